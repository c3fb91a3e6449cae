//! `iolab micro runtime` — what a lightweight task costs, and an echo server on the runtime
//! against the same server on tokio.
//!
//! - `task_switch_ns`: two tasks on one loop ping-pong a token through two bounded channels
//!   (`iolab_runtime::sync::mpsc`, capacity 1); wall time / task switches (2 per round trip).
//! - `thread_switch_ns`: two OS threads pinned to the same CPU do the same through a futex
//!   word (wait until it is my turn, hand the turn over, FUTEX_WAKE); wall / switches.
//! - `switch_ratio` = thread / task (target >= 50, issue 45's; the first measurements gave 55-58).
//! - `spawn_join_ns`: spawn 1,000,000 trivial tasks, then join them all; wall / tasks.
//! - `bytes_per_task`: RSS growth while 1,000,000 tasks are parked (each waiting on a shared
//!   `Cond`, join handles dropped), divided by 1,000,000 (target <= 256).
//! - `echo_msgs_per_s_iolab` / `echo_msgs_per_s_tokio`: one client (an iolab loop, 100
//!   connections, each sending a 100-byte message and reading the 100-byte echo in turn)
//!   pinned to one CPU, against an echo server pinned to another: a single iolab loop, then
//!   a tokio current-thread runtime, same code shape (read up to 4 KiB, write it back),
//!   alternated 3 times in one invocation; `echo_ratio` = iolab / tokio (target >= 1.3 on
//!   io_uring).
//!
//! Every figure is the median of 3 runs (the raw runs are under `"samples"`). `driver` is
//! the runtime's driver (IOLAB_DRIVER=epoll measures the fallback).

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use crate::osutil;
use crate::table::{Cell as TableCell, Num, Report, Table};

const MSG: usize = 100;
const CONNS: usize = 100;

/// The median of the repeats (iolab-sys's: the mean of the middle two for an even count);
/// NaN for no sample.
fn middle(v: &[f64]) -> f64 {
    iolab_sys::percentile::median(v).unwrap_or(f64::NAN)
}

/// Spread of repeats in percent of their median ((max - min) / median); NaN below two.
fn spread(v: &[f64]) -> f64 {
    iolab_sys::percentile::spread_pct(v).unwrap_or(f64::NAN)
}

/// The echo figures are kept once the last `ECHO_WINDOW` runs of each server agree within
/// `ECHO_STABLE_PCT` (spread of repeats), or when the time cap is reached.
const ECHO_WINDOW: usize = 3;
const ECHO_STABLE_PCT: f64 = 10.0;

/// Echo runs of both servers, side by side (iolab then tokio, alternately, so a change in the
/// machine's load hits both), until the last `ECHO_WINDOW` of each agree within
/// `ECHO_STABLE_PCT` or `cap` has passed (at least `ECHO_WINDOW` pairs either way).
struct EchoSeries {
    iolab: Vec<f64>,
    tokio: Vec<f64>,
    stable: bool,
}

impl EchoSeries {
    fn window(v: &[f64]) -> &[f64] {
        &v[v.len().saturating_sub(ECHO_WINDOW)..]
    }

    /// (iolab, tokio) spreads of the window, in percent.
    fn spreads(&self) -> (f64, f64) {
        (
            spread(Self::window(&self.iolab)),
            spread(Self::window(&self.tokio)),
        )
    }
}

fn echo_series(
    server_cpu: usize,
    client_cpu: usize,
    dur: Duration,
    cap: Duration,
) -> anyhow::Result<EchoSeries> {
    let t0 = Instant::now();
    let mut e = EchoSeries {
        iolab: Vec::new(),
        tokio: Vec::new(),
        stable: false,
    };
    loop {
        e.iolab
            .push(echo_run(Server::Iolab, server_cpu, client_cpu, dur)?);
        e.tokio
            .push(echo_run(Server::Tokio, server_cpu, client_cpu, dur)?);
        if e.iolab.len() < ECHO_WINDOW {
            continue;
        }
        let (a, b) = e.spreads();
        e.stable = a < ECHO_STABLE_PCT && b < ECHO_STABLE_PCT;
        // One more pair must fit in the cap (a pair takes about 2 × (dur + warm-up)).
        let pair = t0.elapsed().as_secs_f64() / e.iolab.len() as f64;
        if e.stable || t0.elapsed().as_secs_f64() + pair > cap.as_secs_f64() {
            return Ok(e);
        }
    }
}

