//! `iolab micro echo` — an echo server in each I/O model under growing client counts
//! (seed 003: the five Winsock models; here their Linux analogues).
//!
//! Models: `threads` (one blocking thread per connection, as the seed's blocking model),
//! `select` (FD_SETSIZE bound: a connection whose fd is ≥ 1024 is refused), `poll`, `epoll`
//! (level-triggered), `io_uring` (accept, recv and send completions) and `iolab-runtime`
//! (one task per connection on one runtime loop: threaded-style code on lightweight tasks),
//! and the same task-per-connection server on the runtimes users would pick instead
//! (`tokio`, `monoio`, `glommio`: [`crate::echo::peers`]). Each server runs in this process, pinned to the
//! first CPU; one client thread pinned to the second CPU holds N connections (10 … 10,000),
//! each continuously sending a message (100 B or 1 KB) and waiting for its echo (one message
//! in flight per connection). Per point: connections held (those that got echoes; a model
//! that cannot hold N stops there and larger N are skipped), messages per second, round trip
//! p50/p99, server CPU (the server threads' run time from /proc/self/task/TID/schedstat over
//! the measured window), messages per CPU-second of the server (messages / that run time) and the growth of the process's RSS (VmRSS) while the server runs.
//! Client sockets are moved to fds ≥ 1024 so that the select server gets the low ones.
//!
//! JSON fields: `"clients"`, `"sizes"`, `"window_ms"`, `"nofile"` (the fd limit in force),
//! `"points"`: `[{model, clients, bytes, held, msgs_per_s, msgs_per_cpu_s, p50_us, p99_us,
//! server_cpu_pct, rss_growth_kib, refused, status}]`, `"max_held"`: {model: most connections held},
//! `"runtime_status"` (the runtime's driver), `"tables"`, `"figures"`.

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

mod clients;
mod fd;
mod peers;
mod servers;

use crate::osutil;
use crate::table::{Cell, Figure, Num, Report, RoundedPoints, Table};
use clients::Clients;
use servers::start;

pub(crate) const BUF: usize = 2048;
/// Client sockets are duplicated to fds at or above this, leaving the low ones to servers.
const CLIENT_FD_BASE: RawFd = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    Threads,
    Select,
    Poll,
    Epoll,
    Uring,
    Runtime,
    Tokio,
    Monoio,
    Glommio,
}

/// Every model, in the order of the table.
pub const MODELS: [Model; 9] = [
    Model::Threads,
    Model::Select,
    Model::Poll,
    Model::Epoll,
    Model::Uring,
    Model::Runtime,
    Model::Tokio,
    Model::Monoio,
    Model::Glommio,
];

impl Model {
    pub fn name(self) -> &'static str {
        match self {
            Model::Threads => "threads",
            Model::Select => "select",
            Model::Poll => "poll",
            Model::Epoll => "epoll",
            Model::Uring => "io_uring",
            Model::Runtime => "iolab-runtime",
            Model::Tokio => "tokio",
            Model::Monoio => "monoio",
            Model::Glommio => "glommio",
        }
    }
}

/// Shared between a server and the harness.
#[derive(Default)]
pub(crate) struct Ctl {
    stop: AtomicBool,
    tids: Mutex<Vec<i32>>,
    pub(crate) refused: AtomicU64,
}

