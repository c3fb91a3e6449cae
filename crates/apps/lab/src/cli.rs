//! `iolab lab`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::lab::{Options, Profile};

/// Runs seed 000's experiments over every I/O model (and nginx and the tokio server), then
/// writes DIR/results.json, DIR/logs/*.csv and DIR/index.html (Figures 1 and 2 for a small
/// and a 700 KB file, error tables, keep-alive throughput, microbenchmarks, the machine).
///
/// Server and client are pinned to different CPUs; client connections come from several
/// loopback source addresses; means use only steady-state requests (see the report's
/// Method table). Ctrl-C stops every server before exiting.
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct LabArgs {
    /// tiny: seconds (tests); quick: at most 10 minutes in all, requests per point sized
    /// to fit; full: the seed's 50,000 requests per point, 3 repeats.
    #[arg(long, value_enum, default_value = "quick")]
    pub profile: Profile,
    /// Comma-separated models to run (see `iolab models`; also uring-callback-sync, i.e.
    /// uring-callback --accept sync, seed 000's CR), "all", or "none" (peers only).
    #[arg(long, value_name = "LIST", default_value = "all")]
    pub models: String,
    /// Comma-separated peers: nginx, tokio; or "none". Peers not installed are skipped.
    #[arg(long, value_name = "LIST", default_value = "nginx,tokio")]
    pub peers: String,
    /// Output directory.
    #[arg(long, value_name = "DIR", default_value = "report")]
    pub out: PathBuf,
    /// Repeats per point (default: 3 in full, 1 otherwise); the model order is shuffled
    /// for each repeat and the report gives medians and min..max.
    #[arg(long, value_name = "N")]
    pub repeat: Option<usize>,
    /// Skip the Microbenchmarks section.
    #[arg(long)]
    pub no_micro: bool,
    /// Comma-separated microbenchmarks to run (default: all of them).
    #[arg(long, value_name = "LIST", conflicts_with = "no_micro")]
    pub micro: Option<String>,
    /// Worker threads or loops passed to each model (0 = the model's default); nginx and
    /// the tokio server get this many, at least 1.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub workers: usize,
    /// Listen backlog asked of every server (the kernel caps it at net.core.somaxconn);
    /// default 4096, or the seed's 200 with --seed-conditions.
    #[arg(long, value_name = "N")]
    pub backlog: Option<u32>,
    /// Run each server in its own network namespace behind a veth pair shaped with tc to
    /// RATE each way (e.g. 100mbit, 1gbit), instead of loopback. iolab creates and removes
    /// the namespace, veths and qdiscs (also on Ctrl-C / SIGTERM; leftovers of a killed run
    /// are removed at the next start). Needs root and iproute2.
    #[arg(long, value_name = "RATE")]
    pub link: Option<String>,
    /// One-way delay added on the link (netem on both ends; e.g. 5ms). Needs --link and a
    /// kernel with sch_netem.
    #[arg(long, value_name = "D", requires = "link")]
    pub delay: Option<String>,
    /// Instead of the matrix: requests/s against server workers (1, 2, 4, ... up to the
    /// server's CPUs) for epoll, uring-fixed, runtime, nginx and tokio, keep-alive and a
    /// new connection per request; a figure and a table in DIR/index.html, a "scaling"
    /// block in results.json.
    #[arg(long, conflicts_with_all = ["seed_conditions", "check", "render"])]
    pub scaling: bool,
    /// CPUs for the server with --scaling (e.g. 0-7; default: the first half of the
    /// machine's).
    #[arg(long, value_name = "LIST", requires = "scaling")]
    pub server_cpus: Option<String>,
    /// CPUs for the load generator with --scaling (default: the other half).
    #[arg(long, value_name = "LIST", requires = "scaling")]
    pub client_cpus: Option<String>,
    /// Seed 000's method in one switch: a 100 Mb/s link (unless --link says otherwise),
    /// listen backlog 200, a new connection per request only (no keep-alive points), no
    /// microbenchmarks unless --micro; the full profile then runs the seed's 50,000 requests
    /// per point, the quick one fits in 13 minutes.
    #[arg(long)]
    pub seed_conditions: bool,
    /// Time budget in seconds for the whole run (quick profile; default 600).
    #[arg(long, value_name = "SECS")]
    pub budget: Option<u64>,
    /// Skip the efficiency pass (server CPU time per request at a fixed offered rate).
    #[arg(long)]
    pub no_efficiency: bool,
    /// Offered rate of the efficiency pass, requests/s, for both keep-alive and new
    /// connections (default: half the lowest peak any server reached in this run, per mode).
    #[arg(long, value_name = "REQ_PER_S", conflicts_with = "no_efficiency")]
    pub efficiency_rate: Option<f64>,
    /// Print results.json to stdout at the end (progress stays on stderr).
    #[arg(long)]
    pub json: bool,
    /// Do not run anything: validate DIR/results.json and the SVGs of DIR/index.html.
    #[arg(long, value_name = "DIR", conflicts_with = "render")]
    pub check: Option<PathBuf>,
    /// Do not run anything: rewrite DIR/index.html from DIR/results.json (with the
    /// seeder section from DIR/seed-bench.json when that file is there).
    #[arg(long, value_name = "DIR")]
    pub render: Option<PathBuf>,
    /// Add the BitTorrent seeder section: the JSON written by `iolab seed bench --json
    /// FILE` (Hekate and libtorrent against peers), kept in results.json.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["scaling", "check"])]
    pub seed_bench: Option<PathBuf>,
}

