//! fio's queue-depth search for a latency target (`latency_target`, `latency_window`,
//! `latency_percentile`, `latency_run`; fio 3.33's `io_u.c`: `lat_target_init`,
//! `lat_target_check`, `lat_target_success`, `__lat_target_failed`, `queue_full`).
//!
//! A job with a target starts at queue depth 1 (its `iodepth` the ceiling). An I/O whose
//! total latency (submission to completion) exceeds the target fails; with the default
//! percentile, 100, one failure lowers the depth at once, and one at depth 1 ends the job
//! (fio's `lat_fatal`: "max latency exceeded"). Else, after each completion, once a window
//! has passed since the cycle began: if at least `latency_percentile` % of the window's
//! I/Os succeeded the depth doubles (or, after a failure, moves halfway to the lowest depth
//! that failed; three successes in a row one below it raise that bound by one), else it
//! moves halfway down to the highest that succeeded. Lowering the depth first waits for
//! every I/O in flight (`io_u_quiesce`), then a new cycle begins. When a success leaves the
//! depth as it was (without `latency_run`), fio waits for the I/O in flight, resets the
//! job's figures (`reset_all_stats`) and runs one more window at that depth: the job ends
//! after it, and its figures are those of that window.

use anyhow::{bail, Result};
use serde::Serialize;

use super::units::parse_time_ms;

/// The options this module reads.
pub(crate) const OPTIONS: &[&str] = &[
    "latency_target",
    "latency_window",
    "latency_percentile",
    "latency_run",
];

/// A job's latency-target options (`target_ms` 0: none).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LatOptions {
    pub target_ms: f64,
    pub window_ms: f64,
    pub percentile: f64,
    /// `latency_run`: keep searching instead of ending at a stable depth.
    pub run: bool,
    /// Line of the first of these options.
    pub line: usize,
}

impl Default for LatOptions {
    fn default() -> Self {
        LatOptions {
            target_ms: 0.0,
            window_ms: 0.0,
            percentile: 100.0,
            run: false,
            line: 0,
        }
    }
}

/// Sets option `k` if it is one of this module's; false if it is not.
pub(crate) fn apply(x: &mut LatOptions, k: &str, v: Option<&str>, n: usize) -> Result<bool> {
    let bad = |e: &str| anyhow::anyhow!("line {n}: {k}={}: {e}", v.unwrap_or(""));
    let val = || -> Result<&str> {
        v.filter(|v| !v.is_empty())
            .ok_or_else(|| anyhow::anyhow!("line {n}: {k} needs a value ({k}=...)"))
    };
    // (fio's time options without a unit count microseconds)
    let us = |s: &str| parse_time_ms(s, 0.001).map_err(|e| bad(&e));
    match k {
        "latency_target" => x.target_ms = us(val()?)?,
        "latency_window" => x.window_ms = us(val()?)?,
        "latency_percentile" => {
            let p: f64 = val()?
                .trim()
                .parse()
                .map_err(|_| bad("a percentage, 0..=100"))?;
            if !(0.0..=100.0).contains(&p) {
                return Err(bad("a percentage, 0..=100"));
            }
            x.percentile = p;
        }
        "latency_run" => {
            x.run = match v {
                None | Some("1") | Some("true") | Some("on") | Some("yes") => true,
                Some("0") | Some("false") | Some("off") | Some("no") => false,
                Some(_) => return Err(bad("expected 0 or 1")),
            }
        }
        _ => return Ok(false),
    }
    if x.line == 0 {
        x.line = n;
    }
    Ok(true)
}

