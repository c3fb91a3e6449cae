//! `iolab stats` (a running server's counters) and `iolab models` (the table of models).

use std::path::PathBuf;
use std::time::Duration;

use iolab_stats::{Snapshot, StatsReader};

use super::parse_secs;

#[derive(Debug, clap::Args)]
pub struct ModelsArgs {
    /// Print the model names only, one per line.
    #[arg(long)]
    pub names: bool,
}

/// Print the live counters of a running (or finished) server from its `--stats` file.
#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// The file given to `iolab serve --stats`.
    pub path: PathBuf,
    /// Print again every --interval until interrupted, with request and accept rates.
    #[arg(long)]
    pub watch: bool,
    /// Seconds between two prints with --watch.
    #[arg(long, default_value_t = 1.0, value_parser = parse_secs)]
    pub interval: f64,
    /// One JSON object per line (open, accepted, requests, refused, errors{...}).
    #[arg(long)]
    pub json: bool,
}

pub fn models(args: ModelsArgs) -> anyhow::Result<()> {
    for m in iolab_stats::models::MODELS {
        if args.names {
            println!("{}", m.name);
        } else {
            println!("{:<18} {:<15} {}", m.name, m.seed, m.what);
        }
    }
    Ok(())
}

fn print_text(s: &Snapshot, prev: Option<(&Snapshot, f64)>) {
    let mut line = format!(
        "open {:>6}  accepted {:>9}  requests {:>10}  refused {:>6}",
        s.open, s.accepted, s.requests, s.refused
    );
    if let Some((p, dt)) = prev {
        let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
        line += &format!(
            "  req/s {:>9.0}  acc/s {:>7.0}",
            rate(s.requests, p.requests),
            rate(s.accepted, p.accepted)
        );
    }
    let errors: Vec<String> = s
        .errors
        .iter()
        .filter(|(_, &v)| v > 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    line += &format!(
        "  errors: {}",
        if errors.is_empty() {
            "none".to_string()
        } else {
            errors.join(", ")
        }
    );
    println!("{line}");
}

pub fn run(args: StatsArgs) -> anyhow::Result<()> {
    let reader = StatsReader::open(&args.path)?;
    let print = |s: &Snapshot, prev: Option<(&Snapshot, f64)>| -> anyhow::Result<()> {
        if args.json {
            println!("{}", serde_json::to_string(s)?);
        } else {
            print_text(s, prev);
        }
        Ok(())
    };
    let mut prev = reader.snapshot();
    print(&prev, None)?;
    if !args.watch {
        return Ok(());
    }
    let interval = Duration::from_secs_f64(args.interval.max(0.01));
    let mut t = std::time::Instant::now();
    loop {
        std::thread::sleep(interval);
        let now = std::time::Instant::now();
        let s = reader.snapshot();
        print(&s, Some((&prev, now.duration_since(t).as_secs_f64())))?;
        use std::io::Write as _;
        std::io::stdout().flush()?;
        (prev, t) = (s, now);
    }
}
