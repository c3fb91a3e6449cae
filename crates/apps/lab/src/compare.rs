//! `iolab lab --compare A B`: two results folders side by side, every point, as benchstat
//! compares two sets of Go benchmarks.
//!
//! For each server and point present in both (and each efficiency row), each figure's
//! repeats in A against those in B: the medians, B/A, and the two-sided Mann-Whitney U
//! p-value ([`crate::utest`]). A difference is reported when p < 0.05; when the repeats
//! are too few for any difference to reach that (3 against 3 can give at best p = 0.1) the
//! verdict is "n too small", never a guess. A text table per figure, `--json`, and an HTML
//! page.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::results::{Point, Results};
use crate::utest::{min_p_value, p_value};
use iolab_report::{esc, Table};
use iolab_sys::percentile::median;

/// The significance threshold (benchstat's default).
pub const ALPHA: f64 = 0.05;

/// What the repeats say about one figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// p >= ALPHA: within the noise of the repeats.
    NoDifference,
    /// Significantly better in B (more requests/s, less time or CPU).
    Better,
    Worse,
    /// Too few repeats on one side for any difference to be significant.
    NTooSmall,
}

impl Verdict {
    pub fn label(self) -> &'static str {
        match self {
            Verdict::NoDifference => "~",
            Verdict::Better => "better",
            Verdict::Worse => "worse",
            Verdict::NTooSmall => "n too small",
        }
    }

    pub fn significant(self) -> bool {
        matches!(self, Verdict::Better | Verdict::Worse)
    }
}

/// One figure of one point in both runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub server: String,
    /// "small close c=10", or "efficiency keepalive" for Figure 1b's rows.
    pub point: String,
    /// rps, mean_ms, p99_ms or us_per_request.
    pub metric: String,
    /// Every repeat's value.
    pub a: Vec<f64>,
    pub b: Vec<f64>,
    pub a_median: f64,
    pub b_median: f64,
    /// b_median / a_median; None when A's is 0.
    pub ratio: Option<f64>,
    /// Two-sided Mann-Whitney U p-value.
    pub p: Option<f64>,
    pub verdict: Verdict,
}

/// The whole comparison (`--json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub a: String,
    pub b: String,
    pub alpha: f64,
    pub rows: Vec<Row>,
    /// Points (and efficiency rows) measured in one run only.
    pub only_in_a: Vec<String>,
    pub only_in_b: Vec<String>,
}

/// The figures compared, in table order: (name in results.json, title, higher is better).
pub const METRICS: [(&str, &str, bool); 4] = [
    ("rps", "requests/s", true),
    ("mean_ms", "mean response time, ms", false),
    ("p99_ms", "p99 response time, ms", false),
    (
        "us_per_request",
        "server CPU µs per request (Figure 1b)",
        false,
    ),
];

fn point_label(p: &Point) -> String {
    format!("{} {} c={}", p.file, p.mode, p.concurrency)
}

