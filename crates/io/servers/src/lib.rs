//! The same static web server in every I/O model.
//!
//! CONTRACT: each model is a module with `pub fn run(ctx: &Ctx) -> std::io::Result<()>` that
//! binds `ctx.config.addr`, serves `ctx.site` through `iolab_http::Session`, updates
//! `ctx.stats`, and returns once `ctx.shutdown` is triggered (after closing its sockets).
//!
//! Counting, the same in every model: `stats.accepted()` for each connection `accept` returns;
//! then either `stats.refused()` (closed at once: `max_conns`, FD_SETSIZE, no thread) or
//! `stats.conn_opened()` ... `stats.conn_closed()` around its service; `stats.response(status)`
//! from `Session::feed`'s `on_response`; `stats.error(kind)` / `stats.io_error(&e)` for the
//! socket error or deadline (`iolab_http::Deadline`: head, send, idle) that ended it. [`net`] holds the socket plumbing the thread
//! and readiness models share (listeners, `Conn::progress`, `serve_blocking`, `Registry`).
//!
//! Same sizes everywhere: every model reads a connection into a buffer of
//! `Config::buffers.read_buf` bytes and hands at most `Config::buffers.max_iov` response
//! chunks to one vectored send ([`Buffers`]; defaults [`READ_BUF`] and [`MAX_IOV`], set by
//! `iolab serve --read-buf --max-iov`), so that differences come from the I/O model alone
//! (the io_uring models used to have 8 KiB and 8 iovecs, the others 16 KiB and 64).
//!
//! Bounded work per connection (every model, through `iolab_http::Session`): a model reads
//! only when nothing is pending and calls `Session::resume` after each `advance`, so a
//! connection holds at most `Limits::max_queued` of responses plus two 64 KiB chunks of a
//! streamed file, whatever the client pipelines.
//!
//! Where file reads happen (the table in the crate's README.md says the same). A cache
//! miss costs `open`, `fstat` and the `/proc/self/fd` check — always on the thread that
//! parses the request (metadata, usually in the dentry cache) — then one read of the whole
//! file if it is cacheable (up to `CacheConfig::max_cached_file`), or one 64 KiB read per
//! chunk of a larger, streamed file. Those reads are done:
//! - `threads`, `thread-pool`: on the connection's own thread, which blocks; other
//!   connections are not affected — that is the point of these models.
//! - `select`, `poll`, `epoll`: on the event loop, synchronously (`FileReads::Blocking`); a
//!   read that misses the page cache stalls every connection of that loop, as in seed 000's
//!   servers and nginx without `aio threads`. Kept on purpose: it is what the seed measured.
//! - `uring-accept-sync`, `uring`, `uring-fixed`, `uring-callback`: through the ring
//!   (`FileReads::Caller`, one `IORING_OP_READ` on the file's descriptor,
//!   `uring_common::file_read_entries`); the connection waits in a `ReadingFile` step (or
//!   its routine), the loop serves the others.
//! - `runtime`: on the runtime's blocking pool (`iolab_runtime::detach`), the connection's
//!   task waiting; the same on the epoll driver.
//!
//! Tested by `slow_file_reads_hold_up_only_their_connection` in each of the last two groups:
//! with a disk made 400 ms slower (`Site::inject_read_delay`; `IOLAB_TEST_READ_DELAY_MS` for
//! `iolab serve` in debug builds), another client keeps being answered during a slow read.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub mod net;
pub mod shutdown;
/// The counters moved to their own crate; `crate::stats` keeps the models' paths short.
pub use iolab_stats as stats;

pub mod epoll;
pub mod linger;
pub mod memory;
pub mod poll;
pub mod runtime;
pub mod select;
pub mod spec;
#[cfg(test)]
mod testing;
pub mod thread_pool;
pub mod threads;
pub mod uring;
pub mod uring_accept_sync;
pub mod uring_callback;
pub mod uring_common;
pub(crate) mod uring_conn;
pub mod uring_fixed;
pub(crate) mod uring_worker;

pub use shutdown::Shutdown;

/// Default size of the buffer every model reads a connection's bytes into.
pub const READ_BUF: usize = iolab_stats::models::DEFAULT_READ_BUF;
/// Default most response chunks every model hands to one `writev`/`sendmsg`.
pub const MAX_IOV: usize = iolab_stats::models::DEFAULT_MAX_IOV;
/// Largest `read_buf` accepted (one receive's length is a `u32` in io_uring).
pub const MAX_READ_BUF: usize = 16 << 20;
/// Largest `max_iov` accepted: the kernel's `IOV_MAX`.
pub const IOV_MAX: usize = 1024;

