//! `iolab seed ...`: seeding files (the flags of [`RunArgs`]), `iolab seed bench` and the
//! bench's hidden `iolab seed swarm` leecher processes. The seeder, the bench and the swarm
//! are iolab-seeder's ([`Seeder`], [`bench::run`], [`swarm::run`]); this module turns the
//! flags into their typed configs and drives a seeding run: the torrent loaded or made, the
//! start line on stdout, announces, status lines on stderr, the `--json` counters file, and
//! SIGINT/SIGTERM.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use iolab_runtime::net::TcpListener;
use iolab_runtime::{sleep, spawn, Runtime};
use iolab_seeder::announce::Tiers;
use iolab_seeder::bench::{self, BenchConfig};
use iolab_seeder::dial::DialLimits;
use iolab_seeder::disk::{DiskMode, DiskStats};
use iolab_seeder::https::TlsClient;
use iolab_seeder::metadata;
use iolab_seeder::metainfo::{CreateOptions, Meta, MetaVersion};
use iolab_seeder::mse::Policy;
use iolab_seeder::seed::{host, totals, Config, Counters, Host, Seeder};
use iolab_seeder::spec::SeedSpec;
use iolab_seeder::swarm::{self, SwarmConfig};

use super::choice_enum;

/// Seed files over BitTorrent (Hekate), or benchmark the seeder against libtorrent.
#[derive(Debug, clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "PATH is either .torrent files (their data is looked up in --data, by \
default each .torrent's directory), or one directory of *.torrent files (without --torrent), \
or the data itself: one file (a single-file torrent), one directory (a multi-file torrent \
named after it) or several paths (a multi-file torrent named --name). The data is checked \
against the piece hashes at start (progress bar), then seeded until SIGINT or SIGTERM. Per \
torrent, stdout says \"seeding NAME (info hash H, N pieces of P bytes, T bytes) on ADDR with \
disk path D\" and \"magnet URI\" (BEP 9: clients can start from the link alone).\n\nMany \
torrents share one process: the --listen sockets, --max-peers (per process) and one peer id; \
each has its own trackers (--tracker replaces all), choker, --slots and --max-dialled. A peer \
is routed by the info hash of its handshake (MSE: by its req2 hash); another hash is closed. \
Given several torrents or a directory, one that fails to load or check is named on stderr and \
skipped (the command fails only if none loads), and a last line says \"seeding N torrents \
(M skipped) on ADDR\" (ADDR: each listener's, joined by \"and\").\n\nExamples:\n  iolab tracker --listen \
127.0.0.1:6969 &\n  iolab seed ./iso --tracker http://127.0.0.1:6969/announce --torrent \
iso.torrent --listen 127.0.0.1:6881\n  iolab seed iso.torrent --data . --disk mmap\n  iolab \
seed ~/torrents --data ~/downloads --listen 0.0.0.0:6881 --listen [::]:6881\n  iolab \
seed bench --quick --json bench.json"
)]
pub struct SeedArgs {
    #[command(subcommand)]
    pub command: Option<SeedCommand>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum SeedCommand {
    /// Run a swarm of leechers against our seeder and libtorrent's, side by side.
    Bench(BenchArgs),
    /// (internal) One process of leechers for the bench.
    #[command(hide = true)]
    Swarm(SwarmArgs),
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The .torrent files to seed (or a directory of them), or the files/directories to
    /// make a torrent of.
    pub paths: Vec<PathBuf>,
    /// Write the created .torrent here (when PATH is data).
    #[arg(long, value_name = "OUT.torrent")]
    pub torrent: Option<PathBuf>,
    /// Directory holding a loaded torrent's data (default: the .torrent's directory).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Tracker announce URL: written into a created torrent, and announced to (http://,
    /// https:// or udp://). When absent, a loaded torrent's own trackers are used: its announce-list
    /// tiers (BEP 12), else its announce URL.
    #[arg(long)]
    pub tracker: Option<String>,
    /// Address to accept peers on, for every torrent (port 0 picks a free port). Repeatable:
    /// `--listen 0.0.0.0:6881 --listen [::]:6881` is dual stack (an IPv6 listener takes
    /// IPv6 only, so both share the port; with --utp each gets a UDP socket too). Trackers
    /// are told the first one's port.
    #[arg(long, value_name = "ADDR", default_values_t = SeedSpec::default().listen)]
    pub listen: Vec<SocketAddr>,
    /// How blocks are read from disk: uring (async reads on io_uring), mmap (Hekate's Unix
    /// design: mincore, then the blocking pool on a miss), pread (the blocking pool).
    #[arg(long, value_enum, default_value_t = SeedSpec::default().disk.into())]
    pub disk: DiskArg,
    /// Keep the kernel's read-ahead on the data files. By default they are opened with a
    /// random-access hint (POSIX_FADV_RANDOM, MADV_RANDOM for mmap): with many peers each
    /// wanting other pieces, read-ahead reads pages no peer asked for (cold read
    /// amplification 1.5-3 at 1,000 peers) and evicts pages that are still wanted.
    #[arg(long)]
    pub read_ahead: bool,
    /// Upload slots (best uploaders + one optimistic, rotated); 0 = unchoke every
    /// interested peer.
    #[arg(long, default_value_t = SeedSpec::default().slots)]
    pub slots: usize,
    /// Piece size of a created torrent (e.g. 262144, 256K, 4M): a power of two from 16 KiB
    /// to 64 MiB. Default: about 1,500 pieces, between 16 KiB and 4 MiB.
    #[arg(long, value_parser = parse_size)]
    pub piece_length: Option<u64>,
    /// Name of a multi-file torrent made of several paths.
    #[arg(long)]
    pub name: Option<String>,
    /// Make the .torrent (needs --torrent) and exit without seeding.
    #[arg(long)]
    pub create_only: bool,
    /// Skip the hash check of a loaded torrent's data (trust it).
    #[arg(long)]
    pub no_check: bool,
    /// Connections held at once by the process (all torrents, accepted and dialled).
    #[arg(long, default_value_t = SeedSpec::default().max_peers)]
    pub max_peers: usize,
    /// uTP (BEP 29): accept it over UDP on the --listen port (on, as the clients do:
    /// stock Transmission tries uTP first and never falls back to TCP), or TCP only (off).
    #[arg(long, value_enum, default_value_t = OnOff::from(SeedSpec::default().utp))]
    pub utp: OnOff,
    /// Requests queued per peer (more are rejected).
    #[arg(long, default_value_t = SeedSpec::default().max_queue)]
    pub max_queue: usize,
    /// The send-progress deadline: seconds a peer may take none of the data waiting for it
    /// before it is dropped (it is choked as snubbed after 5 s).
    #[arg(long, default_value_t = SeedSpec::default().send_timeout, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub send_timeout: u64,
    /// Seconds between status lines on stderr (0 = none).
    #[arg(long, default_value_t = SeedSpec::default().status_every)]
    pub status_every: u64,
    /// Write the counters as JSON to this file every second and at exit.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Event-loop driver for this run (default: io_uring when available).
    #[arg(long, value_enum)]
    pub driver: Option<DriverArg>,
    /// MSE/PE (protocol encryption): prefer (accept plaintext and MSE, choose RC4 when
    /// offered, dial with MSE), require (MSE with RC4 only), off (plaintext only).
    #[arg(long, value_enum, default_value_t = SeedSpec::default().encryption.into())]
    pub encryption: EncryptionArg,
    /// Tracker peers dialled and held at once (a bounded budget, back-off per address,
    /// never our own address); 0 = never dial.
    #[arg(long, default_value_t = SeedSpec::default().max_dialled)]
    pub max_dialled: usize,
    /// Make a v2-only torrent (BEP 52: SHA-256 merkle trees, `file tree`, `piece layers`).
    /// Clients without v2 cannot use it; seeding one answers v2 handshakes only.
    #[arg(long, conflicts_with = "hybrid")]
    pub v2: bool,
    /// Make a hybrid v1+v2 torrent (BEP 52, with BEP 47 pad files so that every file
    /// starts at a piece boundary): v1 and v2 clients can both use it.
    #[arg(long)]
    pub hybrid: bool,
    /// A web seed (BEP 19 `url-list`) to write into a created torrent: an http(s) URL of
    /// the file (single-file) or of the directory holding the torrent's directory
    /// (multi-file, ending in `/`). Repeatable.
    #[arg(long = "web-seed", value_name = "URL")]
    pub web_seeds: Vec<String>,
    /// Mark a created torrent private (BEP 27): clients then take peers from its trackers
    /// only (no DHT, PEX or LSD; Hekate has none of them anyway).
    #[arg(long)]
    pub private: bool,
    /// A comment written into a created torrent.
    #[arg(long, value_name = "TEXT")]
    pub comment: Option<String>,
    /// PEM file of the certificate authorities to check https trackers against (default:
    /// Mozilla's root CAs, built in).
    #[arg(long, value_name = "FILE")]
    pub tracker_ca: Option<PathBuf>,
}

impl RunArgs {
    /// The seeding run the flags ask for.
    pub fn to_spec(&self) -> SeedSpec {
        SeedSpec {
            paths: self.paths.clone(),
            torrent: self.torrent.clone(),
            data: self.data.clone(),
            tracker: self.tracker.clone(),
            listen: self.listen.clone(),
            disk: self.disk.into(),
            read_ahead: self.read_ahead,
            slots: self.slots,
            piece_length: self.piece_length,
            name: self.name.clone(),
            create_only: self.create_only,
            no_check: self.no_check,
            max_peers: self.max_peers,
            utp: self.utp == OnOff::On,
            max_queue: self.max_queue,
            send_timeout: self.send_timeout,
            status_every: self.status_every,
            json: self.json.clone(),
            driver: self.driver.map(Into::into),
            encryption: self.encryption.into(),
            max_dialled: self.max_dialled,
            version: match (self.v2, self.hybrid) {
                (true, _) => MetaVersion::V2,
                (_, true) => MetaVersion::Hybrid,
                _ => MetaVersion::V1,
            },
            web_seeds: self.web_seeds.clone(),
            private: self.private,
            comment: self.comment.clone(),
            tracker_ca: self.tracker_ca.clone(),
        }
    }
}

choice_enum! {
    /// `--encryption`: [`Policy`].
    pub enum EncryptionArg => Policy { Prefer, Require, Off }
}

choice_enum! {
    /// `seed bench --encryption`: [`bench::Encryption`].
    pub enum BenchEncryptionArg => bench::Encryption { Off, Rc4 }
}

/// A switch given as `on` or `off` (`--utp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

impl From<bool> for OnOff {
    fn from(on: bool) -> OnOff {
        if on {
            OnOff::On
        } else {
            OnOff::Off
        }
    }
}

choice_enum! {
    /// `--disk`, `--disks`: [`DiskMode`].
    pub enum DiskArg => DiskMode { Uring, Mmap, Pread }
}

choice_enum! {
    /// `--driver` of `seed` and `tracker`: [`iolab_runtime::Driver`].
    pub enum DriverArg => iolab_runtime::Driver { Uring, Epoll }
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "The quick run (--quick) uses 10 and 100 peers, 2 s per run, a 64 MiB \
torrent, 3 repeats: under 5 minutes. The full run: 10, 100, 1000 and 10000 peers, 10 s per run, 256 MiB. \
10,000 peers need 10,000+ descriptors in the seeder: the bench raises RLIMIT_NOFILE (as root \
up to fs.nr_open) and splits the swarm over processes of at most 2,500 peers.\n\nExample:\n  \
iolab seed bench --quick --json bench.json"
)]
pub struct BenchArgs {
    /// The short matrix (under 5 minutes).
    #[arg(long)]
    pub quick: bool,
    /// Peer counts (comma-separated); default 10,100,1000,10000 (quick: 10,100).
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<usize>,
    /// Seconds of downloading per run (default 10, quick 2).
    #[arg(long)]
    pub secs: Option<f64>,
    /// Torrent size in MiB (default 256, quick 64).
    #[arg(long)]
    pub size_mib: Option<u64>,
    /// Piece size of the bench torrent.
    #[arg(long, default_value = "256K", value_parser = parse_size)]
    pub piece_length: u64,
    /// Our disk paths to run (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "uring,mmap,pread")]
    pub disks: Vec<DiskArg>,
    /// Upload slots for both seeders (ours --slots, libtorrent unchoke_slots_limit);
    /// 0 = unlimited (libtorrent -1).
    #[arg(long, default_value_t = BenchConfig::default().slots)]
    pub slots: usize,
    /// Requests outstanding per leecher.
    #[arg(long, default_value_t = BenchConfig::default().pipeline)]
    pub pipeline: usize,
    /// The leechers' openings, each point run with each (comma-separated): off (the plain
    /// handshake), rc4 (MSE offering RC4 only: both seeders run the key exchange and encrypt
    /// every byte; libtorrent with its default encryption settings, Hekate with --encryption
    /// prefer). Default: off,rc4 (quick: off).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub encryption: Vec<BenchEncryptionArg>,
    /// Runs per (seeder, peers, cache) point; the table shows medians and min–max. The
    /// seeders' order is rotated between repeats.
    #[arg(long, default_value_t = BenchConfig::default().repeats)]
    pub repeats: usize,
    /// Skip libtorrent.
    #[arg(long)]
    pub no_libtorrent: bool,
    /// Run our seeders with the kernel's read-ahead on (`iolab seed --read-ahead`).
    #[arg(long)]
    pub read_ahead: bool,
    /// Only warm-cache runs (cold runs drop the page cache of the torrent's files first).
    #[arg(long)]
    pub warm_only: bool,
    /// Where to put the bench torrent's data (default: a temp dir, removed after).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl BenchArgs {
    /// The bench's config: the full or the quick matrix ([`BenchConfig::quick`]), with what
    /// the flags set.
    pub fn to_config(&self) -> BenchConfig {
        let base = if self.quick {
            BenchConfig::quick()
        } else {
            BenchConfig::default()
        };
        BenchConfig {
            peers: if self.peers.is_empty() {
                base.peers
            } else {
                self.peers.clone()
            },
            secs: self.secs.unwrap_or(base.secs),
            size_mib: self.size_mib.unwrap_or(base.size_mib),
            piece_length: self.piece_length,
            disks: self.disks.iter().map(|&d| d.into()).collect(),
            slots: self.slots,
            encryption: if self.encryption.is_empty() {
                base.encryption
            } else {
                self.encryption.iter().map(|&e| e.into()).collect()
            },
            pipeline: self.pipeline,
            repeats: self.repeats,
            libtorrent: !self.no_libtorrent,
            read_ahead: self.read_ahead,
            warm_only: self.warm_only,
            dir: self.dir.clone(),
            json: self.json.clone(),
        }
    }
}

