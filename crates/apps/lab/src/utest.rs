//! The Mann-Whitney U test (Wilcoxon rank-sum), two-sided, as benchstat uses it to say
//! whether two sets of repeats differ by more than their noise: exact for small samples
//! (every split of the pooled values enumerated, so ties are exact too), the normal
//! approximation with tie correction for larger ones.

/// Samples up to this many values in all get the exact test (2^16 splits at most).
const EXACT_MAX: usize = 16;

/// U of `a` against `b`: pairs (x in a, y in b) with x > y, ties counting half.
fn u_statistic(a: &[f64], b: &[f64]) -> f64 {
    let mut u = 0.0;
    for &x in a {
        for &y in b {
            u += match x.total_cmp(&y) {
                std::cmp::Ordering::Greater => 1.0,
                std::cmp::Ordering::Equal => 0.5,
                std::cmp::Ordering::Less => 0.0,
            };
        }
    }
    u
}

/// The two-sided p-value that `a` and `b` come from one distribution; None when either is
/// empty or a value is not finite.
pub fn p_value(a: &[f64], b: &[f64]) -> Option<f64> {
    let (m, n) = (a.len(), b.len());
    if m == 0 || n == 0 || a.iter().chain(b).any(|v| !v.is_finite()) {
        return None;
    }
    let centre = (m * n) as f64 / 2.0;
    let observed = (u_statistic(a, b) - centre).abs();
    if m + n <= EXACT_MAX {
        let pooled: Vec<f64> = a.iter().chain(b).copied().collect();
        let (mut extreme, mut total) = (0u64, 0u64);
        let mut x = Vec::with_capacity(m);
        let mut y = Vec::with_capacity(n);
        for mask in 0u32..(1 << (m + n)) {
            if mask.count_ones() as usize != m {
                continue;
            }
            x.clear();
            y.clear();
            for (i, &v) in pooled.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    x.push(v);
                } else {
                    y.push(v);
                }
            }
            total += 1;
            // A small tolerance: U moves in halves, so this only absorbs rounding.
            if (u_statistic(&x, &y) - centre).abs() >= observed - 1e-9 {
                extreme += 1;
            }
        }
        return Some(extreme as f64 / total as f64);
    }
    // Normal approximation with the tie correction of the variance.
    let mut pooled: Vec<f64> = a.iter().chain(b).copied().collect();
    pooled.sort_by(f64::total_cmp);
    let mut ties = 0.0;
    let mut i = 0;
    while i < pooled.len() {
        let j = pooled[i..].iter().take_while(|&&v| v == pooled[i]).count();
        let t = j as f64;
        ties += t * t * t - t;
        i += j;
    }
    let (mf, nf) = (m as f64, n as f64);
    let big_n = mf + nf;
    let var = mf * nf / 12.0 * ((big_n + 1.0) - ties / (big_n * (big_n - 1.0)));
    if var <= 0.0 {
        return Some(1.0);
    }
    // Continuity correction.
    let z = ((observed - 0.5).max(0.0)) / var.sqrt();
    Some((2.0 * normal_sf(z)).min(1.0))
}

/// The smallest p-value samples of these sizes can give (all of one below all of the
/// other, no ties): when it is above the threshold, no difference can be significant.
pub fn min_p_value(m: usize, n: usize) -> f64 {
    if m == 0 || n == 0 {
        return 1.0;
    }
    // 2 / C(m + n, m).
    let mut c = 1.0f64;
    for k in 0..m.min(n) {
        c = c * (m + n - k) as f64 / (k + 1) as f64;
    }
    (2.0 / c).min(1.0)
}

/// P(Z > z) for a standard normal Z (Abramowitz and Stegun 7.1.26 through erfc; error
/// below 1.5e-7, far finer than a significance threshold needs).
fn normal_sf(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erfc = poly * (-x * x).exp();
    let erfc = if x >= 0.0 { erfc } else { 2.0 - erfc };
    erfc / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separated_samples_reach_the_smallest_p() {
        let a = [1.0, 2.0, 3.0, 4.0];
        let b = [5.0, 6.0, 7.0, 8.0];
        let p = p_value(&a, &b).unwrap();
        assert!((p - 2.0 / 70.0).abs() < 1e-12, "{p}");
        assert!((min_p_value(4, 4) - 2.0 / 70.0).abs() < 1e-12);
        // Three against three can never be significant at 5%.
        assert!((min_p_value(3, 3) - 0.1).abs() < 1e-12);
        assert_eq!(min_p_value(0, 3), 1.0);
    }

    #[test]
    fn identical_samples_give_one() {
        let a = [3.0, 1.0, 2.0, 2.0, 5.0];
        assert_eq!(p_value(&a, &a).unwrap(), 1.0);
        assert_eq!(p_value(&[1.0; 3], &[1.0; 3]).unwrap(), 1.0);
        assert!(p_value(&[], &a).is_none());
        assert!(p_value(&[f64::NAN], &a).is_none());
    }

    /// Textbook cases: for sizes 4 and 5 the U distribution has P(U <= 2) = 4/126 and
    /// 126 splits in all (tables of the Mann-Whitney U).
    #[test]
    fn matches_the_exact_distribution() {
        // U(a > b) = 0 + 0 + 1 + 1 = 2: two-sided 8/126.
        let a = [1.0, 2.0, 3.0, 6.0];
        let b = [4.0, 5.0, 7.0, 8.0, 9.0];
        let p = p_value(&a, &b).unwrap();
        assert!((p - 8.0 / 126.0).abs() < 1e-12, "{p}");
        // Sides swapped: the same p.
        assert_eq!(p_value(&b, &a).unwrap(), p);
        // U = 6, 4 from the centre 10: 52 of the 126 splits are as far (counted by an
        // independent enumeration of the splits).
        let a = [1.0, 2.0, 4.0, 9.0];
        let b = [3.0, 5.0, 6.0, 7.0, 8.0];
        let p = p_value(&a, &b).unwrap();
        assert!((p - 52.0 / 126.0).abs() < 1e-12, "{p}");
    }

    /// Large samples go through the normal approximation, which agrees with the exact
    /// p-value to a few percent where both apply.
    #[test]
    fn the_approximation_follows_the_exact_test() {
        let a: Vec<f64> = (0..10).map(|i| i as f64).collect();
        let b: Vec<f64> = (0..10).map(|i| i as f64 + 6.5).collect();
        let approx = p_value(&a, &b).unwrap();
        assert!(approx < 0.01 && approx > 0.0005, "{approx}");
        let far: Vec<f64> = (0..10).map(|i| i as f64 + 100.0).collect();
        assert!(p_value(&a, &far).unwrap() < 0.001);
        assert!(p_value(&a, &a).unwrap() > 0.9);
        assert!((normal_sf(0.0) - 0.5).abs() < 1e-7);
        assert!((normal_sf(1.959_964) - 0.025).abs() < 1e-6);
    }
}
