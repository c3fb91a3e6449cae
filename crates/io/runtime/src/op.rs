//! `submit`, the general primitive (CPC's `cpc_call_async_prim`), and the readiness waits
//! (CPC's original `cpc_io_wait`).

use std::any::Any;
use std::future::Future;
use std::io;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use io_uring::{opcode, squeue, types};

use crate::cond::{CancelWatch, Cancelled, Cond};
use crate::driver::uring::{self, OpData};
use crate::driver::{epoll, IoDriver, KeyError, OpKey};
use crate::rt::{try_with_core, with_core};

/// A direction of readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Interest {
    Readable,
    Writable,
}

/// An I/O operation with its owned resources: what [`submit`] runs.
///
/// The operation value *is* the record's payload: [`submit`] moves it into a runtime-owned
/// operation record (boxed, so it never moves again), calls [`prepare`](Operation::prepare)
/// on it there, and hands it back with the result once the kernel has completed it. On the
/// epoll driver, [`attempt`](Operation::attempt) runs instead whenever
/// [`readiness`](Operation::readiness) says the descriptor is ready.
///
/// # Safety
/// Every pointer in the SQE that `prepare` returns must point into `self` or into heap memory
/// that `self` owns and does not free or reallocate before it is dropped or returned: the
/// kernel reads and writes through those pointers until the completion arrives.
pub unsafe trait Operation: 'static {
    /// Builds the SQE (its `user_data` is set by the runtime).
    fn prepare(&mut self) -> squeue::Entry;

    /// Epoll driver: performs the operation now, without blocking. `WouldBlock` makes the
    /// runtime wait for [`readiness`](Operation::readiness) and call it again.
    fn attempt(&mut self) -> io::Result<usize>;

    /// The descriptor and direction to wait on when the operation would block (`None` for
    /// operations that never return EAGAIN, such as regular-file reads).
    fn readiness(&self) -> Option<(RawFd, Interest)>;

    /// Called when the operation completes after its future was dropped, with its result:
    /// release what it produced (for instance close an accepted descriptor).
    fn orphaned(&mut self, result: io::Result<usize>) {
        let _ = result;
    }

    /// io_uring driver: an attempt made on the task's thread before anything is submitted,
    /// which must not block (`MSG_DONTWAIT`). `Some(Ok(n))` or a real error completes the
    /// operation at once, without an SQE, a completion or a wake-up of the task (the
    /// counterpart of IOCP's skip-completion-on-success); `Some(Err(WouldBlock))` submits
    /// it. `None` (the default) always submits. Worth it only for operations that usually
    /// succeed at once and whose io_uring form would complete inline anyway (a send with
    /// room in the socket buffer): the attempt then replaces a ring round trip.
    fn attempt_inline(&mut self) -> Option<io::Result<usize>> {
        None
    }
}

fn to_result(res: i32) -> io::Result<usize> {
    if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as usize)
    }
}

impl<O: Operation> OpData for O {
    fn prepare(&mut self) -> squeue::Entry {
        Operation::prepare(self)
    }

    fn poll_events(&self) -> Option<(RawFd, u32)> {
        self.readiness().map(|(fd, i)| {
            let ev = match i {
                Interest::Readable => libc::POLLIN | libc::POLLRDHUP,
                Interest::Writable => libc::POLLOUT,
            };
            (fd, ev as u32)
        })
    }

