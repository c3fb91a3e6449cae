//! fio options beyond the basic pattern, each modelled as fio 3.33 defines it (its HOWTO and
//! its code: `lib/zipf.c`, `lib/gauss.c`, `io_u.c`, `flow.c`, `backend.c`):
//!
//! * `random_distribution`: `random` (uniform), `zipf:θ`, `pareto:h`, `normal:σ%` (`gauss`),
//!   `zoned:A/S:...` and `zoned_abs:A/SIZE:...` (A % of the accesses to the next S % or SIZE
//!   bytes of the region), with fio's optional `:center` for the first three. Zipf is Gray et
//!   al.'s generator over at most 10 M ranks as fio's `zipf_next`; pareto `(n-1)·u^(log h /
//!   log(1-h))` as fio's `pareto_next`; normal the mean of 12 uniform draws plus a spread of
//!   σ % of the blocks, as fio's `gauss_next`. fio scatters the ranks over the region with a
//!   hash: so does the simulator (its own hash, so the hot blocks are others than fio's, equally
//!   many and equally hot). fio with its random map moves a drawn block already done to the
//!   next free one; that is not modelled, so a distribution needs `norandommap` (as every
//!   example using one has).
//! * `blockalign`: random offsets on this boundary (fio's default: the smallest block size).
//! * `number_ios`: a clone stops after this many I/Os (if nothing else stopped it first).
//! * `exitall`, `exit_what`: when a clone of such a job ends, the jobs of its reporting group
//!   (`group`, fio's default), every running job (`stonewall`) or every job, started or not
//!   (`all`) stop issuing.
//! * `flow`, `flow_id`, `flow_sleep`: fio's token flow control: a clone issues while its share
//!   of the flow group's I/Os is at most its share of the group's weights; else it waits until
//!   the others have issued enough, rounded up to whole `flow_sleep` steps (fio sleeps, then
//!   checks again). fio first also waits for the clone's I/Os in flight (`io_u_quiesce`);
//!   here they complete meanwhile, which the ratio does not see.
//! * `rate_process=poisson`: `rate_iops` with exponential gaps (fio's `usec_for_io`).
//! * `io_submit_mode=offload`: a helper thread submits at the rate's times; the I/O and its
//!   times are those of `inline`.
//! * `zonemode=zbd` on the simulated device, which is not zoned: fio emulates zones of
//!   `zonesize`, every one empty at the start (`init_zone_info`: the write pointer at the
//!   zone's start). A read-only job without `read_beyond_wp` finds no written data
//!   (`zbd_adjust_block`, `zbd_find_zone`) and ends with no I/O, as fio 3.33 did here on a
//!   file; jobs that write, or read beyond the write pointers, are refused.
//! * `verify` (`do_verify`, default on): a write job reads back what it wrote once its writes
//!   are done: an `fsync` and a cache drop per file (fio's `do_verify`), then every block again
//!   as a read, in the order written (fio's verify list with a random map). The data and its
//!   checksum are not modelled, only the I/O; `verify_backlog`, `verify_only`, verify with
//!   `time_based`, `loops` or `norandommap` (fio then sorts the read-back) are refused.

use anyhow::{bail, Result};
use rand::Rng;
use serde::Serialize;

use super::units::{parse_size, MAX_BYTES};

/// Options this module reads (the job reader's SIMULATED list takes them in).
pub(crate) const OPTIONS: &[&str] = &[
    "random_distribution",
    "blockalign",
    "ba",
    "number_ios",
    "exitall",
    "exit_what",
    "flow",
    "flow_id",
    "flow_sleep",
    "rate_process",
    "io_submit_mode",
    "verify",
    "do_verify",
    "prio",
    "prioclass",
    "cmdprio_percentage",
    "cmdprio_class",
    "cmdprio",
    "cmdprio_bssplit",
    "cpuload",
    "cpuchunks",
    "cpumode",
    "zonemode",
    "zonesize",
    "zonerange",
    "zoneskip",
    "fill_device",
    "fill_fs",
    "read_beyond_wp",
];

