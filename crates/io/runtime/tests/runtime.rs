//! Behaviour of the runtime; run on both drivers (`IOLAB_DRIVER=epoll cargo test`).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iolab_runtime::net::{TcpListener, TcpStream};
use iolab_runtime::sync::{mpsc, oneshot, Notify};
use iolab_runtime::{
    cancellable, detach, live_ops, sleep, sleep_or_cancel, sleep_until, spawn, timeout, yield_now,
    Cancelled, Cond, Driver, JoinError, Runtime,
};

fn raise_nofile() {
    iolab_sys::raise_nofile_limit().expect("raise RLIMIT_NOFILE");
}

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn echo_server(listener: TcpListener) {
    loop {
        let Ok((s, _)) = listener.accept().await else {
            return;
        };
        spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                buf.resize(4096, 0);
                let (r, b) = s.read(buf).await;
                buf = b;
                let n = match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                buf.truncate(n);
                let (r, b) = s.write_all(buf).await;
                buf = b;
                if r.is_err() {
                    return;
                }
            }
        });
    }
}

async fn read_exact(s: &TcpStream, len: usize) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(len);
    let mut buf = vec![0u8; len];
    while out.len() < len {
        buf.resize(len - out.len(), 0);
        let (r, b) = s.read(buf).await;
        buf = b;
        let n = r?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        out.extend_from_slice(&buf[..n]);
    }
    Ok(out)
}

#[test]
fn echo_1000_clients_100_round_trips() {
    raise_nofile();
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let listener = TcpListener::builder(localhost())
            .backlog(2048)
            .bind()
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let server = spawn(echo_server(listener));
        let checked = Rc::new(RefCell::new(0usize));
        let mut clients = Vec::new();
        for c in 0..1000usize {
            let checked = checked.clone();
            clients.push(spawn(async move {
                let s = TcpStream::connect(addr).await.unwrap();
                for i in 0..100usize {
                    // Distinct content per client and round, varying length.
                    let len = 1 + (c * 7 + i * 13) % 200;
                    let msg: Vec<u8> = (0..len).map(|k| (c + i * 31 + k * 7) as u8).collect();
                    let (r, _) = s.write_all(msg.clone()).await;
                    r.unwrap();
                    let got = read_exact(&s, len).await.unwrap();
                    assert_eq!(got, msg, "client {c} round {i}");
                    *checked.borrow_mut() += len;
                }
            }));
        }
        for c in clients {
            c.await.unwrap();
        }
        server.abort();
        let expected: usize = (0..1000usize)
            .flat_map(|c| (0..100usize).map(move |i| 1 + (c * 7 + i * 13) % 200))
            .sum();
        assert_eq!(
            *checked.borrow(),
            expected,
            "every byte of every round trip was checked"
        );
    });
}

#[test]
fn million_tasks_spawned_and_joined() {
    let rt = Runtime::new().unwrap();
    let total = rt.block_on(async {
        let handles: Vec<_> = (0..1_000_000u64)
            .map(|i| spawn(async move { i * 2 }))
            .collect();
        let mut sum = 0u64;
        for h in handles {
            sum += h.await.unwrap();
        }
        sum
    });
    assert_eq!(total, 999_999 * 1_000_000);
}

#[test]
fn timers_fire_in_deadline_order() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let order = Rc::new(RefCell::new(Vec::new()));
        let start = Instant::now() + Duration::from_millis(5);
        // Deadlines 0..60 ms in a scrambled spawn order.
        let mut hs = Vec::new();
        for k in 0..60u64 {
            let slot = (k * 37) % 60;
            let order = order.clone();
            hs.push(spawn(async move {
                let deadline = start + Duration::from_millis(slot);
                sleep_until(deadline).await;
                assert!(Instant::now() >= deadline, "timer fired early");
                order.borrow_mut().push(slot);
            }));
        }
        for h in hs {
            h.await.unwrap();
        }
        let got = order.borrow().clone();
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(got, sorted);
        assert_eq!(got.len(), 60);
    });
}

