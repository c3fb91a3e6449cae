//! Steady-state filtering, as in seed 000 §1.5: a mean response time only means something
//! for the requests made while the load actually reached was the load asked for.
//!
//! The achieved concurrency at an instant is the number of requests the client had in
//! flight then (from its per-request log), not counting requests stalled in a SYN
//! retransmit: a request whose SYN was dropped (listen backlog full) waits a whole
//! retransmission timeout (1 s on Linux) before the server even sees it, so during that
//! time it adds nothing to the load. The client's own turnaround between a finished request
//! and its replacement (see [`bridge_for`]) is bridged: it is client time, not a lighter
//! load on the server. The server's counters (open connections, sampled
//! during the run) are used as a cross-check: a server holding more connections than the
//! requested concurrency (+ tolerance) is holding ones the client already gave up on, and
//! requests made then are left out too.
//!
//! A request is kept for the means when: it succeeded, it was not SYN-retried, and at its
//! start the achieved concurrency was within the tolerance of the requested one.

use iolab_load::{ErrorKind, RequestRecord};
use iolab_sys::percentile::nearest_rank;

/// Connect phases this long or longer are SYN-retransmit artefacts: on loopback a connect
/// takes microseconds unless the SYN was dropped and re-sent after the 1 s initial RTO.
pub const SYN_RETRY_CONNECT_US: u64 = 900_000;

/// The closed-loop client's turnaround between one request's end and its replacement's
/// start is client time, not a drop in the load: gaps up to this long are bridged at
/// least. A SYN retransmit is not affected: a stalled request counts from its connect.
pub const BRIDGE_US: u64 = 10_000;
/// At most this long (a client busy reading large responses turns around slowly).
pub const BRIDGE_MAX_US: u64 = 500_000;

/// The turnaround bridged for a run: half the median response time, within
/// [`BRIDGE_US`]..[`BRIDGE_MAX_US`] (a client's turnaround grows with the work per response).
pub fn bridge_for(records: &[RequestRecord]) -> u64 {
    let mut d: Vec<u64> = records
        .iter()
        .filter(|r| r.error.is_none())
        .map(|r| r.end_us.saturating_sub(r.start_us))
        .collect();
    if d.is_empty() {
        return BRIDGE_US;
    }
    let mid = d.len() / 2;
    let (_, m, _) = d.select_nth_unstable(mid);
    (*m / 2).clamp(BRIDGE_US, BRIDGE_MAX_US)
}

/// Default tolerance around the requested concurrency (10%).
pub const DEFAULT_TOLERANCE: f64 = 0.10;

/// Whether the request waited for a SYN retransmit before connecting (or never connected
/// after waiting that long).
pub fn is_syn_retry(r: &RequestRecord) -> bool {
    match r.connected_us {
        Some(c) => c.saturating_sub(r.start_us) >= SYN_RETRY_CONNECT_US,
        None => r.error.is_some() && r.end_us.saturating_sub(r.start_us) >= SYN_RETRY_CONNECT_US,
    }
}

/// When the request starts to count as load on the server.
fn effective_start(r: &RequestRecord) -> u64 {
    if is_syn_retry(r) {
        r.connected_us.unwrap_or(r.end_us).max(r.start_us)
    } else {
        r.start_us
    }
}

/// A step function of time (µs) -> level, built from the client log.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// (time µs, level from that time on), times strictly increasing.
    pub steps: Vec<(u64, u64)>,
}

impl Timeline {
    /// Effective requests in flight over time, client turnarounds bridged ([`bridge_for`]).
    pub fn from_records(records: &[RequestRecord]) -> Timeline {
        Timeline::bridged(records, bridge_for(records))
    }

