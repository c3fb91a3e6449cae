//! `sendfile` on a domain connection: a large range goes to the agent (read from the file
//! straight into the arena) and travels as a reference laid out for the receiver's pages
//! (see [`frames::aligned_head`]); a small one as an R frame.

use crate::frames::{self, OutFrame};
use crate::regions::PAGE;
use crate::send::flush_pending;
use crate::{stats, sys, FdState, State, CONFIG};
use iolab_odb::proto;
use libc::{c_int, c_void, iovec};
use std::sync::atomic::Ordering::Relaxed;

/// The file position a `sendfile` call uses and updates: the caller's offset, or the
/// file's own.
struct FilePos {
    inp: c_int,
    off: *mut i64,
    start: i64,
}

impl FilePos {
    fn new(inp: c_int, off: *mut i64) -> Result<FilePos, c_int> {
        let start = if off.is_null() {
            sys::lseek(inp, 0, libc::SEEK_CUR)? as i64
        } else {
            // SAFETY: the caller passes a valid off_t pointer (sendfile's contract).
            unsafe { *off }
        };
        Ok(FilePos { inp, off, start })
    }

    /// `n` bytes from the start were sent.
    fn advance(&self, n: usize) -> Result<(), c_int> {
        if self.off.is_null() {
            sys::lseek(self.inp, self.start + n as i64, libc::SEEK_SET)?;
        } else {
            // SAFETY: as in `new`.
            unsafe { *self.off = self.start + n as i64 };
        }
        Ok(())
    }

    /// Advances by `n` and returns it (the call's result).
    fn sent(&self, n: usize) -> Result<usize, c_int> {
        self.advance(n)?;
        Ok(n)
    }
}

pub(crate) fn odb_sendfile(
    st: &mut State,
    fs: &mut FdState,
    out: c_int,
    inp: c_int,
    off: *mut i64,
    count: usize,
) -> Result<usize, c_int> {
    if fs.rx.raw() {
        return sys::sendfile(out, inp, off, count);
    }
    if !flush_pending(fs, out, 0)? {
        return Err(libc::EAGAIN);
    }
    let pos = FilePos::new(inp, off)?;
    match fs.tx.frame() {
        OutFrame::Real(left) => {
            let mut p = pos.start;
            let n = sys::sendfile(out, inp, &mut p, left.min(count))?;
            pos.advance(n)?;
            stats::R_OUT_BYTES.fetch_add(n as u64, Relaxed);
            fs.tx.sent_real(n);
            return Ok(n);
        }
        OutFrame::Virt(left) => {
            let k = left.min(count);
            pos.advance(k)?;
            fs.tx.resume(k);
            return Ok(k);
        }
        OutFrame::None => {}
    }
    let th = CONFIG.get().map_or(usize::MAX, |c| c.threshold);
    let head = frames::aligned_head(fs.out_since_in, count, th, st.store.is_some());
    if let Some(n) = sendfile_whole(st, fs, out, &pos, count, head, th) {
        return pos.sent(n?);
    }
    let mut sent = 0usize;
    if head > 0 {
        let n = sendfile_r(fs, out, inp, pos.start, head)?;
        if n < head {
            return pos.sent(n);
        }
        sent = n;
        stats::ALIGN_PADS.fetch_add(1, Relaxed);
    }
    let rest = count - sent;
    if let Some(vlen) = frames::reference_len(fs.out_since_in, sent, rest, head, th) {
        match sendfile_v(st, fs, out, inp, pos.start + sent as i64, vlen) {
            Ok(Some(got)) => {
                sent += got;
                let tail = count - sent;
                if got == vlen && tail > 0 && tail < PAGE {
                    if let Ok(n) = sendfile_r(fs, out, inp, pos.start + sent as i64, tail) {
                        sent += n;
                    }
                }
                return pos.sent(sent);
            }
            Ok(None) => {}
            Err(_) if sent > 0 => return pos.sent(sent),
            Err(e) => return Err(e),
        }
    }
    match sendfile_r(fs, out, inp, pos.start + sent as i64, rest) {
        Ok(n) => pos.sent(sent + n),
        Err(_) if sent > 0 => pos.sent(sent),
        Err(e) => Err(e),
    }
}

