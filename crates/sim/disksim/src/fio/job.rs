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

use std::collections::HashMap;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::request::{Advice, Flags, SECTOR};

pub use super::units::{parse_size, parse_time_ms, MAX_BYTES, MAX_RUNTIME_MS};
/// Largest block size (fio's own limit is lower; a request must fit the simulator's limits).
pub const MAX_BS: u64 = 1 << 30;
/// Most streams (numjobs summed over jobs) and most requests in flight per stream.
pub const MAX_STREAMS: u64 = 4096;
pub const MAX_IODEPTH: u64 = 65536;

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
    /// fio's name of the pattern (`rw=`).
    pub fn name(self) -> &'static str {
        match self {
            Rw::Read => "read",
            Rw::Write => "write",
            Rw::RandRead => "randread",
            Rw::RandWrite => "randwrite",
            Rw::Rw => "rw",
            Rw::RandRw => "randrw",
        }
    }

    pub fn random(self) -> bool {
        matches!(self, Rw::RandRead | Rw::RandWrite | Rw::RandRw)
    }
    /// Fraction of reads given `rwmixread` (%).
    pub(crate) fn read_share(self, rwmixread: f64) -> f64 {
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
    /// fio's `null` engine (and a file `/dev/null` or `/dev/zero`): every I/O completes at
    /// once, with no device I/O; the time per I/O is fio's own loop (see
    /// [`crate::fio::source`]).
    Null,
    /// fio's `cpuio` engine: no I/O; each "I/O" burns `cpuchunks` µs of CPU, then sleeps
    /// for the rest of the `cpuload` share (fio's `fio_cpuio_init` thinktime), until the
    /// runtime ends.
    Cpuio,
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
    /// `filename_format` (fio's `$jobname`, `$jobnum`, `$filenum` expanded at layout).
    pub filename_format: Option<String>,
    /// The offset modifier of `rw=PATTERN:N`.
    pub rw_mod: RwModifier,
    /// `stonewall`: starts once every job before it in the file has ended.
    pub stonewall: bool,
    /// `wait_for`: starts once every clone of the named (earlier) job has ended.
    pub wait_for: Option<String>,
    /// `startdelay`: the job starts this long after it may, ms.
    pub startdelay_ms: f64,
    /// `loops`: passes over the job's `io_size` (fio's default 1).
    pub loops: u64,
    /// `bssplit`: block sizes with their weights (%), reads and writes (empty: `bs`).
    pub bssplit: [Vec<(u64, u32)>; 2],
    /// `rate_iops`: I/Os per second per clone, reads and writes.
    pub rate_iops: [Option<u64>; 2],
    /// Distributions, exit rules, flow control, verify ([`super::extra`]).
    pub extra: super::extra::JobExtra,
    /// The file is a block device (`filename=/dev/...`) and no size was given: the job uses
    /// the whole simulated device, as fio uses the device's size.
    pub whole_device: bool,
    /// Reporting group (fio's `groupid`: a new one at each `new_group` or `stonewall`).
    pub group: usize,
    /// `offset`: where the job's region starts in each file, bytes.
    pub offset: u64,
}