    /// Effective requests in flight over time. An end followed within `bridge_us` by a
    /// start is the closed-loop client replacing a finished request: the level does not
    /// dip in between. Each start is matched to the most recent unmatched end in its
    /// window, so a client that stays idle longer leaves its end unmatched and the level
    /// drops at that end (matching the oldest end instead would let idle clients borrow
    /// other clients' replacements and hide the drop).
    pub fn bridged(records: &[RequestRecord], bridge_us: u64) -> Timeline {
        // (time, 0 = end / 1 = start): ends first at the same instant.
        let mut sweep: Vec<(u64, u8)> = Vec::with_capacity(records.len() * 2);
        for r in records {
            let s = effective_start(r);
            let e = r.end_us.max(s);
            if e > s {
                sweep.push((s, 1));
                sweep.push((e, 0));
            }
        }
        sweep.sort_unstable();
        let mut ev: Vec<(u64, i64)> = Vec::with_capacity(sweep.len());
        // Unmatched ends, most recent on top; they count as -1 at their own time.
        let mut pending: Vec<u64> = Vec::new();
        for &(t, kind) in &sweep {
            if kind == 0 {
                pending.push(t);
                continue;
            }
            match pending.last() {
                Some(&e) if e.saturating_add(bridge_us) >= t => {
                    pending.pop();
                }
                _ => ev.push((t, 1)),
            }
            // Ends too old to be bridged any more are final.
            if pending
                .first()
                .is_some_and(|&e| e.saturating_add(bridge_us) < t)
            {
                let cut = pending.partition_point(|&e| e.saturating_add(bridge_us) < t);
                ev.extend(pending.drain(..cut).map(|e| (e, -1)));
            }
        }
        ev.extend(pending.into_iter().map(|e| (e, -1)));
        // Ends before starts at the same instant, so the level never flickers to N+1.
        ev.sort_unstable();
        let mut steps: Vec<(u64, u64)> = Vec::new();
        let mut level: i64 = 0;
        for (t, d) in ev {
            level += d;
            let l = level.max(0) as u64;
            match steps.last_mut() {
                Some(last) if last.0 == t => last.1 = l,
                _ => steps.push((t, l)),
            }
        }
        Timeline { steps }
    }

    /// Level at time `t` (after every event at `t`).
    pub fn at(&self, t: u64) -> u64 {
        match self.steps.partition_point(|s| s.0 <= t) {
            0 => 0,
            i => self.steps[i - 1].1,
        }
    }

    /// Time-weighted mean level over `[a, b)`.
    pub fn mean_over(&self, a: u64, b: u64) -> f64 {
        if b <= a {
            return self.at(a) as f64;
        }
        let mut sum = 0.0;
        let mut t = a;
        let mut level = self.at(a);
        let start = self.steps.partition_point(|s| s.0 <= a);
        for &(st, l) in &self.steps[start..] {
            if st >= b {
                break;
            }
            sum += level as f64 * (st - t) as f64;
            t = st;
            level = l;
        }
        sum += level as f64 * (b - t) as f64;
        sum / (b - a) as f64
    }

    /// At most `max` (time s, level) points for plotting, keeping the steps' shape.
    pub fn downsample(&self, max: usize) -> Vec<(f64, f64)> {
        let n = self.steps.len();
        let stride = n.div_ceil(max.max(1)).max(1);
        let mut out: Vec<(f64, f64)> = self
            .steps
            .iter()
            .step_by(stride)
            .map(|&(t, l)| (t as f64 / 1e6, l as f64))
            .collect();
        if let Some(&(t, l)) = self.steps.last() {
            if n > 1 && (n - 1) % stride != 0 {
                out.push((t as f64 / 1e6, l as f64));
            }
        }
        out
    }
}

/// Server-side samples: (µs since the run started, open connections).
pub type ServerSamples = [(u64, u64)];

/// Nearest preceding server sample at `t`.
fn server_at(samples: &ServerSamples, t: u64) -> Option<u64> {
    match samples.partition_point(|s| s.0 <= t) {
        0 => samples.first().map(|s| s.1),
        i => Some(samples[i - 1].1),
    }
}

/// What the filter concludes about one run of one point.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Analysis {
    pub requests: u64,
    pub ok: u64,
    /// Failed requests (still-in-flight ones at a deadline are `unfinished`, not errors).
    pub errors: u64,
    pub unfinished: u64,
    pub syn_retries: u64,
    pub kept: u64,
    /// Over the kept requests; over every successful non-SYN-retried one when none was kept
    /// (then `steady` is false); 0 when nothing succeeded.
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub steady: bool,
    /// Time-weighted mean of the achieved concurrency from when the requested level was
    /// first reached (or the first start) to the last start.
    pub achieved_concurrency: f64,
    pub server_concurrency_mean: Option<f64>,
    pub server_concurrency_max: Option<u64>,
    /// Per record (same order as the input): kept for the means.
    pub kept_mask: Vec<bool>,
}

fn duration_ms(r: &RequestRecord) -> f64 {
    r.end_us.saturating_sub(r.start_us) as f64 / 1000.0
}

