//! Regression tests of issue 9 §1 (runtime correctness): each forces the situation that used to
//! go wrong. Run on both drivers (`IOLAB_DRIVER=epoll cargo test -p iolab-runtime`).

use std::future::Future;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use iolab_runtime::io_uring::{opcode, squeue, types};
use iolab_runtime::net::TcpListener;
use iolab_runtime::{
    spawn, submit_or_cancel, yield_now, Cancelled, Cond, Interest, Operation, Runtime,
};

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Polls `fut` exactly once (starting its operation), whatever the outcome.
async fn poll_once<F: Future + ?Sized>(mut fut: Pin<&mut F>) -> Poll<F::Output> {
    std::future::poll_fn(|cx: &mut Context<'_>| Poll::Ready(fut.as_mut().poll(cx))).await
}

/// Whether descriptor `fd` is open in this process.
fn fd_open(fd: i32) -> bool {
    // SAFETY: F_GETFD reads the descriptor's flags and touches no memory.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// Keeps a copy of stdout: a test that sees fd 1 closed under it puts it back before failing,
/// so the harness can still print.
struct StdoutGuard(i32);

impl StdoutGuard {
    fn new() -> StdoutGuard {
        // SAFETY: dup of a descriptor we do not otherwise touch.
        StdoutGuard(unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 100) })
    }

    /// Asserts fd 1 is still open (restoring it first if it was closed).
    fn check(&self, what: &str) {
        if !fd_open(1) {
            // SAFETY: dup2 of our saved copy back onto fd 1.
            unsafe { libc::dup2(self.0, 1) };
            panic!("{what}: the runtime closed fd 1 (stdout)");
        }
    }
}

impl Drop for StdoutGuard {
    fn drop(&mut self) {
        // SAFETY: closes the copy we made.
        unsafe { libc::close(self.0) };
    }
}

// ------------------------------------------------------------------ 1. cancel vs EAGAIN retry

/// A read on an empty socket gets EAGAIN, so the io_uring driver queues a poll for
/// readability under the operation's key. The peer then writes (the poll completes as soon as
/// it reaches the kernel) and the cancel is sent in the same loop turn, so it reaches the
/// kernel after the poll has completed. The result must be `Cancelled` (and the data still
/// there) or the real read; never the poll's readiness mask as a byte count.
#[test]
fn cancel_meeting_the_retry_poll_of_a_read() {
    let rt = Runtime::builder().simulate_eagain(true).build().unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind(localhost()).unwrap();
        let addr = listener.local_addr().unwrap();
        let (mut cancelled, mut completed) = (0, 0);
        for round in 0..200 {
            let mut client = std::net::TcpStream::connect(addr).unwrap();
            let (server, _) = listener.accept().await.unwrap();
            let server = Rc::new(server);
            let cond = Cond::new();
            let reader = {
                let (s, c) = (server.clone(), cond.clone());
                spawn(async move { s.read_or_cancel(vec![0u8; 64], &c).await })
            };
            // The reader starts its read; the next loop turn gets EAGAIN and queues the poll.
            for _ in 0..1 + round % 3 {
                yield_now().await;
            }
            let sent = format!("round {round} payload");
            client.write_all(sent.as_bytes()).unwrap();
            cond.signal();
            let (r, buf) = reader.await.unwrap();
            let mut got = match r {
                Ok(n) => {
                    completed += 1;
                    buf[..n].to_vec()
                }
                Err(e) if Cancelled::is(&e) => {
                    cancelled += 1;
                    Vec::new()
                }
                Err(e) => panic!("round {round}: read_or_cancel failed: {e}"),
            };
            // Whatever was not read is still in the socket: nothing invented, nothing lost.
            while got.len() < sent.len() {
                let (r, b) = server.read(vec![0u8; 64]).await;
                let n = r.unwrap();
                assert!(n > 0, "round {round}: end of stream");
                got.extend_from_slice(&b[..n]);
            }
            assert_eq!(
                String::from_utf8_lossy(&got),
                sent,
                "round {round}: bytes reported by the cancelled read"
            );
        }
        eprintln!("cancelled {cancelled}, completed {completed}");
    });
}

