//! The client side of the echo benchmark: N connections on one epoll set, each keeping
//! one message in flight and timing its echo.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::fd::{epoll_add, new_epoll, read_fd, set_nonblocking, write_all_fd};
use super::{BUF, CLIENT_FD_BASE};
use crate::osutil;

struct Conn {
    fd: OwnedFd,
    sent_at: Instant,
    got: usize,
    echoes: u64,
    alive: bool,
}

fn connect_client(addr: SocketAddr) -> io::Result<OwnedFd> {
    let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
    s.set_nodelay(true)?;
    let fd = s.into_raw_fd();
    // SAFETY: duplicates our own fd to the lowest free fd ≥ CLIENT_FD_BASE.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, CLIENT_FD_BASE) };
    let keep = if high >= 0 {
        // SAFETY: fd is ours and replaced by `high`.
        unsafe { libc::close(fd) };
        high
    } else {
        fd
    };
    set_nonblocking(keep);
    // SAFETY: keep is an fd we own from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(keep) })
}

/// Sends a message on `c`; marks it dead on error.
fn send_msg(c: &mut Conn, msg: &[u8]) {
    c.sent_at = Instant::now();
    c.got = 0;
    if write_all_fd(c.fd.as_raw_fd(), msg).is_err() {
        c.alive = false;
    }
}

/// The client side of a point: connections on one epoll set (an event's key is the
/// connection's index), each keeping one `size`-byte message in flight.
pub(super) struct Clients {
    ep: OwnedFd,
    conns: Vec<Conn>,
    msg: Vec<u8>,
    events: Vec<libc::epoll_event>,
    scratch: Vec<u8>,
}

impl Clients {
    /// Opens up to `n` connections to `addr` and sends each its first message; the status
    /// says where connecting stopped, if it did (empty otherwise).
    pub(super) fn connect(
        addr: SocketAddr,
        n: usize,
        size: usize,
    ) -> anyhow::Result<(Clients, String)> {
        let mut c = Clients {
            ep: new_epoll().context("epoll_create1")?,
            conns: Vec::with_capacity(n),
            msg: vec![0x42u8; size],
            events: vec![libc::epoll_event { events: 0, u64: 0 }; 1024],
            scratch: vec![0u8; BUF.max(size)],
        };
        let mut status = String::new();
        for _ in 0..n {
            match connect_client(addr) {
                Ok(fd) => {
                    epoll_add(c.ep.as_raw_fd(), fd.as_raw_fd(), c.conns.len() as u64)?;
                    c.conns.push(Conn {
                        fd,
                        sent_at: Instant::now(),
                        got: 0,
                        echoes: 0,
                        alive: true,
                    });
                }
                Err(e) => {
                    status = format!("connect {} failed: {e}", c.conns.len() + 1);
                    break;
                }
            }
        }
        for conn in c.conns.iter_mut() {
            send_msg(conn, &c.msg);
        }
        Ok((c, status))
    }

    /// Reads echoes and sends the next messages until `until`, or, when `warm`, until every
    /// live connection has had its first echo; the round trips go to `rtts`. Returns the
    /// echoes received.
    pub(super) fn drive(
        &mut self,
        until: Instant,
        mut rtts: Option<&mut Vec<u64>>,
        warm: bool,
    ) -> u64 {
        let size = self.msg.len();
        let mut echoes = 0u64;
        let mut pending = self
            .conns
            .iter()
            .filter(|c| c.alive && c.echoes == 0)
            .count();
        while Instant::now() < until && !(warm && pending == 0) {
            // SAFETY: events has room for events.len() entries.
            let n = unsafe {
                libc::epoll_wait(
                    self.ep.as_raw_fd(),
                    self.events.as_mut_ptr(),
                    self.events.len() as i32,
                    10,
                )
            };
            for ev in self.events.iter().take(n.max(0) as usize) {
                let c = &mut self.conns[ev.u64 as usize];
                if !c.alive {
                    continue;
                }
                match read_fd(c.fd.as_raw_fd(), &mut self.scratch[..size - c.got]) {
                    Ok(0) => c.alive = false,
                    Ok(k) => {
                        c.got += k;
                        if c.got == size {
                            if c.echoes == 0 {
                                pending = pending.saturating_sub(1);
                            }
                            c.echoes += 1;
                            echoes += 1;
                            if let Some(v) = rtts.as_deref_mut() {
                                v.push(c.sent_at.elapsed().as_nanos() as u64);
                            }
                            send_msg(c, &self.msg);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => c.alive = false,
                }
                if !c.alive {
                    pending = pending.saturating_sub(1);
                    // SAFETY: removing our own fd from our epoll set.
                    unsafe {
                        libc::epoll_ctl(
                            self.ep.as_raw_fd(),
                            libc::EPOLL_CTL_DEL,
                            c.fd.as_raw_fd(),
                            std::ptr::null_mut(),
                        )
                    };
                }
            }
        }
        echoes
    }

    /// Connections still echoing.
    pub(super) fn held(&self) -> usize {
        self.conns
            .iter()
            .filter(|c| c.alive && c.echoes > 0)
            .count()
    }

    /// Closes every connection with a reset rather than a FIN: no TIME_WAIT left behind by
    /// thousands of connections.
    pub(super) fn reset(self) {
        for c in &self.conns {
            osutil::set_linger_rst(&c.fd);
        }
    }
}
