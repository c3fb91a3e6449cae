//! `results.json`: every point of every server, with the machine and the settings.
//!
//! Format (schema "iolab-lab/1"): `points` is a flat list; each point is one server
//! (`model`), one `file` ("small" or "big"), one `mode` ("close": a new connection per
//! request, or "keepalive") and one `concurrency`, and carries the median over its repeats
//! of `mean_ms`, `p50_ms`, `p99_ms`, `rps`, `errors`, `syn_retries`,
//! `achieved_concurrency`, their `spread` (min and max over the repeats) and every repeat.

use std::collections::BTreeMap;

use iolab_sys::percentile::median;
use serde::{Deserialize, Serialize};

pub const SCHEMA: &str = "iolab-lab/1";

/// Which file a point fetches: seed 000's small HTML page or its 700 KB file. Serialised as
/// "small" and "big".
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    #[default]
    Small,
    Big,
}

impl FileKind {
    /// In report order.
    pub const ALL: [FileKind; 2] = [FileKind::Small, FileKind::Big];

    /// The name in results.json, log file names and the report's anchors.
    pub fn name(self) -> &'static str {
        match self {
            FileKind::Small => "small",
            FileKind::Big => "big",
        }
    }

    /// The request path of the file in the lab's site (`lab::write_site`).
    pub fn path(self) -> &'static str {
        match self {
            FileKind::Small => "/small.html",
            FileKind::Big => "/big.bin",
        }
    }

    /// How the report names it.
    pub fn label(self) -> &'static str {
        match self {
            FileKind::Small => "small file (about 300 bytes)",
            FileKind::Big => "700 KB file",
        }
    }
}

impl std::fmt::Display for FileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How the client uses its connections: a new one per request (the seed's method, ab's
/// default) or kept alive (wrk). Serialised as "close" and "keepalive"; declared in that
/// order so that maps keyed by mode keep the order they had with string keys.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ConnMode {
    #[default]
    Close,
    KeepAlive,
}

impl ConnMode {
    /// The order the efficiency and scaling sections list the modes in.
    pub const REPORT_ORDER: [ConnMode; 2] = [ConnMode::KeepAlive, ConnMode::Close];

    /// The name in results.json and log file names.
    pub fn name(self) -> &'static str {
        match self {
            ConnMode::Close => "close",
            ConnMode::KeepAlive => "keepalive",
        }
    }

    pub fn keepalive(self) -> bool {
        self == ConnMode::KeepAlive
    }

    /// How tables name it.
    pub fn label(self) -> &'static str {
        match self {
            ConnMode::Close => "new connection",
            ConnMode::KeepAlive => "keep-alive",
        }
    }
}

impl std::fmt::Display for ConnMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What happened to a server of the run. Serialised as "ok", "failed", "skipped".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Every point measured.
    #[default]
    Ok,
    /// Some points missing (it failed to start, crashed or a load run failed).
    Failed,
    /// Not run: a peer that is not installed.
    Skipped,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "failed",
            Status::Skipped => "skipped",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One of iolab's models, a peer (nginx, the tokio server), a user's command (`--target`)
/// or a server already running (`--url`). Serialised as "model", "peer", "command", "url".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetKind {
    #[default]
    Model,
    Peer,
    Command,
    Url,
}

impl TargetKind {
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Model => "model",
            TargetKind::Peer => "peer",
            TargetKind::Command => "command",
            TargetKind::Url => "url",
        }
    }
}

/// The figures of one point: the names the issue fixes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub rps: f64,
    pub errors: u64,
    pub syn_retries: u64,
    pub achieved_concurrency: f64,
}