/// The swarm flags' defaults: the library's ([`SwarmConfig::new`]).
fn swarm_defaults() -> SwarmConfig {
    SwarmConfig::new(SocketAddr::from(([0, 0, 0, 0], 0)), PathBuf::new())
}

#[derive(Debug, Clone, clap::Args)]
pub struct SwarmArgs {
    /// The seeder to download from.
    #[arg(long)]
    pub target: SocketAddr,
    /// The torrent (only its info hash and piece layout are used).
    #[arg(long)]
    pub torrent: PathBuf,
    /// Connections held by this process.
    #[arg(long, default_value_t = swarm_defaults().peers)]
    pub peers: usize,
    /// Seconds to hold the connections idle (handshaken, not interested) before downloading.
    #[arg(long, default_value_t = swarm_defaults().idle_secs)]
    pub idle_secs: f64,
    /// Seconds of downloading.
    #[arg(long, default_value_t = swarm_defaults().secs)]
    pub secs: f64,
    /// Requests outstanding per peer.
    #[arg(long, default_value_t = swarm_defaults().pipeline)]
    pub pipeline: usize,
    /// New connections per second (0 = all at once).
    #[arg(long, default_value_t = swarm_defaults().connect_rate)]
    pub connect_rate: u64,
    /// Index of this process (varies the peer ids across processes).
    #[arg(long, default_value_t = swarm_defaults().process)]
    pub process: u32,
    /// Open every connection with MSE offering RC4 only (the seeder encrypts all it sends).
    #[arg(long)]
    pub mse: bool,
}

