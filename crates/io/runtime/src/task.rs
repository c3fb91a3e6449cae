//! Tasks: a future plus the little state a loop needs to run it, in one allocation.
//!
//! A task belongs to exactly one loop (its *owner*) for its whole life: it is polled, and its
//! future dropped, only on the owner's thread. Wakers, however, must be `Send + Sync`, so a
//! waker may fire on any thread: it then hands the task to the owner through the owner's
//! remote queue (and eventfd). That is what makes `!Send` futures safe to spawn on a loop.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use crate::rt::{self, Shared};

const SCHEDULED: u8 = 1;
const COMPLETE: u8 = 2;
const ABORT: u8 = 4;

pub(crate) const NO_KEY: usize = usize::MAX;

/// What a loop sees of a task.
pub(crate) trait Runnable: Send + Sync + 'static {
    /// Polls the task once. Owner thread only.
    fn run(self: Arc<Self>);
    /// Drops the future without polling it again and completes the task with
    /// [`JoinError::Shutdown`]. Owner thread only, or any thread for a task never polled.
    fn shutdown(&self);
}

/// Why a task ended without producing its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinError {
    /// [`JoinHandle::abort`] was called.
    Aborted,
    /// The task panicked; the payload's message, where it was a string.
    Panicked(String),
    /// The runtime shut down before the task finished.
    Shutdown,
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Aborted => f.write_str("task aborted"),
            JoinError::Panicked(m) => write!(f, "task panicked: {m}"),
            JoinError::Shutdown => f.write_str("runtime shut down before the task finished"),
        }
    }
}

impl std::error::Error for JoinError {}

impl From<JoinError> for std::io::Error {
    fn from(e: JoinError) -> Self {
        std::io::Error::other(e)
    }
}

struct JoinSlot<T> {
    output: Option<Result<T, JoinError>>,
    waker: Option<Waker>,
    /// The JoinHandle is gone: the output is dropped as soon as it exists.
    detached: bool,
}

pub(crate) struct Task<F: Future> {
    state: AtomicU8,
    /// Key in the owner's task registry, or NO_KEY before the first run. Owner thread only.
    key: Cell<usize>,
    owner: Arc<Shared>,
    /// Owner thread only (see the SAFETY note on the Send/Sync impls).
    future: UnsafeCell<Option<F>>,
    join: Mutex<JoinSlot<F::Output>>,
}

// SAFETY: `future` and `key` are only touched on the owner loop's thread: `run` and `shutdown`
// are called by the owner's core, except `shutdown` of a task that was never polled (its
// future is then still the value handed to `Handle::spawn`, which requires it `Send`, or a
// `SpawnWith` holding only a `Send` closure). Everything else is atomics or behind a Mutex.
// The output crosses threads only through `JoinHandle<T>`, which is `Send` only if `T` is.
unsafe impl<F: Future> Send for Task<F> {}
// SAFETY: as above.
unsafe impl<F: Future> Sync for Task<F> {}

impl<F: Future + 'static> Task<F> {
    pub(crate) fn new(future: F, owner: Arc<Shared>) -> Arc<Self> {
        Arc::new(Task {
            state: AtomicU8::new(SCHEDULED),
            key: Cell::new(NO_KEY),
            owner,
            future: UnsafeCell::new(Some(future)),
            join: Mutex::new(JoinSlot {
                output: None,
                waker: None,
                detached: false,
            }),
        })
    }

    pub(crate) fn set_key(&self, key: usize) {
        self.key.set(key);
    }

    fn complete(&self, output: Result<F::Output, JoinError>) {
        self.state.fetch_or(COMPLETE, Ordering::AcqRel);
        let key = self.key.replace(NO_KEY);
        if key != NO_KEY {
            rt::unregister_task(&self.owner, key);
        }
        let waker = {
            let mut slot = lock(&self.join);
            if slot.detached {
                drop(slot);
                drop(output);
                return;
            }
            slot.output = Some(output);
            slot.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Sets SCHEDULED; true if the caller must queue the task.
    fn mark_scheduled(&self) -> bool {
        let prev = self.state.fetch_or(SCHEDULED, Ordering::AcqRel);
        prev & (SCHEDULED | COMPLETE) == 0
    }
}

fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

impl<F: Future + 'static> Runnable for Task<F> {
    fn run(self: Arc<Self>) {
        let prev = self.state.fetch_and(!SCHEDULED, Ordering::AcqRel);
        if prev & COMPLETE != 0 {
            return;
        }
        if self.key.get() == NO_KEY {
            // First run of a task spawned from another thread: register it with its loop.
            let key = rt::register_task(self.clone());
            self.key.set(key);
        }
        // SAFETY: owner thread (see the Send/Sync impls); no other reference to the future
        // exists while it is polled.
        let slot = unsafe { &mut *self.future.get() };
        if prev & ABORT != 0 {
            *slot = None;
            self.complete(Err(JoinError::Aborted));
            return;
        }
        let Some(fut) = slot.as_mut() else { return };
        let waker = Waker::from(self.clone());
        let mut cx = Context::from_waker(&waker);
        // SAFETY: the future stays in place inside the Arc allocation until it is dropped
        // in place (`*slot = None`); it is never moved out.
        let pinned = unsafe { Pin::new_unchecked(fut) };
        match catch_unwind(AssertUnwindSafe(|| pinned.poll(&mut cx))) {
            Ok(Poll::Pending) => {}
            Ok(Poll::Ready(v)) => {
                *slot = None;
                self.complete(Ok(v));
            }
            Err(payload) => {
                *slot = None;
                self.complete(Err(JoinError::Panicked(panic_message(&*payload))));
            }
        }
    }

    fn shutdown(&self) {
        if self.state.load(Ordering::Acquire) & COMPLETE != 0 {
            return;
        }
        // SAFETY: see the trait documentation: owner thread, or a never-polled task.
        let slot = unsafe { &mut *self.future.get() };
        *slot = None;
        self.complete(Err(JoinError::Shutdown));
    }
}

