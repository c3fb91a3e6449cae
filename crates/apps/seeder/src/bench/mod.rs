//! `iolab seed bench`: the same swarm of leechers (our own, [`crate::swarm`], like
//! libtorrent's connection_tester) against Hekate with each disk path and against
//! libtorrent's seeder (python3-libtorrent, default settings and `high_performance_seed`),
//! side by side in one run, cold cache and warm.
//!
//! Per run: upload MB/s (bytes the swarm received / download time), seeder CPU seconds per
//! GB sent (/proc/PID/stat utime+stime), seeder RSS per connected idle peer (RSS with every
//! peer handshaken and idle minus RSS before, / peers), disk bytes read per byte sent
//! (/proc/PID/io read_bytes), request latency p50/p99 (request sent → block received). The
//! seeder is pinned to CPU 0 and the swarm to CPU 1 (taskset) when there are two CPUs.
//! Each point runs in plaintext and, with `encryption` holding [`Encryption::Rc4`], with
//! every leecher opening MSE and asking for RC4, so both seeders encrypt all they send.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde::Serialize;

use crate::disk::DiskMode;
use crate::metainfo::{CreateOptions, Meta};
use crate::spec::SeedSpec;
use crate::swarm::{SwarmConfig, SwarmResult};

mod versus;
pub use versus::Versus;

/// How the bench's leechers open their connections (`--encryption`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Encryption {
    /// The plain BitTorrent handshake.
    Off,
    /// MSE with RC4 only offered: the seeder runs the DH exchange per connection and RC4 over
    /// every byte.
    Rc4,
}

impl std::fmt::Display for Encryption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Encryption::Off => "off",
            Encryption::Rc4 => "rc4",
        })
    }
}

/// What `iolab seed bench` runs: the matrix (seeders x peer counts x cold and warm cache x
/// repeats) and its torrent. [`Default`] is the full run, [`BenchConfig::quick`] the short one.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchConfig {
    /// Peer counts, one point each (a swarm of more than 2,500 is split over processes).
    pub peers: Vec<usize>,
    /// Seconds of downloading per run.
    pub secs: f64,
    /// Torrent size in MiB (one file of this size and a short tail: the last piece is short).
    pub size_mib: u64,
    /// Piece size of the bench torrent, in bytes.
    pub piece_length: u64,
    /// Our disk paths to run, one seeder each.
    pub disks: Vec<DiskMode>,
    /// Upload slots for both seeders (ours `--slots`, libtorrent `unchoke_slots_limit`);
    /// 0 = unlimited (libtorrent -1).
    pub slots: usize,
    /// The leechers' openings to run each point with (at least one).
    pub encryption: Vec<Encryption>,
    /// Requests outstanding per leecher.
    pub pipeline: usize,
    /// Runs per (seeder, peers, cache) point (at least one); the table shows medians and
    /// min–max. The seeders' order is rotated between repeats.
    pub repeats: usize,
    /// Also run libtorrent's seeder, when /usr/bin/python3 can import libtorrent.
    pub libtorrent: bool,
    /// Run our seeders with the kernel's read-ahead on (`iolab seed --read-ahead`).
    pub read_ahead: bool,
    /// Only warm-cache runs (cold runs drop the page cache of the torrent's files first).
    pub warm_only: bool,
    /// Where to put the bench torrent's data (`None`: a temp dir, removed after).
    pub dir: Option<PathBuf>,
    /// Write the results as JSON here.
    pub json: Option<PathBuf>,
}

impl Default for BenchConfig {
    /// The full run: 10, 100, 1000 and 10000 peers, 10 s per run, 256 MiB, plaintext and
    /// MSE/RC4.
    fn default() -> Self {
        BenchConfig {
            peers: vec![10, 100, 1000, 10_000],
            secs: 10.0,
            size_mib: 256,
            piece_length: 256 << 10,
            disks: vec![DiskMode::Uring, DiskMode::Mmap, DiskMode::Pread],
            slots: 8,
            encryption: vec![Encryption::Off, Encryption::Rc4],
            pipeline: 16,
            repeats: 3,
            libtorrent: true,
            read_ahead: false,
            warm_only: false,
            dir: None,
            json: None,
        }
    }
}