    fn orphaned(&mut self, res: i32) {
        Operation::orphaned(self, to_result(res))
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// Runs `op` on the loop's driver and resolves with its result and the operation (with its
/// buffers) handed back: the counterpart of CPC's `cpc_call_async_prim`.
///
/// If the future is dropped before completion, the operation is cancelled
/// (IORING_OP_ASYNC_CANCEL) and its record keeps `op` until the kernel's completion.
pub async fn submit<O: Operation>(op: O) -> (io::Result<usize>, O) {
    submit_inner(op, None).await
}

/// [`submit`] that ends early when `cancel` is signalled: the in-flight operation is
/// cancelled with IORING_OP_ASYNC_CANCEL and, once the kernel is done with it, the result is
/// an error for which [`Cancelled::is`] holds, with `op` handed back. If the operation had
/// already completed when the cancellation reached the kernel, its real result is returned.
pub async fn submit_or_cancel<O: Operation>(op: O, cancel: &Cond) -> (io::Result<usize>, O) {
    submit_inner(op, Some(cancel)).await
}

fn is_uring() -> bool {
    with_core(|c| matches!(&*c.driver.borrow(), IoDriver::Uring(_)))
}

/// Which driver the loop has, and for io_uring whether [`Operation::attempt_inline`] is
/// used (not under `simulate_eagain`, whose tests need every operation on the ring).
fn uring_inline() -> Option<bool> {
    with_core(|c| match &*c.driver.borrow() {
        IoDriver::Uring(u) => Some(u.inline_attempts()),
        IoDriver::Epoll(_) => None,
    })
}

pub(crate) async fn submit_inner<O: Operation>(
    mut op: O,
    cancel: Option<&Cond>,
) -> (io::Result<usize>, O) {
    if let Some(inline) = uring_inline() {
        if inline {
            match op.attempt_inline() {
                None => {}
                Some(Err(e))
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.raw_os_error() == Some(libc::EINTR) => {}
                Some(r) => return (r, op),
            }
        }
        UringOp {
            op: Some(op),
            key: None,
            cancel: cancel.map(CancelWatch::new),
            cancelled: false,
        }
        .await
    } else {
        epoll_run(op, cancel).await
    }
}

async fn epoll_run<O: Operation>(mut op: O, cancel: Option<&Cond>) -> (io::Result<usize>, O) {
    loop {
        match op.attempt() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let Some((fd, interest)) = op.readiness() else {
                    return (Err(e), op);
                };
                let r = Readiness {
                    fd,
                    interest,
                    key: None,
                    cancel: cancel.map(CancelWatch::new),
                }
                .await;
                if let Err(e) = r {
                    return (Err(e), op);
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            r => return (r, op),
        }
    }
}

struct UringOp<'c, O: Operation> {
    op: Option<O>,
    key: Option<OpKey>,
    cancel: Option<CancelWatch<'c>>,
    cancelled: bool,
}

// The operation is moved into a Box before anything points into it; the future itself
// holds nothing that must stay in place.
impl<O: Operation> Unpin for UringOp<'_, O> {}

/// Runs `f` on this loop's io_uring driver. `f` must not run user code (wakers, operation
/// callbacks, destructors of user data): the driver is borrowed meanwhile.
fn with_uring<R>(f: impl FnOnce(&mut crate::driver::uring::Uring) -> R) -> R {
    with_core(|c| match &mut *c.driver.borrow_mut() {
        IoDriver::Uring(u) => f(u),
        IoDriver::Epoll(_) => panic!("iolab-runtime: {}", KeyError::OtherLoop),
    })
}

impl<O: Operation> Future for UringOp<'_, O> {
    type Output = (io::Result<usize>, O);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let key = match this.key {
            Some(k) => k,
            None => {
                let op = this.op.take().expect("UringOp polled after completion");
                let mut data: Box<dyn OpData> = Box::new(op);
                // User code (`prepare`, `readiness`) runs here, before the driver is borrowed;
                // the SQE points into the box, which does not move when the box does.
                let sqe = data.prepare();
                let events = data.poll_events();
                let k = with_uring(|u| u.start(data, sqe, events));
                this.key = Some(k);
                k
            }
        };
        match with_uring(|u| u.poll(&key, cx.waker())) {
            Err(e) => {
                // Misuse: the record belongs to another loop (or is gone); never touch it.
                this.key = None;
                panic!("iolab-runtime: {e}");
            }
            Ok(uring::Polled::Ready(res, data)) => {
                this.key = None;
                let op = *data
                    .into_any()
                    .downcast::<O>()
                    .expect("operation record holds its own type");
                let result = if res < 0
                    && this.cancelled
                    && (res == -libc::ECANCELED || res == -libc::EINTR)
                {
                    Err(Cancelled.into())
                } else {
                    to_result(res)
                };
                return Poll::Ready((result, op));
            }
            Ok(uring::Polled::NewWaker) => {
                let waker = cx.waker().clone();
                let old = with_uring(|u| u.set_waker(&key, waker));
                drop(old);
            }
            Ok(uring::Polled::Pending) => {}
        }
        if !this.cancelled {
            if let Some(w) = &mut this.cancel {
                if w.poll_signalled(cx) {
                    this.cancelled = true;
                    with_uring(|u| u.cancel(&key));
                }
            }
        }
        Poll::Pending
    }
}

impl<O: Operation> Drop for UringOp<'_, O> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let waker = try_with_core(|c| {
                let mut d = c.driver.try_borrow_mut().ok()?;
                match &mut *d {
                    IoDriver::Uring(u) => u.orphan(&key),
                    IoDriver::Epoll(_) => None,
                }
            });
            drop(waker);
        }
    }
}