/// fio's zipf generator sums at most this many ranks (`ZIPF_MAX_GEN`).
const ZIPF_MAX_GEN: u64 = 10_000_000;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Distribution {
    Random,
    Zipf {
        theta: f64,
        center: Option<f64>,
    },
    Pareto {
        h: f64,
        center: Option<f64>,
    },
    Normal {
        dev_pct: f64,
        center: Option<f64>,
    },
    /// (share of accesses %, share of the region %) per zone, in order.
    Zoned(Vec<(f64, f64)>),
    /// (share of accesses %, bytes) per zone, in order.
    ZonedAbs(Vec<(f64, u64)>),
}

/// What an `exitall` job stops when it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExitWhat {
    Group,
    Stonewall,
    All,
}

/// The options of this module for one job.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobExtra {
    pub distribution: Distribution,
    pub blockalign: Option<u64>,
    pub number_ios: Option<u64>,
    pub exitall: bool,
    pub exit_what: ExitWhat,
    /// `flow` weight (0: no flow control) and group.
    pub flow: u32,
    pub flow_id: u32,
    pub flow_sleep_us: f64,
    pub poisson: bool,
    /// `verify=` other than none, with `do_verify`.
    pub verify: bool,
    pub do_verify: bool,
    /// Line of the `random_distribution` and `verify` options, for the checks.
    pub lines: [usize; 2],
    /// The I/O priority options (`prio`, `prioclass`, `cmdprio*`; [`super::prio`]).
    pub prio: super::prio::JobPrio,
    /// fio's `cpuio` engine: the CPU share (%, 0: not given) and the burn cycle, µs.
    pub cpuload: u32,
    pub cpuchunks_us: u64,
    /// `zonemode` (None: not given; fio then takes strided when `zonesize` is given) and
    /// `zonesize`, `zonerange`, `zoneskip`, bytes; the zonemode's line.
    pub zonemode: Option<ZoneMode>,
    pub zone: [u64; 3],
    pub zone_line: usize,
    /// `fill_device`: a new file takes the device's free space (fio writes until ENOSPC).
    pub fill_device: bool,
    /// `read_beyond_wp` (zonemode=zbd: reads past a zone's write pointer).
    pub read_beyond_wp: bool,
    /// No size given, and the file is made by an earlier job: fio takes the existing file's
    /// size (set by the job reader, checked against the earlier jobs).
    pub size_of_earlier_file: bool,
    /// Steady-state detection (`ss`, `ss_dur`, `ss_ramp`, [`super::steady`]).
    pub ss: super::steady::SsOptions,
    /// The queue-depth search for a latency target ([`super::latency`]).
    pub lat: super::latency::LatOptions,
}

/// `zonemode=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ZoneMode {
    None,
    Strided,
    Zbd,
}

/// fio's `zonemode=strided`: I/O in one zone of `range` bytes until `size` bytes were
/// transferred there, then the next zone, `range + skip` bytes further, wrapping to the
/// file's start past its end (fio's `setup_strided_zone_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Strided {
    pub size: u64,
    pub range: u64,
    pub skip: u64,
}

impl JobExtra {
    /// The strided zones of a job of `files` files (fio: strided only with one file open,
    /// else no zones).
    pub(crate) fn strided(&self, files: u64) -> Option<Strided> {
        let [size, range, skip] = self.zone;
        let on = match self.zonemode {
            Some(ZoneMode::Strided) => true,
            None => size > 0,
            _ => false,
        };
        (on && files == 1 && size > 0).then_some(Strided {
            size,
            range: if range > 0 { range } else { size },
            skip,
        })
    }
}

