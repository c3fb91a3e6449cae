//! `results.json`: every point of every server, with the machine and the settings.
//!
//! Format (schema "iolab-lab/1"): `points` is a flat list; each point is one server
//! (`model`), one `file` ("small" or "big"), one `mode` ("close": a new connection per
//! request, or "keepalive") and one `concurrency`, and carries the median over its repeats
//! of `mean_ms`, `p50_ms`, `p99_ms`, `rps`, `errors`, `syn_retries`,
//! `achieved_concurrency`, their `spread` (min and max over the repeats) and every repeat.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const SCHEMA: &str = "iolab-lab/1";

/// The figures of one point: the names the issue fixes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub rps: f64,
    pub errors: u64,
    pub syn_retries: u64,
    pub achieved_concurrency: f64,
}

/// One measurement of one point.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Repeat {
    pub repeat: usize,
    #[serde(flatten)]
    pub metrics: Metrics,
    pub requests: u64,
    pub ok: u64,
    /// Requests that passed the steady-state filter (the means use these).
    pub kept: u64,
    /// Some request was made at the requested concurrency.
    pub steady: bool,
    /// Errors at most 1% and the requested concurrency achieved (Figure 1 draws it).
    pub sustained: bool,
    pub errors_by_kind: BTreeMap<String, u64>,
    pub server_concurrency_mean: Option<f64>,
    pub server_concurrency_max: Option<u64>,
    pub elapsed_s: f64,
    pub client_cpu_s: f64,
    /// Per-request log (CSV), relative to the report directory.
    pub log: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// [min, max] over the repeats.
    pub mean_ms: [f64; 2],
    pub p99_ms: [f64; 2],
    pub rps: [f64; 2],
    pub errors: [u64; 2],
}

/// Figure 2's data for one run: each request's completion, the concurrency over time.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Trace {
    /// [end time s, response time ms, class (0 ok, 1 SYN-retried, 2 error)], downsampled.
    pub scatter: Vec<[f64; 3]>,
    /// [time s, open connections] from the server's counters (empty for servers without).
    pub server: Vec<[f64; 2]>,
    /// [time s, requests in flight] from the client log.
    pub client: Vec<[f64; 2]>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Point {
    pub model: String,
    pub file: String,
    pub mode: String,
    pub concurrency: usize,
    #[serde(flatten)]
    pub metrics: Metrics,
    pub sustained: bool,
    pub spread: Spread,
    pub repeats: Vec<Repeat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<Trace>,
}

/// A server the lab ran (a model or a peer) and what happened to it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TargetInfo {
    pub name: String,
    /// "model" or "peer".
    pub kind: String,
    pub describe: String,
    /// "ok", "failed" (some points missing) or "skipped" (not installed).
    pub status: String,
    pub failures: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Results {
    pub schema: String,
    pub profile: String,
    pub command: String,
    pub started_unix: u64,
    pub elapsed_s: f64,
    pub machine: serde_json::Value,
    /// The settings that decide the result, by name.
    pub settings: BTreeMap<String, String>,
    pub warnings: Vec<String>,
    /// How the points were measured (requests per point, repeats, filter, ...).
    pub method: BTreeMap<String, String>,
    pub targets: Vec<TargetInfo>,
    pub points: Vec<Point>,
    /// `iolab micro` results by name (their own JSON convention), when run.
    #[serde(default)]
    pub micro: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub micro_failures: BTreeMap<String, String>,
    /// Seed 000's figures next to ours (see `seedtable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_vs_iolab: Option<crate::seedtable::SeedTable>,
    /// Server CPU time per request at a fixed offered rate (see `efficiency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<crate::efficiency::Efficiency>,
    /// The configuration each peer ran with (nginx.conf), by peer name.
    #[serde(default)]
    pub peer_configs: BTreeMap<String, String>,
    /// The shaped link the server ran behind (`--link`, `--seed-conditions`); absent on
    /// loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<crate::link::LinkInfo>,
    /// `--scaling`: requests/s against server workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<crate::scaling::Scaling>,
    /// `iolab seed bench --json` results, as that command wrote them (`--seed-bench`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_bench: Option<serde_json::Value>,
}

/// Median of values (mean of the middle two when even); 0 for none.
pub fn median(vals: &[f64]) -> f64 {
    iolab_sys::percentile::median_mean_of_middle(vals).unwrap_or(0.0)
}

fn median_u(vals: &[u64]) -> u64 {
    let f: Vec<f64> = vals.iter().map(|&x| x as f64).collect();
    median(&f).round() as u64
}

fn min_max(vals: impl Iterator<Item = f64> + Clone) -> [f64; 2] {
    let lo = vals.clone().fold(f64::INFINITY, f64::min);
    let hi = vals.fold(f64::NEG_INFINITY, f64::max);
    if lo.is_finite() && hi.is_finite() {
        [lo, hi]
    } else {
        [0.0, 0.0]
    }
}