/// The seeder bench JSON of `path`: an object with a `summary` list, or a clear error.
pub fn read_seed_bench(path: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    if !v.get("summary").is_some_and(serde_json::Value::is_array) {
        bail!(
            "{} is not the JSON of `iolab seed bench --json` (no \"summary\" list)",
            path.display()
        );
    }
    Ok(v)
}

fn list(s: &str) -> Vec<String> {
    s.split(',')
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect()
}

/// The model names asked for, checked against `iolab models`.
pub fn parse_models(s: &str) -> anyhow::Result<Vec<String>> {
    let known = crate::lab::target_names();
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    let asked = list(s);
    if asked.is_empty() {
        bail!(
            "--models is empty; give model names ({}) or \"all\"",
            known.join(", ")
        );
    }
    if asked.iter().any(|m| m == "none") {
        return Ok(Vec::new());
    }
    if asked.iter().any(|m| m == "all") {
        return Ok(known.iter().map(|s| s.to_string()).collect());
    }
    for m in &asked {
        if !known.contains(&m.as_str()) {
            bail!("unknown model {m:?}; known: {}", known.join(", "));
        }
    }
    Ok(asked)
}

pub fn parse_peers(s: &str) -> anyhow::Result<Vec<String>> {
    let asked = list(s);
    if asked.iter().any(|p| p == "none") {
        return Ok(Vec::new());
    }
    for p in &asked {
        if p != "nginx" && p != "tokio" {
            bail!("unknown peer {p:?}; known: nginx, tokio (or none)");
        }
    }
    Ok(asked)
}

pub fn parse_micro(s: Option<&str>, none: bool) -> anyhow::Result<Vec<String>> {
    if none {
        return Ok(Vec::new());
    }
    let Some(s) = s else {
        return Ok(iolab_micro::NAMES.iter().map(|s| s.to_string()).collect());
    };
    let asked = list(s);
    for m in &asked {
        if !iolab_micro::NAMES.contains(&m.as_str()) {
            bail!(
                "unknown microbenchmark {m:?}; known: {}",
                iolab_micro::NAMES.join(", ")
            );
        }
    }
    Ok(asked)
}

