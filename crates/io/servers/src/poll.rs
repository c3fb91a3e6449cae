//! `poll`: one thread, non-blocking sockets, `poll(2)`.
//!
//! No seed 000 server: this is the step between `select` and `epoll` that seed 003's
//! comparison of readiness models implies on Linux. The loop is the `select` one, but the
//! interest list is an array of `pollfd` that grows with the connections, so there is no
//! FD_SETSIZE ceiling; the kernel still scans the whole array on every call, which is the
//! O(n) cost this model exhibits. Closed connections leave the array by swap-remove.
//!
//! Deadlines (`iolab_http::Deadline`: a head's, a stalled send's, the idle one): the `poll`
//! timeout is the earliest; expired connections are closed and counted as timeouts.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Instant;

use crate::net::{self, Conn, Want};
use crate::Ctx;

/// `pollfds[0]` is the stop eventfd, `pollfds[1]` the listener, then one per connection.
const FIRST_CONN: usize = 2;

fn events(want: Want) -> libc::c_short {
    match want {
        Want::Write => libc::POLLOUT,
        _ => libc::POLLIN,
    }
}

pub fn run(ctx: &Ctx) -> io::Result<()> {
    let cfg = &ctx.config;
    let stats = &*ctx.stats;
    let listener = net::listen(cfg.addr, cfg.backlog, false, true)?;
    let pollfd = |fd, events| libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let mut pollfds = vec![
        pollfd(ctx.shutdown.fd(), libc::POLLIN),
        pollfd(listener.as_raw_fd(), libc::POLLIN),
    ];
    // conns[i] goes with pollfds[FIRST_CONN + i].
    let mut conns: Vec<Conn> = Vec::new();
    let mut buf = vec![0u8; ctx.config.buffers.read_buf];
    // Set after an accept failure like EMFILE: the listener is not watched until then.
    let mut accept_paused: Option<Instant> = None;

    while !ctx.shutdown.is_triggered() {
        accept_paused = accept_paused.filter(|&t| t > Instant::now());
        pollfds[1].events = if accept_paused.is_some() {
            0
        } else {
            libc::POLLIN
        };
        let earliest = conns
            .iter()
            .filter_map(|c| c.deadline())
            .chain(accept_paused)
            .min();
        let timeout = net::timeout_ms(earliest, Instant::now());
        // SAFETY: pollfds is a valid, initialised array of its length.
        let n = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(io::Error::new(e.kind(), format!("poll: {e}")));
        }
        if pollfds[0].revents != 0 {
            break;
        }
        let now = Instant::now();
        let mut i = 0;
        while i < conns.len() {
            let p = &mut pollfds[FIRST_CONN + i];
            match conns[i].turn(p.revents != 0, now, &mut buf, stats) {
                None => i += 1,
                Some(Want::Close) => {
                    conns.swap_remove(i);
                    pollfds.swap_remove(FIRST_CONN + i);
                    stats.conn_closed();
                    // The last entry moved to `i`, with this turn's revents: look at it next.
                }
                Some(want) => {
                    p.events = events(want);
                    p.revents = 0;
                    i += 1;
                }
            }
        }
        if pollfds[1].revents != 0
            && !accept_all(ctx, &listener, &mut conns, &mut pollfds, &mut buf)
        {
            accept_paused = Some(Instant::now() + net::ACCEPT_BACKOFF);
        }
    }
    for _ in conns.drain(..) {
        stats.conn_closed();
    }
    Ok(())
}

/// Accepts every connection waiting in the queue; serves each as far as it goes at once.
/// False when accepting failed for a reason that will not go away at once (EMFILE, ...).
fn accept_all(
    ctx: &Ctx,
    listener: &std::net::TcpListener,
    conns: &mut Vec<Conn>,
    pollfds: &mut Vec<libc::pollfd>,
    buf: &mut [u8],
) -> bool {
    net::accept_all(listener, &ctx.stats, |stream| {
        if conns.len() >= ctx.config.max_conns {
            ctx.stats.refused();
            return;
        }
        if let Some((conn, want)) = Conn::start(ctx, stream, buf) {
            pollfds.push(libc::pollfd {
                fd: conn.fd(),
                events: events(want),
                revents: 0,
            });
            conns.push(conn);
        }
    })
}
