//! `iolab disksim ...` subcommands.

use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::config::Config;
use crate::engine::{Simulator, Source};
use crate::request::{CacheOutcome, Completion, Op};
use crate::trace::{Format, TraceSource};
use crate::validate;
use crate::workload::{Address, Dist, Generator, WorkloadSpec};

#[derive(Args, Debug)]
pub struct DisksimArgs {
    #[command(subcommand)]
    pub command: DisksimCommand,
}

#[derive(Subcommand, Debug)]
// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
pub enum DisksimCommand {
    /// Replay DiskSim's real-disk validation traces on our disk models and score them
    /// (demerit figure, mean response time, simulation speed).
    ValidateDisksim(ValidateArgs),
    /// Simulate a trace (or the config's [workload]) on the configured device.
    Run(RunArgs),
    /// Measure the simulator's speed: 1,000,000 requests, random and sequential.
    Bench(BenchArgs),
    /// Measure a real device through a file created in DIR (O_DIRECT, fio): latency and
    /// throughput by size, read/write, sequential/random, queue depth; seek profile;
    /// write-cache behaviour; host settings. Writes a measured-device config for `run`.
    Calibrate(CalibrateArgs),
    /// Run real fio (in a memory cgroup) and the simulator on the same jobs and compare them
    /// job by job: throughput, mean/p50/p99 latency, demerit, simulation speed.
    Validate(LinuxValidateArgs),
    /// Run a command under strace and write its file I/O (read/write/pread/pwrite/readv/
    /// writev, lseek, fsync/fdatasync, fadvise, with sizes and offsets per file) as an iolab
    /// file trace; `run --trace T --format files` replays it; `--compare N --config CAL`
    /// also times the command N times without strace and compares with the replay.
    Record(crate::recordcli::RecordArgs),
}

#[derive(Args, Debug)]
pub struct LinuxValidateArgs {
    /// Directory on the device to test (files are created there and removed at the end).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Measured-device config from an earlier `calibrate --out` (default: run
    /// `calibrate` first, separately from the validation runs).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Smaller suite (32 and 512 KiB, 3 runs, 1 s jobs, 64 MiB cgroup): about 5 minutes.
    #[arg(long)]
    pub quick: bool,
    /// Only the jobs whose name contains one of these (comma-separated), e.g. randread-32k.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Runs of each job (default 3 with --quick, 5 without), plus one with fio's per-request
    /// latency log for the latency distribution.
    #[arg(long)]
    pub runs: Option<u32>,
    /// Seconds per job (default 1 with --quick, 3 without).
    #[arg(long)]
    pub runtime: Option<f64>,
    /// Cold-case file size (fio size syntax; default 96m with --quick, 256m without).
    #[arg(long)]
    pub file_size: Option<String>,
    /// Memory cgroup limit (fio size syntax; default 64m with --quick, 128m without).
    #[arg(long)]
    pub mem: Option<String>,
    /// Parent directory of the cgroup (default: the memory controller's root).
    #[arg(long)]
    pub cgroup_root: Option<PathBuf>,
    /// Write every job's real and simulated figures (and the machine) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// HTML report (table, throughput bars, latency CDFs).
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Fail if the mean throughput error exceeds the value recorded in this JSON
    /// ({"mean_abs_error_pct": X, "spread_pct": S}) by more than the run-to-run spread.
    #[arg(long)]
    pub check: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// The simulator alone: no fio, no cgroup, no file created; prints each job's simulated
    /// figures and simulated time / wall time (the fastest of `--runs` repeats, default 1).
    /// Needs --calibration.
    #[arg(long, requires = "calibration", conflicts_with_all = ["html", "check"])]
    pub sim_only: bool,
}