impl BenchConfig {
    /// The short matrix, under 5 minutes: 10 and 100 peers, 2 s per run, a 64 MiB torrent,
    /// plaintext.
    pub fn quick() -> Self {
        BenchConfig {
            peers: vec![10, 100],
            secs: 2.0,
            size_mib: 64,
            encryption: vec![Encryption::Off],
            ..BenchConfig::default()
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub seeder: String,
    pub peers: usize,
    pub cache: &'static str,
    pub encryption: Encryption,
    pub connected: usize,
    pub unchoked_peers: usize,
    pub upload_mb_s: f64,
    pub cpu_s_per_gb: Option<f64>,
    pub rss_base_kib: u64,
    pub rss_per_idle_peer_bytes: Option<f64>,
    /// Disk bytes read / bytes sent.
    pub read_amplification: Option<f64>,
    /// Distinct bytes the swarm received (each 16 KiB block counted once).
    pub distinct_bytes: u64,
    /// Disk bytes read / distinct bytes sent: the read-once figure (≤ 1.05 cold is the goal;
    /// it is 0 warm, and can be below 1 cold only if something else read the data in).
    pub read_amplification_distinct: Option<f64>,
    pub repeat: usize,
    pub lat_p50_ms: f64,
    pub lat_p99_ms: f64,
    pub bytes: u64,
    pub secs: f64,
    pub rejects: u64,
    pub dropped: usize,
}

/// libtorrent's seeder. Two profiles:
/// - `default`: `lt.default_settings()`, changed only where a loopback swarm needs it;
/// - `hps`: `lt.high_performance_seed()` tuned as its expert users tune a seed with many
///   peers (libtorrent's tuning guide): every connection allowed, no peer turnover, a deep
///   accept backlog, large send buffers, disk threads, suggest from the read cache, the
///   fastest-upload seed choker.
///
/// Common to both (the swarm is many peers on 127.0.0.1, TCP only): DHT/LSD/UPnP/NAT-PMP
/// off, uTP off, `allow_multiple_connections_per_ip`, `connections_limit` twice the swarm
/// (it admits only about 2/3 of it as incoming peers), `max_peerlist_size` ≥ the swarm,
/// `listen_queue_size` ≥ the swarm (capped by somaxconn), `unchoke_slots_limit` = ours,
/// RLIMIT_NOFILE soft limit raised to the hard one. The torrent is added in seed mode,
/// not auto-managed and not paused, and "listening" is printed only once it is started and
/// seeding: a torrent still paused by the session's queue turns incoming peers away (the
/// cause of the 0 connections seen before).
const LIBTORRENT_SEEDER: &str = r#"
import sys, json, time, resource, libtorrent as lt
torrent, data, mode, slots, conns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
# libtorrent caps connections_limit at a share of RLIMIT_NOFILE: every descriptor allowed.
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
except (ValueError, OSError):
    pass
try:
    somaxconn = int(open('/proc/sys/net/core/somaxconn').read())
except OSError:
    somaxconn = 4096
s = lt.default_settings()
if mode == 'hps':
    s.update(lt.high_performance_seed())
changes = {'listen_interfaces': '127.0.0.1:0', 'enable_dht': False, 'enable_lsd': False,
           'enable_upnp': False, 'enable_natpmp': False,
           'enable_incoming_utp': False, 'enable_outgoing_utp': False,
           'allow_multiple_connections_per_ip': True,
           # libtorrent let in only about 2/3 of connections_limit as incoming peers
           # (10,100 -> 6,743 of a 10,000-peer swarm): twice the swarm.
           'connections_limit': max(s['connections_limit'], 2 * conns),
           'max_peerlist_size': max(s['max_peerlist_size'], conns),
           'listen_queue_size': max(s['listen_queue_size'], min(conns, somaxconn)),
           'unchoke_slots_limit': slots if slots > 0 else -1,
           'alert_mask': 0}
if mode == 'hps':
    changes.update({
        # never disconnect peers to make room (turnover starts at 90% of connections_limit)
        'peer_turnover': 0,
        'seed_choking_algorithm': lt.seed_choking_algorithm_t.fastest_upload,
        'choking_algorithm': lt.choking_algorithm_t.fixed_slots_choker,
        'suggest_mode': lt.suggest_mode_t.suggest_read_cache,
        'send_buffer_watermark': max(s['send_buffer_watermark'], 3 << 20),
        'send_buffer_low_watermark': max(s['send_buffer_low_watermark'], 1 << 20),
        'send_buffer_watermark_factor': max(s['send_buffer_watermark_factor'], 150),
        'max_queued_disk_bytes': max(s['max_queued_disk_bytes'], 7 << 20),
        'aio_threads': max(s['aio_threads'], 8),
        'max_allowed_in_request_queue': max(s['max_allowed_in_request_queue'], 2000),
        'file_pool_size': max(s['file_pool_size'], 500),
        'close_redundant_connections': False,
        'inactivity_timeout': 600, 'peer_timeout': 120,
    })
s.update(changes)
ses = lt.session(s)
p = lt.add_torrent_params()
p.ti = lt.torrent_info(torrent)
p.save_path = data
p.flags |= lt.torrent_flags.seed_mode
p.flags &= ~lt.torrent_flags.auto_managed
p.flags &= ~lt.torrent_flags.paused
h = ses.add_torrent(p)
h.resume()
for _ in range(600):
    st = h.status()
    if ses.listen_port() and st.is_seeding and not (st.flags & lt.torrent_flags.paused) \
            and st.state == lt.torrent_status.seeding:
        break
    time.sleep(0.05)
else:
    print('not seeding after 30 s', file=sys.stderr, flush=True)
    sys.exit(1)
print('listening', ses.listen_port(), flush=True)
got = ses.get_settings()
keys = ['connections_limit', 'max_peerlist_size', 'listen_queue_size', 'unchoke_slots_limit',
        'choking_algorithm', 'seed_choking_algorithm', 'num_optimistic_unchoke_slots',
        'peer_turnover', 'peer_turnover_cutoff', 'suggest_mode', 'send_buffer_watermark',
        'send_buffer_low_watermark', 'send_buffer_watermark_factor', 'max_queued_disk_bytes',
        'aio_threads', 'hashing_threads', 'max_allowed_in_request_queue', 'file_pool_size',
        'allow_multiple_connections_per_ip', 'enable_incoming_utp', 'close_redundant_connections',
        'in_enc_policy', 'out_enc_policy', 'allowed_enc_level', 'prefer_rc4']
out = {k: got[k] for k in keys if k in got}
out['version'] = lt.__version__
out['disk_io'] = 'mmap (libtorrent 2.0 default)'
print(json.dumps(out), flush=True)
while True:
    time.sleep(1)
"#;

fn proc_cpu_secs(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the state field.
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz.max(1.0))
}

/// The number after `key` in `/proc/PID/FILE` (`status`: `VmRSS:   1234 kB`; `io`:
/// `read_bytes: 4096`).
fn proc_number(pid: u32, file: &str, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    s.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn proc_rss_kib(pid: u32) -> Option<u64> {
    proc_number(pid, "status", "VmRSS:")
}

fn proc_read_bytes(pid: u32) -> Option<u64> {
    proc_number(pid, "io", "read_bytes:")
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pinned(cpu: usize) -> Command {
    let two = std::thread::available_parallelism()
        .map(|n| n.get() >= 2)
        .unwrap_or(false);
    let has_taskset = Path::new("/usr/bin/taskset").exists();
    if two && has_taskset {
        let mut c = Command::new("/usr/bin/taskset");
        c.args(["-c", &cpu.to_string()]);
        c
    } else {
        // A command that execs its arguments: `env`.
        Command::new("/usr/bin/env")
    }
}

/// A seeder the bench runs: ours with one of its disk paths, or libtorrent's with its
/// default settings or `high_performance_seed` ([`LIBTORRENT_SEEDER`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seeder {
    Hekate(DiskMode),
    Libtorrent { hps: bool },
}

impl std::fmt::Display for Seeder {
    /// The name in the table and the JSON: hekate-uring, ..., libtorrent-default,
    /// libtorrent-hps.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(&match self {
            Seeder::Hekate(disk) => format!("hekate-{disk}"),
            Seeder::Libtorrent { hps: false } => "libtorrent-default".into(),
            Seeder::Libtorrent { hps: true } => "libtorrent-hps".into(),
        })
    }
}

