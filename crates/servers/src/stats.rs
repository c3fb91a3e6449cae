//! Live counters of a server (written by the model, read by `iolab stats` and the lab).
//! (Being written: shared-memory file given by `--stats PATH`.)

#[derive(Default)]
pub struct Stats {}

/// A copy of the counters at one instant (what `iolab stats` prints and the lab samples).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// Connections open now.
    pub open: u64,
    pub accepted: u64,
    pub requests: u64,
    /// Connections closed at once because a limit (max-conns, FD_SETSIZE) was reached.
    pub refused: u64,
    /// Errors by kind ("bad_request", "not_found", "header_too_large", "io", "reset", ...).
    pub errors: std::collections::BTreeMap<String, u64>,
}

/// Reads a running server's `--stats` file without disturbing it.
pub struct StatsReader {
    _path: std::path::PathBuf,
}

impl StatsReader {
    pub fn open(path: &std::path::Path) -> std::io::Result<StatsReader> {
        let _ = path;
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "stats not written yet"))
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot::default()
    }
}
