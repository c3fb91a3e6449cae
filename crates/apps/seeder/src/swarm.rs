//! The bench's leechers (like libtorrent's connection_tester): one process holds many peer
//! connections as lightweight tasks on one loop. Each peer handshakes (fast + extension
//! bits, a BEP 20 peer id of its own), holds idle for a while (for the RSS-per-idle-peer
//! figure), says it is interested, and then downloads as clients do: a random piece, its
//! 16 KiB blocks pipelined `--pipeline` deep, the next random piece, until the time is up.
//! Piece data is skipped as it arrives (a streaming parser: no per-peer buffer for data).
//!
//! Output: one JSON line on stdout at the end (bytes, blocks, latency histogram quantiles,
//! connections), and `connected N` on stdout once every peer has handshaken.

use std::cell::RefCell;
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use iolab_runtime::net::TcpStream;
use iolab_runtime::{sleep, spawn, timeout, wait_readable, Runtime};
use serde::{Deserialize, Serialize};

use crate::link;
use crate::metainfo::Meta;
use crate::mse::{Established, Exchange as _, Initiator, Rc4Pair, CRYPTO_RC4};
use crate::wire::{self, Handshake, Message};

/// One swarm process (`iolab seed swarm`, started by the bench; its arguments:
/// [`SwarmConfig::to_args`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SwarmConfig {
    /// The seeder to download from.
    pub target: SocketAddr,
    /// The torrent (only its info hash and piece layout are used).
    pub torrent: PathBuf,
    /// Connections held by this process.
    pub peers: usize,
    /// Seconds to hold the connections idle (handshaken, not interested) before downloading.
    pub idle_secs: f64,
    /// Seconds of downloading.
    pub secs: f64,
    /// Requests outstanding per peer.
    pub pipeline: usize,
    /// New connections per second (0 = all at once).
    pub connect_rate: u64,
    /// Index of this process (varies the peer ids across processes).
    pub process: u32,
    /// Open every connection with MSE offering RC4 only, as an encrypting client does, so
    /// the seeder pays for the key exchange and for RC4 on every byte it sends.
    pub mse: bool,
}

impl SwarmConfig {
    /// A swarm process against `target` with the flags' defaults: 10 peers, idle 1 s, 10 s of
    /// downloading, 16 requests outstanding, 5,000 connections per second, process 0,
    /// plaintext.
    pub fn new(target: SocketAddr, torrent: PathBuf) -> SwarmConfig {
        SwarmConfig {
            target,
            torrent,
            peers: 10,
            idle_secs: 1.0,
            secs: 10.0,
            pipeline: 16,
            connect_rate: 5000,
            process: 0,
            mse: false,
        }
    }
}

/// What one swarm process measured.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct SwarmResult {
    pub peers: usize,
    pub connected: usize,
    pub connect_failures: usize,
    pub dropped: usize,
    pub unchoked_peers: usize,
    pub bytes: u64,
    pub blocks: u64,
    pub rejects: u64,
    pub secs: f64,
    /// Request latency in microseconds (request sent → block fully received).
    pub lat_p50_us: u64,
    pub lat_p99_us: u64,
    pub lat_count: u64,
    /// Serialized histogram quantiles (for merging across processes): (quantile, value).
    pub lat_samples: Vec<(f64, u64)>,
    /// The distinct 16 KiB blocks received (bit i = the block at byte offset i × 16 KiB of
    /// the torrent), hex, for the bench's read amplification: disk bytes read / distinct
    /// bytes sent.
    #[serde(default)]
    pub blocks_seen: String,
}

/// Sets bit `i` of a bitmap (most significant bit first, as a BitTorrent bitfield).
fn set_bit(map: &mut [u8], i: u64) {
    if let Some(b) = map.get_mut((i / 8) as usize) {
        *b |= 0x80 >> (i % 8);
    }
}

