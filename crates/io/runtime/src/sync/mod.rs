//! Synchronisation between tasks, on one loop or across loops and threads: a bounded
//! channel with backpressure, a one-shot channel, and [`Notify`].
//!
//! These are `Send + Sync` (a mutex each; uncontended on one loop). For signalling between
//! tasks of one loop, with CPC semantics and cancellation, see [`crate::Cond`].

pub mod mpsc;
mod notify;
pub mod oneshot;

pub use notify::{Notified, Notify};

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
