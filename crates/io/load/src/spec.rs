//! How another part of iolab runs `iolab load` as a child process (the tiers bench runs it
//! in the client's network namespace): one type both sides use. The launcher fills a
//! [`LoadSpec`] and runs the binary with [`LoadSpec::to_args`]; the binary's command line
//! (src/cli/load.rs) parses those flags, and a round-trip test there (spec -> `to_args` ->
//! clap -> spec) fails when a flag is renamed on one side only.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// `iolab load URL`: a timed run, closed loop or at a fixed rate.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadSpec {
    pub url: String,
    /// Concurrent clients (closed loop) or the connection cap (open loop, `rate`).
    pub connections: usize,
    pub duration: Duration,
    pub keepalive: bool,
    /// Requests per second, as an open loop; `None`: closed loop.
    pub rate: Option<f64>,
    /// A request not answered within this is counted as a timeout.
    pub timeout: Duration,
    /// Client threads (0 = one per core).
    pub threads: usize,
    /// Where the JSON report goes (`-`: standard output).
    pub json: Option<PathBuf>,
    /// Where the per-request CSV log goes (`--log`; the lab merges remote hosts' logs).
    pub log: Option<PathBuf>,
    /// No progress line.
    pub quiet: bool,
}

impl LoadSpec {
    /// A 10 s closed-loop run with one connection, as `iolab load -d 10s URL`.
    pub fn new(url: impl Into<String>) -> LoadSpec {
        LoadSpec {
            url: url.into(),
            connections: 1,
            duration: Duration::from_secs(10),
            keepalive: false,
            rate: None,
            timeout: Duration::from_secs(10),
            threads: 0,
            json: None,
            log: None,
            quiet: false,
        }
    }

    /// The `iolab` arguments that run this spec (`load` first), every field written.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["load".into()];
        let mut flag = |k: &str, v: String| {
            a.push(k.into());
            a.push(v.into());
        };
        flag("-c", self.connections.to_string());
        flag("-d", format!("{}ms", self.duration.as_millis()));
        flag("--timeout", format!("{}ms", self.timeout.as_millis()));
        flag("--threads", self.threads.to_string());
        if let Some(r) = self.rate {
            flag("--rate", r.to_string());
        }
        a.push(
            if self.keepalive {
                "--keepalive"
            } else {
                "--no-keepalive"
            }
            .into(),
        );
        if let Some(j) = &self.json {
            a.push("--json".into());
            a.push(j.into());
        }
        if let Some(l) = &self.log {
            a.push("--log".into());
            a.push(l.into());
        }
        if self.quiet {
            a.push("-q".into());
        }
        a.push(self.url.clone().into());
        a
    }
}
