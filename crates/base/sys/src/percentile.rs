//! The one percentile and the one median of the project.
//!
//! - [`percentile`] is the nearest-rank percentile (the smallest sample with at least p% of
//!   the samples at or below it): it reports a value that was observed, never one
//!   interpolated between two. It sorts a copy; [`nearest_rank`] is the same on a slice the
//!   caller sorted (no copy, any `Copy` type).
//! - [`median`] is the usual median for summaries: the middle value, or the mean of the two
//!   middle values when the count is even. It sorts a copy.
//!
//! Empty input gives `None`: each caller says what it reports then (`.unwrap_or(0.0)`,
//! `.unwrap_or(f64::NAN)`, ...). NaN is never a sample: a failed measurement has no rank.
//! Both functions ignore NaN values; [`median`] also ignores infinities (the mean of two
//! middle values must be a number), [`percentile`] ranks them (an infinite latency is the
//! slowest sample). `p` outside 0..=100 is clamped; a NaN `p` gives `None`.

/// Nearest-rank percentile (`p` in 0..=100, clamped) of an ascending-sorted slice; `None` when
/// empty or `p` is NaN.
pub fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() || p.is_nan() {
        return None;
    }
    let p = p.clamp(0.0, 100.0);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Nearest-rank percentile (`p` in 0..=100, clamped) of unsorted values: sorts a copy,
/// ignores NaN values; `None` when no value is left or `p` is NaN.
pub fn percentile(xs: &[f64], p: f64) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    nearest_rank(&v, p)
}

/// Median of the finite values (NaN and infinities ignored): the middle one, or the mean of
/// the two middle ones for an even count; sorts a copy. `None` when there is no finite value.
pub fn median(xs: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Spread of repeated measurements, in percent of their median: (max - min) / median × 100.
/// `None` for fewer than two finite values or a zero median.
pub fn spread_pct(xs: &[f64]) -> Option<f64> {
    let v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.len() < 2 {
        return None;
    }
    let med = median(&v)?;
    if med == 0.0 {
        return None;
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((hi - lo) / med.abs() * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_picks_observed_values() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 50.0), Some(50));
        assert_eq!(nearest_rank(&v, 99.0), Some(99));
        assert_eq!(nearest_rank(&v, 99.5), Some(100));
        assert_eq!(nearest_rank(&v, 0.0), Some(1));
        assert_eq!(nearest_rank(&v, 250.0), Some(100));
        assert_eq!(nearest_rank::<u32>(&[], 50.0), None);
        assert_eq!(nearest_rank(&v, f64::NAN), None);
        assert_eq!(percentile(&[3.0, f64::NAN, 1.0, 2.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[f64::NAN], 50.0), None);
    }

    #[test]
    fn spread_and_the_middle_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, f64::INFINITY]), None);
        assert_eq!(spread_pct(&[90.0, 100.0, 110.0]), Some(20.0));
        assert_eq!(spread_pct(&[100.0]), None);
        assert_eq!(spread_pct(&[0.0, 0.0]), None);
    }

    #[test]
    fn empty_input_is_none_and_each_caller_chooses() {
        assert_eq!(median(&[]), None);
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(median(&[]).unwrap_or(0.0), 0.0);
        assert!(median(&[]).unwrap_or(f64::NAN).is_nan());
        assert_eq!(spread_pct(&[]), None);
    }

    #[test]
    fn nan_is_not_a_sample() {
        let nan = f64::NAN;
        assert_eq!(median(&[nan, 5.0, nan, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[nan, nan]), None);
        assert_eq!(
            median(&[1.0, f64::INFINITY, 3.0]),
            Some(2.0),
            "infinity ignored"
        );
        assert_eq!(percentile(&[nan, 5.0, 1.0, 3.0], 100.0), Some(5.0));
        assert_eq!(
            percentile(&[1.0, f64::INFINITY], 100.0),
            Some(f64::INFINITY)
        );
        assert_eq!(percentile(&[1.0, 2.0], nan), None);
        assert_eq!(spread_pct(&[nan, 90.0, 110.0]), Some(20.0));
    }

    #[test]
    fn percentile_does_not_reorder_its_input_and_median_of_one_is_it() {
        let xs = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&xs, 50.0), Some(3.0));
        assert_eq!(percentile(&xs, 20.0), Some(1.0));
        assert_eq!(percentile(&xs, 21.0), Some(2.0));
        assert_eq!(xs, [5.0, 1.0, 4.0, 2.0, 3.0]);
        assert_eq!(median(&[7.0]), Some(7.0));
        // The nearest-rank median of an even count is the lower middle; median is the mean.
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), Some(2.0));
        assert_eq!(median(&[1.0, 2.0, 3.0, 4.0]), Some(2.5));
    }
}
