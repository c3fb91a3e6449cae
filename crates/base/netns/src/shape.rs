//! Link shaping with `tc`: tbf for a rate, netem for delay, loss and reordering.

use std::time::Duration;

/// How an interface's egress is shaped. Shaping acts on what leaves the interface, so a
/// symmetric link shapes both ends of the veth.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shape {
    /// Rate in bits per second (tbf). None: no rate limit.
    pub rate_bps: Option<u64>,
    /// Queue behind the rate limit in bytes (tbf `limit`). None: 1,000 full-size frames
    /// (1,514,000 bytes), what a NIC with the default txqueuelen 1000 would hold.
    pub queue_bytes: Option<u64>,
    /// One-way delay added to every packet (netem).
    pub delay: Option<Duration>,
    /// Delay jitter (netem, needs `delay`).
    pub jitter: Option<Duration>,
    /// Packet loss in percent (netem).
    pub loss_pct: Option<f64>,
    /// Percent of packets sent at once instead of delayed, which reorders them (netem,
    /// needs `delay`).
    pub reorder_pct: Option<f64>,
}

impl Shape {
    pub fn rate(bps: u64) -> Shape {
        Shape {
            rate_bps: Some(bps),
            ..Shape::default()
        }
    }

    pub fn with_delay(mut self, d: Duration) -> Shape {
        self.delay = Some(d);
        self
    }

    /// True if a netem qdisc is needed.
    pub fn needs_netem(&self) -> bool {
        self.delay.is_some() || self.loss_pct.is_some() || self.reorder_pct.is_some()
    }

    /// tbf's bucket: 5 ms at the rate, at least 16 KiB (tbf needs at least rate / HZ, and a
    /// bucket below one GSO segment would split every segment).
    pub fn burst_bytes(&self) -> Option<u64> {
        self.rate_bps.map(|r| (r / 8 / 200).max(16 * 1024))
    }

    pub fn check(&self) -> anyhow::Result<()> {
        if self.rate_bps == Some(0) {
            anyhow::bail!("a rate of 0 bit/s would carry nothing");
        }
        if (self.jitter.is_some() || self.reorder_pct.is_some()) && self.delay.is_none() {
            anyhow::bail!("jitter and reordering need a delay");
        }
        for (what, v) in [("loss", self.loss_pct), ("reorder", self.reorder_pct)] {
            if let Some(p) = v {
                if !(0.0..=100.0).contains(&p) {
                    anyhow::bail!("{what} {p}% is not a percentage");
                }
            }
        }
        Ok(())
    }

