//! `iolab seed ...` and `iolab tracker ...`.

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

use crate::disk::DiskMode;
use crate::metainfo::{CreateOptions, Meta};
use crate::seed::{Config, Counters, Seeder};
use crate::tracker::{self, Tracker};

/// Seed files over BitTorrent (Hekate), or benchmark the seeder against libtorrent.
#[derive(Debug, clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "PATH is either one .torrent file (its data is looked up in --data, by \
default the .torrent's directory) or the data itself: one file (a single-file torrent), one \
directory (a multi-file torrent named after it) or several paths (a multi-file torrent named \
--name). The data is checked against the piece hashes at start (progress bar), then seeded \
until SIGINT or SIGTERM. The first line on stdout is \"seeding NAME (info hash H, N pieces of \
P bytes, T bytes) on ADDR with disk path D\".\n\nExamples:\n  iolab tracker --listen \
127.0.0.1:6969 &\n  iolab seed ./iso --tracker http://127.0.0.1:6969/announce --torrent \
iso.torrent --listen 127.0.0.1:6881\n  iolab seed iso.torrent --data . --disk mmap\n  iolab \
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
    Bench(crate::bench::BenchArgs),
    /// (internal) One process of leechers for the bench.
    #[command(hide = true)]
    Swarm(crate::swarm::SwarmArgs),
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A .torrent to seed, or the files/directories to make a torrent of.
    pub paths: Vec<PathBuf>,
    /// Write the created .torrent here (when PATH is data).
    #[arg(long, value_name = "OUT.torrent")]
    pub torrent: Option<PathBuf>,
    /// Directory holding a loaded torrent's data (default: the .torrent's directory).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Tracker announce URL: written into a created torrent, and announced to (http:// only).
    /// A loaded torrent's own announce URL is used when this is absent.
    #[arg(long)]
    pub tracker: Option<String>,
    /// Address to accept peers on (port 0 picks a free port).
    #[arg(long, default_value = "0.0.0.0:6881")]
    pub listen: SocketAddr,
    /// How blocks are read from disk: uring (async reads on io_uring), mmap (Hekate's Unix
    /// design: mincore, then the blocking pool on a miss), pread (the blocking pool).
    #[arg(long, value_enum, default_value_t = DiskMode::Uring)]
    pub disk: DiskMode,
    /// Keep the kernel's read-ahead on the data files. By default they are opened with a
    /// random-access hint (POSIX_FADV_RANDOM, MADV_RANDOM for mmap): with many peers each
    /// wanting other pieces, read-ahead reads pages no peer asked for (cold read
    /// amplification 1.5-3 at 1,000 peers) and evicts pages that are still wanted.
    #[arg(long)]
    pub read_ahead: bool,
    /// Upload slots (best uploaders + one optimistic, rotated); 0 = unchoke every
    /// interested peer.
    #[arg(long, default_value_t = 8)]
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
    /// Connections held at once.
    #[arg(long, default_value_t = Config::default().max_peers)]
    pub max_peers: usize,
    /// Requests queued per peer (more are rejected).
    #[arg(long, default_value_t = Config::default().max_queue)]
    pub max_queue: usize,
    /// Seconds between status lines on stderr (0 = none).
    #[arg(long, default_value_t = 10)]
    pub status_every: u64,
    /// Write the counters as JSON to this file every second and at exit.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Event-loop driver for this run (default: io_uring when available).
    #[arg(long, value_enum)]
    pub driver: Option<DriverArg>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DriverArg {
    Uring,
    Epoll,
}

/// `256K`, `4M`, `1G` or a plain number of bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("{s:?} is not a size (e.g. 16384, 256K, 4M)"))
}

pub fn seed(args: SeedArgs) -> anyhow::Result<()> {
    match args.command {
        Some(SeedCommand::Bench(b)) => crate::bench::run(b),
        Some(SeedCommand::Swarm(s)) => crate::swarm::run(s),
        None => run(args.run),
    }
}

fn is_torrent(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "torrent") && p.is_file()
}

