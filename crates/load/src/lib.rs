//! The iolab load generator (`iolab load`).
//!
//! CONTRACT (used by `iolab-lab`; add fields freely, do not rename or remove these):
//! `run(&LoadConfig) -> anyhow::Result<LoadReport>`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

pub mod cli;

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

/// One request, times in µs from the start of the run.
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

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct LoadReport {
    pub requests: u64,
    pub ok: u64,
    pub errors: std::collections::BTreeMap<String, u64>,
    pub elapsed_s: f64,
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
    /// Client CPU seconds (user + system) and mean lag behind schedule.
    pub client_cpu_s: f64,
    pub schedule_lag_ms: f64,
    /// Sorted by start time when `keep_records`.
    #[serde(skip)]
    pub records: Vec<RequestRecord>,
}

pub fn run(config: &LoadConfig) -> anyhow::Result<LoadReport> {
    let _ = config;
    anyhow::bail!("iolab-load: run is not written yet")
}
