//! Hekate (`iolab seed`, `iolab tracker`) against real BitTorrent clients on loopback, and
//! against bad input. Each interop case: `iolab tracker` and `iolab seed` as processes, a
//! torrent of 64 MiB or more (a last piece shorter than the rest, a 0-byte file, a file in
//! a subdirectory), one real client downloading it through the tracker, and every
//! downloaded file compared byte for byte with the original.
//!
//! Clients: aria2c, transmission-daemon (the engine of transmission-cli), python3-libtorrent (Debian's /usr/bin/python3),
//! ctorrent, rtorrent, qbittorrent-nox; and a torrent made by mktorrent, seeded by us. A
//! missing client skips its case with one line naming the Debian package, except under
//! `CI=true` where it fails. Stock transmission-cli and webtorrent-cli (npm), and in the
//! full matrix anacrolix/torrent and rqbit (built by scripts/install-seeder-full), run in a
//! network namespace ([`NsSwarm`]), from the `.torrent` and from the magnet link. The default matrix gives each client one piece size (16 KiB
//! to 4 MiB); `IOLAB_SEED_INTEROP_FULL=1` runs every client with every piece size, single-
//! and multi-file (see crates/apps/seeder/README.md).
//!
//! The cases run one at a time (a global lock): the machine has two cores.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use iolab_sys::testing::{free_port, random_bytes};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_iolab");
static SERIAL: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// True if `cmd` is there; otherwise prints the skip line (or panics under CI=true).
fn have(cmd: &str, package: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        if ci() {
            panic!("{cmd} is missing (Debian package {package}; scripts/install-deps installs it)");
        }
        eprintln!("SKIPPED: {cmd} not installed (Debian package {package})");
    }
    found
}

/// A temp directory removed on drop, and the processes to kill.
struct Fixture {
    dir: PathBuf,
    children: Vec<Child>,
    /// The address the tracker and the seeder listen on.
    ip: String,
    /// Clients are started with MSE/PE required (RC4 only), the seeder with
    /// `--encryption require`: a download proves RC4 end to end.
    forced_mse: bool,
    /// Transmission as shipped: uTP on (else off, so that it reaches us over TCP itself).
    transmission_utp: bool,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Fixture {
    fn new(tag: &str) -> Fixture {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("iolab-seeder-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Fixture {
            dir,
            children: Vec::new(),
            ip: "127.0.0.1".into(),
            forced_mse: false,
            transmission_utp: false,
        }
    }

    /// The shared data set: `data/multi/{a.bin (64 MiB + 12345), empty, sub/b.bin}` and
    /// `data/single.bin` (64 MiB + 777).
    fn data(&self) -> PathBuf {
        self.data_of(64 << 20)
    }

    /// [`Fixture::data`] with files of `big` bytes (and a few) instead of 64 MiB.
    fn data_of(&self, big: usize) -> PathBuf {
        let d = self.dir.join("data");
        let m = d.join("multi");
        std::fs::create_dir_all(m.join("sub")).unwrap();
        std::fs::write(m.join("a.bin"), random_bytes(big + 12345, 1)).unwrap();
        std::fs::write(m.join("empty"), b"").unwrap();
        std::fs::write(m.join("sub/b.bin"), random_bytes(300_001, 2)).unwrap();
        std::fs::write(d.join("single.bin"), random_bytes(big + 777, 3)).unwrap();
        d
    }

    fn spawn(&mut self, cmd: &mut Command) -> usize {
        let c = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        self.children.push(c);
        self.children.len() - 1
    }

    /// Starts `client` on `torrent` into `dl` (its output discarded) and waits until
    /// `want.got` is `want.src` byte for byte ([`wait_complete`]).
    fn download(&mut self, client: Client, torrent: &Path, dl: &Path, want: Want) -> bool {
        let mut cmd = client.start(self, torrent, dl);
        self.run_until_complete(&mut cmd, want)
    }

    /// Starts a client's command (its output discarded) and waits until `want.got` is
    /// `want.src` byte for byte ([`wait_complete`]).
    fn run_until_complete(&mut self, cmd: &mut Command, want: Want) -> bool {
        let i = self.spawn(cmd.stdout(Stdio::null()).stderr(Stdio::null()));
        let Want {
            src,
            got,
            limit,
            skip_empty,
        } = want;
        wait_complete(src, got, &mut self.children[i], limit, skip_empty)
    }

    /// Starts `iolab tracker` on a free port; returns its announce URL.
    fn tracker(&mut self) -> String {
        let i = self.spawn(
            Command::new(BIN)
                .args(["tracker", "--listen", &format!("{}:0", self.ip)])
                .args(["--interval", "5"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null()),
        );
        let line = first_line(&mut self.children[i]);
        line.strip_prefix("tracker on ")
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected tracker line {line:?}"))
            .to_string()
    }

    /// Starts `iolab seed ARGS --listen 127.0.0.1:0`; returns its address.
    fn seed(&mut self, args: &[&str]) -> SocketAddr {
        let line = self.seed_lines(args, 1).remove(0);
        let addr = line
            .split(" on ")
            .last()
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected seed line {line:?}"));
        addr.parse().unwrap()
    }

    /// Starts `iolab seed ARGS --listen IP:0` (stderr in `seed.log`); returns the first `n`
    /// lines it prints (the first: where it listens; the second: the magnet link).
    fn seed_lines(&mut self, args: &[&str], n: usize) -> Vec<String> {
        let log = std::fs::File::create(self.dir.join("seed.log")).unwrap();
        let i = self.spawn(
            Command::new(BIN)
                .arg("seed")
                .args(args)
                .args(["--listen", &format!("{}:0", self.ip), "--status-every", "2"])
                .stdout(Stdio::piped())
                .stderr(log),
        );
        first_lines(&mut self.children[i], n)
    }

    fn seed_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("seed.log")).unwrap_or_default()
    }
}

fn first_line(c: &mut Child) -> String {
    first_lines(c, 1).remove(0)
}

/// The first `n` lines `c` prints (its stdout piped), then the rest drained.
fn first_lines(c: &mut Child, n: usize) -> Vec<String> {
    let out = c.stdout.take().unwrap();
    let mut r = BufReader::new(out);
    let lines = (0..n)
        .map(|_| {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            line.trim().to_string()
        })
        .collect();
    // Keep draining so the child never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = r.read_to_end(&mut sink);
    });
    lines
}

/// This host's first global IPv4 address (`ip -4 -o addr show scope global`), if any.
fn host_ipv4() -> Option<String> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let addr = text
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)?;
    Some(addr.split('/').next()?.to_string())
}

/// Files of the torrent made from `src` (a file or a directory), relative paths.
fn files_of(src: &Path) -> Vec<PathBuf> {
    fn walk(base: &Path, d: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                walk(base, &e.path(), out);
            } else {
                out.push(e.path().strip_prefix(base).unwrap().to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    if src.is_dir() {
        walk(src, src, &mut out);
    }
    out
}

/// The files of `src` a client must write: all of them, or without the 0-byte ones for a
/// client that never creates those (`skip_empty`).
fn files_to_check(src: &Path, skip_empty: bool) -> Vec<PathBuf> {
    let mut v = files_of(src);
    if skip_empty {
        v.retain(|r| std::fs::metadata(src.join(r)).is_ok_and(|m| m.len() > 0));
    }
    v
}

/// True when `got` holds exactly the data of `src` (same relative files, same bytes).
fn same_data(src: &Path, got: &Path, skip_empty: bool) -> bool {
    if src.is_file() {
        return std::fs::read(got).ok().as_deref() == Some(std::fs::read(src).unwrap().as_slice());
    }
    files_to_check(src, skip_empty).iter().all(|rel| {
        let a = std::fs::read(src.join(rel)).unwrap();
        std::fs::read(got.join(rel)).ok() == Some(a)
    })
}

/// What a download must end as: `got` identical to `src` within `limit` (`skip_empty`: a
/// file of 0 bytes may be missing).
struct Want<'a> {
    src: &'a Path,
    got: &'a Path,
    limit: Duration,
    skip_empty: bool,
}

/// Waits until `got` matches `src` byte for byte (sizes first, then contents once a
/// second), or the client exits, or the deadline.
fn wait_complete(
    src: &Path,
    got: &Path,
    client: &mut Child,
    limit: Duration,
    skip_empty: bool,
) -> bool {
    let deadline = Instant::now() + limit;
    let want_size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).ok();
    while Instant::now() < deadline {
        let sizes_ok = if src.is_file() {
            want_size(got) == want_size(src)
        } else {
            files_to_check(src, skip_empty)
                .iter()
                .all(|r| want_size(&got.join(r)) == want_size(&src.join(r)))
        };
        if sizes_ok && same_data(src, got, skip_empty) {
            return true;
        }
        if let Ok(Some(_)) = client.try_wait() {
            return same_data(src, got, skip_empty);
        }
        std::thread::sleep(Duration::from_millis(1000));
    }
    false
}

#[derive(Clone, Copy, Debug)]
enum Client {
    Aria2,
    Transmission,
    Libtorrent,
    Ctorrent,
    Rtorrent,
    Qbittorrent,
}

impl Client {
    fn tool(self) -> (&'static str, &'static str) {
        match self {
            Client::Aria2 => ("aria2c", "aria2"),
            Client::Transmission => ("transmission-daemon", "transmission-daemon"),
            Client::Libtorrent => ("/usr/bin/python3", "python3-libtorrent"),
            Client::Ctorrent => ("ctorrent", "ctorrent"),
            Client::Rtorrent => ("rtorrent", "rtorrent"),
            Client::Qbittorrent => ("qbittorrent-nox", "qbittorrent-nox"),
        }
    }