impl Default for JobExtra {
    fn default() -> Self {
        JobExtra {
            distribution: Distribution::Random,
            blockalign: None,
            number_ios: None,
            exitall: false,
            exit_what: ExitWhat::Group,
            flow: 0,
            flow_id: 0,
            flow_sleep_us: 0.0,
            poisson: false,
            verify: false,
            do_verify: true,
            lines: [0, 0],
            prio: Default::default(),
            cpuload: 0,
            cpuchunks_us: 50_000,
            zonemode: None,
            zone: [0; 3],
            zone_line: 0,
            fill_device: false,
            read_beyond_wp: false,
            size_of_earlier_file: false,
            ss: Default::default(),
            lat: Default::default(),
        }
    }
}

fn val<'a>(k: &str, v: Option<&'a str>, n: usize) -> Result<&'a str> {
    match v {
        Some(v) if !v.is_empty() => Ok(v),
        _ => bail!("line {n}: {k} needs a value ({k}=...)"),
    }
}

fn boolean(k: &str, v: Option<&str>, n: usize) -> Result<bool> {
    match v {
        None | Some("1") | Some("true") | Some("on") | Some("yes") => Ok(true),
        Some("0") | Some("false") | Some("off") | Some("no") => Ok(false),
        Some(o) => bail!("line {n}: {k}={o}: expected 0 or 1"),
    }
}

/// Sets option `k` if it is one of this module's; false if it is not.
pub(crate) fn apply(x: &mut JobExtra, k: &str, v: Option<&str>, n: usize) -> Result<bool> {
    let bad = |e: String| anyhow::anyhow!("line {n}: {k}={}: {e}", v.unwrap_or(""));
    match k {
        "random_distribution" => {
            x.distribution = parse_distribution(val(k, v, n)?).map_err(bad)?;
            x.lines[0] = n;
        }
        "blockalign" | "ba" => {
            let s = val(k, v, n)?;
            let first = s.split(',').next().unwrap_or("");
            let b = parse_size(first).map_err(bad)?;
            if b == 0 || b > 1 << 30 {
                return Err(bad("an alignment within 1 byte..=1 GiB".into()));
            }
            x.blockalign = Some(b);
        }
        "number_ios" => {
            let c = parse_size(val(k, v, n)?).map_err(bad)?;
            x.number_ios = (c > 0).then_some(c);
        }
        "exitall" => x.exitall = boolean(k, v, n)?,
        "exit_what" => {
            x.exit_what = match val(k, v, n)? {
                "group" => ExitWhat::Group,
                "stonewall" => ExitWhat::Stonewall,
                "all" => ExitWhat::All,
                _ => return Err(bad("expected group, stonewall or all".into())),
            }
        }
        "flow" => {
            let w: i64 = val(k, v, n)?
                .parse()
                .map_err(|_| bad("not a whole number".into()))?;
            // fio 3.33 takes a weight of 1..=1000 (FLOW_MAX_WEIGHT); 0 is no flow control.
            if !(0..=1000).contains(&w) {
                return Err(bad(
                    "fio's flow weight is 0..=1000 (negative weights are fio 3.2x's)".into(),
                ));
            }
            x.flow = w as u32;
        }
        "flow_id" => {
            x.flow_id = val(k, v, n)?
                .parse()
                .map_err(|_| bad("not a whole number".into()))?
        }
        "flow_sleep" => {
            let us: u64 = val(k, v, n)?
                .parse()
                .map_err(|_| bad("microseconds, a whole number".into()))?;
            if us > 60_000_000 {
                return Err(bad("at most 60 s".into()));
            }
            x.flow_sleep_us = us as f64;
        }
        "rate_process" => {
            x.poisson = match val(k, v, n)? {
                "linear" => false,
                "poisson" => true,
                _ => return Err(bad("expected linear or poisson".into())),
            }
        }
        "io_submit_mode" => match val(k, v, n)? {
            "inline" | "offload" => {}
            _ => return Err(bad("expected inline or offload".into())),
        },
        "verify" => {
            x.verify = val(k, v, n)? != "0" && v != Some("none");
            x.lines[1] = n;
        }
        "do_verify" => x.do_verify = boolean(k, v, n)?,
        "prio" | "prioclass" | "cmdprio_percentage" | "cmdprio_class" | "cmdprio"
        | "cmdprio_bssplit" => {
            x.prio.apply(k, val(k, v, n)?, n)?;
        }
        "cpuload" => {
            let c: u32 = val(k, v, n)?
                .parse()
                .map_err(|_| bad("a percentage".into()))?;
            // fio caps it at 100 (`fio_cpuio_init`).
            x.cpuload = c.min(100);
        }
        "cpuchunks" => {
            let us: u64 = val(k, v, n)?
                .parse()
                .map_err(|_| bad("microseconds, a whole number".into()))?;
            if !(1..=60_000_000).contains(&us) {
                return Err(bad("1 µs..=60 s".into()));
            }
            x.cpuchunks_us = us;
        }
        // qsort's cycle is the time this machine's sorts took (fio measures it); the
        // simulator's cycle is `cpuchunks` for both: the job's span, its runtime, is the same.
        "zonemode" => {
            x.zonemode = Some(match val(k, v, n)? {
                "none" => ZoneMode::None,
                "strided" => ZoneMode::Strided,
                "zbd" => ZoneMode::Zbd,
                _ => return Err(bad("expected none, strided or zbd".into())),
            });
            x.zone_line = n;
        }
        "zonesize" | "zonerange" | "zoneskip" => {
            let b = parse_size(val(k, v, n)?).map_err(bad)?;
            if b > MAX_BYTES {
                return Err(bad("larger than the simulator's limit".into()));
            }
            let i = ["zonesize", "zonerange", "zoneskip"]
                .iter()
                .position(|z| *z == k)
                .unwrap_or(0);
            x.zone[i] = b;
            if x.zone_line == 0 {
                x.zone_line = n;
            }
        }
        "fill_device" | "fill_fs" => x.fill_device = boolean(k, v, n)?,
        "read_beyond_wp" => x.read_beyond_wp = boolean(k, v, n)?,
        "cpumode" => match val(k, v, n)? {
            "noop" | "qsort" => {}
            _ => return Err(bad("expected noop or qsort".into())),
        },
        _ => {
            return Ok(super::steady::apply(&mut x.ss, k, v, n)?
                || super::latency::apply(&mut x.lat, k, v, n)?)
        }
    }
    Ok(true)
}

