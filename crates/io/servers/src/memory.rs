//! Giving back the memory of closed connections.
//!
//! Every model frees a connection's buffers when it closes, but glibc's allocator keeps
//! freed memory in its arenas (one per thread that allocated) instead of returning it to
//! the system: after 2,000 idle connections closed, a server stayed at 21–45 MiB against
//! 7 MiB at its start. So each server runs a small thread beside its model that samples the
//! number of open connections every [`TRIM_EVERY`] and calls `malloc_trim(0)` (every
//! arena, free pages given back with `madvise(MADV_DONTNEED)`) once the connections have
//! fallen to a quarter of the peak seen since the last trim, or to none after any
//! activity. It costs nothing on the I/O path and one `malloc_trim` per burst that ends.

use std::sync::mpsc;
use std::time::Duration;

use crate::stats::{Counter, Stats};

/// How often the open connections are looked at.
pub const TRIM_EVERY: Duration = Duration::from_millis(500);

/// Fewest connections a peak must have had for a partial fall to trim (below it, only a
/// fall to zero does).
const PEAK_WORTH_TRIMMING: u64 = 64;

/// What the trimming thread remembers between samples.
#[derive(Debug, Default)]
struct Watch {
    /// Most connections open at once since the last trim.
    peak: u64,
    /// `accepted` at the last trim: unchanged means nothing happened since.
    accepted: u64,
}

impl Watch {
    /// One sample: true when memory should be given back now.
    fn sample(&mut self, open: u64, accepted: u64) -> bool {
        self.peak = self.peak.max(open);
        let active = accepted != self.accepted;
        let fell = self.peak >= PEAK_WORTH_TRIMMING && open <= self.peak / 4;
        if active && (open == 0 || fell) {
            self.peak = open;
            self.accepted = accepted;
            return true;
        }
        false
    }
}

/// Gives freed heap memory back to the system.
pub fn trim() {
    // SAFETY: malloc_trim only walks the allocator's own arenas, under their locks.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Runs `serve` with the trimming thread beside it; the thread ends when `serve` returns.
pub fn with_trimming<T>(stats: &Stats, serve: impl FnOnce() -> T) -> T {
    std::thread::scope(|s| {
        let (done, wait) = mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("trim".into())
            .spawn_scoped(s, move || {
                let mut watch = Watch::default();
                while let Err(mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(TRIM_EVERY) {
                    if watch.sample(stats.get(Counter::Open), stats.get(Counter::Accepted)) {
                        trim();
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no memory-trimming thread ({e}): freed memory stays in the heap");
        }
        let r = serve();
        drop(done);
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_a_burst_has_ended() {
        let mut w = Watch::default();
        assert!(!w.sample(0, 0), "nothing happened yet");
        assert!(!w.sample(2000, 2000), "at the peak");
        assert!(!w.sample(900, 2000), "above a quarter of it");
        assert!(w.sample(400, 2000), "fell to a quarter");
        assert!(!w.sample(400, 2000), "and not again while nothing happens");
        assert!(w.sample(0, 2001), "none open after activity");
        assert!(!w.sample(0, 2001));
        assert!(!w.sample(10, 2020), "a small peak");
        assert!(!w.sample(2, 2020));
    }
}
