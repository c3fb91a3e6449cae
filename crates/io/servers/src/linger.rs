//! Lingering close, the same for every model: a connection ended by an error answer (400,
//! 413, 414, 431, 505: `Session::lingers`) usually has input the server never read, and
//! closing a socket with unread input makes the kernel send a reset, which can destroy the
//! answer in the client's receive queue before the client reads it. So, as nginx's
//! `lingering_close` does, the server shuts its sending side (the client sees the whole
//! answer, then end of file) and reads and discards what the client still sends, for a
//! bounded time and size, before it closes:
//!
//! - [`LINGER_TIME`] in all (nginx `lingering_time` 30 s);
//! - [`LINGER_TIMEOUT`] without a byte (nginx `lingering_timeout` 5 s);
//! - [`LINGER_BYTES`] discarded at most;
//! - [`MAX_LINGERING`] sockets at once; beyond, a socket is closed at once, as before.
//!
//! A model hands the socket over with [`linger`] instead of closing it, once its answer is
//! flushed (a `dup` of it for the io_uring models, which then close their own descriptor as
//! usual: the socket lives on in the duplicate). One thread per server drains them all with
//! `epoll`; it starts with the first socket and ends once none is left. The connection is
//! counted closed by its model as before: lingering is the kernel's socket, not a
//! connection the model serves.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use iolab_sys::cvt;

/// Longest a socket lingers in all.
pub const LINGER_TIME: Duration = Duration::from_secs(5);
/// Longest a lingering socket waits for the client's next byte.
pub const LINGER_TIMEOUT: Duration = Duration::from_secs(1);
/// Most bytes read and discarded from one lingering socket.
pub const LINGER_BYTES: usize = 1 << 20;
/// Most sockets lingering at once.
pub const MAX_LINGERING: usize = 1024;

struct Lingering {
    fd: OwnedFd,
    since: Instant,
    last: Instant,
    drained: usize,
}

#[derive(Default)]
struct Lingerer {
    /// The epoll set of the running thread, None when no thread runs.
    epoll: Option<RawFd>,
    sockets: HashMap<RawFd, Lingering>,
}

fn lingerer() -> &'static Mutex<Lingerer> {
    static L: OnceLock<Mutex<Lingerer>> = OnceLock::new();
    L.get_or_init(|| Mutex::new(Lingerer::default()))
}

fn lock() -> std::sync::MutexGuard<'static, Lingerer> {
    // Every operation under the lock is one map or epoll call: a poisoned lock is usable.
    lingerer().lock().unwrap_or_else(|p| p.into_inner())
}

/// Shuts `fd`'s sending side and drains it in the background within the bounds above; the
/// descriptor is owned from here on (closed by the lingering thread). Closes it at once when
/// [`MAX_LINGERING`] sockets linger already or the thread cannot start.
pub fn linger(fd: OwnedFd) {
    let raw = fd.as_raw_fd();
    // SAFETY: shutdown on a descriptor we own; an error (ENOTCONN: the client is gone)
    // just means there is nothing to wait for, and the close below is clean.
    if unsafe { libc::shutdown(raw, libc::SHUT_WR) } != 0 {
        return;
    }
    let mut l = lock();
    if l.sockets.len() >= MAX_LINGERING {
        return;
    }
    let epoll = match l.epoll {
        Some(ep) => ep,
        None => match start_thread() {
            Ok(ep) => {
                l.epoll = Some(ep);
                ep
            }
            Err(e) => {
                tracing::warn!("lingering close unavailable ({e}): closing at once");
                return;
            }
        },
    };
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
        u64: raw as u64,
    };
    // SAFETY: a valid epoll descriptor and event; the socket stays open while registered.
    if unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, raw, &mut ev) } != 0 {
        return;
    }
    let now = Instant::now();
    l.sockets.insert(
        raw,
        Lingering {
            fd,
            since: now,
            last: now,
            drained: 0,
        },
    );
}

/// The epoll set and the thread draining it; the thread owns the set and closes it when no
/// socket is left.
fn start_thread() -> io::Result<RawFd> {
    // SAFETY: epoll_create1 returns a new descriptor or -1.
    let ep = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
    // SAFETY: ep is fresh and owned by nobody else; the thread takes it.
    let owned = unsafe { OwnedFd::from_raw_fd(ep) };
    std::thread::Builder::new()
        .name("linger".into())
        .spawn(move || drain_loop(owned))?;
    Ok(ep)
}

fn drain_loop(epoll: OwnedFd) {
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut scratch = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: a live epoll descriptor and an array of its length.
        let n = unsafe {
            libc::epoll_wait(
                epoll.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                100,
            )
        };
        let mut l = lock();
        for ev in events.iter().take(n.max(0) as usize) {
            let fd = ev.u64 as RawFd;
            if let Some(s) = l.sockets.get_mut(&fd) {
                if !drain(s, &mut scratch) {
                    l.sockets.remove(&fd);
                }
            }
        }
        let now = Instant::now();
        l.sockets.retain(|_, s| {
            now.duration_since(s.since) < LINGER_TIME && now.duration_since(s.last) < LINGER_TIMEOUT
        });
        if l.sockets.is_empty() {
            // The next socket starts a new thread with a new set; this one closes its own.
            l.epoll = None;
            return;
        }
    }
}

/// Reads and discards what is there; false when the socket is done (end of file, an error,
/// or [`LINGER_BYTES`] reached).
fn drain(s: &mut Lingering, scratch: &mut [u8]) -> bool {
    loop {
        // SAFETY: reads into a buffer we own of the length given.
        let n = unsafe {
            libc::recv(
                s.fd.as_raw_fd(),
                scratch.as_mut_ptr().cast(),
                scratch.len(),
                libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => return false,
            n if n > 0 => {
                s.last = Instant::now();
                s.drained += n as usize;
                if s.drained >= LINGER_BYTES {
                    return false;
                }
            }
            _ => {
                let e = io::Error::last_os_error();
                return matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                );
            }
        }
    }
}

/// A duplicate of `fd` to hand to [`linger`] while the caller closes its own (the io_uring
/// models, whose close is an operation on the ring). None when `dup` fails (out of
/// descriptors): the socket is then closed at once, as before.
pub fn dup(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor the caller keeps open returns a new one or -1.
    let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    // SAFETY: d is a fresh descriptor nobody else owns.
    (d >= 0).then(|| unsafe { OwnedFd::from_raw_fd(d) })
}