/// fio's `cpuio` needs `cpuload` (fio: "cpu thread needs rate"); with no file it runs until
/// its runtime ends, so the simulator needs one.
pub(crate) fn check_cpuio(name: &str, x: &JobExtra, runtime: bool, line: usize) -> Result<()> {
    if x.cpuload == 0 {
        bail!("line {line}: job '{name}': ioengine=cpuio needs cpuload= (fio's rule)");
    }
    if !runtime {
        bail!("line {line}: job '{name}': ioengine=cpuio without a runtime runs until stopped: give runtime=");
    }
    Ok(())
}

impl JobExtra {
    /// fio's cpuio cycle: `cpuchunks` µs of CPU, then `cpuchunks·(100 - cpuload)/cpuload` µs
    /// of sleep (`fio_cpuio_init`'s thinktime, integer µs as fio's), ms.
    pub(crate) fn cpuio_cycle_ms(&self) -> f64 {
        let load = u64::from(self.cpuload.max(1));
        let think = self.cpuchunks_us * (100 - load) / load;
        (self.cpuchunks_us + think) as f64 / 1000.0
    }
}

/// What [`check`] needs to know of a job.
pub(crate) struct JobFacts<'a> {
    pub name: &'a str,
    pub extra: &'a JobExtra,
    /// A random `rw=`; write-only (`write`, `randwrite`); several passes (`time_based`,
    /// `loops`).
    pub random: bool,
    pub write_only: bool,
    pub read_only: bool,
    pub passes: bool,
    pub norandommap: bool,
}

