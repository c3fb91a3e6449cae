//! `uring-callback` — seed 000's **CR** (`--accept sync`) and **CR-iocp** (`--accept async`)
//! on io_uring.
//!
//! The CR servers passed a *completion routine* to every `WSARecv`/`WSASend`: when the
//! operation finished, Windows queued the routine as an APC to the thread that issued the call,
//! and ran it the next time that thread waited "alertably". Here each client operation is
//! submitted with a boxed callback (`FnOnce(&mut Loop, result)`), and the SQE's `user_data` is
//! the address of that box, as the `OVERLAPPED` led to the routine. Each worker thread
//! (`workers`, 0 = one per core) owns a ring and its own listener (SO_REUSEPORT); only the
//! thread that submitted an operation reaps its completion and runs its callback — the APC
//! rule. A connection has no state record in a table: its state (`Conn`) is owned by the
//! callback of the one operation it has in flight, and moves on to the next callback — the
//! continuation-passing style the seed's routines were written in.
//!
//! The two ways to accept, as in the seed:
//! - `--accept sync` (CR): the loop is centred on a synchronous `accept4`, called until the
//!   kernel's queue is empty; each connection is started up to its first I/O. When the
//!   queue is empty the thread waits — in `io_uring_enter`, for completions *or* the
//!   listener becoming readable (one POLL_ADD on it) — and runs the callbacks of whatever
//!   completed: the "alertable wait" of CR's blocking accept.
//! - `--accept async` (CR-iocp): `AcceptEx` could not take a completion routine, so CR-iocp
//!   accepted through a completion port and dispatched those packets in its main loop. Here:
//!   [`ACCEPTS_AHEAD`](common::ACCEPTS_AHEAD) accepts are posted with a plain tag instead of
//!   a callback, and the loop handles them itself; everything else runs by callback.
//!
//! File bytes (a cache miss, the chunks of a large file) are read with `IORING_OP_READ` and
//! a completion routine too, like any client I/O: a slow disk delays only its connection.
//!
//! The connection's state machine is the one every io_uring model runs
//! ([`crate::uring_conn`]: the same steps, the same rule for the next one); what is this
//! model's own is that each step is a routine that owns the connection.
//!
//! The idle timeout, the stop request, and the accept-side events are the loop's own
//! plumbing (tagged `user_data`, or callbacks on the loop); every client I/O is a callback.
//! Idle timeout and shutdown: see [`crate::uring_common`] (a registry of open sockets per
//! worker holds what the tick and the stop need: each connection's `uring_conn::Socket`).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Instant;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use iolab_http::{FileRead, FileReads, Session, Site};
use slab::Slab;

use crate::stats::{ErrorKind, Stats};
use crate::uring_common::{self as common, Gate, StartLine};
use crate::uring_conn::{self as conn, IoMemory, Next, Socket, Step};
use crate::{AcceptMode, Ctx, Shutdown};

pub fn run(ctx: &Ctx) -> io::Result<()> {
    let n = common::worker_count(ctx.config.workers);
    let mode = ctx.config.accept;
    let sockets = common::bound_sockets(ctx, n, mode == AcceptMode::Sync)?;
    let gate = Arc::new(Gate::new(ctx.config.max_conns));
    let start = StartLine::new(n);
    let name = match mode {
        AcceptMode::Sync => "uring-cr",
        AcceptMode::Async => "uring-cr-iocp",
    };
    common::run_workers(ctx, sockets, name, |_, sock| {
        let worker = Loop::new(ctx, Arc::clone(&gate), sock);
        start.arrive_and_wait(&ctx.shutdown);
        worker?.serve()
    })
}

/// A completion routine: run by the worker that submitted the operation, with its result.
type Routine = Box<dyn FnOnce(&mut Loop, i32) -> io::Result<()>>;

/// `user_data` of an accept posted ahead (`--accept async`): handled by the loop itself.
const ACCEPT: u64 = 1;
/// `user_data` of the POLL_ADD on the listener (`--accept sync`): time to call accept again.
const LISTENER_READY: u64 = 2;
// Callback addresses are heap pointers, never 1 or 2.

/// A connection's state, owned by the callback of its operation in flight (what the tick
/// and the stop request need, its `Socket`, is in the worker's registry).
struct Conn {
    fd: RawFd,
    /// Its socket's entry in the worker's registry.
    key: usize,
    session: Session,
    buf: Box<[u8]>,
    mem: IoMemory,
}

