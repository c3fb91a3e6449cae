//! `iolab`: server I/O on Linux, built and measured.

use clap::{Parser, Subcommand};

mod cli;

#[derive(Parser)]
#[command(name = "iolab", version, about = "Server I/O on Linux, built and measured", long_about = None)]
struct Cli {
    /// More diagnostics on stderr: -v for info (e.g. the I/O driver chosen), -vv for debug,
    /// -vvv for trace. RUST_LOG (e.g. RUST_LOG=iolab_runtime=debug) takes precedence.
    /// Warnings and errors are always shown.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

/// Libraries log through `tracing`; the binary decides where it goes: stderr, at the level
/// -v/-vv/-vvv ask for, or as RUST_LOG says. Progress of long work (events with target
/// `progress`, at info: the lab's `[ 3/40 0:01:12] ...` lines, micro's and `seed bench`'s)
/// is always shown, as the bare message: it is what a user watches, not a diagnostic.
/// `RUST_LOG=progress=off` silences it.
fn init_logging(verbose: u8) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::{fmt, prelude::*, EnvFilter};
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let rust_log = std::env::var("RUST_LOG")
        .ok()
        .filter(|s| !s.trim().is_empty());
    let diagnostics_filter = EnvFilter::new(rust_log.as_deref().unwrap_or(level))
        // The progress layer below prints those; not twice.
        .add_directive("progress=off".parse().expect("a valid directive"));
    let progress_level = match rust_log.as_deref() {
        Some(s) if s.split(',').any(|d| d.trim() == "progress=off") => LevelFilter::OFF,
        _ => LevelFilter::INFO,
    };
    let progress = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_level(false)
        .with_target(false)
        .without_time()
        .with_filter(Targets::new().with_target("progress", progress_level));
    let diagnostics = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .without_time()
        .with_filter(diagnostics_filter);
    let _ = tracing_subscriber::registry()
        .with(progress)
        .with(diagnostics)
        .try_init();
}

#[derive(Subcommand)]
enum Command {
    /// Serve a directory over HTTP with one of the I/O models.
    Serve(cli::serve::ServeArgs),
    /// List the I/O models (name, seed analogue, what it is).
    Models(cli::stats::ModelsArgs),
    /// Print the live counters of a running server (from its --stats file).
    Stats(cli::stats::StatsArgs),
    /// Generate HTTP load against a URL and report latency, throughput and errors.
    Load(cli::load::LoadArgs),
    /// Run the experiments over every model and write the HTML report.
    Lab(cli::lab::LabArgs),
    /// Run a microbenchmark: runtime, ctxswitch, queue, syscalls, echo, limits, all.
    Micro(cli::micro::MicroArgs),
    /// The tiers testbed (client, FE, IS, BE: nginx in network namespaces) and ODB: up, down, status, bench.
    Tiers(cli::tiers::TiersArgs),
    /// Seed files over BitTorrent (Hekate, on iolab-runtime); `seed bench` measures it.
    Seed(cli::seed::SeedArgs),
    /// A small HTTP BitTorrent tracker (announce, compact peers, scrape).
    Tracker(cli::tracker::TrackerArgs),
    /// Disk I/O simulator: validate-disksim, run, bench (trace-driven, discrete-event).
    Disksim(cli::disksim::DisksimArgs),
    /// DISC (seed 004 ch. 3): our FE/IS/BE tiers and the BE's shortcut to the client: be, proxy, check.
    Disc(cli::disc::DiscArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let result = match cli.command {
        Command::Serve(a) => cli::serve::run(a),
        Command::Models(a) => cli::stats::models(a),
        Command::Stats(a) => cli::stats::run(a),
        Command::Load(a) => cli::load::run(a),
        Command::Lab(a) => cli::lab::run(a),
        Command::Micro(a) => cli::micro::run(a),
        Command::Tiers(a) => cli::tiers::run(a),
        Command::Seed(a) => cli::seed::run(a),
        Command::Tracker(a) => cli::tracker::run(a),
        Command::Disksim(a) => cli::disksim::run(a),
        Command::Disc(a) => cli::disc::run(a),
    };
    if result.is_err() {
        // A failure caused by a signal's teardown is not the outcome: the handler exits with
        // 128 + the signal once everything is removed.
        iolab_netns::wait_if_tearing_down();
    }
    result
}