/// Encodes a bitmap as hex.
pub fn bitmap_hex(map: &[u8]) -> String {
    map.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes [`bitmap_hex`]'s output (malformed pairs read as 0).
pub fn bitmap_from_hex(s: &str) -> Vec<u8> {
    s.as_bytes()
        .chunks(2)
        .map(|c| {
            std::str::from_utf8(c)
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .unwrap_or(0)
        })
        .collect()
}

struct Shared {
    hist: Histogram<u64>,
    seen: Vec<u8>,
    res: SwarmResult,
    go: bool,
}

/// Raises this process's open-file limit to `want` (or as far as allowed): the soft limit
/// up to the hard one; as root, the hard one too, up to fs.nr_open (which the kernel will not
/// exceed). Returns the soft limit in force.
pub fn raise_nofile(want: u64) -> u64 {
    let nr_open = iolab_sys::host::read_collapsed("/proc/sys/fs/nr_open")
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    iolab_sys::fdlimit::raise_nofile_to(want.min(nr_open))
}

/// Runs one swarm process: `connected N`, then the JSON [`SwarmResult`], on stdout.
pub fn run(args: SwarmConfig) -> anyhow::Result<()> {
    raise_nofile(args.peers as u64 + 64);
    let bytes = std::fs::read(&args.torrent)?;
    let meta = Rc::new(Meta::from_bytes(&bytes, std::path::Path::new("."))?);
    let rt = Runtime::builder().workers(1).build()?;
    let shared = Rc::new(RefCell::new(Shared {
        hist: Histogram::new_with_bounds(1, 60_000_000, 3)?,
        seen: vec![0u8; (meta.total.div_ceil(wire::MAX_BLOCK as u64)).div_ceil(8) as usize],
        res: SwarmResult {
            peers: args.peers,
            ..Default::default()
        },
        go: false,
    }));
    let go = iolab_runtime::Cond::new();
    let sh = shared.clone();
    rt.block_on(async move {
        let mut handles = Vec::new();
        let start = Instant::now();
        for i in 0..args.peers {
            if args.connect_rate > 0 {
                let due = start + Duration::from_secs_f64(i as f64 / args.connect_rate as f64);
                iolab_runtime::sleep_until(due).await;
            }
            let m = meta.clone();
            let s = sh.clone();
            let g = go.clone();
            let a = args.clone();
            handles.push(spawn(async move { leecher(a, i, m, s, g).await }));
        }
        // Wait until every peer has handshaken (or failed), bounded.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (c, f, d) = {
                let r = &sh.borrow().res;
                (r.connected, r.connect_failures, r.dropped)
            };
            if c + f + d >= args.peers || Instant::now() > deadline {
                break;
            }
            sleep(Duration::from_millis(20)).await;
        }
        println!("connected {}", sh.borrow().res.connected);
        let _ = io::stdout().flush();
        sleep(Duration::from_secs_f64(args.idle_secs)).await;
        let t0 = Instant::now();
        sh.borrow_mut().go = true;
        go.broadcast();
        sleep(Duration::from_secs_f64(args.secs)).await;
        sh.borrow_mut().res.secs = t0.elapsed().as_secs_f64();
        sh.borrow_mut().go = false; // stop counting
        for h in handles {
            h.abort();
        }
    });
    let s = shared.borrow();
    let mut res = s.res.clone();
    res.lat_p50_us = s.hist.value_at_quantile(0.5);
    res.lat_p99_us = s.hist.value_at_quantile(0.99);
    res.lat_count = s.hist.len();
    res.blocks_seen = bitmap_hex(&s.seen);
    res.lat_samples = [0.5, 0.9, 0.99, 0.999]
        .iter()
        .map(|q| (*q, s.hist.value_at_quantile(*q)))
        .collect();
    println!("{}", serde_json::to_string(&res)?);
    Ok(())
}

/// Streaming input: message headers are kept, piece data is skipped.
struct Input {
    head: Vec<u8>,
    /// Bytes of the current piece message's data still to skip, and its (index, begin).
    skip: usize,
    cur: (u32, u32, u32),
}

/// Connects peer `i` of this process to the target and sends its handshake (under MSE when
/// the config says so: the stream's cipher and the bytes already decrypted come back);
/// `None` (counted as a connect failure) when any step fails.
async fn connect(
    args: &SwarmConfig,
    i: usize,
    meta: &Meta,
    sh: &RefCell<Shared>,
) -> Option<(TcpStream, Option<Established>)> {
    let failed = || {
        sh.borrow_mut().res.connect_failures += 1;
        None
    };
    let Ok(Ok(stream)) = timeout(CONNECT_TIMEOUT, TcpStream::connect(args.target)).await else {
        return failed();
    };
    let _ = stream.set_nodelay(true);
    let mut peer_id = [0u8; 20];
    peer_id[..8].copy_from_slice(b"-IS0100-");
    let tag = format!("{:04}{:08}", args.process % 10_000, i);
    peer_id[8..].copy_from_slice(tag.as_bytes());
    let mut reserved = [0u8; 8];
    reserved[wire::RESERVED_FAST.0] |= wire::RESERVED_FAST.1;
    let hs = Handshake {
        reserved,
        info_hash: meta.info_hash,
        peer_id,
    }
    .encode()
    .to_vec();
    if !args.mse {
        return match stream.write_all(hs).await.0 {
            Ok(()) => Some((stream, None)),
            Err(_) => failed(),
        };
    }
    match mse_opening(&stream, meta.info_hash, hs).await {
        Some(est) => Some((stream, Some(est))),
        None => failed(),
    }
}