/// The repeats of each figure of each point, by (server, point label).
type Samples = BTreeMap<(String, String), Vec<(&'static str, Vec<f64>)>>;

/// The repeats of every run in `runs` pooled by server, point and figure: one side of an
/// interleaved comparison (A B B A ...) is several results folders.
fn samples(runs: &[&Results]) -> Samples {
    let mut out = Samples::new();
    let mut add = |key: (String, String), figures: Vec<(&'static str, Vec<f64>)>| {
        let have = out.entry(key).or_default();
        for (metric, values) in figures {
            match have.iter_mut().find(|(m, _)| *m == metric) {
                Some((_, v)) => v.extend(values),
                None => have.push((metric, values)),
            }
        }
    };
    for r in runs {
        for p in &r.points {
            let reps = &p.repeats;
            let figures = vec![
                ("rps", reps.iter().map(|x| x.metrics.rps).collect()),
                ("mean_ms", reps.iter().map(|x| x.metrics.mean_ms).collect()),
                ("p99_ms", reps.iter().map(|x| x.metrics.p99_ms).collect()),
            ];
            add((p.model.clone(), point_label(p)), figures);
        }
        for row in r.efficiency.iter().flat_map(|e| &e.rows) {
            let v = row
                .repeats
                .iter()
                .filter(|x| x.ok > 0)
                .map(|x| x.us_per_request)
                .collect();
            let label = if row.low {
                format!("efficiency {} at the low rate", row.mode)
            } else {
                format!("efficiency {}", row.mode)
            };
            add((row.server.clone(), label), vec![("us_per_request", v)]);
        }
    }
    out
}

/// The verdict on one figure's repeats.
pub fn judge(a: &[f64], b: &[f64], higher_is_better: bool) -> (Option<f64>, Verdict) {
    let p = p_value(a, b);
    if min_p_value(a.len(), b.len()) >= ALPHA {
        return (p, Verdict::NTooSmall);
    }
    let verdict = match p {
        Some(p) if p < ALPHA => {
            let up = median(b).unwrap_or(0.0) > median(a).unwrap_or(0.0);
            if up == higher_is_better {
                Verdict::Better
            } else {
                Verdict::Worse
            }
        }
        _ => Verdict::NoDifference,
    };
    (p, verdict)
}

/// Compares run `b` against run `a` (labelled as given).
pub fn compare(a: &Results, b: &Results, labels: (&str, &str)) -> Comparison {
    compare_runs(&[a], &[b], labels)
}

/// Compares the runs of side `b` against those of side `a`, each side's repeats pooled.
pub fn compare_runs(a: &[&Results], b: &[&Results], labels: (&str, &str)) -> Comparison {
    let (sa, sb) = (samples(a), samples(b));
    let mut c = Comparison {
        a: labels.0.into(),
        b: labels.1.into(),
        alpha: ALPHA,
        ..Comparison::default()
    };
    let name = |k: &(String, String)| format!("{} {}", k.0, k.1);
    c.only_in_a = sa
        .keys()
        .filter(|k| !sb.contains_key(*k))
        .map(name)
        .collect();
    c.only_in_b = sb
        .keys()
        .filter(|k| !sa.contains_key(*k))
        .map(name)
        .collect();
    for (metric, _, higher) in METRICS {
        for (key, figures) in &sa {
            let Some(other) = sb.get(key) else { continue };
            let find = |f: &[(&str, Vec<f64>)]| {
                f.iter().find(|(m, _)| *m == metric).map(|(_, v)| v.clone())
            };
            let (Some(va), Some(vb)) = (find(figures), find(other)) else {
                continue;
            };
            let (a_median, b_median) = (median(&va).unwrap_or(0.0), median(&vb).unwrap_or(0.0));
            let (p, verdict) = judge(&va, &vb, higher);
            c.rows.push(Row {
                server: key.0.clone(),
                point: key.1.clone(),
                metric: metric.into(),
                a: va,
                b: vb,
                a_median,
                b_median,
                ratio: (a_median != 0.0).then(|| b_median / a_median),
                p,
                verdict,
            });
        }
    }
    c
}

/// Loads each folder's results.json and compares side `b` against side `a`; a side of
/// several folders pools their repeats (runs of the two builds taken in turns, so that a
/// machine's drift falls on both).
pub fn compare_dirs(a: &[PathBuf], b: &[PathBuf]) -> anyhow::Result<Comparison> {
    let load = |side: &[PathBuf]| -> anyhow::Result<Vec<Results>> {
        anyhow::ensure!(!side.is_empty(), "a side of the comparison names no folder");
        side.iter()
            .map(|d| crate::validate::load_results(d))
            .collect()
    };
    let (ra, rb) = (load(a)?, load(b)?);
    let label = |side: &[PathBuf]| {
        side.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    Ok(compare_runs(
        &ra.iter().collect::<Vec<_>>(),
        &rb.iter().collect::<Vec<_>>(),
        (&label(a), &label(b)),
    ))
}

impl Comparison {
    /// Servers with at least one significant difference, each once, in row order.
    pub fn significant_servers(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for r in self.rows.iter().filter(|r| r.verdict.significant()) {
            if !v.contains(&r.server) {
                v.push(r.server.clone());
            }
        }
        v
    }

    /// One sentence per server with a significant difference, then the counts.
    pub fn summary(&self) -> Vec<String> {
        let mut out = Vec::new();
        for s in self.significant_servers() {
            let rows: Vec<&Row> = self.rows.iter().filter(|r| r.server == s).collect();
            let count = |v: Verdict| rows.iter().filter(|r| r.verdict == v).count();
            let worse = count(Verdict::Worse);
            out.push(format!(
                "{s}: {worse} figure{} worse, {} better, of {} compared",
                if worse == 1 { "" } else { "s" },
                count(Verdict::Better),
                rows.len()
            ));
        }
        let count = |v: Verdict| self.rows.iter().filter(|r| r.verdict == v).count();
        out.push(format!(
            "{} figures compared: {} worse, {} better, {} within the noise (p >= {ALPHA}), {} with too few repeats to tell (give each run --repeat 5)",
            self.rows.len(),
            count(Verdict::Worse),
            count(Verdict::Better),
            count(Verdict::NoDifference),
            count(Verdict::NTooSmall)
        ));
        if !self.only_in_a.is_empty() || !self.only_in_b.is_empty() {
            out.push(format!(
                "measured in one run only: A {}, B {}",
                self.only_in_a.len(),
                self.only_in_b.len()
            ));
        }
        out
    }

    /// One table per figure: server, point, A and B (median, ±half the spread in %,
    /// repeats), B/A, p and the verdict.
    pub fn tables(&self) -> Vec<(&'static str, Table)> {
        let mut out = Vec::new();
        for (metric, title, _) in METRICS {
            let mut t = Table::new(["server", "point", "A", "B", "B/A", "p", "verdict"])
                .align(1, iolab_report::Align::Left)
                .align(6, iolab_report::Align::Left);
            for r in self.rows.iter().filter(|r| r.metric == metric) {
                t.row([
                    r.server.clone(),
                    r.point.clone(),
                    cell(r.a_median, &r.a),
                    cell(r.b_median, &r.b),
                    r.ratio
                        .map(|x| format!("{x:.2}"))
                        .unwrap_or_else(|| "-".into()),
                    r.p.map(|p| format!("{p:.3}")).unwrap_or_else(|| "-".into()),
                    r.verdict.label().into(),
                ]);
            }
            if !t.rows().is_empty() {
                out.push((title, t));
            }
        }
        out
    }

    /// The text the terminal gets.
    pub fn text(&self) -> String {
        let mut out = format!("A: {}\nB: {}\n", self.a, self.b);
        for (title, t) in self.tables() {
            out.push_str(&format!("\n{title}\n{}", t.to_text()));
        }
        out.push('\n');
        for s in self.summary() {
            out.push_str(&format!("- {s}\n"));
        }
        out
    }

    /// The HTML page.
    pub fn html(&self) -> String {
        let mut body = format!(
            "<h1>iolab lab --compare</h1><p>A: <code>{}</code><br>B: <code>{}</code></p>\
<p>Each figure's repeats in A against those in B: medians, ± half their spread, B/A, and \
the two-sided Mann-Whitney U p-value. <b>better</b>/<b>worse</b> when p &lt; {ALPHA}; ~ \
within the noise; <i>n too small</i> when the repeats cannot show a difference at that \
level (3 against 3 give p &ge; 0.1 at best: run both with <code>--repeat 5</code>).</p><ul>",
            esc(&self.a),
            esc(&self.b)
        );
        for s in self.summary() {
            body.push_str(&format!("<li>{}</li>", esc(&s)));
        }
        body.push_str("</ul>");
        for (title, t) in self.tables() {
            body.push_str(&format!("<h2>{}</h2>{}", esc(title), t.to_html()));
        }
        for (side, v) in [("A", &self.only_in_a), ("B", &self.only_in_b)] {
            if !v.is_empty() {
                body.push_str(&format!(
                    "<h2>Only in {side}</h2><p>{}</p>",
                    esc(&v.join(", "))
                ));
            }
        }
        iolab_report::page("iolab lab --compare", iolab_report::BASE_STYLE, &body)
    }
}

/// A median with ± half the spread in percent and the number of repeats: "1234 ±3% (n=5)".
fn cell(med: f64, v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let spread = if med != 0.0 && v.len() > 1 {
        format!(" ±{:.0}%", (hi - lo) / 2.0 / med.abs() * 100.0)
    } else {
        String::new()
    };
    format!("{}{spread} (n={})", crate::report::short(med), v.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::efficiency::{EffRepeat, EffRow, Efficiency};
    use crate::results::{ConnMode, FileKind, Metrics, Repeat};

    /// Two servers, `n` repeats per point with a little noise, and an efficiency block.
    pub(crate) fn run(n: usize, slow: Option<(&str, f64)>) -> Results {
        let mut r = Results::default();
        let mut eff = Efficiency::default();
        for (si, server) in ["fast", "steady"].into_iter().enumerate() {
            let k = match slow {
                Some((s, k)) if s == server => k,
                _ => 1.0,
            };
            for (file, mode, c) in [
                (FileKind::Small, ConnMode::Close, 10),
                (FileKind::Big, ConnMode::Close, 10),
                (FileKind::Small, ConnMode::KeepAlive, 10),
            ] {
                let reps: Vec<Repeat> = (0..n)
                    .map(|i| {
                        // ±1% noise, the same in every run of this seed.
                        let noise = 1.0 + 0.01 * ((i * 7 + si * 3) % 5) as f64 / 4.0 - 0.005;
                        let rps = 10_000.0 * noise * k;
                        Repeat {
                            repeat: i,
                            metrics: Metrics {
                                rps,
                                mean_ms: 1000.0 / rps,
                                p99_ms: 3000.0 / rps,
                                ..Metrics::default()
                            },
                            ..Repeat::default()
                        }
                    })
                    .collect();
                r.points
                    .push(Point::from_repeats(server, file, mode, c, reps));
            }
            eff.rows.push(EffRow {
                server: server.into(),
                mode: ConnMode::KeepAlive,
                repeats: (0..n)
                    .map(|i| EffRepeat {
                        ok: 100,
                        us_per_request: (20.0 + (i % 3) as f64 * 0.1) / k,
                        ..EffRepeat::default()
                    })
                    .collect(),
                ..EffRow::default()
            });
        }
        r.efficiency = Some(eff);
        r
    }

    #[test]
    fn a_run_against_itself_differs_nowhere() {
        let r = run(5, None);
        let c = compare(&r, &r, ("a", "a"));
        assert_eq!(c.rows.len(), 2 * (3 * 3 + 1));
        assert!(c.rows.iter().all(|x| x.verdict == Verdict::NoDifference));
        assert!(c.rows.iter().all(|x| x.ratio == Some(1.0)));
        assert!(c.significant_servers().is_empty());
        assert!(c.only_in_a.is_empty() && c.only_in_b.is_empty());
    }

    /// One server 20% slower in B: only its figures move, all of them the right way.
    #[test]
    fn a_slower_server_is_found() {
        let (a, b) = (run(5, None), run(5, Some(("steady", 0.8))));
        let c = compare(&a, &b, ("before", "after"));
        assert_eq!(c.significant_servers(), ["steady"]);
        for r in c.rows.iter().filter(|r| r.server == "steady") {
            assert_eq!(r.verdict, Verdict::Worse, "{r:?}");
        }
        let rps = c
            .rows
            .iter()
            .find(|r| r.server == "steady" && r.metric == "rps")
            .unwrap();
        assert!((rps.ratio.unwrap() - 0.8).abs() < 1e-9);
        // Faster is better: B against A the other way round.
        let back = compare(&b, &a, ("after", "before"));
        assert!(back
            .rows
            .iter()
            .filter(|r| r.server == "steady")
            .all(|r| r.verdict == Verdict::Better));
        let text = c.text();
        assert!(
            text.contains("worse") && text.contains("steady: 10 figures worse"),
            "{text}"
        );
        let html = c.html();
        assert!(html.contains("<h2>requests/s</h2>") && html.contains("worse"));
    }

    /// Runs taken in turns pool their repeats: two runs of 3 per side reach what one run of
    /// 3 cannot (a point measured in one run of a side only adds that run's repeats).
    #[test]
    fn several_runs_per_side_pool_their_repeats() {
        let (a1, a2) = (run(3, None), run(3, None));
        let (b1, b2) = (run(3, Some(("steady", 0.8))), run(3, Some(("steady", 0.8))));
        let one = compare(&a1, &b1, ("a", "b"));
        assert!(one.significant_servers().is_empty());
        let c = compare_runs(&[&a1, &a2], &[&b1, &b2], ("a1,a2", "b1,b2"));
        assert!(
            c.rows.iter().all(|r| r.a.len() == 6 && r.b.len() == 6),
            "{:?}",
            c.rows[0]
        );
        assert_eq!(c.significant_servers(), ["steady"]);
        let mut partial = a2.clone();
        partial.points.pop();
        let c = compare_runs(&[&a1, &partial], &[&b1, &b2], ("a", "b"));
        assert!(c.rows.iter().any(|r| r.a.len() == 3) && c.only_in_a.is_empty());
    }

    /// Three repeats against three cannot reach p < 0.05: said so, even for a big change.
    #[test]
    fn few_repeats_are_not_called_significant() {
        let (a, b) = (run(3, None), run(3, Some(("steady", 0.5))));
        let c = compare(&a, &b, ("a", "b"));
        assert!(c.rows.iter().all(|r| r.verdict == Verdict::NTooSmall));
        assert!(c.significant_servers().is_empty());
        let mut fewer = a.clone();
        fewer.points.pop();
        let c = compare(&fewer, &a, ("a", "b"));
        assert_eq!(c.only_in_b, ["steady small keepalive c=10"]);
    }
}
