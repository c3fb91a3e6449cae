//! The iolab load generator (`iolab load`).
//!
//! CONTRACT (used by `iolab-lab`; add fields freely, do not rename or remove these):
//! `run(&LoadConfig) -> anyhow::Result<LoadReport>`.
//!
//! How it measures (see README.md in this crate): client threads each run an epoll loop
//! over non-blocking sockets ([`engine`]); a request's latency runs from its scheduled
//! start (closed loop: when its slot became free; open loop: `i / rate`) to the last byte
//! of its response; failures and requests still in flight at the end are recorded, never
//! dropped; latencies go into an HdrHistogram (1 µs to 1 h, 3 significant digits).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

mod engine;
pub mod response;
pub mod spec;
pub mod stats;
pub mod url;

pub use stats::{read_csv, write_csv, SecondStats, SynSchedule};
pub use url::{parse_url, Target};

/// Kinds of failure, counted separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    Refused,
    Reset,
    Timeout,
    PortExhaustion,
    Emfile,
    ShortResponse,
    Malformed,
    Non2xx,
    Other,
    /// Still in flight when the run ended.
    Unfinished,
}

impl ErrorKind {
    /// Every kind, in declaration order (`kind as usize` indexes this array).
    pub const ALL: [ErrorKind; 10] = [
        ErrorKind::Refused,
        ErrorKind::Reset,
        ErrorKind::Timeout,
        ErrorKind::PortExhaustion,
        ErrorKind::Emfile,
        ErrorKind::ShortResponse,
        ErrorKind::Malformed,
        ErrorKind::Non2xx,
        ErrorKind::Other,
        ErrorKind::Unfinished,
    ];

    /// The name used in the CSV log and as key of `LoadReport::errors`.
    pub fn name(self) -> &'static str {
        stats::kind_name(self)
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Target address and request path ("/small.html").
    pub addr: SocketAddr,
    pub host: String,
    pub path: String,
    /// Concurrent clients (closed loop) or the connection cap (open loop).
    pub connections: usize,
    /// Stop after this many requests...
    pub requests: Option<u64>,
    /// ...or after this long.
    pub duration: Option<Duration>,
    /// Reuse connections (wrk) or one new connection per request (ab's default, the seed's).
    pub keepalive: bool,
    /// Open loop at this many requests/s, latency from the scheduled send time.
    pub rate: Option<f64>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Local addresses to spread connections over (empty = let the kernel choose).
    pub source_addrs: Vec<IpAddr>,
    /// Client threads (0 = choose).
    pub threads: usize,
    /// CPU to pin the client threads to, if any.
    pub pin_cpu: Option<usize>,
    /// Keep every request's record in `LoadReport::records`.
    pub keep_records: bool,
    /// No progress bar.
    pub quiet: bool,
}

impl LoadConfig {
    /// A configuration for `url` with the CLI's defaults: 1 connection, 1 request, a new
    /// connection per request, 10 s timeout, records kept, quiet.
    pub fn for_url(url: &str) -> anyhow::Result<Self> {
        let t = parse_url(url)?;
        Ok(Self {
            host: t.host,
            ..Self::for_addr(t.addr, &t.path)
        })
    }

    /// A configuration for `path` (the request target, e.g. "/small.html") on the server
    /// at `addr`, `Host: addr`, with the defaults of [`LoadConfig::for_url`]: for a caller
    /// that has the address, so that it is never printed into a URL and parsed back.
    pub fn for_addr(addr: SocketAddr, path: &str) -> Self {
        Self {
            addr,
            host: addr.to_string(),
            path: path.to_string(),
            connections: 1,
            requests: Some(1),
            duration: None,
            keepalive: false,
            rate: None,
            timeout: Duration::from_secs(10),
            source_addrs: Vec::new(),
            threads: 0,
            pin_cpu: None,
            keep_records: true,
            quiet: true,
        }
    }