/// A read the kernel itself answers with -EAGAIN (`RWF_NOWAIT`), through the public
/// [`Operation`] interface: the same race with no testing aid.
struct NowaitRead {
    fd: i32,
    buf: Vec<u8>,
}

// SAFETY: the SQE points into `buf`, a heap allocation owned by the operation and never
// reallocated while it is in flight.
unsafe impl Operation for NowaitRead {
    fn prepare(&mut self) -> squeue::Entry {
        opcode::Read::new(
            types::Fd(self.fd),
            self.buf.as_mut_ptr(),
            self.buf.len() as u32,
        )
        .offset(u64::MAX)
        .rw_flags(libc::RWF_NOWAIT)
        .build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        // SAFETY: reads into our own buffer of the length given.
        let r = unsafe { libc::read(self.fd, self.buf.as_mut_ptr().cast(), self.buf.len()) };
        iolab_sys::cvt(r).map(|n| n as usize)
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        Some((self.fd, Interest::Readable))
    }
}

#[test]
fn cancel_meeting_the_retry_poll_of_a_nowait_read() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind(localhost()).unwrap();
        let addr = listener.local_addr().unwrap();
        for round in 0..100 {
            let mut client = std::net::TcpStream::connect(addr).unwrap();
            let (server, _) = listener.accept().await.unwrap();
            let cond = Cond::new();
            let reader = {
                let (fd, c) = (server.as_raw_fd(), cond.clone());
                let op = NowaitRead {
                    fd,
                    buf: vec![0u8; 64],
                };
                spawn(async move { submit_or_cancel(op, &c).await })
            };
            for _ in 0..1 + round % 3 {
                yield_now().await;
            }
            let sent = format!("round {round} payload");
            client.write_all(sent.as_bytes()).unwrap();
            cond.signal();
            let (r, op) = reader.await.unwrap();
            let mut got = match r {
                Ok(n) => op.buf[..n].to_vec(),
                Err(e) if Cancelled::is(&e) => Vec::new(),
                Err(e) => panic!("round {round}: read failed: {e}"),
            };
            while got.len() < sent.len() {
                let (r, b) = server.read(vec![0u8; 64]).await;
                let n = r.unwrap();
                assert!(n > 0, "round {round}: end of stream");
                got.extend_from_slice(&b[..n]);
            }
            assert_eq!(String::from_utf8_lossy(&got), sent, "round {round}");
        }
    });
}

/// The same race on accept: a cancelled accept must not hand back the poll mask as a
/// descriptor (it used to wrap fd 1, fail on getpeername and close stdout).
#[test]
fn cancel_meeting_the_retry_poll_of_an_accept() {
    let guard = StdoutGuard::new();
    let rt = Runtime::builder().simulate_eagain(true).build().unwrap();
    rt.block_on(async {
        let listener = Rc::new(TcpListener::bind(localhost()).unwrap());
        let addr = listener.local_addr().unwrap();
        for round in 0..100 {
            let cond = Cond::new();
            let acceptor = {
                let (l, c) = (listener.clone(), cond.clone());
                spawn(async move { l.accept_or_cancel(&c).await })
            };
            for _ in 0..1 + round % 3 {
                yield_now().await;
            }
            let client = std::net::TcpStream::connect(addr).unwrap();
            let me = client.local_addr().unwrap();
            cond.signal();
            let r = acceptor.await.unwrap();
            guard.check(&format!("round {round}"));
            let (stream, peer) = match r {
                Ok(x) => x,
                Err(e) if Cancelled::is(&e) => listener.accept().await.unwrap(),
                Err(e) => panic!("round {round}: accept_or_cancel failed: {e}"),
            };
            assert_eq!(peer, me, "round {round}: accepted peer");
            assert_eq!(stream.peer_addr().unwrap(), me, "round {round}");
        }
    });
    guard.check("after the runtime");
}

