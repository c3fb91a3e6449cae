//! The seeding engine: one lightweight task per peer on an iolab-runtime loop, a choker
//! task per torrent, an announcer task per torrent (the binary's). Everything a peer can
//! make us do is bounded (see [`Config`]). A [`Seeder`] is one torrent's state (its swarm,
//! choker, dialler and counters); a [`Host`] holds the torrents of a process, accepts on
//! its listeners and routes each peer to its torrent by info hash ([`host`]).
//!
//! A peer task is written in threaded style, CPC's way: wait until the socket is readable
//! or until the choker wakes it (a [`Cond`]), parse every complete message, serve queued
//! requests (disk read through [`Storage`], then one send), repeat. An idle peer holds no
//! buffer: input is received into a per-loop scratch buffer, and only the bytes of an
//! incomplete message are kept.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
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

use iolab_runtime::net::TcpStream;
use iolab_runtime::{sleep, timeout, wait_readable, wait_readable_or_cancel, Cancelled, Cond};
use serde::Serialize;

use crate::choker::{self, ChokeLimits, PeerSlot, Swarm, SNUB_TICK};
use crate::dial::{DialLimits, Dialer};
use crate::disk::{advance, Block, Chunk, DiskMode, Storage};
use crate::hashes::Trees;
use crate::link::{self, recv_into};
use crate::metadata;
use crate::metainfo::Meta;
use crate::mse::{Policy, Rc4Pair};
use crate::wire::{self, Handshake, HashReq, Limits, Message, WireError};
pub use host::Host;
use utp_mux::UtpLimits;

pub mod host;
mod utp_mux;

/// The longest wait, after our handshake to a peer that dialled us, for its first message
/// before we send ours ([`Seeder::session`]).
const AFTER_HANDSHAKE_PAUSE: Duration = Duration::from_millis(100);

/// BEP 52 hash requests answered per peer between two sends (16 KiB of hashes each at
/// most); more are rejected, so that a 53-byte request cannot make us queue unbounded
/// output. libtorrent keeps two outstanding.
pub const MAX_HASH_ANSWERS: usize = 16;

/// Limits and knobs of the seeder.
#[derive(Debug, Clone)]
pub struct Config {
    /// Upload slots: peers unchoked at once (the best uploaders by rate, one of them an
    /// optimistic slot rotated every 30 s); 0 = every interested peer is unchoked.
    pub slots: usize,
    /// Connections held at once by the process, all torrents together (accepted, dialled,
    /// uTP, handshaking or not); more are closed at accept and not dialled.
    pub max_peers: usize,
    /// Torrents one process seeds at most ([`Host::add`] refuses more).
    pub max_torrents: usize,
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
    /// The send-progress deadline: a peer that takes none of the data waiting for it (a
    /// write that does not advance, or bytes left unacknowledged in the socket's send
    /// queue) for this long is dropped. Well under the 60 s it used to be: such a peer
    /// held an upload slot all that time.
    pub send_timeout: Duration,
    /// A peer that takes nothing for this long while data waits for it, or while it is
    /// unchoked and interested, is snubbed: choked and ranked last ([`crate::choker`]).
    pub snub_after: Duration,
    /// Blocks sent in one write (gathered into one buffer).
    pub batch: usize,
    /// Period of the choker's rounds.
    pub choke_interval: Duration,
    /// Allowed-fast pieces offered to fast-extension peers (BEP 6).
    pub allowed_fast: usize,
    pub disk: DiskMode,
    /// Keep the kernel's read-ahead on the data files (default off: random access hint).
    pub read_ahead: bool,
    /// MSE/PE (`--encryption`): what is accepted and chosen ([`crate::mse`]).
    pub encryption: Policy,
    /// Dialling out to tracker peers ([`crate::dial`]).
    pub dial: DialLimits,
    /// Accept uTP (BEP 29) on the listener's port number over UDP (`--utp`).
    pub utp: bool,
    pub utp_limits: UtpLimits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            slots: 8,
            max_peers: 20_000,
            max_torrents: 1000,
            max_queue: 2000,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            send_timeout: Duration::from_secs(20),
            snub_after: Duration::from_secs(5),
            batch: 4,
            choke_interval: Duration::from_secs(10),
            allowed_fast: 10,
            disk: DiskMode::Uring,
            read_ahead: false,
            encryption: Policy::Prefer,
            dial: DialLimits::default(),
            // On, as in the clients: stock Transmission tries uTP first and never falls
            // back to TCP (tests/seeder.rs: libtorrent and Transmission download over it).
            utp: true,
            utp_limits: UtpLimits::default(),
        }
    }
}