/// One measurement of one point.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Repeat {
    pub repeat: usize,
    #[serde(flatten)]
    pub metrics: Metrics,
    pub requests: u64,
    pub ok: u64,
    /// Requests that passed the steady-state filter (the means use these).
    pub kept: u64,
    /// Some request was made at the requested concurrency.
    pub steady: bool,
    /// Errors at most 1% and the requested concurrency achieved (Figure 1 draws it).
    pub sustained: bool,
    pub errors_by_kind: BTreeMap<String, u64>,
    pub server_concurrency_mean: Option<f64>,
    pub server_concurrency_max: Option<u64>,
    pub elapsed_s: f64,
    pub client_cpu_s: f64,
    /// Per-request log (CSV), relative to the report directory.
    pub log: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// [min, max] over the repeats.
    pub mean_ms: [f64; 2],
    pub p99_ms: [f64; 2],
    pub rps: [f64; 2],
    pub errors: [u64; 2],
}

/// Figure 2's data for one run: each request's completion, the concurrency over time.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Trace {
    /// [end time s, response time ms, class (0 ok, 1 SYN-retried, 2 error)], downsampled.
    pub scatter: Vec<[f64; 3]>,
    /// [time s, open connections] from the server's counters (empty for servers without).
    pub server: Vec<[f64; 2]>,
    /// [time s, requests in flight] from the client log.
    pub client: Vec<[f64; 2]>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Point {
    pub model: String,
    pub file: FileKind,
    pub mode: ConnMode,
    pub concurrency: usize,
    #[serde(flatten)]
    pub metrics: Metrics,
    pub sustained: bool,
    pub spread: Spread,
    pub repeats: Vec<Repeat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<Trace>,
}

/// A server the lab ran (a model or a peer) and what happened to it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TargetInfo {
    pub name: String,
    pub kind: TargetKind,
    pub describe: String,
    pub status: Status,
    pub failures: Vec<String>,
    /// `--target`: the command as given, placeholders and all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// `--url`: the URL as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `--target`: its stdout and stderr, relative to the report directory (every start
    /// appended, each after a `--- iolab lab: start` line).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<String>,
    /// What the lab cannot measure of this server (`--target`, `--url`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_measured: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Results {
    pub schema: String,
    pub profile: String,
    pub command: String,
    pub started_unix: u64,
    pub elapsed_s: f64,
    pub machine: serde_json::Value,
    /// The settings that decide the result, by name.
    pub settings: BTreeMap<String, String>,
    pub warnings: Vec<String>,
    /// How the points were measured (requests per point, repeats, filter, ...).
    pub method: BTreeMap<String, String>,
    pub targets: Vec<TargetInfo>,
    pub points: Vec<Point>,
    /// `iolab micro` results by name (their own JSON convention), when run.
    #[serde(default)]
    pub micro: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub micro_failures: BTreeMap<String, String>,
    /// Seed 000's figures next to ours (see `seedtable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_vs_iolab: Option<SeedTable>,
    /// Server CPU time per request at a fixed offered rate (see `efficiency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<Efficiency>,
    /// The configuration each peer ran with (nginx.conf), by peer name.
    #[serde(default)]
    pub peer_configs: BTreeMap<String, String>,
    /// The shaped link the server ran behind (`--link`, `--seed-conditions`); absent on
    /// loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkInfo>,
    /// `--scaling`: requests/s against server workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<Scaling>,
    /// `--hosts`: the run over an inventory of hosts (server and client hosts apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<HostsRun>,
    /// `iolab seed bench --json` results, as that command wrote them (`--seed-bench`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_bench: Option<serde_json::Value>,
}

/// [min, max] of values; [0, 0] for none.
pub(crate) fn min_max(vals: impl Iterator<Item = f64> + Clone) -> [f64; 2] {
    let lo = vals.clone().fold(f64::INFINITY, f64::min);
    let hi = vals.fold(f64::NEG_INFINITY, f64::max);
    if lo.is_finite() && hi.is_finite() {
        [lo, hi]
    } else {
        [0.0, 0.0]
    }
}

