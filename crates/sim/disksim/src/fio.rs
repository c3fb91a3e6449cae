//! fio job files as workloads: `iolab disksim run --fio JOB.fio`.
//!
//! The reader takes fio's job-file syntax (`[global]` and job sections, `key=value` or a bare
//! `key` for booleans, `#`/`;` comments) and fio's number syntax as fio 3.33 reads it with its
//! default `kb_base=1024`: `k`, `kb`, `ki` (any case) are 1024, and — fio's compatibility
//! quirk, checked against fio itself — `kib` is 1000 (likewise m, g, t, p); `0x` hex; ranges
//! `a-b` or `a:b` where fio takes one (`bsrange`, `filesize`). Times: `runtime` in seconds,
//! `thinktime` in µs, each with an optional `us`, `ms`, `s`, `m`, `h`, `d` suffix.
//!
//! Every option is either simulated, accepted as reporting-only (it changes what fio prints,
//! not the I/O: `group_reporting`, `write_lat_log`...), or reported: one error lists every
//! unsupported option with its line (`allow_unknown` turns that into warnings). A bad value
//! is an error naming its line. Nothing here panics on any input (fuzzed, `fuzz/`).
//!
//! The workload ([`FioSource`]): each job's `numjobs` clones are independent *streams*, each a
//! closed loop of `iodepth` requests (1 for the synchronous engines psync/sync/pvsync, and for
//! libaio on buffered files, where the kernel completes the submission synchronously), issued
//! through the engine's [`When::Stream`]. Each clone has its own file(s) unless `filename`
//! names a shared one, laid out contiguously on the device, one after another from sector 0.
//! Random offsets follow fio's default random map (each block once per pass, in a seeded
//! random order; `norandommap` draws with replacement, as do clones past the maps' bounds,
//! `MAX_RANDOM_MAP` and `MAX_RANDOM_MAPS`). `rate` delays issues to keep the
//! clone's bytes within the rate; `thinktime` waits after each completion.

use std::collections::HashMap;

use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::engine::{Finished, Pending, Source, When};
use crate::request::Advice;
use crate::request::{FileRef, Flags, Op, Request, SECTOR};

/// Largest size accepted anywhere (1 PiB): beyond it is a typo, not a workload.
pub const MAX_BYTES: u64 = 1 << 50;
/// Largest block size (fio's own limit is lower; a request must fit the simulator's limits).
pub const MAX_BS: u64 = 1 << 30;
/// Most streams (numjobs summed over jobs) and most requests in flight per stream.
pub const MAX_STREAMS: u64 = 4096;
pub const MAX_IODEPTH: u64 = 65536;
/// Longest runtime, ms (30 days).
pub const MAX_RUNTIME_MS: f64 = 30.0 * 86_400_000.0;
/// Random maps (fio's per-block "done" bitmap, here a permutation of 4-byte block numbers)
/// up to this many blocks per stream (4 MiB); larger regions draw with replacement, as
/// `norandommap`.
const MAX_RANDOM_MAP: u64 = 1 << 20;
/// All the streams' random maps together, blocks (64 MiB): streams that would pass it draw
/// with replacement. Before this bound a job of many clones over a file of tiny blocks built
/// a map per clone (found by the fuzzer: 160 clones of a 4 MiB file at `bs=2`, 2 M blocks
/// each, took 9 s; 4,096 clones of 16 M blocks would have taken 256 GiB).
const MAX_RANDOM_MAPS: u64 = 1 << 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    Read,
    Write,
    RandRead,
    RandWrite,
    /// Mixed sequential (`rw`/`readwrite`).
    Rw,
    RandRw,
}

impl Rw {
    pub fn random(self) -> bool {
        matches!(self, Rw::RandRead | Rw::RandWrite | Rw::RandRw)
    }
    /// Fraction of reads given `rwmixread` (%).
    fn read_share(self, rwmixread: f64) -> f64 {
        match self {
            Rw::Read | Rw::RandRead => 1.0,
            Rw::Write | Rw::RandWrite => 0.0,
            Rw::Rw | Rw::RandRw => rwmixread / 100.0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IoEngine {
    /// psync, sync, pvsync, pvsync2: one request at a time per job.
    Sync,
    Libaio,
    IoUring,
}

/// `fadvise_hint`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FadviseHint {
    None,
    /// fio's default (`1`): SEQUENTIAL for sequential jobs, RANDOM for random ones.
    Type,
    Sequential,
    Random,
}

/// `sync` (O_SYNC/O_DSYNC on the files).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    None,
    Sync,
    Dsync,
}

/// One job section, with `[global]` applied (units in the field names).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FioJob {
    pub name: String,
    /// Line of the section header.
    pub line: usize,
    pub rw: Rw,
    /// % of reads in mixed jobs.
    pub rwmixread: f64,
    /// Block size range (min, max) for reads and for writes, bytes.
    pub bs: [(u64, u64); 2],
    /// Total I/O per clone (`size`, or `io_size` when given), bytes.
    pub io_bytes: Option<u64>,
    /// Region of the file(s) used per clone (`size`), bytes.
    pub size: Option<u64>,
    /// Size of each file (range), bytes.
    pub filesize: Option<(u64, u64)>,
    pub nrfiles: u64,
    pub iodepth: u64,
    pub ioengine: IoEngine,
    pub direct: bool,
    pub sync: SyncMode,
    pub fadvise_hint: FadviseHint,
    pub numjobs: u64,
    pub runtime_ms: Option<f64>,
    pub time_based: bool,
    /// Rate cap per clone, bytes/s, reads and writes.
    pub rate: [Option<u64>; 2],
    pub thinktime_us: f64,
    pub norandommap: bool,
    pub randseed: u64,
    /// fio's `invalidate` (drop the file's cached pages before the job; default on).
    pub invalidate: bool,
    pub filename: Option<String>,
}

impl FioJob {
    fn defaults(name: &str, line: usize) -> FioJob {
        FioJob {
            name: name.to_string(),
            line,
            rw: Rw::Read,
            rwmixread: 50.0,
            bs: [(4096, 4096); 2],
            io_bytes: None,
            size: None,
            filesize: None,
            nrfiles: 1,
            iodepth: 1,
            ioengine: IoEngine::Sync,
            direct: false,
            sync: SyncMode::None,
            fadvise_hint: FadviseHint::Type,
            numjobs: 1,
            runtime_ms: None,
            time_based: false,
            rate: [None, None],
            thinktime_us: 0.0,
            norandommap: false,
            randseed: 0x5eed,
            invalidate: true,
            filename: None,
        }
    }

    /// Requests this job keeps in flight per clone.
    pub fn effective_depth(&self) -> u64 {
        match self.ioengine {
            IoEngine::Sync => 1,
            // libaio on a buffered file: io_submit does the I/O before returning.
            IoEngine::Libaio if !self.direct => 1,
            _ => self.iodepth,
        }
    }

    /// The page-cache advice fio gives each file (`fadvise_hint`).
    pub fn advice(&self) -> Option<Advice> {
        match self.fadvise_hint {
            FadviseHint::None => None,
            FadviseHint::Sequential => Some(Advice::Sequential),
            FadviseHint::Random => Some(Advice::Random),
            FadviseHint::Type if self.rw.random() => Some(Advice::Random),
            FadviseHint::Type => Some(Advice::Sequential),
        }
    }

    /// Bytes of each file of a clone.
    fn file_bytes(&self) -> u64 {
        match (self.filesize, self.size) {
            (Some((lo, _)), _) => lo,
            (None, Some(s)) => (s / self.nrfiles.max(1)).max(1),
            (None, None) => 0,
        }
    }
}

/// A parsed job file.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobFile {
    pub jobs: Vec<FioJob>,
    /// Unsupported options let through by `allow_unknown`, and other notes.
    pub warnings: Vec<String>,
}

/// Options that change what fio reports but not the I/O it does.
const REPORTING_ONLY: &[&str] = &[
    "description",
    "group_reporting",
    "write_lat_log",
    "write_bw_log",
    "write_iops_log",
    "write_hist_log",
    "log_avg_msec",
    "log_hist_msec",
    "log_max_value",
    "log_offset",
    "log_compression",
    "per_job_logs",
    "lat_percentiles",
    "clat_percentiles",
    "slat_percentiles",
    "percentile_list",
    "disable_lat",
    "disable_clat",
    "disable_slat",
    "disable_bw_measurement",
    "gtod_reduce",
    "thread",
    "stats",
    "unified_rw_reporting",
    "significant_figures",
    "cpus_allowed",
    "cpus_allowed_policy",
    "cpumask",
    "kb_base",
    "directory",
    "create_serialize",
    "allow_file_create",
    "overwrite",
    "randrepeat",
    "random_generator",
    "unlink",
];

/// Options the simulation uses.
const SIMULATED: &[&str] = &[
    "name",
    "rw",
    "readwrite",
    "rwmixread",
    "rwmixwrite",
    "bs",
    "blocksize",
    "bsrange",
    "blocksize_range",
    "size",
    "io_size",
    "io_limit",
    "filesize",
    "nrfiles",
    "iodepth",
    "ioengine",
    "direct",
    "buffered",
    "sync",
    "fadvise_hint",
    "numjobs",
    "runtime",
    "time_based",
    "rate",
    "thinktime",
    "norandommap",
    "randseed",
    "invalidate",
    "filename",
];

/// Every option name the reader knows (simulated or reporting-only).
pub fn known_options() -> impl Iterator<Item = &'static str> {
    SIMULATED.iter().chain(REPORTING_ONLY).copied()
}

