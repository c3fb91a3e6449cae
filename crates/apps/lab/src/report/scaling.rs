//! The scaling run's table and page (`iolab lab --scaling`): speed-up with worker count.

use std::fmt::Write as _;

use crate::results::{ConnMode, Results, Scaling, ScalingRow};
use crate::svg::{self, esc, LineChart, Series};

/// The servers in the order of the rows.
fn servers(s: &Scaling) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for r in &s.rows {
        if !v.contains(&r.server) {
            v.push(r.server.clone());
        }
    }
    v
}

/// Text lines of the table (for the CLI summary and the report).
pub fn table_rows(s: &Scaling) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for server in servers(s) {
        for mode in ConnMode::REPORT_ORDER {
            let rows: Vec<&ScalingRow> = s
                .rows
                .iter()
                .filter(|r| r.server == server && r.mode == mode)
                .collect();
            let base = rows.iter().find(|r| r.workers == 1).map(|r| r.rps);
            for r in rows {
                out.push(vec![
                    server.clone(),
                    mode.label().into(),
                    r.workers.to_string(),
                    format!("{:.0}", r.rps),
                    format!("{:.0}..{:.0}", r.rps_spread[0], r.rps_spread[1]),
                    match base {
                        Some(b) if b > 0.0 => format!("{:.2}", r.rps / b),
                        _ => "-".into(),
                    },
                    r.errors.to_string(),
                ]);
            }
        }
    }
    out
}

pub const TABLE_HEAD: [&str; 7] = [
    "server",
    "mode",
    "workers",
    "requests/s",
    "min..max",
    "x 1 worker",
    "errors",
];

/// The report section: a figure per mode and the table.
pub fn section(s: &Scaling, num: &mut usize) -> String {
    let mut out = String::from(r#"<h2 id="scaling">Scaling with cores</h2>"#);
    let _ = write!(out, "<p>{}.</p>", esc(&s.note));
    for mode in ConnMode::REPORT_ORDER {
        let label = match mode {
            ConnMode::KeepAlive => "keep-alive",
            ConnMode::Close => "a new connection per request",
        };
        let series = servers(s)
            .into_iter()
            .map(|name| Series {
                points: s
                    .rows
                    .iter()
                    .filter(|r| r.server == name && r.mode == mode)
                    .map(|r| (r.workers as f64, r.rps))
                    .collect(),
                name,
            })
            .collect();
        let chart = LineChart {
            title: format!("Figure {num}: requests/s against server workers, {label}"),
            x_label: format!(
                "server workers (on {} server CPU{})",
                s.server_cpus.len(),
                if s.server_cpus.len() == 1 { "" } else { "s" }
            ),
            y_label: "requests/s".into(),
            log_x: s.workers.len() > 2,
            log_y: false,
            series,
        };
        out.push_str(&svg::line_chart(&chart));
        *num += 1;
    }
    out.push_str("<table><tr>");
    for h in TABLE_HEAD {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr>");
    for row in table_rows(s) {
        out.push_str("<tr>");
        for c in row {
            let _ = write!(out, "<td>{}</td>", esc(&c));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    if !s.failures.is_empty() {
        out.push_str(r#"<div class="warn"><ul>"#);
        for f in &s.failures {
            let _ = write!(out, "<li>{}</li>", esc(f));
        }
        out.push_str("</ul></div>");
    }
    out
}

/// The table as aligned text (printed at the end of a run).
pub fn text_table(s: &Scaling) -> String {
    let rows = table_rows(s);
    let mut w: Vec<usize> = TABLE_HEAD.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: Vec<String>| {
        let cells: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    };
    line(&mut out, TABLE_HEAD.iter().map(|s| s.to_string()).collect());
    let _ = writeln!(
        out,
        "|{}|",
        w.iter()
            .map(|n| "-".repeat(n + 2))
            .collect::<Vec<_>>()
            .join("|")
    );
    for r in rows {
        line(&mut out, r);
    }
    out
}

/// A scaling-only report page (no matrix was run).
pub fn render_page(r: &Results, s: &Scaling) -> String {
    let mut out = String::new();
    let ms = |k: &str| {
        r.machine
            .get(k)
            .map(|v| v.to_string().trim_matches('"').to_string())
            .unwrap_or_default()
    };
    let _ = write!(
        out,
        r#"<h1>iolab lab: scaling with cores</h1><p>Profile <b>{}</b>, {:.0} s. Machine: {} ({} CPUs), kernel {}. Command: <code>{}</code></p>"#,
        esc(&r.profile),
        r.elapsed_s,
        esc(&ms("cpu_model")),
        esc(&ms("cpus")),
        esc(&ms("kernel")),
        esc(&r.command)
    );
    let mut num = 1;
    out.push_str(&section(s, &mut num));
    out.push_str(&crate::link::report_section(r.link.as_ref()));
    out.push_str(r#"<h2 id="machine">Machine and settings</h2>"#);
    out.push_str(&super::kv_table("Settings", &r.settings));
    out.push_str(&super::kv_table("Method", &r.method));
    iolab_report::page("iolab lab: scaling", super::STYLE, &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_speedups() {
        let row = |w: usize, rps: f64| ScalingRow {
            server: "epoll".into(),
            mode: ConnMode::KeepAlive,
            workers: w,
            rps,
            rps_spread: [rps, rps],
            runs: vec![rps],
            errors: 0,
        };
        let s = Scaling {
            rows: vec![row(1, 1000.0), row(2, 1800.0)],
            workers: vec![1, 2],
            server_cpus: vec![0, 1],
            ..Scaling::default()
        };
        let t = table_rows(&s);
        assert_eq!(t[1][5], "1.80");
        assert!(text_table(&s).contains("| epoll"));
        let mut n = 1;
        let html = section(&s, &mut n);
        assert_eq!(n, 3);
        assert!(html.contains("Figure 1") && html.contains("Figure 2"));
    }
}