/// The `:N` of `rw=PATTERN:N` (fio's "offset modifier", `rw_sequencer=sequential`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum RwModifier {
    None,
    /// Sequential patterns: N bytes added to each next offset (a hole; negative: backwards;
    /// past either end of the region the position wraps, as fio's `get_next_seq_offset`).
    Hole(i64),
    /// Random patterns: N I/Os sequential from each random offset before a new one.
    RandomRun(u64),
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
            filename_format: None,
            rw_mod: RwModifier::None,
            stonewall: false,
            wait_for: None,
            startdelay_ms: 0.0,
            loops: 1,
            bssplit: [Vec::new(), Vec::new()],
            rate_iops: [None, None],
            extra: Default::default(),
            whole_device: false,
            group: 0,
            offset: 0,
        }
    }

    /// Requests this job keeps in flight per clone.
    pub fn effective_depth(&self) -> u64 {
        match self.ioengine {
            // fio's null engine "completes" in its own loop, one I/O at a time.
            IoEngine::Sync | IoEngine::Null | IoEngine::Cpuio => 1,
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

    /// The open flags of this job's reads (`read`) or writes.
    pub(crate) fn flags(&self, read: bool) -> Flags {
        let mut flags = Flags::default();
        if self.direct {
            flags = flags.with(Flags::DIRECT);
        }
        if read {
            return flags;
        }
        match self.sync {
            SyncMode::None => flags,
            SyncMode::Dsync => flags.with(Flags::DSYNC),
            // Linux's O_SYNC is __O_SYNC | O_DSYNC.
            SyncMode::Sync => flags.with(Flags::OSYNC).with(Flags::DSYNC),
        }
    }

    /// Bytes of each file of a clone.
    pub(crate) fn file_bytes(&self) -> u64 {
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

impl JobFile {
    /// I/O priorities (`prio`, `prioclass`, `cmdprio*`, [`super::prio`]) under the host's
    /// scheduler: `none` dispatches whatever the priority and mq-deadline serves by class,
    /// both modelled; the seed's policies (FCFS, SCAN, ...) are no kernel scheduler and
    /// have no classes: refused. Under mq-deadline a job priority (`prio`, `prioclass`) on
    /// buffered I/O is refused: the kernel reads ahead (and writes back on `fsync`) with the
    /// job thread's priority, which the page cache model does not carry.
    pub fn check_scheduler(&self, sched: crate::blocklayer::IoScheduler) -> Result<()> {
        use crate::blocklayer::IoScheduler;
        for j in &self.jobs {
            let p = &j.extra.prio;
            let Some(n) = p.line else { continue };
            if let Err(e) = p.check() {
                bail!("line {n}: job '{}': {e}", j.name);
            }
            match sched {
                IoScheduler::None => {}
                IoScheduler::Classic(_) => bail!(
                    "line {n}: job '{}': I/O priorities under the {} policy: it is no kernel scheduler and has no priority classes (use none or mq-deadline)",
                    j.name,
                    sched.name()
                ),
                IoScheduler::MqDeadline => {
                    if let (Some(n), false) = (p.job_line, j.direct) {
                        bail!(
                            "line {n}: job '{}': prio/prioclass with buffered I/O: the kernel gives the job's read-ahead and fsync write-back the thread's priority, which the page cache model does not carry (use direct=1)",
                            j.name
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

/// Options that change what fio reports but not the I/O it does.
const REPORTING_ONLY: &[&str] = &[
    "description",
    // Logs each I/O's priority (fio's latency logs): reporting.
    "log_prio",
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
    // CPU and memory placement (NUMA): no effect on the simulated I/O.
    "numa_cpu_nodes",
    "numa_mem_policy",
    // A floor fio checks (it ends a job that falls below it); not checked here.
    "ratemin",
    "rate_min",
    "cpumask",
    "kb_base",
    "directory",
    "create_serialize",
    "allow_file_create",
    "overwrite",
    "randrepeat",
    "random_generator",
    "unlink",
    // Reporting groups (`new_group`; a stonewall also starts one): fio sums the group's
    // jobs in its report, the I/O is the same.
    "new_group",
    // Threads instead of processes (fio also takes `threads`): the same I/O.
    "threads",
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
    "filename_format",
    "stonewall",
    "wait_for_previous",
    "wait_for",
    "startdelay",
    "loops",
    "timeout",
    "bssplit",
    "rate_iops",
    "offset",
    "fileoffset",
];

/// Whether `k` is an option the simulation uses (here or in [`super::extra`]).
fn simulated(k: &str) -> bool {
    SIMULATED.contains(&k)
        || super::extra::OPTIONS.contains(&k)
        || super::steady::OPTIONS.contains(&k)
        || super::latency::OPTIONS.contains(&k)
}

/// Every option name the reader knows (simulated, reporting-only or of no effect on the
/// simulated I/O, [`super::inert`]).
pub fn known_options() -> impl Iterator<Item = &'static str> {
    SIMULATED
        .iter()
        .chain(super::extra::OPTIONS)
        .chain(super::steady::OPTIONS)
        .chain(super::latency::OPTIONS)
        .chain(REPORTING_ONLY)
        .copied()
        .chain(super::inert::names())
}

/// Parses a job file, `${VAR}` taken from the environment as fio does. `allow_unknown`:
/// unsupported options become warnings (an engine that is not modelled stays an error).
pub fn parse(text: &str, allow_unknown: bool) -> Result<JobFile> {
    parse_with_env(text, allow_unknown, &|k| std::env::var(k).ok())
}

/// fio's `${VAR}` in a value (`fio_option_dup_subs`: every `${NAME}` with a non-empty name
/// and a closing brace is replaced by the variable's value). fio replaces an unset one with
/// nothing; the simulator refuses it, naming it, since an empty value is almost never what
/// the job file means.
fn expand_env(k: &str, v: &str, n: usize, env: &dyn Fn(&str) -> Option<String>) -> Result<String> {
    let mut out = String::new();
    let mut rest = v;
    while let Some(i) = rest.find("${") {
        let Some(len) = rest[i + 2..].find('}').filter(|&l| l > 0) else {
            break;
        };
        let name = &rest[i + 2..i + 2 + len];
        let Some(val) = env(name) else {
            bail!(
                "{}",
                super::refusals::refusal(
                    k,
                    Some(v),
                    n,
                    &format!("environment variable {name} is not set (fio would put nothing in its place): set it")
                )
            );
        };
        out.push_str(&rest[..i]);
        out.push_str(&val);
        rest = &rest[i + 3 + len..];
    }
    out.push_str(rest);
    if out.len() > 4096 {
        bail!("line {n}: {k}: the value with its variables expanded is longer than 4096 bytes");
    }
    Ok(out)
}

/// Parses a job file, `${VAR}` taken from `env`.
pub fn parse_with_env(
    text: &str,
    allow_unknown: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<JobFile> {
    // The values with their variables expanded, by line (kept here: the sections borrow them).
    let mut expanded: HashMap<usize, String> = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let l = raw.split([';', '#']).next().unwrap_or("").trim();
        if l.starts_with('[') {
            continue;
        }
        if let Some((k, v)) = l.split_once('=').filter(|(_, v)| v.contains("${")) {
            expanded.insert(i + 1, expand_env(k.trim(), v.trim(), i + 1, env)?);
        }
    }
    struct Section<'a> {
        name: &'a str,
        line: usize,
        opts: Vec<(&'a str, Option<&'a str>, usize)>,
    }
    let mut sections: Vec<Section> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        // fio ends a line at its first ';' or '#' (checked with fio 3.33's --showcmd:
        // `numjobs=2 ; 4 threads` is numjobs=2, `filename=a#b` is `a`).
        let l = raw.split([';', '#']).next().unwrap_or("").trim();
        if l.is_empty() {
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
            Some((k, _)) if expanded.contains_key(&n) => {
                (k.trim(), expanded.get(&n).map(String::as_str))
            }
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (l, None),
        };
        if k.is_empty() {
            bail!("line {n}: option with no name: {l}");
        }
        if let Some(v) = v.filter(|v| v.contains('$')) {
            // fio's own keywords: `$jobname`, `$jobnum`, `$filenum`, `$clientuid` in
            // filename_format (any case: fio's `strcasestr`).
            let own = k == "filename_format"
                && v.split('$').skip(1).all(|w| {
                    let w = w.to_ascii_lowercase();
                    ["jobname", "jobnum", "filenum", "clientuid"]
                        .iter()
                        .any(|kw| w.starts_with(kw))
                });
            if !own {
                bail!(
                    "{}",
                    super::refusals::refusal(k, Some(v), n, "a '$' keyword other than filename_format's $jobname, $jobnum, $filenum, $clientuid (fio's $pagesize, $mb_memory, $ncpus are this machine's, not the simulated one's): give the value")
                );
            }
        }
        sec.opts.push((k, v, n));
    }
    let warnings = refuse(
        sections.iter().flat_map(|s| s.opts.iter().copied()),
        allow_unknown,
    )?;
    let mut global: Vec<(&str, Option<&str>, usize)> = Vec::new();
    let mut jobs: Vec<FioJob> = Vec::new();
    for s in &sections {
        if s.name == "global" {
            global.extend(s.opts.iter().copied());
            continue;
        }
        let mut job = FioJob::defaults(s.name, s.line);
        let mut new_group = false;
        for &(k, v, n) in global.iter().chain(&s.opts) {
            if k == "new_group" {
                new_group = parse_bool(k, v, n)?;
            }
            if known_options().any(|o| o == k) {
                apply(&mut job, k, v, n)?;
            }
        }
        finish(&mut job)?;
        // fio's groupid: the first job's is 0, a stonewall or new_group starts the next.
        job.group = match jobs.last() {
            None => 0,
            Some(prev) => prev.group + usize::from(job.stonewall || new_group),
        };
        jobs.push(job);
    }
    if jobs.is_empty() {
        bail!("no job section (a [name] other than [global]) in the job file");
    }
    super::steady::check(&jobs)?;
    super::extra::check_zbd_files(&jobs)?;
    for (i, j) in jobs.iter().enumerate() {
        if let Some(w) = &j.wait_for {
            let earlier = jobs[..i].iter().filter(|e| &e.name == w).count();
            if earlier != 1 {
                bail!(
                    "line {}: job '{}': wait_for={w}: fio needs one job of that name before this one ({earlier} found)",
                    j.line,
                    j.name
                );
            }
        }
    }
    for (i, j) in jobs.iter().enumerate() {
        let file = j.filename.as_deref().unwrap_or("");
        if j.extra.size_of_earlier_file
            && !jobs[..i]
                .iter()
                .any(|e| e.filename.as_deref() == Some(file) && !e.extra.size_of_earlier_file)
        {
            bail!(
                "line {}: job '{}' has no size (size= or filesize=), and no earlier job makes its file {file}: fio would take the existing file's size, which the simulator does not know",
                j.line,
                j.name
            );
        }
    }
    let streams: u64 = jobs.iter().map(|j| j.numjobs).sum();
    if streams > MAX_STREAMS {
        bail!("{streams} jobs in all (numjobs summed) is more than the limit of {MAX_STREAMS}");
    }
    Ok(JobFile { jobs, warnings })
}

/// The job file's refusals, all at once (engines first: an engine not modelled makes its
/// options moot), each as [`super::refusals::refusal`]; with `allow_unknown` the options
/// (not the engines) are warnings instead.
fn refuse<'a>(
    opts: impl Iterator<Item = (&'a str, Option<&'a str>, usize)>,
    allow_unknown: bool,
) -> Result<Vec<String>> {
    use super::refusals::{engine_why, option_why, refusal};
    let mut engines = Vec::new();
    let mut unknown = Vec::new();
    for (k, v, n) in opts {
        if k == "ioengine" {
            if let Some(why) = v.and_then(engine_why) {
                engines.push(refusal(k, v, n, why));
            }
        } else if !known_options().any(|o| o == k) {
            let why = option_why(k).unwrap_or(
                "not an option the simulator models (without it the simulation would silently differ from fio)",
            );
            unknown.push(refusal(k, v, n, why));
        }
    }
    if engines.is_empty() && allow_unknown {
        return Ok(unknown
            .into_iter()
            .map(|u| format!("{u} — ignored (--allow-unknown)"))
            .collect());
    }
    let all: Vec<String> = engines.into_iter().chain(unknown).collect();
    let Some(first) = all.first() else {
        return Ok(Vec::new());
    };
    let more = match all.len() - 1 {
        0 => String::new(),
        m => format!(
            " (and {m} more refusal{} below)",
            if m == 1 { "" } else { "s" }
        ),
    };
    bail!(
        "{first}{more}{}\n  --allow-unknown simulates without the options (not the engines)\n  supported: {}\n  reporting only or of no effect on the simulated I/O: {}",
        all[1..].iter().map(|r| format!("\n  {r}")).collect::<String>(),
        known_options()
            .filter(|o| simulated(o))
            .collect::<Vec<_>>()
            .join(" "),
        REPORTING_ONLY
            .iter()
            .copied()
            .chain(super::inert::names())
            .collect::<Vec<_>>()
            .join(" ")
    )
}

fn finish(job: &mut FioJob) -> Result<()> {
    let l = job.line;
    if let Some(f) = job.filename.as_deref() {
        if f == "/dev/null" || f == "/dev/zero" {
            // No I/O reaches a device: the I/O is fio's null engine's.
            job.ioengine = IoEngine::Null;
        } else if f.starts_with("/dev/") && job.size.is_none() && job.filesize.is_none() {
            job.whole_device = true;
        }
    }
    if job.ioengine == IoEngine::Cpuio {
        super::extra::check_cpuio(&job.name, &job.extra, job.runtime_ms.is_some(), l)?;
        // No file: fio's cpuio opens none; the loop runs until the runtime ends.
        job.time_based = true;
        job.size = Some(job.bs[0].1.max(job.bs[1].1));
    }
    if job.ioengine == IoEngine::Null && job.size.is_none() && job.filesize.is_none() {
        bail!(
            "line {l}: job '{}' has no size (size= or filesize=): fio's null engine needs one",
            job.name
        );
    }
    let passes = job.time_based || job.loops > 1;
    super::latency::check(&job.extra.lat, &job.name, job.numjobs, passes)?;
    super::extra::check(&super::extra::JobFacts {
        name: &job.name,
        extra: &job.extra,
        random: job.rw.random(),
        write_only: matches!(job.rw, Rw::Write | Rw::RandWrite),
        read_only: matches!(job.rw, Rw::Read | Rw::RandRead),
        passes: job.time_based || job.loops > 1,
        norandommap: job.norandommap,
    })?;
    let sized = job.size.is_some() || job.filesize.is_some() || job.whole_device;
    if !sized && job.extra.fill_device {
        // (the size is the device's free space, known at layout)
    } else if !sized && job.filename.is_some() {
        // fio takes the file's size: the file of an earlier job (checked by `parse`).
        job.extra.size_of_earlier_file = true;
    } else if !sized {
        bail!(
            "line {l}: job '{}' has no size (size= or filesize=)",
            job.name
        );
    }
    if job.size.is_none() {
        job.size = job.filesize.map(|(lo, _)| lo.saturating_mul(job.nrfiles));
    }
    if job.io_bytes.is_none() && sized && !job.whole_device {
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
    // (a size set at layout, from the device or the earlier file, is checked there)
    if fb < max_bs && sized && !job.whole_device {
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

/// Sets option `k` (value `v`, on line `n`) in `job`.
fn apply(job: &mut FioJob, k: &str, v: Option<&str>, n: usize) -> Result<()> {
    let err = |msg: &str| -> anyhow::Error {
        anyhow::anyhow!("line {n}: {k}={}: {msg}", v.unwrap_or(""))
    };
    let size = |s: &str| parse_size(s).map_err(|e| err(&e));
    let range = |s: &str| parse_range(s).map_err(|e| err(&e));
    match k {
        "name" => job.name = need(k, v, n)?.to_string(),
        "rw" | "readwrite" => {
            (job.rw, job.rw_mod) = parse_rw(need(k, v, n)?).map_err(|e| err(&e))?
        }
        "rwmixread" => job.rwmixread = parse_count(k, v, n, 0, 100)? as f64,
        "rwmixwrite" => job.rwmixread = 100.0 - parse_count(k, v, n, 0, 100)? as f64,
        "bs" | "blocksize" => job.bs = parse_bs(need(k, v, n)?, job.bs).map_err(|e| err(&e))?,
        "bsrange" | "blocksize_range" => {
            job.bs = parse_bsrange(need(k, v, n)?).map_err(|e| err(&e))?
        }
        "size" => {
            let s = need(k, v, n)?;
            if s.ends_with('%') {
                return Err(err(
                    "a size in % of the device is not supported (give bytes)",
                ));
            }
            job.size = Some(size(s)?);
        }
        "io_size" | "io_limit" => job.io_bytes = Some(size(need(k, v, n)?)?),
        "offset" | "fileoffset" => {
            let s = need(k, v, n)?;
            if s.ends_with('%') || s.contains(':') {
                return Err(err(
                    "an offset in % of the file or with an alignment is not supported (give bytes)",
                ));
            }
            job.offset = size(s)?;
        }
        "filesize" => job.filesize = Some(range(need(k, v, n)?)?),
        "nrfiles" => job.nrfiles = parse_count(k, v, n, 1, 4096)?,
        "iodepth" => job.iodepth = parse_count(k, v, n, 1, MAX_IODEPTH)?,
        "ioengine" => job.ioengine = parse_ioengine(need(k, v, n)?, n)?,
        "direct" => job.direct = parse_bool(k, v, n)?,
        "buffered" => job.direct = !parse_bool(k, v, n)?,
        "sync" => job.sync = parse_sync(v).map_err(err)?,
        "fadvise_hint" => job.fadvise_hint = parse_fadvise_hint(need(k, v, n)?).map_err(err)?,
        "numjobs" => job.numjobs = parse_count(k, v, n, 1, MAX_STREAMS)?,
        "stonewall" | "wait_for_previous" => job.stonewall = parse_bool(k, v, n)?,
        "wait_for" => job.wait_for = Some(need(k, v, n)?.to_string()),
        "startdelay" => {
            let s = need(k, v, n)?;
            if s.contains(['-', ':']) {
                return Err(err("a random range of start delays is not supported"));
            }
            job.startdelay_ms = parse_time_ms(s, 1000.0).map_err(|e| err(&e))?
        }
        "bssplit" => {
            job.bssplit = parse_bssplit(need(k, v, n)?).map_err(|e| err(&e))?;
            for (d, split) in job.bssplit.iter().enumerate() {
                let lo = split.iter().map(|b| b.0).min().unwrap_or(job.bs[d].0);
                let hi = split.iter().map(|b| b.0).max().unwrap_or(job.bs[d].1);
                job.bs[d] = (lo, hi);
            }
        }
        "rate_iops" => {
            let r = parse_rate(need(k, v, n)?).map_err(|e| err(&e))?;
            job.rate_iops = r;
        }
        "loops" => job.loops = parse_count(k, v, n, 1, 1 << 32)?,
        "filename_format" => job.filename_format = Some(need(k, v, n)?.to_string()),
        "runtime" | "timeout" => {
            let ms = parse_time_ms(need(k, v, n)?, 1000.0).map_err(|e| err(&e))?;
            job.runtime_ms = (ms > 0.0).then_some(ms);
        }
        "time_based" => job.time_based = parse_bool(k, v, n)?,
        "rate" => job.rate = parse_rate(need(k, v, n)?).map_err(|e| err(&e))?,
        "thinktime" => {
            job.thinktime_us = parse_time_ms(need(k, v, n)?, 0.001).map_err(|e| err(&e))? * 1000.0
        }
        "norandommap" => job.norandommap = parse_bool(k, v, n)?,
        "randseed" => job.randseed = size(need(k, v, n)?)?,
        "invalidate" => job.invalidate = parse_bool(k, v, n)?,
        "filename" => {
            let s = need(k, v, n)?;
            if s.contains(':') {
                return Err(err("several files in one filename= are not supported"));
            }
            job.filename = Some(s.to_string());
        }
        _ => {
            super::extra::apply(&mut job.extra, k, v, n)?;
        } // else reporting-only
    }
    Ok(())
}

/// `rw=PATTERN[:N]`: the pattern and its offset modifier (or why not).
fn parse_rw(s: &str) -> std::result::Result<(Rw, RwModifier), String> {
    let (pat, modifier) = match s.split_once(':') {
        Some((p, m)) => (p.trim(), Some(m.trim())),
        None => (s, None),
    };
    let rw = match pat {
        "read" => Rw::Read,
        "write" => Rw::Write,
        "randread" => Rw::RandRead,
        "randwrite" => Rw::RandWrite,
        "rw" | "readwrite" => Rw::Rw,
        "randrw" => Rw::RandRw,
        "trim" | "randtrim" | "trimwrite" | "randtrimwrite" => {
            return Err("trim workloads are not supported".into())
        }
        _ => return Err("expected read, write, randread, randwrite, rw or randrw".into()),
    };
    let m = match modifier {
        None => RwModifier::None,
        Some(m) if rw.random() => {
            let k = parse_size(m)?;
            if k == 0 || k > 1 << 32 {
                return Err("rw=PATTERN:N: N I/Os per random offset, 1..=2^32".into());
            }
            RwModifier::RandomRun(k)
        }
        Some(m) => {
            let (neg, v) = match m.strip_prefix('-') {
                Some(v) => (true, v),
                None => (false, m),
            };
            let b = parse_size(v)?;
            if b > MAX_BS * 1024 {
                return Err("rw=PATTERN:N: a hole of at most 1 TiB".into());
            }
            RwModifier::Hole(if neg { -(b as i64) } else { b as i64 })
        }
    };
    Ok((rw, m))
}

/// `bs=READ[,WRITE[,TRIM]]` over the block sizes `bs` set so far: a read size sets both
/// directions, a write size the writes', an empty one leaves them.
fn parse_bs(s: &str, mut bs: [(u64, u64); 2]) -> std::result::Result<[(u64, u64); 2], String> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.len() > 3 {
        return Err("expected bs=READ[,WRITE[,TRIM]]".into());
    }
    let mut vals = [None, None];
    for (i, p) in parts.iter().take(2).enumerate() {
        if p.is_empty() {
            continue;
        }
        if p.contains('-') || p.contains(':') {
            return Err("a range of block sizes goes in bsrange=".into());
        }
        let b = parse_size(p)?;
        if b == 0 || b > MAX_BS {
            return Err("a block size must be within 1 byte..=1 GiB".into());
        }
        vals[i] = Some(b);
    }
    if let Some(r) = vals[0] {
        bs = [(r, r), (r, r)];
    }
    if let Some(w) = vals[1] {
        bs[1] = (w, w);
    }
    Ok(bs)
}

/// `bsrange=LO-HI[,LO-HI]`: the reads' range, and the writes' when given (else the reads').
fn parse_bsrange(s: &str) -> std::result::Result<[(u64, u64); 2], String> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.len() > 3 {
        return Err("expected bsrange=LO-HI[,LO-HI]".into());
    }
    let r = parse_range(parts[0])?;
    let mut bs = [r, r];
    if let Some(p) = parts.get(1).filter(|p| !p.is_empty()) {
        bs[1] = parse_range(p)?;
    }
    if bs.iter().any(|&(_, hi)| hi > MAX_BS) {
        return Err("a block size must be within 1 byte..=1 GiB".into());
    }
    Ok(bs)
}

/// `bssplit=BS/PCT:BS/PCT...[,WRITES]`: weighted block sizes; sizes without a % share what
/// the others leave, equally (fio's `bssplit_ddir`).
fn parse_bssplit(s: &str) -> std::result::Result<[Vec<(u64, u32)>; 2], String> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.len() > 3 {
        return Err("expected bssplit=READS[,WRITES[,TRIMS]]".into());
    }
    let mut out = [Vec::new(), Vec::new()];
    for (d, p) in parts.iter().take(2).enumerate() {
        let mut v: Vec<(u64, Option<u32>)> = Vec::new();
        for item in p.split(':').filter(|i| !i.is_empty()) {
            let (b, pct) = match item.split_once('/') {
                Some((b, pct)) => {
                    let x: u32 = pct
                        .trim()
                        .parse()
                        .map_err(|_| format!("'{pct}' is not a percentage"))?;
                    (b, (x > 0).then_some(x.min(100)))
                }
                None => (item, None),
            };
            let b = parse_size(b)?;
            if b == 0 || b > MAX_BS {
                return Err("a block size must be within 1 byte..=1 GiB".into());
            }
            v.push((b, pct));
            if v.len() > 64 {
                return Err("at most 64 sizes in a bssplit".into());
            }
        }
        let given: u32 = v.iter().filter_map(|x| x.1).sum();
        if given > 100 {
            return Err(format!("the percentages add up to {given}, over 100"));
        }
        let missing = v.iter().filter(|x| x.1.is_none()).count() as u32;
        let share = (100 - given).checked_div(missing).unwrap_or(0);
        out[d] = v
            .into_iter()
            .map(|(b, p)| (b, p.unwrap_or(share)))
            .collect();
    }
    if out[1].is_empty() {
        out[1] = out[0].clone();
    }
    Ok(out)
}

/// `rate=READ[,WRITE]`, bytes/s (0: no cap); one value caps both directions.
fn parse_rate(s: &str) -> std::result::Result<[Option<u64>; 2], String> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.len() > 3 {
        return Err("expected rate=READ[,WRITE]".into());
    }
    let mut r = [None, None];
    for (i, p) in parts.iter().take(2).enumerate() {
        if !p.is_empty() {
            let x = parse_size(p)?;
            r[i] = (x > 0).then_some(x);
        }
    }
    Ok(if parts.len() == 1 { [r[0], r[0]] } else { r })
}

fn parse_ioengine(s: &str, n: usize) -> Result<IoEngine> {
    match s {
        "psync" | "sync" | "pvsync" | "pvsync2" => Ok(IoEngine::Sync),
        "libaio" => Ok(IoEngine::Libaio),
        "io_uring" => Ok(IoEngine::IoUring),
        "null" => Ok(IoEngine::Null),
        "cpuio" => Ok(IoEngine::Cpuio),
        _ => bail!(
            "{}",
            super::refusals::refusal(
                "ioengine",
                Some(s),
                n,
                super::refusals::engine_why(s).unwrap_or("not modelled")
            )
        ),
    }
}

/// `sync=` (a bare `sync` is `sync=1`).
fn parse_sync(v: Option<&str>) -> std::result::Result<SyncMode, &'static str> {
    match v {
        None | Some("1") | Some("sync") => Ok(SyncMode::Sync),
        Some("0") | Some("none") => Ok(SyncMode::None),
        Some("dsync") => Ok(SyncMode::Dsync),
        _ => Err("expected 0, 1, none, sync or dsync"),
    }
}

fn parse_fadvise_hint(s: &str) -> std::result::Result<FadviseHint, &'static str> {
    match s {
        "0" => Ok(FadviseHint::None),
        "1" => Ok(FadviseHint::Type),
        "sequential" => Ok(FadviseHint::Sequential),
        "random" => Ok(FadviseHint::Random),
        _ => Err("expected 0, 1, sequential or random"),
    }
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

impl super::steady::SsJob for FioJob {
    fn group(&self) -> usize {
        self.group
    }
    fn ss(&self) -> &super::steady::SsOptions {
        &self.extra.ss
    }
    fn line(&self) -> usize {
        self.line
    }
    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let text = "[j]\nsize=1m\nfoo=1\nramp_time=5\nrw=read\n";
        let e = parse(text, false).unwrap_err().to_string();
        // Each refusal: the option, its line and why; the first on the first line.
        assert!(
            e.starts_with("foo=1 (line 3): not an option the simulator models"),
            "{e}"
        );
        assert!(e.contains("\n  ramp_time=5 (line 4): "), "{e}");
        let jf = parse(text, true).unwrap();
        assert_eq!(jf.warnings.len(), 2);
        assert!(jf.warnings[0].starts_with("foo=1 (line 3)"));
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

    /// fio ends a line at its first ';' or '#' (fio 3.33's --showcmd of these lines:
    /// `--numjobs=2 --rw=read --filename=/tmp/x`); they were refused as bad values.
    #[test]
    fn inline_comments_end_the_line_as_in_fio() {
        let jf = parse(
            "[j] ; the job\nsize=1m ; 1 MiB\nnumjobs=2\t; 2 threads\nfilename=/tmp/x#y\nrw=read;\nbs=4k # block\n",
            false,
        )
        .unwrap();
        let j = &jf.jobs[0];
        assert_eq!(
            (j.name.as_str(), j.numjobs, j.size),
            ("j", 2, Some(1 << 20))
        );
        assert_eq!(j.filename.as_deref(), Some("/tmp/x"));
        assert_eq!((j.rw, j.bs[0].0), (Rw::Read, 4096));
    }
}
