//! `iolab disksim record`: runs a command under strace, writes its file I/O as an iolab file
//! trace ([`iolab_disksim::record`]), and with `--compare N` replays it on a calibrated device and
//! compares with the command's measured wall time (N runs without strace, each with the
//! traced files' pages dropped first).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use iolab_disksim::calibrate::drop_file_cache;
use iolab_disksim::record::{parse_strace, replay, EventOp, FileTrace, STRACE_ARGS, TRACE_SET};
use iolab_disksim::report::write_json;
use serde::Serialize;

use super::host::print_host;

#[derive(Args, Debug)]
pub struct RecordArgs {
    /// Where to write the file trace (refuses to replace a file that is not an iolab file
    /// trace).
    #[arg(long, default_value = "iolab-record.trace")]
    pub out: PathBuf,
    /// Keep only the files under these directories (repeatable; default every regular path
    /// except /dev, /proc, /sys).
    #[arg(long)]
    pub only_under: Vec<PathBuf>,
    /// After recording, run the command N more times without strace (each with the traced
    /// files' cached pages dropped: a cold cache, as the simulation starts) and compare the
    /// median wall time with the replay on `--config`.
    #[arg(long, default_value_t = 0)]
    pub compare: u32,
    /// Device config for the replay (a `calibrate --out` file), needed with --compare.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Keep strace's own output here.
    #[arg(long)]
    pub strace_out: Option<PathBuf>,
    /// Write the summary (and the comparison) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

#[derive(Serialize)]
struct Summary {
    command: String,
    events: usize,
    files: usize,
    read_bytes: u64,
    write_bytes: u64,
    fsyncs: usize,
    lost: std::collections::BTreeMap<String, u64>,
    lost_bytes: u64,
    skipped_lines: u64,
    strace_overhead_us: f64,
    traced_wall_s: f64,
    compare: Option<Comparison>,
}

#[derive(Serialize)]
struct Comparison {
    runs_wall_s: Vec<f64>,
    real_wall_s: f64,
    spread_pct: f64,
    sim_s: f64,
    error_pct: f64,
    real_mb_s: f64,
    sim_mb_s: f64,
    sim_wall_s: f64,
}

fn strace_available() -> Result<()> {
    match Command::new("strace")
        .arg("-V")
        .stdout(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => Ok(()),
        _ => bail!("strace not found (Debian package: strace)"),
    }
}

/// Our scratch directory (strace's output, the overhead probe's file), removed on drop.
struct Scratch(PathBuf);
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn wall(cmd: &mut Command) -> Result<f64> {
    let t = Instant::now();
    let st = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed: {st}");
    }
    Ok(t.elapsed().as_secs_f64())
}

