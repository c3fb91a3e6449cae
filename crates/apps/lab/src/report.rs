//! `index.html`: the figures, tables and a few generated sentences, from [`Results`] alone
//! (so a report can be re-rendered from its `results.json`).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use iolab_sys::percentile::median;

use crate::results::{error_groups, ConnMode, FileKind, Point, Results, Status, ERROR_GROUPS};
use crate::svg::{self, esc, fmt_tick, BarChart, LineChart, ScatterPanel, Series};

pub mod hosts;
pub mod scaling;

fn f2(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Names of the servers in report order (models first, then peers), only those measured.
fn names(r: &Results) -> Vec<String> {
    r.targets.iter().map(|t| t.name.clone()).collect()
}

/// Figure 1 data: each server's mean response time per concurrency, up to (not including)
/// the first level it could not sustain. Returns the series and where each stopped.
pub fn figure1_series(r: &Results, file: FileKind) -> Vec<(Series, Option<usize>)> {
    let levels = r.levels(file, ConnMode::Close);
    names(r)
        .into_iter()
        .map(|name| {
            let mut pts = Vec::new();
            let mut stop = None;
            for &c in &levels {
                match r.point(&name, file, ConnMode::Close, c) {
                    Some(p) if p.sustained => pts.push((c as f64, p.metrics.mean_ms)),
                    Some(_) => {
                        stop = Some(c);
                        break;
                    }
                    // Not measured (the server failed before): the curve stops there too.
                    None => {
                        if !pts.is_empty() {
                            stop = Some(c);
                        }
                        break;
                    }
                }
            }
            (Series { name, points: pts }, stop)
        })
        .collect()
}

/// Figure 1 (or 3) as a standalone SVG, also written next to the report for READMEs.
pub fn figure1(r: &Results, file: FileKind, num: usize) -> String {
    let label = file.label();
    let series = figure1_series(r, file)
        .into_iter()
        .map(|(mut s, stop)| {
            if let Some(c) = stop {
                s.name = format!("{} (stops at {c})", s.name);
            }
            s
        })
        .collect();
    let chart = LineChart {
        title: format!("Figure {num}: mean response time against concurrency, {label}"),
        x_label: "concurrent clients (new connection per request)".into(),
        y_label: "mean response time (ms)".into(),
        log_x: true,
        log_y: true,
        series,
    };
    svg::line_chart(&chart)
}
pub use crate::results::top_level;

fn figure2(r: &Results, file: FileKind, num: usize) -> String {
    let label = file.label();
    let Some(c) = top_level(r, file) else {
        return "<p>No points measured.</p>".into();
    };
    let mut out = format!(
        r#"<figure><figcaption>Figure {num}: each request at concurrency {c}, {label}: response time (dots, left axis; <span style="color:{}">ok</span>, <span style="color:{}">SYN-retried</span>, <span style="color:{}">failed</span>) against the time it completed, and the concurrency over time (right axis): connections open in the server (solid black, from its counters; for the peers, which have none, the client's requests in flight), the client's requests in flight (dashed grey), the requested level (dashed green). On loopback a fast server holds few connections at once: the others wait in its listen queue. Display: at most {MAX_OK_DOTS} ok and {MAX_ODD_DOTS} other dots per panel, evenly sampled; every request is in logs/ and results.json.</figcaption><div class="multiples">"#,
        svg::CLASS_COLORS[0],
        svg::CLASS_COLORS[1],
        svg::CLASS_COLORS[2]
    );
    for name in names(r) {
        let Some(p) = r.point(&name, file, ConnMode::Close, c) else {
            let _ = write!(
                out,
                r#"<div class="missing">{}: not measured</div>"#,
                esc(&name)
            );
            continue;
        };
        let trace = p.trace.clone().unwrap_or_default();
        let client = line_points(&trace.client);
        let (line, line_label, line2) = if trace.server.is_empty() {
            (client, "client requests in flight", Vec::new())
        } else {
            (line_points(&trace.server), "connections", client)
        };
        let panel = ScatterPanel {
            title: format!(
                "{name}: mean {} ms, {} errors",
                f2(p.metrics.mean_ms),
                p.metrics.errors
            ),
            points: scatter_dots(&trace.scatter),
            line,
            line_label: line_label.into(),
            line2,
            requested: Some(c as f64),
        };
        out.push_str(&svg::scatter_panel(&panel));
    }
    out.push_str("</div></figure>");
    out
}

/// Dots drawn per panel of Figures 2 and 4 at most, successful requests and others
/// (SYN-retried, failed) separately; lines at most this many vertices. The page stays small
/// (a quick run's index.html under 1 MB); every request is in logs/ and results.json.
pub const MAX_OK_DOTS: usize = 350;
pub const MAX_ODD_DOTS: usize = 150;
pub const MAX_LINE_POINTS: usize = 250;

/// A scatter as a panel draws it: decimated ([`display_scatter`]), each dot's class.
pub fn scatter_dots(points: &[[f64; 3]]) -> Vec<(f64, f64, u8)> {
    display_scatter(points)
        .iter()
        .map(|x| (x[0], x[1], x[2] as u8))
        .collect()
}

/// A line of (time, level) as a panel draws it: at most [`MAX_LINE_POINTS`] vertices.
pub fn line_points(points: &[[f64; 2]]) -> Vec<(f64, f64)> {
    decimate(points, MAX_LINE_POINTS)
        .iter()
        .map(|x| (x[0], x[1]))
        .collect()
}

/// At most `max` items, evenly strided, the last one kept.
pub fn decimate<T: Copy>(v: &[T], max: usize) -> Vec<T> {
    if v.len() <= max || max == 0 {
        return v.to_vec();
    }
    let stride = v.len().div_ceil(max.saturating_sub(1).max(1));
    let mut out: Vec<T> = v.iter().step_by(stride).copied().collect();
    if (v.len() - 1) % stride != 0 {
        out.push(v[v.len() - 1]);
    }
    out
}

/// The scatter drawn for one panel: successful requests and the others decimated apart,
/// so that the rare SYN-retried or failed ones stay visible.
pub fn display_scatter(points: &[[f64; 3]]) -> Vec<[f64; 3]> {
    let ok: Vec<[f64; 3]> = points.iter().filter(|p| p[2] == 0.0).copied().collect();
    let odd: Vec<[f64; 3]> = points.iter().filter(|p| p[2] != 0.0).copied().collect();
    let mut v = decimate(&ok, MAX_OK_DOTS);
    v.extend(decimate(&odd, MAX_ODD_DOTS));
    v
}

fn error_table(r: &Results, file: FileKind) -> String {
    let Some(c) = top_level(r, file) else {
        return String::new();
    };
    let pts: Vec<&Point> = names(r)
        .iter()
        .filter_map(|n| r.point(n, file, ConnMode::Close, c))
        .collect();
    let mut kinds: Vec<String> = pts
        .iter()
        .flat_map(|p| {
            p.repeats
                .iter()
                .flat_map(|x| x.errors_by_kind.keys().cloned())
        })
        .collect();
    kinds.sort();
    kinds.dedup();
    let mut out = format!(
        "<table><caption>Errors at concurrency {c} (median over repeats; by kind: summed over repeats)</caption><tr><th>server</th><th>requests</th><th>errors</th><th>SYN-retried</th>"
    );
    for k in &kinds {
        let _ = write!(out, "<th>{}</th>", esc(k));
    }
    out.push_str("</tr>");
    for p in pts {
        let reqs: u64 =
            p.repeats.iter().map(|x| x.requests).sum::<u64>() / p.repeats.len().max(1) as u64;
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{reqs}</td><td>{}</td><td>{}</td>",
            esc(&p.model),
            p.metrics.errors,
            p.metrics.syn_retries
        );
        for k in &kinds {
            let n: u64 = p
                .repeats
                .iter()
                .filter_map(|x| x.errors_by_kind.get(k))
                .sum();
            let _ = write!(out, "<td>{n}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    out
}

fn keepalive_section(r: &Results, num: usize) -> String {
    let levels = r.levels(FileKind::Small, ConnMode::KeepAlive);
    if levels.is_empty() {
        return "<p>No keep-alive points measured.</p>".into();
    }
    let cats = names(r);
    let series = levels
        .iter()
        .map(|&c| {
            let vals = cats
                .iter()
                .map(|n| {
                    r.point(n, FileKind::Small, ConnMode::KeepAlive, c)
                        .map(|p| p.metrics.rps)
                })
                .collect();
            (format!("{c} connections"), vals)
        })
        .collect();
    let chart = BarChart {
        title: format!("Figure {num}: keep-alive throughput, small file"),
        y_label: "requests/s".into(),
        categories: cats.clone(),
        series,
    };
    let mut out = svg::bar_chart(&chart);
    let how = r
        .method
        .get("keep-alive points")
        .map(|m| format!(" Each point: {m}."))
        .unwrap_or_default();
    let _ = write!(
        out,
        "<table><caption>Keep-alive throughput, small file (median over runs, spread = min..max).{}</caption><tr><th>server</th><th>connections</th><th>requests/s</th><th>spread</th><th>runs</th><th>seconds per run</th><th>mean ms</th><th>p99 ms</th><th>errors</th></tr>",
        esc(&how)
    );
    for n in &cats {
        for &c in &levels {
            if let Some(p) = r.point(n, FileKind::Small, ConnMode::KeepAlive, c) {
                let secs: Vec<f64> = p.repeats.iter().map(|x| x.elapsed_s).collect();
                let _ = write!(
                    out,
                    "<tr><td>{}</td><td>{c}</td><td>{}</td><td>{}..{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(n),
                    f2(p.metrics.rps),
                    f2(p.spread.rps[0]),
                    f2(p.spread.rps[1]),
                    p.repeats.len(),
                    f2(median(&secs).unwrap_or(0.0)),
                    f2(p.metrics.mean_ms),
                    f2(p.metrics.p99_ms),
                    p.metrics.errors
                );
            }
        }
    }
    out.push_str("</table>");
    out
}

/// Sentences stating what the figures show, computed from the data.
pub fn summary(r: &Results) -> Vec<String> {
    let mut out = Vec::new();
    for file in FileKind::ALL {
        let label = file.label();
        let Some(c) = top_level(r, file) else {
            continue;
        };
        let pts: Vec<&Point> = names(r)
            .iter()
            .filter_map(|n| r.point(n, file, ConnMode::Close, c))
            .collect();
        let mut sustained: Vec<&&Point> = pts.iter().filter(|p| p.sustained).collect();
        sustained.sort_by(|a, b| a.metrics.mean_ms.total_cmp(&b.metrics.mean_ms));
        if let Some(best) = sustained.first() {
            let mut s = format!(
                "With the {label} at {c} concurrent clients, {} is fastest among the {} servers that sustain the load (mean {} ms, {} requests/s)",
                best.model,
                sustained.len(),
                f2(best.metrics.mean_ms),
                f2(best.metrics.rps)
            );
            if let Some(worst) = sustained.last().filter(|w| w.model != best.model) {
                let _ = write!(
                    s,
                    "; {} is slowest of them ({} ms)",
                    worst.model,
                    f2(worst.metrics.mean_ms)
                );
            }
            s.push('.');
            out.push(s);
        } else if !pts.is_empty() {
            out.push(format!(
                "With the {label}, no server sustained {c} concurrent clients here."
            ));
        }
        let stops: Vec<String> = figure1_series(r, file)
            .into_iter()
            .filter_map(|(s, stop)| stop.map(|c| format!("{} at {c}", s.name)))
            .collect();
        if !stops.is_empty() {
            out.push(format!(
                "With the {label}, these curves stop (errors above 1% or the concurrency not reached): {}.",
                stops.join(", ")
            ));
        }
        let mut errs: Vec<&&Point> = pts.iter().filter(|p| p.metrics.errors > 0).collect();
        errs.sort_by_key(|p| std::cmp::Reverse(p.metrics.errors));
        if errs.is_empty() && !pts.is_empty() {
            out.push(format!("No server made an error at {c} with the {label}."));
        } else if !errs.is_empty() {
            let list: Vec<String> = errs
                .iter()
                .take(4)
                .map(|p| format!("{} ({})", p.model, p.metrics.errors))
                .collect();
            out.push(format!(
                "Most errors at {c} with the {label}: {}.",
                list.join(", ")
            ));
        }
        let syn: u64 = pts.iter().map(|p| p.metrics.syn_retries).sum();
        if syn > 0 {
            out.push(format!(
                "{syn} requests at {c} with the {label} waited for a SYN retransmit (a dropped SYN re-sent after 1 s); they are counted but left out of the means."
            ));
        }
    }
    let ka_levels = r.levels(FileKind::Small, ConnMode::KeepAlive);
    if let Some(&c) = ka_levels.last() {
        let all: Vec<&Point> = names(r)
            .iter()
            .filter_map(|n| r.point(n, FileKind::Small, ConnMode::KeepAlive, c))
            .collect();
        let dead: Vec<&str> = all
            .iter()
            .filter(|p| p.metrics.rps <= 0.0)
            .map(|p| p.model.as_str())
            .collect();
        if !dead.is_empty() {
            out.push(format!(
                "With keep-alive at {c} connections, {} completed no request in the time given.",
                dead.join(", ")
            ));
        }
        let mut ka: Vec<&Point> = all.into_iter().filter(|p| p.metrics.rps > 0.0).collect();
        ka.sort_by(|a, b| b.metrics.rps.total_cmp(&a.metrics.rps));
        if let (Some(first), Some(last)) = (ka.first(), ka.last()) {
            out.push(format!(
                "With keep-alive at {c} connections, {} serves the most requests/s ({}), {} the fewest ({}).",
                first.model,
                f2(first.metrics.rps),
                last.model,
                f2(last.metrics.rps)
            ));
        }
    }
    let failed: Vec<String> = r
        .targets
        .iter()
        .filter(|t| t.status != Status::Ok)
        .map(|t| {
            format!(
                "{} ({}: {})",
                t.name,
                t.status,
                t.failures.first().map(String::as_str).unwrap_or("")
            )
        })
        .collect();
    if !failed.is_empty() {
        out.push(format!("Not fully measured: {}.", failed.join("; ")));
    }
    out
}

fn points_table(r: &Results) -> String {
    let mut out = String::from(
        "<details><summary>Every point (medians over repeats, spread = min..max)</summary><table><tr><th>server</th><th>file</th><th>mode</th><th>c</th><th>mean ms</th><th>spread</th><th>p50 ms</th><th>p99 ms</th><th>req/s</th><th>errors</th><th>SYN-retried</th><th>achieved c</th><th>server c (mean / max)</th><th>kept / requests</th><th>sustained</th></tr>",
    );
    for p in &r.points {
        let kept: u64 = p.repeats.iter().map(|x| x.kept).sum();
        let reqs: u64 = p.repeats.iter().map(|x| x.requests).sum();
        let srv = p
            .repeats
            .first()
            .and_then(|x| {
                x.server_concurrency_mean
                    .map(|m| format!("{} / {}", f2(m), x.server_concurrency_max.unwrap_or(0)))
            })
            .unwrap_or_else(|| "-".into());
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}..{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{srv}</td><td>{kept} / {reqs}</td><td>{}</td></tr>",
            esc(&p.model),
            p.file,
            p.mode,
            p.concurrency,
            f2(p.metrics.mean_ms),
            f2(p.spread.mean_ms[0]),
            f2(p.spread.mean_ms[1]),
            f2(p.metrics.p50_ms),
            f2(p.metrics.p99_ms),
            f2(p.metrics.rps),
            p.metrics.errors,
            p.metrics.syn_retries,
            f2(p.metrics.achieved_concurrency),
            if p.sustained { "yes" } else { "no" }
        );
    }
    out.push_str("</table></details>");
    out
}

pub(crate) fn kv_table(caption: &str, rows: &std::collections::BTreeMap<String, String>) -> String {
    let mut out = format!("<table><caption>{}</caption>", esc(caption));
    for (k, v) in rows {
        let _ = write!(out, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
    }
    out.push_str("</table>");
    out
}

fn json_cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Number(n) => n.as_f64().map(f2).unwrap_or_else(|| n.to_string()),
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// Renders one micro's JSON by the convention in `iolab_micro`: its tables and figures.
pub fn micro_block(name: &str, v: &serde_json::Value, fig_num: &mut usize) -> String {
    let mut out = format!("<h3>{}</h3>", esc(name));
    let tables = v
        .get("tables")
        .and_then(|t| t.as_array())
        .cloned()
        .unwrap_or_default();
    let figures = v
        .get("figures")
        .and_then(|t| t.as_array())
        .cloned()
        .unwrap_or_default();
    if tables.is_empty() && figures.is_empty() {
        out.push_str("<p>No tables or figures in this benchmark's output.</p>");
    }
    for t in &tables {
        let title = t.get("title").and_then(|x| x.as_str()).unwrap_or(name);
        let _ = write!(out, "<table><caption>{}</caption><tr>", esc(title));
        for c in t
            .get("columns")
            .and_then(|x| x.as_array())
            .into_iter()
            .flatten()
        {
            let _ = write!(out, "<th>{}</th>", esc(&json_cell(c)));
        }
        out.push_str("</tr>");
        for row in t
            .get("rows")
            .and_then(|x| x.as_array())
            .into_iter()
            .flatten()
        {
            out.push_str("<tr>");
            match row.as_array() {
                Some(cells) => {
                    for c in cells {
                        let _ = write!(out, "<td>{}</td>", esc(&json_cell(c)));
                    }
                }
                None => {
                    let _ = write!(out, "<td>{}</td>", esc(&json_cell(row)));
                }
            }
            out.push_str("</tr>");
        }
        out.push_str("</table>");
        if let Some(note) = t.get("note").and_then(|x| x.as_str()) {
            let _ = write!(out, r#"<p class="note">{}</p>"#, esc(note));
        }
    }
    for f in &figures {
        let s = |k: &str| f.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
        let series = f
            .get("series")
            .and_then(|x| x.as_array())
            .into_iter()
            .flatten()
            .map(|se| Series {
                name: se
                    .get("name")
                    .and_then(|x| x.as_str())
                    .unwrap_or("?")
                    .to_string(),
                points: se
                    .get("points")
                    .and_then(|x| x.as_array())
                    .into_iter()
                    .flatten()
                    .filter_map(|p| {
                        let a = p.as_array()?;
                        Some((a.first()?.as_f64()?, a.get(1)?.as_f64()?))
                    })
                    .collect(),
            })
            .collect();
        let chart = LineChart {
            title: format!("Figure {}: {}", fig_num, s("title")),
            x_label: s("x_label"),
            y_label: s("y_label"),
            log_x: f.get("log_x").and_then(|x| x.as_bool()).unwrap_or(false),
            log_y: f.get("log_y").and_then(|x| x.as_bool()).unwrap_or(false),
            series,
        };
        *fig_num += 1;
        out.push_str(&svg::line_chart(&chart));
    }
    out
}

pub(crate) const STYLE: &str = r#"body{font-family:sans-serif;max-width:1320px;margin:1em auto;padding:0 1em;color:#222;line-height:1.4}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.8em 0;font-size:13px}th,td{border:1px solid #ccc;padding:2px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}caption{text-align:left;font-weight:bold;padding:.3em 0}
.multiples{display:flex;flex-wrap:wrap;gap:6px}.missing{width:420px;height:250px;display:flex;align-items:center;justify-content:center;border:1px dashed #bbb;color:#888}
.warn{background:#fff4e0;border-left:4px solid #f0a030;padding:.4em .8em}.note{color:#555;font-size:13px}
figure{margin:1em 0}figcaption{font-size:13px;margin-bottom:.4em}svg.figure{border:1px solid #eee;margin:2px}"#;

pub fn render(r: &Results) -> String {
    if let (true, Some(s)) = (r.points.is_empty(), r.scaling.as_ref()) {
        return scaling::render_page(r, s);
    }
    if let Some(h) = &r.hosts {
        return hosts::render_page(r, h);
    }
    let mut out = String::new();
    let machine = &r.machine;
    let ms = |k: &str| machine.get(k).map(json_cell).unwrap_or_default();
    let _ = write!(
        out,
        r#"<h1>iolab lab report</h1><p>Profile <b>{}</b>, {} servers, {} points, {:.0} s. Machine: {} ({} CPUs), kernel {}. Command: <code>{}</code></p>"#,
        esc(&r.profile),
        r.targets.len(),
        r.points.len(),
        r.elapsed_s,
        esc(&ms("cpu_model")),
        esc(&ms("cpus")),
        esc(&ms("kernel")),
        esc(&r.command)
    );
    out.push_str(r##"<nav><a href="#small">small file</a> · <a href="#big">700 KB file</a> · <a href="#efficiency">CPU per request</a> · <a href="#keepalive">keep-alive</a> · <a href="#seed">seed 000 vs iolab</a> · <a href="#points">all points</a> · <a href="#micro">microbenchmarks</a> · <a href="#machine">machine and settings</a></nav>"##);
    out.push_str(r#"<h2 id="summary">What the figures show</h2><ul>"#);
    for s in summary(r) {
        let _ = write!(out, "<li>{}</li>", esc(&s));
    }
    out.push_str("</ul>");
    if !r.warnings.is_empty() {
        out.push_str(
            r#"<div class="warn"><b>Warnings: settings that may distort the results</b><ul>"#,
        );
        for w in &r.warnings {
            let _ = write!(out, "<li>{}</li>", esc(w));
        }
        out.push_str("</ul></div>");
    }
    out.push_str(&crate::link::report_section(r.link.as_ref()));
    let mut num = 1;
    for file in FileKind::ALL {
        let _ = write!(
            out,
            r#"<h2 id="{file}">{} — a new connection per request</h2>"#,
            esc(&capitalise(file.label()))
        );
        out.push_str(&figure1(r, file, num));
        if file == FileKind::Small {
            out.push_str(&efficiency_section(r));
        }
        num += 1;
        out.push_str(&figure2(r, file, num));
        num += 1;
        out.push_str(&error_table(r, file));
    }
    out.push_str(r#"<h2 id="keepalive">Keep-alive throughput</h2>"#);
    out.push_str(&keepalive_section(r, num));
    num += 1;
    out.push_str(r#"<h2 id="seed">Seed 000 next to iolab</h2>"#);
    out.push_str(&seed_section(r));
    out.push_str(r#"<h2 id="points">All points</h2>"#);
    out.push_str(&points_table(r));
    out.push_str(&servers_table(r));
    out.push_str(&peer_configs(r));
    out.push_str(r#"<h2 id="micro">Microbenchmarks</h2>"#);
    if r.micro.is_empty() && r.micro_failures.is_empty() {
        out.push_str("<p>Not run (<code>--no-micro</code>).</p>");
    }
    // In the order `iolab micro all` runs them, then any other.
    let mut names: Vec<&String> = r.micro.keys().collect();
    names.sort_by_key(|n| {
        iolab_stats::microbenchmarks::NAMES
            .iter()
            .position(|k| k == n)
            .unwrap_or(usize::MAX)
    });
    for name in names {
        out.push_str(&micro_block(name, &r.micro[name], &mut num));
    }
    for (name, e) in &r.micro_failures {
        let _ = write!(
            out,
            r#"<p class="warn">micro {}: {}</p>"#,
            esc(name),
            esc(e)
        );
    }
    if let Some(b) = &r.seed_bench {
        out.push_str(&crate::seedbench::section(b, &mut num));
    }
    out.push_str(r#"<h2 id="machine">Machine and settings</h2>"#);
    out.push_str(&kv_table("Settings that decide the result", &r.settings));
    out.push_str(&kv_table("Method", &r.method));
    iolab_report::page("iolab lab report", STYLE, &out)
}

/// Figure 1b and its table: server CPU time per request at a fixed offered rate.
pub fn efficiency_section(r: &Results) -> String {
    let mut out = String::from(
        r#"<h3 id="efficiency">Server CPU time per request at a fixed offered rate</h3>"#,
    );
    let Some(e) = &r.efficiency else {
        out.push_str("<p>Not measured in this run (<code>--no-efficiency</code>).</p>");
        return out;
    };
    let _ = write!(
        out,
        "<p>Requests/s on this machine ranks the client as much as the servers (the client saturates its core first). This figure separates them: each server is offered the same open-loop rate, below every server's saturation, and its own CPU time (user + system, all its processes and threads) is divided by the requests it answered. Rates: {}. {} runs of {} s per server and mode, at most {} requests in flight; CPU time from {}. On loopback part of the kernel's TCP receive work is charged to the sender, the same way for every server.</p>",
        esc(&e.rate_basis),
        e.repeats,
        f2(e.duration_s),
        e.connections,
        esc(&e.cpu_source)
    );
    let cats: Vec<String> = names(r)
        .into_iter()
        .filter(|n| e.rows.iter().any(|x| &x.server == n))
        .collect();
    let series = e
        .levels()
        .into_iter()
        .map(|(mode, low)| {
            let vals = cats
                .iter()
                .map(|n| e.row_at(n, mode, low).map(|x| x.us_per_request))
                .collect();
            let label = match mode {
                ConnMode::KeepAlive => "keep-alive",
                ConnMode::Close => "new connection per request",
            };
            let rate = f2(e.rate_of(mode, low).unwrap_or(0.0));
            (format!("{label} ({rate} req/s)"), vals)
        })
        .collect();
    if !cats.is_empty() {
        out.push_str(&svg::bar_chart(&BarChart {
            title:
                "Figure 1b: server CPU time per request at a fixed offered rate (lower is better)"
                    .into(),
            y_label: "CPU µs per request".into(),
            categories: cats.clone(),
            series,
        }));
    }
    out.push_str(&efficiency_table(e, &cats));
    for f in &e.failures {
        let _ = write!(out, r#"<p class="warn">{}</p>"#, esc(f));
    }
    out
}

/// The efficiency table: per server and mode its CPU per answered request and its failed
/// requests by kind (over all runs), then a warning for each row whose failures exceed 1%:
/// a server that drops requests does less work for them, so its CPU per request is no
/// like-for-like figure.
fn efficiency_table(e: &crate::results::Efficiency, servers: &[String]) -> String {
    let mut out = String::from("<table><caption>Server CPU µs per request (median over runs; spread = min..max). Failed: requests that got no complete 2xx answer, over all runs, by kind (requests still in flight when a run ended are not failures)</caption><tr><th>server</th><th>mode</th><th>offered req/s</th><th>answered req/s</th><th>CPU µs per request</th><th>spread</th><th>server CPU s</th><th>failed</th>");
    for (group, _) in ERROR_GROUPS {
        let _ = write!(out, "<th>{group}</th>");
    }
    out.push_str("</tr>");
    let mut warnings = Vec::new();
    for n in servers {
        for (mode, low) in e.levels() {
            let Some(x) = e.row_at(n, mode, low) else {
                continue;
            };
            let ach: Vec<f64> = x.repeats.iter().map(|y| y.achieved_rps).collect();
            let cpu: f64 = x.repeats.iter().map(|y| y.cpu_s).sum();
            let ok: u64 = x.repeats.iter().map(|y| y.ok).sum();
            let groups = error_groups(&x.errors_by_kind());
            let failed: u64 = groups.iter().sum();
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}..{}</td><td>{}</td><td>{failed}</td>",
                esc(n),
                mode.label(),
                f2(x.rate),
                f2(median(&ach).unwrap_or(0.0)),
                f2(x.us_per_request),
                f2(x.spread[0]),
                f2(x.spread[1]),
                f2(cpu)
            );
            for g in groups {
                let _ = write!(out, "<td>{g}</td>");
            }
            out.push_str("</tr>");
            if failed * 100 > ok + failed {
                let kinds: Vec<String> = ERROR_GROUPS
                    .iter()
                    .zip(groups)
                    .filter(|(_, g)| *g > 0)
                    .map(|((name, _), g)| format!("{g} {name}"))
                    .collect();
                warnings.push(format!(
                    "{n} {}: {failed} of {} requests failed ({}); its CPU per request is over the {ok} it answered, and a server that drops requests spends less on them: not comparable with the others.",
                    mode.label(),
                    ok + failed,
                    kinds.join(", ")
                ));
            }
        }
    }
    out.push_str("</table>");
    for w in warnings {
        let _ = write!(out, r#"<p class="warn">{}</p>"#, esc(&w));
    }
    out
}

fn opt_ms(v: Option<f64>) -> String {
    v.map(f2).unwrap_or_else(|| "-".into())
}

/// The seed-vs-iolab table (from results.json's block, or computed for an older file).
pub fn seed_section(r: &Results) -> String {
    let Some(t) = r
        .seed_vs_iolab
        .clone()
        .or_else(|| crate::seedtable::build(r))
    else {
        return "<p>No close-mode point measured: nothing to compare.</p>".into();
    };
    let c = t.concurrency;
    let mut out = format!(
        "<p><b>Seed:</b> {}.<br><b>Ours:</b> {}.</p>",
        esc(&t.seed_conditions),
        esc(&t.our_conditions)
    );
    if c != 1000 {
        let _ = write!(
            out,
            r#"<p class="warn">This run's top concurrency is {c}, not the seed's 1000: our columns are at c={c}.</p>"#
        );
    }
    let _ = write!(
        out,
        "<table><caption>Seed 000 (Windows 7, 100 Mb/s, ab) and iolab, server by server</caption><tr><th>seed server</th><th>iolab analogue</th><th>small file mean: seed, c=1000</th><th>ours, c={c} (ms)</th><th>errors: seed, c=1000 (of 50,000)</th><th>ours, c={c}</th><th>highest concurrency sustained: seed</th><th>ours</th><th>700 KB mean: seed, c=1000 (s)</th><th>ours, c={c} (s)</th><th>why ours differs</th></tr>"
    );
    for row in &t.rows {
        let seed_mean = match row.seed_small_mean_ms {
            Some([a, b]) if a == b => format!("about {a:.0} ms"),
            Some([a, b]) => format!("{a:.0}-{b:.0} ms"),
            None => row.seed_small_mean_text.clone(),
        };
        let ours_mean = match (row.ours_small_mean_ms, row.ours_small_sustained) {
            (Some(m), Some(false)) => format!("{} (not sustained)", f2(m)),
            (m, _) => opt_ms(m),
        };
        let ours_err = match (row.ours_errors, row.ours_requests) {
            (Some(e), Some(n)) => format!("{e} of {n}"),
            _ => "-".into(),
        };
        let ours_sus = if !row.measured {
            "-".into()
        } else {
            row.ours_sustained_max
                .map(|m| m.to_string())
                .unwrap_or_else(|| "none".into())
        };
        let _ = write!(
            out,
            "<tr><td>{} <span class=\"note\">({})</span></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}-{:.0}</td><td>{}</td><td style=\"text-align:left\">{}</td></tr>",
            esc(&row.seed_server),
            esc(&row.seed_what),
            esc(&row.analogue_command.replace("iolab serve --model ", "")),
            esc(&seed_mean),
            ours_mean,
            row.seed_errors,
            ours_err,
            esc(&row.seed_sustained),
            ours_sus,
            row.seed_big_mean_s[0],
            row.seed_big_mean_s[1],
            row.ours_big_mean_ms.map(|m| f2(m / 1000.0)).unwrap_or_else(|| "-".into()),
            esc(&row.why)
        );
    }
    out.push_str("</table>");
    let _ = write!(
        out,
        r#"<p class="note">Seed figures from crates/apps/lab/data/seed000.json ({}); per row: {}.</p>"#,
        esc(&t.source),
        esc(&t
            .rows
            .iter()
            .map(|x| format!("{}: {}", x.seed_server, x.refs))
            .collect::<Vec<_>>()
            .join("; "))
    );
    out
}

/// The configuration each peer ran with, as written.
fn peer_configs(r: &Results) -> String {
    let mut out = String::new();
    for (name, conf) in &r.peer_configs {
        let _ = write!(
            out,
            r#"<h3 id="config-{0}">{0} configuration (as run; also {0}.conf in the results directory)</h3><pre>{1}</pre>"#,
            esc(name),
            esc(conf)
        );
    }
    out
}

fn servers_table(r: &Results) -> String {
    let mut out = String::from("<table><caption>Servers</caption><tr><th>server</th><th>kind</th><th>what</th><th>status</th><th>failures</th></tr>");
    for t in &r.targets {
        // A user's server (--target, --url): its logs and what the lab cannot measure.
        let mut what = esc(&t.describe);
        if !t.logs.is_empty() {
            let _ = write!(what, "<br>output: {}", esc(&t.logs.join(", ")));
        }
        for n in &t.not_measured {
            let _ = write!(what, "<br>not measured: {}", esc(n));
        }
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&t.name),
            t.kind.name(),
            what,
            t.status,
            esc(&t.failures.join("; "))
        );
    }
    out.push_str("</table>");
    out
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

/// A tick label helper re-exported for text output.
pub fn short(v: f64) -> String {
    fmt_tick(v)
}

/// results.json, index.html and Figure 1 as standalone SVGs (figure1-small.svg, figure1-big.svg).
pub fn write_outputs(results: &Results, out: &Path) -> anyhow::Result<()> {
    let json = out.join("results.json");
    // Compact: the traces make it megabytes when pretty-printed (`jq .` to read it).
    std::fs::write(&json, serde_json::to_string(results)? + "\n")
        .with_context(|| format!("writing {}", json.display()))?;
    // Figure 1 on its own, for a README or a slide.
    for file in FileKind::ALL {
        let svg_path = out.join(format!("figure1-{file}.svg"));
        let num = if file == FileKind::Small { 1 } else { 3 };
        let svg = figure1(results, file, num);
        std::fs::write(&svg_path, svg)
            .with_context(|| format!("writing {}", svg_path.display()))?;
    }
    let html = out.join("index.html");
    std::fs::write(&html, render(results))
        .with_context(|| format!("writing {}", html.display()))?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::results::{Metrics, Repeat, TargetInfo, TargetKind, Trace};

    /// A synthetic result: `a` fast and sustained everywhere, `b` failing at 100.
    pub fn synthetic() -> Results {
        let mut r = Results {
            profile: "tiny".into(),
            ..Results::default()
        };
        for name in ["a", "b"] {
            r.targets.push(TargetInfo {
                name: name.into(),
                kind: TargetKind::Model,
                status: Status::Ok,
                ..TargetInfo::default()
            });
            for file in FileKind::ALL {
                for c in [1usize, 10, 100] {
                    let bad = name == "b" && c == 100;
                    let mean = c as f64 * if name == "a" { 0.1 } else { 0.3 };
                    let rep = Repeat {
                        metrics: Metrics {
                            mean_ms: mean,
                            p50_ms: mean,
                            p99_ms: mean * 3.0,
                            rps: 1e4 / (1.0 + mean),
                            errors: if bad { 40 } else { 0 },
                            syn_retries: if bad { 3 } else { 0 },
                            achieved_concurrency: c as f64,
                        },
                        requests: 300,
                        sustained: !bad,
                        errors_by_kind: if bad {
                            [("reset".to_string(), 40u64)].into()
                        } else {
                            Default::default()
                        },
                        ..Repeat::default()
                    };
                    let mut p = Point::from_repeats(name, file, ConnMode::Close, c, vec![rep]);
                    if c == 100 {
                        p.trace = Some(Trace {
                            scatter: (0..50)
                                .map(|i| {
                                    [
                                        i as f64 * 0.01,
                                        1.0 + (i % 7) as f64,
                                        if i == 3 { 1.0 } else { 0.0 },
                                    ]
                                })
                                .collect(),
                            server: (0..10)
                                .map(|i| [i as f64 * 0.05, 90.0 + i as f64])
                                .collect(),
                            client: vec![],
                        });
                    }
                    r.points.push(p);
                }
            }
            let ka = Repeat {
                metrics: Metrics {
                    rps: if name == "a" { 50_000.0 } else { 20_000.0 },
                    mean_ms: 1.0,
                    ..Metrics::default()
                },
                sustained: true,
                ..Repeat::default()
            };
            r.points.push(Point::from_repeats(
                name,
                FileKind::Small,
                ConnMode::KeepAlive,
                10,
                vec![ka],
            ));
        }
        r.micro.insert(
            "queue".into(),
            serde_json::json!({"tables": [{"title": "ns per op", "columns": ["queue", "ns"], "rows": [["vecdeque", 3.5], ["uring", 120]], "note": "10 M ops"}],
                "figures": [{"title": "depth", "x_label": "depth", "y_label": "ns", "log_x": true, "log_y": false, "series": [{"name": "vecdeque", "points": [[1, 3.0], [1000, 4.0]]}]}]}),
        );
        r
    }

    #[test]
    fn figure1_stops_where_not_sustained() {
        let r = synthetic();
        let s = figure1_series(&r, FileKind::Small);
        assert_eq!(s[0].0.points.len(), 3);
        assert_eq!(s[0].1, None);
        assert_eq!(s[1].0.points.len(), 2);
        assert_eq!(s[1].1, Some(100));
    }

    #[test]
    fn summary_names_the_fastest_and_the_failures() {
        let r = synthetic();
        let s = summary(&r).join(" ");
        assert!(s.contains("a is fastest"), "{s}");
        assert!(s.contains("b at 100"), "{s}");
        assert!(s.contains("b (40)"), "{s}");
        assert!(s.contains("SYN retransmit"), "{s}");
        assert!(
            s.contains("keep-alive at 10 connections, a serves the most"),
            "{s}"
        );
    }

    /// A quick run's worth of servers with the largest traces the lab keeps renders under
    /// 1 MB: Figure 2 and 4 are decimated for display.
    #[test]
    fn a_full_size_report_stays_under_one_megabyte() {
        let mut r = synthetic();
        let base: Vec<Point> = r.points.clone();
        for i in 0..11 {
            let name = format!("server-{i}");
            r.targets.push(TargetInfo {
                name: name.clone(),
                kind: TargetKind::Model,
                status: Status::Ok,
                ..TargetInfo::default()
            });
            for p in &base {
                let mut q = p.clone();
                q.model = name.clone();
                r.points.push(q);
            }
        }
        for p in r.points.iter_mut().filter(|p| p.trace.is_some()) {
            p.trace = Some(Trace {
                // What lab::trace keeps at most: 2000 ok + 1000 others, 1000 + 600 line points.
                scatter: (0..3000)
                    .map(|i| {
                        [
                            i as f64 * 0.001234,
                            1.0 + (i % 97) as f64 * 1.37,
                            if i < 2000 { 0.0 } else { 1.0 + (i % 2) as f64 },
                        ]
                    })
                    .collect(),
                server: (0..1000)
                    .map(|i| [i as f64 * 0.0037, 900.0 + (i % 13) as f64])
                    .collect(),
                client: (0..600)
                    .map(|i| [i as f64 * 0.0061, 990.0 + (i % 7) as f64])
                    .collect(),
            });
        }
        let html = render(&r);
        assert!(html.len() < 1_000_000, "{} bytes", html.len());
        // Still every panel, and SYN-retried / failed dots among the drawn ones.
        let svgs = crate::validate::extract_svgs(&html);
        assert!(svgs.len() >= 2 + 2 * 13);
        assert!(html.contains(svg::CLASS_COLORS[1]) && html.contains(svg::CLASS_COLORS[2]));
    }

    #[test]
    fn decimation_keeps_ends_and_bounds() {
        let v: Vec<u32> = (0..1001).collect();
        let d = decimate(&v, 100);
        assert!(d.len() <= 101, "{}", d.len());
        assert_eq!(d[0], 0);
        assert_eq!(*d.last().unwrap(), 1000);
        assert_eq!(decimate(&v[..5], 100), vec![0, 1, 2, 3, 4]);
        let s: Vec<[f64; 3]> = (0..5000)
            .map(|i| [i as f64, 1.0, if i % 50 == 0 { 2.0 } else { 0.0 }])
            .collect();
        let d = display_scatter(&s);
        assert!(d.iter().filter(|p| p[2] == 0.0).count() <= MAX_OK_DOTS + 1);
        assert_eq!(d.iter().filter(|p| p[2] == 2.0).count(), 100);
    }

    #[test]
    fn html_figures_parse_as_xml() {
        let r = synthetic();
        let html = render(&r);
        let svgs = crate::validate::extract_svgs(&html);
        // Figures 1-4 (2 + 2 panels... 2 line charts, 4 panels), keep-alive, one micro figure.
        assert_eq!(svgs.len(), 2 + 4 + 1 + 1, "{}", svgs.len());
        for s in &svgs {
            roxmltree::Document::parse(s).expect("SVG parses");
        }
        assert!(html.contains("ns per op") && html.contains("vecdeque"));
        assert!(html.contains("Errors at concurrency 100"));
        assert!(html.contains("<td>reset</td>") || html.contains("<th>reset</th>"));
    }

    /// Figure 1b's table breaks failures down by kind and warns about a server that
    /// drops requests; requests in flight at the end are no failure.
    #[test]
    fn the_efficiency_table_shows_errors_by_kind() {
        use crate::results::{EffRepeat, EffRow, Efficiency};
        let rep = |ok: u64, kinds: &[(&str, u64)]| EffRepeat {
            ok,
            errors_by_kind: kinds.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
            ..EffRepeat::default()
        };
        let e = Efficiency {
            rows: vec![
                EffRow {
                    server: "drops".into(),
                    mode: ConnMode::KeepAlive,
                    repeats: vec![
                        rep(100, &[("short_response", 30), ("timeout", 2)]),
                        rep(100, &[("reset", 4), ("refused", 1), ("weird", 1)]),
                    ],
                    ..EffRow::default()
                },
                EffRow {
                    server: "fine".into(),
                    mode: ConnMode::KeepAlive,
                    repeats: vec![rep(500, &[("unfinished", 7)])],
                    ..EffRow::default()
                },
            ],
            ..Efficiency::default()
        };
        let html = efficiency_table(&e, &["drops".into(), "fine".into()]);
        assert!(
            html.contains("<th>short or malformed answers</th>"),
            "{html}"
        );
        // failed, then timeouts, resets or refused, short or malformed, non-2xx, other
        assert!(
            html.contains("<td>38</td><td>2</td><td>5</td><td>30</td><td>0</td><td>1</td></tr>"),
            "{html}"
        );
        assert!(
            html.contains("<td>0</td><td>0</td><td>0</td><td>0</td><td>0</td><td>0</td></tr>"),
            "{html}"
        );
        assert!(html.contains("drops keep-alive: 38 of 238 requests failed (2 timeouts, 5 resets or refused, 30 short or malformed answers, 1 other)"), "{html}");
        assert!(!html.contains("fine keep-alive:"), "{html}");
    }

    /// Figure 1b at two rates per mode: a bar series and a table row for each, the low
    /// rate's apart from the main one's.
    #[test]
    fn figure_1b_shows_both_rates() {
        use crate::results::{EffRow, Efficiency};
        let row = |mode, rate, low, us| EffRow {
            server: "epoll".into(),
            mode,
            rate,
            low,
            us_per_request: us,
            ..EffRow::default()
        };
        let mut r = Results::default();
        let e = Efficiency {
            rates: [(ConnMode::KeepAlive, 8000.0), (ConnMode::Close, 2000.0)].into(),
            low_rates: [(ConnMode::KeepAlive, 1600.0), (ConnMode::Close, 400.0)].into(),
            rows: vec![
                row(ConnMode::KeepAlive, 8000.0, false, 21.5),
                row(ConnMode::Close, 2000.0, false, 40.25),
                row(ConnMode::KeepAlive, 1600.0, true, 33.75),
                row(ConnMode::Close, 400.0, true, 61.5),
            ],
            ..Efficiency::default()
        };
        assert_eq!(
            e.row_at("epoll", ConnMode::KeepAlive, true).map(|x| x.rate),
            Some(1600.0)
        );
        assert_eq!(
            e.row("epoll", ConnMode::KeepAlive).map(|x| x.rate),
            Some(8000.0)
        );
        let table = efficiency_table(&e, &["epoll".into()]);
        for cells in [
            "<td>keep-alive</td><td>8000</td><td>0.00</td><td>21.5</td>",
            "<td>keep-alive</td><td>1600</td><td>0.00</td><td>33.8</td>",
            "<td>new connection</td><td>400</td><td>0.00</td><td>61.5</td>",
        ] {
            assert!(table.contains(cells), "{cells}: {table}");
        }
        r.efficiency = Some(e);
        r.targets.push(crate::results::TargetInfo {
            name: "epoll".into(),
            ..crate::results::TargetInfo::default()
        });
        let html = efficiency_section(&r);
        for label in [
            "keep-alive (8000 req/s)",
            "keep-alive (1600 req/s)",
            "new connection per request (2000 req/s)",
            "new connection per request (400 req/s)",
        ] {
            assert!(html.contains(label), "{label}: {html}");
        }
    }
}