/// How long a connection and its MSE exchange may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// MSE as the dialling side, offering RC4 only, our handshake as its initial payload: the
/// opening, then the exchange as the seeder's own dialler drives it ([`link::exchange`]).
async fn mse_opening(stream: &TcpStream, info_hash: [u8; 20], hs: Vec<u8>) -> Option<Established> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    let (mut init, opening) = Initiator::new(info_hash, CRYPTO_RC4, hs);
    timeout(CONNECT_TIMEOUT, stream.write_all(opening))
        .await
        .ok()?
        .0
        .ok()?;
    let est = link::exchange(stream, Vec::new(), deadline, |d| init.feed(d))
        .await
        .ok()?;
    // RC4 was the only method offered: a plaintext answer is a broken peer.
    est.rc4.is_some().then_some(est)
}

/// Why a leecher stops: the seeder closed, broke the protocol or the socket failed. Each
/// counts as a dropped peer.
struct Dropped;

/// One leecher's side of the protocol: what it was told and what it asked for.
struct Leecher {
    input: Input,
    /// The seeder's handshake (68 bytes) has been received.
    got_hs: bool,
    unchoked: bool,
    interested_sent: bool,
    counted_unchoke: bool,
    /// Requests sent and not answered: (index, begin, when).
    pending: Vec<(u32, u32, Instant)>,
    /// The piece being downloaded: (index, next begin).
    piece: Option<(u32, u32)>,
    /// The stream's cipher under MSE (RC4 both ways), `None` in plaintext.
    rc4: Option<Rc4Pair>,
}

impl Leecher {
    fn new(rc4: Option<Rc4Pair>) -> Leecher {
        Leecher {
            input: Input {
                head: Vec::new(),
                skip: 0,
                cur: (0, 0, 0),
            },
            got_hs: false,
            unchoked: false,
            interested_sent: false,
            counted_unchoke: false,
            pending: Vec::new(),
            piece: None,
            rc4,
        }
    }

    /// Sends `bytes` (encrypted first under MSE).
    async fn send(&mut self, stream: &TcpStream, mut bytes: Vec<u8>) -> Result<(), Dropped> {
        if let Some(c) = &mut self.rc4 {
            c.encrypt(&mut bytes).map_err(|_| Dropped)?;
        }
        stream.write_all(bytes).await.0.map_err(|_| Dropped)
    }

    /// The requests that fill the pipeline to `depth`: the current piece's next blocks, then
    /// a random piece's.
    fn requests(&mut self, meta: &Meta, depth: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while self.pending.len() < depth {
            let (idx, begin) = match self.piece {
                Some((idx, b)) if (b as u64) < meta.piece_len(idx) => (idx, b),
                _ => (rand::random_range(0..meta.num_pieces()), 0),
            };
            let len = (meta.piece_len(idx) - begin as u64).min(wire::MAX_BLOCK as u64) as u32;
            self.piece = Some((idx, begin + len));
            wire::encode(
                &Message::Request {
                    index: idx,
                    begin,
                    length: len,
                },
                &mut out,
            );
            self.pending.push((idx, begin, Instant::now()));
        }
        out
    }