/// Parses a job file. `allow_unknown`: unsupported options become warnings.
pub fn parse(text: &str, allow_unknown: bool) -> Result<JobFile> {
    struct Section<'a> {
        name: &'a str,
        line: usize,
        opts: Vec<(&'a str, Option<&'a str>, usize)>,
    }
    let mut sections: Vec<Section> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') || l.starts_with(';') {
            continue;
        }
        if let Some(rest) = l.strip_prefix('[') {
            let Some(name) = rest.strip_suffix(']') else {
                bail!("line {n}: a section header must end with ']': {l}");
            };
            let name = name.trim();
            if name.is_empty() {
                bail!("line {n}: empty section name");
            }
            sections.push(Section {
                name,
                line: n,
                opts: Vec::new(),
            });
            continue;
        }
        if l.starts_with("include ") {
            bail!("line {n}: 'include' is not supported (put the options in this file)");
        }
        let Some(sec) = sections.last_mut() else {
            bail!("line {n}: option outside any [section]: {l}");
        };
        let (k, v) = match l.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (l, None),
        };
        if k.is_empty() {
            bail!("line {n}: option with no name: {l}");
        }
        if v.is_some_and(|v| v.contains('$')) {
            bail!("line {n}: environment variables ('$') in values are not supported: {l}");
        }
        sec.opts.push((k, v, n));
    }
    // Unknown options: all at once.
    let mut unknown: Vec<String> = Vec::new();
    for s in &sections {
        for (k, _, n) in &s.opts {
            if !known_options().any(|o| o == *k) {
                unknown.push(format!("{k} (line {n})"));
            }
        }
    }
    let mut warnings = Vec::new();
    if !unknown.is_empty() {
        let msg = format!(
            "unsupported fio option{}: {}",
            if unknown.len() == 1 { "" } else { "s" },
            unknown.join(", ")
        );
        if !allow_unknown {
            bail!(
                "{msg}\n  the simulator would silently differ from fio; remove them or pass --allow-unknown to simulate without them\n  supported: {}\n  reporting only (accepted, no effect on the I/O): {}",
                SIMULATED.join(" "),
                REPORTING_ONLY.join(" ")
            );
        }
        warnings.push(format!("{msg} — ignored (--allow-unknown)"));
    }
    let mut global: Vec<(&str, Option<&str>, usize)> = Vec::new();
    let mut jobs = Vec::new();
    for s in &sections {
        if s.name == "global" {
            global.extend(s.opts.iter().copied());
            continue;
        }
        let mut job = FioJob::defaults(s.name, s.line);
        for &(k, v, n) in global.iter().chain(&s.opts) {
            if known_options().any(|o| o == k) {
                apply(&mut job, k, v, n)?;
            }
        }
        finish(&mut job)?;
        jobs.push(job);
    }
    if jobs.is_empty() {
        bail!("no job section (a [name] other than [global]) in the job file");
    }
    let streams: u64 = jobs.iter().map(|j| j.numjobs).sum();
    if streams > MAX_STREAMS {
        bail!("{streams} jobs in all (numjobs summed) is more than the limit of {MAX_STREAMS}");
    }
    Ok(JobFile { jobs, warnings })
}

fn finish(job: &mut FioJob) -> Result<()> {
    let l = job.line;
    if job.size.is_none() && job.filesize.is_none() {
        bail!(
            "line {l}: job '{}' has no size (size= or filesize=)",
            job.name
        );
    }
    if job.size.is_none() {
        job.size = job.filesize.map(|(lo, _)| lo.saturating_mul(job.nrfiles));
    }
    if job.io_bytes.is_none() {
        job.io_bytes = job.size;
    }
    if job.time_based && job.runtime_ms.is_none() {
        bail!(
            "line {l}: job '{}': time_based needs a runtime (it would run forever)",
            job.name
        );
    }
    let fb = job.file_bytes();
    let max_bs = job.bs[0].1.max(job.bs[1].1);
    if fb < max_bs {
        bail!(
            "line {l}: job '{}': each file ({fb} bytes) is smaller than the block size ({max_bs} bytes)",
            job.name
        );
    }
    if job.direct {
        for (lo, hi) in job.bs {
            if lo % SECTOR != 0 || hi % SECTOR != 0 {
                bail!(
                    "line {l}: job '{}': direct=1 needs block sizes in multiples of 512 bytes",
                    job.name
                );
            }
        }
    }
    Ok(())
}

fn need<'a>(k: &str, v: Option<&'a str>, n: usize) -> Result<&'a str> {
    match v {
        Some(v) if !v.is_empty() => Ok(v),
        _ => bail!("line {n}: {k} needs a value ({k}=...)"),
    }
}

fn parse_bool(k: &str, v: Option<&str>, n: usize) -> Result<bool> {
    match v {
        None => Ok(true),
        Some("1") | Some("true") | Some("on") | Some("yes") => Ok(true),
        Some("0") | Some("false") | Some("off") | Some("no") => Ok(false),
        Some(o) => bail!("line {n}: {k}={o}: expected 0 or 1"),
    }
}

fn parse_count(k: &str, v: Option<&str>, n: usize, min: u64, max: u64) -> Result<u64> {
    let v = need(k, v, n)?;
    let x = parse_size(v).map_err(|e| anyhow::anyhow!("line {n}: {k}={v}: {e}"))?;
    if x < min || x > max {
        bail!("line {n}: {k}={v}: must be within {min}..={max}");
    }
    Ok(x)
}

fn apply(job: &mut FioJob, k: &str, v: Option<&str>, n: usize) -> Result<()> {
    let err = |msg: &str| -> anyhow::Error {
        anyhow::anyhow!("line {n}: {k}={}: {msg}", v.unwrap_or(""))
    };
    match k {
        "name" => job.name = need(k, v, n)?.to_string(),
        "rw" | "readwrite" => {
            let s = need(k, v, n)?;
            if s.contains(':') {
                return Err(err("offset modifiers (rw=...:N) are not supported"));
            }
            job.rw = match s {
                "read" => Rw::Read,
                "write" => Rw::Write,
                "randread" => Rw::RandRead,
                "randwrite" => Rw::RandWrite,
                "rw" | "readwrite" => Rw::Rw,
                "randrw" => Rw::RandRw,
                "trim" | "randtrim" | "trimwrite" | "randtrimwrite" => {
                    return Err(err("trim workloads are not supported"))
                }
                _ => {
                    return Err(err(
                        "expected read, write, randread, randwrite, rw or randrw",
                    ))
                }
            };
        }
        "rwmixread" => job.rwmixread = parse_count(k, v, n, 0, 100)? as f64,
        "rwmixwrite" => job.rwmixread = 100.0 - parse_count(k, v, n, 0, 100)? as f64,
        "bs" | "blocksize" => {
            let s = need(k, v, n)?;
            let parts: Vec<&str> = s.split(',').collect();
            if parts.len() > 3 {
                return Err(err("expected bs=READ[,WRITE[,TRIM]]"));
            }
            let mut vals = [None, None];
            for (i, p) in parts.iter().take(2).enumerate() {
                if p.is_empty() {
                    continue;
                }
                if p.contains('-') || p.contains(':') {
                    return Err(err("a range of block sizes goes in bsrange="));
                }
                let b = parse_size(p).map_err(|e| err(&e))?;
                if b == 0 || b > MAX_BS {
                    return Err(err("a block size must be within 1 byte..=1 GiB"));
                }
                vals[i] = Some(b);
            }
            if let Some(r) = vals[0] {
                job.bs = [(r, r), (r, r)];
            }
            if let Some(w) = vals[1] {
                job.bs[1] = (w, w);
            }
        }
        "bsrange" | "blocksize_range" => {
            let s = need(k, v, n)?;
            let parts: Vec<&str> = s.split(',').collect();
            if parts.len() > 3 {
                return Err(err("expected bsrange=LO-HI[,LO-HI]"));
            }
            let r = parse_range(parts[0]).map_err(|e| err(&e))?;
            job.bs = [r, r];
            if let Some(p) = parts.get(1).filter(|p| !p.is_empty()) {
                job.bs[1] = parse_range(p).map_err(|e| err(&e))?;
            }
            if job.bs.iter().any(|&(_, hi)| hi > MAX_BS) {
                return Err(err("a block size must be within 1 byte..=1 GiB"));
            }
        }
        "size" => {
            let s = need(k, v, n)?;
            if s.ends_with('%') {
                return Err(err(
                    "a size in % of the device is not supported (give bytes)",
                ));
            }
            job.size = Some(parse_size(s).map_err(|e| err(&e))?);
        }
        "io_size" | "io_limit" => {
            job.io_bytes = Some(parse_size(need(k, v, n)?).map_err(|e| err(&e))?)
        }
        "filesize" => job.filesize = Some(parse_range(need(k, v, n)?).map_err(|e| err(&e))?),
        "nrfiles" => job.nrfiles = parse_count(k, v, n, 1, 4096)?,
        "iodepth" => job.iodepth = parse_count(k, v, n, 1, MAX_IODEPTH)?,
        "ioengine" => {
            job.ioengine = match need(k, v, n)? {
                "psync" | "sync" | "pvsync" | "pvsync2" => IoEngine::Sync,
                "libaio" => IoEngine::Libaio,
                "io_uring" => IoEngine::IoUring,
                _ => {
                    return Err(err(
                        "supported engines: psync, sync, pvsync, pvsync2, libaio, io_uring",
                    ))
                }
            }
        }
        "direct" => job.direct = parse_bool(k, v, n)?,
        "buffered" => job.direct = !parse_bool(k, v, n)?,
        "sync" => {
            job.sync = match v {
                None | Some("1") | Some("sync") => SyncMode::Sync,
                Some("0") | Some("none") => SyncMode::None,
                Some("dsync") => SyncMode::Dsync,
                _ => return Err(err("expected 0, 1, none, sync or dsync")),
            }
        }
        "fadvise_hint" => {
            job.fadvise_hint = match need(k, v, n)? {
                "0" => FadviseHint::None,
                "1" => FadviseHint::Type,
                "sequential" => FadviseHint::Sequential,
                "random" => FadviseHint::Random,
                _ => return Err(err("expected 0, 1, sequential or random")),
            }
        }
        "numjobs" => job.numjobs = parse_count(k, v, n, 1, MAX_STREAMS)?,
        "runtime" => {
            let ms = parse_time_ms(need(k, v, n)?, 1000.0).map_err(|e| err(&e))?;
            job.runtime_ms = (ms > 0.0).then_some(ms);
        }
        "time_based" => job.time_based = parse_bool(k, v, n)?,
        "rate" => {
            let s = need(k, v, n)?;
            let parts: Vec<&str> = s.split(',').collect();
            if parts.len() > 3 {
                return Err(err("expected rate=READ[,WRITE]"));
            }
            let mut r = [None, None];
            for (i, p) in parts.iter().take(2).enumerate() {
                if !p.is_empty() {
                    let x = parse_size(p).map_err(|e| err(&e))?;
                    r[i] = (x > 0).then_some(x);
                }
            }
            job.rate = if parts.len() == 1 { [r[0], r[0]] } else { r };
        }
        "thinktime" => {
            job.thinktime_us = parse_time_ms(need(k, v, n)?, 0.001).map_err(|e| err(&e))? * 1000.0
        }
        "norandommap" => job.norandommap = parse_bool(k, v, n)?,
        "randseed" => job.randseed = parse_size(need(k, v, n)?).map_err(|e| err(&e))?,
        "invalidate" => job.invalidate = parse_bool(k, v, n)?,
        "filename" => {
            let s = need(k, v, n)?;
            if s.contains(':') {
                return Err(err("several files in one filename= are not supported"));
            }
            job.filename = Some(s.to_string());
        }
        _ => {} // reporting-only
    }
    Ok(())
}

