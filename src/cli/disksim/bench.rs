//! `iolab disksim bench`: the simulator's speed.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use iolab_disksim::engine::Simulator;
use iolab_disksim::hdd;
use iolab_disksim::report::{machine, write_json};
use iolab_disksim::workload::{Address, Dist, Generator, WorkloadSpec};
use serde::Serialize;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Requests per workload (default 1,000,000; 100,000 with --quick).
    #[arg(long)]
    pub requests: Option<u64>,
    /// 100,000 requests per workload (about a second in all): a check, not a figure.
    #[arg(long, conflicts_with = "requests")]
    pub quick: bool,
    /// Write the figures as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Serialize)]
struct BenchResult {
    device: String,
    workload: String,
    requests: u64,
    wall_s: f64,
    /// CPU time of the simulating thread (s): on a shared machine the fair measure of what
    /// one core does.
    cpu_s: f64,
    requests_per_s: f64,
    requests_per_cpu_s: f64,
    sim_s: f64,
    sim_per_wall: f64,
    sim_per_cpu: f64,
}

/// CPU time of the calling thread in seconds (Linux schedstat), if available.
fn thread_cpu_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns / 1e9)
}

pub(super) fn bench(a: BenchArgs) -> Result<()> {
    let requests = a
        .requests
        .unwrap_or(if a.quick { 100_000 } else { 1_000_000 });
    if requests == 0 {
        bail!("--requests must be at least 1");
    }
    let parv = iolab_disksim::default_valid_dir().join("barracuda.parv");
    let spec = hdd::HddSpec::from_disksim(&parv, None)?;
    let blocks = spec.blocks();
    let mut out = Vec::new();
    let workloads = [
        ("random 4 KiB reads, closed loop QD1", Address::Random, 1.0),
        (
            "sequential 4 KiB reads, closed loop QD1",
            Address::Sequential { start: 0 },
            1.0,
        ),
        (
            "random 4 KiB, 2/3 reads, closed loop QD1",
            Address::Random,
            0.66,
        ),
    ];
    println!("machine: {}", machine());
    println!(
        "{:<42} {:>9} {:>7} {:>7} {:>11} {:>11} {:>10} {:>10}",
        "workload (HDD: Seagate Barracuda model)",
        "requests",
        "wall s",
        "cpu s",
        "req/s wall",
        "req/s cpu",
        "sim/wall",
        "sim/cpu"
    );
    for (name, address, rf) in workloads {
        let w = WorkloadSpec {
            requests,
            read_fraction: rf,
            size: Dist::Constant { value: 8.0 },
            address,
            span: None,
            align: 8,
            interarrival: None,
            depth: 1,
            think: None,
            seed: 1,
        };
        let mut src = Generator::new(w, blocks)?;
        let mut sim = Simulator::new(vec![Box::new(hdd::Hdd::new(spec.clone()))]);
        let c0 = thread_cpu_s();
        let t0 = Instant::now();
        let mut count = 0u64;
        let totals = sim.run(&mut src, &mut |_| count += 1)?;
        let wall = t0.elapsed().as_secs_f64().max(1e-9);
        let cpu = match (c0, thread_cpu_s()) {
            (Some(a), Some(b)) if b > a => b - a,
            _ => wall,
        };
        let r = BenchResult {
            device: spec.name.clone(),
            workload: name.into(),
            requests: count,
            wall_s: wall,
            cpu_s: cpu,
            requests_per_s: count as f64 / wall,
            requests_per_cpu_s: count as f64 / cpu,
            sim_s: totals.sim_end / 1000.0,
            sim_per_wall: totals.sim_end / 1000.0 / wall,
            sim_per_cpu: totals.sim_end / 1000.0 / cpu,
        };
        println!(
            "{:<42} {:>9} {:>7.3} {:>7.3} {:>11.0} {:>11.0} {:>9.0}x {:>9.0}x",
            r.workload,
            r.requests,
            r.wall_s,
            r.cpu_s,
            r.requests_per_s,
            r.requests_per_cpu_s,
            r.sim_per_wall,
            r.sim_per_cpu
        );
        out.push(r);
    }
    write_json(
        a.json.as_deref(),
        &serde_json::json!({"machine": machine(), "results": out}),
    )?;
    Ok(())
}
