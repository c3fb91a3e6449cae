//! iolab-glommio-server: the glommio peer the lab runs beside iolab's models and tokio.
//!
//! Configured as glommio's documentation and benchmark servers configure it: one
//! `LocalExecutor` per thread, placed on one CPU (`Placement::Fixed`), each with its own
//! SO_REUSEPORT listener on the shared address. `--profile` picks the executor settings:
//! glommio's defaults, or the latency or throughput trade-off its documentation describes
//! (`iolab_servers::spec::GlommioProfile` says what each sets).
//!
//! HTTP is iolab's: each connection drives an `iolab_http::Session` (read → feed → write
//! pending → advance), as the tokio peer's `iolab` engine does. glommio's streams have no
//! vectored write, so a response's chunks up to 64 KiB are gathered into one buffer and
//! sent with one write (a copy of a few hundred bytes for the lab's small file, where two
//! sends would cost a system call more); larger chunks are sent as they are.
//!
//! Deadlines are glommio's own socket timeouts (`set_read_timeout`, `set_write_timeout`).
//! SIGINT or SIGTERM exits 0 (connections in progress are dropped).

mod shard;

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, ValueEnum};
use iolab_peer_common::shards::{self, Plan};
use iolab_servers::spec::{GlommioProfile, GlommioSpec};

/// Serve a directory over HTTP with glommio (the lab's glommio peer).
#[derive(Debug, Parser)]
#[command(
    name = "iolab-glommio-server",
    version,
    after_help = "Configuration: one glommio LocalExecutor per thread with Placement::Fixed(cpu) \
                  on the CPUs of the process's set, each with its own SO_REUSEPORT listener. \
                  Profiles: default = LocalExecutorBuilder defaults (ring depth 128, preempt \
                  timer 100 ms, 10 MiB I/O memory, default task queue); latency = connections in \
                  a task queue with Latency::Matters(1 ms) (glommio's latency ring); throughput \
                  = a Latency::NotImportant queue, ring depth 1024, preempt timer 500 ms. The \
                  start line repeats this with the values in force."
)]
struct Args {
    /// Directory to serve; `/` maps to it, a directory to its index.html. Nothing outside it
    /// is ever served (same rules as `iolab serve`: iolab_http::Site)
    #[arg(long)]
    root: PathBuf,
    /// Address to listen on (port 0 picks a free port; the chosen address is printed)
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// Threads, each its own glommio executor placed on one CPU (0 = one per allowed CPU)
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Length of each listener's queue of connections not yet accepted (listen(2) backlog)
    #[arg(long, default_value_t = 1024)]
    backlog: u32,
    /// Seconds a connection may wait for a read or a write before it is closed; 0 = never
    #[arg(long, default_value_t = 60.0)]
    idle_timeout: f64,
    /// Executor settings: glommio's defaults, or its latency or throughput trade-off
    #[arg(long, value_enum, default_value_t = Profile::Default)]
    profile: Profile,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Profile {
    Default,
    Latency,
    Throughput,
}

impl From<Profile> for GlommioProfile {
    fn from(p: Profile) -> Self {
        match p {
            Profile::Default => GlommioProfile::Default,
            Profile::Latency => GlommioProfile::Latency,
            Profile::Throughput => GlommioProfile::Throughput,
        }
    }
}

impl Args {
    /// The spec the lab launches this peer with; an idle timeout must be seconds >= 0.
    fn to_spec(&self) -> Result<GlommioSpec> {
        Ok(GlommioSpec {
            root: self.root.clone(),
            addr: self.addr,
            workers: self.workers,
            backlog: self.backlog,
            idle_timeout: iolab_peer_common::idle_timeout(self.idle_timeout)?,
            profile: self.profile.into(),
        })
    }
}

fn main() {
    let args = Args::parse();
    if let Err(e) = args.to_spec().and_then(run) {
        eprintln!("iolab-glommio-server: {e:#}");
        std::process::exit(1);
    }
}

fn run(spec: GlommioSpec) -> Result<()> {
    let plan = Plan {
        root: &spec.root,
        addr: spec.addr,
        workers: spec.workers,
        backlog: spec.backlog,
        idle_timeout: spec.idle_timeout,
        thread_prefix: "glommio",
        thread_noun: "an executor thread",
    };
    let profile = spec.profile;
    // Each thread reports whether its executor could be made before anything is announced:
    // glommio's io_uring set-up (its rings, its registered I/O memory) fails here if at all.
    let started = shards::start(plan, move |s, ready| shard::serve(s, profile, ready))?;
    println!(
        "serving {} on {} with glommio ({} executors on CPUs {}, profile {}: {}, \
         {}, backlog {}, idle timeout {})",
        spec.root.display(),
        started.addr,
        started.threads,
        started.cpu_list(),
        spec.profile.name(),
        shard::settings(spec.profile),
        started.listeners_text("executor"),
        spec.backlog,
        iolab_peer_common::idle_text(started.idle),
    );
    started.join()
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::time::Duration;

    use super::*;

    fn parse(args: Vec<OsString>) -> Args {
        Args::try_parse_from(std::iter::once(OsString::from("iolab-glommio-server")).chain(args))
            .unwrap_or_else(|e| panic!("the peer refuses the spec's arguments: {e}"))
    }

    /// What the lab launches is what the peer runs: spec -> arguments -> clap -> spec.
    #[test]
    fn a_spec_survives_the_command_line() {
        let mut specs = Vec::new();
        for profile in GlommioProfile::ALL {
            let mut s = GlommioSpec::new("dir with space".into(), "[::1]:9000".parse().unwrap());
            s.workers = 3;
            s.backlog = 200;
            s.idle_timeout = Duration::from_millis(1500);
            s.profile = profile;
            specs.push(s);
        }
        let mut never_idle = GlommioSpec::new("/w".into(), "127.0.0.1:8099".parse().unwrap());
        never_idle.idle_timeout = Duration::ZERO;
        specs.push(never_idle);
        for spec in specs {
            assert_eq!(parse(spec.to_args()).to_spec().unwrap(), spec);
        }
    }

    /// `GlommioSpec::new` says what the peer does when a flag is left out; a negative idle
    /// timeout is refused.
    #[test]
    fn the_spec_defaults_are_the_command_line_defaults() {
        let args = ["--root", "/w", "--addr", "127.0.0.1:8099"].map(OsString::from);
        assert_eq!(
            parse(args.to_vec()).to_spec().unwrap(),
            GlommioSpec::new("/w".into(), "127.0.0.1:8099".parse().unwrap())
        );
        let args = ["--root", "/w", "--idle-timeout=-1"].map(OsString::from);
        let e = parse(args.to_vec()).to_spec().unwrap_err().to_string();
        assert!(e.contains("--idle-timeout must be"), "{e}");
    }
}
