//! Latency statistics, SYN-retransmit detection and the output formats (CSV log, JSON).

use std::io::Write;

use hdrhistogram::Histogram;

use crate::{ErrorKind, RequestRecord};

/// Highest latency the histograms hold (1 hour, in µs); longer values are clamped.
pub const MAX_LATENCY_US: u64 = 3_600_000_000;

/// A new latency histogram: 1 µs to 1 hour at 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

/// The value at quantile `q` (0..=1) in milliseconds; 0 for an empty histogram.
pub fn quantile_ms(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1000.0
    }
}

/// When a connect() completes after lost SYNs. Linux resends a SYN that got no answer after
/// the initial RTO of 1 s; the first `net.ipv4.tcp_syn_linear_timeouts` resends (4 by default
/// where the kernel has the setting, as 6.x kernels do) wait 1 s again, the later ones double
/// the wait. With 1, 2, ... SYNs lost, connect() completes at about 1, 2, 3, 4, 5, 7 s after the
/// first SYN by default, and at 1, 3, 7, 15, 31, 63 s without linear timeouts (older kernels;
/// the seed's Windows client showed the same step at 3 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynSchedule {
    steps_us: [u64; 6],
}

/// A connect time this far below a step still counts (timer slack is small)...
pub const SYN_EARLY_US: u64 = 20_000;
/// ...and this far above it (the retransmitted SYN still has to be answered by a busy server).
pub const SYN_LATE_US: u64 = 300_000;

impl SynSchedule {
    /// The schedule when `linear` resends wait the initial RTO before the wait doubles.
    pub fn with_linear_timeouts(linear: u32) -> SynSchedule {
        let mut steps_us = [0; 6];
        let (mut at, mut rto) = (0, 1_000_000);
        for (resend, step) in (1..).zip(steps_us.iter_mut()) {
            at += rto;
            *step = at;
            if resend > linear {
                rto *= 2;
            }
        }
        SynSchedule { steps_us }
    }

    /// The schedule of the caller's network namespace (none linear where the kernel does
    /// not have the setting).
    pub fn of_host() -> SynSchedule {
        let linear = iolab_sys::host::sysctl("net.ipv4.tcp_syn_linear_timeouts")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        SynSchedule::with_linear_timeouts(linear)
    }

    /// The connect times (µs) after which 1, 2, ... lost SYNs complete.
    pub fn steps_us(&self) -> &[u64; 6] {
        &self.steps_us
    }

    /// How many SYNs a connect that took `connect_us` most likely lost (0 = no artefact).
    pub fn retransmits(&self, connect_us: u64) -> u32 {
        for (lost, step) in (1..).zip(self.steps_us) {
            if connect_us + SYN_EARLY_US >= step && connect_us <= step + SYN_LATE_US {
                return lost;
            }
        }
        0
    }
}

/// One second of the run, by completion time.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SecondStats {
    /// Start of the second, seconds from the start of the run.
    pub second: u64,
    /// Requests that ended in this second (successes and failures).
    pub requests: u64,
    pub errors: u64,
    /// Mean latency of the successful ones (0 when none).
    pub mean_ms: f64,
}

/// Accumulates the per-second series.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    requests: Vec<u64>,
    errors: Vec<u64>,
    ok: Vec<u64>,
    latency_sum_us: Vec<u64>,
}

impl Timeline {
    pub fn add(&mut self, end_us: u64, latency_us: Option<u64>, error: bool) {
        let s = (end_us / 1_000_000) as usize;
        if s >= self.requests.len() {
            let n = s + 1;
            self.requests.resize(n, 0);
            self.errors.resize(n, 0);
            self.ok.resize(n, 0);
            self.latency_sum_us.resize(n, 0);
        }
        self.requests[s] += 1;
        if error {
            self.errors[s] += 1;
        }
        if let Some(l) = latency_us {
            self.ok[s] += 1;
            self.latency_sum_us[s] += l;
        }
    }

    /// `n` failed requests that ended at `end_us`.
    pub fn add_n(&mut self, end_us: u64, n: u64) {
        if n == 0 {
            return;
        }
        self.add(end_us, None, true);
        let s = (end_us / 1_000_000) as usize;
        self.requests[s] += n - 1;
        self.errors[s] += n - 1;
    }

    pub fn merge(&mut self, other: &Timeline) {
        if other.requests.len() > self.requests.len() {
            let n = other.requests.len();
            self.requests.resize(n, 0);
            self.errors.resize(n, 0);
            self.ok.resize(n, 0);
            self.latency_sum_us.resize(n, 0);
        }
        for i in 0..other.requests.len() {
            self.requests[i] += other.requests[i];
            self.errors[i] += other.errors[i];
            self.ok[i] += other.ok[i];
            self.latency_sum_us[i] += other.latency_sum_us[i];
        }
    }

