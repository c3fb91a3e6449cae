//! `epoll`: one edge-triggered epoll loop per core, each with its own listener.
//!
//! Mirrors seed 000's readiness server family (WSAEventSelect / WaitForMultipleObjects,
//! annex A.1) and seed 003's WSAEventSelect model, without their 64-handle limit: each loop
//! owns an epoll instance, a listener and its connections, and shares nothing with the other
//! loops but the counters (shared-nothing, as nginx does with `reuseport`).
//!
//! Decisions:
//! - Listeners: one SO_REUSEPORT listener per loop, so the kernel spreads new connections
//!   over the loops by hash and no two loops ever contend on one accept queue (the
//!   alternative, one shared listener with EPOLLEXCLUSIVE, still wakes a loop that may find
//!   the queue already drained). The cost: a busy loop's queue is not stolen by idle ones.
//! - Edge-triggered: each connection is registered once for EPOLLIN|EPOLLOUT|EPOLLRDHUP with
//!   EPOLLET and never re-armed; every event drives the connection until its read or write
//!   would block ([`Conn::progress`]), which is what edge triggering requires.
//! - Workers: `--workers N` loops, 0 = one per core (available parallelism).
//! - `max_conns` is server-wide (one atomic count over all loops).
//! - Deadlines (`iolab_http::Deadline`: a head's, a stalled send's, the idle one): each loop
//!   sweeps its connections every [`sweep_interval`]; a connection past its deadline is
//!   closed (counted as a timeout) within that slack.

use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use iolab_sys::cvt;

use crate::net::{self, Conn, Want};
use crate::stats::ErrorKind;
use crate::Ctx;

const STOP: u64 = u64::MAX;
const LISTENER: u64 = u64::MAX - 1;
/// Events fetched per `epoll_wait`.
const EVENTS: usize = 256;

/// Loops for a configuration.
pub fn workers(config: &crate::Config) -> usize {
    if config.workers == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        config.workers
    }
}

/// How often a loop looks for connections past their deadline: a thirty-second of the
/// shortest timeout, within 10 ms..1 s (a 2 s head deadline is kept within 63 ms).
pub fn sweep_interval(shortest: Duration) -> Duration {
    (shortest / 32).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

struct Epoll(OwnedFd);

impl Epoll {
    fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 returns a new descriptor or -1.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: fd is fresh and owned by nobody else.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn add(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: valid epoll descriptor and event struct; the kernel copies the event.
        cvt(unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) })?;
        Ok(())
    }

    fn wait(&self, events: &mut [libc::epoll_event], timeout_ms: i32) -> io::Result<usize> {
        // SAFETY: `events` is a writable array of its length.
        let n = cvt(unsafe {
            libc::epoll_wait(
                self.0.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                timeout_ms,
            )
        })?;
        Ok(n as usize)
    }
}

pub fn run(ctx: &Ctx) -> io::Result<()> {
    let cfg = &ctx.config;
    let n = workers(cfg);
    // Every listener is bound here, so that errors (address in use) come before any loop.
    let listeners = net::listen_group(cfg.addr, cfg.backlog, n, true)?;
    let held = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for (i, listener) in listeners.into_iter().enumerate() {
            let held = &held;
            let b = std::thread::Builder::new().name(format!("epoll-{i}"));
            match b.spawn_scoped(scope, move || event_loop(ctx, listener, held)) {
                Ok(h) => handles.push(h),
                Err(e) => {
                    ctx.shutdown.trigger();
                    return Err(e);
                }
            }
        }
        let mut result = Ok(());
        for h in handles {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("epoll loop panicked")));
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

fn event_loop(ctx: &Ctx, listener: TcpListener, held: &AtomicUsize) -> io::Result<()> {
    let stats = &*ctx.stats;
    let ep = Epoll::new()?;
    ep.add(ctx.shutdown.fd(), libc::EPOLLIN as u32, STOP)?;
    ep.add(
        listener.as_raw_fd(),
        (libc::EPOLLIN | libc::EPOLLET) as u32,
        LISTENER,
    )?;
    let conn_events = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;
    let mut conns: slab::Slab<Conn> = slab::Slab::new();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS];
    let mut buf = vec![0u8; ctx.config.buffers.read_buf];
    let sweep = ctx.config.timeouts().shortest().map(sweep_interval);
    let mut next_sweep = sweep.map(|s| Instant::now() + s);

    let close = |conns: &mut slab::Slab<Conn>, key: usize| {
        // Dropping the socket closes it, which also removes it from the epoll set.
        conns.remove(key);
        held.fetch_sub(1, Ordering::Relaxed);
        stats.conn_closed();
    };

    // Accepts every queued connection; false after an error like EMFILE, which leaves
    // connections queued without a new edge to come: `accept_retry` then polls the queue.
    let accept_all = |conns: &mut slab::Slab<Conn>| -> bool {
        net::accept_all(&listener, stats, |stream| {
            if held.fetch_add(1, Ordering::Relaxed) >= ctx.config.max_conns {
                held.fetch_sub(1, Ordering::Relaxed);
                stats.refused();
                return;
            }
            stats.conn_opened();
            let entry = conns.vacant_entry();
            let key = entry.key();
            let registered = net::prepare(&stream, true)
                .and_then(|_| ep.add(stream.as_raw_fd(), conn_events, key as u64));
            if registered.is_err() {
                stats.error(ErrorKind::Io);
                held.fetch_sub(1, Ordering::Relaxed);
                stats.conn_closed();
                return;
            }
            // Data often arrives with the connection: registering an already readable
            // socket queues its first event, so `progress` runs from the event loop.
            entry.insert(Conn::new(stream, ctx));
        })
    };
    let mut accept_retry: Option<Instant> = None;

    'run: loop {
        let wake = match (next_sweep, accept_retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timeout = net::timeout_ms(wake, Instant::now());
        let n = match ep.wait(&mut events, timeout) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io::Error::new(e.kind(), format!("epoll_wait: {e}"))),
        };
        for ev in &events[..n] {
            match ev.u64 {
                STOP => break 'run,
                LISTENER => {
                    if !accept_all(&mut conns) {
                        accept_retry = Some(Instant::now() + net::ACCEPT_BACKOFF);
                    }
                }
                token => {
                    let key = token as usize;
                    let Some(conn) = conns.get_mut(key) else {
                        continue;
                    };
                    if conn.progress(&mut buf, stats) == Want::Close {
                        close(&mut conns, key);
                    }
                }
            }
        }
        if accept_retry.is_some_and(|t| t <= Instant::now()) {
            accept_retry = (!accept_all(&mut conns)).then(|| Instant::now() + net::ACCEPT_BACKOFF);
        }
        if let (Some(every), Some(at)) = (sweep, next_sweep) {
            let now = Instant::now();
            if now >= at {
                let expired: Vec<usize> = conns
                    .iter()
                    .filter(|(_, c)| c.deadline().is_some_and(|d| d <= now))
                    .map(|(k, _)| k)
                    .collect();
                for key in expired {
                    stats.error(ErrorKind::Timeout);
                    close(&mut conns, key);
                }
                next_sweep = Some(now + every);
            }
        }
    }
    for key in conns.iter().map(|(k, _)| k).collect::<Vec<_>>() {
        close(&mut conns, key);
    }
    Ok(())
}