/// Applies the steady-state filter to one run at `requested` concurrency.
pub fn analyse(
    records: &[RequestRecord],
    requested: usize,
    server: Option<&ServerSamples>,
    tolerance: f64,
) -> Analysis {
    let n = requested.max(1) as f64;
    let lo = n * (1.0 - tolerance);
    let hi = n * (1.0 + tolerance);
    let tl = Timeline::from_records(records);
    let mut a = Analysis {
        requests: records.len() as u64,
        ..Analysis::default()
    };
    let mut kept = Vec::new();
    let mut fallback = Vec::new();
    a.kept_mask = Vec::with_capacity(records.len());
    for r in records {
        let syn = is_syn_retry(r);
        if syn {
            a.syn_retries += 1;
        }
        if r.error == Some(ErrorKind::Unfinished) {
            a.unfinished += 1;
            a.kept_mask.push(false);
            continue;
        }
        if r.error.is_some() {
            a.errors += 1;
            a.kept_mask.push(false);
            continue;
        }
        a.ok += 1;
        if syn {
            a.kept_mask.push(false);
            continue;
        }
        let d = duration_ms(r);
        fallback.push(d);
        let level = tl.at(r.start_us) as f64;
        let server_ok = match server.and_then(|s| server_at(s, r.start_us)) {
            // A few connections of slack: at low levels the previous point's last
            // connections may still be closing.
            Some(open) => (open as f64) <= hi.max(n + 4.0),
            None => true,
        };
        let keep = level >= lo && level <= hi && server_ok;
        a.kept_mask.push(keep);
        if keep {
            kept.push(d);
        }
    }
    a.kept = kept.len() as u64;
    a.steady = !kept.is_empty();
    let mut vals = if kept.is_empty() { fallback } else { kept };
    vals.sort_by(f64::total_cmp);
    if !vals.is_empty() {
        a.mean_ms = vals.iter().sum::<f64>() / vals.len() as f64;
        a.p50_ms = nearest_rank(&vals, 50.0).unwrap_or(0.0);
        a.p99_ms = nearest_rank(&vals, 99.0).unwrap_or(0.0);
    }
    // From the moment the requested level is first reached (the client's ramp-up is not
    // the server's doing) to the last start (after it the closed loop drains by design);
    // a level never reached is averaged over the whole issuing period.
    let first = records.iter().map(|r| r.start_us).min().unwrap_or(0);
    let last = records.iter().map(|r| r.start_us).max().unwrap_or(0);
    let reached = tl
        .steps
        .iter()
        .find(|s| s.1 as f64 >= lo)
        .map(|s| s.0)
        .filter(|&t| t < last)
        .unwrap_or(first);
    let (ma, mb) = (reached, last.max(reached));
    a.achieved_concurrency = tl.mean_over(ma, mb);
    if let Some(s) = server {
        let inside: Vec<u64> = s
            .iter()
            .filter(|x| x.0 >= ma && x.0 <= mb)
            .map(|x| x.1)
            .collect();
        let pool: Vec<u64> = if inside.is_empty() {
            s.iter().map(|x| x.1).collect()
        } else {
            inside
        };
        if !pool.is_empty() {
            a.server_concurrency_mean = Some(pool.iter().sum::<u64>() as f64 / pool.len() as f64);
            a.server_concurrency_max = s.iter().map(|x| x.1).max();
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(start: u64, connected: u64, end: u64, err: bool) -> RequestRecord {
        RequestRecord {
            scheduled_us: start,
            start_us: start,
            connected_us: if err { None } else { Some(connected) },
            first_byte_us: if err { None } else { Some(end) },
            end_us: end,
            status: if err { None } else { Some(200) },
            bytes: 300,
            error: if err { Some(ErrorKind::Reset) } else { None },
            conn_id: start,
        }
    }

    /// A closed loop of `c` clients, each doing `per` requests of `d` µs back to back.
    fn closed_loop(c: u64, per: u64, d: u64) -> Vec<RequestRecord> {
        let mut v = Vec::new();
        for k in 0..c {
            for i in 0..per {
                // Clients start staggered by 1 µs, as a real client's connects are.
                let s = k + i * d;
                v.push(rec(s, s + 10, s + d, false));
            }
        }
        v.sort_by_key(|r| r.start_us);
        v
    }

    #[test]
    fn syn_retry_detection() {
        assert!(!is_syn_retry(&rec(0, 500, 900, false)));
        assert!(is_syn_retry(&rec(0, 1_000_300, 1_000_900, false)));
        assert!(is_syn_retry(&rec(10, 3_000_010, 3_000_500, false)));
        let mut timed_out = rec(0, 0, 1_500_000, true);
        timed_out.error = Some(ErrorKind::Timeout);
        assert!(is_syn_retry(&timed_out));
        assert!(!is_syn_retry(&rec(0, 0, 2_000, true)));
    }

    #[test]
    fn timeline_counts_in_flight_without_flicker() {
        let recs = vec![
            rec(0, 1, 10, false),
            rec(10, 11, 20, false),
            rec(5, 6, 15, false),
        ];
        let tl = Timeline::from_records(&recs);
        assert_eq!(tl.at(0), 1);
        assert_eq!(tl.at(5), 2);
        // At 10 one ends and one starts: still 2, never 3.
        assert_eq!(tl.at(10), 2);
        assert!(tl.steps.iter().all(|s| s.1 <= 2));
        assert_eq!(tl.at(15), 1);
        assert_eq!(tl.at(20), 0);
        assert!((tl.mean_over(0, 20) - 1.5).abs() < 1e-9);
    }

    #[test]
    fn client_turnaround_is_bridged_but_long_gaps_are_not() {
        // One client, 1 ms requests, 0.5 ms between them (the client's own time).
        let recs: Vec<RequestRecord> = (0..10)
            .map(|i| rec(i * 1500, i * 1500 + 10, i * 1500 + 1000, false))
            .collect();
        let tl = Timeline::from_records(&recs);
        assert_eq!(tl.at(1200), 1, "bridged gap");
        assert!((tl.mean_over(0, 14_500) - 1.0).abs() < 1e-9);
        let raw = Timeline::bridged(&recs, 0);
        assert_eq!(raw.at(1200), 0);
        // A 50 ms pause is not client turnaround: the level drops.
        let mut gap = recs.clone();
        gap.push(rec(100_000, 100_010, 101_000, false));
        let tl = Timeline::from_records(&gap);
        assert_eq!(tl.at(50_000), 0);
        assert_eq!(tl.at(100_500), 1);
        let a = analyse(&recs, 1, None, DEFAULT_TOLERANCE);
        assert_eq!(a.kept, 10);
        assert!((a.achieved_concurrency - 1.0).abs() < 1e-9);
    }

    #[test]
    fn slow_ramp_up_is_not_held_against_the_server_but_later_dips_are() {
        // 10 clients starting 5 ms apart, then 1 ms requests back to back for 100 ms;
        // `pause(k, t)` leaves client k idle at time t.
        let run = |pause: &dyn Fn(u64, u64) -> bool| {
            let mut recs = Vec::new();
            for k in 0..10u64 {
                let mut t = k * 5000;
                while t < 100_000 {
                    if !pause(k, t) {
                        recs.push(rec(t, t + 10, t + 1000, false));
                    }
                    t += 1000;
                }
            }
            recs.sort_by_key(|r| r.start_us);
            analyse(&recs, 10, None, DEFAULT_TOLERANCE)
        };
        let a = run(&|_, _| false);
        assert!(a.achieved_concurrency > 9.5, "{}", a.achieved_concurrency);
        // Half the clients pause for 40 ms in the middle: the level is not sustained.
        let b = run(&|k, t| k % 2 == 0 && (50_000..90_000).contains(&t));
        assert!(b.achieved_concurrency < 9.0, "{}", b.achieved_concurrency);
        assert!(b.kept < a.kept);
    }

    #[test]
    fn bridge_grows_with_the_response_time() {
        assert_eq!(bridge_for(&[]), BRIDGE_US);
        let fast: Vec<RequestRecord> = (0..5)
            .map(|i| rec(i * 100, i * 100 + 1, i * 100 + 50, false))
            .collect();
        assert_eq!(bridge_for(&fast), BRIDGE_US);
        let slow: Vec<RequestRecord> = (0..5).map(|i| rec(i, i + 1, i + 200_000, false)).collect();
        assert_eq!(bridge_for(&slow), 100_000);
        let very: Vec<RequestRecord> = (0..5)
            .map(|i| rec(i, i + 1, i + 9_000_000, false))
            .collect();
        assert_eq!(bridge_for(&very), BRIDGE_MAX_US);
    }

    #[test]
    fn steady_closed_loop_keeps_nearly_everything() {
        let recs = closed_loop(10, 50, 1000);
        let a = analyse(&recs, 10, None, DEFAULT_TOLERANCE);
        assert_eq!(a.requests, 500);
        assert_eq!(a.errors, 0);
        assert!(a.steady);
        // Only the ramp-up (clients 1 µs apart) and none of the rest are dropped.
        assert!(a.kept >= 490, "kept {}", a.kept);
        assert!((a.mean_ms - 1.0).abs() < 1e-9);
        assert!(
            (a.achieved_concurrency - 10.0).abs() < 0.1,
            "{}",
            a.achieved_concurrency
        );
    }

    #[test]
    fn under_achieved_load_is_left_out() {
        // Asked for 10, but only 5 clients ever ran: nothing is steady.
        let recs = closed_loop(5, 20, 1000);
        let a = analyse(&recs, 10, None, DEFAULT_TOLERANCE);
        assert!(!a.steady);
        assert_eq!(a.kept, 0);
        // The means fall back to every successful request and say so.
        assert!((a.mean_ms - 1.0).abs() < 1e-9);
        assert!(a.achieved_concurrency < 5.5);
    }

    #[test]
    fn syn_retried_requests_are_counted_and_excluded() {
        let mut recs = closed_loop(4, 10, 1000);
        // One extra request whose SYN was dropped: 1 s in connect, then fast.
        recs.push(rec(100, 1_000_100, 1_000_600, false));
        recs.sort_by_key(|r| r.start_us);
        let a = analyse(&recs, 4, None, DEFAULT_TOLERANCE);
        assert_eq!(a.syn_retries, 1);
        assert_eq!(a.ok, 41);
        // The slow one must not drag the mean towards 1 s.
        assert!(a.mean_ms < 2.0, "mean {}", a.mean_ms);
        let idx = recs
            .iter()
            .position(|r| r.start_us == 100 && r.end_us == 1_000_600)
            .unwrap();
        assert!(!a.kept_mask[idx]);
        // While stalled it did not count as load: the other 4 stay steady at 4.
        assert!(a.kept >= 35);
    }

    #[test]
    fn errors_are_counted_not_averaged() {
        let mut recs = closed_loop(2, 10, 1000);
        recs.push(rec(3, 0, 5, true));
        recs.sort_by_key(|r| r.start_us);
        let a = analyse(&recs, 2, None, 0.5);
        assert_eq!(a.errors, 1);
        assert_eq!(a.ok, 20);
        assert_eq!(a.kept_mask.iter().filter(|k| **k).count() as u64, a.kept);
    }

    #[test]
    fn server_holding_abandoned_connections_excludes_requests() {
        let recs = closed_loop(10, 20, 1000);
        // The server reports 30 open connections during the second half.
        let samples: Vec<(u64, u64)> = (0..20)
            .map(|i| (i * 1000, if i < 10 { 10 } else { 30 }))
            .collect();
        let a = analyse(&recs, 10, Some(&samples), DEFAULT_TOLERANCE);
        let b = analyse(&recs, 10, None, DEFAULT_TOLERANCE);
        assert!(a.kept < b.kept);
        assert!(a.kept > 0);
        assert_eq!(a.server_concurrency_max, Some(30));
        assert!(a.server_concurrency_mean.unwrap() > 10.0);
    }

    #[test]
    fn unfinished_requests_are_neither_ok_nor_errors() {
        let mut recs = closed_loop(2, 5, 1000);
        let mut u = rec(6000, 6010, 7000, true);
        u.error = Some(ErrorKind::Unfinished);
        recs.push(u);
        let a = analyse(&recs, 2, None, DEFAULT_TOLERANCE);
        assert_eq!((a.ok, a.errors, a.unfinished, a.requests), (10, 0, 1, 11));
    }

    #[test]
    fn p50_and_p99_are_nearest_rank() {
        let percentile = |v: &[f64], q: f64| nearest_rank(v, q).unwrap_or(0.0);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn empty_input_is_harmless() {
        let a = analyse(&[], 1000, Some(&[]), DEFAULT_TOLERANCE);
        assert_eq!(a.requests, 0);
        assert!(!a.steady);
        assert_eq!(a.mean_ms, 0.0);
        assert!(Timeline::from_records(&[]).downsample(10).is_empty());
    }

    #[test]
    fn downsample_bounds_points_and_keeps_the_end() {
        let recs = closed_loop(3, 1000, 100);
        let tl = Timeline::from_records(&recs);
        let d = tl.downsample(50);
        assert!(d.len() <= 51);
        assert_eq!(d.last().unwrap().0, tl.steps.last().unwrap().0 as f64 / 1e6);
    }
}