impl Ctl {
    fn register(&self) {
        self.tids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(osutil::gettid());
    }
    /// Sum of the run time (ns) of the registered server threads.
    fn cpu_ns(&self) -> u64 {
        let tids = self.tids.lock().unwrap_or_else(|e| e.into_inner()).clone();
        tids.iter()
            .filter_map(|t| std::fs::read_to_string(format!("/proc/self/task/{t}/schedstat")).ok())
            .filter_map(|s| {
                s.split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .sum()
    }
    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Clone, Default)]
struct PointResult {
    held: usize,
    msgs_per_s: f64,
    /// Messages per second of server run time (msgs_per_s / (cpu_pct / 100)).
    msgs_per_cpu_s: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_pct: f64,
    rss_growth_kib: i64,
    refused: u64,
    status: String,
}

fn run_point(
    model: Model,
    clients: usize,
    size: usize,
    window: Duration,
    warm_max: Duration,
    cpus: (usize, usize),
) -> anyhow::Result<PointResult> {
    let rss0 = osutil::rss_kib() as i64;
    let server = start(model, cpus.0)?;
    let ctl = server.ctl.clone();
    let addr = server.addr;
    let client = std::thread::Builder::new()
        .name("echo-client".into())
        .spawn(move || -> anyhow::Result<PointResult> {
            let _ = osutil::pin_to(cpus.1);
            let (mut c, status) = Clients::connect(addr, clients, size)?;
            let mut r = PointResult {
                status,
                ..Default::default()
            };
            // Warm-up: until every live connection has had one echo (or warm_max).
            c.drive(Instant::now() + warm_max, None, true);
            let mut rtts: Vec<u64> = Vec::new();
            let cpu0 = ctl.cpu_ns();
            let t0 = Instant::now();
            let echoes = c.drive(t0 + window, Some(&mut rtts), false);
            let secs = t0.elapsed().as_secs_f64();
            let cpu1 = ctl.cpu_ns();
            r.rss_growth_kib = osutil::rss_kib() as i64 - rss0;
            r.held = c.held();
            r.msgs_per_s = echoes as f64 / secs;
            let cpu_ns = cpu1.saturating_sub(cpu0);
            r.cpu_pct = 100.0 * cpu_ns as f64 / (secs * 1e9);
            if cpu_ns > 0 {
                r.msgs_per_cpu_s = echoes as f64 / (cpu_ns as f64 / 1e9);
            }
            if let Some(s) = crate::stats::Summary::of(&mut rtts) {
                r.p50_us = s.p50 as f64 / 1000.0;
                r.p99_us = s.p99 as f64 / 1000.0;
            }
            c.reset();
            Ok(r)
        })?;
    let res = client
        .join()
        .map_err(|_| anyhow::anyhow!("echo client panicked"));
    server.ctl.stop.store(true, Ordering::SeqCst);
    let served = server
        .join
        .join()
        .map_err(|_| anyhow::anyhow!("echo server panicked"))?;
    let mut r = res??;
    served.with_context(|| format!("{} server", model.name()))?;
    r.refused = server.ctl.refused.load(Ordering::Relaxed);
    if r.status.is_empty() {
        r.status = if r.held < clients {
            format!("held {} of {clients}", r.held)
        } else {
            "ok".into()
        };
    }
    Ok(r)
}

/// Which driver the iolab-runtime model runs on.
fn runtime_status() -> String {
    match iolab_runtime::driver() {
        Ok(d) => format!("ok ({d:?} driver, one loop)"),
        Err(e) => format!("unavailable: {e}"),
    }
}

/// One (model, clients, message size) point: a row of `"points"` and of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    model: &'static str,
    /// Connections attempted.
    clients: usize,
    bytes: usize,
    /// Connections still echoing at the end; null when the point was skipped.
    held: Option<usize>,
    /// Absent when the point was skipped.
    #[serde(flatten)]
    measured: Option<Measured>,
    status: String,
}

/// What a point that ran measured.
#[derive(Debug, Clone, Serialize)]
struct Measured {
    msgs_per_s: Num,
    msgs_per_cpu_s: Num,
    p50_us: Num,
    p99_us: Num,
    server_cpu_pct: Num,
    rss_growth_kib: i64,
    refused: u64,
}

impl Point {
    fn skipped(model: Model, clients: usize, bytes: usize, status: String) -> Point {
        Point {
            model: model.name(),
            clients,
            bytes,
            held: None,
            measured: None,
            status,
        }
    }

    fn measured(model: Model, clients: usize, bytes: usize, r: PointResult) -> Point {
        Point {
            model: model.name(),
            clients,
            bytes,
            held: Some(r.held),
            measured: Some(Measured {
                msgs_per_s: Num(r.msgs_per_s),
                msgs_per_cpu_s: Num(r.msgs_per_cpu_s),
                p50_us: Num(r.p50_us),
                p99_us: Num(r.p99_us),
                server_cpu_pct: Num(r.cpu_pct),
                rss_growth_kib: r.rss_growth_kib,
                refused: r.refused,
            }),
            status: r.status,
        }
    }