/// fio keeps one zone state per file for all jobs: a `zonemode=zbd` reader is modelled only
/// if no job of the run writes its file (its zones then stay empty).
pub(crate) fn check_zbd_files(jobs: &[super::FioJob]) -> Result<()> {
    for j in jobs
        .iter()
        .filter(|j| j.extra.zonemode == Some(ZoneMode::Zbd))
    {
        let Some(f) = j.filename.as_deref() else {
            continue;
        };
        if let Some(w) = jobs
            .iter()
            .find(|w| w.filename.as_deref() == Some(f) && w.rw.read_share(w.rwmixread) < 1.0)
        {
            bail!(
                "line {}: job '{}': zonemode=zbd on {f}, which job '{}' writes: fio's emulated write pointers are not modelled",
                j.extra.zone_line,
                j.name,
                w.name
            );
        }
    }
    Ok(())
}

/// What these options need of the rest of the job (errors name the option's line).
pub(crate) fn check(job: &JobFacts) -> Result<()> {
    let x = job.extra;
    let [dl, vl] = x.lines;
    match (x.zonemode, x.zone[0]) {
        (Some(ZoneMode::Zbd), 0) => bail!(
            "line {}: job '{}': zonemode=zbd on a device that is not zoned needs zonesize (fio's rule: it emulates the zones)",
            x.zone_line,
            job.name
        ),
        (Some(ZoneMode::Zbd), _) if !job.read_only || x.read_beyond_wp => bail!(
            "{}",
            super::refusals::refusal(
                "zonemode",
                Some("zbd"),
                x.zone_line,
                "fio's emulated zones with writes or read_beyond_wp (write pointers, zone resets, open-zone limits): not modelled; a read-only job without read_beyond_wp is (it reads nothing)"
            )
        ),
        (Some(ZoneMode::None), z) if z > 0 => bail!(
            "line {}: job '{}': zonemode=none and zonesize are not compatible (fio's rule)",
            x.zone_line,
            job.name
        ),
        (Some(ZoneMode::Strided), 0) => bail!(
            "line {}: job '{}': zonemode=strided needs zonesize (fio's rule)",
            x.zone_line,
            job.name
        ),
        _ => {}
    }
    if x.distribution != Distribution::Random && !job.norandommap {
        bail!(
            "line {dl}: job '{}': random_distribution without norandommap: fio then moves a drawn block already done to the next free one, which is not modelled (add norandommap)",
            job.name
        );
    }
    if x.distribution != Distribution::Random && !job.random {
        bail!(
            "line {dl}: job '{}': random_distribution needs a random rw=",
            job.name
        );
    }
    if x.verify && x.do_verify {
        let why = if job.read_only {
            // fio checks each block as it reads it: no I/O of its own.
            None
        } else if !job.write_only {
            Some("a job that is not write-only (fio verifies its reads as they come)")
        } else if job.passes {
            Some("time_based or loops (fio's read-back after a runtime or of several passes)")
        } else if job.norandommap {
            Some("norandommap (fio sorts the read-back by offset and drops overwritten blocks)")
        } else if x.number_ios.is_some() {
            Some("number_ios")
        } else {
            None
        };
        if let Some(why) = why {
            bail!(
                "line {vl}: job '{}': verify with {why} is not modelled",
                job.name
            );
        }
    }
    Ok(())
}

