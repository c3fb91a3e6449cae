//! The page of a run over hosts (`iolab lab --hosts`): the hosts, then every point with
//! each client host's share and the merged figures.

use std::fmt::Write as _;

use crate::results::{HostsRun, Results};
use crate::svg::esc;

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
        for l in &p.per_host {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{}</td><td>{}</td><td>{}</td><td></td></tr>",
                esc(&p.server),
                p.file,
                p.mode.label(),
                l.connections,
                esc(&l.host),
                f2(l.achieved_concurrency),
                l.ok,
                l.errors,
                l.rps,
                f2(l.p50_ms),
                f2(l.p99_ms),
                f2(l.start_ms)
            );
        }
        let m = &p.merged;
        let _ = write!(
            out,
            "<tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th><th>all</th><th>{}</th><th>{}</th><th>{}</th><th>{:.0}</th><th>{}</th><th>{}</th><th></th><th>{cpu}</th></tr>",
            esc(&p.server),
            p.file,
            p.mode.label(),
            m.connections,
            f2(m.achieved_concurrency),
            m.ok,
            m.errors,
            m.rps,
            f2(m.p50_ms),
            f2(m.p99_ms)
        );
    }
    out.push_str("</table>");
    for f in &h.failures {
        let _ = write!(out, r#"<p class="warn">{}</p>"#, esc(f));
    }
    iolab_report::page("iolab lab: hosts", super::STYLE, &out)
}
