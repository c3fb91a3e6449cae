//! The completion driver: one io_uring per loop.
//!
//! Every in-flight operation has a [`Record`] in a slab owned by the driver; its slab key is
//! the SQE's `user_data`. The record owns the operation's data (buffers, sockaddr, iovecs,
//! paths: whatever the SQE points into, boxed so it never moves) and the waker. It is freed
//! only when its completion arrives: if the future was dropped meanwhile the record is
//! marked orphan, an ASYNC_CANCEL is sent, and the data is released at the CQE. This is the
//! OVERLAPPED-embedded-in-the-thread-record of seed 000 §2, with the kernel's completion
//! finding the record in O(1).

use std::any::Any;
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::task::Waker;
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring, Probe};
use slab::Slab;

use super::{Deferred, KeyError, OpKey};

const WAKE_TAG: u64 = u64::MAX;
const CANCEL_TAG: u64 = u64::MAX - 1;
const ENTRIES: u32 = 1024;

/// The type-erased side of an [`crate::op::Operation`] that the driver keeps.
pub(crate) trait OpData: 'static {
    fn prepare(&mut self) -> squeue::Entry;
    /// Poll events to wait for before retrying after -EAGAIN.
    fn poll_events(&self) -> Option<(RawFd, u32)>;
    fn orphaned(&mut self, res: i32);
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

enum State {
    InFlight,
    Done(i32),
    /// The future is gone; free at the CQE.
    Orphan,
}

struct Record {
    state: State,
    waker: Option<Waker>,
    data: Box<dyn OpData>,
    /// The operation's SQE, prepared once outside the driver's borrow; resubmitted as is
    /// after -EAGAIN (the failed attempt did nothing, so it still describes the operation).
    sqe: squeue::Entry,
    /// What to poll for after -EAGAIN (`OpData::poll_events`, also computed up front).
    events: Option<(RawFd, u32)>,
    /// Names this record among every record the slot has held (see `OpKey`).
    gen: u64,
    cancel_sent: bool,
    /// A POLL_ADD is in flight for this record (after the op returned -EAGAIN).
    polling: bool,
}

/// How a poll of an operation went (decided under the driver's borrow).
pub(crate) enum Polled {
    /// Completed: the result and the operation's data (its record is freed).
    Ready(i32, Box<dyn OpData>),
    Pending,
    /// Pending, and the stored waker would not wake the caller: store a clone, made
    /// outside the borrow ([`Uring::set_waker`]).
    NewWaker,
}

pub(crate) struct Uring {
    ring: IoUring,
    records: Slab<Record>,
    /// SQEs waiting for room in the submission queue.
    backlog: VecDeque<squeue::Entry>,
    efd: RawFd,
    efd_armed: bool,
    /// This loop's id (the first part of every key it hands out).
    id: u64,
    next_gen: u64,
    /// Wakers and orphan callbacks, run by the core outside the borrow.
    pub(crate) deferred: Deferred,
    /// Testing aid: the first attempt of a readiness-waiting operation completes with
    /// -EAGAIN at the next reap without reaching the kernel (see `Builder::simulate_eagain`).
    simulate_eagain: bool,
    simulated: Vec<usize>,
    /// Completions copied out of the ring (reused between reaps).
    cqes: Vec<(u64, i32)>,
}

const REQUIRED: [(u8, &str); 14] = [
    (opcode::PollAdd::CODE, "POLL_ADD"),
    (opcode::AsyncCancel::CODE, "ASYNC_CANCEL"),
    (opcode::Accept::CODE, "ACCEPT"),
    (opcode::Connect::CODE, "CONNECT"),
    (opcode::Recv::CODE, "RECV"),
    (opcode::Send::CODE, "SEND"),
    (opcode::SendMsg::CODE, "SENDMSG"),
    (opcode::Read::CODE, "READ"),
    (opcode::Write::CODE, "WRITE"),
    (opcode::Fsync::CODE, "FSYNC"),
    (opcode::OpenAt::CODE, "OPENAT"),
    (opcode::Close::CODE, "CLOSE"),
    (opcode::Splice::CODE, "SPLICE"),
    (opcode::Shutdown::CODE, "SHUTDOWN"),
];

/// Can this process use io_uring with every opcode the runtime needs?
pub(crate) fn probe() -> io::Result<()> {
    let ring = IoUring::new(8)?;
    if !ring.params().is_feature_ext_arg() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "kernel lacks IORING_FEAT_EXT_ARG (Linux 5.11+)",
        ));
    }
    let mut p = Probe::new();
    ring.submitter().register_probe(&mut p)?;
    for (code, name) in REQUIRED {
        if !p.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("io_uring lacks IORING_OP_{name}"),
            ));
        }
    }
    Ok(())
}

