//! `iolab load`.

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use iolab_load::{run as run_load, LoadConfig, LoadReport};

/// Generate HTTP load against a URL and report latency, throughput and errors.
///
/// Closed loop by default: -c clients, each sending its next request as soon as the previous
/// one ends (as ab and wrk). With --rate, open loop: requests are due at a constant rate and
/// their latency counts from when they were due (as wrk2), so a stalled server cannot hide
/// behind a slowed-down client (no coordinated omission); -c then caps the connections.
///
/// A NEW CONNECTION PER REQUEST is the default (--no-keepalive), as ab's default and the
/// seed's experiments; --keepalive reuses connections (as wrk).
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct LoadArgs {
    /// Target: http://HOST[:PORT][/PATH], HOST an IPv4 literal, [IPv6] literal or localhost.
    pub url: String,
    /// Concurrent clients (closed loop) or the connection cap (open loop).
    #[arg(
        short = 'c',
        long = "connections",
        default_value_t = 1,
        value_name = "N"
    )]
    pub connections: usize,
    /// Stop after this many requests (default: 1 when no -d is given).
    #[arg(
        short = 'n',
        long = "requests",
        value_name = "M",
        conflicts_with = "duration"
    )]
    pub requests: Option<u64>,
    /// Stop after this long (e.g. 10s, 500ms, 2m; a bare number is seconds); requests
    /// still in flight then are counted as unfinished.
    #[arg(short = 'd', long = "duration", value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Reuse connections (HTTP/1.1 keep-alive).
    #[arg(long, conflicts_with = "no_keepalive")]
    pub keepalive: bool,
    /// One new connection per request, closed by the server (the default).
    #[arg(long)]
    pub no_keepalive: bool,
    /// Open loop: this many requests per second in all.
    #[arg(long, value_name = "R")]
    pub rate: Option<f64>,
    /// Per-request timeout (from the request's actual start).
    #[arg(long, default_value = "10s", value_name = "T", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Spread connections over these local source addresses (comma-separated), so 50,000
    /// new connections do not run out of ephemeral ports (e.g. 127.0.0.2,127.0.0.3).
    #[arg(long, value_delimiter = ',', value_name = "ADDRS")]
    pub source: Vec<IpAddr>,
    /// Client threads, each with its own epoll loop (default: 1 with --cpu, else one per
    /// CPU; at most -c).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub threads: usize,
    /// Pin the client threads to this CPU.
    #[arg(long, value_name = "K")]
    pub cpu: Option<usize>,
    /// Write the report as JSON (with a per-second time series) to FILE ('-' = stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write every request as CSV to FILE, in order of scheduled start, failures included:
    /// scheduled_us,start_us,connected_us,first_byte_us,end_us,status,bytes,error,conn_id
    /// (µs from the start of the run; empty = did not happen).
    #[arg(long, value_name = "FILE", verbatim_doc_comment)]
    pub log: Option<PathBuf>,
    /// No progress bar and no text summary (the warnings still go to stderr).
    #[arg(short, long)]
    pub quiet: bool,
}

/// Parse "10s", "500ms", "2m", "1h", "250us" or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    use iolab_sys::units::UnitError;
    let s = s.trim();
    let positive = || format!("{s:?}: the duration must be positive");
    let d = iolab_sys::units::parse_duration(s).map_err(|e| match e {
        UnitError::NotANumber { .. } => {
            format!("{s:?}: expected a duration like 10s, 500ms or 2m")
        }
        UnitError::UnknownUnit { unit, .. } => {
            format!("{s:?}: unknown unit {unit:?} (use us, ms, s, m or h)")
        }
        UnitError::OutOfRange { .. } => positive(),
    })?;
    if d.is_zero() || d.as_secs_f64() > 1e9 {
        return Err(positive());
    }
    Ok(d)
}

