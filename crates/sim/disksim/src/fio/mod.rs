//! fio job files as workloads: `iolab disksim run --fio JOB.fio`.
//!
//! * [`job`]: the job-file reader ([`parse`]: fio's syntax and numbers, every option
//!   simulated, reporting-only or refused with its line);
//! * [`source`]: the jobs as the engine's workload ([`FioSource`]: each clone a closed loop
//!   of `iodepth` requests over its files);
//! * [`results`]: the per-job figures fio would print ([`JobStats`], [`job_table`]);
//! * [`real`]: the real fio, as `calibrate` and `validate` run it (typed job files, its
//!   JSON output).
//!
//! The host stack the jobs run through (page cache, block layer, the calibrated CPU costs of
//! system calls) is built by [`crate::host::HostParams::stack`].

pub mod extra;
mod inert;
pub mod job;
mod latency;
mod phases;
pub mod prio;
pub mod real;
mod refusals;
pub mod results;
pub mod source;
mod steady;
mod units;

pub use job::{
    known_options, parse, parse_range, parse_size, parse_time_ms, parse_with_env, FadviseHint,
    FioJob, IoEngine, JobFile, Rw, SyncMode, MAX_BS, MAX_BYTES, MAX_IODEPTH, MAX_RUNTIME_MS,
    MAX_STREAMS,
};
pub use results::{job_table, DirResult, JobResult, JobStats};
pub use source::{FioSource, SimFile};
