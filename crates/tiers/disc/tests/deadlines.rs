//! Issue 43 §3 for our tiers: a client trickling its request head one byte a second kept a
//! BE or proxy connection for as long as it liked, and one that stopped reading kept a
//! relay waiting forever. Now the whole head is due `--header-timeout` after the
//! connection's start, and bytes waiting for a client with none acknowledged end the
//! connection after `--send-timeout` (`iolab_disc::deadline`); each is closed at its
//! deadline ±10% and counted.
//!
//! One test: the counters are the process's, and the cases run in order of what they count.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iolab_disc::deadline::{expired_count, ClientTimeouts, Expiry};
use iolab_disc::proxy::{DiscMode, ProxyConfig, DIRECT_STALL};
use iolab_disc::stop::Stop;

const LIMIT: Duration = Duration::from_secs(2);
const BIG: usize = 32 << 20;
/// How long after the request a client that reads nothing stops acknowledging, at most.
const WINDOW_CLOSING: Duration = Duration::from_millis(500);

struct Tier {
    addr: SocketAddr,
    stop: Arc<Stop>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Drop for Tier {
    fn drop(&mut self) {
        self.stop.trigger();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn timeouts(header: Duration, send: Duration) -> ClientTimeouts {
    ClientTimeouts { header, send }
}

/// Our BE (no DISC) serving `root`.
fn be(root: &std::path::Path, t: ClientTimeouts) -> Tier {
    let site = iolab_http::Site::new(root, iolab_http::Limits::default()).unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let stop = Stop::new().unwrap();
    let s = stop.clone();
    let thread = std::thread::spawn(move || iolab_disc::be::run(l, None, site, None, t, s));
    Tier {
        addr,
        stop,
        thread: Some(thread),
    }
}

/// Our FE (no DISC) in front of `upstream`.
fn fe(upstream: SocketAddr, t: ClientTimeouts) -> Tier {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let stop = Stop::new().unwrap();
    let s = stop.clone();
    let cfg = ProxyConfig {
        upstreams: vec![upstream],
        first: true,
        disc: DiscMode::Off,
        hook_iface: None,
        stall: DIRECT_STALL,
        dp_key: None,
        timeouts: t,
    };
    let thread = std::thread::spawn(move || iolab_disc::proxy::run(l, cfg, s));
    Tier {
        addr,
        stop,
        thread: Some(thread),
    }
}

/// Sends a request head one byte a second from the connection's start; returns when the
/// tier closed it, counted from the connect.
fn trickle_until_closed(at: SocketAddr) -> Duration {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(at).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(1000)))
        .unwrap();
    let head = b"GET /small.html HTTP/1.1\r\nHost: t\r\nX-Slow: 1\r\n";
    for &b in head.iter() {
        if s.write_all(&[b]).is_err() {
            break;
        }
        // Waits a second for the close (EOF or reset) between bytes.
        let mut one = [0u8; 64];
        match s.read(&mut one) {
            Ok(0) => return t0.elapsed(),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return t0.elapsed(),
            Ok(_) => panic!("an answer to an incomplete head"),
            Err(_) => {} // the second passed
        }
    }
    panic!(
        "{at}: a head trickling for {:?} was never closed",
        t0.elapsed()
    );
}

fn within_ten_percent(what: &str, took: Duration) {
    assert!(
        took >= LIMIT.mul_f64(0.9) && took <= LIMIT.mul_f64(1.1),
        "{what}: closed after {took:?}, not within 10% of {LIMIT:?}"
    );
}

/// Asks `at` for 4 × 32 MiB and reads none of it; returns when a send deadline was
/// counted, from the request, and checks the connection then ends.
fn stall_until_closed(at: SocketAddr, what: &str) -> Duration {
    let before = expired_count(Expiry::Send);
    let mut s = TcpStream::connect(at).unwrap();
    s.write_all(&b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n".repeat(4))
        .unwrap();
    let t0 = Instant::now();
    while expired_count(Expiry::Send) == before {
        assert!(
            t0.elapsed() < 4 * LIMIT,
            "{what}: a stalled client never closed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = t0.elapsed();
    // What the buffers hold, then the end.
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut got = 0usize;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("{what}: the stalled connection did not end: {e}"),
        }
    }
    assert!(
        got < 4 * BIG,
        "{what}: all {got} bytes came after the close"
    );
    took
}

#[test]
fn trickling_heads_and_stalled_readers_are_closed_at_their_deadlines() {
    let dir = iolab_sys::testing::tempdir("disc-deadlines").unwrap();
    std::fs::write(dir.path().join("small.html"), b"<p>small</p>\n").unwrap();
    std::fs::write(dir.path().join("big.bin"), vec![7u8; BIG]).unwrap();
    let strict = timeouts(LIMIT, LIMIT);
    let back = be(dir.path(), strict);
    // The FE's upstream sends as long as the FE wants (no send deadline): the stall is the
    // FE's client's.
    let relaxed_be = be(dir.path(), timeouts(LIMIT, Duration::ZERO));
    let front = fe(relaxed_be.addr, strict);

    let heads = expired_count(Expiry::Header);
    let (be_head, fe_head) = std::thread::scope(|s| {
        let b = s.spawn(|| trickle_until_closed(back.addr));
        let f = s.spawn(|| trickle_until_closed(front.addr));
        (b.join().unwrap(), f.join().unwrap())
    });
    eprintln!("slowloris closed after {be_head:?} (BE), {fe_head:?} (FE)");
    within_ten_percent("the BE's trickling head", be_head);
    within_ten_percent("the FE's trickling head", fe_head);
    assert_eq!(expired_count(Expiry::Header), heads + 2, "both counted");

    let be_send = stall_until_closed(back.addr, "the BE");
    let fe_send = stall_until_closed(front.addr, "the FE");
    eprintln!("stalled readers closed after {be_send:?} (BE), {fe_send:?} (FE)");
    // The stall starts once the client's receive window has closed, which takes a while
    // after the request (its buffer autotunes, then its window shrinks by small steps that
    // are progress: 0.3 s here, zero-window probes finding a little room each time).
    for (what, took) in [("the BE", be_send), ("the FE", fe_send)] {
        assert!(
            took >= LIMIT.mul_f64(0.9) && took <= LIMIT.mul_f64(1.1) + WINDOW_CLOSING,
            "{what}'s stalled reader: closed after {took:?}, not at {LIMIT:?}"
        );
    }
}