impl Point {
    /// A point summarising its repeats: medians (`iolab_sys::percentile::median`, the mean
    /// of the middle two when even, 0 for none), spread, and sustained when most were.
    pub fn from_repeats(
        model: &str,
        file: FileKind,
        mode: ConnMode,
        concurrency: usize,
        repeats: Vec<Repeat>,
    ) -> Point {
        let m = |f: fn(&Metrics) -> f64| {
            let v: Vec<f64> = repeats.iter().map(|r| f(&r.metrics)).collect();
            median(&v).unwrap_or(0.0)
        };
        let mu = |f: fn(&Metrics) -> u64| {
            let v: Vec<f64> = repeats.iter().map(|r| f(&r.metrics) as f64).collect();
            median(&v).unwrap_or(0.0).round() as u64
        };
        let metrics = Metrics {
            mean_ms: m(|x| x.mean_ms),
            p50_ms: m(|x| x.p50_ms),
            p99_ms: m(|x| x.p99_ms),
            rps: m(|x| x.rps),
            errors: mu(|x| x.errors),
            syn_retries: mu(|x| x.syn_retries),
            achieved_concurrency: m(|x| x.achieved_concurrency),
        };
        let spread = Spread {
            mean_ms: min_max(repeats.iter().map(|r| r.metrics.mean_ms)),
            p99_ms: min_max(repeats.iter().map(|r| r.metrics.p99_ms)),
            rps: min_max(repeats.iter().map(|r| r.metrics.rps)),
            errors: [
                repeats.iter().map(|r| r.metrics.errors).min().unwrap_or(0),
                repeats.iter().map(|r| r.metrics.errors).max().unwrap_or(0),
            ],
        };
        let n_sustained = repeats.iter().filter(|r| r.sustained).count();
        Point {
            model: model.to_string(),
            file,
            mode,
            concurrency,
            metrics,
            sustained: !repeats.is_empty() && n_sustained * 2 > repeats.len(),
            spread,
            repeats,
            trace: None,
        }
    }
}

impl Results {
    pub fn point(&self, model: &str, file: FileKind, mode: ConnMode, c: usize) -> Option<&Point> {
        self.points
            .iter()
            .find(|p| p.model == model && p.file == file && p.mode == mode && p.concurrency == c)
    }

    /// Concurrency levels measured for a file and mode, ascending.
    pub fn levels(&self, file: FileKind, mode: ConnMode) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .points
            .iter()
            .filter(|p| p.file == file && p.mode == mode)
            .map(|p| p.concurrency)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// The fields every point must carry, by the issue.
pub const REQUIRED_POINT_FIELDS: [&str; 7] = [
    "mean_ms",
    "p50_ms",
    "p99_ms",
    "rps",
    "errors",
    "syn_retries",
    "achieved_concurrency",
];

// The blocks of results.json that the passes fill (efficiency, link, scaling, seed table):
// their types live here so that results imports nothing of the lab.

/// One measurement: one server, one mode, one repeat.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EffRepeat {
    pub ok: u64,
    pub errors: u64,
    /// Server CPU seconds (user + system, every process and thread of the server).
    pub cpu_s: f64,
    pub elapsed_s: f64,
    /// Requests answered per second (should match the offered rate).
    pub achieved_rps: f64,
    pub us_per_request: f64,
    pub client_cpu_s: f64,
    /// `errors` by the load generator's kind (`timeout`, `reset`, `short_response`, ...;
    /// `unfinished`: still in flight when the run ended). Absent when there were none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors_by_kind: BTreeMap<String, u64>,
}

/// The groups of error kinds the efficiency table shows, each with the load generator's
/// kinds it sums (`iolab_load::ErrorKind::name`). A kind not named here counts as "other";
/// `unfinished` (in flight when the run ended, normal for an open loop) is no failure.
pub const ERROR_GROUPS: [(&str, &[&str]); 5] = [
    ("timeouts", &["timeout"]),
    ("resets or refused", &["reset", "refused"]),
    (
        "short or malformed answers",
        &["short_response", "malformed"],
    ),
    ("non-2xx", &["non2xx"]),
    ("other", &[]),
];

