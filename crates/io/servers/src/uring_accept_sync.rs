//! `uring-accept-sync` — seed 000's **iocp1** on io_uring.
//!
//! iocp1 dedicated one thread to synchronous `accept` calls and ran the event loop around
//! `GetQueuedCompletionStatus` on another; the accept thread handed each new socket to the
//! loop with `PostQueuedCompletionStatus`, so that a new client arrived in the loop as one
//! more completion packet. Here:
//!
//! - one accept thread waits in `poll(2)` on the listening socket (and on the shutdown
//!   eventfd, so that it can stop), then `accept4`s every connection queued — the blocking
//!   accept of iocp1, without a blocking call that a stop request could not interrupt;
//! - it checks `max_conns` (refused: closed at once and counted), counts the connection open,
//!   and posts the descriptor into a worker's ring with `IORING_OP_MSG_RING` (round robin
//!   over the workers): the worker sees a completion whose result is the socket, exactly as
//!   iocp1's loop dequeued a packet;
//! - every worker runs the `uring` (iocp2) event loop, connection state machine and store
//!   unchanged, minus its own accepts (`Source::Handoff` in [`crate::uring_worker`]): the
//!   comparison between the two models is the comparison of the two ways to accept.
//!
//! When it stops, the accept thread posts a last message ("no more sockets") into every
//! ring; a worker returns only after it, so that no socket can be posted into a ring that
//! nobody reaps any more. The port takes connections only once every worker's ring exists.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::mpsc;

use io_uring::{opcode, types, IoUring};

use crate::stats::ErrorKind;
use crate::uring::Boxes;
use crate::uring_common::{self as common, Gate};
use crate::uring_worker::{token, Op, Source, Worker};
use crate::Ctx;

/// What each thread of the server is.
enum Role {
    /// Runs a ring; sends the ring's descriptor to the accept thread once it exists.
    Worker(mpsc::Sender<io::Result<RawFd>>),
    /// The accept thread: the workers' ring descriptors, its own ring (only to submit the
    /// MSG_RING posts) and the listening socket.
    Acceptor(mpsc::Receiver<io::Result<RawFd>>, Box<IoUring>, OwnedFd),
}

pub fn run(ctx: &Ctx) -> io::Result<()> {
    let n = common::worker_count(ctx.config.workers);
    let listener = common::bind(ctx.config.addr, false, true)?;
    let gate = Gate::new(ctx.config.max_conns);
    // Created here, before any worker: a worker returns only after the accept thread's
    // last post, so the accept thread must be able to post whatever happens.
    let own_ring = common::shared_ring(8)?;
    // One sender per worker: if a worker dies before sending, the receiver sees fewer rings
    // instead of waiting forever.
    let (tx, rx) = mpsc::channel::<io::Result<RawFd>>();
    let mut roles: Vec<Role> = (0..n).map(|_| Role::Worker(tx.clone())).collect();
    drop(tx);
    roles.push(Role::Acceptor(rx, Box::new(own_ring), listener));
    common::run_workers(ctx, roles, "uring-accept-sync", |_, role| match role {
        Role::Acceptor(rx, ring, listener) => {
            let rings: Vec<io::Result<RawFd>> = rx.iter().take(n).collect();
            accept_thread(ctx, &gate, &listener, *ring, n, rings)
        }
        Role::Worker(tx) => {
            let worker = common::ring().map(|ring| {
                let store = Boxes::new(ctx.config.buffers);
                Worker::new(ctx, &gate, Source::Handoff, ring, store)
            });
            match worker {
                Ok(w) => {
                    let _ = tx.send(Ok(w.ring_fd()));
                    drop(tx);
                    w.serve()
                }
                Err(e) => {
                    let _ = tx.send(Err(io::Error::new(e.kind(), e.to_string())));
                    Err(e)
                }
            }
        }
    })
}

