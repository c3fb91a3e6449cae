//! `Notify`: wake one waiting task (or store one permit), or every waiting task.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use super::lock;

/// How a waiter was notified.
#[derive(Clone, Copy, PartialEq, Eq)]
enum By {
    Not,
    One,
    All,
}

struct State {
    permit: bool,
    waiters: Vec<(u64, Option<Waker>, By)>,
    next_id: u64,
}

/// Like a binary semaphore for wake-ups: [`notify_one`](Notify::notify_one) wakes the oldest
/// waiter, or, with none waiting, leaves a permit that the next
/// [`notified`](Notify::notified) consumes at once; [`notify_waiters`](Notify::notify_waiters)
/// wakes every current waiter and leaves no permit. `Send + Sync`: usable across loops.
pub struct Notify {
    state: Mutex<State>,
}

impl Default for Notify {
    fn default() -> Self {
        Notify::new()
    }
}

impl std::fmt::Debug for Notify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Notify")
    }
}

impl Notify {
    pub fn new() -> Notify {
        Notify {
            state: Mutex::new(State {
                permit: false,
                waiters: Vec::new(),
                next_id: 0,
            }),
        }
    }

    pub fn notify_one(&self) {
        let w = {
            let mut s = lock(&self.state);
            match s.waiters.iter_mut().find(|(_, _, n)| *n == By::Not) {
                Some(e) => {
                    e.2 = By::One;
                    e.1.take()
                }
                None => {
                    s.permit = true;
                    None
                }
            }
        };
        if let Some(w) = w {
            w.wake();
        }
    }

    pub fn notify_waiters(&self) {
        let ws: Vec<Waker> = {
            let mut s = lock(&self.state);
            s.waiters
                .iter_mut()
                .filter(|(_, _, n)| *n == By::Not)
                .filter_map(|e| {
                    e.2 = By::All;
                    e.1.take()
                })
                .collect()
        };
        for w in ws {
            w.wake();
        }
    }

    /// Waits for a notification.
    pub fn notified(&self) -> Notified<'_> {
        Notified {
            notify: self,
            id: None,
        }
    }
}

/// Future of [`Notify::notified`]. Dropped after being picked by `notify_one` but before
/// completing, it passes the notification on.
#[must_use = "futures do nothing unless awaited"]
pub struct Notified<'a> {
    notify: &'a Notify,
    id: Option<u64>,
}

impl Future for Notified<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = lock(&self.notify.state);
        match self.id {
            None => {
                if s.permit {
                    s.permit = false;
                    return Poll::Ready(());
                }
                let id = s.next_id;
                s.next_id += 1;
                s.waiters.push((id, Some(cx.waker().clone()), By::Not));
                drop(s);
                self.id = Some(id);
                Poll::Pending
            }
            Some(id) => {
                let Some(pos) = s.waiters.iter().position(|(i, _, _)| *i == id) else {
                    return Poll::Ready(());
                };
                if s.waiters[pos].2 != By::Not {
                    s.waiters.remove(pos);
                    drop(s);
                    self.id = None;
                    return Poll::Ready(());
                }
                s.waiters[pos].1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for Notified<'_> {
    fn drop(&mut self) {
        let Some(id) = self.id else { return };
        let pass_on = {
            let mut s = lock(&self.notify.state);
            match s.waiters.iter().position(|(i, _, _)| *i == id) {
                // Only a notify_one is passed on; a notify_waiters wake-up is not a permit.
                Some(pos) => s.waiters.remove(pos).2 == By::One,
                None => false,
            }
        };
        if pass_on {
            self.notify.notify_one();
        }
    }
}