/// The load generator's error name of requests still in flight at the end of a run.
pub const UNFINISHED: &str = "unfinished";

/// `by_kind` summed into [`ERROR_GROUPS`], in their order.
pub fn error_groups(by_kind: &BTreeMap<String, u64>) -> [u64; ERROR_GROUPS.len()] {
    let mut out = [0u64; ERROR_GROUPS.len()];
    for (kind, &n) in by_kind {
        if kind == UNFINISHED {
            continue;
        }
        let i = ERROR_GROUPS
            .iter()
            .position(|(_, kinds)| kinds.contains(&kind.as_str()))
            .unwrap_or(ERROR_GROUPS.len() - 1);
        out[i] += n;
    }
    out
}

impl EffRow {
    /// The repeats' errors by kind, summed.
    pub fn errors_by_kind(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for r in &self.repeats {
            for (k, n) in &r.errors_by_kind {
                *out.entry(k.clone()).or_insert(0) += n;
            }
        }
        out
    }
}

/// One server in one mode: median and spread over the repeats.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EffRow {
    pub server: String,
    pub mode: ConnMode,
    /// Offered rate, requests/s.
    pub rate: f64,
    /// Measured at the low rate of its mode ([`Efficiency::low_rates`]), not the main one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub low: bool,
    /// Median over repeats of server CPU µs per request.
    pub us_per_request: f64,
    /// [min, max] over repeats.
    pub spread: [f64; 2],
    pub repeats: Vec<EffRepeat>,
}

/// The `efficiency` block of results.json.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Efficiency {
    /// Offered rate per mode, requests/s.
    pub rates: BTreeMap<ConnMode, f64>,
    /// A second, lower rate per mode (a tenth of the lowest peak; none with a fixed
    /// `--efficiency-rate`): where a server idles between requests, the cost of waking up
    /// counts for more.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub low_rates: BTreeMap<ConnMode, f64>,
    /// How the rates were chosen.
    pub rate_basis: String,
    pub duration_s: f64,
    pub repeats: usize,
    /// Open-loop connection cap (requests in flight at most).
    pub connections: usize,
    /// Where the CPU times come from.
    pub cpu_source: String,
    pub rows: Vec<EffRow>,
    /// Servers or modes that could not be measured, and why.
    pub failures: Vec<String>,
}

impl Efficiency {
    /// The row of a server and mode at the main rate.
    pub fn row(&self, server: &str, mode: ConnMode) -> Option<&EffRow> {
        self.row_at(server, mode, false)
    }

    /// The row of a server and mode at the main rate, or at the low one.
    pub fn row_at(&self, server: &str, mode: ConnMode, low: bool) -> Option<&EffRow> {
        self.rows
            .iter()
            .find(|r| r.server == server && r.mode == mode && r.low == low)
    }

    /// (mode, low) of every rate offered or measured, main rates first, each in the
    /// report's order of modes.
    pub fn levels(&self) -> Vec<(ConnMode, bool)> {
        let mut out = Vec::new();
        for low in [false, true] {
            let rates = if low { &self.low_rates } else { &self.rates };
            for &m in &ConnMode::REPORT_ORDER {
                let seen = self.rows.iter().any(|r| r.mode == m && r.low == low);
                if rates.contains_key(&m) || seen {
                    out.push((m, low));
                }
            }
        }
        out
    }

    /// The offered rate of a level.
    pub fn rate_of(&self, mode: ConnMode, low: bool) -> Option<f64> {
        if low {
            self.low_rates.get(&mode).copied()
        } else {
            self.rates.get(&mode).copied()
        }
    }
}