    /// The `tc qdisc add` argument lists (after `tc [-n NS] qdisc add dev IFACE`): tbf at
    /// the root and netem under it (tbf is classful with one class, 1:1), or either alone.
    pub fn tc_args(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        let netem = self.netem_args();
        if let Some(rate) = self.rate_bps {
            let mut tbf: Vec<String> = ["root", "handle", "1:", "tbf", "rate"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            tbf.push(format!("{rate}bit"));
            tbf.push("burst".into());
            tbf.push(self.burst_bytes().unwrap_or(16384).to_string());
            tbf.push("limit".into());
            tbf.push(self.queue_bytes.unwrap_or(1_514_000).to_string());
            out.push(tbf);
            if let Some(n) = netem {
                let mut a: Vec<String> = ["parent", "1:1", "handle", "10:"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                a.extend(n);
                out.push(a);
            }
        } else if let Some(n) = netem {
            let mut a: Vec<String> = ["root", "handle", "1:"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            a.extend(n);
            out.push(a);
        }
        out
    }

    fn netem_args(&self) -> Option<Vec<String>> {
        if !self.needs_netem() {
            return None;
        }
        let mut a = vec!["netem".to_string()];
        // netem's own queue: as large as tbf's, in packets (netem's default of 1,000 would
        // drop at high rates with a long delay).
        a.push("limit".into());
        a.push("100000".into());
        if let Some(d) = self.delay {
            a.push("delay".into());
            a.push(format!("{}us", d.as_micros()));
            if let Some(j) = self.jitter {
                a.push(format!("{}us", j.as_micros()));
            }
        }
        if let Some(p) = self.loss_pct {
            a.push("loss".into());
            a.push(format!("{p}%"));
        }
        if let Some(p) = self.reorder_pct {
            a.push("reorder".into());
            a.push(format!("{p}%"));
        }
        Some(a)
    }
}

/// Parses a rate as tc writes it: `100mbit`, `1gbit`, `500kbit`, `12500000` (bit/s),
/// `10mbps` (bytes/s, as tc reads it). Decimal prefixes, as tc uses.
pub fn parse_rate(s: &str) -> anyhow::Result<u64> {
    let (v, unit) = iolab_sys::units::split_number_unit(s)
        .ok_or_else(|| anyhow::anyhow!("rate {s:?}: expected a number and a unit like 100mbit"))?;
    let mult = match unit.as_str() {
        "" | "bit" => 1.0,
        "kbit" | "k" => 1e3,
        "mbit" | "m" => 1e6,
        "gbit" | "g" => 1e9,
        "bps" => 8.0,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        _ => anyhow::bail!("rate {s:?}: unknown unit {unit:?} (bit, kbit, mbit, gbit, or kbps/mbps/gbps for bytes/s)"),
    };
    let bps = v * mult;
    if !bps.is_finite() || !(1.0..=1e13).contains(&bps) {
        anyhow::bail!("rate {s:?} is out of range");
    }
    Ok(bps.round() as u64)
}

/// Parses a duration like `10ms`, `250us`, `1s`, `1.5ms` (the forms of
/// [`iolab_sys::units::parse_duration`]), up to an hour. The unit is required: a bare `10`
/// on a link means nothing obvious.
pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    use iolab_sys::units::{self, UnitError};
    let (_, unit) = units::split_number_unit(s)
        .ok_or_else(|| anyhow::anyhow!("duration {s:?}: expected a number and a unit like 10ms"))?;
    let give_a_unit = || anyhow::anyhow!("duration {s:?}: give a unit: us, ms, s, m or h");
    if unit.is_empty() {
        return Err(give_a_unit());
    }
    let out_of_range = || anyhow::anyhow!("duration {s:?} is out of range (0 to 1 hour)");
    let d = units::parse_duration(s).map_err(|e| match e {
        UnitError::UnknownUnit { .. } => give_a_unit(),
        UnitError::NotANumber { .. } | UnitError::OutOfRange { .. } => out_of_range(),
    })?;
    if d > Duration::from_secs(3600) {
        return Err(out_of_range());
    }
    Ok(d)
}

/// Writes a rate the way a person reads it: `100 Mbit/s`.
pub fn format_rate(bps: u64) -> String {
    if bps >= 1_000_000_000 && bps % 1_000_000 == 0 {
        format!("{} Gbit/s", bps as f64 / 1e9)
    } else if bps >= 1_000_000 {
        format!("{} Mbit/s", bps as f64 / 1e6)
    } else if bps >= 1_000 {
        format!("{} kbit/s", bps as f64 / 1e3)
    } else {
        format!("{bps} bit/s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("100mbit").unwrap(), 100_000_000);
        assert_eq!(parse_rate("1Gbit").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("2.5mbit").unwrap(), 2_500_000);
        assert_eq!(parse_rate("12500000").unwrap(), 12_500_000);
        assert_eq!(parse_rate("10mbps").unwrap(), 80_000_000);
        for bad in ["", "mbit", "100 furlongs", "0", "-5mbit", "1e99gbit"] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
        assert_eq!(format_rate(100_000_000), "100 Mbit/s");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10ms").unwrap(), Duration::from_millis(10));
        assert_eq!(
            parse_duration("1.5ms").unwrap(),
            Duration::from_micros(1500)
        );
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        for bad in ["", "10", "ms", "5h", "99999s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        let e = parse_duration("10").unwrap_err().to_string();
        assert!(e.contains("give a unit"), "{e}");
        let e = parse_duration("10 furlongs").unwrap_err().to_string();
        assert!(e.contains("give a unit"), "{e}");
        let e = parse_duration("2h").unwrap_err().to_string();
        assert!(e.contains("out of range"), "{e}");
    }

    #[test]
    fn tc_commands() {
        let s = Shape::rate(100_000_000);
        assert_eq!(
            s.tc_args(),
            vec![vec![
                "root",
                "handle",
                "1:",
                "tbf",
                "rate",
                "100000000bit",
                "burst",
                "62500",
                "limit",
                "1514000"
            ]]
        );
        let s = s.with_delay(Duration::from_millis(10));
        let a = s.tc_args();
        assert_eq!(a.len(), 2);
        assert_eq!(a[1][..5], ["parent", "1:1", "handle", "10:", "netem"]);
        assert!(a[1].join(" ").contains("delay 10000us"));
        let d = Shape::default().with_delay(Duration::from_millis(1));
        assert_eq!(d.tc_args()[0][..4], ["root", "handle", "1:", "netem"]);
        assert!(Shape::default().tc_args().is_empty());
        let bad = Shape {
            jitter: Some(Duration::from_millis(1)),
            ..Shape::default()
        };
        assert!(bad.check().is_err());
    }
}
