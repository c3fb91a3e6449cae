//! fio's steady-state detection (`ss`, `ss_dur`, `ss_ramp`; fio 3.33's `steadystate.c`,
//! `helper_thread.c`, `options.c`): a job ends early once its IOPS or bandwidth has held
//! steady for `ss_dur` seconds.
//!
//! fio's helper thread samples every second (`STEADYSTATE_MSEC`), on its own clock, which
//! starts before any job does: at each tick every running job (clone) whose ramp is over
//! (`ss_ramp` plus one second since the job's start) adds `1000·(bytes − bytes at the last
//! tick) / ms since the last tick` (integer arithmetic) to its unit's sample, the unit being
//! the clone, or with `group_reporting` its reporting group, checked at the group's last
//! clone while that one runs. Once a unit holds `ss_dur` samples the criterion is checked on
//! the latest `ss_dur` at every tick: `iops`/`bw`, the largest distance of a sample from
//! their mean; `iops_slope`/`bw_slope`, the least-squares slope over x = 0..dur−1; with `%`,
//! as a percentage of the (integer, for the slope) mean. Below the limit, every clone of the
//! unit stops issuing (fio's `fio_mark_td_terminate`) and ends when its I/O in flight has
//! completed. The simulator's ticks fall at the run's start plus whole seconds; a job
//! started on a tick counts as started just after it (fio's helper thread runs first).

use anyhow::{bail, Result};
use serde::Serialize;

use super::units::{parse_size, parse_time_ms};

/// The options this module reads (fio's long names and their aliases).
pub(crate) const OPTIONS: &[&str] = &[
    "ss",
    "steadystate",
    "ss_dur",
    "steadystate_duration",
    "ss_ramp",
    "steadystate_ramp_time",
    // (also changes fio's report; here it matters for what ss samples)
    "group_reporting",
];

/// fio's sampling interval, ms (`STEADYSTATE_MSEC`).
const TICK_MS: f64 = 1000.0;

/// A job's steady-state options, as fio keeps them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SsOptions {
    /// IOPS (else bandwidth), slope (else deviation from the mean), limit in % of the mean.
    pub iops: bool,
    pub slope: bool,
    pub pct: bool,
    pub limit: f64,
    /// `ss_dur` in whole seconds (fio divides its µs by 10^6; 0: no detection).
    pub dur: u64,
    /// `ss_ramp`, µs.
    pub ramp_us: u64,
    pub group_reporting: bool,
    /// Line of the first steady-state option (0: none given).
    pub line: usize,
}

impl Default for SsOptions {
    fn default() -> Self {
        // fio's default criterion: `iops_slope:0.01%`.
        SsOptions {
            iops: true,
            slope: true,
            pct: true,
            limit: 0.01,
            dur: 0,
            ramp_us: 0,
            group_reporting: false,
            line: 0,
        }
    }
}

impl SsOptions {
    /// What fio compares between the jobs of a group (`td_steadystate_init`: a job without
    /// `ss_dur` keeps no steady-state settings at all, whatever its `ss`).
    fn same_detection(&self, o: &SsOptions) -> bool {
        let key = |x: &SsOptions| (x.iops, x.slope, x.pct, x.limit, x.dur, x.ramp_us);
        (self.dur == 0 && o.dur == 0) || key(self) == key(o)
    }
}

