//! The executor: one single-threaded loop per worker, each with its own I/O driver, timers,
//! run queue and task registry; a remote queue plus an eventfd per loop for wake-ups and
//! spawns that come from other threads.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Instant;

use slab::Slab;

use crate::driver::{Deferred, Driver, IoDriver};
use crate::task::{JoinHandle, Runnable, SpawnWith, Task};
use crate::time::Timers;

/// Tasks run before the loop looks at I/O and timers again.
const BUDGET: usize = 512;

struct RemoteQueue {
    items: Vec<Arc<dyn Runnable>>,
    closed: bool,
}

/// The thread-safe part of a loop: what other threads use to reach it.
pub(crate) struct Shared {
    index: usize,
    remote: Mutex<RemoteQueue>,
    /// Set when the remote queue may hold work or a wake-up was requested; the eventfd is
    /// written only on the false -> true edge, so a busy loop costs senders one atomic.
    pending: AtomicBool,
    stop: AtomicBool,
    efd: OwnedFd,
    all: Mutex<Vec<Arc<Shared>>>,
}

impl Shared {
    fn new(index: usize) -> io::Result<Arc<Shared>> {
        // SAFETY: eventfd returns a fresh descriptor or -1.
        let fd =
            iolab_sys::cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        Ok(Arc::new(Shared {
            index,
            remote: Mutex::new(RemoteQueue {
                items: Vec::new(),
                closed: false,
            }),
            pending: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            // SAFETY: fd is ours alone.
            efd: unsafe { OwnedFd::from_raw_fd(fd) },
            all: Mutex::new(Vec::new()),
        }))
    }

    pub(crate) fn efd(&self) -> i32 {
        self.efd.as_raw_fd()
    }

    fn push_remote(&self, task: Arc<dyn Runnable>) {
        let mut q = self.remote.lock().unwrap_or_else(|e| e.into_inner());
        if q.closed {
            drop(q);
            // Only never-polled tasks or completed ones can get here (see Core::shutdown).
            task.shutdown();
            return;
        }
        q.items.push(task);
        drop(q);
        self.wake_loop();
    }

    pub(crate) fn wake_loop(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd. An error (counter
            // saturated) still leaves the eventfd readable, which is all we need.
            unsafe { libc::write(self.efd.as_raw_fd(), &one as *const u64 as *const _, 8) };
        }
    }
}

pub(crate) struct Core {
    pub(crate) shared: Arc<Shared>,
    run_queue: RefCell<VecDeque<Arc<dyn Runnable>>>,
    tasks: RefCell<Slab<Arc<dyn Runnable>>>,
    pub(crate) driver: RefCell<IoDriver>,
    pub(crate) timers: RefCell<Timers>,
    /// Set while `block_on` (or a worker loop) runs on this core.
    entered: Cell<bool>,
    /// Unique in the process, never reused: the loop part of every operation and timer key.
    pub(crate) id: u64,
    /// The driver's user work of a turn (wakers, orphan callbacks), run outside its borrow;
    /// kept between turns for its capacity.
    deferred: Cell<Deferred>,
}

