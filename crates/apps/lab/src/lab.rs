//! The experiment: every server through the matrix, then the report.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use iolab_load::{ErrorKind, LoadConfig, LoadReport, RequestRecord};
use rand::seq::SliceRandom;

use crate::results::{Metrics, Point, Repeat, Results, TargetInfo, Trace, SCHEMA};
use crate::server::{Kind, Launch, ServerProc, Target};
use crate::steady::{self, Analysis};

/// How much a run measures (the CLI's `--profile` lists what each does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Tiny,
    Quick,
    Full,
}

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Tiny => "tiny",
            Profile::Quick => "quick",
            Profile::Full => "full",
        }
    }
}

/// The size of the small file, as the seed's small HTML page.
pub const SMALL_BYTES: usize = 300;
/// The seed's large file: 700 KB.
pub const BIG_BYTES: usize = 700 * 1024;

#[derive(Debug, Clone)]
pub struct Options {
    pub profile: Profile,
    pub models: Vec<String>,
    pub peers: Vec<String>,
    pub out: PathBuf,
    pub repeat: Option<usize>,
    /// Micro names to run (empty = none).
    pub micro: Vec<String>,
    pub workers: usize,
    pub backlog: u32,
    /// Whole-run time budget (quick); None = the profile's.
    pub budget: Option<Duration>,
    pub command: String,
    /// Measure server CPU time per request at a fixed offered rate (see [`crate::efficiency`]).
    pub efficiency: bool,
    /// The offered rate of the efficiency pass (requests/s, both modes); None = half the
    /// slowest server's peak in this run.
    pub efficiency_rate: Option<f64>,
    /// Run the server behind a shaped link instead of loopback (`--link`).
    pub link: Option<crate::link::LinkSpec>,
    /// `--seed-conditions`: the seed's method (new connection per request only).
    pub seed_conditions: bool,
}

/// The matrix of a profile.
#[derive(Debug, Clone)]
pub struct Plan {
    pub levels: Vec<usize>,
    pub ka_levels: Vec<usize>,
    pub repeats: usize,
    /// Requests per point when fixed (tiny, full); None = from the time budget (quick).
    pub small_requests: Option<u64>,
    pub big_requests: Option<u64>,
    pub budget: Option<Duration>,
    pub timeout: Duration,
    pub log_all: bool,
    pub warmup: (u64, u64),
    /// Each keep-alive point runs this long (wrk-style, by duration, not by count)...
    pub ka_duration: Duration,
    /// ...this many times back to back per server start (the spread is over these).
    pub ka_repeats: usize,
}

impl Plan {
    pub fn for_profile(p: Profile) -> Plan {
        let seed_levels = vec![1, 10, 50, 100, 200, 500, 1000];
        match p {
            Profile::Tiny => Plan {
                levels: vec![1, 10, 50],
                ka_levels: vec![10],
                repeats: 1,
                small_requests: Some(300),
                big_requests: Some(150),
                budget: None,
                timeout: Duration::from_secs(3),
                log_all: false,
                warmup: (50, 10),
                ka_duration: Duration::from_millis(500),
                ka_repeats: 2,
            },
            Profile::Quick => Plan {
                levels: seed_levels,
                ka_levels: vec![100],
                repeats: 1,
                small_requests: None,
                big_requests: None,
                budget: Some(Duration::from_secs(600)),
                timeout: Duration::from_secs(5),
                log_all: false,
                warmup: (300, 40),
                ka_duration: Duration::from_secs(3),
                ka_repeats: 3,
            },
            Profile::Full => Plan {
                levels: seed_levels,
                ka_levels: vec![10, 100, 1000],
                repeats: 3,
                small_requests: Some(50_000),
                big_requests: Some(50_000),
                budget: None,
                timeout: Duration::from_secs(10),
                log_all: true,
                warmup: (2000, 200),
                ka_duration: Duration::from_secs(10),
                ka_repeats: 1,
            },
        }
    }

    /// (file, mode, concurrency) in the order they are run for one server.
    pub fn points(&self) -> Vec<(&'static str, &'static str, usize)> {
        let mut v = Vec::new();
        for file in ["small", "big"] {
            for &c in &self.levels {
                v.push((file, "close", c));
            }
        }
        for &c in &self.ka_levels {
            v.push(("small", "keepalive", c));
        }
        v
    }
}

/// Requests for a point of `point_s` seconds at an estimated `rps`: enough to pass the
/// ramp-up at concurrency `c` (2c + 100), at most 50,000 as the seed.
pub fn budget_requests(rps: f64, point_s: f64, c: usize) -> u64 {
    let min = 2 * c as u64 + 100;
    let est = if rps.is_finite() && rps > 0.0 {
        (rps * point_s * 0.8) as u64
    } else {
        min
    };
    est.clamp(min, 50_000)
}

/// Progress lines on stderr with an ETA.
struct Progress {
    /// The start of the whole run (shown) and of the points (for the ETA).
    t0: Instant,
    points0: Instant,
    done: usize,
    total: usize,
    deadline: Option<Instant>,
}