    /// The table's row (RSS growth in MiB).
    fn cells(&self) -> Vec<Cell> {
        let m = self.measured.as_ref();
        vec![
            self.model.into(),
            self.clients.into(),
            self.bytes.into(),
            self.held.into(),
            m.map(|m| m.msgs_per_s).into(),
            m.map(|m| m.msgs_per_cpu_s).into(),
            m.map(|m| m.p50_us).into(),
            m.map(|m| m.p99_us).into(),
            m.map(|m| m.server_cpu_pct).into(),
            m.map(|m| Num(m.rss_growth_kib as f64 / 1024.0)).into(),
            self.status.as_str().into(),
        ]
    }
}

/// The JSON fields of `iolab micro echo` (besides machine, tables and figures).
#[derive(Debug, Clone, Serialize)]
pub struct Fields {
    clients: Vec<usize>,
    sizes: Vec<usize>,
    window_ms: u64,
    /// The fd limit in force.
    nofile: u64,
    points: Vec<Point>,
    /// Most connections each model held.
    max_held: BTreeMap<&'static str, u64>,
    runtime_status: String,
}

/// What a run measures: client counts, message sizes, the measured window per point and
/// the bound on its warm-up.
struct Plan {
    clients: Vec<usize>,
    sizes: Vec<usize>,
    window: Duration,
    warm: Duration,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                clients: vec![10, 1000],
                sizes: vec![100],
                window: Duration::from_millis(500),
                warm: Duration::from_secs(3),
            }
        } else {
            Plan {
                clients: vec![10, 100, 1000, 10_000],
                sizes: vec![100, 1024],
                window: Duration::from_millis(1500),
                warm: Duration::from_secs(8),
            }
        }
    }
}

/// The two figures of one message size: throughput and p99 against clients.
struct SizeFigures {
    throughput: Figure,
    p99: Figure,
}

impl SizeFigures {
    fn new(size: usize) -> SizeFigures {
        let mut throughput = Figure::new(
            format!("Echo throughput, {size}-byte messages"),
            "clients",
            "messages per second",
        );
        throughput.log_x = true;
        let mut p99 = Figure::new(
            format!("Echo round trip p99, {size}-byte messages"),
            "clients",
            "p99 round trip (µs)",
        );
        p99.log_x = true;
        p99.log_y = true;
        SizeFigures { throughput, p99 }
    }
}

/// Every client count of the plan for `model` with `size`-byte messages; the counts past
/// one the model could not hold are skipped.
fn run_model(
    model: Model,
    size: usize,
    plan: &Plan,
    nofile: u64,
    pair: (usize, usize),
    figs: &mut SizeFigures,
) -> Vec<Point> {
    let mut points = Vec::new();
    let mut failed_at: Option<usize> = None;
    for &asked in &plan.clients {
        if let Some(prev) = failed_at {
            let status = format!("skipped: could not hold {prev}");
            points.push(Point::skipped(model, asked, size, status));
            continue;
        }
        // Client and server ends both live in this process: 2 fds per connection.
        // Past the fd limit, run the largest count that fits and say so.
        let fit = (nofile.saturating_sub(256) / 2) as usize;
        let n = asked.min(fit);
        let mut r = run_point(model, n, size, plan.window, plan.warm, pair).unwrap_or_else(|e| {
            PointResult {
                status: format!("failed: {e:#}"),
                ..Default::default()
            }
        });
        tracing::debug!("echo {} {n} {size}: {r:?}", model.name());
        if n < asked && r.status == "ok" {
            r.status =
                format!("ok; {n} clients, not {asked}: ulimit -n {nofile} (2 fds per connection)");
        }
        if r.held < n {
            failed_at = Some(asked);
        }
        if r.held > 0 {
            figs.throughput
                .point_rounded(model.name(), n as f64, r.msgs_per_s);
            figs.p99.point_rounded(model.name(), n as f64, r.p99_us);
        }
        points.push(Point::measured(model, n, size, r));
    }
    points
}