/// The link as built and measured, recorded with every result.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LinkInfo {
    /// Rate asked for, bits per second, each direction.
    pub rate_bps: u64,
    /// One-way delay asked for, ms (0: none).
    pub delay_ms: f64,
    /// The server's network namespace.
    pub namespace: String,
    pub server_addr: String,
    pub client_addrs: Vec<String>,
    /// `tc qdisc show` of each end, read back after shaping.
    pub qdisc_server_end: String,
    pub qdisc_client_end: String,
    /// The same as JSON (`tc -j qdisc show`), server end then client end.
    pub qdiscs: Vec<serde_json::Value>,
    /// Listen backlog asked of every server.
    pub backlog: u32,
    /// TCP limits inside the server's namespace (they are per namespace).
    pub namespace_sysctls: BTreeMap<String, String>,
    /// Bulk transfer before the matrix: bytes each way and the rate measured, bits/s.
    pub bulk_bytes: u64,
    pub measured_down_bps: f64,
    pub measured_up_bps: f64,
    /// Set by `--seed-conditions`.
    pub seed_conditions: bool,
}

/// The `scaling` block of results.json.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Scaling {
    pub server_cpus: Vec<usize>,
    pub client_cpus: Vec<usize>,
    /// How the CPUs were chosen and what that means for the curve.
    pub note: String,
    /// Worker counts measured.
    pub workers: Vec<usize>,
    /// Seconds per measurement, and measurements per (server, workers, mode).
    pub duration_s: f64,
    pub repeats: usize,
    /// Client connections by mode.
    pub connections: BTreeMap<ConnMode, usize>,
    pub rows: Vec<ScalingRow>,
    pub failures: Vec<String>,
}

/// One server at one worker count in one mode.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ScalingRow {
    pub server: String,
    pub mode: ConnMode,
    pub workers: usize,
    /// Median requests/s over the repeats, and [min, max].
    pub rps: f64,
    pub rps_spread: [f64; 2],
    pub runs: Vec<f64>,
    /// Failed requests over all repeats (those in flight at the end do not count).
    pub errors: u64,
}

/// One row of the table: a seed server, its analogue, both sides' figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SeedRow {
    pub seed_server: String,
    pub seed_what: String,
    pub analogue: String,
    pub analogue_command: String,
    /// The analogue was measured in this run.
    pub measured: bool,
    /// Small file, c = top level, mean response time (ms): the seed's [low, high] and text.
    pub seed_small_mean_ms: Option<[f64; 2]>,
    pub seed_small_mean_text: String,
    pub ours_small_mean_ms: Option<f64>,
    /// Our point at the top level was sustained (else the mean is over unsteady requests).
    pub ours_small_sustained: Option<bool>,
    /// Our requests/s at that point (with the mean: Little's law, mean = c / rate).
    #[serde(default)]
    pub ours_small_rps: Option<f64>,
    /// Errors at the top level: the seed's out of its 50,000; ours out of our requests.
    pub seed_errors: u64,
    pub seed_requests: u64,
    pub ours_errors: Option<u64>,
    pub ours_requests: Option<u64>,
    /// Highest concurrency sustained (every level up to it sustained).
    pub seed_sustained: String,
    pub ours_sustained_max: Option<usize>,
    /// The 700 KB file at the top level: the seed's [59, 60] s and ours.
    pub seed_big_mean_s: [f64; 2],
    pub ours_big_mean_ms: Option<f64>,
    /// Why ours differs, in one line.
    pub why: String,
    /// Where the seed's figures come from.
    pub refs: String,
}

/// The "seed vs iolab" block of results.json.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SeedTable {
    /// The concurrency our columns are taken at (the seed's is 1000; a tiny run's lower).
    pub concurrency: usize,
    pub seed_conditions: String,
    /// Under which conditions our figures were measured.
    pub our_conditions: String,
    pub rows: Vec<SeedRow>,
    pub source: String,
}