/// strace's cost per traced call (ms): `dd` reading a cached file of ours 4 KiB at a time
/// (2 traced calls per block), with and without strace, minus the same for 0 blocks
/// (start-up), best of 3.
fn strace_overhead_ms(dir: &Path) -> Result<f64> {
    let f = dir.join("probe.dat");
    std::fs::write(&f, vec![7u8; 8 << 20])?;
    let blocks = 2048u64;
    let run = |count: u64, traced: bool| -> Result<f64> {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let mut c = if traced {
                let mut c = Command::new("strace");
                c.args(STRACE_ARGS)
                    .arg("-e")
                    .arg(TRACE_SET)
                    .arg("-o")
                    .arg(dir.join("probe.strace"))
                    .arg("dd");
                c
            } else {
                Command::new("dd")
            };
            c.arg(format!("if={}", f.display()))
                .arg("of=/dev/null")
                .arg("bs=4k")
                .arg(format!("count={count}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            best = best.min(wall(&mut c)?);
        }
        Ok(best)
    };
    let _ = run(blocks, false)?; // caches the file
    let d = (run(blocks, true)? - run(blocks, false)?) - (run(0, true)? - run(0, false)?);
    Ok((d * 1000.0 / (2 * blocks) as f64).max(0.0))
}

/// Drops the cached pages of the trace's files that exist (written ones are synced first, so
/// that the drop is complete). Opens read-only: nothing is written but what the command wrote.
fn drop_cached(t: &FileTrace) {
    for f in &t.files {
        drop_file_cache(Path::new(&f.path));
    }
}

pub(super) fn record_cmd(a: RecordArgs) -> Result<()> {
    if a.compare > 0 && a.config.is_none() {
        bail!("--compare needs --config CAL.toml (a `calibrate --out` file) for the replay");
    }
    if a.out.exists() {
        let head = std::fs::read(&a.out).unwrap_or_default();
        if !head.starts_with(b"# iolab file trace") {
            bail!(
                "{} exists and is not an iolab file trace: not replacing it",
                a.out.display()
            );
        }
    }
    strace_available()?;
    let scratch =
        Scratch(std::env::temp_dir().join(format!("iolab-disksim-record-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&scratch.0); // our own pid: a leftover of this process
    std::fs::create_dir(&scratch.0).with_context(|| format!("creating {}", scratch.0.display()))?;
    let raw = a
        .strace_out
        .clone()
        .unwrap_or_else(|| scratch.0.join("cmd.strace"));
    let (prog, args) = a.command.split_first().context("no command given")?;
    eprintln!("record: measuring strace's own cost per call (dd on a file of ours)");
    let overhead = strace_overhead_ms(&scratch.0)?;
    let mut c = Command::new("strace");
    c.args(STRACE_ARGS)
        .arg("-e")
        .arg(TRACE_SET)
        .arg("-o")
        .arg(&raw)
        .arg("--")
        .arg(prog)
        .args(args);
    let traced_wall = wall(&mut c)?;
    let text = std::fs::read_to_string(&raw)
        .with_context(|| format!("reading strace's output {}", raw.display()))?;
    let only: Vec<String> = a
        .only_under
        .iter()
        .map(|p| {
            std::fs::canonicalize(p)
                .unwrap_or_else(|_| p.clone())
                .to_string_lossy()
                .to_string()
        })
        .collect();
    let (mut trace, lost, lost_bytes, skipped) = parse_strace(&text, only).finish();
    trace.strace_overhead_ms = overhead;
    std::fs::write(&a.out, trace.to_text())
        .with_context(|| format!("writing {}", a.out.display()))?;
    let cmdline = a
        .command
        .iter()
        .map(|s| s.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let mut s = Summary {
        command: cmdline,
        events: trace.events.len(),
        files: trace.files.len(),
        read_bytes: trace.bytes(EventOp::Read),
        write_bytes: trace.bytes(EventOp::Write),
        fsyncs: trace
            .events
            .iter()
            .filter(|e| matches!(e.op, EventOp::Fsync | EventOp::Fdatasync))
            .count(),
        lost,
        lost_bytes,
        skipped_lines: skipped,
        strace_overhead_us: overhead * 1000.0,
        traced_wall_s: traced_wall,
        compare: None,
    };
    println!(
        "recorded    {}: {} calls on {} files, {:.1} MiB read, {:.1} MiB written, {} fsync/fdatasync; {:.3} s under strace",
        a.out.display(),
        s.events,
        s.files,
        s.read_bytes as f64 / 1048576.0,
        s.write_bytes as f64 / 1048576.0,
        s.fsyncs,
        traced_wall
    );
    println!(
        "not replayed {} (kernel-side copies moved {} bytes); lines not understood: {skipped}; strace's cost {:.1} µs per call (subtracted from the gaps)",
        if s.lost.is_empty() {
            "nothing".to_string()
        } else {
            s.lost
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        lost_bytes,
        overhead * 1000.0
    );
    if a.compare > 0 {
        let config = a.config.as_ref().expect("checked above");
        let mut runs = Vec::new();
        for _ in 0..a.compare {
            drop_cached(&trace);
            let mut c = Command::new(prog);
            c.args(args);
            runs.push(wall(&mut c)?);
        }
        let mut sorted = runs.clone();
        sorted.sort_by(f64::total_cmp);
        let real = sorted[sorted.len() / 2];
        let spread = (sorted[sorted.len() - 1] - sorted[0]) / real * 100.0;
        let rp = replay(&trace, config)?;
        let (sim_s, sim_wall) = (rp.sim_s, rp.wall_s);
        print_host(Some(&[]), &rp.host_stats);
        let bytes = (s.read_bytes + s.write_bytes) as f64;
        let cmp = Comparison {
            runs_wall_s: runs,
            real_wall_s: real,
            spread_pct: spread,
            sim_s,
            error_pct: (sim_s - real) / real * 100.0,
            real_mb_s: bytes / real / 1e6,
            sim_mb_s: if sim_s > 0.0 {
                bytes / sim_s / 1e6
            } else {
                0.0
            },
            sim_wall_s: sim_wall,
        };
        println!(
            "compare     real {:.3} s (median of {}, spread {:.0}%, cold: the files' pages dropped before each run) vs simulated {:.3} s: error {:+.1}%; {:.1} vs {:.1} MB/s; simulated in {:.3} s",
            real, a.compare, spread, sim_s, cmp.error_pct, cmp.real_mb_s, cmp.sim_mb_s, sim_wall
        );
        println!("            (the real time includes the process's start and exit, the simulation starts at its first traced call)");
        s.compare = Some(cmp);
    }
    write_json(a.json.as_deref(), &s)?;
    Ok(())
}
