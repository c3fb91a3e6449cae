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

use anyhow::Result;
use clap::{Parser, ValueEnum};
use iolab_peer_common::shards::{self, Plan};
use iolab_servers::spec::{GlommioProfile, GlommioSpec};

#[path = "../../peer-common/cli/basic_flags.rs"]
mod basic_flags;

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
    #[command(flatten)]
    basics: basic_flags::BasicFlags,
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
            profile: self.profile.into(),
            ..GlommioSpec::with(self.basics.to_basics()?)
        })
    }
}

fn main() {
    basic_flags::main_with("iolab-glommio-server", Args::to_spec, run);
}

fn run(spec: GlommioSpec) -> Result<()> {
    let plan = Plan {
        basics: &spec.peer,
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
        spec.peer.root.display(),
        started.addr,
        started.threads,
        started.cpu_list(),
        spec.profile.name(),
        shard::settings(spec.profile),
        started.listeners_text("executor"),
        spec.peer.backlog,
        iolab_peer_common::idle_text(started.idle),
    );
    started.join()
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    fn to_spec(args: Vec<OsString>) -> Result<GlommioSpec> {
        basic_flags::parse_spec(args, Args::to_spec)
    }

    /// The shared flags' contract (`check_command_line`), and this peer's own flag through
    /// the command line.
    #[test]
    fn a_spec_survives_the_command_line() {
        iolab_peer_common::testing::check_command_line(
            to_spec,
            GlommioSpec::with,
            GlommioSpec::to_args,
        );
        for profile in GlommioProfile::ALL {
            let spec = GlommioSpec {
                profile,
                ..GlommioSpec::new("/w".into(), "127.0.0.1:8099".parse().unwrap())
            };
            assert_eq!(to_spec(spec.to_args()).unwrap(), spec);
        }
    }
}
