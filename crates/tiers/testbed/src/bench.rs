//! `iolab tiers bench`: vanilla nginx and nginx with ODB side by side in one run, in the
//! testbed's namespaces. For each payload size and repeat, each mode runs wrk from the client
//! namespace for the same time; per mode: IS CPU per request (cgroup), bytes through the IS's
//! interfaces per request, client throughput and p50/p99 latency. The two stacks run on
//! different ports of the same namespaces; modes alternate inside each repeat so that drift
//! of the shared machine hits both alike.

use crate::cpu::TierCounters;
use crate::stack::{Odb, Stack};
use crate::testbed::State;
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

pub const FULL_SIZES: [usize; 7] = [1024, 3072, 4096, 16384, 65536, 262144, 1 << 20];
pub const QUICK_SIZES: [usize; 4] = [1024, 3072, 65536, 1 << 20];

pub fn all_sizes() -> Vec<usize> {
    let mut v: Vec<usize> = FULL_SIZES.to_vec();
    v.extend(QUICK_SIZES);
    v.sort_unstable();
    v.dedup();
    v
}

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

fn is_bytes(state: &State) -> u64 {
    let Ok(v) = crate::cpu::iface_bytes(state.ns("is")) else {
        return 0;
    };
    v.iter().map(|(_, rx, tx)| rx + tx).sum()
}