pub struct Loop {
    ring: IoUring,
    listener: OwnedFd,
    mode: AcceptMode,
    backlog: u32,
    site: Arc<Site>,
    buffers: crate::Buffers,
    stats: Arc<Stats>,
    shutdown: Arc<Shutdown>,
    gate: Arc<Gate>,
    registry: Slab<Socket>,
    in_flight: usize,
    /// `--accept async`: accepts posted now.
    accepts: usize,
    /// `--accept sync`: the POLL_ADD on the listener is in flight.
    listener_armed: bool,
    stopping: bool,
    timeouts: iolab_http::Timeouts,
    /// Set after an accept failed for want of descriptors: no accepts meanwhile.
    accept_pause: common::AcceptPause,
    tick: types::Timespec,
    /// `user_data` of the tick in flight, to remove it at the stop.
    tick_user_data: u64,
    now: Instant,
}

impl Loop {
    fn new(ctx: &Ctx, gate: Arc<Gate>, listener: OwnedFd) -> io::Result<Loop> {
        Ok(Loop {
            ring: common::ring()?,
            listener,
            mode: ctx.config.accept,
            backlog: ctx.config.backlog,
            site: Arc::clone(&ctx.site),
            buffers: ctx.config.buffers,
            stats: Arc::clone(&ctx.stats),
            shutdown: Arc::clone(&ctx.shutdown),
            gate,
            registry: Slab::new(),
            in_flight: 0,
            accepts: 0,
            listener_armed: false,
            stopping: false,
            timeouts: ctx.config.timeouts(),
            accept_pause: common::AcceptPause::default(),
            tick: common::tick_period(ctx.config.timeouts()).into(),
            tick_user_data: 0,
            now: Instant::now(),
        })
    }

    /// Submits `entry`; `routine` runs on this thread when it completes.
    fn submit(
        &mut self,
        entry: squeue::Entry,
        routine: impl FnOnce(&mut Loop, i32) -> io::Result<()> + 'static,
    ) -> io::Result<u64> {
        self.submit_routine(
            |ring, user_data| common::push(ring, &entry.user_data(user_data)),
            routine,
        )
    }

    /// As [`Loop::submit`], for a file read (possibly two linked entries).
    fn submit_with(
        &mut self,
        entries: common::FileReadEntries,
        routine: impl FnOnce(&mut Loop, i32) -> io::Result<()> + 'static,
    ) -> io::Result<u64> {
        self.submit_routine(|ring, user_data| entries.push(ring, user_data), routine)
    }

    /// Boxes `routine`, queues with `push` the entries whose completion runs it (their
    /// `user_data` is the box's address), and counts them in flight.
    fn submit_routine(
        &mut self,
        push: impl FnOnce(&mut IoUring, u64) -> io::Result<()>,
        routine: impl FnOnce(&mut Loop, i32) -> io::Result<()> + 'static,
    ) -> io::Result<u64> {
        let routine: Box<Routine> = Box::new(Box::new(routine));
        let ptr = Box::into_raw(routine);
        let user_data = ptr as u64;
        if let Err(e) = push(&mut self.ring, user_data) {
            // SAFETY: ptr came from Box::into_raw just above and no entry that completes was
            // queued with it.
            drop(unsafe { Box::from_raw(ptr) });
            return Err(e);
        }
        self.in_flight += 1;
        Ok(user_data)
    }

    /// Submits `entry` with a tag the loop dispatches itself.
    fn submit_tagged(&mut self, entry: squeue::Entry, tag: u64) -> io::Result<()> {
        common::push(&mut self.ring, &entry.user_data(tag))?;
        self.in_flight += 1;
        Ok(())
    }

    fn serve(mut self) -> io::Result<()> {
        let result = self.event_loop();
        if self.in_flight > 0 {
            // Only on an unexpected ring error. The callbacks still in flight own their
            // connections' buffers; they are never run nor freed (the kernel may write there).
            tracing::warn!(
                "uring-callback: stopping with {} operations in flight",
                self.in_flight
            );
        }
        result
    }

    fn event_loop(&mut self) -> io::Result<()> {
        common::start_listening(&self.listener, self.backlog)?;
        arm_stop(self)?;
        arm_tick(self)?;
        match self.mode {
            AcceptMode::Async => self.post_accepts()?,
            AcceptMode::Sync => self.accept_sync()?,
        }
        let mut cqes: Vec<cqueue::Entry> = Vec::with_capacity(common::RING_ENTRIES as usize * 4);
        while !(self.stopping && self.in_flight == 0) {
            common::submit_and_wait(&mut self.ring)?;
            common::drain(&mut self.ring, &mut cqes);
            self.now = Instant::now();
            for cqe in &cqes {
                self.in_flight -= 1;
                match cqe.user_data() {
                    ACCEPT => self.on_accept(cqe.result())?,
                    LISTENER_READY => {
                        self.listener_armed = false;
                        self.accept_sync()?;
                    }
                    common::NO_COMPLETION => {
                        return Err(io::Error::other("a completion that must not come"));
                    }
                    ptr => {
                        // SAFETY: every other user_data is a pointer made by `submit` with
                        // Box::into_raw, completed exactly once, so reclaimed exactly once.
                        let routine: Box<Routine> = unsafe { Box::from_raw(ptr as *mut Routine) };
                        (*routine)(self, cqe.result())?;
                    }
                }
            }
        }
        Ok(())
    }