impl<F: Future + 'static> Wake for Task<F> {
    fn wake(self: Arc<Self>) {
        if self.mark_scheduled() {
            let owner = self.owner.clone();
            rt::schedule(&owner, self);
        }
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.mark_scheduled() {
            rt::schedule(&self.owner, self.clone());
        }
    }
}

pub(crate) trait Join<T>: Send + Sync {
    fn poll_join(&self, cx: &mut Context<'_>) -> Poll<Result<T, JoinError>>;
    fn abort(self: Arc<Self>);
    fn is_finished(&self) -> bool;
    fn detach(&self);
}

impl<F: Future + 'static> Join<F::Output> for Task<F> {
    fn poll_join(&self, cx: &mut Context<'_>) -> Poll<Result<F::Output, JoinError>> {
        let mut slot = lock(&self.join);
        if let Some(out) = slot.output.take() {
            return Poll::Ready(out);
        }
        match &slot.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => slot.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    fn abort(self: Arc<Self>) {
        let prev = self.state.fetch_or(ABORT, Ordering::AcqRel);
        if prev & COMPLETE == 0 {
            self.wake();
        }
    }

    fn is_finished(&self) -> bool {
        self.state.load(Ordering::Acquire) & COMPLETE != 0
    }

    fn detach(&self) {
        let out = {
            let mut slot = lock(&self.join);
            slot.detached = true;
            slot.waker = None;
            slot.output.take()
        };
        drop(out);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave the slot inconsistent (plain stores).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An owned permission to await (or abort) a spawned task.
///
/// Awaiting gives the task's value, or a [`JoinError`] if it was aborted, panicked or the
/// runtime shut down first. Dropping the handle detaches the task: it keeps running.
pub struct JoinHandle<T> {
    task: Arc<dyn Join<T>>,
    _marker: PhantomData<T>,
}

impl<T> JoinHandle<T> {
    pub(crate) fn new(task: Arc<dyn Join<T>>) -> Self {
        JoinHandle {
            task,
            _marker: PhantomData,
        }
    }

    /// Asks the task to stop: its future is dropped at its next turn on its loop (any
    /// operation it has in flight is cancelled) and awaiting this handle gives
    /// [`JoinError::Aborted`]. No effect on a finished task.
    pub fn abort(&self) {
        self.task.clone().abort();
    }

    /// Whether the task has finished (value ready, aborted, panicked or shut down).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.task.poll_join(cx)
    }
}

impl<T> Drop for JoinHandle<T> {
    fn drop(&mut self) {
        self.task.detach();
    }
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("finished", &self.is_finished())
            .finish()
    }
}

/// A future built on its loop from a `Send` closure: what crosses threads is only the
/// closure, so the future it makes need not be `Send`.
pub(crate) enum SpawnWith<C, Fut> {
    Closure(Option<C>),
    Running(Fut),
}

impl<C, Fut> Future for SpawnWith<C, Fut>
where
    C: FnOnce() -> Fut,
    Fut: Future,
{
    type Output = Fut::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Fut::Output> {
        // SAFETY: we never move the future out of `Running`; the closure variant is Unpin
        // data that we only take by value before replacing the whole enum in place.
        let this = unsafe { self.get_unchecked_mut() };
        if let SpawnWith::Closure(c) = this {
            let make = c
                .take()
                .expect("SpawnWith polled after a panic in its closure");
            *this = SpawnWith::Running(make());
        }
        match this {
            // SAFETY: `this` is pinned (we came from Pin<&mut Self>) and is not moved.
            SpawnWith::Running(f) => unsafe { Pin::new_unchecked(f) }.poll(cx),
            SpawnWith::Closure(_) => unreachable!(),
        }
    }
}