/// Dropping an accept whose retry poll has completed: the orphaned accept must not close the
/// descriptor number the poll mask happens to be (1: stdout), and the connection stays
/// acceptable.
#[test]
fn dropped_accept_meeting_its_retry_poll() {
    let guard = StdoutGuard::new();
    let rt = Runtime::builder().simulate_eagain(true).build().unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind(localhost()).unwrap();
        let addr = listener.local_addr().unwrap();
        for round in 0..100 {
            let mut fut = Box::pin(listener.accept());
            assert!(poll_once(fut.as_mut()).await.is_pending());
            for _ in 0..1 + round % 3 {
                yield_now().await;
            }
            let mut client = std::net::TcpStream::connect(addr).unwrap();
            drop(fut);
            for _ in 0..3 {
                yield_now().await;
            }
            guard.check(&format!("round {round}"));
            let (stream, peer) = listener.accept().await.unwrap();
            assert_eq!(peer, client.local_addr().unwrap(), "round {round}");
            drop(stream);
            let mut b = [0u8; 1];
            assert_eq!(
                client.read(&mut b).unwrap(),
                0,
                "round {round}: closed by us"
            );
        }
    });
    guard.check("after the runtime");
}

// ------------------------------------------------------------------ 2. send_to, slow reader

/// `File::send_to` to a reader that stalls: the socket's buffers are small and the reader
/// starts late and pauses, so the splice pipe -> socket meets a full socket (-EAGAIN) many
/// times. Every byte must arrive, in order, and `send_to` must report the whole length.
#[test]
fn send_to_a_slow_reader_loses_nothing() {
    use iolab_runtime::fs::File;
    use socket2::{Domain, Socket, Type};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::new().unwrap();
    for len in [1usize, 4097, 65_537, (1 << 20) + 7, 64 << 20] {
        let path = dir.path().join(format!("f{len}"));
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind(localhost()).unwrap();
            let addr = listener.local_addr().unwrap();
            let reader = std::thread::spawn(move || {
                let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
                s.set_recv_buffer_size(4096).unwrap();
                s.connect(&addr.into()).unwrap();
                let mut s: std::net::TcpStream = s.into();
                std::thread::sleep(Duration::from_millis(100)); // reads late
                let mut got = Vec::with_capacity(len);
                let mut buf = vec![0u8; 4096];
                let mut pauses = 0;
                loop {
                    let n = s.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                    // ...and stalls now and then (a few times per file).
                    if got.len() / (len / 4 + 1) > pauses {
                        pauses += 1;
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
                got
            });
            let (stream, _) = listener.accept().await.unwrap();
            let sndbuf: libc::c_int = 4096;
            // SAFETY: setsockopt reads an int we own, of the size we pass.
            let r = unsafe {
                libc::setsockopt(
                    stream.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_SNDBUF,
                    (&sndbuf as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(r, 0);
            let file = File::open(&path).await.unwrap();
            let sent = file.send_to(&stream, 0, len).await;
            assert_eq!(sent.unwrap_or_else(|e| panic!("{len} B: {e}")), len);
            drop(stream);
            // Waited for on the pool, not on this thread: with DEFER_TASKRUN the ring lets go
            // of a finished splice's file only when this loop next enters it, so a loop
            // blocked in a plain `join` kept the socket open and the reader waited for a FIN
            // that never came (a CI run hung here; one io_uring_enter from gdb released it).
            let got = iolab_runtime::detach(move || reader.join()).await.unwrap();
            assert_eq!(got.len(), len, "{len} B: bytes received");
            assert!(got == data, "{len} B: bytes differ");
        });
    }
}

// ------------------------------------------------------------------ 3. dropped timers

/// A million timeouts whose inner future finishes first (as a read that finds data does):
/// each registers its timer and is dropped. The timer structure must hold the live timers
/// only, not one dead entry per dropped timeout.
#[test]
fn dropped_timeouts_leave_only_live_timers() {
    use iolab_runtime::time::live_timers;
    use iolab_runtime::{sleep, timeout};
    use std::time::Duration;

    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        // 1,000 live timers that stay registered throughout.
        let mut live: Vec<Pin<Box<iolab_runtime::Sleep>>> = (0..1000)
            .map(|i| Box::pin(sleep(Duration::from_secs(3600 + i))))
            .collect();
        for s in &mut live {
            assert!(poll_once(s.as_mut()).await.is_pending());
        }
        assert_eq!(live_timers(), 1000);
        for i in 0..1_000_000u64 {
            let mut t = Box::pin(timeout(
                Duration::from_secs(60 + i % 7),
                std::future::pending::<()>(),
            ));
            assert!(poll_once(t.as_mut()).await.is_pending()); // its timer is registered
            drop(t);
            if i % 100_000 == 0 {
                assert!(live_timers() <= 1001, "{} entries after {i}", live_timers());
            }
        }
        assert_eq!(
            live_timers(),
            1000,
            "entries after 1,000,000 dropped timeouts"
        );
        // A timer that fires leaves the structure too.
        sleep(Duration::from_millis(2)).await;
        assert_eq!(live_timers(), 1000);
        drop(live);
        assert_eq!(live_timers(), 0);
    });
}

/// One resettable timer serves many operations: pushed later it does not fire at the old
/// deadline; pulled earlier while a task waits on it, it wakes that task at the new one.
#[test]
fn a_reset_sleep_fires_at_its_new_deadline() {
    use iolab_runtime::time::live_timers;
    use iolab_runtime::{sleep, timeout_with};
    use std::time::{Duration, Instant};

    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let start = Instant::now();
        let mut idle = sleep(Duration::from_millis(300));
        // Each "operation" takes 10 ms and pushes the deadline 300 ms on: 10 of them outlast
        // the first deadline (timing margins are wide for sanitizer builds).
        for _ in 0..40 {
            idle.reset(Instant::now() + Duration::from_millis(300));
            let r = timeout_with(&mut idle, sleep(Duration::from_millis(10))).await;
            assert!(r.is_ok(), "the idle timer fired though it was pushed back");
            assert_eq!(live_timers(), 1, "one timer per connection");
        }
        assert!(start.elapsed() >= Duration::from_millis(400));
        // An operation that does not finish: the idle timer ends it.
        idle.reset(Instant::now() + Duration::from_millis(20));
        let t = Instant::now();
        let r = timeout_with(&mut idle, std::future::pending::<()>()).await;
        assert!(r.is_err());
        assert!(t.elapsed() >= Duration::from_millis(20));
        assert_eq!(live_timers(), 0);
        // Pulled earlier while a task waits on it.
        let idle = Rc::new(std::cell::RefCell::new(sleep(Duration::from_secs(3600))));
        let waiter = {
            let idle = idle.clone();
            spawn(async move {
                std::future::poll_fn(|cx| Pin::new(&mut *idle.borrow_mut()).poll(cx)).await;
                Instant::now()
            })
        };
        yield_now().await;
        yield_now().await;
        let t = Instant::now();
        idle.borrow_mut().reset(t + Duration::from_millis(15));
        let woke = waiter.await.unwrap();
        assert!(woke >= t + Duration::from_millis(15));
        assert!(woke < t + Duration::from_secs(5));
    });
}

