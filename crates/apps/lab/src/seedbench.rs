//! The report's BitTorrent seeder section: the JSON of `iolab seed bench --json FILE`
//! (Hekate's disk paths and libtorrent side by side against the number of peers), given to
//! `iolab lab --seed-bench FILE` or found as DIR/seed-bench.json by `iolab lab --render DIR`.
//! Two figures (upload rate and seeder CPU per GB against peers, one curve per seeder and
//! cache state) and the table of every point. The JSON is kept as it is (the seeder's own
//! convention, like the micro results): this module only reads its `summary` rows.

use std::fmt::Write;

use serde_json::Value;

use crate::svg::{esc, line_chart, LineChart, Series};

/// One `summary` row of the bench JSON (fields missing or null read as absent).
struct Row<'a> {
    seeder: &'a str,
    peers: f64,
    cache: &'a str,
    /// The leechers' opening (`off`, `rc4`), in benches that ran both.
    encryption: Option<&'a str>,
    v: &'a Value,
}

impl Row<'_> {
    /// The conditions of the point besides the seeder and peers: the cache state, and the
    /// encryption when the bench recorded it (plaintext and RC4 points are not one curve).
    fn state(&self) -> String {
        match self.encryption {
            Some("rc4") => format!("{}, MSE/RC4", self.cache),
            Some(_) => format!("{}, plaintext", self.cache),
            None => self.cache.to_string(),
        }
    }

    fn num(&self, k: &str) -> Option<f64> {
        self.v
            .get(k)
            .and_then(Value::as_f64)
            .filter(|x| x.is_finite())
    }
}

fn rows(bench: &Value) -> Vec<Row<'_>> {
    let Some(list) = bench.get("summary").and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|v| {
            Some(Row {
                seeder: v.get("seeder")?.as_str()?,
                peers: v.get("peers")?.as_f64()?,
                cache: v.get("cache").and_then(Value::as_str).unwrap_or("?"),
                encryption: v.get("encryption").and_then(Value::as_str),
                v,
            })
        })
        .collect()
}