    // --- accepting -------------------------------------------------------------------------

    /// CR-iocp: accepts posted ahead, re-posted as they complete.
    fn post_accepts(&mut self) -> io::Result<()> {
        let fd = self.listener.as_raw_fd();
        if !self.accept_pause.allows(self.now) {
            return Ok(());
        }
        while !self.stopping && self.accepts < common::ACCEPTS_AHEAD {
            self.submit_tagged(common::accept_entry(fd), ACCEPT)?;
            self.accepts += 1;
        }
        Ok(())
    }

    fn on_accept(&mut self, res: i32) -> io::Result<()> {
        self.accepts -= 1;
        self.accept_pause.after(res, self.now);
        let Some(fd) = common::accepted(res, &self.stats) else {
            return Ok(());
        };
        self.post_accepts()?;
        self.take(fd)
    }

    /// CR: accept synchronously until the kernel's queue is empty, then wait (in the ring)
    /// for the listener to become readable again.
    fn accept_sync(&mut self) -> io::Result<()> {
        let listener = self.listener.as_raw_fd();
        if !self.accept_pause.allows(self.now) {
            return Ok(());
        }
        while !self.stopping {
            let e = match common::accept(listener) {
                Ok(fd) => {
                    self.take(fd)?;
                    continue;
                }
                Err(e) => e,
            };
            match e.raw_os_error() {
                Some(libc::EAGAIN) => break,
                Some(libc::EINTR | libc::ECONNABORTED | libc::EPROTO) => continue,
                Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                    // The listener stays readable: wait for the backoff, not for it.
                    self.stats.error(ErrorKind::Io);
                    self.accept_pause.after(-libc::EMFILE, self.now);
                    return Ok(());
                }
                _ => return Err(io::Error::new(e.kind(), format!("accept failed: {e}"))),
            }
        }
        if !self.stopping && !self.listener_armed {
            let e = opcode::PollAdd::new(types::Fd(listener), libc::POLLIN as u32).build();
            self.submit_tagged(e, LISTENER_READY)?;
            self.listener_armed = true;
        }
        Ok(())
    }

    /// A socket was accepted: refuse it, or start serving it up to its first I/O.
    fn take(&mut self, fd: RawFd) -> io::Result<()> {
        self.stats.accepted();
        if self.stopping || !self.gate.enter() {
            common::close_fd(fd);
            self.stats.refused();
            return Ok(());
        }
        self.stats.conn_opened();
        let key = self
            .registry
            .insert(Socket::new(fd, self.timeouts, self.now));
        let conn = Box::new(Conn {
            fd,
            key,
            session: Session::with_file_reads(Arc::clone(&self.site), FileReads::Caller),
            buf: vec![0u8; self.buffers.read_buf].into_boxed_slice(),
            mem: IoMemory::new(self.buffers.max_iov),
        });
        receive(self, conn)
    }

    /// The connection's socket in the registry, now waiting for `step`.
    fn step(&mut self, conn: &Conn, step: Step) -> &mut Socket {
        let socket = &mut self.registry[conn.key];
        socket.step = step;
        socket
    }
}

// --- one connection, callback by callback ------------------------------------------------------

fn receive(lp: &mut Loop, mut conn: Box<Conn>) -> io::Result<()> {
    lp.step(&conn, Step::Receiving);
    // The buffer is a boxed slice owned by `conn`, which the callback owns until it runs, after
    // the receive has completed.
    let e = opcode::Recv::new(
        types::Fd(conn.fd),
        conn.buf.as_mut_ptr(),
        conn.buf.len() as u32,
    )
    .build();
    lp.submit(e, move |lp, res| on_received(lp, conn, res))?;
    Ok(())
}

fn on_received(lp: &mut Loop, mut conn: Box<Conn>, res: i32) -> io::Result<()> {
    let Some(n) = lp.registry[conn.key].received(res) else {
        return close(lp, conn);
    };
    let stats = &lp.stats;
    let Conn { session, buf, .. } = &mut *conn;
    session.feed(&buf[..n], |status| stats.response(status));
    lp.registry[conn.key].update(&conn.session, lp.now);
    next(lp, conn)
}

/// After a receive, a send or a file read (see [`conn::next`]).
fn next(lp: &mut Loop, mut conn: Box<Conn>) -> io::Result<()> {
    match conn::next(&mut conn.session, lp.stopping) {
        Next::ReadFile(job) => read_file(lp, conn, job),
        Next::Send => send(lp, conn),
        Next::Close => close(lp, conn),
        Next::Receive => receive(lp, conn),
    }
}