    pub fn seconds(&self) -> Vec<SecondStats> {
        (0..self.requests.len())
            .map(|i| SecondStats {
                second: i as u64,
                requests: self.requests[i],
                errors: self.errors[i],
                mean_ms: if self.ok[i] == 0 {
                    0.0
                } else {
                    self.latency_sum_us[i] as f64 / self.ok[i] as f64 / 1000.0
                },
            })
            .collect()
    }
}

/// The CSV log's header line.
pub const CSV_HEADER: &str =
    "scheduled_us,start_us,connected_us,first_byte_us,end_us,status,bytes,error,conn_id";

/// Name of an error kind as written in the CSV log and the JSON report.
pub fn kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Refused => "refused",
        ErrorKind::Reset => "reset",
        ErrorKind::Timeout => "timeout",
        ErrorKind::PortExhaustion => "port_exhaustion",
        ErrorKind::Emfile => "emfile",
        ErrorKind::ShortResponse => "short_response",
        ErrorKind::Malformed => "malformed",
        ErrorKind::Non2xx => "non2xx",
        ErrorKind::Other => "other",
        ErrorKind::Unfinished => "unfinished",
    }
}

/// Parse a name written by [`kind_name`].
pub fn kind_from_name(name: &str) -> Option<ErrorKind> {
    ErrorKind::ALL
        .iter()
        .copied()
        .find(|k| kind_name(*k) == name)
}

/// Write records as CSV (header first; absent values are empty fields).
pub fn write_csv<W: Write>(mut w: W, records: &[RequestRecord]) -> std::io::Result<()> {
    writeln!(w, "{CSV_HEADER}")?;
    for r in records {
        write!(w, "{},{},", r.scheduled_us, r.start_us)?;
        write_opt(&mut w, r.connected_us)?;
        write_opt(&mut w, r.first_byte_us)?;
        write!(w, "{},", r.end_us)?;
        write_opt(&mut w, r.status.map(u64::from))?;
        writeln!(
            w,
            "{},{},{}",
            r.bytes,
            r.error.map(kind_name).unwrap_or(""),
            r.conn_id
        )?;
    }
    w.flush()
}

fn write_opt<W: Write>(w: &mut W, v: Option<u64>) -> std::io::Result<()> {
    match v {
        Some(v) => write!(w, "{v},"),
        None => write!(w, ","),
    }
}