impl LoadArgs {
    /// The library configuration these arguments describe.
    pub fn to_config(&self) -> anyhow::Result<LoadConfig> {
        let mut c = LoadConfig::for_url(&self.url)?;
        c.connections = self.connections;
        c.duration = self.duration;
        c.requests = match (self.requests, self.duration) {
            (Some(n), _) => Some(n),
            (None, Some(_)) => None,
            (None, None) => Some(1),
        };
        c.keepalive = self.keepalive;
        c.rate = self.rate;
        c.timeout = self.timeout;
        c.source_addrs = self.source.clone();
        c.threads = self.threads;
        c.pin_cpu = self.cpu;
        c.keep_records = self.log.is_some();
        c.quiet = self.quiet;
        Ok(c)
    }
}

pub fn run(args: LoadArgs) -> anyhow::Result<()> {
    let config = args.to_config()?;
    let report = run_load(&config)?;
    if let Some(path) = &args.log {
        let f = std::fs::File::create(path)
            .map_err(|e| anyhow::anyhow!("cannot create the log {}: {e}", path.display()))?;
        iolab_load::write_csv(std::io::BufWriter::new(f), &report.records)
            .map_err(|e| anyhow::anyhow!("cannot write the log {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)? + "\n";
        if path.as_os_str() == "-" {
            std::io::stdout().write_all(text.as_bytes())?;
        } else {
            std::fs::write(path, text)
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        }
    }
    let to_stdout_json = args.json.as_ref().is_some_and(|p| p.as_os_str() == "-");
    if !args.quiet && !to_stdout_json {
        print!("{}", summary(&report));
        std::io::stdout().flush()?;
    }
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    Ok(())
}

/// The text summary printed after a run.
pub fn summary(r: &LoadReport) -> String {
    let mut s = String::new();
    let mode = match r.rate {
        Some(rate) => format!(
            "open loop at {rate} req/s, at most {} connections",
            r.connections
        ),
        None => format!("closed loop, {} clients", r.connections),
    };
    let conn = if r.keepalive {
        "keep-alive"
    } else {
        "new connection per request"
    };
    s += &format!("{}: {mode}, {conn}, {} thread(s)\n", r.url, r.threads);
    s += &format!(
        "  requests  {} in {:.3} s: {} ok, {} errors ({} unfinished)\n",
        r.requests, r.elapsed_s, r.ok, r.error_count, r.unfinished
    );
    s += &format!(
        "  rate      {:.1} req/s, {:.2} MB/s\n",
        r.rps,
        r.bytes_per_s / 1e6
    );
    if r.ok > 0 {
        s += &format!(
            "  latency   mean {:.3} ms, stdev {:.3}, min {:.3}, max {:.3}\n",
            r.mean_ms, r.stdev_ms, r.min_ms, r.max_ms
        );
        s += &format!(
            "  percentiles (ms)  p50 {:.3}  p75 {:.3}  p90 {:.3}  p95 {:.3}  p99 {:.3}  p99.9 {:.3}  p99.99 {:.3}\n",
            r.p50_ms, r.p75_ms, r.p90_ms, r.p95_ms, r.p99_ms, r.p999_ms, r.p9999_ms
        );
    }
    if r.connects > 0 {
        s += &format!(
            "  connect   {} new connections, mean {:.3} ms, {} near 1 s/3 s (SYN retransmits)\n",
            r.connects, r.connect_mean_ms, r.syn_retries
        );
    }
    if !r.errors.is_empty() {
        let list: Vec<String> = r.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
        s += &format!("  errors    {}\n", list.join(", "));
    }
    s += &format!(
        "  client    {:.2} s CPU ({:.0}% of {} core(s))",
        r.client_cpu_s, r.client_cpu_pct, r.cpu_cores
    );
    if r.rate.is_some() {
        s += &format!(
            ", lag behind schedule mean {:.3} ms, max {:.3} ms",
            r.schedule_lag_ms, r.schedule_lag_max_ms
        );
    }
    s += "\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        load: LoadArgs,
    }

    fn parse(args: &[&str]) -> Result<LoadArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("iolab-load").chain(args.iter().copied()))
            .map(|c| c.load)
    }

    /// The message clap gives for a refused command line, without its usage footer.
    fn refusal(args: &[&str]) -> String {
        match parse(args) {
            Ok(_) => panic!("{args:?} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    /// What `iolab load` runs when started from an [`iolab_load::spec::LoadSpec`] (the
    /// tiers bench's client): every field of the spec comes back from the flags.
    #[test]
    fn a_load_spec_survives_the_command_line() {
        use iolab_load::spec::LoadSpec;
        let closed = LoadSpec::new("http://10.0.0.1:8080/f65536");
        let open = LoadSpec {
            connections: 64,
            duration: Duration::from_millis(2500),
            keepalive: true,
            rate: Some(300.5),
            timeout: Duration::from_secs(5),
            threads: 1,
            json: Some("-".into()),
            log: Some("/r/load.csv".into()),
            quiet: true,
            ..LoadSpec::new("http://127.0.0.1:1/x")
        };
        for spec in [closed, open] {
            let argv: Vec<String> = spec
                .to_args()
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            assert_eq!(argv[0], "load");
            let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
            let a = parse(&args).unwrap();
            let back = LoadSpec {
                url: a.url.clone(),
                connections: a.connections,
                duration: a.duration.unwrap(),
                keepalive: a.keepalive && !a.no_keepalive,
                rate: a.rate,
                timeout: a.timeout,
                threads: a.threads,
                json: a.json.clone(),
                log: a.log.clone(),
                quiet: a.quiet,
            };
            assert_eq!(back, spec);
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        for bad in ["", "s", "0", "-1s", "5x", "1e999", "abc"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_arguments_are_refused_with_a_message() {
        let e = refusal(&["http://127.0.0.1:1/", "-n", "5", "-d", "5s"]);
        assert!(
            e.contains("'--requests <M>' cannot be used with '--duration <DURATION>'"),
            "{e}"
        );
        let e = refusal(&["http://127.0.0.1:1/", "--keepalive", "--no-keepalive"]);
        assert!(
            e.contains("'--keepalive' cannot be used with '--no-keepalive'"),
            "{e}"
        );
        let e = refusal(&["http://127.0.0.1:1/", "-d", "five"]);
        assert!(
            e.contains("\"five\": expected a duration like 10s, 500ms or 2m"),
            "{e}"
        );
        let e = refusal(&["http://127.0.0.1:1/", "--source", "not-an-ip"]);
        assert!(
            e.contains("invalid value 'not-an-ip' for '--source <ADDRS>'"),
            "{e}"
        );
        let args = parse(&["ftp://example.com/"]).unwrap();
        let err = run(args).unwrap_err().to_string();
        assert!(err.contains("http://"), "{err}");
        let args = parse(&["http://127.0.0.1:1/", "-c", "0"]).unwrap();
        let err = run(args).unwrap_err().to_string();
        assert!(err.contains("connections"), "{err}");
    }

    #[test]
    fn defaults_and_options_map_to_the_config() {
        let a = parse(&[
            "http://[::1]:8080/p",
            "-c",
            "7",
            "-d",
            "2s",
            "--keepalive",
            "--rate",
            "100",
            "--timeout",
            "250ms",
            "--source",
            "::1",
            "--threads",
            "3",
            "--cpu",
            "1",
        ])
        .unwrap();
        let c = a.to_config().unwrap();
        assert_eq!(c.connections, 7);
        assert_eq!(c.requests, None);
        assert_eq!(c.duration, Some(Duration::from_secs(2)));
        assert!(c.keepalive);
        assert_eq!(c.rate, Some(100.0));
        assert_eq!(c.timeout, Duration::from_millis(250));
        assert_eq!(c.source_addrs, vec!["::1".parse::<IpAddr>().unwrap()]);
        assert_eq!((c.threads, c.pin_cpu), (3, Some(1)));
        assert!(!c.keep_records);
        let c = parse(&["http://127.0.0.1/"]).unwrap().to_config().unwrap();
        assert_eq!(
            (c.requests, c.connections, c.keepalive),
            (Some(1), 1, false)
        );
        assert!(
            !parse(&["http://127.0.0.1/"]).unwrap().keepalive,
            "a new connection per request is the default"
        );
    }
}
