//! Cancel storm: 100,000 reads on idle sockets, cancelled through a Cond. Each must return
//! `Cancelled` within 10 ms of the signal with its buffer intact, and the count of live
//! operation records must return to zero. Also run under AddressSanitizer
//! (scripts/runtime-sanitize).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use iolab_runtime::net::{TcpListener, TcpStream};
use iolab_runtime::{live_ops, sleep, spawn, yield_now, Cancelled, Cond, Runtime};

const SOCKETS: usize = 250;
const READS_PER_SOCKET: usize = 2;
const WAVES: usize = 200; // 250 * 2 * 200 = 100,000 reads

/// 10 ms, the bound the issue sets. Under a sanitizer (scripts/runtime-sanitize) everything
/// runs several times slower; the script relaxes the bound with IOLAB_STORM_LIMIT_MS, since
/// there the point is memory safety.
fn limit() -> Duration {
    let ms = std::env::var("IOLAB_STORM_LIMIT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    Duration::from_millis(ms)
}

/// Involuntary context switches of this thread: a wave during which the scheduler took the
/// CPU away (2 shared cores) measures the machine, not the runtime, and is run again.
fn preemptions() -> i64 {
    // SAFETY: getrusage fills a live struct.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut u);
        u.ru_nivcsw
    }
}

#[test]
fn cancel_storm_100k_reads() {
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let listener = TcpListener::builder("127.0.0.1:0".parse().unwrap()).backlog(1024).bind().unwrap();
        let addr = listener.local_addr().unwrap();
        let mut clients = Vec::new();
        let mut servers = Vec::new();
        for _ in 0..SOCKETS {
            clients.push(TcpStream::connect(addr).await.unwrap());
            servers.push(Rc::new(listener.accept().await.unwrap().0));
        }
        let base = live_ops();
        let mut total = 0usize;
        let mut worst = Duration::ZERO;
        let mut reruns = 0usize;
        let mut wave = 0usize;
        let limit = limit();
        while wave < WAVES {
            let cancel = Cond::new();
            let returned: Rc<RefCell<Vec<Instant>>> = Rc::new(RefCell::new(Vec::new()));
            let mut tasks = Vec::new();
            for (si, s) in servers.iter().enumerate() {
                for k in 0..READS_PER_SOCKET {
                    let (s, cancel, returned) = (s.clone(), cancel.clone(), returned.clone());
                    let tag = ((si * READS_PER_SOCKET + k) % 251) as u8;
                    tasks.push(spawn(async move {
                        let (r, buf) = s.read_or_cancel(vec![tag; 32], &cancel).await;
                        returned.borrow_mut().push(Instant::now());
                        (r, buf, tag)
                    }));
                }
            }
            // Let every read reach the kernel and park there.
            yield_now().await;
            sleep(Duration::from_millis(1)).await;
            assert_eq!(live_ops(), base + SOCKETS * READS_PER_SOCKET, "reads in flight");
            let pre = preemptions();
            let signalled = Instant::now();
            cancel.broadcast();
            for t in tasks {
                let (r, buf, tag) = t.await.unwrap();
                let e = r.expect_err("an idle read must not complete");
                assert!(Cancelled::is(&e), "expected Cancelled, got {e}");
                assert_eq!(buf, vec![tag; 32], "the buffer comes back untouched");
            }
            let slowest = returned.borrow().iter().map(|t| *t - signalled).max().unwrap();
            assert_eq!(returned.borrow().len(), SOCKETS * READS_PER_SOCKET);
            if slowest > limit && preemptions() != pre && reruns < 20 {
                reruns += 1;
                continue;
            }
            assert!(slowest <= limit, "wave {wave}: a read took {slowest:?} to return Cancelled");
            worst = worst.max(slowest);
            total += SOCKETS * READS_PER_SOCKET;
            assert_eq!(live_ops(), base, "records freed after wave {wave}");
            wave += 1;
        }
        assert_eq!(total, 100_000);
        assert_eq!(live_ops(), 0);
        eprintln!("cancel storm: {total} reads cancelled, slowest {worst:?} after the signal, {reruns} waves re-run after preemption");
        // The sockets still work: nothing was left reading them.
        let (r, _) = clients[0].write_all(b"still alive".to_vec()).await;
        r.unwrap();
        let (r, buf) = servers[0].read(vec![0u8; 32]).await;
        assert_eq!(&buf[..r.unwrap()], b"still alive");
    });
}