/// Starts a seeder; returns the process, its address and (libtorrent) its settings.
fn start_seeder(
    kind: Seeder,
    torrent: &Path,
    data: &Path,
    args: &BenchConfig,
    peers: usize,
) -> anyhow::Result<(Proc, std::net::SocketAddr, Option<serde_json::Value>)> {
    let exe = std::env::current_exe()?;
    let mut cmd = pinned(0);
    match kind {
        Seeder::Libtorrent { hps } => {
            cmd.arg("/usr/bin/python3")
                .arg("-c")
                .arg(LIBTORRENT_SEEDER)
                .arg(torrent)
                .arg(data)
                .arg(if hps { "hps" } else { "default" })
                .arg(args.slots.to_string())
                .arg((peers + 100).to_string());
        }
        Seeder::Hekate(disk) => {
            let spec = SeedSpec {
                paths: vec![torrent.to_path_buf()],
                data: Some(data.to_path_buf()),
                listen: vec![SocketAddr::from(([127, 0, 0, 1], 0))],
                no_check: true,
                status_every: 0,
                disk,
                slots: args.slots,
                max_peers: peers + 100,
                read_ahead: args.read_ahead,
                ..SeedSpec::default()
            };
            cmd.arg(exe).args(spec.to_args());
        }
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting the {kind} seeder"))?;
    let out = child.stdout.take().context("stdout")?;
    let mut r = BufReader::new(out);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let addr: std::net::SocketAddr = if let Some(p) = line.strip_prefix("listening ") {
        format!("127.0.0.1:{}", p.trim()).parse()?
    } else {
        line.split(" on ")
            .last()
            .and_then(|s| s.split_whitespace().next())
            .with_context(|| format!("{kind}: unexpected start line {line:?}"))?
            .parse()?
    };
    let mut settings = None;
    if matches!(kind, Seeder::Libtorrent { .. }) {
        let mut l2 = String::new();
        r.read_line(&mut l2)?;
        settings = serde_json::from_str(l2.trim()).ok();
    }
    std::thread::spawn(move || {
        let mut sink = String::new();
        while r.read_line(&mut sink).unwrap_or(0) > 0 {
            sink.clear();
        }
    });
    Ok((Proc(child), addr, settings))
}

/// One cell of the matrix: a swarm size, a cache state, the leechers' opening.
#[derive(Debug, Clone, Copy)]
struct Point {
    peers: usize,
    cold: bool,
    encryption: Encryption,
}

fn one_run(
    kind: Seeder,
    Point {
        peers,
        cold,
        encryption,
    }: Point,
    meta: &Meta,
    torrent: &Path,
    data: &Path,
    args: &BenchConfig,
    secs: f64,
) -> anyhow::Result<(Row, Option<serde_json::Value>)> {
    let (seeder, addr, settings) = start_seeder(kind, torrent, data, args, peers)?;
    let pid = seeder.0.id();
    std::thread::sleep(Duration::from_millis(300));
    if cold {
        crate::disk::drop_cache(meta)?;
    }
    let rss_base = proc_rss_kib(pid).unwrap_or(0);
    let per_proc = 2500;
    let nproc = peers.div_ceil(per_proc).max(1);
    let exe = std::env::current_exe()?;
    let mut swarm = Vec::new();
    for p in 0..nproc {
        let n = (peers - p * per_proc).min(per_proc);
        let spec = SwarmConfig {
            peers: n,
            idle_secs: 1.0,
            secs,
            pipeline: args.pipeline,
            process: p as u32,
            mse: encryption == Encryption::Rc4,
            ..SwarmConfig::new(addr, torrent.to_path_buf())
        };
        let mut c = pinned(1);
        c.arg(&exe)
            .args(spec.to_args())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .stdin(Stdio::null());
        swarm.push(Proc(c.spawn().context("starting a swarm process")?));
    }
    // Every process says `connected N` once its peers are handshaken.
    let mut readers = Vec::new();
    let mut connected = 0;
    for p in &mut swarm {
        let mut r = BufReader::new(p.0.stdout.take().context("stdout")?);
        let mut line = String::new();
        r.read_line(&mut line)?;
        connected += line
            .trim()
            .strip_prefix("connected ")
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0);
        readers.push(r);
    }
    // Idle: every peer handshaken, none interested yet.
    std::thread::sleep(Duration::from_millis(500));
    let rss_idle = proc_rss_kib(pid).unwrap_or(0);
    let cpu0 = proc_cpu_secs(pid);
    let io0 = proc_read_bytes(pid);
    let mut results = Vec::new();
    for mut r in readers {
        let mut line = String::new();
        r.read_line(&mut line)?;
        results.push(
            serde_json::from_str::<SwarmResult>(line.trim())
                .with_context(|| format!("swarm output {line:?}"))?,
        );
    }
    let cpu1 = proc_cpu_secs(pid);
    let io1 = proc_read_bytes(pid);
    drop(seeder);
    drop(swarm);
    let bytes: u64 = results.iter().map(|r| r.bytes).sum();
    let rsecs = results.iter().map(|r| r.secs).fold(0.0, f64::max).max(1e-3);
    let lat50 = {
        // Weighted by block count: the median of the medians, good enough across ≤ 4 processes.
        let mut v: Vec<(u64, u64)> = results
            .iter()
            .map(|r| (r.lat_p50_us, r.lat_count))
            .collect();
        v.sort();
        let total: u64 = v.iter().map(|x| x.1).sum();
        let mut acc = 0;
        let mut m = 0;
        for (l, c) in v {
            acc += c;
            m = l;
            if acc * 2 >= total {
                break;
            }
        }
        m
    };
    let lat99 = results.iter().map(|r| r.lat_p99_us).max().unwrap_or(0);
    let mut seen: Vec<u8> = Vec::new();
    for r in &results {
        let m = crate::swarm::bitmap_from_hex(&r.blocks_seen);
        if seen.len() < m.len() {
            seen.resize(m.len(), 0);
        }
        for (a, b) in seen.iter_mut().zip(m) {
            *a |= b;
        }
    }
    let block = crate::wire::MAX_BLOCK as u64;
    let distinct: u64 = (0..seen.len() as u64 * 8)
        .filter(|i| seen[(i / 8) as usize] & (0x80 >> (i % 8)) != 0)
        .map(|i| block.min(meta.total.saturating_sub(i * block)))
        .sum();
    let gb = bytes as f64 / 1e9;
    let row = Row {
        seeder: kind.to_string(),
        peers,
        cache: if cold { "cold" } else { "warm" },
        encryption,
        connected,
        unchoked_peers: results.iter().map(|r| r.unchoked_peers).sum(),
        upload_mb_s: bytes as f64 / rsecs / 1e6,
        cpu_s_per_gb: match (cpu0, cpu1) {
            (Some(a), Some(b)) if gb > 0.0 => Some((b - a) / gb),
            _ => None,
        },
        rss_base_kib: rss_base,
        rss_per_idle_peer_bytes: if connected > 0 {
            Some((rss_idle as f64 - rss_base as f64) * 1024.0 / connected as f64)
        } else {
            None
        },
        read_amplification: match (io0, io1) {
            (Some(a), Some(b)) if bytes > 0 => Some((b - a) as f64 / bytes as f64),
            _ => None,
        },
        distinct_bytes: distinct,
        read_amplification_distinct: match (io0, io1) {
            (Some(a), Some(b)) if distinct > 0 => Some((b - a) as f64 / distinct as f64),
            _ => None,
        },
        repeat: 0,
        lat_p50_ms: lat50 as f64 / 1000.0,
        lat_p99_ms: lat99 as f64 / 1000.0,
        bytes,
        secs: rsecs,
        rejects: results.iter().map(|r| r.rejects).sum(),
        dropped: results.iter().map(|r| r.dropped).sum(),
    };
    Ok((row, settings))
}

