//! The seeding engine: one lightweight task per peer on an iolab-runtime loop, a choker
//! task, an announcer task. Everything a peer can make us do is bounded (see [`Config`]).
//!
//! A peer task is written in threaded style, CPC's way: wait until the socket is readable
//! or until the choker wakes it (a [`Cond`]), parse every complete message, serve queued
//! requests (disk read through [`Storage`], then one send), repeat. An idle peer holds no
//! buffer: input is received into a per-loop scratch buffer, and only the bytes of an
//! incomplete message are kept.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use iolab_runtime::net::{TcpListener, TcpStream};
use iolab_runtime::{sleep, spawn, timeout, wait_readable_or_cancel, Cancelled, Cond};
use serde::Serialize;
use slab::Slab;

use crate::disk::{advance, Block, Chunk, DiskMode, Storage};
use crate::metainfo::Meta;
use crate::wire::{self, Handshake, Limits, Message, WireError};

/// Limits and knobs of the seeder.
#[derive(Debug, Clone)]
pub struct Config {
    /// Upload slots: peers unchoked at once (the best uploaders by rate, one of them an
    /// optimistic slot rotated every 30 s); 0 = every interested peer is unchoked.
    pub slots: usize,
    /// Connections held at once; more are closed at accept.
    pub max_peers: usize,
    /// Requests queued per peer (advertised as BEP 10 `reqq`); beyond, rejected/ignored.
    /// A peer without the fast extension cannot be told that a request was dropped: it
    /// waits for the block forever. ctorrent asks for whole pieces at once (256 blocks of
    /// a 4 MiB piece, more than one piece at a time) and stalled at the old 250; 2000 is
    /// libtorrent's default (`max_allowed_in_request_queue`): 24 KB of queue at most.
    pub max_queue: usize,
    /// Time a new connection has to send its handshake.
    pub handshake_timeout: Duration,
    /// A peer that sends nothing for this long is dropped (clients send keep-alives every 2 min).
    pub idle_timeout: Duration,
    /// A send that makes no progress for this long drops the peer.
    pub send_timeout: Duration,
    /// Blocks sent in one write (gathered into one buffer).
    pub batch: usize,
    /// Period of the choker's rounds.
    pub choke_interval: Duration,
    /// Allowed-fast pieces offered to fast-extension peers (BEP 6).
    pub allowed_fast: usize,
    pub disk: DiskMode,
    /// Keep the kernel's read-ahead on the data files (default off: random access hint).
    pub read_ahead: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            slots: 8,
            max_peers: 20_000,
            max_queue: 2000,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            send_timeout: Duration::from_secs(60),
            batch: 4,
            choke_interval: Duration::from_secs(10),
            allowed_fast: 10,
            disk: DiskMode::Uring,
            read_ahead: false,
        }
    }
}

/// Live counters (atomics: read by the stats printer and the bench from other threads).
#[derive(Debug, Default, Serialize)]
pub struct Counters {
    pub peers_now: AtomicU64,
    pub peers_accepted: AtomicU64,
    pub peers_refused_full: AtomicU64,
    /// Dropped for a protocol violation (garbage, bad handshake, out-of-bounds request, ...).
    pub peers_dropped_garbage: AtomicU64,
    pub peers_wrong_torrent: AtomicU64,
    pub handshake_timeouts: AtomicU64,
    pub idle_timeouts: AtomicU64,
    pub send_failures: AtomicU64,
    pub blocks_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub requests_rejected: AtomicU64,
    pub disk_errors: AtomicU64,
    pub unchoked_now: AtomicU64,
}

impl Counters {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Req {
    index: u32,
    begin: u32,
    length: u32,
}

struct PeerSlot {
    interested: bool,
    choked: bool,
    optimistic: bool,
    uploaded: u64,
    uploaded_last_round: u64,
    wake: Cond,
}

struct Swarm {
    peers: Slab<PeerSlot>,
    unchoked: usize,
}

impl Swarm {
    /// The one place a peer's choke state changes: keeps `unchoked` and the `unchoked_now`
    /// counter in step, and wakes the peer's task so that it tells the peer.
    fn set_choked(&mut self, key: usize, choked: bool, unchoked_now: &AtomicU64) {
        let p = &mut self.peers[key];
        if p.choked == choked {
            return;
        }
        p.choked = choked;
        p.wake.broadcast();
        if choked {
            p.optimistic = false;
            self.unchoked -= 1;
            unchoked_now.fetch_sub(1, Ordering::Relaxed);
        } else {
            self.unchoked += 1;
            unchoked_now.fetch_add(1, Ordering::Relaxed);
        }
    }
}

pub struct Seeder {
    pub meta: Arc<Meta>,
    pub storage: Storage,
    pub cfg: Config,
    pub counters: Arc<Counters>,
    pub peer_id: [u8; 20],
    limits: Limits,
    swarm: RefCell<Swarm>,
}

thread_local! {
    /// The loop's receive buffer: a peer's input lands here first, so an idle peer holds none.
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0u8; 64 * 1024]);
}