/// Loads or creates the torrent of `args`, checks the data. Shared with the bench.
pub fn prepare(args: &RunArgs) -> anyhow::Result<Meta> {
    if args.paths.is_empty() {
        bail!("give a .torrent to seed or the files to make one of (see --help)");
    }
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    if args.paths.len() == 1 && is_torrent(&args.paths[0]) {
        if args.create_only {
            bail!(
                "--create-only makes a torrent from data; {} is already one",
                args.paths[0].display()
            );
        }
        let t = &args.paths[0];
        let data = match &args.data {
            Some(d) => d.clone(),
            None => t
                .parent()
                .map(|p| {
                    if p.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        p
                    }
                })
                .unwrap_or(Path::new("."))
                .to_path_buf(),
        };
        let meta = Meta::load(t, &data)?;
        if !args.no_check {
            meta.verify(progress).with_context(|| {
                format!("checking the data of {} in {}", t.display(), data.display())
            })?;
        }
        return Ok(meta);
    }
    for p in &args.paths {
        if is_torrent(p) {
            bail!("{} is a .torrent: give it alone to seed it", p.display());
        }
    }
    let (meta, bytes) = Meta::create(
        &args.paths,
        &CreateOptions {
            piece_length: args.piece_length,
            announce: args.tracker.clone(),
            name: args.name.clone(),
            progress,
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

fn runtime(driver: Option<DriverArg>) -> anyhow::Result<Runtime> {
    let mut b = Runtime::builder().workers(1);
    match driver {
        Some(DriverArg::Uring) => b = b.driver(iolab_runtime::Driver::Uring),
        Some(DriverArg::Epoll) => b = b.driver(iolab_runtime::Driver::Epoll),
        None => {}
    }
    b.build().context("starting the runtime")
}

fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    Ok(stop)
}

fn write_json(
    path: &Path,
    meta: &Meta,
    counters: &Counters,
    disk: &crate::disk::DiskStats,
    mode: DiskMode,
) {
    let v = serde_json::json!({
        "name": meta.name,
        "info_hash": meta.info_hash_hex(),
        "disk": mode,
        "counters": counters,
        "disk_reads": disk.reads.load(Ordering::Relaxed),
        "disk_bytes": disk.bytes.load(Ordering::Relaxed),
        "mmap_resident": disk.resident.load(Ordering::Relaxed),
        "mmap_resident_after_yield": disk.resident_after_yield.load(Ordering::Relaxed),
        "mmap_prefetched": disk.prefetched.load(Ordering::Relaxed),
        "detached": disk.detached.load(Ordering::Relaxed),
    });
    let tmp = path.with_extension("json.tmp");
    if std::fs::write(&tmp, v.to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let meta = Arc::new(prepare(&args)?);
    if args.create_only {
        println!(
            "created {} ({}, info hash {}, {} pieces of {} bytes, {} bytes)",
            args.torrent
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            meta.name,
            meta.info_hash_hex(),
            meta.num_pieces(),
            meta.piece_length,
            meta.total
        );
        return Ok(());
    }
    let stop = stop_flag()?;
    crate::swarm::raise_nofile(args.max_peers as u64 + 256);
    let rt = runtime(args.driver)?;
    let cfg = Config {
        slots: args.slots,
        max_peers: args.max_peers,
        max_queue: args.max_queue.max(1),
        disk: args.disk,
        read_ahead: args.read_ahead,
        ..Config::default()
    };
    let tracker_url = args.tracker.clone().or_else(|| meta.announce.clone());
    rt.block_on(async move {
        // A deep accept queue (capped by net.core.somaxconn): a swarm arriving at once is
        // not made to wait for SYN retransmissions.
        let listener = TcpListener::builder(args.listen).backlog(4096).bind().map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                anyhow::anyhow!("cannot listen on {}: the address is in use (another seeder?)", args.listen)
            } else {
                anyhow::anyhow!("cannot listen on {}: {e}", args.listen)
            }
        })?;
        let local = listener.local_addr()?;
        let seeder = Seeder::new(meta.clone(), cfg).context("opening the data files")?;
        println!(
            "seeding {} (info hash {}, {} pieces of {} bytes, {} bytes) on {} with disk path {}",
            meta.name,
            meta.info_hash_hex(),
            meta.num_pieces(),
            meta.piece_length,
            meta.total,
            local,
            args.disk
        );
        let _ = std::io::stdout().flush();
        let failed: Rc<std::cell::RefCell<Option<std::io::Error>>> = Default::default();
        {
            let s = seeder.clone();
            let f = failed.clone();
            spawn(async move {
                if let Err(e) = s.serve(listener).await {
                    *f.borrow_mut() = Some(e);
                }
            });
        }
        if let Some(url) = tracker_url.clone() {
            let s = seeder.clone();
            spawn(async move {
                let mut event = "started";
                loop {
                    let up = Counters::get(&s.counters.bytes_sent);
                    let wait = match tracker::announce(&url, &s.meta.info_hash, &s.peer_id, local.port(), up, 0, event).await {
                        Ok(r) => {
                            event = "";
                            r.interval
                        }
                        Err(e) => {
                            eprintln!("seed: announce failed: {e:#} (retrying in 30 s)");
                            Duration::from_secs(30)
                        }
                    };
                    sleep(wait).await;
                }
            });
        }
        let started = Instant::now();
        let mut last_status = Instant::now();
        let mut last_json = Instant::now();
        let mut last_bytes = 0u64;
        while !stop.load(Ordering::Relaxed) {
            sleep(Duration::from_millis(100)).await;
            if let Some(e) = failed.borrow_mut().take() {
                return Err(anyhow::anyhow!("accepting peers failed: {e}"));
            }
            let c = &seeder.counters;
            if args.status_every > 0 && last_status.elapsed() >= Duration::from_secs(args.status_every) {
                let b = Counters::get(&c.bytes_sent);
                let rate = (b - last_bytes) as f64 / last_status.elapsed().as_secs_f64() / 1e6;
                last_bytes = b;
                last_status = Instant::now();
                eprintln!(
                    "seed: {:.0}s peers {} (unchoked {}), sent {:.1} MB at {:.1} MB/s, dropped {} bad, {} timed out",
                    started.elapsed().as_secs_f64(),
                    Counters::get(&c.peers_now),
                    Counters::get(&c.unchoked_now),
                    b as f64 / 1e6,
                    rate,
                    Counters::get(&c.peers_dropped_garbage),
                    Counters::get(&c.handshake_timeouts) + Counters::get(&c.idle_timeouts),
                );
            }
            if let Some(j) = &args.json {
                if last_json.elapsed() >= Duration::from_secs(1) {
                    last_json = Instant::now();
                    write_json(j, &meta, c, &seeder.storage.stats, args.disk);
                }
            }
        }
        if let Some(j) = &args.json {
            write_json(j, &meta, &seeder.counters, &seeder.storage.stats, args.disk);
        }
        if let Some(url) = tracker_url {
            let up = Counters::get(&seeder.counters.bytes_sent);
            let _ = iolab_runtime::timeout(
                Duration::from_secs(2),
                tracker::announce(&url, &meta.info_hash, &seeder.peer_id, local.port(), up, 0, "stopped"),
            )
            .await;
        }
        eprintln!("seed: stopped after sending {} bytes", Counters::get(&seeder.counters.bytes_sent));
        Ok(())
    })
}

