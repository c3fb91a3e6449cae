//! The command lines of the processes the bench starts: a seeding process ([`SeedSpec`],
//! `iolab seed PATH...`) and a swarm process ([`crate::swarm::SwarmConfig`],
//! `iolab seed swarm`). Each is one type that both sides use: the bench builds it and turns
//! it into arguments with `to_args`, the binary's command line (src/cli/seed.rs) parses the
//! flags back into the same type, and a test there checks that the two agree for every
//! field.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use iolab_runtime::Driver;

use crate::disk::DiskMode;
use crate::metainfo::MetaVersion;
use crate::mse::Policy;
use crate::seed::Config;
use crate::swarm::SwarmConfig;

/// `iolab seed PATH...`: what to seed and how. [`Default`] is what the flags default to.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedSpec {
    /// The .torrent files to seed (or one directory of them), or the files/directories to
    /// make a torrent of.
    pub paths: Vec<PathBuf>,
    /// Where to write the created .torrent (when `paths` is data).
    pub torrent: Option<PathBuf>,
    /// Directory holding a loaded torrent's data (`None`: the .torrent's directory).
    pub data: Option<PathBuf>,
    /// Tracker announce URL: written into a created torrent, and announced to.
    pub tracker: Option<String>,
    /// Addresses to accept peers on, every torrent on each (port 0 picks a free port).
    pub listen: Vec<SocketAddr>,
    /// How blocks are read from disk.
    pub disk: DiskMode,
    /// Keep the kernel's read-ahead on the data files.
    pub read_ahead: bool,
    /// Upload slots; 0 = unchoke every interested peer.
    pub slots: usize,
    /// Piece size of a created torrent (`None`: about 1,500 pieces).
    pub piece_length: Option<u64>,
    /// Name of a multi-file torrent made of several paths.
    pub name: Option<String>,
    /// Make the .torrent and exit without seeding.
    pub create_only: bool,
    /// Skip the hash check of a loaded torrent's data.
    pub no_check: bool,
    /// Connections held at once.
    pub max_peers: usize,
    /// Accept uTP over UDP on the listen port (`--utp on|off`).
    pub utp: bool,
    /// Requests queued per peer.
    pub max_queue: usize,
    /// Seconds a peer may take none of the data waiting for it before it is dropped.
    pub send_timeout: u64,
    /// Seconds between status lines on stderr (0 = none).
    pub status_every: u64,
    /// Where to write the counters as JSON, every second and at exit.
    pub json: Option<PathBuf>,
    /// Event-loop driver (`None`: io_uring when available).
    pub driver: Option<Driver>,
    /// MSE/PE policy (`--encryption`).
    pub encryption: Policy,
    /// Tracker peers dialled and held at once (0: never dial).
    pub max_dialled: usize,
    /// Format of a created torrent (`--v2`, `--hybrid`; v1 by default).
    pub version: MetaVersion,
    /// BEP 19 web seeds written into a created torrent.
    pub web_seeds: Vec<String>,
    /// BEP 27: a created torrent is private.
    pub private: bool,
    /// `comment` of a created torrent.
    pub comment: Option<String>,
    /// PEM file of the CAs that https trackers' certificates are checked against (`None`:
    /// Mozilla's roots).
    pub tracker_ca: Option<PathBuf>,
}

impl Default for SeedSpec {
    fn default() -> Self {
        let engine = Config::default();
        SeedSpec {
            paths: Vec::new(),
            torrent: None,
            data: None,
            tracker: None,
            listen: vec![SocketAddr::from(([0, 0, 0, 0], 6881))],
            disk: engine.disk,
            read_ahead: engine.read_ahead,
            slots: engine.slots,
            piece_length: None,
            name: None,
            create_only: false,
            no_check: false,
            max_peers: engine.max_peers,
            utp: engine.utp,
            max_queue: engine.max_queue,
            send_timeout: engine.send_timeout.as_secs(),
            status_every: 10,
            json: None,
            driver: None,
            encryption: engine.encryption,
            max_dialled: engine.dial.max_dialled,
            version: MetaVersion::V1,
            web_seeds: Vec::new(),
            private: false,
            comment: None,
            tracker_ca: None,
        }
    }
}

/// An argument list under construction: flags with values, flags alone.
#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn words(mut self, words: &[&str]) -> Self {
        self.0.extend(words.iter().map(OsString::from));
        self
    }

    fn value(mut self, flag: &str, value: impl Into<OsString>) -> Self {
        self.0.push(flag.into());
        self.0.push(value.into());
        self
    }

    fn value_if(self, flag: &str, value: Option<impl Into<OsString>>) -> Self {
        match value {
            Some(v) => self.value(flag, v),
            None => self,
        }
    }

    fn flag_if(mut self, flag: &str, on: bool) -> Self {
        if on {
            self.0.push(flag.into());
        }
        self
    }
}

/// `--driver`'s value for `driver`.
fn driver_flag(driver: Driver) -> &'static str {
    match driver {
        Driver::Uring => "uring",
        Driver::Epoll => "epoll",
    }
}

impl SeedSpec {
    /// The arguments of `iolab` that run this spec: `seed`, every flag, then the paths
    /// (after `--`, so that no path is read as a flag or a subcommand).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args = Args::default()
            .words(&["seed"])
            .value_if("--torrent", self.torrent.as_ref())
            .value_if("--data", self.data.as_ref())
            .value_if("--tracker", self.tracker.as_ref())
            .value("--disk", self.disk.to_string())
            .flag_if("--read-ahead", self.read_ahead)
            .value("--slots", self.slots.to_string())
            .value_if("--piece-length", self.piece_length.map(|n| n.to_string()))
            .value_if("--name", self.name.as_ref())
            .flag_if("--create-only", self.create_only)
            .flag_if("--no-check", self.no_check)
            .value("--max-peers", self.max_peers.to_string())
            .value("--utp", if self.utp { "on" } else { "off" })
            .value("--max-queue", self.max_queue.to_string())
            .value("--send-timeout", self.send_timeout.to_string())
            .value("--status-every", self.status_every.to_string())
            .value_if("--json", self.json.as_ref())
            .value_if("--driver", self.driver.map(driver_flag))
            .value("--encryption", self.encryption.name())
            .value("--max-dialled", self.max_dialled.to_string())
            .flag_if("--v2", self.version == MetaVersion::V2)
            .flag_if("--hybrid", self.version == MetaVersion::Hybrid)
            .flag_if("--private", self.private)
            .value_if("--comment", self.comment.as_ref())
            .value_if("--tracker-ca", self.tracker_ca.as_ref());
        for url in &self.web_seeds {
            args = args.value("--web-seed", url);
        }
        for addr in &self.listen {
            args = args.value("--listen", addr.to_string());
        }
        args = args.words(&["--"]);
        args.0.extend(self.paths.iter().map(OsString::from));
        args.0
    }
}

impl SwarmConfig {
    /// The arguments of `iolab` that run this swarm process: `seed swarm` and every flag.
    pub fn to_args(&self) -> Vec<OsString> {
        Args::default()
            .words(&["seed", "swarm"])
            .value("--target", self.target.to_string())
            .value("--torrent", &self.torrent)
            .value("--peers", self.peers.to_string())
            .value("--idle-secs", self.idle_secs.to_string())
            .value("--secs", self.secs.to_string())
            .value("--pipeline", self.pipeline.to_string())
            .value("--connect-rate", self.connect_rate.to_string())
            .value("--process", self.process.to_string())
            .flag_if("--mse", self.mse)
            .0
    }
}
