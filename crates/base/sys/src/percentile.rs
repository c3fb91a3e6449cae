//! Nearest-rank percentiles and medians.
//!
//! Nearest rank (the smallest sample with at least p% of the samples at or below it) reports a
//! value that was observed, never one interpolated between two; [`median_mean_of_middle`] is
//! the usual median for summaries (the mean of the two middle values when the count is even).

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

/// Nearest-rank percentile of unsorted values (sorts a copy, ignores NaN); `None` when no value.
pub fn percentile(xs: &[f64], p: f64) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    nearest_rank(&v, p)
}

/// Median of finite values: the middle one, or the mean of the two middle ones for an even
/// count; `None` when there is no finite value.
pub fn median_mean_of_middle(xs: &[f64]) -> Option<f64> {
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
    let med = median_mean_of_middle(&v)?;
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
    fn medians_and_spread() {
        assert_eq!(median_mean_of_middle(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median_mean_of_middle(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median_mean_of_middle(&[f64::NAN, f64::INFINITY]), None);
        assert_eq!(spread_pct(&[90.0, 100.0, 110.0]), Some(20.0));
        assert_eq!(spread_pct(&[100.0]), None);
        assert_eq!(spread_pct(&[0.0, 0.0]), None);
    }
}