fn libtorrent_available() -> bool {
    Command::new("/usr/bin/python3")
        .args(["-c", "import libtorrent"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `"machine"` of the bench's JSON.
#[derive(Debug, Clone, Serialize)]
struct Machine {
    cpus: usize,
    /// The CPU model ("" when unknown).
    cpu: String,
    kernel: String,
    /// The runtime's driver, as `Debug` prints the probe's result.
    driver: String,
}

fn machine() -> Machine {
    use iolab_sys::host;
    Machine {
        cpus: host::cpus(),
        cpu: host::cpu_model().unwrap_or_default(),
        kernel: host::kernel_release().unwrap_or_default(),
        driver: format!("{:?}", iolab_runtime::driver()),
    }
}

/// `"config"` of the bench's JSON: what the numbers were measured with.
#[derive(Debug, Clone, Serialize)]
struct Settings {
    peers: Vec<usize>,
    secs: f64,
    size_bytes: u64,
    piece_length: u64,
    slots: usize,
    pipeline: usize,
    /// Bytes per request.
    block: u32,
    read_ahead: bool,
    encryption: Vec<Encryption>,
    /// Where Hekate's RC4 comes from (OpenSSL or the rc4 crate).
    rc4: &'static str,
}

/// What `--json` writes.
#[derive(Debug, Clone, Serialize)]
struct Results<'a> {
    machine: Machine,
    config: Settings,
    /// libtorrent's settings as read back from each of its sessions, by seeder name.
    libtorrent_settings: &'a serde_json::Map<String, serde_json::Value>,
    summary: &'a [Summary],
    /// Each Hekate seeder against the cheaper libtorrent profile at every point.
    versus: &'a [Versus],
    rows: &'a [Row],
}

/// Writes `len` bytes of xorshift noise to `file` (the same bytes every time).
fn write_data(file: &Path, len: u64) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(file)?);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for c in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
        }
        let n = left.min(buf.len() as u64) as usize;
        std::io::Write::write_all(&mut f, &buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// The bench's data in `dir` (written unless already there: `size` bytes and a short tail,
/// so the last piece is short) and its torrent.
fn bench_torrent(dir: &Path, size: u64, piece_length: u64) -> anyhow::Result<(Meta, PathBuf)> {
    let file = dir.join("bench.bin");
    let want = size + 4321;
    if std::fs::metadata(&file).map(|m| m.len()).ok() != Some(want) {
        tracing::info!(target: "progress", "bench: writing {} MiB of data", want >> 20);
        write_data(&file, want)?;
    }
    let (meta, bytes) = Meta::create(
        std::slice::from_ref(&file),
        &CreateOptions {
            piece_length: Some(piece_length),
            progress: false,
            ..Default::default()
        },
    )?;
    let torrent = dir.join("bench.torrent");
    std::fs::write(&torrent, bytes)?;
    Ok((meta, torrent))
}

/// Ours with each disk path, then libtorrent's two profiles when it is asked for and present.
fn seeders(args: &BenchConfig) -> Vec<Seeder> {
    let mut kinds: Vec<Seeder> = args.disks.iter().map(|&d| Seeder::Hekate(d)).collect();
    let lt = args.libtorrent && libtorrent_available();
    if args.libtorrent && !lt {
        tracing::warn!(
            "bench: /usr/bin/python3 cannot import libtorrent (python3-libtorrent): ours only"
        );
    }
    if lt {
        kinds.push(Seeder::Libtorrent { hps: false });
        kinds.push(Seeder::Libtorrent { hps: true });
    }
    kinds
}

/// Runs the bench of `args`: prints the table (and libtorrent's settings) on stdout and
/// writes the JSON if asked; progress goes to the `progress` log target.
pub fn run(args: BenchConfig) -> anyhow::Result<()> {
    let peers = args.peers.clone();
    let secs = args.secs;
    let size = args.size_mib << 20;
    let max_peers = peers.iter().copied().max().unwrap_or(0);
    // Inherited by the seeders: libtorrent keeps only part of its descriptors for peers, so
    // twice the swarm (the hard limit can be raised only with CAP_SYS_RESOURCE, up to
    // fs.nr_open; here it stays at 20,000).
    let limit = crate::swarm::raise_nofile(max_peers as u64 * 2 + 1024);
    if (limit as usize) < max_peers.min(2500) + 64 {
        bail!("open-file limit {limit} is too low for {max_peers} peers");
    }
    // The data: one file of `size` bytes plus a short tail, so the last piece is short.
    let tmp;
    let dir = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            tmp = std::env::temp_dir().join(format!("iolab-seeder-bench-{}", std::process::id()));
            std::fs::create_dir_all(&tmp)?;
            tmp
        }
    };
    let _cleanup = CleanDir(if args.dir.is_none() {
        Some(dir.clone())
    } else {
        None
    });
    let (meta, torrent) = bench_torrent(&dir, size, args.piece_length)?;
    let kinds = seeders(&args);
    let caches: Vec<bool> = if args.warm_only {
        vec![false]
    } else {
        vec![true, false]
    };
    let started = Instant::now();
    let mut rows: Vec<Row> = Vec::new();
    let mut summary: Vec<Summary> = Vec::new();
    let mut lt_settings = serde_json::Map::new();
    let repeats = args.repeats.max(1);
    let encryptions = if args.encryption.is_empty() {
        vec![Encryption::Off]
    } else {
        args.encryption.clone()
    };
    tracing::info!(target: "progress",
        "bench: {} seeders x {} peer counts x {} openings x {} caches x {repeats} repeats, {secs} s each",
        kinds.len(),
        peers.len(),
        encryptions.len(),
        caches.len()
    );
    let caches = &caches;
    let points = peers.iter().flat_map(|&peers| {
        encryptions.iter().flat_map(move |&encryption| {
            caches.iter().map(move |&cold| Point {
                peers,
                cold,
                encryption,
            })
        })
    });
    for point in points {
        let first = rows.len();
        for r in 0..repeats {
            // Rotate the order so no seeder always runs first (or right after another).
            for j in 0..kinds.len() {
                let kind = kinds[(j + r) % kinds.len()];
                match one_run(kind, point, &meta, &torrent, &dir, &args, secs) {
                    Ok((mut row, settings)) => {
                        if let Some(s) = settings {
                            lt_settings.insert(kind.to_string(), s);
                        }
                        row.repeat = r;
                        tracing::info!(target: "progress",
                            "  run {}/{repeats} {kind:<19} {:>6} peers {:<4} {}: {} connected, {:.1} MB/s",
                            r + 1,
                            point.peers,
                            row.cache,
                            point.encryption,
                            row.connected,
                            row.upload_mb_s
                        );
                        rows.push(row);
                    }
                    Err(e) => tracing::warn!(
                        "bench: {kind} with {} peers ({}) failed: {e:#}",
                        point.peers,
                        point.encryption
                    ),
                }
            }
        }
        for kind in &kinds {
            let name = kind.to_string();
            let runs: Vec<&Row> = rows[first..].iter().filter(|r| r.seeder == name).collect();
            if let Some(s) = Summary::of(&runs) {
                summary.push(s);
            }
        }
    }
    println!(
        "medians of {repeats} runs [min-max]; seeder on CPU 0, swarm on CPU 1; {} MiB torrent, {} KiB pieces, {} s per run, {} upload slots, pipeline {}, read-ahead {}; enc rc4: leechers open MSE offering RC4 only (Hekate --encryption prefer, its RC4 from {}; libtorrent's default enc settings)",
        meta.total >> 20,
        meta.piece_length >> 10,
        secs,
        args.slots,
        args.pipeline,
        if args.read_ahead { "on" } else { "off" },
        crate::mse::rc4_engine()
    );
    print_summary(&summary);
    let versus = Versus::of(&summary);
    versus::print(&versus);
    if !lt_settings.is_empty() {
        println!("libtorrent settings (as read back from the session):");
        for (k, v) in &lt_settings {
            println!("  {k}: {v}");
        }
    }
    println!("bench: {:.0} s", started.elapsed().as_secs_f64());
    if let Some(j) = &args.json {
        let results = Results {
            machine: machine(),
            config: Settings {
                peers,
                secs,
                size_bytes: meta.total,
                piece_length: meta.piece_length,
                slots: args.slots,
                pipeline: args.pipeline,
                block: crate::wire::MAX_BLOCK,
                read_ahead: args.read_ahead,
                encryption: encryptions,
                rc4: crate::mse::rc4_engine(),
            },
            libtorrent_settings: &lt_settings,
            summary: &summary,
            versus: &versus,
            rows: &rows,
        };
        // Through a Value, whose keys are sorted: the file reads as it always has.
        let v = serde_json::to_value(&results)?;
        std::fs::write(j, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", j.display()))?;
    }
    Ok(())
}

