//! Microbenchmarks (`iolab micro <name>`).
//!
//! CONTRACT: each benchmark is a module with
//! `pub fn run(opts: &Opts) -> anyhow::Result<table::Report<Fields>>` that prints its tables
//! to stdout and returns its results, typed: the JSON written by `--json` is their
//! serialisation. The lab calls them through [`run_named`].
//!
//! JSON CONVENTION (the lab renders it generically): each benchmark's object has
//! `"machine"`: [`machine::Machine`], its own named fields (documented in the README and in
//! each module's `Fields`), and
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

/// A benchmark's entry point, its results as the JSON `--json` writes.
type Runner = fn(&Opts) -> anyhow::Result<serde_json::Value>;

fn json<F: serde::Serialize>(
    report: anyhow::Result<table::Report<F>>,
) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::to_value(report?)?)
}

/// The entry point of the benchmark `name`, if there is one.
fn runner(name: &str) -> Option<Runner> {
    Some(match name {
        "runtime" => |o| json(runtime::run(o)),
        "ctxswitch" => |o| json(ctxswitch::run(o)),
        "queue" => |o| json(queue::run(o)),
        "syscalls" => |o| json(syscalls::run(o)),
        "echo" => |o| json(echo::run(o)),
        "limits" => |o| json(limits::run(o)),
        _ => return None,
    })
}

/// Runs the benchmark `name` and returns its results as the JSON `--json` writes.
pub fn run_named(name: &str, opts: &Opts) -> anyhow::Result<serde_json::Value> {
    match runner(name) {
        Some(run) => run(opts),
        None => anyhow::bail!(
            "unknown microbenchmark {name:?}; known: {}",
            NAMES.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_has_a_benchmark() {
        for name in NAMES {
            assert!(runner(name).is_some(), "{name} is listed but not run");
        }
        let e = run_named("nosuch", &Opts::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown microbenchmark \"nosuch\""), "{e}");
        assert!(e.contains(&NAMES.join(", ")), "{e}");
    }
}