/// Live counters (atomics: read by the stats printer and the bench from other threads).
/// Each torrent has its own (what its peers did once routed to it, its dials); the process
/// has one more for what happens before a connection is routed ([`Process`]): accepts,
/// openings, MSE, unknown info hashes, uTP. Each event is counted once, in one of them, so
/// the totals are their sums ([`totals`]).
#[derive(Debug, Default, Serialize)]
pub struct Counters {
    /// Handshaken peers now (accepted and dialled).
    pub peers_now: AtomicU64,
    /// Peers that connected to us over TCP.
    pub peers_accepted: AtomicU64,
    /// Accepted peers (TCP or uTP) that completed a handshake for this torrent; of them,
    /// those over uTP and those that opened with MSE.
    pub peers_handshaken: AtomicU64,
    pub utp_handshaken: AtomicU64,
    pub mse_handshaken: AtomicU64,
    /// Peers that connected to us over uTP (a SYN taken: socket pair and session made).
    pub utp_accepted: AtomicU64,
    /// SYNs dropped at the half-open limit (or for want of a socket pair).
    pub utp_refused: AtomicU64,
    /// uTP connections closed by a RESET, by a deadline (handshake, retransmissions, idle,
    /// FIN).
    pub utp_resets: AtomicU64,
    pub utp_timeouts: AtomicU64,
    /// Datagrams that are not uTP packets; packets for no connection of ours.
    pub utp_garbage: AtomicU64,
    pub utp_unknown: AtomicU64,
    /// Tracker peers we dialled, those that completed the handshake, those that failed
    /// (connect, MSE or handshake).
    pub peers_dialled: AtomicU64,
    pub peers_dialled_handshaken: AtomicU64,
    pub dial_failures: AtomicU64,
    pub peers_refused_full: AtomicU64,
    /// Dropped for a protocol violation (garbage, bad handshake, out-of-bounds request, ...).
    pub peers_dropped_garbage: AtomicU64,
    /// Closed for an info hash (plain, or MSE's req2) of none of our torrents.
    pub peers_wrong_torrent: AtomicU64,
    /// Connections that opened with MSE/PE (closed at once under `--encryption off`; not
    /// counted as bad peers).
    pub mse_openings: AtomicU64,
    /// MSE exchanges completed (either way), and how many of them chose RC4.
    pub mse_established: AtomicU64,
    pub mse_rc4: AtomicU64,
    /// MSE exchanges that failed (bad hashes, timeouts, no method in common, ...).
    pub mse_failures: AtomicU64,
    /// Plaintext handshakes closed under `--encryption require`.
    pub plaintext_refused: AtomicU64,
    pub handshake_timeouts: AtomicU64,
    pub idle_timeouts: AtomicU64,
    pub send_failures: AtomicU64,
    /// Dropped at the send-progress deadline (took nothing for `send_timeout`).
    pub send_stalls: AtomicU64,
    /// Times a peer was snubbed (took nothing for `snub_after`).
    pub peers_snubbed: AtomicU64,
    pub blocks_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub requests_rejected: AtomicU64,
    /// BEP 52 hash requests answered with hashes, and rejected.
    pub hash_requests_served: AtomicU64,
    pub hash_requests_rejected: AtomicU64,
    pub disk_errors: AtomicU64,
    pub unchoked_now: AtomicU64,
}