fn wrk(
    state: &State,
    url: &str,
    secs: f64,
    conns: usize,
    cpus: &Option<String>,
) -> anyhow::Result<String> {
    let mut c = match cpus {
        Some(cp) => {
            let mut c = std::process::Command::new("taskset");
            c.args(["-c", cp, "wrk"]);
            c
        }
        None => std::process::Command::new("wrk"),
    };
    c.args([
        "-t1",
        &format!("-c{conns}"),
        &format!("-d{}s", secs.max(1.0).round() as u64),
        "--latency",
        "--timeout",
        "10s",
        url,
    ]);
    if let Some(ns) = state.ns("client") {
        crate::stack::enter_ns(&mut c, ns)?;
    }
    let out = c.output().context("running wrk (Debian package wrk)")?;
    if !out.status.success() {
        bail!("wrk failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn one_run(
    state: &State,
    stack: &Stack,
    cg: &crate::cpu::Cgroups,
    size: usize,
    o: &BenchOpts,
) -> anyhow::Result<Run> {
    let url = format!("http://{}{}", stack.cfg.listen("fe"), target(o.php, size).0);
    let cpu0: Vec<f64> = crate::stack::TIERS
        .iter()
        .map(|t| cg.cpu_seconds(t))
        .collect();
    let b0 = is_bytes(state);
    let steal = Steal::start(o.tier_cpus.as_deref());
    let t0 = Instant::now();
    let out = wrk(state, &url, o.seconds, o.connections, &o.client_cpus)?;
    let secs = t0.elapsed().as_secs_f64();
    let steal_pct = steal.pct();
    let b1 = is_bytes(state);
    let cpu1: Vec<f64> = crate::stack::TIERS
        .iter()
        .map(|t| cg.cpu_seconds(t))
        .collect();
    let (requests, p50, p99, errors) = parse_wrk(&out)?;
    Ok(Run {
        requests,
        seconds: secs,
        rps: requests as f64 / o.seconds.max(1.0).round(),
        p50_ms: p50,
        p99_ms: p99,
        errors,
        cpu_s: [cpu1[0] - cpu0[0], cpu1[1] - cpu0[1], cpu1[2] - cpu0[2]],
        is_bytes: b1 - b0,
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

/// One line on the host's steal during a bench's runs, per configuration (`runs`: label
/// and the steal of each of its runs).
pub(crate) fn steal_line(runs: &[(&str, Vec<f64>)]) -> String {
    let all: Vec<f64> = runs.iter().flat_map(|(_, v)| v.iter().copied()).collect();
    if all.is_empty() {
        return "host steal on the tiers' CPU: not measured (/proc/stat unreadable)\n".into();
    }
    let st = stats(all);
    let per: Vec<String> = runs
        .iter()
        .map(|(c, v)| {
            format!(
                "{c} {:.1}%",
                stats(v.clone())["median"].as_f64().unwrap_or(f64::NAN)
            )
        })
        .collect();
    format!(
        "host steal on the tiers' CPU during the runs (/proc/stat): median {:.1}% ({:.1}-{:.1}%); {}\n",
        st["median"].as_f64().unwrap_or(f64::NAN),
        st["min"].as_f64().unwrap_or(f64::NAN),
        st["max"].as_f64().unwrap_or(f64::NAN),
        per.join(", ")
    )
}

/// (median, min, max) of the finite values, each NaN (JSON null) when there is none; shared
/// by the ODB and DISC benches.
pub(crate) fn stats(v: Vec<f64>) -> Value {
    let f: Vec<f64> = v.into_iter().filter(|x| x.is_finite()).collect();
    let median = iolab_sys::percentile::median_mean_of_middle(&f).unwrap_or(f64::NAN);
    let lo = f.iter().copied().reduce(f64::min).unwrap_or(f64::NAN);
    let hi = f.iter().copied().reduce(f64::max).unwrap_or(f64::NAN);
    json!({"median": median, "min": lo, "max": hi})
}

fn summarize(runs: &[Run]) -> Value {
    let per_req = |f: &dyn Fn(&Run) -> f64| -> Vec<f64> {
        runs.iter()
            .map(|r| f(r) / (r.requests.max(1) as f64))
            .collect()
    };
    json!({
        "rps": stats(runs.iter().map(|r| r.rps).collect()),
        "p50_ms": stats(runs.iter().map(|r| r.p50_ms).collect()),
        "p99_ms": stats(runs.iter().map(|r| r.p99_ms).collect()),
        "fe_cpu_us_per_req": stats(per_req(&|r| r.cpu_s[0] * 1e6)),
        "is_cpu_us_per_req": stats(per_req(&|r| r.cpu_s[1] * 1e6)),
        "be_cpu_us_per_req": stats(per_req(&|r| r.cpu_s[2] * 1e6)),
        "is_bytes_per_req": stats(per_req(&|r| r.is_bytes as f64)),
        "errors": runs.iter().map(|r| r.errors).sum::<u64>(),
        "runs": runs,
    })
}

fn m(v: &Value, k: &str) -> f64 {
    v[k]["median"].as_f64().unwrap_or(f64::NAN)
}

/// Set by the command's SIGINT/SIGTERM handler: the bench stops after the run in progress
/// and returns an error, so its guards (stacks, cgroups, directories) remove what it made.
pub static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Removes a directory tree when dropped (the bench's stack directories).
struct RemoveDir(std::path::PathBuf);
impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the bench against a testbed that is up; returns the JSON result.
pub fn run(state: &State, o: &BenchOpts, progress: &dyn Fn(&str)) -> anyhow::Result<Value> {
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
    let mut sizes_out = Vec::new();
    for &size in &o.sizes {
        // correctness gate and warm-up: both stacks serve the same bytes
        let (path, want) = target(o.php, size);
        for st in [&vanilla, &odb] {
            let body = fetch_in_client_ns(state, &format!("http://{}{path}", st.cfg.listen("fe")))?;
            if body != want {
                bail!(
                    "{} bytes from the {} stack differ from the file",
                    size,
                    if st.cfg.odb.is_some() {
                        "ODB"
                    } else {
                        "vanilla"
                    }
                );
            }
        }
        let odb_url = format!("http://{}{path}", odb.cfg.listen("fe"));
        let before = odb_counters_fresh(state, &odb, &odb_url)?;
        let mut runs_v = Vec::new();
        let mut runs_o = Vec::new();
        for rep in 0..o.repeats {
            // alternate which mode goes first
            let order: [(&Stack, &crate::cpu::Cgroups, bool); 2] = if rep % 2 == 0 {
                [(&vanilla, &cg_v, false), (&odb, &cg_o, true)]
            } else {
                [(&odb, &cg_o, true), (&vanilla, &cg_v, false)]
            };
            for (st, cg, is_odb) in order {
                if INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed) {
                    bail!("interrupted");
                }
                let r = one_run(state, st, cg, size, o)?;
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
        let after = odb_counters_fresh(state, &odb, &odb_url)?;
        let delta =
            |counter: fn(&TierCounters) -> u64| counter(&after) as f64 - counter(&before) as f64;
        // Responses between the snapshots, as the BE's library saw them: each one a
        // reference (one per 4 MiB) or a copy fallback. wrk's count would miss the requests
        // in flight when each of its runs stopped (up to one per connection), which the
        // tiers served all the same.
        let per_response = (size as f64 / (4u64 << 20) as f64).ceil().max(1.0);
        let responses = (delta(|c| c.be.v_out_frames) / per_response
            + delta(|c| c.be.store_fallbacks))
        .max(1.0);
        let by_ref_pct = (delta(|c| c.is.v_in_bytes) - delta(|c| c.is.fetch_bytes)).max(0.0)
            / (responses * size as f64)
            * 100.0;
        let sv = summarize(&runs_v);
        let so = summarize(&runs_o);
        let ratio = |k: &str| m(&so, k) / m(&sv, k);
        sizes_out.push(json!({
            "size": size,
            "vanilla": sv,
            "odb": so,
            "is_cpu_ratio": ratio("is_cpu_us_per_req"),
            "is_bytes_bypass_pct": (1.0 - ratio("is_bytes_per_req")) * 100.0,
            "is_payload_by_reference_pct": by_ref_pct,
            "rps_ratio": ratio("rps"),
            "p99_ratio": ratio("p99_ms"),
        }));
    }
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
    Ok(json!({
        "bench": "tiers",
        "machine": machine(),
        "method": {
            "repeats": o.repeats, "seconds": o.seconds, "connections": o.connections,
            "client": "wrk -t1 (client namespace)", "tier_cpus": o.tier_cpus, "client_cpus": o.client_cpus,
            "payloads": if o.php { "php-fpm /payload.php" } else { "static files" },
            "odb_threshold": o.odb.threshold, "agent_memory_mib": o.odb.agent_memory_mib,
            "rate_bps": state.up.rate_bps, "delay_us": state.up.delay_us,
        },
        "nginx_configs": state.configs.iter().map(|(t, c)| json!({"tier": t, "config": c})).collect::<Vec<_>>(),
        "php_fpm_config": php_fpm_config,
        "sizes": sizes_out,
        "odb_counters_last_run": counters,
        "agent_stats_last_run": agent_stats,
    }))
}

/// The tiers' ODB counters, fresh: the library writes them at most once a second, after a
/// call, so wait a second and make one request (each tier's first call for it writes the
/// file; its response comes after the snapshot and counts with the next one, at every
/// tier alike).
fn odb_counters_fresh(state: &State, stack: &Stack, url: &str) -> anyhow::Result<TierCounters> {
    std::thread::sleep(std::time::Duration::from_millis(1100));
    fetch_in_client_ns(state, url)?;
    std::thread::sleep(std::time::Duration::from_millis(100));
    stack.odb_counters()
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

pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let nginx = std::process::Command::new("nginx")
        .arg("-v")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
        .unwrap_or_default();
    json!({
        "kernel": iolab_netns::kernel_release(),
        "cpu": cpu,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "nginx": nginx,
    })
}

/// The result as a plain-text table (what the closing note pastes).
pub fn table(v: &Value) -> String {
    let mut s = String::new();
    s.push_str("size      | IS CPU us/req van → odb (ratio) | IS bytes/req van → odb (bypass) | payload by ref | req/s van → odb | p50 ms van → odb | p99 ms van → odb\n");
    for x in v["sizes"].as_array().into_iter().flatten() {
        let (sv, so) = (&x["vanilla"], &x["odb"]);
        s.push_str(&format!(
            "{:>9} | {:>7.1} → {:>7.1} ({:>5.2}x) | {:>9.0} → {:>9.0} ({:>5.1}%) | {:>13.2}% | {:>7.0} → {:>7.0} | {:>6.2} → {:>6.2} | {:>6.2} → {:>6.2}\n",
            x["size"].as_u64().unwrap_or(0),
            m(sv, "is_cpu_us_per_req"),
            m(so, "is_cpu_us_per_req"),
            x["is_cpu_ratio"].as_f64().unwrap_or(f64::NAN),
            m(sv, "is_bytes_per_req"),
            m(so, "is_bytes_per_req"),
            x["is_bytes_bypass_pct"].as_f64().unwrap_or(f64::NAN),
            x["is_payload_by_reference_pct"].as_f64().unwrap_or(f64::NAN),
            m(sv, "rps"),
            m(so, "rps"),
            m(sv, "p50_ms"),
            m(so, "p50_ms"),
            m(sv, "p99_ms"),
            m(so, "p99_ms"),
        ));
    }
    s.push_str(&goals(v));
    let steal: Vec<(&str, Vec<f64>)> = ["vanilla", "odb"]
        .iter()
        .map(|mode| {
            let sizes = v["sizes"].as_array().into_iter().flatten();
            let runs = sizes.flat_map(|x| x[*mode]["runs"].as_array().into_iter().flatten());
            (
                *mode,
                runs.filter_map(|r| r["steal_pct"].as_f64()).collect(),
            )
        })
        .collect();
    s.push_str(&steal_line(&steal));
    s
}

/// One goal's line: its measured value at each size it names (`unit` after each) and
/// whether all of them meet `ok`; a goal none of whose sizes was measured says so.
pub(crate) fn goal_line(
    name: &str,
    vals: Vec<(u64, f64)>,
    unit: &str,
    ok: &dyn Fn(f64) -> bool,
) -> String {
    if vals.is_empty() {
        return format!("  {name}: no size measured\n");
    }
    let met = vals.iter().all(|&(_, x)| ok(x));
    // Two decimals, or three where rounding to two would read as the other verdict
    // (0.504 printed "0.50x — NOT met" against a goal of 0.50).
    let list: Vec<String> = vals
        .iter()
        .map(|&(size, x)| {
            if ok((x * 100.0).round() / 100.0) == ok(x) {
                format!("{size} B {x:.2}{unit}")
            } else {
                format!("{size} B {x:.3}{unit}")
            }
        })
        .collect();
    format!(
        "  {name}: {} — {}\n",
        list.join(", "),
        if met { "met" } else { "NOT met" }
    )
}

/// The figure `at` reads from each size of a bench's JSON (`v["sizes"]`), for the sizes
/// `keep` names: (size, figure; NaN where it is missing).
pub(crate) fn goal_values(
    v: &Value,
    keep: &dyn Fn(u64) -> bool,
    at: &dyn Fn(&Value) -> Option<f64>,
) -> Vec<(u64, f64)> {
    v["sizes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| (x["size"].as_u64().unwrap_or(0), at(x).unwrap_or(f64::NAN)))
        .filter(|&(size, _)| keep(size))
        .collect()
}

/// Seed 004's goals for ODB (issue 14), each with what this run measured and whether it
/// is met: IS CPU −50% or better from 64 KiB, ≥ 93.75% of the payload bypassing the IS at
/// 64 KiB, ≤ 5% overhead below 4 KiB, no loss of client throughput at any size. A goal whose
/// sizes the run did not measure says so.
pub fn goals(v: &Value) -> String {
    let pick = |keep: &dyn Fn(u64) -> bool, key: &str| goal_values(v, keep, &|x| x[key].as_f64());
    let mut s = String::from("goals (seed 004):\n");
    s += &goal_line(
        "IS CPU ODB/vanilla <= 0.50x from 64 KiB",
        pick(&|n| n >= 65536, "is_cpu_ratio"),
        "x",
        &|x| x <= 0.5,
    );
    s += &goal_line(
        "payload by reference >= 93.75% at 64 KiB",
        pick(&|n| n == 65536, "is_payload_by_reference_pct"),
        "%",
        &|x| x >= 93.75,
    );
    s += &goal_line(
        "IS CPU ODB/vanilla <= 1.05x below 4 KiB",
        pick(&|n| n < 4096, "is_cpu_ratio"),
        "x",
        &|x| x <= 1.05,
    );
    s += &goal_line(
        "client req/s ODB/vanilla >= 1.00x at every size",
        pick(&|_| true, "rps_ratio"),
        "x",
        &|x| x >= 1.0,
    );
    s
}

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The printed nginx configurations of a result (`nginx_configs`), one heading and block per
/// tier; `prefix` goes before each tier's name.
pub(crate) fn nginx_configs_html(v: &Value, prefix: &str) -> String {
    v["nginx_configs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "<h4>{prefix}{}</h4><pre>{}</pre>",
                esc(c["tier"].as_str().unwrap_or("")),
                esc(c["config"].as_str().unwrap_or(""))
            )
        })
        .collect()
}

/// The report section (a self-contained HTML page with an SVG figure).
pub fn html(v: &Value) -> String {
    let sizes: Vec<&Value> = v["sizes"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let mut rows = String::new();
    for x in &sizes {
        let (sv, so) = (&x["vanilla"], &x["odb"]);
        let spread = |v: &Value, k: &str| {
            format!(
                "{:.1}–{:.1}",
                v[k]["min"].as_f64().unwrap_or(f64::NAN),
                v[k]["max"].as_f64().unwrap_or(f64::NAN)
            )
        };
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{:.1} <small>({})</small></td><td>{:.1} <small>({})</small></td><td>{:.2}×</td><td>{:.0}</td><td>{:.0}</td><td>{:.1}%</td><td>{:.2}%</td><td>{:.0}</td><td>{:.0}</td><td>{:.2} / {:.2}</td><td>{:.2} / {:.2}</td></tr>\n",
            x["size"], m(sv, "is_cpu_us_per_req"), spread(sv, "is_cpu_us_per_req"), m(so, "is_cpu_us_per_req"), spread(so, "is_cpu_us_per_req"),
            x["is_cpu_ratio"].as_f64().unwrap_or(f64::NAN), m(sv, "is_bytes_per_req"), m(so, "is_bytes_per_req"),
            x["is_bytes_bypass_pct"].as_f64().unwrap_or(f64::NAN),
            x["is_payload_by_reference_pct"].as_f64().unwrap_or(f64::NAN), m(sv, "rps"), m(so, "rps"),
            m(sv, "p50_ms"), m(so, "p50_ms"), m(sv, "p99_ms"), m(so, "p99_ms")
        ));
    }
    // figure: IS CPU per request, vanilla vs ODB, one pair of bars per size (log-free, scaled to max)
    let maxc = sizes
        .iter()
        .flat_map(|x| {
            [
                m(&x["vanilla"], "is_cpu_us_per_req"),
                m(&x["odb"], "is_cpu_us_per_req"),
            ]
        })
        .filter(|x| x.is_finite())
        .fold(1.0, f64::max);
    let (w, h, pad) = (120.0 * sizes.len().max(1) as f64 + 80.0, 260.0, 40.0);
    let mut svg = format!("<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' role='img' aria-label='IS CPU per request'>");
    svg.push_str(&format!(
        "<line x1='{pad}' y1='{}' x2='{}' y2='{}' stroke='#333'/>",
        h - pad,
        w - 10.0,
        h - pad
    ));
    for (i, x) in sizes.iter().enumerate() {
        let x0 = pad + 20.0 + i as f64 * 120.0;
        for (j, (k, col)) in [("vanilla", "#8a8a8a"), ("odb", "#2b6cb0")]
            .iter()
            .enumerate()
        {
            let val = m(&x[*k], "is_cpu_us_per_req");
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
            x["size"]
        ));
    }
    svg.push_str(&format!("<text x='{pad}' y='16' font-size='12'>IS CPU µs per request (max {maxc:.0}); grey: vanilla, blue: ODB</text></svg>"));
    let configs = nginx_configs_html(v, "");
    let goals_text = esc(&goals(v));
    format!(
        "<!doctype html><html><head><meta charset='utf-8'><title>iolab tiers: ODB across nginx</title>\
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}pre{{background:#f6f6f6;padding:6px;font-size:11px}}</style></head><body>\
<section id='tiers'><h2>ODB (on-demand buffers) across three nginx tiers</h2>\
<p>client → FE → IS → BE, each tier unmodified Debian nginx in its own network namespace; ODB by <code>LD_PRELOAD</code>. Medians of {} repeats of {} s (min–max in brackets), wrk with {} connections. Goals (seed 004): IS CPU −50% from 64 KiB, ≥93.75% of bytes bypassing the IS at 64 KiB, ≤5% overhead below 4 KiB, no throughput loss. Two bypass figures: <em>interface bytes</em> counts every byte in and out of the IS (headers, frame headers, the page of real bytes around the response header, the tail); <em>payload by reference</em> is the seed's own measure (60 of 64 KB: 93.75%), the body bytes the IS received as references and never fetched, from its library's counters, per response.</p>\
<table><tr><th>size B</th><th>IS µs/req vanilla</th><th>IS µs/req ODB</th><th>ratio</th><th>IS bytes/req vanilla</th><th>IS bytes/req ODB</th><th>bypass (interface bytes)</th><th>payload by reference</th><th>req/s vanilla</th><th>req/s ODB</th><th>p50 ms</th><th>p99 ms</th></tr>\n{rows}</table>\
<pre>{goals_text}</pre><figure>{svg}</figure><p>Machine: {}</p><details><summary>nginx configurations</summary>{configs}</details></section></body></html>\n",
        v["method"]["repeats"], v["method"]["seconds"], v["method"]["connections"], esc(&v["machine"].to_string())
    )
}

/// Renders `html` in headless Chromium to a PNG next to it; an error if it does not render.
pub fn check_in_chromium(html: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    let bin =
        crate::stack::which("chromium").context("chromium not found (Debian package chromium)")?;
    let png = html.with_extension("png");
    let _ = std::fs::remove_file(&png);
    let out = std::process::Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1200,900",
        ])
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", html.canonicalize()?.display()))
        .output()
        .context("running chromium")?;
    let ok = std::fs::metadata(&png)
        .map(|m| m.len() > 1000)
        .unwrap_or(false);
    if !ok {
        bail!(
            "chromium did not render {}: {}",
            html.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(png)
}

pub fn default_seconds(quick: bool) -> f64 {
    if quick {
        2.0
    } else {
        5.0
    }
}

pub fn sleep_settle() {
    std::thread::sleep(Duration::from_millis(200));
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

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

    /// A value that rounds onto the goal's bound gets a third decimal, so that what is
    /// printed agrees with the verdict.
    #[test]
    fn a_value_rounding_onto_the_bound_shows_a_third_decimal() {
        let under = |x: f64| x <= 0.5;
        let l = goal_line("CPU", vec![(65536, 0.5042), (1048576, 0.16)], "x", &under);
        assert_eq!(l, "  CPU: 65536 B 0.504x, 1048576 B 0.16x — NOT met\n");
        let l = goal_line("CPU", vec![(65536, 0.4962)], "x", &under);
        assert_eq!(l, "  CPU: 65536 B 0.50x — met\n");
        let l = goal_line("req/s", vec![(65536, 0.4951)], "x", &|x| x >= 0.5);
        assert_eq!(l, "  req/s: 65536 B 0.495x — NOT met\n");
    }

    /// The line of `goals` that starts (indentation aside) with `start`.
    pub(crate) fn goal_named(goals: &str, start: &str) -> String {
        goals
            .lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no goal {start:?} in {goals}"))
            .to_string()
    }

    /// Each ODB goal is judged on the sizes it names: a miss at any of them is a miss.
    #[test]
    fn goals_are_judged_on_their_own_sizes() {
        let v = json!({"sizes": [
            {"size": 1024, "is_cpu_ratio": 1.04, "rps_ratio": 0.97, "is_payload_by_reference_pct": 0.0},
            {"size": 3072, "is_cpu_ratio": 1.06, "rps_ratio": 1.01, "is_payload_by_reference_pct": 0.0},
            {"size": 65536, "is_cpu_ratio": 0.45, "rps_ratio": 1.0, "is_payload_by_reference_pct": 93.75},
        ]});
        let g = goals(&v);
        let line = |start: &str| goal_named(&g, start);
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
