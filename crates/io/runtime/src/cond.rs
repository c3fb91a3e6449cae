//! CPC's condition variables, and cancellation through them.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use slab::Slab;

/// The error of a wait whose cancel [`Cond`] was signalled.
///
/// I/O operations report it as an [`io::Error`] of kind `Interrupted` carrying this value;
/// test with [`Cancelled::is`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled;

impl Cancelled {
    /// Whether `e` is a cancellation (as returned by the `*_or_cancel` I/O operations).
    pub fn is(e: &io::Error) -> bool {
        e.get_ref().is_some_and(|inner| inner.is::<Cancelled>())
    }
}

impl fmt::Display for Cancelled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("operation cancelled")
    }
}

impl std::error::Error for Cancelled {}

impl From<Cancelled> for io::Error {
    fn from(c: Cancelled) -> Self {
        io::Error::new(io::ErrorKind::Interrupted, c)
    }
}

/// Links are u32 slab keys (NIL = none): a parked task costs one small node here.
const NIL: u32 = u32::MAX;

struct Node {
    waker: Option<Waker>,
    prev: u32,
    next: u32,
    signalled: bool,
}

struct Inner {
    nodes: Slab<Node>,
    head: u32,
    tail: u32,
    queued: usize,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            nodes: Slab::new(),
            head: NIL,
            tail: NIL,
            queued: 0,
        }
    }
}

impl Inner {
    fn push(&mut self, waker: Waker) -> usize {
        let key = self.nodes.insert(Node {
            waker: Some(waker),
            prev: self.tail,
            next: NIL,
            signalled: false,
        });
        assert!(
            key < NIL as usize,
            "iolab-runtime: more than 4 billion waiters on one Cond"
        );
        match self.tail {
            NIL => self.head = key as u32,
            t => self.nodes[t as usize].next = key as u32,
        }
        self.tail = key as u32;
        self.queued += 1;
        key
    }

    fn unlink(&mut self, key: usize) {
        let (prev, next) = {
            let n = &self.nodes[key];
            (n.prev, n.next)
        };
        match prev {
            NIL => self.head = next,
            p => self.nodes[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.nodes[n as usize].prev = prev,
        }
        self.queued -= 1;
    }

    fn pop(&mut self) -> Option<Waker> {
        if self.head == NIL {
            return None;
        }
        let h = self.head as usize;
        self.unlink(h);
        let n = &mut self.nodes[h];
        n.signalled = true;
        n.waker.take()
    }

    /// Whether waiter `key` was signalled (then forgotten); else refresh its waker.
    fn check(&mut self, key: usize, waker: &Waker) -> bool {
        let n = &mut self.nodes[key];
        if n.signalled {
            self.nodes.remove(key);
            return true;
        }
        if !n.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            n.waker = Some(waker.clone());
        }
        false
    }

    fn remove(&mut self, key: usize) {
        if let Some(n) = self.nodes.get(key) {
            if !n.signalled {
                self.unlink(key);
            }
            self.nodes.remove(key);
        }
    }
}

/// A condition variable for tasks of one loop, as in CPC: tasks [`wait`](Cond::wait) on it;
/// [`signal`](Cond::signal) wakes the oldest waiter, [`broadcast`](Cond::broadcast) all of
/// them. Signals are not remembered: a signal with no waiter is lost.
///
/// A `Cond` also cancels: every wait of the runtime has a form taking a cancel `Cond`
/// (`*_or_cancel`, [`cancellable`]); signalling it makes those waits return [`Cancelled`].
///
/// Cloning gives another handle to the same condition. Not `Send`: it belongs to one loop.
#[derive(Clone, Default)]
pub struct Cond {
    inner: Rc<RefCell<Inner>>,
}

impl fmt::Debug for Cond {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cond")
            .field("waiters", &self.waiters())
            .finish()
    }
}

impl Cond {
    pub fn new() -> Cond {
        Cond::default()
    }

    /// Wakes the oldest waiter; false if there was none.
    pub fn signal(&self) -> bool {
        let w = self.inner.borrow_mut().pop();
        match w {
            Some(w) => {
                w.wake();
                true
            }
            None => false,
        }
    }