/// Why a peer's task ended (the payloads are read through `Debug` in the debug log).
#[derive(Debug)]
#[allow(dead_code)]
enum End {
    Closed,
    Garbage(String),
    WrongTorrent,
    HandshakeTimeout,
    Idle,
    Io(io::Error),
}

impl From<WireError> for End {
    fn from(e: WireError) -> End {
        End::Garbage(e.to_string())
    }
}

impl Seeder {
    pub fn new(meta: Arc<Meta>, cfg: Config) -> io::Result<Rc<Seeder>> {
        let storage = Storage::open(meta.clone(), cfg.disk, cfg.read_ahead)?;
        let limits = Limits::for_pieces(meta.num_pieces());
        Ok(Rc::new(Seeder {
            meta,
            storage,
            cfg,
            counters: Arc::new(Counters::default()),
            peer_id: wire::make_peer_id(),
            limits,
            swarm: RefCell::new(Swarm {
                peers: Slab::new(),
                unchoked: 0,
            }),
        }))
    }

    /// Accepts peers forever (run it inside the runtime). Also starts the choker.
    pub async fn serve(self: Rc<Self>, listener: TcpListener) -> io::Result<()> {
        if self.cfg.slots > 0 {
            spawn(self.clone().choker());
        }
        let mut acceptor = listener.accept_many(16);
        loop {
            let (stream, addr) = match acceptor.next().await {
                Ok(x) => x,
                Err(e) if is_transient_accept(&e) => {
                    // EMFILE and friends: back off briefly rather than spin.
                    sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if Counters::get(&self.counters.peers_now) as usize >= self.cfg.max_peers {
                inc(&self.counters.peers_refused_full);
                drop(stream);
                continue;
            }
            inc(&self.counters.peers_accepted);
            self.counters.peers_now.fetch_add(1, Ordering::Relaxed);
            let me = self.clone();
            spawn(async move {
                let _ = stream.set_nodelay(true);
                let end = me.clone().peer(&stream, addr).await;
                me.counters.peers_now.fetch_sub(1, Ordering::Relaxed);
                if debug_peers() {
                    tracing::info!(target: "progress", "seed: peer {addr} ended: {end:?}");
                }
                match end {
                    End::Closed => {}
                    End::Garbage(_) => inc(&me.counters.peers_dropped_garbage),
                    End::WrongTorrent => inc(&me.counters.peers_wrong_torrent),
                    End::HandshakeTimeout => inc(&me.counters.handshake_timeouts),
                    End::Idle => inc(&me.counters.idle_timeouts),
                    End::Io(_) => inc(&me.counters.send_failures),
                }
            });
        }
    }

    async fn peer(self: Rc<Self>, stream: &TcpStream, addr: SocketAddr) -> End {
        let mut inbuf: Vec<u8> = Vec::new();
        // Handshake, within the timeout.
        let never = Cond::new();
        let deadline = Instant::now() + self.cfg.handshake_timeout;
        while inbuf.len() < wire::HANDSHAKE_LEN {
            let left = deadline.saturating_duration_since(Instant::now());
            match timeout(left, wait_readable_or_cancel(stream.as_raw_fd(), &never)).await {
                Err(_) => return End::HandshakeTimeout,
                Ok(Err(e)) => return End::Io(e),
                Ok(Ok(())) => {}
            }
            match recv_into(stream, &mut inbuf) {
                Ok(0) => return End::Closed,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return End::Io(e),
            }
            if inbuf.len() >= 20 && (inbuf[0] != 19 || &inbuf[1..20] != wire::PROTOCOL) {
                return End::Garbage("not a BitTorrent handshake".into());
            }
        }
        let hs = match Handshake::parse(&inbuf) {
            Ok(h) => h,
            Err(e) => return e.into(),
        };
        inbuf.drain(..wire::HANDSHAKE_LEN);
        if hs.info_hash != self.meta.info_hash {
            return End::WrongTorrent;
        }
        let fast = hs.fast();
        let extended = hs.extended();
        let mut reserved = [0u8; 8];
        reserved[wire::RESERVED_FAST.0] |= wire::RESERVED_FAST.1;
        reserved[wire::RESERVED_EXTENDED.0] |= wire::RESERVED_EXTENDED.1;
        let mut out = Handshake {
            reserved,
            info_hash: self.meta.info_hash,
            peer_id: self.peer_id,
        }
        .encode()
        .to_vec();
        if extended {
            let v = concat!("iolab-hekate ", env!("CARGO_PKG_VERSION"));
            let payload = format!("d1:mde4:reqqi{}e1:v{}:{}e", self.cfg.max_queue, v.len(), v);
            wire::encode(
                &Message::Extended {
                    id: 0,
                    payload: payload.as_bytes(),
                },
                &mut out,
            );
        }
        let allowed: Vec<u32> = match (fast, addr.ip()) {
            (true, IpAddr::V4(ip)) if self.cfg.allowed_fast > 0 => wire::allowed_fast_set(
                ip,
                &self.meta.info_hash,
                self.meta.num_pieces(),
                self.cfg.allowed_fast,
            ),
            _ => Vec::new(),
        };
        if fast {
            wire::encode(&Message::HaveAll, &mut out);
            for &i in &allowed {
                wire::encode(&Message::AllowedFast(i), &mut out);
            }
        } else {
            let n = self.meta.num_pieces() as usize;
            let mut bf = vec![0xFFu8; n.div_ceil(8)];
            if n % 8 != 0 {
                let last = bf.len() - 1;
                bf[last] = 0xFFu8 << (8 - n % 8);
            }
            wire::encode(&Message::Bitfield(&bf), &mut out);
        }
        if let Err(e) = self.send(stream, out).await {
            return End::Io(e);
        }

        let wake = Cond::new();
        let key = self.swarm.borrow_mut().peers.insert(PeerSlot {
            interested: false,
            choked: true,
            optimistic: false,
            uploaded: 0,
            uploaded_last_round: 0,
            wake: wake.clone(),
        });
        let end = self
            .run_peer(stream, key, &wake, fast, &allowed, inbuf)
            .await;
        let mut sw = self.swarm.borrow_mut();
        sw.set_choked(key, true, &self.counters.unchoked_now);
        sw.peers.remove(key);
        end
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_peer(
        &self,
        stream: &TcpStream,
        key: usize,
        wake: &Cond,
        fast: bool,
        allowed: &[u32],
        mut inbuf: Vec<u8>,
    ) -> End {
        let mut queue: VecDeque<Req> = VecDeque::new();
        let mut sent_choked = true; // what the peer was last told
        let mut last_input = Instant::now();
        let mut out: Vec<u8> = Vec::new();
        loop {
            // 1. Every complete message in the input.
            let mut pos = 0;
            loop {
                let (msg, n) = match wire::parse(&inbuf[pos..], self.limits) {
                    Ok(Some(x)) => x,
                    Ok(None) => break,
                    Err(e) => return e.into(),
                };
                pos += n;
                if debug_peers() && !matches!(msg, Message::Request { .. }) {
                    tracing::info!(target: "progress", "seed: peer {key}: {:?}", DebugMsg(&msg));
                }
                if let Err(e) = self.on_message(key, msg, fast, allowed, &mut queue, &mut out) {
                    return e;
                }
            }
            inbuf.drain(..pos);
            if inbuf.is_empty() && inbuf.capacity() > 0 {
                inbuf = Vec::new(); // an idle peer keeps no buffer
            }
            // 2. The choker's decision.
            let choked = self.swarm.borrow().peers[key].choked;
            if choked != sent_choked {
                sent_choked = choked;
                if choked {
                    wire::encode(&Message::Choke, &mut out);
                    // BEP 6: a choke cancels pending requests, each explicitly rejected.
                    queue.retain(|r| {
                        let keep = fast && allowed.contains(&r.index);
                        if fast && !keep {
                            wire::encode(
                                &Message::Reject {
                                    index: r.index,
                                    begin: r.begin,
                                    length: r.length,
                                },
                                &mut out,
                            );
                        }
                        keep
                    });
                } else {
                    wire::encode(&Message::Unchoke, &mut out);
                }
            }
            // 3. Serve up to `batch` queued blocks in one send. Their reads run together
            // (with io_uring, one submission for all of them), not one after the other.
            let mut served = 0;
            let mut batch = Vec::new();
            while batch.len() < self.cfg.batch {
                let Some(r) = queue.front().copied() else {
                    break;
                };
                if sent_choked && !(fast && allowed.contains(&r.index)) {
                    break;
                }
                queue.pop_front();
                batch.push(r);
            }
            let reads = batch.iter().map(|r| {
                let off = r.index as u64 * self.meta.piece_length + r.begin as u64;
                self.storage.read(off, r.length as usize)
            });
            let datas = join_all(reads.collect()).await;
            // One gathered send: protocol bytes from `out`, blocks as the disk gave them
            // (no copy into one buffer; from the mapping itself on the mmap path).
            let mut chunks: Vec<Chunk> = Vec::new();
            for (r, data) in batch.into_iter().zip(datas) {
                match data {
                    Ok(data) => {
                        out.extend_from_slice(&wire::piece_header(r.index, r.begin, r.length));
                        chunks.push(Chunk::new(Block::Owned(std::mem::take(&mut out))));
                        chunks.push(Chunk::new(data));
                        served += 1;
                    }
                    Err(_) => {
                        inc(&self.counters.disk_errors);
                        if fast {
                            wire::encode(
                                &Message::Reject {
                                    index: r.index,
                                    begin: r.begin,
                                    length: r.length,
                                },
                                &mut out,
                            );
                        }
                    }
                }
            }
            if queue.is_empty() && queue.capacity() > 0 {
                queue = VecDeque::new();
            }
            if !out.is_empty() {
                chunks.push(Chunk::new(Block::Owned(std::mem::take(&mut out))));
            }
            if !chunks.is_empty() {
                let bytes: usize = chunks.iter().map(iolab_runtime::IoBuf::len).sum();
                if let Err(e) = self.send_chunks(stream, chunks).await {
                    return End::Io(e);
                }
                if served > 0 {
                    let payload = bytes as u64; // headers included: close enough for rates
                    self.counters
                        .blocks_sent
                        .fetch_add(served as u64, Ordering::Relaxed);
                    self.counters
                        .bytes_sent
                        .fetch_add(payload, Ordering::Relaxed);
                    self.swarm.borrow_mut().peers[key].uploaded += payload;
                }
                // Input that arrived meanwhile (cancels, more requests) before more work.
                match recv_into(stream, &mut inbuf) {
                    Ok(0) => return End::Closed,
                    Ok(_) => last_input = Instant::now(),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return End::Io(e),
                }
                continue;
            }
            // 4. Nothing to do: wait for input or the choker.
            let idle_left = self.cfg.idle_timeout.saturating_sub(last_input.elapsed());
            if idle_left.is_zero() {
                return End::Idle;
            }
            match timeout(idle_left, wait_readable_or_cancel(stream.as_raw_fd(), wake)).await {
                Err(_) => return End::Idle,
                Ok(Err(e)) if Cancelled::is(&e) => continue,
                Ok(Err(e)) => return End::Io(e),
                Ok(Ok(())) => {}
            }
            match recv_into(stream, &mut inbuf) {
                Ok(0) => return End::Closed,
                Ok(_) => last_input = Instant::now(),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return End::Io(e),
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_message(
        &self,
        key: usize,
        msg: Message<'_>,
        fast: bool,
        allowed: &[u32],
        queue: &mut VecDeque<Req>,
        out: &mut Vec<u8>,
    ) -> Result<(), End> {
        let npieces = self.meta.num_pieces();
        let reject = |out: &mut Vec<u8>, r: Req| {
            inc(&self.counters.requests_rejected);
            if fast {
                wire::encode(
                    &Message::Reject {
                        index: r.index,
                        begin: r.begin,
                        length: r.length,
                    },
                    out,
                );
            }
        };
        match msg {
            Message::KeepAlive | Message::Choke | Message::Unchoke | Message::Port(_) => {}
            Message::Interested => self.set_interested(key, true),
            Message::NotInterested => self.set_interested(key, false),
            Message::Have(i) => {
                if i >= npieces {
                    return Err(End::Garbage(format!("have of piece {i} of {npieces}")));
                }
            }
            Message::Bitfield(b) => {
                // Clients (aria2) send bitfields again mid-connection: only the size is checked.
                if b.len() != npieces.div_ceil(8) as usize {
                    return Err(End::Garbage(format!(
                        "bitfield of {} bytes for {npieces} pieces",
                        b.len()
                    )));
                }
            }
            Message::HaveAll | Message::HaveNone => {
                if !fast {
                    return Err(End::Garbage(
                        "fast-extension message without the extension".into(),
                    ));
                }
            }
            Message::Request {
                index,
                begin,
                length,
            } => {
                let r = Req {
                    index,
                    begin,
                    length,
                };
                if index >= npieces || begin as u64 >= self.meta.piece_len(index) || length == 0 {
                    return Err(End::Garbage(format!(
                        "request outside the torrent: piece {index} offset {begin} length {length}"
                    )));
                }
                if !wire::check_request(index, begin, length, npieces, |i| self.meta.piece_len(i)) {
                    // Too long (> 16 KiB) or running past the piece's end.
                    reject(out, r);
                } else if (self.swarm.borrow().peers[key].choked
                    && !(fast && allowed.contains(&index)))
                    || queue.len() >= self.cfg.max_queue
                {
                    // Choked (and not allowed-fast), or the queue is full.
                    reject(out, r);
                } else {
                    queue.push_back(r);
                }
            }
            Message::Cancel {
                index,
                begin,
                length,
            } => {
                let r = Req {
                    index,
                    begin,
                    length,
                };
                if let Some(p) = queue.iter().position(|q| *q == r) {
                    queue.remove(p);
                    if fast {
                        // BEP 6: a cancelled request is answered with a reject.
                        wire::encode(
                            &Message::Reject {
                                index,
                                begin,
                                length,
                            },
                            out,
                        );
                    }
                }
            }
            Message::Piece { .. } => {
                // We never request; a seeder ignores unsolicited data (bounded by the cap).
            }
            Message::Suggest(_) | Message::AllowedFast(_) | Message::Reject { .. } => {
                if !fast {
                    return Err(End::Garbage(
                        "fast-extension message without the extension".into(),
                    ));
                }
            }
            Message::Extended { id, payload } => {
                if id == 0 {
                    // The extension handshake: must be a bencoded dictionary.
                    match lava_torrent::bencode::BencodeElem::from_bytes(payload) {
                        Ok(v)
                            if v.len() == 1
                                && matches!(
                                    v[0],
                                    lava_torrent::bencode::BencodeElem::Dictionary(_)
                                        | lava_torrent::bencode::BencodeElem::RawDictionary(_)
                                ) => {}
                        _ => {
                            return Err(End::Garbage(
                                "extension handshake is not a bencoded dictionary".into(),
                            ))
                        }
                    }
                }
                // Other extensions (ut_metadata, ut_pex) are not offered: ignored.
            }
        }
        Ok(())
    }

    fn set_interested(&self, key: usize, on: bool) {
        let mut sw = self.swarm.borrow_mut();
        if sw.peers[key].interested == on {
            return;
        }
        sw.peers[key].interested = on;
        let free_slot = self.cfg.slots == 0 || sw.unchoked < self.cfg.slots;
        if !on || free_slot {
            // Interested with a slot free: unchoked now, not at the next round.
            sw.set_choked(key, !on, &self.counters.unchoked_now);
        }
    }

    /// The choker: every round, the interested peers with the best upload rate over the last
    /// round get `slots - 1` slots; one more slot goes optimistically to a choked interested
    /// peer, moved every third round (so a newcomer gets a chance to show its rate).
    async fn choker(self: Rc<Self>) {
        let mut round = 0u64;
        loop {
            sleep(self.cfg.choke_interval).await;
            round += 1;
            let mut sw = self.swarm.borrow_mut();
            let mut ranked: Vec<(u64, usize)> = Vec::new();
            let mut optimistic = None;
            for (k, p) in sw.peers.iter_mut() {
                let rate = p.uploaded - p.uploaded_last_round;
                p.uploaded_last_round = p.uploaded;
                if p.optimistic {
                    optimistic = Some(k);
                }
                if p.interested {
                    ranked.push((rate, k));
                }
            }
            ranked.sort_unstable_by_key(|x| std::cmp::Reverse(x.0));
            let regular = self.cfg.slots.saturating_sub(1).max(1);
            let mut unchoke: Vec<usize> = ranked.iter().take(regular).map(|x| x.1).collect();
            if round % 3 == 0 || optimistic.is_none_or(|k| !sw.peers[k].interested) {
                let rest: Vec<usize> = ranked.iter().skip(regular).map(|x| x.1).collect();
                optimistic = if rest.is_empty() {
                    None
                } else {
                    Some(rest[rand::random_range(0..rest.len())])
                };
            }
            if let Some(k) = optimistic {
                if !unchoke.contains(&k) && self.cfg.slots > 1 {
                    unchoke.push(k);
                }
            }
            let keys: Vec<usize> = sw.peers.iter().map(|(k, _)| k).collect();
            for k in keys {
                let want = unchoke.contains(&k);
                sw.set_choked(k, !want, &self.counters.unchoked_now);
                sw.peers[k].optimistic = Some(k) == optimistic && want;
            }
        }
    }

    /// Sends every byte of `chunks` (gathered sends until done), within the send timeout.
    async fn send_chunks(&self, stream: &TcpStream, mut chunks: Vec<Chunk>) -> io::Result<()> {
        let all = async {
            while !chunks.is_empty() {
                let (r, back) = stream.writev(chunks).await;
                chunks = back;
                match r? {
                    0 => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                    n => advance(&mut chunks, n),
                }
            }
            Ok(())
        };
        match timeout(self.cfg.send_timeout, all).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "send timed out")),
        }
    }

    async fn send(&self, stream: &TcpStream, buf: Vec<u8>) -> io::Result<()> {
        match timeout(self.cfg.send_timeout, stream.write_all(buf)).await {
            Ok((r, _)) => r,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "send timed out")),
        }
    }
}

/// `IOLAB_SEED_DEBUG=1` prints why each peer's connection ended.
fn debug_peers() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("IOLAB_SEED_DEBUG").is_some_and(|v| v != "0"))
}