impl Progress {
    fn line(&self, msg: &str) {
        let el = self.t0.elapsed().as_secs_f64();
        let eta = if self.done > 0 && self.done < self.total {
            let per = self.points0.elapsed().as_secs_f64() / self.done as f64;
            let mut left = per * (self.total - self.done) as f64;
            if let Some(d) = self.deadline {
                left = left.min(d.saturating_duration_since(Instant::now()).as_secs_f64());
            }
            format!(" ETA {}", hms(left))
        } else {
            String::new()
        };
        tracing::info!(target: "progress", "[{:>3}/{} {}{eta}] {msg}", self.done, self.total, hms(el));
    }
}

pub fn hms(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// Samples a server's open connections at 20 Hz until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<Vec<(u64, u64)>>>,
}

impl Sampler {
    fn start(stats_path: Option<&Path>, base: Instant) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let reader = stats_path.and_then(|p| iolab_stats::StatsReader::open(p).ok());
        let handle = reader.map(|reader| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut v = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    v.push((base.elapsed().as_micros() as u64, reader.snapshot().open));
                    std::thread::sleep(Duration::from_millis(50));
                }
                v.push((base.elapsed().as_micros() as u64, reader.snapshot().open));
                v
            })
        });
        Sampler { stop, handle }
    }

    fn finish(mut self) -> Option<Vec<(u64, u64)>> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().and_then(|h| h.join().ok())
    }
}

/// Lets the server finish with the previous point's connections (abandoned ones included)
/// before the next point starts: waits, up to 1 s, for its open connections to reach zero.
fn settle(srv: &ServerProc) {
    let reader = srv
        .stats_path
        .as_deref()
        .and_then(|p| iolab_stats::StatsReader::open(p).ok());
    let Some(reader) = reader else {
        std::thread::sleep(Duration::from_millis(100));
        return;
    };
    let t0 = Instant::now();
    while reader.snapshot().open > 0 && t0.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Allowed CPUs of this process.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity fills the zeroed set we own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

pub(crate) fn write_site(www: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(www).with_context(|| format!("creating {}", www.display()))?;
    let head = "<!DOCTYPE html>\n<html><head><title>iolab</title></head><body>\n<p>";
    let tail = "</p>\n</body></html>\n";
    let fill = SMALL_BYTES - head.len() - tail.len();
    let mut small = String::from(head);
    small.extend(std::iter::repeat_n('x', fill));
    small.push_str(tail);
    std::fs::write(www.join("small.html"), &small)?;
    // Deterministic, incompressible-looking bytes (nothing compresses them anyway).
    let mut big = vec![0u8; BIG_BYTES];
    let mut x: u32 = 0x9e37_79b9;
    for b in &mut big {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    std::fs::write(www.join("big.bin"), &big)?;
    Ok(())
}

fn file_path(file: &str) -> &'static str {
    if file == "big" {
        "/big.bin"
    } else {
        "/small.html"
    }
}

/// Every model target the lab knows, in report order: the models of `iolab models`, each
/// followed by its variants (`crate::server::MODEL_VARIANTS`).
pub fn target_names() -> Vec<String> {
    let mut v = Vec::new();
    for m in iolab_stats::models::names() {
        v.push(m.to_string());
        for (name, base, _) in crate::server::MODEL_VARIANTS {
            if base == m {
                v.push(name.to_string());
            }
        }
    }
    v
}

/// The servers to run, in report order.
pub fn targets(models: &[String], peers: &[String]) -> (Vec<Target>, Vec<TargetInfo>) {
    let mut t = Vec::new();
    let mut skipped = Vec::new();
    for name in target_names() {
        if models.contains(&name) {
            let (base, extra) = crate::server::model_args(&name);
            let Some(m) = iolab_stats::models::find(base) else {
                continue;
            };
            let seed = match (name.as_str(), extra) {
                ("uring-callback", _) => "CR-iocp, accept async".to_string(),
                (_, []) => m.seed.to_string(),
                _ if base == "uring-callback" => format!("CR, with {}", extra.join(" ")),
                _ => format!("{}, with {}", m.seed, extra.join(" ")),
            };
            t.push(Target {
                name: name.clone(),
                kind: Kind::Model(name.clone()),
                describe: format!("{} (seed: {seed})", m.what),
            });
        }
    }
    for p in peers {
        let (bin, describe) = match p.as_str() {
            "nginx" => ("nginx", "nginx (Debian), event loop per worker, sendfile"),
            "tokio" => (
                "iolab-tokio-server",
                "tokio + hyper, work-stealing async runtime",
            ),
            _ => continue,
        };
        match crate::server::find_binary(bin) {
            Some(path) => t.push(Target {
                name: p.clone(),
                kind: if p == "nginx" {
                    Kind::Nginx(path)
                } else {
                    Kind::Tokio(path)
                },
                describe: describe.into(),
            }),
            None => skipped.push(TargetInfo {
                name: p.clone(),
                kind: "peer".into(),
                describe: describe.into(),
                status: "skipped".into(),
                failures: vec![format!("{bin} not found next to iolab or on PATH")],
            }),
        }
    }
    (t, skipped)
}

fn error_name(k: ErrorKind) -> String {
    serde_json::to_value(k)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_else(|| format!("{k:?}"))
}

fn write_csv(path: &Path, records: &[RequestRecord], a: &Analysis) -> anyhow::Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = std::io::BufWriter::new(f);
    writeln!(w, "scheduled_us,start_us,connected_us,first_byte_us,end_us,status,bytes,error,conn_id,syn_retry,kept")?;
    let opt = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_default();
    for (i, r) in records.iter().enumerate() {
        writeln!(
            w,
            "{},{},{},{},{},{},{},{},{},{},{}",
            r.scheduled_us,
            r.start_us,
            opt(r.connected_us),
            opt(r.first_byte_us),
            r.end_us,
            r.status.map(|s| s.to_string()).unwrap_or_default(),
            r.bytes,
            r.error.map(error_name).unwrap_or_default(),
            r.conn_id,
            u8::from(steady::is_syn_retry(r)),
            u8::from(a.kept_mask.get(i).copied().unwrap_or(false)),
        )?;
    }
    w.flush()?;
    Ok(())
}