/// One curve per (seeder, cache, encryption) of `key` against peers.
fn series(rows: &[Row], key: &str) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for r in rows {
        let Some(y) = r.num(key) else { continue };
        let name = format!("{} ({})", r.seeder, r.state());
        match out.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push((r.peers, y)),
            None => out.push(Series {
                name,
                points: vec![(r.peers, y)],
            }),
        }
    }
    for s in &mut out {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// The section's HTML (heading included); `num` is the next figure number.
pub fn section(bench: &Value, num: &mut usize) -> String {
    let mut out = String::from(r#"<h2 id="seeder">BitTorrent seeder: Hekate and libtorrent</h2>"#);
    let rows = rows(bench);
    if rows.is_empty() {
        out.push_str("<p class=\"warn\">The seeder bench JSON has no summary rows.</p>");
        return out;
    }
    let cfg = bench.get("config").cloned().unwrap_or(Value::Null);
    let c = |k: &str| {
        cfg.get(k)
            .map(|v| v.to_string())
            .unwrap_or_else(|| "?".into())
    };
    let _ = write!(
        out,
        "<p>From <code>iolab seed bench</code>: a swarm of leechers of our own on loopback \
         downloads one torrent ({} bytes, pieces of {} bytes, {} s per run, {} upload slots, \
         pipeline {}, read-ahead {}) from each seeder in turn; medians over the repeats. \
         <i>rd/dist</i> is the disk bytes read per distinct byte sent (1.0 = every byte read \
         once; 0 when the cache was warm).</p>",
        esc(&c("size_bytes")),
        esc(&c("piece_length")),
        esc(&c("secs")),
        esc(&c("slots")),
        esc(&c("pipeline")),
        esc(&c("read_ahead")),
    );
    for (key, title, y_label, log_y) in [
        (
            "upload_mb_s",
            "Upload rate against peers",
            "upload MB/s",
            false,
        ),
        (
            "cpu_s_per_gb",
            "Seeder CPU per GB sent against peers",
            "CPU s per GB sent",
            true,
        ),
    ] {
        let chart = LineChart {
            title: title.into(),
            x_label: "peers (leechers connected at once)".into(),
            y_label: y_label.into(),
            log_x: true,
            log_y,
            series: series(&rows, key),
        };
        let _ = write!(
            out,
            "<figure><figcaption>Figure {num}: {}, one curve per seeder, cache state and encryption (median of the repeats).</figcaption>{}</figure>",
            esc(title),
            line_chart(&chart)
        );
        *num += 1;
    }
    out.push_str("<table><caption>Every point (medians; [min-max] over the repeats)</caption><tr><th>seeder</th><th>peers</th><th>cache</th><th>connected (fewest)</th><th>upload MB/s</th><th>CPU s/GB</th><th>RSS per idle peer (B)</th><th>rd/dist</th><th>latency p50 / p99 (ms)</th></tr>");
    let f = |v: Option<f64>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or("-".into());
    for r in &rows {
        let range = |k: &str, p: usize| match (
            r.num(k),
            r.num(&format!("{k}_min")),
            r.num(&format!("{k}_max")),
        ) {
            (Some(m), Some(a), Some(b)) => format!("{m:.p$} [{a:.p$}-{b:.p$}]"),
            (m, _, _) => f(m, p),
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td></tr>",
            esc(r.seeder),
            r.peers,
            esc(&r.state()),
            f(r.num("connected_min"), 0),
            range("upload_mb_s", 0),
            range("cpu_s_per_gb", 2),
            f(r.num("rss_per_idle_peer_bytes"), 0),
            f(r.num("read_amplification_distinct"), 3),
            f(r.num("lat_p50_ms"), 2),
            f(r.num("lat_p99_ms"), 2),
        );
    }
    out.push_str("</table>");
    out.push_str(&versus_table(bench));
    if let Some(m) = bench.get("machine") {
        let _ = write!(
            out,
            "<p class=\"note\">Machine of the seeder bench: <code>{}</code></p>",
            esc(&m.to_string())
        );
    }
    out
}

/// The bench's `versus` rows (each Hekate point against libtorrent's cheaper profile, with
/// the goal), as a table; nothing for benches that did not write them.
fn versus_table(bench: &Value) -> String {
    let Some(list) = bench
        .get("versus")
        .and_then(Value::as_array)
        .filter(|l| !l.is_empty())
    else {
        return String::new();
    };
    let mut out = String::from("<table><caption>Hekate against libtorrent's cheaper profile at each point (goal: at most 0.5x its CPU per GB at at least its rate)</caption><tr><th>seeder</th><th>peers</th><th>cache, encryption</th><th>libtorrent</th><th>CPU/GB ratio</th><th>MB/s ratio</th><th>goal</th></tr>");
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
    let ratio = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_f64)
            .map_or("-".into(), |x| format!("{x:.2}x"))
    };
    for v in list {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}, {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&text(v, "seeder")),
            v.get("peers").and_then(Value::as_u64).unwrap_or(0),
            esc(&text(v, "cache")),
            esc(&text(v, "encryption")),
            esc(&text(v, "libtorrent")),
            ratio(v, "cpu_ratio"),
            ratio(v, "rate_ratio"),
            if v.get("goal_met").and_then(Value::as_bool) == Some(true) { "met" } else { "missed" },
        );
    }
    out.push_str("</table>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_and_table_from_the_summary() {
        let bench = serde_json::json!({
            "config": {"size_bytes": 1, "piece_length": 2, "secs": 3, "slots": 8, "pipeline": 16, "read_ahead": false},
            "summary": [
                {"seeder": "hekate-pread", "peers": 100, "cache": "cold", "upload_mb_s": 500.0, "upload_mb_s_min": 400.0, "upload_mb_s_max": 600.0, "cpu_s_per_gb": 1.2, "read_amplification_distinct": 1.001, "lat_p50_ms": 1.0, "lat_p99_ms": 9.0, "connected_min": 100},
                {"seeder": "hekate-pread", "peers": 10, "cache": "cold", "upload_mb_s": 300.0, "cpu_s_per_gb": null, "lat_p50_ms": 1.0, "lat_p99_ms": 2.0},
                {"seeder": "libtorrent-hps", "peers": 10, "cache": "warm", "upload_mb_s": 200.0, "cpu_s_per_gb": 1.5, "lat_p50_ms": 1.0, "lat_p99_ms": 2.0}
            ]
        });
        let mut num = 7;
        let html = section(&bench, &mut num);
        assert_eq!(num, 9, "two figures");
        let marks = crate::validate::svg_marks(&html).unwrap();
        assert_eq!(marks.svgs, 2);
        assert!(html.contains("400-600"), "the spread is shown");
        assert!(html.contains("hekate-pread (cold)") && html.contains("libtorrent-hps (warm)"));
        // The ascending-peer curve of hekate-pread cold: 10 then 100.
        let s = series(&rows(&bench), "upload_mb_s");
        assert_eq!(s[0].points, vec![(10.0, 300.0), (100.0, 500.0)]);
        assert!(section(&serde_json::json!({}), &mut num).contains("no summary rows"));
    }

    /// A bench run in plaintext and under MSE gives two curves per seeder and cache, not one
    /// curve through both.
    #[test]
    fn plaintext_and_rc4_points_are_separate_curves() {
        let point = |enc: &str, peers: u32, mb_s: f64| {
            serde_json::json!({"seeder": "hekate-mmap", "peers": peers, "cache": "warm",
                "encryption": enc, "upload_mb_s": mb_s, "cpu_s_per_gb": 1.0})
        };
        let bench = serde_json::json!({"summary": [
            point("off", 100, 900.0), point("rc4", 100, 250.0),
            point("off", 1000, 700.0), point("rc4", 1000, 220.0)
        ]});
        let s = series(&rows(&bench), "upload_mb_s");
        let names: Vec<&str> = s.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "hekate-mmap (warm, plaintext)",
                "hekate-mmap (warm, MSE/RC4)"
            ]
        );
        assert_eq!(s[1].points, vec![(100.0, 250.0), (1000.0, 220.0)]);
        let mut num = 1;
        assert!(section(&bench, &mut num).contains("<td>warm, MSE/RC4</td>"));
        let with_versus = serde_json::json!({"summary": bench["summary"], "versus": [
            {"seeder": "hekate-mmap", "peers": 1000, "cache": "warm", "encryption": "rc4",
             "libtorrent": "libtorrent-hps", "cpu_ratio": 0.41, "rate_ratio": 1.79, "goal_met": true}
        ]});
        let html = section(&with_versus, &mut num);
        assert!(
            html.contains("<td>0.41x</td><td>1.79x</td><td>met</td>"),
            "{html}"
        );
    }
}