/// The buffer sizes every model uses, one value for all of them, so that differences come
/// from the I/O model alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Buffers {
    /// Bytes of a connection read at once: the size of each connection's receive buffer
    /// (`uring-fixed`: of each slot of its registered arena), 1 to [`MAX_READ_BUF`].
    pub read_buf: usize,
    /// Most response chunks (a head, a body, the next pipelined response...) handed to one
    /// `writev`/`sendmsg`, 1 to [`IOV_MAX`].
    pub max_iov: usize,
}

impl Default for Buffers {
    fn default() -> Self {
        Buffers {
            read_buf: READ_BUF,
            max_iov: MAX_IOV,
        }
    }
}

impl Buffers {
    /// Checks the bounds; the error says which value is out of range.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_READ_BUF).contains(&self.read_buf) {
            return Err(format!(
                "read buffer of {} bytes: must be 1 to {MAX_READ_BUF}",
                self.read_buf
            ));
        }
        if !(1..=IOV_MAX).contains(&self.max_iov) {
            return Err(format!(
                "{} iovecs per send: must be 1 to {IOV_MAX}",
                self.max_iov
            ));
        }
        Ok(())
    }
}
pub use stats::Stats;

/// How `uring-callback` accepts connections (seed 000's CR vs CR-iocp).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum AcceptMode {
    Sync,
    Async,
}

/// One configuration for every model.
#[derive(Debug, Clone)]
pub struct Config {
    pub root: PathBuf,
    pub addr: SocketAddr,
    pub backlog: u32,
    /// Threads or loops, where the model has several (0 = one per core).
    pub workers: usize,
    /// Connections held at once; beyond it new connections are closed and counted as refused.
    pub max_conns: usize,
    /// A keep-alive connection without a byte between requests this long is closed (also a
    /// request body stalled this long); zero = never.
    pub idle_timeout: Duration,
    /// A request head not complete this long after its first byte (the connection's start,
    /// for the first request) is closed, however its bytes trickle in; zero = never.
    pub header_timeout: Duration,
    /// A response whose send makes no progress this long is closed; zero = never.
    pub send_timeout: Duration,
    pub limits: iolab_http::Limits,
    pub accept: AcceptMode,
    /// Receive buffer and iovec count, the same for every model.
    pub buffers: Buffers,
    /// `uring-fixed`: connection slots per worker, allocated and pinned at start (0 = sized
    /// from `max_conns` and the workers, [`uring_fixed::slots_per_worker`]).
    pub slots: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            root: PathBuf::from("."),
            addr: "127.0.0.1:8080".parse().unwrap(),
            backlog: 1024,
            workers: 0,
            max_conns: 10_000,
            idle_timeout: iolab_http::DEFAULT_TIMEOUT,
            header_timeout: iolab_http::DEFAULT_TIMEOUT,
            send_timeout: iolab_http::DEFAULT_TIMEOUT,
            limits: iolab_http::Limits::default(),
            accept: AcceptMode::Async,
            buffers: Buffers::default(),
            slots: 0,
        }
    }
}

impl Config {
    /// The deadlines of every connection ([`iolab_http::Deadline`]).
    pub fn timeouts(&self) -> iolab_http::Timeouts {
        iolab_http::Timeouts {
            header: self.header_timeout,
            idle: self.idle_timeout,
            send: self.send_timeout,
        }
    }
}

/// What a model's `run` receives.
pub struct Ctx {
    pub config: Config,
    pub site: Arc<iolab_http::Site>,
    pub stats: Arc<Stats>,
    pub shutdown: Arc<Shutdown>,
}

impl Ctx {
    /// A context for `config`: opens the site (errors name the root), a fresh stop request,
    /// and the given counters (`Stats::private()` or `Stats::create(path)`).
    pub fn new(config: Config, stats: Stats) -> std::io::Result<Ctx> {
        config
            .buffers
            .check()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let site = iolab_http::Site::new(config.root.clone(), config.limits.clone())?;
        Ok(Ctx {
            config,
            site,
            stats: Arc::new(stats),
            shutdown: Shutdown::new()?,
        })
    }
}

/// Every model, in the order `iolab models` lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Model {
    Threads,
    ThreadPool,
    Select,
    Poll,
    Epoll,
    UringAcceptSync,
    Uring,
    UringFixed,
    UringCallback,
    Runtime,
}