#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Directory on the device to measure (a file is created there and removed at the end).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Fewer points and shorter runs: under 2 minutes (512 MiB file, 250 ms per point).
    #[arg(long)]
    pub quick: bool,
    /// Write the measured-device config (TOML) here (refuses to replace a file it did not
    /// write).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write every figure as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// Directory with NAME.parv / NAME.trace pairs (default: the copy in the repository,
    /// crates/sim/disksim/data/disksim-valid).
    pub dir: Option<PathBuf>,
    /// Only these disks (file stems), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub disks: Vec<String>,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the HTML report (table and response-time CDF per disk) here.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Fail (exit 1) if a disk's demerit exceeds the value recorded in this JSON file
    /// ({"disk": max_demerit_ms, ...}).
    #[arg(long)]
    pub check: Option<PathBuf>,
    /// Write DIR/DISK.csv per disk: each request's real and simulated response time (ms),
    /// the drive's own hit/miss label, ours, and the simulated overhead/seek/rotation/
    /// transfer/bus split. The directory is created if missing.
    #[arg(long, value_name = "DIR")]
    pub per_request: Option<PathBuf>,
    /// Also print, per disk, simulated minus real response time by what the model did with
    /// each request (write, read hit, read miss without a seek, by seek time): where a model
    /// errs. Always in the JSON (`by_class`).
    #[arg(long)]
    pub by_class: bool,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// TOML configuration (device and optional [workload]); see crates/sim/disksim/configs/.
    #[arg(long)]
    pub config: PathBuf,
    /// Trace to replay (default: the config's [workload] generator).
    #[arg(long, conflicts_with = "fio")]
    pub trace: Option<PathBuf>,
    /// fio job file to simulate (rw, rwmixread, bs, bsrange, size, io_size, filesize,
    /// nrfiles, iodepth, ioengine, direct, sync, fadvise_hint, numjobs, runtime, time_based,
    /// rate, thinktime, norandommap, randseed, invalidate, filename): through this host's
    /// page cache over the configured device; prints per-job results as fio does.
    #[arg(long)]
    pub fio: Option<PathBuf>,
    /// With --fio: simulate despite options the simulator does not model (each is listed as
    /// a warning); without it they are an error.
    #[arg(long, requires = "fio")]
    pub allow_unknown: bool,
    /// Trace format: validate, ascii, fio, blkparse, msr, iolab, files (`record`'s file trace, replayed through the host stack) (default: guessed).
    #[arg(long)]
    pub format: Option<String>,
    /// Write the summary as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write one CSV line per request here (arrival, queue wait, cache, seek, rotation, ...).
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// The host stack (page cache, block layer) above the device.
    #[command(flatten)]
    pub host: crate::host::HostArgs,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Requests per workload.
    #[arg(long, default_value_t = 1_000_000)]
    pub requests: u64,
    /// Write the figures as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub fn run(a: DisksimArgs) -> Result<()> {
    match a.command {
        DisksimCommand::ValidateDisksim(v) => validate_disksim(v),
        DisksimCommand::Run(r) => run_cmd(r),
        DisksimCommand::Bench(b) => bench(b),
        DisksimCommand::Calibrate(c) => calibrate_cmd(c),
        DisksimCommand::Validate(v) => linux_validate_cmd(v),
        DisksimCommand::Record(r) => crate::recordcli::record_cmd(r),
    }
}

