//! `iolab tiers bench --disc`: the unmodified nginx chain, our tiers without DISC and our
//! tiers with DISC (direct mode: the BE's DP sends payloads on the FE's client connection)
//! side by side in one run.
//!
//! DISC needs a path the nginx testbed lacks, so the bench builds its own four namespaces
//! (tag `dsb`, removed on exit and by the next run if it was killed):
//!
//! ```text
//!  client ──A── FE ──B── IS ──C── BE        /27 subnets of one free /24
//!    │          └────────D────────┘│        D: the FE reaches DP on the BE
//!    └───────────────E─────────────┘        E: DP's segments to the client
//! ```
//!
//! TCP runs with Linux's defaults (timestamps, window scaling, SACK) everywhere; the
//! client has reverse-path filtering off (DP's segments carry the FE's address and arrive
//! on E). Every configuration runs in these same
//! namespaces under the same settings, so the nginx chain meets the same TCP.
//!
//! Each tier is its own process (nginx master + worker; `iolab disc be|proxy`), started in
//! its namespace and in a cgroup of its own (the BE's DP is a part of the BE process, so
//! its CPU counts as the BE's), pinned to CPU 0; wrk runs in the client's namespace on CPU 1.
//! A configuration runs only during its own runs (started, checked, measured, stopped): the
//! FE's eBPF hooks exist only while DISC runs, and idle peers cost nothing to the others.
//! Each repeat runs the three configurations in a shuffled order.
//!
//! Stalls: wrk's own `--timeout` counts requests that waited too long, and the whole wrk run
//! is bounded by `timeout(1)`; a stalled run is counted in the table, never waited for.
//!
//! Hook cost: `kernel.bpf_stats_enabled=1` during the bench (the previous value restored
//! after), `bpftool prog show --json` before and after each DISC run: run_time_ns/run_cnt of
//! the FE process's `disc_egress` and `disc_ingress` programs.

mod client;
mod net;
mod peers;
mod report;

pub use net::parse_hook_stats;
pub use report::{
    goals, html, served_right_bytes, table, ConfigSummary, DiscResult, Ratios, SizeRow,
};

use crate::bench::RemoveDir;
use crate::children::DpSend;
use anyhow::{bail, Context};
use client::{check_bytes, client_run};
use net::{hook_stats, prog_ids_of, BpfStats, Net};
use peers::{fe_url, Peers};
use std::path::PathBuf;

/// Namespace/veth tag of this bench (names carry it and the owner's pid).
pub const TAG: &str = "dsb";
pub const FULL_SIZES: [usize; 5] = [1024, 16384, 65536, 262144, 1 << 20];
pub const QUICK_SIZES: [usize; 3] = [1024, 65536, 1 << 20];

/// The three configurations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Config {
    Nginx,
    Ours,
    Disc,
}

impl Config {
    /// In the table's order.
    pub const ALL: [Config; 3] = [Config::Nginx, Config::Ours, Config::Disc];

    /// As the table, the JSON and the scratch directories name it.
    pub fn name(self) -> &'static str {
        match self {
            Config::Nginx => "nginx",
            Config::Ours => "ours",
            Config::Disc => "disc",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Config::Nginx => "nginx chain",
            Config::Ours => "our tiers, DISC off",
            Config::Disc => "our tiers, DISC direct",
        }
    }
}

#[derive(Clone, Debug)]
pub struct DiscOpts {
    pub sizes: Vec<usize>,
    pub repeats: usize,
    pub seconds: u64,
    pub connections: usize,
    /// Payload files f<size> (the testbed's root).
    pub root: PathBuf,
    /// Scratch directory (configs, logs), removed at the end.
    pub dir: PathBuf,
    /// This program (`iolab`), to start our tiers as `iolab disc be|proxy`.
    pub exe: PathBuf,
    pub tier_cpus: String,
    pub client_cpus: String,
    /// DP's send path (`iolab disc be --dp-send`).
    pub dp_send: DpSend,
    /// The FE forwards the client's ACKs to DP (`iolab disc be --no-ack-tap`).
    pub dp_acks_forwarded: bool,
    /// Open loop at this many requests/s (`iolab load --rate`) instead of wrk's closed loop.
    pub rate: Option<f64>,
}

/// One wrk run of one configuration at one size.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Run {
    pub config: Config,
    pub size: usize,
    pub repeat: usize,
    /// The bytes of one GET before the run were those of the file.
    pub bytes_ok: bool,
    /// What the check's GET received instead, when it was wrong.
    pub bytes_error: Option<String>,
    pub requests: u64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Non-2xx answers and socket errors other than timeouts.
    pub errors: u64,
    /// Requests wrk gave up waiting for (`--timeout`), and runs cut by the outer bound.
    pub stalled: u64,
    /// CPU seconds per tier (FE, IS, BE) during the run.
    pub cpu_s: [f64; 3],
    pub fe_bytes: u64,
    pub is_bytes: u64,
    /// (run_time_ns, run_cnt) of disc_egress and disc_ingress during the run (DISC only).
    pub hook_egress: Option<(u64, u64)>,
    pub hook_ingress: Option<(u64, u64)>,
    /// Percent of the tiers' CPU time the host took during the run (`bench::Steal`).
    pub steal_pct: Option<f64>,
}

