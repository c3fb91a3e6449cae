//! `iolab disksim calibrate`: measures a real device through a file this tool creates on it,
//! with O_DIRECT, and writes a measured-device config (`measured.rs`) the simulator reads.
//!
//! What it measures (each with fio, Debian package `fio`, `ioengine=libaio`, `direct=1`, on
//! the file it created, time-bounded):
//! * mean latency and throughput by request size (4 KiB–4 MiB), read/write, sequential and
//!   random, queue depth 1–64: the `[measured]` table;
//! * the seek profile: 4 KiB reads at growing distances (fio's `rw=read:SKIP` stride); "flat"
//!   when the slowest distance is within 25% of the fastest (SSDs, virtual disks);
//! * write-cache behaviour: 4 KiB writes plain, each followed by fsync (a cache flush), and
//!   with O_DSYNC (FUA, or a flush where the device has no FUA);
//! * and it reads the settings that matter: `/sys/block/DEV/queue/*`, `/proc/sys/vm/dirty_*`,
//!   MemTotal and the memory cgroup limit.
//!
//! Safety: the only file written is the one it creates (`O_CREAT|O_EXCL`, a name with
//! `iolab-disksim-calib` and the pid), removed at the end, on error and on Ctrl-C. A
//! filesystem that refuses O_DIRECT is one clear error (and the file is removed).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::host::median;

/// The host settings the simulation depends on.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HostSettings {
    pub disk: Option<String>,
    /// `/sys/block/DEV/queue/*` (single-line files).
    pub queue: BTreeMap<String, String>,
    /// `/proc/sys/vm/dirty_*`.
    pub vm: BTreeMap<String, String>,
    pub mem_total_bytes: Option<u64>,
    /// Memory cgroup limit of this process (v2 memory.max or v1 limit_in_bytes), if any.
    pub cgroup_limit_bytes: Option<u64>,
    /// Device size, bytes (`/sys/block/DEV/size` × 512).
    pub device_bytes: Option<u64>,
}

pub fn read_host_settings(disk: Option<&str>) -> HostSettings {
    let mut h = HostSettings {
        disk: disk.map(str::to_string),
        ..Default::default()
    };
    if let Some(d) = disk {
        if let Ok(rd) = std::fs::read_dir(format!("/sys/block/{d}/queue")) {
            for e in rd.flatten() {
                let p = e.path();
                if let Ok(t) = std::fs::read_to_string(&p) {
                    let t = t.trim();
                    if !t.contains('\n') && t.len() < 200 {
                        h.queue
                            .insert(e.file_name().to_string_lossy().into_owned(), t.into());
                    }
                }
            }
        }
        h.device_bytes = std::fs::read_to_string(format!("/sys/block/{d}/size"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(|s| s * 512);
    }
    if let Ok(rd) = std::fs::read_dir("/proc/sys/vm") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("dirty") {
                if let Ok(t) = std::fs::read_to_string(e.path()) {
                    h.vm.insert(name, t.trim().into());
                }
            }
        }
    }
    h.mem_total_bytes = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| crate::pagecache::parse_memtotal(&m));
    h.cgroup_limit_bytes = crate::host::read_memory()
        .ok()
        .and_then(|m| m.cgroup_limit)
        .map(|(l, _)| l);
    h
}

/// Fails with the package name when fio is missing.
pub fn require_fio() -> Result<String> {
    match Command::new("fio").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).trim().to_string()),
        _ => bail!("fio is not installed (Debian package: fio; scripts/install-deps installs it)"),
    }
}

/// Ctrl-C / SIGTERM seen (set by the handler [`install_interrupt_flag`] registers).
pub fn install_interrupt_flag() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, flag.clone()).context("installing a signal handler")?;
    }
    Ok(flag)
}

/// Runs fio on a job file and returns its JSON output.
pub fn run_fio_json(
    jobfile: &Path,
    extra: &[String],
    interrupted: &AtomicBool,
) -> Result<serde_json::Value> {
    run_fio_json_in(None, jobfile, extra, interrupted)
}

/// [`run_fio_json`], with fio inside a cgroup when `cgroup_procs` names its `cgroup.procs`:
/// a shell joins the cgroup and then becomes fio, so fio and the page cache it fills are
/// charged to the cgroup from its first byte.
pub fn run_fio_json_in(
    cgroup_procs: Option<&Path>,
    jobfile: &Path,
    extra: &[String],
    interrupted: &AtomicBool,
) -> Result<serde_json::Value> {
    const NOT_JOINED: i32 = 97;
    let mut cmd = match cgroup_procs {
        None => Command::new("fio"),
        Some(procs) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!(
                    "echo $$ > \"$0\" || exit {NOT_JOINED}; exec fio \"$@\""
                ))
                .arg(procs);
            c
        }
    };
    let out = cmd
        .arg("--output-format=json")
        .args(extra)
        .arg(jobfile)
        .output()
        .context("running fio (Debian package: fio)")?;
    if interrupted.load(Ordering::Relaxed) {
        bail!("interrupted");
    }
    if let (Some(procs), Some(NOT_JOINED)) = (cgroup_procs, out.status.code()) {
        bail!("could not move fio into the cgroup of {}", procs.display());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "fio failed on {}: {}{}",
            jobfile.display(),
            String::from_utf8_lossy(&out.stderr).trim(),
            text.trim()
        );
    }
    // fio may print notes before the JSON object.
    let start = text.find('{').context("fio printed no JSON")?;
    serde_json::from_str(&text[start..]).context("reading fio's JSON output")
}

