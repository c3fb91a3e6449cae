//! One point: one load run against a running server, with the server's open connections
//! sampled meanwhile, analysed for its steady state, logged and summarised as a [`Repeat`].

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use iolab_load::{ErrorKind, LoadConfig, RequestRecord};

use crate::plan::{Plan, PointSpec, Sizing};
use crate::results::{ConnMode, FileKind, Metrics, Repeat, Trace};
use crate::server::ServerProc;
use crate::steady::{self, Analysis};

/// Where the load generator runs from: the source addresses it spreads its connections
/// over and the CPU it is pinned to.
#[derive(Debug, Clone, Default)]
pub struct Client {
    pub sources: Vec<IpAddr>,
    pub cpu: Option<usize>,
}

impl Client {
    /// A load run of `connections` against `file` on `addr` in `mode`, from this client;
    /// the rest as `LoadConfig::for_addr` has it (one request, records kept, quiet).
    pub fn load(
        &self,
        addr: SocketAddr,
        file: FileKind,
        mode: ConnMode,
        connections: usize,
    ) -> LoadConfig {
        let mut cfg = LoadConfig::for_addr(addr, file.path());
        cfg.connections = connections;
        cfg.keepalive = mode.keepalive();
        cfg.source_addrs = self.sources.clone();
        cfg.pin_cpu = self.cpu;
        cfg
    }

    /// [`Client::load`] against a running server: its Host header and the path its files
    /// are under (a `--url`'s); from no fixed source address when the server is not on
    /// loopback (the sources are loopback addresses there).
    pub fn load_on(
        &self,
        srv: &ServerProc,
        file: FileKind,
        mode: ConnMode,
        connections: usize,
    ) -> LoadConfig {
        let mut cfg = self.load(srv.addr, file, mode, connections);
        cfg.host = srv.host.clone();
        cfg.path = format!("{}{}", srv.prefix, file.path());
        if !srv.addr.ip().is_loopback() && self.sources.iter().all(|s| s.is_loopback()) {
            cfg.source_addrs.clear();
        }
        cfg
    }
}

/// One run of one point.
#[derive(Debug, Clone, Copy)]
pub struct Shot {
    pub point: PointSpec,
    pub sizing: Sizing,
    /// Which run of this point on this server (repeats and keep-alive's back-to-back runs).
    pub repeat: usize,
    /// Keep Figure 2's data of this run.
    pub trace: bool,
    /// A warm-up: its log (with `--profile full`) is named so.
    pub warmup: bool,
}

/// Everything one run produced.
pub struct Outcome {
    pub repeat: Repeat,
    pub trace: Option<Trace>,
}

/// What a run needs besides the point: the plan, where logs go, the client.
pub struct Bench<'a> {
    pub plan: &'a Plan,
    pub out: &'a Path,
    pub client: Client,
}

impl Bench<'_> {
    /// Runs `shot` against `srv` (the server named `name`).
    pub fn run(&self, srv: &ServerProc, name: &str, shot: &Shot) -> anyhow::Result<Outcome> {
        let PointSpec {
            file,
            mode,
            concurrency: c,
        } = shot.point;
        let mut cfg = self.client.load_on(srv, file, mode, c);
        cfg.requests = shot.sizing.requests;
        cfg.duration = Some(shot.sizing.cap);
        cfg.timeout = self.plan.timeout;
        let base = Instant::now();
        let sampler = Sampler::start(srv.stats_path.as_deref(), base);
        let report = iolab_load::run(&cfg);
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
        let log = if self.plan.log_all || (!shot.warmup && self.plan.is_top_close(shot.point)) {
            let tag = if shot.warmup { "warmup" } else { mode.name() };
            let rel = format!("logs/{name}_{file}_{tag}_c{c}_r{}.csv", shot.repeat);
            write_csv(&self.out.join(&rel), &report.records, &a)?;
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
            repeat: shot.repeat,
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
        let trace = shot
            .trace
            .then(|| trace(&report.records, samples.as_deref()));
        Ok(Outcome { repeat, trace })
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
pub fn settle(srv: &ServerProc) {
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
pub(crate) fn trace(records: &[RequestRecord], server: Option<&[(u64, u64)]>) -> Trace {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_load_goes_to_the_file_in_the_mode() {
        let client = Client {
            sources: vec![[127, 0, 0, 2].into()],
            cpu: Some(1),
        };
        let addr: SocketAddr = "127.0.0.1:8099".parse().unwrap();
        let cfg = client.load(addr, FileKind::Big, ConnMode::KeepAlive, 7);
        assert_eq!(cfg.addr, addr);
        assert_eq!(cfg.path, "/big.bin");
        assert_eq!(cfg.host, "127.0.0.1:8099");
        assert!(cfg.keepalive);
        assert_eq!(cfg.connections, 7);
        assert_eq!(cfg.source_addrs, client.sources);
        assert_eq!(cfg.pin_cpu, Some(1));
        let cfg = client.load(addr, FileKind::Small, ConnMode::Close, 1);
        assert_eq!(cfg.path, "/small.html");
        assert!(!cfg.keepalive);
    }
}
