//! How a server of the lab's line-up is started as a child process: one type per role,
//! used by both sides. The launcher (the lab) fills a spec and runs the binary with
//! `to_args()`; the binary's command line parses those flags back into the same spec
//! (`iolab serve`: src/cli/serve.rs, `ServeArgs::to_spec`; the tokio peer:
//! crates/apps/tokio-server, `Args::to_spec`; the monoio and glommio peers likewise in
//! crates/apps/{monoio,glommio}-server), and a round-trip test on each side (spec ->
//! `to_args` -> clap -> spec) fails when a flag is renamed on one side only.
//!
//! `to_args` writes every field, defaults included, so that what the child runs with never
//! depends on the two sides agreeing on a default.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::{AcceptMode, Buffers, Config, Model};

/// `iolab serve`: one model serving a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeSpec {
    pub model: Model,
    pub root: PathBuf,
    pub addr: SocketAddr,
    /// Threads or loops, where the model has several (0 = the model's default).
    pub workers: usize,
    pub backlog: u32,
    pub max_conns: usize,
    /// 0 = never.
    pub idle_timeout: Duration,
    /// The whole request head, from its first byte; 0 = never.
    pub header_timeout: Duration,
    /// A send without progress; 0 = never.
    pub send_timeout: Duration,
    /// Publish the live counters in this file (`--stats`).
    pub stats: Option<PathBuf>,
    pub accept: AcceptMode,
    pub limits: iolab_http::Limits,
    pub buffers: Buffers,
    /// `uring-fixed`'s slots per worker (0 = from `max_conns` / workers).
    pub slots: usize,
}

impl ServeSpec {
    /// `model` serving `root` on `addr`, the rest as [`Config::default`] (which is
    /// `iolab serve`'s defaults), no stats file.
    pub fn new(model: Model, root: PathBuf, addr: SocketAddr) -> ServeSpec {
        let d = Config::default();
        ServeSpec {
            model,
            root,
            addr,
            workers: d.workers,
            backlog: d.backlog,
            max_conns: d.max_conns,
            idle_timeout: d.idle_timeout,
            header_timeout: d.header_timeout,
            send_timeout: d.send_timeout,
            stats: None,
            accept: d.accept,
            limits: d.limits,
            buffers: d.buffers,
            slots: d.slots,
        }
    }

    /// The flag `to_args` gives `accept`, with its value (`--accept sync`).
    pub fn accept_arg(accept: AcceptMode) -> [&'static str; 2] {
        [
            "--accept",
            match accept {
                AcceptMode::Sync => "sync",
                AcceptMode::Async => "async",
            },
        ]
    }

    /// The arguments after the program name: `serve --model M --root DIR ...`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["serve".into()];
        let mut flag = |name: &str, value: OsString| {
            a.push(name.into());
            a.push(value);
        };
        flag("--model", self.model.name().into());
        flag("--root", self.root.clone().into());
        flag("--addr", self.addr.to_string().into());
        flag("--workers", self.workers.to_string().into());
        flag("--backlog", self.backlog.to_string().into());
        flag("--max-conns", self.max_conns.to_string().into());
        flag("--idle-timeout", secs(self.idle_timeout));
        flag("--header-timeout", secs(self.header_timeout));
        flag("--send-timeout", secs(self.send_timeout));
        if let Some(p) = &self.stats {
            flag("--stats", p.clone().into());
        }
        let [accept, mode] = Self::accept_arg(self.accept);
        flag(accept, mode.into());
        let l = &self.limits;
        flag("--max-request-line", l.max_request_line.to_string().into());
        flag("--max-header-bytes", l.max_header_bytes.to_string().into());
        flag("--max-headers", l.max_headers.to_string().into());
        flag("--max-body", l.max_body.to_string().into());
        flag("--max-queued", l.max_queued.to_string().into());
        flag("--read-buf", self.buffers.read_buf.to_string().into());
        flag("--max-iov", self.buffers.max_iov.to_string().into());
        flag("--slots", self.slots.to_string().into());
        a
    }

    /// The configuration the model runs with.
    pub fn config(&self) -> Config {
        Config {
            root: self.root.clone(),
            addr: self.addr,
            backlog: self.backlog,
            workers: self.workers,
            max_conns: self.max_conns,
            idle_timeout: self.idle_timeout,
            header_timeout: self.header_timeout,
            send_timeout: self.send_timeout,
            limits: self.limits.clone(),
            accept: self.accept,
            buffers: self.buffers,
            slots: self.slots,
        }
    }
}

/// The model whose `--model` name is `name`.
pub fn model_named(name: &str) -> Option<Model> {
    Model::ALL.into_iter().find(|m| m.name() == name)
}

/// Which HTTP implementation the tokio peer answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokioEngine {
    /// hyper's HTTP/1.1 server, what a tokio user would deploy.
    Hyper,
    /// iolab's `Session` on tokio sockets.
    Iolab,
}

impl TokioEngine {
    /// The value of `--engine`.
    pub fn name(self) -> &'static str {
        match self {
            TokioEngine::Hyper => "hyper",
            TokioEngine::Iolab => "iolab",
        }
    }
}