/// Task switch cost on one iolab loop, in ns (two tasks, a token through two channels).
pub fn task_switch_ns(round_trips: u64) -> anyhow::Result<f64> {
    let rt = iolab_runtime::Runtime::new()?;
    Ok(rt.block_on(async move {
        let (tx_a, mut rx_a) = iolab_runtime::sync::mpsc::channel::<u64>(1);
        let (tx_b, mut rx_b) = iolab_runtime::sync::mpsc::channel::<u64>(1);
        let pong = iolab_runtime::spawn(async move {
            while let Some(v) = rx_a.recv().await {
                if tx_b.send(v + 1).await.is_err() {
                    break;
                }
            }
        });
        let ping = iolab_runtime::spawn(async move {
            let t0 = Instant::now();
            for i in 0..round_trips {
                tx_a.send(i).await.expect("pong alive");
                let v = rx_b.recv().await.expect("pong alive");
                debug_assert_eq!(v, i + 1);
            }
            t0.elapsed()
        });
        let wall = ping.await.expect("ping task");
        let _ = pong.await;
        wall.as_nanos() as f64 / (2 * round_trips) as f64
    }))
}

fn futex_wait(word: &AtomicU32, val: u32) {
    // SAFETY: FUTEX_WAIT on a live, aligned u32; returns at once if the value changed.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            val,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live, aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        );
    }
}

/// Thread switch cost in ns: two threads on one CPU hand a turn word back and forth.
fn thread_switch_ns(round_trips: u64, cpu: usize) -> anyhow::Result<f64> {
    let turn = Arc::new(AtomicU32::new(0));
    let t2 = turn.clone();
    let pong = std::thread::spawn(move || {
        let _ = osutil::pin_to(cpu);
        for _ in 0..round_trips {
            while t2.load(Ordering::Acquire) != 1 {
                futex_wait(&t2, 0);
            }
            t2.store(0, Ordering::Release);
            futex_wake(&t2);
        }
    });
    let ping = std::thread::spawn(move || {
        let _ = osutil::pin_to(cpu);
        let t0 = Instant::now();
        for _ in 0..round_trips {
            turn.store(1, Ordering::Release);
            futex_wake(&turn);
            while turn.load(Ordering::Acquire) != 0 {
                futex_wait(&turn, 1);
            }
        }
        t0.elapsed()
    });
    let wall = ping
        .join()
        .map_err(|_| anyhow::anyhow!("ping thread panicked"))?;
    pong.join()
        .map_err(|_| anyhow::anyhow!("pong thread panicked"))?;
    Ok(wall.as_nanos() as f64 / (2 * round_trips) as f64)
}

fn spawn_join_ns(n: u64) -> anyhow::Result<f64> {
    let rt = iolab_runtime::Runtime::new()?;
    Ok(rt.block_on(async move {
        let t0 = Instant::now();
        let hs: Vec<_> = (0..n)
            .map(|i| iolab_runtime::spawn(async move { i }))
            .collect();
        let mut s = 0u64;
        for h in hs {
            s = s.wrapping_add(h.await.expect("trivial task"));
        }
        std::hint::black_box(s);
        t0.elapsed().as_nanos() as f64 / n as f64
    }))
}

fn bytes_per_task(n: u64) -> anyhow::Result<f64> {
    let rt = iolab_runtime::Runtime::new()?;
    Ok(rt.block_on(async move {
        let cond = Rc::new(iolab_runtime::Cond::new());
        let done = Rc::new(Cell::new(0u64));
        // Warm the allocator and the run queue so their growth is not counted.
        for _ in 0..1000 {
            iolab_runtime::yield_now().await;
        }
        let before = osutil::rss_kib();
        for _ in 0..n {
            let (c, d) = (cond.clone(), done.clone());
            drop(iolab_runtime::spawn(async move {
                c.wait().await;
                d.set(d.get() + 1);
            }));
        }
        // Let every task run up to its wait.
        iolab_runtime::yield_now().await;
        while cond.waiters() < n as usize {
            iolab_runtime::yield_now().await;
        }
        let after = osutil::rss_kib();
        cond.broadcast();
        while done.get() < n {
            iolab_runtime::yield_now().await;
        }
        (after.saturating_sub(before) * 1024) as f64 / n as f64
    }))
}

// ---------------------------------------------------------------- echo