/// Source of loop ids (0 is never handed out).
static NEXT_LOOP_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static CURRENT: Cell<*const Core> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` with the loop of this thread; panics with a clear message outside a runtime.
pub(crate) fn with_core<R>(f: impl FnOnce(&Core) -> R) -> R {
    let p = CURRENT.with(|c| c.get());
    assert!(
        !p.is_null(),
        "iolab-runtime: this must run inside a runtime (Runtime::block_on or a spawned task)"
    );
    // SAFETY: CURRENT is non-null only between Enter::new and Enter::drop, while the Core it
    // points to is borrowed by the caller that entered it and cannot move or be dropped.
    f(unsafe { &*p })
}

pub(crate) fn try_with_core<R>(f: impl FnOnce(&Core) -> R) -> Option<R> {
    let p = CURRENT.with(|c| c.get());
    if p.is_null() {
        None
    } else {
        // SAFETY: as in with_core.
        Some(f(unsafe { &*p }))
    }
}

struct Enter {
    prev: *const Core,
}

impl Enter {
    fn new(core: &Core) -> Enter {
        let prev = CURRENT.with(|c| c.replace(core as *const Core));
        Enter { prev }
    }
}

impl Drop for Enter {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.prev));
    }
}

fn on_owner_thread(owner: &Arc<Shared>) -> bool {
    try_with_core(|c| Arc::ptr_eq(&c.shared, owner)).unwrap_or(false)
}

pub(crate) fn schedule(owner: &Arc<Shared>, task: Arc<dyn Runnable>) {
    let local = try_with_core(|c| {
        if Arc::ptr_eq(&c.shared, owner) {
            c.run_queue.borrow_mut().push_back(task.clone());
            true
        } else {
            false
        }
    });
    if local != Some(true) {
        owner.push_remote(task);
    }
}

pub(crate) fn register_task(task: Arc<dyn Runnable>) -> usize {
    with_core(|c| c.tasks.borrow_mut().insert(task))
}

pub(crate) fn unregister_task(owner: &Arc<Shared>, key: usize) {
    let removed = try_with_core(|c| {
        if Arc::ptr_eq(&c.shared, owner) {
            // try_borrow: during shutdown the registry is being drained by the core itself.
            c.tasks
                .try_borrow_mut()
                .ok()
                .and_then(|mut t| t.try_remove(key))
        } else {
            None
        }
    });
    drop(removed);
}

impl Core {
    fn new(shared: Arc<Shared>, kind: Driver, simulate_eagain: bool) -> io::Result<Core> {
        let id = NEXT_LOOP_ID.fetch_add(1, Ordering::Relaxed);
        let driver = IoDriver::new(kind, shared.efd(), id, simulate_eagain)?;
        Ok(Core {
            shared,
            run_queue: RefCell::new(VecDeque::with_capacity(1024)),
            tasks: RefCell::new(Slab::new()),
            driver: RefCell::new(driver),
            timers: RefCell::new(Timers::default()),
            entered: Cell::new(false),
            id,
            deferred: Cell::new(Deferred::default()),
        })
    }

    fn spawn_local<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        let task = Task::new(fut, self.shared.clone());
        let key = self.tasks.borrow_mut().insert(task.clone());
        task.set_key(key);
        self.run_queue.borrow_mut().push_back(task.clone());
        JoinHandle::new(task)
    }

    fn drain_remote(&self) {
        if !self.shared.pending.swap(false, Ordering::AcqRel) {
            return;
        }
        let items = {
            let mut q = self.shared.remote.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut q.items)
        };
        self.run_queue.borrow_mut().extend(items);
    }

    /// One turn: run ready tasks, fire timers, then poll the driver (blocking only when
    /// nothing is ready, `main` included: the block_on future's wake flag).
    fn turn(&self, main: Option<&AtomicBool>) {
        for _ in 0..BUDGET {
            let next = self.run_queue.borrow_mut().pop_front();
            match next {
                Some(t) => t.run(),
                None => break,
            }
        }
        self.drain_remote();
        let next_deadline = self.fire_timers();
        let idle = !main.is_some_and(|m| m.load(Ordering::Acquire))
            && self.run_queue.borrow().is_empty()
            && !self.shared.pending.load(Ordering::Acquire);
        let timeout = if !idle {
            Some(std::time::Duration::ZERO)
        } else {
            next_deadline.map(|d| d.saturating_duration_since(Instant::now()))
        };
        self.driver.borrow_mut().turn(timeout);
        self.run_deferred();
        self.fire_timers();
    }

    /// Runs the user code the driver found (wakers to wake, callbacks and destructors of
    /// operations whose futures were dropped) now that it is no longer borrowed: that code
    /// may use the runtime (spawn, start operations, query it) without a RefCell panic.
    fn run_deferred(&self) {
        let mut deferred = self.deferred.take();
        self.driver.borrow_mut().take_deferred(&mut deferred);
        deferred.run();
        self.deferred.set(deferred);
    }

    fn fire_timers(&self) -> Option<Instant> {
        let mut timers = self.timers.borrow_mut();
        if timers.is_empty() {
            return None;
        }
        let wakers = timers.expire(Instant::now());
        let next = timers.next_deadline();
        drop(timers);
        for w in wakers {
            w.wake();
        }
        next
    }

    /// Drops every task's future (cancelling what they had in flight), then lets the driver
    /// wait for the kernel to finish with every buffer; returns the operation records that
    /// were not freed ([`IoDriver::shutdown`]).
    fn shutdown(&self) -> usize {
        let _enter = Enter::new(self);
        loop {
            let tasks: Vec<_> = {
                let mut reg = self.tasks.borrow_mut();
                reg.drain().collect()
            };
            let queued: Vec<_> = self.run_queue.borrow_mut().drain(..).collect();
            let remote = {
                let mut q = self.shared.remote.lock().unwrap_or_else(|e| e.into_inner());
                std::mem::take(&mut q.items)
            };
            if tasks.is_empty() && queued.is_empty() && remote.is_empty() {
                break;
            }
            for t in tasks.iter().chain(queued.iter()).chain(remote.iter()) {
                t.shutdown();
            }
        }
        {
            let mut q = self.shared.remote.lock().unwrap_or_else(|e| e.into_inner());
            q.closed = true;
            let items = std::mem::take(&mut q.items);
            drop(q);
            for t in items {
                t.shutdown();
            }
        }
        let wakers = self.timers.borrow_mut().clear();
        drop(wakers);
        self.run_deferred();
        let not_freed = self.driver.borrow_mut().shutdown();
        self.run_deferred();
        not_freed
    }
}

struct MainWaker {
    woken: AtomicBool,
    shared: Arc<Shared>,
}

impl Wake for MainWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.woken.swap(true, Ordering::AcqRel) && !on_owner_thread(&self.shared) {
            self.shared.wake_loop();
        }
    }
}

fn block_on_core<F: Future>(core: &Core, fut: F) -> F::Output {
    assert!(
        !core.entered.get(),
        "iolab-runtime: block_on called from inside the same runtime (nested block_on)"
    );
    assert!(
        CURRENT.with(|c| c.get()).is_null(),
        "iolab-runtime: block_on called from inside a runtime; spawn or await instead"
    );
    let _enter = Enter::new(core);
    core.entered.set(true);
    struct Leave<'a>(&'a Core);
    impl Drop for Leave<'_> {
        fn drop(&mut self) {
            self.0.entered.set(false);
        }
    }
    let _leave = Leave(core);
    let main = Arc::new(MainWaker {
        woken: AtomicBool::new(true),
        shared: core.shared.clone(),
    });
    let waker = Waker::from(main.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        if main.woken.swap(false, Ordering::AcqRel) {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
        }
        core.turn(Some(&main.woken));
    }
}

/// Builds a [`Runtime`]: number of loops (workers), CPU pinning, driver.
#[derive(Debug, Clone, Default)]
pub struct Builder {
    workers: usize,
    pin: bool,
    driver: Option<Driver>,
    simulate_eagain: bool,
}

impl Builder {
    pub fn new() -> Builder {
        Builder {
            workers: 1,
            pin: false,
            driver: None,
            simulate_eagain: false,
        }
    }

    /// Number of loops, one thread each (0 = one per CPU). Loop 0 is driven by the thread
    /// that calls [`Runtime::block_on`]; loops 1.. run on threads the runtime starts.
    pub fn workers(mut self, n: usize) -> Builder {
        self.workers = n;
        self
    }

    /// Pins the runtime's own worker threads (loops 1..) to CPU `i % ncpus`.
    pub fn pin_workers(mut self, pin: bool) -> Builder {
        self.pin = pin;
        self
    }

    /// Forces a driver for this runtime instead of the process-wide choice of [`crate::driver()`].
    pub fn driver(mut self, driver: Driver) -> Builder {
        self.driver = Some(driver);
        self
    }

    /// Testing aid (io_uring only): the first attempt of every operation that can wait for
    /// readiness "fails" with -EAGAIN without reaching the kernel, so it takes the driver's
    /// retry path (poll for readiness under the operation's key, then issue it) as it does
    /// on kernels that answer -EAGAIN (older ones, non-blocking splices, `RWF_NOWAIT`).
    /// Deterministic, so tests can race cancellation against that path.
    #[doc(hidden)]
    pub fn simulate_eagain(mut self, on: bool) -> Builder {
        self.simulate_eagain = on;
        self
    }

    pub fn build(self) -> io::Result<Runtime> {
        let kind = match self.driver {
            Some(d) => d,
            None => crate::driver::choose()?,
        };
        let n = if self.workers == 0 {
            num_cpus()
        } else {
            self.workers
        };
        let mut shareds = Vec::with_capacity(n);
        for i in 0..n {
            shareds.push(Shared::new(i)?);
        }
        for s in &shareds {
            *s.all.lock().unwrap_or_else(|e| e.into_inner()) = shareds.clone();
        }
        let simulate_eagain = self.simulate_eagain;
        let core = Box::new(Core::new(shareds[0].clone(), kind, simulate_eagain)?);
        let mut workers = Vec::new();
        let cpus = num_cpus();
        for (i, shared) in shareds.iter().enumerate().skip(1) {
            let shared = shared.clone();
            let pin = self.pin.then_some(i % cpus);
            let (tx, rx) = std::sync::mpsc::channel();
            let jh = thread::Builder::new()
                .name(format!("iolab-loop-{i}"))
                .spawn(move || worker_main(shared, kind, simulate_eagain, pin, tx))?;
            match rx.recv() {
                Ok(Ok(())) => workers.push(jh),
                Ok(Err(e)) => {
                    let _ = jh.join();
                    return Err(e);
                }
                Err(_) => {
                    let _ = jh.join();
                    return Err(io::Error::other(
                        "iolab-runtime: worker thread died at start",
                    ));
                }
            }
        }
        Ok(Runtime {
            core,
            shareds,
            workers,
            kind,
            stopped: false,
            _not_send: PhantomData,
        })
    }
}

fn worker_main(
    shared: Arc<Shared>,
    kind: Driver,
    simulate_eagain: bool,
    pin: Option<usize>,
    ready: std::sync::mpsc::Sender<io::Result<()>>,
) {
    if let Some(cpu) = pin {
        let _ = pin_current_thread(cpu);
    }
    let core = match Core::new(shared.clone(), kind, simulate_eagain) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    {
        let _enter = Enter::new(&core);
        core.entered.set(true);
        while !shared.stop.load(Ordering::Acquire) {
            core.turn(None);
        }
    }
    core.shutdown();
}

/// Pins the calling thread to one CPU (one helper for every crate: `iolab_sys::cpu`).
pub use iolab_sys::pin_current_thread;

pub(crate) fn num_cpus() -> usize {
    thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// A set of event loops (one per worker) with their I/O drivers and timers.
///
/// `!Send`: loop 0 belongs to the thread that built the runtime and is driven by
/// [`Runtime::block_on`]. Dropping the runtime stops the workers, drops every task (their
/// in-flight operations are cancelled) and waits for the kernel to release every buffer.
pub struct Runtime {
    core: Box<Core>,
    shareds: Vec<Arc<Shared>>,
    workers: Vec<thread::JoinHandle<()>>,
    kind: Driver,
    /// Set by [`Runtime::shutdown`], so that the drop that follows it has nothing to do.
    stopped: bool,
    _not_send: PhantomData<*const ()>,
}

impl Runtime {
    /// One loop on the calling thread, with the process-wide driver ([`crate::driver()`]).
    pub fn new() -> io::Result<Runtime> {
        Builder::new().build()
    }

    pub fn builder() -> Builder {
        Builder::new()
    }

    /// Runs `fut` to completion on loop 0, running the loop's tasks meanwhile.
    ///
    /// Panics if called from inside a runtime.
    pub fn block_on<F: Future>(&self, fut: F) -> F::Output {
        block_on_core(&self.core, fut)
    }

    /// The driver this runtime's loops use.
    pub fn driver(&self) -> Driver {
        self.kind
    }

    /// Number of loops.
    pub fn workers(&self) -> usize {
        self.shareds.len()
    }

    /// A handle to spawn onto loop `i`, if it exists.
    pub fn handle(&self, i: usize) -> Option<Handle> {
        self.shareds.get(i).map(|s| Handle { shared: s.clone() })
    }

    /// Spawns onto loop 0 (runs while `block_on` runs).
    pub fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        self.core.spawn_local(fut)
    }

    /// Live operation records (in-flight I/O operations, or readiness registrations on the
    /// epoll driver) on loop 0.
    pub fn live_ops(&self) -> usize {
        self.core.driver.borrow().live_ops()
    }

    /// Shuts the runtime down as dropping it does, and says whether that freed everything:
    /// returns loop 0's operation records still live afterwards, counting those the kernel
    /// did not let go of within the bound (their buffers leaked, not freed). 0 when every
    /// in-flight operation was cancelled and freed.
    pub fn shutdown(mut self) -> usize {
        self.stop()
    }

    /// Stops the worker loops, drops every task (cancelling what it had in flight) and waits,
    /// bounded, for the kernel to finish with every buffer; returns what
    /// [`Runtime::shutdown`] does.
    fn stop(&mut self) -> usize {
        if std::mem::replace(&mut self.stopped, true) {
            return 0;
        }
        for s in &self.shareds[1..] {
            s.stop.store(true, Ordering::Release);
            s.pending.store(false, Ordering::Release);
            s.wake_loop();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        let not_freed = self.core.shutdown();
        for s in &self.shareds {
            s.all.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
        not_freed
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A `Send + Sync` handle to one loop: spawn onto it from anywhere.
#[derive(Clone)]
pub struct Handle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("worker", &self.shared.index)
            .finish()
    }
}

impl Handle {
    /// The loop running the caller. Panics outside a runtime.
    pub fn current() -> Handle {
        with_core(|c| Handle {
            shared: c.shared.clone(),
        })
    }

    /// Index of this loop in its runtime (0 = the `block_on` loop).
    pub fn worker(&self) -> usize {
        self.shared.index
    }

    /// Spawns a `Send` future onto this loop.
    pub fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        if on_owner_thread(&self.shared) {
            return with_core(|c| c.spawn_local(fut));
        }
        let task = Task::new(fut, self.shared.clone());
        self.shared.push_remote(task.clone());
        JoinHandle::new(task)
    }

    /// Runs `make` on this loop and spawns the future it returns there; the future itself
    /// need not be `Send` (thread-per-core style: it never leaves that loop).
    pub fn spawn_with<C, Fut>(&self, make: C) -> JoinHandle<Fut::Output>
    where
        C: FnOnce() -> Fut + Send + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        let fut = SpawnWith::Closure(Some(make));
        if on_owner_thread(&self.shared) {
            return with_core(|c| c.spawn_local(fut));
        }
        let task = Task::new(fut, self.shared.clone());
        self.shared.push_remote(task.clone());
        JoinHandle::new(task)
    }
}

/// Handles to every loop of the runtime the caller runs in (index = worker number).
pub fn workers() -> Vec<Handle> {
    with_core(|c| {
        c.shared
            .all
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|s| Handle { shared: s.clone() })
            .collect()
    })
}

/// Spawns a task on the caller's loop. The future need not be `Send`: it never leaves this
/// loop. Panics outside a runtime.
pub fn spawn<F>(fut: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    with_core(|c| c.spawn_local(fut))
}

/// Runs `fut` to completion on a fresh single-loop runtime.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let rt =
        Runtime::new().unwrap_or_else(|e| panic!("iolab-runtime: cannot start a runtime: {e}"));
    rt.block_on(fut)
}

/// Live operation records on the caller's loop: operations the kernel has not completed yet
/// (io_uring), or readiness registrations (epoll). Returns to 0 once every operation is done.
pub fn live_ops() -> usize {
    with_core(|c| c.driver.borrow().live_ops())
}

/// Lets the other ready tasks run, then resumes.
pub fn yield_now() -> YieldNow {
    YieldNow { yielded: false }
}

/// Future of [`yield_now`].
#[must_use = "futures do nothing unless awaited"]
pub struct YieldNow {
    yielded: bool,
}

impl Future for YieldNow {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