/// One (seeder, peers, cache) point over its repeats: medians, and min–max where the
/// spread matters.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub seeder: String,
    pub peers: usize,
    pub cache: &'static str,
    pub encryption: Encryption,
    pub runs: usize,
    /// The fewest peers connected in any run.
    pub connected_min: usize,
    pub upload_mb_s: f64,
    pub upload_mb_s_min: f64,
    pub upload_mb_s_max: f64,
    pub cpu_s_per_gb: Option<f64>,
    pub cpu_s_per_gb_min: Option<f64>,
    pub cpu_s_per_gb_max: Option<f64>,
    pub rss_per_idle_peer_bytes: Option<f64>,
    pub read_amplification: Option<f64>,
    pub read_amplification_distinct: Option<f64>,
    pub lat_p50_ms: f64,
    pub lat_p99_ms: f64,
}

/// The median of the finite values of `v` (iolab-sys's: the mean of the middle two of an
/// even count) and their min and max; `None` when there is none.
fn middle_and_range(v: Vec<f64>) -> Option<(f64, f64, f64)> {
    let middle = iolab_sys::percentile::median(&v)?;
    let finite = v.iter().copied().filter(|x| x.is_finite());
    let min = finite.clone().fold(f64::INFINITY, f64::min);
    let max = finite.fold(f64::NEG_INFINITY, f64::max);
    Some((middle, min, max))
}