async fn iolab_serve(s: iolab_runtime::net::TcpStream) {
    let _ = s.set_nodelay(true);
    // Owned buffers: the read buffer keeps its 4 KiB; what was read goes out in a second
    // buffer (a copy of n bytes, where tokio writes from a borrowed slice).
    let mut buf = vec![0u8; 4096];
    let mut out = Vec::with_capacity(4096);
    loop {
        let (r, b) = s.read(buf).await;
        buf = b;
        let n = match r {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        out.clear();
        out.extend_from_slice(&buf[..n]);
        let (r, o) = s.write_all(out).await;
        out = o;
        if r.is_err() {
            return;
        }
    }
}

/// Runs an iolab echo server on `cpu` until `stop` is set; sends its address first.
fn iolab_server(
    cpu: usize,
    stop: Arc<AtomicBool>,
    addr_tx: std::sync::mpsc::Sender<anyhow::Result<SocketAddr>>,
) {
    let _ = osutil::pin_to(cpu);
    let run = || -> anyhow::Result<()> {
        let rt = iolab_runtime::Runtime::new()?;
        let listener = iolab_runtime::net::TcpListener::builder("127.0.0.1:0".parse()?)
            .backlog(1024)
            .bind()?;
        let _ = addr_tx.clone().send(Ok(listener.local_addr()?));
        rt.block_on(async move {
            iolab_runtime::spawn(async move {
                let mut acc = listener.accept_many(4);
                while let Ok((s, _)) = acc.next().await {
                    iolab_runtime::spawn(iolab_serve(s));
                }
            });
            while !stop.load(Ordering::Acquire) {
                iolab_runtime::sleep(Duration::from_millis(20)).await;
            }
        });
        Ok(())
    };
    if let Err(e) = run() {
        let _ = addr_tx.send(Err(e));
    }
}

fn tokio_server(
    cpu: usize,
    stop: Arc<AtomicBool>,
    addr_tx: std::sync::mpsc::Sender<anyhow::Result<SocketAddr>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = osutil::pin_to(cpu);
    let run = || -> anyhow::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let tx = addr_tx.clone();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let _ = tx.send(Ok(listener.local_addr()?));
            let acceptor = tokio::spawn(async move {
                while let Ok((mut s, _)) = listener.accept().await {
                    tokio::spawn(async move {
                        let _ = s.set_nodelay(true);
                        let mut buf = vec![0u8; 4096];
                        loop {
                            let n = match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            });
            while !stop.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            acceptor.abort();
            anyhow::Ok(())
        })
    };
    if let Err(e) = run() {
        let _ = addr_tx.send(Err(e));
    }
}

/// The client: 100 connections on one iolab loop pinned to `cpu`; messages echoed per second.
fn echo_client(addr: SocketAddr, cpu: usize, dur: Duration) -> anyhow::Result<f64> {
    let _ = osutil::pin_to(cpu);
    let rt = iolab_runtime::Runtime::new()?;
    let r = rt.block_on(async move {
        let mut conns = Vec::new();
        for _ in 0..CONNS {
            let s = iolab_runtime::net::TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            conns.push(s);
        }
        let count = Rc::new(Cell::new(0u64));
        let start = Instant::now() + Duration::from_millis(200); // warm-up excluded
        let end = start + dur;
        let mut hs = Vec::new();
        for (i, s) in conns.into_iter().enumerate() {
            let count = count.clone();
            hs.push(iolab_runtime::spawn(async move {
                let mut msg = vec![i as u8; MSG];
                let mut buf = vec![0u8; MSG];
                loop {
                    let now = Instant::now();
                    if now >= end {
                        return Ok::<(), std::io::Error>(());
                    }
                    let (r, m) = s.write_all(msg).await;
                    msg = m;
                    r?;
                    let mut got = 0;
                    while got < MSG {
                        buf.resize(MSG - got, 0);
                        let (r, b) = s.read(buf).await;
                        buf = b;
                        match r? {
                            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                            n => got += n,
                        }
                    }
                    if now >= start {
                        count.set(count.get() + 1);
                    }
                }
            }));
        }
        for h in hs {
            h.await.map_err(std::io::Error::from)??;
        }
        Ok::<f64, std::io::Error>(count.get() as f64 / dur.as_secs_f64())
    });
    Ok(r?)
}

#[derive(Clone, Copy)]
enum Server {
    Iolab,
    Tokio,
}

fn echo_run(
    server: Server,
    server_cpu: usize,
    client_cpu: usize,
    dur: Duration,
) -> anyhow::Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = stop.clone();
    let th = std::thread::spawn(move || match server {
        Server::Iolab => iolab_server(server_cpu, s2, tx),
        Server::Tokio => tokio_server(server_cpu, s2, tx),
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(10))
        .context("echo server did not start")??;
    let r = std::thread::spawn(move || echo_client(addr, client_cpu, dur))
        .join()
        .map_err(|_| anyhow::anyhow!("echo client thread panicked"))
        .and_then(|r| r);
    stop.store(true, Ordering::Release);
    th.join()
        .map_err(|_| anyhow::anyhow!("echo server thread panicked"))?;
    r
}

/// A spread cell: "4.2%", or "-" when there is none.
fn pct(p: f64) -> TableCell {
    if p.is_finite() {
        format!("{p:.1}%").into()
    } else {
        "-".into()
    }
}

/// A spread in percent for JSON: one decimal, null when there is none.
#[derive(Debug, Clone, Copy)]
struct Spread(f64);

impl Serialize for Spread {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.is_finite() {
            s.serialize_f64((self.0 * 10.0).round() / 10.0)
        } else {
            s.serialize_none()
        }
    }
}

/// The repeated measures, one value per measure: the raw runs (`"samples"`) or their
/// spreads (`"spread_pct"`).
#[derive(Debug, Clone, Serialize)]
struct PerMeasure<T> {
    task_switch_ns: T,
    thread_switch_ns: T,
    spawn_join_ns: T,
    echo_msgs_per_s_iolab: T,
    echo_msgs_per_s_tokio: T,
}

/// The JSON fields of `iolab micro runtime` (besides machine, tables and figures).
#[derive(Debug, Clone, Serialize)]
pub struct Fields {
    driver: &'static str,
    task_switch_ns: f64,
    thread_switch_ns: f64,
    switch_ratio: f64,
    spawn_join_ns: f64,
    bytes_per_task: f64,
    echo_msgs_per_s_iolab: f64,
    echo_msgs_per_s_tokio: f64,
    echo_ratio: f64,
    echo_connections: usize,
    echo_message_bytes: usize,
    echo_seconds_per_run: f64,
    echo_runs: usize,
    echo_stable: bool,
    echo_stable_pct: f64,
    echo_window: usize,
    spread_pct: PerMeasure<Spread>,
    server_cpu: usize,
    client_cpu: usize,
    quick: bool,
    samples: PerMeasure<Vec<f64>>,
}

/// How many of each: task switches, thread switches, spawns, parked tasks; and the length
/// of one echo run and the cap on the echo series.
struct Plan {
    switch_n: u64,
    thread_n: u64,
    spawn_n: u64,
    park_n: u64,
    echo_dur: Duration,
    echo_cap: Duration,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        // Echo: each run is long enough to average over many scheduler slices (quick: 1 s,
        // where 0.3 s runs here gave 156k, 172k and 55k msg/s), repeated until stable, within
        // a cap.
        if quick {
            Plan {
                switch_n: 100_000,
                thread_n: 20_000,
                spawn_n: 100_000,
                park_n: 100_000,
                echo_dur: Duration::from_secs(1),
                echo_cap: Duration::from_secs(20),
            }
        } else {
            Plan {
                switch_n: 1_000_000,
                thread_n: 100_000,
                spawn_n: 1_000_000,
                park_n: 1_000_000,
                echo_dur: Duration::from_secs(3),
                echo_cap: Duration::from_secs(90),
            }
        }
    }
}