pub fn run(args: LabArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.check {
        let c = crate::validate::check_report(dir)?;
        println!(
            "{}: valid; {} points over {} servers; {} SVG figures ({} paths, {} circles)",
            dir.display(),
            c.points,
            c.models.len(),
            c.svgs,
            c.paths,
            c.circles
        );
        return Ok(());
    }
    if let Some(dir) = &args.render {
        let p = dir.join("results.json");
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        let mut r: crate::results::Results =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
        // The seed table is a function of the results: rebuilt with this version's notes.
        r.seed_vs_iolab = crate::seedtable::build(&r);
        let bench = args
            .seed_bench
            .clone()
            .unwrap_or(dir.join("seed-bench.json"));
        if args.seed_bench.is_some() || bench.exists() {
            r.seed_bench = Some(read_seed_bench(&bench)?);
        }
        crate::lab::write_outputs(&r, dir)?;
        println!("{}", dir.join("index.html").display());
        return Ok(());
    }
    if args.repeat == Some(0) {
        bail!("--repeat must be at least 1");
    }
    if args
        .efficiency_rate
        .is_some_and(|r| !(r.is_finite() && r > 0.0))
    {
        bail!("--efficiency-rate must be a positive number of requests per second");
    }
    if args.budget == Some(0) {
        bail!("--budget must be positive");
    }
    let link = match (&args.link, args.seed_conditions) {
        (Some(r), _) => Some(crate::link::LinkSpec {
            rate_bps: iolab_netns::parse_rate(r).context("--link")?,
            delay: args
                .delay
                .as_deref()
                .map(iolab_netns::parse_duration)
                .transpose()
                .context("--delay")?,
        }),
        (None, true) => Some(crate::link::LinkSpec {
            rate_bps: crate::link::SEED_RATE_BPS,
            delay: None,
        }),
        (None, false) => None,
    };
    if args.backlog == Some(0) {
        bail!("--backlog must be at least 1");
    }
    let backlog = args.backlog.unwrap_or(if args.seed_conditions {
        crate::link::SEED_BACKLOG
    } else {
        4096
    });
    let no_micro = args.no_micro || (args.seed_conditions && args.micro.is_none());
    let opts = Options {
        profile: args.profile,
        models: parse_models(&args.models)?,
        peers: parse_peers(&args.peers)?,
        out: args.out.clone(),
        repeat: args.repeat,
        micro: parse_micro(args.micro.as_deref(), no_micro)?,
        workers: args.workers,
        backlog,
        budget: args.budget.map(Duration::from_secs),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        efficiency: !args.no_efficiency,
        efficiency_rate: args.efficiency_rate,
        link,
        seed_conditions: args.seed_conditions,
    };
    if args.scaling {
        let parse = |s: &Option<String>| {
            s.as_deref()
                .map(|l| iolab_sys::cpu::parse_cpu_list(l).map_err(anyhow::Error::msg))
                .transpose()
        };
        let r = crate::scaling::run(
            &opts,
            parse(&args.server_cpus).context("--server-cpus")?,
            parse(&args.client_cpus).context("--client-cpus")?,
        )?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else if let Some(s) = &r.scaling {
            println!("{}", s.note);
            print!("{}", crate::scaling::text_table(s));
            println!("report: {}", opts.out.join("index.html").display());
        }
        return Ok(());
    }
    if opts.models.is_empty() && opts.peers.is_empty() {
        bail!("nothing to measure: --models none and --peers none");
    }
    let seed_bench = args
        .seed_bench
        .as_deref()
        .map(read_seed_bench)
        .transpose()?;
    let mut results = crate::lab::run(&opts)?;
    if let Some(b) = seed_bench {
        results.seed_bench = Some(b);
        crate::lab::write_outputs(&results, &opts.out)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        for s in crate::report::summary(&results) {
            println!("- {s}");
        }
        println!("report: {}", opts.out.join("index.html").display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_lists() {
        assert_eq!(parse_models("all").unwrap().len(), 11);
        assert!(parse_models("uring-callback-sync").is_ok());
        assert_eq!(
            parse_models("threads, epoll").unwrap(),
            vec!["threads", "epoll"]
        );
        let e = parse_models("threads,nope").unwrap_err().to_string();
        assert!(
            e.contains("unknown model \"nope\"") && e.contains("uring-fixed"),
            "{e}"
        );
        assert!(parse_models(",").is_err());
        assert!(parse_models("none").unwrap().is_empty());
    }

    #[test]
    fn peer_and_micro_lists() {
        assert!(parse_peers("none").unwrap().is_empty());
        assert_eq!(parse_peers("nginx").unwrap(), vec!["nginx"]);
        assert!(parse_peers("apache").is_err());
        assert!(parse_micro(None, true).unwrap().is_empty());
        assert_eq!(
            parse_micro(None, false).unwrap().len(),
            iolab_micro::NAMES.len()
        );
        assert_eq!(parse_micro(Some("queue"), false).unwrap(), vec!["queue"]);
        assert!(parse_micro(Some("bogus"), false).is_err());
    }
}