/// Figure 2's data from one run, bounded in size.
fn trace(records: &[RequestRecord], server: Option<&[(u64, u64)]>) -> Trace {
    const MAX_OK: usize = 2000;
    const MAX_ODD: usize = 1000;
    // 0.1 ms of time and 1 µs of latency are finer than the figures can show.
    let r4 = |x: f64| (x * 1e4).round() / 1e4;
    let class = |r: &RequestRecord| {
        if r.error.is_some() {
            2.0
        } else if steady::is_syn_retry(r) {
            1.0
        } else {
            0.0
        }
    };
    let point = |r: &RequestRecord| {
        [
            r4(r.end_us as f64 / 1e6),
            r.end_us.saturating_sub(r.start_us) as f64 / 1000.0,
            class(r),
        ]
    };
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| class(r) == 0.0).collect();
    let stride = ok.len().div_ceil(MAX_OK).max(1);
    let mut scatter: Vec<[f64; 3]> = ok.iter().step_by(stride).map(|r| point(r)).collect();
    scatter.extend(
        records
            .iter()
            .filter(|r| class(r) != 0.0)
            .take(MAX_ODD)
            .map(point),
    );
    let server = server
        .map(|s| {
            let stride = s.len().div_ceil(1000).max(1);
            s.iter()
                .step_by(stride)
                .map(|&(t, o)| [r4(t as f64 / 1e6), o as f64])
                .collect()
        })
        .unwrap_or_default();
    let client = steady::Timeline::from_records(records)
        .downsample(600)
        .into_iter()
        .map(|(t, l)| [r4(t), l])
        .collect();
    Trace {
        scatter,
        server,
        client,
    }
}

/// (target index, file, mode, concurrency).
type PointKey = (usize, &'static str, &'static str, usize);

/// Everything one point's run produced.
struct RunOut {
    repeat: Repeat,
    trace: Option<Trace>,
}

struct Ctx<'a> {
    opts: &'a Options,
    plan: &'a Plan,
    sources: Vec<std::net::IpAddr>,
    client_cpu: Option<usize>,
}

#[allow(clippy::too_many_arguments)]
fn run_point(
    cx: &Ctx,
    srv: &ServerProc,
    name: &str,
    file: &str,
    mode: &str,
    c: usize,
    requests: Option<u64>,
    cap: Duration,
    rep: usize,
    want_trace: bool,
) -> anyhow::Result<RunOut> {
    let mut cfg = LoadConfig::for_url(&format!("http://{}{}", srv.addr, file_path(file)))?;
    cfg.connections = c;
    cfg.requests = requests;
    cfg.duration = Some(cap);
    cfg.keepalive = mode == "keepalive";
    cfg.timeout = cx.plan.timeout;
    cfg.source_addrs = cx.sources.clone();
    cfg.pin_cpu = cx.client_cpu;
    cfg.keep_records = true;
    cfg.quiet = true;
    let base = Instant::now();
    let sampler = Sampler::start(srv.stats_path.as_deref(), base);
    let report: anyhow::Result<LoadReport> = iolab_load::run(&cfg);
    let samples = sampler.finish();
    let report = report?;
    let a = steady::analyse(
        &report.records,
        c,
        samples.as_deref(),
        steady::DEFAULT_TOLERANCE,
    );
    let mut by_kind = BTreeMap::new();
    for r in &report.records {
        if let Some(k) = r.error {
            *by_kind.entry(error_name(k)).or_insert(0u64) += 1;
        }
    }
    let log = if cx.plan.log_all || (mode == "close" && Some(&c) == cx.plan.levels.last()) {
        let rel = format!("logs/{name}_{file}_{mode}_c{c}_r{rep}.csv");
        write_csv(&cx.opts.out.join(&rel), &report.records, &a)?;
        Some(rel)
    } else {
        None
    };
    let n = c as f64;
    let sustained = a.steady
        && (a.errors as f64) <= 0.01 * a.requests.max(1) as f64
        && a.achieved_concurrency >= n * (1.0 - steady::DEFAULT_TOLERANCE)
        && a.kept as f64 >= 0.25 * a.ok as f64;
    let repeat = Repeat {
        repeat: rep,
        metrics: Metrics {
            mean_ms: a.mean_ms,
            p50_ms: a.p50_ms,
            p99_ms: a.p99_ms,
            rps: report.rps,
            errors: a.errors,
            syn_retries: a.syn_retries,
            achieved_concurrency: a.achieved_concurrency,
        },
        requests: a.requests,
        ok: a.ok,
        kept: a.kept,
        steady: a.steady,
        sustained,
        errors_by_kind: by_kind,
        server_concurrency_mean: a.server_concurrency_mean,
        server_concurrency_max: a.server_concurrency_max,
        elapsed_s: report.elapsed_s,
        client_cpu_s: report.client_cpu_s,
        log,
    };
    let trace = want_trace.then(|| trace(&report.records, samples.as_deref()));
    Ok(RunOut { repeat, trace })
}