impl Point {
    /// A point summarising its repeats: medians, spread, and sustained when most were.
    pub fn from_repeats(
        model: &str,
        file: &str,
        mode: &str,
        concurrency: usize,
        repeats: Vec<Repeat>,
    ) -> Point {
        let m = |f: fn(&Metrics) -> f64| {
            median(&repeats.iter().map(|r| f(&r.metrics)).collect::<Vec<_>>())
        };
        let mu = |f: fn(&Metrics) -> u64| {
            median_u(&repeats.iter().map(|r| f(&r.metrics)).collect::<Vec<_>>())
        };
        let metrics = Metrics {
            mean_ms: m(|x| x.mean_ms),
            p50_ms: m(|x| x.p50_ms),
            p99_ms: m(|x| x.p99_ms),
            rps: m(|x| x.rps),
            errors: mu(|x| x.errors),
            syn_retries: mu(|x| x.syn_retries),
            achieved_concurrency: m(|x| x.achieved_concurrency),
        };
        let spread = Spread {
            mean_ms: min_max(repeats.iter().map(|r| r.metrics.mean_ms)),
            p99_ms: min_max(repeats.iter().map(|r| r.metrics.p99_ms)),
            rps: min_max(repeats.iter().map(|r| r.metrics.rps)),
            errors: [
                repeats.iter().map(|r| r.metrics.errors).min().unwrap_or(0),
                repeats.iter().map(|r| r.metrics.errors).max().unwrap_or(0),
            ],
        };
        let n_sustained = repeats.iter().filter(|r| r.sustained).count();
        Point {
            model: model.to_string(),
            file: file.to_string(),
            mode: mode.to_string(),
            concurrency,
            metrics,
            sustained: !repeats.is_empty() && n_sustained * 2 > repeats.len(),
            spread,
            repeats,
            trace: None,
        }
    }
}

impl Results {
    pub fn point(&self, model: &str, file: &str, mode: &str, c: usize) -> Option<&Point> {
        self.points
            .iter()
            .find(|p| p.model == model && p.file == file && p.mode == mode && p.concurrency == c)
    }

    /// Concurrency levels measured for a file and mode, ascending.
    pub fn levels(&self, file: &str, mode: &str) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .points
            .iter()
            .filter(|p| p.file == file && p.mode == mode)
            .map(|p| p.concurrency)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// The fields every point must carry, by the issue.
pub const REQUIRED_POINT_FIELDS: [&str; 7] = [
    "mean_ms",
    "p50_ms",
    "p99_ms",
    "rps",
    "errors",
    "syn_retries",
    "achieved_concurrency",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn rep(i: usize, mean: f64, errors: u64, sustained: bool) -> Repeat {
        Repeat {
            repeat: i,
            metrics: Metrics {
                mean_ms: mean,
                p50_ms: mean,
                p99_ms: mean * 2.0,
                rps: 1000.0 / mean,
                errors,
                ..Metrics::default()
            },
            sustained,
            ..Repeat::default()
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[f64::NAN, 1.0]), 1.0);
    }

    #[test]
    fn point_aggregates_repeats() {
        let p = Point::from_repeats(
            "epoll",
            "small",
            "close",
            100,
            vec![
                rep(0, 3.0, 0, true),
                rep(1, 1.0, 5, false),
                rep(2, 2.0, 1, true),
            ],
        );
        assert_eq!(p.metrics.mean_ms, 2.0);
        assert_eq!(p.spread.mean_ms, [1.0, 3.0]);
        assert_eq!(p.spread.errors, [0, 5]);
        assert_eq!(p.metrics.errors, 1);
        assert!(p.sustained);
        let q = Point::from_repeats("x", "small", "close", 1, vec![]);
        assert!(!q.sustained);
        assert_eq!(q.spread.mean_ms, [0.0, 0.0]);
    }

    #[test]
    fn json_has_the_required_names_and_round_trips() {
        let mut p =
            Point::from_repeats("threads", "big", "close", 1000, vec![rep(0, 5.0, 2, true)]);
        p.trace = Some(Trace {
            scatter: vec![[0.1, 2.0, 0.0]],
            server: vec![[0.0, 1.0]],
            client: vec![],
        });
        let r = Results {
            schema: SCHEMA.into(),
            points: vec![p],
            ..Results::default()
        };
        let s = serde_json::to_string(&r).unwrap();
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        let pt = &v["points"][0];
        for k in REQUIRED_POINT_FIELDS {
            assert!(pt.get(k).is_some(), "missing {k}");
            assert!(pt["repeats"][0].get(k).is_some(), "repeat missing {k}");
        }
        assert_eq!(pt["model"], "threads");
        assert_eq!(pt["file"], "big");
        assert_eq!(pt["concurrency"], 1000);
        assert_eq!(pt["spread"]["mean_ms"][1], 5.0);
        let back: Results = serde_json::from_str(&s).unwrap();
        assert_eq!(back.points[0].metrics, r.points[0].metrics);
        assert_eq!(
            back.point("threads", "big", "close", 1000)
                .unwrap()
                .repeats
                .len(),
            1
        );
        assert_eq!(back.levels("big", "close"), vec![1000]);
        assert!(back.point("threads", "small", "close", 1000).is_none());
    }
}
