//! `uring` — seed 000's **iocp2** on io_uring.
//!
//! iocp2 posted several `AcceptEx` calls ahead on its listening socket, allocated the state of
//! each client on demand, and ran one event loop around `GetQueuedCompletionStatus`: each
//! completion packet led, through the `OVERLAPPED` it carried, to the client's environment and
//! to "the next function to run". Here:
//!
//! - the completion port is an io_uring per worker thread (`workers`, 0 = one per core), each
//!   with its own listener on the same port (SO_REUSEPORT spreads connections over them);
//! - `AcceptEx` posted ahead is [`ACCEPTS_AHEAD`] `IORING_OP_ACCEPT`s kept in flight; each one
//!   is re-posted as soon as it completes;
//! - the client environment is a `Conn` allocated when its socket is accepted and freed when
//!   its close completes (a slab of boxes: the box never moves, so the kernel can hold
//!   pointers into it while an operation is in flight);
//! - the `OVERLAPPED` pointer is the SQE's `user_data`: (slab key, operation);
//! - "the next function to run" is `Step`, the one thing each connection waits for, set
//!   where the operation is submitted and matched when it completes;
//! - file bytes (a cache miss, the chunks of a large file) are read with `IORING_OP_READ`
//!   into a buffer the connection owns (`Step::ReadingFile`), as an iocp server read files
//!   with `ReadFile` on the same port: a slow disk holds up only the connection waiting.
//!
//! `uring-accept-sync` (iocp1) reuses this worker unchanged except for where sockets come
//! from (`Source::Handoff`): exactly the one difference between iocp1 and iocp2.
//!
//! Idle timeout and shutdown: see [`crate::uring_common`].

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, types, IoUring};
use iolab_http::{FileRead, FileReads, Session};
use slab::Slab;

use crate::stats::ErrorKind;
use crate::uring_common::{self as common, Gate, StartLine};
use crate::Ctx;

/// Accepts kept in flight on each worker's listener, as iocp2 kept `AcceptEx` calls posted.
pub const ACCEPTS_AHEAD: usize = 16;

/// Serves `ctx` until its shutdown: one ring and one listener per worker thread.
pub fn run(ctx: &Ctx) -> io::Result<()> {
    let n = common::worker_count(ctx.config.workers);
    let sockets = common::bound_sockets(ctx, n, false)?;
    let gate = Gate::new(ctx.config.max_conns);
    let start = StartLine::new(n);
    common::run_workers(ctx, sockets, "uring", |_, sock| {
        let worker = Worker::new(ctx, &gate, Source::Listener(sock));
        start.arrive_and_wait(&ctx.shutdown);
        worker?.serve()
    })
}

/// What an operation in flight is; the low byte of its `user_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Op {
    Accept = 1,
    Recv,
    Send,
    Close,
    /// The periodic idle-timeout tick.
    Tick,
    /// The POLL_ADD on the shutdown eventfd.
    Stop,
    /// Cancelling the accepts or the tick at shutdown.
    Cancel,
    /// A socket posted into this ring by the accept thread (`uring-accept-sync`); the
    /// completion's result is the descriptor.
    Handoff,
    /// The accept thread has stopped: no more `Handoff` will come.
    HandoffEnd,
    /// A read of file bytes the connection's session waits for.
    ReadFile,
}

impl Op {
    const ALL: [Op; 10] = [
        Op::Accept,
        Op::Recv,
        Op::Send,
        Op::Close,
        Op::Tick,
        Op::Stop,
        Op::Cancel,
        Op::Handoff,
        Op::HandoffEnd,
        Op::ReadFile,
    ];
}

/// `user_data` of an operation: the connection's key above the operation byte.
pub(crate) fn token(key: usize, op: Op) -> u64 {
    ((key as u64) << 8) | op as u64
}

