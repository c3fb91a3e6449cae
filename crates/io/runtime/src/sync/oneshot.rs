//! A channel for one value.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use super::lock;

struct Inner<T> {
    value: Option<T>,
    rx_waker: Option<Waker>,
    tx_gone: bool,
    rx_gone: bool,
}

/// Sends the value; consumed by [`Sender::send`].
pub struct Sender<T> {
    inner: Arc<Mutex<Inner<T>>>,
}

/// Awaits the value: `Ok(v)`, or `Err(RecvError)` if the sender was dropped without sending.
pub struct Receiver<T> {
    inner: Arc<Mutex<Inner<T>>>,
}

/// The sender was dropped without sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvError;

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("oneshot sender dropped without sending")
    }
}

impl std::error::Error for RecvError {}

pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let inner = Arc::new(Mutex::new(Inner {
        value: None,
        rx_waker: None,
        tx_gone: false,
        rx_gone: false,
    }));
    (
        Sender {
            inner: inner.clone(),
        },
        Receiver { inner },
    )
}

impl<T> Sender<T> {
    /// Delivers `value`; gives it back if the receiver is gone.
    pub fn send(self, value: T) -> Result<(), T> {
        let w = {
            let mut g = lock(&self.inner);
            if g.rx_gone {
                return Err(value);
            }
            g.value = Some(value);
            g.rx_waker.take()
        };
        if let Some(w) = w {
            w.wake();
        }
        Ok(())
    }

    /// Whether the receiver was dropped.
    pub fn is_closed(&self) -> bool {
        lock(&self.inner).rx_gone
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let w = {
            let mut g = lock(&self.inner);
            g.tx_gone = true;
            g.rx_waker.take()
        };
        if let Some(w) = w {
            w.wake();
        }
    }
}

impl<T> Future for Receiver<T> {
    type Output = Result<T, RecvError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut g = lock(&self.inner);
        if let Some(v) = g.value.take() {
            return Poll::Ready(Ok(v));
        }
        if g.tx_gone {
            return Poll::Ready(Err(RecvError));
        }
        if !g.rx_waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            g.rx_waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl<T> Receiver<T> {
    /// The value if it has arrived, without waiting.
    pub fn try_recv(&mut self) -> Option<T> {
        lock(&self.inner).value.take()
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let v = {
            let mut g = lock(&self.inner);
            g.rx_gone = true;
            g.value.take()
        };
        drop(v);
    }
}