/// Every measure: the task figures 3 times each, the echo series until stable.
fn measure(
    plan: &Plan,
    server_cpu: usize,
    client_cpu: usize,
) -> anyhow::Result<(f64, PerMeasure<Vec<f64>>, bool)> {
    let bpt = bytes_per_task(plan.park_n)?;
    let mut task_s = Vec::new();
    let mut thread_s = Vec::new();
    let mut spawn_s = Vec::new();
    for _ in 0..3 {
        task_s.push(task_switch_ns(plan.switch_n)?);
        thread_s.push(thread_switch_ns(plan.thread_n, server_cpu)?);
        spawn_s.push(spawn_join_ns(plan.spawn_n)?);
    }
    let echo = echo_series(server_cpu, client_cpu, plan.echo_dur, plan.echo_cap)?;
    let samples = PerMeasure {
        task_switch_ns: task_s,
        thread_switch_ns: thread_s,
        spawn_join_ns: spawn_s,
        echo_msgs_per_s_iolab: echo.iolab,
        echo_msgs_per_s_tokio: echo.tokio,
    };
    Ok((bpt, samples, echo.stable))
}

fn table(
    f: &Fields,
    driver: iolab_runtime::Driver,
    plan: &Plan,
    machine: &crate::machine::Machine,
) -> Table {
    let spread = &f.spread_pct;
    let mut t = Table::new(
        format!("iolab-runtime ({driver} driver), medians of 3 runs (echo: of the last 3)"),
        &["measure", "value", "unit", "spread", "target"],
    );
    #[rustfmt::skip]
    let rows: [(&str, f64, &str, TableCell, &str); 8] = [
        ("task switch (2 tasks, channel ping-pong)", f.task_switch_ns, "ns", pct(spread.task_switch_ns.0), ""),
        ("thread switch (2 threads, futex, same CPU)", f.thread_switch_ns, "ns", pct(spread.thread_switch_ns.0), ""),
        ("switch ratio thread/task", f.switch_ratio, "x", "".into(), ">= 50"),
        ("spawn + join one task", f.spawn_join_ns, "ns", pct(spread.spawn_join_ns.0), ""),
        ("memory per parked task (RSS growth / tasks)", f.bytes_per_task, "bytes", "".into(), "<= 256"),
        ("echo, iolab server", f.echo_msgs_per_s_iolab, "msg/s", pct(spread.echo_msgs_per_s_iolab.0), ""),
        ("echo, tokio server", f.echo_msgs_per_s_tokio, "msg/s", pct(spread.echo_msgs_per_s_tokio.0), ""),
        ("echo ratio iolab/tokio", f.echo_ratio, "x", "".into(), ">= 1.3 on io_uring"),
    ];
    for (measure, value, unit, spread, target) in rows {
        t.row(vec![
            measure.into(),
            Num(value).into(),
            unit.into(),
            spread,
            target.into(),
        ]);
    }
    t.with_note(format!(
        "echo: {CONNS} connections, {MSG}-byte messages, one message in flight per connection, \
         server pinned to CPU {}, client (iolab loop) to CPU {}, {:?} per run, \
         {} runs of each server alternately until the last {ECHO_WINDOW} agree within {ECHO_STABLE_PCT}% ({}; cap {:?}); \
         spread = (max - min) / median of the repeats; {}",
        f.server_cpu,
        f.client_cpu,
        plan.echo_dur,
        f.echo_runs,
        if f.echo_stable { "reached" } else { "NOT reached: the machine is too noisy, compare the ratio" },
        plan.echo_cap,
        machine.summary()
    ))
}

