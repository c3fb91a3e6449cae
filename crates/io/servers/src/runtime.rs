//! `runtime`: CPC's web server (seed 000 §2.2) on iolab-runtime — threaded-style code, one
//! lightweight task per connection, completion I/O underneath (io_uring; epoll fallback).
//!
//! Each worker loop (`--workers`, 0 = one per core) owns a SO_REUSEPORT listener with
//! several accepts in flight (the pre-posted AcceptEx of the seed's CPC server) and spawns a
//! task per accepted connection. The task reads, feeds the `Session`, writes what is pending
//! — the same loop as the `threads` model, with `.await` where that one blocks. The deadline
//! (`iolab_http::Deadline`: a request head's, from its first byte; a send's, from its last
//! progress; the idle one between requests) is one timer per connection, set to the phase's
//! deadline before each read and write and raced against it (`timeout_with`; on expiry the
//! operation is dropped, which cancels it), so a loop's
//! timer structure holds one entry per connection, not one per operation;
//! a stop request wakes every loop through the shutdown eventfd (`wait_readable`) and is
//! broadcast on a `Cond` that cancels every accept, read and write in flight.
//! `max_conns` is server-wide (one atomic count over all loops).
//!
//! Per request, on a keep-alive connection: the next read is started alongside the
//! answer's write, so one `io_uring_enter` posts it and the task is not woken in between
//! (its bytes are fed once the answer is out, so the session sees no input while output is
//! pending); the write itself usually completes on the task's thread
//! (`Operation::attempt_inline`). Per connection: TCP_NODELAY comes from the listener
//! (accepted sockets inherit it), and a loop reuses the receive buffers of closed
//! connections (at most [`SPARE_BUFFERS`]).
//!
//! File bytes (a cache miss, the chunks of a large file) are read on the runtime's blocking
//! pool (`detach`), the task waiting meanwhile: CPC's way of running a blocking call off the
//! loop. A slow disk holds up only the connection waiting for it, on either driver (the
//! runtime's `File::read_at` would run on the loop under the epoll fallback).

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iolab_http::{Deadline, FileReads, Session};
use iolab_runtime::net::{TcpListener, TcpStream};
use iolab_runtime::{
    cancellable, detach, sleep, spawn, timeout_with, wait_readable, Cancelled, Cond, Runtime, Sleep,
};

use crate::net;
use crate::stats::ErrorKind;
use crate::{Ctx, Shutdown, Stats};

/// Accepts kept in flight per loop.
const ACCEPTS: usize = 4;

/// Receive buffers of closed connections a loop keeps for the next ones (at the default
/// 16 KiB, 1 MiB per loop at most): a new connection then costs no allocation and no
/// zeroing of its buffer.
const SPARE_BUFFERS: usize = 64;

/// What every loop shares.
#[derive(Clone)]
struct Env {
    site: Arc<iolab_http::Site>,
    stats: Arc<Stats>,
    shutdown: Arc<Shutdown>,
    held: Arc<AtomicUsize>,
    max_conns: usize,
    timeouts: iolab_http::Timeouts,
    buffers: crate::Buffers,
}

/// The stop state of one loop: a flag for tasks that are running, a Cond for those waiting.
#[derive(Clone)]
struct Stop {
    flag: Rc<Cell<bool>>,
    cond: Cond,
}

/// What one loop's connections share besides [`Env`].
#[derive(Clone)]
struct LoopState {
    /// Receive buffers handed back by closed connections (at most [`SPARE_BUFFERS`]).
    spare: Rc<std::cell::RefCell<Vec<Vec<u8>>>>,
    /// TCP_NODELAY is set on the listener, so accepted sockets have it already (Linux
    /// copies it to them): no setsockopt per connection.
    nodelay_inherited: bool,
}

impl LoopState {
    fn take_buffer(&self, len: usize) -> Vec<u8> {
        match self.spare.borrow_mut().pop() {
            Some(b) if b.len() == len => b,
            _ => vec![0u8; len],
        }
    }

    fn give_back(&self, buf: Vec<u8>) {
        let mut spare = self.spare.borrow_mut();
        if spare.len() < SPARE_BUFFERS {
            spare.push(buf);
        }
    }
}