/// Writes `value` as pretty JSON to `path` when one was asked for (`--json`).
pub fn write_json(path: Option<&Path>, value: &impl Serialize) -> Result<()> {
    if let Some(p) = path {
        std::fs::write(p, serde_json::to_string_pretty(value)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Refuses to replace a file this tool did not write (its first line must start with
/// `marker`).
pub fn check_replaceable(p: &Path, marker: &str) -> Result<()> {
    if p.exists() {
        let head = std::fs::read(p).unwrap_or_default();
        if !head.starts_with(marker.as_bytes()) {
            bail!(
                "{} exists and was not written by iolab disksim: refusing to replace it (choose another path)",
                p.display()
            );
        }
    }
    Ok(())
}

fn progress_bar(quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(1);
    b.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}] {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    b
}

/// How old a calibration may be before `validate` warns: on the shared VM this was built
/// on, the device's latencies and the host's copy costs drift within hours (28 Nov, seven
/// minutes apart: the 36 jobs 11.8% off on average with a calibration just taken, 31.4%
/// with one taken 1 h 45 min before; crates/sim/disksim/README.md).
pub const CALIBRATION_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// A warning when the calibration file `path` was written more than
/// [`CALIBRATION_MAX_AGE`] before `now` (its modification time).
fn stale_calibration(path: &std::path::Path, now: std::time::SystemTime) -> Option<String> {
    let written = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
    let age = now.duration_since(written).ok()?;
    (age > CALIBRATION_MAX_AGE).then(|| {
        let mins = age.as_secs() / 60;
        format!(
            "the calibration {} was written {} h {:02} min ago: this machine's device and copy \
             costs may have moved since (they drift within hours on a shared VM); for a \
             validation that measures the model, calibrate again just before",
            path.display(),
            mins / 60,
            mins % 60
        )
    })
}

/// A progress callback `(done, total, what)` that drives `bar`.
fn on_bar(bar: &indicatif::ProgressBar) -> impl FnMut(u64, u64, &str) + '_ {
    move |done, total, what| {
        bar.set_length(total);
        bar.set_position(done);
        bar.set_message(what.to_string());
    }
}

fn linux_validate_cmd(a: LinuxValidateArgs) -> Result<()> {
    let mut settings = crate::linuxval::Settings::new(a.quick);
    if let Some(r) = a.runs {
        if r == 0 || r > 100 {
            bail!("--runs must be within 1..=100");
        }
        settings.runs = r;
    }
    if let Some(t) = a.runtime {
        if !(t > 0.0 && t <= 3600.0) {
            bail!("--runtime must be within (0, 3600] seconds");
        }
        settings.runtime_ms = (t * 1000.0) as u64;
    }
    let size = |s: &str, what: &str| {
        crate::fio::parse_size(s).map_err(|e| anyhow::anyhow!("{what} {s}: {e}"))
    };
    if let Some(m) = &a.mem {
        settings.cgroup_limit = size(m, "--mem")?.max(16 << 20);
        settings.warm_file = settings.cgroup_limit * 3 / 8;
    }
    if let Some(f) = &a.file_size {
        settings.cold_file = size(f, "--file-size")?.max(1 << 20);
    }
    if let Some(p) = &a.json {
        check_replaceable(p, "{")?;
    }
    let flag = crate::calibrate::install_interrupt_flag()?;
    let bar = progress_bar(a.quiet);
    if a.sim_only {
        let cal = a
            .calibration
            .as_deref()
            .expect("clap requires --calibration");
        let model = crate::linuxval::Model::load(cal, &a.dir)?;
        let v = crate::linuxval::simulate_suite(
            &a.dir,
            &model,
            &settings,
            &a.only,
            a.runs.unwrap_or(1),
            &flag,
            &mut on_bar(&bar),
        );
        bar.finish_and_clear();
        let v = v?;
        print!("{}", crate::linuxval::sim_only_table(&v));
        return write_json(
            a.json.as_deref(),
            &serde_json::json!({
                "machine": machine(),
                "calibration": cal.display().to_string(),
                "settings": settings,
                "results": v,
            }),
        );
    }
    let _cal_dir;
    let cal_path = match &a.calibration {
        Some(p) => {
            if let Some(w) = stale_calibration(p, std::time::SystemTime::now()) {
                eprintln!("warning: {w}");
            }
            p.clone()
        }
        None => {
            println!("no --calibration: calibrating first (a separate run; --quick)");
            let c = crate::calibrate::calibrate(&a.dir, true, &flag, &mut |d, t, w| {
                bar.set_length(t);
                bar.set_position(d);
                bar.set_message(format!("calibrate: {w}"));
            })?;
            print!("{}", crate::calibrate::table(&c));
            let d = crate::calibrate::tempdir("validate-cal")?;
            let p = d.path.join("calibration.toml");
            std::fs::write(&p, crate::calibrate::config_toml(&c))?;
            _cal_dir = d;
            p
        }
    };
    let model = crate::linuxval::Model::load(&cal_path, &a.dir)?;
    let r = crate::linuxval::validate(
        &a.dir,
        &model,
        settings,
        a.cgroup_root.as_deref(),
        &a.only,
        &flag,
        &mut on_bar(&bar),
    );
    bar.finish_and_clear();
    let r = r?;
    print!("{}", crate::linuxval::table(&r));
    write_json(a.json.as_deref(), &r)?;
    if let Some(p) = &a.html {
        check_replaceable(p, "<!doctype html>")?;
        std::fs::write(p, crate::linuxval::html(&r))
            .with_context(|| format!("writing {}", p.display()))?;
        println!("report: {}", p.display());
    }
    if let Some(p) = &a.check {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let b: crate::linuxval::Baseline =
            serde_json::from_str(&text).with_context(|| format!("{}", p.display()))?;
        println!("{}", crate::linuxval::check(&r, &b)?);
    }
    Ok(())
}

fn calibrate_cmd(a: CalibrateArgs) -> Result<()> {
    const MARK: &str = "# Written by `iolab disksim calibrate";
    if let Some(p) = &a.out {
        check_replaceable(p, MARK)?;
    }
    if let Some(p) = &a.json {
        check_replaceable(p, "{")?;
    }
    let flag = crate::calibrate::install_interrupt_flag()?;
    let bar = progress_bar(a.quiet);
    let c = crate::calibrate::calibrate(&a.dir, a.quick, &flag, &mut on_bar(&bar));
    bar.finish_and_clear();
    let c = c?;
    print!("{}", crate::calibrate::table(&c));
    if let Some(p) = &a.out {
        std::fs::write(p, crate::calibrate::config_toml(&c))
            .with_context(|| format!("writing {}", p.display()))?;
        println!(
            "config: {} (iolab disksim run --config {} ...)",
            p.display(),
            p.display()
        );
    }
    write_json(a.json.as_deref(), &c)?;
    Ok(())
}

pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    format!("{cpu}, {cores} cores, {}", std::env::consts::ARCH)
}

fn validate_disksim(a: ValidateArgs) -> Result<()> {
    let dir = a.dir.unwrap_or_else(crate::default_valid_dir);
    let mut results = Vec::new();
    for (name, parv, trace) in validate::find_disks(&dir)? {
        if !a.disks.is_empty() && !a.disks.contains(&name) {
            continue;
        }
        let r = match &a.per_request {
            Some(d) => {
                std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
                let p = d.join(format!("{name}.csv"));
                check_replaceable(&p, validate::PER_REQUEST_HEADER)?;
                let f = std::fs::File::create(&p)
                    .with_context(|| format!("creating {}", p.display()))?;
                let mut w = std::io::BufWriter::new(f);
                let r = validate::run_disk_logged(&name, &parv, &trace, Some(&mut w))?;
                std::io::Write::flush(&mut w)
                    .with_context(|| format!("writing {}", p.display()))?;
                r
            }
            None => validate::run_disk(&name, &parv, &trace)?,
        };
        results.push(r);
    }
    if results.is_empty() {
        bail!(
            "no disk selected (known: {})",
            validate::find_disks(&dir)?
                .into_iter()
                .map(|d| d.0)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    print!("{}", validate::table(&results));
    println!("demerit: RMS of real vs simulated response-time distributions at 10,000 percentiles; goal: <= DiskSim's and |mean| <= 5%");
    println!("req rms: RMS of simulated minus real response time request by request (ms); DiskSim: DiskSim 4.0's on the same trace");
    if a.by_class {
        println!();
        print!("{}", validate::class_table(&results));
        println!("mean, rms: of simulated minus real response time over the class's requests (negative mean: the model is too fast)");
    }
    write_json(a.json.as_deref(), &results)?;
    if let Some(p) = &a.html {
        std::fs::write(p, validate::html(&results, &machine()))
            .with_context(|| format!("writing {}", p.display()))?;
        println!("report: {}", p.display());
    }
    if let Some(p) = &a.check {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let limits: std::collections::BTreeMap<String, f64> =
            serde_json::from_str(&text).with_context(|| format!("{}", p.display()))?;
        let mut bad = Vec::new();
        for r in &results {
            if let Some(&max) = limits.get(&r.disk) {
                if r.demerit_ms > max {
                    bad.push(format!(
                        "{}: demerit {:.4} ms > recorded {:.4} ms",
                        r.disk, r.demerit_ms, max
                    ));
                }
            }
        }
        if !bad.is_empty() {
            bail!("demerit regressed:\n  {}", bad.join("\n  "));
        }
        println!(
            "check: every demerit within the values recorded in {}",
            p.display()
        );
    }
    Ok(())
}

/// Streaming statistics of a run.
#[derive(Default)]
struct Summary {
    n: u64,
    reads: u64,
    bytes: u64,
    sum_resp: f64,
    hits: u64,
    partial: u64,
    misses: u64,
    writeback: u64,
    seek: f64,
    rotation: f64,
    transfer: f64,
    first_arrival: Option<f64>,
    last_completion: f64,
    hist: Option<hdrhistogram::Histogram<u64>>,
}

impl Summary {
    fn new() -> Self {
        Summary {
            hist: hdrhistogram::Histogram::new(3).ok(),
            ..Default::default()
        }
    }
    fn add(&mut self, c: &Completion) {
        self.n += 1;
        if c.req.op == Op::Read {
            self.reads += 1;
        }
        self.bytes += c.req.bytes();
        let r = c.response();
        self.sum_resp += r;
        match c.rec.cache {
            CacheOutcome::Hit => self.hits += 1,
            CacheOutcome::Partial => self.partial += 1,
            CacheOutcome::Miss => self.misses += 1,
            CacheOutcome::WriteBack => self.writeback += 1,
            CacheOutcome::None => {}
        }
        self.seek += c.rec.seek;
        self.rotation += c.rec.rotation;
        self.transfer += c.rec.transfer;
        self.first_arrival = Some(
            self.first_arrival
                .map_or(c.rec.arrival, |f: f64| f.min(c.rec.arrival)),
        );
        self.last_completion = self.last_completion.max(c.rec.completion);
        if let Some(h) = &mut self.hist {
            let _ = h.record(((r * 1e6) as u64).max(1)); // ns
        }
    }
}

#[derive(Serialize)]
struct RunReport {
    device: String,
    requests: u64,
    sim_time_ms: f64,
    wall_s: f64,
    sim_per_wall: f64,
    iops: f64,
    throughput_mb_s: f64,
    mean_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    read_fraction: f64,
    cache_hit_ratio: f64,
    cache_partial_ratio: f64,
    write_back_ratio: f64,
    seek_share: f64,
    rotation_share: f64,
    transfer_share: f64,
    device_stats: Vec<(String, f64)>,
    /// The host stack's parameters (None: `--host none`).
    host: Option<Vec<(String, String)>>,
    /// Page-cache and block-layer counters.
    host_stats: Vec<(String, f64)>,
}

fn open_trace(path: &Path, format: Option<&str>) -> Result<Box<dyn Source>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut r = BufReader::new(f);
    let fmt = match format {
        Some(f) => Format::parse(f)?,
        None => {
            use std::io::BufRead;
            let buf = r.fill_buf()?;
            let first = String::from_utf8_lossy(&buf[..buf.len().min(512)])
                .lines()
                .next()
                .unwrap_or("")
                .to_string();
            let g = Format::guess(&path.to_string_lossy(), &first);
            eprintln!(
                "trace format: {g:?} (guessed; --format to choose) — units: {}",
                g.units()
            );
            g
        }
    };
    Ok(Box::new(TraceSource::new(r, fmt)))
}

fn run_cmd(a: RunArgs) -> Result<()> {
    if let Some(job) = &a.fio {
        return run_fio(&a, job);
    }
    if let Some(t) = &a.trace {
        let is_files = match a.format.as_deref() {
            Some(f) => f.eq_ignore_ascii_case("files"),
            None => std::fs::read(t)
                .map(|b| b.starts_with(b"# iolab file trace"))
                .unwrap_or(false),
        };
        if is_files {
            return run_file_trace(&a, t);
        }
    }
    let cfg = Config::load(&a.config)?;
    let dev = cfg.device(&a.config)?;
    let mut source: Box<dyn Source> = match &a.trace {
        Some(t) => open_trace(t, a.format.as_deref())?,
        None => match &cfg.workload {
            Some(w) => Box::new(Generator::new(w.clone(), dev.blocks)?),
            None => bail!(
                "no --trace and no [workload] section in {}",
                a.config.display()
            ),
        },
    };
    let total = source.len_hint();
    let mut log = RequestLog::create(a.log.as_deref())?;
    let bar = if a.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let b = match total {
            Some(n) => indicatif::ProgressBar::new(n),
            None => indicatif::ProgressBar::new_spinner(),
        };
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {pos}/{len} requests [{elapsed_precise}] {per_sec}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    };
    let description = dev.description.clone();
    let host = a.host.params()?;
    let mut sim = Simulator::new(match &host {
        Some(h) => h.stack_on(dev.component)?,
        None => vec![dev.component],
    });
    let mut sum = Summary::new();
    let t0 = Instant::now();
    let totals = sim.run(source.as_mut(), &mut |c| {
        sum.add(c);
        if sum.n % 65536 == 0 {
            bar.set_position(sum.n);
        }
        if let Some(l) = &mut log {
            l.write(c);
        }
    })?;
    bar.finish_and_clear();
    let wall = t0.elapsed().as_secs_f64().max(1e-9);
    if let Some(l) = log {
        l.finish()?;
    }
    let span = (sum.last_completion - sum.first_arrival.unwrap_or(0.0)).max(1e-9);
    let n = sum.n.max(1) as f64;
    let q = |p: f64| {
        sum.hist
            .as_ref()
            .map(|h| h.value_at_quantile(p) as f64 / 1e6)
            .unwrap_or(f64::NAN)
    };
    let device_stats = sim
        .components()
        .last()
        .map(|c| c.stats())
        .unwrap_or_default();
    let comps = sim.components();
    let host_stats: Vec<(String, f64)> = comps[..comps.len() - 1]
        .iter()
        .flat_map(|c| c.stats())
        .collect();
    let rep = RunReport {
        device: description,
        requests: totals.requests,
        sim_time_ms: totals.sim_end,
        wall_s: wall,
        sim_per_wall: totals.sim_end / 1000.0 / wall,
        iops: sum.n as f64 / (span / 1000.0),
        throughput_mb_s: sum.bytes as f64 / 1e6 / (span / 1000.0),
        mean_ms: sum.sum_resp / n,
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        p999_ms: q(0.999),
        max_ms: sum
            .hist
            .as_ref()
            .map(|h| h.max() as f64 / 1e6)
            .unwrap_or(f64::NAN),
        read_fraction: sum.reads as f64 / n,
        cache_hit_ratio: sum.hits as f64 / n,
        cache_partial_ratio: sum.partial as f64 / n,
        write_back_ratio: sum.writeback as f64 / n,
        seek_share: sum.seek / sum.sum_resp.max(1e-12),
        rotation_share: sum.rotation / sum.sum_resp.max(1e-12),
        transfer_share: sum.transfer / sum.sum_resp.max(1e-12),
        device_stats,
        host: host.map(|h| h.describe()),
        host_stats,
    };
    println!("device      {}", rep.device);
    println!(
        "requests    {} ({:.1}% reads) in {:.3} s simulated, {:.3} s wall ({:.0}x real time)",
        rep.requests,
        rep.read_fraction * 100.0,
        rep.sim_time_ms / 1000.0,
        rep.wall_s,
        rep.sim_per_wall
    );
    println!(
        "throughput  {:.2} MB/s, {:.1} IOPS",
        rep.throughput_mb_s, rep.iops
    );
    println!(
        "response    mean {:.3} ms, p50 {:.3}, p99 {:.3}, p99.9 {:.3}, max {:.3} ms",
        rep.mean_ms, rep.p50_ms, rep.p99_ms, rep.p999_ms, rep.max_ms
    );
    println!(
        "cache       hits {:.1}%, partial {:.1}%, write-back {:.1}% of requests",
        rep.cache_hit_ratio * 100.0,
        rep.cache_partial_ratio * 100.0,
        rep.write_back_ratio * 100.0
    );
    println!(
        "time split  seek {:.1}%, rotation {:.1}%, media transfer {:.1}% of total response time",
        rep.seek_share * 100.0,
        rep.rotation_share * 100.0,
        rep.transfer_share * 100.0
    );
    crate::host::print_host(rep.host.as_deref(), &rep.host_stats);
    write_json(a.json.as_deref(), &rep)?;
    Ok(())
}

/// Replays a file trace of `record` through the host stack (this machine's settings) over
/// the configured device.
fn run_file_trace(a: &RunArgs, path: &Path) -> Result<()> {
    if a.log.is_some() {
        bail!("--log is not available for file traces (`record`'s format): their calls are replayed through the host stack as a whole; use --json for the summary");
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let t =
        crate::record::FileTrace::parse(&text).with_context(|| format!("{}", path.display()))?;
    let rp = crate::recordcli::replay(&t, &a.config)?;
    let (sim_s, wall) = (rp.sim_s, rp.wall_s);
    crate::host::print_host(Some(&[]), &rp.host_stats);
    let r = t.bytes(crate::record::EventOp::Read);
    let w = t.bytes(crate::record::EventOp::Write);
    println!(
        "replayed    {}: {} calls on {} files, {:.1} MiB read, {:.1} MiB written",
        path.display(),
        t.events.len(),
        t.files.len(),
        r as f64 / 1048576.0,
        w as f64 / 1048576.0
    );
    println!(
        "simulated   {:.3} s from the first call to the last completion ({:.1} MB/s), in {:.3} s wall",
        sim_s,
        if sim_s > 0.0 { (r + w) as f64 / sim_s / 1e6 } else { 0.0 },
        wall
    );
    if let Some(p) = &a.json {
        let v = serde_json::json!({"calls": t.events.len(), "files": t.files.len(),
            "read_bytes": r, "write_bytes": w, "sim_s": sim_s, "wall_s": wall});
        write_json(Some(p), &v)?;
    }
    Ok(())
}

/// `--log`: one CSV line per completed request.
struct RequestLog {
    out: BufWriter<std::fs::File>,
    path: PathBuf,
    /// The first write error (reported once the run is over).
    err: Option<std::io::Error>,
}

impl RequestLog {
    fn create(path: Option<&Path>) -> Result<Option<RequestLog>> {
        let Some(p) = path else {
            return Ok(None);
        };
        let mut out = BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        );
        writeln!(out, "id,op,lba,sectors,arrival_ms,queue_wait_ms,device_start_ms,cache,overhead_ms,seek_ms,rotation_ms,transfer_ms,bus_ms,completion_ms,response_ms")?;
        Ok(Some(RequestLog {
            out,
            path: p.to_path_buf(),
            err: None,
        }))
    }

    fn write(&mut self, c: &Completion) {
        if self.err.is_some() {
            return;
        }
        let r = &c.rec;
        if let Err(e) = writeln!(
            self.out,
            "{},{},{},{},{:.6},{:.6},{:.6},{},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6}",
            c.req.id,
            c.req.op.letter(),
            c.req.lba,
            c.req.sectors,
            r.arrival,
            r.queue_wait,
            r.device_start,
            r.cache.name(),
            r.overhead,
            r.seek,
            r.rotation,
            r.transfer,
            r.bus,
            r.completion,
            c.response()
        ) {
            self.err = Some(e);
        }
    }

    fn finish(mut self) -> Result<()> {
        if let Some(e) = self.err.take() {
            bail!("writing the request log {}: {e}", self.path.display());
        }
        self.out
            .flush()
            .with_context(|| format!("writing the request log {}", self.path.display()))
    }
}

fn run_fio(a: &RunArgs, job: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(job).with_context(|| format!("reading {}", job.display()))?;
    let jf =
        crate::fio::parse(&text, a.allow_unknown).with_context(|| format!("{}", job.display()))?;
    for w in &jf.warnings {
        eprintln!("warning: {}: {w}", job.display());
    }
    let cfg = Config::load(&a.config)?;
    let dev = cfg.device(&a.config)?;
    let gap = cfg.host_cpu.as_ref().map_or(0.0, |c| c.app_gap_us);
    let mut src = crate::fio::FioSource::new(&jf, 0, dev.blocks)?.with_app_gap_us(gap);
    // --fio simulates file I/O, so a host stack is always there: the one the --host flags
    // ask for, or else this machine's (the device holding the current directory).
    let host = match a.host.params()? {
        Some(h) => h,
        None => match crate::host::HostParams::from_system(".") {
            Ok(h) => h,
            Err(e) => {
                eprintln!("warning: this machine's settings ({e:#}); using Linux's defaults");
                crate::host::HostParams::linux_defaults()
            }
        },
    };
    let capacity_pages = host.page_cache.capacity_pages;
    let ra = host.page_cache.read_ahead_kb;
    println!("device      {}", dev.description);
    println!(
        "host        {}",
        host.describe()
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(c) = &cfg.host_cpu {
        println!(
            "host cpu    buffered-read cost table from the calibration (µs by KiB): {:?}",
            c.cached_read_us
        );
    }
    let mut stats = crate::fio::JobStats::new(&src);
    let chain = crate::fio::host_chain_with_files(
        dev.component,
        &host,
        cfg.host_cpu.as_ref(),
        &src.file_sizes(),
    )?;
    let mut sim = Simulator::new(chain);
    let bar = if a.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new_spinner()
    };
    let mut log = RequestLog::create(a.log.as_deref())?;
    let mut n = 0u64;
    let t0 = Instant::now();
    let totals = sim.run(&mut src, &mut |c| {
        stats.add(c);
        if let Some(l) = &mut log {
            l.write(c);
        }
        n += 1;
        if n % 65536 == 0 {
            bar.set_position(n);
        }
    })?;
    bar.finish_and_clear();
    let wall = t0.elapsed().as_secs_f64().max(1e-9);
    if let Some(l) = log {
        l.finish()?;
    }
    let results = stats.results();
    print!("{}", crate::fio::job_table(&results));
    println!(
        "simulated   {} requests, {:.3} s simulated in {:.3} s wall ({:.0}x real time)",
        totals.requests,
        totals.sim_end / 1000.0,
        wall,
        totals.sim_end / 1000.0 / wall
    );
    if let Some(p) = &a.json {
        let v = serde_json::json!({
            "device": dev.description,
            "page_cache_pages": capacity_pages,
            "read_ahead_kb": ra,
            "jobs": results,
            "requests": totals.requests,
            "sim_time_ms": totals.sim_end,
            "wall_s": wall,
        });
        write_json(Some(p), &v)?;
    }
    Ok(())
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
pub fn thread_cpu_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns / 1e9)
}