#[test]
fn sleep_resolution_is_at_least_a_millisecond() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let t = Instant::now();
        sleep(Duration::from_millis(3)).await;
        assert!(t.elapsed() >= Duration::from_millis(3));
        let t = Instant::now();
        sleep(Duration::from_micros(300)).await;
        assert!(t.elapsed() >= Duration::from_micros(300));
    });
}

#[test]
fn timeout_cancels_the_inner_operation() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind(localhost()).unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let before = live_ops();
        let r = timeout(Duration::from_millis(30), server.read(vec![0u8; 64])).await;
        assert!(r.is_err(), "an idle read must time out");
        // The dropped read is cancelled: its record goes away once the kernel confirms.
        let t = Instant::now();
        while live_ops() > before && t.elapsed() < Duration::from_secs(2) {
            sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(live_ops(), before);
        // The cancelled read did not swallow data written afterwards.
        let (r, _) = client.write_all(b"after timeout".to_vec()).await;
        r.unwrap();
        assert_eq!(read_exact(&server, 13).await.unwrap(), b"after timeout");
        // And timeout passes a quick result through.
        let r = timeout(Duration::from_secs(5), async { 7 }).await;
        assert_eq!(r, Ok(7));
    });
}

#[test]
fn detach_does_not_stall_other_tasks() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let ticks = Rc::new(RefCell::new(Vec::new()));
        let t2 = ticks.clone();
        let ticker = spawn(async move {
            for _ in 0..30 {
                sleep(Duration::from_millis(10)).await;
                t2.borrow_mut().push(Instant::now());
            }
        });
        let t0 = Instant::now();
        let jobs: Vec<_> = (0..4)
            .map(|i| {
                spawn(async move {
                    detach(move || {
                        std::thread::sleep(Duration::from_millis(200));
                        i * 10
                    })
                    .await
                })
            })
            .collect();
        let mut results = Vec::new();
        for j in jobs {
            results.push(j.await.unwrap());
        }
        let elapsed = t0.elapsed();
        assert_eq!(results, vec![0, 10, 20, 30]);
        // The four sleeps ran in parallel on the pool, not one after another on the loop.
        assert!(
            elapsed < Duration::from_millis(700),
            "detached jobs ran serially: {elapsed:?}"
        );
        ticker.await.unwrap();
        let ticks = ticks.borrow();
        // While the jobs slept, the loop kept ticking: a job run on the loop itself would
        // leave a gap of at least 200 ms (the margin absorbs a busy shared machine).
        let max_gap = ticks.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert!(
            max_gap < Duration::from_millis(190),
            "ticker stalled for {max_gap:?}"
        );
        let during = ticks
            .iter()
            .filter(|t| **t < t0 + Duration::from_millis(200))
            .count();
        assert!(
            during >= 5,
            "only {during} ticks during the detached sleeps"
        );
    });
}

#[test]
fn detach_propagates_panics_to_the_task() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let h = spawn(async { detach(|| -> u32 { panic!("boom in pool") }).await });
        match h.await {
            Err(JoinError::Panicked(m)) => assert!(m.contains("boom in pool")),
            other => panic!("expected a panic, got {other:?}"),
        }
    });
}

#[test]
fn driver_choice() {
    let d = iolab_runtime::driver().unwrap();
    let rt = Runtime::new().unwrap();
    assert_eq!(rt.driver(), d);
    match std::env::var("IOLAB_DRIVER").ok().as_deref() {
        Some("epoll") => assert_eq!(d, Driver::Epoll),
        Some("uring") => assert_eq!(d, Driver::Uring),
        _ => {
            let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
                .map(|s| s.trim() != "0")
                .unwrap_or(false);
            if !disabled && iolab_runtime::io_uring::IoUring::new(4).is_ok() {
                assert_eq!(d, Driver::Uring, "io_uring is available but was not chosen");
            } else {
                assert_eq!(d, Driver::Epoll);
            }
        }
    }
    let cur = rt.block_on(async { iolab_runtime::current_driver() });
    assert_eq!(cur, d);
    // A runtime can also force the fallback.
    let rt = Runtime::builder().driver(Driver::Epoll).build().unwrap();
    assert_eq!(
        rt.block_on(async { iolab_runtime::current_driver() }),
        Driver::Epoll
    );
}