// ------------------------------------------------------------------ 4. keys and re-entrancy

/// A waker that re-enters the runtime when woken: queries it and spawns a task, then wakes
/// the task that owns it.
struct ReentrantWaker {
    inner: std::task::Waker,
    woken: std::sync::atomic::AtomicUsize,
}

impl std::task::Wake for ReentrantWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        // Each of these borrows the loop's driver or timers.
        let _ = iolab_runtime::live_ops();
        let _ = iolab_runtime::time::live_timers();
        let _ = iolab_runtime::current_driver();
        spawn(async {});
        self.woken
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.wake_by_ref();
    }
}

/// Polls `fut` with a [`ReentrantWaker`] wrapped around the task's own.
async fn with_reentrant_waker<F: Future>(fut: F) -> (F::Output, usize) {
    let mut fut = std::pin::pin!(fut);
    let mut waker: Option<std::sync::Arc<ReentrantWaker>> = None;
    let out = std::future::poll_fn(|cx| {
        let w = waker.get_or_insert_with(|| {
            std::sync::Arc::new(ReentrantWaker {
                inner: cx.waker().clone(),
                woken: Default::default(),
            })
        });
        let custom = std::task::Waker::from(w.clone());
        fut.as_mut().poll(&mut Context::from_waker(&custom))
    })
    .await;
    let n = waker.map_or(0, |w| w.woken.load(std::sync::atomic::Ordering::Relaxed));
    (out, n)
}