/// Accepts until the shutdown, hands each socket to a worker ring, then tells every ring
/// that no more sockets will come.
fn accept_thread(
    ctx: &Ctx,
    gate: &Gate,
    listener: &OwnedFd,
    mut ring: IoUring,
    workers: usize,
    rings: Vec<io::Result<RawFd>>,
) -> io::Result<()> {
    let mut targets = Vec::with_capacity(rings.len());
    let mut failed = None;
    for r in rings {
        match r {
            Ok(fd) => targets.push(fd),
            Err(e) => failed = Some(e),
        }
    }
    if failed.is_none() && targets.len() < workers {
        failed = Some(io::Error::other(
            "a worker thread stopped before its ring was ready",
        ));
    }
    let result = match failed {
        Some(e) => {
            ctx.shutdown.trigger();
            Err(e)
        }
        // Every ring is ready: only now does the port take connections.
        None => common::start_listening(listener, ctx.config.backlog)
            .and_then(|()| accept_loop(ctx, gate, listener.as_raw_fd(), &mut ring, &targets)),
    };
    for &target in &targets {
        if let Err(e) = post(&mut ring, target, 0, token(0, Op::HandoffEnd)) {
            // Not expected (the target ring is alive: its worker is waiting for this very
            // message); say so rather than leave a worker waiting in silence.
            tracing::error!("uring-accept-sync: cannot tell a worker to stop: {e}");
        }
    }
    result
}

fn accept_loop(
    ctx: &Ctx,
    gate: &Gate,
    listener: RawFd,
    ring: &mut IoUring,
    targets: &[RawFd],
) -> io::Result<()> {
    let mut next = 0;
    let mut fds = [
        libc::pollfd {
            fd: listener,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: ctx.shutdown.fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: fds is a live array of two pollfd.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if ctx.shutdown.is_triggered() {
            return Ok(());
        }
        // Take every connection queued now.
        loop {
            let fd = match common::accept(listener) {
                Ok(fd) => fd,
                Err(e) => {
                    match e.raw_os_error() {
                        Some(libc::EAGAIN | libc::EINTR | libc::ECONNABORTED | libc::EPROTO) => {}
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                            // Out of descriptors or memory: the connection waits in the
                            // backlog; pause rather than spin on a listener that stays
                            // readable.
                            ctx.stats.error(ErrorKind::Io);
                            std::thread::sleep(crate::net::ACCEPT_BACKOFF);
                        }
                        _ => return Err(io::Error::new(e.kind(), format!("accept failed: {e}"))),
                    }
                    break;
                }
            };
            ctx.stats.accepted();
            if !gate.enter() {
                common::close_fd(fd);
                ctx.stats.refused();
                continue;
            }
            // Open from now on (the worker does not count it again): the counters never
            // show a connection in transit as neither refused nor open.
            ctx.stats.conn_opened();
            let target = targets[next];
            next = (next + 1) % targets.len();
            if let Err(e) = post(ring, target, fd, token(0, Op::Handoff)) {
                common::close_fd(fd);
                gate.leave();
                ctx.stats.error(ErrorKind::of_io(&e));
                ctx.stats.conn_closed();
            }
        }
    }
}

/// Posts a completion (result `res`, `user_data`) into the ring `target` and waits until the
/// kernel has done it.
fn post(ring: &mut IoUring, target: RawFd, res: i32, user_data: u64) -> io::Result<()> {
    let e = opcode::MsgRingData::new(types::Fd(target), res, user_data, None)
        .build()
        .user_data(0);
    common::push(ring, &e)?;
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    let cqe = ring
        .completion()
        .next()
        .ok_or_else(|| io::Error::other("MSG_RING completion missing"))?;
    if cqe.result() < 0 {
        return Err(io::Error::from_raw_os_error(-cqe.result()));
    }
    Ok(())
}

#[cfg(test)]
mod serve_tests {
    crate::testing::serve_tests!(super::run);
}