impl Counters {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// The field-by-field sums of `parts` as a JSON object (the totals of a process: its
/// [`Process`] counters and every torrent's).
pub fn totals<'a>(parts: impl IntoIterator<Item = &'a Counters>) -> serde_json::Value {
    let mut sum = serde_json::Map::new();
    for c in parts {
        if let Ok(serde_json::Value::Object(m)) = serde_json::to_value(c) {
            for (k, v) in m {
                let add = v.as_u64().unwrap_or(0);
                let old = sum.get(&k).and_then(serde_json::Value::as_u64).unwrap_or(0);
                sum.insert(k, old.saturating_add(add).into());
            }
        }
    }
    serde_json::Value::Object(sum)
}

/// What the torrents of one process share: the connections held (bounded by
/// [`Config::max_peers`]), the counters of connections not yet routed to a torrent, and
/// our peer id.
#[derive(Debug)]
pub struct Process {
    /// Connections held now, all torrents, handshaking or not.
    pub connections: AtomicU64,
    pub counters: Counters,
    pub peer_id: [u8; 20],
}

impl Default for Process {
    fn default() -> Self {
        Process {
            connections: AtomicU64::new(0),
            counters: Counters::default(),
            peer_id: wire::make_peer_id(),
        }
    }
}

impl Process {
    /// Whether `max` connections are held already.
    pub(crate) fn full(&self, max: usize) -> bool {
        Counters::get(&self.connections) as usize >= max
    }
}

pub(crate) fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Req {
    index: u32,
    begin: u32,
    length: u32,
}

impl Req {
    /// Appends the BEP 6 reject of this request to `out`.
    fn reject(self, out: &mut Vec<u8>) {
        wire::encode(
            &Message::Reject {
                index: self.index,
                begin: self.begin,
                length: self.length,
            },
            out,
        );
    }
}

/// A peer's task state between its turns: what it negotiated, its queued requests and the
/// protocol bytes waiting to be sent.
struct Peer<'a> {
    key: usize,
    /// The peer has the fast extension (BEP 6): rejects are sent, allowed-fast pieces served
    /// while choked.
    fast: bool,
    allowed: &'a [u32],
    /// The peer's id for ut_metadata messages (BEP 9), from its extension handshake.
    ut_metadata: Option<u8>,
    queue: VecDeque<Req>,
    /// Hash requests answered since the last send ([`MAX_HASH_ANSWERS`]).
    hash_answers: usize,
    /// What the peer was last told.
    sent_choked: bool,
    out: Vec<u8>,
    /// RC4 both ways when MSE chose it.
    rc4: Option<Rc4Pair>,
}

impl Peer<'_> {
    /// Whether `r` may be served while the peer is choked (an allowed-fast piece).
    fn allowed_fast(&self, r: &Req) -> bool {
        self.fast && self.allowed.contains(&r.index)
    }

    /// Rejects `r` to a fast-extension peer; others cannot be told.
    fn reject(&mut self, r: Req) {
        if self.fast {
            r.reject(&mut self.out);
        }
    }
}

pub struct Seeder {
    pub meta: Arc<Meta>,
    pub storage: Storage,
    pub cfg: Config,
    pub counters: Arc<Counters>,
    pub peer_id: [u8; 20],
    /// What this process's torrents share.
    pub process: Arc<Process>,
    limits: Limits,
    /// The v2 files' merkle trees, for BEP 52 hash requests.
    trees: Trees,
    swarm: RefCell<Swarm>,
    /// Which tracker peers to dial ([`crate::dial`]).
    pub(crate) dialer: RefCell<Dialer>,
    /// Peer ids of the handshaken peers (and how many connections each): a dialled peer
    /// already connected is closed.
    peer_ids: RefCell<HashMap<[u8; 20], usize>>,
}