/// Sets option `k` if it is one of this module's; false if it is not.
pub(crate) fn apply(x: &mut SsOptions, k: &str, v: Option<&str>, n: usize) -> Result<bool> {
    let bad = |e: &str| anyhow::anyhow!("line {n}: {k}={}: {e}", v.unwrap_or(""));
    let val = || -> Result<&str> {
        v.filter(|v| !v.is_empty())
            .ok_or_else(|| anyhow::anyhow!("line {n}: {k} needs a value ({k}=...)"))
    };
    match k {
        "group_reporting" => {
            x.group_reporting = match v {
                None | Some("1") | Some("true") | Some("on") | Some("yes") => true,
                Some("0") | Some("false") | Some("off") | Some("no") => false,
                Some(_) => return Err(bad("expected 0 or 1")),
            };
            return Ok(true);
        }
        "ss" | "steadystate" => {
            let s = val()?;
            let (crit, thr) = s.split_once(':').ok_or_else(|| {
                bad("the threshold must follow the criterion (fio: iops:10%, bw_slope:1%...)")
            })?;
            (x.iops, x.slope) = match crit.trim() {
                "iops" => (true, false),
                "iops_slope" => (true, true),
                "bw" => (false, false),
                "bw_slope" => (false, true),
                _ => return Err(bad("expected iops, iops_slope, bw or bw_slope")),
            };
            let thr = thr.trim();
            x.pct = thr.contains('%');
            x.limit = if x.pct || x.iops {
                let t = thr.split('%').next().unwrap_or("").trim();
                t.parse::<f64>()
                    .ok()
                    .filter(|l| l.is_finite())
                    .ok_or_else(|| bad("the threshold is a number"))?
            } else {
                // fio's str_to_decimal: a bandwidth in bytes/s with fio's size suffixes.
                parse_size(thr).map_err(|e| bad(&e))? as f64
            };
        }
        "ss_dur" | "steadystate_duration" => {
            let ms = parse_time_ms(val()?, 1000.0).map_err(|e| bad(&e))?;
            if ms > 86_400_000.0 {
                return Err(bad("at most a day"));
            }
            x.dur = (ms / 1000.0).floor() as u64;
        }
        "ss_ramp" | "steadystate_ramp_time" => {
            let ms = parse_time_ms(val()?, 1000.0).map_err(|e| bad(&e))?;
            if ms > 86_400_000.0 {
                return Err(bad("at most a day"));
            }
            x.ramp_us = (ms * 1000.0).round() as u64;
        }
        _ => return Ok(false),
    }
    if x.line == 0 {
        x.line = n;
    }
    Ok(true)
}

/// What the detection reads of a job (the parser's `FioJob` implements it, so this module
/// depends on nothing of the parser's).
pub(crate) trait SsJob {
    fn group(&self) -> usize;
    fn ss(&self) -> &SsOptions;
    fn line(&self) -> usize;
    fn name(&self) -> &str;
}

/// fio's rule: the jobs of a reporting group detect steady state alike (else "job rejected:
/// steadystate options must be consistent within reporting groups"). The simulator also
/// needs one `group_reporting` per group when detection is on.
pub(crate) fn check<J: SsJob>(jobs: &[J]) -> Result<()> {
    for (i, j) in jobs.iter().enumerate() {
        let Some(first) = jobs[..i].iter().find(|e| e.group() == j.group()) else {
            continue;
        };
        let (a, b) = (first.ss(), j.ss());
        if !a.same_detection(b) {
            bail!(
                "line {}: job '{}': steadystate options must be consistent within reporting groups (fio rejects the job: they differ from job '{}')",
                j.line(),
                j.name(),
                first.name()
            );
        }
        if a.dur > 0 && a.group_reporting != b.group_reporting {
            bail!(
                "line {}: job '{}': steady-state detection with group_reporting on some jobs of a reporting group and not others is not modelled",
                j.line(),
                j.name()
            );
        }
    }
    Ok(())
}

/// One clone's counters as fio's `steadystate_check` keeps them.
#[derive(Clone, Debug, Default)]
struct Counts {
    ios: u64,
    bytes: u64,
    prev_ios: u64,
    prev_bytes: u64,
    /// The last tick (or the clone's start), ms; None: not started yet.
    prev_time: Option<f64>,
    ramp_over: bool,
}

/// What is checked together: a clone, or a reporting group with `group_reporting`.
#[derive(Debug)]
struct Unit {
    opts: SsOptions,
    streams: Vec<u32>,
    /// The latest samples (IOPS, bytes/s), at most `dur`.
    samples: std::collections::VecDeque<(u64, u64)>,
    attained: bool,
}

/// Whether a clone runs at a tick: started (at ms) and not ended.
pub(super) type Running<'a> = &'a dyn Fn(u32) -> Option<f64>;

/// The steady-state detection of a run.
#[derive(Debug)]
pub(super) struct Monitor {
    units: Vec<Unit>,
    counts: Vec<Counts>,
    /// Ticks done since the run's start.
    ticks: u64,
}

impl Monitor {
    /// The detection of `jobs` (stream `i` a clone of job `job_of[i]`); None if no job has
    /// it.
    pub(super) fn new<J: SsJob>(jobs: &[J], job_of: &[usize]) -> Option<Monitor> {
        let mut units: Vec<Unit> = Vec::new();
        let mut unit_of_group: std::collections::HashMap<usize, usize> = Default::default();
        for (sid, &j) in job_of.iter().enumerate() {
            let job = &jobs[j];
            let o = job.ss();
            if o.dur == 0 {
                continue;
            }
            let at = if o.group_reporting {
                *unit_of_group.entry(job.group()).or_insert(units.len())
            } else {
                units.len()
            };
            if at == units.len() {
                units.push(Unit {
                    opts: o.clone(),
                    streams: Vec::new(),
                    samples: Default::default(),
                    attained: false,
                });
            }
            units[at].streams.push(sid as u32);
        }
        (!units.is_empty()).then(|| Monitor {
            units,
            counts: vec![Counts::default(); job_of.len()],
            ticks: 0,
        })
    }