/// A waker that uses the runtime when the driver wakes it (an I/O completion, a readiness
/// event) or a timer fires: no RefCell re-borrow panic, the operation completes.
#[test]
fn wakers_that_reenter_the_runtime() {
    use iolab_runtime::sleep;
    use std::time::Duration;

    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind(localhost()).unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            client.write_all(b"ping").unwrap();
            client
        });
        let ((r, buf), woken) = with_reentrant_waker(server.read(vec![0u8; 16])).await;
        assert_eq!(&buf[..r.unwrap()], b"ping");
        assert!(woken >= 1, "the read completed without waking its waker");
        let _client = writer.join().unwrap();
        // Readiness waits (POLL_ADD on io_uring, epoll on the fallback).
        let efd = unsafe_eventfd();
        let signaller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            let one = 1u64;
            // SAFETY: writes 8 bytes from a live u64 to the eventfd.
            unsafe { libc::write(efd, (&one as *const u64).cast(), 8) };
        });
        let (r, woken) = with_reentrant_waker(iolab_runtime::wait_readable(efd)).await;
        r.unwrap();
        assert!(woken >= 1);
        signaller.join().unwrap();
        // SAFETY: closes the eventfd we created.
        unsafe { libc::close(efd) };
        let ((), woken) = with_reentrant_waker(sleep(Duration::from_millis(5))).await;
        assert!(woken >= 1);
    });
}

fn unsafe_eventfd() -> RawFd {
    // SAFETY: eventfd returns a fresh descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    assert!(fd >= 0);
    fd
}

/// An operation whose callbacks use the runtime: `prepare` (run when it starts) and
/// `orphaned` (run when it completes after its future was dropped).
struct ReentrantRead {
    fd: RawFd,
    buf: Vec<u8>,
    orphaned: Rc<std::cell::Cell<bool>>,
}

// SAFETY: the SQE points into `buf`, owned by the operation and never reallocated.
unsafe impl Operation for ReentrantRead {
    fn prepare(&mut self) -> squeue::Entry {
        let _ = iolab_runtime::live_ops();
        opcode::Recv::new(
            types::Fd(self.fd),
            self.buf.as_mut_ptr(),
            self.buf.len() as u32,
        )
        .build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        let _ = iolab_runtime::live_ops();
        // SAFETY: reads into our own buffer of the length given.
        let r = unsafe { libc::read(self.fd, self.buf.as_mut_ptr().cast(), self.buf.len()) };
        iolab_sys::cvt(r).map(|n| n as usize)
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        Some((self.fd, Interest::Readable))
    }

    fn orphaned(&mut self, _result: io::Result<usize>) {
        let _ = iolab_runtime::live_ops();
        spawn(async {});
        self.orphaned.set(true);
    }
}

#[test]
fn operation_callbacks_that_reenter_the_runtime() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind(localhost()).unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let orphaned = Rc::new(std::cell::Cell::new(false));
        let op = || ReentrantRead {
            fd: server.as_raw_fd(),
            buf: vec![0u8; 16],
            orphaned: orphaned.clone(),
        };
        // Started, then dropped in flight: completes (cancelled) after its future is gone.
        let mut fut = Box::pin(iolab_runtime::submit(op()));
        assert!(poll_once(fut.as_mut()).await.is_pending());
        drop(fut);
        let t = std::time::Instant::now();
        while iolab_runtime::live_ops() > 0 && t.elapsed() < std::time::Duration::from_secs(5) {
            yield_now().await;
        }
        assert_eq!(iolab_runtime::live_ops(), 0);
        if iolab_runtime::current_driver() == iolab_runtime::Driver::Uring {
            assert!(orphaned.get(), "the orphan callback ran");
        }
        // And one that completes normally.
        client.write_all(b"pong").unwrap();
        let (r, op) = iolab_runtime::submit(op()).await;
        assert_eq!(&op.buf[..r.unwrap()], b"pong");
    });
}

/// Polls `fut` once on the current loop; Err(message) if that panicked.
async fn poll_catching<F: Future + ?Sized>(fut: Pin<&mut F>) -> Result<Poll<F::Output>, String> {
    let mut fut = Some(fut);
    std::future::poll_fn(|cx| {
        let f = fut.take().unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut f = f;
            f.as_mut().poll(cx)
        }));
        Poll::Ready(r.map_err(|p| {
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        }))
    })
    .await
}