    /// Wakes every current waiter; returns how many.
    pub fn broadcast(&self) -> usize {
        let mut wakers = Vec::new();
        {
            let mut inner = self.inner.borrow_mut();
            while inner.head != NIL {
                if let Some(w) = inner.pop() {
                    wakers.push(w);
                }
            }
        }
        let n = wakers.len();
        for w in wakers {
            w.wake();
        }
        n
    }

    /// Number of tasks waiting (not yet signalled).
    pub fn waiters(&self) -> usize {
        self.inner.borrow().queued
    }

    /// Waits for a signal.
    pub fn wait(&self) -> CondWait<'_> {
        CondWait {
            cond: self,
            key: None,
        }
    }

    /// Waits for a signal on `self`, or returns `Err(Cancelled)` when `cancel` is signalled.
    pub async fn wait_or_cancel(&self, cancel: &Cond) -> Result<(), Cancelled> {
        cancellable(cancel, self.wait()).await
    }

    pub(crate) fn add_waiter(&self, waker: &Waker) -> usize {
        self.inner.borrow_mut().push(waker.clone())
    }

    pub(crate) fn check_waiter(&self, key: usize, waker: &Waker) -> bool {
        self.inner.borrow_mut().check(key, waker)
    }

    pub(crate) fn remove_waiter(&self, key: usize) {
        if let Ok(mut inner) = self.inner.try_borrow_mut() {
            inner.remove(key);
        }
    }
}

/// Future of [`Cond::wait`]. Dropping it after it was signalled consumes the signal.
#[must_use = "futures do nothing unless awaited"]
pub struct CondWait<'a> {
    cond: &'a Cond,
    key: Option<usize>,
}

impl Future for CondWait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.key {
            None => {
                self.key = Some(self.cond.add_waiter(cx.waker()));
                Poll::Pending
            }
            Some(k) => {
                if self.cond.check_waiter(k, cx.waker()) {
                    self.key = None;
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl Drop for CondWait<'_> {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            self.cond.remove_waiter(k);
        }
    }
}

/// Watches a cancel condition from inside another future.
pub(crate) struct CancelWatch<'a> {
    cond: &'a Cond,
    key: Option<usize>,
}

impl<'a> CancelWatch<'a> {
    pub(crate) fn new(cond: &'a Cond) -> Self {
        CancelWatch { cond, key: None }
    }

    /// True once the condition has been signalled since the first call.
    pub(crate) fn poll_signalled(&mut self, cx: &mut Context<'_>) -> bool {
        match self.key {
            None => {
                self.key = Some(self.cond.add_waiter(cx.waker()));
                false
            }
            Some(k) => {
                if self.cond.check_waiter(k, cx.waker()) {
                    self.key = None;
                    true
                } else {
                    false
                }
            }
        }
    }
}

impl Drop for CancelWatch<'_> {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            self.cond.remove_waiter(k);
        }
    }
}

/// Runs `fut` until it finishes, or until `cancel` is signalled: then `fut` is dropped
/// (cancelling whatever it had in flight) and the result is `Err(Cancelled)`.
///
/// Works for any wait: [`crate::sleep`], [`Cond::wait`], [`crate::wait_readable`], a whole
/// request handler. I/O operations with owned buffers have their own `*_or_cancel` forms,
/// which give the buffer back.
pub async fn cancellable<F: Future>(cancel: &Cond, fut: F) -> Result<F::Output, Cancelled> {
    Cancellable {
        fut,
        watch: CancelWatch::new(cancel),
    }
    .await
}

struct Cancellable<'a, F> {
    fut: F,
    watch: CancelWatch<'a>,
}

impl<F: Future> Future for Cancellable<'_, F> {
    type Output = Result<F::Output, Cancelled>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: structural pinning of `fut` only; it is never moved. `watch` is Unpin.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: see above.
        if let Poll::Ready(v) = unsafe { Pin::new_unchecked(&mut this.fut) }.poll(cx) {
            return Poll::Ready(Ok(v));
        }
        if this.watch.poll_signalled(cx) {
            return Poll::Ready(Err(Cancelled));
        }
        Poll::Pending
    }
}