    /// Receives what the socket holds into the input (piece data skipped as it streams by).
    /// `Ok(false)`: nothing there yet.
    fn recv(&mut self, fd: RawFd) -> Result<bool, Dropped> {
        let mut buf = std::mem::take(&mut self.input.head);
        let n = SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let n = recv_now(fd, &mut s);
            if n > 0 {
                let cipher = self.rc4.as_mut().map(|c| c.decrypt(&mut s[..n as usize]));
                if cipher.is_some_and(|r| r.is_err()) {
                    return CIPHER_FAILED;
                }
                feed(&mut self.input, &mut buf, &s[..n as usize]);
            }
            n
        });
        self.input.head = buf;
        match n {
            0 | CIPHER_FAILED => Err(Dropped),
            n if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock => {
                Ok(false)
            }
            n if n < 0 => Err(Dropped),
            _ => Ok(true),
        }
    }

    /// Takes the seeder's handshake off the input once it is complete. `Ok(false)`: not yet.
    fn handshake(&mut self, sh: &RefCell<Shared>) -> Result<bool, Dropped> {
        if self.got_hs {
            return Ok(true);
        }
        if self.input.head.len() < wire::HANDSHAKE_LEN {
            return Ok(false);
        }
        if Handshake::parse(&self.input.head).is_err() {
            return Err(Dropped);
        }
        self.input.head.drain(..wire::HANDSHAKE_LEN);
        self.got_hs = true;
        sh.borrow_mut().res.connected += 1;
        Ok(true)
    }

    /// Acts on what the input holds: the seeder's handshake, then its complete messages.
    fn take_input(&mut self, meta: &Meta, sh: &RefCell<Shared>) -> Result<(), Dropped> {
        if !self.handshake(sh)? {
            return Ok(());
        }
        let mut events = Vec::new();
        drain_messages(&mut self.input, &mut events);
        for ev in events {
            self.on_event(ev, meta, sh)?;
        }
        Ok(())
    }

    /// Acts on one message of the seeder's.
    fn on_event(&mut self, ev: Ev, meta: &Meta, sh: &RefCell<Shared>) -> Result<(), Dropped> {
        match ev {
            Ev::Unchoke => {
                self.unchoked = true;
                if !self.counted_unchoke {
                    self.counted_unchoke = true;
                    sh.borrow_mut().res.unchoked_peers += 1;
                }
            }
            Ev::Choke => {
                self.unchoked = false;
                self.pending.clear();
                self.piece = None;
            }
            Ev::Reject(idx, begin) => {
                self.pending.retain(|p| !(p.0 == idx && p.1 == begin));
                sh.borrow_mut().res.rejects += 1;
            }
            Ev::Block(idx, begin, len) => {
                if let Some(p) = self.pending.iter().position(|p| p.0 == idx && p.1 == begin) {
                    let t = self.pending.swap_remove(p).2;
                    let mut s = sh.borrow_mut();
                    if s.go {
                        let us = t.elapsed().as_micros().max(1) as u64;
                        let _ = s.hist.record(us.min(60_000_000));
                        s.res.bytes += len as u64;
                        s.res.blocks += 1;
                        let off = idx as u64 * meta.piece_length + begin as u64;
                        set_bit(&mut s.seen, off / wire::MAX_BLOCK as u64);
                    }
                }
            }
            Ev::Bad => return Err(Dropped),
        }
        Ok(())
    }
}

async fn leecher(
    args: SwarmConfig,
    i: usize,
    meta: Rc<Meta>,
    sh: Rc<RefCell<Shared>>,
    go: iolab_runtime::Cond,
) {
    let Some((stream, mse)) = connect(&args, i, &meta, &sh).await else {
        return;
    };
    let _ = download(&args, &stream, mse, &meta, &sh, &go).await;
    // However it ended (the tasks are aborted at the end of the run, not ended).
    sh.borrow_mut().res.dropped += 1;
}

/// The connected leecher: idle until the bench says go, then interested, then downloading
/// with the pipeline kept full.
async fn download(
    args: &SwarmConfig,
    stream: &TcpStream,
    mse: Option<Established>,
    meta: &Meta,
    sh: &RefCell<Shared>,
    go: &iolab_runtime::Cond,
) -> Result<(), Dropped> {
    let fd = stream.as_raw_fd();
    let (rc4, early) = mse.map_or((None, Vec::new()), |est| (est.rc4, est.payload));
    let mut l = Leecher::new(rc4);
    if !early.is_empty() {
        // What followed the exchange, already decrypted: the seeder's handshake, perhaps more.
        let mut head = std::mem::take(&mut l.input.head);
        feed(&mut l.input, &mut head, &early);
        l.input.head = head;
        l.take_input(meta, sh)?;
    }
    loop {
        // Send interest once the bench says go.
        if l.got_hs && !l.interested_sent && sh.borrow().go {
            l.interested_sent = true;
            let mut b = Vec::new();
            wire::encode(&Message::Interested, &mut b);
            l.send(stream, b).await?;
        }
        if l.unchoked && l.interested_sent {
            let out = l.requests(meta, args.pipeline);
            if !out.is_empty() {
                l.send(stream, out).await?;
            }
        }
        // Wait for input (or for "go" while idle).
        if l.got_hs && !l.interested_sent {
            if !sh.borrow().go {
                // Woken by the go broadcast, or by input (choke etc.).
                let _ = iolab_runtime::wait_readable_or_cancel(fd, go).await;
            }
        } else if wait_readable(fd).await.is_err() {
            return Err(Dropped);
        }
        if l.recv(fd)? {
            l.take_input(meta, sh)?;
        }
    }
}

