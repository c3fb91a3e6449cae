//! Response times as DiskSim reports them (`IOdriver Response time ...` in its `.outv`): the
//! average, standard deviation, maximum and the distribution in the buckets of DiskSim's
//! `statdefs` ("Response time": `< 5  < 10  < 20  < 40  < 60  < 90  <120  <150  <200  200+`
//! ms), and a demerit between two such distributions.

/// Upper bounds (ms) of DiskSim's response-time buckets; the last bucket is open.
pub const BUCKETS_MS: [f64; 9] = [5.0, 10.0, 20.0, 40.0, 60.0, 90.0, 120.0, 150.0, 200.0];

/// Response-time figures in DiskSim's terms.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ResponseStats {
    pub count: u64,
    pub sum: f64,
    pub sum_sq: f64,
    pub max: f64,
    /// Requests per bucket of [`BUCKETS_MS`] (10: the last is `200+`).
    pub buckets: [u64; 10],
}

impl ResponseStats {
    pub fn add(&mut self, ms: f64) {
        self.count += 1;
        self.sum += ms;
        self.sum_sq += ms * ms;
        self.max = self.max.max(ms);
        let i = BUCKETS_MS.iter().position(|&b| ms < b).unwrap_or(9);
        self.buckets[i] += 1;
    }
    pub fn mean(&self) -> f64 {
        self.sum / self.count.max(1) as f64
    }
    /// The sample standard deviation (DiskSim's `std.dev.`).
    pub fn std_dev(&self) -> f64 {
        if self.count < 2 {
            return 0.0;
        }
        let n = self.count as f64;
        ((self.sum_sq - self.sum * self.sum / n) / (n - 1.0))
            .max(0.0)
            .sqrt()
    }
    /// The lines DiskSim prints for its IOdriver (`prefix` = "IOdriver").
    pub fn disksim_lines(&self, prefix: &str) -> String {
        let mut s = format!(
            "{prefix} Response time average: \t{:.6}\n{prefix} Response time std.dev.:\t{:.6}\n{prefix} Response time maximum:\t{:.6}\n{prefix} Response time distribution\n",
            self.mean(),
            self.std_dev(),
            self.max
        );
        s += "   <  5    < 10    < 20    < 40    < 60    < 90    <120    <150    <200    200+\n";
        for b in self.buckets {
            s += &format!(" {b:>7}");
        }
        s + "\n"
    }
}

/// The demerit (ms) of distribution `a` against `b`, from their buckets alone: the RMS
/// difference of their quantiles at 1,000 evenly spaced fractions, each quantile
/// interpolated linearly inside its bucket (the open bucket up to `max_a`, `max_b`). Only an
/// estimate of the Ruemmler-Wilkes demerit on the requests themselves: DiskSim prints only
/// the buckets.
pub fn bucket_demerit(a: &[u64; 10], max_a: f64, b: &[u64; 10], max_b: f64) -> f64 {
    let (na, nb) = (a.iter().sum::<u64>(), b.iter().sum::<u64>());
    if na == 0 || nb == 0 {
        return f64::NAN;
    }
    let points = 1000;
    let mut sum = 0.0;
    for i in 0..points {
        let p = (i as f64 + 0.5) / points as f64;
        let d = quantile(a, na, max_a, p) - quantile(b, nb, max_b, p);
        sum += d * d;
    }
    (sum / points as f64).sqrt()
}

fn quantile(buckets: &[u64; 10], n: u64, max: f64, p: f64) -> f64 {
    let target = p * n as f64;
    let mut below = 0.0;
    for (i, &k) in buckets.iter().enumerate() {
        let k = k as f64;
        if k > 0.0 && below + k >= target {
            let lo = if i == 0 { 0.0 } else { BUCKETS_MS[i - 1] };
            let hi = if i < 9 { BUCKETS_MS[i] } else { max.max(lo) };
            return lo + (hi - lo) * (target - below) / k;
        }
        below += k;
    }
    max
}

/// DiskSim's `IOdriver Response time` figures read back from a `.outv` text: (average,
/// maximum, buckets).
pub fn parse_outv(text: &str) -> Option<(f64, f64, [u64; 10])> {
    let mut lines = text.lines();
    let mut avg = None;
    let mut max = None;
    while let Some(l) = lines.next() {
        let value = |l: &str| l.rsplit(':').next()?.trim().parse::<f64>().ok();
        if l.starts_with("IOdriver Response time average:") {
            avg = value(l);
        } else if l.starts_with("IOdriver Response time maximum:") {
            max = value(l);
        } else if l.starts_with("IOdriver Response time distribution") {
            lines.next()?;
            let counts: Vec<u64> = lines
                .next()?
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            let buckets: [u64; 10] = counts.try_into().ok()?;
            return Some((avg?, max?, buckets));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_lines_are_disksims() {
        let mut s = ResponseStats::default();
        for ms in [1.0, 4.99, 5.0, 12.0, 250.0] {
            s.add(ms);
        }
        assert_eq!(s.buckets, [2, 1, 1, 0, 0, 0, 0, 0, 0, 1]);
        let text = s.disksim_lines("IOdriver");
        let (avg, max, b) = parse_outv(&text).unwrap();
        assert!((avg - s.mean()).abs() < 1e-6 && max == 250.0 && b == s.buckets);
    }

    #[test]
    fn the_bucket_demerit_is_zero_for_equal_and_grows_with_a_shift() {
        let a = [10, 10, 0, 0, 0, 0, 0, 0, 0, 0];
        let b = [0, 10, 10, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(bucket_demerit(&a, 9.0, &a, 9.0), 0.0);
        let d = bucket_demerit(&a, 9.0, &b, 19.0);
        assert!(d > 4.0 && d < 8.0, "{d}");
    }
}