    fn available(self) -> bool {
        let (cmd, pkg) = self.tool();
        if !have(cmd, pkg) {
            return false;
        }
        if let Client::Libtorrent = self {
            let ok = Command::new("/usr/bin/python3")
                .args(["-c", "import libtorrent"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                if ci() {
                    panic!("/usr/bin/python3 cannot import libtorrent (Debian package python3-libtorrent)");
                }
                eprintln!(
                    "SKIPPED: /usr/bin/python3 cannot import libtorrent (python3-libtorrent)"
                );
            }
            return ok;
        }
        true
    }

    /// Starts the client downloading `torrent` into `dl` (an empty directory).
    fn start(self, fx: &Fixture, torrent: &Path, dl: &Path) -> Command {
        let port = free_port().unwrap().to_string();
        let home = fx.dir.join(format!("home-{self:?}"));
        std::fs::create_dir_all(&home).unwrap();
        let mut c;
        match self {
            Client::Aria2 => {
                c = Command::new("aria2c");
                c.arg(format!("--dir={}", dl.display()))
                    .args([
                        "--seed-time=0",
                        "--bt-enable-lpd=false",
                        "--enable-dht=false",
                        "--enable-dht6=false",
                        "--enable-peer-exchange=false",
                        "--bt-stop-timeout=120",
                        "--summary-interval=0",
                        "--console-log-level=warn",
                        "--file-allocation=none",
                    ])
                    .args(if fx.forced_mse {
                        &["--bt-require-crypto=true", "--bt-min-crypto-level=arc4"][..]
                    } else {
                        &[]
                    })
                    .arg(format!("--listen-port={port}"))
                    .arg(torrent);
            }
            Client::Transmission => {
                // transmission-daemon (the engine of transmission-cli, which in 3.00 leaves
                // a torrent added on its command line paused): the torrent is dropped in
                // its watch directory and starts at once.
                let watch = home.join("watch");
                std::fs::create_dir_all(&watch).unwrap();
                std::fs::copy(torrent, watch.join("t.torrent")).unwrap();
                std::fs::write(
                    home.join("settings.json"),
                    format!("{{\"utp-enabled\": {}, \"pex-enabled\": false, \"rpc-bind-address\": \"127.0.0.1\", \"start-added-torrents\": true, \"download-queue-enabled\": false}}\n", fx.transmission_utp),
                )
                .unwrap();
                c = Command::new("transmission-daemon");
                c.arg("-f")
                    .arg("-g")
                    .arg(&home)
                    .arg("-w")
                    .arg(dl)
                    .arg("-c")
                    .arg(&watch)
                    .args(["-P", &port, "-p", &free_port().unwrap().to_string()])
                    // Encryption: its default (preferred: MSE first), or required.
                    .args(["--no-dht", "--no-lpd", "-M"])
                    .args(if fx.forced_mse {
                        &["-er"][..]
                    } else {
                        &["-ep"]
                    });
            }
            Client::Libtorrent => {
                c = Command::new("/usr/bin/python3");
                c.arg("-c")
                    .arg(LIBTORRENT_LEECHER)
                    .arg(torrent)
                    .arg(dl)
                    .arg(&port)
                    .arg(if fx.forced_mse { "forced" } else { "stock" });
            }
            Client::Ctorrent => {
                c = Command::new("ctorrent");
                // -i 127.0.0.2: ctorrent takes a peer at its own address for itself and
                // never connects to it; bound to another loopback address it does.
                c.current_dir(dl)
                    .args(["-e", "0", "-i", "127.0.0.2", "-p", &port])
                    .arg(torrent);
            }
            Client::Rtorrent => {
                c = Command::new("rtorrent");
                let session = home.join("session");
                std::fs::create_dir_all(&session).unwrap();
                c.arg("-n")
                    .arg("-o")
                    .arg("system.daemon.set=true")
                    .arg("-o")
                    .arg(format!("directory.default.set={}", dl.display()))
                    .arg("-o")
                    .arg(format!("session.path.set={}", session.display()))
                    .arg("-o")
                    .arg(format!("network.port_range.set={port}-{port}"))
                    .arg("-o")
                    .arg("dht.mode.set=disable")
                    .arg("-o")
                    .arg("protocol.pex.set=no")
                    .arg("-o")
                    .arg("trackers.use_udp.set=no")
                    .arg(torrent)
                    .env("HOME", &home);
            }
            Client::Qbittorrent => {
                let conf = home.join("qBittorrent/config");
                std::fs::create_dir_all(&conf).unwrap();
                std::fs::write(
                    conf.join("qBittorrent.conf"),
                    "[LegalNotice]\nAccepted=true\n\n[BitTorrent]\nSession\\DHTEnabled=false\nSession\\LSDEnabled=false\nSession\\PeXEnabled=false\n\n[Preferences]\nConnection\\UPnP=false\n",
                )
                .unwrap();
                c = Command::new("qbittorrent-nox");
                c.arg(format!("--profile={}", home.display()))
                    .arg(format!("--webui-port={}", free_port().unwrap()))
                    .arg(format!("--torrenting-port={port}"))
                    .arg(format!("--save-path={}", dl.display()))
                    .arg("--skip-dialog=true")
                    .arg(torrent)
                    .env("HOME", &home);
            }
        }
        c.stdin(Stdio::null());
        c
    }
}

/// A libtorrent leecher: downloads into argv[2], listening on argv[3], MSE forced when
/// argv[4] is `forced`, exits 0 when done.
const LIBTORRENT_LEECHER: &str = r#"
import sys, time, libtorrent as lt
settings = {'listen_interfaces': '127.0.0.1:' + sys.argv[3], 'enable_dht': False,
            'enable_lsd': False, 'enable_upnp': False, 'enable_natpmp': False,
            'allow_multiple_connections_per_ip': True}
if sys.argv[4] == 'forced':
    settings.update({'out_enc_policy': int(lt.enc_policy.forced),
                     'in_enc_policy': int(lt.enc_policy.forced),
                     'allowed_enc_level': int(lt.enc_level.rc4)})
ses = lt.session(settings)
h = ses.add_torrent({'ti': lt.torrent_info(sys.argv[1]), 'save_path': sys.argv[2]})
deadline = time.time() + 170
while time.time() < deadline:
    s = h.status()
    if s.is_seeding:
        sys.exit(0)
    time.sleep(0.2)
sys.exit(1)
"#;

/// One interop case: `client` downloads a torrent of `src` (piece size `piece`) from us.
fn interop(client: Client, single: bool, piece: &str) {
    interop_with(client, single, piece, false);
}

/// [`interop`], with MSE required on both sides when `forced_mse` (and a smaller data set:
/// RC4 is what is tested, not size).
fn interop_with(client: Client, single: bool, piece: &str, forced_mse: bool) {
    let _g = lock();
    if !client.available() {
        return;
    }
    let mut fx =
        Fixture::new(&format!("{client:?}{}", if forced_mse { "-mse" } else { "" }).to_lowercase());
    fx.forced_mse = forced_mse;
    if let Client::Transmission = client {
        // Transmission drops every peer in 127.0.0.0/8 that a tracker gives it (it counts
        // loopback as a "martian" address), so its swarm runs on this host's own address.
        match host_ipv4() {
            Some(ip) => fx.ip = ip,
            // Not a missing tool but the host's network: even under CI this skips (loudly)
            // rather than fail, since a CI container may have loopback only.
            None => {
                eprintln!("SKIPPED: transmission needs a non-loopback IPv4 address on this host");
                return;
            }
        }
    }
    let data = if forced_mse {
        fx.data_of(6 << 20)
    } else {
        fx.data()
    };
    let src = if single {
        data.join("single.bin")
    } else {
        data.join("multi")
    };
    let torrent = fx.dir.join("t.torrent");
    let url = fx.tracker();
    // Every disk path is proven by real clients: each client downloads from one of them.
    let disk = match client {
        Client::Aria2 | Client::Qbittorrent => "mmap",
        Client::Libtorrent | Client::Ctorrent => "pread",
        _ => "uring",
    };
    let json = fx.dir.join("counters.json");
    let seed = fx.seed(&[
        src.to_str().unwrap(),
        "--torrent",
        torrent.to_str().unwrap(),
        "--tracker",
        &url,
        "--piece-length",
        piece,
        "--disk",
        disk,
        "--json",
        json.to_str().unwrap(),
        "--encryption",
        if forced_mse { "require" } else { "prefer" },
    ]);
    assert!(TcpStream::connect(seed).is_ok());
    let dl = fx.dir.join("dl");
    std::fs::create_dir_all(&dl).unwrap();
    let t0 = Instant::now();
    let got = dl.join(src.file_name().unwrap());
    // Transmission 3.00 never creates a file of 0 bytes (its known limitation, not ours:
    // the file has no piece to write); every other file is compared.
    let skip_empty = matches!(client, Client::Transmission);
    let want = Want {
        src: &src,
        got: &got,
        limit: Duration::from_secs(150),
        skip_empty,
    };
    let ok = fx.download(client, &torrent, &dl, want);
    let secs = t0.elapsed().as_secs_f64();
    assert!(
        ok,
        "{client:?} did not download {} (piece {piece}) identical to the source in time; seed log:\n{}",
        src.display(),
        fx.seed_log()
    );
    std::thread::sleep(Duration::from_millis(1100)); // the counters are written every second
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default())
            .unwrap_or_default();
    let n = |k: &str| c["counters"][k].as_u64().unwrap_or(0);
    if forced_mse {
        assert!(
            n("mse_rc4") >= 1,
            "{client:?} got the data without RC4? {c}"
        );
    }
    eprintln!(
        "interop: {client:?} downloaded {} ({}, piece {piece}, our disk path {disk}) byte for byte in {secs:.1} s; MSE exchanges {} ({} RC4), plaintext refused {}",
        src.file_name().unwrap().to_string_lossy(),
        if single { "single-file" } else { "multi-file" },
        n("mse_established"),
        n("mse_rc4"),
        n("plaintext_refused"),
    );
}

fn full() -> bool {
    std::env::var("IOLAB_SEED_INTEROP_FULL").is_ok_and(|v| v == "1")
}

fn matrix(client: Client, default_piece: &str, default_single: bool) {
    if full() {
        for piece in ["16K", "64K", "256K", "1M", "4M"] {
            for single in [false, true] {
                interop(client, single, piece);
            }
        }
    } else {
        interop(client, default_single, default_piece);
    }
}

#[test]
fn interop_aria2c() {
    matrix(Client::Aria2, "16K", false);
}

/// transmission-daemon, on this host's non-loopback address (see `interop`).
#[test]
fn interop_transmission() {
    matrix(Client::Transmission, "64K", false);
}

#[test]
fn interop_libtorrent() {
    matrix(Client::Libtorrent, "256K", true);
}

#[test]
fn interop_ctorrent() {
    // 4 MiB pieces, multi-file: ctorrent stalled here when a peer's request queue was 250.
    matrix(Client::Ctorrent, "4M", false);
}

#[test]
fn interop_rtorrent() {
    matrix(Client::Rtorrent, "1M", false);
}

#[test]
fn interop_qbittorrent() {
    matrix(Client::Qbittorrent, "1M", true);
}

/// aria2c with `--bt-require-crypto=true` (arc4 only), the seeder with `--encryption
/// require`.
#[test]
fn interop_mse_aria2c() {
    interop_with(Client::Aria2, false, "64K", true);
}

/// transmission-daemon with encryption required (`-er`), on this host's address.
#[test]
fn interop_mse_transmission() {
    interop_with(Client::Transmission, false, "64K", true);
}

/// python3-libtorrent with `out_enc_policy` / `in_enc_policy` forced, RC4 only.
#[test]
fn interop_mse_libtorrent() {
    interop_with(Client::Libtorrent, true, "256K", true);
}

/// Stock transmission-daemon 3.00 (uTP on, encryption preferred) in a network namespace on
/// a non-loopback address: it sends one uTP SYN to the seeder and never falls back to TCP,
/// so with the seeder's uTP off it downloads only because the seeder dials it (the tracker
/// lists it; the seeder re-announces every 5 s). Without dialling it never gets a byte.
#[test]
fn stock_transmission_is_dialled_and_downloads() {
    let Some(c) = stock_transmission_in_a_namespace("sd", &["--utp", "off"]) else {
        return;
    };
    let n = |k: &str| c["counters"][k].as_u64().unwrap_or(0);
    assert!(n("peers_dialled_handshaken") >= 1, "{c}");
}

/// Stock transmission-daemon over uTP, its first choice: the seeder's uTP on and dialling
/// off, so the only way in is Transmission's own uTP connection.
#[test]
fn stock_transmission_downloads_over_utp() {
    let args = ["--utp", "on", "--max-dialled", "0"];
    let Some(c) = stock_transmission_in_a_namespace("sdu", &args) else {
        return;
    };
    let n = |k: &str| c["counters"][k].as_u64().unwrap_or(0);
    assert!(n("utp_accepted") >= 1, "{c}");
    assert_eq!(n("peers_dialled"), 0, "{c}");
    assert_eq!(n("utp_garbage"), 0, "{c}");
}

/// Stock Transmission in a network namespace of its own (it ignores tracker peers in
/// 127/8) downloads 6 MiB from the seeder started with `seed_args`: the seeder's counters,
/// or None where the test cannot run.
fn stock_transmission_in_a_namespace(tag: &str, seed_args: &[&str]) -> Option<serde_json::Value> {
    let _g = lock();
    if !Client::Transmission.available() {
        return None;
    }
    let mut sw = NsSwarm::new(tag, seed_args, false)?;
    sw.fx.transmission_utp = true;
    let mut cmd = Client::Transmission.start(&sw.fx, &sw.torrent, &sw.dl);
    let (ok, secs) = sw.download(&mut cmd, Duration::from_secs(60), true);
    let c = counters(&sw.json);
    assert!(
        ok,
        "stock Transmission did not download (seeder {seed_args:?}); counters {c}; seed log:\n{}",
        sw.fx.seed_log()
    );
    let n = |k: &str| c["counters"][k].as_u64().unwrap_or(0);
    eprintln!(
        "stock Transmission (seeder {seed_args:?}) downloaded in {secs:.1} s; dialled {} (handshaken {}), accepted {}, uTP {}, MSE {} ({} RC4)",
        n("peers_dialled"),
        n("peers_dialled_handshaken"),
        n("peers_accepted"),
        n("utp_accepted"),
        n("mse_established"),
        n("mse_rc4"),
    );
    Some(c)
}

/// A swarm across a veth pair: `iolab tracker` and `iolab seed` on the outer address, a
/// client in a network namespace whose only link is that pair. Transmission ignores tracker
/// peers in 127/8, so it needs such an address; and a client's DHT bootstrap or port
/// mapping (webtorrent has no switch for either) reaches nothing beyond the seeder. Fields
/// drop in order: the processes before the namespace.
struct NsSwarm {
    fx: Fixture,
    ns: iolab_netns::Namespace,
    _net: iolab_netns::Net,
    /// `data/multi` of [`Fixture::data_of`] (6 MiB, a 0-byte file, a subdirectory), or
    /// `data/single.bin`.
    src: PathBuf,
    torrent: PathBuf,
    /// The magnet link `iolab seed` printed.
    magnet: String,
    json: PathBuf,
    /// The client's download directory (empty).
    dl: PathBuf,
}

impl NsSwarm {
    /// Sets the swarm up, the seeder started with `seed_args` (64 KiB pieces) on the
    /// multi-file data or `single.bin`; None (said) where this host has no network
    /// namespaces, except under CI, where that fails.
    fn new(tag: &str, seed_args: &[&str], single: bool) -> Option<NsSwarm> {
        let netns = iolab_netns::preflight().and_then(|_| iolab_netns::Net::new(tag));
        let mut net = match netns {
            Ok(n) => n,
            Err(e) if !ci() => {
                eprintln!("SKIPPED: no network namespace here ({e:#})");
                return None;
            }
            Err(e) => panic!("network namespaces are needed: {e:#}"),
        };
        let ns = net.namespace().unwrap();
        let (inside, outside) = net.veth(Some(&ns), None).unwrap();
        let [a, b, c] = iolab_netns::free_subnet().unwrap();
        let (seed_ip, client_ip) = (format!("{a}.{b}.{c}.1"), format!("{a}.{b}.{c}.2"));
        outside.add_addr(&format!("{seed_ip}/24")).unwrap();
        inside.add_addr(&format!("{client_ip}/24")).unwrap();
        outside.up().unwrap();
        inside.up().unwrap();
        let mut fx = Fixture::new(tag);
        fx.ip = seed_ip;
        let data = fx.data_of(6 << 20);
        let src = data.join(if single { "single.bin" } else { "multi" });
        let torrent = fx.dir.join("t.torrent");
        let url = fx.tracker();
        let json = fx.dir.join("counters.json");
        let mut args = vec![
            src.to_str().unwrap(),
            "--torrent",
            torrent.to_str().unwrap(),
            "--tracker",
            &url,
            "--piece-length",
            "64K",
            "--json",
            json.to_str().unwrap(),
        ];
        args.extend_from_slice(seed_args);
        let lines = fx.seed_lines(&args, 2);
        let magnet = lines[1]
            .strip_prefix("magnet ")
            .unwrap_or_else(|| panic!("no magnet link printed: {lines:?}"))
            .to_string();
        let dl = fx.dir.join("dl");
        std::fs::create_dir_all(&dl).unwrap();
        Some(NsSwarm {
            fx,
            ns,
            _net: net,
            src,
            torrent,
            magnet,
            json,
            dl,
        })
    }

    /// Runs `cmd` inside the namespace until its download is the source byte for byte
    /// (`skip_empty`: but for its 0-byte file), the client exits or `limit`: whether it
    /// got there, and the seconds it took.
    fn download(&mut self, cmd: &mut Command, limit: Duration, skip_empty: bool) -> (bool, f64) {
        self.ns.enter(cmd).unwrap();
        let got = self.dl.join(self.src.file_name().unwrap());
        let want = Want {
            src: &self.src,
            got: &got,
            limit,
            skip_empty,
        };
        let t0 = Instant::now();
        let ok = self.fx.run_until_complete(cmd, want);
        (ok, t0.elapsed().as_secs_f64())
    }
}

/// True if webtorrent-cli (npm, scripts/npm-global) is installed whole; otherwise the skip
/// line (or a failure under CI=true).
fn have_webtorrent() -> bool {
    let ok = Command::new("scripts/npm-global")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["--check", WEBTORRENT, "webtorrent"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if ci() {
            panic!("{WEBTORRENT} is missing (npm; scripts/install-deps installs it)");
        }
        eprintln!("SKIPPED: {WEBTORRENT} not installed (npm; scripts/install-deps installs it)");
    }
    ok
}

