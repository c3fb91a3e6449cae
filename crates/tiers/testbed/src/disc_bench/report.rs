//! The DISC bench's result (typed rows, written as its JSON), and the table, the goals and
//! the HTML page made from it.

use super::net::Net;
use super::peers::our_tiers;
use super::{Config, DiscOpts, Run};
use crate::report::{
    esc, goal_line, goal_values, json_sorted, nginx_configs_html, steal_line, svg_open, Host,
    NginxConfig, Spread,
};
use anyhow::bail;
use serde::Serialize;

/// One configuration's figures at one size over its repeats.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigSummary {
    pub rps: Spread,
    pub p50_ms: Spread,
    pub p99_ms: Spread,
    pub cpu_us_per_req: Spread,
    pub fe_cpu_us_per_req: Spread,
    pub is_cpu_us_per_req: Spread,
    pub be_cpu_us_per_req: Spread,
    pub fe_bytes_per_req: Spread,
    pub is_bytes_per_req: Spread,
    pub errors: u64,
    pub stalled: u64,
    pub bytes_ok: bool,
}

impl ConfigSummary {
    fn of(runs: &[&Run]) -> ConfigSummary {
        let per_req = |f: &dyn Fn(&Run) -> f64| -> Spread {
            let v: Vec<f64> = runs
                .iter()
                .filter(|r| r.requests > 0)
                .map(|r| f(r) / r.requests as f64)
                .collect();
            Spread::of(&v)
        };
        let each =
            |f: &dyn Fn(&Run) -> f64| Spread::of(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
        ConfigSummary {
            rps: each(&|r| r.rps),
            p50_ms: each(&|r| r.p50_ms),
            p99_ms: each(&|r| r.p99_ms),
            cpu_us_per_req: per_req(&|r| r.cpu_s.iter().sum::<f64>() * 1e6),
            fe_cpu_us_per_req: per_req(&|r| r.cpu_s[0] * 1e6),
            is_cpu_us_per_req: per_req(&|r| r.cpu_s[1] * 1e6),
            be_cpu_us_per_req: per_req(&|r| r.cpu_s[2] * 1e6),
            fe_bytes_per_req: per_req(&|r| r.fe_bytes as f64),
            is_bytes_per_req: per_req(&|r| r.is_bytes as f64),
            errors: runs.iter().map(|r| r.errors).sum(),
            stalled: runs.iter().map(|r| r.stalled).sum(),
            bytes_ok: runs.iter().all(|r| r.bytes_ok),
        }
    }
}

/// The ratios between the configurations at one size (of the medians, but for the one
/// within each repeat).
#[derive(Clone, Debug, Serialize)]
pub struct Ratios {
    /// The CPU ratio within each repeat (its configurations run one after the other): the
    /// machine's drift between repeats, which moves the nginx chain by ±10% here, cancels.
    pub cpu_disc_vs_nginx_per_repeat: Spread,
    pub cpu_disc_vs_nginx: f64,
    pub cpu_disc_vs_ours: f64,
    pub rps_disc_vs_nginx: f64,
    pub rps_ours_vs_nginx: f64,
    pub p99_disc_vs_nginx: f64,
    pub p99_disc_vs_ours: f64,
}

/// One size's row of the result: each configuration's summary and the ratios between them.
#[derive(Clone, Debug, Serialize)]
pub struct SizeRow {
    pub size: usize,
    pub nginx: ConfigSummary,
    pub ours: ConfigSummary,
    pub disc: ConfigSummary,
    pub ratios: Ratios,
}

impl SizeRow {
    pub fn of(&self, c: Config) -> &ConfigSummary {
        match c {
            Config::Nginx => &self.nginx,
            Config::Ours => &self.ours,
            Config::Disc => &self.disc,
        }
    }

