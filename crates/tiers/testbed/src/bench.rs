//! `iolab tiers bench`: vanilla nginx and nginx with ODB side by side in one run, in the
//! testbed's namespaces. For each payload size and repeat, each mode runs wrk from the client
//! namespace for the same time; per mode: IS CPU per request (cgroup), bytes through the IS's
//! interfaces per request, client throughput and p50/p99 latency. The two stacks run on
//! different ports of the same namespaces; modes alternate inside each repeat so that drift
//! of the shared machine hits both alike.

use crate::cpu::TierCounters;
use crate::report::{
    esc, goal_line, goal_values, json_sorted, steal_line, Host, NginxConfig, Spread,
};
use crate::stack::{Odb, Stack};
use crate::state::State;
use anyhow::{bail, Context};
use serde::Serialize;
use std::time::Instant;

pub use crate::testutil::{all_sizes, FULL_SIZES, QUICK_SIZES};

#[derive(Clone, Debug)]
pub struct BenchOpts {
    pub sizes: Vec<usize>,
    pub repeats: usize,
    pub seconds: f64,
    pub connections: usize,
    pub odb: Odb,
    /// CPUs for the tiers and for the client (taskset lists).
    pub tier_cpus: Option<String>,
    pub client_cpus: Option<String>,
    /// The payloads come from PHP (php-fpm on the BE, `/payload.php?n=SIZE`) instead of
    /// static files.
    pub php: bool,
}

/// The path a size is requested at, and the bytes it answers.
pub fn target(php: bool, size: usize) -> (String, Vec<u8>) {
    if php {
        (
            format!("/payload.php?n={size}"),
            crate::nginx::php_payload(size),
        )
    } else {
        (format!("/f{size}"), crate::testutil::payload(size))
    }
}

/// One wrk run's figures.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Run {
    pub requests: u64,
    pub seconds: f64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub errors: u64,
    /// CPU seconds per tier during the run.
    pub cpu_s: [f64; 3],
    /// Bytes in + out of the IS's interfaces during the run.
    pub is_bytes: u64,
    /// Percent of the tiers' CPU time the host took during the run ([`Steal`]).
    pub steal_pct: Option<f64>,
}

fn parse_ms(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mul) = if let Some(v) = s.strip_suffix("us") {
        (v, 0.001)
    } else if let Some(v) = s.strip_suffix("ms") {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1000.0)
    } else {
        (s, 1.0)
    };
    num.parse::<f64>().ok().map(|x| x * mul)
}

