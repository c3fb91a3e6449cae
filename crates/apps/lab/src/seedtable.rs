//! Seed 000's results next to ours: one row per seed server and its iolab analogue.
//!
//! The seed's figures live in one data file, `crates/apps/lab/data/seed000.json`, each with the
//! section it comes from (§1.4–1.5, annexes B, C, E). This module only reads them and puts
//! our figures beside them, from whatever run produced the results (loopback or a shaped
//! link): the table says under which conditions ours were measured, and each row says in
//! one line why ours differs.

use serde::Deserialize;

use crate::results::{ConnMode, FileKind, Results};

/// The data file, compiled in (so a report can be rendered anywhere).
pub const SEED_JSON: &str = include_str!("../data/seed000.json");

#[derive(Debug, Clone, Deserialize)]
pub struct Seed {
    pub schema: String,
    pub source: String,
    pub conditions: SeedConditions,
    pub big_file: SeedBigFile,
    pub servers: Vec<SeedServer>,
    pub big_errors_ref: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SeedConditions {
    pub server: String,
    pub client: String,
    pub link: String,
    pub link_mbit: f64,
    pub requests_per_point: u64,
    pub top_concurrency: usize,
    pub listen_backlog: u32,
    pub syn_retransmit_s: f64,
    pub time_wait_s: f64,
    pub ephemeral_ports: u64,
    #[serde(rename = "ref")]
    pub reference: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SeedBigFile {
    pub bytes: u64,
    pub mean_s_c1000: [f64; 2],
    pub text: String,
    #[serde(rename = "ref")]
    pub reference: String,
    pub link_bound_s: f64,
    pub link_bound_text: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SeedSustained {
    /// The highest concurrency it held, when the text gives one.
    #[serde(default)]
    pub max: Option<usize>,
    /// It could not hold this many (select: 200).
    #[serde(default)]
    pub below: Option<usize>,
    pub text: String,
    #[serde(rename = "ref")]
    pub reference: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SeedServer {
    pub name: String,
    pub what: String,
    /// The lab's target name of the analogue.
    pub analogue: String,
    pub analogue_command: String,
    /// [low, high] in ms; None when the seed gives no mean (the server did not hold 1000).
    pub small_mean_ms_c1000: Option<[f64; 2]>,
    pub small_mean_text: String,
    pub small_mean_ref: String,
    pub errors_c1000: u64,
    pub errors_ref: String,
    pub sustained: SeedSustained,
    pub big_errors_c1000_10k: Vec<u64>,
    pub seed_cause: String,
}

/// The seed's data, parsed (the data file is tested to parse).
pub fn seed() -> Seed {
    serde_json::from_str(SEED_JSON).expect("crates/apps/lab/data/seed000.json parses (tested)")
}

pub use crate::results::{SeedRow, SeedTable};

/// The link the run was shaped with (`--link`, `--seed-conditions`: results' `link` block,
/// or any setting whose name starts with "link"), or None on loopback.
pub fn link_of(r: &Results) -> Option<String> {
    if let Some(l) = &r.link {
        let mut s = format!("{} Mbit/s each way", fmt_mbit(l.rate_bps as f64 / 1e6));
        if l.delay_ms > 0.0 {
            s.push_str(&format!(", {} ms one-way delay", l.delay_ms));
        }
        if l.measured_down_bps > 0.0 {
            s.push_str(&format!(
                ", measured {} Mbit/s down",
                fmt_mbit(l.measured_down_bps / 1e6)
            ));
        }
        s.push_str(&format!(", listen backlog {}", l.backlog));
        if l.seed_conditions {
            s.push_str(", --seed-conditions");
        }
        return Some(s);
    }
    let parts: Vec<String> = r
        .settings
        .iter()
        .filter(|(k, v)| {
            let k = k.to_ascii_lowercase();
            (k.starts_with("link") || k == "delay" || k == "qdisc")
                && !v.trim().is_empty()
                && !v.to_ascii_lowercase().starts_with("none")
                && !v.to_ascii_lowercase().starts_with("loopback")
        })
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

fn fmt_mbit(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The link rate in Mbit/s: results' `link` block, else the link settings ("100mbit",
/// "1gbit", "100 Mb/s").
pub fn link_mbit(r: &Results) -> Option<f64> {
    if let Some(l) = &r.link {
        return Some(l.rate_bps as f64 / 1e6);
    }
    let text = link_of(r)?.to_ascii_lowercase();
    for word in text.split(|c: char| c == ',' || c.is_whitespace()) {
        let digits: String = word
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let Ok(n) = digits.parse::<f64>() else {
            continue;
        };
        let unit = &word[digits.len()..];
        let scale = if unit.starts_with("gbit") || unit.starts_with("gb/s") {
            1000.0
        } else if unit.starts_with("mbit") || unit.starts_with("mb/s") {
            1.0
        } else if unit.starts_with("kbit") || unit.starts_with("kb/s") {
            0.001
        } else {
            continue;
        };
        return Some(n * scale);
    }
    None
}

fn backlog_of(r: &Results) -> Option<u32> {
    if let Some(l) = &r.link {
        return Some(l.backlog);
    }
    let asked: u32 = r
        .settings
        .get("listen backlog asked")?
        .trim()
        .parse()
        .ok()?;
    let cap = r
        .settings
        .get("net.core.somaxconn")
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(asked);
    Some(asked.min(cap))
}

/// One line on our conditions: where, the backlog, the requests per point.
pub fn our_conditions(r: &Results) -> String {
    let place = match link_of(r) {
        Some(l) => format!("through a shaped link ({l})"),
        None => "on loopback (no link between client and server: the client's single core sets the pace)".into(),
    };
    let backlog = backlog_of(r)
        .map(|b| format!("listen backlog {b}"))
        .unwrap_or_else(|| "listen backlog not recorded".into());
    let reqs = r
        .method
        .get("requests per point")
        .cloned()
        .unwrap_or_else(|| "-".into());
    let cpu = r
        .settings
        .get("cpu")
        .cloned()
        .unwrap_or_else(|| "this machine".into());
    format!(
        "iolab {} profile, {place}; {backlog}; Linux re-sends a dropped SYN after 1 s; requests per point: {reqs}; {cpu}",
        r.profile
    )
}

/// The highest level at which a server's curve is unbroken: every level up to it sustained.
fn sustained_max(r: &Results, name: &str) -> Option<usize> {
    let mut best = None;
    for c in r.levels(FileKind::Small, ConnMode::Close) {
        match r.point(name, FileKind::Small, ConnMode::Close, c) {
            Some(p) if p.sustained => best = Some(c),
            _ => break,
        }
    }
    best
}

fn requests_of(p: &crate::results::Point) -> u64 {
    let v: Vec<f64> = p.repeats.iter().map(|x| x.requests as f64).collect();
    iolab_sys::percentile::median(&v).unwrap_or(0.0).round() as u64
}

/// Why our row differs from the seed's, in one line.
fn why(s: &SeedServer, row: &SeedRow, seed: &Seed, r: &Results, c: usize) -> String {
    if !row.measured {
        return format!(
            "not measured in this run (add {} to --models)",
            row.analogue
        );
    }
    let mut parts: Vec<String> = Vec::new();
    let backlog = backlog_of(r);
    let seed_backlog = seed.conditions.listen_backlog;
    let ours_err = row.ours_errors.unwrap_or(0);
    if row.seed_errors > 0 && ours_err == 0 {
        parts.push(format!(
            "seed: {}; here the backlog is {} and a dropped SYN costs 1 s, not 3 s",
            s.seed_cause,
            backlog.map_or("-".into(), |b| b.to_string())
        ));
    } else if ours_err > 0 && row.seed_errors == 0 {
        parts.push(format!(
            "ours fails {ours_err} requests where the seed's did not (see the error table for their kinds)"
        ));
    } else if row.seed_errors > 0 {
        parts.push(format!("seed: {}", s.seed_cause));
    }
    if backlog.is_some_and(|b| b <= seed_backlog) && row.seed_errors == 0 && ours_err > 0 {
        parts.push(format!(
            "our backlog ({}) is as short as Windows 7's {seed_backlog}",
            backlog.unwrap_or(0)
        ));
    }
    if let (Some(mean), Some(rps)) = (row.ours_small_mean_ms, row.ours_small_rps) {
        parts.push(format!(
            "our small-file mean follows this machine's rate (Little's law: {c} clients / {rps:.0} req/s = {:.0} ms, ours {mean:.0} ms): the shared CPUs and the one client core set it, not a link",
            c as f64 / rps * 1000.0
        ));
    }
    match row.analogue.as_str() {
        "select" => parts.push(format!(
            "Linux select takes descriptors below FD_SETSIZE = {} (the seed's Windows select had its own FD_SETSIZE cap, annex E.3){}",
            libc::FD_SETSIZE,
            if c + 16 >= libc::FD_SETSIZE { ": at this concurrency the descriptors reach it" } else { "" }
        )),
        "threads" | "thread-pool" => parts.push(
            "Linux thread stacks (64 KiB asked) are committed page by page, so 1000 threads cost little memory; Windows rounded stacks to 64 KB and CreateThread failed near 1000 threads on 1 GB (annex B)"
                .into(),
        ),
        _ => {}
    }
    if row.analogue == "thread-pool" {
        parts.push("our pool has 256 threads by default: clients beyond wait in the backlog instead of failing".into());
    }
    match (link_mbit(r), row.ours_big_mean_ms) {
        (None, Some(big)) => parts.push(format!(
            "no 100 Mb/s link: the 700 KB file takes {:.2} s at c={c}, not the seed's link-bound {:.0}-{:.0} s",
            big / 1000.0,
            seed.big_file.mean_s_c1000[0],
            seed.big_file.mean_s_c1000[1]
        )),
        (Some(mbit), Some(big)) => {
            // Each of c clients gets 1/c of the link for one 700 KB response.
            let bound = c as f64 * seed.big_file.bytes as f64 * 8.0 / (mbit * 1e6);
            parts.push(format!(
                "the {mbit:.0} Mbit/s link bounds the 700 KB file at c={c} to about {bound:.1} s (ours {:.1} s)",
                big / 1000.0
            ));
        }
        _ => {}
    }
    if parts.is_empty() {
        parts.push("as the seed".into());
    }
    parts.join("; ")
}

/// The table for a run; None when the run measured no close-mode point.
pub fn build(r: &Results) -> Option<SeedTable> {
    let seed = seed();
    let c = crate::results::top_level(r, FileKind::Small)?;
    let seed_conditions = format!(
        "{}; client {}; {}; {} requests per point, concurrency up to {}; listen backlog {} (fixed on Windows 7), a dropped SYN re-sent after {} s ({})",
        seed.conditions.server,
        seed.conditions.client,
        seed.conditions.link,
        seed.conditions.requests_per_point,
        seed.conditions.top_concurrency,
        seed.conditions.listen_backlog,
        seed.conditions.syn_retransmit_s,
        seed.conditions.reference
    );
    let mut rows = Vec::new();
    for s in &seed.servers {
        let small = r.point(&s.analogue, FileKind::Small, ConnMode::Close, c);
        let big = r.point(&s.analogue, FileKind::Big, ConnMode::Close, c);
        let measured = small.is_some();
        let seed_sustained = match (s.sustained.max, s.sustained.below) {
            (Some(m), _) => format!("{m} ({})", s.sustained.text),
            (None, Some(b)) => format!("below {b} ({})", s.sustained.text),
            _ => s.sustained.text.clone(),
        };
        let mut row = SeedRow {
            seed_server: s.name.clone(),
            seed_what: s.what.clone(),
            analogue: s.analogue.clone(),
            analogue_command: s.analogue_command.clone(),
            measured,
            seed_small_mean_ms: s.small_mean_ms_c1000,
            seed_small_mean_text: s.small_mean_text.clone(),
            ours_small_mean_ms: small
                .filter(|p| p.metrics.mean_ms > 0.0)
                .map(|p| p.metrics.mean_ms),
            ours_small_sustained: small.map(|p| p.sustained),
            ours_small_rps: small.map(|p| p.metrics.rps).filter(|r| *r > 0.0),
            seed_errors: s.errors_c1000,
            seed_requests: seed.conditions.requests_per_point,
            ours_errors: small.map(|p| p.metrics.errors),
            ours_requests: small.map(requests_of),
            seed_sustained,
            ours_sustained_max: if measured {
                sustained_max(r, &s.analogue)
            } else {
                None
            },
            seed_big_mean_s: seed.big_file.mean_s_c1000,
            ours_big_mean_ms: big
                .filter(|p| p.metrics.mean_ms > 0.0)
                .map(|p| p.metrics.mean_ms),
            why: String::new(),
            refs: format!(
                "mean {}; errors {}; sustained {}; 700 KB {}",
                s.small_mean_ref, s.errors_ref, s.sustained.reference, seed.big_file.reference
            ),
        };
        row.why = why(s, &row, &seed, r, c);
        rows.push(row);
    }
    Some(SeedTable {
        concurrency: c,
        seed_conditions,
        our_conditions: our_conditions(r),
        rows,
        source: seed.source.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_file_parses_and_every_seed_server_has_an_analogue() {
        let s = seed();
        assert_eq!(s.schema, "iolab-seed/1");
        let names: Vec<&str> = s.servers.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "CR",
                "CR-iocp",
                "iocp1",
                "iocp2",
                "iocp3",
                "select",
                "thread",
                "thread-static",
                "CPC"
            ]
        );
        // Every analogue is a target the lab can run.
        let known = crate::select::parse_models("all").unwrap();
        for x in &s.servers {
            assert!(
                known.contains(&x.analogue),
                "{} maps to {}, not a lab model",
                x.name,
                x.analogue
            );
            assert!(!x.errors_ref.is_empty() && !x.small_mean_ref.is_empty());
            assert!(x.small_mean_ref.contains('§') || x.small_mean_ref.contains("annex"));
            assert_eq!(x.big_errors_c1000_10k.len(), 3, "{}", x.name);
        }
        // The figures the issue quotes, as the seed prints them (§1.5.1).
        let err = |n: &str| s.servers.iter().find(|x| x.name == n).unwrap().errors_c1000;
        assert_eq!(
            [
                err("CPC"),
                err("CR-iocp"),
                err("iocp2"),
                err("iocp3"),
                err("iocp1"),
                err("select"),
                err("thread-static"),
                err("thread"),
                err("CR")
            ],
            [0, 0, 0, 0, 1625, 13562, 16247, 18608, 19884]
        );
        let sel = s.servers.iter().find(|x| x.name == "select").unwrap();
        assert_eq!(sel.sustained.below, Some(200));
        assert_eq!(s.big_file.mean_s_c1000, [59.0, 60.0]);
        assert_eq!(s.conditions.requests_per_point, 50_000);
        assert_eq!(s.conditions.listen_backlog, 200);
        // 1,000 x 700 KB over 12.5 MB/s is about the seed's link bound.
        let bound = 1000.0 * s.big_file.bytes as f64 * 8.0 / (s.conditions.link_mbit * 1e6);
        assert!((bound - s.big_file.link_bound_s).abs() < 2.0, "{bound}");
    }

    #[test]
    fn link_rates_are_read_from_the_settings() {
        let mut r = Results::default();
        assert_eq!(link_mbit(&r), None);
        r.settings.insert("link".into(), "loopback".into());
        assert_eq!(link_of(&r), None);
        r.settings.insert("link rate".into(), "100mbit".into());
        assert_eq!(link_mbit(&r), Some(100.0));
        r.settings.insert("link rate".into(), "1gbit".into());
        assert_eq!(link_mbit(&r), Some(1000.0));
    }

    #[test]
    fn a_run_fills_the_rows_of_its_models_and_says_where_it_ran() {
        let mut r = crate::report::tests::synthetic();
        // Name the synthetic servers after two analogues.
        for p in &mut r.points {
            p.model = if p.model == "a" { "runtime" } else { "select" }.into();
        }
        for t in &mut r.targets {
            t.name = if t.name == "a" { "runtime" } else { "select" }.into();
        }
        r.settings
            .insert("listen backlog asked".into(), "4096".into());
        let t = build(&r).expect("a table");
        assert_eq!(t.concurrency, 100);
        assert_eq!(t.rows.len(), 9);
        assert!(
            t.our_conditions.contains("loopback"),
            "{}",
            t.our_conditions
        );
        let cpc = t.rows.iter().find(|x| x.seed_server == "CPC").unwrap();
        assert!(cpc.measured);
        assert_eq!(cpc.ours_sustained_max, Some(100));
        assert!(cpc.ours_small_mean_ms.unwrap() > 0.0);
        assert_eq!(cpc.seed_small_mean_ms, Some([500.0, 500.0]));
        assert!(cpc.why.contains("no 100 Mb/s link"), "{}", cpc.why);
        assert!(cpc.why.contains("Little's law"), "{}", cpc.why);
        let sel = t.rows.iter().find(|x| x.seed_server == "select").unwrap();
        assert_eq!(sel.ours_sustained_max, Some(10));
        assert_eq!(sel.ours_errors, Some(40));
        assert!(sel.why.contains("FD_SETSIZE"), "{}", sel.why);
        let cr = t.rows.iter().find(|x| x.seed_server == "CR").unwrap();
        assert!(!cr.measured && cr.why.contains("not measured"));
        // On a shaped link the conditions and the bound say so.
        r.settings.insert("link rate".into(), "100mbit".into());
        let t = build(&r).unwrap();
        assert!(t.our_conditions.contains("shaped link"));
        let cpc = t.rows.iter().find(|x| x.seed_server == "CPC").unwrap();
        assert!(cpc.why.contains("100 Mbit/s link bounds"), "{}", cpc.why);
    }
}
