//! `iolab lab`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

use iolab_lab::lab::Options;
use iolab_lab::select::{parse_micro, parse_models, parse_peers, read_seed_bench};
use iolab_lab::server::Kind;

use super::choice_enum;

choice_enum! {
    pub enum Profile => iolab_lab::lab::Profile {
        /// Seconds: a few low concurrency levels, a few hundred requests (for tests).
        Tiny,
        /// At most 10 minutes in all: every level, requests per point from the time budget.
        Quick,
        /// The seed's method: 50,000 requests per point, 3 repeats, every log kept.
        Full,
    }
}

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
    /// Default: all, or none when --target or --url is given.
    #[arg(long, value_name = "LIST")]
    pub models: Option<String>,
    /// Comma-separated peers: nginx, tokio, monoio, glommio; or "none". Peers not installed
    /// are skipped; one that cannot start here (io_uring refused) is reported with its error.
    /// Default: all four, or none when --target or --url is given.
    #[arg(long, value_name = "LIST")]
    pub peers: Option<String>,
    /// Your own server, started and stopped by the lab like its models (repeatable):
    /// NAME='COMMAND', run with `sh -c` in its own process group, pinned to the server CPU,
    /// after {addr} (IP:PORT), {ip}, {port}, {root} (the directory of the lab's small.html
    /// and big.bin) and {dir} (a scratch directory) are replaced. Ready when it serves
    /// both files; its CPU time is counted in Figure 1b; stdout/stderr in DIR/run/NAME/.
    /// E.g. --target py='python3 -m http.server {port} --bind {ip} --directory {root}'
    #[arg(
        long = "target",
        value_name = "NAME=COMMAND",
        conflicts_with = "scaling"
    )]
    pub targets: Vec<String>,
    /// A server already running (repeatable): NAME=http://IP:PORT[/PATH]. It must serve the
    /// lab's files (DIR/www/small.html and big.bin, the same bytes every run) as
    /// PATH/small.html and PATH/big.bin: the lab checks that first. Its CPU time is not
    /// measured (the report says so).
    #[arg(long = "url", value_name = "NAME=URL", conflicts_with = "scaling")]
    pub urls: Vec<String>,
    /// Output directory.
    #[arg(long, value_name = "DIR", default_value = "report")]
    pub out: PathBuf,
    /// Repeats per point (default: 3 in full, 1 otherwise), and of each efficiency
    /// measurement (default: 2 in tiny, 3 otherwise); the model order is shuffled for each
    /// repeat and the report gives medians and min..max.
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
    /// Run over hosts reached with OpenSSH: the server on the inventory's server host, the
    /// load from every client host at once, their results merged (TOML: see
    /// crates/apps/lab/README.md). Built-in models only; --peers defaults to none.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["scaling", "check", "render", "seed_conditions"])]
    pub hosts: Option<PathBuf>,
    /// Print results.json to stdout at the end (progress stays on stderr).
    #[arg(long)]
    pub json: bool,
    /// Do not run anything: compare two results folders, every point and Figure 1b row
    /// side by side (medians, B/A, Mann-Whitney U p-value over the repeats; "n too small"
    /// when the repeats cannot show a difference: give both runs --repeat 5). A side may be
    /// several folders, comma-separated (A1,A2 B1,B2): their repeats are pooled, so runs of
    /// the two builds taken in turns (A B B A) share the machine's drift. Prints the tables
    /// (or JSON with --json) and writes OUT/compare.html.
    #[arg(long, num_args = 2, value_names = ["A", "B"], conflicts_with_all = ["check", "render", "scaling"])]
    pub compare: Vec<PathBuf>,
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