/// Parses wrk's `--latency` output.
pub fn parse_wrk(out: &str) -> anyhow::Result<(u64, f64, f64, u64)> {
    let mut req = None;
    let (mut p50, mut p99, mut errors) = (f64::NAN, f64::NAN, 0u64);
    for l in out.lines() {
        let t = l.trim();
        if let Some(rest) = t.strip_prefix("50%") {
            p50 = parse_ms(rest).unwrap_or(f64::NAN);
        } else if let Some(rest) = t.strip_prefix("99%") {
            p99 = parse_ms(rest).unwrap_or(f64::NAN);
        } else if t.contains("requests in") {
            req = t
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok());
        } else if let Some(rest) = t.strip_prefix("Non-2xx or 3xx responses:") {
            errors += rest.trim().parse::<u64>().unwrap_or(0);
        } else if let Some(rest) = t.strip_prefix("Socket errors:") {
            for part in rest.split(',') {
                errors += part
                    .split_whitespace()
                    .last()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    let req = req.context("no request count in wrk's output")?;
    Ok((req, p50, p99, errors))
}

/// A moment of a run: each tier's CPU seconds so far, the bytes through the IS's
/// interfaces, and the tiers' CPUs' times (for the host's steal).
pub(crate) struct Snapshot {
    pub(crate) cpu_s: [f64; 3],
    pub(crate) is_bytes: u64,
    pub(crate) cpu_times: Option<iolab_sys::cpu::CpuTimes>,
}

/// Where the bench's two stacks (vanilla and ODB) run and how it reaches them: this
/// machine's namespaces ([`LocalRig`]) or the hosts of `up --hosts`
/// (`crate::hosts::bench`).
pub(crate) trait Rig {
    /// The FE's URL for `path` in one mode.
    fn url(&self, odb: bool, path: &str) -> String;
    /// A GET from the client: the body (an error unless a 2xx).
    fn fetch(&self, url: &str) -> anyhow::Result<Vec<u8>>;
    /// wrk from the client ([`wrk_args`]): its output.
    fn wrk(&self, args: &[String]) -> anyhow::Result<String>;
    fn snapshot(&self, odb: bool) -> anyhow::Result<Snapshot>;
    /// The ODB stack's counters.
    fn odb_counters(&self) -> anyhow::Result<TierCounters>;
}

/// wrk's arguments for one run (the program's name first).
pub(crate) fn wrk_args(url: &str, secs: f64, conns: usize) -> Vec<String> {
    [
        "wrk".to_string(),
        "-t1".into(),
        format!("-c{conns}"),
        format!("-d{}s", secs.max(1.0).round() as u64),
        "--latency".into(),
        "--timeout".into(),
        "10s".into(),
        url.into(),
    ]
    .into()
}

/// The summed times of `cpus` (None: all CPUs) in a `/proc/stat` text.
pub(crate) fn cpu_times(stat: &str, cpus: &[Option<usize>]) -> Option<iolab_sys::cpu::CpuTimes> {
    let mut sum = iolab_sys::cpu::CpuTimes { steal: 0, total: 0 };
    for &c in cpus {
        let t = iolab_sys::cpu::CpuTimes::parse(stat, c)?;
        (sum.steal, sum.total) = (sum.steal + t.steal, sum.total + t.total);
    }
    Some(sum)
}

/// The taskset list's CPUs (None or unreadable: all of them together).
pub(crate) fn cpu_choice(list: Option<&str>) -> Vec<Option<usize>> {
    match list.map(iolab_sys::cpu::parse_cpu_list) {
        Some(Ok(l)) if !l.is_empty() => l.into_iter().map(Some).collect(),
        _ => vec![None],
    }
}

/// The bench's stacks in the testbed's namespaces on this machine.
pub(crate) struct LocalRig<'a> {
    state: &'a State,
    stacks: [(&'a Stack, &'a crate::cpu::Cgroups); 2],
    client_cpus: Option<String>,
    tier_cpus: Vec<Option<usize>>,
}

impl Rig for LocalRig<'_> {
    fn url(&self, odb: bool, path: &str) -> String {
        format!(
            "http://{}{path}",
            self.stacks[usize::from(odb)].0.cfg.listen("fe")
        )
    }

    fn fetch(&self, url: &str) -> anyhow::Result<Vec<u8>> {
        fetch_in_client_ns(self.state, url)
    }

    fn wrk(&self, args: &[String]) -> anyhow::Result<String> {
        let mut c = match &self.client_cpus {
            Some(cp) => {
                let mut c = std::process::Command::new("taskset");
                c.args(["-c", cp]).args(args);
                c
            }
            None => {
                let mut c = std::process::Command::new(&args[0]);
                c.args(&args[1..]);
                c
            }
        };
        if let Some(ns) = self.state.ns("client") {
            crate::stack::enter_ns(&mut c, ns)?;
        }
        let out = c.output().context("running wrk (Debian package wrk)")?;
        if !out.status.success() {
            bail!("wrk failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn snapshot(&self, odb: bool) -> anyhow::Result<Snapshot> {
        let cg = self.stacks[usize::from(odb)].1;
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let is_bytes = crate::cpu::iface_bytes(self.state.ns("is"))
            .map(|v| v.iter().map(|(_, rx, tx)| rx + tx).sum())
            .unwrap_or(0);
        Ok(Snapshot {
            cpu_s: crate::stack::TIERS.map(|t| cg.cpu_seconds(t)),
            is_bytes,
            cpu_times: cpu_times(&stat, &self.tier_cpus),
        })
    }

    fn odb_counters(&self) -> anyhow::Result<TierCounters> {
        self.stacks[1].0.odb_counters()
    }
}

fn one_run(rig: &dyn Rig, odb: bool, size: usize, o: &BenchOpts) -> anyhow::Result<Run> {
    let url = rig.url(odb, &target(o.php, size).0);
    let before = rig.snapshot(odb)?;
    let t0 = Instant::now();
    let out = rig.wrk(&wrk_args(&url, o.seconds, o.connections))?;
    let secs = t0.elapsed().as_secs_f64();
    let after = rig.snapshot(odb)?;
    let steal_pct = match (&before.cpu_times, &after.cpu_times) {
        (Some(b), Some(a)) => a.steal_pct_since(b),
        _ => None,
    };
    let (requests, p50, p99, errors) = parse_wrk(&out)?;
    let cpu = |i: usize| after.cpu_s[i] - before.cpu_s[i];
    Ok(Run {
        requests,
        seconds: secs,
        rps: requests as f64 / o.seconds.max(1.0).round(),
        p50_ms: p50,
        p99_ms: p99,
        errors,
        cpu_s: [cpu(0), cpu(1), cpu(2)],
        is_bytes: after.is_bytes.saturating_sub(before.is_bytes),
        steal_pct,
    })
}

/// The host's steal on the tiers' CPUs over a run, from `/proc/stat`: on a virtual
/// machine, the time its co-tenants took while the tiers wanted to run. Printed with each
/// run and summed up under the table, so that a run on a busy host is seen as such (the
/// CPU accounting already leaves stolen time out, but a busy host slows what does run:
/// caches, memory bandwidth, the wake-ups between virtual CPUs).
pub(crate) struct Steal(Vec<(Option<usize>, iolab_sys::cpu::CpuTimes)>);

impl Steal {
    /// `cpus`: a taskset list ("0", "0,2-3"); None or unreadable: all CPUs together.
    pub(crate) fn start(cpus: Option<&str>) -> Steal {
        let list: Vec<Option<usize>> = match cpus.map(iolab_sys::cpu::parse_cpu_list) {
            Some(Ok(l)) => l.into_iter().map(Some).collect(),
            _ => vec![None],
        };
        // (/proc/stat read once for all of them)
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        Steal(
            list.into_iter()
                .filter_map(|c| Some((c, iolab_sys::cpu::CpuTimes::parse(&stat, c)?)))
                .collect(),
        )
    }

    /// Percent of those CPUs' time since `start` that the host took; None when
    /// `/proc/stat` could not be read or no tick passed.
    pub(crate) fn pct(&self) -> Option<f64> {
        use iolab_sys::cpu::CpuTimes;
        let zero = CpuTimes { steal: 0, total: 0 };
        let (mut before, mut now) = (zero, zero);
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        for (c, b) in &self.0 {
            let n = CpuTimes::parse(&stat, *c)?;
            (before.steal, before.total) = (before.steal + b.steal, before.total + b.total);
            (now.steal, now.total) = (now.steal + n.steal, now.total + n.total);
        }
        now.steal_pct_since(&before)
    }
}

/// Set by the command's SIGINT/SIGTERM handler: the bench stops after the run in progress
/// and returns an error, so its guards (stacks, cgroups, directories) remove what it made.
pub static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Removes a directory tree when dropped (the bench's stack directories).
pub(crate) struct RemoveDir(pub(crate) std::path::PathBuf);
impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One mode's figures at one size over its repeats.
#[derive(Clone, Debug, Serialize)]
pub struct ModeSummary {
    pub rps: Spread,
    pub p50_ms: Spread,
    pub p99_ms: Spread,
    pub fe_cpu_us_per_req: Spread,
    pub is_cpu_us_per_req: Spread,
    pub be_cpu_us_per_req: Spread,
    /// The three tiers' CPU per request together (the BE's with its buffer agent): on one
    /// CPU, what the chain's throughput is the inverse of.
    pub chain_cpu_us_per_req: Spread,
    pub is_bytes_per_req: Spread,
    pub errors: u64,
    pub runs: Vec<Run>,
}

impl ModeSummary {
    fn of(runs: Vec<Run>) -> ModeSummary {
        let per_req = |f: &dyn Fn(&Run) -> f64| -> Spread {
            let v: Vec<f64> = runs
                .iter()
                .map(|r| f(r) / (r.requests.max(1) as f64))
                .collect();
            Spread::of(&v)
        };
        let each = |f: &dyn Fn(&Run) -> f64| Spread::of(&runs.iter().map(f).collect::<Vec<_>>());
        ModeSummary {
            rps: each(&|r| r.rps),
            p50_ms: each(&|r| r.p50_ms),
            p99_ms: each(&|r| r.p99_ms),
            fe_cpu_us_per_req: per_req(&|r| r.cpu_s[0] * 1e6),
            is_cpu_us_per_req: per_req(&|r| r.cpu_s[1] * 1e6),
            be_cpu_us_per_req: per_req(&|r| r.cpu_s[2] * 1e6),
            chain_cpu_us_per_req: per_req(&|r| r.cpu_s.iter().sum::<f64>() * 1e6),
            is_bytes_per_req: per_req(&|r| r.is_bytes as f64),
            errors: runs.iter().map(|r| r.errors).sum(),
            runs,
        }
    }
}

/// One size's row: both modes and what ODB changed.
#[derive(Clone, Debug, Serialize)]
pub struct SizeRow {
    pub size: usize,
    pub vanilla: ModeSummary,
    pub odb: ModeSummary,
    /// IS CPU per request, ODB over vanilla (medians).
    pub is_cpu_ratio: f64,
    /// The chain's CPU per request (FE + IS + BE), ODB over vanilla (medians).
    pub chain_cpu_ratio: f64,
    /// Of the bytes through the IS's interfaces, the share ODB saved.
    pub is_bytes_bypass_pct: f64,
    /// Of the payload, the share the IS received by reference and never fetched.
    pub is_payload_by_reference_pct: f64,
    pub rps_ratio: f64,
    pub p99_ratio: f64,
}

impl SizeRow {
    fn new(size: usize, vanilla: ModeSummary, odb: ModeSummary, by_ref_pct: f64) -> SizeRow {
        let ratio = |f: fn(&ModeSummary) -> Spread| f(&odb).median / f(&vanilla).median;
        SizeRow {
            size,
            is_cpu_ratio: ratio(|m| m.is_cpu_us_per_req),
            chain_cpu_ratio: ratio(|m| m.chain_cpu_us_per_req),
            is_bytes_bypass_pct: (1.0 - ratio(|m| m.is_bytes_per_req)) * 100.0,
            is_payload_by_reference_pct: by_ref_pct,
            rps_ratio: ratio(|m| m.rps),
            p99_ratio: ratio(|m| m.p99_ms),
            vanilla,
            odb,
        }
    }
}

/// How the bench ran.
#[derive(Clone, Debug, Serialize)]
pub struct Method {
    pub repeats: usize,
    pub seconds: f64,
    pub connections: usize,
    pub client: &'static str,
    pub tier_cpus: Option<String>,
    pub client_cpus: Option<String>,
    pub payloads: &'static str,
    pub odb_threshold: usize,
    pub agent_memory_mib: u64,
    pub rate_bps: Option<u64>,
    pub delay_us: Option<u64>,
}

impl Method {
    /// What `o` fixes for every rig; the rig names its client and fills in its placement,
    /// payloads and shaping.
    pub(crate) fn of(o: &BenchOpts, client: &'static str) -> Method {
        Method {
            repeats: o.repeats,
            seconds: o.seconds,
            connections: o.connections,
            client,
            tier_cpus: None,
            client_cpus: None,
            payloads: "static files",
            odb_threshold: o.odb.threshold,
            agent_memory_mib: o.odb.agent_memory_mib,
            rate_bps: None,
            delay_us: None,
        }
    }
}

/// The bench's result (`--json`; the table and the page are made from it).
#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    pub bench: &'static str,
    pub machine: Host,
    pub method: Method,
    pub nginx_configs: Vec<NginxConfig>,
    pub php_fpm_config: Option<String>,
    pub sizes: Vec<SizeRow>,
    pub odb_counters_last_run: TierCounters,
    /// The agent's own STATS (allocations refused as full, evictions, live buffers).
    pub agent_stats_last_run: Option<serde_json::Value>,
    /// The hosts of `up --hosts` (None: this machine's namespaces).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<BenchHost>>,
}

/// One host of a bench over hosts, as the result names it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchHost {
    pub role: String,
    pub name: String,
    pub address: String,
    pub cpus: Vec<usize>,
    pub machine: std::collections::BTreeMap<String, String>,
}

/// Runs the bench against a testbed that is up.
pub fn run(state: &State, o: &BenchOpts, progress: &dyn Fn(&str)) -> anyhow::Result<BenchResult> {
    let base = state.up.port + 100;
    let mk = |name: &str, port: u16, odb: Option<Odb>| {
        let mut c = state.stack_config(
            port,
            state.dir.join(format!("bench-{name}")),
            odb,
            o.tier_cpus.clone(),
        );
        c.php = o.php;
        c
    };
    // declared first, dropped last: after the stacks have stopped
    let _dirs = [
        RemoveDir(state.dir.join("bench-vanilla")),
        RemoveDir(state.dir.join("bench-odb")),
    ];
    let cg_v = crate::cpu::Cgroups::new("bv", &crate::stack::TIERS)?;
    let cg_o = crate::cpu::Cgroups::new("bo", &crate::stack::TIERS)?;
    let vanilla = Stack::start(mk("vanilla", base, None), Some(&cg_v))
        .context("starting the vanilla stack")?;
    let odb = Stack::start(mk("odb", base + 10, Some(o.odb.clone())), Some(&cg_o))
        .context("starting the ODB stack")?;
    let rig = LocalRig {
        state,
        stacks: [(&vanilla, &cg_v), (&odb, &cg_o)],
        client_cpus: o.client_cpus.clone(),
        tier_cpus: cpu_choice(o.tier_cpus.as_deref()),
    };
    let sizes = measure(&rig, o, progress)?;
    // the agent's own view (allocations refused as full, evictions, live buffers): why
    // stores fell back, when they did
    let agent_stats = crate::cpu::agent_stats_in(odb.cfg.be.ns.as_deref(), odb.cfg.agent_addr());
    let counters = odb.odb_counters()?;
    let php_fpm_config = odb
        .configs
        .iter()
        .find(|(n, _)| n == "php-fpm")
        .map(|(_, c)| c.clone());
    drop(odb);
    drop(vanilla);
    Ok(BenchResult {
        bench: "tiers",
        machine: Host::probe(),
        method: Method {
            tier_cpus: o.tier_cpus.clone(),
            client_cpus: o.client_cpus.clone(),
            payloads: if o.php {
                "php-fpm /payload.php"
            } else {
                "static files"
            },
            rate_bps: state.up.rate_bps,
            delay_us: state.up.delay_us,
            ..Method::of(o, "wrk -t1 (client namespace)")
        },
        nginx_configs: NginxConfig::list(&state.configs),
        php_fpm_config,
        sizes,
        odb_counters_last_run: counters,
        agent_stats_last_run: agent_stats,
        hosts: None,
    })
}

/// Every size of `o` on `rig`: a row each.
pub(crate) fn measure(
    rig: &dyn Rig,
    o: &BenchOpts,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Vec<SizeRow>> {
    o.sizes
        .iter()
        .map(|&size| measure_size(rig, size, o, progress))
        .collect()
}

/// One size: both stacks checked for the file's bytes, then `o.repeats` runs of each mode
/// (alternating which goes first), and the ODB stack's counters around them.
fn measure_size(
    rig: &dyn Rig,
    size: usize,
    o: &BenchOpts,
    progress: &dyn Fn(&str),
) -> anyhow::Result<SizeRow> {
    // correctness gate and warm-up: both stacks serve the same bytes
    let (path, want) = target(o.php, size);
    for odb in [false, true] {
        let body = rig.fetch(&rig.url(odb, &path))?;
        if body != want {
            bail!(
                "{} bytes from the {} stack differ from the file",
                size,
                if odb { "ODB" } else { "vanilla" }
            );
        }
    }
    let odb_url = rig.url(true, &path);
    let before = odb_counters_fresh(rig, &odb_url)?;
    let mut runs_v = Vec::new();
    let mut runs_o = Vec::new();
    for rep in 0..o.repeats {
        // alternate which mode goes first
        let order = if rep % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for is_odb in order {
            if INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed) {
                bail!("interrupted");
            }
            let r = one_run(rig, is_odb, size, o)?;
            progress(&format!(
                "  {:>8} B  {:<7} rep {}: {:>8.0} req/s  IS {:>6.1} us/req  IS bytes/req {:>9.0}  p99 {:.2} ms  steal {:.0}%",
                size,
                if is_odb { "odb" } else { "vanilla" },
                rep + 1,
                r.rps,
                r.cpu_s[1] * 1e6 / r.requests.max(1) as f64,
                r.is_bytes as f64 / r.requests.max(1) as f64,
                r.p99_ms,
                r.steal_pct.unwrap_or(f64::NAN)
            ));
            if is_odb {
                runs_o.push(r);
            } else {
                runs_v.push(r);
            }
        }
    }
    let after = odb_counters_fresh(rig, &odb_url)?;
    let delta =
        |counter: fn(&TierCounters) -> u64| counter(&after) as f64 - counter(&before) as f64;
    // Responses between the snapshots, as the BE's library saw them: each one a
    // reference (one per 4 MiB) or a copy fallback. wrk's count would miss the requests
    // in flight when each of its runs stopped (up to one per connection), which the
    // tiers served all the same.
    let per_response = (size as f64 / (4u64 << 20) as f64).ceil().max(1.0);
    let responses =
        (delta(|c| c.be.v_out_frames) / per_response + delta(|c| c.be.store_fallbacks)).max(1.0);
    let by_ref_pct = (delta(|c| c.is.v_in_bytes) - delta(|c| c.is.fetch_bytes)).max(0.0)
        / (responses * size as f64)
        * 100.0;
    Ok(SizeRow::new(
        size,
        ModeSummary::of(runs_v),
        ModeSummary::of(runs_o),
        by_ref_pct,
    ))
}

/// The tiers' ODB counters, fresh: the library writes them at most once a second, after a
/// call, so wait a second and make one request (each tier's first call for it writes the
/// file; its response comes after the snapshot and counts with the next one, at every
/// tier alike).
fn odb_counters_fresh(rig: &dyn Rig, url: &str) -> anyhow::Result<TierCounters> {
    std::thread::sleep(std::time::Duration::from_millis(1100));
    rig.fetch(url)?;
    std::thread::sleep(std::time::Duration::from_millis(100));
    rig.odb_counters()
}

fn fetch_in_client_ns(state: &State, url: &str) -> anyhow::Result<Vec<u8>> {
    let mut c = std::process::Command::new("curl");
    c.args(["-s", "-f", "-m", "20", url]);
    if let Some(ns) = state.ns("client") {
        crate::stack::enter_ns(&mut c, ns)?;
    }
    let out = c.output().context("running curl (Debian package curl)")?;
    if !out.status.success() {
        bail!("curl {url} failed ({})", out.status);
    }
    Ok(out.stdout)
}

/// The result as a plain-text table (what the closing note pastes).
pub fn table(v: &BenchResult) -> String {
    let mut s = String::new();
    s.push_str("size      | IS CPU us/req van → odb (ratio) | chain CPU us/req van → odb (ratio) | IS bytes/req van → odb (bypass) | payload by ref | req/s van → odb | p50 ms van → odb | p99 ms van → odb\n");
    for x in &v.sizes {
        let (sv, so) = (&x.vanilla, &x.odb);
        s.push_str(&format!(
            "{:>9} | {:>7.1} → {:>7.1} ({:>5.2}x) | {:>8.1} → {:>8.1} ({:>5.2}x) | {:>9.0} → {:>9.0} ({:>5.1}%) | {:>13.2}% | {:>7.0} → {:>7.0} | {:>6.2} → {:>6.2} | {:>6.2} → {:>6.2}\n",
            x.size,
            sv.is_cpu_us_per_req.median,
            so.is_cpu_us_per_req.median,
            x.is_cpu_ratio,
            sv.chain_cpu_us_per_req.median,
            so.chain_cpu_us_per_req.median,
            x.chain_cpu_ratio,
            sv.is_bytes_per_req.median,
            so.is_bytes_per_req.median,
            x.is_bytes_bypass_pct,
            x.is_payload_by_reference_pct,
            sv.rps.median,
            so.rps.median,
            sv.p50_ms.median,
            so.p50_ms.median,
            sv.p99_ms.median,
            so.p99_ms.median,
        ));
    }
    s.push_str(&goals(&v.sizes));
    let steal_of = |m: &ModeSummary| {
        m.runs
            .iter()
            .filter_map(|r| r.steal_pct)
            .collect::<Vec<_>>()
    };
    let steal = [
        (
            "vanilla",
            v.sizes.iter().flat_map(|x| steal_of(&x.vanilla)).collect(),
        ),
        (
            "odb",
            v.sizes.iter().flat_map(|x| steal_of(&x.odb)).collect(),
        ),
    ];
    s.push_str(&steal_line(&steal));
    s
}

/// Seed 004's goals for ODB (issue 14), each with what this run measured and whether it
/// is met: IS CPU −50% or better from 64 KiB, ≥ 93.75% of the payload bypassing the IS at
/// 64 KiB, ≤ 5% overhead below 4 KiB, no loss of client throughput at any size. A goal whose
/// sizes the run did not measure says so.
pub fn goals(sizes: &[SizeRow]) -> String {
    let pick = |keep: &dyn Fn(u64) -> bool, at: fn(&SizeRow) -> f64| {
        goal_values(sizes, |x| x.size, keep, at)
    };
    let mut s = String::from("goals (seed 004):\n");
    s += &goal_line(
        "IS CPU ODB/vanilla <= 0.50x from 64 KiB",
        pick(&|n| n >= 65536, |x| x.is_cpu_ratio),
        "x",
        &|x| x <= 0.5,
    );
    s += &goal_line(
        "payload by reference >= 93.75% at 64 KiB",
        pick(&|n| n == 65536, |x| x.is_payload_by_reference_pct),
        "%",
        &|x| x >= 93.75,
    );
    s += &goal_line(
        "IS CPU ODB/vanilla <= 1.05x below 4 KiB",
        pick(&|n| n < 4096, |x| x.is_cpu_ratio),
        "x",
        &|x| x <= 1.05,
    );
    s += &goal_line(
        "chain CPU ODB/vanilla <= 1.00x from 64 KiB (issue 46)",
        pick(&|n| n >= 65536, |x| x.chain_cpu_ratio),
        "x",
        &|x| x <= 1.0,
    );
    s += &goal_line(
        "client req/s ODB/vanilla >= 1.00x at every size",
        pick(&|_| true, |x| x.rps_ratio),
        "x",
        &|x| x >= 1.0,
    );
    s
}

/// The report section (a self-contained HTML page with an SVG figure).
pub fn html(v: &BenchResult) -> String {
    let mut rows = String::new();
    for x in &v.sizes {
        let (sv, so) = (&x.vanilla, &x.odb);
        let spread = |s: &Spread| format!("{:.1}–{:.1}", s.min, s.max);
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{:.1} <small>({})</small></td><td>{:.1} <small>({})</small></td><td>{:.2}×</td><td>{:.1} → {:.1} ({:.2}×)</td><td>{:.0}</td><td>{:.0}</td><td>{:.1}%</td><td>{:.2}%</td><td>{:.0}</td><td>{:.0}</td><td>{:.2} / {:.2}</td><td>{:.2} / {:.2}</td></tr>\n",
            x.size, sv.is_cpu_us_per_req.median, spread(&sv.is_cpu_us_per_req), so.is_cpu_us_per_req.median, spread(&so.is_cpu_us_per_req),
            x.is_cpu_ratio, sv.chain_cpu_us_per_req.median, so.chain_cpu_us_per_req.median, x.chain_cpu_ratio,
            sv.is_bytes_per_req.median, so.is_bytes_per_req.median,
            x.is_bytes_bypass_pct,
            x.is_payload_by_reference_pct, sv.rps.median, so.rps.median,
            sv.p50_ms.median, so.p50_ms.median, sv.p99_ms.median, so.p99_ms.median
        ));
    }
    let svg = is_cpu_figure(&v.sizes);
    let configs = crate::report::nginx_configs_html(&v.nginx_configs, "");
    let goals_text = esc(&goals(&v.sizes));
    let (placement, hosts) = match &v.hosts {
        Some(h) => (
            "on its own host (the hosts of <code>up --hosts</code>, below)",
            hosts_html(h),
        ),
        None => ("in its own network namespace", String::new()),
    };
    format!(
        "<!doctype html><html><head><meta charset='utf-8'><title>iolab tiers: ODB across nginx</title>\
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}pre{{background:#f6f6f6;padding:6px;font-size:11px}}</style></head><body>\
<section id='tiers'><h2>ODB (on-demand buffers) across three nginx tiers</h2>\
<p>client → FE → IS → BE, each tier unmodified Debian nginx {placement}; ODB by <code>LD_PRELOAD</code>. Medians of {} repeats of {} s (min–max in brackets), wrk with {} connections. Goals (seed 004): IS CPU −50% from 64 KiB, ≥93.75% of bytes bypassing the IS at 64 KiB, ≤5% overhead below 4 KiB, no throughput loss. Two bypass figures: <em>interface bytes</em> counts every byte in and out of the IS (headers, frame headers, the page of real bytes around the response header, the tail); <em>payload by reference</em> is the seed's own measure (60 of 64 KB: 93.75%), the body bytes the IS received as references and never fetched, from its library's counters, per response.</p>\
<table><tr><th>size B</th><th>IS µs/req vanilla</th><th>IS µs/req ODB</th><th>ratio</th><th>chain µs/req (FE+IS+BE) vanilla → ODB</th><th>IS bytes/req vanilla</th><th>IS bytes/req ODB</th><th>bypass (interface bytes)</th><th>payload by reference</th><th>req/s vanilla</th><th>req/s ODB</th><th>p50 ms</th><th>p99 ms</th></tr>\n{rows}</table>\
<pre>{goals_text}</pre><figure>{svg}</figure>{hosts}<p>Machine: {}</p><details><summary>nginx configurations</summary>{configs}</details></section></body></html>\n",
        v.method.repeats, json_sorted(&v.method.seconds), v.method.connections, esc(&json_sorted(&v.machine))
    )
}