/// Runs the whole lab and writes the report. Returns the results.
pub fn run(opts: &Options) -> anyhow::Result<Results> {
    let t0 = Instant::now();
    let mut plan = Plan::for_profile(opts.profile);
    if let Some(r) = opts.repeat {
        plan.repeats = r.max(1);
    }
    if opts.seed_conditions {
        // The seed measured a new connection per request only.
        plan.ka_levels.clear();
        if plan.budget.is_some() {
            plan.budget = Some(Duration::from_secs(crate::link::SEED_QUICK_BUDGET_S));
        }
    }
    if opts.budget.is_some() {
        plan.budget = opts.budget;
    }
    let out = &opts.out;
    std::fs::create_dir_all(out.join("logs"))
        .with_context(|| format!("creating {}", out.display()))?;
    let www = out.join("www");
    write_site(&www)?;
    let run_dir = out.join("run");
    crate::server::install_signal_handler()?;
    let link = match &opts.link {
        Some(spec) => {
            let mut l = crate::link::Link::create(spec, opts.backlog)?;
            l.info.seed_conditions = opts.seed_conditions;
            l.measure()?;
            tracing::info!(target: "progress", "iolab lab: {}", l.describe());
            Some(l)
        }
        None => None,
    };

    let (nofile_before, nofile_after) = iolab_sys::raise_nofile_limit().unwrap_or((0, 0));
    let machine = iolab_sys::host::Machine::collect();
    let cpus = allowed_cpus();
    let (server_cpu, client_cpu) = if cpus.len() >= 2 {
        (Some(cpus[0]), Some(cpus[1]))
    } else {
        (None, None)
    };
    let sources = match &link {
        Some(l) => l.client_ips.clone(),
        None => crate::settings::source_addrs(8),
    };
    let server_ip: std::net::IpAddr = match &link {
        Some(l) => l.server_ip,
        None => [127, 0, 0, 1].into(),
    };
    let max_c = plan
        .levels
        .iter()
        .chain(&plan.ka_levels)
        .copied()
        .max()
        .unwrap_or(1);
    let demand = crate::settings::Demand {
        max_concurrency: max_c,
        backlog: opts.backlog,
        max_requests_per_point: plan.small_requests.unwrap_or(50_000),
        source_addrs: sources.len(),
    };
    let (mut settings, warnings) =
        crate::settings::assess(&machine, &demand, (server_cpu, client_cpu));
    // The lab runs every model with `iolab serve`'s default buffers (the same for all).
    settings.insert(
        "read buffer, every model".into(),
        format!("{} B", iolab_stats::models::DEFAULT_READ_BUF),
    );
    settings.insert(
        "iovecs per send, every model".into(),
        iolab_stats::models::DEFAULT_MAX_IOV.to_string(),
    );
    if nofile_after != nofile_before {
        settings.insert(
            "ulimit -n".into(),
            format!("{nofile_after} (raised by the lab from {nofile_before})"),
        );
    }
    for w in &warnings {
        tracing::warn!("{w}");
    }

    let (targets, skipped) = targets(&opts.models, &opts.peers);
    for s in &skipped {
        tracing::warn!("peer {} skipped: {}", s.name, s.failures.join("; "));
    }
    let points = plan.points();
    let total = targets.len() * points.len() * plan.repeats;
    let micro_est = if opts.micro.is_empty() {
        0.0
    } else if opts.profile == Profile::Full {
        600.0
    } else {
        150.0
    };
    let est = match plan.budget {
        Some(b) => format!(
            "at most {} (time budget; requests per point sized to fit)",
            hms(b.as_secs_f64())
        ),
        None => {
            let reqs: f64 = points
                .iter()
                .map(|p| {
                    (if p.0 == "big" {
                        plan.big_requests
                    } else {
                        plan.small_requests
                    })
                    .unwrap_or(1000) as f64
                })
                .sum();
            // A pessimistic 3,000 requests/s on a shared 2-core machine.
            hms(micro_est
                + reqs * (targets.len() * plan.repeats) as f64 / 3000.0
                + 2.0 * targets.len() as f64)
        }
    };
    tracing::info!(target: "progress",
        "iolab lab --profile {}: {} servers x {} points x {} repeat(s) = {total} runs, {} micro(s); estimate {est}; output in {}",
        opts.profile.name(),
        targets.len(),
        points.len(),
        plan.repeats,
        opts.micro.len(),
        out.display()
    );

    let mut results = Results {
        schema: SCHEMA.into(),
        profile: opts.profile.name().into(),
        command: opts.command.clone(),
        started_unix: machine.collected_at_unix,
        machine: serde_json::to_value(&machine)?,
        settings,
        warnings,
        ..Results::default()
    };

    // Micros first, alone on the machine; the lab then sizes its points to the time left.
    // With a budget, the micros share at most 35% of it (they take under a minute when
    // healthy; the limit only stops a stuck one from eating the servers' time).
    let micro_end = plan.budget.map(|b| t0 + b.mul_f64(0.35));
    for name in &opts.micro {
        let limit = micro_end
            .map(|e| e.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_secs(1800))
            .max(Duration::from_secs(10));
        tracing::info!(target: "progress", "micro {name} (limit {})", hms(limit.as_secs_f64()));
        match crate::micro::run_one(name, &opts.out, opts.profile != Profile::Full, limit) {
            Ok(v) => {
                results.micro.insert(name.clone(), v);
            }
            Err(e) => {
                tracing::warn!("micro {name} failed: {e:#}");
                results
                    .micro_failures
                    .insert(name.clone(), format!("{e:#}"));
            }
        }
    }

    let mut infos: Vec<TargetInfo> = targets
        .iter()
        .map(|t| TargetInfo {
            name: t.name.clone(),
            kind: if t.is_peer() { "peer" } else { "model" }.into(),
            describe: t.describe.clone(),
            status: "ok".into(),
            failures: Vec::new(),
        })
        .collect();
    let cx = Ctx {
        opts,
        plan: &plan,
        sources: sources.clone(),
        client_cpu,
    };
    let iolab = std::env::current_exe().context("finding the iolab executable")?;
    // (target index, file, mode, c) -> repeats, and the first repeat's trace.
    let mut runs: BTreeMap<PointKey, (Vec<Repeat>, Option<Trace>)> = BTreeMap::new();
    // Reserve for writing the report and shutting servers down.
    // ... and for the efficiency pass after the matrix.
    let (eff_duration, eff_repeats) = crate::efficiency::plan_for(opts.profile.name());
    let eff_reserve = if opts.efficiency {
        targets.len() as f64
            * (2.0 * eff_repeats as f64 * (eff_duration.as_secs_f64() + 0.15) + 1.5)
    } else {
        0.0
    };
    let deadline = plan.budget.map(|b| {
        t0 + b.saturating_sub(Duration::from_secs(40) + Duration::from_secs_f64(eff_reserve))
    });
    let make_launch = |t: &Target| -> anyhow::Result<Launch> {
        let addr = SocketAddr::new(server_ip, crate::server::free_port()?);
        Ok(Launch {
            iolab: iolab.clone(),
            www: www.clone(),
            run_dir: run_dir.join(&t.name),
            addr,
            workers: if t.is_peer() {
                opts.workers.max(1)
            } else {
                opts.workers
            },
            backlog: opts.backlog,
            cpu: server_cpu,
            cpus: Vec::new(),
            netns: link.as_ref().map(|l| l.ns.clone()),
        })
    };
    let mut prog = Progress {
        t0,
        points0: Instant::now(),
        done: 0,
        total,
        deadline,
    };
    let mut rng = rand::rng();
    for rep in 0..plan.repeats {
        let mut order: Vec<usize> = (0..targets.len()).collect();
        if plan.repeats > 1 {
            order.shuffle(&mut rng);
        }
        for (k, &ti) in order.iter().enumerate() {
            let t = &targets[ti];
            let target_start = Instant::now();
            // This server's share of the time left (quick).
            let share = deadline.map(|d| {
                let left_runs = (plan.repeats - rep) * targets.len() - k;
                d.saturating_duration_since(Instant::now()).as_secs_f64() / left_runs.max(1) as f64
            });
            let launch = make_launch(t)?;
            let mut srv = match ServerProc::start(t, &launch) {
                Ok(s) => s,
                Err(e) => {
                    let msg = format!("repeat {rep}: failed to start: {e:#}");
                    prog.done += points.len();
                    prog.line(&format!("{}: {msg}", t.name));
                    infos[ti].status = "failed".into();
                    infos[ti].failures.push(msg);
                    continue;
                }
            };
            if let Kind::Nginx(_) = t.kind {
                // The configuration it really ran with, for the report and the results dir.
                let conf = launch.run_dir.join("nginx.conf");
                if let Ok(text) = std::fs::read_to_string(&conf) {
                    if !results.peer_configs.contains_key(&t.name) {
                        std::fs::write(out.join("nginx.conf"), &text).with_context(|| {
                            format!("writing {}", out.join("nginx.conf").display())
                        })?;
                        results.peer_configs.insert(t.name.clone(), text);
                    }
                }
            }
            if srv
                .stats_path
                .as_deref()
                .is_some_and(|p| iolab_stats::StatsReader::open(p).is_err())
            {
                let note = "server counters unavailable (stats file unreadable); achieved concurrency from the client log only".to_string();
                if !infos[ti].failures.contains(&note) {
                    infos[ti].failures.push(note);
                }
            }
            // Warm-up, which also measures the rate used to size the points (quick).
            let mut rate = [0.0f64; 2];
            for (i, (file, n)) in [("small", plan.warmup.0), ("big", plan.warmup.1)]
                .into_iter()
                .enumerate()
            {
                match run_point(
                    &cx,
                    &srv,
                    &t.name,
                    file,
                    "warmup",
                    10,
                    Some(n),
                    Duration::from_secs(5),
                    rep,
                    false,
                ) {
                    Ok(o) => rate[i] = o.repeat.metrics.rps,
                    Err(e) => prog.line(&format!("{} warm-up ({file}) failed: {e:#}", t.name)),
                }
            }
            // Points are sized as they go: the time left to this server spread over its
            // points left, at the rate last measured for the same file and mode.
            let target_deadline = share.map(|s| target_start + Duration::from_secs_f64(s));
            let mut rate = [rate[0], rate[1], rate[0] * 2.5];
            for (pi, &(file, mode, c)) in points.iter().enumerate() {
                let slot = match (file, mode) {
                    (_, "keepalive") => 2,
                    ("big", _) => 1,
                    _ => 0,
                };
                // Keep-alive points run for a fixed time; the close-mode points share what
                // is left of this server's time.
                let ka_left = points[pi..].iter().filter(|p| p.1 == "keepalive").count();
                let close_left = (points.len() - pi - ka_left).max(1);
                let ka_reserve = ka_left as f64
                    * plan.ka_repeats as f64
                    * (plan.ka_duration.as_secs_f64() + 0.2);
                let per_point = target_deadline.map(|d| {
                    let left = d.saturating_duration_since(Instant::now()).as_secs_f64();
                    ((left - 0.3 - ka_reserve) / close_left as f64).max(0.25)
                });
                let requests = match (per_point, file) {
                    // Keep-alive throughput is measured over a duration, as wrk does.
                    _ if mode == "keepalive" => None,
                    (Some(ps), _) => Some(budget_requests(rate[slot], ps, c)),
                    (None, "big") => Some(plan.big_requests.unwrap_or(1000)),
                    (None, _) => Some(plan.small_requests.unwrap_or(1000)),
                };
                // A cap so that one stuck point cannot eat the run; requests still in flight
                // then are "unfinished", not errors.
                let cap = match per_point {
                    _ if mode == "keepalive" => plan.ka_duration,
                    Some(ps) => Duration::from_secs_f64((ps * 3.0).max(1.5) + 1.5),
                    None => Duration::from_secs(3600),
                };
                let want_trace = rep == 0 && mode == "close" && Some(&c) == plan.levels.last();
                prog.done += 1;
                // Keep-alive points are repeated back to back on the same server start, so
                // that even a single-repeat profile reports their spread.
                let runs_here = if mode == "keepalive" {
                    plan.ka_repeats.max(1)
                } else {
                    1
                };
                for k in 0..runs_here {
                    settle(&srv);
                    let rep_index = rep * runs_here + k;
                    match run_point(
                        &cx, &srv, &t.name, file, mode, c, requests, cap, rep_index, want_trace,
                    ) {
                        Ok(o) => {
                            let m = &o.repeat.metrics;
                            if m.rps > 0.0 {
                                rate[slot] = m.rps;
                            }
                            prog.line(&format!(
                                "{} {file} {mode} c={c}{}: {} req, mean {} ms, p99 {} ms, {} req/s, {} errors, {} SYN-retried, achieved c {:.0}{}",
                                t.name,
                                if runs_here > 1 { format!(" ({}/{runs_here}, {:.1} s)", k + 1, o.repeat.elapsed_s) } else { String::new() },
                                o.repeat.requests,
                                crate::report::short(m.mean_ms),
                                crate::report::short(m.p99_ms),
                                crate::report::short(m.rps.round()),
                                m.errors,
                                m.syn_retries,
                                m.achieved_concurrency,
                                if o.repeat.sustained { "" } else { " (not sustained)" }
                            ));
                            let e = runs.entry((ti, file, mode, c)).or_default();
                            e.0.push(o.repeat);
                            if e.1.is_none() {
                                e.1 = o.trace;
                            }
                        }
                        Err(e) => {
                            let msg = format!(
                                "repeat {rep_index}, {file} {mode} c={c}: load failed: {e:#}"
                            );
                            prog.line(&format!("{}: {msg}", t.name));
                            infos[ti].status = "failed".into();
                            infos[ti].failures.push(msg);
                        }
                    }
                }
                if let Some(crash) = srv.crash_report() {
                    let msg = format!("repeat {rep}: crashed during {file} {mode} c={c}: {crash}");
                    prog.line(&msg);
                    infos[ti].status = "failed".into();
                    infos[ti].failures.push(msg);
                    prog.done += points.len() - pi - 1;
                    break;
                }
            }
            srv.stop();
        }
    }

    for (ti, t) in targets.iter().enumerate() {
        for &(file, mode, c) in &points {
            if let Some((reps, tr)) = runs.remove(&(ti, file, mode, c)) {
                let mut p = Point::from_repeats(&t.name, file, mode, c, reps);
                p.trace = tr;
                results.points.push(p);
            }
        }
    }
    if opts.efficiency {
        let eff = efficiency_pass(
            &results,
            opts,
            &targets,
            &make_launch,
            &sources,
            client_cpu,
            (eff_duration, eff_repeats),
        );
        results.efficiency = Some(eff);
    }
    infos.extend(skipped);
    results.targets = infos;
    results.method = method(&plan, &sources, opts);
    if let Some(l) = link {
        results.link = Some(l.info.clone());
        l.remove().context("removing the link")?;
    }
    results.seed_vs_iolab = crate::seedtable::build(&results);
    results.elapsed_s = t0.elapsed().as_secs_f64();
    write_outputs(&results, out)?;
    tracing::info!(target: "progress",
        "iolab lab: done in {}; report: {}",
        hms(results.elapsed_s),
        out.join("index.html").display()
    );
    Ok(results)
}

