//! Microbenchmarks (`iolab micro <name>`).
//!
//! CONTRACT: each benchmark is a module with
//! `pub fn run(opts: &Opts) -> anyhow::Result<serde_json::Value>` that prints its table to
//! stdout and returns the JSON written by `--json`. The lab calls them through [`run_named`].
//!
//! JSON CONVENTION (the lab renders it generically): each benchmark's object has
//! `"machine"`: [`machine::Machine`], its own named fields (documented in the README), and
//! `"tables"`: `[{"title", "columns": [..], "rows": [[..]], "note"?}]` and
//! `"figures"`: `[{"title", "x_label", "y_label", "log_x": bool, "log_y": bool,
//!   "series": [{"name", "points": [[x, y], ..]}]}]`.

pub mod ctxswitch;
pub mod echo;
pub mod limits;
pub mod machine;
pub mod osutil;
pub mod queue;
pub mod runtime;
pub mod stats;
pub mod syscalls;
pub mod table;

/// Options shared by every microbenchmark.
#[derive(Debug, Clone, Default)]
pub struct Opts {
    /// Short run for tests and `micro all --quick` (seconds, not minutes).
    pub quick: bool,
}

/// Every benchmark name, in the order `micro all` runs them (the list lives in iolab-stats so
/// that the lab reads it without linking the benchmarks).
pub use iolab_stats::microbenchmarks::NAMES;

pub fn run_named(name: &str, opts: &Opts) -> anyhow::Result<serde_json::Value> {
    match name {
        "runtime" => runtime::run(opts),
        "ctxswitch" => ctxswitch::run(opts),
        "queue" => queue::run(opts),
        "syscalls" => syscalls::run(opts),
        "echo" => echo::run(opts),
        "limits" => limits::run(opts),
        other => anyhow::bail!(
            "unknown microbenchmark {other:?}; known: {}",
            NAMES.join(", ")
        ),
    }
}
