//! The page of a run over hosts (`iolab lab --hosts`): the hosts, then every point with
//! each client host's share and the merged figures.

use std::fmt::Write as _;

use crate::results::{HostLoad, HostsRun, MergedLoad, Results};
use crate::svg::{self, esc};

fn f2(v: f64) -> String {
    format!("{v:.2}")
}

/// The whole page of a `--hosts` run.
pub fn render_page(r: &Results, h: &HostsRun) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<h1>iolab lab over hosts</h1><p>Profile <b>{}</b>, {:.0} s, inventory <code>{}</code>. Command: <code>{}</code></p>",
        esc(&r.profile),
        r.elapsed_s,
        esc(&h.inventory),
        esc(&r.command)
    );
    out.push_str(r#"<h2 id="hosts">Hosts</h2><table><tr><th>host</th><th>role</th><th>address</th><th>CPUs</th><th>clock offset ms</th><th>round trip ms</th><th>machine</th></tr>"#);
    for x in &h.hosts {
        let machine: Vec<String> = x.machine.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        let cpus: Vec<String> = x.cpus.iter().map(usize::to_string).collect();
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:+.3}</td><td>{:.3}</td><td>{}</td></tr>",
            esc(&x.name),
            esc(&x.role),
            esc(&x.address),
            esc(&cpus.join(",")),
            x.clock_offset_ms,
            x.clock_rtt_ms,
            esc(&machine.join("; "))
        );
    }
    out.push_str("</table>");
    out.push_str(r#"<h2 id="points">Points</h2><p>Latency quantiles of all hosts' requests together (their histograms merged); requests/s and concurrency summed over the hosts; each host's start on the controller's clock (offset-corrected).</p><table><tr><th>server</th><th>file</th><th>mode</th><th>connections</th><th>host</th><th>achieved concurrency</th><th>ok</th><th>errors</th><th>req/s</th><th>p50 ms</th><th>p99 ms</th><th>start ms</th><th>server CPU µs per request</th></tr>"#);
    for p in &h.points {
        let cpu = p.us_per_request.map_or("-".into(), f2);
        let point = [
            esc(&p.server),
            p.file.to_string(),
            p.mode.label().to_string(),
        ];
        for l in &p.per_host {
            let share = [l.connections.to_string(), esc(&l.host)];
            let rest = [f2(l.start_ms), String::new()];
            let load = l.cells();
            row(
                &mut out,
                "td",
                point.iter().chain(&share).chain(&load).chain(&rest),
            );
        }
        let m = &p.merged;
        let all = [m.connections.to_string(), "all".to_string()];
        let rest = [String::new(), cpu];
        row(
            &mut out,
            "th",
            point.iter().chain(&all).chain(&m.cells()).chain(&rest),
        );
    }
    out.push_str("</table>");
    out.push_str(&figure2(h));
    for f in &h.failures {
        let _ = write!(out, r#"<p class="warn">{}</p>"#, esc(f));
    }
    iolab_report::page("iolab lab: hosts", super::STYLE, &out)
}

/// Figure 2 over hosts: at the top close-mode level, every client host's requests on the
/// controller's clock in one panel per server and file.
fn figure2(h: &HostsRun) -> String {
    use super::{line_points, scatter_dots};
    let mut out = String::new();
    for p in &h.points {
        let Some(trace) = &p.trace else { continue };
        if out.is_empty() {
            let _ = write!(
                out,
                r#"<h2 id="figure2">Figure 2</h2><figure><figcaption>Each request at the top close-mode level from every client host, on the controller's clock (each host's start offset-corrected): response time (dots, left axis; <span style="color:{}">ok</span>, <span style="color:{}">SYN-retried</span>, <span style="color:{}">failed</span>) against the time it completed, and all hosts' requests in flight (right axis) beside the requested level. No server curve: the server's counters stay on its host.</figcaption><div class="multiples">"#,
                svg::CLASS_COLORS[0],
                svg::CLASS_COLORS[1],
                svg::CLASS_COLORS[2]
            );
        }
        let panel = svg::ScatterPanel {
            title: format!(
                "{} {}: {} connections from {} hosts, p50 {} ms, {} errors",
                p.server,
                p.file,
                p.concurrency,
                p.per_host.len(),
                f2(p.merged.p50_ms),
                p.merged.errors
            ),
            points: scatter_dots(&trace.scatter),
            line: line_points(&trace.client),
            line_label: "client requests in flight, all hosts".into(),
            line2: Vec::new(),
            requested: Some(p.concurrency as f64),
        };
        out.push_str(&svg::scatter_panel(&panel));
    }
    if !out.is_empty() {
        out.push_str("</div></figure>");
    }
    out
}

/// The load figures a host's share and the merged line both show, in the table's order.
macro_rules! load_cells {
    ($($t:ty),*) => {$(
        impl $t {
            fn cells(&self) -> [String; 6] {
                [
                    f2(self.achieved_concurrency),
                    self.ok.to_string(),
                    self.errors.to_string(),
                    format!("{:.0}", self.rps),
                    f2(self.p50_ms),
                    f2(self.p99_ms),
                ]
            }
        }
    )*};
}
load_cells!(HostLoad, MergedLoad);

/// One table row: each cell (already escaped) in `<td>` (a host's share) or `<th>` (the
/// merged figures, set off from the shares).
fn row<'a>(out: &mut String, tag: &str, cells: impl Iterator<Item = &'a String>) {
    out.push_str("<tr>");
    for c in cells {
        let _ = write!(out, "<{tag}>{c}</{tag}>");
    }
    out.push_str("</tr>");
}