impl Summary {
    fn of(runs: &[&Row]) -> Option<Summary> {
        let first = runs.first()?;
        let m = |f: &dyn Fn(&Row) -> Option<f64>| {
            middle_and_range(runs.iter().filter_map(|r| f(r)).collect())
        };
        let up = m(&|r| Some(r.upload_mb_s))?;
        let cpu = m(&|r| r.cpu_s_per_gb);
        Some(Summary {
            seeder: first.seeder.clone(),
            peers: first.peers,
            cache: first.cache,
            encryption: first.encryption,
            runs: runs.len(),
            connected_min: runs.iter().map(|r| r.connected).min().unwrap_or(0),
            upload_mb_s: up.0,
            upload_mb_s_min: up.1,
            upload_mb_s_max: up.2,
            cpu_s_per_gb: cpu.map(|c| c.0),
            cpu_s_per_gb_min: cpu.map(|c| c.1),
            cpu_s_per_gb_max: cpu.map(|c| c.2),
            rss_per_idle_peer_bytes: m(&|r| r.rss_per_idle_peer_bytes).map(|x| x.0),
            read_amplification: m(&|r| r.read_amplification).map(|x| x.0),
            read_amplification_distinct: m(&|r| r.read_amplification_distinct).map(|x| x.0),
            lat_p50_ms: m(&|r| Some(r.lat_p50_ms)).map_or(0.0, |x| x.0),
            lat_p99_ms: m(&|r| Some(r.lat_p99_ms)).map_or(0.0, |x| x.0),
        })
    }
}