impl SwarmArgs {
    pub fn to_config(&self) -> SwarmConfig {
        SwarmConfig {
            target: self.target,
            torrent: self.torrent.clone(),
            peers: self.peers,
            idle_secs: self.idle_secs,
            secs: self.secs,
            pipeline: self.pipeline,
            connect_rate: self.connect_rate,
            process: self.process,
            mse: self.mse,
        }
    }
}

/// The largest size these flags take. They are piece sizes (a torrent then asks for a power
/// of two up to 64 MiB): anything past 1 GiB is a mistake, refused as it always was.
const MAX_SIZE: u64 = 1 << 30;

/// `256K`, `4M`, `1G` or a plain number of bytes (iolab-sys's sizes), at most 1 GiB.
pub fn parse_size(s: &str) -> Result<u64, String> {
    iolab_sys::units::parse_size(s)
        .ok()
        .filter(|&n| n <= MAX_SIZE)
        .ok_or_else(|| format!("{:?} is not a size (e.g. 16384, 256K, 4M)", s.trim()))
}

pub fn run(args: SeedArgs) -> anyhow::Result<()> {
    match args.command {
        Some(SeedCommand::Bench(b)) => bench::run(b.to_config()),
        Some(SeedCommand::Swarm(s)) => swarm::run(s.to_config()),
        None => seed(args.run.to_spec()),
    }
}

