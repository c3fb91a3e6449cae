//! The deadlines of every model, started as `iolab serve --model M`: a request head that
//! trickles in is closed at `--header-timeout` (counted from its first byte, or from the
//! connection's start for the first request), however steadily its bytes come; a client that
//! stops reading a response is closed at `--send-timeout`. And the descriptor limit: under a
//! low `RLIMIT_NOFILE` every model serves, backs off when `accept` fails with EMFILE, and
//! recovers by itself. Each case runs every model at once (one thread each), so the whole
//! file takes a few seconds.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use iolab_stats::{ErrorKind, Snapshot, StatsReader};
use iolab_sys::testing::free_port;

mod common;
use common::closed_by_peer;

const BIN: &str = env!("CARGO_BIN_EXE_iolab");

/// Every model, and uring-callback's second accept mode.
const VARIANTS: [(&str, &[&str]); 11] = [
    ("threads", &[]),
    ("thread-pool", &["--workers", "8"]),
    ("select", &[]),
    ("poll", &[]),
    ("epoll", &[]),
    ("uring-accept-sync", &[]),
    ("uring", &[]),
    ("uring-fixed", &[]),
    ("uring-callback", &[]),
    ("uring-callback", &["--accept", "sync"]),
    ("runtime", &[]),
];

struct Server {
    child: Child,
    addr: SocketAddr,
    stats: StatsReader,
    name: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// `iolab serve --model NAME ARGS EXTRA` on a free port, serving small.html and a
    /// 2 MB big.bin; retried when the port was taken meanwhile.
    fn start(name: &str, args: &[&str], extra: &[&str]) -> Server {
        Server::start_limited(name, args, extra, None)
    }