/// The npm package of scripts/deps/seeder.
const WEBTORRENT: &str = "webtorrent-cli@6.0.1";

/// Stock webtorrent-cli (`webtorrent download ID -o DIR`, its defaults: MSE/PE first, uTP
/// tried before TCP, DHT and NAT port mapping on, which reach nothing from the namespace)
/// downloads from `iolab seed` on its defaults; `id`: the `.torrent` or the magnet link.
/// Returns the seeder's counters. WebTorrent >= 2 opens every connection with MSE: before
/// issue 47's MSE the seeder closed it as "not a BitTorrent handshake", and it never got a
/// byte.
fn stock_webtorrent(tag: &str, magnet: bool) -> Option<serde_json::Value> {
    let _g = lock();
    if !have_webtorrent() {
        return None;
    }
    let mut sw = NsSwarm::new(tag, &[], false)?;
    let id = if magnet {
        sw.magnet.clone()
    } else {
        sw.torrent.to_str().unwrap().to_string()
    };
    let mut cmd = Command::new("webtorrent");
    cmd.args(["download", &id, "-o"])
        .arg(&sw.dl)
        .arg("--quiet")
        .env("HOME", &sw.fx.dir);
    let (ok, secs) = sw.download(&mut cmd, Duration::from_secs(90), false);
    let c = counters(&sw.json);
    assert!(
        ok,
        "stock webtorrent did not download from {id}; counters {c}; seed log:\n{}",
        sw.fx.seed_log()
    );
    let n = |k: &str| c["counters"][k].as_u64().unwrap_or(0);
    eprintln!(
        "stock webtorrent ({}) downloaded 6 MiB in {secs:.1} s; uTP {}, TCP accepted {}, dialled {}, MSE {} ({} RC4)",
        if magnet { "magnet link" } else { ".torrent" },
        n("utp_accepted"),
        n("peers_accepted"),
        n("peers_dialled_handshaken"),
        n("mse_established"),
        n("mse_rc4"),
    );
    Some(c)
}

/// webtorrent-cli from the `.torrent`: it reaches the seeder over uTP (its first choice)
/// under MSE with RC4 (it offers RC4 and plaintext; `prefer` picks RC4).
#[test]
fn stock_webtorrent_downloads_a_torrent() {
    let Some(c) = stock_webtorrent("wt", false) else {
        return;
    };
    let n = |k: &str| c["counters"][k].as_u64().unwrap_or(0);
    assert!(n("mse_rc4") >= 1, "webtorrent opens with MSE: {c}");
    assert!(
        n("utp_accepted") >= 1,
        "webtorrent tries uTP first (its uTP addon unbuilt? scripts/npm-global): {c}"
    );
    assert_eq!(n("utp_garbage"), 0, "{c}");
}

/// webtorrent-cli from the magnet link `iolab seed` prints: the tracker gives it the seeder
/// (a magnet client announces `left=0`), BEP 9 gives it the info dictionary.
#[test]
fn stock_webtorrent_downloads_from_the_magnet_link() {
    let Some(c) = stock_webtorrent("wtm", true) else {
        return;
    };
    let n = |k: &str| c["counters"][k].as_u64().unwrap_or(0);
    assert!(n("mse_established") >= 1, "{c}");
}

/// Stock transmission-cli 3.00 (uTP on, encryption preferred; DHT, LPD and PEX off in its
/// settings.json) given the magnet link `iolab seed` prints, in a namespace (it ignores
/// tracker peers in 127/8): it fetches the metadata over BEP 9, then the data, byte for
/// byte but for the 0-byte file, which Transmission 3.00 never creates. (transmission-
/// daemon's watch directory takes `.torrent` files only.)
#[test]
fn stock_transmission_downloads_from_the_magnet_link() {
    let _g = lock();
    if !have("transmission-cli", "transmission-cli") {
        return;
    }
    let Some(mut sw) = NsSwarm::new("tm", &[], false) else {
        return;
    };
    let home = sw.fx.dir.join("home-tcli");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("settings.json"),
        "{\"dht-enabled\": false, \"lpd-enabled\": false, \"pex-enabled\": false}\n",
    )
    .unwrap();
    let mut cmd = Command::new("transmission-cli");
    cmd.arg("-g")
        .arg(&home)
        .arg("-w")
        .arg(&sw.dl)
        .arg(&sw.magnet)
        .stdin(Stdio::null());
    let (ok, secs) = sw.download(&mut cmd, Duration::from_secs(90), true);
    let c = counters(&sw.json);
    assert!(
        ok,
        "transmission-cli did not download from {}; counters {c}; seed log:\n{}",
        sw.magnet,
        sw.fx.seed_log()
    );
    let n = |k: &str| c["counters"][k].as_u64().unwrap_or(0);
    eprintln!(
        "stock transmission-cli (magnet link) downloaded 6 MiB in {secs:.1} s; uTP {}, TCP accepted {}, dialled {}, MSE {} ({} RC4)",
        n("utp_accepted"),
        n("peers_accepted"),
        n("peers_dialled_handshaken"),
        n("mse_established"),
        n("mse_rc4"),
    );
}

/// True if the full-matrix client `cmd` (built by scripts/install-seeder-full) is there;
/// else the skip line, or a failure when the full matrix is asked for
/// (`IOLAB_SEED_INTEROP_FULL=1`): these take minutes to build, so only that installs them.
fn have_full_client(cmd: &Path, what: &str) -> bool {
    if cmd.is_file() {
        return true;
    }
    if full() {
        panic!(
            "{} is missing ({what}; scripts/install-seeder-full builds it)",
            cmd.display()
        );
    }
    eprintln!(
        "SKIPPED: {} not built ({what}; scripts/install-seeder-full, or IOLAB_SEED_INTEROP_FULL=1 to require it)",
        cmd.display()
    );
    false
}

/// Where scripts/install-seeder-full puts the full matrix's clients.
fn full_client(name: &str) -> PathBuf {
    let dir = std::env::var_os("IOLAB_SEED_CLIENTS").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/seed-clients/bin"),
        PathBuf::from,
    );
    dir.join(name)
}

/// Runs a full-matrix client `cmd` (in `sw.dl`, in the namespace) to completion and says
/// what the seeder saw; `who` names it.
fn full_client_download(sw: &mut NsSwarm, cmd: &mut Command, who: &str) -> serde_json::Value {
    cmd.current_dir(&sw.dl)
        .env("HOME", &sw.fx.dir)
        .stdin(Stdio::null());
    let (ok, secs) = sw.download(cmd, Duration::from_secs(90), false);
    let c = counters(&sw.json);
    assert!(
        ok,
        "{who} did not download; counters {c}; seed log:\n{}",
        sw.fx.seed_log()
    );
    let n = |k: &str| c["counters"][k].as_u64().unwrap_or(0);
    eprintln!(
        "{who} downloaded 6 MiB in {secs:.1} s; uTP {}, TCP accepted {}, dialled {}, MSE {} ({} RC4)",
        n("utp_accepted"),
        n("peers_accepted"),
        n("peers_dialled_handshaken"),
        n("mse_established"),
        n("mse_rc4"),
    );
    c
}

/// anacrolix/torrent v1.59.1's `torrent download` (DHT off; else its defaults: uTP and TCP,
/// MSE preferred, its file storage) from the `.torrent`, single-file: with a multi-file
/// torrent its default file storage fails with "error writing chunk: invalid argument"
/// (flushing the last file's `.part`) whoever seeds, aria2c too (docs/results/seeder.md).
#[test]
fn anacrolix_torrent_downloads() {
    anacrolix_from("ana", false);
}

/// anacrolix/torrent from the magnet link `iolab seed` prints.
#[test]
fn anacrolix_torrent_downloads_from_the_magnet_link() {
    anacrolix_from("anm", true);
}

fn anacrolix_from(tag: &str, magnet: bool) {
    let client = ("torrent", "anacrolix/torrent v1.59.1", "Go");
    full_client_from(client, tag, magnet, true, |cmd, _, id| {
        cmd.args(["download", "--no-dht"]).arg(id);
    });
}

/// rqbit 9.1.0 (`rqbit download -e`, DHT and LSD off; else its defaults: TCP, uTP off,
/// plaintext: it has no MSE) from the `.torrent`, multi-file.
#[test]
fn rqbit_downloads() {
    rqbit_from("rq", false);
}

/// rqbit from the magnet link `iolab seed` prints.
#[test]
fn rqbit_downloads_from_the_magnet_link() {
    rqbit_from("rqm", true);
}

fn rqbit_from(tag: &str, magnet: bool) {
    let client = ("rqbit", "rqbit 9.1.0", "crates.io");
    full_client_from(client, tag, magnet, false, |cmd, sw, id| {
        cmd.args(["--disable-dht", "--disable-lsd", "download", "-e", "-o"])
            .arg(&sw.dl)
            .arg(id);
    });
}

/// A full-matrix client `(binary, name and version, where it comes from)` downloading from
/// the `.torrent` or the magnet link (a single-file torrent if `single_file`); `args` puts
/// its command line together from the swarm and the torrent's id (path or magnet URI).
fn full_client_from(
    (binary, name, source): (&str, &str, &str),
    tag: &str,
    magnet: bool,
    single_file: bool,
    args: impl FnOnce(&mut Command, &NsSwarm, &str),
) {
    let _g = lock();
    let bin = full_client(binary);
    if !have_full_client(&bin, &format!("{name}, {source}")) {
        return;
    }
    let Some(mut sw) = NsSwarm::new(tag, &[], single_file) else {
        return;
    };
    let id = if magnet {
        sw.magnet.clone()
    } else {
        sw.torrent.to_str().unwrap().to_string()
    };
    let mut cmd = Command::new(&bin);
    args(&mut cmd, &sw, &id);
    let via = if magnet { "magnet link" } else { ".torrent" };
    full_client_download(&mut sw, &mut cmd, &format!("{name} ({via})"));
}

/// Makes a torrent of argv[1] with python3-libtorrent's `create_torrent` (16 KiB pieces,
/// tracker argv[3]) into argv[2]: its default, hybrid v1+v2 with BEP 47 pad files, or
/// v2-only when argv[4] is `v2`.
const LIBTORRENT_CREATE: &str = r#"
import sys, os, libtorrent as lt
src, out, tracker, mode = sys.argv[1:5]
fs = lt.file_storage()
lt.add_files(fs, src)
t = lt.create_torrent(fs, 16384, flags=lt.create_torrent.v2_only if mode == 'v2' else 0)
t.add_tracker(tracker)
lt.set_piece_hashes(t, os.path.dirname(os.path.abspath(src)))
open(out, 'wb').write(lt.bencode(t.generate()))
"#;

/// A hybrid torrent made by libtorrent 2.0 (its default output: pad files `.pad/N` after
/// every file but the last) is seeded by its v1 side with no pad file on disk, and
/// libtorrent downloads every real file byte for byte (aria2c 1.36 cannot: it computes
/// another info hash for a hybrid torrent). (libtorrent's v2-only torrents: see
/// `v2_and_hybrid_torrents_are_libtorrents_own`.)
#[test]
fn libtorrent_hybrid_torrent_seeded() {
    let _g = lock();
    if !Client::Libtorrent.available() {
        return;
    }
    let mut fx = Fixture::new("hybrid");
    let data = fx.data_of(3 << 20);
    let src = data.join("multi");
    let url = fx.tracker();
    let make = |out: &Path, mode: &str| {
        common::run_ok(
            Command::new("/usr/bin/python3")
                .args(["-c", LIBTORRENT_CREATE])
                .arg(&src)
                .arg(out)
                .args([url.as_str(), mode]),
        );
    };
    let hybrid = fx.dir.join("hybrid.torrent");
    make(&hybrid, "hybrid");
    assert!(
        std::fs::read(&hybrid)
            .unwrap()
            .windows(4)
            .any(|w| w == b".pad"),
        "libtorrent's default torrent has pad files"
    );
    fx.seed(&[hybrid.to_str().unwrap(), "--data", data.to_str().unwrap()]);
    assert!(!data.join("multi/.pad").exists(), "no pad file on disk");
    let dl = fx.dir.join("dl");
    std::fs::create_dir_all(&dl).unwrap();
    let got = dl.join("multi");
    let want = Want {
        src: &src,
        got: &got,
        limit: Duration::from_secs(60),
        skip_empty: false,
    };
    let ok = fx.download(Client::Libtorrent, &hybrid, &dl, want);
    assert!(
        ok,
        "libtorrent did not get the hybrid torrent; seed log:\n{}",
        fx.seed_log()
    );
}

/// mktorrent makes a torrent of `data`/multi announcing to `url` (pieces of 2^`log2_piece`
/// bytes), which we then seed; returns the torrent and an empty download directory.
fn seed_mktorrent(
    fx: &mut Fixture,
    data: &Path,
    url: &str,
    log2_piece: &str,
) -> (PathBuf, PathBuf) {
    let torrent = fx.dir.join("mk.torrent");
    let st = Command::new("mktorrent")
        .args(["-a", url, "-l", log2_piece, "-o"])
        .arg(&torrent)
        .arg(data.join("multi"))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    fx.seed(&[torrent.to_str().unwrap(), "--data", data.to_str().unwrap()]);
    let dl = fx.dir.join("dl");
    std::fs::create_dir_all(&dl).unwrap();
    (torrent, dl)
}

/// A torrent made by mktorrent (not by us) is seeded by us: aria2c downloads it.
#[test]
fn mktorrent_torrent_seeded() {
    let _g = lock();
    if !have("mktorrent", "mktorrent") || !Client::Aria2.available() {
        return;
    }
    let mut fx = Fixture::new("mktorrent");
    let data = fx.data();
    let url = fx.tracker();
    let (torrent, dl) = seed_mktorrent(&mut fx, &data, &url, "17");
    let (src, got) = (data.join("multi"), dl.join("multi"));
    let want = Want {
        src: &src,
        got: &got,
        limit: Duration::from_secs(120),
        skip_empty: false,
    };
    let ok = fx.download(Client::Aria2, &torrent, &dl, want);
    assert!(
        ok,
        "aria2c did not get the mktorrent torrent; seed log:\n{}",
        fx.seed_log()
    );
}

