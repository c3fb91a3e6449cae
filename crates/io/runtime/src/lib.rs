//! # iolab-runtime: lightweight tasks on completion I/O
//!
//! CPC's idea (seed 000 §2) brought to Linux: code written in threaded style — Rust
//! `async fn`, which the compiler turns into continuations as CPC's translator does — runs
//! as lightweight tasks on an event loop whose I/O engine is completion-based: io_uring,
//! Linux's counterpart of Windows I/O completion ports. Where io_uring is missing or
//! forbidden, the same API runs on an epoll readiness driver.
//!
//! ```no_run
//! use iolab_runtime::net::{TcpListener, TcpStream};
//! use iolab_runtime::{spawn, Runtime};
//!
//! async fn echo(stream: TcpStream) -> std::io::Result<()> {
//!     let mut buf = vec![0u8; 4096];
//!     loop {
//!         buf.resize(4096, 0);
//!         let (r, b) = stream.read(buf).await; // the buffer travels to the kernel and back
//!         buf = b;
//!         let n = r?;
//!         if n == 0 {
//!             return Ok(());
//!         }
//!         buf.truncate(n);
//!         let (r, b) = stream.write_all(buf).await;
//!         buf = b;
//!         r?;
//!     }
//! }
//!
//! async fn serve(listener: TcpListener) -> std::io::Result<()> {
//!     loop {
//!         let (stream, _peer) = listener.accept().await?;
//!         spawn(echo(stream)); // one lightweight task per connection
//!     }
//! }
//!
//! let rt = Runtime::new()?;
//! let listener = TcpListener::bind("127.0.0.1:7000".parse().unwrap())?;
//! rt.block_on(serve(listener))?;
//! # Ok::<(), std::io::Error>(())
//! ```
//! (`examples/echo.rs` is the runnable version.)
//!
//! ## Design
//!
//! **Tasks and loops.** A [`Runtime`] has one single-threaded loop per worker
//! ([`Builder::workers`], thread-per-core, no work stealing). A task is one allocation
//! holding its future, a state byte, a join slot and its owner loop; it never leaves its
//! loop, so its future need not be `Send` ([`spawn`]). Wakers are `Send`: a wake-up from
//! another thread (a [`detach`]ed job, a [`sync`] channel, another loop) goes through the
//! owner's remote queue and eventfd. [`Handle::spawn`] / [`Handle::spawn_with`] start a task
//! on another loop the same way.
//!
//! **Operation records (the OVERLAPPED of seed 000).** On io_uring every in-flight operation
//! has a record owned by the loop's driver, in a slab whose key is the SQE's `user_data`, so
//! a completion finds its record, and through the record's waker its task, in O(1). The
//! record owns everything the kernel touches — buffers, socket address, iovecs, path — boxed
//! so it never moves, and it is freed only when the kernel's completion arrives. Hence the
//! owned-buffer API: `stream.read(buf).await` returns `(io::Result<usize>, buf)`; the buffer
//! travels into the record and back. §2.1's point holds: with completion I/O the buffer must
//! exist (and be given away) before the operation starts.
//!
//! **`submit`, the general primitive (CPC's `cpc_call_async_prim`).** Any operation is an
//! [`Operation`] value: [`Operation::prepare`] builds the SQE from the record-owned value
//! (CPC's `f`, issuing the asynchronous call with the runtime-allocated OVERLAPPED);
//! [`submit`] resolves with the result and hands the value back. Every network and file
//! call of this crate is one `Operation`. The same value also says how to run on epoll
//! ([`Operation::attempt`] + [`Operation::readiness`]).
//!
//! **Readiness (CPC's original `cpc_io_wait`).** [`wait_readable`] / [`wait_writable`] work
//! on any descriptor: IORING_OP_POLL_ADD on io_uring, epoll on the fallback.
//!
//! **Cancellation, the CPC way.** A [`Cond`] is CPC's condition variable ([`Cond::wait`],
//! [`Cond::signal`], [`Cond::broadcast`]). Every wait has a form taking a cancel `Cond`:
//! `*_or_cancel` I/O calls ([`submit_or_cancel`], [`net::TcpStream::read_or_cancel`], ...),
//! [`sleep_or_cancel`], [`Cond::wait_or_cancel`], [`wait_readable_or_cancel`], and
//! [`cancellable`] for any future. Signalling the `Cond` makes an in-flight operation send
//! IORING_OP_ASYNC_CANCEL for its `user_data`; the call returns a [`Cancelled`] error once
//! the kernel has completed the operation (with -ECANCELED), handing the buffer back. On
//! epoll nothing is in the kernel: the wait is simply dropped.
//!
//! **Drop safety.** Dropping a future whose operation is in flight (a [`timeout`], an
//! aborted task, a dropped `select`) marks its record orphan and sends ASYNC_CANCEL; the
//! record keeps the buffer until the completion arrives and then frees it (closing an fd
//! the operation produced, e.g. an accepted socket). [`live_ops`] counts live records.
//! Dropping the runtime drops every task, cancels everything still in flight and waits
//! (bounded) for the kernel to let go of every buffer; [`Runtime::shutdown`] does the same
//! and returns the records it could not free (0 when everything was).
//!
//! **Keys and re-entrancy.** A record is named by (loop id, slot, generation); loop ids are
//! never reused, so a started future polled on another loop (another runtime or worker)
//! panics with a clear message instead of reaching that loop's record of the same slot, and a
//! stale key reaches nothing. Timers are named the same way. Wakers, `Operation` callbacks
//! and the destructors of orphaned operations run after the loop has released its driver,
//! so they may call into the runtime.
//!
//! **Drivers.** `IOLAB_DRIVER=uring|epoll` forces one; otherwise io_uring is used when a ring
//! can be created and supports every opcode needed (probed once), and epoll otherwise
//! (ENOSYS on old kernels, EPERM under `kernel.io_uring_disabled` or seccomp). The choice is
//! logged once to stderr and returned by [`driver()`]. Each loop's ring is created with
//! SINGLE_ISSUER + DEFER_TASKRUN where the kernel has them; submissions are batched: SQEs
//! queued while tasks run go to the kernel in one `io_uring_enter` per loop turn, which also
//! waits for completions.
//!
//! **Timers** are an ordered map of deadlines per loop holding exactly the live timers (a
//! dropped timer leaves it at once; see [`mod@time`] for why not io_uring timeouts): the loop sleeps in `io_uring_enter` with a nanosecond EXT_ARG timeout, or
//! `epoll_wait` with the millisecond timeout rounded up; resolution 1 ms or better.
//!
//! **Detach (`cpc_detach`).** [`detach`] runs a blocking closure on a bounded pool of native
//! threads and resumes the task on its own loop with the result.
//!
//! ## CPC → iolab-runtime
//!
//! | CPC (seed 000 §2) | iolab-runtime |
//! |---|---|
//! | CPC thread (continuations) | task: an `async` block spawned with [`spawn`] |
//! | `cpc_spawn` | [`spawn`], [`Handle::spawn`] (onto another loop) |
//! | `cpc_yield` | [`yield_now`] |
//! | `cpc_sleep` | [`sleep`], [`sleep_until`], [`sleep_or_cancel`] |
//! | `cpc_condvar`, `cpc_wait`, `cpc_signal`, `cpc_signal_all` | [`Cond`], [`Cond::wait`], [`Cond::signal`], [`Cond::broadcast`] |
//! | `cpc_io_wait(fd, dir, cond)` | [`wait_readable`], [`wait_writable`], `*_or_cancel` forms |
//! | `cpc_call_async_prim(handle, f, closure, cond)` | [`submit`] / [`submit_or_cancel`] with an [`Operation`] |
//! | OVERLAPPED embedded in the CPC thread | operation record in the driver's slab; key = `user_data` |
//! | CancelIoEx on the OVERLAPPED | IORING_OP_ASYNC_CANCEL on the record's `user_data` |
//! | `cpc_detach` / `cpc_attach` | [`detach`] (closure on the pool, resume on the loop) |
//! | IOCP completion packet for the thread pool | remote queue + eventfd of the loop |
//! | AcceptEx pre-posted | several accepts in flight: [`net::TcpListener::accept_many`] |

pub mod buf;
mod cond;
mod detach;
mod driver;
pub mod fs;
pub mod net;
mod op;
mod rt;
pub mod sync;
mod task;
pub mod time;

pub use buf::{IoBuf, IoBufMut, Slice};
pub use cond::{cancellable, Cancelled, Cond, CondWait};
pub use detach::{detach, MAX_DETACH_THREADS};
pub use driver::{current_driver, driver, Driver};
pub use op::{
    submit, submit_or_cancel, wait_readable, wait_readable_or_cancel, wait_writable,
    wait_writable_or_cancel, Interest, Operation,
};
pub use rt::{
    block_on, live_ops, pin_current_thread, spawn, workers, yield_now, Builder, Handle, Runtime,
    YieldNow,
};
pub use task::{JoinError, JoinHandle};
pub use time::{sleep, sleep_or_cancel, sleep_until, timeout, timeout_with, Elapsed, Sleep};

/// The io-uring crate, for implementing [`Operation`].
pub use io_uring;