#[test]
fn two_workers_spawn_onto_each_other() {
    let rt = Runtime::builder().workers(2).build().unwrap();
    assert_eq!(rt.workers(), 2);
    rt.block_on(async {
        let main_thread = std::thread::current().id();
        let other = iolab_runtime::workers()[1].clone();
        assert_eq!(other.worker(), 1);
        // A Send future onto loop 1, returning its thread and a computed value.
        let h = other.spawn(async {
            sleep(Duration::from_millis(2)).await;
            (std::thread::current().id(), (1..=100u64).sum::<u64>())
        });
        let (tid, sum) = h.await.unwrap();
        assert_ne!(tid, main_thread);
        assert_eq!(sum, 5050);
        // A !Send future built on loop 1, which spawns back onto loop 0.
        let back = iolab_runtime::workers()[0].clone();
        let h = other.spawn_with(move || async move {
            let local = Rc::new(RefCell::new(0u32));
            for i in 0..10 {
                *local.borrow_mut() += i;
                yield_now().await;
            }
            let v = *local.borrow();
            let r = back
                .spawn(async move { (std::thread::current().id(), v * 2) })
                .await
                .unwrap();
            r
        });
        let (tid0, v) = h.await.unwrap();
        assert_eq!(tid0, main_thread);
        assert_eq!(v, 90);
        // Many cross-loop spawns in flight at once.
        let hs: Vec<_> = (0..1000u64)
            .map(|i| other.spawn(async move { i + 1 }))
            .collect();
        let mut s = 0;
        for h in hs {
            s += h.await.unwrap();
        }
        assert_eq!(s, 500_500);
        // I/O on the other loop.
        let listener = TcpListener::bind(localhost()).unwrap();
        let addr = listener.local_addr().unwrap();
        let server = spawn(echo_server(listener));
        let h = other.spawn_with(move || async move {
            let s = TcpStream::connect(addr).await.unwrap();
            let (r, _) = s.write_all(b"cross".to_vec()).await;
            r.unwrap();
            read_exact(&s, 5).await.unwrap()
        });
        assert_eq!(h.await.unwrap(), b"cross");
        server.abort();
    });
}

#[test]
fn join_handle_abort_and_panic() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let h = spawn(async {
            sleep(Duration::from_secs(60)).await;
            1
        });
        yield_now().await;
        h.abort();
        assert_eq!(h.await, Err(JoinError::Aborted));
        let h = spawn(async {
            if true {
                panic!("task failed");
            }
        });
        match h.await {
            Err(JoinError::Panicked(m)) => assert!(m.contains("task failed")),
            other => panic!("expected panic, got {other:?}"),
        }
        // A detached task (handle dropped) still runs.
        let (tx, rx) = oneshot::channel();
        drop(spawn(async move {
            yield_now().await;
            tx.send(5).unwrap();
        }));
        assert_eq!(rx.await, Ok(5));
        assert_eq!(live_ops(), 0);
    });
}