    fn new(runs: &[Run], size: usize) -> SizeRow {
        let summary = |c: Config| {
            let rs: Vec<&Run> = runs
                .iter()
                .filter(|r| r.size == size && r.config == c)
                .collect();
            ConfigSummary::of(&rs)
        };
        let (nginx, ours, disc) = (
            summary(Config::Nginx),
            summary(Config::Ours),
            summary(Config::Disc),
        );
        let cpu = |c: &ConfigSummary| c.cpu_us_per_req.median;
        let ratios = Ratios {
            cpu_disc_vs_nginx_per_repeat: paired_cpu(runs, size, Config::Disc, Config::Nginx),
            cpu_disc_vs_nginx: cpu(&disc) / cpu(&nginx),
            cpu_disc_vs_ours: cpu(&disc) / cpu(&ours),
            rps_disc_vs_nginx: disc.rps.median / nginx.rps.median,
            rps_ours_vs_nginx: ours.rps.median / nginx.rps.median,
            p99_disc_vs_nginx: disc.p99_ms.median / nginx.p99_ms.median,
            p99_disc_vs_ours: disc.p99_ms.median / ours.p99_ms.median,
        };
        SizeRow {
            size,
            nginx,
            ours,
            disc,
            ratios,
        }
    }
}

/// CPU per request of `a` over `b` within each repeat.
fn paired_cpu(runs: &[Run], size: usize, a: Config, b: Config) -> Spread {
    let cpu = |c: Config, rep: usize| {
        runs.iter()
            .find(|x| x.size == size && x.config == c && x.repeat == rep && x.requests > 0)
            .map(|x| x.cpu_s.iter().sum::<f64>() / x.requests as f64)
    };
    let reps = runs.iter().map(|x| x.repeat + 1).max().unwrap_or(0);
    let v: Vec<f64> = (0..reps)
        .filter_map(|rep| Some(cpu(a, rep)? / cpu(b, rep)?))
        .collect();
    Spread::of(&v)
}

/// A hook's cost over every DISC run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct HookCost {
    pub run_time_ns: u64,
    pub run_cnt: u64,
    pub ns_per_packet: f64,
}