/// What every peer binary is told, whatever its runtime: what to serve, where, on how many
/// threads, with which listen backlog and idle timeout (the flags they share).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerBasics {
    pub root: PathBuf,
    pub addr: SocketAddr,
    /// Threads, each its runtime's worker or executor (0 = one per CPU the process may
    /// run on).
    pub workers: usize,
    pub backlog: u32,
    /// 0 = never.
    pub idle_timeout: Duration,
}

impl PeerBasics {
    /// `root` on `addr` with the peers' defaults: a thread per CPU, backlog 1024, 60 s
    /// idle timeout.
    pub fn new(root: PathBuf, addr: SocketAddr) -> PeerBasics {
        PeerBasics {
            root,
            addr,
            workers: 0,
            backlog: 1024,
            idle_timeout: Duration::from_secs(60),
        }
    }

    /// The shared flags, followed by `extra`: one peer's own flag and its value.
    fn to_args_with(&self, extra: (&str, OsString)) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut flag = |name: &str, value: OsString| {
            a.push(name.into());
            a.push(value);
        };
        flag("--root", self.root.clone().into());
        flag("--addr", self.addr.to_string().into());
        flag("--workers", self.workers.to_string().into());
        flag("--backlog", self.backlog.to_string().into());
        flag("--idle-timeout", secs(self.idle_timeout));
        flag(extra.0, extra.1);
        a
    }
}

/// `iolab-tokio-server`: the tokio peer serving a directory (`peer.workers`: tokio worker
/// threads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokioSpec {
    pub peer: PeerBasics,
    pub engine: TokioEngine,
}

impl TokioSpec {
    /// The peer serving `root` on `addr` with its defaults: a thread per core, backlog
    /// 1024, 60 s idle timeout, hyper.
    pub fn new(root: PathBuf, addr: SocketAddr) -> TokioSpec {
        TokioSpec::with(PeerBasics::new(root, addr))
    }

    /// The peer told `peer`, answering with hyper.
    pub fn with(peer: PeerBasics) -> TokioSpec {
        TokioSpec {
            peer,
            engine: TokioEngine::Hyper,
        }
    }

    /// The arguments after the program name.
    pub fn to_args(&self) -> Vec<OsString> {
        self.peer
            .to_args_with(("--engine", self.engine.name().into()))
    }
}

/// `iolab-monoio-server`: the monoio peer serving a directory (monoio's io_uring driver,
/// one runtime per thread, each thread bound to one CPU, one SO_REUSEPORT listener each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonoioSpec {
    pub peer: PeerBasics,
    /// Submission queue entries of each thread's ring (monoio's `with_entries`; it raises
    /// anything below 256 to 256).
    pub entries: u32,
}

impl MonoioSpec {
    /// monoio's configuration guide: "When your QPS is high, setting larger entries can
    /// increase the ring size and reduce the number of submits"; its own benchmark servers
    /// use 32768.
    pub const RECOMMENDED_ENTRIES: u32 = 32768;

    /// The peer serving `root` on `addr` with its defaults: a thread per CPU, backlog 1024,
    /// 60 s idle timeout, rings of [`MonoioSpec::RECOMMENDED_ENTRIES`].
    pub fn new(root: PathBuf, addr: SocketAddr) -> MonoioSpec {
        MonoioSpec::with(PeerBasics::new(root, addr))
    }

    /// The peer told `peer`, with rings of [`MonoioSpec::RECOMMENDED_ENTRIES`].
    pub fn with(peer: PeerBasics) -> MonoioSpec {
        MonoioSpec {
            peer,
            entries: Self::RECOMMENDED_ENTRIES,
        }
    }

    /// The arguments after the program name.
    pub fn to_args(&self) -> Vec<OsString> {
        self.peer
            .to_args_with(("--entries", self.entries.to_string().into()))
    }
}

/// How the glommio peer sets up its executors: glommio's defaults, or one of the two
/// trade-offs its documentation describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlommioProfile {
    /// `LocalExecutorBuilder::new(Placement::Fixed(cpu))` and nothing else: ring depth 128,
    /// preemption every 100 ms, connections in the default task queue.
    Default,
    /// Connections in a task queue marked `Latency::Matters(1 ms)` (glommio: latency
    /// sensitive queues get their own ring and make background work preempt itself).
    Latency,
    /// Connections in a `Latency::NotImportant` queue, a deeper ring (1024: "a higher ring
    /// depth allows a shard to submit a greater number of IO requests") and preemption
    /// every 500 ms ("lower values ... can help latency but harm throughput").
    Throughput,
}

impl GlommioProfile {
    pub const ALL: [GlommioProfile; 3] = [
        GlommioProfile::Default,
        GlommioProfile::Latency,
        GlommioProfile::Throughput,
    ];

    /// The value of `--profile`.
    pub fn name(self) -> &'static str {
        match self {
            GlommioProfile::Default => "default",
            GlommioProfile::Latency => "latency",
            GlommioProfile::Throughput => "throughput",
        }
    }
}