/// Starts each server again and measures its CPU time per request at a fixed offered rate
/// (see [`crate::efficiency`]).
fn efficiency_pass(
    results: &Results,
    opts: &Options,
    targets: &[Target],
    make_launch: &dyn Fn(&Target) -> anyhow::Result<Launch>,
    sources: &[std::net::IpAddr],
    client_cpu: Option<usize>,
    (duration, repeats): (Duration, usize),
) -> crate::efficiency::Efficiency {
    use crate::efficiency::{self as eff, Efficiency};
    let mut e = Efficiency {
        duration_s: duration.as_secs_f64(),
        repeats,
        connections: eff::CONNECTIONS,
        cpu_source: "the kernel's CPU clock of each process of the server's group (clock_getcpuclockid: user + system, every thread, exited ones included; ns)".into(),
        ..Efficiency::default()
    };
    let defaults = eff::default_rates(results);
    let mut basis = Vec::new();
    for mode in eff::MODES {
        let label = if mode == "keepalive" {
            "keep-alive"
        } else {
            "new connection"
        };
        match (opts.efficiency_rate, defaults.get(mode)) {
            (Some(r), _) => {
                e.rates.insert(mode.into(), r);
                basis.push(format!("{label}: {r:.0} req/s (fixed, --efficiency-rate)"));
            }
            (None, Some((r, who, peak))) => {
                e.rates.insert(mode.into(), r.round());
                basis.push(format!(
                    "{label}: {:.0} req/s, half the lowest peak in this run ({who}: {peak:.0} req/s)",
                    r.round()
                ));
            }
            (None, None) => e.failures.push(format!(
                "{label}: no point measured in this mode to set a rate from"
            )),
        }
    }
    e.rate_basis = basis.join("; ");
    tracing::info!(target: "progress", "efficiency: server CPU per request at {}", e.rate_basis);
    for t in targets {
        let launch = match make_launch(t) {
            Ok(l) => l,
            Err(err) => {
                e.failures.push(format!("{}: {err:#}", t.name));
                continue;
            }
        };
        let mut srv = match ServerProc::start(t, &launch) {
            Ok(s) => s,
            Err(err) => {
                e.failures
                    .push(format!("{}: failed to start: {err:#}", t.name));
                continue;
            }
        };
        for mode in eff::MODES {
            let Some(&rate) = e.rates.get(mode) else {
                continue;
            };
            // A short closed-loop warm-up: caches filled, the server's threads started.
            if let Ok(mut w) = LoadConfig::for_url(&format!("http://{}/small.html", srv.addr)) {
                w.connections = 10;
                w.requests = Some(200);
                w.keepalive = mode == "keepalive";
                w.source_addrs = sources.to_vec();
                w.pin_cpu = client_cpu;
                w.keep_records = false;
                let _ = iolab_load::run(&w);
            }
            settle(&srv);
            match eff::measure(
                &t.name,
                srv.pgid(),
                srv.addr,
                mode,
                rate,
                duration,
                repeats,
                sources,
                client_cpu,
            ) {
                Ok((row, proc_stat_only)) => {
                    if proc_stat_only {
                        e.cpu_source = "/proc/PID/stat utime + stime of each process of the server's group (clock ticks; the CPU clock was not readable)".into();
                    }
                    tracing::info!(target: "progress",
                        "efficiency {} {mode} at {rate:.0} req/s: {:.1} us CPU per request ({:.1}..{:.1})",
                        t.name, row.us_per_request, row.spread[0], row.spread[1]
                    );
                    e.rows.push(row);
                }
                Err(err) => e.failures.push(format!("{} {mode}: {err:#}", t.name)),
            }
            if let Some(crash) = srv.crash_report() {
                e.failures.push(format!("{} {mode}: {crash}", t.name));
                break;
            }
        }
        srv.stop();
    }
    e
}