    /// A request of `sid` completed (`bytes`; None: not a read or a write, fio's
    /// `io_blocks` do not count it).
    pub(super) fn completed(&mut self, sid: u32, bytes: Option<u64>) {
        if let (Some(c), Some(b)) = (self.counts.get_mut(sid as usize), bytes) {
            c.ios += 1;
            c.bytes += b;
        }
    }

    /// Runs the ticks of the run (started at `origin` ms) up to `now`; the clones to stop
    /// (their unit held steady), at the tick's time.
    pub(super) fn ticks_until(
        &mut self,
        origin: f64,
        now: f64,
        running: Running,
    ) -> Vec<(u32, f64)> {
        let mut stop = Vec::new();
        loop {
            let t = origin + (self.ticks + 1) as f64 * TICK_MS;
            if t > now {
                return stop;
            }
            self.ticks += 1;
            for u in 0..self.units.len() {
                if self.tick_unit(u, t, running) {
                    stop.extend(self.units[u].streams.iter().map(|&s| (s, t)));
                }
            }
        }
    }

    /// One tick of unit `u` at `t`: true if it holds steady now.
    fn tick_unit(&mut self, u: usize, t: f64, running: Running) -> bool {
        let unit = &mut self.units[u];
        if unit.attained {
            return false;
        }
        let ramp_ms = unit.opts.ramp_us as f64 / 1000.0;
        let (mut iops, mut bw, mut over) = (0u64, 0u64, 0usize);
        // (a clone started on the tick starts just after it)
        let runs = |sid: u32| running(sid).filter(|&e| e < t);
        let last_runs = unit.streams.last().is_some_and(|&s| runs(s).is_some());
        for &sid in &unit.streams {
            let c = &mut self.counts[sid as usize];
            let Some(epoch) = runs(sid) else {
                continue;
            };
            let prev = *c.prev_time.get_or_insert(epoch);
            // fio: ramp over once the time since the start is at least ramp + 1 s (strictly
            // more here: the start is just after a tick).
            if ramp_ms == 0.0 || t - epoch > ramp_ms + TICK_MS {
                c.ramp_over = true;
            }
            // fio's mtime_since: whole ms (at least 1: a tick after the start).
            let rate_ms = ((t - prev).floor() as u64).max(1);
            if c.ramp_over {
                bw += (c.bytes - c.prev_bytes).saturating_mul(1000) / rate_ms;
                iops += (c.ios - c.prev_ios).saturating_mul(1000) / rate_ms;
                over += 1;
            }
            (c.prev_time, c.prev_ios, c.prev_bytes) = (Some(t), c.ios, c.bytes);
        }
        // fio checks at the unit's last clone, if it runs, once one clone's ramp is over.
        if !last_runs || over == 0 {
            return false;
        }
        let dur = unit.opts.dur as usize;
        unit.samples.push_back((iops, bw));
        while unit.samples.len() > dur {
            unit.samples.pop_front();
        }
        if unit.samples.len() < dur {
            return false;
        }
        let ys: Vec<u64> = unit
            .samples
            .iter()
            .map(|&(i, b)| if unit.opts.iops { i } else { b })
            .collect();
        unit.attained = holds_steady(&unit.opts, &ys);
        unit.attained
    }
}

