//! A stop request shared by a server's threads: a flag, plus an eventfd that becomes readable
//! once stop is requested so that select/poll/epoll/io_uring loops can wait on it beside
//! their sockets.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub struct Shutdown {
    flag: AtomicBool,
    efd: OwnedFd,
}

impl Shutdown {
    pub fn new() -> std::io::Result<Arc<Shutdown>> {
        // SAFETY: eventfd returns a new descriptor we own, or -1.
        let fd =
            iolab_sys::cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        Ok(Arc::new(Shutdown {
            flag: AtomicBool::new(false),
            // SAFETY: fd is a fresh descriptor owned by nobody else.
            efd: unsafe { OwnedFd::from_raw_fd(fd) },
        }))
    }

    /// Requests the stop; idempotent, async-signal-safe enough for a signal-hook thread.
    pub fn trigger(&self) {
        if !self.flag.swap(true, Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes from a valid u64 to our eventfd.
            unsafe { libc::write(self.efd.as_raw_fd(), &one as *const u64 as *const _, 8) };
        }
    }

    pub fn is_triggered(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Readable (and stays readable) once the stop is requested.
    pub fn fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }
}
