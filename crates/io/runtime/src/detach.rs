//! `detach`: blocking work on a bounded pool of native threads (CPC's `cpc_detach`).
//!
//! The closure runs on a pool thread; its result is stored in a shared slot and the waiting
//! task is woken through its waker, which brings it back to *its own* loop (through that
//! loop's remote queue and eventfd) where it resumes with the value.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

/// Most native threads the pool starts; beyond, jobs queue.
pub const MAX_DETACH_THREADS: usize = 64;
const IDLE_EXIT: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send>;

struct PoolState {
    queue: VecDeque<Job>,
    threads: usize,
    idle: usize,
}

struct Pool {
    state: Mutex<PoolState>,
    cv: Condvar,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        state: Mutex::new(PoolState {
            queue: VecDeque::new(),
            threads: 0,
            idle: 0,
        }),
        cv: Condvar::new(),
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn worker(p: &'static Pool) {
    let mut st = lock(&p.state);
    loop {
        if let Some(job) = st.queue.pop_front() {
            drop(st);
            job();
            st = lock(&p.state);
            continue;
        }
        st.idle += 1;
        let (g, to) =
            p.cv.wait_timeout(st, IDLE_EXIT)
                .unwrap_or_else(|e| e.into_inner());
        st = g;
        st.idle -= 1;
        if to.timed_out() && st.queue.is_empty() {
            st.threads -= 1;
            return;
        }
    }
}

fn submit(job: Job) {
    let p = pool();
    let mut st = lock(&p.state);
    st.queue.push_back(job);
    if st.idle < st.queue.len() && st.threads < MAX_DETACH_THREADS {
        st.threads += 1;
        let spawned = thread::Builder::new()
            .name("iolab-detach".into())
            .spawn(move || worker(p));
        if spawned.is_err() {
            // Could not start a thread: the existing ones (if any) will drain the queue.
            st.threads -= 1;
        }
    }
    drop(st);
    p.cv.notify_one();
}

struct Slot<R> {
    result: Option<thread::Result<R>>,
    waker: Option<Waker>,
}

/// Runs `f` on the native thread pool and resumes the calling task on its own loop with the
/// result; other tasks of the loop keep running meanwhile. A panic in `f` is resumed in the
/// task. If the future is dropped first, `f` still runs to completion and its result is
/// dropped.
pub async fn detach<F, R>(f: F) -> R
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let slot = Arc::new(Mutex::new(Slot {
        result: None,
        waker: None,
    }));
    let s2 = slot.clone();
    submit(Box::new(move || {
        let r = catch_unwind(AssertUnwindSafe(f));
        let w = {
            let mut s = lock(&s2);
            s.result = Some(r);
            s.waker.take()
        };
        if let Some(w) = w {
            w.wake();
        }
    }));
    match (Detached { slot }).await {
        Ok(v) => v,
        Err(p) => resume_unwind(p),
    }
}

struct Detached<R> {
    slot: Arc<Mutex<Slot<R>>>,
}

impl<R> Future for Detached<R> {
    type Output = thread::Result<R>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = lock(&self.slot);
        if let Some(r) = s.result.take() {
            return Poll::Ready(r);
        }
        if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            s.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}