/// Writes a regular file's dirty pages to the device and waits, then drops its cached
/// pages: the file starts cold and no write-back of it is left running. Opens read-only, so
/// nothing is written but what was already written to the file; errors are ignored (a file
/// that vanished has no cache).
pub fn drop_file_cache(path: &Path) {
    use std::os::unix::io::AsRawFd;
    if let Ok(file) = std::fs::File::open(path) {
        if file.metadata().is_ok_and(|m| m.is_file()) {
            let _ = file.sync_all();
            // SAFETY: a valid descriptor owned by `file` for the whole call.
            unsafe {
                libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        }
    }
}

/// A file created by this tool, removed when dropped.
pub struct OwnedFile {
    pub path: PathBuf,
}

impl OwnedFile {
    /// Creates the empty file `DIR/iolab-disksim-TAG-PID.dat` (never one already there: O_EXCL).
    pub fn create_new(dir: &Path, tag: &str) -> Result<OwnedFile> {
        let path = dir.join(format!("iolab-disksim-{tag}-{}.dat", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(OwnedFile { path })
    }
}

impl Drop for OwnedFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A 4096-aligned buffer of `len` bytes (for O_DIRECT), filled with a non-repeating pattern.
fn aligned_buffer(len: usize) -> (Vec<u8>, usize) {
    let mut v = vec![0u8; len + 4096];
    let off = v.as_ptr().align_offset(4096);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in v[off..off + len].iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    (v, off)
}

/// Creates `dir/iolab-disksim-<tag>-<pid>.dat` (never an existing file), checks that it can be
/// opened with O_DIRECT, and fills `bytes` of it with O_DIRECT writes (so every block is
/// allocated and written: reads of unwritten extents would never reach the device).
pub fn create_direct_file(dir: &Path, tag: &str, bytes: u64) -> Result<OwnedFile> {
    let md = std::fs::metadata(dir).with_context(|| format!("{}", dir.display()))?;
    if !md.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let owned = OwnedFile::create_new(dir, tag)?;
    let mut f = match std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&owned.path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => bail!(
            "the filesystem of {} refuses O_DIRECT (open: {e}); calibrate measures the device without the page cache, so it needs a directory on a filesystem that supports O_DIRECT (ext4, xfs, btrfs...)",
            dir.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("opening {} with O_DIRECT", owned.path.display())),
    };
    const CHUNK: usize = 1 << 20;
    let (buf, off) = aligned_buffer(CHUNK);
    let mut done = 0u64;
    while done < bytes {
        let n = (bytes - done).min(CHUNK as u64) as usize;
        let n = n.div_ceil(4096) * 4096;
        match f.write(&buf[off..off + n]) {
            Ok(w) if w > 0 => done += w as u64,
            Ok(_) => bail!("writing {}: no progress", owned.path.display()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => bail!(
                "the filesystem of {} refuses O_DIRECT writes ({e})",
                dir.display()
            ),
            Err(e) => return Err(e).with_context(|| format!("writing {}", owned.path.display())),
        }
    }
    f.sync_all()?;
    Ok(owned)
}

/// One measured point (op, pattern, size, queue depth).
#[derive(Clone, Debug, Serialize)]
pub struct CalPoint {
    pub op: String,
    pub pattern: String,
    pub size_kib: u64,
    pub qd: u32,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mb_s: f64,
    pub iops: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SeekPoint {
    pub distance_kib: u64,
    pub mean_us: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct WriteCache {
    /// 4 KiB random O_DIRECT write, QD1.
    pub write_us: f64,
    /// Same, each followed by fsync: the write plus the flush.
    pub write_fsync_us: f64,
    /// With O_DSYNC (FUA, or write + flush without FUA).
    pub write_dsync_us: f64,
    pub volatile_cache: Option<String>,
    pub fua: Option<String>,
    pub verdict: String,
}

impl WriteCache {
    /// What a flush costs an `O_DSYNC` write or an `fdatasync` (µs): the O_DSYNC write less
    /// the plain one, no journal commit (0 when a measurement failed).
    pub fn datasync_flush_us(&self) -> f64 {
        excess_us(self.write_dsync_us, self.write_us)
    }

    /// What a cache flush costs the device (µs): the fsync'd write less the plain one (0 when
    /// a measurement failed).
    pub fn flush_us(&self) -> f64 {
        excess_us(self.write_fsync_us, self.write_us)
    }
}

/// `with - without`, at least 0; 0 when either is not a number.
fn excess_us(with: f64, without: f64) -> f64 {
    let d = with - without;
    if d.is_finite() {
        d.max(0.0)
    } else {
        0.0
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Calibration {
    pub target: String,
    pub file_bytes: u64,
    pub fio: String,
    pub quick: bool,
    pub seconds: f64,
    pub host: HostSettings,
    pub points: Vec<CalPoint>,
    /// O_DIRECT reads into huge pages (few memory segments, as the page cache's large
    /// folios): empty when transparent huge pages are off here.
    pub large_folio_points: Vec<CalPoint>,
    /// Why `large_folio_points` is empty, when it is.
    pub large_folio_note: Option<String>,
    pub seek: Vec<SeekPoint>,
    pub seek_verdict: String,
    pub write_cache: WriteCache,
    /// Cached buffered reads: cost per call and per KiB.
    pub host_cpu: crate::host::HostCpu,
}

/// Calibration plan.
pub struct Plan {
    pub sizes_kib: Vec<u64>,
    pub qds: Vec<u32>,
    /// Sizes and depths of the reads into huge pages (the page cache's read-ahead sizes).
    pub large_sizes_kib: Vec<u64>,
    pub large_qds: Vec<u32>,
    pub runtime_ms: u64,
    pub file_bytes: u64,
    pub seek_kib: Vec<u64>,
}

impl Plan {
    pub fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                sizes_kib: vec![4, 16, 64, 256, 1024, 4096],
                qds: vec![1, 4, 16, 64],
                large_sizes_kib: vec![64, 256, 1024, 4096],
                large_qds: vec![1, 4, 16],
                runtime_ms: 250,
                file_bytes: 512 << 20,
                seek_kib: vec![0, 64, 1024, 16 << 10, 256 << 10],
            }
        } else {
            Plan {
                sizes_kib: vec![4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
                qds: vec![1, 2, 4, 8, 16, 32, 64],
                large_sizes_kib: vec![64, 128, 256, 512, 1024, 2048, 4096],
                large_qds: vec![1, 2, 4, 8, 16],
                runtime_ms: 1000,
                file_bytes: 2 << 30,
                seek_kib: vec![
                    0,
                    16,
                    64,
                    256,
                    1024,
                    4 << 10,
                    16 << 10,
                    64 << 10,
                    256 << 10,
                    1 << 20,
                ],
            }
        }
    }
}

fn lat_us(dir: &serde_json::Value, what: &str) -> f64 {
    let v = &dir["lat_ns"];
    match what {
        "mean" => v["mean"].as_f64().unwrap_or(f64::NAN) / 1000.0,
        p => v["percentile"][p].as_f64().unwrap_or(f64::NAN) / 1000.0,
    }
}

/// A (KiB, mean µs) table from fio jobs named PREFIX + size in KiB, or PREFIX + size + "_" +
/// sample (the median of the samples' means), `dir` "read" or "write"; sizes with no
/// usable job are left out.
fn cost_table(jobs: &[serde_json::Value], prefix: &str, dir: &str, sizes: &[u64]) -> Vec<[f64; 2]> {
    let mut t = Vec::new();
    for &k in sizes {
        let mut us = samples(jobs, &format!("{prefix}{k}"), |j| lat_us(&j[dir], "mean"));
        if !us.is_empty() {
            t.push([k as f64, median(&mut us)]);
        }
    }
    t
}

/// `f` of each job named NAME or NAME + "_" + anything, where finite and >= 0.
fn samples(
    jobs: &[serde_json::Value],
    name: &str,
    f: impl Fn(&serde_json::Value) -> f64,
) -> Vec<f64> {
    jobs.iter()
        .filter(|j| {
            j["jobname"].as_str().is_some_and(|n| {
                n == name || n.strip_prefix(name).is_some_and(|r| r.starts_with('_'))
            })
        })
        .map(f)
        .filter(|v| v.is_finite() && *v >= 0.0)
        .collect()
}

/// A page miss's cost (µs per 4 KiB page) of each pair of miss-cost jobs: buffered job
/// `b{k}_{sample}` less its O_DIRECT twin `d{k}_{sample}` less the copy of `k` KiB from
/// `copy_us` ((KiB, µs) table), per page; pairs with a missing or unusable half are left out.
fn miss_samples(jobs: &[serde_json::Value], sizes: &[u64], copy_us: &[[f64; 2]]) -> Vec<f64> {
    let mut per_page = Vec::new();
    for &k in sizes {
        let copy = crate::host::table_us(copy_us, k as f64);
        let prefix = format!("b{k}_");
        for job in jobs {
            let Some(sample) = job["jobname"]
                .as_str()
                .and_then(|n| n.strip_prefix(&prefix))
            else {
                continue;
            };
            let twin = format!("d{k}_{sample}");
            let Some(d) = jobs.iter().find(|j| j["jobname"] == twin.as_str()) else {
                continue;
            };
            let extra =
                (lat_us(&job["read"], "mean") - lat_us(&d["read"], "mean") - copy) / (k / 4) as f64;
            if extra.is_finite() {
                per_page.push(extra.max(0.0));
            }
        }
    }
    per_page
}

/// The read or write half of a job of fio's JSON, whichever did I/O.
fn active_dir(job: &serde_json::Value) -> &serde_json::Value {
    if job["write"]["io_bytes"].as_u64().unwrap_or(0)
        > job["read"]["io_bytes"].as_u64().unwrap_or(0)
    {
        &job["write"]
    } else {
        &job["read"]
    }
}

/// Cached-read costs: each size is read for CACHED_READ_MS in CACHED_READ_SAMPLES jobs in
/// each of two rounds a minute apart (the sizes interleaved within a round, so a size's
/// samples are not back to back), over a cached set of CACHED_READ_SET_MIB, meant to be
/// larger than a CPU's last-level cache so that a copy runs at memory speed. It was on the
/// AMD host of 23-27 Nov; on the Intel one of 28 Nov a 24 MiB set still copies twice as
/// fast as this one (the validation's warm jobs, simulated 40-57% too slow): hence the set
/// profile, 32 KiB reads over sets of CACHED_SETS_MIB, which scales the table to a job's own set.
/// Copies of 512 KiB and more are bound by a memory bandwidth this VM shares with its
/// host's other guests, and their cost moves by the minute (70-116 µs at 512 KiB; one
/// 250 ms job over 16 MiB measured 46, a round of three samples 114 and 168 on bad minutes):
/// the median of the six samples is what a run is likeliest to meet.
const CACHED_READ_MS: u64 = 100;
const CACHED_READ_SAMPLES: usize = 3;
/// CACHED_READ_SAMPLES under `--quick`: fio spends ~0.3 s starting each of these short jobs
/// (it polls for a stonewalled job's start every 100 ms), and with three a round and the
/// reclaim jobs `calibrate --quick` took 135-147 s here, where the issue asks for 2 minutes.
const QUICK_SAMPLES: usize = 2;
/// The memory cgroup the reclaim cost is measured in (the validation's `--quick` limit).
const MISS_CGROUP_BYTES: u64 = 64 << 20;
/// Unmeasured reading that fills that cgroup before a buffered job's measured part (64 MiB
/// at the ~0.7 GB/s of random 128 KiB buffered reads here is ~90 ms).
const MISS_CGROUP_RAMP_MS: u64 = 200;
const CACHED_READ_SET_MIB: u64 = crate::host::CACHED_TABLE_SET_MIB;
/// The cached sets of the set profile (MiB): from within a CPU's caches to beyond them, up
/// to CACHED_READ_SET_MIB (`HostCpu::for_cached_set` scales against its value there).
const CACHED_SETS_MIB: [u64; 8] = [2, 4, 8, 16, 24, 32, 48, CACHED_READ_SET_MIB];

/// Runs the plan on a file created in `dir`. `progress(done, total, what)`.
pub fn calibrate(
    dir: &Path,
    quick: bool,
    interrupted: &AtomicBool,
    progress: &mut dyn FnMut(u64, u64, &str),
) -> Result<Calibration> {
    let fio = require_fio()?;
    let t0 = Instant::now();
    let plan = Plan::new(quick);
    let disk = crate::host::resolve_disk(&dir.to_string_lossy()).ok();
    let host = read_host_settings(disk.as_deref());
    let combos = [
        ("read", "seq"),
        ("read", "rand"),
        ("write", "seq"),
        ("write", "rand"),
    ];
    let total = (combos.len() * plan.sizes_kib.len()) as u64 + 5;
    progress(0, total, "creating the test file");
    let file = create_direct_file(dir, "calib", plan.file_bytes)?;
    let work = tempdir("calib")?;
    let fname = file.path.to_string_lossy().replace(':', "\\:");
    // System-call cost of buffered reads served by the page cache: the first
    // CACHED_READ_SET_MIB read once to warm it, then read at each size, round and round (one
    // pass was 4 reads at 4 MiB and a few ms in all, which fio times in whole ms). The
    // validation's sizes (32, 128, 512 KiB) are among them: no interpolation there. Two
    // rounds, one now and one after the device's measurements, minutes apart (the copy's
    // cost moves by the minute on this VM; see CACHED_READ_MS).
    let cpu_sizes = [4u64, 16, 32, 64, 128, 256, 512, 1024, 4096];
    let per_round = if quick {
        QUICK_SAMPLES
    } else {
        CACHED_READ_SAMPLES
    };
    // The jobs of fio's JSON for job file `text` (written to the work directory as `name`).
    let fio_jobs =
        |cgroup: Option<&Path>, name: &str, text: &str| -> Result<Vec<serde_json::Value>> {
            let jf = work.path.join(name);
            std::fs::write(&jf, text)?;
            let v = run_fio_json_in(cgroup, &jf, &[], interrupted)?;
            Ok(v["jobs"].as_array().cloned().unwrap_or_default())
        };
    let copy_costs = |round: usize| -> Result<Vec<serde_json::Value>> {
        let mut text = format!(
            "[global]\nfilename={fname}\nsize={CACHED_READ_SET_MIB}m\nioengine=psync\ndirect=0\nstonewall\n[warm]\nrw=read\nbs=1m\ninvalidate=1\n"
        );
        for r in 0..per_round {
            for k in cpu_sizes {
                text.push_str(&format!(
                    "[c{k}_{round}{r}]\nrw=read\nbs={k}k\ninvalidate=0\ntime_based\nruntime={CACHED_READ_MS}ms\n"
                ));
            }
        }
        fio_jobs(None, "cpu.fio", &text)
    };
    // How the copy's cost depends on the set a job's cached reads go over (see
    // HostCpu::cached_set_us): 32 KiB reads of a file of each size in CACHED_SETS_MIB,
    // created here, read whole once and then CACHED_READ_SAMPLES times back to back, each
    // set in a file of its own as a job's is (reading the first part of the 64 MiB file
    // instead measured sets below the CPU's cache at the large set's cost, 4.0 against
    // 2.7-3.0 µs at 24 MiB, 28 Nov).
    let set_costs = |round: usize| -> Result<Vec<serde_json::Value>> {
        let mut files = Vec::new();
        let mut text = String::from("[global]\nioengine=psync\ndirect=0\nstonewall\n");
        for m in CACHED_SETS_MIB {
            let owned = OwnedFile::create_new(dir, &format!("cset{m}_{round}"))?;
            let f = owned.path.to_string_lossy().replace(':', "\\:");
            text.push_str(&format!(
                "[l{m}_{round}]\nfilename={f}\nsize={m}m\nrw=read\nbs=1m\n"
            ));
            for r in 0..per_round {
                text.push_str(&format!(
                    "[s{m}_{round}{r}]\nfilename={f}\nsize={m}m\nrw=read\nbs=32k\ninvalidate=0\ntime_based\nruntime={CACHED_READ_MS}ms\n"
                ));
            }
            files.push(owned);
        }
        let jobs = fio_jobs(None, "cset.fio", &text);
        drop(files);
        jobs
    };
    let first_set_costs = set_costs(0)?;
    let first_copy_costs = copy_costs(0)?;
    let head = format!(
        "[global]\nfilename={fname}\nsize={}\ndirect=1\nioengine=libaio\nruntime={}ms\ntime_based\nramp_time=0\nrandrepeat=0\ninvalidate=1\nstonewall\n",
        plan.file_bytes, plan.runtime_ms
    );
    // Buffered writes into new pages (the cost `write` jobs pay before write-back): one fresh
    // file per size and sample, created here (never a file already there) and removed
    // after its round, 16 MiB each, well under the dirty thresholds so nothing waits for the
    // device. CACHED_READ_SAMPLES samples in each of two rounds, like the cached reads: one
    // pass at each size, once, measured a 512 KiB write at half its cost on a bad minute.
    let write_costs = |round: usize| -> Result<Vec<serde_json::Value>> {
        let mut wfiles = Vec::new();
        let mut text = String::from("[global]\nsize=16m\nioengine=psync\ndirect=0\nstonewall\n");
        for r in 0..per_round {
            for k in cpu_sizes {
                let owned = OwnedFile::create_new(dir, &format!("wcost{k}_{round}{r}"))?;
                text.push_str(&format!(
                    "[w{k}_{round}{r}]\nfilename={}\nrw=write\nbs={k}k\n",
                    owned.path.to_string_lossy().replace(':', "\\:")
                ));
                wfiles.push(owned);
            }
        }
        let jobs = fio_jobs(None, "wcost.fio", &text);
        drop(wfiles);
        jobs
    };
    // A read's cost per new 4 KiB folio: buffered random reads of a cold file
    // (fadvise_hint: POSIX_FADV_RANDOM, so no read-ahead and order-0 folios) against
    // O_DIRECT ones of the same size, interleaved, less the copy; the median per page over
    // two rounds (one round measured 0.22 µs where five others measured 1.7-3.2). Then the
    // same jobs in a memory cgroup of MISS_CGROUP_BYTES kept full (each buffered job first
    // reads MISS_CGROUP_RAMP_MS unmeasured, which fills it: `invalidate` empties it at the
    // job's start), whose reads reclaim a page for every page they bring in: the difference
    // is the reclaim's cost. Without a memory controller (not root), reclaim counts as free.
    let miss_sizes = [128u64, 512];
    let miss_text = |round: usize, in_cgroup: bool| -> String {
        let mut text = head.replace("direct=1\n", "").replace("invalidate=1\n", "");
        for r in 0..per_round {
            for k in miss_sizes {
                for (name, direct) in [("b", 0), ("d", 1)] {
                    text.push_str(&format!(
                        "[{name}{k}_{round}{r}]\nrw=randread\nioengine=psync\nbs={k}k\ndirect={direct}\ninvalidate=1\nruntime={CACHED_READ_MS}ms\n"
                    ));
                    if in_cgroup && direct == 0 {
                        text.push_str(&format!("ramp_time={MISS_CGROUP_RAMP_MS}ms\n"));
                    }
                }
            }
        }
        text
    };
    let miss_costs = |round: usize| fio_jobs(None, "miss.fio", &miss_text(round, false));
    let miss_cgroup = match crate::linuxval::create_cgroup(None, MISS_CGROUP_BYTES) {
        Ok(cg) => Some(cg),
        Err(e) => {
            tracing::warn!(
                "the reclaim cost of a full cache is not measured (counts as free): {e}"
            );
            None
        }
    };
    let reclaim_costs = |round: usize| match &miss_cgroup {
        Some(cg) => fio_jobs(Some(&cg.procs), "miss-cg.fio", &miss_text(round, true)),
        None => Ok(Vec::new()),
    };
    let first_write_costs = write_costs(0)?;
    let first_miss_costs = miss_costs(0)?;
    let first_reclaim_costs = reclaim_costs(0)?;
    let mut points = Vec::new();
    let mut step = 0u64;
    for (op, pat) in combos {
        for &kib in &plan.sizes_kib {
            if interrupted.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            progress(step, total, &format!("{op} {pat} {kib} KiB"));
            let rw = match (op, pat) {
                ("read", "seq") => "read",
                ("read", _) => "randread",
                ("write", "seq") => "write",
                _ => "randwrite",
            };
            let mut text = head.clone();
            for &qd in &plan.qds {
                // Big requests at high depth only measure the same bandwidth limit longer.
                if kib >= 1024 && qd > 16 {
                    continue;
                }
                text.push_str(&format!("[p{qd}]\nrw={rw}\nbs={kib}k\niodepth={qd}\n"));
            }
            let jf = work.path.join("cal.fio");
            std::fs::write(&jf, &text)?;
            let v = run_fio_json(&jf, &[], interrupted)?;
            for job in v["jobs"].as_array().into_iter().flatten() {
                let qd: u32 = job["jobname"].as_str().unwrap_or("p1")[1..]
                    .parse()
                    .unwrap_or(1);
                let d = active_dir(job);
                points.push(CalPoint {
                    op: op.into(),
                    pattern: if pat == "seq" { "sequential" } else { "random" }.into(),
                    size_kib: kib,
                    qd,
                    mean_us: lat_us(d, "mean"),
                    p50_us: lat_us(d, "50.000000"),
                    p99_us: lat_us(d, "99.000000"),
                    mb_s: d["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6,
                    iops: d["iops"].as_f64().unwrap_or(0.0),
                });
            }
            step += 1;
        }
    }
    progress(step, total, "reads into huge pages");
    let (large_folio_points, large_folio_note) =
        match huge_page_reads(&file.path, &plan, interrupted)? {
            Ok(p) => (p, None),
            Err(why) => (Vec::new(), Some(why)),
        };
    step += 1;
    // Seek profile: 4 KiB reads, QD1, with SKIP bytes between them.
    progress(step, total, "seek profile");
    let mut text = head.clone();
    for &d in &plan.seek_kib {
        let rw = if d == 0 {
            "read".to_string()
        } else {
            format!("read:{d}k")
        };
        text.push_str(&format!("[s{d}]\nrw={rw}\nbs=4k\niodepth=1\n"));
    }
    let jf = work.path.join("seek.fio");
    std::fs::write(&jf, &text)?;
    let v = run_fio_json(&jf, &[], interrupted)?;
    let mut seek = Vec::new();
    for job in v["jobs"].as_array().into_iter().flatten() {
        let d: u64 = job["jobname"].as_str().unwrap_or("s0")[1..]
            .parse()
            .unwrap_or(0);
        seek.push(SeekPoint {
            distance_kib: d,
            mean_us: lat_us(&job["read"], "mean"),
        });
    }
    seek.sort_by_key(|p| p.distance_kib);
    let seek_verdict = seek_verdict(&seek);
    step += 1;
    // Write cache: plain, fsync after each write, O_DSYNC.
    progress(step, total, "write cache");
    let text = format!(
        "{head}[plain]\nrw=randwrite\nbs=4k\niodepth=1\n[fsync]\nrw=randwrite\nbs=4k\niodepth=1\nfsync=1\n[dsync]\nrw=randwrite\nbs=4k\niodepth=1\nsync=dsync\n"
    );
    let jf = work.path.join("wc.fio");
    std::fs::write(&jf, &text)?;
    let v = run_fio_json(&jf, &[], interrupted)?;
    let jobs = v["jobs"].as_array().cloned().unwrap_or_default();
    let get = |name: &str| -> (f64, f64) {
        jobs.iter()
            .find(|j| j["jobname"] == name)
            .map(|j| {
                let w = lat_us(&j["write"], "mean");
                let s = j["sync"]["lat_ns"]["mean"].as_f64().unwrap_or(0.0) / 1000.0;
                (w, s)
            })
            .unwrap_or((f64::NAN, 0.0))
    };
    let (plain, _) = get("plain");
    let (fw, fs) = get("fsync");
    let (dsync, _) = get("dsync");
    let volatile = host.queue.get("write_cache").cloned();
    let fua = host.queue.get("fua").cloned();
    let verdict = if fw + fs > plain * 1.5 || dsync > plain * 1.5 {
        format!(
            "volatile write cache: a flush costs {:.0} µs over a plain write ({plain:.0} µs); O_DSYNC writes take {dsync:.0} µs",
            (fw + fs - plain).max(0.0)
        )
    } else {
        format!(
            "flushes are cheap: plain {plain:.0} µs, with fsync {:.0} µs, O_DSYNC {dsync:.0} µs (write-through or a battery-backed cache)",
            fw + fs
        )
    };
    step += 1;
    progress(step, total, "page-cache copy cost");
    let mut jobs = first_copy_costs;
    jobs.extend(copy_costs(1)?);
    let cached_read_us = cost_table(&jobs, "c", "read", &cpu_sizes);
    let mut sjobs = first_set_costs;
    sjobs.extend(set_costs(1)?);
    let cached_set_us = cost_table(&sjobs, "s", "read", &CACHED_SETS_MIB);
    // fio's own time per I/O: the 4 KiB jobs' run time per I/O beyond their latency. (Every
    // sample is >= 0: `max` turns the median of none, NaN, into 0.)
    let app_gap_us = median(&mut samples(&jobs, "c4", |j| {
        let d = &j["read"];
        let ios = d["total_ios"].as_f64().unwrap_or(0.0);
        let runtime_us = d["runtime"].as_f64().unwrap_or(0.0) * 1000.0;
        if ios > 0.0 {
            (runtime_us / ios - lat_us(d, "mean")).max(0.0)
        } else {
            f64::NAN
        }
    }))
    .max(0.0);
    let mut wjobs = first_write_costs;
    wjobs.extend(write_costs(1)?);
    let cached_write_us = cost_table(&wjobs, "w", "write", &cpu_sizes);
    progress(step, total, "page-cache miss cost");
    let mut mjobs = first_miss_costs;
    mjobs.extend(miss_costs(1)?);
    let miss_folio_us = median(&mut miss_samples(&mjobs, &miss_sizes, &cached_read_us)).max(0.0);
    let mut rjobs = first_reclaim_costs;
    rjobs.extend(reclaim_costs(1)?);
    drop(miss_cgroup);
    let in_cgroup = median(&mut miss_samples(&rjobs, &miss_sizes, &cached_read_us));
    // (no cgroup: the median of nothing, NaN, which `max` turns into 0)
    let reclaim_folio_us = (in_cgroup - miss_folio_us).max(0.0);
    let dontneed_dirty_page_us = dontneed_cost(dir, interrupted)?;
    step += 1;
    let host_cpu = crate::host::HostCpu {
        cached_read_us,
        cached_write_us,
        app_gap_us,
        miss_folio_us,
        reclaim_folio_us,
        dontneed_dirty_page_us,
        cached_set_us,
    };
    step += 1;
    progress(step, total, "done");
    Ok(Calibration {
        target: file.path.display().to_string(),
        file_bytes: plan.file_bytes,
        fio,
        quick,
        seconds: t0.elapsed().as_secs_f64(),
        host,
        points,
        large_folio_points,
        large_folio_note,
        seek,
        seek_verdict,
        write_cache: WriteCache {
            write_us: plain,
            write_fsync_us: fw + fs,
            write_dsync_us: dsync,
            volatile_cache: volatile,
            fua,
            verdict,
        },
        host_cpu,
    })
}

/// Dirty data per `dontneed_cost` sample, and samples.
const DONTNEED_BYTES: usize = 32 << 20;
const DONTNEED_SAMPLES: usize = 3;

/// What `POSIX_FADV_DONTNEED` costs its caller per dirty page it sends to write-back (µs):
/// the median over samples of one call over a fresh file of DONTNEED_BYTES of buffered
/// writes (a file created here with O_EXCL and removed after each sample).
fn dontneed_cost(dir: &Path, interrupted: &AtomicBool) -> Result<f64> {
    use std::os::fd::AsRawFd;
    let chunk = vec![0x5au8; 1 << 20];
    let mut per_page = Vec::new();
    for r in 0..DONTNEED_SAMPLES {
        if interrupted.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        let owned = OwnedFile::create_new(dir, &format!("dontneed{r}"))?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&owned.path)
            .with_context(|| format!("opening {}", owned.path.display()))?;
        for _ in 0..DONTNEED_BYTES / chunk.len() {
            f.write_all(&chunk)
                .with_context(|| format!("writing {}", owned.path.display()))?;
        }
        let t = Instant::now();
        // SAFETY: posix_fadvise on a descriptor we own; no memory is passed.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let us = t.elapsed().as_secs_f64() * 1e6;
        if rc == 0 {
            per_page.push(us / (DONTNEED_BYTES / 4096) as f64);
        }
        // Written out before the file goes, so the next sample's pages are not waiting
        // behind this one's write-back.
        let _ = f.sync_all();
    }
    Ok(median(&mut per_page).max(0.0))
}

/// Runs each (pattern, size, depth) of the plan's large-folio grid for `plan.runtime_ms`:
/// `depth` threads, each reading `path` with O_DIRECT into its own buffer of transparent
/// huge pages (one memory segment per 2 MiB, as a read into the page cache's largest
/// folios), sequential reads sharing one advancing offset, random ones aligned to their
/// size. fio cannot ask for such buffers without a hugetlbfs mount (a system setting);
/// `madvise` can. Ok(Err(why)) when huge pages are not to be had here.
fn huge_page_reads(
    path: &Path,
    plan: &Plan,
    interrupted: &AtomicBool,
) -> Result<std::result::Result<Vec<CalPoint>, String>> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    use std::sync::atomic::AtomicU64;
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if !thp.contains("[always]") && !thp.contains("[madvise]") {
        return Ok(Err(format!(
            "transparent huge pages are off ({})",
            thp.trim()
        )));
    }
    let max_kib = plan.large_sizes_kib.iter().copied().max().unwrap_or(0);
    let max_qd = plan.large_qds.iter().copied().max().unwrap_or(0) as usize;
    let before = crate::hugebuf::anon_huge_bytes().unwrap_or(0);
    let mut bufs = (0..max_qd)
        .map(|_| crate::hugebuf::HugeBuffer::new(max_kib as usize * 1024))
        .collect::<std::io::Result<Vec<_>>>()
        .context("allocating the huge-page buffers")?;
    let want: u64 = bufs.iter().map(|b| b.len() as u64).sum();
    let got = crate::hugebuf::anon_huge_bytes()
        .unwrap_or(0)
        .saturating_sub(before);
    if got < want / 2 {
        return Ok(Err(format!(
            "the kernel gave {} MiB of the {} MiB asked for in huge pages",
            got >> 20,
            want >> 20
        )));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("opening {} with O_DIRECT", path.display()))?;
    let file_bytes = file.metadata()?.len();
    let mut points = Vec::new();
    for sequential in [true, false] {
        for &kib in &plan.large_sizes_kib {
            for &qd in &plan.large_qds {
                if interrupted.load(Ordering::Relaxed) {
                    bail!("interrupted");
                }
                let size = kib * 1024;
                let slots = file_bytes / size;
                if slots == 0 {
                    continue;
                }
                let next = AtomicU64::new(0);
                let deadline = Instant::now() + std::time::Duration::from_millis(plan.runtime_ms);
                let t0 = Instant::now();
                let lats: Vec<std::io::Result<Vec<f64>>> = std::thread::scope(|sc| {
                    let handles: Vec<_> = bufs
                        .iter_mut()
                        .take(qd as usize)
                        .enumerate()
                        .map(|(i, buf)| {
                            let (file, next) = (&file, &next);
                            sc.spawn(move || {
                                let dst = buf.slice_mut(0, size as usize);
                                let mut rng =
                                    0x9e37_79b9_7f4a_7c15u64 ^ ((i as u64 + 1) * 0x2545_f491);
                                let mut lat = Vec::new();
                                while Instant::now() < deadline {
                                    let slot = if sequential {
                                        next.fetch_add(1, Ordering::Relaxed) % slots
                                    } else {
                                        rng ^= rng << 13;
                                        rng ^= rng >> 7;
                                        rng ^= rng << 17;
                                        rng % slots
                                    };
                                    let t = Instant::now();
                                    file.read_exact_at(dst, slot * size)?;
                                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                                }
                                Ok(lat)
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("a reader thread panicked"))
                        .collect()
                });
                let secs = t0.elapsed().as_secs_f64();
                let mut all = Vec::new();
                for l in lats {
                    all.extend(l.with_context(|| format!("O_DIRECT read of {}", path.display()))?);
                }
                if all.is_empty() {
                    continue;
                }
                all.sort_by(f64::total_cmp);
                let n = all.len();
                let pct = |q: f64| all[((n as f64 * q) as usize).min(n - 1)];
                points.push(CalPoint {
                    op: "read".into(),
                    pattern: if sequential { "sequential" } else { "random" }.into(),
                    size_kib: kib,
                    qd,
                    mean_us: all.iter().sum::<f64>() / n as f64,
                    p50_us: pct(0.5),
                    p99_us: pct(0.99),
                    mb_s: (n as u64 * size) as f64 / secs / 1e6,
                    iops: n as f64 / secs,
                });
            }
        }
    }
    Ok(Ok(points))
}

/// "flat" when the farther half of the distances is not slower than the nearer half by more
/// than 25% (no mechanical seek: SSDs, virtual disks); else the near and far latencies.
pub fn seek_verdict(seek: &[SeekPoint]) -> String {
    if seek.len() < 2 {
        return "not measured".into();
    }
    let half = seek.len() / 2;
    let mean = |s: &[SeekPoint]| s.iter().map(|p| p.mean_us).sum::<f64>() / s.len() as f64;
    let (near, far) = (mean(&seek[..half]), mean(&seek[seek.len() - half..]));
    let lo = seek.iter().map(|s| s.mean_us).fold(f64::INFINITY, f64::min);
    let hi = seek.iter().map(|s| s.mean_us).fold(0.0, f64::max);
    if far <= near * 1.25 {
        format!("flat: 4 KiB reads take {lo:.0}–{hi:.0} µs at every distance, the far ones no slower than the near ones (no mechanical seek: an SSD or a virtual disk)")
    } else {
        format!("distance-dependent: {near:.0} µs near, {far:.0} µs far (a seek cost)")
    }
}

/// The points the simulator gets: per (op, pattern, qd), the affine fit at each measured
/// size (or the raw point when there are fewer than 3 sizes).
pub fn fitted_points(points: &[CalPoint]) -> Vec<CalPoint> {
    let mut out = Vec::new();
    for p in points {
        if !(p.mean_us.is_finite() && p.mean_us > 0.0) {
            continue;
        }
        let group: Vec<(f64, f64)> = points
            .iter()
            .filter(|q| q.op == p.op && q.pattern == p.pattern && q.qd == p.qd)
            .filter(|q| q.mean_us.is_finite() && q.mean_us > 0.0)
            .map(|q| (q.size_kib as f64, q.mean_us))
            .collect();
        let mut f = p.clone();
        if let Some((a, b)) = crate::host::fit_affine(&group) {
            f.mean_us = a + b * p.size_kib as f64;
        }
        out.push(f);
    }
    out
}

/// The measured-device config (TOML) `run --config` reads.
pub fn config_toml(c: &Calibration) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "# Written by `iolab disksim calibrate{}` ({:.0} s) on {} ({}).\n",
        if c.quick { " --quick" } else { "" },
        c.seconds,
        c.host.disk.as_deref().unwrap_or("unknown device"),
        c.fio
    ));
    s.push_str(&format!(
        "# seek profile: {}\n# write cache: {}\n",
        c.seek_verdict, c.write_cache.verdict
    ));
    s.push_str("# host settings (the simulator reads these from the machine it runs on; recorded here for reference):\n");
    for k in [
        "scheduler",
        "rotational",
        "read_ahead_kb",
        "max_sectors_kb",
        "nr_requests",
        "write_cache",
        "fua",
    ] {
        if let Some(v) = c.host.queue.get(k) {
            s.push_str(&format!("#   queue/{k} = {v}\n"));
        }
    }
    for (k, v) in &c.host.vm {
        s.push_str(&format!("#   vm.{k} = {v}\n"));
    }
    if let Some(m) = c.host.mem_total_bytes {
        s.push_str(&format!("#   MemTotal = {m} bytes\n"));
    }
    let qd = c.points.iter().map(|p| p.qd).max().unwrap_or(1);
    let gib = c.host.device_bytes.map(|b| (b >> 30).max(1)).unwrap_or(64);
    let flush = c.write_cache.flush_us();
    let datasync_flush = c.write_cache.datasync_flush_us();
    s.push_str(&format!(
        "\n# latency_us: a robust affine fit in size of the measured means per op, pattern and queue\n# depth (Theil-Sen; the raw means are in the --json output and the printed table).\n[device]\nkind = \"measured\"\n\n[measured]\nqueue_depth = {qd}\ncapacity_gib = {gib}\n# a cache flush: a 4 KiB write followed by fsync, less the plain write (µs)\nflush_us = {flush:.1}\n# fdatasync's and O_DSYNC's flush (no journal commit): an O_DSYNC write less the plain one (µs)\ndatasync_flush_us = {datasync_flush:.1}\npoints = [\n"
    ));
    let point = |p: &CalPoint| {
        format!(
            "  {{ op = \"{}\", pattern = \"{}\", size_kib = {}, qd = {}, latency_us = {:.1} }},\n",
            p.op, p.pattern, p.size_kib, p.qd, p.mean_us
        )
    };
    for p in &fitted_points(&c.points) {
        s.push_str(&point(p));
    }
    s.push_str("]\n");
    if !c.large_folio_points.is_empty() {
        s.push_str("# reads into the page cache's large folios: O_DIRECT into huge pages (the same fit)\nlarge_folio_points = [\n");
        for p in &fitted_points(&c.large_folio_points) {
            s.push_str(&point(p));
        }
        s.push_str("]\n");
    }
    let toml = |t: &[[f64; 2]]| join_table(t, |k, us| format!("[{k}, {us:.2}]"));
    s.push_str(&format!(
        "\n# buffered reads served by the page cache: [KiB, mean µs]\n[host_cpu]\ncached_read_us = [{}]\n",
        toml(&c.host_cpu.cached_read_us)
    ));
    s.push_str(&format!(
        "# buffered writes into new page-cache pages: [KiB, mean µs]\ncached_write_us = [{}]\n",
        toml(&c.host_cpu.cached_write_us)
    ));
    s.push_str(&format!(
        "# buffered 32 KiB reads by the cached set they go over: [MiB, mean µs]\ncached_set_us = [{}]\n",
        toml(&c.host_cpu.cached_set_us)
    ));
    s.push_str(&format!(
        "# fio's own time between a completion and its next request (µs)\napp_gap_us = {:.2}\n",
        c.host_cpu.app_gap_us
    ));
    s.push_str(&format!(
        "# a read's cost per new 4 KiB folio it brings into the cache (µs)\nmiss_folio_us = {:.2}\n",
        c.host_cpu.miss_folio_us
    ));
    s.push_str(&format!(
        "# what reclaiming room for it adds when the cache is full (µs)\nreclaim_folio_us = {:.2}\n",
        c.host_cpu.reclaim_folio_us
    ));
    s.push_str(&format!(
        "# POSIX_FADV_DONTNEED's cost per dirty page it sends to write-back (µs)\ndontneed_dirty_page_us = {:.3}\n",
        c.host_cpu.dontneed_dirty_page_us
    ));
    s
}

/// A (KiB, µs) table's entries as `item` formats them, comma-separated.
fn join_table(t: &[[f64; 2]], item: impl Fn(f64, f64) -> String) -> String {
    t.iter()
        .map(|[k, us]| item(*k, *us))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The table `calibrate` prints.
pub fn table(c: &Calibration) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "target {} ({} MiB, {}), {:.0} s\n",
        c.target,
        c.file_bytes >> 20,
        c.host.disk.as_deref().unwrap_or("?"),
        c.seconds
    ));
    let qds: Vec<u32> = {
        let mut v: Vec<u32> = c.points.iter().map(|p| p.qd).collect();
        v.sort();
        v.dedup();
        v
    };
    s.push_str(&format!("{:<6} {:<10} {:>8}", "op", "pattern", "size KiB"));
    for q in &qds {
        s.push_str(&format!(" {:>17}", format!("QD{q} µs | MB/s")));
    }
    s.push('\n');
    let mut keys: Vec<(String, String, u64)> = c
        .points
        .iter()
        .map(|p| (p.op.clone(), p.pattern.clone(), p.size_kib))
        .collect();
    keys.dedup();
    for (op, pat, kib) in keys {
        s.push_str(&format!("{op:<6} {pat:<10} {kib:>8}"));
        for q in &qds {
            match c
                .points
                .iter()
                .find(|p| p.op == op && p.pattern == pat && p.size_kib == kib && p.qd == *q)
            {
                Some(p) => s.push_str(&format!(" {:>9.0} | {:>5.0}", p.mean_us, p.mb_s)),
                None => s.push_str(&format!(" {:>17}", "-")),
            }
        }
        s.push('\n');
    }
    match (&c.large_folio_note, c.large_folio_points.is_empty()) {
        (Some(why), _) => s.push_str(&format!(
            "reads into huge pages (large folios): not measured: {why}\n"
        )),
        (None, true) => {}
        (None, false) => {
            s.push_str("reads into huge pages (large folios), µs | MB/s:");
            for p in &c.large_folio_points {
                s.push_str(&format!(
                    "\n  {:<10} {:>5} KiB QD{:<3} {:>7.0} | {:>5.0}",
                    p.pattern, p.size_kib, p.qd, p.mean_us, p.mb_s
                ));
            }
            s.push('\n');
        }
    }
    s.push_str("seek (4 KiB reads, QD1): ");
    s.push_str(
        &c.seek
            .iter()
            .map(|p| format!("{} KiB {:.0} µs", p.distance_kib, p.mean_us))
            .collect::<Vec<_>>()
            .join(", "),
    );
    s.push_str(&format!("\n  {}\n", c.seek_verdict));
    s.push_str(&format!(
        "write cache: {} (queue/write_cache = {}, fua = {})\n",
        c.write_cache.verdict,
        c.write_cache.volatile_cache.as_deref().unwrap_or("?"),
        c.write_cache.fua.as_deref().unwrap_or("?")
    ));
    let text = |t: &[[f64; 2]]| join_table(t, |k, us| format!("{k} KiB {us:.1}"));
    s.push_str(&format!(
        "buffered read from the page cache (µs by size): {}\nbuffered write into new pages (µs by size): {}; fio's time between I/Os {:.1} µs\nbuffered read of an uncached page, beyond O_DIRECT and the copy: {:.2} µs a 4 KiB folio, {:.2} more to reclaim room in a full memory cgroup; POSIX_FADV_DONTNEED {:.3} µs a dirty page\n",
        text(&c.host_cpu.cached_read_us),
        text(&c.host_cpu.cached_write_us),
        c.host_cpu.app_gap_us,
        c.host_cpu.miss_folio_us,
        c.host_cpu.reclaim_folio_us,
        c.host_cpu.dontneed_dirty_page_us
    ));
    if !c.host_cpu.cached_set_us.is_empty() {
        s.push_str(&format!(
            "buffered 32 KiB read by the cached set it goes over (µs): {}\n",
            join_table(&c.host_cpu.cached_set_us, |m, us| format!(
                "{m} MiB {us:.1}"
            ))
        ));
    }
    let q = |k: &str| c.host.queue.get(k).map(String::as_str).unwrap_or("?");
    s.push_str(&format!(
        "settings: scheduler {}, rotational {}, read_ahead_kb {}, max_sectors_kb {}, nr_requests {}; ",
        q("scheduler"),
        q("rotational"),
        q("read_ahead_kb"),
        q("max_sectors_kb"),
        q("nr_requests")
    ));
    s.push_str(
        &c.host
            .vm
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    s.push_str(&format!(
        "; MemTotal {} MiB{}\n",
        c.host.mem_total_bytes.unwrap_or(0) >> 20,
        c.host
            .cgroup_limit_bytes
            .map(|l| format!(", cgroup limit {} MiB", l >> 20))
            .unwrap_or_default()
    ));
    s
}

/// A private temporary directory (name with the tag and pid), removed when dropped.
pub struct TempDir {
    pub path: PathBuf,
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

pub fn tempdir(tag: &str) -> Result<TempDir> {
    let path = std::env::temp_dir().join(format!("iolab-disksim-{tag}-{}", std::process::id()));
    if path.exists() {
        std::fs::remove_dir_all(&path)?; // our own pid: a leftover of this very process
    }
    std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
    Ok(TempDir { path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_fit_ignores_an_outlier() {
        let pts = [
            (4.0, 160.0),
            (16.0, 1242.0),
            (64.0, 240.0),
            (256.0, 600.0),
            (1024.0, 2000.0),
            (4096.0, 7500.0),
        ];
        let (a, b) = crate::host::fit_affine(&pts).unwrap();
        // The five regular points lie near 150 + 1.8 × KiB; the 16 KiB one is 1000 µs off.
        assert!((100.0..250.0).contains(&a), "{a}");
        assert!((1.6..2.0).contains(&b), "{b}");
        assert!(crate::host::fit_affine(&pts[..2]).is_none());
    }

    /// A job of fio's JSON named `name` whose reads took `us` µs on average.
    fn read_job((name, us): (&str, f64)) -> serde_json::Value {
        serde_json::json!({"jobname": name, "read": {"lat_ns": {"mean": us * 1000.0}}})
    }

    #[test]
    fn a_miss_cost_pairs_each_buffered_sample_with_its_direct_twin() {
        let jobs = [
            ("b128_00", 150.0),
            ("d128_00", 100.0),
            ("b128_11", 140.0),
            ("d128_01", 10.0),
            ("d128_11", 120.0),
            ("b512_10", 500.0),
        ]
        .map(read_job);
        // Copy 18 µs at 128 KiB (32 pages): (150 - 100 - 18) / 32 = 1.0 and
        // (140 - 120 - 18) / 32 = 0.0625; b512_10 has no twin, d128_01 no buffered half.
        let copy = [[128.0, 18.0], [512.0, 70.0]];
        let mut got = miss_samples(&jobs, &[128, 512], &copy);
        got.sort_by(f64::total_cmp);
        assert_eq!(got, vec![0.0625, 1.0]);
    }

    #[test]
    fn a_cost_is_the_median_of_its_samples() {
        let jobs = [
            ("c4_0", 1.0),
            ("c4096_0", 400.0),
            ("c4_1", 9.0),
            ("c4096_1", 300.0),
            ("c4_2", 2.0),
            ("c512", 80.0),
            ("c16_0", f64::NAN),
        ]
        .map(read_job);
        // c4's samples are 1, 9, 2 (not c4096's); c512 a single job; c16 none usable.
        let t = cost_table(&jobs, "c", "read", &[4, 16, 512, 4096]);
        assert_eq!(t, vec![[4.0, 2.0], [512.0, 80.0], [4096.0, 350.0]]);
    }

    #[test]
    fn seek_profile_verdict() {
        let p = |d, us| SeekPoint {
            distance_kib: d,
            mean_us: us,
        };
        let flat = seek_verdict(&[p(0, 220.0), p(64, 200.0), p(1024, 160.0), p(16384, 150.0)]);
        assert!(flat.starts_with("flat"), "{flat}");
        let hdd = seek_verdict(&[p(0, 100.0), p(64, 300.0), p(1024, 4000.0), p(16384, 9000.0)]);
        assert!(hdd.starts_with("distance-dependent"), "{hdd}");
    }

    #[test]
    fn config_from_points_loads_as_a_measured_device() {
        let c = Calibration {
            target: "t".into(),
            file_bytes: 1 << 20,
            fio: "fio-3.33".into(),
            quick: true,
            seconds: 1.0,
            host: HostSettings::default(),
            points: vec![CalPoint {
                op: "read".into(),
                pattern: "random".into(),
                size_kib: 4,
                qd: 1,
                mean_us: 150.0,
                p50_us: 140.0,
                p99_us: 300.0,
                mb_s: 27.0,
                iops: 6600.0,
            }],
            large_folio_points: vec![CalPoint {
                op: "read".into(),
                pattern: "random".into(),
                size_kib: 512,
                qd: 1,
                mean_us: 230.0,
                p50_us: 220.0,
                p99_us: 300.0,
                mb_s: 2200.0,
                iops: 4300.0,
            }],
            large_folio_note: None,
            seek: vec![],
            seek_verdict: "flat".into(),
            write_cache: WriteCache {
                write_us: 1.0,
                write_fsync_us: 1.0,
                write_dsync_us: 1.0,
                volatile_cache: None,
                fua: None,
                verdict: "v".into(),
            },
            host_cpu: Default::default(),
        };
        let text = config_toml(&c);
        let cfg: crate::config::Config = toml::from_str(&text).unwrap();
        let d = cfg.device(Path::new("x.toml")).unwrap();
        assert!(d.blocks > 0);
        assert!(table(&c).contains("QD1"));
        assert!(text.contains("large_folio_points = ["), "{text}");
        let m: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(
            m["measured"]["large_folio_points"][0]["latency_us"].as_float(),
            Some(230.0)
        );
    }
}