fn method(plan: &Plan, sources: &[std::net::IpAddr], opts: &Options) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let lv = |v: &[usize]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    m.insert(
        "concurrency levels (new connection per request)".into(),
        lv(&plan.levels),
    );
    m.insert(
        "keep-alive connections".into(),
        if plan.ka_levels.is_empty() {
            "none (the seed's method: a new connection per request)".into()
        } else {
            lv(&plan.ka_levels)
        },
    );
    m.insert(
        "network path".into(),
        match &opts.link {
            Some(l) => format!(
                "a veth pair shaped with tc to {} each way{}; the server in its own network namespace (see The link)",
                iolab_netns::format_rate(l.rate_bps),
                l.delay
                    .map(|d| format!(", {} ms one-way delay", d.as_secs_f64() * 1e3))
                    .unwrap_or_default()
            ),
            None => "loopback (no link: --link RATE or --seed-conditions for one)".into(),
        },
    );
    m.insert(
        "keep-alive points".into(),
        format!(
            "{} s each (by duration, as wrk), {} back to back per server start and repeat; requests/s is their median, min..max their spread",
            plan.ka_duration.as_secs_f64(),
            plan.ka_repeats
        ),
    );
    m.insert(
        "requests per point".into(),
        match (plan.small_requests, plan.budget) {
            (Some(n), _) => format!(
                "{n} (small file), {} (700 KB file)",
                plan.big_requests.unwrap_or(n)
            ),
            (None, Some(b)) => format!(
                "sized from the warm-up rate to fit {} in all; at least 2c + 100, at most 50,000",
                hms(b.as_secs_f64())
            ),
            _ => "-".into(),
        },
    );
    m.insert(
        "repeats".into(),
        format!(
            "{} (model order shuffled when more than 1; medians and min..max reported)",
            plan.repeats
        ),
    );
    m.insert(
        "per-request timeout".into(),
        format!("{} s", plan.timeout.as_secs()),
    );
    m.insert(
        "steady-state filter".into(),
        format!(
            "means over the requests started while the client had the requested concurrency in flight (within {:.0}%; requests stalled in a SYN retransmit do not count, the client's own turnaround between requests, up to half the median response time within {}..{} ms, does) and the server did not hold more; SYN-retried (connect >= {} ms) and failed requests are counted, never averaged",
            steady::DEFAULT_TOLERANCE * 100.0,
            steady::BRIDGE_US / 1000,
            steady::BRIDGE_MAX_US / 1000,
            steady::SYN_RETRY_CONNECT_US / 1000
        ),
    );
    m.insert("sustained (Figure 1)".into(), "errors <= 1% of requests, achieved concurrency within 10% of the requested, at least a quarter of the successful requests steady".into());
    m.insert(
        "ephemeral ports".into(),
        if sources.is_empty() {
            "one source address (127.0.0.1); no spreading possible".into()
        } else {
            format!("client connections spread round-robin over {} {} source addresses ({}..{}) so that 50,000 new connections per point cannot exhaust the ephemeral ports", sources.len(), if opts.link.is_some() { "link" } else { "loopback" }, sources[0], sources[sources.len() - 1])
        },
    );
    m.insert(
        "warm-up".into(),
        format!(
            "{} + {} requests at concurrency 10 (small, 700 KB) after each server start",
            plan.warmup.0, plan.warmup.1
        ),
    );
    m.insert(
        "per-request logs".into(),
        if plan.log_all {
            "every point (logs/*.csv)".into()
        } else {
            "the top concurrency level of each server (logs/*.csv)".into()
        },
    );
    m.insert(
        "server workers".into(),
        if opts.workers == 0 {
            "model's default (0), nginx and tokio: 1".into()
        } else {
            opts.workers.to_string()
        },
    );
    m
}