fn untoken(user_data: u64) -> (usize, Option<Op>) {
    let op = Op::ALL
        .iter()
        .copied()
        .find(|op| *op as u64 == user_data & 0xff);
    ((user_data >> 8) as usize, op)
}

/// Where a worker's sockets come from.
pub(crate) enum Source {
    /// Its own listener, with [`ACCEPTS_AHEAD`] accepts posted on it (iocp2).
    Listener(OwnedFd),
    /// An accept thread that posts each socket into the ring with `IORING_OP_MSG_RING`
    /// (iocp1's `PostQueuedCompletionStatus`); its gate check is done by the accept thread.
    Handoff,
}

/// What a connection waits for: the next step of its state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// A receive is in flight; its completion feeds the HTTP session.
    Receiving,
    /// A send of the pending response bytes is in flight; its completion advances them.
    Sending,
    /// A read of file bytes is in flight; its completion hands them to the session.
    ReadingFile,
    /// The close is in flight; its completion frees the connection.
    Closing,
}

/// One client's environment, allocated when its socket arrives.
struct Conn {
    fd: RawFd,
    step: Step,
    session: Session,
    buf: Box<[u8]>,
    iov: Box<[libc::iovec]>,
    msg: libc::msghdr,
    /// The file read in flight and the buffer it reads into (both kept until it completes).
    file: Option<(FileRead, Vec<u8>)>,
    /// The test hook's delay before a file read (see `uring_common::file_read_entries`).
    delay: types::Timespec,
    /// When its last operation completed (for the idle timeout).
    last_io: Instant,
    /// The socket was shut down by the worker (idle timeout or stop): no second shutdown.
    shut: bool,
    /// Why it ends, counted when the close completes; None for an orderly end.
    fault: Option<ErrorKind>,
}

pub(crate) struct Worker<'a> {
    ctx: &'a Ctx,
    gate: &'a Gate,
    ring: IoUring,
    source: Source,
    conns: Slab<Box<Conn>>,
    /// Operations submitted and not yet completed; the worker returns only at zero.
    in_flight: usize,
    /// Accepts posted on the listener now.
    accepts: usize,
    stopping: bool,
    /// `uring-accept-sync`: the accept thread may still post sockets.
    handoff_open: bool,
    idle_timeout: Duration,
    tick: types::Timespec,
    now: Instant,
}