fn is_torrent(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "torrent") && p.is_file()
}

/// The `*.torrent` files directly in `dir`, by name (empty if it holds none or cannot be
/// read).
fn torrents_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| is_torrent(p))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// What the paths of `args` ask to seed.
enum Source {
    /// Data to make one torrent of.
    Data,
    /// One .torrent given alone: an error in it is the command's.
    One(PathBuf),
    /// Several .torrent files, or a directory of them: one that fails is said and skipped.
    Many(Vec<PathBuf>),
}

/// Data, one .torrent, or many: every path a .torrent file, or one directory holding
/// `*.torrent` files (and no --torrent, which would make it data to create one of).
fn source_of(args: &SeedSpec) -> anyhow::Result<Source> {
    let p = &args.paths;
    if p.is_empty() {
        bail!("give a .torrent to seed or the files to make one of (see --help)");
    }
    if p.iter().all(|t| is_torrent(t)) {
        if args.create_only {
            bail!(
                "--create-only makes a torrent from data; {} is already one",
                p[0].display()
            );
        }
        return Ok(match p.len() {
            1 => Source::One(p[0].clone()),
            _ => Source::Many(p.clone()),
        });
    }
    if let Some(t) = p.iter().find(|t| is_torrent(t)) {
        bail!(
            "{} is a .torrent: give .torrent files alone (no data paths) to seed them",
            t.display()
        );
    }
    if p.len() == 1 && p[0].is_dir() && args.torrent.is_none() && !args.create_only {
        let list = torrents_in(&p[0]);
        if !list.is_empty() {
            return Ok(Source::Many(list));
        }
    }
    Ok(Source::Data)
}

/// Loads `t` (its data in --data, else beside it) and checks the data unless --no-check.
fn load(args: &SeedSpec, t: &Path) -> anyhow::Result<Meta> {
    let data = match &args.data {
        Some(d) => d.clone(),
        None => t
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf(),
    };
    let meta = Meta::load(t, &data)?;
    if !args.no_check {
        let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
        meta.verify(progress).with_context(|| {
            format!("checking the data of {} in {}", t.display(), data.display())
        })?;
    }
    Ok(meta)
}

/// The torrents to seed: made from data, loaded from one .torrent, or loaded from many (a
/// failure said by name and skipped; an error only if none loads). Also whether it was
/// many, and how many were skipped.
fn prepare(args: &SeedSpec) -> anyhow::Result<(Vec<Meta>, bool, usize)> {
    let list = match source_of(args)? {
        Source::Data => return Ok((vec![create(args)?], false, 0)),
        Source::One(t) => return Ok((vec![load(args, &t)?], false, 0)),
        Source::Many(list) => list,
    };
    let mut metas: Vec<Meta> = Vec::new();
    for t in &list {
        match load(args, t) {
            Ok(m) => metas.push(m),
            Err(e) => eprintln!("seed: skipped {}: {e:#}", t.display()),
        }
    }
    let skipped = list.len() - metas.len();
    if metas.is_empty() {
        bail!("none of the {} torrents could be seeded", list.len());
    }
    Ok((metas, true, skipped))
}

/// Makes the torrent of the data paths (and writes it to --torrent).
fn create(args: &SeedSpec) -> anyhow::Result<Meta> {
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (meta, bytes) = Meta::create(
        &args.paths,
        &CreateOptions {
            piece_length: args.piece_length,
            announce: args.tracker.clone(),
            name: args.name.clone(),
            progress,
            version: args.version,
            web_seeds: args.web_seeds.clone(),
            private: args.private,
            comment: args.comment.clone(),
        },
    )?;
    match &args.torrent {
        Some(out) => {
            if out.exists() && !is_torrent(out) {
                bail!(
                    "{} exists and is not a .torrent: not overwritten",
                    out.display()
                );
            }
            std::fs::write(out, &bytes).with_context(|| format!("writing {}", out.display()))?;
        }
        None if args.create_only => bail!("--create-only needs --torrent OUT.torrent"),
        None => {}
    }
    Ok(meta)
}

/// The runtime of a `seed` or `tracker` process: one worker, on `--driver`.
pub(crate) fn runtime(driver: Option<iolab_runtime::Driver>) -> anyhow::Result<Runtime> {
    let mut b = Runtime::builder().workers(1);
    if let Some(d) = driver {
        b = b.driver(d);
    }
    b.build().context("starting the runtime")
}

/// Set on SIGINT or SIGTERM.
pub(crate) fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    Ok(stop)
}

/// The disk counters of `d` (one torrent's, or summed into `into`).
fn disk_json(d: &DiskStats, into: &mut serde_json::Map<String, serde_json::Value>) {
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    for (k, v) in [
        ("disk_reads", get(&d.reads)),
        ("disk_bytes", get(&d.bytes)),
        ("mmap_resident", get(&d.resident)),
        ("mmap_resident_after_yield", get(&d.resident_after_yield)),
        ("mmap_prefetched", get(&d.prefetched)),
        ("detached", get(&d.detached)),
    ] {
        let old = into.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        into.insert(k.into(), (old + v).into());
    }
}

