//! In-process checks of a model, shared by the unit tests of the io_uring models and
//! `runtime` (the common suite in tests/models.rs runs the `iolab` binary; these also cover
//! settings it does not pass, such as `--accept sync` and several workers).
//!
//! - [`exercise`]: keep-alive, pipelining and a client gone mid-response, with the counters;
//! - [`slow_reads_hold_up_only_their_connection`]: a slow file read holds up only the
//!   connection waiting for it (the models that read files through the ring or the blocking
//!   pool);
//! - [`serve_tests!`]: both, as the tests of a model with one way to accept.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iolab_sys::testing::TempDir;

use crate::{AcceptMode, Config, Ctx, Shutdown, Stats};

/// A model's `run`.
pub(crate) type Run = fn(&Ctx) -> io::Result<()>;

/// The tests of an io_uring model with one way to accept: served by one worker and by two
/// ([`exercise`]), and slow file reads ([`slow_reads_hold_up_only_their_connection`]).
macro_rules! serve_tests {
    ($run:path) => {
        #[test]
        fn serves_one_worker() {
            $crate::testing::exercise($run, 1, $crate::AcceptMode::Async);
        }

        #[test]
        fn serves_two_workers() {
            $crate::testing::exercise($run, 2, $crate::AcceptMode::Async);
        }

        #[test]
        fn slow_file_reads_hold_up_only_their_connection() {
            $crate::testing::slow_reads_hold_up_only_their_connection(
                $run,
                $crate::AcceptMode::Async,
            );
        }
    };
}
pub(crate) use serve_tests;

/// A temp directory holding the given files, removed however the test ends.
fn temp_root(tag: &str, files: &[(&str, &[u8])]) -> TempDir {
    let root = iolab_sys::testing::tempdir(tag).unwrap();
    for (name, bytes) in files {
        std::fs::write(root.path().join(name), bytes).unwrap();
    }
    root
}

/// A loopback address with a port free a moment ago.
fn free_addr() -> SocketAddr {
    let port = iolab_sys::testing::free_port().unwrap();
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A configuration serving `root` on `addr` with `workers` rings and the `accept` mode.
fn config(root: &Path, addr: SocketAddr, workers: usize, accept: AcceptMode) -> Config {
    Config {
        root: root.to_path_buf(),
        addr,
        workers,
        accept,
        ..Config::default()
    }
}

/// Triggers the server's shutdown when dropped: also when the client side panics (a
/// failed assertion), so the scoped server thread ends and the test fails at once instead
/// of waiting forever for a server nobody stops.
struct StopOnDrop<'a>(&'a Shutdown);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.trigger();
    }
}

/// Runs `run` on `ctx` while `client` runs against it (given the first connection, made
/// once the server is up), then stops the server (also when `client` panics: the panic then
/// ends the call promptly) and checks that the model returned Ok.
fn serve(ctx: &Ctx, run: Run, client: impl FnOnce(TcpStream)) {
    let addr = ctx.config.addr;
    let result = std::thread::scope(|s| {
        let server = s.spawn(|| run(ctx));
        let stop = StopOnDrop(&ctx.shutdown);
        let deadline = Instant::now() + Duration::from_secs(10);
        let first = loop {
            match TcpStream::connect(addr) {
                Ok(c) => break c,
                Err(e) => {
                    assert!(
                        Instant::now() < deadline && !server.is_finished(),
                        "server not up: {e}"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        };
        client(first);
        drop(stop);
        server.join().expect("server thread panicked")
    });
    result.expect("model returned an error");
}

/// Reads one response with a Content-Length body; returns (head, body).
fn response(s: &mut TcpStream) -> (String, Vec<u8>) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).expect("response head");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("Content-Length");
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).expect("response body");
    (head, body)
}

/// Serves a temp root with `run` (`workers` rings, `accept` mode), drives real requests
/// through it, stops it, and checks the answers and the counters.
pub(crate) fn exercise(run: Run, workers: usize, accept: AcceptMode) {
    let ctx = serve_files(run, workers, accept, client);
    let s = ctx.stats.snapshot();
    assert_eq!(
        (s.open, s.accepted, s.requests, s.refused),
        (0, 2, 6, 0),
        "{s:?}"
    );
}