/// A client whose disk fills up (aria2c writing into an 8 MiB tmpfs mounted in its own
/// private mount namespace, `unshare -m`) fails with its own clear error, while a second
/// aria2c started at the same time downloads everything byte for byte: the seeder keeps
/// serving the others and is still up and accepting afterwards.
#[test]
fn a_client_with_a_full_disk_does_not_stop_the_others() {
    let _g = lock();
    if !Client::Aria2.available() || !have("unshare", "util-linux") {
        return;
    }
    // Root is needed for the mount namespace.
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    if !root {
        assert!(
            !ci(),
            "the full-disk test needs root (unshare -m, mount tmpfs)"
        );
        eprintln!("SKIPPED: the full-disk test needs root (unshare -m, mount tmpfs)");
        return;
    }
    let mut fx = Fixture::new("fulldisk");
    let data = fx.data();
    let src = data.join("single.bin");
    let torrent = fx.dir.join("t.torrent");
    let url = fx.tracker();
    let seed = fx.seed(&[
        src.to_str().unwrap(),
        "--torrent",
        torrent.to_str().unwrap(),
        "--tracker",
        &url,
        "--piece-length",
        "256K",
        "--slots",
        "0",
    ]);
    let small = fx.dir.join("small");
    let dl = fx.dir.join("dl");
    std::fs::create_dir_all(&small).unwrap();
    std::fs::create_dir_all(&dl).unwrap();
    // The tmpfs exists only in the client's namespace: it goes with the client.
    let aria = Client::Aria2.start(&fx, &torrent, &small);
    let args: Vec<String> = aria
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let script =
        "mount -t tmpfs -o size=8m iolab-seeder-full \"$1\" && shift && exec aria2c \"$@\"";
    let full = fx.spawn(
        Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
            .arg(&small)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped()) // aria2c's console, where its errors go
            .stderr(Stdio::piped()),
    );
    let ok = fx.spawn(
        Client::Aria2
            .start(&fx, &torrent, &dl)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let got = dl.join("single.bin");
    let complete = wait_complete(
        &src,
        &got,
        &mut fx.children[ok],
        Duration::from_secs(150),
        false,
    );
    assert!(
        complete,
        "the second client did not complete; seed log:\n{}",
        fx.seed_log()
    );
    // The full-disk client stops with an error of its own (ENOSPC), never with all data.
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(st) = fx.children[full].try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the full-disk client never stopped"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let mut err = String::new();
    let _ = fx.children[full]
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut err);
    let _ = fx.children[full]
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err);
    assert!(!status.success(), "the full-disk client succeeded?\n{err}");
    assert!(
        err.contains("No space left") || err.contains("space"),
        "the full-disk client's error is not about space: {err}"
    );
    // Never mounted outside its namespace: nothing landed in `small` here.
    assert!(std::fs::read_dir(&small).unwrap().next().is_none());
    // The seeder is still up and accepting.
    assert!(
        fx.children[1].try_wait().unwrap().is_none(),
        "the seeder exited"
    );
    assert!(
        TcpStream::connect(seed).is_ok(),
        "the seeder stopped accepting"
    );
    assert!(!fx.seed_log().contains("panicked"));
}

// ------------------------------------------------------------------ bad input

fn small_fixture(tag: &str) -> (Fixture, PathBuf, PathBuf) {
    let fx = Fixture::new(tag);
    let d = fx.dir.join("data");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("f.bin"), random_bytes(200_000, 9)).unwrap();
    let t = fx.dir.join("f.torrent");
    let st = Command::new(BIN)
        .arg("seed")
        .arg(d.join("f.bin"))
        .arg("--torrent")
        .arg(&t)
        .arg("--create-only")
        .args(["--piece-length", "16K"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    (fx, d, t)
}

fn seed_fails(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("seed")
        .args(args)
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "seed {args:?} should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn truncated_and_malformed_torrents_are_clear_errors() {
    let (fx, d, t) = small_fixture("badtorrent");
    let bytes = std::fs::read(&t).unwrap();
    let cut = fx.dir.join("cut.torrent");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = seed_fails(&[cut.to_str().unwrap(), "--data", d.to_str().unwrap()]);
    assert!(err.contains("not a valid .torrent"), "{err}");
    assert!(err.contains("truncated"), "{err}");
    let junk = fx.dir.join("junk.torrent");
    std::fs::write(&junk, b"<html>not found</html>").unwrap();
    let err = seed_fails(&[junk.to_str().unwrap(), "--data", d.to_str().unwrap()]);
    assert!(err.contains("not a valid .torrent"), "{err}");
    let empty = fx.dir.join("empty.torrent");
    std::fs::write(&empty, b"").unwrap();
    let err = seed_fails(&[empty.to_str().unwrap(), "--data", d.to_str().unwrap()]);
    assert!(err.contains("empty"), "{err}");
}

#[test]
fn data_that_does_not_match_is_a_clear_error() {
    let (_fx, d, t) = small_fixture("mismatch");
    let mut b = std::fs::read(d.join("f.bin")).unwrap();
    b[100_000] ^= 0xFF; // piece 6
    std::fs::write(d.join("f.bin"), &b).unwrap();
    let err = seed_fails(&[t.to_str().unwrap(), "--data", d.to_str().unwrap()]);
    assert!(
        err.contains("piece 6") && err.contains("does not match"),
        "{err}"
    );
    b.truncate(150_000);
    std::fs::write(d.join("f.bin"), &b).unwrap();
    let err = seed_fails(&[t.to_str().unwrap(), "--data", d.to_str().unwrap()]);
    assert!(err.contains("150000 bytes"), "{err}");
}

#[test]
fn port_in_use_is_a_clear_error() {
    let (_fx, d, t) = small_fixture("port");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = Command::new(BIN)
        .arg("seed")
        .arg(&t)
        .args(["--data", d.to_str().unwrap(), "--listen", &addr])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use"), "{err}");
    assert!(
        out.stdout.is_empty(),
        "no start line when the port is taken"
    );
}

fn handshake(info_hash: &[u8; 20], fast: bool) -> Vec<u8> {
    let mut h = vec![19];
    h.extend_from_slice(b"BitTorrent protocol");
    let mut reserved = [0u8; 8];
    if fast {
        reserved[7] |= 0x04;
    }
    h.extend_from_slice(&reserved);
    h.extend_from_slice(info_hash);
    h.extend_from_slice(b"-XX0000-abcdefghijkl");
    h
}

fn info_hash_of(t: &Path) -> [u8; 20] {
    let m = iolab_seeder::metainfo::Meta::load(t, Path::new("/nonexistent")).unwrap();
    m.info_hash
}

/// Reads messages until one with id `want`; returns its payload.
fn read_until(s: &mut impl Read, want: u8) -> Vec<u8> {
    loop {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let n = u32::from_be_bytes(len) as usize;
        if n == 0 {
            continue;
        }
        let mut m = vec![0u8; n];
        s.read_exact(&mut m).unwrap();
        if m[0] == want {
            return m[1..].to_vec();
        }
    }
}

/// Garbage, oversized messages, out-of-bounds and oversized requests, a silent peer: each
/// is dropped or rejected, counted, and a well-behaved peer is served meanwhile.
#[test]
fn bad_peers_are_dropped_and_others_served() {
    let _g = lock();
    let (mut fx, d, t) = small_fixture("badpeers");
    let json = fx.dir.join("c.json");
    let addr = fx.seed(&[
        t.to_str().unwrap(),
        "--data",
        d.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--slots",
        "0",
    ]);
    let ih = info_hash_of(&t);
    let to = Some(Duration::from_secs(10));
    let open = || {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(to).unwrap();
        s
    };
    let closed = |s: &mut TcpStream| common::closed_by_peer(s, Duration::from_secs(10));
    // 1. Not a handshake.
    let mut g = open();
    g.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(closed(&mut g), "an HTTP request is dropped");
    // 1b. An MSE/PE opening (96 bytes of DH key, padding): answered with our key, not
    // counted as a bad peer when it goes away.
    let mut mse = open();
    mse.write_all(&random_bytes(96 + 100, 5)).unwrap();
    let mut yb = [0u8; 96];
    mse.read_exact(&mut yb).unwrap();
    // Read the padding too, so that the close is a FIN (the exchange ends "closed"), not
    // a reset from unread bytes (an I/O error): each way must count as one failure.
    mse.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut pad = [0u8; 1024];
    while matches!(mse.read(&mut pad), Ok(n) if n > 0) {}
    drop(mse);
    // 2. The wrong torrent.
    let mut w = open();
    w.write_all(&handshake(&[7; 20], true)).unwrap();
    assert!(closed(&mut w), "a handshake for another torrent is dropped");
    // 3. A message longer than any legal one.
    let mut big = open();
    big.write_all(&handshake(&ih, true)).unwrap();
    big.write_all(&(10u32 << 20).to_be_bytes()).unwrap();
    assert!(closed(&mut big), "a 10 MiB message length is dropped");
    // 4. A request outside the torrent.
    let mut oob = open();
    oob.write_all(&handshake(&ih, true)).unwrap();
    let mut m = vec![0, 0, 0, 1, 2]; // interested
    m.extend_from_slice(&[0, 0, 0, 13, 6]);
    m.extend_from_slice(&1000u32.to_be_bytes());
    m.extend_from_slice(&0u32.to_be_bytes());
    m.extend_from_slice(&16384u32.to_be_bytes());
    oob.write_all(&m).unwrap();
    assert!(
        closed(&mut oob),
        "a request for piece 1000 of 13 is dropped"
    );
    // 5. A good peer, with a too-long request (rejected, not dropped) then good ones.
    let mut good = open();
    good.write_all(&handshake(&ih, true)).unwrap();
    let mut m = vec![0, 0, 0, 1, 2];
    for (begin, len) in [(0u32, 32768u32), (0, 16384), (8192, 16384)] {
        m.extend_from_slice(&[0, 0, 0, 13, 6]);
        m.extend_from_slice(&2u32.to_be_bytes());
        m.extend_from_slice(&begin.to_be_bytes());
        m.extend_from_slice(&len.to_be_bytes());
    }
    good.write_all(&m).unwrap();
    let mut hs = [0u8; 68];
    good.read_exact(&mut hs).unwrap();
    assert_eq!(&hs[28..48], &ih, "the seeder's handshake names the torrent");
    // Rejected at once: the 32 KiB request, and the one at offset 8192 that runs past the
    // end of piece 2 (16 KiB long; an offset at or past the end would be a violation).
    let rej = read_until(&mut good, 0x10);
    assert_eq!(
        &rej[8..12],
        &32768u32.to_be_bytes(),
        "the 32 KiB request is rejected"
    );
    let rej = read_until(&mut good, 0x10);
    assert_eq!(&rej[4..8], &8192u32.to_be_bytes());
    let src = std::fs::read(d.join("f.bin")).unwrap();
    let p = read_until(&mut good, 7);
    assert_eq!(&p[..8], &[0, 0, 0, 2, 0, 0, 0, 0]);
    assert_eq!(
        &p[8..],
        &src[2 * 16384..3 * 16384],
        "block bytes are the file's"
    );
    // The counters say what happened.
    std::thread::sleep(Duration::from_millis(1500));
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let n = |k: &str| c["counters"][k].as_u64().unwrap();
    assert_eq!(n("peers_dropped_garbage"), 3, "{c}");
    assert_eq!(n("mse_openings"), 1, "an MSE opening is no bad peer: {c}");
    assert_eq!(n("mse_failures"), 1, "{c}");
    assert_eq!(n("peers_wrong_torrent"), 1, "{c}");
    assert!(n("requests_rejected") >= 1, "{c}");
    assert!(n("blocks_sent") >= 1, "{c}");
    assert_eq!(n("peers_now"), 1, "{c}");
}

// ------------------------------------------------------------------ MSE/PE

/// A peer connection under MSE: RC4 both ways, or plaintext after the exchange.
struct MseStream {
    s: TcpStream,
    rc4: Option<iolab_seeder::mse::Rc4Pair>,
    /// Payload bytes received with the end of the exchange, already decrypted.
    early: Vec<u8>,
}

impl Read for MseStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.early.is_empty() {
            let n = buf.len().min(self.early.len());
            buf[..n].copy_from_slice(&self.early[..n]);
            self.early.drain(..n);
            return Ok(n);
        }
        let n = self.s.read(buf)?;
        if let Some(rc4) = &mut self.rc4 {
            rc4.decrypt(&mut buf[..n]).map_err(std::io::Error::other)?;
        }
        Ok(n)
    }
}

impl MseStream {
    fn send(&mut self, data: &[u8]) {
        let mut d = data.to_vec();
        if let Some(rc4) = &mut self.rc4 {
            rc4.encrypt(&mut d).expect("RC4");
        }
        self.s.write_all(&d).unwrap();
    }
}

/// Dials `addr` with MSE for `ih`, offering `provide`, our handshake as the initial payload.
/// `None` when the seeder closes during the exchange.
fn mse_dial(addr: SocketAddr, ih: &[u8; 20], provide: u32) -> Option<MseStream> {
    use iolab_seeder::mse::{Exchange as _, Initiator};
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (mut mse, opening) = Initiator::new(*ih, provide, handshake(ih, true));
    s.write_all(&opening).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        let p = mse
            .feed(&buf[..n])
            .expect("the seeder's side of MSE follows the spec");
        s.write_all(&p.send).unwrap();
        if let Some(done) = p.done {
            return Some(MseStream {
                s,
                rc4: done.rc4,
                early: done.payload,
            });
        }
    }
}