/// The `--json` report: `counters` and the disk figures are the process's totals (every
/// torrent's and the connections not yet routed, `process`), `torrents` each torrent's own;
/// `name` and `info_hash` the torrent's when there is one.
fn report(host: &Host, mode: DiskMode) -> serde_json::Value {
    let parts = host.torrents.iter().map(|s| &*s.counters);
    let mut top = serde_json::Map::new();
    if let [one] = &host.torrents[..] {
        top.insert("name".into(), one.meta.name.clone().into());
        top.insert("info_hash".into(), one.meta.info_hash_hex().into());
    }
    top.insert("disk".into(), serde_json::json!(mode));
    top.insert(
        "counters".into(),
        totals(std::iter::once(&host.process.counters).chain(parts)),
    );
    top.insert("process".into(), serde_json::json!(&host.process.counters));
    let held = Counters::get(&host.process.connections);
    top.insert("connections_now".into(), held.into());
    let mut torrents = Vec::new();
    for s in &host.torrents {
        disk_json(&s.storage.stats, &mut top);
        let mut t = serde_json::Map::new();
        t.insert("name".into(), s.meta.name.clone().into());
        t.insert("info_hash".into(), s.meta.info_hash_hex().into());
        t.insert("counters".into(), serde_json::json!(&*s.counters));
        disk_json(&s.storage.stats, &mut t);
        torrents.push(serde_json::Value::Object(t));
    }
    top.insert("torrents".into(), torrents.into());
    serde_json::Value::Object(top)
}

fn write_json(path: &Path, host: &Host, mode: DiskMode) {
    let tmp = path.with_extension("json.tmp");
    if std::fs::write(&tmp, report(host, mode).to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// Announces one torrent under `info_hash` (one of its [`Meta::info_hashes`]) to its
/// trackers (BEP 12 tiers), then again at each interval they ask for.
async fn announce_every_interval(s: Rc<Seeder>, ann: Announced, port: u16) {
    let (tiers, info_hash) = (ann.0, ann.1);
    let mut event = "started";
    loop {
        let up = Counters::get(&s.counters.bytes_sent);
        let mut t = tiers.borrow().clone();
        let wait = match t.announce(&info_hash, &s.peer_id, port, up, event).await {
            Ok(r) => {
                event = "";
                // Dial the leechers we were told of (within the dialler's budget).
                s.dial_peers(&r.peers);
                r.interval
            }
            Err(errors) => {
                eprintln!(
                    "seed: announce failed ({}): {} (retrying in 30 s)",
                    s.meta.name,
                    errors.join("; ")
                );
                Duration::from_secs(30)
            }
        };
        *tiers.borrow_mut() = t;
        sleep(wait).await;
    }
}

/// The `--status-every` line from the totals `c` ([`report`]'s `counters`): `secs` since
/// the start, `sent` bytes in all (the figure the rate was computed from), the send rate in
/// MB/s since the last line.
fn status_line(c: &serde_json::Value, secs: f64, sent: u64, rate: f64) -> String {
    let n = |k: &str| c[k].as_u64().unwrap_or(0);
    format!(
        "seed: {secs:.0}s peers {} (unchoked {}, accepted {}, dialled {}), sent {:.1} MB at {rate:.1} MB/s, dropped {} bad, {} wrong torrent, {} mse openings ({} established, {} rc4), {} timed out, {} stalled",
        n("peers_now"),
        n("unchoked_now"),
        n("peers_accepted"),
        n("peers_dialled_handshaken"),
        sent as f64 / 1e6,
        n("peers_dropped_garbage"),
        n("peers_wrong_torrent"),
        n("mse_openings"),
        n("mse_established"),
        n("mse_rc4"),
        n("handshake_timeouts") + n("idle_timeouts"),
        n("send_stalls"),
    )
}

/// The engine's limits and knobs from the flags.
fn engine_config(args: &SeedSpec) -> Config {
    Config {
        slots: args.slots,
        max_peers: args.max_peers,
        utp: args.utp,
        max_queue: args.max_queue.max(1),
        send_timeout: Duration::from_secs(args.send_timeout),
        disk: args.disk,
        read_ahead: args.read_ahead,
        encryption: args.encryption,
        dial: DialLimits {
            max_dialled: args.max_dialled,
            ..DialLimits::default()
        },
        ..Config::default()
    }
}

/// What the start lines say of a v2 or hybrid torrent: its format and full v2 info hash.
fn v2_note(meta: &Meta) -> String {
    match &meta.v2 {
        Some(v2) => format!(
            ", {}, v2 info hash {}",
            meta.version.name(),
            v2.info_hash_hex()
        ),
        None => String::new(),
    }
}

/// `iolab seed PATH...`: seeds until SIGINT or SIGTERM (or makes the torrent only).
fn seed(args: SeedSpec) -> anyhow::Result<()> {
    let (metas, many, skipped) = prepare(&args)?;
    if args.create_only {
        let meta = &metas[0];
        println!(
            "created {} ({}, info hash {}, {} pieces of {} bytes, {} bytes){}",
            args.torrent
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            meta.name,
            meta.info_hash_hex(),
            meta.num_pieces(),
            meta.piece_length,
            meta.total,
            v2_note(meta),
        );
        return Ok(());
    }
    let stop = stop_flag()?;
    swarm::raise_nofile(args.max_peers as u64 + 256 + 8 * metas.len() as u64);
    let rt = runtime(args.driver)?;
    let tls = match &args.tracker_ca {
        Some(ca) => Some(iolab_seeder::https::TlsClient::with_ca_file(ca)?),
        None => None,
    };
    rt.block_on(async move {
        let listeners = bind_listeners(&args.listen)?;
        let locals: Vec<SocketAddr> = listeners
            .iter()
            .map(|l| l.local_addr())
            .collect::<Result<_, _>>()?;
        let mut host = Host::new(engine_config(&args));
        let mut seeded = Vec::new();
        let loaded = metas.len();
        for meta in metas {
            match host.add(Arc::new(meta)) {
                Ok(s) => seeded.push((s.clone(), torrent_tiers(&args, &s.meta, tls.clone()))),
                // The error names the torrent.
                Err(e) if many => eprintln!("seed: skipped {e:#}"),
                Err(e) => return Err(e),
            }
        }
        if seeded.is_empty() {
            bail!("none of the torrents could be seeded");
        }
        let host = Rc::new(host);
        for (s, tiers) in &seeded {
            print_start(&s.meta, &locals, args.disk, tiers);
        }
        if many {
            let skipped = skipped + loaded - seeded.len();
            println!(
                "seeding {} torrents ({} skipped) on {}",
                host.torrents.len(),
                skipped,
                addr_list(&locals)
            );
        }
        let _ = std::io::stdout().flush();
        serve_all(host, listeners, seeded, &args, &stop).await
    })
}

/// The listeners of `--listen`, every address (an IPv6 one IPV6_V6ONLY, so that an IPv4
/// and an IPv6 listener share a port). A deep accept queue (capped by net.core.somaxconn):
/// a swarm arriving at once is not made to wait for SYN retransmissions.
fn bind_listeners(addrs: &[SocketAddr]) -> anyhow::Result<Vec<TcpListener>> {
    let mut out = Vec::new();
    for &a in addrs {
        let l = host::bind_tcp(a, 4096).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                anyhow::anyhow!("cannot listen on {a}: the address is in use (another seeder?)")
            } else {
                anyhow::anyhow!("cannot listen on {a}: {e}")
            }
        })?;
        out.push(l);
    }
    if out.is_empty() {
        bail!("no --listen address");
    }
    Ok(out)
}