/// fio's criterion on the latest `dur` samples `ys`, oldest first.
fn holds_steady(o: &SsOptions, ys: &[u64]) -> bool {
    let n = ys.len() as u64;
    let sum_y = ys.iter().fold(0u64, |a, &y| a.saturating_add(y));
    if o.slope {
        let sum_x = n * n.saturating_sub(1) / 2;
        let sum_x_sq = n.saturating_sub(1) * n * (2 * n).saturating_sub(1) / 6;
        let sum_xy = ys.iter().enumerate().fold(0u64, |a, (x, &y)| {
            a.saturating_add((x as u64).saturating_mul(y))
        });
        let (n_f, sx) = (n as f64, sum_x as f64);
        // (dur 1: 0/0, NaN, never below the limit, as in fio)
        let slope = (sum_xy as f64 - sx * sum_y as f64 / n_f) / (sum_x_sq as f64 - sx * sx / n_f);
        let criterion = if o.pct {
            // fio divides the integers: the mean is truncated.
            100.0 * slope / (sum_y / n) as f64
        } else {
            slope
        };
        criterion.abs() < o.limit
    } else {
        let mean = sum_y as f64 / n as f64;
        let dev = ys
            .iter()
            .map(|&y| (y as f64 - mean).abs())
            .fold(0.0, f64::max);
        let criterion = if o.pct { 100.0 * dev / mean } else { dev };
        criterion < o.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(spec: &str) -> SsOptions {
        let mut o = SsOptions::default();
        apply(&mut o, "ss", Some(spec), 1).unwrap();
        o
    }

    #[test]
    fn criteria_as_fio_computes_them() {
        // Deviation: the samples 90, 100, 110 are 10 from their mean 100: 10 %.
        let ys = [90, 100, 110];
        assert!(!holds_steady(&opts("iops:10%"), &ys));
        assert!(holds_steady(&opts("iops:10.5%"), &ys));
        assert!(holds_steady(&opts("iops:11"), &ys));
        assert!(!holds_steady(&opts("iops:10"), &ys));
        // Slope: 10 per sample, 10 % of the mean 100.
        assert!(!holds_steady(&opts("iops_slope:10%"), &ys));
        assert!(holds_steady(&opts("iops_slope:10.01%"), &ys));
        // (a falling slope counts by its size)
        assert!(!holds_steady(&opts("bw_slope:10"), &[110, 100, 90]));
        assert!(holds_steady(&opts("bw_slope:11"), &[110, 100, 90]));
        // One sample: fio's slope is 0/0, never steady; its deviation 0.
        assert!(!holds_steady(&opts("iops_slope:50%"), &[100]));
        assert!(holds_steady(&opts("iops:1%"), &[100]));
    }

    #[test]
    fn options_parse_as_fio_reads_them() {
        let o = opts("bw:1m");
        assert!(!o.iops && !o.slope && !o.pct && o.limit == 1048576.0);
        let mut o = SsOptions::default();
        assert!(apply(&mut o, "ss", Some("iops"), 3).is_err());
        assert!(apply(&mut o, "ss", Some("lat:1%"), 3).is_err());
        apply(&mut o, "ss_dur", Some("1500ms"), 4).unwrap();
        assert_eq!(o.dur, 1, "fio keeps whole seconds");
        apply(&mut o, "ss_ramp", Some("10"), 5).unwrap();
        assert_eq!(o.ramp_us, 10_000_000, "seconds by default");
        assert_eq!(o.line, 4);
    }

    /// fio's rule: one reporting group, one detection; `ss` without `ss_dur` is none.
    #[test]
    fn a_group_detects_alike() {
        let p = |t: &str| {
            crate::fio::parse(t, false)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert!(p("[a]\nsize=1m\nss=iops:5%\n[b]\nsize=1m\n").is_ok());
        let e = p("[a]\nsize=1m\nss_dur=5\n[b]\nsize=1m\n").unwrap_err();
        assert!(
            e.starts_with("line 4: job 'b'") && e.contains("consistent"),
            "{e}"
        );
        assert!(p("[a]\nsize=1m\nss_dur=5\n[b]\nsize=1m\nstonewall\n").is_ok());
    }

    /// A clone at 1,000 I/Os a second from time 0: with a 1 s ramp the first sample is at
    /// 3 s (the start counts as just after the tick at 0, so 2 s since it is not yet "at
    /// least ramp + 1 s"), and 3 samples are full at 5 s.
    #[test]
    fn ticks_sample_after_the_ramp_and_stop_when_full() {
        let mut o = opts("iops:10%");
        o.dur = 3;
        o.ramp_us = 1_000_000;
        let mut job = crate::fio::parse("[a]\nsize=1m\n", false).unwrap().jobs[0].clone();
        job.extra.ss = o;
        let mut m = Monitor::new(&[job], &[0]).unwrap();
        let running = |_| Some(0.0);
        let mut stop = Vec::new();
        for ms in 1..=6000u32 {
            stop.extend(m.ticks_until(0.0, f64::from(ms), &running));
            m.completed(0, Some(4096));
            if !stop.is_empty() {
                assert_eq!(stop, vec![(0, 5000.0)]);
                assert_eq!(m.units[0].samples, [(1000, 4_096_000); 3]);
                return;
            }
        }
        panic!("never steady");
    }
}