/// `iolab-glommio-server`: the glommio peer serving a directory (one `LocalExecutor` per
/// thread, each placed on one CPU, one SO_REUSEPORT listener each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlommioSpec {
    pub peer: PeerBasics,
    pub profile: GlommioProfile,
}

impl GlommioSpec {
    /// The peer serving `root` on `addr` with its defaults: a thread per CPU, backlog 1024,
    /// 60 s idle timeout, glommio's default executor settings.
    pub fn new(root: PathBuf, addr: SocketAddr) -> GlommioSpec {
        GlommioSpec::with(PeerBasics::new(root, addr))
    }

    /// The peer told `peer`, with glommio's default executor settings.
    pub fn with(peer: PeerBasics) -> GlommioSpec {
        GlommioSpec {
            peer,
            profile: GlommioProfile::Default,
        }
    }

    /// The arguments after the program name.
    pub fn to_args(&self) -> Vec<OsString> {
        self.peer
            .to_args_with(("--profile", self.profile.name().into()))
    }
}

/// A duration as the seconds the command lines take (fractions allowed); `f64`'s Display
/// is the shortest text that parses back to the same value.
fn secs(d: Duration) -> OsString {
    d.as_secs_f64().to_string().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_args_name_every_field() {
        let mut s = ServeSpec::new(
            Model::UringCallback,
            "/srv/www".into(),
            "127.0.0.1:8099".parse().unwrap(),
        );
        s.stats = Some("/run/stats".into());
        s.accept = AcceptMode::Sync;
        s.idle_timeout = Duration::from_millis(2500);
        let args: Vec<String> = s
            .to_args()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(args[0], "serve");
        let value = |flag: &str| {
            let i = args.iter().position(|a| a == flag).expect(flag);
            args[i + 1].clone()
        };
        assert_eq!(value("--model"), "uring-callback");
        assert_eq!(value("--root"), "/srv/www");
        assert_eq!(value("--addr"), "127.0.0.1:8099");
        assert_eq!(value("--stats"), "/run/stats");
        assert_eq!(value("--accept"), "sync");
        assert_eq!(value("--idle-timeout"), "2.5");
        assert_eq!(value("--header-timeout"), "60");
        assert_eq!(value("--send-timeout"), "60");
        assert_eq!(value("--backlog"), "1024");
        // Flags and values alternate after the subcommand.
        assert_eq!(args.len() % 2, 1);
        assert!(args[1..].iter().step_by(2).all(|f| f.starts_with("--")));
        s.stats = None;
        assert!(!s.to_args().contains(&OsString::from("--stats")));
    }

    #[test]
    fn config_carries_the_spec() {
        let mut s = ServeSpec::new(Model::Epoll, "/w".into(), "127.0.0.1:1".parse().unwrap());
        s.workers = 3;
        s.backlog = 200;
        s.buffers.max_iov = 8;
        let c = s.config();
        assert_eq!((c.workers, c.backlog, c.buffers.max_iov), (3, 200, 8));
        assert_eq!(c.root, PathBuf::from("/w"));
        assert_eq!(c.limits, s.limits);
    }

    #[test]
    fn models_are_found_by_name() {
        for m in Model::ALL {
            assert_eq!(model_named(m.name()), Some(m));
        }
        assert_eq!(model_named("uring-callback-sync"), None);
    }

    fn strings(args: Vec<OsString>) -> Vec<String> {
        args.into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn monoio_and_glommio_args() {
        let mut m = MonoioSpec::new("/w".into(), "127.0.0.1:9000".parse().unwrap());
        m.entries = 4096;
        m.peer.workers = 2;
        assert_eq!(
            strings(m.to_args()),
            [
                "--root",
                "/w",
                "--addr",
                "127.0.0.1:9000",
                "--workers",
                "2",
                "--backlog",
                "1024",
                "--idle-timeout",
                "60",
                "--entries",
                "4096"
            ]
        );
        assert_eq!(MonoioSpec::new("/w".into(), m.peer.addr).entries, 32768);
        let mut g = GlommioSpec::new("/w".into(), "127.0.0.1:9000".parse().unwrap());
        g.profile = GlommioProfile::Latency;
        g.peer.idle_timeout = Duration::from_millis(250);
        let args = strings(g.to_args());
        assert_eq!(
            args[8..],
            ["--idle-timeout", "0.25", "--profile", "latency"]
        );
        let names: Vec<_> = GlommioProfile::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["default", "latency", "throughput"]);
    }

    #[test]
    fn tokio_args() {
        let mut t = TokioSpec::new("/w".into(), "[::1]:9000".parse().unwrap());
        t.engine = TokioEngine::Iolab;
        t.peer.idle_timeout = Duration::ZERO;
        let args: Vec<String> = t
            .to_args()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "--root",
                "/w",
                "--addr",
                "[::1]:9000",
                "--workers",
                "0",
                "--backlog",
                "1024",
                "--idle-timeout",
                "0",
                "--engine",
                "iolab"
            ]
        );
    }
}