    /// The request sent on the wire.
    pub fn request_bytes(&self) -> Vec<u8> {
        let mut r = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: iolab-load\r\nAccept: */*\r\n",
            self.path, self.host
        );
        if !self.keepalive {
            r.push_str("Connection: close\r\n");
        }
        r.push_str("\r\n");
        r.into_bytes()
    }

    /// The client threads a run uses: `threads`, or when 0: one when pinned to a CPU,
    /// else one per available CPU; never more than the connections.
    pub fn effective_threads(&self) -> usize {
        let t = if self.threads > 0 {
            self.threads
        } else if self.pin_cpu.is_some() {
            1
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        };
        t.clamp(1, self.connections.max(1))
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.connections == 0 {
            anyhow::bail!("connections must be at least 1");
        }
        if self.requests.is_none() && self.duration.is_none() {
            anyhow::bail!("give a number of requests (-n) or a duration (-d)");
        }
        if self.requests == Some(0) {
            anyhow::bail!("the number of requests must be at least 1");
        }
        if self.duration.is_some_and(|d| d.is_zero()) {
            anyhow::bail!("the duration must be positive");
        }
        if let Some(r) = self.rate {
            if !(r.is_finite() && r > 0.0) {
                anyhow::bail!("the rate must be a positive number of requests per second");
            }
        }
        if self.timeout.is_zero() {
            anyhow::bail!("the timeout must be positive");
        }
        if !self.path.starts_with('/')
            || self.path.bytes().any(|b| b.is_ascii_control() || b == b' ')
        {
            anyhow::bail!(
                "the path {:?} must start with '/' and hold no spaces or control characters",
                self.path
            );
        }
        if self.host.bytes().any(|b| b.is_ascii_control()) {
            anyhow::bail!("the Host value {:?} holds control characters", self.host);
        }
        for src in &self.source_addrs {
            if src.is_ipv4() != self.addr.is_ipv4() {
                anyhow::bail!(
                    "source address {src} is not of the same family as the target {}",
                    self.addr
                );
            }
        }
        Ok(())
    }
}

/// One request, times in µs from the start of the run.
///
/// `connected_us` equals `start_us` for a request sent on a reused keep-alive connection.
/// `conn_id` 0 means no connection was made (socket() failed, or an open-loop request was
/// still waiting for a free connection when the run ended; then `start_us == end_us`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RequestRecord {
    pub scheduled_us: u64,
    pub start_us: u64,
    pub connected_us: Option<u64>,
    pub first_byte_us: Option<u64>,
    pub end_us: u64,
    pub status: Option<u16>,
    pub bytes: u64,
    pub error: Option<ErrorKind>,
    pub conn_id: u64,
}

impl RequestRecord {
    /// The latency the report's quantiles are of: from when the request was due, so a
    /// request held back by a busy connection counts its wait (no coordinated omission).
    pub fn latency_us(&self) -> u64 {
        self.end_us.saturating_sub(self.scheduled_us)
    }
}

/// The result of a run. Latency statistics cover the successful (2xx) requests; failures
/// are counted in `errors` by kind (names as in the CSV log: refused, reset, timeout,
/// port_exhaustion, emfile, short_response, malformed, non2xx, other, unfinished).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct LoadReport {
    /// Every request made or due (successes, failures and unfinished ones).
    pub requests: u64,
    /// Requests with a complete 2xx response.
    pub ok: u64,
    pub errors: std::collections::BTreeMap<String, u64>,
    pub elapsed_s: f64,
    /// Successful requests per second of `elapsed_s`.
    pub rps: f64,
    pub bytes_per_s: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub p9999_ms: f64,
    pub max_ms: f64,
    /// Requests whose connect time looks like a SYN retransmit (near 1 s or 3 s).
    pub syn_retries: u64,
    /// Client CPU seconds (user + system) and mean lag behind schedule (open loop: start
    /// minus `i / rate`; closed loop: start minus the end of the slot's previous request).
    pub client_cpu_s: f64,
    pub schedule_lag_ms: f64,
    /// Sorted by start time when `keep_records`.
    #[serde(skip)]
    pub records: Vec<RequestRecord>,
    // ---- additions beyond the contract ----
    pub url: String,
    pub connections: usize,
    pub keepalive: bool,
    /// Open-loop rate, if any (requests/s).
    pub rate: Option<f64>,
    pub threads: usize,
    /// Response bytes received (headers and bodies).
    pub bytes: u64,
    /// Total errors (all kinds, unfinished included).
    pub error_count: u64,
    pub unfinished: u64,
    pub min_ms: f64,
    pub p75_ms: f64,
    pub p95_ms: f64,
    /// Standard deviation of the successful requests' latency.
    pub stdev_ms: f64,
    /// New connections established, and their mean connect time.
    pub connects: u64,
    pub connect_mean_ms: f64,
    /// Largest lag behind schedule.
    pub schedule_lag_max_ms: f64,
    /// Client CPU use as a percentage of the cores it could use (`cpu_cores`).
    pub client_cpu_pct: f64,
    pub cpu_cores: usize,
    /// The client looks like the bottleneck (CPU near 100% of its cores, or large lag).
    pub saturated: bool,
    pub warnings: Vec<String>,
    /// Per second of the run, by completion time.
    pub timeline: Vec<SecondStats>,
}

impl LoadReport {
    /// Errors of one kind.
    pub fn errors_of(&self, kind: ErrorKind) -> u64 {
        self.errors.get(kind.name()).copied().unwrap_or(0)
    }
}

/// Run the load described by `config` and report what happened.
pub fn run(config: &LoadConfig) -> anyhow::Result<LoadReport> {
    config.validate()?;
    let nofile = iolab_sys::raise_nofile_limit().map_or(0, |(_, after)| after);
    let threads = config.effective_threads();
    let shared = engine::Shared::new(threads);
    let request = config.request_bytes();
    let deadline_us = config.duration.map(|d| d.as_micros() as u64);
    let syn = SynSchedule::of_host();
    let plans: Vec<engine::Plan> = (0..threads)
        .map(|k| engine::Plan {
            index: k,
            threads,
            slots: config.connections * (k + 1) / threads - config.connections * k / threads,
            addr: config.addr,
            sources: config.source_addrs.clone(),
            request: request.clone(),
            keepalive: config.keepalive,
            timeout_us: config.timeout.as_micros().max(1) as u64,
            requests: config.requests,
            deadline_us,
            rate: config.rate,
            keep_records: config.keep_records,
            pin_cpu: config.pin_cpu,
            syn,
        })
        .collect();

    let bar = (!config.quiet).then(|| progress_bar(config));
    let outcomes: Vec<anyhow::Result<engine::Outcome>> = std::thread::scope(|scope| {
        let handles: Vec<_> = plans
            .into_iter()
            .enumerate()
            .map(|(k, plan)| {
                let shared = &shared;
                std::thread::Builder::new()
                    .name(format!("iolab-load-{k}"))
                    .spawn_scoped(scope, move || engine::run_thread(plan, shared))
            })
            .collect();
        // Spawning can fail (thread limits): the threads that did start would wait at the
        // barrier forever, so give up before they are released only if all started.
        if handles.iter().any(|h| h.is_err()) {
            // Threads that started are blocked at the barrier for `threads` parties; release
            // them by joining the barrier as the missing ones.
            let missing = handles.iter().filter(|h| h.is_err()).count();
            for _ in 0..missing {
                let s = &shared;
                scope.spawn(move || s.barrier.wait());
            }
        }
        if let Some(bar) = &bar {
            while handles
                .iter()
                .any(|h| h.as_ref().is_ok_and(|h| !h.is_finished()))
            {
                std::thread::sleep(Duration::from_millis(100));
                update_bar(bar, config, &shared);
            }
            update_bar(bar, config, &shared);
            bar.finish_and_clear();
        }
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client thread panicked"))),
                Err(e) => Err(anyhow::anyhow!("cannot start a client thread: {e}")),
            })
            .collect()
    });
    let mut outs = Vec::with_capacity(outcomes.len());
    for o in outcomes {
        outs.push(o?);
    }
    let mut report = summarize(config, threads, outs, &syn);
    if nofile > 0 && (nofile as usize) < config.connections + 64 {
        report.warnings.push(format!(
            "the open-file limit ({nofile}) is below the connection count ({}): expect EMFILE errors",
            config.connections
        ));
    }
    Ok(report)
}

fn progress_bar(config: &LoadConfig) -> indicatif::ProgressBar {
    let bar = match (config.requests, config.duration) {
        (Some(n), _) => indicatif::ProgressBar::new(n),
        (None, Some(d)) => indicatif::ProgressBar::new(d.as_secs().max(1)),
        (None, None) => indicatif::ProgressBar::new_spinner(),
    };
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr_with_hz(10));
    let template = if config.requests.is_some() {
        "{elapsed_precise} [{bar:40}] {pos}/{len} requests {msg}"
    } else {
        "{elapsed_precise} [{bar:40}] {pos}/{len} s {msg}"
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

fn update_bar(bar: &indicatif::ProgressBar, config: &LoadConfig, shared: &engine::Shared) {
    let ended = shared.ended.load(std::sync::atomic::Ordering::Relaxed);
    let failed = shared.failed.load(std::sync::atomic::Ordering::Relaxed);
    let elapsed = shared.t0.get().map_or(0.0, |t| t.elapsed().as_secs_f64());
    if config.requests.is_some() {
        bar.set_position(ended);
    } else {
        bar.set_position(elapsed as u64);
    }
    let rps = if elapsed > 0.0 {
        ended as f64 / elapsed
    } else {
        0.0
    };
    bar.set_message(format!("{ended} done, {failed} errors, {rps:.0} req/s"));
}

fn summarize(
    config: &LoadConfig,
    threads: usize,
    outs: Vec<engine::Outcome>,
    syn: &SynSchedule,
) -> LoadReport {
    let mut hist = stats::new_histogram();
    let mut timeline = stats::Timeline::default();
    let mut errors = [0u64; ErrorKind::ALL.len()];
    let mut r = LoadReport {
        url: format!("http://{}{}", config.host, config.path),
        connections: config.connections,
        keepalive: config.keepalive,
        rate: config.rate,
        threads,
        ..Default::default()
    };
    let (mut lat_sum, mut conn_sum, mut lag_sum, mut lag_n, mut lag_max) = (0u64, 0, 0, 0, 0);
    let mut end_us = 0;
    for o in outs {
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = hist.add(&o.hist);
        timeline.merge(&o.timeline);
        for (i, e) in o.errors.iter().enumerate() {
            errors[i] += e;
        }
        r.requests += o.requests;
        r.ok += o.ok;
        r.bytes += o.bytes;
        r.syn_retries += o.syn_retries;
        r.connects += o.connects;
        r.client_cpu_s += o.cpu_s;
        lat_sum += o.latency_sum_us;
        conn_sum += o.connect_sum_us;
        lag_sum += o.lag_sum_us;
        lag_n += o.lag_n;
        lag_max = lag_max.max(o.lag_max_us);
        end_us = end_us.max(o.end_us);
        r.records.extend(o.records);
    }
    r.records
        .sort_by_key(|x| (x.scheduled_us, x.start_us, x.conn_id));
    for k in ErrorKind::ALL {
        let n = errors[k as usize];
        if n > 0 {
            r.errors.insert(k.name().to_string(), n);
        }
        r.error_count += n;
    }
    r.unfinished = errors[ErrorKind::Unfinished as usize];
    r.elapsed_s = match config.duration {
        Some(d) if end_us >= d.as_micros() as u64 => d.as_secs_f64(),
        _ => end_us as f64 / 1e6,
    };
    if r.elapsed_s > 0.0 {
        r.rps = r.ok as f64 / r.elapsed_s;
        r.bytes_per_s = r.bytes as f64 / r.elapsed_s;
    }
    if r.ok > 0 {
        r.mean_ms = lat_sum as f64 / r.ok as f64 / 1000.0;
        r.stdev_ms = hist.stdev() / 1000.0;
        r.min_ms = hist.min() as f64 / 1000.0;
    }
    r.p50_ms = stats::quantile_ms(&hist, 0.5);
    r.p75_ms = stats::quantile_ms(&hist, 0.75);
    r.p90_ms = stats::quantile_ms(&hist, 0.9);
    r.p95_ms = stats::quantile_ms(&hist, 0.95);
    r.p99_ms = stats::quantile_ms(&hist, 0.99);
    r.p999_ms = stats::quantile_ms(&hist, 0.999);
    r.p9999_ms = stats::quantile_ms(&hist, 0.9999);
    r.max_ms = if hist.is_empty() {
        0.0
    } else {
        hist.max() as f64 / 1000.0
    };
    if r.connects > 0 {
        r.connect_mean_ms = conn_sum as f64 / r.connects as f64 / 1000.0;
    }
    if lag_n > 0 {
        r.schedule_lag_ms = lag_sum as f64 / lag_n as f64 / 1000.0;
        r.schedule_lag_max_ms = lag_max as f64 / 1000.0;
    }
    r.timeline = timeline.seconds();

    // Saturation: the cores the client threads could use.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    r.cpu_cores = if config.pin_cpu.is_some() {
        1
    } else {
        threads.min(cpus)
    };
    if r.elapsed_s > 0.0 {
        r.client_cpu_pct = r.client_cpu_s / (r.elapsed_s * r.cpu_cores as f64) * 100.0;
    }
    if r.client_cpu_pct >= 90.0 {
        r.saturated = true;
        r.warnings.push(format!(
            "the client used {:.0}% of its {} core(s): it may be the bottleneck, not the server",
            r.client_cpu_pct, r.cpu_cores
        ));
    }
    match config.rate {
        Some(rate) => {
            if r.schedule_lag_ms > (1.0f64).max(1000.0 / rate) {
                r.saturated = true;
                r.warnings.push(format!(
                    "requests started {:.2} ms late on average (max {:.1} ms): the client could not \
                     keep {rate} requests/s, or all {} connections were busy (that wait is counted \
                     in the latency)",
                    r.schedule_lag_ms, r.schedule_lag_max_ms, config.connections
                ));
            }
        }
        None => {
            if r.schedule_lag_ms > (1.0f64).max(0.1 * r.mean_ms) {
                r.saturated = true;
                r.warnings.push(format!(
                    "the clients took {:.2} ms on average (max {:.1} ms) to send their next request \
                     after the previous one ended: the client is slow to keep up",
                    r.schedule_lag_ms, r.schedule_lag_max_ms
                ));
            }
        }
    }
    if r.syn_retries > 0 {
        let [first, second, ..] = syn.steps_us().map(|us| us / 1_000_000);
        r.warnings.push(format!(
            "{} request(s) connected after about {first} s, {second} s, ... : lost SYNs \
             retransmitted by the client (listen backlog overflow?); their latency is the \
             retransmit timer, not the server",
            r.syn_retries
        ));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kind_index_matches_all() {
        for (i, k) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
        }
    }

    #[test]
    fn request_bytes_and_threads() {
        let mut c = LoadConfig::for_url("http://127.0.0.1:8080/x").unwrap();
        assert_eq!(
            c.request_bytes(),
            b"GET /x HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: iolab-load\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        c.keepalive = true;
        assert!(!String::from_utf8(c.request_bytes())
            .unwrap()
            .contains("close"));
        c.connections = 3;
        c.threads = 8;
        assert_eq!(c.effective_threads(), 3);
        c.threads = 0;
        c.pin_cpu = Some(0);
        assert_eq!(c.effective_threads(), 1);
    }

    /// An address and a path give the configuration their URL gives, for IPv4 and IPv6.
    #[test]
    fn for_addr_is_for_url_without_the_url() {
        for (addr, url) in [
            ("127.0.0.2:8080", "http://127.0.0.2:8080/big.bin"),
            ("[::1]:9000", "http://[::1]:9000/big.bin"),
        ] {
            let a = LoadConfig::for_addr(addr.parse().unwrap(), "/big.bin");
            let u = LoadConfig::for_url(url).unwrap();
            assert_eq!((a.addr, &a.host, &a.path), (u.addr, &u.host, &u.path));
            assert_eq!(a.request_bytes(), u.request_bytes());
            assert_eq!(
                (a.connections, a.requests, a.duration, a.keepalive, a.rate),
                (1, Some(1), None, false, None)
            );
            assert_eq!(
                (a.timeout, a.keep_records, a.quiet),
                (Duration::from_secs(10), true, true)
            );
            assert_eq!((a.threads, a.pin_cpu, a.source_addrs.len()), (0, None, 0));
        }
    }

    #[test]
    fn invalid_configs_are_refused() {
        let base = LoadConfig::for_url("http://127.0.0.1:1/").unwrap();
        let mut c = base.clone();
        c.connections = 0;
        assert!(run(&c).is_err());
        let mut c = base.clone();
        c.requests = None;
        assert!(run(&c).is_err());
        let mut c = base.clone();
        c.rate = Some(f64::NAN);
        assert!(run(&c).is_err());
        let mut c = base.clone();
        c.source_addrs = vec!["::1".parse().unwrap()];
        assert!(run(&c).is_err());
        let mut c = base;
        c.path = "/a\r\nX: y".into();
        assert!(run(&c).is_err());
    }
}
