//! Small statistics helpers shared by the microbenchmarks: mean, nearest-rank percentiles,
//! and a summary of a sample set.

/// Arithmetic mean; `None` for an empty slice.
pub fn mean(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        None
    } else {
        Some(xs.iter().sum::<f64>() / xs.len() as f64)
    }
}

/// Nearest-rank percentile (`p` in 0..=100) of an ascending-sorted slice; `None` when empty.
pub use iolab_sys::percentile::nearest_rank as percentile_sorted;

/// Percentile of unsorted values (sorts a copy, ignores NaN); `None` when empty.
pub use iolab_sys::percentile::percentile;

/// Summary of a set of samples (e.g. round-trip times in nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Summary {
    pub count: usize,
    pub min: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
    pub mean: f64,
}

impl Summary {
    /// Summarises `samples` (sorted in place); `None` when there are none.
    pub fn of(samples: &mut [u64]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let sum: u128 = samples.iter().map(|&x| x as u128).sum();
        Some(Summary {
            count: samples.len(),
            min: samples[0],
            p50: percentile_sorted(samples, 50.0)?,
            p99: percentile_sorted(samples, 99.0)?,
            max: samples[samples.len() - 1],
            mean: sum as f64 / samples.len() as f64,
        })
    }
}

/// `part / whole` as a percentage, 0 when `whole` is 0.
pub fn share_pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// Rounds to `sig` significant digits (for readable JSON and tables).
pub fn round_sig(x: f64, sig: u32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let mag = x.abs().log10().floor() as i32;
    let scale = 10f64.powi(sig as i32 - 1 - mag);
    (x * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_median() {
        assert_eq!(mean(&[]), None);
        assert_eq!(mean(&[1.0, 2.0, 6.0]), Some(3.0));
        // The median as the nearest-rank 50th percentile: the lower middle of an even count.
        assert_eq!(percentile(&[5.0, 1.0, 3.0], 50.0), Some(3.0));
        assert_eq!(percentile(&[4.0, 1.0, 3.0, 2.0], 50.0), Some(2.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile_sorted(&v, 99.0), Some(99));
        assert_eq!(percentile_sorted(&v, 100.0), Some(100));
        assert_eq!(percentile_sorted(&v, 0.0), Some(1));
        assert_eq!(percentile_sorted(&v, 50.0), Some(50));
        assert_eq!(percentile_sorted(&v, 150.0), Some(100));
        assert_eq!(percentile_sorted(&v, f64::NAN), None);
        let empty: [u64; 0] = [];
        assert_eq!(percentile_sorted(&empty, 50.0), None);
        // A single outlier in 1000 samples does not move p99, two in 100 do.
        let mut w = vec![10u64; 1000];
        w[999] = 1_000_000;
        assert_eq!(percentile_sorted(&w, 99.0), Some(10));
        let mut x = vec![10u64; 100];
        x[98] = 500;
        x[99] = 500;
        x.sort_unstable();
        assert_eq!(percentile_sorted(&x, 99.0), Some(500));
    }

    #[test]
    fn percentile_ignores_nan() {
        assert_eq!(percentile(&[f64::NAN, 2.0, 1.0], 100.0), Some(2.0));
    }

    #[test]
    fn summary_of_samples() {
        let mut s = vec![5, 1, 4, 2, 3];
        let sum = Summary::of(&mut s).unwrap();
        assert_eq!((sum.count, sum.min, sum.p50, sum.max), (5, 1, 3, 5));
        assert_eq!(sum.p99, 5);
        assert!((sum.mean - 3.0).abs() < 1e-12);
        assert_eq!(Summary::of(&mut []), None);
    }

    #[test]
    fn shares_and_rounding() {
        assert_eq!(share_pct(1, 4), 25.0);
        assert_eq!(share_pct(3, 0), 0.0);
        assert_eq!(round_sig(1234.5678, 3), 1230.0);
        assert_eq!(round_sig(0.0012345, 2), 0.0012);
        assert_eq!(round_sig(0.0, 3), 0.0);
        assert_eq!(round_sig(-987.0, 1), -1000.0);
    }
}
