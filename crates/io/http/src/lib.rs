//! HTTP/1.1 request parsing and static-file responses, shared by every iolab server model.
//!
//! CONTRACT (used by `iolab-servers` and `iolab-tokio-server`; extend it, do not rename it):
//! a model reads bytes from a socket, gives them to [`Session::feed`], writes
//! [`Session::pending`] to the socket, calls [`Session::advance`] with the count written then
//! [`Session::resume`], reads again only once nothing is pending, and closes the connection
//! once [`Session::should_close`] is true and nothing is pending.
//! Every model therefore serves exactly the same bytes and counts exactly the same statuses.
//!
//! File bytes not in memory (a cache miss, the chunks of a large file) are read by the
//! session itself, blocking the caller's thread ([`Session::new`], [`FileReads::Blocking`]),
//! or by the model: with [`FileReads::Caller`], the model first asks [`Session::file_read`]
//! for the read the session waits for, does it (through io_uring, on a thread pool) and
//! hands the bytes to [`Session::file_read_done`], before writing what is pending.
//!
//! ```no_run
//! # fn serve(mut sock: std::net::TcpStream) -> std::io::Result<()> {
//! use std::io::{Read, Write};
//! let site = iolab_http::Site::new("/srv/www", iolab_http::Limits::default())?;
//! let mut session = iolab_http::Session::new(site);
//! let mut buf = [0u8; 16 * 1024];
//! loop {
//!     let n = sock.read(&mut buf)?;
//!     if n == 0 {
//!         return Ok(());
//!     }
//!     session.feed(&buf[..n], |status| println!("answered {status}"));
//!     while let Some(chunk) = session.pending().front() {
//!         let written = sock.write(chunk)?;
//!         session.advance(written);
//!         // Answers the pipelined requests held back while the queue was full.
//!         session.resume(|status| println!("answered {status}"));
//!     }
//!     if session.should_close() {
//!         return Ok(());
//!     }
//! }
//! # }
//! ```
//!
//! The limits, and every decision on what is accepted, are documented in the crate's
//! README.md (included below).
#![doc = include_str!("../README.md")]

use std::path::PathBuf;
use std::sync::Arc;

mod conditional;
mod deadline;
pub mod direct;
mod reply;
mod request;
mod response;
mod session;
mod site;
mod target;

pub use deadline::{Deadline, Phase, Timeouts, DEFAULT_TIMEOUT};
pub use session::{FileRead, FileReads, Session};
pub use site::CacheConfig;

/// Size of the chunks a file too large for the cache is read and sent in: what one
/// streaming response holds in memory at most (about twice this while a chunk is sent).
pub const STREAM_CHUNK: usize = 64 * 1024;

/// Explicit limits; every one is documented in the README and configurable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Longest request line accepted; longer gets 414.
    pub max_request_line: usize,
    /// Largest header block (excluding the request line); larger gets 431.
    pub max_header_bytes: usize,
    /// Most header lines; more gets 431.
    pub max_headers: usize,
    /// Largest request body drained before answering; larger gets 413 and the connection closes.
    pub max_body: usize,
    /// Response bytes queued per connection at which answering pipelined requests pauses
    /// until the client has read them (backpressure). A streamed file also pauses it.
    pub max_queued: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_line: 8 * 1024,
            max_header_bytes: 16 * 1024,
            max_headers: 100,
            max_body: 64 * 1024,
            max_queued: 256 * 1024,
        }
    }
}

/// The static site: a root directory (canonicalised) and a file cache shared by all
/// connections of a server.
pub struct Site {
    root: PathBuf,
    limits: Limits,
    files: site::Files,
    /// Test hook ([`Site::inject_request_cost`]): CPU burnt per request, in nanoseconds.
    request_cost_ns: std::sync::atomic::AtomicU64,
}

impl Site {
    /// Opens `root` (must be a directory). Errors are clear `io::Error`s naming the path.
    pub fn new(root: impl Into<PathBuf>, limits: Limits) -> std::io::Result<Arc<Site>> {
        Site::with_cache(root, limits, CacheConfig::default())
    }

    /// As [`Site::new`], with explicit file-cache settings.
    pub fn with_cache(
        root: impl Into<PathBuf>,
        limits: Limits,
        cache: CacheConfig,
    ) -> std::io::Result<Arc<Site>> {
        let given = root.into();
        let root = std::fs::canonicalize(&given).map_err(|e| {
            std::io::Error::new(e.kind(), format!("web root {}: {e}", given.display()))
        })?;
        let meta = std::fs::metadata(&root).map_err(|e| {
            std::io::Error::new(e.kind(), format!("web root {}: {e}", root.display()))
        })?;
        if !meta.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                format!("web root {}: not a directory", given.display()),
            ));
        }
        Ok(Arc::new(Site {
            files: site::Files::new(root.clone(), cache),
            root,
            limits,
            request_cost_ns: std::sync::atomic::AtomicU64::new(0),
        }))
    }

    /// The canonical root directory.
    pub fn root(&self) -> &std::path::Path {
        &self.root
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The file-cache settings.
    pub fn cache_config(&self) -> &CacheConfig {
        self.files.config()
    }

    /// Number of files in the cache and their total size in bytes.
    pub fn cache_usage(&self) -> (usize, u64) {
        self.files.cache_usage()
    }

    /// Test hook: from now on every read of a file's bytes (a cache miss, a chunk of a
    /// streamed file) takes at least `delay` more — a slow disk. A read done on the caller's
    /// thread sleeps first ([`FileRead::read_blocking`], [`FileReads::Blocking`]); a model
    /// that reads through io_uring links a timeout of [`FileRead::injected_delay`] before its
    /// `IORING_OP_READ`. Used by the tests that check a slow read does not hold up other
    /// connections; `iolab serve` sets it from `IOLAB_TEST_READ_DELAY_MS` in debug builds
    /// only. Zero (the default) turns it off.
    #[doc(hidden)]
    pub fn inject_read_delay(&self, delay: std::time::Duration) {
        self.files.set_read_delay(delay);
    }

    /// Test hook: from now on every request costs at least `cost` more CPU time on the
    /// thread that answers it (a busy loop before the answer) — a deliberately slower
    /// build of a model, for checking that `iolab lab --compare` finds it. `iolab serve`
    /// sets it from `IOLAB_TEST_CPU_PER_REQUEST_US` in debug builds only. Zero (the
    /// default) turns it off: one relaxed load per request.
    #[doc(hidden)]
    pub fn inject_request_cost(&self, cost: std::time::Duration) {
        let ns = u64::try_from(cost.as_nanos()).unwrap_or(u64::MAX);
        self.request_cost_ns
            .store(ns, std::sync::atomic::Ordering::Relaxed);
    }

    /// Burns the injected per-request cost, if any (thread CPU time, so that a preempted
    /// thread still pays the whole cost).
    pub(crate) fn pay_request_cost(&self) {
        let ns = self
            .request_cost_ns
            .load(std::sync::atomic::Ordering::Relaxed);
        if ns == 0 {
            return;
        }
        let start = iolab_sys::cpu::thread_cpu_ns();
        while iolab_sys::cpu::thread_cpu_ns().saturating_sub(start) < ns {
            std::hint::spin_loop();
        }
    }

    pub(crate) fn files(&self) -> &site::Files {
        debug_assert_eq!(self.files.root(), self.root);
        &self.files
    }
}