/// results.json, index.html and Figure 1 as standalone SVGs (figure1-small.svg, figure1-big.svg).
pub fn write_outputs(results: &Results, out: &Path) -> anyhow::Result<()> {
    let json = out.join("results.json");
    // Compact: the traces make it megabytes when pretty-printed (`jq .` to read it).
    std::fs::write(&json, serde_json::to_string(results)? + "\n")
        .with_context(|| format!("writing {}", json.display()))?;
    // Figure 1 on its own, for a README or a slide.
    for (file, label) in crate::report::FILES {
        let svg_path = out.join(format!("figure1-{file}.svg"));
        let num = if file == "small" { 1 } else { 3 };
        let svg = crate::report::figure1(results, file, label, num);
        std::fs::write(&svg_path, svg)
            .with_context(|| format!("writing {}", svg_path.display()))?;
    }
    let html = out.join("index.html");
    std::fs::write(&html, crate::report::render(results))
        .with_context(|| format!("writing {}", html.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans() {
        let q = Plan::for_profile(Profile::Quick);
        assert_eq!(q.levels, vec![1, 10, 50, 100, 200, 500, 1000]);
        assert_eq!(q.points().len(), 15);
        assert!(q.budget.is_some());
        let f = Plan::for_profile(Profile::Full);
        assert_eq!(f.small_requests, Some(50_000));
        assert!(f.repeats >= 3);
        let t = Plan::for_profile(Profile::Tiny);
        assert!(t.points().iter().all(|p| p.2 <= 50));
    }

    #[test]
    fn request_budget_bounds() {
        assert_eq!(budget_requests(10_000.0, 1.0, 10), 8000);
        // At least enough to get past the ramp-up at c = 1000.
        assert_eq!(budget_requests(100.0, 1.0, 1000), 2100);
        assert_eq!(budget_requests(1e9, 10.0, 1), 50_000);
        assert_eq!(budget_requests(f64::NAN, 1.0, 1), 102);
        assert_eq!(budget_requests(0.0, 1.0, 50), 200);
    }

    #[test]
    fn site_files_have_the_seed_sizes() {
        let d = std::env::temp_dir().join(format!("iolab-lab-site-{}", std::process::id()));
        write_site(&d).unwrap();
        assert_eq!(
            std::fs::metadata(d.join("small.html")).unwrap().len(),
            SMALL_BYTES as u64
        );
        assert_eq!(
            std::fs::metadata(d.join("big.bin")).unwrap().len(),
            BIG_BYTES as u64
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn unknown_peers_are_ignored_and_missing_ones_skipped() {
        let (t, s) = targets(&["epoll".into(), "nope".into()], &["bogus".into()]);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].name, "epoll");
        assert!(s.is_empty());
    }

    #[test]
    fn hms_format() {
        assert_eq!(hms(5.2), "5s");
        assert_eq!(hms(125.0), "2m05s");
        assert_eq!(hms(-1.0), "0s");
    }
}