pub fn run(args: LabArgs) -> anyhow::Result<()> {
    if let Some(dir) = &args.check {
        let c = iolab_lab::validate::check_report(dir)?;
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
    if let [a, b] = args.compare.as_slice() {
        return run_compare(a, b, &args.out, args.json);
    }
    if let Some(dir) = &args.render {
        let page = iolab_lab::select::render(dir, args.seed_bench.as_deref())?;
        println!("{}", page.display());
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
        (Some(r), _) => Some(iolab_lab::link::LinkSpec {
            rate_bps: iolab_netns::parse_rate(r).context("--link")?,
            delay: args
                .delay
                .as_deref()
                .map(iolab_netns::parse_duration)
                .transpose()
                .context("--delay")?,
        }),
        (None, true) => Some(iolab_lab::link::LinkSpec {
            rate_bps: iolab_lab::link::SEED_RATE_BPS,
            delay: None,
        }),
        (None, false) => None,
    };
    if args.backlog == Some(0) {
        bail!("--backlog must be at least 1");
    }
    let backlog = args.backlog.unwrap_or(if args.seed_conditions {
        iolab_lab::link::SEED_BACKLOG
    } else {
        4096
    });
    let no_micro = args.no_micro || (args.seed_conditions && args.micro.is_none());
    let mut targets = Vec::new();
    for t in &args.targets {
        targets.push(iolab_lab::byo::parse_command_target(t)?);
    }
    for u in &args.urls {
        targets.push(iolab_lab::byo::parse_url_target(u)?);
    }
    // Your own servers alone unless the built-in ones are named too.
    let (models, peers) = if args.hosts.is_some() {
        ("all", "none")
    } else if targets.is_empty() {
        ("all", "nginx,tokio,monoio,glommio")
    } else {
        ("none", "none")
    };
    let opts = Options {
        profile: args.profile.into(),
        models: parse_models(args.models.as_deref().unwrap_or(models))?,
        peers: parse_peers(args.peers.as_deref().unwrap_or(peers))?,
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
        targets,
    };
    if args.scaling {
        let parse = |s: &Option<String>| {
            s.as_deref()
                .map(|l| iolab_sys::cpu::parse_cpu_list(l).map_err(anyhow::Error::msg))
                .transpose()
        };
        let r = iolab_lab::scaling::run(
            &opts,
            parse(&args.server_cpus).context("--server-cpus")?,
            parse(&args.client_cpus).context("--client-cpus")?,
        )?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else if let Some(s) = &r.scaling {
            println!("{}", s.note);
            print!("{}", iolab_lab::scaling::text_table(s));
            println!("report: {}", opts.out.join("index.html").display());
        }
        return Ok(());
    }
    if let Some(inventory) = &args.hosts {
        return run_hosts(&opts, inventory, args.json);
    }
    if opts.models.is_empty() && opts.peers.is_empty() && opts.targets.is_empty() {
        bail!("nothing to measure: --models none and --peers none (and no --target or --url)");
    }
    if opts.targets.iter().any(|t| matches!(t.kind, Kind::Url(_))) {
        tracing::warn!(
            "--url: the server must serve {}/small.html and big.bin as PATH/small.html and PATH/big.bin (the lab checks before each start); its CPU time is not measured",
            opts.out.join("www").display()
        );
    }
    let seed_bench = args
        .seed_bench
        .as_deref()
        .map(read_seed_bench)
        .transpose()?;
    let mut results = iolab_lab::lab::run(&opts)?;
    if let Some(b) = seed_bench {
        results.seed_bench = Some(b);
        iolab_lab::lab::write_outputs(&results, &opts.out)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        for s in iolab_lab::report::summary(&results) {
            println!("- {s}");
        }
        println!("report: {}", opts.out.join("index.html").display());
    }
    refuse_if_nothing_measured(&results)
}

/// A run that measured nothing because its servers failed exits non-zero (scripts and CI
/// would take its empty report for a result); the report is written first and says why.
/// Over hosts: no point merged and failures listed (each server failed on its host).
fn refuse_if_nothing_measured(r: &iolab_lab::results::Results) -> anyhow::Result<()> {
    use iolab_lab::results::Status;
    if let Some(h) = &r.hosts {
        return match h.failures.first() {
            Some(first) if h.points.is_empty() => bail!(
                "nothing measured on the hosts: every server failed (first: {first}); the report says why"
            ),
            _ => Ok(()),
        };
    }
    let measured = !r.points.is_empty()
        || r.efficiency.as_ref().is_some_and(|e| !e.rows.is_empty())
        || r.scaling.is_some();
    let failed: Vec<&iolab_lab::results::TargetInfo> = r
        .targets
        .iter()
        .filter(|t| t.status == Status::Failed)
        .collect();
    if measured || failed.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = failed.iter().map(|t| t.name.as_str()).collect();
    let first = failed.iter().flat_map(|t| t.failures.first()).next();
    bail!(
        "nothing measured: every server failed ({}; first: {}); the report says why",
        names.join(", "),
        first.map_or("no reason recorded", String::as_str)
    )
}

/// `--hosts`: the run over the inventory's hosts, its points printed one per line.
fn run_hosts(opts: &Options, inventory: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let r = iolab_lab::hosts::run(opts, inventory)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else if let Some(h) = &r.hosts {
        for p in &h.points {
            println!(
                "- {} {} {} c={}: {:.0} req/s from {} hosts, p50 {:.2} ms, p99 {:.2} ms, {} errors",
                p.server,
                p.file,
                p.mode,
                p.merged.connections,
                p.merged.rps,
                p.per_host.len(),
                p.merged.p50_ms,
                p.merged.p99_ms,
                p.merged.errors
            );
        }
        for f in &h.failures {
            println!("- failed: {f}");
        }
        println!("report: {}", opts.out.join("index.html").display());
    }
    refuse_if_nothing_measured(&r)
}

/// `--compare A B`: two results folders (or comma-separated lists of them) side by side,
/// the page in OUT/compare.html.
fn run_compare(
    a: &std::path::Path,
    b: &std::path::Path,
    out: &std::path::Path,
    json: bool,
) -> anyhow::Result<()> {
    let side = |p: &std::path::Path| -> Vec<PathBuf> {
        p.to_string_lossy()
            .split(',')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect()
    };
    let c = iolab_lab::compare::compare_dirs(&side(a), &side(b))?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let page = out.join("compare.html");
    std::fs::write(&page, c.html()).with_context(|| format!("writing {}", page.display()))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        print!("{}", c.text());
        println!("page: {}", page.display());
    }
    Ok(())
}
