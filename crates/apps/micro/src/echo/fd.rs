//! The raw descriptor calls both sides of the echo benchmark use: reads, writes that
//! finish, non-blocking mode, a wait on one descriptor, epoll sets.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use iolab_sys::cvt;

pub(super) fn read_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for buf.len() bytes.
    cvt(unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) }).map(|n| n as usize)
}

pub(super) fn write_all_fd(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: buf is valid for buf.len() bytes; MSG_NOSIGNAL avoids SIGPIPE.
        match cvt(unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) }) {
            Ok(n) => buf = &buf[n as usize..],
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                std::thread::yield_now()
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub(super) fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl flag update on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

/// Waits up to `ms` for the listener to be readable (so loops can check `stop`).
pub(super) fn poll_one(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

pub(super) fn epoll_add(ep: RawFd, fd: RawFd, key: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: key,
    };
    // SAFETY: valid epoll fd and event struct.
    cvt(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) }).map(drop)
}

pub(super) fn new_epoll() -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1 returns a new fd we own.
    let ep = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(ep) })
}