/// A small HTTP BitTorrent tracker (BEP 3 announce, BEP 23 compact, BEP 48 scrape).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Prints \"tracker on http://ADDR/announce\" and serves until SIGINT or \
SIGTERM. Peers announce to /announce, statistics at /scrape (BEP 48).\n\nExample:\n  iolab \
tracker --listen 127.0.0.1:6969"
)]
pub struct TrackerArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "0.0.0.0:6969")]
    pub listen: SocketAddr,
    /// Seconds between a client's announces (told to clients); peers silent for twice this
    /// are forgotten.
    #[arg(long, default_value_t = 60)]
    pub interval: u64,
    #[arg(long, value_enum)]
    pub driver: Option<DriverArg>,
}

pub fn tracker(args: TrackerArgs) -> anyhow::Result<()> {
    let stop = stop_flag()?;
    let rt = runtime(args.driver)?;
    rt.block_on(async move {
        let listener = TcpListener::bind(args.listen).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                anyhow::anyhow!("cannot listen on {}: the address is in use", args.listen)
            } else {
                anyhow::anyhow!("cannot listen on {}: {e}", args.listen)
            }
        })?;
        let local = listener.local_addr()?;
        println!("tracker on http://{local}/announce");
        let _ = std::io::stdout().flush();
        let t = Tracker::new(Duration::from_secs(args.interval.max(1)));
        let failed: Rc<std::cell::RefCell<Option<std::io::Error>>> = Default::default();
        {
            let t = t.clone();
            let f = failed.clone();
            spawn(async move {
                if let Err(e) = t.serve(listener).await {
                    *f.borrow_mut() = Some(e);
                }
            });
        }
        while !stop.load(Ordering::Relaxed) {
            sleep(Duration::from_millis(100)).await;
            if let Some(e) = failed.borrow_mut().take() {
                return Err(anyhow::anyhow!("accepting failed: {e}"));
            }
        }
        eprintln!(
            "tracker: stopped ({} announces, {} scrapes, {} bad requests)",
            t.announces.get(),
            t.scrapes.get(),
            t.bad_requests.get()
        );
        Ok(())
    })
}
