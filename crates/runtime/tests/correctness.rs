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
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
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
            let got = reader.join().unwrap();
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
        let mut idle = sleep(Duration::from_millis(30));
        // Each "operation" finishes within 10 ms and pushes the deadline 30 ms on.
        for _ in 0..6 {
            idle.reset(Instant::now() + Duration::from_millis(30));
            let r = timeout_with(&mut idle, sleep(Duration::from_millis(10))).await;
            assert!(r.is_ok(), "the idle timer fired though it was pushed back");
            assert_eq!(live_timers(), 1, "one timer per connection");
        }
        assert!(start.elapsed() >= Duration::from_millis(60));
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