/// The common case in one send: real head bytes (up to the page boundary), a reference of
/// whole pages, and a tail of less than a page, the three frames in one `sendmsg` (before:
/// a send and a `sendfile` per R frame, a send for the V header, and the receiver woke for
/// the head before the store's round trip let the rest go). The reference names the file's
/// range itself when the agent serves the file (it answers fetches with `sendfile`: no copy
/// anywhere), else bytes copied into the arena by the same `preadv` that reads head and
/// tail. None: not this case (the caller's general path).
/// Some(Ok(n)): n application bytes are accounted for (the connection's writer says what a
/// short send still owes, as the general path does).
fn sendfile_whole(
    st: &mut State,
    fs: &mut FdState,
    out: c_int,
    pos: &FilePos,
    count: usize,
    head: usize,
    th: usize,
) -> Option<Result<usize, c_int>> {
    let (vlen, tail) = frames::whole_layout(fs.out_since_in, count, head, th)?;
    let store = st.store.as_mut()?;
    let (inp, at) = (pos.inp, pos.start);
    let mut hb = [0u8; PAGE];
    let mut tb = [0u8; PAGE];
    let mid = at + head as i64;
    let r = if let Ok(r) = store.file_ref(inp, mid as u64, vlen as u32) {
        let read = |b: &mut [u8; PAGE], n: usize, off: i64| {
            n == 0 || sys::pread(inp, b.as_mut_ptr().cast(), n, off).is_ok_and(|k| k == n)
        };
        if !read(&mut hb, head, at) || !read(&mut tb, tail, mid + vlen as i64) {
            return Some(sendfile_r(fs, out, inp, at, count));
        }
        stats::FILE_REF_BYTES.fetch_add(vlen as u64, Relaxed);
        r
    } else {
        // No room (or a file that changed under us, below): the bytes go as they are, here
        // — the general path would ask the agent for room a second time.
        let (dst, r) = match store.alloc(vlen as u32) {
            Ok(x) => x,
            Err(_) => {
                stats::STORE_FALLBACKS.fetch_add(1, Relaxed);
                return Some(sendfile_r(fs, out, inp, at, count));
            }
        };
        let rd = [
            iovec {
                iov_base: hb.as_mut_ptr().cast(),
                iov_len: head,
            },
            iovec {
                iov_base: dst.cast(),
                iov_len: vlen,
            },
            iovec {
                iov_base: tb.as_mut_ptr().cast(),
                iov_len: tail,
            },
        ];
        // SAFETY (of the arena iovec): dst..dst+vlen is our reservation in the arena.
        match sys::preadv(inp, rd.as_ptr(), 3, at, 0) {
            Ok(n) if n == count => {}
            // a file that changed under us: the reservation expires at the agent unused
            _ => {
                stats::STORE_WASTED.fetch_add(1, Relaxed);
                return Some(sendfile_r(fs, out, inp, at, count));
            }
        }
        r
    };
    Some(send_whole(fs, out, &hb[..head], (r, vlen), &tb[..tail]))
}

/// Sends the head's R frame, the reference and the tail's R frame in one `sendmsg`.
fn send_whole(
    fs: &mut FdState,
    out: c_int,
    hb: &[u8],
    (r, vlen): (proto::Ref, usize),
    tb: &[u8],
) -> Result<usize, c_int> {
    let (head, tail) = (hb.len(), tb.len());
    let rh = proto::encode_r(head as u32);
    let vh = r.slice(0, vlen as u32).encode();
    let th_ = proto::encode_r(tail as u32);
    let rh: &[u8] = if head > 0 { &rh } else { &[] };
    let th_: &[u8] = if tail > 0 { &th_ } else { &[] };
    let parts: [&[u8]; 5] = [rh, hb, &vh, th_, tb];
    let mut iov = [iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 5];
    let mut k = 0;
    for p in parts.iter().filter(|p| !p.is_empty()) {
        iov[k] = iovec {
            iov_base: p.as_ptr() as *mut c_void,
            iov_len: p.len(),
        };
        k += 1;
    }
    let n = match sys::sendmsg(out, &iov[..k], 0) {
        Ok(n) => n,
        Err(e) => {
            // an arena reservation goes unused (a file range reserves nothing)
            if proto::file_id_parts(r.buf_id).is_none() {
                stats::STORE_WASTED.fetch_add(1, Relaxed);
            }
            return Err(e);
        }
    };
    stats::STORED_BYTES.fetch_add(vlen as u64, Relaxed);
    if head > 0 {
        stats::ALIGN_PADS.fetch_add(1, Relaxed);
    }
    // What the n bytes sent cover, part by part: application bytes consumed, and what is
    // owed (the rest of a header goes first next time; the application offers its bytes
    // again from where the count stops).
    let s = fs.tx.account_whole((rh, head), (&vh, vlen), (th_, tail), n);
    stats::R_OUT_BYTES.fetch_add(s.r_bytes as u64, Relaxed);
    stats::V_OUT_BYTES.fetch_add(s.v_bytes as u64, Relaxed);
    stats::V_OUT_FRAMES.fetch_add(s.v_frames as u64, Relaxed);
    if s.app > 0 {
        Ok(s.app)
    } else {
        Err(libc::EAGAIN)
    }
}