/// A read started on one runtime and then polled on another, which has its own read in
/// flight under the same slot number: the misuse is reported (a panic naming it), the other
/// runtime's operation is untouched and completes with its own data.
#[test]
fn an_operation_polled_on_another_runtime_is_an_error() {
    let rt1 = Runtime::new().unwrap();
    let rt2 = Runtime::new().unwrap();
    let l1 = std::net::TcpListener::bind(localhost()).unwrap();
    let _c1 = std::net::TcpStream::connect(l1.local_addr().unwrap()).unwrap();
    let a = iolab_runtime::net::TcpStream::from_std(l1.accept().unwrap().0).unwrap();
    let l2 = std::net::TcpListener::bind(localhost()).unwrap();
    let mut c2 = std::net::TcpStream::connect(l2.local_addr().unwrap()).unwrap();
    let b = iolab_runtime::net::TcpStream::from_std(l2.accept().unwrap().0).unwrap();

    // Started on rt1 (its record is rt1's first).
    let mut foreign = Box::pin(a.read(vec![0u8; 8]));
    rt1.block_on(async {
        assert!(poll_once(foreign.as_mut()).await.is_pending());
    });
    rt2.block_on(async {
        // rt2's own first operation, in flight.
        let mut own = Box::pin(b.read(vec![0u8; 8]));
        assert!(poll_once(own.as_mut()).await.is_pending());
        let r = poll_catching(foreign.as_mut()).await;
        let msg = r.expect_err("polling rt1's operation on rt2 must fail");
        assert!(msg.contains("another loop"), "panic message: {msg}");
        drop(foreign); // must not orphan rt2's record
        c2.write_all(b"mine").unwrap();
        let (r, buf) = own.await;
        assert_eq!(&buf[..r.unwrap()], b"mine");
    });
    drop(rt2);
    drop(rt1);
}

/// The same for a timer registered on one runtime and polled (or reset) on another.
#[test]
fn a_timer_polled_on_another_runtime_is_an_error() {
    use iolab_runtime::sleep;
    use std::time::Duration;

    let rt1 = Runtime::new().unwrap();
    let rt2 = Runtime::new().unwrap();
    let mut foreign = Box::pin(sleep(Duration::from_millis(20)));
    rt1.block_on(async {
        assert!(poll_once(foreign.as_mut()).await.is_pending());
    });
    rt2.block_on(async {
        let mut own = Box::pin(sleep(Duration::from_millis(40)));
        assert!(poll_once(own.as_mut()).await.is_pending());
        let r = poll_catching(foreign.as_mut()).await;
        let msg = r.expect_err("polling rt1's timer on rt2 must fail");
        assert!(msg.contains("another loop"), "panic message: {msg}");
        drop(foreign);
        assert_eq!(iolab_runtime::time::live_timers(), 1);
        let t = std::time::Instant::now();
        own.await;
        assert!(t.elapsed() < Duration::from_secs(5));
    });
}

// ------------------------------------------------------------------ 5. inline sends

/// A send with room in the socket buffer completes in the poll that starts it, without an
/// operation record or a completion to wait for (`Operation::attempt_inline`); one that
/// meets a full socket goes to the ring and finishes once the reader drains it, every byte
/// in order (a `write_all` of 8 MiB against a reader that starts 50 ms late).
#[test]
fn a_send_with_room_completes_at_once_and_a_full_one_waits() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind(localhost()).unwrap();
        let addr = listener.local_addr().unwrap();
        let reader = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            got
        });
        let (server, _) = listener.accept().await.unwrap();
        let mut first = Box::pin(server.write(b"hello".to_vec()));
        match poll_once(first.as_mut()).await {
            Poll::Ready((r, _)) => assert_eq!(r.unwrap(), 5),
            Poll::Pending if iolab_runtime::current_driver() == iolab_runtime::Driver::Epoll => {
                // The epoll driver attempts at once too; pending would be a bug there as well.
                panic!("a send with room waited for readiness")
            }
            Poll::Pending => panic!("a send with room waited for a completion"),
        }
        assert_eq!(iolab_runtime::live_ops(), 0);
        drop(first);
        let big: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
        let (r, big) = server.write_all(big).await;
        r.unwrap();
        drop(server);
        let got = iolab_runtime::detach(move || reader.join().unwrap()).await;
        assert_eq!(&got[..5], b"hello");
        assert!(got[5..] == big[..], "bytes lost or reordered");
    });
}