/// Why a peer's task ended (the payloads are read through `Debug` in the debug log).
#[derive(Debug)]
#[allow(dead_code)]
pub(crate) enum End {
    Closed,
    Garbage(String),
    WrongTorrent,
    HandshakeTimeout,
    Idle,
    /// Took nothing of what was sent for `send_timeout`.
    SendStalled,
    /// The peer opened with MSE/PE under `--encryption off`.
    MseOpening,
    /// The MSE exchange failed.
    MseFailed(String),
    /// A plaintext handshake under `--encryption require`.
    PlaintextRefused,
    /// A dialled peer is us, or already connected.
    Ourselves,
    Io(io::Error),
}

impl From<WireError> for End {
    fn from(e: WireError) -> End {
        End::Garbage(e.to_string())
    }
}

impl Seeder {
    /// One torrent of the process `process` (its data files opened).
    pub fn new(meta: Arc<Meta>, cfg: Config, process: Arc<Process>) -> io::Result<Rc<Seeder>> {
        let storage = Storage::open(meta.clone(), cfg.disk, cfg.read_ahead)?;
        let limits = Limits::for_pieces(meta.num_pieces());
        let trees = Trees::new(&meta);
        let cfg_dial = cfg.dial;
        Ok(Rc::new(Seeder {
            meta,
            storage,
            cfg,
            counters: Arc::new(Counters::default()),
            peer_id: process.peer_id,
            process,
            limits,
            trees,
            swarm: RefCell::new(Swarm::new()),
            dialer: RefCell::new(Dialer::new(cfg_dial)),
            peer_ids: RefCell::new(HashMap::new()),
        }))
    }

    /// Our BitTorrent handshake for `info_hash` (the peer's, which named this torrent: a
    /// hybrid's v1 or truncated v2 hash): the fast and extension bits, BEP 52's v2 bit for
    /// a torrent with a v2 side, our peer id.
    pub(crate) fn our_handshake(&self, info_hash: [u8; 20]) -> [u8; wire::HANDSHAKE_LEN] {
        let mut reserved = [0u8; 8];
        reserved[wire::RESERVED_FAST.0] |= wire::RESERVED_FAST.1;
        reserved[wire::RESERVED_EXTENDED.0] |= wire::RESERVED_EXTENDED.1;
        if self.meta.v2.is_some() {
            reserved[wire::RESERVED_V2.0] |= wire::RESERVED_V2.1;
        }
        Handshake {
            reserved,
            info_hash,
            peer_id: self.peer_id,
        }
        .encode()
    }

    /// Whether ut_metadata (BEP 9) is offered: we have the info dictionary, not too big.
    fn offers_metadata(&self) -> bool {
        !self.meta.info.is_empty() && self.meta.info.len() <= metadata::MAX_METADATA
    }

    /// Logs why a peer's connection ended (`IOLAB_SEED_DEBUG`).
    pub(crate) fn log_end(&self, addr: SocketAddr, end: &End) {
        log_end(addr, end);
    }

    /// Counts why a peer's connection ended (in this torrent's counters).
    pub(crate) fn count_end(&self, addr: SocketAddr, end: End) {
        log_end(addr, &end);
        count_end(&self.counters, end);
    }

    /// Starts the choker ([`Host::start`] does, for every torrent).
    pub(crate) fn start_choker(self: &Rc<Self>) {
        iolab_runtime::spawn(self.clone().choker());
    }

    /// Whether a peer with this id is handshaken with us.
    pub(crate) fn is_connected(&self, peer_id: &[u8; 20]) -> bool {
        self.peer_ids.borrow().contains_key(peer_id)
    }