    /// As [`Server::start`], under `RLIMIT_NOFILE` = `nofile` (soft and hard) when given.
    fn start_limited(name: &str, args: &[&str], extra: &[&str], nofile: Option<u64>) -> Server {
        let label = format!("{name} {}", args.join(" "));
        let mut last = String::new();
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("small.html"), b"<p>small</p>\n").unwrap();
            std::fs::write(dir.path().join("big.bin"), vec![7u8; 2 << 20]).unwrap();
            let addr: SocketAddr = format!("127.0.0.1:{}", free_port().unwrap())
                .parse()
                .unwrap();
            let stats_path = dir.path().join("stats");
            let mut cmd = Command::new(BIN);
            if let Some(n) = nofile {
                use std::os::unix::process::CommandExt as _;
                let lim = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                // SAFETY: setrlimit is async-signal-safe and only reads `lim`, copied in.
                unsafe {
                    cmd.pre_exec(move || {
                        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
            let mut child = cmd
                .args(["serve", "--model", name])
                .args(args)
                .arg("--root")
                .arg(dir.path())
                .args(["--addr", &addr.to_string(), "--stats"])
                .arg(&stats_path)
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn iolab serve");
            let mut out = BufReader::new(child.stdout.take().unwrap());
            let mut line = String::new();
            let _ = out.read_line(&mut line);
            std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
            // The start line comes before the model binds: wait until it accepts.
            let end = Instant::now() + Duration::from_secs(15);
            let mut ready = false;
            while line.starts_with("serving ") && Instant::now() < end && !ready {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                ready = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok();
                std::thread::sleep(Duration::from_millis(20));
            }
            if ready {
                let stats = StatsReader::open(&stats_path).expect("the server's stats file");
                let srv = Server {
                    child,
                    addr,
                    stats,
                    name: label,
                    _dir: dir,
                };
                // The probe was a connection too (closed before any head: no timeout).
                srv.wait_for(|s| s.accepted >= 1 && s.open == 0, "the probe to close");
                return srv;
            }
            let _ = child.kill();
            let _ = child.wait();
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            last = format!("{line}{err}");
            if !last.contains("in use") {
                break;
            }
        }
        panic!("iolab serve --model {label} did not start: {last}");
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).expect("connect");
        s.set_nodelay(true).unwrap();
        s
    }

    /// Waits (10 s at most) until the counters satisfy `cond`.
    fn wait_for(&self, cond: impl Fn(&Snapshot) -> bool, what: &str) -> Snapshot {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.stats.snapshot();
            if cond(&s) {
                return s;
            }
            assert!(
                Instant::now() < end,
                "{}: waiting for {what}; counters {s:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Runs `case` for every variant, each on its own thread, and panics with every failure.
fn every_model(case: fn(&str, &[&str])) {
    every_model_by(case, VARIANTS.len());
}

/// As [`every_model`], `at_once` variants at a time.
fn every_model_by(case: fn(&str, &[&str]), at_once: usize) {
    let failures: Vec<String> = VARIANTS
        .chunks(at_once)
        .flat_map(|group| run_group(case, group))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn run_group(
    case: fn(&str, &[&str]),
    group: &[(&'static str, &'static [&'static str])],
) -> Vec<String> {
    std::thread::scope(|s| {
        let runs: Vec<_> = group
            .iter()
            .map(|&(name, args)| (name, args, s.spawn(move || case(name, args))))
            .collect();
        runs.into_iter()
            .filter_map(|(name, args, h)| {
                h.join().err().map(|e| {
                    let msg = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    format!("{name} {args:?}: {msg}")
                })
            })
            .collect()
    })
}

const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// A byte every this often: the head stays far from complete, and far from idle.
const TRICKLE: Duration = Duration::from_millis(250);

/// Writes a request head one byte every [`TRICKLE`] until the server closes; returns how
/// long after `from` the close came.
fn trickle_until_closed(mut s: TcpStream, from: Instant, srv: &Server) -> Duration {
    let mut writer = s.try_clone().unwrap();
    let head = b"GET /small.html HTTP/1.1\r\nHost: t\r\nX-Slow: ".repeat(4);
    let feeder = std::thread::spawn(move || {
        for b in head {
            if writer.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(TRICKLE);
        }
    });
    let closed = closed_by_peer(&mut s, Duration::from_secs(10));
    let after = from.elapsed();
    assert!(closed, "{}: a trickling head not closed in 10 s", srv.name);
    drop(s);
    let _ = feeder.join();
    after
}

fn within_ten_percent(name: &str, what: &str, took: Duration, limit: Duration) {
    let (lo, hi) = (limit.mul_f64(0.9), limit.mul_f64(1.1));
    assert!(
        took >= lo && took <= hi,
        "{name}: {what} closed after {took:?}, not within 10% of {limit:?}"
    );
}

fn slow_head(name: &str, args: &[&str]) {
    let srv = Server::start(
        name,
        args,
        &[
            "--header-timeout",
            "2",
            "--idle-timeout",
            "30",
            "--send-timeout",
            "30",
        ],
    );
    // The first request: the head is due 2 s after the connection's start.
    let (first, later) = std::thread::scope(|s| {
        let first = s.spawn(|| {
            let c = srv.connect();
            trickle_until_closed(c, Instant::now(), &srv)
        });
        // A keep-alive connection: one request answered, 1 s idle, then a head trickles in;
        // it is due 2 s after its own first byte.
        let mut c = srv.connect();
        c.write_all(b"GET /small.html HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let mut r = BufReader::new(c.try_clone().unwrap());
        let mut status = String::new();
        r.read_line(&mut status).unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{}: {status}", srv.name);
        std::thread::sleep(Duration::from_secs(1));
        let later = trickle_until_closed(c, Instant::now(), &srv);
        (first.join().unwrap(), later)
    });
    eprintln!(
        "{}: slowloris closed after {first:?} (first head), {later:?} (keep-alive head)",
        srv.name
    );
    within_ten_percent(&srv.name, "a first head", first, HEADER_TIMEOUT);
    within_ten_percent(&srv.name, "a keep-alive head", later, HEADER_TIMEOUT);
    let snap = srv.wait_for(|s| s.open == 0, "both connections closed");
    assert_eq!(snap.error(ErrorKind::Timeout), 2, "{}: {snap:?}", srv.name);
}

/// A head sent one byte every 250 ms never completes; every model closes it at the
/// header deadline (±10%), the first request's counted from the connection's start and a
/// keep-alive request's from its first byte, and counts a timeout for each.
#[test]
fn a_trickling_head_is_closed_at_the_header_deadline() {
    every_model(slow_head);
}

const SEND_TIMEOUT: Duration = Duration::from_secs(2);

fn stalled_reader(name: &str, args: &[&str]) {
    let srv = Server::start(
        name,
        args,
        &[
            "--header-timeout",
            "30",
            "--idle-timeout",
            "30",
            "--send-timeout",
            "2",
        ],
    );
    let mut c = srv.connect();
    // 32 MB of responses asked for and none read: the socket buffers fill within
    // milliseconds, then the server's sends make no progress.
    c.write_all(&b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n".repeat(16))
        .unwrap();
    let t = Instant::now();
    let snap = srv.wait_for(|s| s.error(ErrorKind::Timeout) >= 1, "a send timeout");
    let took = t.elapsed();
    eprintln!("{}: stalled send closed after {took:?}", srv.name);
    // The buffers take a little while to fill: up to 10% on top, and never before.
    let (lo, hi) = (SEND_TIMEOUT, SEND_TIMEOUT.mul_f64(1.1) + TRICKLE);
    assert!(
        took >= lo.mul_f64(0.9) && took <= hi,
        "{}: a stalled send closed after {took:?}, not at {SEND_TIMEOUT:?}; {snap:?}",
        srv.name
    );
    srv.wait_for(|s| s.open == 0, "the stalled connection closed");
    // The connection really is gone: what is left in the buffers, then EOF or a reset.
    assert!(closed_by_peer(&mut c, Duration::from_secs(10)));
}

/// A client that asks for large responses and reads none of them is closed at the send
/// deadline and counted as a timeout, in every model.
#[test]
fn a_client_that_stops_reading_is_closed_at_the_send_deadline() {
    every_model(stalled_reader);
}

/// The descriptor limit the servers run under: a few dozen above what they hold idle.
const NOFILE: u64 = 48;
/// Idle connections opened at once: more than [`NOFILE`] descriptors.
const BURST: usize = 80;

/// One GET of /small.html on a new connection; its status (0 when there was no answer
/// within `within`).
fn get_status(srv: &Server, within: Duration) -> u16 {
    let mut c = srv.connect();
    c.set_read_timeout(Some(within)).unwrap();
    if c.write_all(b"GET /small.html HTTP/1.1\r\nHost: t\r\n\r\n")
        .is_err()
    {
        return 0;
    }
    let mut line = String::new();
    let _ = BufReader::new(c).read_line(&mut line);
    line.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// CPU seconds (user + system) the process has used, from /proc/PID/stat.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name in parentheses: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11..13).map_or(0.0, |t| {
        t.iter().filter_map(|v| v.parse::<f64>().ok()).sum()
    });
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn descriptor_exhaustion(name: &str, args: &[&str]) {
    // thread-pool at its default size: 256 workers asked for, which 48 descriptors cannot
    // hold (each blocked accept reserves one): it must size its pool down and say so.
    let args: &[&str] = if name == "thread-pool" { &[] } else { args };
    let srv = Server::start_limited(name, args, &[], Some(NOFILE));
    assert_eq!(
        get_status(&srv, Duration::from_secs(5)),
        200,
        "{}: under the limit",
        srv.name
    );
    // A burst of idle connections beyond the limit: accept fails with EMFILE (or, in the
    // thread models, the connections wait for a thread).
    let burst: Vec<TcpStream> = (0..BURST).map(|_| srv.connect()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let cpu = cpu_secs(srv.child.id());
    std::thread::sleep(Duration::from_secs(1));
    let spent = cpu_secs(srv.child.id()) - cpu;
    assert!(
        spent < 0.05,
        "{}: {spent:.3} s of CPU in 1 s while out of descriptors (spinning on accept?)",
        srv.name
    );
    drop(burst);
    // Recovery by itself: the queued connections are served and closed, then a new client
    // is answered.
    let t = Instant::now();
    let status = get_status(&srv, Duration::from_secs(10));
    eprintln!(
        "{}: answered {status} {:?} after the burst closed",
        srv.name,
        t.elapsed()
    );
    assert_eq!(status, 200, "{}: after the burst", srv.name);
}

/// Every model under RLIMIT_NOFILE = 48: answers 200 (thread-pool answered 500 to every
/// request when its blocked accepts took every descriptor), does not spin while a burst of
/// connections exhausts the descriptors, and answers again once the burst has gone.
#[test]
fn every_model_survives_descriptor_exhaustion() {
    every_model(descriptor_exhaustion);
}

/// Idle keep-alive connections the memory case opens at once.
const IDLE_CONNS: usize = 2000;
/// How far above its start RSS a server may stay once they have closed: the issue's
/// 2 MiB, plus 1 MiB for what the first requests leave for good (the file cache's entry,
/// each thread's `Date` line, a grown completion vector) — measured on idle servers.
const RSS_SLACK_KIB: u64 = 3 * 1024;

/// VmRSS of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// RSS in KiB once it holds still (the same ±64 KiB over 200 ms, 3 s at most).
fn settled_rss(pid: u32) -> u64 {
    let end = Instant::now() + Duration::from_secs(3);
    let mut last = rss_kib(pid);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = rss_kib(pid);
        if now.abs_diff(last) <= 64 || Instant::now() > end {
            return now;
        }
        last = now;
    }
}

fn memory_returns(name: &str, args: &[&str]) {
    // thread-pool holds one connection per thread: a pool for all of them.
    let args: &[&str] = if name == "thread-pool" {
        &["--workers", "2048"]
    } else {
        args
    };
    let srv = Server::start(name, args, &["--max-conns", "10000"]);
    let pid = srv.child.id();
    // The baseline: started, one request answered (the cache holds the file).
    assert_eq!(get_status(&srv, Duration::from_secs(5)), 200);
    let base = settled_rss(pid);
    // select holds descriptors below FD_SETSIZE (1,024) only.
    let n = if name == "select" { 900 } else { IDLE_CONNS };
    let mut conns: Vec<TcpStream> = (0..n).map(|_| srv.connect()).collect();
    for c in &mut conns {
        c.write_all(b"GET /small.html HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
    }
    for c in &mut conns {
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut line = String::new();
        // Only the status line: the rest stays in the socket, the connection idle.
        let mut r = BufReader::new(c.try_clone().unwrap());
        r.read_line(&mut line).unwrap();
        assert!(line.starts_with("HTTP/1.1 200"), "{}: {line:?}", srv.name);
    }
    srv.wait_for(|s| s.open as usize >= n, "every connection open");
    let held = rss_kib(pid);
    drop(conns);
    srv.wait_for(|s| s.open == 0, "every connection closed");
    std::thread::sleep(Duration::from_millis(1200));
    let after = settled_rss(pid);
    eprintln!(
        "{}: RSS {:.1} MiB at start, {:.1} MiB with {n} idle, {:.1} MiB after they closed",
        srv.name,
        base as f64 / 1024.0,
        held as f64 / 1024.0,
        after as f64 / 1024.0
    );
    assert!(
        after <= base + RSS_SLACK_KIB,
        "{}: RSS {after} KiB after {IDLE_CONNS} connections closed, {base} KiB at start",
        srv.name
    );
}

/// Every model gives back the memory of 2,000 idle connections (select: 900) once they have
/// closed: its RSS returns to within [`RSS_SLACK_KIB`] of what it was before them. (The
/// thread models kept 26 and 9 MiB until their stacks were their own and one arena held
/// their buffers: `threads::OwnStack`, `memory::one_arena`.)
#[test]
fn memory_of_closed_connections_is_given_back() {
    iolab_sys::raise_nofile_limit().expect("raise RLIMIT_NOFILE");
    // 2,000 client sockets per model: four models at a time stay within the test's
    // descriptor limit.
    every_model_by(memory_returns, 4);
}

/// A bad request followed by more bytes than the server reads: every model answers 400 and
/// closes lingering (its sending side shut, the rest of the input drained), so the client
/// reads the whole status line and an end of file, never a reset.
fn bad_request_then_more(name: &str, args: &[&str]) {
    let srv = Server::start(name, args, &[]);
    for (what, head) in [
        (
            "400",
            b"GET /small.html HTTP/1.1\r\nBad Header\r\n\r\n".to_vec(),
        ),
        ("414", [b"GET /".to_vec(), vec![b'a'; 9000]].concat()),
        (
            "431",
            [
                b"GET / HTTP/1.1\r\nHost: t\r\n".to_vec(),
                b"X: y\r\n".repeat(200),
                b"\r\n".to_vec(),
            ]
            .concat(),
        ),
    ] {
        let mut c = srv.connect();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // The bad head, then 256 KiB the server will never parse: without a lingering
        // close they are unread when it closes, and the kernel answers with a reset.
        c.write_all(&head).unwrap();
        let _ = c.write_all(&vec![b'x'; 256 * 1024]);
        let mut got = Vec::new();
        let end = c.read_to_end(&mut got);
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with(&format!("HTTP/1.1 {what} ")),
            "{}: {what}: got {:?}",
            srv.name,
            &text[..text.len().min(60)]
        );
        assert!(
            end.is_ok(),
            "{}: {what}: the answer ended with {end:?}",
            srv.name
        );
    }
}

#[test]
fn error_answers_close_lingering() {
    every_model(bad_request_then_more);
}