#[test]
fn cond_signal_broadcast_and_cancel() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let c = Cond::new();
        let woke = Rc::new(RefCell::new(Vec::new()));
        let mut hs = Vec::new();
        for i in 0..3 {
            let (c, woke) = (c.clone(), woke.clone());
            hs.push(spawn(async move {
                c.wait().await;
                woke.borrow_mut().push(i);
            }));
        }
        yield_now().await;
        assert_eq!(c.waiters(), 3);
        assert!(c.signal());
        yield_now().await;
        yield_now().await;
        assert_eq!(
            *woke.borrow(),
            vec![0],
            "signal wakes the oldest waiter only"
        );
        assert_eq!(c.broadcast(), 2);
        for h in hs {
            h.await.unwrap();
        }
        assert_eq!(woke.borrow().len(), 3);
        assert!(!c.signal(), "no waiter left: the signal is lost");

        // Every kind of wait can be cancelled through a Cond.
        let cancel = Cond::new();
        let other = Cond::new();
        let (c1, c2, c3) = (cancel.clone(), cancel.clone(), cancel.clone());
        let o = other.clone();
        let a = spawn(async move { sleep_or_cancel(Duration::from_secs(60), &c1).await });
        let b = spawn(async move { o.wait_or_cancel(&c2).await });
        let d = spawn(async move { cancellable(&c3, sleep(Duration::from_secs(60))).await });
        sleep(Duration::from_millis(5)).await;
        let t = Instant::now();
        assert_eq!(cancel.broadcast(), 3);
        assert_eq!(a.await.unwrap(), Err(Cancelled));
        assert_eq!(b.await.unwrap(), Err(Cancelled));
        assert_eq!(d.await.unwrap(), Err(Cancelled));
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(other.waiters(), 0, "the cancelled wait left the other Cond");
    });
}

#[test]
fn cancelled_read_and_accept_give_back_buffers() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let listener = Rc::new(TcpListener::bind(localhost()).unwrap());
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let server = Rc::new(server);
        let cancel = Cond::new();
        let (s2, c2) = (server.clone(), cancel.clone());
        let reader = spawn(async move {
            let buf = vec![7u8; 100];
            s2.read_or_cancel(buf, &c2).await
        });
        let (l2, c3) = (listener.clone(), cancel.clone());
        let acceptor = spawn(async move { l2.accept_or_cancel(&c3).await.map(|_| ()) });
        sleep(Duration::from_millis(5)).await;
        cancel.broadcast();
        let (r, buf) = reader.await.unwrap();
        let e = r.unwrap_err();
        assert!(Cancelled::is(&e), "got {e}");
        assert_eq!(buf, vec![7u8; 100], "the buffer comes back intact");
        let e = acceptor.await.unwrap().unwrap_err();
        assert!(Cancelled::is(&e), "got {e}");
        assert_eq!(live_ops(), 0);
        // The connection still works afterwards.
        let (r, _) = client.write_all(b"ok".to_vec()).await;
        r.unwrap();
        assert_eq!(read_exact(&server, 2).await.unwrap(), b"ok");
    });
}

#[test]
fn readiness_waits_on_any_descriptor() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        // SAFETY: eventfd returns a new descriptor or -1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(efd >= 0);
        let waiter = spawn(async move { iolab_runtime::wait_readable(efd).await });
        sleep(Duration::from_millis(5)).await;
        assert!(!waiter.is_finished());
        let one = 1u64;
        assert_eq!(
            // SAFETY: an eventfd takes exactly 8 bytes, read from a live u64 on our stack.
            unsafe { libc::write(efd, &one as *const u64 as *const _, 8) },
            8
        );
        waiter.await.unwrap().unwrap();
        iolab_runtime::wait_writable(efd).await.unwrap();
        let cancel = Cond::new();
        let mut buf = 0u64;
        // SAFETY: clears the counter into a live u64.
        unsafe { libc::read(efd, &mut buf as *mut u64 as *mut _, 8) };
        let c2 = cancel.clone();
        let w = spawn(async move { iolab_runtime::wait_readable_or_cancel(efd, &c2).await });
        sleep(Duration::from_millis(5)).await;
        cancel.signal();
        let e = w.await.unwrap().unwrap_err();
        assert!(Cancelled::is(&e));
        assert_eq!(live_ops(), 0);
        // SAFETY: closing our eventfd.
        unsafe { libc::close(efd) };
    });
}