/// The highest close-mode concurrency measured for a file (1,000 in quick and full).
pub fn top_level(r: &Results, file: FileKind) -> Option<usize> {
    r.levels(file, ConnMode::Close).last().copied()
}

/// The `hosts` block of results.json (`iolab lab --hosts FILE`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HostsRun {
    /// The inventory file, as given.
    pub inventory: String,
    /// The server host first, then the client hosts.
    pub hosts: Vec<HostInfo>,
    pub points: Vec<HostPoint>,
    /// Servers or points that could not be measured, and why.
    pub failures: Vec<String>,
}

/// One host as the run found it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HostInfo {
    pub name: String,
    /// "server" or "client".
    pub role: String,
    pub address: String,
    pub cpus: Vec<usize>,
    /// The host's clock minus the controller's at the start, ms, and the round trip of
    /// the sample it was measured over.
    pub clock_offset_ms: f64,
    pub clock_rtt_ms: f64,
    /// What the host said of itself (kernel, CPUs, CPU model, memory, hostname).
    pub machine: BTreeMap<String, String>,
}

/// One point measured from every client host at once.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HostPoint {
    pub server: String,
    pub file: FileKind,
    pub mode: ConnMode,
    /// Connections over all client hosts (split as evenly as they go).
    pub concurrency: usize,
    pub duration_s: f64,
    pub per_host: Vec<HostLoad>,
    pub merged: MergedLoad,
    /// The server's CPU seconds over the point (read on the server host), and per
    /// answered request in µs.
    pub server_cpu_s: Option<f64>,
    pub us_per_request: Option<f64>,
    /// Figure 2's data at the top close-mode level: every host's requests on the
    /// controller's clock (no server curve: the server's counters stay on its host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<Trace>,
}

/// One client host's share of a point.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HostLoad {
    pub host: String,
    pub connections: usize,
    /// Requests in flight on average (the sum of latencies over the run's length).
    pub achieved_concurrency: f64,
    pub ok: u64,
    pub errors: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors_by_kind: BTreeMap<String, u64>,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// When its load started on the controller's clock (the host's clock corrected by
    /// its offset), ms after the first host's start: one time axis for all hosts.
    pub start_ms: f64,
}