/// `random_distribution=` as fio reads it.
pub fn parse_distribution(s: &str) -> std::result::Result<Distribution, String> {
    let (kind, rest) = s.split_once(':').unwrap_or((s, ""));
    let params =
        |what: &str, lo: f64, hi: f64| -> std::result::Result<(f64, Option<f64>), String> {
            let mut it = rest.split(':');
            let p: f64 = it
                .next()
                .unwrap_or("")
                .trim()
                .parse()
                .map_err(|_| format!("{kind}:{what}: a number"))?;
            if !(p > lo && p < hi) {
                return Err(format!("{kind}:{what} must be within ({lo}, {hi})"));
            }
            let center = match it.next() {
                None => None,
                Some(c) => {
                    let c: f64 = c
                        .trim()
                        .parse()
                        .map_err(|_| "center: a number".to_string())?;
                    if !(0.0..=1.0).contains(&c) {
                        return Err("the center is a fraction, 0..=1".into());
                    }
                    Some(c)
                }
            };
            Ok((p, center))
        };
    Ok(match kind {
        "random" => Distribution::Random,
        "zipf" => {
            let (theta, center) = params("theta", 0.0, f64::INFINITY)?;
            if theta == 1.0 {
                return Err("zipf:1 is not defined (fio refuses it too)".into());
            }
            Distribution::Zipf { theta, center }
        }
        "pareto" => {
            let (h, center) = params("h", 0.0, 1.0)?;
            Distribution::Pareto { h, center }
        }
        "normal" | "gauss" => {
            let (dev_pct, center) = params("dev", -f64::MIN_POSITIVE, 100.0 + 1e-9)?;
            Distribution::Normal { dev_pct, center }
        }
        "zoned" | "zoned_abs" => parse_zones(kind, rest)?,
        _ => {
            return Err(
                "expected random, zipf:θ, pareto:h, normal:σ, zoned:... or zoned_abs:...".into(),
            )
        }
    })
}

fn parse_zones(kind: &str, rest: &str) -> std::result::Result<Distribution, String> {
    if rest.contains(',') {
        return Err("zones per direction (',') are not supported: one list for both".into());
    }
    let mut zones: Vec<(f64, Option<u64>)> = Vec::new();
    for z in rest.split(':').filter(|z| !z.trim().is_empty()) {
        let (a, sz) = z
            .split_once('/')
            .ok_or(format!("zone '{z}': ACCESS/SIZE"))?;
        let a: f64 = a
            .trim()
            .parse()
            .map_err(|_| format!("zone '{z}': the access share is a number"))?;
        let sz = sz.trim();
        let size = if sz.is_empty() {
            None
        } else if kind == "zoned" {
            let p: f64 = sz
                .trim_end_matches('%')
                .parse()
                .map_err(|_| format!("zone '{z}': the size share is a number"))?;
            Some((p * 1e6) as u64)
        } else {
            Some(parse_size(sz)?)
        };
        zones.push((a, size));
        if zones.len() > 256 {
            return Err("at most 256 zones".into());
        }
    }
    let access: f64 = zones.iter().map(|z| z.0).sum();
    if zones.is_empty() || (access - 100.0).abs() > 1e-6 || zones.iter().any(|z| z.0 < 0.0) {
        return Err(format!("the zones' accesses add up to {access}%, not 100%"));
    }
    if kind == "zoned_abs" {
        if zones
            .iter()
            .any(|z| z.1.is_none_or(|b| b == 0 || b > MAX_BYTES))
        {
            return Err("zoned_abs: every zone needs a size".into());
        }
        return Ok(Distribution::ZonedAbs(
            zones
                .into_iter()
                .map(|(a, b)| (a, b.unwrap_or(0)))
                .collect(),
        ));
    }
    // Sizes in millionths of a percent; zones without one share what the others leave.
    let given: u64 = zones.iter().filter_map(|z| z.1).sum();
    if given > 100_000_000 {
        return Err("the zones' sizes add up to over 100%".into());
    }
    let missing = zones.iter().filter(|z| z.1.is_none()).count() as u64;
    let share = (100_000_000 - given).checked_div(missing).unwrap_or(0);
    Ok(Distribution::Zoned(
        zones
            .into_iter()
            .map(|(a, s)| (a, s.unwrap_or(share) as f64 / 1e6))
            .collect(),
    ))
}

/// A 64-bit mix (the SplitMix64 finaliser): scatters ranks over the region, as fio's hash.
fn scatter(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A distribution's generator over `n` blocks (zipf's sums computed once).
#[derive(Clone, Debug)]
pub(crate) struct Sampler {
    n: u64,
    zetan: f64,
    zeta2: f64,
    offset: u64,
}