/// `A` or `A and B and ...`.
fn addr_list(addrs: &[SocketAddr]) -> String {
    let v: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    v.join(" and ")
}

/// A torrent's trackers: --tracker replaces every torrent's; else its announce-list tiers
/// (BEP 12) or its announce URL. A scheme we cannot announce to is said once, here.
fn torrent_tiers(args: &SeedSpec, meta: &Meta, tls: Option<TlsClient>) -> Tiers {
    let list = match &args.tracker {
        Some(url) => vec![vec![url.clone()]],
        None => meta.tracker_tiers(),
    };
    let tiers = Tiers::new(list, |url| {
        eprintln!(
            "seed: {}: tracker {url} skipped: only http://, https:// and udp:// trackers are supported",
            meta.name
        )
    });
    if meta.private {
        eprintln!("seed: {} is a private torrent (BEP 27): peers from its trackers only (Hekate has no DHT, PEX or LSD)", meta.name);
    }
    match tls {
        Some(t) => tiers.with_tls(t),
        None => tiers,
    }
}

/// A torrent's start lines: "seeding ..." and its magnet link.
fn print_start(meta: &Meta, locals: &[SocketAddr], disk: DiskMode, tiers: &Tiers) {
    println!(
        "seeding {} (info hash {}, {} pieces of {} bytes, {} bytes) on {} with disk path {}",
        meta.name,
        meta.info_hash_hex(),
        meta.num_pieces(),
        meta.piece_length,
        meta.total,
        addr_list(locals),
        disk
    );
    if !meta.info.is_empty() {
        // BEP 9: clients can start from this alone (the metadata comes from us; a v2-only
        // torrent's piece layers then by BEP 52 hash requests).
        let trackers: Vec<String> = tiers.tiers.iter().flatten().cloned().collect();
        let link = match (meta.version, &meta.v2) {
            (MetaVersion::V2, Some(v2)) => {
                metadata::magnet_v2(&v2.info_hash_hex(), &meta.name, &trackers)
            }
            (MetaVersion::Hybrid, Some(v2)) => metadata::magnet_hybrid(
                &meta.info_hash_hex(),
                &v2.info_hash_hex(),
                &meta.name,
                &trackers,
            ),
            _ => metadata::magnet(&meta.info_hash_hex(), &meta.name, &trackers),
        };
        println!("magnet {link}");
    }
}

/// Serves until SIGINT/SIGTERM: every listener accepting, each torrent announcing, status
/// lines and the `--json` report; then the "stopped" announces.
async fn serve_all(
    host: Rc<Host>,
    listeners: Vec<TcpListener>,
    seeded: Vec<(Rc<Seeder>, Tiers)>,
    args: &SeedSpec,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let locals: Vec<SocketAddr> = listeners.iter().flat_map(|l| l.local_addr()).collect();
    host.start(&locals);
    let failed: Rc<std::cell::RefCell<Option<std::io::Error>>> = Default::default();
    for l in listeners {
        let (h, f) = (host.clone(), failed.clone());
        spawn(async move {
            if let Err(e) = h.serve(l).await {
                *f.borrow_mut() = Some(e);
            }
        });
    }
    // The port trackers are told: the first listener's (peers reach the others by the
    // address family the tracker saw us on, on the same port when the ports agree).
    let port = locals.first().map_or(0, SocketAddr::port);
    if locals.iter().any(|a| a.port() != port) {
        eprintln!("seed: listeners on different ports: trackers are told port {port}");
    }
    let mut announced = Vec::new();
    for (s, tiers) in seeded {
        if tiers.is_empty() {
            continue;
        }
        // A hybrid under both hashes: a v2 client (a `btmh` magnet link) asks for the v2 one.
        for h in s.meta.info_hashes() {
            let t: Announced = (Rc::new(std::cell::RefCell::new(tiers.clone())), h);
            spawn(announce_every_interval(s.clone(), t.clone(), port));
            announced.push((s.clone(), t));
        }
    }
    let (started, mut last_status, mut last_json) =
        (Instant::now(), Instant::now(), Instant::now());
    let mut last_bytes = 0u64;
    while !stop.load(Ordering::Relaxed) {
        sleep(Duration::from_millis(100)).await;
        if let Some(e) = failed.borrow_mut().take() {
            return Err(anyhow::anyhow!("accepting peers failed: {e}"));
        }
        if args.status_every > 0 && last_status.elapsed() >= Duration::from_secs(args.status_every)
        {
            let c = &report(&host, args.disk)["counters"];
            let b = c["bytes_sent"].as_u64().unwrap_or(0);
            let rate =
                b.saturating_sub(last_bytes) as f64 / last_status.elapsed().as_secs_f64() / 1e6;
            last_bytes = b;
            last_status = Instant::now();
            eprintln!(
                "{}",
                status_line(c, started.elapsed().as_secs_f64(), b, rate)
            );
        }
        if let Some(j) = &args.json {
            if last_json.elapsed() >= Duration::from_secs(1) {
                last_json = Instant::now();
                write_json(j, &host, args.disk);
            }
        }
    }
    if let Some(j) = &args.json {
        write_json(j, &host, args.disk);
    }
    announce_stopped(announced, port).await;
    let sent = report(&host, args.disk)["counters"]["bytes_sent"].as_u64();
    eprintln!("seed: stopped after sending {} bytes", sent.unwrap_or(0));
    Ok(())
}