#[test]
fn tcp_stream_operations() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let listener = TcpListener::builder(localhost())
            .backlog(16)
            .reuse_addr(true)
            .reuse_port(true)
            .bind()
            .unwrap();
        let addr = listener.local_addr().unwrap();
        // A second listener on the same port thanks to SO_REUSEPORT.
        let twin = TcpListener::builder(addr).reuse_port(true).bind().unwrap();
        assert_eq!(twin.local_addr().unwrap(), addr);
        drop(twin);
        let client = TcpStream::connect(addr).await.unwrap();
        let (server, peer) = listener.accept().await.unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        assert_eq!(server.peer_addr().unwrap(), peer);
        client.set_nodelay(true).unwrap();
        assert!(client.nodelay().unwrap());
        let (r, bufs) = client
            .writev(vec![
                b"hello ".to_vec(),
                b"vectored ".to_vec(),
                b"world".to_vec(),
            ])
            .await;
        assert_eq!(r.unwrap(), 20);
        assert_eq!(bufs.len(), 3);
        assert_eq!(
            read_exact(&server, 20).await.unwrap(),
            b"hello vectored world"
        );
        let (r, _) = client.send("static str").await;
        assert_eq!(r.unwrap(), 10);
        let (r, b) = server.recv(vec![0u8; 10]).await;
        assert_eq!(&b[..r.unwrap()], b"static str");
        client.shutdown(std::net::Shutdown::Write).await.unwrap();
        let (r, _) = server.read(vec![0u8; 10]).await;
        assert_eq!(r.unwrap(), 0, "end of stream after the peer's shutdown");
        server.close().await.unwrap();
        client.close().await.unwrap();
        // Connecting to a closed port fails with a clear error.
        drop(listener);
        let e = TcpStream::connect(addr).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
        assert!(e.to_string().contains(&addr.to_string()));
        assert_eq!(live_ops(), 0);
    });
}

#[test]
fn several_accepts_in_flight() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind(localhost()).unwrap();
        let addr = listener.local_addr().unwrap();
        let done = Rc::new(RefCell::new(0));
        let d2 = done.clone();
        let clients = spawn(async move {
            let mut v = Vec::new();
            for _ in 0..20 {
                v.push(TcpStream::connect(addr).await.unwrap());
            }
            *d2.borrow_mut() += 1;
            v
        });
        let mut acc = listener.accept_many(8);
        let mut got = Vec::new();
        for _ in 0..20 {
            got.push(acc.next().await.unwrap());
        }
        let cs = clients.await.unwrap();
        assert_eq!(cs.len(), 20);
        let mut peers: Vec<_> = got.iter().map(|(_, p)| *p).collect();
        let mut locals: Vec<_> = cs.iter().map(|c| c.local_addr().unwrap()).collect();
        peers.sort();
        locals.sort();
        assert_eq!(peers, locals);
        assert!(
            live_ops() >= 1,
            "accepts stay posted while the acceptor lives"
        );
        drop(acc);
        let t = Instant::now();
        while live_ops() > 0 && t.elapsed() < Duration::from_secs(2) {
            sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(live_ops(), 0);
    });
}

#[test]
fn mpsc_backpressure_oneshot_notify() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let (tx, mut rx) = mpsc::channel::<u32>(2);
        let sent = Rc::new(RefCell::new(0));
        let s2 = sent.clone();
        let producer = spawn(async move {
            for i in 0..10 {
                tx.send(i).await.unwrap();
                *s2.borrow_mut() += 1;
            }
        });
        sleep(Duration::from_millis(5)).await;
        assert_eq!(*sent.borrow(), 2, "send waits while the channel is full");
        let mut got = Vec::new();
        while let Some(v) = rx.recv().await {
            got.push(v);
        }
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        producer.await.unwrap();

        let (tx, rx) = oneshot::channel::<String>();
        drop(tx);
        assert!(rx.await.is_err());

        let n = Arc::new(Notify::new());
        n.notify_one();
        n.notified().await; // the stored permit
        let hits = Arc::new(AtomicUsize::new(0));
        let mut hs = Vec::new();
        for _ in 0..3 {
            let (n, hits) = (n.clone(), hits.clone());
            hs.push(spawn(async move {
                n.notified().await;
                hits.fetch_add(1, Ordering::SeqCst);
            }));
        }
        yield_now().await;
        n.notify_waiters();
        for h in hs {
            h.await.unwrap();
        }
        assert_eq!(hits.load(Ordering::SeqCst), 3);
    });
}