fn print_summary(summary: &[Summary]) {
    println!(
        "{:<19} {:>6} {:>5} {:>4} {:>6} {:>17} {:>17} {:>9} {:>7} {:>7} {:>7} {:>8}",
        "seeder",
        "peers",
        "cache",
        "enc",
        "conn",
        "MB/s [min-max]",
        "CPU s/GB [min-max]",
        "B/idle pr",
        "rd/sent",
        "rd/dist",
        "p50 ms",
        "p99 ms"
    );
    let opt =
        |v: Option<f64>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or_else(|| "-".into());
    for s in summary {
        let cpu = match (s.cpu_s_per_gb, s.cpu_s_per_gb_min, s.cpu_s_per_gb_max) {
            (Some(c), Some(a), Some(b)) => format!("{c:.2} [{a:.2}-{b:.2}]"),
            _ => "-".into(),
        };
        println!(
            "{:<19} {:>6} {:>5} {:>4} {:>6} {:>17} {:>17} {:>9} {:>7} {:>7} {:>7.2} {:>8.2}",
            s.seeder,
            s.peers,
            s.cache,
            s.encryption,
            s.connected_min,
            format!(
                "{:.0} [{:.0}-{:.0}]",
                s.upload_mb_s, s.upload_mb_s_min, s.upload_mb_s_max
            ),
            cpu,
            opt(s.rss_per_idle_peer_bytes, 0),
            opt(s.read_amplification, 3),
            opt(s.read_amplification_distinct, 3),
            s.lat_p50_ms,
            s.lat_p99_ms
        );
    }
}

struct CleanDir(Option<PathBuf>);

impl Drop for CleanDir {
    fn drop(&mut self) {
        if let Some(d) = &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_middle_comes_with_its_range() {
        assert_eq!(middle_and_range(vec![3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(
            middle_and_range(vec![4.0, 1.0, f64::NAN, 2.0, 3.0]),
            Some((2.5, 1.0, 4.0))
        );
        assert_eq!(middle_and_range(vec![7.5]), Some((7.5, 7.5, 7.5)));
        assert_eq!(middle_and_range(vec![f64::NAN]), None);
        assert_eq!(middle_and_range(Vec::new()), None);
    }

    #[test]
    fn seeders_are_named_as_the_table_and_json_name_them() {
        let names: Vec<String> = [
            Seeder::Hekate(DiskMode::Uring),
            Seeder::Hekate(DiskMode::Pread),
            Seeder::Libtorrent { hps: false },
            Seeder::Libtorrent { hps: true },
        ]
        .iter()
        .map(|s| format!("{s:<19}|"))
        .collect();
        assert_eq!(
            names,
            [
                "hekate-uring       |",
                "hekate-pread       |",
                "libtorrent-default |",
                "libtorrent-hps     |"
            ]
        );
    }
}