/// Under MSE (RC4, and plaintext chosen inside MSE) the seeder's handshake and a block
/// arrive intact; `--encryption require` refuses plaintext and plaintext-only offers.
#[test]
fn mse_peers_are_served_and_the_policy_holds() {
    use iolab_seeder::mse::{CRYPTO_PLAINTEXT, CRYPTO_RC4};
    let _g = lock();
    let (mut fx, d, t) = small_fixture("mse");
    let json = fx.dir.join("c.json");
    let ih = info_hash_of(&t);
    let src = std::fs::read(d.join("f.bin")).unwrap();
    let addr = fx.seed(&[
        t.to_str().unwrap(),
        "--data",
        d.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--slots",
        "0",
    ]);
    for provide in [CRYPTO_RC4 | CRYPTO_PLAINTEXT, CRYPTO_PLAINTEXT] {
        let mut p = mse_dial(addr, &ih, provide).expect("the default policy accepts MSE");
        assert_eq!(
            p.rc4.is_some(),
            provide & CRYPTO_RC4 != 0,
            "RC4 chosen when offered"
        );
        let mut hs = [0u8; 68];
        p.read_exact(&mut hs).unwrap();
        assert_eq!(&hs[28..48], &ih, "the seeder's handshake, decrypted");
        let mut m = vec![0, 0, 0, 1, 2];
        m.extend_from_slice(&[0, 0, 0, 13, 6]);
        m.extend_from_slice(&3u32.to_be_bytes());
        m.extend_from_slice(&0u32.to_be_bytes());
        m.extend_from_slice(&16384u32.to_be_bytes());
        p.send(&m);
        let block = read_until(&mut p, 7);
        assert_eq!(
            &block[8..],
            &src[3 * 16384..4 * 16384],
            "block 3, byte for byte"
        );
    }
    // A plaintext peer is still served by default.
    let mut plain = TcpStream::connect(addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    plain.write_all(&handshake(&ih, true)).unwrap();
    let mut hs = [0u8; 68];
    plain.read_exact(&mut hs).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let n = |k: &str| c["counters"][k].as_u64().unwrap();
    assert_eq!(n("mse_openings"), 2, "{c}");
    assert_eq!(n("mse_established"), 2, "{c}");
    assert_eq!(n("mse_rc4"), 1, "{c}");

    let mut fx2 = Fixture::new("mse-require");
    let addr = fx2.seed(&[
        t.to_str().unwrap(),
        "--data",
        d.to_str().unwrap(),
        "--encryption",
        "require",
    ]);
    assert!(
        mse_dial(addr, &ih, CRYPTO_PLAINTEXT).is_none(),
        "require: a plaintext-only offer is refused"
    );
    let mut plain = TcpStream::connect(addr).unwrap();
    plain.write_all(&handshake(&ih, true)).unwrap();
    assert!(
        common::closed_by_peer(&mut plain, Duration::from_secs(5)),
        "require: a plaintext handshake is closed"
    );
    let mut p = mse_dial(addr, &ih, CRYPTO_RC4).expect("require: RC4 accepted");
    let mut hs = [0u8; 68];
    p.read_exact(&mut hs).unwrap();
    assert_eq!(&hs[28..48], &ih);
}

// ------------------------------------------------------------------ the choker

/// `iolab seed` of one `len`-byte file in `piece`-byte pieces (created in a new fixture).
fn fixture_of(tag: &str, len: usize, piece: &str) -> (Fixture, PathBuf, PathBuf) {
    let fx = Fixture::new(tag);
    let d = fx.dir.join("data");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("f.bin"), random_bytes(len, 11)).unwrap();
    let t = fx.dir.join("f.torrent");
    let st = Command::new(BIN)
        .arg("seed")
        .arg(d.join("f.bin"))
        .arg("--torrent")
        .arg(&t)
        .arg("--create-only")
        .args(["--piece-length", piece])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    (fx, d, t)
}

/// The wire bytes of `interested` and a request for every 16 KiB block of `pieces` pieces
/// of `piece` bytes.
fn interested_and_every_request(pieces: u32, piece: u32) -> Vec<u8> {
    let mut m = vec![0, 0, 0, 1, 2];
    for index in 0..pieces {
        for begin in (0..piece).step_by(16384) {
            m.extend_from_slice(&[0, 0, 0, 13, 6]);
            m.extend_from_slice(&index.to_be_bytes());
            m.extend_from_slice(&begin.to_be_bytes());
            m.extend_from_slice(&16384u32.to_be_bytes());
        }
    }
    m
}

/// The issue's denial of service: 200 peers that say interested, request every block and
/// never read (the first ones unchoked at once, the others served their allowed-fast
/// pieces) do not keep a good peer (plain BEP 3, no fast extension, reading everything)
/// out for more than one rechoke round; it is then served, and the stalled ones are
/// dropped at the send-progress deadline. Before, the stalled peers kept their slots until
/// the 60 s send timeout and the newcomer lost every tie at 0 bytes.
#[test]
fn stalled_peers_do_not_starve_a_good_one() {
    let _g = lock();
    const PIECE: u32 = 64 << 10;
    const PIECES: u32 = 64;
    let (mut fx, d, t) = fixture_of("starve", (PIECES * PIECE) as usize, "64K");
    let json = fx.dir.join("c.json");
    // The default rechoke round (10 s) and snub time (5 s); a send-progress deadline of
    // 6 s rather than 20 s, to see the stalled peers dropped quickly.
    let round = Duration::from_secs(10);
    let send_timeout = Duration::from_secs(6);
    let addr = fx.seed(&[
        t.to_str().unwrap(),
        "--data",
        d.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--send-timeout",
        "6",
    ]);
    let ih = info_hash_of(&t);
    let stalled_start = Instant::now();
    let stalled_msgs = interested_and_every_request(PIECES, PIECE);
    let mut stalled = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&handshake(&ih, true)).unwrap();
        s.write_all(&stalled_msgs).unwrap();
        stalled.push(s); // never read
    }
    // Let them take the slots and fill their buffers.
    std::thread::sleep(Duration::from_millis(500));
    let mut good = TcpStream::connect(addr).unwrap();
    good.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    good.write_all(&handshake(&ih, false)).unwrap();
    good.write_all(&[0, 0, 0, 1, 2]).unwrap();
    let asked = Instant::now();
    let mut hs = [0u8; 68];
    good.read_exact(&mut hs).unwrap();
    read_until(&mut good, 1); // unchoke (a read timeout fails the test)
    let waited = asked.elapsed();
    assert!(
        waited <= round,
        "the good peer waited {waited:?} to be unchoked (round {round:?})"
    );
    let src = std::fs::read(d.join("f.bin")).unwrap();
    let mut req = Vec::new();
    for begin in (0..PIECE).step_by(16384) {
        req.extend_from_slice(&[0, 0, 0, 13, 6]);
        req.extend_from_slice(&5u32.to_be_bytes());
        req.extend_from_slice(&begin.to_be_bytes());
        req.extend_from_slice(&16384u32.to_be_bytes());
    }
    good.write_all(&req).unwrap();
    for _ in 0..PIECE / 16384 {
        let p = read_until(&mut good, 7);
        let begin = u32::from_be_bytes(p[4..8].try_into().unwrap()) as usize;
        let off = 5 * PIECE as usize + begin;
        assert_eq!(
            &p[8..],
            &src[off..off + 16384],
            "block at {begin} of piece 5"
        );
    }
    // The stalled peers whose sends made no progress for 6 s are dropped.
    let deadline = stalled_start + send_timeout + Duration::from_secs(3);
    std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let n = |k: &str| c["counters"][k].as_u64().unwrap();
    assert_eq!(n("send_stalls"), 200, "{c}");
    assert!(n("peers_snubbed") >= 200, "{c}");
    assert_eq!(n("peers_dropped_garbage"), 0, "{c}");
    assert_eq!(n("peers_now"), 1, "only the good peer is left: {c}");
    drop(stalled);
}

/// The tracker answers announces with compact peers and scrapes (BEP 48) over HTTP.
#[test]
fn tracker_over_http() {
    let mut fx = Fixture::new("tracker");
    let url = fx.tracker();
    let base = url
        .trim_end_matches("/announce")
        .trim_start_matches("http://");
    let get = |path: &str| {
        let mut s = TcpStream::connect(base).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .unwrap();
        let mut b = Vec::new();
        s.read_to_end(&mut b).unwrap();
        b
    };
    let ih = "%01".repeat(20);
    let r = get(&format!(
        "/announce?info_hash={ih}&peer_id=-AA0000-aaaaaaaaaaaa&port=5000&left=0&uploaded=1&compact=1"
    ));
    assert!(r.starts_with(b"HTTP/1.1 200"));
    let r = get(&format!(
        "/announce?info_hash={ih}&peer_id=-BB0000-bbbbbbbbbbbb&port=6000&left=10&compact=1"
    ));
    let want = [b"5:peers6:".as_slice(), &[127, 0, 0, 1, 0x13, 0x88]].concat();
    assert!(
        r.windows(want.len()).any(|w| w == want.as_slice()),
        "{}",
        String::from_utf8_lossy(&r)
    );
    let s = get(&format!("/scrape?info_hash={ih}"));
    assert!(
        s.windows(11).any(|w| w == b"completei1e"),
        "{}",
        String::from_utf8_lossy(&s)
    );
    let bad = get("/announce?info_hash=short");
    assert!(bad.windows(14).any(|w| w == b"failure reason"));
}

/// `s` as a bencoded string.
fn bstr(s: &str) -> String {
    format!("{}:{s}", s.len())
}

/// BEP 12 and 15: a torrent with only an `announce-list` (as anacrolix's `create` makes) is
/// announced, tier by tier: the first tier's wss:// URL is skipped (said once) and its
/// http:// tracker refuses connections, so the seeder falls through to the second tier, a
/// udp:// tracker (`iolab tracker` serves both), where a leecher then finds it. Before, such
/// a torrent was never announced, without a word.
#[test]
fn announce_list_tiers_fall_through_to_a_udp_tracker() {
    let _g = lock();
    let (mut fx, d, t) = small_fixture("announcelist");
    let http = fx.tracker();
    let hostport = http
        .trim_start_matches("http://")
        .trim_end_matches("/announce");
    let udp = format!("udp://{hostport}");
    let dead = format!("http://127.0.0.1:{}/announce", free_port().unwrap());
    // The created torrent has no announce: an announce-list goes in before "created by"
    // (the first key; BEP 3 dictionaries are sorted).
    let bytes = std::fs::read(&t).unwrap();
    assert!(bytes.starts_with(b"d10:created by"), "{:?}", &bytes[..20]);
    let list = format!(
        "13:announce-listll{}{}el{}ee",
        bstr("wss://tracker.example/announce"),
        bstr(&dead),
        bstr(&udp)
    );
    let out = [b"d", list.as_bytes(), &bytes[1..]].concat();
    let listed = fx.dir.join("listed.torrent");
    std::fs::write(&listed, &out).unwrap();
    assert_eq!(
        info_hash_of(&listed),
        info_hash_of(&t),
        "the info is unchanged"
    );
    let seed = fx.seed(&[listed.to_str().unwrap(), "--data", d.to_str().unwrap()]);
    let ih: String = info_hash_of(&t)
        .iter()
        .map(|b| format!("%{b:02x}"))
        .collect();
    let want = [
        b"5:peers6:".as_slice(),
        &[127, 0, 0, 1],
        &seed.port().to_be_bytes(),
    ]
    .concat();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut s = TcpStream::connect(hostport).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "GET /announce?info_hash={ih}&peer_id=-LL0000-llllllllllll&port=7777&left=5 HTTP/1.1\r\n\r\n"
        )
        .unwrap();
        let mut r = Vec::new();
        let _ = s.read_to_end(&mut r);
        if r.windows(want.len()).any(|w| w == want.as_slice()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the seeder never reached the udp tracker: {}\n{}",
            String::from_utf8_lossy(&r),
            fx.seed_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = fx.seed_log();
    assert_eq!(
        log.matches("wss://tracker.example/announce skipped")
            .count(),
        1,
        "{log}"
    );
}

/// BEP 15 with a real client: the torrent's only tracker is `iolab tracker` over UDP (made
/// by mktorrent, not by us); the seeder announces there, and aria2c finds it there and
/// downloads byte for byte. aria2c speaks to UDP trackers only through its DHT socket
/// ("udp is not supported yet" without it), so its DHT is on, with no node to reach here
/// (LPD and PEX off): the tracker is the only way it learns of the seeder.
#[test]
fn aria2c_finds_the_seeder_through_a_udp_tracker() {
    let _g = lock();
    if !have("mktorrent", "mktorrent") || !Client::Aria2.available() {
        return;
    }
    let mut fx = Fixture::new("udptracker");
    let data = fx.data_of(2 << 20);
    let http = fx.tracker();
    let udp = format!(
        "udp://{}/announce",
        http.trim_start_matches("http://")
            .trim_end_matches("/announce")
    );
    let (torrent, dl) = seed_mktorrent(&mut fx, &data, &udp, "16");
    let (src, got) = (data.join("multi"), dl.join("multi"));
    let want = Want {
        src: &src,
        got: &got,
        limit: Duration::from_secs(90),
        skip_empty: false,
    };
    let mut aria = Client::Aria2.start(&fx, &torrent, &dl);
    aria.arg("--enable-dht=true")
        .arg(format!("--dht-listen-port={}", free_port().unwrap()));
    let ok = fx.run_until_complete(&mut aria, want);
    assert!(
        ok,
        "aria2c did not find the seeder through {udp}; seed log:\n{}",
        fx.seed_log()
    );
}

/// One BEP 10 extended message: length, id 20, extended id, payload.
fn extended(id: u8, payload: &[u8]) -> Vec<u8> {
    let mut m = ((payload.len() + 2) as u32).to_be_bytes().to_vec();
    m.extend_from_slice(&[20, id]);
    m.extend_from_slice(payload);
    m
}

/// The value of integer key `key` in a bencoded dictionary's bytes.
fn bint(d: &[u8], key: &str) -> Option<u64> {
    let k = format!("{}:{key}i", key.len());
    let at = d.windows(k.len()).position(|w| w == k.as_bytes())? + k.len();
    let end = at + d[at..].iter().position(|&b| b == b'e')?;
    std::str::from_utf8(&d[at..end]).ok()?.parse().ok()
}