pub fn run(opts: &crate::Opts) -> anyhow::Result<Report<Fields>> {
    let machine = crate::machine::Machine::collect();
    let t_start = Instant::now();
    osutil::raise_nofile(4096);
    let driver = iolab_runtime::driver()?;
    let cpus = osutil::allowed_cpus();
    let (server_cpu, client_cpu) = (cpus[0], *cpus.get(1).unwrap_or(&cpus[0]));
    let plan = Plan::new(opts.quick);
    let (bpt, samples, echo_stable) = measure(&plan, server_cpu, client_cpu)?;
    let s = &samples;
    let (io_s, tk_s) = (&s.echo_msgs_per_s_iolab, &s.echo_msgs_per_s_tokio);
    // The echo figures are the medians of the final window: the runs that agree.
    let io_window = EchoSeries::window(io_s);
    let tk_window = EchoSeries::window(tk_s);
    let (task, thread) = (middle(&s.task_switch_ns), middle(&s.thread_switch_ns));
    let (io, tk) = (middle(io_window), middle(tk_window));
    let fields = Fields {
        driver: driver.name(),
        task_switch_ns: task,
        thread_switch_ns: thread,
        switch_ratio: thread / task,
        spawn_join_ns: middle(&s.spawn_join_ns),
        bytes_per_task: bpt,
        echo_msgs_per_s_iolab: io,
        echo_msgs_per_s_tokio: tk,
        echo_ratio: io / tk,
        echo_connections: CONNS,
        echo_message_bytes: MSG,
        echo_seconds_per_run: plan.echo_dur.as_secs_f64(),
        echo_runs: io_s.len(),
        echo_stable,
        echo_stable_pct: ECHO_STABLE_PCT,
        echo_window: ECHO_WINDOW,
        spread_pct: PerMeasure {
            task_switch_ns: Spread(spread(&s.task_switch_ns)),
            thread_switch_ns: Spread(spread(&s.thread_switch_ns)),
            spawn_join_ns: Spread(spread(&s.spawn_join_ns)),
            echo_msgs_per_s_iolab: Spread(spread(io_window)),
            echo_msgs_per_s_tokio: Spread(spread(tk_window)),
        },
        server_cpu,
        client_cpu,
        quick: opts.quick,
        samples,
    };
    let t = table(&fields, driver, &plan, &machine);
    t.print();
    tracing::info!(target: "progress", "(took {:.1} s)", t_start.elapsed().as_secs_f64());
    Ok(Report {
        machine,
        fields,
        tables: vec![t],
        figures: vec![],
    })
}