fn send(lp: &mut Loop, mut conn: Box<Conn>) -> io::Result<()> {
    // The memory is inside the boxed Conn (moving the box does not move it), which the
    // callback owns until the send has completed.
    let Some(e) = conn.mem.send(&conn.session, conn.fd) else {
        return close(lp, conn);
    };
    lp.step(&conn, Step::Sending);
    lp.submit(e, move |lp, res| on_sent(lp, conn, res))?;
    Ok(())
}

fn read_file(lp: &mut Loop, mut conn: Box<Conn>, job: FileRead) -> io::Result<()> {
    lp.step(&conn, Step::ReadingFile);
    // The routine owns the boxed Conn, and so the read's buffer, its job (the open
    // descriptor) and its delay, until the read completes; moving the box moves none of them.
    let entries = conn.mem.read_file(job);
    lp.submit_with(entries, move |lp, res| on_file_read(lp, conn, res))?;
    Ok(())
}

fn on_file_read(lp: &mut Loop, mut conn: Box<Conn>, res: i32) -> io::Result<()> {
    let Conn { session, mem, .. } = &mut *conn;
    if !mem.file_read_done(res, session, &lp.stats) {
        return close(lp, conn);
    }
    lp.registry[conn.key].update(&conn.session, lp.now);
    next(lp, conn)
}

fn on_sent(lp: &mut Loop, mut conn: Box<Conn>, res: i32) -> io::Result<()> {
    let Some(n) = lp.registry[conn.key].sent(res) else {
        return close(lp, conn);
    };
    conn::advance(&mut conn.session, n, &lp.stats);
    lp.registry[conn.key].update(&conn.session, lp.now);
    next(lp, conn)
}

fn close(lp: &mut Loop, conn: Box<Conn>) -> io::Result<()> {
    conn::linger_if_needed(&conn.session, conn.fd);
    lp.step(&conn, Step::Closing);
    let e = conn::close_entry(conn.fd);
    lp.submit(e, move |lp, _| {
        let key = conn.key;
        // Everything the connection holds is released before it is counted closed.
        drop(conn);
        lp.registry.remove(key).closed(&lp.stats, &lp.gate);
        Ok(())
    })?;
    Ok(())
}

// --- the loop's own callbacks: idle tick and stop ----------------------------------------------

fn arm_tick(lp: &mut Loop) -> io::Result<()> {
    // The kernel copies the timespec when the SQE is submitted; it lives in the loop.
    let e = opcode::Timeout::new(&lp.tick).build();
    lp.tick_user_data = lp.submit(e, |lp, _| on_tick(lp))?;
    Ok(())
}

fn on_tick(lp: &mut Loop) -> io::Result<()> {
    if lp.stopping {
        return Ok(());
    }
    let now = lp.now;
    for (_, socket) in lp.registry.iter_mut() {
        socket.shut_if_expired(now);
    }
    match lp.mode {
        AcceptMode::Async => lp.post_accepts()?,
        AcceptMode::Sync => lp.accept_sync()?,
    }
    arm_tick(lp)
}

fn arm_stop(lp: &mut Loop) -> io::Result<()> {
    lp.submit(common::stop_entry(&lp.shutdown), |lp, _| on_stop(lp))?;
    Ok(())
}

fn on_stop(lp: &mut Loop) -> io::Result<()> {
    lp.stopping = true;
    let cancel = common::cancel_accepts_entry(lp.listener.as_raw_fd());
    lp.submit(cancel, |_, _| Ok(()))?;
    lp.submit(
        opcode::TimeoutRemove::new(lp.tick_user_data).build(),
        |_, _| Ok(()),
    )?;
    for (_, socket) in lp.registry.iter_mut() {
        socket.shut_for_stop();
    }
    Ok(())
}

#[cfg(test)]
mod serve_tests {
    use crate::testing::exercise;
    use crate::AcceptMode;

    #[test]
    fn serves_with_synchronous_accept_cr() {
        exercise(super::run, 1, AcceptMode::Sync);
        exercise(super::run, 2, AcceptMode::Sync);
    }

    #[test]
    fn slow_file_reads_hold_up_only_their_connection() {
        use crate::testing::slow_reads_hold_up_only_their_connection as check;
        check(super::run, AcceptMode::Sync);
        check(super::run, AcceptMode::Async);
    }

    #[test]
    fn serves_with_accepts_on_the_ring_cr_iocp() {
        exercise(super::run, 1, AcceptMode::Async);
        exercise(super::run, 2, AcceptMode::Async);
    }
}