/// The hosts of a bench over `up --hosts`: role, name, address, CPUs, machine.
fn hosts_html(hosts: &[BenchHost]) -> String {
    let mut rows = String::new();
    for h in hosts {
        let cpus: Vec<String> = h.cpus.iter().map(usize::to_string).collect();
        let machine: Vec<String> = h.machine.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td style='text-align:left'>{}</td></tr>",
            esc(&h.role),
            esc(&h.name),
            esc(&h.address),
            esc(&cpus.join(",")),
            esc(&machine.join("; "))
        ));
    }
    format!("<h3 id='hosts'>Hosts</h3><table><tr><th>role</th><th>host</th><th>address</th><th>CPUs</th><th>machine</th></tr>{rows}</table>")
}

/// The figure: IS CPU per request, vanilla vs ODB, one pair of bars per size (log-free,
/// scaled to the largest).
fn is_cpu_figure(sizes: &[SizeRow]) -> String {
    let maxc = sizes
        .iter()
        .flat_map(|x| {
            [
                x.vanilla.is_cpu_us_per_req.median,
                x.odb.is_cpu_us_per_req.median,
            ]
        })
        .filter(|x| x.is_finite())
        .fold(1.0, f64::max);
    let (w, h, pad) = (120.0 * sizes.len().max(1) as f64 + 80.0, 260.0, 40.0);
    let mut svg = crate::report::svg_open(w, h, pad, "IS CPU per request");
    for (i, x) in sizes.iter().enumerate() {
        let x0 = pad + 20.0 + i as f64 * 120.0;
        for (j, (k, m, col)) in [
            ("vanilla", &x.vanilla, "#8a8a8a"),
            ("odb", &x.odb, "#2b6cb0"),
        ]
        .iter()
        .enumerate()
        {
            let val = m.is_cpu_us_per_req.median;
            let bh = if val.is_finite() {
                (h - 2.0 * pad) * val / maxc
            } else {
                0.0
            };
            svg.push_str(&format!("<rect x='{}' y='{}' width='40' height='{bh:.1}' fill='{col}'><title>{k}: {val:.1} us</title></rect>", x0 + j as f64 * 44.0, h - pad - bh));
        }
        svg.push_str(&format!(
            "<text x='{}' y='{}' font-size='11' text-anchor='middle'>{} B</text>",
            x0 + 42.0,
            h - pad + 14.0,
            x.size
        ));
    }
    svg.push_str(&format!("<text x='{pad}' y='16' font-size='12'>IS CPU µs per request (max {maxc:.0}); grey: vanilla, blue: ODB</text></svg>"));
    svg
}

