//! Timers: an ordered map of deadlines per loop.
//!
//! Why not io_uring timeouts: a map in the loop works the same on both drivers, costs no
//! syscall or submission per timer, and the loop already sleeps in one place
//! (io_uring_enter with an EXT_ARG timespec, nanosecond precision; epoll_wait, whose
//! millisecond timeout we round *up* so a timer never fires early). Resolution is therefore
//! 1 ms or better.
//!
//! Invariant: the map holds exactly the live timers. A [`Sleep`] dropped before its
//! deadline (a [`timeout`] whose operation finished first) removes its entry at once,
//! O(log n), so memory follows the number of live timers, not the rate at which timers are
//! created times their duration (a binary heap with lazy deletion kept one dead entry per
//! dropped timer until its deadline came up). A connection that wants an idle limit keeps
//! one [`Sleep`], [`Sleep::reset`]s it after each operation and races each operation
//! against it with [`timeout_with`].

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::driver::KeyError;
use crate::rt::with_core;

/// A registered timer's name: its deadline and a sequence number unique within its loop
/// (which also orders timers with equal deadlines by creation).
type TimerKey = (Instant, u64);

/// The live timers of one loop, ordered by deadline. A timer is in the map from its first
/// pending poll until it fires or its [`Sleep`] is dropped or reset: the map's size is the
/// number of live timers, whatever the number of timers dropped before their deadline.
#[derive(Default)]
pub(crate) struct Timers {
    map: BTreeMap<TimerKey, Option<Waker>>,
    seq: u64,
}

impl Timers {
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    fn insert(&mut self, deadline: Instant, waker: Waker) -> TimerKey {
        self.seq += 1;
        let key = (deadline, self.seq);
        self.map.insert(key, Some(waker));
        key
    }

    /// Removes a timer; its waker is returned so that it is dropped outside the borrow.
    fn remove(&mut self, key: &TimerKey) -> Option<Option<Waker>> {
        self.map.remove(key)
    }

    /// Wakers of the timers due at `now`, in deadline order (ties: creation order). The
    /// caller wakes them after releasing the borrow.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<Waker> {
        let mut out = Vec::new();
        while let Some(entry) = self.map.first_entry() {
            if entry.key().0 > now {
                break;
            }
            if let Some(w) = entry.remove() {
                out.push(w);
            }
        }
        out
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.map.first_key_value().map(|(k, _)| k.0)
    }

    /// Empties the structure, handing the wakers back to be dropped outside the borrow.
    pub(crate) fn clear(&mut self) -> Vec<Waker> {
        std::mem::take(&mut self.map)
            .into_values()
            .flatten()
            .collect()
    }
}

/// How a poll of a registered timer went, decided under the borrow.
enum Polled {
    Ready,
    Pending,
    /// Pending, and the stored waker would not wake this task: store a clone (made outside
    /// the borrow).
    NewWaker,
}

/// Future of [`sleep`] and [`sleep_until`].
///
/// It can be [`reset`](Sleep::reset) to a new deadline and polled again, so one `Sleep` can
/// serve as a connection's idle timer across many operations ([`timeout_with`]).
#[must_use = "futures do nothing unless awaited"]
pub struct Sleep {
    deadline: Instant,
    /// Set while the timer is registered: the id of its loop and its key there.
    key: Option<(u64, TimerKey)>,
}