    /// A handshaken peer: our handshake (unless we dialled and sent it already), extension
    /// handshake, what we have, then the message loop until it ends.
    pub(crate) async fn session(
        &self,
        stream: &TcpStream,
        addr: SocketAddr,
        hs: Handshake,
        inbuf: Vec<u8>,
        mut rc4: Option<Rc4Pair>,
        send_handshake: bool,
    ) -> End {
        let fast = hs.fast();
        let extended = hs.extended();
        let mut out = Vec::new();
        if send_handshake {
            if let Err(e) = self
                .send(stream, self.our_handshake(hs.info_hash).to_vec(), &mut rc4)
                .await
            {
                return End::Io(e);
            }
            if inbuf.is_empty() {
                // Transmission 3.00, having dialled us, drops whatever arrives in the read
                // that completes our handshake (over uTP, where our handshake and what
                // follows travel in one packet, it never saw our pieces and never asked
                // for one). So what follows goes once the peer has sent something after
                // its handshake, as every client does at once, or after a short pause.
                let _ = timeout(AFTER_HANDSHAKE_PAUSE, wait_readable(stream.as_raw_fd())).await;
            }
        }
        if extended {
            let size = if self.offers_metadata() {
                self.meta.info.len()
            } else {
                0
            };
            let payload = metadata::our_handshake(self.cfg.max_queue, size);
            wire::encode(
                &Message::Extended {
                    id: 0,
                    payload: &payload,
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
        if let Err(e) = self.send(stream, out, &mut rc4).await {
            return End::Io(e);
        }

        let wake = Cond::new();
        let key = self
            .swarm
            .borrow_mut()
            .peers
            .insert(PeerSlot::new(stream.as_raw_fd(), wake.clone()));
        let peer = Peer {
            key,
            fast,
            allowed: &allowed,
            ut_metadata: None,
            queue: VecDeque::new(),
            hash_answers: 0,
            sent_choked: true,
            out: Vec::new(),
            rc4,
        };
        *self.peer_ids.borrow_mut().entry(hs.peer_id).or_default() += 1;
        let end = self.run_peer(stream, &wake, peer, inbuf).await;
        let mut ids = self.peer_ids.borrow_mut();
        if let Some(n) = ids.get_mut(&hs.peer_id) {
            *n -= 1;
            if *n == 0 {
                ids.remove(&hs.peer_id);
            }
        }
        drop(ids);
        let mut sw = self.swarm.borrow_mut();
        sw.set_choked(key, true, &self.counters.unchoked_now);
        sw.peers.remove(key);
        end
    }

    /// The message loop of a handshaken peer.
    async fn run_peer(
        &self,
        stream: &TcpStream,
        wake: &Cond,
        mut peer: Peer<'_>,
        mut inbuf: Vec<u8>,
    ) -> End {
        let key = peer.key;
        let mut last_input = Instant::now();
        loop {
            // 0. The choker found it taking nothing for the send timeout.
            if self.swarm.borrow().peers[key].stalled {
                return End::SendStalled;
            }
            // 1. Every complete message in the input.
            if let Err(e) = self.on_input(&mut peer, &mut inbuf) {
                return e;
            }
            // 2. The choker's decision.
            self.tell_choke(&mut peer);
            // 3. Serve up to `batch` queued blocks in one send.
            match self.serve_batch(stream, &mut peer).await {
                Err(e) => return e,
                Ok(true) => {
                    // Input that arrived meanwhile (cancels, more requests) before more work.
                    if let Err(e) = take_input(stream, &mut inbuf, &mut last_input, &mut peer.rc4) {
                        return e;
                    }
                    continue;
                }
                Ok(false) => {}
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
            if let Err(e) = take_input(stream, &mut inbuf, &mut last_input, &mut peer.rc4) {
                return e;
            }
        }
    }

    /// Acts on every complete message in `inbuf` and drops them from it.
    fn on_input(&self, peer: &mut Peer, inbuf: &mut Vec<u8>) -> Result<(), End> {
        // What was answered before has been sent (`serve_batch` sends `out` whole).
        peer.hash_answers = 0;
        let mut pos = 0;
        loop {
            let (msg, n) = match wire::parse(&inbuf[pos..], self.limits) {
                Ok(Some(x)) => x,
                Ok(None) => break,
                Err(e) => return Err(e.into()),
            };
            pos += n;
            if debug_peers() && !matches!(msg, Message::Request { .. }) {
                tracing::info!(target: "progress", "seed: peer {}: {:?}", peer.key, DebugMsg(&msg));
            }
            self.on_message(peer, msg)?;
        }
        inbuf.drain(..pos);
        if inbuf.is_empty() && inbuf.capacity() > 0 {
            *inbuf = Vec::new(); // an idle peer keeps no buffer
        }
        Ok(())
    }

    /// Tells the peer when the choker changed its mind; BEP 6: a choke cancels the pending
    /// requests, each explicitly rejected (but those of allowed-fast pieces).
    fn tell_choke(&self, peer: &mut Peer) {
        let choked = self.swarm.borrow().peers[peer.key].choked;
        if choked == peer.sent_choked {
            return;
        }
        peer.sent_choked = choked;
        if !choked {
            wire::encode(&Message::Unchoke, &mut peer.out);
            return;
        }
        wire::encode(&Message::Choke, &mut peer.out);
        let queue = std::mem::take(&mut peer.queue);
        for r in queue {
            if peer.allowed_fast(&r) {
                peer.queue.push_back(r);
            } else {
                peer.reject(r);
            }
        }
    }

    /// Serves up to `batch` queued blocks (and the protocol bytes waiting) in one gathered
    /// send. Their reads run together (with io_uring, one submission for all of them), not
    /// one after the other. `Ok(false)`: nothing was sent.
    async fn serve_batch(&self, stream: &TcpStream, peer: &mut Peer<'_>) -> Result<bool, End> {
        let mut batch = Vec::new();
        while batch.len() < self.cfg.batch {
            let Some(r) = peer.queue.front().copied() else {
                break;
            };
            if peer.sent_choked && !peer.allowed_fast(&r) {
                break;
            }
            peer.queue.pop_front();
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
        let mut served = 0;
        for (r, data) in batch.into_iter().zip(datas) {
            match data {
                Ok(data) => {
                    peer.out
                        .extend_from_slice(&wire::piece_header(r.index, r.begin, r.length));
                    chunks.push(Chunk::new(Block::Owned(std::mem::take(&mut peer.out))));
                    chunks.push(Chunk::new(data));
                    served += 1;
                }
                Err(_) => {
                    inc(&self.counters.disk_errors);
                    peer.reject(r);
                }
            }
        }
        if peer.queue.is_empty() && peer.queue.capacity() > 0 {
            peer.queue = VecDeque::new();
        }
        if !peer.out.is_empty() {
            chunks.push(Chunk::new(Block::Owned(std::mem::take(&mut peer.out))));
        }
        if chunks.is_empty() {
            return Ok(false);
        }
        let bytes: usize = chunks.iter().map(iolab_runtime::IoBuf::len).sum();
        let sealed = link::seal(chunks, &mut peer.rc4).map_err(End::Io)?;
        self.send_chunks(stream, peer.key, sealed).await?;
        if served > 0 {
            let payload = bytes as u64; // headers included: close enough for rates
            self.counters
                .blocks_sent
                .fetch_add(served as u64, Ordering::Relaxed);
            self.counters
                .bytes_sent
                .fetch_add(payload, Ordering::Relaxed);
        }
        Ok(true)
    }

    fn on_message(&self, peer: &mut Peer, msg: Message<'_>) -> Result<(), End> {
        let key = peer.key;
        let fast = peer.fast;
        let npieces = self.meta.num_pieces();
        let cancel = matches!(msg, Message::Cancel { .. });
        let refuse = |peer: &mut Peer, r: Req| {
            inc(&self.counters.requests_rejected);
            peer.reject(r);
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
            Message::HaveAll
            | Message::HaveNone
            | Message::Suggest(_)
            | Message::AllowedFast(_)
            | Message::Reject { .. } => {
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
            }
            | Message::Cancel {
                index,
                begin,
                length,
            } => {
                let r = Req {
                    index,
                    begin,
                    length,
                };
                if cancel {
                    if let Some(p) = peer.queue.iter().position(|q| *q == r) {
                        peer.queue.remove(p);
                        // BEP 6: a cancelled request is answered with a reject.
                        peer.reject(r);
                    }
                    return Ok(());
                }
                if index >= npieces || begin as u64 >= self.meta.piece_len(index) || length == 0 {
                    return Err(End::Garbage(format!(
                        "request outside the torrent: piece {index} offset {begin} length {length}"
                    )));
                }
                if !wire::check_request(index, begin, length, npieces, |i| self.meta.piece_len(i)) {
                    // Too long (> 16 KiB) or running past the piece's end.
                    refuse(peer, r);
                } else if (self.swarm.borrow().peers[key].choked && !peer.allowed_fast(&r))
                    || peer.queue.len() >= self.cfg.max_queue
                {
                    // Choked (and not allowed-fast), or the queue is full.
                    refuse(peer, r);
                } else {
                    peer.queue.push_back(r);
                }
            }
            Message::Piece { .. } => {
                // We never request; a seeder ignores unsolicited data (bounded by the cap).
            }
            Message::Extended { id: 0, payload } => {
                // The extension handshake: a bencoded dictionary, maybe with the id the
                // peer takes ut_metadata messages with.
                peer.ut_metadata = metadata::peer_handshake(payload).map_err(End::Garbage)?;
            }
            Message::Extended {
                id: metadata::UT_METADATA_ID,
                payload,
            } if self.offers_metadata() => {
                // BEP 9: a request is answered with the piece, or a reject out of range.
                let piece = metadata::parse_message(payload).map_err(End::Garbage)?;
                if let (Some(piece), Some(their_id)) = (piece, peer.ut_metadata) {
                    let answer = metadata::answer(&self.meta.info, piece);
                    wire::encode(
                        &Message::Extended {
                            id: their_id,
                            payload: &answer,
                        },
                        &mut peer.out,
                    );
                }
            }
            Message::Extended { .. } => {
                // Extensions we do not offer (ut_pex, ...): ignored.
            }
            Message::HashRequest(r) => self.on_hash_request(peer, r),
            Message::Hashes { .. } | Message::HashReject(_) => {
                // We never ask for hashes; unsolicited ones are ignored (bounded by the cap).
            }
        }
        Ok(())
    }

    /// BEP 52: the hashes asked for with their proof, or a hash reject (out of bounds, not
    /// ours, or past [`MAX_HASH_ANSWERS`] since the last send).
    fn on_hash_request(&self, peer: &mut Peer, r: HashReq) {
        let answer = (peer.hash_answers < MAX_HASH_ANSWERS)
            .then(|| self.trees.answer(&r))
            .flatten();
        match answer {
            Some(hashes) => {
                peer.hash_answers += 1;
                inc(&self.counters.hash_requests_served);
                wire::encode_hashes(&r, &hashes, &mut peer.out);
            }
            None => {
                inc(&self.counters.hash_requests_rejected);
                wire::encode(&Message::HashReject(r), &mut peer.out);
            }
        }
    }

    fn set_interested(&self, key: usize, on: bool) {
        self.swarm.borrow_mut().set_interested(
            key,
            on,
            self.cfg.slots,
            &self.counters.unchoked_now,
        );
    }

    /// The choker ([`crate::choker`]): a snub pass every second (peers that take nothing
    /// are choked, or dropped at the send-progress deadline), a rechoke round every
    /// `choke_interval` when slots are limited.
    async fn choker(self: Rc<Self>) {
        let lim = ChokeLimits {
            slots: self.cfg.slots,
            snub_after: self.cfg.snub_after,
            send_timeout: self.cfg.send_timeout,
        };
        let mut next_round = Instant::now() + self.cfg.choke_interval;
        loop {
            sleep(SNUB_TICK.min(self.cfg.choke_interval)).await;
            let now = Instant::now();
            let mut sw = self.swarm.borrow_mut();
            let c = &self.counters;
            let o = sw.snub_pass(now, lim, choker::send_queue, &c.unchoked_now);
            c.peers_snubbed.fetch_add(o.snubbed, Ordering::Relaxed);
            if self.cfg.slots > 0 && now >= next_round {
                next_round = now + self.cfg.choke_interval;
                sw.rechoke(self.cfg.slots, &c.unchoked_now);
            }
        }
    }

    /// Sends every byte of `chunks` to peer `key` (gathered sends until done, each written
    /// byte counted in its slot); a write that makes no progress within the send timeout
    /// ends the peer ([`End::SendStalled`]).
    async fn send_chunks(
        &self,
        stream: &TcpStream,
        key: usize,
        mut chunks: Vec<Chunk>,
    ) -> Result<(), End> {
        while !chunks.is_empty() {
            let (r, back) = match timeout(self.cfg.send_timeout, stream.writev(chunks)).await {
                Ok(x) => x,
                Err(_) => return Err(End::SendStalled),
            };
            chunks = back;
            match r {
                Ok(0) => return Err(End::Io(io::Error::from(io::ErrorKind::WriteZero))),
                Ok(n) => {
                    advance(&mut chunks, n);
                    self.swarm.borrow_mut().peers[key].written += n as u64;
                }
                Err(e) => return Err(End::Io(e)),
            }
        }
        Ok(())
    }

    async fn send(
        &self,
        stream: &TcpStream,
        mut buf: Vec<u8>,
        rc4: &mut Option<Rc4Pair>,
    ) -> io::Result<()> {
        if let Some(rc4) = rc4 {
            rc4.encrypt(&mut buf).map_err(io::Error::other)?;
        }
        match timeout(self.cfg.send_timeout, stream.write_all(buf)).await {
            Ok((r, _)) => r,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "send timed out")),
        }
    }
}

/// Logs why a peer's connection ended (`IOLAB_SEED_DEBUG`).
pub(crate) fn log_end(addr: SocketAddr, end: &End) {
    if debug_peers() {
        tracing::info!(target: "progress", "seed: peer {addr} ended: {end:?}");
    }
}

/// Counts why a peer's connection ended, in `c`.
pub(crate) fn count_end(c: &Counters, end: End) {
    match end {
        End::Closed | End::Ourselves => {}
        End::Garbage(_) => inc(&c.peers_dropped_garbage),
        End::WrongTorrent => inc(&c.peers_wrong_torrent),
        End::HandshakeTimeout => inc(&c.handshake_timeouts),
        End::Idle => inc(&c.idle_timeouts),
        End::SendStalled => inc(&c.send_stalls),
        End::MseOpening => inc(&c.mse_openings),
        // Counted where the exchange failed (`mse_result`), dialled or accepted.
        End::MseFailed(_) => {}
        End::PlaintextRefused => inc(&c.plaintext_refused),
        End::Io(_) => inc(&c.send_failures),
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

/// Takes what input is there into `inbuf` (the time of it into `last_input`); the end of
/// the peer when it closed or the socket failed.
fn take_input(
    stream: &TcpStream,
    inbuf: &mut Vec<u8>,
    last_input: &mut Instant,
    rc4: &mut Option<Rc4Pair>,
) -> Result<(), End> {
    match recv_into(stream, inbuf, rc4) {
        Ok(0) => Err(End::Closed),
        Ok(_) => {
            *last_input = Instant::now();
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
        Err(e) => Err(End::Io(e)),
    }
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
            Message::Hashes { req, hashes } => {
                write!(f, "Hashes({req:?}, {} bytes)", hashes.len())
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