impl HookCost {
    fn over(runs: &[Run], egress: bool) -> HookCost {
        let (mut t, mut n) = (0u64, 0u64);
        for r in runs {
            if let Some((a, b)) = if egress {
                r.hook_egress
            } else {
                r.hook_ingress
            } {
                t += a;
                n += b;
            }
        }
        HookCost {
            run_time_ns: t,
            run_cnt: n,
            ns_per_packet: if n > 0 { t as f64 / n as f64 } else { f64::NAN },
        }
    }
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Hooks {
    pub egress: HookCost,
    pub ingress: HookCost,
}

/// How the bench ran.
#[derive(Clone, Debug, Serialize)]
pub struct Method {
    pub repeats: usize,
    pub seconds: u64,
    pub connections: usize,
    /// What the table and the HTML name as the client.
    pub client: String,
    pub rate: Option<f64>,
    pub tier_cpus: String,
    pub client_cpus: String,
    pub orders: Vec<[Config; 3]>,
    pub namespaces: [String; 4],
    pub sysctls: Vec<String>,
    pub hook_iface: String,
    pub bpf_stats: &'static str,
}

/// One of our tiers' command lines in a configuration.
#[derive(Clone, Debug, Serialize)]
pub struct OurTierCommand {
    pub tier: &'static str,
    pub command: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct OurConfig {
    pub config: Config,
    pub tiers: Vec<OurTierCommand>,
}

/// The bench's result (`--json`; the table and the page are made from it).
#[derive(Clone, Debug, Serialize)]
pub struct DiscResult {
    pub bench: &'static str,
    pub machine: Host,
    pub method: Method,
    pub nginx_configs: Vec<NginxConfig>,
    pub our_tiers: Vec<OurConfig>,
    pub hooks: Hooks,
    pub sizes: Vec<SizeRow>,
    pub runs: Vec<Run>,
}

/// The result of the runs made.
pub(super) fn result(
    o: &DiscOpts,
    net: &Net,
    bpftool: bool,
    orders: Vec<[Config; 3]>,
    nginx_configs: &[(String, String)],
    runs: Vec<Run>,
) -> DiscResult {
    let our = |disc: bool| OurConfig {
        config: if disc { Config::Disc } else { Config::Ours },
        tiers: our_tiers(net, o, disc)
            .into_iter()
            .map(|(tier, spec)| OurTierCommand {
                tier,
                command: format!("iolab {}", spec.to_args().join(" ")),
            })
            .collect(),
    };
    DiscResult {
        bench: "tiers-disc",
        machine: Host::probe(),
        method: Method {
            repeats: o.repeats,
            seconds: o.seconds,
            connections: o.connections,
            client: match o.rate {
                None => format!("wrk -t1 -c{} --latency --timeout 5s", o.connections),
                Some(r) => format!(
                    "iolab load --rate {r} --keepalive -c {} --threads 1 --timeout 5s (open loop)",
                    o.connections
                ),
            },
            rate: o.rate,
            tier_cpus: o.tier_cpus.clone(),
            client_cpus: o.client_cpus.clone(),
            orders,
            namespaces: net.ns.clone(),
            sysctls: net.sysctls.clone(),
            hook_iface: net.fe_if.clone(),
            bpf_stats: if bpftool {
                "kernel.bpf_stats_enabled=1 during the run; bpftool prog show --json"
            } else {
                "bpftool missing"
            },
        },
        nginx_configs: NginxConfig::list(nginx_configs),
        our_tiers: vec![our(false), our(true)],
        hooks: Hooks {
            egress: HookCost::over(&runs, true),
            ingress: HookCost::over(&runs, false),
        },
        sizes: o
            .sizes
            .iter()
            .map(|&size| SizeRow::new(&runs, size))
            .collect(),
        runs,
    }
}

/// The nginx directives that matter for a fair fight, one line per tier.
fn nginx_summary(config: &str) -> String {
    let keys = [
        "worker_processes",
        "sendfile",
        "tcp_nopush",
        "keepalive ",
        "proxy_http_version",
        "proxy_buffers",
        "proxy_buffer_size",
        "proxy_max_temp_file_size",
        "access_log",
    ];
    config
        .lines()
        .map(str::trim)
        .filter(|l| keys.iter().any(|k| l.starts_with(k)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Seed 004's goals for DISC (issue 15), each with what this run measured and whether it
/// is met: total CPU −50% or better from 64 KiB (the ratio of medians, and within each
/// repeat), ≥ 1.5× the nginx chain's requests/s at 64 KiB, no p99 regression at any size.
/// (The hook cost per packet, the fourth, is a measurement: printed below.) `rate`: the
/// fixed rate every configuration was offered, if any.
pub fn goals(sizes: &[SizeRow], rate: Option<f64>) -> String {
    let pick = |keep: &dyn Fn(u64) -> bool, at: fn(&Ratios) -> f64| {
        goal_values(sizes, |x| x.size, keep, |x| at(&x.ratios))
    };
    let line = |name: &str, vals: Vec<(u64, f64)>, ok: &dyn Fn(f64) -> bool| {
        goal_line(name, vals, "x", ok)
    };
    let from64 = |n: u64| n >= 65536;
    let mut s = String::from("goals (seed 004):\n");
    s += &line(
        "total CPU DISC/nginx <= 0.50x from 64 KiB",
        pick(&from64, |r| r.cpu_disc_vs_nginx),
        &|x| x <= 0.5,
    );
    s += &line(
        "  the same, median within each repeat",
        pick(&from64, |r| r.cpu_disc_vs_nginx_per_repeat.median),
        &|x| x <= 0.5,
    );
    if let Some(rate) = rate {
        s += &format!(
            "  req/s DISC/nginx >= 1.5x at 64 KiB: not measured at a fixed rate ({rate} req/s offered to every configuration; run without --rate)\n"
        );
    } else {
        s += &line(
            "req/s DISC/nginx >= 1.5x at 64 KiB",
            pick(&|n| n == 65536, |r| r.rps_disc_vs_nginx),
            &|x| x >= 1.5,
        );
    }
    s += &line(
        "p99 DISC/nginx <= 1.00x at every size",
        pick(&|_| true, |r| r.p99_disc_vs_nginx),
        &|x| x <= 1.0,
    );
    s
}

fn ok_or_wrong(y: &ConfigSummary) -> &'static str {
    if y.bytes_ok {
        "ok"
    } else {
        "WRONG"
    }
}

/// The plain-text table (what the closing note pastes), with every peer's configuration.
pub fn table(v: &DiscResult) -> String {
    let mut s = String::new();
    s.push_str("size B   | config | req/s (min-max)        | p50 ms | p99 ms | CPU us/req total (FE/IS/BE)  | FE B/req  | IS B/req  | bytes | err | stalled\n");
    for x in &v.sizes {
        for c in Config::ALL {
            let y = x.of(c);
            s.push_str(&format!(
                "{:>8} | {:<6} | {:>7.0} ({:>6.0}-{:>6.0}) | {:>6.2} | {:>6.2} | {:>7.1} ({:>5.1}/{:>5.1}/{:>5.1}) | {:>9.0} | {:>9.0} | {:<5} | {:>3} | {:>3}\n",
                x.size,
                c.name(),
                y.rps.median,
                y.rps.min,
                y.rps.max,
                y.p50_ms.median,
                y.p99_ms.median,
                y.cpu_us_per_req.median,
                y.fe_cpu_us_per_req.median,
                y.is_cpu_us_per_req.median,
                y.be_cpu_us_per_req.median,
                y.fe_bytes_per_req.median,
                y.is_bytes_per_req.median,
                ok_or_wrong(y),
                y.errors,
                y.stalled,
            ));
        }
        let r = &x.ratios;
        let p = &r.cpu_disc_vs_nginx_per_repeat;
        s.push_str(&format!(
            "{:>8} | DISC vs nginx: CPU/req {:.2}x (within each repeat: median {:.2}x, {:.2}-{:.2}x), req/s {:.2}x, p99 {:.2}x; DISC vs ours: CPU/req {:.2}x, p99 {:.2}x\n",
            "",
            r.cpu_disc_vs_nginx,
            p.median,
            p.min,
            p.max,
            r.rps_disc_vs_nginx,
            r.p99_disc_vs_nginx,
            r.cpu_disc_vs_ours,
            r.p99_disc_vs_ours,
        ));
    }
    s.push_str(&goals(&v.sizes, v.method.rate));
    s.push_str(&format!(
        "eBPF hook cost (kernel bpf_stats, all DISC runs): disc_egress {:.0} ns/packet ({} packets), disc_ingress {:.0} ns/packet ({} packets)\n",
        v.hooks.egress.ns_per_packet,
        v.hooks.egress.run_cnt,
        v.hooks.ingress.ns_per_packet,
        v.hooks.ingress.run_cnt,
    ));
    let steal: Vec<(&str, Vec<f64>)> = Config::ALL
        .iter()
        .map(|&c| {
            let of_c = v.runs.iter().filter(|r| r.config == c);
            (c.name(), of_c.filter_map(|r| r.steal_pct).collect())
        })
        .collect();
    s.push_str(&steal_line(&steal));
    s.push_str(&method_lines(v));
    s
}

/// The table's closing lines: how the bench ran and every peer's configuration.
fn method_lines(v: &DiscResult) -> String {
    let me = &v.method;
    let mut s = format!(
        "method: medians of {} repeats x {} s, {} on CPU {}, tiers on CPU {}; order per repeat {}\n",
        me.repeats,
        me.seconds,
        me.client,
        me.client_cpus,
        me.tier_cpus,
        json_sorted(&me.orders)
    );
    s.push_str(&format!(
        "TCP in the bench's namespaces (all configurations): {}\n",
        me.sysctls.join(", ")
    ));
    for c in &v.nginx_configs {
        s.push_str(&format!("nginx {}: {}\n", c.tier, nginx_summary(&c.config)));
    }
    for c in &v.our_tiers {
        for t in &c.tiers {
            s.push_str(&format!("{} {}: {}\n", c.config.name(), t.tier, t.command));
        }
    }
    s
}

const COLOURS: [&str; 3] = ["#8a8a8a", "#d69e2e", "#2b6cb0"];

/// A grouped bar chart: one group per size, one bar per configuration.
fn chart(v: &DiscResult, figure: fn(&ConfigSummary) -> f64, title: &str) -> String {
    let max = v
        .sizes
        .iter()
        .flat_map(|x| Config::ALL.map(|c| figure(x.of(c))))
        .filter(|x| x.is_finite())
        .fold(1e-9, f64::max);
    let (w, h, pad) = (
        (140.0 * v.sizes.len().max(1) as f64 + 80.0).max(620.0),
        290.0,
        52.0,
    );
    // log scale: 1 KiB and 1 MiB differ by orders of magnitude
    let scale = |v: f64| (h - 2.0 * pad) * (1.0 + v).ln() / (1.0 + max).ln();
    let mut svg = svg_open(w, h, pad, title);
    for (i, x) in v.sizes.iter().enumerate() {
        let x0 = pad + 20.0 + i as f64 * 140.0;
        for (j, c) in Config::ALL.iter().enumerate() {
            let val = figure(x.of(*c));
            let bh = if val.is_finite() { scale(val) } else { 0.0 };
            svg.push_str(&format!(
                "<rect x='{:.1}' y='{:.1}' width='36' height='{bh:.1}' fill='{}'><title>{}: {val:.1}</title></rect>",
                x0 + j as f64 * 38.0,
                h - pad - bh,
                COLOURS[j],
                c.label()
            ));
            svg.push_str(&format!(
                "<text x='{:.1}' y='{:.1}' font-size='9' text-anchor='middle'>{val:.0}</text>",
                x0 + j as f64 * 38.0 + 18.0,
                h - pad - bh - 3.0
            ));
        }
        svg.push_str(&format!(
            "<text x='{}' y='{}' font-size='11' text-anchor='middle'>{} B</text>",
            x0 + 55.0,
            h - pad + 14.0,
            x.size
        ));
    }
    svg.push_str(&format!(
        "<text x='{pad}' y='16' font-size='12'>{} (log scale, max {max:.1})</text><text x='{pad}' y='32' font-size='11'><tspan fill='{}'>■ nginx chain</tspan> <tspan fill='{}'>■ our tiers, DISC off</tspan> <tspan fill='{}'>■ our tiers, DISC direct</tspan></text></svg>",
        esc(title), COLOURS[0], COLOURS[1], COLOURS[2]
    ));
    svg
}

/// The report section: a self-contained HTML page with the table and two SVG figures.
pub fn html(v: &DiscResult) -> String {
    let mut rows = String::new();
    for x in &v.sizes {
        for (j, c) in Config::ALL.iter().enumerate() {
            let y = x.of(*c);
            rows.push_str(&format!(
                "<tr><td>{}</td><td style='color:{}'>{}</td><td>{:.0} <small>({:.0}–{:.0})</small></td><td>{:.2}</td><td>{:.2}</td><td>{:.1}</td><td>{:.1} / {:.1} / {:.1}</td><td>{:.0}</td><td>{:.0}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                x.size, COLOURS[j], c.label(), y.rps.median, y.rps.min, y.rps.max,
                y.p50_ms.median, y.p99_ms.median, y.cpu_us_per_req.median, y.fe_cpu_us_per_req.median, y.is_cpu_us_per_req.median, y.be_cpu_us_per_req.median,
                y.fe_bytes_per_req.median, y.is_bytes_per_req.median,
                ok_or_wrong(y), y.errors, y.stalled
            ));
        }
    }
    let configs = nginx_configs_html(&v.nginx_configs, "nginx ");
    let text = table(v);
    format!(
        "<!doctype html><html><head><meta charset='utf-8'><title>iolab tiers: DISC against the nginx chain</title>\
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}pre{{background:#f6f6f6;padding:6px;font-size:11px;overflow-x:auto}}</style></head><body>\
<section id='tiers-disc'><h2>DISC: the back end answers on the front end's connection</h2>\
<p>client → FE → IS → BE in network namespaces: the unmodified nginx chain, our tiers (crates/tiers/disc) without DISC, our tiers with DISC in direct mode. Medians of {} repeats of {} s (min–max), client <code>{}</code> in the client's namespace; CPU per tier from a cgroup per tier (the BE's DP counts as BE). Goals (seed 004): total CPU −50% from 64 KiB with an IS, no p99 regression, ≥1.5× the nginx chain's req/s at 64 KiB.</p>\
<table><tr><th>size B</th><th>configuration</th><th>req/s</th><th>p50 ms</th><th>p99 ms</th><th>CPU µs/req</th><th>FE / IS / BE µs/req</th><th>FE bytes/req</th><th>IS bytes/req</th><th>bytes</th><th>errors</th><th>stalled</th></tr>\n{rows}</table>\
<figure>{}</figure><figure>{}</figure><pre>{}</pre><p>Machine: {}</p><details><summary>nginx configurations</summary>{configs}</details></section></body></html>\n",
        v.method.repeats, v.method.seconds,
        esc(&v.method.client),
        chart(v, |y| y.rps.median, "requests/s by payload size"),
        chart(v, |y| y.cpu_us_per_req.median, "total CPU µs per request by payload size"),
        esc(&text),
        esc(&json_sorted(&v.machine))
    )
}

/// An error naming every configuration and size that served wrong bytes.
pub fn served_right_bytes(v: &DiscResult) -> anyhow::Result<()> {
    let wrong: Vec<String> = v
        .sizes
        .iter()
        .flat_map(|x| {
            Config::ALL
                .iter()
                .filter(|c| !x.of(**c).bytes_ok)
                .map(|c| format!("{} at {} B", c.label(), x.size))
                .collect::<Vec<_>>()
        })
        .collect();
    if !wrong.is_empty() {
        bail!("wrong bytes served: {}", wrong.join(", "));
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::report::tests::goal_named;

    /// A row with only the ratios given (every figure unmeasured).
    fn ratios_row(size: usize, cpu: f64, rps: f64, p99: f64, cpu_per_repeat: f64) -> SizeRow {
        let mut x = SizeRow::new(&[], size);
        x.ratios.cpu_disc_vs_nginx = cpu;
        x.ratios.rps_disc_vs_nginx = rps;
        x.ratios.p99_disc_vs_nginx = p99;
        x.ratios.cpu_disc_vs_nginx_per_repeat.median = cpu_per_repeat;
        x
    }

    /// Each goal is judged on the sizes it names, a miss at any of them is a miss, and a
    /// goal with none of its sizes measured says so.
    #[test]
    fn goals_are_judged_on_their_own_sizes() {
        let v = [
            ratios_row(1024, 0.74, 1.3, 0.8, 0.7),
            ratios_row(65536, 0.52, 1.9, 0.03, 0.49),
            ratios_row(1048576, 0.14, 8.0, 1.2, 0.14),
        ];
        let g = goals(&v, None);
        let line = |start: &str| goal_named(&g, start);
        assert!(
            line("total CPU").contains("65536 B 0.52x, 1048576 B 0.14x — NOT met"),
            "{g}"
        );
        assert!(line("the same, median").ends_with("— met"), "{g}");
        assert!(line("req/s").contains("65536 B 1.90x — met"), "{g}");
        assert!(line("p99").ends_with("— NOT met"), "{g}");
        let small = [SizeRow::new(&[], 1024)];
        assert!(
            goals(&small, None).contains("req/s DISC/nginx >= 1.5x at 64 KiB: no size measured")
        );
    }

    /// At a fixed rate every configuration is offered the same requests/s: the req/s goal
    /// is not judged from it (it would read 1.00x, a miss that measures nothing).
    #[test]
    fn a_fixed_rate_leaves_the_req_s_goal_unjudged() {
        let v = [ratios_row(65536, 0.9, 1.0, 0.05, 0.9)];
        let g = goals(&v, Some(600.0));
        let line = |start: &str| goal_named(&g, start);
        assert!(
            line("req/s").contains("not measured at a fixed rate (600 req/s"),
            "{g}"
        );
        assert!(
            line("total CPU").ends_with("65536 B 0.90x — NOT met"),
            "{g}"
        );
        assert!(line("p99").ends_with("— met"), "{g}");
    }

    pub(in crate::disc_bench) fn run(config: Config, size: usize, rps: f64, ok: bool) -> Run {
        let disc = config == Config::Disc;
        Run {
            config,
            size,
            repeat: 0,
            bytes_ok: ok,
            bytes_error: (!ok).then(|| "x".into()),
            requests: rps as u64,
            rps,
            p50_ms: 1.0,
            p99_ms: 2.0,
            errors: 0,
            stalled: u64::from(disc),
            cpu_s: [0.1, 0.2, 0.3],
            fe_bytes: 1000 * rps as u64,
            is_bytes: 2000 * rps as u64,
            hook_egress: disc.then_some((1000, 10)),
            hook_ingress: disc.then_some((600, 20)),
            steal_pct: Some(if config == Config::Nginx { 4.0 } else { 2.0 }),
        }
    }

    /// A result as `run` builds it, from runs made up here.
    fn result(runs: Vec<Run>) -> DiscResult {
        DiscResult {
            bench: "tiers-disc",
            machine: Host {
                cpu: String::new(),
                cpus: 2,
                kernel: String::new(),
                nginx: String::new(),
            },
            method: Method {
                repeats: 1,
                seconds: 1,
                connections: 4,
                client: "wrk".into(),
                rate: None,
                tier_cpus: "0".into(),
                client_cpus: "1".into(),
                orders: vec![],
                namespaces: Default::default(),
                sysctls: vec!["FE: x=0".into()],
                hook_iface: String::new(),
                bpf_stats: "",
            },
            nginx_configs: vec![NginxConfig {
                tier: "fe".into(),
                config: "worker_processes 1;\nsendfile on;\nevents {}".into(),
            }],
            our_tiers: vec![OurConfig {
                config: Config::Disc,
                tiers: vec![OurTierCommand {
                    tier: "fe",
                    command: "iolab disc proxy --disc direct".into(),
                }],
            }],
            hooks: Hooks {
                egress: HookCost::over(&runs, true),
                ingress: HookCost::over(&runs, false),
            },
            sizes: [1024usize, 65536]
                .iter()
                .map(|&size| SizeRow::new(&runs, size))
                .collect(),
            runs,
        }
    }

    #[test]
    fn the_table_has_a_row_per_size_and_configuration_and_the_peers_settings() {
        let mut runs = Vec::new();
        for size in [1024, 65536] {
            runs.push(run(Config::Nginx, size, 100.0, true));
            runs.push(run(Config::Ours, size, 150.0, true));
            runs.push(run(Config::Disc, size, 300.0, size == 1024));
        }
        let v = result(runs);
        let t = table(&v);
        for size in ["1024", "65536"] {
            for c in Config::ALL {
                let rows = t
                    .lines()
                    .filter(|l| {
                        let f: Vec<&str> = l.split('|').map(str::trim).collect();
                        f.len() == 11 && f[0] == size && f[1] == c.name()
                    })
                    .count();
                assert_eq!(rows, 1, "{size} {c:?} in\n{t}");
            }
        }
        assert!(t.contains("req/s 3.00x"), "{t}");
        assert!(
            t.contains("CPU/req 0.33x (within each repeat: median 0.33x, 0.33-0.33x)"),
            "{t}"
        );
        assert!(t.contains("WRONG"), "the wrong bytes at 64 KiB show:\n{t}");
        // 1000 ns over 10 packets twice (two DISC runs): 100 ns; ingress 600/20: 30 ns
        assert!(t.contains("disc_egress 100 ns/packet (20 packets)"), "{t}");
        assert!(
            t.contains("host steal on the tiers' CPU during the runs (/proc/stat): median 2.0% (2.0-4.0%); nginx 4.0%, ours 2.0%, disc 2.0%"),
            "{t}"
        );
        assert!(t.contains("disc_ingress 30 ns/packet (40 packets)"), "{t}");
        assert!(
            t.contains("nginx fe: worker_processes 1; sendfile on;"),
            "{t}"
        );
        assert!(t.contains("disc fe: iolab disc proxy --disc direct"), "{t}");
        let h = html(&v);
        assert_eq!(h.matches("<svg").count(), 2);
        assert_eq!(h.matches("<tr><td>").count(), 6);
        let dir = iolab_sys::testing::tempdir("tiers-discbench").unwrap();
        let json = dir.path().join("r.json");
        crate::report::write_files(&v, &h, &json, &dir.path().join("r.html")).unwrap();
        let back: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(back["sizes"][1]["disc"]["bytes_ok"], false, "{back}");
        let e = served_right_bytes(&v).unwrap_err();
        assert!(format!("{e}").contains("DISC direct at 65536 B"), "{e}");
    }

    /// The ratio within each repeat pairs runs of the same repeat (the machine drifts
    /// between repeats); the ratio of the medians does not.
    #[test]
    fn the_per_repeat_cpu_ratio_pairs_runs_of_one_repeat() {
        let mut runs = Vec::new();
        // CPU per request (nginx, disc) by repeat: (1.0, 0.6), (3.0, 1.2), (2.0, 0.7).
        for (rep, nginx, disc) in [(0, 1.0, 0.6), (1, 3.0, 1.2), (2, 2.0, 0.7)] {
            for (c, cpu) in [
                (Config::Nginx, nginx),
                (Config::Disc, disc),
                (Config::Ours, 1.0),
            ] {
                let mut r = run(c, 65536, 1.0, true);
                r.repeat = rep;
                r.requests = 1;
                r.cpu_s = [cpu, 0.0, 0.0];
                runs.push(r);
            }
        }
        let x = SizeRow::new(&runs, 65536);
        let p = &x.ratios.cpu_disc_vs_nginx_per_repeat;
        let close = |v: f64, want: f64| (v - want).abs() < 1e-9;
        assert!(close(p.median, 0.4), "{p:?}");
        assert!(close(p.min, 0.35) && close(p.max, 0.6), "{p:?}");
        assert!(
            close(x.ratios.cpu_disc_vs_nginx, 0.35),
            "medians: 0.7 / 2.0"
        );
    }
}