#[test]
fn channels_across_loops_and_threads() {
    let rt = Runtime::builder().workers(2).build().unwrap();
    rt.block_on(async {
        let (tx, mut rx) = mpsc::channel::<u64>(4);
        let other = iolab_runtime::workers()[1].clone();
        let h = other.spawn(async move {
            for i in 0..1000 {
                tx.send(i).await.unwrap();
            }
        });
        let mut sum = 0;
        while let Some(v) = rx.recv().await {
            sum += v;
        }
        assert_eq!(sum, 499_500);
        h.await.unwrap();
        // A plain thread completing a oneshot wakes the task on its loop.
        let (tx, rx) = oneshot::channel();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(10));
            tx.send(42u8).unwrap();
        });
        assert_eq!(rx.await, Ok(42));
    });
}

#[test]
fn files_read_write_fsync_metadata_send() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.bin");
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let f = iolab_runtime::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .custom_flags(libc::O_DSYNC)
            .open(&path)
            .await
            .unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let (r, _) = f.write_all_at(data.clone(), 0).await;
        r.unwrap();
        let (r, _) = f.write_at(b"XY".to_vec(), 10).await;
        assert_eq!(r.unwrap(), 2);
        f.fsync().await.unwrap();
        f.fdatasync().await.unwrap();
        assert_eq!(f.metadata().unwrap().len(), 200_000);
        let (r, buf) = f.read_at(vec![0u8; 16], 4).await;
        assert_eq!(r.unwrap(), 16);
        let mut want = data[4..20].to_vec();
        want[6] = b'X';
        want[7] = b'Y';
        assert_eq!(buf, want);
        let (r, _) = f.read_at(vec![0u8; 16], 200_000).await;
        assert_eq!(r.unwrap(), 0, "end of file");
        let e = iolab_runtime::fs::File::open(dir.path().join("missing"))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
        assert!(e.to_string().contains("missing"));

        // A file region to a socket without a user-space copy.
        let listener = TcpListener::bind(localhost()).unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let f = Rc::new(f);
        let f2 = f.clone();
        let sender = spawn(async move { f2.send_to(&server, 1000, 150_000).await });
        let got = read_exact(&client, 150_000).await.unwrap();
        assert_eq!(sender.await.unwrap().unwrap(), 150_000);
        let mut want = data[1000..151_000].to_vec();
        if want.len() > 150_000 {
            want.truncate(150_000);
        }
        assert_eq!(got, want);
        f.set_len(10).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 10);
        assert_eq!(live_ops(), 0);
    });
}

#[test]
fn runtime_drop_with_tasks_and_operations_in_flight() {
    let rt = Runtime::new().unwrap();
    let listener = TcpListener::bind(localhost()).unwrap();
    let addr = listener.local_addr().unwrap();
    let client = rt.block_on(async move {
        let client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let server = Rc::new(server);
        for _ in 0..50 {
            let s = server.clone();
            spawn(async move {
                let _ = s.read(vec![0u8; 1024]).await;
            });
        }
        spawn(async move {
            let _ = listener.accept().await;
        });
        yield_now().await;
        client
    });
    assert!(
        rt.live_ops() >= 51,
        "the reads and the accept are in flight: {}",
        rt.live_ops()
    );
    // Tasks are parked with reads and an accept in flight; shutting the runtime down (what
    // dropping it does) must cancel them, wait for the kernel and free everything.
    let not_freed = rt.shutdown();
    drop(client);
    assert_eq!(not_freed, 0, "operation records left after the shutdown");
}
