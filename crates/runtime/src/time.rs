//! Timers: a binary heap of deadlines per loop.
//!
//! Why not io_uring timeouts: a heap works the same on both drivers, costs no syscall or
//! submission per timer, and the loop already sleeps in one place (io_uring_enter with an
//! EXT_ARG timespec, nanosecond precision; epoll_wait, whose millisecond timeout we round
//! *up* so a timer never fires early). Resolution is therefore 1 ms or better; a dropped
//! timer is removed from the table at once and its heap entry skipped lazily.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use slab::Slab;

use crate::rt::with_core;

struct Entry {
    seq: u64,
    waker: Option<Waker>,
    fired: bool,
}

#[derive(Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    entries: Slab<Entry>,
    seq: u64,
}

impl Timers {
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn insert(&mut self, deadline: Instant, waker: Waker) -> usize {
        self.seq += 1;
        let seq = self.seq;
        let key = self.entries.insert(Entry {
            seq,
            waker: Some(waker),
            fired: false,
        });
        self.heap.push(Reverse((deadline, seq, key)));
        key
    }

    /// Wakers of the timers due at `now`, in deadline order (ties: creation order).
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<Waker> {
        let mut out = Vec::new();
        while let Some(Reverse((deadline, seq, key))) = self.heap.peek().copied() {
            let live = matches!(self.entries.get(key), Some(e) if e.seq == seq && !e.fired);
            if !live {
                self.heap.pop();
                continue;
            }
            if deadline > now {
                break;
            }
            self.heap.pop();
            let e = &mut self.entries[key];
            e.fired = true;
            if let Some(w) = e.waker.take() {
                out.push(w);
            }
        }
        out
    }

    pub(crate) fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(Reverse((deadline, seq, key))) = self.heap.peek().copied() {
            match self.entries.get(key) {
                Some(e) if e.seq == seq && !e.fired => return Some(deadline),
                _ => {
                    self.heap.pop();
                }
            }
        }
        None
    }

    pub(crate) fn clear(&mut self) {
        self.heap.clear();
        self.entries.clear();
    }
}

/// Future of [`sleep`] and [`sleep_until`].
#[must_use = "futures do nothing unless awaited"]
pub struct Sleep {
    deadline: Instant,
    key: Option<usize>,
}

impl Sleep {
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        let key = self.key;
        let done: Result<bool, usize> = with_core(|c| {
            let mut t = c.timers.borrow_mut();
            match key {
                Some(k) => {
                    let e = &mut t.entries[k];
                    if e.fired || Instant::now() >= deadline {
                        t.entries.remove(k);
                        Ok(true)
                    } else {
                        if !e.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                            e.waker = Some(cx.waker().clone());
                        }
                        Ok(false)
                    }
                }
                None if Instant::now() >= deadline => Ok(true),
                None => Err(t.insert(deadline, cx.waker().clone())),
            }
        });
        match done {
            Ok(true) => {
                self.key = None;
                Poll::Ready(())
            }
            Ok(false) => Poll::Pending,
            Err(k) => {
                self.key = Some(k);
                Poll::Pending
            }
        }
    }
}

impl Sleep {
    fn new(deadline: Instant) -> Sleep {
        Sleep {
            deadline,
            key: None,
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            crate::rt::try_with_core(|c| {
                if let Ok(mut t) = c.timers.try_borrow_mut() {
                    t.entries.try_remove(k);
                }
            });
        }
    }
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

struct Timeout<F> {
    fut: F,
    sleep: Sleep,
}

impl<F: Future> Future for Timeout<F> {
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
