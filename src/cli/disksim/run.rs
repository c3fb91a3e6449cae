//! `iolab disksim run`: a trace, the config's workload, a fio job or a recorded file trace
//! on the configured device, and the summary of the run.

use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use iolab_disksim::config::Config;
use iolab_disksim::engine::{Simulator, Source};
use iolab_disksim::host::HostParams;
use iolab_disksim::report::write_json;
use iolab_disksim::request::{CacheOutcome, Completion, Op};
use iolab_disksim::trace::{Format, TraceSource};
use iolab_disksim::workload::Generator;
use iolab_disksim::{fio, record};
use serde::Serialize;

use super::host::{print_host, HostArgs};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// TOML configuration (device and optional [workload]); see crates/sim/disksim/configs/.
    /// A DiskSim parameter file (.parv, .diskspecs) is taken as it is: an HDD of its disk.
    #[arg(long)]
    pub config: PathBuf,
    /// The disk (disksim_disk block name) of a DiskSim parameter file that has several
    /// (default: the one instantiated first, named on stderr).
    #[arg(long, value_name = "NAME")]
    pub disk: Option<String>,
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
    /// With a trace that numbers its devices (DiskSim's ascii): replay only device N (one
    /// device is modelled; a trace addressing several is an error without this).
    #[arg(long, value_name = "N")]
    pub device: Option<u32>,
    /// Write the summary as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write one CSV line per request here (arrival, queue wait, cache, seek, rotation, ...).
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// `disksim`: also print the response-time figures under DiskSim's statistics names
    /// and buckets (IOdriver / Overall I/O System response time, per-disk seek and rotation),
    /// to compare with a DiskSim `.outv`.
    #[arg(long, value_name = "disksim")]
    pub stats: Option<String>,
    /// The host stack (page cache, block layer) above the device.
    #[command(flatten)]
    pub host: HostArgs,
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
    /// DiskSim's response-time figures (average, std.dev., maximum, buckets).
    disksim: iolab_disksim::system::stats::ResponseStats,
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
        self.disksim.add(r);
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

/// Opens a trace, its format given or guessed (the guess and its reason on stderr), every
/// request checked against the device's `capacity` sectors.
fn open_trace(
    path: &Path,
    format: Option<&str>,
    capacity: u64,
    device: Option<u32>,
    system: Option<std::collections::BTreeMap<u32, u64>>,
) -> Result<TraceSource<BufReader<std::fs::File>>> {
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
            let (g, why) = Format::guess_why(&path.to_string_lossy(), &first);
            eprintln!(
                "note: trace format guessed as {g:?} ({why}; --format to choose) — units: {}",
                g.units()
            );
            g
        }
    };
    let mut src = TraceSource::new(r, fmt).with_capacity(capacity);
    if let Some(d) = device {
        src = src.with_device(d)?;
    }
    if let Some(sys) = system {
        src = src.with_system(sys)?;
    }
    Ok(src)
}