/// A size in fio's syntax (kb_base=1024): `4k` = 4096, `4KiB` = 4000 (fio's compatibility
/// mode), `0x1000`, `1m`, `2g`...
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let (digits, suffix, radix) = if let Some(h) = t.strip_prefix("0x").or(t.strip_prefix("0X")) {
        (h, "", 16)
    } else {
        let end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        (&t[..end], &t[end..], 10)
    };
    if digits.is_empty() {
        return Err(format!("'{t}' is not a number"));
    }
    let n = u64::from_str_radix(digits, radix).map_err(|_| format!("'{t}' is not a number"))?;
    let suf = suffix.to_ascii_lowercase();
    let (exp, base) = match suf.as_str() {
        "" | "b" => (0, 1024),
        _ => {
            let p = match suf.as_bytes()[0] {
                b'k' => 1,
                b'm' => 2,
                b'g' => 3,
                b't' => 4,
                b'p' => 5,
                _ => return Err(format!("'{t}': unknown unit '{suffix}' (k, m, g, t, p)")),
            };
            match &suf[1..] {
                "" | "b" | "i" => (p, 1024),
                "ib" => (p, 1000),
                _ => return Err(format!("'{t}': unknown unit '{suffix}' (k, m, g, t, p)")),
            }
        }
    };
    let mult = (base as u64).checked_pow(exp).ok_or("too large")?;
    let v = n
        .checked_mul(mult)
        .ok_or_else(|| format!("'{t}' is too large"))?;
    if v > MAX_BYTES {
        return Err(format!("'{t}' is larger than the limit of 1 PiB"));
    }
    Ok(v)
}

/// `a-b`, `a:b` or a single value (lo = hi).
pub fn parse_range(s: &str) -> std::result::Result<(u64, u64), String> {
    let (a, b) = match s.split_once(['-', ':']) {
        Some((a, b)) => (parse_size(a)?, parse_size(b)?),
        None => {
            let x = parse_size(s)?;
            (x, x)
        }
    };
    if a == 0 || b == 0 {
        return Err("sizes must be at least 1".into());
    }
    if a > b {
        return Err(format!(
            "range {a}-{b}: the low end is larger than the high end"
        ));
    }
    Ok((a, b))
}

/// A time in ms; `default_unit_ms` is what a bare number counts (1000 for seconds).
pub fn parse_time_ms(s: &str, default_unit_ms: f64) -> std::result::Result<f64, String> {
    let t = s.trim();
    let end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if end == 0 {
        return Err(format!("'{t}' is not a time"));
    }
    let n: u64 = t[..end]
        .parse()
        .map_err(|_| format!("'{t}' is not a time"))?;
    let unit = match t[end..].to_ascii_lowercase().as_str() {
        "" => default_unit_ms,
        "us" | "usec" => 0.001,
        "ms" | "msec" => 1.0,
        "s" | "sec" => 1000.0,
        "m" | "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        u => {
            return Err(format!(
                "'{t}': unknown time unit '{u}' (us, ms, s, m, h, d)"
            ))
        }
    };
    let ms = n as f64 * unit;
    if ms > MAX_RUNTIME_MS {
        return Err(format!("'{t}' is longer than 30 days"));
    }
    Ok(ms)
}

/// A file of the simulated run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimFile {
    pub name: String,
    /// First sector on the device.
    pub lba: u64,
    pub bytes: u64,
    #[serde(skip)]
    pub advice: Option<Advice>,
}

/// Per-clone state.
struct Stream {
    job: usize,
    files: Vec<u32>,
    /// Bytes of the region used in each file.
    region: u64,
    rng: ChaCha8Rng,
    /// Sequential position (bytes) and file index.
    pos: u64,
    file_i: usize,
    /// Random map: the block order of this pass, and how far through it.
    perm: Vec<u32>,
    perm_i: usize,
    /// No random map for this stream: the run's budget was spent ([`MAX_RANDOM_MAPS`]).
    no_map: bool,
    issued_bytes: u64,
    /// Bytes per op for the rate cap.
    rate_bytes: [u64; 2],
    done: bool,
    /// `posix_fadvise` calls made before the first I/O (fio's `invalidate` and
    /// `fadvise_hint`), still to hand out.
    prelude: Vec<Request>,
    /// Completions of prelude calls still to come: they free no I/O slot.
    prelude_pending: u64,
    /// `time_based`: the bytes issued at which the next pass over the job's `io_size` starts.
    pass_end: u64,
}

/// A `posix_fadvise(fd, 0, 0, a)` on file `id`.
fn advise_request(f: &SimFile, id: u32, a: Advice) -> Request {
    Request {
        id: 0,
        arrival: 0.0,
        dev: 0,
        lba: f.lba,
        sectors: 0,
        op: Op::Advise(a),
        flags: Flags::default(),
        file: Some(FileRef {
            file: id,
            offset: 0,
        }),
    }
}