/// One non-blocking `recv` into `buf`: its result as the kernel gives it.
fn recv_now(fd: RawFd, buf: &mut [u8]) -> isize {
    // SAFETY: `buf` is a live, exclusively borrowed buffer of buf.len() bytes.
    unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    }
}

/// `recv`'s result when the bytes arrived but RC4 failed on them (recv returns -1 at worst).
const CIPHER_FAILED: isize = -2;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0u8; 256 * 1024]);
}

enum Ev {
    Unchoke,
    Choke,
    Reject(u32, u32),
    Block(u32, u32, u32),
    Bad,
}

/// Appends `data` to the input, skipping piece data as it streams by.
fn feed(input: &mut Input, head: &mut Vec<u8>, mut data: &[u8]) {
    while !data.is_empty() {
        if input.skip > 0 {
            let k = input.skip.min(data.len());
            input.skip -= k;
            data = &data[k..];
            if input.skip == 0 {
                // Completed piece: recorded as a pseudo-message in `head` so the events keep
                // their order: 0xFF marker + index + begin + length.
                head.extend_from_slice(&[0, 0, 0, 13, 0xFF]);
                head.extend_from_slice(&input.cur.0.to_be_bytes());
                head.extend_from_slice(&input.cur.1.to_be_bytes());
                head.extend_from_slice(&input.cur.2.to_be_bytes());
            }
            continue;
        }
        head.push(data[0]);
        data = &data[1..];
        // A piece message's header is complete: switch to skipping its data. Only past the
        // handshake: find the start of the last (incomplete) message in head.
        if let Some((len, start)) = last_incomplete(head) {
            if head.len() - start == 13 && head[start + 4] == 7 && len >= 9 {
                let idx =
                    u32::from_be_bytes(head[start + 5..start + 9].try_into().unwrap_or([0; 4]));
                let begin =
                    u32::from_be_bytes(head[start + 9..start + 13].try_into().unwrap_or([0; 4]));
                let dlen = len as usize - 9;
                input.cur = (idx, begin, dlen as u32);
                head.truncate(start);
                input.skip = dlen;
                if dlen == 0 {
                    head.extend_from_slice(&[0, 0, 0, 13, 0xFF]);
                    head.extend_from_slice(&idx.to_be_bytes());
                    head.extend_from_slice(&begin.to_be_bytes());
                    head.extend_from_slice(&0u32.to_be_bytes());
                }
            }
        }
    }
}

/// The (length, start) of the message being assembled at the end of `head`, skipping the
/// handshake (68 bytes starting with 19) and complete messages.
fn last_incomplete(head: &[u8]) -> Option<(u32, usize)> {
    let mut pos = 0;
    if head.first() == Some(&19) {
        if head.len() < wire::HANDSHAKE_LEN {
            return None;
        }
        pos = wire::HANDSHAKE_LEN;
    }
    loop {
        if head.len() < pos + 4 {
            return None;
        }
        let len = u32::from_be_bytes(head[pos..pos + 4].try_into().ok()?);
        if head.len() >= pos + 4 + len as usize {
            pos += 4 + len as usize;
            continue;
        }
        return Some((len, pos));
    }
}

fn drain_messages(input: &mut Input, events: &mut Vec<Ev>) {
    let head = &mut input.head;
    let mut pos = 0;
    while head.len() >= pos + 4 {
        let len =
            u32::from_be_bytes([head[pos], head[pos + 1], head[pos + 2], head[pos + 3]]) as usize;
        if len > 1 << 20 {
            events.push(Ev::Bad);
            return;
        }
        if head.len() < pos + 4 + len {
            break;
        }
        if len > 0 {
            let id = head[pos + 4];
            let p = &head[pos + 5..pos + 4 + len];
            match id {
                0 => events.push(Ev::Choke),
                1 => events.push(Ev::Unchoke),
                0x10 if p.len() == 12 => events.push(Ev::Reject(
                    u32::from_be_bytes([p[0], p[1], p[2], p[3]]),
                    u32::from_be_bytes([p[4], p[5], p[6], p[7]]),
                )),
                0xFF if p.len() == 12 => events.push(Ev::Block(
                    u32::from_be_bytes([p[0], p[1], p[2], p[3]]),
                    u32::from_be_bytes([p[4], p[5], p[6], p[7]]),
                    u32::from_be_bytes([p[8], p[9], p[10], p[11]]),
                )),
                _ => {}
            }
        }
        pos += 4 + len;
    }
    head.drain(..pos);
}