pub fn run(opts: &crate::Opts) -> anyhow::Result<Report<Fields>> {
    let machine = crate::machine::Machine::collect();
    let nofile = osutil::raise_nofile(65536);
    let cpus = osutil::allowed_cpus();
    let pair = (cpus[0], *cpus.get(1).unwrap_or(&cpus[0]));
    let plan = Plan::new(opts.quick);
    let mut points = Vec::new();
    let mut figures: Vec<Figure> = Vec::new();
    for &size in &plan.sizes {
        let mut figs = SizeFigures::new(size);
        for model in MODELS {
            points.extend(run_model(model, size, &plan, nofile, pair, &mut figs));
        }
        figures.push(figs.throughput);
        figures.push(figs.p99);
    }
    let mut max_held: BTreeMap<&'static str, u64> = BTreeMap::new();
    for p in &points {
        if let Some(held) = p.held {
            let most = max_held.entry(p.model).or_insert(0);
            *most = (*most).max(held as u64);
        }
    }
    let rt = runtime_status();
    let mut table = Table::new(
        "Echo server by I/O model (seed 003)",
        &[
            "model",
            "clients",
            "bytes",
            "held",
            "msgs/s",
            "msgs per CPU-s",
            "p50 µs",
            "p99 µs",
            "server CPU %",
            "RSS growth MiB",
            "status",
        ],
    );
    for p in &points {
        table.row(p.cells());
    }
    let table = table.with_note(format!(
        "Server pinned to CPU {}, one client thread pinned to CPU {}; each connection keeps one message in flight; {} ms measured after a warm-up in which every connection gets one echo. \
         clients = connections attempted (capped so that 2 per connection fit under ulimit -n); held = connections still echoing at the end (select refuses fds ≥ FD_SETSIZE = 1024; a model that cannot hold N is not tried with more). \
         iolab-runtime: {rt}. server CPU % = run time of the server's threads (schedstat) / window; msgs per CPU-s = messages / that run time; tokio: current-thread runtime; monoio: io_uring driver, 32768-entry ring; glommio: LocalExecutor defaults; RSS growth = VmRSS of the process during the point minus before (includes the client's small per-connection state, the same for every model). ulimit -n in force: {nofile}.",
        pair.0, pair.1, plan.window.as_millis()
    ));
    table.print();
    Ok(Report {
        machine,
        fields: Fields {
            window_ms: plan.window.as_millis() as u64,
            clients: plan.clients,
            sizes: plan.sizes,
            nofile,
            points,
            max_held,
            runtime_status: rt,
        },
        tables: vec![table],
        figures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(p: &Point) -> Vec<String> {
        let v = serde_json::to_value(p).unwrap();
        v.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn a_skipped_point_has_no_figures_and_a_null_held() {
        let p = Point::skipped(
            Model::Select,
            1000,
            100,
            "skipped: could not hold 100".into(),
        );
        assert_eq!(keys(&p), ["bytes", "clients", "held", "model", "status"]);
        let v = serde_json::to_value(&p).unwrap();
        assert!(v["held"].is_null());
        assert_eq!(v["model"], "select");
        let cells = p.cells();
        assert_eq!(cells.len(), 11);
        assert_eq!(cells[3..10], vec![Cell::Empty; 7]);
        let failed = PointResult {
            status: "failed: x".into(),
            ..Default::default()
        };
        let p = Point::measured(Model::Uring, 10, 100, failed);
        assert_eq!(
            keys(&p),
            [
                "bytes",
                "clients",
                "held",
                "model",
                "msgs_per_cpu_s",
                "msgs_per_s",
                "p50_us",
                "p99_us",
                "refused",
                "rss_growth_kib",
                "server_cpu_pct",
                "status"
            ]
        );
        assert_eq!(serde_json::to_value(&p).unwrap()["held"], 0);
    }

    #[test]
    fn every_model_echoes() {
        let cpus = osutil::allowed_cpus();
        let pair = (cpus[0], *cpus.get(1).unwrap_or(&cpus[0]));
        for model in MODELS {
            let r = run_point(
                model,
                4,
                100,
                Duration::from_millis(100),
                Duration::from_secs(5),
                pair,
            );
            match r {
                Ok(r) => {
                    assert_eq!(r.held, 4, "{}: {r:?}", model.name());
                    // Messages per CPU-second are the rate over the server's CPU share,
                    // which may pass 100% (a loaded machine's runtime with its helper
                    // threads read 100.3%): consistent, not larger than the rate.
                    let per_cpu = r.msgs_per_s / (r.cpu_pct / 100.0);
                    assert!(
                        r.msgs_per_s > 0.0
                            && r.p99_us > 0.0
                            && (r.msgs_per_cpu_s - per_cpu).abs() <= 0.01 * per_cpu,
                        "{}: {r:?}",
                        model.name()
                    );
                }
                Err(e) if model == Model::Uring && format!("{e:#}").contains("io_uring setup") => {}
                Err(e) => panic!("{}: {e:#}", model.name()),
            }
        }
    }
}