pub fn default_seconds(quick: bool) -> f64 {
    if quick {
        2.0
    } else {
        5.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::steal_line;

    #[test]
    fn steal_is_summed_over_the_tiers_cpus_and_summed_up_per_configuration() {
        // This machine's /proc/stat: a run of a few ticks gives a share in [0, 100].
        let s = Steal::start(Some("0"));
        assert_eq!(s.0.len(), 1);
        let t0 = Instant::now();
        while t0.elapsed() < std::time::Duration::from_millis(60) {
            std::hint::spin_loop();
        }
        let pct = s.pct().expect("ticks passed");
        assert!((0.0..=100.0).contains(&pct), "{pct}");
        assert_eq!(
            Steal::start(Some("x")).0[0].0,
            None,
            "unreadable list: all CPUs"
        );
        let line = steal_line(&[("nginx", vec![1.0, 3.0, 2.0]), ("disc", vec![10.0])]);
        assert!(line.contains("median 2.5% (1.0-10.0%)"), "{line}");
        assert!(line.contains("nginx 2.0%, disc 10.0%"), "{line}");
        assert!(steal_line(&[("odb", vec![])]).contains("not measured"));
    }

    /// Each ODB goal is judged on the sizes it names: a miss at any of them is a miss.
    #[test]
    fn goals_are_judged_on_their_own_sizes() {
        let row = |size, is_cpu_ratio, rps_ratio, is_payload_by_reference_pct| SizeRow {
            size,
            is_cpu_ratio,
            rps_ratio,
            is_payload_by_reference_pct,
            ..SizeRow::new(
                size,
                ModeSummary::of(vec![]),
                ModeSummary::of(vec![]),
                f64::NAN,
            )
        };
        let v = [
            row(1024, 1.04, 0.97, 0.0),
            row(3072, 1.06, 1.01, 0.0),
            row(65536, 0.45, 1.0, 93.75),
        ];
        let g = goals(&v);
        let line = |start: &str| crate::report::tests::goal_named(&g, start);
        assert!(
            line("IS CPU ODB/vanilla <= 0.50x").contains("65536 B 0.45x — met"),
            "{g}"
        );
        assert!(line("payload by reference").ends_with("— met"), "{g}");
        assert!(
            line("IS CPU ODB/vanilla <= 1.05x").contains("1024 B 1.04x, 3072 B 1.06x — NOT met"),
            "{g}"
        );
        assert!(line("client req/s").ends_with("— NOT met"), "{g}");
    }
}
