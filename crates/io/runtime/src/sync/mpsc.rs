//! A bounded multi-producer, single-consumer channel with backpressure: `send` waits while
//! the channel holds `capacity` values.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use super::lock;

struct Chan<T> {
    queue: VecDeque<T>,
    cap: usize,
    rx_waker: Option<Waker>,
    /// Senders waiting for room, oldest first: (id, waker).
    tx_waiters: VecDeque<(u64, Waker)>,
    next_id: u64,
    senders: usize,
    rx_gone: bool,
}

impl<T> Chan<T> {
    fn wake_one_sender(&mut self) -> Option<Waker> {
        self.tx_waiters.pop_front().map(|(_, w)| w)
    }
}

/// Sending half; clone it for more producers.
pub struct Sender<T> {
    chan: Arc<Mutex<Chan<T>>>,
}

/// Receiving half.
pub struct Receiver<T> {
    chan: Arc<Mutex<Chan<T>>>,
}

/// The receiver is gone; the value comes back.
#[derive(PartialEq, Eq)]
pub struct SendError<T>(pub T);

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendError(..)")
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("channel receiver dropped")
    }
}

impl<T> std::error::Error for SendError<T> {}

/// Why [`Sender::try_send`] failed; the value comes back.
#[derive(PartialEq, Eq)]
pub enum TrySendError<T> {
    Full(T),
    Closed(T),
}

impl<T> fmt::Debug for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(_) => f.write_str("Full(..)"),
            TrySendError::Closed(_) => f.write_str("Closed(..)"),
        }
    }
}

/// A channel holding at most `capacity` values (at least 1).
pub fn channel<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let cap = capacity.max(1);
    let chan = Arc::new(Mutex::new(Chan {
        queue: VecDeque::with_capacity(cap.min(1024)),
        cap,
        rx_waker: None,
        tx_waiters: VecDeque::new(),
        next_id: 0,
        senders: 1,
        rx_gone: false,
    }));
    (Sender { chan: chan.clone() }, Receiver { chan })
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        lock(&self.chan).senders += 1;
        Sender {
            chan: self.chan.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let w = {
            let mut c = lock(&self.chan);
            c.senders -= 1;
            if c.senders == 0 {
                c.rx_waker.take()
            } else {
                None
            }
        };
        if let Some(w) = w {
            w.wake();
        }
    }
}

impl<T> Sender<T> {
    /// Sends `value`, waiting while the channel is full.
    pub fn send(&self, value: T) -> Send<'_, T> {
        Send {
            sender: self,
            value: Some(value),
            id: None,
        }
    }

    /// Sends without waiting.
    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        let w = {
            let mut c = lock(&self.chan);
            if c.rx_gone {
                return Err(TrySendError::Closed(value));
            }
            if c.queue.len() >= c.cap {
                return Err(TrySendError::Full(value));
            }
            c.queue.push_back(value);
            c.rx_waker.take()
        };
        if let Some(w) = w {
            w.wake();
        }
        Ok(())
    }

    /// Whether the receiver was dropped.
    pub fn is_closed(&self) -> bool {
        lock(&self.chan).rx_gone
    }
}

/// Future of [`Sender::send`].
#[must_use = "futures do nothing unless awaited"]
pub struct Send<'a, T> {
    sender: &'a Sender<T>,
    value: Option<T>,
    id: Option<u64>,
}

impl<T> Unpin for Send<'_, T> {}

impl<T> Future for Send<'_, T> {
    type Output = Result<(), SendError<T>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let value = this.value.take().expect("Send polled after completion");
        let mut c = lock(&this.sender.chan);
        if c.rx_gone {
            return Poll::Ready(Err(SendError(value)));
        }
        if c.queue.len() < c.cap {
            if let Some(id) = this.id.take() {
                c.tx_waiters.retain(|(i, _)| *i != id);
            }
            c.queue.push_back(value);
            let w = c.rx_waker.take();
            drop(c);
            if let Some(w) = w {
                w.wake();
            }
            return Poll::Ready(Ok(()));
        }
        this.value = Some(value);
        match this.id {
            Some(id) => {
                if let Some(e) = c.tx_waiters.iter_mut().find(|(i, _)| *i == id) {
                    if !e.1.will_wake(cx.waker()) {
                        e.1 = cx.waker().clone();
                    }
                } else {
                    // We were woken but lost the slot to another sender: queue again, first.
                    c.tx_waiters.push_front((id, cx.waker().clone()));
                }
            }
            None => {
                let id = c.next_id;
                c.next_id += 1;
                c.tx_waiters.push_back((id, cx.waker().clone()));
                this.id = Some(id);
            }
        }
        Poll::Pending
    }
}

impl<T> Drop for Send<'_, T> {
    fn drop(&mut self) {
        let Some(id) = self.id else { return };
        let w = {
            let mut c = lock(&self.sender.chan);
            let before = c.tx_waiters.len();
            c.tx_waiters.retain(|(i, _)| *i != id);
            let was_queued = c.tx_waiters.len() != before;
            // Woken for a free slot but leaving without using it: pass the turn on.
            if !was_queued && c.queue.len() < c.cap {
                c.wake_one_sender()
            } else {
                None
            }
        };
        if let Some(w) = w {
            w.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// The next value; `None` once every sender is gone and the channel is empty.
    pub fn recv(&mut self) -> Recv<'_, T> {
        Recv { rx: self }
    }

    /// The next value if there is one, without waiting.
    pub fn try_recv(&mut self) -> Option<T> {
        let (v, w) = {
            let mut c = lock(&self.chan);
            let v = c.queue.pop_front();
            let w = if v.is_some() {
                c.wake_one_sender()
            } else {
                None
            };
            (v, w)
        };
        if let Some(w) = w {
            w.wake();
        }
        v
    }

    /// Values waiting in the channel.
    pub fn len(&self) -> usize {
        lock(&self.chan).queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Future of [`Receiver::recv`].
#[must_use = "futures do nothing unless awaited"]
pub struct Recv<'a, T> {
    rx: &'a mut Receiver<T>,
}

impl<T> Future for Recv<'_, T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut c = lock(&self.rx.chan);
        if let Some(v) = c.queue.pop_front() {
            let w = c.wake_one_sender();
            drop(c);
            if let Some(w) = w {
                w.wake();
            }
            return Poll::Ready(Some(v));
        }
        if c.senders == 0 {
            return Poll::Ready(None);
        }
        if !c.rx_waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            c.rx_waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let (items, waiters) = {
            let mut c = lock(&self.chan);
            c.rx_gone = true;
            (
                std::mem::take(&mut c.queue),
                std::mem::take(&mut c.tx_waiters),
            )
        };
        drop(items);
        for (_, w) in waiters {
            w.wake();
        }
    }
}