impl Sampler {
    pub(crate) fn new(d: &Distribution, n: u64) -> Sampler {
        let n = n.max(1);
        let (mut zetan, mut zeta2) = (0.0, 0.0);
        if let Distribution::Zipf { theta, .. } = d {
            let m = n.min(ZIPF_MAX_GEN);
            zetan = (1..=m).map(|i| (i as f64).powf(-theta)).sum();
            zeta2 = 1.0 + 2f64.powf(-theta);
        }
        let center = match d {
            Distribution::Zipf { center, .. }
            | Distribution::Pareto { center, .. }
            | Distribution::Normal { center, .. } => *center,
            _ => None,
        };
        let offset = center.map_or(0, |c| (n as f64 * c) as u64);
        Sampler {
            n,
            zetan,
            zeta2,
            offset,
        }
    }

    pub(crate) fn blocks(&self) -> u64 {
        self.n
    }

    /// The next block, 0..n.
    pub(crate) fn next(&self, d: &Distribution, rng: &mut impl Rng) -> u64 {
        let n = self.n;
        let ranked = |rank: u64| (scatter(rank).wrapping_add(self.offset)) % n;
        match d {
            Distribution::Random => rng.random_range(0..n),
            Distribution::Zipf { theta, .. } => {
                // fio's zipf_next: over all n ranks (the sums over at most 10 M), a rank past
                // the end wrapping round with the hash's modulo, as fio's does.
                let nf = n as f64;
                let alpha = 1.0 / (1.0 - theta);
                let eta = (1.0 - (2.0 / nf).powf(1.0 - theta)) / (1.0 - self.zeta2 / self.zetan);
                let u: f64 = rng.random();
                let z = u * self.zetan;
                let rank = if z < 1.0 {
                    0
                } else if z < 1.0 + 0.5f64.powf(*theta) {
                    1
                } else {
                    (nf * (eta * u - eta + 1.0).powf(alpha)) as u64
                };
                ranked(rank)
            }
            Distribution::Pareto { h, .. } => {
                let pow = h.ln() / (1.0 - h).ln();
                let u: f64 = rng.random();
                ranked((((n - 1) as f64) * u.powf(pow)) as u64)
            }
            Distribution::Normal { dev_pct, .. } => {
                let sum: u64 = (0..12).map(|_| rng.random_range(0..=n)).sum();
                let mut v = sum.div_ceil(12);
                let stddev = ((n as f64 * dev_pct / 100.0).ceil() as u64).min(n / 2);
                if stddev > 0 {
                    let mut dev = rng.random_range(0..stddev) as i64 - (stddev / 2) as i64;
                    while v as i64 + dev >= n as i64 {
                        dev /= 2;
                    }
                    v = (v as i64 + dev).max(0) as u64;
                }
                ranked(v)
            }
            Distribution::Zoned(zones) => {
                let (lo, hi) = pick_zone(rng, zones.iter().map(|z| (z.0, z.1 / 100.0 * n as f64)));
                rng.random_range(lo.min(n - 1)..hi.clamp(lo + 1, n).max(lo.min(n - 1) + 1))
            }
            Distribution::ZonedAbs(zones) => {
                // (the caller's blocks are in its unit: sizes are converted by `with_unit`)
                let (lo, hi) = pick_zone(rng, zones.iter().map(|z| (z.0, z.1 as f64)));
                rng.random_range(lo.min(n - 1)..hi.clamp(lo + 1, n).max(lo.min(n - 1) + 1))
            }
        }
    }
}

/// Picks a zone by its access share and returns its block range (lo, hi).
fn pick_zone(rng: &mut impl Rng, zones: impl Iterator<Item = (f64, f64)>) -> (u64, u64) {
    let x: f64 = rng.random::<f64>() * 100.0;
    let (mut acc, mut start) = (0.0, 0.0);
    let mut last = (0, 1);
    for (access, len) in zones {
        let range = (start as u64, (start + len).ceil() as u64);
        acc += access;
        if access > 0.0 {
            last = range;
        }
        if x < acc && access > 0.0 {
            return range;
        }
        start += len;
    }
    last
}