fn build_ring() -> io::Result<IoUring> {
    // Best first: completions run on our thread only when we ask (DEFER_TASKRUN), then
    // cooperative task-work, then plain. Older kernels reject the newer flags with EINVAL.
    let cq = ENTRIES * 8;
    if let Ok(r) = IoUring::builder()
        .setup_cqsize(cq)
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .build(ENTRIES)
    {
        return Ok(r);
    }
    if let Ok(r) = IoUring::builder()
        .setup_cqsize(cq)
        .setup_coop_taskrun()
        .setup_taskrun_flag()
        .build(ENTRIES)
    {
        return Ok(r);
    }
    IoUring::builder().setup_cqsize(cq).build(ENTRIES)
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

impl Uring {
    pub(crate) fn new(efd: RawFd, id: u64, simulate_eagain: bool) -> io::Result<Uring> {
        let ring = build_ring()?;
        let mut u = Uring {
            ring,
            records: Slab::with_capacity(256),
            backlog: VecDeque::new(),
            efd,
            efd_armed: false,
            id,
            next_gen: 0,
            deferred: Deferred::default(),
            simulate_eagain,
            simulated: Vec::new(),
            cqes: Vec::with_capacity(256),
        };
        u.arm_efd();
        Ok(u)
    }

    pub(crate) fn live_ops(&self) -> usize {
        self.records.len()
    }

    /// Whether operations may complete on the task's thread before reaching the ring
    /// ([`crate::Operation::attempt_inline`]); off under `simulate_eagain`.
    pub(crate) fn inline_attempts(&self) -> bool {
        !self.simulate_eagain
    }

    fn arm_efd(&mut self) {
        let e = opcode::PollAdd::new(types::Fd(self.efd), libc::POLLIN as u32)
            .build()
            .user_data(WAKE_TAG);
        self.queue(e);
        self.efd_armed = true;
    }

    /// Queues an SQE: into the ring if it has room, else into the backlog (flushed by turn).
    fn queue(&mut self, e: squeue::Entry) {
        if !self.backlog.is_empty() {
            self.backlog.push_back(e);
            return;
        }
        // SAFETY: every pointer an SQE carries points into a record's boxed data, which
        // stays put until that record's CQE, or is null/absent (cancel, poll).
        if unsafe { self.ring.submission().push(&e) }.is_err() {
            self.backlog.push_back(e);
        }
    }

    /// Moves backlog SQEs into the ring, submitting to make room as needed.
    fn flush_backlog(&mut self) {
        while let Some(e) = self.backlog.front() {
            // SAFETY: as in queue().
            if unsafe { self.ring.submission().push(e) }.is_ok() {
                self.backlog.pop_front();
                continue;
            }
            match self.ring.submit() {
                Ok(_) => {}
                Err(err) if matches!(errno(&err), libc::EBUSY | libc::EAGAIN | libc::EINTR) => {
                    // The CQ is full (overflow pending): make room by reaping.
                    self.reap();
                }
                Err(err) => panic!("iolab-runtime: io_uring_enter failed: {err}"),
            }
        }
    }

    /// Starts an operation whose SQE (`sqe`, pointing into `data`) and readiness `events`
    /// the caller computed outside the borrow; returns its key.
    pub(crate) fn start(
        &mut self,
        data: Box<dyn OpData>,
        sqe: squeue::Entry,
        events: Option<(RawFd, u32)>,
    ) -> OpKey {
        self.next_gen += 1;
        let gen = self.next_gen;
        let index = self.records.insert(Record {
            state: State::InFlight,
            waker: None,
            data,
            sqe: sqe.user_data(0),
            events,
            gen,
            cancel_sent: false,
            polling: false,
        });
        let key = OpKey {
            loop_id: self.id,
            index,
            gen,
        };
        if self.simulate_eagain && events.is_some() {
            self.simulated.push(index);
            return key;
        }
        let sqe = self.records[index].sqe.clone().user_data(index as u64);
        self.queue(sqe);
        key
    }

    /// The record `key` names, if it is this loop's and still live.
    fn record(&mut self, key: &OpKey) -> Result<&mut Record, KeyError> {
        if key.loop_id != self.id {
            return Err(KeyError::OtherLoop);
        }
        match self.records.get_mut(key.index) {
            Some(r) if r.gen == key.gen => Ok(r),
            _ => Err(KeyError::Stale),
        }
    }

    /// Polls operation `key` for the task whose waker is `waker` (which is not cloned here:
    /// cloning runs user code, see [`Polled::NewWaker`]). On completion the record is freed
    /// and the operation's data handed back.
    pub(crate) fn poll(&mut self, key: &OpKey, waker: &Waker) -> Result<Polled, KeyError> {
        let rec = self.record(key)?;
        Ok(match rec.state {
            State::Done(res) => Polled::Ready(res, self.records.remove(key.index).data),
            _ if rec.waker.as_ref().is_some_and(|w| w.will_wake(waker)) => Polled::Pending,
            _ => Polled::NewWaker,
        })
    }

    /// Stores the waker of operation `key`; returns the one it replaces (to be dropped by
    /// the caller outside the borrow).
    pub(crate) fn set_waker(&mut self, key: &OpKey, waker: Waker) -> Option<Waker> {
        let rec = self.record(key).ok()?;
        rec.waker.replace(waker)
    }

    /// Sends IORING_OP_ASYNC_CANCEL for operation `key` (once); ignores a key that is not a
    /// live record of this loop.
    pub(crate) fn cancel(&mut self, key: &OpKey) {
        if self.record(key).is_ok() {
            self.cancel_index(key.index);
        }
    }

    fn cancel_index(&mut self, index: usize) {
        let rec = &mut self.records[index];
        if rec.cancel_sent || matches!(rec.state, State::Done(_)) {
            return;
        }
        rec.cancel_sent = true;
        let e = opcode::AsyncCancel::new(index as u64)
            .build()
            .user_data(CANCEL_TAG);
        self.queue(e);
    }

    /// The future owning `key` is gone: cancel, and free the record at its completion.
    /// Returns the record's waker, for the caller to drop outside the borrow. A key that is
    /// not a live record of this loop is ignored: another loop's record is never touched.
    pub(crate) fn orphan(&mut self, key: &OpKey) -> Option<Waker> {
        let rec = self.record(key).ok()?;
        match rec.state {
            State::Done(res) => {
                let rec = self.records.remove(key.index);
                self.deferred.orphans.push((rec.data, res));
                rec.waker
            }
            _ => {
                rec.state = State::Orphan;
                let waker = rec.waker.take();
                self.cancel_index(key.index);
                // Hand the operation and its cancel to the kernel now, not at the next turn:
                // the caller may close the descriptor right after dropping the future, and a
                // reused descriptor number must not meet a still-queued SQE. Once submitted,
                // the kernel holds its own reference to the file.
                self.flush_backlog();
                let _ = self.ring.submit();
                waker
            }
        }
    }

    fn reap(&mut self) {
        let mut cqes = std::mem::take(&mut self.cqes);
        {
            let mut cq = self.ring.completion();
            cq.sync();
            cqes.extend((&mut cq).map(|cqe| (cqe.user_data(), cqe.result())));
        }
        for &(ud, res) in &cqes {
            if ud == WAKE_TAG {
                let mut buf = 0u64;
                // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd; we
                // only clear its counter.
                unsafe { libc::read(self.efd, &mut buf as *mut u64 as *mut _, 8) };
                self.efd_armed = false;
            } else if ud != CANCEL_TAG {
                self.complete(ud as usize, res);
            }
        }
        cqes.clear();
        self.cqes = cqes;
        for key in std::mem::take(&mut self.simulated) {
            self.complete(key, -libc::EAGAIN);
        }
        if !self.efd_armed {
            let e = opcode::PollAdd::new(types::Fd(self.efd), libc::POLLIN as u32)
                .build()
                .user_data(WAKE_TAG);
            self.backlog.push_back(e);
            self.efd_armed = true;
        }
    }

    /// One completion for record `key`: either the operation's own, or that of the poll the
    /// driver armed under the same key after the operation returned -EAGAIN.
    fn complete(&mut self, key: usize, mut res: i32) {
        let Some(rec) = self.records.get_mut(key) else {
            return;
        };
        if rec.polling {
            rec.polling = false;
            if rec.cancel_sent {
                // The operation itself has not run since its -EAGAIN, so nothing was done:
                // it is cancelled, whatever the poll reports. The poll's result is a
                // readiness mask (POLLIN = 1), never a byte count or a descriptor.
                res = -libc::ECANCELED;
            } else if res >= 0 {
                // Ready now: retry the operation itself.
                let e = rec.sqe.clone().user_data(key as u64);
                self.backlog.push_back(e);
                return;
            }
            // else the poll itself failed: its error is the operation's.
        } else if res == -libc::EAGAIN && !rec.cancel_sent {
            if let Some((fd, events)) = rec.events {
                rec.polling = true;
                let e = opcode::PollAdd::new(types::Fd(fd), events)
                    .build()
                    .user_data(key as u64);
                self.backlog.push_back(e);
                return;
            }
        }
        if rec.cancel_sent && res == -libc::EAGAIN {
            res = -libc::ECANCELED;
        }
        match rec.state {
            State::InFlight => {
                rec.state = State::Done(res);
                if let Some(w) = rec.waker.take() {
                    self.deferred.wakers.push(w);
                }
            }
            State::Orphan => {
                let data = self.records.remove(key).data;
                self.deferred.orphans.push((data, res));
            }
            State::Done(_) => {}
        }
    }

    pub(crate) fn turn(&mut self, timeout: Option<Duration>) {
        self.flush_backlog();
        // Simulated completions are due now: do not sleep in the kernel.
        let timeout = if self.simulated.is_empty() {
            timeout
        } else {
            Some(Duration::ZERO)
        };
        let r = match timeout {
            Some(d) if d.is_zero() => {
                let mut sq = self.ring.submission();
                let need = !sq.is_empty() || sq.taskrun() || sq.cq_overflow();
                sq.sync();
                drop(sq);
                if need {
                    self.ring.submit()
                } else {
                    Ok(0)
                }
            }
            Some(d) => {
                let ts = types::Timespec::from(d);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
            None => self.ring.submit_and_wait(1),
        };
        if let Err(e) = r {
            if !matches!(
                errno(&e),
                libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN
            ) {
                panic!("iolab-runtime: io_uring_enter failed: {e}");
            }
        }
        self.reap();
        self.flush_backlog();
    }

    /// Cancels everything still in flight and waits (bounded) for the kernel to finish with
    /// every buffer. Records still in flight after that are leaked, never freed under the
    /// kernel's feet.
    /// Cancels every record and turns the ring until each has completed (at most 5 s); returns
    /// the records left: those still in flight then, which are leaked, plus any live one.
    pub(crate) fn shutdown(&mut self) -> usize {
        let keys: Vec<usize> = self.records.iter().map(|(k, _)| k).collect();
        for k in keys {
            self.cancel_index(k);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self
            .records
            .iter()
            .any(|(_, r)| !matches!(r.state, State::Done(_)))
            && Instant::now() < deadline
        {
            self.turn(Some(Duration::from_millis(20)));
        }
        self.leak_in_flight() + self.records.len()
    }

    /// Forgets the data of the records the kernel still holds (it may write into their
    /// buffers at any time); returns how many.
    fn leak_in_flight(&mut self) -> usize {
        let stuck: Vec<usize> = self
            .records
            .iter()
            .filter(|(_, r)| !matches!(r.state, State::Done(_)))
            .map(|(k, _)| k)
            .collect();
        if !stuck.is_empty() {
            tracing::warn!(
                "iolab-runtime: {} operation(s) still in flight at shutdown; their buffers are leaked, not freed",
                stuck.len()
            );
        }
        let leaked = stuck.len();
        for k in stuck {
            std::mem::forget(self.records.remove(k).data);
        }
        leaked
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        self.leak_in_flight();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{Interest, Operation};

    struct Nop;

    // SAFETY: a NOP SQE carries no pointer.
    unsafe impl Operation for Nop {
        fn prepare(&mut self) -> squeue::Entry {
            opcode::Nop::new().build()
        }
        fn attempt(&mut self) -> io::Result<usize> {
            Ok(0)
        }
        fn readiness(&self) -> Option<(RawFd, Interest)> {
            None
        }
    }

    fn start_nop(u: &mut Uring) -> OpKey {
        let mut data: Box<dyn OpData> = Box::new(Nop);
        let sqe = data.prepare();
        u.start(data, sqe, None)
    }

    fn finish(u: &mut Uring, key: &OpKey) -> i32 {
        for _ in 0..500 {
            if let Polled::Ready(res, _) = u.poll(key, Waker::noop()).unwrap() {
                return res;
            }
            u.turn(Some(Duration::from_millis(10)));
        }
        panic!("NOP never completed");
    }

    /// A key whose slot was freed and reused, or that names another loop, reaches no record.
    #[test]
    fn stale_and_foreign_keys_are_errors() {
        // SAFETY: eventfd returns a fresh descriptor or -1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        assert!(efd >= 0);
        let mut u = Uring::new(efd, 7, false).unwrap();
        let old = start_nop(&mut u);
        assert_eq!(finish(&mut u, &old), 0);
        let new = start_nop(&mut u);
        assert_eq!(new.index, old.index, "the slot is reused");
        assert!(matches!(u.poll(&old, Waker::noop()), Err(KeyError::Stale)));
        assert!(u.set_waker(&old, Waker::noop().clone()).is_none());
        assert!(u.orphan(&old).is_none());
        u.cancel(&old);
        let foreign = OpKey { loop_id: 8, ..new };
        assert!(matches!(
            u.poll(&foreign, Waker::noop()),
            Err(KeyError::OtherLoop)
        ));
        assert!(u.orphan(&foreign).is_none());
        assert_eq!(u.live_ops(), 1, "the live record was not touched");
        assert_eq!(finish(&mut u, &new), 0);
        assert_eq!(u.live_ops(), 0);
        drop(u);
        // SAFETY: closes the eventfd created above.
        unsafe { libc::close(efd) };
    }
}
