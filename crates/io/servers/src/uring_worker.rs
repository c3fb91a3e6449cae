//! The event loop of `uring`, `uring-fixed` and `uring-accept-sync`: one ring per worker
//! thread, the connection state machine of [`crate::uring_conn`] driven by completions whose
//! `user_data` is (connection key, operation) — seed 000's iocp loop, where the `OVERLAPPED`
//! led to the client's environment and "the next function to run".
//!
//! What the three models differ in is a parameter of [`Worker`]:
//! - where its sockets come from ([`Source`]): its own listener with
//!   [`ACCEPTS_AHEAD`](common::ACCEPTS_AHEAD) accepts posted (`uring`, `uring-fixed`), or an
//!   accept thread that posts each socket into the ring (`uring-accept-sync`);
//! - where it keeps its connections ([`Store`]): allocated on demand, one box each
//!   (`uring::Boxes`), or in an array allocated at start with one registered receive arena
//!   (`uring_fixed::FixedSlots`). The store is a type parameter, so each model's loop is
//!   compiled for its own store: no indirection on the I/O path.
//!
//! Idle timeout and shutdown: see [`crate::uring_common`].

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Instant;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use iolab_http::{FileRead, FileReads, Session};

use crate::uring_common::{self as common, Gate};
use crate::uring_conn::{self as conn, IoMemory, Next, Socket, Step};
use crate::Ctx;

/// What an operation in flight is; the low byte of its `user_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Op {
    Accept = 1,
    Recv,
    Send,
    Close,
    /// The periodic tick that closes connections past their deadline.
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
    /// Every operation, in the order of their values (1, 2, ...): `Op::ALL[byte - 1]` is the
    /// operation of a byte.
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
    let op = ((user_data & 0xff) as usize)
        .checked_sub(1)
        .and_then(|i| Op::ALL.get(i))
        .copied();
    ((user_data >> 8) as usize, op)
}

/// Where a worker's sockets come from.
pub(crate) enum Source {
    /// Its own listener, with `ACCEPTS_AHEAD` accepts posted on it (iocp2, iocp3).
    Listener(OwnedFd),
    /// An accept thread that posts each socket into the ring with `IORING_OP_MSG_RING`
    /// (iocp1's `PostQueuedCompletionStatus`); its gate check is done by the accept thread.
    Handoff,
}

/// One open connection of a worker: its socket and its HTTP session. The memory its
/// operations hand the kernel ([`IoMemory`], the receive buffer) is the store's.
pub(crate) struct Conn {
    pub(crate) socket: Socket,
    pub(crate) session: Session,
}

/// Where a worker keeps its connections, and their receive buffers. A key is valid from
/// `insert` to `remove`; every place a store hands out stays where it is until then, and the
/// memory of a removed connection is not freed while an operation on it may be in flight
/// (its close is the last one; `leak` covers a worker that stops on a ring error).
pub(crate) trait Store {
    /// False when no place is free now (the connection is refused).
    fn has_room(&self) -> bool;
    /// Places a new connection; its key, the `user_data` of its operations.
    fn insert(&mut self, conn: Conn) -> usize;
    /// The connection at `key` and the memory of its sends and file reads.
    fn get(&mut self, key: usize) -> (&mut Conn, &mut IoMemory);
    /// The connection at `key` and a receive into its buffer (the caller sets the
    /// `user_data`).
    fn receive(&mut self, key: usize) -> (&mut Conn, squeue::Entry);
    /// The connection at `key` and its receive buffer, which its last receive wrote into.
    fn received(&mut self, key: usize) -> (&mut Conn, &[u8]);
    /// Takes out a connection whose close has completed; its place is free again.
    fn remove(&mut self, key: usize) -> Conn;
    /// Runs `f` on every connection held.
    fn for_each(&mut self, f: impl FnMut(&mut Conn));
    /// Never frees the buffers: the worker stopped on a ring error with operations still in
    /// flight, and the kernel may still write into them.
    fn leak(&mut self);
}

pub(crate) struct Worker<'a, S: Store> {
    ctx: &'a Ctx,
    gate: &'a Gate,
    ring: IoUring,
    source: Source,
    /// Declared after the ring, so dropped after it.
    store: S,
    /// Operations submitted and not yet completed; the worker returns only at zero.
    in_flight: usize,
    /// Accepts posted on the listener now.
    accepts: usize,
    stopping: bool,
    /// `uring-accept-sync`: the accept thread may still post sockets.
    handoff_open: bool,
    timeouts: iolab_http::Timeouts,
    /// Set after an accept failed for want of descriptors: no accepts posted meanwhile.
    accept_pause: common::AcceptPause,
    tick: types::Timespec,
    now: Instant,
}

impl<'a, S: Store> Worker<'a, S> {
    pub(crate) fn new(
        ctx: &'a Ctx,
        gate: &'a Gate,
        source: Source,
        ring: IoUring,
        store: S,
    ) -> Worker<'a, S> {
        let handoff_open = matches!(source, Source::Handoff);
        Worker {
            ctx,
            gate,
            ring,
            source,
            store,
            in_flight: 0,
            accepts: 0,
            stopping: false,
            handoff_open,
            timeouts: ctx.config.timeouts(),
            accept_pause: common::AcceptPause::default(),
            tick: common::tick_period(ctx.config.timeouts()).into(),
            now: Instant::now(),
        }
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
            self.store.leak();
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

