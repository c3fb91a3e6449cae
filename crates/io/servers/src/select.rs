//! `select`: one thread, non-blocking sockets, `select(2)`.
//!
//! Mirrors seed 000's **select** server (annex B): an event loop whose heart is `select`,
//! every socket non-blocking, every call synchronous; a connection is served as far as it
//! can go the moment it is accepted, then whenever `select` reports it ready in the
//! direction it waits for (read for the next request, write for a pending response).
//!
//! FD_SETSIZE (seed annex E.3): an `fd_set` holds descriptors 0..1024 only, and writing a
//! larger one would overflow it. So a connection whose descriptor number is 1024 or more is
//! closed at once and counted as **refused**, as is one beyond `max_conns`. Descriptors
//! below 1024 are all usable (the listener, the stop eventfd and stdio take a few), so about
//! 1,000 connections are held at most. Every loop turn rebuilds both sets and scans every
//! slot: the O(FD_SETSIZE) cost per wake-up is the point of the model.
//!
//! Deadlines (`iolab_http::Deadline`: a head's, a stalled send's, the idle one): the `select`
//! timeout is the earliest; expired connections are closed and counted as timeouts.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use crate::net::{self, Conn, Want};
use crate::Ctx;

/// Largest descriptor number + 1 that `select` can watch.
pub const FD_SETSIZE: usize = libc::FD_SETSIZE;

/// A `fd_set` that only accepts descriptors below FD_SETSIZE.
struct FdSet(libc::fd_set);

impl FdSet {
    fn new() -> FdSet {
        // SAFETY: fd_set is plain bytes; FD_ZERO then initialises it properly.
        let mut s: libc::fd_set = unsafe { std::mem::zeroed() };
        // SAFETY: `s` is a valid fd_set.
        unsafe { libc::FD_ZERO(&mut s) };
        FdSet(s)
    }

    fn insert(&mut self, fd: RawFd) {
        assert!((fd as usize) < FD_SETSIZE);
        // SAFETY: 0 <= fd < FD_SETSIZE (checked above), so the bit is inside the set.
        unsafe { libc::FD_SET(fd, &mut self.0) };
    }

    fn contains(&self, fd: RawFd) -> bool {
        // SAFETY: same bound as `insert`; descriptors out of range are never in the set.
        (fd as usize) < FD_SETSIZE && unsafe { libc::FD_ISSET(fd, &self.0) }
    }
}

struct Slot {
    conn: Conn,
    want: Want,
}

pub fn run(ctx: &Ctx) -> io::Result<()> {
    let cfg = &ctx.config;
    let stats = &*ctx.stats;
    let listener = net::listen(cfg.addr, cfg.backlog, false, true)?;
    let (lfd, efd) = (listener.as_raw_fd(), ctx.shutdown.fd());
    if lfd as usize >= FD_SETSIZE || efd as usize >= FD_SETSIZE {
        return Err(io::Error::other(format!(
            "select: listener or stop descriptor ({lfd}, {efd}) is beyond FD_SETSIZE ({FD_SETSIZE})"
        )));
    }
    // Indexed by descriptor number: select speaks in descriptor numbers anyway.
    let mut slots: Vec<Option<Slot>> = (0..FD_SETSIZE).map(|_| None).collect();
    let mut held = 0usize;
    let mut buf = vec![0u8; ctx.config.buffers.read_buf];
    // Set after an accept failure like EMFILE: the listener is left out until then.
    let mut accept_paused: Option<Instant> = None;

    while !ctx.shutdown.is_triggered() {
        let (mut rset, mut wset) = (FdSet::new(), FdSet::new());
        accept_paused = accept_paused.filter(|&t| t > Instant::now());
        if accept_paused.is_none() {
            rset.insert(lfd);
        }
        rset.insert(efd);
        let mut maxfd = lfd.max(efd);
        let mut earliest: Option<Instant> = accept_paused;
        for (fd, slot) in slots.iter().enumerate() {
            let Some(s) = slot else { continue };
            match s.want {
                Want::Write => wset.insert(fd as RawFd),
                _ => rset.insert(fd as RawFd),
            }
            maxfd = maxfd.max(fd as RawFd);
            if let Some(d) = s.conn.deadline() {
                earliest = Some(earliest.map_or(d, |e| e.min(d)));
            }
        }
        let mut tv;
        let tvp = match earliest {
            None => std::ptr::null_mut(),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                tv = libc::timeval {
                    tv_sec: left.as_secs() as libc::time_t,
                    tv_usec: left.subsec_micros() as libc::suseconds_t,
                };
                &mut tv as *mut libc::timeval
            }
        };
        // SAFETY: both sets are valid and only hold descriptors < maxfd + 1 <= FD_SETSIZE;
        // tvp is null or points to a live timeval.
        let n = unsafe {
            libc::select(
                maxfd + 1,
                &mut rset.0,
                &mut wset.0,
                std::ptr::null_mut(),
                tvp,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(io::Error::new(e.kind(), format!("select: {e}")));
        }
        if rset.contains(efd) {
            break;
        }
        if rset.contains(lfd) && !accept_all(ctx, &listener, &mut slots, &mut held, &mut buf) {
            accept_paused = Some(Instant::now() + net::ACCEPT_BACKOFF);
        }
        let now = Instant::now();
        for fd in 0..=maxfd {
            let Some(s) = &mut slots[fd as usize] else {
                continue;
            };
            let ready = rset.contains(fd) || wset.contains(fd);
            match s.conn.turn(ready, now, &mut buf, stats) {
                None => {}
                Some(Want::Close) => {
                    slots[fd as usize] = None;
                    held -= 1;
                    stats.conn_closed();
                }
                Some(want) => s.want = want,
            }
        }
    }
    for _ in slots.iter_mut().filter_map(Option::take) {
        stats.conn_closed();
    }
    Ok(())
}

/// Accepts every connection waiting in the queue; serves each as far as it goes at once.
/// False when accepting failed for a reason that will not go away at once (EMFILE, ...):
/// the rest is left in the queue for a later turn.
fn accept_all(
    ctx: &Ctx,
    listener: &std::net::TcpListener,
    slots: &mut [Option<Slot>],
    held: &mut usize,
    buf: &mut [u8],
) -> bool {
    net::accept_all(listener, &ctx.stats, |stream| {
        let fd = stream.as_raw_fd();
        if fd as usize >= FD_SETSIZE || *held >= ctx.config.max_conns {
            ctx.stats.refused();
            return;
        }
        if let Some((conn, want)) = Conn::start(ctx, stream, buf) {
            slots[fd as usize] = Some(Slot { conn, want });
            *held += 1;
        }
    })
}