impl<'a> Worker<'a> {
    pub(crate) fn new(ctx: &'a Ctx, gate: &'a Gate, source: Source) -> io::Result<Worker<'a>> {
        Worker::with_ring(ctx, gate, source, common::ring()?)
    }

    pub(crate) fn with_ring(
        ctx: &'a Ctx,
        gate: &'a Gate,
        source: Source,
        ring: IoUring,
    ) -> io::Result<Worker<'a>> {
        let handoff_open = matches!(source, Source::Handoff);
        Ok(Worker {
            ctx,
            gate,
            ring,
            source,
            conns: Slab::new(),
            in_flight: 0,
            accepts: 0,
            stopping: false,
            handoff_open,
            idle_timeout: ctx.config.idle_timeout,
            tick: common::tick_period(ctx.config.idle_timeout).into(),
            now: Instant::now(),
        })
    }

    pub(crate) fn ring_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// The event loop: wait for completions, dispatch each on its operation, until the stop
    /// has been requested and nothing is in flight any more.
    pub(crate) fn serve(mut self) -> io::Result<()> {
        let result = self.event_loop();
        if self.in_flight > 0 {
            // Only on an unexpected ring error: the kernel may still write into the buffers,
            // so they are leaked rather than freed under it.
            std::mem::forget(std::mem::take(&mut self.conns));
        }
        result
    }

    fn event_loop(&mut self) -> io::Result<()> {
        if let Source::Listener(sock) = &self.source {
            common::start_listening(sock, self.ctx.config.backlog)?;
        }
        self.arm_stop()?;
        self.arm_tick()?;
        self.post_accepts()?;
        let mut cqes: Vec<cqueue::Entry> = Vec::with_capacity(common::RING_ENTRIES as usize * 4);
        while !(self.stopping && self.in_flight == 0 && !self.handoff_open) {
            common::submit_and_wait(&mut self.ring)?;
            common::drain(&mut self.ring, &mut cqes);
            self.now = Instant::now();
            for cqe in &cqes {
                self.complete(cqe.user_data(), cqe.result())?;
            }
        }
        Ok(())
    }

    fn complete(&mut self, user_data: u64, res: i32) -> io::Result<()> {
        let (key, op) = untoken(user_data);
        let Some(op) = op else {
            return Err(io::Error::other(format!(
                "unknown completion {user_data:#x}"
            )));
        };
        if !matches!(op, Op::Handoff | Op::HandoffEnd) {
            self.in_flight -= 1;
        }
        match op {
            Op::Accept => self.on_accept(res),
            Op::Handoff => self.on_handoff(res),
            Op::HandoffEnd => {
                self.handoff_open = false;
                Ok(())
            }
            Op::Recv => self.on_recv(key, res),
            Op::Send => self.on_send(key, res),
            Op::ReadFile => self.on_file_read(key, res),
            Op::Close => {
                self.on_closed(key);
                Ok(())
            }
            Op::Tick => self.on_tick(),
            Op::Stop => self.on_stop(),
            Op::Cancel => Ok(()),
        }
    }

    fn submit(&mut self, entry: io_uring::squeue::Entry) -> io::Result<()> {
        common::push(&mut self.ring, &entry)?;
        self.in_flight += 1;
        Ok(())
    }

    // --- accepting -------------------------------------------------------------------------

    fn post_accepts(&mut self) -> io::Result<()> {
        let Source::Listener(listener) = &self.source else {
            return Ok(());
        };
        let fd = listener.as_raw_fd();
        while !self.stopping && self.accepts < ACCEPTS_AHEAD {
            // No peer address is asked for (null pointers): nothing to keep alive.
            let e = opcode::Accept::new(types::Fd(fd), std::ptr::null_mut(), std::ptr::null_mut())
                .flags(libc::SOCK_CLOEXEC)
                .build()
                .user_data(token(0, Op::Accept));
            self.submit(e)?;
            self.accepts += 1;
        }
        Ok(())
    }

    fn on_accept(&mut self, res: i32) -> io::Result<()> {
        self.accepts -= 1;
        if res < 0 {
            if res != -libc::ECANCELED {
                // EMFILE and the like: the accept is re-posted at the next tick rather than at
                // once, which would spin while the condition lasts.
                self.ctx.stats.error(common::error_kind(res));
            }
            return Ok(());
        }
        self.ctx.stats.accepted();
        self.post_accepts()?;
        if self.stopping || !self.gate.enter() {
            common::close_fd(res);
            self.ctx.stats.refused();
            return Ok(());
        }
        self.open(res)
    }

    fn on_handoff(&mut self, fd: i32) -> io::Result<()> {
        if fd < 0 {
            return Ok(());
        }
        if self.stopping {
            // Counted open by the accept thread: this is a close, not a refusal.
            common::close_fd(fd);
            self.gate.leave();
            self.ctx.stats.conn_closed();
            return Ok(());
        }
        self.open(fd)
    }

    // --- one connection's state machine ----------------------------------------------------

    fn open(&mut self, fd: RawFd) -> io::Result<()> {
        // A handed-off socket was counted open by the accept thread when it admitted it, so
        // that "open" never misses a connection on its way to a ring.
        if let Source::Listener(_) = self.source {
            self.ctx.stats.conn_opened();
        }
        let key = self.conns.insert(Box::new(Conn {
            fd,
            step: Step::Receiving,
            session: Session::with_file_reads(Arc::clone(&self.ctx.site), FileReads::Caller),
            buf: vec![0u8; self.ctx.config.buffers.read_buf].into_boxed_slice(),
            iov: common::empty_iovecs(self.ctx.config.buffers.max_iov),
            msg: common::empty_msghdr(),
            file: None,
            delay: types::Timespec::new(),
            last_io: self.now,
            shut: false,
            fault: None,
        }));
        self.receive(key)
    }

    /// Step → Receiving.
    fn receive(&mut self, key: usize) -> io::Result<()> {
        let c = &mut self.conns[key];
        c.step = Step::Receiving;
        // The buffer is a boxed slice owned by the connection, which stays in the slab until
        // its close completes — after this receive's completion.
        let e = opcode::Recv::new(types::Fd(c.fd), c.buf.as_mut_ptr(), c.buf.len() as u32)
            .build()
            .user_data(token(key, Op::Recv));
        self.submit(e)
    }

    /// Step → Sending: the first pending chunks in one sendmsg.
    fn send(&mut self, key: usize) -> io::Result<()> {
        let c = &mut self.conns[key];
        let n = common::fill_iovecs(&c.session, &mut c.iov);
        if n == 0 {
            return self.close(key);
        }
        c.step = Step::Sending;
        c.msg.msg_iov = c.iov.as_mut_ptr();
        c.msg.msg_iovlen = n;
        // msghdr and iovecs live in the boxed connection; the bytes they point to are the
        // session's pending chunks, which are not touched until this send completes.
        let e = opcode::SendMsg::new(types::Fd(c.fd), &c.msg)
            .flags(common::SEND_FLAGS)
            .build()
            .user_data(token(key, Op::Send));
        self.submit(e)
    }

    /// Step → ReadingFile: the read the session waits for, into a buffer of its size.
    fn read_file(&mut self, key: usize, job: FileRead) -> io::Result<()> {
        let c = &mut self.conns[key];
        c.step = Step::ReadingFile;
        let buf = vec![0u8; job.len()];
        let (job, buf) = c.file.insert((job, buf));
        // The buffer and the job (which holds the descriptor open) stay in the boxed
        // connection until the read's completion; `delay` lives there too.
        common::file_read_entries(job, buf, &mut c.delay)
            .push(&mut self.ring, token(key, Op::ReadFile))?;
        self.in_flight += 1;
        Ok(())
    }

    /// Step → Closing.
    fn close(&mut self, key: usize) -> io::Result<()> {
        let c = &mut self.conns[key];
        c.step = Step::Closing;
        let e = opcode::Close::new(types::Fd(c.fd))
            .build()
            .user_data(token(key, Op::Close));
        self.submit(e)
    }

    /// After a receive, a send or a file read: read the file bytes the session waits for,
    /// else send what is pending, else close if the session is over, else receive the next
    /// request.
    fn next_step(&mut self, key: usize) -> io::Result<()> {
        let c = &mut self.conns[key];
        if self.stopping {
            self.close(key)
        } else if let Some(job) = c.session.file_read() {
            self.read_file(key, job)
        } else if c.session.has_pending() {
            self.send(key)
        } else if c.session.should_close() {
            self.close(key)
        } else {
            self.receive(key)
        }
    }

    fn on_recv(&mut self, key: usize, res: i32) -> io::Result<()> {
        let stats = &*self.ctx.stats;
        let c = &mut self.conns[key];
        debug_assert_eq!(c.step, Step::Receiving);
        c.last_io = self.now;
        if res <= 0 {
            // 0: the peer closed (or our shutdown at an idle timeout or stop).
            if res < 0 && c.fault.is_none() {
                c.fault = Some(common::error_kind(res));
            }
            return self.close(key);
        }
        c.session
            .feed(&c.buf[..res as usize], |status| stats.response(status));
        self.next_step(key)
    }

    fn on_send(&mut self, key: usize, res: i32) -> io::Result<()> {
        let c = &mut self.conns[key];
        debug_assert_eq!(c.step, Step::Sending);
        c.last_io = self.now;
        if res <= 0 {
            if c.fault.is_none() {
                c.fault = Some(if res < 0 {
                    common::error_kind(res)
                } else {
                    ErrorKind::Io
                });
            }
            return self.close(key);
        }
        let stats = &*self.ctx.stats;
        c.session.advance(res as usize);
        // The requests held back while the queue was full (backpressure) are answered now.
        c.session.resume(|status| stats.response(status));
        self.next_step(key)
    }

    fn on_file_read(&mut self, key: usize, res: i32) -> io::Result<()> {
        let stats = &*self.ctx.stats;
        let c = &mut self.conns[key];
        debug_assert_eq!(c.step, Step::ReadingFile);
        let Some((_, mut buf)) = c.file.take() else {
            return self.close(key);
        };
        let result = if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            buf.truncate(res as usize);
            Ok(buf)
        };
        c.session
            .file_read_done(result, |status| stats.response(status));
        self.next_step(key)
    }

    fn on_closed(&mut self, key: usize) {
        let c = self.conns.remove(key);
        if let Some(kind) = c.fault {
            self.ctx.stats.error(kind);
        }
        self.ctx.stats.conn_closed();
        self.gate.leave();
    }

    // --- timeout and stop ------------------------------------------------------------------

    fn arm_tick(&mut self) -> io::Result<()> {
        // The kernel copies the timespec when the SQE is submitted; it lives in the worker.
        let e = opcode::Timeout::new(&self.tick)
            .build()
            .user_data(token(0, Op::Tick));
        self.submit(e)
    }

    fn arm_stop(&mut self) -> io::Result<()> {
        let e = opcode::PollAdd::new(types::Fd(self.ctx.shutdown.fd()), libc::POLLIN as u32)
            .build()
            .user_data(token(0, Op::Stop));
        self.submit(e)
    }

    fn on_tick(&mut self) -> io::Result<()> {
        if self.stopping {
            return Ok(());
        }
        for (_, c) in self.conns.iter_mut() {
            if c.step != Step::Closing
                && !c.shut
                && common::idle_expired(self.now, c.last_io, self.idle_timeout)
            {
                common::shutdown_socket(c.fd);
                c.shut = true;
                c.fault = Some(ErrorKind::Timeout);
            }
        }
        self.post_accepts()?;
        self.arm_tick()
    }

    fn on_stop(&mut self) -> io::Result<()> {
        self.stopping = true;
        if let Source::Listener(listener) = &self.source {
            let cancel = types::CancelBuilder::fd(types::Fd(listener.as_raw_fd())).all();
            let e = opcode::AsyncCancel2::new(cancel)
                .build()
                .user_data(token(0, Op::Cancel));
            self.submit(e)?;
        }
        let e = opcode::TimeoutRemove::new(token(0, Op::Tick))
            .build()
            .user_data(token(0, Op::Cancel));
        self.submit(e)?;
        for (_, c) in self.conns.iter_mut() {
            if c.step != Step::Closing && !c.shut {
                common::shutdown_socket(c.fd);
                c.shut = true;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_round_trips_key_and_operation() {
        for op in Op::ALL {
            for key in [0usize, 1, 255, 256, 1 << 40] {
                assert_eq!(untoken(token(key, op)), (key, Some(op)));
            }
        }
        assert_eq!(untoken(0).1, None, "operation byte 0 is no operation");
    }
}

#[cfg(test)]
mod serve_tests {
    use crate::uring_common::testing::exercise;
    use crate::AcceptMode;

    #[test]
    fn serves_one_worker() {
        exercise(super::run, 1, AcceptMode::Async);
    }

    #[test]
    fn serves_two_workers() {
        exercise(super::run, 2, AcceptMode::Async);
    }

    #[test]
    fn slow_file_reads_hold_up_only_their_connection() {
        crate::uring_common::slow_disk::slow_reads_hold_up_only_their_connection(
            super::run,
            AcceptMode::Async,
        );
    }
}