/// What the simulator needs of a job with a target: fio restarts the search at every pass
/// (`do_io` calls `lat_target_init`) and resets each clone's figures at its own time; the
/// simulator's figures are per job.
pub(crate) fn check(x: &LatOptions, name: &str, numjobs: u64, passes: bool) -> Result<()> {
    if x.target_ms == 0.0 {
        return Ok(());
    }
    let l = x.line;
    if numjobs > 1 {
        bail!("line {l}: job '{name}': latency_target with numjobs > 1 is not modelled (fio resets each clone's figures when its search ends; the simulator's figures are per job)");
    }
    if passes {
        bail!("line {l}: job '{name}': latency_target with time_based or loops is not modelled (fio restarts the search at each pass over the file)");
    }
    Ok(())
}

/// What the search asks of the clone after a completion.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Step {
    /// Go on at the current depth.
    Go,
    /// Wait for the I/O in flight, then a new cycle (and, `reset`, new figures).
    Quiesce { reset: bool },
    /// The job ends: its search is over, or an I/O failed at depth 1 (`fatal`).
    End { fatal: bool },
}

/// One clone's search (fio's `latency_qd`, `_low`, `_high`, `latency_stable_count`...).
#[derive(Clone, Debug)]
pub(super) struct Search {
    pub qd: u64,
    low: u64,
    high: u64,
    iodepth: u64,
    stable: u32,
    end_run: bool,
    /// The cycle's start, ms, and the I/Os completed then and failed since.
    since: f64,
    ios_at: u64,
    ios: u64,
    failed: u64,
}

impl Search {
    /// fio's `lat_target_init` at the clone's start (`now`).
    pub(super) fn new(iodepth: u64, now: f64) -> Search {
        Search {
            qd: 1,
            low: 1,
            high: iodepth,
            iodepth,
            stable: 0,
            end_run: false,
            since: now,
            ios_at: 0,
            ios: 0,
            failed: 0,
        }
    }

    /// fio's `lat_new_cycle` at `now`.
    pub(super) fn new_cycle(&mut self, now: f64) {
        self.since = now;
        self.ios_at = self.ios;
        self.failed = 0;
    }

    /// A read or write completed at `now` after `latency_ms`; `quiescing`: while the clone
    /// waits for its I/O in flight (fio's `io_u_quiesce` reaps them without checking the
    /// window; a failure still counts, and at percentile 100 lowers the depth again).
    pub(super) fn completed(
        &mut self,
        o: &LatOptions,
        latency_ms: f64,
        now: f64,
        quiescing: bool,
    ) -> Step {
        self.ios += 1;
        // (fio compares whole nanoseconds)
        if (latency_ms * 1e6).round() > (o.target_ms * 1e6).round() {
            if o.percentile == 100.0 {
                if self.qd == 1 {
                    return Step::End { fatal: true };
                }
                self.ramp_down();
                return Step::Quiesce { reset: false };
            }
            self.failed += 1;
        }
        if quiescing || now - self.since < o.window_ms {
            return Step::Go;
        }
        let ios = self.ios - self.ios_at;
        let success = 100.0 * (ios - self.failed) as f64 / ios as f64;
        if success >= o.percentile {
            return self.success(o, now);
        }
        if self.qd == 1 {
            // (fio's __lat_target_failed at depth 1 changes nothing, not even the cycle)
            return Step::Go;
        }
        self.ramp_down();
        Step::Quiesce { reset: false }
    }

    /// fio's `__lat_target_failed` above depth 1 (the new cycle begins after the quiesce).
    fn ramp_down(&mut self) {
        self.high = self.qd;
        if self.qd == self.low {
            self.low -= 1;
        }
        self.qd = (self.qd + self.low) / 2;
        self.stable = 0;
    }