/// Every host's requests together: latency quantiles from the hosts' histograms merged.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MergedLoad {
    pub connections: usize,
    pub achieved_concurrency: f64,
    pub ok: u64,
    pub errors: u64,
    pub rps: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rep(i: usize, mean: f64, errors: u64, sustained: bool) -> Repeat {
        Repeat {
            repeat: i,
            metrics: Metrics {
                mean_ms: mean,
                p50_ms: mean,
                p99_ms: mean * 2.0,
                rps: 1000.0 / mean,
                errors,
                ..Metrics::default()
            },
            sustained,
            ..Repeat::default()
        }
    }

    /// The lab's summaries: the middle value, the mean of the middle two when even, NaN
    /// ignored, 0 for none.
    #[test]
    fn summaries_take_the_middle_and_zero_for_none() {
        let mid = |v: &[f64]| median(v).unwrap_or(0.0);
        assert_eq!(mid(&[]), 0.0);
        assert_eq!(mid(&[3.0]), 3.0);
        assert_eq!(mid(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(mid(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(mid(&[f64::NAN, 1.0]), 1.0);
    }

    #[test]
    fn point_aggregates_repeats() {
        let p = Point::from_repeats(
            "epoll",
            FileKind::Small,
            ConnMode::Close,
            100,
            vec![
                rep(0, 3.0, 0, true),
                rep(1, 1.0, 5, false),
                rep(2, 2.0, 1, true),
            ],
        );
        assert_eq!(p.metrics.mean_ms, 2.0);
        assert_eq!(p.spread.mean_ms, [1.0, 3.0]);
        assert_eq!(p.spread.errors, [0, 5]);
        assert_eq!(p.metrics.errors, 1);
        assert!(p.sustained);
        let q = Point::from_repeats("x", FileKind::Small, ConnMode::Close, 1, vec![]);
        assert!(!q.sustained);
        assert_eq!(q.spread.mean_ms, [0.0, 0.0]);
    }

    #[test]
    fn json_has_the_required_names_and_round_trips() {
        let mut p = Point::from_repeats(
            "threads",
            FileKind::Big,
            ConnMode::Close,
            1000,
            vec![rep(0, 5.0, 2, true)],
        );
        p.trace = Some(Trace {
            scatter: vec![[0.1, 2.0, 0.0]],
            server: vec![[0.0, 1.0]],
            client: vec![],
        });
        let r = Results {
            schema: SCHEMA.into(),
            points: vec![p],
            ..Results::default()
        };
        let s = serde_json::to_string(&r).unwrap();
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        let pt = &v["points"][0];
        for k in REQUIRED_POINT_FIELDS {
            assert!(pt.get(k).is_some(), "missing {k}");
            assert!(pt["repeats"][0].get(k).is_some(), "repeat missing {k}");
        }
        assert_eq!(pt["model"], "threads");
        assert_eq!(pt["file"], "big");
        assert_eq!(pt["mode"], "close");
        assert_eq!(pt["concurrency"], 1000);
        assert_eq!(pt["spread"]["mean_ms"][1], 5.0);
        let back: Results = serde_json::from_str(&s).unwrap();
        assert_eq!(back.points[0].metrics, r.points[0].metrics);
        assert_eq!(
            back.point("threads", FileKind::Big, ConnMode::Close, 1000)
                .unwrap()
                .repeats
                .len(),
            1
        );
        assert_eq!(back.levels(FileKind::Big, ConnMode::Close), vec![1000]);
        assert!(back
            .point("threads", FileKind::Small, ConnMode::Close, 1000)
            .is_none());
    }

    /// The JSON strings are today's (results.json is read by scripts), and `name()`, used
    /// in logs and the report, says the same.
    #[test]
    fn enums_serialise_to_the_former_strings() {
        for f in FileKind::ALL {
            assert_eq!(json(&f), f.name());
        }
        assert_eq!(json(&FileKind::Small), "small");
        assert_eq!(json(&FileKind::Big), "big");
        for m in ConnMode::REPORT_ORDER {
            assert_eq!(json(&m), m.name());
        }
        assert_eq!(json(&ConnMode::Close), "close");
        assert_eq!(json(&ConnMode::KeepAlive), "keepalive");
        for (s, want) in [
            (Status::Ok, "ok"),
            (Status::Failed, "failed"),
            (Status::Skipped, "skipped"),
        ] {
            assert_eq!(json(&s), want);
            assert_eq!(s.name(), want);
        }
        for (k, want) in [
            (TargetKind::Model, "model"),
            (TargetKind::Peer, "peer"),
            (TargetKind::Command, "command"),
            (TargetKind::Url, "url"),
        ] {
            assert_eq!(json(&k), want);
            assert_eq!(k.name(), want);
        }
        // Maps keyed by mode (efficiency rates, scaling connections) keep string keys, in
        // the order string keys sorted in.
        let m: BTreeMap<ConnMode, u32> = [(ConnMode::KeepAlive, 1), (ConnMode::Close, 2)].into();
        let s = serde_json::to_string(&m).unwrap();
        assert_eq!(s, r#"{"close":2,"keepalive":1}"#);
        assert_eq!(
            serde_json::from_str::<BTreeMap<ConnMode, u32>>(&s).unwrap(),
            m
        );
        assert!(serde_json::from_str::<FileKind>(r#""huge""#).is_err());
    }

    /// A value's JSON string.
    fn json<T: Serialize>(v: &T) -> String {
        serde_json::to_value(v)
            .unwrap()
            .as_str()
            .expect("a JSON string")
            .to_string()
    }
}