/// Read a CSV log written by [`write_csv`] (the lab and the tests use it).
pub fn read_csv(text: &str) -> anyhow::Result<Vec<RequestRecord>> {
    let mut lines = text.lines();
    match lines.next() {
        Some(h) if h == CSV_HEADER => {}
        _ => anyhow::bail!("not an iolab load log: the first line must be `{CSV_HEADER}`"),
    }
    let mut out = Vec::new();
    for (i, line) in lines.enumerate() {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 9 {
            let shown: String = line.chars().take(80).collect();
            anyhow::bail!(
                "line {}: expected 9 fields, found {}: {shown:?}",
                i + 2,
                f.len()
            );
        }
        let num = |s: &str| -> anyhow::Result<u64> {
            s.parse()
                .map_err(|_| anyhow::anyhow!("line {}: bad number {s:?}", i + 2))
        };
        let opt = |s: &str| -> anyhow::Result<Option<u64>> {
            if s.is_empty() {
                Ok(None)
            } else {
                num(s).map(Some)
            }
        };
        out.push(RequestRecord {
            scheduled_us: num(f[0])?,
            start_us: num(f[1])?,
            connected_us: opt(f[2])?,
            first_byte_us: opt(f[3])?,
            end_us: num(f[4])?,
            status: opt(f[5])?
                .map(u16::try_from)
                .transpose()
                .map_err(|_| anyhow::anyhow!("line {}: bad status", i + 2))?,
            bytes: num(f[6])?,
            error: if f[7].is_empty() {
                None
            } else {
                Some(
                    kind_from_name(f[7])
                        .ok_or_else(|| anyhow::anyhow!("line {}: bad error {:?}", i + 2, f[7]))?,
                )
            },
            conn_id: num(f[8])?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_known_distribution() {
        let mut h = new_histogram();
        for v in 1..=10_000u64 {
            h.record(v * 100).unwrap(); // 0.1 ms .. 1000 ms
        }
        let close = |a: f64, b: f64| (a - b).abs() <= b * 0.002;
        assert!(
            close(quantile_ms(&h, 0.5), 500.0),
            "{}",
            quantile_ms(&h, 0.5)
        );
        assert!(
            close(quantile_ms(&h, 0.99), 990.0),
            "{}",
            quantile_ms(&h, 0.99)
        );
        assert!(close(quantile_ms(&h, 0.999), 999.0));
        assert!(close(quantile_ms(&h, 1.0), 1000.0));
        assert!(close(h.mean() / 1000.0, 500.05));
        assert_eq!(quantile_ms(&new_histogram(), 0.5), 0.0);
    }

    #[test]
    fn percentiles_with_outliers() {
        // 99 fast requests and one lost-SYN request: the median stays fast, p99.9 sees it.
        let mut h = new_histogram();
        for _ in 0..99 {
            h.record(2_000).unwrap();
        }
        h.record(1_003_000).unwrap();
        assert!((quantile_ms(&h, 0.5) - 2.0).abs() < 0.01);
        assert!((quantile_ms(&h, 0.99) - 2.0).abs() < 0.01);
        assert!((quantile_ms(&h, 0.999) - 1003.0).abs() < 1.0);
    }

    #[test]
    fn syn_artefacts() {
        // Exponential backoff from the first resend (kernels without linear timeouts).
        let exponential = SynSchedule::with_linear_timeouts(0);
        let syn_retransmits = |us| exponential.retransmits(us);
        assert_eq!(
            exponential.steps_us(),
            &[1_000_000, 3_000_000, 7_000_000, 15_000_000, 31_000_000, 63_000_000]
        );
        assert_eq!(syn_retransmits(0), 0);
        assert_eq!(syn_retransmits(150), 0);
        assert_eq!(syn_retransmits(500_000), 0);
        assert_eq!(syn_retransmits(985_000), 1);
        assert_eq!(syn_retransmits(1_000_300), 1);
        assert_eq!(syn_retransmits(1_250_000), 1);
        assert_eq!(syn_retransmits(1_400_000), 0);
        assert_eq!(syn_retransmits(2_000_000), 0);
        assert_eq!(syn_retransmits(3_010_000), 2);
        assert_eq!(syn_retransmits(7_100_000), 3);
        assert_eq!(syn_retransmits(15_000_000), 4);
        assert_eq!(syn_retransmits(10_000_000), 0);
    }

    #[test]
    fn syn_artefacts_with_linear_timeouts() {
        // Linux's default of 4 linear resends: 1 s apart, then the wait doubles.
        let linear = SynSchedule::with_linear_timeouts(4);
        assert_eq!(
            linear.steps_us(),
            &[1_000_000, 2_000_000, 3_000_000, 4_000_000, 5_000_000, 7_000_000]
        );
        assert_eq!(linear.retransmits(500_000), 0);
        assert_eq!(linear.retransmits(1_010_000), 1);
        assert_eq!(linear.retransmits(1_400_000), 0);
        assert_eq!(linear.retransmits(2_050_000), 2);
        assert_eq!(linear.retransmits(3_000_000), 3);
        assert_eq!(linear.retransmits(5_100_000), 5);
        assert_eq!(linear.retransmits(6_000_000), 0);
        assert_eq!(linear.retransmits(7_000_000), 6);
        assert_eq!(
            SynSchedule::with_linear_timeouts(1).steps_us()[..3],
            [1_000_000, 2_000_000, 4_000_000]
        );
    }

    #[test]
    fn timeline_buckets() {
        let mut t = Timeline::default();
        t.add(10, Some(1000), false);
        t.add(999_999, Some(3000), false);
        t.add(1_000_000, None, true);
        t.add(2_500_000, Some(500), false);
        let mut u = Timeline::default();
        u.add(2_000_001, None, true);
        u.add_n(2_000_002, 0);
        t.merge(&u);
        let s = t.seconds();
        assert_eq!(s.len(), 3);
        assert_eq!(
            s[0],
            SecondStats {
                second: 0,
                requests: 2,
                errors: 0,
                mean_ms: 2.0
            }
        );
        assert_eq!((s[1].requests, s[1].errors, s[1].mean_ms), (1, 1, 0.0));
        assert_eq!((s[2].requests, s[2].errors, s[2].mean_ms), (2, 1, 0.5));
    }

    #[test]
    fn csv_round_trip() {
        let recs = vec![
            RequestRecord {
                scheduled_us: 0,
                start_us: 5,
                connected_us: Some(40),
                first_byte_us: Some(90),
                end_us: 100,
                status: Some(200),
                bytes: 512,
                error: None,
                conn_id: 1,
            },
            RequestRecord {
                scheduled_us: 10,
                start_us: 11,
                connected_us: None,
                first_byte_us: None,
                end_us: 20,
                status: None,
                bytes: 0,
                error: Some(ErrorKind::PortExhaustion),
                conn_id: 2,
            },
        ];
        let mut out = Vec::new();
        write_csv(&mut out, &recs).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            format!("{CSV_HEADER}\n0,5,40,90,100,200,512,,1\n10,11,,,20,,0,port_exhaustion,2\n")
        );
        let back = read_csv(&text).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[1].error, Some(ErrorKind::PortExhaustion));
        assert_eq!(back[0].connected_us, Some(40));
        assert_eq!(back[0].status, Some(200));
        assert!(read_csv("a,b\n").is_err());
        assert!(read_csv(&format!("{CSV_HEADER}\n1,2,3\n")).is_err());
    }

    #[test]
    fn kind_names_round_trip_and_match_serde() {
        for k in ErrorKind::ALL {
            assert_eq!(kind_from_name(kind_name(k)), Some(k));
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", kind_name(k)));
        }
    }
}