/// Epoll wait for one direction of readiness.
struct Readiness<'c> {
    fd: RawFd,
    interest: Interest,
    key: Option<OpKey>,
    cancel: Option<CancelWatch<'c>>,
}

/// Runs `f` on this loop's epoll driver; as [`with_uring`], `f` runs no user code.
fn with_epoll<R>(f: impl FnOnce(&mut crate::driver::epoll::Epoll) -> R) -> R {
    with_core(|c| match &mut *c.driver.borrow_mut() {
        IoDriver::Epoll(e) => f(e),
        IoDriver::Uring(_) => panic!("iolab-runtime: {}", KeyError::OtherLoop),
    })
}

impl Future for Readiness<'_> {
    type Output = io::Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let (fd, interest) = (self.fd, self.interest);
        match self.key {
            None => {
                let waker = cx.waker().clone();
                match with_epoll(|e| e.add_waiter(fd, interest, waker)) {
                    Ok(k) => self.key = Some(k),
                    Err((e, waker)) => {
                        drop(waker);
                        return Poll::Ready(Err(e));
                    }
                }
            }
            Some(k) => match with_epoll(|e| e.poll_waiter(&k, cx.waker())) {
                Err(e) => {
                    self.key = None;
                    panic!("iolab-runtime: {e}");
                }
                Ok(epoll::Polled::Ready) => {
                    self.key = None;
                    return Poll::Ready(Ok(()));
                }
                Ok(epoll::Polled::NewWaker) => {
                    let waker = cx.waker().clone();
                    let old = with_epoll(|e| e.set_waker(&k, waker));
                    drop(old);
                }
                Ok(epoll::Polled::Pending) => {}
            },
        }
        if let Some(w) = &mut self.cancel {
            if w.poll_signalled(cx) {
                return Poll::Ready(Err(Cancelled.into()));
            }
        }
        Poll::Pending
    }
}

impl Drop for Readiness<'_> {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            let waker = try_with_core(|c| {
                let mut d = c.driver.try_borrow_mut().ok()?;
                match &mut *d {
                    IoDriver::Epoll(e) => e.remove_waiter(&k),
                    IoDriver::Uring(_) => None,
                }
            });
            drop(waker);
        }
    }
}

struct PollOp {
    fd: RawFd,
    events: u32,
}

// SAFETY: a POLL_ADD SQE carries no pointer.
unsafe impl Operation for PollOp {
    fn prepare(&mut self) -> squeue::Entry {
        opcode::PollAdd::new(types::Fd(self.fd), self.events).build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "poll operation on the epoll driver",
        ))
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        None
    }
}

async fn wait_ready(fd: RawFd, interest: Interest, cancel: Option<&Cond>) -> io::Result<()> {
    if is_uring() {
        let events = match interest {
            Interest::Readable => libc::POLLIN | libc::POLLRDHUP,
            Interest::Writable => libc::POLLOUT,
        } as u32;
        submit_inner(PollOp { fd, events }, cancel)
            .await
            .0
            .map(|_| ())
    } else {
        Readiness {
            fd,
            interest,
            key: None,
            cancel: cancel.map(CancelWatch::new),
        }
        .await
    }
}

/// Waits until `fd` is readable (CPC's `cpc_io_wait(fd, CPC_IO_IN)`): IORING_OP_POLL_ADD on
/// io_uring, epoll on the fallback. Works for any descriptor (eventfd, pipe, socket...).
pub async fn wait_readable(fd: RawFd) -> io::Result<()> {
    wait_ready(fd, Interest::Readable, None).await
}

/// Waits until `fd` is writable.
pub async fn wait_writable(fd: RawFd) -> io::Result<()> {
    wait_ready(fd, Interest::Writable, None).await
}

/// [`wait_readable`] that returns a [`Cancelled`] error when `cancel` is signalled.
pub async fn wait_readable_or_cancel(fd: RawFd, cancel: &Cond) -> io::Result<()> {
    wait_ready(fd, Interest::Readable, Some(cancel)).await
}

/// [`wait_writable`] that returns a [`Cancelled`] error when `cancel` is signalled.
pub async fn wait_writable_or_cancel(fd: RawFd, cancel: &Cond) -> io::Result<()> {
    wait_ready(fd, Interest::Writable, Some(cancel)).await
}