impl Sleep {
    fn new(deadline: Instant) -> Sleep {
        Sleep {
            deadline,
            key: None,
        }
    }

    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Moves the deadline (earlier or later), whether or not the timer has fired; a task
    /// waiting on it is woken at the new deadline. O(log live timers).
    pub fn reset(&mut self, deadline: Instant) {
        if deadline == self.deadline && self.key.is_some() {
            return;
        }
        self.deadline = deadline;
        if let Some((loop_id, k)) = self.key.take() {
            let (key, old) = with_core(|c| {
                if c.id != loop_id {
                    panic!("iolab-runtime: {}", KeyError::OtherLoop);
                }
                let mut t = c.timers.borrow_mut();
                match t.remove(&k) {
                    Some(Some(w)) => (Some((loop_id, t.insert(deadline, w))), None),
                    other => (None, other.flatten()),
                }
            });
            self.key = key;
            drop(old);
        }
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        let Some((loop_id, k)) = self.key else {
            if Instant::now() >= deadline {
                return Poll::Ready(());
            }
            let waker = cx.waker().clone();
            self.key = Some(with_core(|c| {
                (c.id, c.timers.borrow_mut().insert(deadline, waker))
            }));
            return Poll::Pending;
        };
        let (polled, old) = with_core(|c| {
            if c.id != loop_id {
                return (Err(KeyError::OtherLoop), None);
            }
            let mut t = c.timers.borrow_mut();
            match t.map.get(&k) {
                // Not in the structure any more: it fired.
                None => (Ok(Polled::Ready), None),
                // Due, but the loop has not expired it yet.
                Some(_) if Instant::now() >= deadline => (Ok(Polled::Ready), t.remove(&k)),
                Some(Some(w)) if w.will_wake(cx.waker()) => (Ok(Polled::Pending), None),
                Some(_) => (Ok(Polled::NewWaker), None),
            }
        });
        drop(old);
        let polled = match polled {
            Ok(p) => p,
            Err(e) => {
                // Registered on another loop: never touch that loop's timers from here.
                self.key = None;
                panic!("iolab-runtime: {e}");
            }
        };
        match polled {
            Polled::Ready => {
                self.key = None;
                Poll::Ready(())
            }
            Polled::Pending => Poll::Pending,
            Polled::NewWaker => {
                let waker = cx.waker().clone();
                let old = with_core(|c| {
                    c.timers
                        .borrow_mut()
                        .map
                        .get_mut(&k)
                        .map(|slot| slot.replace(waker))
                });
                drop(old);
                Poll::Pending
            }
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some((loop_id, k)) = self.key.take() {
            let waker = crate::rt::try_with_core(|c| {
                if c.id != loop_id {
                    return None; // another loop's entry: it fires there, harmlessly
                }
                c.timers
                    .try_borrow_mut()
                    .ok()
                    .and_then(|mut t| t.remove(&k))
            });
            drop(waker);
        }
    }
}

/// Entries in the caller's loop's timer structure: the live timers (registered, not yet
/// fired, not dropped). For tests and diagnostics. Panics outside a runtime.
pub fn live_timers() -> usize {
    with_core(|c| c.timers.borrow().len())
}

/// Waits until `duration` has passed (resolution 1 ms or better, never early).
pub fn sleep(duration: Duration) -> Sleep {
    Sleep::new(Instant::now() + duration)
}

/// Waits until `deadline`.
pub fn sleep_until(deadline: Instant) -> Sleep {
    Sleep::new(deadline)
}

/// The error of [`timeout`]: the deadline passed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline elapsed")
    }
}

impl std::error::Error for Elapsed {}

impl From<Elapsed> for std::io::Error {
    fn from(_: Elapsed) -> Self {
        std::io::Error::new(std::io::ErrorKind::TimedOut, Elapsed)
    }
}

/// Runs `fut` for at most `duration`. On expiry `fut` is dropped, which cancels the
/// operation it had in flight (IORING_OP_ASYNC_CANCEL; its buffers stay with the runtime
/// until the kernel completes it).
pub async fn timeout<F: Future>(duration: Duration, fut: F) -> Result<F::Output, Elapsed> {
    Timeout {
        fut,
        sleep: sleep(duration),
    }
    .await
}

/// Runs `fut` until `sleep` fires, like [`timeout`] but with a timer the caller keeps: reset
/// it ([`Sleep::reset`]) and use it again for the next operation. One timer per connection
/// instead of one per read and write.
pub async fn timeout_with<F: Future>(sleep: &mut Sleep, fut: F) -> Result<F::Output, Elapsed> {
    Timeout { fut, sleep }.await
}

struct Timeout<F, S> {
    fut: F,
    sleep: S,
}

impl<F: Future, S: Future<Output = ()> + Unpin> Future for Timeout<F, S> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: structural pinning: `fut` is never moved out of the pinned struct; `sleep`
        // is Unpin.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: see above.
        if let Poll::Ready(v) = unsafe { Pin::new_unchecked(&mut this.fut) }.poll(cx) {
            return Poll::Ready(Ok(v));
        }
        match Pin::new(&mut this.sleep).poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// [`sleep`] that returns `Err(Cancelled)` early when `cancel` is signalled.
pub async fn sleep_or_cancel(
    duration: std::time::Duration,
    cancel: &crate::cond::Cond,
) -> Result<(), crate::cond::Cancelled> {
    crate::cond::cancellable(cancel, sleep(duration)).await
}