/// BEP 9: `iolab seed` prints the torrent's magnet link, and a client that has only the
/// info hash fetches the info dictionary from it (a raw-socket client here: extension
/// handshake, ut_metadata requests of 16 KiB pieces, one out of range), whose SHA-1 is the
/// info hash. Before, no client could start from a magnet link.
#[test]
fn a_magnet_client_fetches_the_metadata() {
    let _g = lock();
    // 2,000 pieces of 16 KiB: an info dictionary of 40 KB, 3 metadata pieces.
    let (mut fx, d, t) = fixture_of("magnet", 2_000 * 16384, "16K");
    let log = std::fs::File::create(fx.dir.join("seed.log")).unwrap();
    let i = fx.spawn(
        Command::new(BIN)
            .arg("seed")
            .arg(&t)
            .args(["--data", d.to_str().unwrap(), "--no-check"])
            .args([
                "--listen",
                "127.0.0.1:0",
                "--tracker",
                "udp://127.0.0.1:9/x",
            ])
            .stdout(Stdio::piped())
            .stderr(log),
    );
    let mut out = BufReader::new(fx.children[i].stdout.take().unwrap());
    let (mut first, mut second) = (String::new(), String::new());
    out.read_line(&mut first).unwrap();
    out.read_line(&mut second).unwrap();
    let addr: SocketAddr = first
        .split(" on ")
        .last()
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let ih = info_hash_of(&t);
    let hex: String = ih.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        second.trim(),
        format!(
            "magnet magnet:?xt=urn:btih:{hex}&dn=f%2Ebin&tr=udp%3A%2F%2F127%2E0%2E0%2E1%3A9%2Fx"
        ),
    );
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hs = handshake(&ih, true);
    hs[25] |= 0x10; // BEP 10
    s.write_all(&hs).unwrap();
    s.write_all(&extended(0, b"d1:md11:ut_metadatai3eee"))
        .unwrap();
    let mut theirs = [0u8; 68];
    s.read_exact(&mut theirs).unwrap();
    assert_ne!(theirs[25] & 0x10, 0, "the seeder speaks BEP 10");
    let h = read_until(&mut s, 20);
    assert_eq!(h[0], 0, "the extension handshake first");
    let our_id = bint(&h[1..], "ut_metadata").expect("ut_metadata offered") as u8;
    let size = bint(&h[1..], "metadata_size").unwrap() as usize;
    let pieces = size.div_ceil(16384);
    assert_eq!(pieces, 3, "{size} bytes");
    let mut req = Vec::new();
    for p in 0..=pieces {
        req.extend(extended(
            our_id,
            format!("d8:msg_typei0e5:piecei{p}ee").as_bytes(),
        ));
    }
    s.write_all(&req).unwrap();
    let mut info = vec![0u8; size];
    for p in 0..=pieces {
        let m = read_until(&mut s, 20);
        assert_eq!(m[0], 3, "sent with the id we asked for");
        let head = format!("d8:msg_typei1e5:piecei{p}e10:total_sizei{size}ee");
        if p == pieces {
            assert_eq!(&m[1..], format!("d8:msg_typei2e5:piecei{p}ee").as_bytes());
            break;
        }
        assert!(m[1..].starts_with(head.as_bytes()), "piece {p}");
        let data = &m[1 + head.len()..];
        assert!(data.len() == 16384 || p == pieces - 1, "{}", data.len());
        info[p * 16384..p * 16384 + data.len()].copy_from_slice(data);
    }
    let dump = fx.dir.join("info.bin");
    std::fs::write(&dump, &info).unwrap();
    let sum = Command::new("sha1sum").arg(&dump).output().unwrap();
    let sum = String::from_utf8_lossy(&sum.stdout);
    assert_eq!(
        sum.split_whitespace().next(),
        Some(hex.as_str()),
        "SHA-1 of the metadata"
    );
}

/// `iolab seed bench` with libtorrent: every leecher of the swarm connects to libtorrent's
/// seeder too (both profiles) and downloads from it, in plaintext and under MSE/RC4 (our
/// initiator against libtorrent's responder and ours), and the JSON has a summary per
/// seeder and point and Hekate's ratios to libtorrent.
/// Before, libtorrent's torrent was still paused by its session queue when the swarm
/// arrived, and every leecher was turned away (0 connected).
#[test]
fn bench_swarm_connects_to_libtorrent_and_hekate() {
    let _g = lock();
    if !Client::Libtorrent.available() {
        return;
    }
    let fx = Fixture::new("bench");
    let json = fx.dir.join("bench.json");
    let out = Command::new(BIN)
        .args([
            "seed",
            "bench",
            "--peers",
            "6",
            "--secs",
            "0.5",
            "--repeats",
            "1",
        ])
        .args([
            "--size-mib",
            "2",
            "--piece-length",
            "64K",
            "--warm-only",
            "--disks",
            "mmap",
            "--encryption",
            "off,rc4",
        ])
        .arg("--dir")
        .arg(fx.dir.join("data"))
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let seeders: Vec<String> = rows
        .iter()
        .map(|r| format!("{} {}", r["seeder"].as_str().unwrap(), r["encryption"]))
        .collect();
    assert_eq!(
        seeders,
        [
            "hekate-mmap \"off\"",
            "libtorrent-default \"off\"",
            "libtorrent-hps \"off\"",
            "hekate-mmap \"rc4\"",
            "libtorrent-default \"rc4\"",
            "libtorrent-hps \"rc4\""
        ],
        "{text}"
    );
    for r in rows {
        assert_eq!(r["connected"], 6, "{r}");
        assert!(r["bytes"].as_u64().unwrap() > 0, "{r}");
        assert!(r["distinct_bytes"].as_u64().unwrap() > 0, "{r}");
    }
    assert_eq!(v["summary"].as_array().unwrap().len(), 6);
    let versus = v["versus"].as_array().unwrap();
    assert_eq!(versus.len(), 2, "{text}");
    assert!(versus.iter().all(|x| x["cpu_ratio"].as_f64().is_some()));
    assert!(text.contains("against libtorrent"), "{text}");
    assert_eq!(v["config"]["encryption"], serde_json::json!(["off", "rc4"]));
    // The libtorrent configuration is printed with the results and kept in the JSON.
    assert!(text.contains("peer_turnover"), "{text}");
    assert_eq!(
        v["libtorrent_settings"]["libtorrent-hps"]["peer_turnover"],
        0
    );
    assert!(text.contains("in_enc_policy"), "{text}");
}

// ------------------------------------------------- BEP 52 v2/hybrid creation, https trackers

/// Makes a torrent of argv[1] into argv[2] with python3-libtorrent: piece size argv[3],
/// `v2` (v2-only) or `hybrid`, no tracker.
const LIBTORRENT_MAKE: &str = r#"
import sys, os, libtorrent as lt
src, out, piece, mode = sys.argv[1:5]
fs = lt.file_storage()
lt.add_files(fs, src)
t = lt.create_torrent(fs, int(piece), flags=lt.create_torrent.v2_only if mode == 'v2' else 0)
lt.set_piece_hashes(t, os.path.dirname(os.path.abspath(src)))
open(out, 'wb').write(lt.bencode(t.generate()))
"#;

/// For each .torrent in argv: the v1 and v2 info hashes libtorrent computes ('-' for none),
/// its private flag, comment and web seeds, on one line.
const LIBTORRENT_READ: &str = r#"
import sys, libtorrent as lt
for p in sys.argv[1:]:
    ti = lt.torrent_info(p)
    ih = ti.info_hashes()
    print(ih.v1.to_bytes().hex() if ih.has_v1() else '-',
          ih.v2.to_bytes().hex() if ih.has_v2() else '-',
          ti.priv(), repr(ti.comment()), ','.join(w['url'] for w in ti.web_seeds()))
"#;

/// `iolab seed --create-only` of `src` into `out` with `extra` flags: (info hash, v2 info
/// hash or "-") from its line.
fn create_torrent(src: &Path, out: &Path, extra: &[&str]) -> (String, String) {
    let o = Command::new(BIN)
        .arg("seed")
        .args(["--create-only", "--piece-length", "32K", "--torrent"])
        .arg(out)
        .args(extra)
        .arg("--")
        .arg(src)
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{line}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let after = |tag: &str| {
        line.split(tag)
            .nth(1)
            .and_then(|s| s.split([',', ' ', ')']).next())
            .map_or("-".to_string(), |h| h.trim().to_string())
    };
    (after(", info hash "), after("v2 info hash "))
}