fn is_transient_accept(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::ECONNABORTED)
    )
}

/// One non-blocking receive into the loop's scratch buffer, appended to `inbuf`.
fn recv_into(stream: &TcpStream, inbuf: &mut Vec<u8>) -> io::Result<usize> {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        // SAFETY: `s` is a live buffer of s.len() bytes, exclusively borrowed here; recv
        // writes at most that many bytes into it.
        let n = unsafe {
            libc::recv(
                stream.as_raw_fd(),
                s.as_mut_ptr() as *mut libc::c_void,
                s.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        inbuf.extend_from_slice(&s[..n]);
        Ok(n)
    })
}

/// A message for the debug log, with payloads abbreviated.
struct DebugMsg<'a, 'b>(&'a Message<'b>);

impl std::fmt::Debug for DebugMsg<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Message::Bitfield(b) => write!(f, "Bitfield({} bytes)", b.len()),
            Message::Piece { index, begin, data } => {
                write!(f, "Piece({index}, {begin}, {} bytes)", data.len())
            }
            Message::Extended { id, payload } => {
                write!(
                    f,
                    "Extended({id}, {:?})",
                    String::from_utf8_lossy(&payload[..payload.len().min(200)])
                )
            }
            m => write!(f, "{m:?}"),
        }
    }
}

/// Runs the futures together and returns their outputs in order (a small `join_all`).
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot() -> PeerSlot {
        PeerSlot {
            interested: true,
            choked: true,
            optimistic: false,
            uploaded: 0,
            uploaded_last_round: 0,
            wake: Cond::new(),
        }
    }

    #[test]
    fn set_choked_keeps_the_unchoked_count_in_step() {
        let counter = AtomicU64::new(0);
        let mut sw = Swarm {
            peers: Slab::new(),
            unchoked: 0,
        };
        let a = sw.peers.insert(slot());
        let b = sw.peers.insert(slot());
        sw.set_choked(a, false, &counter);
        sw.set_choked(a, false, &counter); // no change: counted once
        sw.set_choked(b, false, &counter);
        assert_eq!((sw.unchoked, counter.load(Ordering::Relaxed)), (2, 2));
        sw.peers[b].optimistic = true;
        sw.set_choked(b, true, &counter);
        assert!(
            !sw.peers[b].optimistic,
            "a choked peer holds no optimistic slot"
        );
        sw.set_choked(b, true, &counter);
        assert_eq!((sw.unchoked, counter.load(Ordering::Relaxed)), (1, 1));
    }
}
