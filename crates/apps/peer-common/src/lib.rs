//! What the lab's peer servers (iolab-tokio-server, iolab-monoio-server,
//! iolab-glommio-server) share, so that the three differ only in their runtime's I/O:
//!
//! - the checks of their flags ([`idle_timeout`]); each `main` prints its own errors, as a
//!   library does not print;
//! - the thread-per-core start of the monoio and glommio peers ([`shards`]: site, CPUs,
//!   one SO_REUSEPORT listener per thread, signals, readiness, join);
//! - the models' session loop on any runtime's socket ([`session_io`]);
//! - the launcher their wire tests start a peer with ([`testing`]).
//!
//! No clap here: each peer parses its own flags and hands the values over.

pub mod session_io;
pub mod shards;
pub mod testing;

use std::time::Duration;

use anyhow::{bail, Result};

/// `--idle-timeout` in seconds as a duration; refused unless a number of seconds >= 0.
pub fn idle_timeout(seconds: f64) -> Result<Duration> {
    if !seconds.is_finite() || seconds < 0.0 {
        bail!("--idle-timeout must be a number of seconds >= 0, not {seconds}");
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// The idle deadline in force: none for a zero timeout.
pub fn idle_deadline(timeout: Duration) -> Option<Duration> {
    (!timeout.is_zero()).then_some(timeout)
}

/// The idle deadline as the start lines print it.
pub fn idle_text(idle: Option<Duration>) -> String {
    idle.map_or("none".to_string(), |d| format!("{} s", d.as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_timeout_is_seconds_at_least_zero() {
        assert_eq!(idle_timeout(1.5).unwrap(), Duration::from_millis(1500));
        assert_eq!(idle_deadline(idle_timeout(0.0).unwrap()), None);
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let e = idle_timeout(bad).unwrap_err().to_string();
            assert!(e.contains("--idle-timeout must be"), "{e}");
        }
        assert_eq!(idle_text(Some(Duration::from_secs(1))), "1 s");
        assert_eq!(idle_text(None), "none");
    }
}