/// The files `serve_files` serves: small.html and the 700 KB big.bin.
fn files() -> (Vec<u8>, Vec<u8>) {
    let small = b"<html>uring unit</html>\n".to_vec();
    let big: Vec<u8> = (0..700_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    (small, big)
}

/// Serves a temp root holding `files()` with `run` while `client` runs against it (given
/// the first connection, made once the server is up, and the address), then stops the server
/// and returns the context, for its counters.
fn serve_files(
    run: Run,
    workers: usize,
    accept: AcceptMode,
    client: impl FnOnce(TcpStream, SocketAddr, &Ctx),
) -> Ctx {
    let (small, big) = files();
    let root = temp_root("uring-unit", &[("small.html", &small), ("big.bin", &big)]);
    let addr = free_addr();
    let ctx = Ctx::new(config(root.path(), addr, workers, accept), Stats::private()).unwrap();
    serve(&ctx, run, |first| client(first, addr, &ctx));
    ctx
}

/// The requests `exercise` makes: keep-alive, pipelining, a client gone mid-response.
fn client(mut c: TcpStream, addr: SocketAddr, ctx: &Ctx) {
    let (small, big) = files();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Keep-alive: three requests on one connection.
    for _ in 0..3 {
        c.write_all(b"GET /small.html HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let (head, body) = response(&mut c);
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert_eq!(body, small);
    }
    // Two pipelined requests in one write, answered in order.
    c.write_all(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\nGET /nope HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let (head, body) = response(&mut c);
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(body == big, "700 KB body differs");
    let (head, _) = response(&mut c);
    assert!(head.starts_with("HTTP/1.1 404 "), "{head}");
    // A client gone in the middle of the 700 KB response.
    let mut d = TcpStream::connect(addr).unwrap();
    d.write_all(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut some = [0u8; 100];
    d.read_exact(&mut some).unwrap();
    drop(d);
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(10);
    while ctx.stats.snapshot().open != 0 {
        assert!(
            Instant::now() < deadline,
            "connections still open: {:?}",
            ctx.stats.snapshot()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A failing assertion on the client side ends the test promptly: the server is stopped
/// and the panic reaches the caller. (Before, the scoped server thread was never told to
/// stop and the test hung.) Run in a thread so a regression fails by a generous bound
/// instead of hanging the suite.
#[test]
fn a_failing_client_assertion_ends_the_test() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let outcome = std::panic::catch_unwind(|| {
            serve_files(crate::uring::run, 1, AcceptMode::Async, |c, _, _| {
                // The connection stays open while the panic unwinds, as in a failing test.
                let _c = c;
                panic!("intentional client failure");
            });
        });
        let _ = tx.send(outcome);
    });
    let outcome = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the failing exercise did not end within 120 s: the server was not stopped");
    let err = outcome.expect_err("the client's panic must reach the caller");
    let msg = err
        .downcast_ref::<&str>()
        .copied()
        .map(str::to_owned)
        .or_else(|| err.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(msg.contains("intentional client failure"), "{msg}");
}

/// The disk's injected slowness: every file read takes this much longer.
const DELAY: Duration = Duration::from_millis(400);

/// Asks for `path` and returns the body of its 200 answer.
fn get(s: &mut TcpStream, path: &str) -> Vec<u8> {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
        .unwrap();
    let (head, body) = response(s);
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{path}: {head}");
    body
}

/// One loop (`workers` 1), a site whose files over 64 KiB are streamed, and a disk made
/// slow by [`DELAY`] once a small file is cached. A client asks for a file not cached (one
/// slow read), then for a streamed file (two slow chunk reads); meanwhile another client
/// keeps asking for the cached file on its keep-alive connection. Whatever the machine's
/// load, the other client must get several answers while the first waits (a model that
/// read on its loop would answer it at most once: its loop sleeps through each read), and
/// the slow answers must be exact and take at least the injected delay (the hook is
/// active).
pub(crate) fn slow_reads_hold_up_only_their_connection(run: Run, accept: AcceptMode) {
    let cached = b"<html>cached</html>\n".to_vec();
    let miss: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let big: Vec<u8> = (0..100_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let root = temp_root(
        "slow-disk",
        &[
            ("cached.html", &cached),
            ("miss.bin", &miss),
            ("big.bin", &big),
        ],
    );
    let addr = free_addr();
    let config = config(root.path(), addr, 1, accept);
    let cache = iolab_http::CacheConfig {
        max_cached_file: 64 * 1024,
        revalidate_after: Duration::from_secs(3600),
        ..iolab_http::CacheConfig::default()
    };
    let ctx = Ctx {
        site: iolab_http::Site::with_cache(root.path(), config.limits.clone(), cache).unwrap(),
        config,
        stats: Arc::new(Stats::private()),
        shutdown: Shutdown::new().unwrap(),
    };
    serve(&ctx, run, |mut fast| {
        fast.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        assert_eq!(get(&mut fast, "/cached.html"), cached);
        ctx.site.inject_read_delay(DELAY);
        for (path, want) in [("/miss.bin", &miss), ("/big.bin", &big)] {
            let done = Arc::new(AtomicBool::new(false));
            let slow_done = Arc::clone(&done);
            let slow = std::thread::spawn(move || {
                let mut c = TcpStream::connect(addr).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let t0 = Instant::now();
                let body = get(&mut c, path);
                let took = t0.elapsed();
                slow_done.store(true, Ordering::SeqCst);
                (body, took)
            });
            let mut answered_meanwhile = 0;
            while !done.load(Ordering::SeqCst) {
                assert_eq!(get(&mut fast, "/cached.html"), cached);
                if !done.load(Ordering::SeqCst) {
                    answered_meanwhile += 1;
                }
            }
            let (body, took) = slow.join().unwrap();
            assert!(body == *want, "{path}: bytes differ");
            assert!(
                took >= DELAY,
                "{path} took {took:?}: the delay was not applied"
            );
            assert!(
                answered_meanwhile >= 3,
                "{path}: the cached file was answered only {answered_meanwhile} times in \
                 the {took:?} a slow read took: the read stalled the loop"
            );
        }
    });
}