pub fn run(ctx: &Ctx) -> io::Result<()> {
    let cfg = &ctx.config;
    let n = crate::epoll::workers(cfg);
    // Every listener is bound before any loop starts (an address in use fails here).
    let listeners = net::listen_group(cfg.addr, cfg.backlog, n, true)?;
    let env = Env {
        site: ctx.site.clone(),
        stats: ctx.stats.clone(),
        shutdown: ctx.shutdown.clone(),
        held: Arc::new(AtomicUsize::new(0)),
        max_conns: cfg.max_conns,
        timeouts: cfg.timeouts(),
        buffers: cfg.buffers,
    };
    let rt = Runtime::builder().workers(n).build()?;
    rt.block_on(async {
        let loops = iolab_runtime::workers();
        let mut joins = Vec::new();
        for (l, listener) in loops.iter().zip(listeners) {
            let env = env.clone();
            joins.push(l.spawn_with(move || worker(env, listener)));
        }
        let mut result = Ok(());
        for j in joins {
            let r = j.await.map_err(io::Error::from).and_then(|r| r);
            if let Err(e) = r {
                // One loop failing stops the server: the others would serve a partial port.
                ctx.shutdown.trigger();
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        result
    })
}

async fn worker(env: Env, listener: std::net::TcpListener) -> io::Result<()> {
    let nodelay_inherited = socket2::SockRef::from(&listener)
        .set_tcp_nodelay(true)
        .is_ok();
    let state = LoopState {
        spare: Default::default(),
        nodelay_inherited,
    };
    let listener = TcpListener::from_std(listener)?;
    let stop = Stop {
        flag: Rc::new(Cell::new(false)),
        cond: Cond::new(),
    };
    {
        let (stop, shutdown) = (stop.clone(), env.shutdown.clone());
        spawn(async move {
            // The eventfd stays readable once triggered, so every loop sees it.
            while !shutdown.is_triggered() {
                if wait_readable(shutdown.fd()).await.is_err() {
                    iolab_runtime::sleep(Duration::from_millis(50)).await;
                }
            }
            stop.flag.set(true);
            stop.cond.broadcast();
        });
    }
    let live = Rc::new(Cell::new(0usize));
    let all_closed = Cond::new();
    let mut acceptor = listener.accept_many(ACCEPTS);
    while !stop.flag.get() {
        let stream = match cancellable(&stop.cond, acceptor.next()).await {
            Err(Cancelled) => break,
            Ok(Ok((s, _))) => s,
            Ok(Err(e)) if net::transient_accept_error(&e) => continue,
            Ok(Err(e)) => {
                // EMFILE and the like: wait for descriptors to free up rather than spin.
                env.stats.io_error(&e);
                let _ = iolab_runtime::sleep_or_cancel(net::ACCEPT_BACKOFF, &stop.cond).await;
                continue;
            }
        };
        env.stats.accepted();
        if env.held.fetch_add(1, Ordering::AcqRel) >= env.max_conns {
            env.held.fetch_sub(1, Ordering::AcqRel);
            env.stats.refused();
            continue;
        }
        env.stats.conn_opened();
        live.set(live.get() + 1);
        let (env, stop, live, all_closed, state) = (
            env.clone(),
            stop.clone(),
            live.clone(),
            all_closed.clone(),
            state.clone(),
        );
        spawn(async move {
            if serve(&stream, &env, &stop, &state).await {
                // Ended by an error answer: the socket lingers in a duplicate.
                if let Some(dup) = crate::linger::dup(std::os::fd::AsRawFd::as_raw_fd(&stream)) {
                    crate::linger::linger(dup);
                }
            }
            drop(stream);
            env.held.fetch_sub(1, Ordering::AcqRel);
            env.stats.conn_closed();
            live.set(live.get() - 1);
            if live.get() == 0 {
                all_closed.broadcast();
            }
        });
    }
    drop(acceptor);
    drop(listener);
    while live.get() > 0 {
        all_closed.wait().await;
    }
    Ok(())
}

/// How one wait of a connection ended.
enum Waited<T> {
    Done(T),
    TimedOut,
    Stopped,
}

/// A connection's deadline and its one timer, set to it before each operation.
struct Timer {
    deadline: Deadline,
    timer: Sleep,
}

async fn wait<F: Future>(timer: &mut Timer, stop: &Stop, fut: F) -> Waited<F::Output> {
    if stop.flag.get() {
        return Waited::Stopped;
    }
    let fut = cancellable(&stop.cond, fut);
    let r = match timer.deadline.at() {
        Some(at) => {
            timer.timer.reset(at);
            match timeout_with(&mut timer.timer, fut).await {
                Ok(r) => r,
                Err(_) => return Waited::TimedOut,
            }
        }
        None => fut.await,
    };
    match r {
        Ok(v) => Waited::Done(v),
        Err(Cancelled) => Waited::Stopped,
    }
}

/// One connection, threaded style; true when it ends with an error answer, flushed, to
/// close lingering.
async fn serve(stream: &TcpStream, env: &Env, stop: &Stop, state: &LoopState) -> bool {
    let mut session = Session::with_file_reads(env.site.clone(), FileReads::Caller);
    let mut buf = Some(state.take_buffer(env.buffers.read_buf));
    serve_session(stream, &mut session, env, stop, state, &mut buf).await;
    if let Some(b) = buf {
        state.give_back(b);
    }
    session.lingers() && !session.has_pending()
}

/// `buf`: the receive buffer, here between reads, in the read's operation record during
/// one (and gone with it when a read is cancelled).
async fn serve_session(
    stream: &TcpStream,
    session: &mut Session,
    env: &Env,
    stop: &Stop,
    state: &LoopState,
    buf: &mut Option<Vec<u8>>,
) {
    let stats = &env.stats;
    if !state.nodelay_inherited && stream.set_nodelay(true).is_err() {
        return stats.error(ErrorKind::Io);
    }
    // The read in flight, if any. It is started alongside each write of a keep-alive
    // connection (one io_uring_enter submits both, and the task is not woken in between
    // just to post the read), and awaited once the answer is out; what it brings is fed
    // only then, so the session still sees no input while output is pending.
    let mut read = pin!(None);
    let mut read_done = None;
    let now = Instant::now();
    let mut timer = Timer {
        deadline: Deadline::new(env.timeouts, now),
        timer: sleep(Duration::ZERO),
    };
    loop {
        if let Some(job) = session.file_read() {
            // Not raced against the timer: a disk read is not the client being slow.
            // A stop waits for it (bounded by the disk), then ends the connection.
            let result = detach(move || job.read_blocking()).await;
            session.file_read_done(result, |status| stats.response(status));
            timer.deadline.update(session, Instant::now());
            continue;
        }
        if session.has_pending() {
            let chunks: Vec<Bytes> = session
                .pending()
                .iter()
                .filter(|c| !c.is_empty())
                .take(env.buffers.max_iov)
                .cloned()
                .collect();
            // Only when the session holds no input of its own: with pipelined requests held
            // back, the next read would take more than one read's worth off the socket
            // while output is pending (Session::feed's contract; tests/models.rs,
            // read_buf_is_honoured).
            let early_read = read.is_none()
                && read_done.is_none()
                && !session.should_close()
                && session.is_between_requests();
            if early_read {
                if let Some(b) = buf.take() {
                    read.set(Some(stream.read(b)));
                }
            }
            let mut write = pin!(stream.writev(chunks));
            let write_and_read = poll_fn(|cx| {
                if let Some(r) = read.as_mut().as_pin_mut() {
                    if let Poll::Ready(v) = r.poll(cx) {
                        read_done = Some(v);
                        read.set(None);
                    }
                }
                write.as_mut().poll(cx)
            });
            match wait(&mut timer, stop, write_and_read).await {
                Waited::Done((Ok(n), _)) => {
                    session.advance(n);
                    // Requests held back while the queue was full (backpressure).
                    session.resume(|status| stats.response(status));
                    timer.deadline.update(session, Instant::now());
                }
                Waited::Done((Err(e), _)) if e.kind() == io::ErrorKind::Interrupted => {}
                Waited::Done((Err(e), _)) => return stats.io_error(&e),
                Waited::TimedOut => return stats.error(ErrorKind::Timeout),
                Waited::Stopped => return,
            }
            continue;
        }
        if session.should_close() {
            return;
        }
        let (r, b) = match read_done.take() {
            Some(done) => done,
            None => {
                if read.is_none() {
                    let Some(b) = buf.take() else { return };
                    read.set(Some(stream.read(b)));
                }
                let Some(r) = read.as_mut().as_pin_mut() else {
                    return;
                };
                match wait(&mut timer, stop, r).await {
                    Waited::Done(done) => {
                        read.set(None);
                        done
                    }
                    // The read is dropped with the task (cancelled in the kernel); its
                    // buffer is released there.
                    Waited::TimedOut => return stats.error(ErrorKind::Timeout),
                    Waited::Stopped => return,
                }
            }
        };
        let b = buf.insert(b);
        match r {
            Ok(0) => return,
            Ok(n) => {
                session.feed(&b[..n], |status| stats.response(status));
                timer.deadline.update(session, Instant::now());
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return stats.io_error(&e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LoopState, SPARE_BUFFERS};

    /// What `nodelay_inherited` relies on: Linux copies TCP_NODELAY from a listener to the
    /// sockets it accepts (if this fails on some kernel, the model sets it per connection
    /// only when setting it on the listener fails, so the answer would wait for Nagle).
    #[test]
    fn accepted_sockets_inherit_nodelay_from_the_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        socket2::SockRef::from(&l).set_tcp_nodelay(true).unwrap();
        let _client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        assert!(s.nodelay().unwrap());
    }

    /// A loop keeps at most SPARE_BUFFERS buffers, and hands out only one of the size asked.
    #[test]
    fn spare_buffers_are_bounded_and_sized() {
        let state = LoopState {
            spare: Default::default(),
            nodelay_inherited: true,
        };
        for _ in 0..SPARE_BUFFERS + 10 {
            state.give_back(vec![7u8; 16]);
        }
        assert_eq!(state.spare.borrow().len(), SPARE_BUFFERS);
        assert_eq!(state.take_buffer(16), vec![7u8; 16]);
        assert_eq!(state.take_buffer(32), vec![0u8; 32]);
    }

    #[test]
    fn slow_file_reads_hold_up_only_their_connection() {
        crate::testing::slow_reads_hold_up_only_their_connection(
            super::run,
            crate::AcceptMode::Async,
        );
    }
}