/// The lines of [`LIBTORRENT_READ`] for `torrents`.
fn libtorrent_reads(torrents: &[&Path]) -> Vec<String> {
    let o = Command::new("/usr/bin/python3")
        .args(["-c", LIBTORRENT_READ])
        .args(torrents)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// `iolab seed torrent --data data`: its first line (the seeder is left to the fixture).
fn seed_line(fx: &mut Fixture, torrent: &Path, data: &Path) -> String {
    let i = fx.spawn(
        Command::new(BIN)
            .arg("seed")
            .arg(torrent)
            .arg("--data")
            .arg(data)
            .args(["--listen", "127.0.0.1:0", "--status-every", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    first_line(&mut fx.children[i])
}

/// Issue 47: `--v2` and `--hybrid` torrents, multi- and single-file, are read by libtorrent
/// with the info hashes we print, and are byte for byte the info dictionaries libtorrent
/// makes of the same files (the same info hashes); libtorrent's own v2 and hybrid torrents
/// load in Hekate (data checked by the merkle trees for v2-only). `--private`, `--comment`
/// and `--web-seed` are read back by libtorrent.
#[test]
fn v2_and_hybrid_torrents_are_libtorrents_own() {
    let _g = lock();
    if !Client::Libtorrent.available() {
        return;
    }
    let mut fx = Fixture::new("v2make");
    let data = fx.data_of(1 << 20);
    for (what, mode) in [
        ("multi", "v2"),
        ("multi", "hybrid"),
        ("single.bin", "v2"),
        ("single.bin", "hybrid"),
    ] {
        let src = data.join(what);
        let ours = fx.dir.join(format!("ours-{what}-{mode}.torrent"));
        let theirs = fx.dir.join(format!("lt-{what}-{mode}.torrent"));
        let (ih, v2) = create_torrent(&src, &ours, &[&format!("--{mode}")]);
        assert_eq!(v2.len(), 64, "{what} {mode}: {v2}");
        common::run_ok(
            Command::new("/usr/bin/python3")
                .args(["-c", LIBTORRENT_MAKE])
                .arg(&src)
                .arg(&theirs)
                .args(["32768", mode]),
        );
        let read = libtorrent_reads(&[&ours, &theirs]);
        let want_v1 = if mode == "v2" { "-" } else { ih.as_str() };
        assert!(
            read[0].starts_with(&format!("{want_v1} {v2} False")),
            "{what} {mode}: ours {ih} {v2}, libtorrent reads {}",
            read[0]
        );
        if mode == "v2" {
            assert_eq!(
                ih,
                v2[..40],
                "the v2-only info hash is the SHA-256 truncated"
            );
        }
        assert_eq!(read[0], read[1], "{what} {mode}: ours, then libtorrent's");
        let line = seed_line(&mut fx, &theirs, &data);
        assert!(
            line.contains(&format!("(info hash {ih},")),
            "{what} {mode}: {line}"
        );
    }
    let ours = fx.dir.join("extras.torrent");
    let ws = "http://127.0.0.1:1/ws/";
    let (_, v2) = create_torrent(
        &data.join("multi"),
        &ours,
        &[
            "--hybrid",
            "--private",
            "--comment",
            "made here",
            "--web-seed",
            ws,
        ],
    );
    let read = libtorrent_reads(&[&ours]);
    assert!(
        read[0].ends_with(&format!("{v2} True 'made here' {ws}")),
        "{}",
        read[0]
    );
}

/// A v2-only torrent made by `iolab seed --v2` is seeded to libtorrent, which downloads
/// it byte for byte (the handshake and the tracker carry the truncated SHA-256; libtorrent
/// checks each piece against the torrent's piece layers). libtorrent 2.0.8 got 147 of 148
/// pieces: it asks for the last piece whole (the last file padded to a piece boundary, as
/// BEP 52's reference implementation lays it out) and we refused it as past the end.
#[test]
fn a_v2_only_torrent_is_seeded_to_libtorrent() {
    let _g = lock();
    if !Client::Libtorrent.available() {
        return;
    }
    let mut fx = Fixture::new("v2seed");
    let data = fx.data_of(2 << 20);
    let src = data.join("multi");
    let url = fx.tracker();
    let torrent = fx.dir.join("v2.torrent");
    fx.seed(&[
        "--v2",
        "--tracker",
        &url,
        "--torrent",
        torrent.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    let dl = fx.dir.join("dl");
    std::fs::create_dir_all(&dl).unwrap();
    let got = dl.join("multi");
    let want = Want {
        src: &src,
        got: &got,
        limit: Duration::from_secs(60),
        skip_empty: false,
    };
    let ok = fx.download(Client::Libtorrent, &torrent, &dl, want);
    assert!(
        ok,
        "libtorrent did not get the v2 torrent; seed log:\n{}",
        fx.seed_log()
    );
}

/// A libtorrent leecher from a magnet link: argv[1] the link, argv[2] the download
/// directory, argv[3] its port, argv[4] the seeder's address (the tracker is slower to
/// tell) or `-` (the tracker's peers only), argv[5] (optional) a tracker to add; its alerts
/// on stderr; exits 0 when done.
const LIBTORRENT_MAGNET_LEECHER: &str = r#"
import sys, time, libtorrent as lt
ses = lt.session({'listen_interfaces': '127.0.0.1:' + sys.argv[3], 'enable_dht': False,
                  'enable_lsd': False, 'enable_upnp': False, 'enable_natpmp': False,
                  'alert_mask': lt.alert.category_t.error_notification
                      | lt.alert.category_t.peer_notification
                      | lt.alert.category_t.status_notification})
p = lt.parse_magnet_uri(sys.argv[1])
p.save_path = sys.argv[2]
h = ses.add_torrent(p)
if len(sys.argv) > 5:
    h.add_tracker({'url': sys.argv[5]})
if sys.argv[4] != '-':
    ip, port = sys.argv[4].rsplit(':', 1)
    h.connect_peer((ip, int(port)))
deadline = time.time() + 100
while time.time() < deadline:
    for a in ses.pop_alerts():
        print(a.message(), file=sys.stderr)
    if h.status().is_seeding:
        sys.exit(0)
    time.sleep(0.2)
sys.exit(1)
"#;

/// BEP 52 from a magnet link: libtorrent 2.0.8 is given only the `urn:btmh:` link `iolab
/// seed` prints for a v2-only torrent; it gets the info dictionary (BEP 9) and then every
/// file's piece layer by hash requests, which we answer from the merkle trees, and checks
/// each piece against them. 16 KiB pieces: `a.bin`'s 577 pieces take two requests (512,
/// then the rest padded to 128); 256 KiB pieces: one. Compared byte for byte.
#[test]
fn a_v2_only_torrent_is_seeded_to_libtorrent_from_its_magnet_link() {
    let _g = lock();
    if !Client::Libtorrent.available() {
        return;
    }
    for piece in ["16K", "256K"] {
        let mut fx = Fixture::new("v2magnet");
        let data = fx.data_of(9 << 20);
        let src = data.join("multi");
        let url = fx.tracker();
        let torrent = fx.dir.join("v2.torrent");
        let json = fx.dir.join("seed.json");
        let lines = fx.seed_lines(
            &[
                "--json",
                json.to_str().unwrap(),
                "--v2",
                "--piece-length",
                piece,
                "--tracker",
                &url,
                "--torrent",
                torrent.to_str().unwrap(),
                src.to_str().unwrap(),
            ],
            2,
        );
        let addr = lines[0]
            .split(" on ")
            .last()
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap();
        let meta = iolab_seeder::metainfo::Meta::load(&torrent, &src).unwrap();
        let v2 = meta.v2.as_ref().unwrap().info_hash_hex();
        let magnet = lines[1]
            .strip_prefix("magnet ")
            .unwrap_or_else(|| panic!("{lines:?}"));
        assert!(
            magnet.starts_with(&format!("magnet:?xt=urn:btmh:1220{v2}&dn=multi")),
            "{magnet}"
        );
        let dl = fx.dir.join("dl");
        std::fs::create_dir_all(&dl).unwrap();
        let lt_log = std::fs::File::create(fx.dir.join("lt.log")).unwrap();
        let port = free_port().unwrap().to_string();
        let i = fx.spawn(
            Command::new("/usr/bin/python3")
                .args(["-c", LIBTORRENT_MAGNET_LEECHER, magnet])
                .arg(&dl)
                .args([&port, addr])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(lt_log),
        );
        let got = dl.join("multi");
        let ok = wait_complete(
            &src,
            &got,
            &mut fx.children[i],
            Duration::from_secs(100),
            false,
        );
        assert!(
            ok,
            "libtorrent did not get the v2 torrent ({piece} pieces) from its magnet link; its log:\n{}\nseed log:\n{}",
            std::fs::read_to_string(fx.dir.join("lt.log")).unwrap_or_default(),
            fx.seed_log()
        );
        std::thread::sleep(Duration::from_millis(1100)); // the counters are written every second
        let c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default())
                .unwrap_or_default();
        let n = |k: &str| c["counters"][k].as_u64().unwrap_or(0);
        // a.bin's piece layer (two requests at 16 KiB pieces), sub/b.bin's (19 or 2 pieces).
        let want = if piece == "16K" { 3 } else { 2 };
        assert!(
            n("hash_requests_served") >= want,
            "the piece layers came by hash requests: {c}"
        );
        eprintln!(
            "v2 magnet ({piece} pieces): libtorrent downloaded byte for byte; hash requests served {}, rejected {}",
            n("hash_requests_served"),
            n("hash_requests_rejected")
        );
    }
}

/// A hybrid from a v2 magnet link (`urn:btmh:` only) and the tracker alone: the seeder
/// announces under both info hashes, libtorrent 2.0.8 finds it under the v2 one, connects
/// with the truncated v2 hash, gets the metadata (SHA-256 checked) and the data, byte for
/// byte.
#[test]
fn a_hybrid_is_found_by_its_v2_hash_and_downloaded_from_a_btmh_magnet_link() {
    let _g = lock();
    if !Client::Libtorrent.available() {
        return;
    }
    let mut fx = Fixture::new("hybridbtmh");
    let data = fx.data_of(2 << 20);
    let src = data.join("multi");
    let url = fx.tracker();
    let torrent = fx.dir.join("h.torrent");
    let json = fx.dir.join("seed.json");
    let lines = fx.seed_lines(
        &[
            "--json",
            json.to_str().unwrap(),
            "--hybrid",
            "--tracker",
            &url,
            "--torrent",
            torrent.to_str().unwrap(),
            src.to_str().unwrap(),
        ],
        2,
    );
    let meta = iolab_seeder::metainfo::Meta::load(&torrent, &src).unwrap();
    let v2 = meta.v2.as_ref().unwrap().info_hash_hex();
    // The printed link names both hashes (BEP 52); the download below uses the v2 one alone.
    let both = format!(
        "magnet magnet:?xt=urn:btih:{}&xt=urn:btmh:1220{v2}&dn=multi&tr=",
        meta.info_hash_hex()
    );
    assert!(lines[1].starts_with(&both), "{lines:?}");
    let magnet = format!("magnet:?xt=urn:btmh:1220{v2}&dn=multi");
    let dl = fx.dir.join("dl");
    std::fs::create_dir_all(&dl).unwrap();
    let lt_log = std::fs::File::create(fx.dir.join("lt.log")).unwrap();
    let port = free_port().unwrap().to_string();
    let i = fx.spawn(
        Command::new("/usr/bin/python3")
            .args(["-c", LIBTORRENT_MAGNET_LEECHER, &magnet])
            .arg(&dl)
            .args([&port, "-", &url])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(lt_log),
    );
    let ok = wait_complete(
        &src,
        &dl.join("multi"),
        &mut fx.children[i],
        Duration::from_secs(60),
        false,
    );
    assert!(
        ok,
        "libtorrent did not get the hybrid from its btmh magnet link; its log:\n{}\nseed log:\n{}",
        std::fs::read_to_string(fx.dir.join("lt.log")).unwrap_or_default(),
        fx.seed_log()
    );
}

/// A hybrid is reached by its truncated v2 hash too (a v2 client's handshake, BEP 52): the
/// seeder answers with that hash and the v2 bit, and serves a hash request for the piece
/// layer of its big file with the uncles that prove it against the file's root; a request
/// out of bounds gets a hash reject with the same fields, and so do those past
/// `MAX_HASH_ANSWERS` in one read.
#[test]
fn a_hybrid_answers_a_v2_handshake_and_hash_requests() {
    let _g = lock();
    let mut fx = Fixture::new("hybridv2");
    let data = fx.data_of(2 << 20);
    let src = data.join("multi");
    let torrent = fx.dir.join("h.torrent");
    let addr = fx.seed(&[
        "--hybrid",
        "--piece-length",
        "16K",
        "--tracker",
        "udp://127.0.0.1:9/x",
        "--torrent",
        torrent.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    let meta = iolab_seeder::metainfo::Meta::load(&torrent, &src).unwrap();
    let hashes = meta.info_hashes();
    assert_eq!(hashes.len(), 2, "a hybrid has two info hashes");
    let v2: [u8; 20] = hashes[1];
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hs = handshake(&v2, true);
    hs[27] |= 0x10; // BEP 52: we have the v2 side
    s.write_all(&hs).unwrap();
    let mut theirs = [0u8; 68];
    s.read_exact(&mut theirs).unwrap();
    assert_eq!(&theirs[28..48], &v2[..], "answered with the hash we used");
    assert_ne!(theirs[27] & 0x10, 0, "the v2 bit");
    // a.bin: 2 MiB + 12345 bytes, 129 pieces of 16 KiB (256 in the padded layer).
    let file = meta
        .v2
        .as_ref()
        .unwrap()
        .files
        .iter()
        .find(|f| f.piece_layer.len() == 129);
    let root = file.expect("a.bin's piece layer").root.unwrap();
    let req = iolab_seeder::wire::HashReq {
        root,
        base: 0,
        index: 128,
        length: 128,
        proof_layers: 7,
    };
    let mut out = Vec::new();
    iolab_seeder::wire::encode(&iolab_seeder::wire::Message::HashRequest(req), &mut out);
    let mut bad = Vec::new();
    let too_many = iolab_seeder::wire::HashReq {
        proof_layers: 8,
        ..req
    };
    iolab_seeder::wire::encode(
        &iolab_seeder::wire::Message::HashRequest(too_many),
        &mut bad,
    );
    s.write_all(&out).unwrap();
    let got = read_until(&mut s, 22);
    assert_eq!(&got[..48], &out[5..], "the request's fields repeated");
    assert_eq!(
        got.len() - 48,
        32 * (128 + 1),
        "128 hashes and the one uncle"
    );
    let answer: Vec<[u8; 32]> = got[48..]
        .chunks(32)
        .map(|c| c.try_into().unwrap())
        .collect();
    assert_eq!(&answer[..1], &file.unwrap().piece_layer[128..]);
    assert_eq!(
        iolab_seeder::hashes::root_of_answer(&req, &answer),
        Some(root)
    );
    s.write_all(&bad).unwrap();
    let rejected = read_until(&mut s, 23);
    assert_eq!(&rejected[..], &bad[5..]);
    // 20 valid requests in one write (one loopback segment, read at once): 16 answered
    // before the next send, the rest rejected, so a peer cannot queue unbounded hashes.
    let limit = iolab_seeder::seed::MAX_HASH_ANSWERS;
    s.write_all(&out.repeat(limit + 4)).unwrap();
    let (mut served, mut refused) = (0, 0);
    while served + refused < limit + 4 {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut m = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut m).unwrap();
        match m.first() {
            Some(22) => served += 1,
            Some(23) => refused += 1,
            _ => {}
        }
    }
    assert_eq!((served, refused), (limit, 4));
}

/// A hybrid torrent made by `iolab seed --hybrid` (pad files) is seeded by its v1 side to
/// ctorrent, a v1-only client, which downloads every real file byte for byte.
#[test]
fn a_hybrid_torrent_we_make_is_seeded_to_a_v1_client() {
    let _g = lock();
    if !Client::Ctorrent.available() {
        return;
    }
    let mut fx = Fixture::new("hybridseed");
    let data = fx.data_of(2 << 20);
    let src = data.join("multi");
    let url = fx.tracker();
    let torrent = fx.dir.join("hybrid.torrent");
    fx.seed(&[
        "--hybrid",
        "--tracker",
        &url,
        "--torrent",
        torrent.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    assert!(
        std::fs::read(&torrent)
            .unwrap()
            .windows(4)
            .any(|w| w == b".pad"),
        "a hybrid has pad files"
    );
    let dl = fx.dir.join("dl");
    std::fs::create_dir_all(&dl).unwrap();
    let got = dl.join("multi");
    let want = Want {
        src: &src,
        got: &got,
        limit: Duration::from_secs(90),
        skip_empty: true,
    };
    let ok = fx.download(Client::Ctorrent, &torrent, &dl, want);
    assert!(
        ok,
        "ctorrent did not get the hybrid torrent; seed log:\n{}",
        fx.seed_log()
    );
}

/// A TLS terminator for the https tracker test: accepts on 127.0.0.1, forwards each
/// connection's request to the plain HTTP `backend` and its reply back, one connection at
/// a time, until dropped.
struct TlsFront {
    addr: SocketAddr,
    handshakes: std::sync::Arc<AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn tls_front(cert: &Path, key: &Path, backend: SocketAddr) -> TlsFront {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let cfg = std::sync::Arc::new(cfg);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let handshakes = std::sync::Arc::new(AtomicUsize::new(0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (h, s) = (handshakes.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            let Ok((sock, _)) = l.accept() else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            let _ = sock.set_nonblocking(false);
            let _ = sock.set_read_timeout(Some(Duration::from_secs(5)));
            let conn = rustls::ServerConnection::new(cfg.clone()).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, sock);
            let mut req = Vec::new();
            let mut buf = [0u8; 2048];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
                match tls.read(&mut buf) {
                    Ok(n) if n > 0 => req.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            if !req.ends_with(b"\r\n\r\n") {
                continue; // the handshake failed (a client that refused our certificate)
            }
            h.fetch_add(1, Ordering::Relaxed);
            let mut reply = Vec::new();
            if let Ok(mut b) = TcpStream::connect(backend) {
                let _ = b.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = b.write_all(&req);
                let _ = b.read_to_end(&mut reply);
            }
            let _ = tls.write_all(&reply);
            tls.conn.send_close_notify();
            let _ = tls.flush();
        }
    });
    TlsFront {
        addr,
        handshakes,
        stop,
        thread: Some(thread),
    }
}

/// Issue 47: an https:// tracker. `iolab tracker` behind a TLS terminator with a
/// certificate from a CA the test makes (openssl): the seeder given that CA
/// (`--tracker-ca`) announces through it (the tracker then lists it); a seeder checking
/// against the default roots refuses the certificate and says so.
#[test]
fn an_https_tracker_is_announced_to_with_its_ca() {
    let _g = lock();
    if !have("openssl", "openssl") {
        return;
    }
    let mut fx = Fixture::new("https");
    let d = fx.dir.clone();
    let sh =
        |script: &str| common::run_ok(Command::new("sh").arg("-c").arg(script).current_dir(&d));
    sh(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout ca.key -out ca.pem -days 2 -subj /CN=iolab-test-ca 2>/dev/null",
    );
    sh("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout srv.key \
        -out srv.csr -subj /CN=127.0.0.1 2>/dev/null && \
        printf 'subjectAltName=IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\nextendedKeyUsage=serverAuth\\n' > ext && \
        openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem \
        -days 2 -extfile ext 2>/dev/null");
    let plain = fx.tracker();
    let backend: SocketAddr = plain
        .trim_start_matches("http://")
        .trim_end_matches("/announce")
        .parse()
        .unwrap();
    let front = tls_front(&d.join("srv.pem"), &d.join("srv.key"), backend);
    let url = format!("https://127.0.0.1:{}/announce", front.addr.port());
    std::fs::write(d.join("f.bin"), random_bytes(100_000, 9)).unwrap();
    let torrent = d.join("f.torrent");
    let ca = d.join("ca.pem");
    fx.seed(&[
        "--tracker",
        &url,
        "--tracker-ca",
        ca.to_str().unwrap(),
        "--torrent",
        torrent.to_str().unwrap(),
        d.join("f.bin").to_str().unwrap(),
    ]);
    let ih: String = info_hash_of(&torrent)
        .iter()
        .map(|b| format!("%{b:02x}"))
        .collect();
    let scrape = || {
        let mut s = TcpStream::connect(backend).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let req = format!("GET /scrape?info_hash={ih} HTTP/1.1\r\nHost: x\r\n\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut b = Vec::new();
        let _ = s.read_to_end(&mut b);
        b
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !scrape().windows(13).any(|w| w == b"incompletei1e") {
        assert!(
            Instant::now() < deadline,
            "the seeder never reached the tracker through TLS; seed log:\n{}",
            fx.seed_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(front.handshakes.load(Ordering::Relaxed) >= 1);
    // The default roots do not know our CA: the announce fails on the certificate.
    let mut other = Fixture::new("https-noca");
    other.seed(&[
        torrent.to_str().unwrap(),
        "--data",
        d.to_str().unwrap(),
        "--tracker",
        &url,
    ]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !other.seed_log().contains("announce failed") {
        assert!(Instant::now() < deadline, "{}", other.seed_log());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        other.seed_log().contains("invalid peer certificate"),
        "{}",
        other.seed_log()
    );
    drop(front);
}

// ------------------------------------------------- many torrents, dual stack (issue 47)

/// Makes a torrent of `src` into `out` (`--create-only`, 16 KiB pieces, `extra` flags).
fn make_torrent(src: &Path, out: &Path, extra: &[&str]) {
    common::run_ok(
        Command::new(BIN)
            .arg("seed")
            .arg(src)
            .arg("--torrent")
            .arg(out)
            .args(["--create-only", "--piece-length", "16K"])
            .args(extra)
            .stdout(Stdio::null()),
    );
}

/// Starts `iolab seed ARGS` (its own --listen flags in `args`) and reads stdout until a
/// line `until` accepts; returns the lines read.
fn seed_until(fx: &mut Fixture, args: &[&str], until: impl Fn(&str) -> bool) -> Vec<String> {
    let log = std::fs::File::create(fx.dir.join("seed.log")).unwrap();
    let i = fx.spawn(
        Command::new(BIN)
            .arg("seed")
            .args(args)
            .args(["--status-every", "2"])
            .stdout(Stdio::piped())
            .stderr(log),
    );
    let mut r = BufReader::new(fx.children[i].stdout.take().unwrap());
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 {
            panic!("iolab seed ended after {lines:?}; log:\n{}", fx.seed_log());
        }
        let done = until(line.trim());
        lines.push(line.trim().to_string());
        if done {
            break;
        }
    }
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = r.read_to_end(&mut sink);
    });
    lines
}

/// The counters file `json` once it is there.
fn counters(json: &Path) -> serde_json::Value {
    std::thread::sleep(Duration::from_millis(1100));
    serde_json::from_str(&std::fs::read_to_string(json).unwrap_or_default()).unwrap_or_default()
}

/// One process, one port, a directory of torrents (one of them broken, said and skipped):
/// aria2c downloads both good ones through the tracker, byte for byte; a raw MSE peer is
/// routed to the second by its req2 hash; an unknown info hash is closed and counted; each
/// torrent has its own counters, and the totals add up.
#[test]
fn two_torrents_are_seeded_from_one_process_on_one_port() {
    use iolab_seeder::mse::{CRYPTO_PLAINTEXT, CRYPTO_RC4};
    let _g = lock();
    if !Client::Aria2.available() {
        return;
    }
    let mut fx = Fixture::new("many");
    let data = fx.data_of(3 << 20);
    let url = fx.tracker();
    let dir = fx.dir.join("torrents");
    std::fs::create_dir_all(&dir).unwrap();
    let (ta, tb) = (dir.join("a.torrent"), dir.join("b.torrent"));
    make_torrent(&data.join("single.bin"), &ta, &["--tracker", &url]);
    make_torrent(&data.join("multi"), &tb, &["--tracker", &url]);
    std::fs::write(dir.join("broken.torrent"), b"d4:infoi1ee").unwrap();
    let json = fx.dir.join("c.json");
    let args = [
        dir.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--json",
        json.to_str().unwrap(),
    ];
    let lines = seed_until(&mut fx, &args, |l| l.contains(" torrents ("));
    let last = lines.last().unwrap();
    assert!(
        last.starts_with("seeding 2 torrents (1 skipped) on "),
        "{lines:?}"
    );
    let addr: SocketAddr = last.rsplit(' ').next().unwrap().parse().unwrap();
    let starts: Vec<&String> = lines.iter().filter(|l| l.starts_with("seeding ")).collect();
    assert_eq!(
        starts.len(),
        3,
        "a line per torrent, then the count: {lines:?}"
    );
    assert!(
        fx.seed_log().contains("broken.torrent"),
        "the broken torrent is named: {}",
        fx.seed_log()
    );
    for (t, src) in [(&ta, data.join("single.bin")), (&tb, data.join("multi"))] {
        let dl = fx
            .dir
            .join(format!("dl-{}", t.file_stem().unwrap().to_string_lossy()));
        std::fs::create_dir_all(&dl).unwrap();
        let got = dl.join(src.file_name().unwrap());
        let want = Want {
            src: &src,
            got: &got,
            limit: Duration::from_secs(90),
            skip_empty: false,
        };
        assert!(
            fx.download(Client::Aria2, t, &dl, want),
            "aria2c did not get {} byte for byte; seed log:\n{}",
            t.display(),
            fx.seed_log()
        );
    }
    // MSE for the second torrent, on the same port: its handshake comes back.
    let ib = info_hash_of(&tb);
    let mut p = mse_dial(addr, &ib, CRYPTO_RC4 | CRYPTO_PLAINTEXT).expect("MSE routed");
    let mut hs = [0u8; 68];
    p.read_exact(&mut hs).unwrap();
    assert_eq!(&hs[28..48], &ib, "routed by req2 to the second torrent");
    assert!(
        mse_dial(addr, &[0x5A; 20], CRYPTO_RC4).is_none(),
        "MSE for no torrent of ours is closed"
    );
    let mut w = TcpStream::connect(addr).unwrap();
    w.write_all(&handshake(&[7; 20], true)).unwrap();
    assert!(common::closed_by_peer(&mut w, Duration::from_secs(10)));
    let c = counters(&json);
    let ts = c["torrents"].as_array().expect("per-torrent counters");
    assert_eq!(ts.len(), 2, "{c}");
    let mut sum = 0;
    for t in ts {
        let sent = t["counters"]["bytes_sent"].as_u64().unwrap();
        assert!(sent > 3 << 20, "each torrent sent its data: {t}");
        assert!(
            t["counters"]["peers_handshaken"].as_u64().unwrap() >= 1,
            "{t}"
        );
        sum += sent;
    }
    assert_eq!(c["counters"]["bytes_sent"].as_u64(), Some(sum), "{c}");
    assert_eq!(c["counters"]["peers_wrong_torrent"], 2, "{c}");
    // aria2c (MSE by default) and the raw MSE peer, both routed to the second torrent.
    assert_eq!(ts[1]["counters"]["peers_handshaken"], 2, "{c}");
    assert!(
        ts[1]["counters"]["mse_handshaken"].as_u64() >= Some(1),
        "{c}"
    );
}

/// Downloads `argv[1]` into argv[2] from the one peer argv[3]:argv[4] (python3-libtorrent,
/// listening on IPv6 loopback only, over TCP: a peer added by hand is tried over uTP only
/// while uTP is on); exits 0 when done.
const LIBTORRENT_FROM_PEER: &str = r#"
import sys, time, libtorrent as lt
ses = lt.session({'listen_interfaces': '[::1]:0', 'enable_dht': False, 'enable_lsd': False,
                  'enable_upnp': False, 'enable_natpmp': False,
                  'enable_outgoing_utp': False, 'enable_incoming_utp': False})
h = ses.add_torrent({'ti': lt.torrent_info(sys.argv[1]), 'save_path': sys.argv[2]})
deadline = time.time() + 80
last = 0
while time.time() < deadline:
    if time.time() - last > 2:
        h.connect_peer((sys.argv[3], int(sys.argv[4])))
        last = time.time()
    if h.status().is_seeding:
        sys.exit(0)
    time.sleep(0.2)
sys.exit(1)
"#;

/// Dual stack: `--listen 127.0.0.1:P --listen [::1]:P` binds both; libtorrent downloads over
/// IPv6 byte for byte while a raw peer is served on the IPv4 listener of the same port.
#[test]
fn a_download_over_ipv6_while_ipv4_listens_on_the_same_port() {
    let _g = lock();
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("SKIPPED: no IPv6 loopback here");
        return;
    }
    if !Client::Libtorrent.available() {
        return;
    }
    let mut fx = Fixture::new("ipv6");
    let data = fx.data_of(2 << 20);
    let t = fx.dir.join("m.torrent");
    let src = data.join("multi");
    make_torrent(&src, &t, &[]);
    let port = free_port().unwrap().to_string();
    let (v4, v6) = (format!("127.0.0.1:{port}"), format!("[::1]:{port}"));
    let json = fx.dir.join("c.json");
    let args = [
        t.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--listen",
        &v4,
        "--listen",
        &v6,
        "--json",
        json.to_str().unwrap(),
    ];
    let lines = seed_until(&mut fx, &args, |l| l.starts_with("seeding "));
    assert!(
        lines[0].contains(&format!("on {v4} and {v6} ")),
        "{lines:?}"
    );
    // The IPv4 listener answers meanwhile.
    let ih = info_hash_of(&t);
    let mut plain = TcpStream::connect(v4.as_str()).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    plain.write_all(&handshake(&ih, true)).unwrap();
    let mut hs = [0u8; 68];
    plain.read_exact(&mut hs).unwrap();
    assert_eq!(&hs[28..48], &ih);
    let dl = fx.dir.join("dl");
    std::fs::create_dir_all(&dl).unwrap();
    let got = dl.join("multi");
    let mut leecher = Command::new("/usr/bin/python3");
    leecher
        .arg("-c")
        .arg(LIBTORRENT_FROM_PEER)
        .arg(&t)
        .arg(&dl)
        .args(["::1", &port]);
    let want = Want {
        src: &src,
        got: &got,
        limit: Duration::from_secs(90),
        skip_empty: false,
    };
    let ok = fx.run_until_complete(&mut leecher, want);
    assert!(
        ok,
        "libtorrent over [::1] did not finish; seed log:\n{}",
        fx.seed_log()
    );
    let c = counters(&json);
    let n = |k: &str| c["counters"][k].as_u64().unwrap_or(0);
    assert!(n("peers_handshaken") >= 2, "{c}");
    assert!(n("bytes_sent") > 2 << 20, "{c}");
}

/// libtorrent over uTP alone (its outgoing TCP off): 48 MiB in 64 KiB pieces, enough
/// traffic on loopback for reordered and lost datagrams and so for libtorrent's selective
/// ACKs, whose bitmasks come in any length (a 3-byte one, refused as garbage, stalled
/// the download until libtorrent timed out at about 53%).
#[test]
fn libtorrent_downloads_over_utp() {
    let _g = lock();
    if !Client::Libtorrent.available() {
        return;
    }
    let mut fx = Fixture::new("lt-utp");
    let data = fx.data_of(48 << 20);
    let src = data.join("single.bin");
    let torrent = fx.dir.join("t.torrent");
    let json = fx.dir.join("counters.json");
    let seed = fx.seed(&[
        src.to_str().unwrap(),
        "--torrent",
        torrent.to_str().unwrap(),
        "--piece-length",
        "64K",
        "--utp",
        "on",
        "--json",
        json.to_str().unwrap(),
    ]);
    let dl = fx.dir.join("dl");
    std::fs::create_dir_all(&dl).unwrap();
    let mut leecher = Command::new("/usr/bin/python3");
    leecher
        .arg("-c")
        .arg(LIBTORRENT_UTP_LEECHER)
        .arg(&torrent)
        .arg(&dl)
        .arg(seed.to_string());
    let t0 = Instant::now();
    let want = Want {
        src: &src,
        got: &dl.join("single.bin"),
        limit: Duration::from_secs(90),
        skip_empty: false,
    };
    let ok = fx.run_until_complete(&mut leecher, want);
    let c = counters(&json);
    assert!(ok, "libtorrent over uTP did not finish; counters {c}");
    let n = |k: &str| c["counters"][k].as_u64().unwrap_or(0);
    // One connection carried it all: none timed out and was made again.
    assert_eq!(n("utp_accepted"), 1, "{c}");
    assert_eq!(n("peers_accepted"), 0, "TCP was off: {c}");
    assert_eq!(n("utp_garbage"), 0, "{c}");
    eprintln!(
        "libtorrent over uTP: 48 MiB in {:.1} s, uTP connections {}, timeouts {}",
        t0.elapsed().as_secs_f64(),
        n("utp_accepted"),
        n("utp_timeouts")
    );
}

/// A libtorrent leecher with TCP off both ways, told of the seeder (argv[3], IP:PORT)
/// directly: it can only connect over uTP.
const LIBTORRENT_UTP_LEECHER: &str = r#"
import sys, time, libtorrent as lt
ip, port = sys.argv[3].rsplit(':', 1)
ses = lt.session({'listen_interfaces': '127.0.0.1:0', 'enable_dht': False,
                  'enable_lsd': False, 'enable_upnp': False, 'enable_natpmp': False,
                  'enable_outgoing_tcp': False, 'enable_incoming_tcp': False})
h = ses.add_torrent({'ti': lt.torrent_info(sys.argv[1]), 'save_path': sys.argv[2]})
h.connect_peer((ip, int(port)))
deadline = time.time() + 85
while time.time() < deadline:
    if h.status().is_seeding:
        sys.exit(0)
    time.sleep(0.2)
sys.exit(1)
"#;
