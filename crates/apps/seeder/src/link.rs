//! A peer connection's byte stream, plaintext or under MSE's RC4 ([`crate::mse`]): the
//! receive into the loop's scratch buffer (decrypted as it is appended), the sealing of
//! outgoing bytes, and the MSE exchange driven over the socket with one deadline.
//!
//! Encryption costs the zero-copy send: under RC4 the blocks of a gathered send are copied
//! into one buffer and encrypted there (the mapping is read-only, and the keystream must
//! cover every byte in order).

use std::cell::RefCell;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Instant;

use iolab_runtime::net::TcpStream;
use iolab_runtime::{timeout, wait_readable};

use crate::disk::{Block, Chunk};
use crate::mse::{Established, MseError, Progress, Rc4Pair};

thread_local! {
    /// The loop's receive buffer: a peer's input lands here first, so an idle peer holds none.
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0u8; 64 * 1024]);
}

/// One non-blocking receive into the loop's scratch buffer, appended to `inbuf` (decrypted
/// when the stream is under RC4).
pub fn recv_into(
    stream: &TcpStream,
    inbuf: &mut Vec<u8>,
    rc4: &mut Option<Rc4Pair>,
) -> io::Result<usize> {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        // SAFETY: `s` is a live buffer of s.len() bytes, exclusively borrowed here; recv
        // writes at most that many bytes into it.
        let n = unsafe {
            libc::recv(
                stream.as_raw_fd(),
                s.as_mut_ptr() as *mut libc::c_void,
                s.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        let start = inbuf.len();
        inbuf.extend_from_slice(&s[..n]);
        if let Some(rc4) = rc4 {
            rc4.decrypt(&mut inbuf[start..]).map_err(io::Error::other)?;
        }
        Ok(n)
    })
}

/// The bytes of a gathered send as they go on the wire: unchanged in plaintext; under RC4
/// copied into one buffer and encrypted.
pub fn seal(chunks: Vec<Chunk>, rc4: &mut Option<Rc4Pair>) -> io::Result<Vec<Chunk>> {
    let Some(rc4) = rc4 else {
        return Ok(chunks);
    };
    let len = chunks.iter().map(iolab_runtime::IoBuf::len).sum();
    let mut all = Vec::with_capacity(len);
    for c in &chunks {
        all.extend_from_slice(c.bytes());
    }
    rc4.encrypt(&mut all).map_err(io::Error::other)?;
    Ok(vec![Chunk::new(Block::Owned(all))])
}

/// Why an MSE exchange over the socket ended without a stream.
#[derive(Debug)]
pub enum ExchangeFailure {
    /// The deadline passed.
    Timeout,
    /// The peer closed.
    Closed,
    Io(io::Error),
    Mse(MseError),
}

/// Drives one MSE exchange: feeds `first` (bytes already received) and then every byte
/// received to `feed`, sends what it returns, until it is done, fails, or `deadline`.
pub async fn exchange<F>(
    stream: &TcpStream,
    first: Vec<u8>,
    deadline: Instant,
    mut feed: F,
) -> Result<Established, ExchangeFailure>
where
    F: FnMut(&[u8]) -> Result<Progress, MseError>,
{
    let mut input = first;
    loop {
        let p = feed(&input).map_err(ExchangeFailure::Mse)?;
        input.clear();
        if !p.send.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match timeout(left, stream.write_all(p.send)).await {
                Err(_) => return Err(ExchangeFailure::Timeout),
                Ok((Err(e), _)) => return Err(ExchangeFailure::Io(e)),
                Ok((Ok(()), _)) => {}
            }
        }
        if let Some(done) = p.done {
            return Ok(done);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, wait_readable(stream.as_raw_fd())).await {
            Err(_) => return Err(ExchangeFailure::Timeout),
            Ok(Err(e)) => return Err(ExchangeFailure::Io(e)),
            Ok(Ok(())) => {}
        }
        match recv_into(stream, &mut input, &mut None) {
            Ok(0) => return Err(ExchangeFailure::Closed),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(ExchangeFailure::Io(e)),
        }
    }
}
