//! `uring-fixed` — seed 000's **iocp3** on io_uring.
//!
//! iocp3 was iocp2 (accepts posted ahead, one event loop around the completion port) with the
//! client environments allocated once, at start, in a fixed number — the number of
//! connections the server can hold — instead of on demand. Here, as in [`crate::uring`]:
//! one ring and one listener per worker, [`uring::ACCEPTS_AHEAD`] accepts kept posted, the
//! same explicit `Step` per connection, `user_data` = (slot, operation). The difference:
//!
//! - each worker allocates at start a fixed array of `max_conns` `Slot`s and one arena
//!   holding every slot's receive buffer; a free list of slot numbers (allocated at start
//!   too) gives a slot to an accepted socket and takes it back when its close completes.
//!   Every worker can hold the whole `max_conns` because SO_REUSEPORT spreads connections
//!   over workers by hash, not by load: a smaller share could refuse a connection while the
//!   server is below its limit. The server-wide limit is the shared gate, as in every model;
//!   beyond it a connection is closed at once and counted as refused;
//! - the arena is registered with the ring (`IORING_REGISTER_BUFFERS`, one buffer) and read
//!   into with `IORING_OP_READ_FIXED`, so the kernel does not map the buffer on each receive.
//!   Registration pins the arena in memory (`max_conns` x `read_buf` per worker: 160 MB at
//!   the default 10,000 and 16 KiB); above [`MAX_REGISTERED`], or if registration fails (memory-lock
//!   limit), the worker says so once and uses plain `IORING_OP_RECV` into the same arena.
//!   Sockets are not registered as fixed files.
//!
//! Nothing is allocated on the request path of a cached file by this module: the completion
//! batch vector is allocated once, the slot's iovecs and msghdr are in the slot, and the
//! response bytes are the session's shared `Bytes`. File bytes (a cache miss, the chunks of a
//! large file) are read with `IORING_OP_READ` into a buffer allocated for that read, as in
//! [`crate::uring`]. The `iolab_http::Session` of a slot is created when a
//! connection opens (its own allocations are per connection, not per request).
//!
//! Idle timeout and shutdown: see [`crate::uring_common`].

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, types, IoUring};
use iolab_http::{FileRead, FileReads, Session};

use crate::stats::ErrorKind;
use crate::uring::{self, token, Op};
use crate::uring_common::{self as common, Gate, StartLine};
use crate::Ctx;

/// Largest receive arena registered (pinned) per worker.
pub const MAX_REGISTERED: usize = 256 << 20;

pub fn run(ctx: &Ctx) -> io::Result<()> {
    let n = common::worker_count(ctx.config.workers);
    let sockets = common::bound_sockets(ctx, n, false)?;
    let gate = Gate::new(ctx.config.max_conns);
    let slots = ctx.config.max_conns.max(1);
    let start = StartLine::new(n);
    common::run_workers(ctx, sockets, "uring-fixed", |_, sock| {
        let worker = Worker::new(ctx, &gate, sock, slots);
        start.arrive_and_wait(&ctx.shutdown);
        worker?.serve()
    })
}

/// What a slot waits for: the next step of its state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// No connection: the slot is in the free list.
    Free,
    /// A receive is in flight; its completion feeds the HTTP session.
    Receiving,
    /// A send of the pending response bytes is in flight; its completion advances them.
    Sending,
    /// A read of file bytes is in flight; its completion hands them to the session.
    ReadingFile,
    /// The close is in flight; its completion returns the slot to the free list.
    Closing,
}

/// One pre-allocated client environment. Its receive buffer is `read_buf` bytes of the
/// worker's arena at offset `index * read_buf` (`Buffers::read_buf`).
struct Slot {
    fd: RawFd,
    step: Step,
    session: Option<Session>,
    iov: Box<[libc::iovec]>,
    msg: libc::msghdr,
    /// The file read in flight and its buffer, kept until it completes.
    file: Option<(FileRead, Vec<u8>)>,
    /// The test hook's delay before a file read (see `uring_common::file_read_entries`).
    delay: types::Timespec,
    last_io: Instant,
    shut: bool,
    fault: Option<ErrorKind>,
}