pub(super) fn run_cmd(a: RunArgs) -> Result<()> {
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
    if a.stats.as_deref().is_some_and(|s| s != "disksim") {
        bail!("--stats takes 'disksim' (DiskSim's statistics names)");
    }
    let cfg = Config::load(&a.config)?.with_disk_name(a.disk.as_deref());
    let (dev, system) = match system_of(&a)? {
        Some(s) => s,
        None => (cfg.device(&a.config)?, None),
    };
    for n in &dev.notes {
        eprintln!("note: {n}");
    }
    let system_caps = system.is_some();
    let mut trace = match &a.trace {
        Some(t) => Some(open_trace(
            t,
            a.format.as_deref(),
            dev.blocks,
            a.device,
            system,
        )?),
        None => None,
    };
    let synth = match (&trace, system_caps) {
        (None, true) => iolab_disksim::system::parv::synthio(&a.config)?,
        _ => None,
    };
    let mut source: Box<dyn Source + '_> = match (&mut trace, synth) {
        (Some(t), _) => Box::new(t),
        (None, Some(s)) => Box::new(s),
        (None, None) => match &cfg.workload {
            Some(w) => Box::new(Generator::new(w.clone(), dev.blocks)?),
            None => bail!(
                "no --trace and no [workload] section in {}",
                a.config.display()
            ),
        },
    };
    let total = source.len_hint();
    let mut log = RequestLog::create(a.log.as_deref())?;
    let bar = progress_bar(a.quiet, total);
    let description = dev.description.clone();
    let host = a.host.to_params()?;
    let mut sim = Simulator::new(match &host {
        Some(h) => h.stack().on(dev.component)?,
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
    drop(source);
    if let Some(l) = log {
        l.finish()?;
    }
    if let (Some(t), Some(d)) = (&trace, a.device) {
        let others: u64 = t
            .per_device
            .iter()
            .filter(|(k, _)| **k != d)
            .map(|(_, v)| v)
            .sum();
        if others > 0 {
            eprintln!(
                "note: replayed device {d}'s {} requests; skipped {others} of the trace's other devices ({:?})",
                t.per_device.get(&d).copied().unwrap_or(0),
                t.per_device
            );
        }
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
    print_report(&rep);
    print_host(rep.host.as_deref(), &rep.host_stats);
    if a.stats.is_some() {
        print_disksim_stats(&sum.disksim, &rep.device_stats);
    }
    write_json(a.json.as_deref(), &rep)?;
    Ok(())
}

/// A DiskSim `.parv` that describes a system (several disks, I/O mappings, an organisation
/// other than one disk as it is), unless one disk is chosen (`--disk`, `--device`): the
/// system as the device, and the trace device numbers it serves with their capacities.
#[allow(clippy::type_complexity)]
fn system_of(
    a: &RunArgs,
) -> Result<
    Option<(
        iolab_disksim::config::Device,
        Option<std::collections::BTreeMap<u32, u64>>,
    )>,
> {
    let parv = a.config.extension().is_some_and(|e| e == "parv");
    if !parv || a.disk.is_some() || a.device.is_some() {
        return Ok(None);
    }
    // Without a trace, a .parv with a synthetic workload runs as a system too (its
    // generators address DiskSim's device numbers).
    let synthetic = a.trace.is_none()
        && iolab_disksim::hdd::params::parse_file(&a.config)?
            .find("disksim_synthio")
            .next()
            .is_some();
    if !synthetic && !iolab_disksim::system::parv::describes_system(&a.config)? {
        return Ok(None);
    }
    let l = iolab_disksim::system::parv::load(&a.config)?;
    let caps = l.system.capacities();
    let blocks = caps.values().copied().min().unwrap_or(0);
    let dev = iolab_disksim::config::Device {
        component: Box::new(l.system),
        blocks,
        description: l.description,
        notes: l.notes,
    };
    Ok(Some((dev, Some(caps))))
}

/// The run's response times under DiskSim's names (`--stats disksim`): the requests as
/// "IOdriver" (a system's logical requests as "Overall I/O System" too, and its accesses to
/// the disks), and each disk's seek and rotation averages.
fn print_disksim_stats(st: &iolab_disksim::system::stats::ResponseStats, device: &[(String, f64)]) {
    let get = |k: &str| device.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
    print!("{}", st.disksim_lines("Overall I/O System"));
    match get("access_mean_ms") {
        Some(m) => println!(
            "IOdriver Total Requests handled:\t{}\nIOdriver Response time average: \t{m:.6}",
            get("accesses").unwrap_or(0.0)
        ),
        None => print!("{}", st.disksim_lines("IOdriver")),
    }
    for (i, (name, n)) in device
        .iter()
        .filter(|(k, _)| k.ends_with(".accesses"))
        .enumerate()
    {
        let disk = name.trim_end_matches(".accesses");
        let per = |k: &str| get(&format!("{disk}.{k}")).map(|v| v / n.max(1.0));
        if let (Some(seek), Some(rot)) = (per("seek_ms_total"), per("rotation_ms_total")) {
            println!("Disk #{i} Seek time average: \t{seek:.6}");
            println!("Disk #{i} Rotational latency average: \t{rot:.6}");
        }
    }
    if let (Some(seek), Some(rot), Some(n)) = (
        get("seek_ms_total"),
        get("rotation_ms_total"),
        Some(st.count as f64),
    ) {
        println!("Disk #0 Seek time average: \t{:.6}", seek / n.max(1.0));
        println!(
            "Disk #0 Rotational latency average: \t{:.6}",
            rot / n.max(1.0)
        );
    }
}

/// The replay's progress line (hidden with --quiet): a bar when the length is known.
fn progress_bar(quiet: bool, total: Option<u64>) -> indicatif::ProgressBar {
    if quiet {
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
    }
}

/// The run's summary, for people (--json writes it for programs).
fn print_report(rep: &RunReport) {
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
}

/// Replays a file trace of `record` through the host stack (this machine's settings) over
/// the configured device.
fn run_file_trace(a: &RunArgs, path: &Path) -> Result<()> {
    if a.log.is_some() {
        bail!("--log is not available for file traces (`record`'s format): their calls are replayed through the host stack as a whole; use --json for the summary");
    }
    // streamed: the trace is read twice, never held whole
    let (rp, t) = record::replay_file(path, &a.config)?;
    let (sim_s, wall) = (rp.sim_s, rp.wall_s);
    print_host(Some(&[]), &rp.host_stats);
    let (r, w) = (t.read_bytes, t.written_bytes);
    println!(
        "replayed    {}: {} calls on {} files, {:.1} MiB read, {:.1} MiB written",
        path.display(),
        t.calls,
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
        let v = serde_json::json!({"calls": t.calls, "files": t.files.len(),
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
    let jf = fio::parse(&text, a.allow_unknown).with_context(|| format!("{}", job.display()))?;
    for w in &jf.warnings {
        eprintln!("warning: {}: {w}", job.display());
    }
    let cfg = Config::load(&a.config)?.with_disk_name(a.disk.as_deref());
    let dev = cfg.device(&a.config)?;
    for n in &dev.notes {
        eprintln!("note: {n}");
    }
    let gap = cfg.host_cpu.as_ref().map_or(0.0, |c| c.app_gap_us);
    let mut src = fio::FioSource::new(&jf, 0, dev.blocks)?.with_app_gap_us(gap);
    // --fio simulates file I/O, so a host stack is always there: the one the --host flags
    // ask for, or else this machine's (the device holding the current directory).
    let host = match a.host.to_params()? {
        Some(h) => h,
        None => match HostParams::from_system(".") {
            Ok(h) => h,
            Err(e) => {
                eprintln!("warning: this machine's settings ({e:#}); using Linux's defaults");
                HostParams::linux_defaults()
            }
        },
    };
    jf.check_scheduler(host.block.scheduler)
        .with_context(|| format!("{}", job.display()))?;
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
    let mut stats = fio::JobStats::new(&src);
    let chain = host
        .stack()
        .cpu(cfg.host_cpu.as_ref())
        .files(&src.file_sizes())
        .on(dev.component)?;
    let mut sim = Simulator::new(chain);
    let bar = if a.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new_spinner()
    };
    let mut log = RequestLog::create(a.log.as_deref())?;
    let mut n = 0u64;
    let t0 = Instant::now();
    let totals = sim.run_streams(&mut src, &mut |c, stream| {
        stats.add(c, stream);
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
    print!("{}", fio::job_table(&results));
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
