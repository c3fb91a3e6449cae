//! Hekate against libtorrent at each point of the bench: the goal is at least
//! libtorrent's upload rate for at most half its CPU per GB, in plaintext and under MSE.
//! Each Hekate seeder is set against the libtorrent profile that spent less CPU per GB at
//! that point (the fairer fight: the cheaper of its default and tuned settings).

use serde::Serialize;

use super::{Encryption, Summary};

/// The CPU-per-GB ratio the bench's goal asks for (Hekate's over libtorrent's).
pub const GOAL_CPU_RATIO: f64 = 0.5;

/// One Hekate seeder against libtorrent at one (peers, cache, encryption) point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Versus {
    pub seeder: String,
    pub peers: usize,
    pub cache: &'static str,
    pub encryption: Encryption,
    /// The libtorrent profile compared with (its lower CPU per GB at this point).
    pub libtorrent: String,
    /// Hekate's CPU s/GB over libtorrent's (medians).
    pub cpu_ratio: f64,
    /// Hekate's upload MB/s over libtorrent's (medians).
    pub rate_ratio: f64,
    /// `cpu_ratio ≤ 0.5` and `rate_ratio ≥ 1`.
    pub goal_met: bool,
}

impl Versus {
    /// Every Hekate row of `summary` that has a libtorrent row at its point with a CPU figure.
    pub fn of(summary: &[Summary]) -> Vec<Versus> {
        let same_point = |a: &Summary, b: &Summary| {
            a.peers == b.peers && a.cache == b.cache && a.encryption == b.encryption
        };
        let mut out = Vec::new();
        for ours in summary.iter().filter(|s| s.seeder.starts_with("hekate")) {
            let Some(our_cpu) = ours.cpu_s_per_gb else {
                continue;
            };
            let theirs = summary
                .iter()
                .filter(|s| s.seeder.starts_with("libtorrent") && same_point(s, ours))
                .filter_map(|s| Some((s, s.cpu_s_per_gb.filter(|c| *c > 0.0)?)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            let Some((lt, lt_cpu)) = theirs else {
                continue;
            };
            if lt.upload_mb_s <= 0.0 {
                continue;
            }
            let cpu_ratio = our_cpu / lt_cpu;
            let rate_ratio = ours.upload_mb_s / lt.upload_mb_s;
            out.push(Versus {
                seeder: ours.seeder.clone(),
                peers: ours.peers,
                cache: ours.cache,
                encryption: ours.encryption,
                libtorrent: lt.seeder.clone(),
                cpu_ratio,
                rate_ratio,
                goal_met: cpu_ratio <= GOAL_CPU_RATIO && rate_ratio >= 1.0,
            });
        }
        out
    }
}

/// The comparison table (nothing when libtorrent did not run).
pub fn print(versus: &[Versus]) {
    if versus.is_empty() {
        return;
    }
    println!(
        "against libtorrent (its cheaper profile per point; goal: CPU/GB <= {GOAL_CPU_RATIO}x at >= 1x its MB/s):"
    );
    println!(
        "{:<19} {:>6} {:>5} {:>4} {:<19} {:>9} {:>9} {:>5}",
        "seeder", "peers", "cache", "enc", "libtorrent", "CPU/GB", "MB/s", "goal"
    );
    for v in versus {
        println!(
            "{:<19} {:>6} {:>5} {:>4} {:<19} {:>8.2}x {:>8.2}x {:>5}",
            v.seeder,
            v.peers,
            v.cache,
            v.encryption,
            v.libtorrent,
            v.cpu_ratio,
            v.rate_ratio,
            if v.goal_met { "met" } else { "no" }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(seeder: &str, enc: Encryption, mb_s: f64, cpu: Option<f64>) -> Summary {
        Summary {
            seeder: seeder.into(),
            peers: 100,
            cache: "warm",
            encryption: enc,
            runs: 3,
            connected_min: 100,
            upload_mb_s: mb_s,
            upload_mb_s_min: mb_s,
            upload_mb_s_max: mb_s,
            cpu_s_per_gb: cpu,
            cpu_s_per_gb_min: cpu,
            cpu_s_per_gb_max: cpu,
            rss_per_idle_peer_bytes: None,
            read_amplification: None,
            read_amplification_distinct: None,
            lat_p50_ms: 0.0,
            lat_p99_ms: 0.0,
        }
    }

    #[test]
    fn each_hekate_point_meets_the_cheaper_libtorrent_of_the_same_point() {
        use Encryption::{Off, Rc4};
        let summary = [
            point("hekate-uring", Off, 600.0, Some(1.0)),
            point("libtorrent-default", Off, 300.0, Some(3.0)),
            point("libtorrent-hps", Off, 400.0, Some(2.0)),
            point("hekate-uring", Rc4, 300.0, Some(2.0)),
            point("libtorrent-default", Rc4, 400.0, Some(2.5)),
            point("hekate-mmap", Rc4, 500.0, None),
        ];
        let v = Versus::of(&summary);
        assert_eq!(v.len(), 2, "a point without CPU figures is left out: {v:?}");
        assert_eq!(v[0].libtorrent, "libtorrent-hps");
        assert!((v[0].cpu_ratio - 0.5).abs() < 1e-9 && (v[0].rate_ratio - 1.5).abs() < 1e-9);
        assert!(v[0].goal_met);
        assert_eq!(
            (v[1].encryption, v[1].libtorrent.as_str()),
            (Rc4, "libtorrent-default")
        );
        assert!((v[1].cpu_ratio - 0.8).abs() < 1e-9 && !v[1].goal_met);
    }
}