struct Worker<'a> {
    ctx: &'a Ctx,
    gate: &'a Gate,
    ring: IoUring,
    listener: OwnedFd,
    /// Never grows nor moves after start: the kernel holds pointers into it (msghdr, iovecs).
    slots: Box<[Slot]>,
    /// Numbers of the free slots; capacity for all of them, allocated at start.
    free: Vec<u32>,
    /// Every slot's receive buffer, back to back; never moves.
    arena: Box<[u8]>,
    /// The arena is registered with the ring as fixed buffer 0.
    registered: bool,
    /// Bytes of each slot's receive buffer.
    read_buf: usize,
    in_flight: usize,
    accepts: usize,
    stopping: bool,
    idle_timeout: Duration,
    tick: types::Timespec,
    now: Instant,
}

impl<'a> Worker<'a> {
    fn new(ctx: &'a Ctx, gate: &'a Gate, listener: OwnedFd, n: usize) -> io::Result<Worker<'a>> {
        let ring = common::ring()?;
        let now = Instant::now();
        let read_buf = ctx.config.buffers.read_buf;
        let slots: Box<[Slot]> = (0..n)
            .map(|_| Slot {
                fd: -1,
                step: Step::Free,
                session: None,
                iov: common::empty_iovecs(ctx.config.buffers.max_iov),
                msg: common::empty_msghdr(),
                file: None,
                delay: types::Timespec::new(),
                last_io: now,
                shut: false,
                fault: None,
            })
            .collect();
        let len = n
            .checked_mul(read_buf)
            .ok_or_else(|| io::Error::other("too many slots"))?;
        let mut arena = vec![0u8; len].into_boxed_slice();
        let iov = libc::iovec {
            iov_base: arena.as_mut_ptr() as *mut libc::c_void,
            iov_len: arena.len(),
        };
        let registered = if len > MAX_REGISTERED {
            tracing::warn!(
                "uring-fixed: {} MiB of receive buffers is too much to pin; using plain receives",
                len >> 20
            );
            false
        } else {
            // SAFETY: the arena outlives the ring's use of it: it is a field of this worker,
            // freed after the event loop has reaped every operation (serve), never moved.
            match unsafe { ring.submitter().register_buffers(&[iov]) } {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(
                        "uring-fixed: receive buffers not registered ({e}); using plain receives"
                    );
                    false
                }
            }
        };
        Ok(Worker {
            ctx,
            gate,
            ring,
            listener,
            slots,
            free: (0..n as u32).rev().collect(),
            arena,
            registered,
            read_buf,
            in_flight: 0,
            accepts: 0,
            stopping: false,
            idle_timeout: ctx.config.idle_timeout,
            tick: common::tick_period(ctx.config.idle_timeout).into(),
            now,
        })
    }

    fn serve(mut self) -> io::Result<()> {
        let result = self.event_loop();
        if self.in_flight > 0 {
            // Only on an unexpected ring error: the kernel may still write into the arena.
            std::mem::forget(std::mem::take(&mut self.arena));
            std::mem::forget(std::mem::take(&mut self.slots));
        }
        result
    }

    fn event_loop(&mut self) -> io::Result<()> {
        common::start_listening(&self.listener, self.ctx.config.backlog)?;
        self.arm_stop()?;
        self.arm_tick()?;
        self.post_accepts()?;
        let mut cqes: Vec<cqueue::Entry> = Vec::with_capacity(common::RING_ENTRIES as usize * 4);
        while !(self.stopping && self.in_flight == 0) {
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
        self.in_flight -= 1;
        let slot = (user_data >> 8) as usize;
        match user_data & 0xff {
            x if x == Op::Accept as u64 => self.on_accept(res),
            x if x == Op::Recv as u64 => self.on_recv(slot, res),
            x if x == Op::Send as u64 => self.on_send(slot, res),
            x if x == Op::ReadFile as u64 => self.on_file_read(slot, res),
            x if x == Op::Close as u64 => {
                self.on_closed(slot);
                Ok(())
            }
            x if x == Op::Tick as u64 => self.on_tick(),
            x if x == Op::Stop as u64 => self.on_stop(),
            x if x == Op::Cancel as u64 => Ok(()),
            _ => Err(io::Error::other(format!(
                "unknown completion {user_data:#x}"
            ))),
        }
    }

    fn submit(&mut self, entry: io_uring::squeue::Entry) -> io::Result<()> {
        common::push(&mut self.ring, &entry)?;
        self.in_flight += 1;
        Ok(())
    }

    // --- accepting -------------------------------------------------------------------------

    fn post_accepts(&mut self) -> io::Result<()> {
        let fd = self.listener.as_raw_fd();
        while !self.stopping && self.accepts < uring::ACCEPTS_AHEAD {
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
                // Re-posted at the next tick, not at once (EMFILE would make it spin).
                self.ctx.stats.error(common::error_kind(res));
            }
            return Ok(());
        }
        self.ctx.stats.accepted();
        self.post_accepts()?;
        if self.stopping || self.free.is_empty() || !self.gate.enter() {
            common::close_fd(res);
            self.ctx.stats.refused();
            return Ok(());
        }
        let slot = self.free.pop().expect("free list checked non-empty") as usize;
        self.ctx.stats.conn_opened();
        let s = &mut self.slots[slot];
        s.fd = res;
        s.session = Some(Session::with_file_reads(
            Arc::clone(&self.ctx.site),
            FileReads::Caller,
        ));
        s.last_io = self.now;
        s.shut = false;
        s.fault = None;
        self.receive(slot)
    }

    // --- one connection's state machine ----------------------------------------------------

    /// Step → Receiving, into the slot's part of the arena.
    fn receive(&mut self, slot: usize) -> io::Result<()> {
        let s = &mut self.slots[slot];
        s.step = Step::Receiving;
        let rb = self.read_buf;
        let buf = self.arena[slot * rb..(slot + 1) * rb].as_mut_ptr();
        // The arena is owned by the worker and outlives every operation (see serve).
        let e = if self.registered {
            opcode::ReadFixed::new(types::Fd(s.fd), buf, rb as u32, 0).build()
        } else {
            opcode::Recv::new(types::Fd(s.fd), buf, rb as u32).build()
        };
        self.submit(e.user_data(token(slot, Op::Recv)))
    }

    /// Step → Sending: the first pending chunks in one sendmsg.
    fn send(&mut self, slot: usize) -> io::Result<()> {
        let s = &mut self.slots[slot];
        let Some(session) = &s.session else {
            return self.close(slot);
        };
        let n = common::fill_iovecs(session, &mut s.iov);
        if n == 0 {
            return self.close(slot);
        }
        s.step = Step::Sending;
        s.msg.msg_iov = s.iov.as_mut_ptr();
        s.msg.msg_iovlen = n;
        // msghdr and iovecs are in the slot (fixed array); the bytes are the session's pending
        // chunks, untouched until this send completes.
        let e = opcode::SendMsg::new(types::Fd(s.fd), &s.msg)
            .flags(common::SEND_FLAGS)
            .build()
            .user_data(token(slot, Op::Send));
        self.submit(e)
    }

    /// Step → ReadingFile: the read the session waits for, into a buffer of its size.
    fn read_file(&mut self, slot: usize, job: FileRead) -> io::Result<()> {
        let s = &mut self.slots[slot];
        s.step = Step::ReadingFile;
        let buf = vec![0u8; job.len()];
        let (job, buf) = s.file.insert((job, buf));
        // Buffer, job (the open descriptor) and delay stay in the slot until the completion.
        common::file_read_entries(job, buf, &mut s.delay)
            .push(&mut self.ring, token(slot, Op::ReadFile))?;
        self.in_flight += 1;
        Ok(())
    }

    /// Step → Closing.
    fn close(&mut self, slot: usize) -> io::Result<()> {
        let s = &mut self.slots[slot];
        s.step = Step::Closing;
        let e = opcode::Close::new(types::Fd(s.fd))
            .build()
            .user_data(token(slot, Op::Close));
        self.submit(e)
    }

    fn next_step(&mut self, slot: usize) -> io::Result<()> {
        let Some(session) = &mut self.slots[slot].session else {
            return self.close(slot);
        };
        if self.stopping {
            self.close(slot)
        } else if let Some(job) = session.file_read() {
            self.read_file(slot, job)
        } else if session.has_pending() {
            self.send(slot)
        } else if session.should_close() {
            self.close(slot)
        } else {
            self.receive(slot)
        }
    }

    fn on_recv(&mut self, slot: usize, res: i32) -> io::Result<()> {
        let stats = &*self.ctx.stats;
        let s = &mut self.slots[slot];
        debug_assert_eq!(s.step, Step::Receiving);
        s.last_io = self.now;
        if res <= 0 {
            if res < 0 && s.fault.is_none() {
                s.fault = Some(common::error_kind(res));
            }
            return self.close(slot);
        }
        let at = slot * self.read_buf;
        let data = &self.arena[at..at + res as usize];
        if let Some(session) = &mut s.session {
            session.feed(data, |status| stats.response(status));
        }
        self.next_step(slot)
    }

    fn on_send(&mut self, slot: usize, res: i32) -> io::Result<()> {
        let s = &mut self.slots[slot];
        debug_assert_eq!(s.step, Step::Sending);
        s.last_io = self.now;
        if res <= 0 {
            if s.fault.is_none() {
                s.fault = Some(if res < 0 {
                    common::error_kind(res)
                } else {
                    ErrorKind::Io
                });
            }
            return self.close(slot);
        }
        if let Some(session) = &mut s.session {
            let stats = &*self.ctx.stats;
            session.advance(res as usize);
            // The requests held back while the queue was full (backpressure) are answered now.
            session.resume(|status| stats.response(status));
        }
        self.next_step(slot)
    }

    fn on_file_read(&mut self, slot: usize, res: i32) -> io::Result<()> {
        let stats = &*self.ctx.stats;
        let s = &mut self.slots[slot];
        debug_assert_eq!(s.step, Step::ReadingFile);
        let (Some((_, mut buf)), Some(session)) = (s.file.take(), &mut s.session) else {
            return self.close(slot);
        };
        let result = if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else {
            buf.truncate(res as usize);
            Ok(buf)
        };
        session.file_read_done(result, |status| stats.response(status));
        self.next_step(slot)
    }

    fn on_closed(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        s.step = Step::Free;
        s.fd = -1;
        s.session = None;
        if let Some(kind) = s.fault.take() {
            self.ctx.stats.error(kind);
        }
        self.free.push(slot as u32);
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
        for s in self.slots.iter_mut() {
            if matches!(s.step, Step::Receiving | Step::Sending)
                && !s.shut
                && common::idle_expired(self.now, s.last_io, self.idle_timeout)
            {
                common::shutdown_socket(s.fd);
                s.shut = true;
                s.fault = Some(ErrorKind::Timeout);
            }
        }
        self.post_accepts()?;
        self.arm_tick()
    }

    fn on_stop(&mut self) -> io::Result<()> {
        self.stopping = true;
        let cancel = types::CancelBuilder::fd(types::Fd(self.listener.as_raw_fd())).all();
        let e = opcode::AsyncCancel2::new(cancel)
            .build()
            .user_data(token(0, Op::Cancel));
        self.submit(e)?;
        let e = opcode::TimeoutRemove::new(token(0, Op::Tick))
            .build()
            .user_data(token(0, Op::Cancel));
        self.submit(e)?;
        for s in self.slots.iter_mut() {
            if matches!(s.step, Step::Receiving | Step::Sending) && !s.shut {
                common::shutdown_socket(s.fd);
                s.shut = true;
            }
        }
        Ok(())
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