fn streams_files_dedup(ids: &[u32]) -> Vec<u32> {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

/// A job file as a workload.
pub struct FioSource {
    pub jobs: Vec<FioJob>,
    pub files: Vec<SimFile>,
    streams: Vec<Stream>,
    /// Initial requests not yet handed out: (stream, remaining).
    initial: Vec<(u32, u64)>,
    initial_i: usize,
    /// Simulated time the jobs start at (ms): runtime and rate count from here.
    start: f64,
    /// The application's time between a completion and its next request, ms.
    gap: f64,
    /// Blocks of random maps still allowed ([`MAX_RANDOM_MAPS`]).
    map_budget: u64,
}

impl FioSource {
    /// Starts the jobs at `t` ms instead of 0 (a second run in the same simulator, after a
    /// warm-up pass).
    pub fn start_at(mut self, t: f64) -> FioSource {
        self.start = t.max(0.0);
        self
    }

    pub fn start(&self) -> f64 {
        self.start
    }

    /// The application's own time between a completion and its next request, µs (fio's
    /// per-I/O loop: [`HostCpu::app_gap_us`]).
    pub fn with_app_gap_us(mut self, us: f64) -> FioSource {
        self.gap = (us / 1000.0).max(0.0);
        self
    }

    /// Lays out the files from sector `first_lba` and checks they fit `capacity` sectors.
    pub fn new(jf: &JobFile, first_lba: u64, capacity: u64) -> Result<FioSource> {
        let mut files: Vec<SimFile> = Vec::new();
        let mut by_name: HashMap<String, u32> = HashMap::new();
        let mut next_lba = first_lba;
        let mut streams = Vec::new();
        let mut initial = Vec::new();
        for (ji, job) in jf.jobs.iter().enumerate() {
            let fb = job.file_bytes();
            for clone in 0..job.numjobs {
                let mut ids = Vec::new();
                for f in 0..job.nrfiles {
                    let name = match &job.filename {
                        Some(n) => n.clone(),
                        None => format!("{}.{}.{}", job.name, clone, f),
                    };
                    if let Some(&id) = by_name.get(&name) {
                        let existing = &mut files[id as usize];
                        if existing.bytes < fb {
                            bail!("file '{name}' is used by several jobs with different sizes");
                        }
                        ids.push(id);
                        continue;
                    }
                    let id = files.len() as u32;
                    // Files start on 1 MiB boundaries, as an empty ext4 lays out large files.
                    let sectors = fb.div_ceil(1 << 20) * ((1 << 20) / SECTOR);
                    if next_lba + sectors > capacity {
                        bail!(
                            "the job file's files ({} MiB so far) do not fit the device ({} MiB)",
                            ((next_lba + sectors) * SECTOR) >> 20,
                            (capacity * SECTOR) >> 20
                        );
                    }
                    files.push(SimFile {
                        name: name.clone(),
                        lba: next_lba,
                        bytes: fb,
                        advice: job.advice(),
                    });
                    next_lba += sectors;
                    by_name.insert(name, id);
                    ids.push(id);
                }
                let region = job.size.unwrap_or(fb).min(fb);
                let seed = job
                    .randseed
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    .wrapping_add(ji as u64 * 1_000_003 + clone);
                let sid = streams.len() as u32;
                streams.push(Stream {
                    job: ji,
                    files: ids.clone(),
                    region,
                    rng: ChaCha8Rng::seed_from_u64(seed),
                    pos: 0,
                    file_i: 0,
                    perm: Vec::new(),
                    perm_i: 0,
                    no_map: false,
                    issued_bytes: 0,
                    rate_bytes: [0, 0],
                    done: false,
                    prelude: Vec::new(),
                    prelude_pending: 0,
                    pass_end: job.io_bytes.unwrap_or(0),
                });
                let mut prelude = Vec::new();
                for &id in &streams_files_dedup(&ids) {
                    let advise = |a: Advice| advise_request(&files[id as usize], id, a);
                    if job.invalidate {
                        prelude.push(advise(Advice::DontNeed));
                    }
                    if let Some(a) = job.advice() {
                        prelude.push(advise(a));
                    }
                }
                let np = prelude.len() as u64;
                if let Some(s) = streams.last_mut() {
                    let s: &mut Stream = s;
                    s.prelude = prelude;
                    s.prelude_pending = np;
                }
                initial.push((sid, job.effective_depth() + np));
            }
        }
        Ok(FioSource {
            jobs: jf.jobs.clone(),
            files,
            streams,
            initial,
            initial_i: 0,
            start: 0.0,
            gap: 0.0,
            map_budget: MAX_RANDOM_MAPS,
        })
    }

    /// The job a file belongs to (its first user).
    pub fn job_of_stream(&self, stream: u32) -> Option<usize> {
        self.streams.get(stream as usize).map(|s| s.job)
    }

    /// The next request of a stream at `now` ms (None: the stream is finished).
    fn make(&mut self, sid: u32, now: f64, first: bool) -> Option<Pending> {
        let s = self.streams.get_mut(sid as usize)?;
        if !s.prelude.is_empty() {
            let req = s.prelude.remove(0);
            return Some(Pending {
                when: When::Stream {
                    stream: sid,
                    at: now,
                },
                req,
            });
        }
        if s.done {
            return None;
        }
        let job = &self.jobs[s.job];
        let total = job.io_bytes.unwrap_or(0);
        if !job.time_based && s.issued_bytes >= total {
            s.done = true;
            return None;
        }
        // A time_based job goes over its `io_size` again and again; each pass starts from
        // the first block with a new random map and, with `invalidate`, drops the files'
        // cached pages first (fio 3.33, checked: a 32 MiB file read for 1 s with
        // invalidate=1 came from the device on every pass, 1,409 MiB of pgpgin for 1,382
        // MiB read; with invalidate=0 it was read once).
        if job.time_based && total > 0 && s.issued_bytes >= s.pass_end {
            s.pass_end = s.issued_bytes + total;
            s.pos = 0;
            s.file_i = 0;
            s.perm_i = s.perm.len();
            if job.invalidate {
                // (Issued in the I/O's place: each completion frees its slot, unlike the
                // first pass's prelude.)
                s.prelude = streams_files_dedup(&s.files)
                    .into_iter()
                    .map(|id| advise_request(&self.files[id as usize], id, Advice::DontNeed))
                    .collect();
                return self.make(sid, now, first);
            }
        }
        let share = job.rw.read_share(job.rwmixread);
        let read = share >= 1.0 || (share > 0.0 && s.rng.random::<f64>() < share);
        let slot = usize::from(!read);
        let (lo, hi) = job.bs[slot];
        let bs = if hi > lo {
            // Multiples of the smallest size, as fio picks within bsrange.
            lo * s.rng.random_range(1..=hi / lo)
        } else {
            lo
        };
        let region = s.region.max(bs);
        let fi;
        let offset;
        if job.rw.random() {
            fi = s.rng.random_range(0..s.files.len());
            // Offsets in units of the job's smallest block (fio's random map is on the
            // minimum block size): with one size per direction, or a range, a unit of this
            // request's size gave a map that the next request's larger size overran past
            // the file's end (found by the fuzzer: `bs=,3k`, reads of 4 KiB at 3 KiB
            // blocks).
            let unit = match share {
                x if x >= 1.0 => job.bs[0].0,
                x if x <= 0.0 => job.bs[1].0,
                _ => job.bs[0].0.min(job.bs[1].0),
            }
            .max(1);
            let blocks = (region / unit).max(1);
            let mut mapped =
                !(job.norandommap || blocks > MAX_RANDOM_MAP || s.files.len() > 1 || s.no_map);
            if mapped && s.perm.is_empty() {
                // The stream's first pass: its map's room comes out of the run's budget.
                if blocks > self.map_budget {
                    (s.no_map, mapped) = (true, false);
                } else {
                    self.map_budget -= blocks;
                }
            }
            let drawn = if !mapped {
                s.rng.random_range(0..blocks)
            } else {
                if s.perm_i >= s.perm.len() {
                    s.perm = (0..blocks as u32).collect();
                    // Fisher-Yates with the stream's generator.
                    for i in (1..s.perm.len()).rev() {
                        let j = s.rng.random_range(0..=i);
                        s.perm.swap(i, j);
                    }
                    s.perm_i = 0;
                }
                s.perm_i += 1;
                u64::from(s.perm[s.perm_i - 1])
            };
            // A block too near the end for this size moves back to the last that fits.
            offset = (drawn * unit).min((region - bs) / unit * unit);
        } else {
            if s.pos + bs > region {
                s.pos = 0;
                s.file_i = (s.file_i + 1) % s.files.len();
            }
            fi = s.file_i;
            offset = s.pos;
            s.pos += bs;
        }
        // The last request of a size-bound job is cut to what is left (fio does the same).
        let bs = if job.time_based {
            bs
        } else {
            bs.min(total - s.issued_bytes).max(SECTOR.min(bs))
        };
        let fid = s.files[fi];
        s.issued_bytes += bs;
        // When: after the think time, and no earlier than the rate allows.
        let mut at = if first {
            now
        } else {
            now + self.gap + job.thinktime_us / 1000.0
        };
        if let Some(rate) = job.rate[slot] {
            let due = self.start + s.rate_bytes[slot] as f64 / rate as f64 * 1000.0;
            at = at.max(due);
            s.rate_bytes[slot] += bs;
        }
        if let Some(rt) = job.runtime_ms {
            if at - self.start >= rt {
                s.done = true;
                return None;
            }
        }
        let f = &self.files[fid as usize];
        let mut flags = Flags::default();
        if job.direct {
            flags = flags.with(Flags::DIRECT);
        }
        if !read {
            flags = match job.sync {
                SyncMode::None => flags,
                SyncMode::Dsync => flags.with(Flags::DSYNC),
                // Linux's O_SYNC is __O_SYNC | O_DSYNC.
                SyncMode::Sync => flags.with(Flags::OSYNC).with(Flags::DSYNC),
            };
        }
        Some(Pending {
            when: When::Stream { stream: sid, at },
            req: Request {
                id: 0,
                arrival: 0.0,
                dev: 0,
                lba: f.lba + offset / SECTOR,
                sectors: (bs.div_ceil(SECTOR)) as u32,
                op: if read { Op::Read } else { Op::Write },
                flags,
                file: Some(FileRef { file: fid, offset }),
            },
        })
    }
}

impl FioSource {
    /// The jobs' files as (file id, bytes), for the page cache's end-of-file read-ahead
    /// limit ([`host_chain_with_files`]).
    pub fn file_sizes(&self) -> Vec<(u32, u64)> {
        self.files
            .iter()
            .enumerate()
            .map(|(i, f)| (i as u32, f.bytes))
            .collect()
    }
}

impl Source for FioSource {
    fn next(&mut self) -> Result<Option<Pending>> {
        // The first `depth` requests of every stream, at time 0.
        while let Some(&(sid, left)) = self.initial.get(self.initial_i) {
            if left == 0 {
                self.initial_i += 1;
                continue;
            }
            self.initial[self.initial_i].1 -= 1;
            if let Some(p) = self.make(sid, self.start, true) {
                return Ok(Some(p));
            }
            self.initial_i += 1;
        }
        Ok(None)
    }
    fn next_in_stream(&mut self, stream: u32, now: f64) -> Result<Option<Pending>> {
        // A completed prelude call (fadvise) frees no I/O slot. The prelude is issued first
        // and completes at once, so its completions come before any I/O's.
        if let Some(s) = self.streams.get_mut(stream as usize) {
            if s.prelude_pending > 0 {
                s.prelude_pending -= 1;
                return Ok(None);
            }
        }
        Ok(self.make(stream, now, false))
    }
    fn len_hint(&self) -> Option<u64> {
        let mut n = 0u64;
        for s in &self.streams {
            let j = &self.jobs[s.job];
            if j.time_based {
                return None;
            }
            let bs = j.bs[0].0.min(j.bs[1].0).max(1);
            n = n.saturating_add(j.io_bytes.unwrap_or(0) / bs);
        }
        Some(n)
    }
}

/// CPU time of a buffered read or write system call on the host, measured by `calibrate`
/// (reads of a cached file at several sizes): `cached_read_us` lists (KiB, µs) points,
/// interpolated linearly in log2(size) and extrapolated in proportion to the size beyond the
/// largest. The cost is not smooth on every machine (on this VM 128 KiB reads take 9 µs and
/// 512 KiB ones 700 µs), hence a table. O_DIRECT requests carry none (the device latency
/// measured with O_DIRECT already holds the system call).
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HostCpu {
    pub cached_read_us: Vec<[f64; 2]>,
    /// Buffered writes into new page-cache pages, (KiB, µs) as `cached_read_us`: the copy
    /// plus page allocation and dirtying, about twice a cached read's cost. Empty (older
    /// calibrations): writes cost the affine part of the read table.
    #[serde(default)]
    pub cached_write_us: Vec<[f64; 2]>,
    /// The application's own time between a completion and its next request (fio's loop,
    /// µs): measured as (run time / I/Os) − mean latency on cached 4 KiB reads.
    #[serde(default)]
    pub app_gap_us: f64,
    /// A read's cost per new folio it brings into the cache, µs (allocation, memcg charge,
    /// insertion, reclaim; see `PageCacheConfig::miss_folio_ms`): measured as buffered
    /// random cold reads (no read-ahead: 4 KiB folios) less O_DIRECT ones and less the
    /// copy, per page. 0 (older calibrations): free.
    #[serde(default)]
    pub miss_folio_us: f64,
    /// What reclaiming room for such a folio adds when the cache is full, µs (see
    /// `PageCacheConfig::reclaim_folio_ms`): the same reads run in a small memory cgroup kept
    /// full, per page, less `miss_folio_us`. 0 (older calibrations): free.
    #[serde(default)]
    pub reclaim_folio_us: f64,
    /// `POSIX_FADV_DONTNEED`'s cost per dirty page it sends to write-back, µs (see
    /// `PageCacheConfig::dontneed_dirty_page_ms`): measured on a fresh file of dirty pages.
    /// 0 (older calibrations): free.
    #[serde(default)]
    pub dontneed_dirty_page_us: f64,
    /// Cached 32 KiB reads by the size of the cached set they go over, (MiB, µs): a copy
    /// out of a set the CPU's caches hold runs faster than one from memory (this VM, 28 Nov:
    /// 2.2 µs over 24 MiB, 4.5 over 64 MiB), and `cached_read_us` was measured over
    /// [`CACHED_TABLE_SET_MIB`]. A job's reads are scaled by this profile at its own set
    /// ([`HostCpu::for_cached_set`]). Empty (older calibrations): no scaling.
    #[serde(default)]
    pub cached_set_us: Vec<[f64; 2]>,
}

/// The cached set (MiB) `cached_read_us` is measured over by `calibrate`.
pub const CACHED_TABLE_SET_MIB: u64 = 64;

impl HostCpu {
    /// Cost (µs) of a buffered read of `kib` KiB.
    pub fn cost_us(&self, kib: f64) -> f64 {
        table_us(&self.cached_read_us, kib)
    }

    /// Cost (µs) of a buffered write of `kib` KiB into new pages (0 without a write table).
    pub fn write_cost_us(&self, kib: f64) -> f64 {
        table_us(&self.cached_write_us, kib)
    }

    /// The costs for a job whose cached reads go over `set_bytes` (its files, at most the
    /// page cache's size): the read table scaled by the set profile's value there over its
    /// value at [`CACHED_TABLE_SET_MIB`] (clamped to the profile's ends: past its largest
    /// set a copy runs at memory speed). No profile, or no set: unchanged.
    pub fn for_cached_set(&self, set_bytes: u64) -> HostCpu {
        let mut c = self.clone();
        if self.cached_set_us.is_empty() || set_bytes == 0 {
            return c;
        }
        // (the tables' interpolation, but held at the largest set: no proportional growth)
        let [largest, at_largest] = self.cached_set_us[self.cached_set_us.len() - 1];
        let at = |mib: f64| {
            if mib >= largest {
                at_largest
            } else {
                table_us(&self.cached_set_us, mib)
            }
        };
        let (here, table) = (
            at(set_bytes as f64 / 1048576.0),
            at(CACHED_TABLE_SET_MIB as f64),
        );
        if here > 0.0 && table > 0.0 && here.is_finite() && table.is_finite() {
            for p in &mut c.cached_read_us {
                p[1] *= here / table;
            }
        }
        c
    }

    /// The affine part `(syscall µs, µs per KiB)`: the slope of a robust fit of the table up
    /// to 128 KiB, where the cost is a copy, under every one of those points (the smallest
    /// intercept, at least 0). The page cache charges it to every buffered call, reads and
    /// writes; [`Syscalls`] adds what reads (and, with a write table, writes) cost beyond it,
    /// and can only add: a line above a point would price that size above its own
    /// measurement. So [`fit_affine`]'s intercept (the median, held at 1 µs or more for
    /// device latencies) is not used: on this VM it lay 0.2-0.6 µs above the points (a 4 KiB
    /// cached read takes 0.89 µs), and a 32 KiB hit cost 4.3 µs against the table's 3.2.
    pub fn affine(&self) -> (f64, f64) {
        let pts: Vec<(f64, f64)> = self
            .cached_read_us
            .iter()
            .filter(|p| p[0] <= 128.0)
            .map(|p| (p[0], p[1]))
            .collect();
        match fit_affine(&pts) {
            Some((_, b)) => {
                let a = pts
                    .iter()
                    .map(|(x, y)| y - b * x)
                    .fold(f64::INFINITY, f64::min);
                (a.max(0.0), b)
            }
            None => (self.cost_us(4.0), 0.0),
        }
    }

    /// Extra cost of a buffered read or write beyond the affine part `(a, b)` (which the page
    /// cache charges; see [`HostCpu::affine`]), ms.
    fn cost_ms(&self, req: &Request, (a, b): (f64, f64)) -> f64 {
        if req.flags.contains(Flags::DIRECT) {
            return 0.0;
        }
        let kib = req.bytes() as f64 / 1024.0;
        let table = match req.op {
            Op::Read => self.cost_us(kib),
            Op::Write if !self.cached_write_us.is_empty() => self.write_cost_us(kib),
            _ => return 0.0,
        };
        (table - (a + b * kib)).max(0.0) / 1000.0
    }

    /// Checks the table: sizes ascending and positive, costs finite and >= 0.
    pub fn validate(&self) -> Result<()> {
        for (name, t) in [
            ("cached_read_us", &self.cached_read_us),
            ("cached_write_us", &self.cached_write_us),
            ("cached_set_us", &self.cached_set_us),
        ] {
            let mut prev = 0.0;
            for [k, us] in t {
                if !(k.is_finite() && *k > prev && us.is_finite() && *us >= 0.0) {
                    bail!("host_cpu.{name}: [size, µs] pairs with sizes ascending and µs >= 0");
                }
                prev = *k;
            }
        }
        if !(self.app_gap_us.is_finite() && (0.0..1e6).contains(&self.app_gap_us)) {
            bail!("host_cpu.app_gap_us must be within 0..1000000");
        }
        for (name, v) in [
            ("miss_folio_us", self.miss_folio_us),
            ("reclaim_folio_us", self.reclaim_folio_us),
            ("dontneed_dirty_page_us", self.dontneed_dirty_page_us),
        ] {
            if !(v.is_finite() && (0.0..1e6).contains(&v)) {
                bail!("host_cpu.{name} must be within 0..1000000");
            }
        }
        Ok(())
    }
}

/// A (KiB, µs) table's value at `kib`: linear in log2(size) between points, the first
/// point's below them, in proportion to the size beyond the last; 0 for an empty table.
pub fn table_us(t: &[[f64; 2]], kib: f64) -> f64 {
    if t.is_empty() {
        return 0.0;
    }
    let i = t.partition_point(|p| p[0] < kib);
    let v = if i == 0 {
        t[0][1]
    } else if i >= t.len() {
        let [k, us] = t[t.len() - 1];
        us * kib / k.max(1e-9)
    } else {
        let ([k0, u0], [k1, u1]) = (t[i - 1], t[i]);
        let f = (kib.max(1e-9).log2() - k0.max(1e-9).log2())
            / (k1.max(1e-9).log2() - k0.max(1e-9).log2()).max(1e-12);
        u0 + f * (u1 - u0)
    };
    if v.is_finite() {
        v.max(0.0)
    } else {
        0.0
    }
}

/// The system-call level: adds [`HostCpu`]'s cost to each buffered request's completion.
pub struct Syscalls {
    cpu: HostCpu,
    /// `cpu.affine()`, fitted once (a robust fit per request was a tenth of the run time).
    affine: (f64, f64),
    /// The last cost worked out: (bytes, op, flags, ms). A job repeats one size, and the
    /// table's log interpolation was a twentieth of a cache hit's simulation.
    memo: Option<(u64, Op, Flags, f64)>,
}

impl Syscalls {
    pub fn new(cpu: HostCpu) -> Syscalls {
        let mut cpu = cpu;
        cpu.cached_read_us.sort_by(|a, b| a[0].total_cmp(&b[0]));
        cpu.cached_write_us.sort_by(|a, b| a[0].total_cmp(&b[0]));
        Syscalls {
            affine: cpu.affine(),
            cpu,
            memo: None,
        }
    }
}

impl Syscalls {
    /// A completion on its way up at `now`: its system call's CPU cost added.
    fn finish(&mut self, done: &mut crate::request::Completion, now: f64) -> Finished {
        let key = (done.req.bytes(), done.req.op, done.req.flags);
        let cost = match self.memo {
            Some((b, o, f, c)) if (b, o, f) == key => c,
            _ => {
                let c = self.cpu.cost_ms(&done.req, self.affine);
                self.memo = Some((key.0, key.1, key.2, c));
                c
            }
        };
        if cost <= 0.0 {
            return Finished::Up;
        }
        done.rec.overhead += cost;
        done.rec.completion = now + cost;
        Finished::UpAt
    }
}

impl crate::engine::Component for Syscalls {
    fn name(&self) -> &str {
        "syscalls"
    }
    fn submit(&mut self, req: Request, ctx: &mut crate::engine::Ctx) {
        ctx.down(req);
    }
    fn passes_requests(&self) -> bool {
        true
    }
    fn complete(&mut self, mut done: crate::request::Completion, ctx: &mut crate::engine::Ctx) {
        match self.finish(&mut done, ctx.now()) {
            Finished::Up => ctx.up(done),
            Finished::UpAt => ctx.up_at(done),
        }
    }
    fn complete_now(
        &mut self,
        done: &mut crate::request::Completion,
        now: f64,
    ) -> Option<Finished> {
        Some(self.finish(done, now))
    }
}

/// The host stack over `device` for a job file: when a calibration gives a [`HostCpu`]
/// table, the page cache's affine CPU costs come from its affine part and the system-call
/// level above adds what buffered reads cost beyond it; then `host`'s page cache and block
/// layer.
/// fio's `fadvise_hint` and `invalidate` reach the page cache as `Advise` requests made by
/// [`FioSource`] before each stream's first I/O.
pub fn host_chain(
    device: Box<dyn crate::engine::Component>,
    host: &crate::host::HostParams,
    cpu: Option<&HostCpu>,
) -> Result<Vec<Box<dyn crate::engine::Component>>> {
    host_chain_with_files(device, host, cpu, &[])
}

/// [`host_chain`] with the workload's file sizes (file id, bytes) given to the page cache:
/// read-ahead stops at the end of each file, as the kernel's does.
pub fn host_chain_with_files(
    device: Box<dyn crate::engine::Component>,
    host: &crate::host::HostParams,
    cpu: Option<&HostCpu>,
    files: &[(u32, u64)],
) -> Result<Vec<Box<dyn crate::engine::Component>>> {
    let mut host = *host;
    let mut chain: Vec<Box<dyn crate::engine::Component>> = Vec::new();
    if let Some(c) = cpu.filter(|c| !c.cached_read_us.is_empty()) {
        c.validate()?;
        // The set the job's cached reads go over: its files, at most what the cache holds.
        let files: u64 = files.iter().map(|f| f.1).sum();
        let capacity = host
            .page_cache
            .capacity_pages
            .saturating_mul(crate::pagecache::PAGE);
        let c = &c.for_cached_set(files.min(capacity));
        let (a, b) = c.affine();
        host.page_cache.syscall_ms = a / 1000.0;
        // b µs per KiB = 1024 / b bytes per µs = MB/s; 0 means free copies.
        host.page_cache.copy_mb_s = if b > 1e-9 { 1024.0 / b } else { 0.0 };
        host.page_cache.miss_folio_ms = c.miss_folio_us / 1000.0;
        host.page_cache.reclaim_folio_ms = c.reclaim_folio_us / 1000.0;
        host.page_cache.dontneed_dirty_page_ms = c.dontneed_dirty_page_us / 1000.0;
        chain.push(Box::new(Syscalls::new(c.clone())));
    }
    chain.extend(host.chain_with_files(files)?);
    chain.push(device);
    Ok(chain)
}

/// Per-job results of a simulated job file, as fio reports them: bandwidth over the job's
/// run (from its start at 0 to its last completion), IOPS and total latency (`lat`: from
/// submission to completion), for reads and writes.
#[derive(Clone, Debug, Serialize)]
pub struct JobResult {
    pub job: String,
    pub read: DirResult,
    pub write: DirResult,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct DirResult {
    pub ios: u64,
    pub bytes: u64,
    /// bytes / job runtime, MB/s (10^6 B/s).
    pub mb_s: f64,
    pub iops: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Latency quantiles at 0, 1, ..., 100 % (for CDF figures), ms.
    pub cdf_ms: Vec<f64>,
}

/// Collects completions per job and direction.
pub struct JobStats {
    names: Vec<String>,
    /// File id → job.
    job_of_file: Vec<usize>,
    /// Per job, per direction (read, write): latencies (ms).
    lat: Vec<[Vec<f64>; 2]>,
    bytes: Vec<[u64; 2]>,
    end: Vec<f64>,
    start: f64,
}

impl JobStats {
    pub fn new(src: &FioSource) -> JobStats {
        let mut job_of_file = vec![0; src.files.len()];
        for s in &src.streams {
            for &f in &s.files {
                job_of_file[f as usize] = s.job;
            }
        }
        let n = src.jobs.len();
        JobStats {
            names: src.jobs.iter().map(|j| j.name.clone()).collect(),
            job_of_file,
            lat: vec![[Vec::new(), Vec::new()]; n],
            bytes: vec![[0, 0]; n],
            end: vec![0.0; n],
            start: src.start,
        }
    }

    pub fn add(&mut self, c: &crate::request::Completion) {
        if !matches!(c.req.op, Op::Read | Op::Write) {
            return;
        }
        let Some(f) = c.req.file else { return };
        let Some(&j) = self.job_of_file.get(f.file as usize) else {
            return;
        };
        let d = usize::from(c.req.op != Op::Read);
        self.lat[j][d].push(c.response());
        self.bytes[j][d] += c.req.bytes();
        self.end[j] = self.end[j].max(c.rec.completion);
    }

    pub fn results(mut self) -> Vec<JobResult> {
        let mut out = Vec::new();
        for j in 0..self.names.len() {
            let runtime_s = ((self.end[j] - self.start) / 1000.0).max(1e-12);
            let mut dirs = [DirResult::default(), DirResult::default()];
            for (d, dir) in dirs.iter_mut().enumerate() {
                let v = &mut self.lat[j][d];
                if v.is_empty() {
                    continue;
                }
                v.sort_by(f64::total_cmp);
                let q = |p: f64| crate::validate::quantile(v, p);
                *dir = DirResult {
                    ios: v.len() as u64,
                    bytes: self.bytes[j][d],
                    mb_s: self.bytes[j][d] as f64 / 1e6 / runtime_s,
                    iops: v.len() as f64 / runtime_s,
                    mean_ms: v.iter().sum::<f64>() / v.len() as f64,
                    p50_ms: q(0.5),
                    p99_ms: q(0.99),
                    cdf_ms: (0..=100)
                        .map(|k| if k == 0 { v[0] } else { q(k as f64 / 100.0) })
                        .collect(),
                };
            }
            let [read, write] = dirs;
            out.push(JobResult {
                job: self.names[j].clone(),
                read,
                write,
            });
        }
        out
    }
}

/// The per-job table `run --fio` prints.
pub fn job_table(results: &[JobResult]) -> String {
    let mut s = format!(
        "{:<20} {:>3} {:>9} {:>10} {:>10} {:>9} {:>9} {:>9}\n",
        "job", "dir", "ios", "MB/s", "IOPS", "mean ms", "p50 ms", "p99 ms"
    );
    for r in results {
        for (name, d) in [("R", &r.read), ("W", &r.write)] {
            if d.ios == 0 {
                continue;
            }
            s.push_str(&format!(
                "{:<20} {:>3} {:>9} {:>10.2} {:>10.1} {:>9.3} {:>9.3} {:>9.3}\n",
                r.job, name, d.ios, d.mb_s, d.iops, d.mean_ms, d.p50_ms, d.p99_ms
            ));
        }
    }
    s
}

/// Median of a list (NaN if empty).
pub(crate) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Robust affine fit `latency = a + b × KiB` (Theil–Sen: the median of the pairwise slopes,
/// the median intercept) of points of one operation, pattern and queue depth: on a shared
/// machine one point in five can be several times too slow, and a table would keep it. The
/// fit is what the simulator gets; the raw points stay in the JSON.
pub fn fit_affine(pts: &[(f64, f64)]) -> Option<(f64, f64)> {
    if pts.len() < 3 {
        return None;
    }
    let mut slopes = Vec::new();
    for i in 0..pts.len() {
        for j in i + 1..pts.len() {
            let dx = pts[j].0 - pts[i].0;
            if dx.abs() > 1e-12 {
                slopes.push((pts[j].1 - pts[i].1) / dx);
            }
        }
    }
    let b = median(&mut slopes).max(0.0);
    let mut icpt: Vec<f64> = pts.iter().map(|(x, y)| y - b * x).collect();
    let a = median(&mut icpt);
    (a.is_finite() && b.is_finite()).then_some((a.max(1.0), b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{ConstantDevice, Simulator};

    #[test]
    fn sizes_as_fio_reads_them() {
        // Checked against fio 3.33 (io_bytes / total_ios of a read job).
        for (s, v) in [
            ("4k", 4096),
            ("4kb", 4096),
            ("4K", 4096),
            ("4Ki", 4096),
            ("4KiB", 4000),
            ("4kib", 4000),
            ("1m", 1 << 20),
            ("1MiB", 1_000_000),
            ("0x1000", 4096),
            ("4000", 4000),
            ("2g", 2 << 30),
        ] {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
        for bad in ["", "k", "4x", "4kk", "-1", "99999999999999999999", "2000p"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_range("4k-16k"), Ok((4096, 16384)));
        assert_eq!(parse_range("4k:8k"), Ok((4096, 8192)));
        assert!(parse_range("8k-4k").is_err());
        assert_eq!(parse_time_ms("30", 1000.0), Ok(30_000.0));
        assert_eq!(parse_time_ms("250ms", 1000.0), Ok(250.0));
        assert_eq!(parse_time_ms("2m", 1000.0), Ok(120_000.0));
        assert_eq!(parse_time_ms("100", 0.001), Ok(0.1));
    }

    const JOB: &str = "; a comment\n[global]\nsize=1m\nbs=64k\ndirect=1\nioengine=libaio\niodepth=4\ngroup_reporting\n\n[seq]\nrw=read\n\n[mix]\nrw=randrw\nrwmixread=70\nbs=4k,16k\nnumjobs=2\nioengine=psync\nruntime=2\ntime_based\nrate=1m\nthinktime=100\n";

    #[test]
    fn global_and_job_sections() {
        let jf = parse(JOB, false).unwrap();
        assert_eq!(jf.jobs.len(), 2);
        let (a, b) = (&jf.jobs[0], &jf.jobs[1]);
        assert_eq!((a.name.as_str(), a.line, a.rw), ("seq", 10, Rw::Read));
        assert_eq!(a.bs, [(65536, 65536); 2]);
        assert_eq!((a.iodepth, a.effective_depth()), (4, 4));
        assert_eq!(a.advice(), Some(Advice::Sequential));
        assert_eq!(b.rw, Rw::RandRw);
        assert_eq!(b.bs, [(4096, 4096), (16384, 16384)]);
        assert_eq!((b.numjobs, b.effective_depth()), (2, 1));
        assert_eq!(b.runtime_ms, Some(2000.0));
        assert!(b.time_based);
        assert_eq!(b.rate, [Some(1 << 20), Some(1 << 20)]);
        assert_eq!(b.thinktime_us, 100.0);
        assert_eq!(b.advice(), Some(Advice::Random));
    }

    #[test]
    fn unknown_options_are_listed_with_lines_once() {
        let text = "[j]\nsize=1m\nfoo=1\nverify=md5\nrw=read\n";
        let e = parse(text, false).unwrap_err().to_string();
        assert!(
            e.contains("foo (line 3)") && e.contains("verify (line 4)"),
            "{e}"
        );
        assert!(e.starts_with("unsupported fio options"), "{e}");
        let jf = parse(text, true).unwrap();
        assert_eq!(jf.warnings.len(), 1);
        assert!(jf.warnings[0].contains("foo (line 3)"));
    }

    #[test]
    fn bad_values_name_their_line() {
        for (text, line, what) in [
            ("[j]\nsize=1m\nrw=sideways\n", "line 3", "rw=sideways"),
            ("[j]\nsize=lots\n", "line 2", "size=lots"),
            ("[j]\nrw=read\n", "line 1", "no size"),
            ("[j]\nsize=1m\niodepth=0\n", "line 3", "iodepth=0"),
            ("[j]\nsize=1m\nbs=4k-8k\n", "line 3", "bsrange"),
            ("[j\nsize=1m\n", "line 1", "']'"),
            ("size=1m\n", "line 1", "outside any"),
            (
                "[j]\nsize=1m\nbs=2m\n",
                "line 1",
                "smaller than the block size",
            ),
            ("[j]\nsize=1m\nioengine=mmap\n", "line 3", "engines"),
            ("[j]\nsize=1m\nruntime=5y\n", "line 3", "time unit"),
            ("[j]\nsize=1m\ntime_based\n", "line 1", "needs a runtime"),
            ("[j]\nsize=2m\nbs=0k\n", "line 3", "block size must be"),
        ] {
            let e = parse(text, false).unwrap_err().to_string();
            assert!(e.contains(line) && e.contains(what), "{text:?}: {e}");
        }
        assert!(parse("[global]\nsize=1m\n", false).is_err(), "no job");
    }

    /// Runs a job on a constant-time device (no host stack): fio's fadvise calls are turned
    /// off, they would take the device's service time here.
    fn run(text: &str, service_ms: f64) -> Vec<crate::request::Completion> {
        let text = format!("[global]\ninvalidate=0\nfadvise_hint=0\n{text}");
        let jf = parse(&text, false).unwrap();
        let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
        let mut sim = Simulator::new(vec![Box::new(ConstantDevice::new(service_ms))]);
        let mut out = Vec::new();
        sim.run(&mut src, &mut |c| out.push(c.clone())).unwrap();
        out
    }

    #[test]
    fn host_cpu_table_interpolates_in_log_size() {
        let c = HostCpu {
            cached_read_us: vec![[4.0, 2.0], [16.0, 6.0], [64.0, 10.0]],
            ..Default::default()
        };
        assert_eq!(c.cost_us(4.0), 2.0);
        assert_eq!(c.cost_us(1.0), 2.0);
        assert!((c.cost_us(8.0) - 4.0).abs() < 1e-9);
        assert!((c.cost_us(128.0) - 20.0).abs() < 1e-9);
        assert_eq!(HostCpu::default().cost_us(100.0), 0.0);
        assert!(HostCpu {
            cached_read_us: vec![[4.0, 1.0], [2.0, 1.0]],
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(HostCpu {
            cached_read_us: vec![[4.0, 1.0]],
            cached_write_us: vec![[4.0, -1.0]],
            ..Default::default()
        }
        .validate()
        .is_err());
        // The affine part of a table that jumps at 512 KiB (this VM) is the small-size copy.
        let vm = HostCpu {
            cached_read_us: vec![[4.0, 2.5], [32.0, 9.0], [128.0, 9.0], [512.0, 700.0]],
            ..Default::default()
        };
        let (a, b) = vm.affine();
        assert!(a <= 2.5 && b < 0.3, "{a} {b}");
    }

    /// The cached-set profile scales the read table by the job's set against the table's
    /// own set (64 MiB), clamped at the profile's ends; no profile, no change.
    #[test]
    fn cached_reads_of_a_smaller_set_cost_what_the_profile_says() {
        let table = vec![[4.0, 1.0], [32.0, 4.0], [512.0, 70.0]];
        let c = HostCpu {
            cached_read_us: table.clone(),
            cached_set_us: vec![[8.0, 2.0], [32.0, 2.0], [64.0, 4.0], [128.0, 4.0]],
            ..Default::default()
        };
        let mib = 1u64 << 20;
        assert_eq!(c.for_cached_set(64 * mib).cached_read_us, table);
        assert_eq!(c.for_cached_set(4096 * mib).cached_read_us, table);
        let small = c.for_cached_set(16 * mib);
        assert_eq!(
            small.cached_read_us,
            vec![[4.0, 0.5], [32.0, 2.0], [512.0, 35.0]]
        );
        assert_eq!(c.for_cached_set(mib).cached_read_us, small.cached_read_us);
        // halfway in log2 between 32 and 64 MiB: 3 of the table's 4
        let mid = c.for_cached_set((45.254834 * mib as f64) as u64);
        assert!(
            (mid.cost_us(32.0) - 3.0).abs() < 1e-3,
            "{}",
            mid.cost_us(32.0)
        );
        let none = HostCpu {
            cached_read_us: table.clone(),
            ..Default::default()
        };
        assert_eq!(none.for_cached_set(mib).cached_read_us, table);
        assert_eq!(c.for_cached_set(0).cached_read_us, table);
        assert!(HostCpu {
            cached_read_us: table,
            cached_set_us: vec![[64.0, 1.0], [8.0, 1.0]],
            ..Default::default()
        }
        .validate()
        .is_err());
    }

    /// A time_based job's passes: with invalidate=1 fio drops the file's cached pages at
    /// each pass and reads it from the device again; with invalidate=0 the first pass's
    /// pages serve the others.
    #[test]
    fn time_based_passes_drop_the_cache_with_invalidate() {
        let mut misses = Vec::new();
        for inv in [1, 0] {
            let jf = parse(
                &format!(
                    "[j]\nrw=read\nsize=256k\nbs=64k\nioengine=psync\nruntime=20ms\ntime_based\ninvalidate={inv}\n"
                ),
                false,
            )
            .unwrap();
            let host = crate::host::HostParams::linux_defaults();
            let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
            let dev = Box::new(ConstantDevice::new(0.1));
            let chain = host_chain_with_files(dev, &host, None, &src.file_sizes()).unwrap();
            let mut stats = JobStats::new(&src);
            let mut sim = Simulator::new(chain);
            sim.run(&mut src, &mut |c| stats.add(c)).unwrap();
            let read = &stats.results()[0].read;
            let passes = read.ios / 4;
            assert!(passes >= 5, "{} reads", read.ios);
            // Pages read from the device: asked for, or read ahead.
            let missed: u64 = sim
                .components()
                .iter()
                .flat_map(|c| c.stats())
                .filter(|(k, _)| k == "pagecache miss pages" || k == "pagecache readahead pages")
                .map(|(_, v)| v as u64)
                .sum();
            misses.push((missed, passes));
        }
        // 64 pages a pass: every pass read from the device, then only the first.
        let [(m1, p1), (m0, _)] = misses[..] else {
            unreachable!()
        };
        assert!(
            m1 >= 64 * (p1 - 1),
            "invalidate=1: {m1} pages missed in {p1} passes"
        );
        assert_eq!(m0, 64, "invalidate=0");
    }

    #[test]
    fn invalidate_and_fadvise_hint_are_advise_calls_before_the_first_io() {
        let jf = parse(
            "[j]\nrw=randread\nsize=64k\nioengine=libaio\ndirect=1\niodepth=2\n",
            false,
        )
        .unwrap();
        let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
        let ops: Vec<Op> = (0..4)
            .map(|_| src.next().unwrap().unwrap().req.op)
            .collect();
        assert_eq!(
            ops,
            [
                Op::Advise(Advice::DontNeed),
                Op::Advise(Advice::Random),
                Op::Read,
                Op::Read
            ]
        );
        assert!(
            src.next().unwrap().is_none(),
            "two advise calls and iodepth 2 reads"
        );
        // The advise calls' completions free no slot; the reads' do.
        assert!(src.next_in_stream(0, 0.0).unwrap().is_none());
        assert!(src.next_in_stream(0, 0.0).unwrap().is_none());
        assert_eq!(
            src.next_in_stream(0, 1.0).unwrap().unwrap().req.op,
            Op::Read
        );
        // Through the host stack: the job completes, every read counted once.
        let host = crate::host::HostParams::linux_defaults();
        let chain = host_chain(Box::new(ConstantDevice::new(0.1)), &host, None).unwrap();
        let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
        let mut stats = JobStats::new(&src);
        Simulator::new(chain)
            .run(&mut src, &mut |c| stats.add(c))
            .unwrap();
        assert_eq!(stats.results()[0].read.ios, 16);
    }

    /// The engine's shortcuts (a lone event run at once, cached reads served through the
    /// fast lane) leave real host chains' runs unchanged: jobs that read ahead, evict, hit,
    /// write back, throttle and mix streams complete the same requests at the same times
    /// with the same outcomes, through the same number of events, with and without them.
    #[test]
    fn the_engines_shortcuts_change_no_fio_job() {
        let cpu = HostCpu {
            cached_read_us: vec![[4.0, 0.9], [32.0, 3.2], [128.0, 12.3], [512.0, 67.0]],
            miss_folio_us: 1.5,
            reclaim_folio_us: 1.0,
            ..Default::default()
        };
        let jobs = [
            // Sequential reads through a cache smaller than the file: read-ahead, markers,
            // eviction, and hits on pages read ahead.
            "[j]\nrw=read\nsize=8m\nbs=32k\nioengine=psync\n",
            // Unaligned sizes: reads continuing inside the previous read's last page (whose
            // second access does not count), over a file larger than the cache, read again.
            "[j]\nrw=read\nsize=2m\nbs=6k\nioengine=psync\nfadvise_hint=sequential\n",
            "[j]\nrw=read\nsize=5m\nbs=6k\nioengine=psync\ntime_based\nruntime=80ms\ninvalidate=0\n",
            // A file read twice (time_based): the second pass hits, pages get promoted.
            "[j]\nrw=read\nsize=1m\nbs=16k\nioengine=psync\ntime_based\nruntime=40ms\ninvalidate=0\n",
            // Random reads by four closed loops at once, some hits, some misses.
            "[j]\nrw=randread\nsize=2m\nbs=32k\nioengine=libaio\niodepth=2\nnumjobs=2\ntime_based\nruntime=30ms\ninvalidate=0\n",
            // Reads and writes mixed: dirty pages, write-back, hits on dirty pages.
            "[j]\nrw=randrw\nrwmixread=60\nsize=4m\nbs=16k\nioengine=psync\ntime_based\nruntime=40ms\n",
            // Buffered writes past the dirty thresholds beside O_DIRECT reads.
            "[w]\nrw=write\nsize=8m\nbs=128k\nioengine=psync\n[r]\nrw=read\nsize=8m\nbs=64k\ndirect=1\nioengine=psync\n",
        ];
        for (i, text) in jobs.iter().enumerate() {
            let run = |shortcut: bool| {
                let jf = parse(text, false).unwrap();
                let mut host = crate::host::HostParams::linux_defaults();
                host.page_cache.capacity_pages = 1024; // 4 MiB
                host.page_cache.dirty.dirtyable_pages = 1024;
                let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
                let dev = Box::new(ConstantDevice::new(0.05));
                let chain =
                    host_chain_with_files(dev, &host, Some(&cpu), &src.file_sizes()).unwrap();
                let mut sim = Simulator::new(chain);
                if !shortcut {
                    sim = sim.without_shortcut();
                }
                let mut out = Vec::new();
                let t = sim
                    .run(&mut src, &mut |c| {
                        out.push((
                            c.req.id,
                            c.req.lba,
                            c.req.op.letter(),
                            c.rec.arrival.to_bits(),
                            c.rec.completion.to_bits(),
                            format!("{:?}", c.rec.cache),
                        ))
                    })
                    .unwrap();
                let stats: Vec<_> = sim.components().iter().flat_map(|c| c.stats()).collect();
                (out, t.events, t.sim_end.to_bits(), format!("{stats:?}"))
            };
            let with = run(true);
            assert!(with.0.len() > 20, "job {i}: {} requests", with.0.len());
            let without = run(false);
            assert_eq!(with.0.len(), without.0.len(), "job {i}: requests");
            for (a, b) in with.0.iter().zip(&without.0) {
                assert_eq!(a, b, "job {i}: first request that differs");
            }
            assert_eq!(with, without, "job {i}");
        }
    }

    /// A cache hit costs the read table's value at its size in all (the page cache's affine
    /// part plus what the system-call level adds), also on a host where a small cached read
    /// takes under a microsecond (the table: `calibrate --quick` on this VM, 28 Nov). With
    /// the affine fit's intercept held at 1 µs, 32 KiB hits took 4.3 µs here against the
    /// table's 3.2, and the validation's warm jobs ran 25% slow.
    #[test]
    fn a_cache_hit_costs_the_read_tables_value_at_its_size() {
        let cpu = HostCpu {
            cached_read_us: vec![
                [4.0, 0.89],
                [16.0, 2.04],
                [32.0, 3.20],
                [64.0, 6.00],
                [128.0, 12.32],
                [256.0, 20.09],
                [512.0, 66.89],
            ],
            ..Default::default()
        };
        let (a, _) = cpu.affine();
        assert!(a < 0.89, "intercept {a} µs");
        let host = crate::host::HostParams::linux_defaults();
        for (kib, us) in [(4u64, 0.89), (32, 3.20), (128, 12.32), (512, 66.89)] {
            let text = format!(
                "[j]\nrw=read\nsize={}k\nbs={kib}k\nioengine=psync\ntime_based\nruntime=30ms\ninvalidate=0\n",
                kib * 4
            );
            let jf = parse(&text, false).unwrap();
            let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
            let chain = host_chain_with_files(
                Box::new(ConstantDevice::new(1.0)),
                &host,
                Some(&cpu),
                &src.file_sizes(),
            )
            .unwrap();
            let mut hits = Vec::new();
            Simulator::new(chain)
                .run(&mut src, &mut |c| {
                    if c.rec.cache == crate::request::CacheOutcome::Hit {
                        hits.push(c.response());
                    }
                })
                .unwrap();
            assert!(hits.len() > 10, "{kib} KiB: {} hits", hits.len());
            for h in hits {
                assert!(
                    (h * 1000.0 - us).abs() < 1e-6,
                    "{kib} KiB: {} µs, table {us}",
                    h * 1000.0
                );
            }
        }
    }

    #[test]
    fn a_write_table_prices_buffered_writes_not_direct_ones() {
        // Read table: affine 1 µs + 0.25 µs/KiB up to 128 KiB. Write table: 40 µs at 32 KiB.
        // A buffered 32 KiB write then costs the write table's 40 µs in all (9 µs of it the
        // page cache's affine part); without a write table, the affine 9 µs alone; an O_DIRECT
        // write costs no CPU here (the device's measured latency holds its system call).
        let cpu = HostCpu {
            cached_read_us: vec![[4.0, 2.0], [32.0, 9.0], [128.0, 33.0]],
            cached_write_us: vec![[4.0, 6.0], [32.0, 40.0]],
            ..Default::default()
        };
        let host = crate::host::HostParams::linux_defaults();
        let one = |cpu: &HostCpu, direct: bool| {
            let text = format!(
                "[j]\nrw=write\nsize=32k\nbs=32k\ndirect={}\n",
                u8::from(direct)
            );
            let jf = parse(&text, false).unwrap();
            let chain = host_chain(Box::new(ConstantDevice::new(1.0)), &host, Some(cpu)).unwrap();
            let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
            let mut out = Vec::new();
            Simulator::new(chain)
                .run(&mut src, &mut |c| {
                    if c.req.op == Op::Write {
                        out.push(c.response())
                    }
                })
                .unwrap();
            assert_eq!(out.len(), 1);
            out[0]
        };
        assert!(
            (one(&cpu, false) - 0.040).abs() < 1e-6,
            "{}",
            one(&cpu, false)
        );
        let no_table = HostCpu {
            cached_write_us: vec![],
            ..cpu.clone()
        };
        assert!(
            (one(&no_table, false) - 0.009).abs() < 1e-6,
            "{}",
            one(&no_table, false)
        );
        assert!((one(&cpu, true) - 1.0).abs() < 1e-6, "{}", one(&cpu, true));
    }

    #[test]
    fn sequential_job_reads_its_file_once_in_order() {
        let out = run("[j]\nrw=read\nsize=64k\nbs=4k\n", 1.0);
        assert_eq!(out.len(), 16);
        for (i, c) in out.iter().enumerate() {
            assert_eq!(c.req.file.unwrap().offset, i as u64 * 4096);
            assert_eq!(c.req.lba, i as u64 * 8);
            // QD1 closed loop on a 1 ms device: back to back.
            assert_eq!(c.rec.completion, (i + 1) as f64);
        }
    }

    #[test]
    fn random_map_covers_every_block_once() {
        let out = run("[j]\nrw=randread\nsize=256k\nbs=4k\n", 0.1);
        let mut offs: Vec<u64> = out.iter().map(|c| c.req.file.unwrap().offset).collect();
        assert_ne!(
            offs,
            (0..64).map(|i| i * 4096).collect::<Vec<_>>(),
            "random order"
        );
        offs.sort();
        assert_eq!(offs, (0..64).map(|i| i * 4096).collect::<Vec<_>>());
    }

    /// Random maps are bounded for the whole run: many clones over a file of tiny blocks
    /// build maps until the budget is spent, the rest draw with replacement (the fuzzer's
    /// job: 160 clones of 2 M blocks each took 9 s to lay out). A region over the per-stream
    /// bound never gets a map.
    #[test]
    fn random_maps_are_bounded_for_the_whole_run() {
        let jf = parse("[j]\nrw=randread\nsize=32m\nbs=2\nnumjobs=40\n", false).unwrap();
        let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
        let blocks = (32u64 << 20) / 2;
        assert!(blocks > MAX_RANDOM_MAP, "over the per-stream bound");
        // A few requests each (the first may be fio's invalidate, an fadvise).
        let pull = |src: &mut FioSource| {
            for sid in 0..src.streams.len() as u32 {
                for _ in 0..3 {
                    let _ = src.make(sid, 0.0, true);
                }
            }
        };
        pull(&mut src);
        assert!(src.streams.iter().all(|s| s.perm.is_empty()));
        let jf = parse("[j]\nrw=randread\nsize=2m\nbs=2\nnumjobs=40\n", false).unwrap();
        let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
        pull(&mut src);
        let mapped: u64 = src.streams.iter().map(|s| s.perm.len() as u64).sum();
        let with_map = src.streams.iter().filter(|s| !s.perm.is_empty()).count();
        assert_eq!(mapped, 16 << 20, "the budget, 1 M blocks per stream");
        assert_eq!(with_map, 16);
        assert!(mapped <= MAX_RANDOM_MAPS);
        assert_eq!(src.streams.iter().filter(|s| s.no_map).count(), 24);
    }

    /// Reads and writes of different sizes (`bs=4k,3k`) or a size range share one random map
    /// in units of the smallest size, and every request lies within its file: the map was
    /// built in units of the first request's size, and larger requests drawn from it went
    /// past the file's end (the fuzzer's `bs=,3k`: 4 KiB reads at 3 KiB blocks, up to
    /// 1.36 MiB into a 1 MiB file).
    #[test]
    fn random_requests_of_mixed_sizes_stay_within_the_file() {
        for text in [
            "[j]\nrw=randrw\nsize=1m\nbs=4k,3k\n",
            "[j]\nrw=randrw\nsize=1m\nbs=,3k\n",
            "[j]\nrw=randread\nsize=1m\nbsrange=4k-16k\n",
        ] {
            let out = run(text, 0.1);
            assert!(!out.is_empty(), "{text}");
            for c in &out {
                let f = c.req.file.unwrap();
                assert!(
                    f.offset + c.req.bytes() <= 1 << 20,
                    "{text}: {} bytes at {}",
                    c.req.bytes(),
                    f.offset
                );
            }
        }
    }

    #[test]
    fn numjobs_and_iodepth_are_independent_closed_loops() {
        // Two clones, each with 4 in flight, on a device serving one at a time in 1 ms:
        // 8 requests queued at once, each clone's next issued when its own request completes.
        let text = "[j]\nrw=randread\nsize=64k\nbs=4k\nioengine=io_uring\niodepth=4\nnumjobs=2\n";
        let out = run(text, 1.0);
        assert_eq!(out.len(), 32);
        let files: std::collections::BTreeSet<u32> =
            out.iter().map(|c| c.req.file.unwrap().file).collect();
        assert_eq!(files.len(), 2, "one file per clone");
        // The device is never idle: completions at 1, 2, ..., 32 ms.
        for (i, c) in out.iter().enumerate() {
            assert_eq!(c.rec.completion, (i + 1) as f64);
        }
        // Never more than 8 in flight: each arrival is at or after the completion 8 earlier.
        let mut arrivals: Vec<f64> = out.iter().map(|c| c.rec.arrival).collect();
        arrivals.sort_by(f64::total_cmp);
        for (i, a) in arrivals.iter().enumerate().skip(8) {
            assert!(*a >= (i - 7) as f64, "{i}: {a}");
        }
    }

    #[test]
    fn time_based_runtime_rate_and_thinktime() {
        // 4 KiB every 1 ms device, rate 1 MiB/s → one request per ~3.9 ms, for 100 ms.
        let out = run(
            "[j]\nrw=read\nsize=64k\nbs=4k\nruntime=100ms\ntime_based\nrate=1m\n",
            1.0,
        );
        let bytes: u64 = out.iter().map(|c| c.req.bytes()).sum();
        let rate = bytes as f64 / 0.1;
        assert!((rate - 1048576.0).abs() / 1048576.0 < 0.05, "{rate} B/s");
        assert!(out.iter().all(|c| c.rec.arrival < 100.0));
        // Thinktime 2000 µs after each 1 ms completion: one request per 3 ms.
        let out = run("[j]\nrw=read\nsize=64k\nbs=4k\nthinktime=2000\n", 1.0);
        assert_eq!(out.len(), 16);
        assert!(
            (out[15].rec.arrival - 15.0 * 3.0).abs() < 1e-9,
            "{}",
            out[15].rec.arrival
        );
    }
}