    /// fio's `lat_target_success`.
    fn success(&mut self, o: &LatOptions, now: f64) -> Step {
        let qd = self.qd;
        self.low = self.qd;
        if self.qd + 1 == self.high {
            self.stable += 1;
            if self.stable >= 3 {
                self.high += 1;
                self.stable = 0;
            }
        }
        self.qd = if self.high != self.iodepth {
            (self.qd + self.high) / 2
        } else {
            self.qd * 2
        }
        .min(self.iodepth);
        if !o.run && self.qd == qd {
            if self.end_run {
                return Step::End { fatal: false };
            }
            self.end_run = true;
            return Step::Quiesce { reset: true };
        }
        self.new_cycle(now);
        Step::Go
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(target_ms: f64, window_ms: f64, percentile: f64) -> LatOptions {
        LatOptions {
            target_ms,
            window_ms,
            percentile,
            ..Default::default()
        }
    }

    /// Always under the target: 1, 2, 4, ... 16, then 16 again: a final window, then the end.
    #[test]
    fn doubles_to_the_ceiling_then_one_final_window() {
        let o = opts(10.0, 100.0, 100.0);
        let mut s = Search::new(16, 0.0);
        let mut depths = vec![s.qd];
        let mut t = 0.0;
        loop {
            t += 1.0;
            match s.completed(&o, 1.0, t, false) {
                Step::Go if s.qd != *depths.last().unwrap() => depths.push(s.qd),
                Step::Go => {}
                Step::Quiesce { reset } => {
                    assert!(reset && s.qd == 16 && t == 500.0, "at {t}");
                    s.new_cycle(t);
                }
                Step::End { fatal } => {
                    assert!(!fatal);
                    assert_eq!(t, 600.0);
                    break;
                }
            }
        }
        assert_eq!(depths, [1, 2, 4, 8, 16]);
    }

    /// A failure at depth 8 (percentile 100) lowers the depth at once to halfway between 8
    /// and the last success (4): 6; at depth 1 it is fatal.
    #[test]
    fn a_failure_bisects_down_and_is_fatal_at_depth_one() {
        let o = opts(10.0, 100.0, 100.0);
        let mut s = Search::new(64, 0.0);
        for t in [100.0, 200.0, 300.0] {
            assert_eq!(s.completed(&o, 1.0, t, false), Step::Go);
        }
        assert_eq!(s.qd, 8);
        assert_eq!(
            s.completed(&o, 11.0, 301.0, false),
            Step::Quiesce { reset: false }
        );
        assert_eq!((s.qd, s.low, s.high), (6, 4, 8));
        let mut one = Search::new(64, 0.0);
        assert_eq!(
            one.completed(&o, 11.0, 1.0, false),
            Step::End { fatal: true }
        );
    }

    /// While the clone waits for its I/O in flight the window is not checked (fio's
    /// quiesce reaps without checking): the final window starts when the wait ends.
    #[test]
    fn no_window_check_while_quiescing() {
        let o = opts(10.0, 100.0, 100.0);
        let mut s = Search::new(1, 0.0);
        assert_eq!(
            s.completed(&o, 1.0, 100.0, false),
            Step::Quiesce { reset: true }
        );
        assert_eq!(s.completed(&o, 1.0, 150.0, true), Step::Go);
        s.new_cycle(150.0);
        assert_eq!(s.completed(&o, 1.0, 249.0, false), Step::Go);
        assert_eq!(
            s.completed(&o, 1.0, 250.0, false),
            Step::End { fatal: false }
        );
    }

    /// Below 100, failures are counted over the window: 1 in 10 is 90 % success.
    #[test]
    fn percentile_counts_the_window() {
        let mut s = Search::new(64, 0.0);
        let o = opts(10.0, 10.0, 90.0);
        for t in 1..10 {
            assert_eq!(s.completed(&o, 1.0, f64::from(t), false), Step::Go);
        }
        assert_eq!(s.completed(&o, 11.0, 10.0, false), Step::Go);
        assert_eq!(s.qd, 2, "90 % >= 90 %: up");
        let o = opts(10.0, 10.0, 95.0);
        let mut s = Search::new(64, 0.0);
        s.qd = 4;
        s.low = 2;
        for t in 1..10 {
            s.completed(&o, 1.0, f64::from(t), false);
        }
        assert_eq!(
            s.completed(&o, 11.0, 10.0, false),
            Step::Quiesce { reset: false }
        );
        assert_eq!(s.qd, 3);
    }
}
