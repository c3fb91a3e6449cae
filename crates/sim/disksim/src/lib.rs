//! iolab disksim: a trace-driven discrete-event disk I/O simulator (seed 002), validated on
//! real disks' traces.
//!
//! The seed's module diagram, as code:
//!
//! ```text
//!  workload (trace::TraceSource, workload::Generator)       ── engine::Source
//!     │ Request (request.rs)                 ▲ Completion + Record
//!  [page cache]            (issue 12)        │               ── engine::Component
//!     │                                      │
//!  [block layer / I/O scheduler] (sched.rs policies; issue 12)
//!     │                                      │
//!  device: hdd (disk cache + disk: hdd/), ssd, measured ── engine::Component
//! ```
//!
//! `engine` owns time and events; components exchange requests and completions only through
//! it. See README.md for the architecture and who owns which module.

pub mod blocklayer;
pub mod calibrate;
pub mod config;
pub mod engine;
pub mod fio;
pub mod hdd;
pub mod host;
pub mod hugebuf;
pub mod linuxval;
mod lru;
pub mod measured;
pub mod pagecache;
mod pageset;
pub mod record;
pub mod report;
pub mod request;
pub mod sched;
pub mod scratch;
pub mod ssd;
pub mod system;
#[cfg(test)]
pub(crate) mod testdev;
pub mod trace;
pub mod validate;
pub mod wincache;
pub mod workload;

/// The simulator's hash maps, looked up on every request (by request id, page, block range):
/// foldhash with a fixed seed, several times cheaper than SipHash on integer keys (SipHash was
/// a quarter of an O_DIRECT job's simulation) and the same in every run.
pub(crate) type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::FixedState>;

/// The validation data shipped with the crate (DiskSim 4.0's real-disk traces).
pub fn default_valid_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/disksim-valid")
}