fn bench(a: BenchArgs) -> Result<()> {
    if a.requests == 0 {
        bail!("--requests must be at least 1");
    }
    let parv = crate::default_valid_dir().join("barracuda.parv");
    let spec = crate::hdd::HddSpec::from_disksim(&parv, None)?;
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
        "{:<42} {:>9} {:>7} {:>7} {:>11} {:>11} {:>10}",
        "workload (HDD: Seagate Barracuda model)",
        "requests",
        "wall s",
        "cpu s",
        "req/s wall",
        "req/s cpu",
        "sim/cpu"
    );
    for (name, address, rf) in workloads {
        let w = WorkloadSpec {
            requests: a.requests,
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
        let mut sim = Simulator::new(vec![Box::new(crate::hdd::Hdd::new(spec.clone()))]);
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
            "{:<42} {:>9} {:>7.3} {:>7.3} {:>11.0} {:>11.0} {:>9.0}x",
            r.workload,
            r.requests,
            r.wall_s,
            r.cpu_s,
            r.requests_per_s,
            r.requests_per_cpu_s,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_old_calibration_is_warned_about_and_a_fresh_one_is_not() {
        let dir = crate::calibrate::tempdir("stale-cal").unwrap();
        let p = dir.path.join("cal.toml");
        std::fs::write(&p, "").unwrap();
        let now = std::time::SystemTime::now();
        assert_eq!(stale_calibration(&p, now), None);
        let later = now + std::time::Duration::from_secs(2 * 3600 + 5 * 60);
        let w = stale_calibration(&p, later).expect("two hours old");
        assert!(w.contains("2 h 05 min ago"), "{w}");
        assert_eq!(
            stale_calibration(&dir.path.join("missing.toml"), later),
            None
        );
    }
}