impl Model {
    pub const ALL: [Model; 10] = [
        Model::Threads,
        Model::ThreadPool,
        Model::Select,
        Model::Poll,
        Model::Epoll,
        Model::UringAcceptSync,
        Model::Uring,
        Model::UringFixed,
        Model::UringCallback,
        Model::Runtime,
    ];

    /// The name `--model` takes, from the shared table (`iolab_stats::models`).
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The seed 000 server this model mirrors, and one line on what it is.
    pub fn describe(self) -> (&'static str, &'static str) {
        let info = self.info();
        (info.seed, info.what)
    }

    /// This model's entry in the shared table: the enum and the table list the models in the
    /// same order (checked by a test).
    pub fn info(self) -> &'static iolab_stats::models::ModelInfo {
        &iolab_stats::models::MODELS[self as usize]
    }

    /// How the "(N workers)" of `iolab serve`'s start line reads for this model.
    pub fn workers_line(self, config: &Config) -> String {
        match self {
            Model::Threads => "1 accept thread + 1 thread per connection".to_string(),
            Model::ThreadPool => format!("{} workers", thread_pool::workers(config)),
            Model::Epoll => format!("{} workers", epoll::workers(config)),
            Model::Select | Model::Poll => "1 worker".to_string(),
            Model::UringFixed => uring_fixed::start_note(config),
            Model::UringAcceptSync | Model::Uring | Model::UringCallback => {
                format!("{} workers", uring_common::worker_count(config.workers))
            }
            _ if config.workers == 0 => "workers: model default".to_string(),
            _ => format!("{} workers", config.workers),
        }
    }

    /// Serves until the stop request, with freed memory given back when connections
    /// close ([`memory::with_trimming`]).
    pub fn run(self, ctx: &Ctx) -> std::io::Result<()> {
        memory::with_trimming(&ctx.stats, || self.run_model(ctx))
    }

    fn run_model(self, ctx: &Ctx) -> std::io::Result<()> {
        match self {
            Model::Threads => threads::run(ctx),
            Model::ThreadPool => thread_pool::run(ctx),
            Model::Select => select::run(ctx),
            Model::Poll => poll::run(ctx),
            Model::Epoll => epoll::run(ctx),
            Model::UringAcceptSync => uring_accept_sync::run(ctx),
            Model::Uring => uring::run(ctx),
            Model::UringFixed => uring_fixed::run(ctx),
            Model::UringCallback => uring_callback::run(ctx),
            Model::Runtime => runtime::run(ctx),
        }
    }
}

impl std::fmt::Display for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The enum, clap's value names and the shared table agree, in the same order.
    #[test]
    fn models_match_the_shared_table() {
        assert_eq!(Model::ALL.len(), iolab_stats::models::MODELS.len());
        for (i, m) in Model::ALL.iter().enumerate() {
            assert_eq!(*m as usize, i);
            // The serialised name (lab's JSON) is the table's name.
            assert_eq!(serde_json::to_value(m).unwrap(), m.name());
        }
    }

    /// A model run on a port where another server listens with SO_REUSEPORT must fail with
    /// "address in use", not join that server's group and take part of its connections.
    #[test]
    fn every_model_refuses_a_port_in_use() {
        let other = net::listen("127.0.0.1:0".parse().unwrap(), 16, true, false).unwrap();
        let addr = other.local_addr().unwrap();
        for (model, accept) in Model::ALL
            .iter()
            .map(|&m| (m, AcceptMode::Async))
            .chain([(Model::UringCallback, AcceptMode::Sync)])
        {
            let config = Config {
                root: std::env::temp_dir(),
                addr,
                workers: 2,
                accept,
                ..Config::default()
            };
            let ctx = Ctx::new(config, Stats::private()).unwrap();
            let result = std::thread::scope(|s| {
                // Bounds the test if a model wrongly starts serving: it is stopped, and the
                // Ok it then returns fails the assertion below.
                let (done, wait) = std::sync::mpsc::channel::<()>();
                let shutdown = ctx.shutdown.clone();
                s.spawn(move || {
                    if wait.recv_timeout(Duration::from_secs(5)).is_err() {
                        shutdown.trigger();
                    }
                });
                let r = model.run(&ctx);
                drop(done);
                r
            });
            let e = result.expect_err(&format!("{model} ({accept:?}) served a port in use"));
            assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{model}: {e}");
            assert!(e.to_string().contains("in use"), "{model}: {e}");
        }
    }
}