fn one_run(
    config: Config,
    size: usize,
    repeat: usize,
    net: &Net,
    peers: &Peers,
    cg: &crate::cpu::Cgroups,
    o: &DiscOpts,
) -> anyhow::Result<Run> {
    let url = fe_url(net, config, size);
    let want = crate::testutil::payload(size);
    let bytes_error = check_bytes(net, &url, &want);
    let ids = peers
        .fe_pid()
        .filter(|_| config == Config::Disc)
        .map(prog_ids_of)
        .unwrap_or_default();
    let h0 = hook_stats(&ids);
    let cpu0 = crate::stack::TIERS.map(|t| cg.cpu_seconds(t));
    let (fe0, is0) = (net.bytes("fe"), net.bytes("is"));
    let steal = crate::bench::Steal::start(Some(&o.tier_cpus));
    let (requests, p50, p99, errors, stalled) = client_run(net, &url, o)?;
    let steal_pct = steal.pct();
    let (fe1, is1) = (net.bytes("fe"), net.bytes("is"));
    let cpu1 = crate::stack::TIERS.map(|t| cg.cpu_seconds(t));
    let h1 = hook_stats(&ids);
    let hook = |i: usize| match (h0, h1) {
        (Some(a), Some(b)) => Some((b[i].0.saturating_sub(a[i].0), b[i].1.saturating_sub(a[i].1))),
        _ => None,
    };
    Ok(Run {
        config,
        size,
        repeat,
        bytes_ok: bytes_error.is_none(),
        bytes_error,
        requests,
        rps: requests as f64 / o.seconds as f64,
        p50_ms: p50,
        p99_ms: p99,
        errors,
        stalled,
        cpu_s: [0, 1, 2].map(|i| cpu1[i] - cpu0[i]),
        fe_bytes: fe1 - fe0,
        is_bytes: is1 - is0,
        hook_egress: hook(0),
        hook_ingress: hook(1),
        steal_pct,
    })
}

/// A small xorshift for the order of the configurations (no dependency for a shuffle).
fn shuffled(seed: &mut u64) -> [Config; 3] {
    let mut c = Config::ALL;
    for i in (1..c.len()).rev() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        c.swap(i, (*seed % (i as u64 + 1)) as usize);
    }
    c
}

/// Runs the bench.
pub fn run(o: &DiscOpts, progress: &dyn Fn(&str)) -> anyhow::Result<DiscResult> {
    for tool in ["wrk", "curl", "nginx", "taskset", "timeout"] {
        crate::stack::which(tool).with_context(|| format!("{tool} not found"))?;
    }
    let bpftool = crate::stack::which("bpftool").is_some();
    if !bpftool {
        progress("bpftool not found (Debian package bpftool): no hook cost");
    }
    std::fs::create_dir_all(&o.dir)?;
    let _dir = RemoveDir(o.dir.clone());
    let net = Net::build(&o.exe, o.dp_send == DpSend::Repair)
        .context("building the bench's namespaces")?;
    let _stats = BpfStats::enable();
    let cgs = [
        crate::cpu::Cgroups::new("dn", &crate::stack::TIERS)?,
        crate::cpu::Cgroups::new("do", &crate::stack::TIERS)?,
        crate::cpu::Cgroups::new("dd", &crate::stack::TIERS)?,
    ];
    let mut nginx_configs = Vec::new();
    let mut seed = (std::process::id() as u64) << 20 | 0x9e37;
    let mut runs: Vec<Run> = Vec::new();
    let mut orders = Vec::new();
    for rep in 0..o.repeats {
        let order = shuffled(&mut seed);
        orders.push(order);
        for config in order {
            if crate::bench::INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed) {
                bail!("interrupted");
            }
            let ci = Config::ALL.iter().position(|c| *c == config).unwrap_or(0);
            let peers = peers::start(config, &net, o, &cgs[ci])
                .with_context(|| format!("starting the {}", config.label()))?;
            if let Peers::Nginx(st) = &peers {
                if nginx_configs.is_empty() {
                    nginx_configs = st.configs.clone();
                }
            }
            for &size in &o.sizes {
                let r = one_run(config, size, rep, &net, &peers, &cgs[ci], o)?;
                progress(&progress_line(&r));
                runs.push(r);
            }
            drop(peers);
        }
    }
    Ok(report::result(
        o,
        &net,
        bpftool,
        orders,
        &nginx_configs,
        runs,
    ))
}

/// The line printed after each run.
fn progress_line(r: &Run) -> String {
    let req = r.requests.max(1) as f64;
    format!(
        "  {:>8} B  {:<5} rep {}: {:>7.0} req/s  CPU {:>6.1} us/req (FE {:.1} IS {:.1} BE {:.1})  FE B/req {:>8.0}  p99 {:>6.2} ms  steal {:.0}%{}{}",
        r.size,
        r.config.name(),
        r.repeat + 1,
        r.rps,
        r.cpu_s.iter().sum::<f64>() * 1e6 / req,
        r.cpu_s[0] * 1e6 / req,
        r.cpu_s[1] * 1e6 / req,
        r.cpu_s[2] * 1e6 / req,
        r.fe_bytes as f64 / req,
        r.p99_ms,
        r.steal_pct.unwrap_or(f64::NAN),
        r.bytes_error.as_ref().map(|e| format!("  WRONG BYTES: {e}")).unwrap_or_default(),
        if r.stalled > 0 { format!("  stalled {}", r.stalled) } else { String::new() },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_order_holds_the_three_configurations() {
        let mut seed = 12345;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..50 {
            let order = shuffled(&mut seed);
            seen.insert(order.map(Config::name));
            let mut names = order.map(Config::name);
            names.sort_unstable();
            assert_eq!(names, ["disc", "nginx", "ours"]);
        }
        assert!(seen.len() > 1, "the order changes");
    }
}