/// Sends `len` bytes of file `inp` from `pos` as a reference stored at the local agent.
/// Ok(None): no agent or no room (the caller sends them as real bytes). Ok(Some(n)): the
/// frame is out and stands for n bytes; Err(EAGAIN) with the V frame owed when its header
/// went out only in part (the application offers those bytes again).
fn sendfile_v(
    st: &mut State,
    fs: &mut FdState,
    out: c_int,
    inp: c_int,
    pos: i64,
    len: usize,
) -> Result<Option<usize>, c_int> {
    let Some(store) = st.store.as_mut() else {
        return Ok(None);
    };
    if let Ok(r) = store.file_ref(inp, pos as u64, len as u32) {
        stats::FILE_REF_BYTES.fetch_add(len as u64, Relaxed);
        return send_v_header(fs, out, r, len);
    }
    let (dst, r) = match store.alloc(len as u32) {
        Ok(x) => x,
        Err(_) => {
            stats::STORE_FALLBACKS.fetch_add(1, Relaxed);
            return Ok(None);
        }
    };
    let mut got = 0;
    while got < len {
        match sys::pread(
            inp,
            // SAFETY: got < len and dst..dst+len is our reservation in the arena, so
            // dst+got stays inside it.
            unsafe { dst.add(got) }.cast(),
            len - got,
            pos + got as i64,
        ) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    if got == 0 {
        return Ok(None);
    }
    send_v_header(fs, out, r.slice(0, got as u32), got)
}

/// Sends the V frame of `r` (standing for `got` bytes of the application's).
fn send_v_header(
    fs: &mut FdState,
    out: c_int,
    r: proto::Ref,
    got: usize,
) -> Result<Option<usize>, c_int> {
    let hdr = r.encode();
    stats::STORED_BYTES.fetch_add(got as u64, Relaxed);
    let n = send_header(out, &hdr)?;
    stats::V_OUT_BYTES.fetch_add(got as u64, Relaxed);
    stats::V_OUT_FRAMES.fetch_add(1, Relaxed);
    if n == hdr.len() {
        return Ok(Some(got));
    }
    fs.tx.header_cut(&hdr, n, OutFrame::Virt(got));
    Err(libc::EAGAIN)
}

/// Sends up to `count` bytes of file `inp` from `pos` as an R frame (sendfile for the data).
/// Returns the data bytes sent; a short send leaves the rest of the frame owed.
fn sendfile_r(
    fs: &mut FdState,
    out: c_int,
    inp: c_int,
    pos: i64,
    count: usize,
) -> Result<usize, c_int> {
    let len = count.min(proto::MAX_FRAME as usize);
    let hdr = proto::encode_r(len as u32);
    let n = send_header(out, &hdr)?;
    if n < hdr.len() {
        fs.tx.header_cut(&hdr, n, OutFrame::Real(len));
        return Err(libc::EAGAIN);
    }
    // header sent: until data goes, the app will offer the same range again
    fs.tx.real_frame_started(len);
    let mut p = pos;
    let n = sys::sendfile(out, inp, &mut p, len)?;
    stats::R_OUT_BYTES.fetch_add(n as u64, Relaxed);
    fs.tx.sent_real(n);
    Ok(n)
}

/// One `sendmsg` of a frame header; the bytes of it that went out.
fn send_header(out: c_int, hdr: &[u8]) -> Result<usize, c_int> {
    let v = [iovec {
        iov_base: hdr.as_ptr() as *mut c_void,
        iov_len: hdr.len(),
    }];
    sys::sendmsg(out, &v, 0)
}