/// A torrent's trackers as one of its info hashes announces to them, and that hash.
type Announced = (Rc<std::cell::RefCell<Tiers>>, [u8; 20]);

/// The "stopped" announces of every torrent (each of its hashes), together, for 2 s at most.
async fn announce_stopped(announced: Vec<(Rc<Seeder>, Announced)>, port: u16) {
    let left = Rc::new(std::cell::Cell::new(announced.len()));
    for (s, (tiers, info_hash)) in announced {
        let left = left.clone();
        spawn(async move {
            let up = Counters::get(&s.counters.bytes_sent);
            let mut t = tiers.borrow().clone();
            let id = s.peer_id;
            let ann = t.announce(&info_hash, &id, port, up, "stopped");
            let _ = iolab_runtime::timeout(Duration::from_secs(2), ann).await;
            left.set(left.get() - 1);
        });
    }
    let until = Instant::now() + Duration::from_millis(2100);
    while left.get() > 0 && Instant::now() < until {
        sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str]) -> SeedArgs {
        use clap::{Args as _, FromArgMatches as _};
        let cmd = SeedArgs::augment_args(clap::Command::new("seed"));
        let m = cmd
            .try_get_matches_from(std::iter::once("seed").chain(argv.iter().copied()))
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        SeedArgs::from_arg_matches(&m).unwrap()
    }

    fn bench(argv: &[&str]) -> BenchConfig {
        match parse(&[&["bench"], argv].concat()).command {
            Some(SeedCommand::Bench(b)) => b.to_config(),
            other => panic!("{argv:?}: {other:?}"),
        }
    }

    /// `iolab ARGS...` through the binary's own parser, as `iolab seed ...`.
    fn parse_iolab(args: Vec<std::ffi::OsString>) -> SeedArgs {
        use clap::Parser as _;
        let argv = std::iter::once("iolab".into()).chain(args.clone());
        let cli = crate::Cli::try_parse_from(argv)
            .unwrap_or_else(|e| panic!("iolab refuses {args:?}: {e}"));
        match cli.command {
            crate::Command::Seed(a) => a,
            _ => panic!("{args:?} not parsed as iolab seed"),
        }
    }

    /// What the bench launches is what `iolab seed` runs: spec -> arguments -> the binary's
    /// parser -> spec, with every field away from its default in one of the specs.
    #[test]
    fn a_seed_spec_survives_the_command_line() {
        let bench_like = SeedSpec {
            paths: vec!["/tmp/b/bench.torrent".into()],
            data: Some("/tmp/b".into()),
            listen: vec!["127.0.0.1:0".parse().unwrap()],
            no_check: true,
            status_every: 0,
            disk: DiskMode::Mmap,
            slots: 0,
            max_peers: 2600,
            read_ahead: true,
            ..SeedSpec::default()
        };
        let everything = SeedSpec {
            // A path named like the subcommand and one like a flag stay paths.
            paths: vec!["bench".into(), "-odd".into(), "a dir/with space".into()],
            torrent: Some("out.torrent".into()),
            data: Some("data".into()),
            tracker: Some("http://127.0.0.1:6969/announce".into()),
            listen: vec![
                "0.0.0.0:7000".parse().unwrap(),
                "[::1]:7000".parse().unwrap(),
            ],
            disk: DiskMode::Pread,
            read_ahead: true,
            slots: 3,
            piece_length: Some(1 << 20),
            name: Some("many files".into()),
            create_only: true,
            no_check: true,
            max_peers: 77,
            utp: false,
            max_queue: 5,
            send_timeout: 7,
            status_every: 2,
            json: Some("c.json".into()),
            driver: Some(iolab_runtime::Driver::Epoll),
            encryption: Policy::Require,
            max_dialled: 3,
            version: MetaVersion::Hybrid,
            web_seeds: vec!["http://a/x".into(), "https://b/y/".into()],
            private: true,
            comment: Some("a -comment".into()),
            tracker_ca: Some("ca.pem".into()),
        };
        let v2 = SeedSpec {
            paths: vec!["d".into()],
            version: MetaVersion::V2,
            ..SeedSpec::default()
        };
        let uring = SeedSpec {
            paths: vec!["x.torrent".into()],
            driver: Some(iolab_runtime::Driver::Uring),
            ..SeedSpec::default()
        };
        for spec in [SeedSpec::default(), bench_like, everything, uring, v2] {
            let a = parse_iolab(spec.to_args());
            assert!(a.command.is_none(), "{spec:?}: {:?}", a.command);
            assert_eq!(a.run.to_spec(), spec);
        }
    }

    #[test]
    fn a_swarm_spec_survives_the_command_line() {
        let defaults = SwarmConfig::new("127.0.0.1:6881".parse().unwrap(), "t.torrent".into());
        let changed = SwarmConfig {
            target: "10.0.0.2:51413".parse().unwrap(),
            torrent: "/tmp/d/bench.torrent".into(),
            peers: 2500,
            idle_secs: 0.25,
            secs: 1.0 / 3.0,
            pipeline: 4,
            connect_rate: 0,
            process: 3,
            mse: true,
        };
        for spec in [defaults, changed] {
            match parse_iolab(spec.to_args()).command {
                Some(SeedCommand::Swarm(s)) => assert_eq!(s.to_config(), spec),
                other => panic!("{spec:?}: {other:?}"),
            }
        }
    }

    /// What the paths mean: .torrent files (one, or many), a directory of them (unless
    /// --torrent or --create-only make it data), data; .torrent files mixed with data refused.
    #[test]
    fn paths_are_one_torrent_many_a_directory_of_them_or_data() {
        let d = tempfile::tempdir().unwrap();
        let (tdir, data) = (d.path().join("t"), d.path().join("data"));
        std::fs::create_dir_all(&tdir).unwrap();
        std::fs::create_dir_all(&data).unwrap();
        let (tb, ta) = (tdir.join("b.torrent"), tdir.join("a.torrent"));
        std::fs::write(&tb, b"x").unwrap();
        std::fs::write(&ta, b"x").unwrap();
        std::fs::write(tdir.join("notes.txt"), b"x").unwrap();
        let spec = |paths: &[&Path]| SeedSpec {
            paths: paths.iter().map(|p| p.to_path_buf()).collect(),
            ..SeedSpec::default()
        };
        let kind = |s: &SeedSpec| match source_of(s) {
            Ok(Source::Data) => "data".to_string(),
            Ok(Source::One(p)) => format!("one {}", p.display()),
            Ok(Source::Many(v)) => format!("many {}", v.len()),
            Err(e) => format!("error {e}"),
        };
        assert_eq!(kind(&spec(&[&tb])), format!("one {}", tb.display()));
        assert_eq!(kind(&spec(&[&tb, &ta])), "many 2");
        let Ok(Source::Many(v)) = source_of(&spec(&[&tdir])) else {
            panic!("a directory of torrents");
        };
        assert_eq!(
            v,
            vec![ta.clone(), tb.clone()],
            "sorted, .torrent files only"
        );
        let with_out = SeedSpec {
            torrent: Some(d.path().join("out.torrent")),
            ..spec(&[&tdir])
        };
        assert_eq!(kind(&with_out), "data", "--torrent: the directory is data");
        assert_eq!(kind(&spec(&[&data])), "data");
        assert!(kind(&spec(&[&tb, &data])).contains("give .torrent files alone"));
        assert!(kind(&spec(&[])).starts_with("error"));
        let create = SeedSpec {
            create_only: true,
            ..spec(&[&tb])
        };
        assert!(kind(&create).contains("already one"));
    }

    #[test]
    fn sizes_parse_with_and_without_a_suffix() {
        assert_eq!(parse_size("16384"), Ok(16384));
        assert_eq!(parse_size("256K"), Ok(256 << 10));
        assert_eq!(parse_size(" 4m "), Ok(4 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("").is_err());
        assert!(parse_size("4T").is_err());
        assert!(parse_size("-1K").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }

    #[test]
    fn bench_flags_give_the_library_defaults_and_the_quick_matrix() {
        assert_eq!(bench(&[]), BenchConfig::default());
        assert_eq!(bench(&["--quick"]), BenchConfig::quick());
        let c = bench(&[
            "--quick",
            "--peers",
            "5,50",
            "--secs",
            "0.5",
            "--size-mib",
            "8",
            "--piece-length",
            "1M",
            "--disks",
            "mmap,pread",
            "--slots",
            "0",
            "--pipeline",
            "4",
            "--encryption",
            "rc4",
            "--repeats",
            "1",
            "--no-libtorrent",
            "--read-ahead",
            "--warm-only",
            "--dir",
            "/tmp/d",
            "--json",
            "b.json",
        ]);
        assert_eq!(
            c,
            BenchConfig {
                peers: vec![5, 50],
                secs: 0.5,
                size_mib: 8,
                piece_length: 1 << 20,
                disks: vec![DiskMode::Mmap, DiskMode::Pread],
                slots: 0,
                encryption: vec![bench::Encryption::Rc4],
                pipeline: 4,
                repeats: 1,
                libtorrent: false,
                read_ahead: true,
                warm_only: true,
                dir: Some("/tmp/d".into()),
                json: Some("b.json".into()),
            }
        );
    }

    #[test]
    fn swarm_flags_make_its_config() {
        let a = match parse(&[
            "swarm",
            "--target",
            "127.0.0.1:6881",
            "--torrent",
            "t.torrent",
        ])
        .command
        {
            Some(SeedCommand::Swarm(s)) => s.to_config(),
            other => panic!("{other:?}"),
        };
        assert_eq!(a.target, "127.0.0.1:6881".parse().unwrap());
        assert_eq!(a.torrent, PathBuf::from("t.torrent"));
        assert_eq!(
            (
                a.peers,
                a.idle_secs,
                a.secs,
                a.pipeline,
                a.connect_rate,
                a.process
            ),
            (10, 1.0, 10.0, 16, 5000, 0)
        );
    }

    #[test]
    fn seed_flags_default_to_the_seeders_config() {
        let a = parse(&["x.torrent"]);
        assert!(a.command.is_none());
        let r = a.run;
        assert_eq!(r.paths, vec![PathBuf::from("x.torrent")]);
        assert_eq!(DiskMode::from(r.disk), Config::default().disk);
        assert_eq!(r.slots, Config::default().slots);
        assert_eq!(r.max_peers, Config::default().max_peers);
        assert_eq!(r.max_queue, Config::default().max_queue);
        assert_eq!(r.listen, vec!["0.0.0.0:6881".parse().unwrap()]);
        assert_eq!(r.status_every, 10);
        assert_eq!(
            r.to_spec(),
            SeedSpec {
                paths: vec!["x.torrent".into()],
                ..SeedSpec::default()
            }
        );
        let a = parse(&["x", "--disk", "mmap", "--piece-length", "64K"]);
        assert_eq!(DiskMode::from(a.run.disk), DiskMode::Mmap);
        assert_eq!(a.run.piece_length, Some(64 << 10));
    }
}