/// `zoned_abs` sizes in blocks of `unit` bytes.
pub(crate) fn with_unit(d: &Distribution, unit: u64) -> Distribution {
    match d {
        Distribution::ZonedAbs(z) => Distribution::ZonedAbs(
            z.iter()
                .map(|&(a, b)| (a, b.div_ceil(unit.max(1))))
                .collect(),
        ),
        d => d.clone(),
    }
}

/// A Poisson process's next gap at `iops` per second, ms (fio's `rate_process=poisson`).
pub(crate) fn poisson_gap_ms(rng: &mut impl Rng, iops: u64) -> f64 {
    let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
    -u.ln() / iops.max(1) as f64 * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn hits(d: &str, n: u64, draws: usize) -> Vec<u64> {
        let d = parse_distribution(d).unwrap();
        let s = Sampler::new(&d, n);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut h = vec![0u64; n as usize];
        for _ in 0..draws {
            h[s.next(&d, &mut rng) as usize] += 1;
        }
        h
    }

    /// Share of the draws that fell on the `top` fraction of the most hit blocks, of those hit
    /// at all (fio-genzipf's rows).
    fn top_share(h: Vec<u64>, top: f64) -> f64 {
        let mut h: Vec<u64> = h.into_iter().filter(|&x| x > 0).collect();
        let total: u64 = h.iter().sum();
        h.sort_unstable_by(|a, b| b.cmp(a));
        let k = (h.len() as f64 * top) as usize;
        h[..k].iter().sum::<u64>() as f64 / total as f64
    }

    /// fio's own figures, `fio-genzipf -t zipf -i 1.2 -b 4096 -g 1` (fio 3.33: 262,144
    /// blocks, as many draws): the top 10 % of the blocks hit take 88.76 % of the hits;
    /// `-i 0.5`: 28.89 %; `-t pareto -i 0.3`: the top 30 % take 64.55 %.
    #[test]
    fn skewed_distributions_concentrate_as_fio_defines_them() {
        let n = 262_144;
        let z12 = top_share(hits("zipf:1.2", n, n as usize), 0.1);
        assert!((z12 - 0.8876).abs() < 0.03, "zipf 1.2: {z12}");
        let z05 = top_share(hits("zipf:0.5", n, n as usize), 0.1);
        assert!((z05 - 0.2889).abs() < 0.03, "zipf 0.5: {z05}");
        let p = top_share(hits("pareto:0.3", n, n as usize), 0.3);
        assert!((p - 0.6455).abs() < 0.03, "pareto 0.3: {p}");
        let u = top_share(hits("random", 1000, 1_000_000), 0.1);
        assert!(u < 0.12, "uniform: {u}");
    }

    /// `zoned:50/5:30/15:20/`: half the accesses to the first 5 % of the region, 30 % to the
    /// next 15 %, the rest to the remaining 80 % (rand-zones.fio).
    #[test]
    fn zones_take_their_share_of_accesses() {
        let h = hits("zoned:50/5:30/15:20/", 1000, 1_000_000);
        let part = |a: usize, b: usize| h[a..b].iter().sum::<u64>() as f64 / 1e6;
        assert!((part(0, 50) - 0.5).abs() < 0.01);
        assert!((part(50, 200) - 0.3).abs() < 0.01);
        assert!((part(200, 1000) - 0.2).abs() < 0.01);
        assert!(parse_distribution("zoned:50/5:30/15").is_err(), "80%");
        assert!(parse_distribution("zipf:1").is_err());
        assert!(parse_distribution("pareto:1.5").is_err());
        let n = hits("normal:10", 1000, 200_000);
        assert!(top_share(n, 0.3) > 0.5, "normal is concentrated");
    }
}