    fn submit(&mut self, entry: squeue::Entry) -> io::Result<()> {
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
        if !self.accept_pause.allows(self.now) {
            return Ok(());
        }
        while !self.stopping && self.accepts < common::ACCEPTS_AHEAD {
            self.submit(common::accept_entry(fd).user_data(token(0, Op::Accept)))?;
            self.accepts += 1;
        }
        Ok(())
    }

    fn on_accept(&mut self, res: i32) -> io::Result<()> {
        self.accepts -= 1;
        self.accept_pause.after(res, self.now);
        let Some(fd) = common::accepted(res, &self.ctx.stats) else {
            return Ok(());
        };
        self.ctx.stats.accepted();
        self.post_accepts()?;
        if self.stopping || !self.store.has_room() || !self.gate.enter() {
            common::close_fd(fd);
            self.ctx.stats.refused();
            return Ok(());
        }
        self.open(fd)
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
        let key = self.store.insert(Conn {
            socket: Socket::new(fd, self.timeouts, self.now),
            session: Session::with_file_reads(Arc::clone(&self.ctx.site), FileReads::Caller),
        });
        self.receive(key)
    }

    /// Step → Receiving, into the store's buffer for the connection.
    fn receive(&mut self, key: usize) -> io::Result<()> {
        let (c, e) = self.store.receive(key);
        c.socket.step = Step::Receiving;
        self.submit(e.user_data(token(key, Op::Recv)))
    }

    /// Step → Sending: the first pending chunks in one sendmsg.
    fn send(&mut self, key: usize) -> io::Result<()> {
        let (c, mem) = self.store.get(key);
        let Some(e) = mem.send(&c.session, c.socket.fd) else {
            return self.close(key);
        };
        c.socket.step = Step::Sending;
        self.submit(e.user_data(token(key, Op::Send)))
    }

    /// Step → ReadingFile: the read the session waits for, into a buffer of its size.
    fn read_file(&mut self, key: usize, job: FileRead) -> io::Result<()> {
        let (c, mem) = self.store.get(key);
        c.socket.step = Step::ReadingFile;
        mem.read_file(job)
            .push(&mut self.ring, token(key, Op::ReadFile))?;
        self.in_flight += 1;
        Ok(())
    }

    /// Step → Closing.
    fn close(&mut self, key: usize) -> io::Result<()> {
        let c = self.store.get(key).0;
        conn::linger_if_needed(&c.session, c.socket.fd);
        let socket = &mut c.socket;
        socket.step = Step::Closing;
        let e = conn::close_entry(socket.fd);
        self.submit(e.user_data(token(key, Op::Close)))
    }

    /// After a receive, a send or a file read (see [`conn::next`]).
    fn next_step(&mut self, key: usize) -> io::Result<()> {
        let stopping = self.stopping;
        match conn::next(&mut self.store.get(key).0.session, stopping) {
            Next::ReadFile(job) => self.read_file(key, job),
            Next::Send => self.send(key),
            Next::Close => self.close(key),
            Next::Receive => self.receive(key),
        }
    }

    fn on_recv(&mut self, key: usize, res: i32) -> io::Result<()> {
        let stats = &*self.ctx.stats;
        let (c, buf) = self.store.received(key);
        debug_assert_eq!(c.socket.step, Step::Receiving);
        let Some(n) = c.socket.received(res) else {
            return self.close(key);
        };
        c.session.feed(&buf[..n], |status| stats.response(status));
        c.socket.update(&c.session, self.now);
        self.next_step(key)
    }

    fn on_send(&mut self, key: usize, res: i32) -> io::Result<()> {
        let c = self.store.get(key).0;
        debug_assert_eq!(c.socket.step, Step::Sending);
        let Some(n) = c.socket.sent(res) else {
            return self.close(key);
        };
        conn::advance(&mut c.session, n, &self.ctx.stats);
        c.socket.update(&c.session, self.now);
        self.next_step(key)
    }

    fn on_file_read(&mut self, key: usize, res: i32) -> io::Result<()> {
        let (c, mem) = self.store.get(key);
        debug_assert_eq!(c.socket.step, Step::ReadingFile);
        if !mem.file_read_done(res, &mut c.session, &self.ctx.stats) {
            return self.close(key);
        }
        c.socket.update(&c.session, self.now);
        self.next_step(key)
    }

    fn on_closed(&mut self, key: usize) {
        let Conn { socket, session } = self.store.remove(key);
        // Everything the connection holds is released before it is counted closed.
        drop(session);
        socket.closed(&self.ctx.stats, self.gate);
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
        let e = common::stop_entry(&self.ctx.shutdown).user_data(token(0, Op::Stop));
        self.submit(e)
    }

    fn on_tick(&mut self) -> io::Result<()> {
        if self.stopping {
            return Ok(());
        }
        let now = self.now;
        self.store.for_each(|c| c.socket.shut_if_expired(now));
        self.post_accepts()?;
        self.arm_tick()
    }

    fn on_stop(&mut self) -> io::Result<()> {
        self.stopping = true;
        if let Source::Listener(listener) = &self.source {
            let e = common::cancel_accepts_entry(listener.as_raw_fd());
            self.submit(e.user_data(token(0, Op::Cancel)))?;
        }
        let e = opcode::TimeoutRemove::new(token(0, Op::Tick))
            .build()
            .user_data(token(0, Op::Cancel));
        self.submit(e)?;
        self.store.for_each(|c| c.socket.shut_for_stop());
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
        assert_eq!(untoken(11).1, None, "no operation past the last one");
    }
}
