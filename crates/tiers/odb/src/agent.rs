//! The buffer agent (the seed's RAB, "remotely accessible buffers"), run on the BE side.
//!
//! Local senders (the preload library in the BE's processes) ask for room with ALLOC, or for a
//! lease of room to cut many buffers from (LEASE, see `proto`), and copy the payload straight
//! into a shared arena (a file in /dev/shm that the agent created and both map), then send a
//! V reference downstream. Any tier fetches byte ranges with FETCH over
//! TCP. Limits, all explicit:
//! - memory: the arena size (`arena_bytes`), fixed at start; nothing else grows with payloads;
//! - a buffer lives until every byte of it was fetched at least once, or until `lifetime`
//!   has passed; only such buffers are evicted (overwritten) to make room, so a buffer a
//!   receiver may still need is never recycled early. When no room can be made the agent
//!   answers FULL and the sender falls back to copying (an out-of-memory agent never loses data);
//! - on SIGTERM/SIGINT the agent stops taking buffers (DRAINING: senders copy, and mint no
//!   more file references) and keeps serving fetches until no live buffer is left and no
//!   file range has been fetched for [`FILE_DRAIN_QUIET`], or `drain` has passed, then exits.
//!   File references reserve nothing, so the agent cannot count those still in flight: the
//!   quiet period is how it learns that the chain has delivered them.

use crate::proto::*;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::net::{SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Where fetches and allocations are served (port 0: any).
    pub listen: SocketAddrV4,
    /// Arena size in bytes: the agent's whole payload memory.
    pub arena_bytes: u64,
    /// Longest time a buffer is kept for a receiver that has not fetched it all.
    pub lifetime: Duration,
    /// Longest drain after SIGTERM.
    pub drain: Duration,
    /// Directory of the arena file (default /dev/shm).
    pub arena_dir: PathBuf,
    /// Owner of the arena file (mode 0600), when the senders run as another user than the
    /// agent (nginx workers run as `nobody` when the master runs as root).
    pub arena_uid: Option<u32>,
    /// Directories whose files local senders may register (FILE) and send by reference,
    /// answered with `sendfile` (none: every payload is copied into the arena).
    pub files: Vec<PathBuf>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            arena_bytes: 256 << 20,
            lifetime: Duration::from_secs(30),
            drain: Duration::from_secs(5),
            arena_dir: PathBuf::from("/dev/shm"),
            arena_uid: None,
            files: Vec::new(),
        }
    }
}

struct Entry {
    id: u128,
    len: u64,
    created: Instant,
    /// Byte ranges fetched so far, sorted and merged.
    fetched: Vec<(u64, u64)>,
    /// The lease this range is, when it is one (LEASE): its buffers are cut by the sender.
    lease: Option<u32>,
}

/// A lease's key and place (its range is an [`Entry`] of the ring at `base`).
struct Lease {
    key: [u8; 16],
    base: u64,
    size: u64,
    /// The connection it was granted on: only that one may release it (another sender
    /// releasing it would let the ring reuse bytes its owner still writes).
    owner: u64,
}

impl Entry {
    fn done(&self) -> bool {
        self.fetched.first() == Some(&(0, self.len))
    }
    fn mark(&mut self, s: u64, e: u64) {
        self.fetched.push((s, e));
        self.fetched.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(self.fetched.len());
        for &(a, b) in &self.fetched {
            match out.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        self.fetched = out;
    }
}

#[derive(Default, serde::Serialize, Clone, Debug)]
pub struct AgentStats {
    pub allocs: u64,
    pub leases: u64,
    pub alloc_bytes: u64,
    pub alloc_full: u64,
    pub alloc_draining: u64,
    pub fetches: u64,
    pub fetch_bytes: u64,
    pub fetch_unknown: u64,
    /// FETCHes of file ranges (answered with `sendfile`) and their bytes.
    pub file_fetches: u64,
    pub file_fetch_bytes: u64,
    /// Files registered (FILE answered OK for a file not yet open).
    pub files_registered: u64,
    pub evicted_done: u64,
    pub evicted_expired: u64,
    pub live_buffers: u64,
    pub live_bytes: u64,
}

struct Arena {
    ptr: *mut u8,
    size: u64,
    path: PathBuf,
}

// SAFETY: the arena is a fixed shared mapping; concurrent access is coordinated by the
// allocation table (a range is written by one sender before its reference exists, and only
// read afterwards).
unsafe impl Send for Arena {}
// SAFETY: as for Send: a range is written by one sender before its reference is published,
// then only read, so shared references never race on the same bytes.
unsafe impl Sync for Arena {}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: ptr/size(+header) are the mapping made in `Arena::create`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), (self.size + ARENA_HEADER) as usize) };
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Arena {
    fn create(dir: &std::path::Path, size: u64, uid: Option<u32>) -> io::Result<Arena> {
        // pid + a per-process counter: several agents may live in one process (tests)
        static N: AtomicU64 = AtomicU64::new(0);
        let path = dir.join(format!(
            "iolab-tiers-odb-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        f.set_len(size + ARENA_HEADER)?;
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        if let Some(uid) = uid {
            std::os::unix::fs::fchown(&f, Some(uid), None)?;
        }
        // SAFETY: a fresh shared mapping of a file we sized to `size` + the header; checked
        // for failure.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                (size + ARENA_HEADER) as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        Ok(Arena {
            ptr: ptr.cast(),
            size,
            path,
        })
    }

    /// Tells the senders, through the header after the buffers, that no new buffer may be
    /// cut (they stop using their leases and copy).
    fn set_draining(&self) {
        // SAFETY: the header's first byte, inside the mapping, only ever accessed atomically.
        let flag =
            unsafe { std::sync::atomic::AtomicU8::from_ptr(self.ptr.add(self.size as usize)) };
        flag.store(1, Ordering::SeqCst);
    }

    /// # Safety
    /// `off + len <= size`, and the range belongs to a committed buffer (no writer).
    unsafe fn slice(&self, off: u64, len: u64) -> &[u8] {
        // SAFETY: per the contract above.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off as usize), len as usize) }
    }
}

struct Table {
    by_off: BTreeMap<u64, Entry>,
    by_id: HashMap<u128, u64>,
    leases: HashMap<u32, Lease>,
    next_lease: u32,
    /// Keys of leases evicted after full delivery (bounded: the last TOMBSTONES), so a
    /// buffer cut from one answers DELIVERED, as an ALLOC buffer does.
    delivered_leases: HashMap<u32, [u8; 16]>,
    delivered_leases_order: std::collections::VecDeque<u32>,
    /// Ids of buffers evicted after full delivery (bounded: the last TOMBSTONES).
    delivered: std::collections::HashSet<u128>,
    delivered_order: std::collections::VecDeque<u128>,
    next: u64,
    stats: AgentStats,
    /// When a file range was last fetched (a draining agent waits for these to stop).
    last_file_fetch: Option<Instant>,
}

/// How long a draining agent that has registered files waits without a file fetch before it
/// exits (bounded by `drain`): references minted before the drain flag was seen are still
/// on their way to a receiver.
pub const FILE_DRAIN_QUIET: Duration = Duration::from_millis(500);

pub struct Agent {
    cfg: AgentConfig,
    id: u64,
    addr: SocketAddrV4,
    arena: Arena,
    table: Mutex<Table>,
    files: Mutex<crate::files::FileTable>,
    draining: AtomicBool,
    conns: AtomicU64,
}

/// How many ids of delivered-then-evicted buffers the agent remembers.
pub const TOMBSTONES: usize = 1 << 16;

/// Most concurrent connections the agent serves (each is one thread).
pub const MAX_CONNS: u64 = 512;

use crate::random::random_u128;

impl Agent {
    /// Binds and creates the arena; `serve` runs it.
    pub fn bind(cfg: AgentConfig) -> io::Result<(Arc<Agent>, TcpListener)> {
        let listener = TcpListener::bind(cfg.listen)?;
        let addr = match listener.local_addr()? {
            std::net::SocketAddr::V4(a) => a,
            _ => return Err(io::Error::other("agent needs an IPv4 address")),
        };
        let files = Mutex::new(crate::files::FileTable::new(&cfg.files)?);
        let arena = Arena::create(&cfg.arena_dir, cfg.arena_bytes, cfg.arena_uid)?;
        let agent = Arc::new(Agent {
            id: random_u128() as u64,
            addr,
            arena,
            table: Mutex::new(Table {
                by_off: BTreeMap::new(),
                by_id: HashMap::new(),
                leases: HashMap::new(),
                next_lease: 0,
                delivered_leases: HashMap::new(),
                delivered_leases_order: Default::default(),
                delivered: Default::default(),
                delivered_order: Default::default(),
                next: 0,
                stats: AgentStats::default(),
                last_file_fetch: None,
            }),
            files,
            draining: AtomicBool::new(false),
            conns: AtomicU64::new(0),
            cfg,
        });
        Ok((agent, listener))
    }

    pub fn addr(&self) -> SocketAddrV4 {
        self.addr
    }
    pub fn id(&self) -> u64 {
        self.id
    }
    /// The arena file (removed when the agent is dropped).
    pub fn arena_path(&self) -> &std::path::Path {
        &self.arena.path
    }

    pub fn stats(&self) -> AgentStats {
        let t = self.table.lock().unwrap();
        let mut s = t.stats.clone();
        s.live_buffers = t.by_off.values().filter(|e| !e.done()).count() as u64;
        s.live_bytes = t.by_off.values().filter(|e| !e.done()).map(|e| e.len).sum();
        s
    }

    fn live_left(&self) -> bool {
        let t = self.table.lock().unwrap();
        t.by_off
            .values()
            .any(|e| !e.done() && e.created.elapsed() < self.cfg.lifetime)
    }

    /// Whether file references may still be in flight during a drain begun at `start`: some
    /// file was registered and one was fetched (or the drain began) within the quiet period.
    fn file_refs_may_be_in_flight(&self, start: Instant) -> bool {
        let t = self.table.lock().unwrap();
        t.stats.files_registered > 0
            && t.last_file_fetch.map_or(start, |f| f.max(start)).elapsed() < FILE_DRAIN_QUIET
    }

    /// Accepts until `stop` is set, then drains (see the module comment) and returns.
    pub fn serve(
        self: &Arc<Agent>,
        listener: TcpListener,
        stop: Arc<AtomicBool>,
    ) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        let mut drain_start: Option<Instant> = None;
        loop {
            if stop.load(Ordering::Relaxed) && drain_start.is_none() {
                self.draining.store(true, Ordering::SeqCst);
                self.arena.set_draining();
                drain_start = Some(Instant::now());
            }
            if let Some(t) = drain_start {
                let busy = self.live_left() || self.file_refs_may_be_in_flight(t);
                if !busy || t.elapsed() >= self.cfg.drain {
                    return Ok(());
                }
            }
            match listener.accept() {
                Ok((s, _)) => {
                    if self.conns.load(Ordering::Relaxed) >= MAX_CONNS {
                        continue; // dropped: the peer falls back
                    }
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_nodelay(true);
                    self.conns.fetch_add(1, Ordering::Relaxed);
                    let me = self.clone();
                    std::thread::spawn(move || {
                        let _ = me.conn(s);
                        me.conns.fetch_sub(1, Ordering::Relaxed);
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn alloc(&self, len: u64) -> (u8, u64, u128) {
        if self.draining.load(Ordering::SeqCst) {
            self.table.lock().unwrap().stats.alloc_draining += 1;
            return (ST_DRAINING, 0, 0);
        }
        let mut t = self.table.lock().unwrap();
        self.alloc_locked(&mut t, len)
    }

    /// LEASE: releases the sender's previous lease (the bytes past `release_used` need no
    /// fetch), then cuts a new one of `size` bytes from the ring. Returns (status, arena
    /// offset, lease number, key, ms the sender may cut buffers from it).
    fn lease(
        &self,
        conn: u64,
        size: u32,
        release_no: u32,
        release_used: u32,
    ) -> (u8, u64, u32, [u8; 16], u32) {
        let mut t = self.table.lock().unwrap();
        let owned = t.leases.get(&release_no).filter(|l| l.owner == conn);
        if let Some(base) = owned.map(|l| l.base) {
            if let Some(e) = t.by_off.get_mut(&base) {
                let used = (release_used as u64).min(e.len);
                if used < e.len {
                    e.mark(used, e.len);
                }
            }
        }
        let none = |st: u8| (st, 0, 0, [0u8; 16], 0);
        if self.draining.load(Ordering::SeqCst) {
            t.stats.alloc_draining += 1;
            return none(ST_DRAINING);
        }
        if size == 0 || size > MAX_LEASE || t.leases.len() as u32 >= LEASE_NOS {
            t.stats.alloc_full += 1;
            return none(ST_FULL);
        }
        let (st, base, _) = self.alloc_locked(&mut t, size as u64);
        if st != ST_OK {
            return none(st);
        }
        let mut no = t.next_lease;
        while t.leases.contains_key(&no) {
            no = (no + 1) % LEASE_NOS;
        }
        t.next_lease = (no + 1) % LEASE_NOS;
        let key = random_u128().to_le_bytes();
        t.leases.insert(
            no,
            Lease {
                key,
                base,
                size: size as u64,
                owner: conn,
            },
        );
        t.by_off.get_mut(&base).expect("just placed").lease = Some(no);
        t.stats.leases += 1;
        let valid_ms = (self.cfg.lifetime.as_millis() / 4).clamp(1, u32::MAX as u128) as u32;
        (ST_OK, base, no, key, valid_ms)
    }

    fn alloc_locked(&self, t: &mut Table, len: u64) -> (u8, u64, u128) {
        if len == 0 || len > self.arena.size {
            t.stats.alloc_full += 1;
            return (ST_FULL, 0, 0);
        }
        // A ring: place the buffer at `next` (the end of the last one), evicting what is in
        // the way if it may go (all bytes fetched, or older than the lifetime), stepping over
        // a buffer that may not (a live one: a stuck buffer holds its own range only, not
        // the ring), wrapping to 0 once. Each step is a tree lookup: the cost of an
        // allocation does not grow with the number of buffers (a full scan per eviction took
        // over a second with 60,000 small fetched buffers in a 256 MiB arena, and the
        // senders' 200 ms store timeout turned ODB off). Fetched buffers stay until the ring
        // comes round: a receiver that faults on a page it forwarded long ago (nginx reusing
        // the memory) still gets it.
        let now = Instant::now();
        let lifetime = self.cfg.lifetime;
        let size = self.arena.size;
        let mut cur = t.next;
        let mut wrapped = false;
        let start = loop {
            if cur + len > size {
                if wrapped {
                    t.stats.alloc_full += 1;
                    return (ST_FULL, 0, 0);
                }
                wrapped = true;
                cur = 0;
                continue;
            }
            // the first buffer overlapping [cur, cur + len): one that starts before cur and
            // runs past it, or the first that starts inside
            let before = t
                .by_off
                .range(..cur)
                .next_back()
                .filter(|(&o, e)| o + e.len > cur)
                .map(|(&o, _)| o);
            let inside = t.by_off.range(cur..cur + len).next().map(|(&o, _)| o);
            let Some(o) = before.or(inside) else {
                break cur;
            };
            let e = &t.by_off[&o];
            if !(e.done() || now.duration_since(e.created) >= lifetime) {
                cur = o + e.len; // live: step over it
                continue;
            }
            let e = t.by_off.remove(&o).unwrap();
            t.by_id.remove(&e.id);
            let lease = e
                .lease
                .and_then(|no| t.leases.remove(&no).map(|l| (no, l.key)));
            if let (true, Some((no, key))) = (e.done(), lease) {
                t.delivered_leases.insert(no, key);
                t.delivered_leases_order.push_back(no);
                if t.delivered_leases_order.len() > TOMBSTONES {
                    let old = t.delivered_leases_order.pop_front().unwrap();
                    t.delivered_leases.remove(&old);
                }
            }
            if e.done() {
                t.stats.evicted_done += 1;
                t.delivered.insert(e.id);
                t.delivered_order.push_back(e.id);
                if t.delivered_order.len() > TOMBSTONES {
                    let old = t.delivered_order.pop_front().unwrap();
                    t.delivered.remove(&old);
                }
            } else {
                t.stats.evicted_expired += 1;
            }
        };
        let end = start + len;
        // (the top bit marks the ids of buffers cut from leases)
        let id = random_u128() >> 1;
        t.by_off.insert(
            start,
            Entry {
                id,
                len,
                created: now,
                fetched: Vec::new(),
                lease: None,
            },
        );
        t.by_id.insert(id, start);
        t.next = end;
        t.stats.allocs += 1;
        t.stats.alloc_bytes += len;
        (ST_OK, start, id)
    }

    /// Checks a fetch and returns the arena range to send.
    fn check_fetch(&self, id: u128, off: u64, len: u64) -> Result<(u64, u64), u8> {
        let mut t = self.table.lock().unwrap();
        if let Some((no, boff, blen)) = lease_id_parts(id) {
            return self.check_lease_fetch(&mut t, id, (no, boff as u64, blen as u64), off, len);
        }
        let Some(&base) = t.by_id.get(&id) else {
            t.stats.fetch_unknown += 1;
            return Err(if t.delivered.contains(&id) {
                ST_DELIVERED
            } else {
                ST_UNKNOWN
            });
        };
        let e = t.by_off.get_mut(&base).unwrap();
        if len == 0 || off.checked_add(len).is_none_or(|end| end > e.len) {
            t.stats.fetch_unknown += 1;
            return Err(ST_UNKNOWN);
        }
        e.mark(off, off + len);
        t.stats.fetches += 1;
        t.stats.fetch_bytes += len;
        Ok((base + off, len))
    }

    /// A fetch of a buffer cut from a lease: the id's MAC under the lease's key, then the
    /// buffer's bounds inside the lease and the fetch's inside the buffer.
    fn check_lease_fetch(
        &self,
        t: &mut Table,
        id: u128,
        (no, boff, blen): (u32, u64, u64),
        off: u64,
        len: u64,
    ) -> Result<(u64, u64), u8> {
        let Some(l) = t.leases.get(&no).filter(|l| lease_id_valid(id, &l.key)) else {
            t.stats.fetch_unknown += 1;
            let delivered = t
                .delivered_leases
                .get(&no)
                .is_some_and(|k| lease_id_valid(id, k));
            return Err(if delivered { ST_DELIVERED } else { ST_UNKNOWN });
        };
        let base = l.base;
        if boff + blen > l.size || len == 0 || off.checked_add(len).is_none_or(|e| e > blen) {
            t.stats.fetch_unknown += 1;
            return Err(ST_UNKNOWN);
        }
        let e = t.by_off.get_mut(&base).expect("a lease's entry");
        e.mark(boff + off, boff + off + len);
        t.stats.fetches += 1;
        t.stats.fetch_bytes += len;
        Ok((base + boff + off, len))
    }

    /// Serves the requests of one peer's stream until it ends (what each accepted connection
    /// runs; public so that the fuzzer can feed it any bytes: `crates/tiers/testbed/fuzz`, target
    /// `agent`).
    ///
    /// Requests are read in batches (a pipelined FETCH batch or the next request arrives
    /// with one read, not two per request) and each reply goes out with one write: with
    /// TCP_NODELAY a status byte written alone is a segment of its own, and the receiver
    /// wakes once for it and again for the data.
    pub fn conn<S: Peer>(&self, mut s: S) -> io::Result<()> {
        static CONNS: AtomicU64 = AtomicU64::new(0);
        let me = CONNS.fetch_add(1, Ordering::Relaxed);
        let mut inbuf = [0u8; 2 * FILE_REQ_FIXED + MAX_FILE_PATH];
        let (mut have, mut at) = (0usize, 0usize);
        loop {
            let Some(&op) = inbuf[at..have].first() else {
                at = 0;
                match s.read(&mut inbuf)? {
                    0 => return Ok(()),
                    n => have = n,
                }
                continue;
            };
            let need = match op {
                OP_HELLO | OP_STATS => 1,
                OP_ALLOC => ALLOC_REQ,
                OP_LEASE => LEASE_REQ,
                OP_FETCH => FETCH_REQ,
                OP_FILE => match inbuf.get(at + 33..at + 35) {
                    Some(&[a, b]) if at + 35 <= have => {
                        let path = u16::from_le_bytes([a, b]) as usize;
                        if path > MAX_FILE_PATH {
                            let _ = s.write_all(&[ST_BAD_REQUEST]);
                            return Ok(());
                        }
                        FILE_REQ_FIXED + path
                    }
                    _ => FILE_REQ_FIXED,
                },
                _ => {
                    let _ = s.write_all(&[ST_BAD_REQUEST]);
                    return Ok(());
                }
            };
            if have - at < need {
                // a request cut by the read: move its start down and read the rest
                inbuf.copy_within(at..have, 0);
                (have, at) = (have - at, 0);
                match s.read(&mut inbuf[have..])? {
                    0 => return Ok(()),
                    n => have += n,
                }
                continue;
            }
            let r = &inbuf[at + 1..at + need];
            at += need;
            self.answer(me, op, r, &mut s)?;
        }
    }

    /// The reply to one whole request (`r`: its bytes after the op).
    fn answer<S: Peer>(&self, me: u64, op: u8, r: &[u8], s: &mut S) -> io::Result<()> {
        match op {
            OP_HELLO => {
                let path = self.arena.path.to_string_lossy().into_owned();
                let mut b = Vec::with_capacity(HELLO_REP_FIXED + path.len());
                b.push(ST_OK);
                b.extend_from_slice(&self.id.to_le_bytes());
                b.extend_from_slice(&self.addr.ip().octets());
                b.extend_from_slice(&self.addr.port().to_le_bytes());
                b.extend_from_slice(&self.arena.size.to_le_bytes());
                b.extend_from_slice(&(path.len() as u16).to_le_bytes());
                b.extend_from_slice(path.as_bytes());
                s.write_all(&b)
            }
            OP_ALLOC => {
                let (st, off, id) = self.alloc(u32::from_le_bytes(r.try_into().unwrap()) as u64);
                let mut b = [0u8; ALLOC_REP];
                b[0] = st;
                b[1..9].copy_from_slice(&off.to_le_bytes());
                b[9..25].copy_from_slice(&id.to_le_bytes());
                s.write_all(&b)
            }
            OP_LEASE => {
                let word = |i: usize| u32::from_le_bytes(r[i..i + 4].try_into().unwrap());
                let (st, off, no, key, valid) = self.lease(me, word(0), word(4), word(8));
                let mut b = [0u8; LEASE_REP];
                b[0] = st;
                b[1..9].copy_from_slice(&off.to_le_bytes());
                b[9..13].copy_from_slice(&no.to_le_bytes());
                b[13..29].copy_from_slice(&key);
                b[29..33].copy_from_slice(&valid.to_le_bytes());
                s.write_all(&b)
            }
            OP_FETCH => {
                let id = u128::from_le_bytes(r[0..16].try_into().unwrap());
                let off = u64::from_le_bytes(r[16..24].try_into().unwrap());
                let len = u32::from_le_bytes(r[24..28].try_into().unwrap()) as u64;
                if file_id_parts(id).is_some() {
                    return self.fetch_file(id, off, len, s);
                }
                match self.check_fetch(id, off, len) {
                    Ok((a, l)) => {
                        // SAFETY: check_fetch bounded (a, l) inside a committed buffer.
                        let data = unsafe { self.arena.slice(a, l) };
                        write_all_vectored(s, &[&[ST_OK], data])
                    }
                    Err(st) => s.write_all(&[st]),
                }
            }
            OP_FILE => {
                let fixed: &[u8; FILE_REQ_FIXED - 1] = r[..FILE_REQ_FIXED - 1].try_into().unwrap();
                let (ident, _) = parse_file_request(fixed);
                let mut b = [0u8; FILE_REP];
                let registered = self
                    .files
                    .lock()
                    .unwrap()
                    .register(ident, &r[FILE_REQ_FIXED - 1..]);
                match registered {
                    Ok((no, key)) => {
                        b[1..5].copy_from_slice(&no.to_le_bytes());
                        b[5..21].copy_from_slice(&key);
                        self.table.lock().unwrap().stats.files_registered += 1;
                    }
                    Err(st) => b[0] = st,
                }
                s.write_all(&b)
            }
            _ => {
                let j = serde_json::to_vec(&self.stats()).unwrap_or_default();
                write_all_vectored(s, &[&(j.len() as u32).to_le_bytes(), &j])
            }
        }
    }

    /// FETCH of a file range: the status, then the bytes straight from the file. A file cut
    /// short meanwhile ends the connection (the receiver fails; it never gets other bytes).
    fn fetch_file<S: Peer>(&self, id: u128, off: u64, len: u64, s: &mut S) -> io::Result<()> {
        let checked = self.files.lock().unwrap().check_fetch(id, off, len);
        let mut t = self.table.lock().unwrap();
        match checked {
            Ok((served, at)) => {
                t.stats.file_fetches += 1;
                t.stats.file_fetch_bytes += len;
                t.last_file_fetch = Some(Instant::now());
                drop(t);
                s.send_file(&served.file, at, len)
            }
            Err(st) => {
                t.stats.fetch_unknown += 1;
                drop(t);
                s.write_all(&[st])
            }
        }
    }
}

/// A peer's stream as the agent answers it: bytes, and a file range after an OK status.
pub trait Peer: Read + Write {
    /// Writes ST_OK then `len` bytes of `file` from `at`. The default reads and writes
    /// (any stream); a socket sends them with `sendfile`, copying nothing.
    fn send_file(&mut self, file: &std::fs::File, at: u64, len: u64) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.write_all(&[ST_OK])?;
        let mut buf = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            file.read_exact_at(&mut buf[..n], at + done)?;
            self.write_all(&buf[..n])?;
            done += n as u64;
        }
        Ok(())
    }
}

impl<P: Peer + ?Sized> Peer for &mut P {
    fn send_file(&mut self, file: &std::fs::File, at: u64, len: u64) -> io::Result<()> {
        (**self).send_file(file, at, len)
    }
}

impl Peer for TcpStream {
    fn send_file(&mut self, file: &std::fs::File, at: u64, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let fd = self.as_raw_fd();
        // MSG_MORE: the status byte leaves with the file's first bytes (with TCP_NODELAY
        // alone it would be a segment of its own, and a wake-up of the receiver).
        // SAFETY: a one-byte buffer on the stack, valid for the call.
        let n = unsafe { libc::send(fd, [ST_OK].as_ptr().cast(), 1, libc::MSG_MORE) };
        if n != 1 {
            return Err(io::Error::last_os_error());
        }
        let mut pos = at as libc::off_t;
        let end = at + len;
        while (pos as u64) < end {
            let want = (end - pos as u64).min(1 << 30) as usize;
            // SAFETY: two descriptors we hold; pos is a valid off_t the kernel advances.
            let n = unsafe { libc::sendfile(fd, file.as_raw_fd(), &mut pos, want) };
            match n {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n if n < 0 => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// `write_all` over several slices with as few writes as the socket allows.
fn write_all_vectored<W: Write + ?Sized>(s: &mut W, parts: &[&[u8]]) -> io::Result<()> {
    let mut slices: Vec<io::IoSlice> = parts.iter().map(|p| io::IoSlice::new(p)).collect();
    let mut left = &mut slices[..];
    io::IoSlice::advance_slices(&mut left, 0);
    while !left.is_empty() {
        match s.write_vectored(left) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => io::IoSlice::advance_slices(&mut left, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The uid of a user name (for `--arena-user`).
pub fn user_uid(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: getpwnam with a NUL-terminated name; the result is read at once (the process
    // is single-threaded at this point).
    let pw = unsafe { libc::getpwnam(c.as_ptr()) };
    // SAFETY: non-null getpwnam results point at a valid passwd struct.
    (!pw.is_null()).then(|| unsafe { (*pw).pw_uid })
}

/// Runs an agent in this process until SIGTERM/SIGINT (then drains); prints its address.
pub fn run_foreground(cfg: AgentConfig) -> io::Result<AgentStats> {
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    let (agent, listener) = Agent::bind(cfg)?;
    println!(
        "odb agent listening on {} (id {:016x}, arena {} MiB at {})",
        agent.addr(),
        agent.id(),
        agent.arena.size >> 20,
        agent.arena.path.display()
    );
    use std::io::Write as _;
    let _ = io::stdout().flush();
    let served = agent.serve(listener, stop);
    // A connection thread may still hold the agent (and the arena) when this process
    // exits: the file goes now, the mapping with the process.
    let _ = std::fs::remove_file(&agent.arena.path);
    served?;
    Ok(agent.stats())
}

/// A plain client of the agent RPC, for tests and `iolab tiers status`.
pub mod client {
    use super::*;

    pub fn fetch(addr: SocketAddrV4, id: u128, off: u64, len: u32) -> io::Result<Option<Vec<u8>>> {
        let mut s = TcpStream::connect(addr)?;
        s.write_all(&fetch_request(id, off, len))?;
        let mut st = [0u8; 1];
        s.read_exact(&mut st)?;
        if st[0] != ST_OK {
            return Ok(None);
        }
        let mut v = vec![0u8; len as usize];
        s.read_exact(&mut v)?;
        Ok(Some(v))
    }

    pub fn alloc(addr: SocketAddrV4, len: u32) -> io::Result<(u8, u64, u128)> {
        let mut s = TcpStream::connect(addr)?;
        s.write_all(&alloc_request(len))?;
        let mut b = [0u8; ALLOC_REP];
        s.read_exact(&mut b)?;
        Ok((
            b[0],
            u64::from_le_bytes(b[1..9].try_into().unwrap()),
            u128::from_le_bytes(b[9..25].try_into().unwrap()),
        ))
    }

    /// LEASE on a connection of the caller's: (status, arena offset, lease no, key, valid ms).
    pub fn lease(
        s: &mut TcpStream,
        size: u32,
        release: Option<(u32, u32)>,
    ) -> io::Result<(u8, u64, u32, [u8; 16], u32)> {
        let (no, used) = release.unwrap_or((NO_LEASE, 0));
        s.write_all(&lease_request(size, no, used))?;
        let mut b = [0u8; LEASE_REP];
        s.read_exact(&mut b)?;
        Ok((
            b[0],
            u64::from_le_bytes(b[1..9].try_into().unwrap()),
            u32::from_le_bytes(b[9..13].try_into().unwrap()),
            b[13..29].try_into().unwrap(),
            u32::from_le_bytes(b[29..33].try_into().unwrap()),
        ))
    }

    /// FILE: (status, file number, key) for the file at `path`, as `fstat` sees it here.
    pub fn register_file(
        addr: SocketAddrV4,
        path: &std::path::Path,
    ) -> io::Result<(u8, u32, [u8; 16])> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        let ident = FileIdent {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        };
        let mut req = vec![0u8; FILE_REQ_FIXED + MAX_FILE_PATH];
        let n = file_request(&ident, path.as_os_str().as_bytes(), &mut req)
            .ok_or_else(|| io::Error::other("path too long"))?;
        let mut s = TcpStream::connect(addr)?;
        s.write_all(&req[..n])?;
        let mut b = [0u8; FILE_REP];
        s.read_exact(&mut b)?;
        Ok((
            b[0],
            u32::from_le_bytes(b[1..5].try_into().unwrap()),
            b[5..21].try_into().unwrap(),
        ))
    }

    pub fn stats(addr: SocketAddrV4) -> io::Result<serde_json::Value> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(&[OP_STATS])?;
        let mut l = [0u8; 4];
        s.read_exact(&mut l)?;
        let n = u32::from_le_bytes(l) as usize;
        if n > 1 << 20 {
            return Err(io::Error::other("stats reply too long"));
        }
        let mut v = vec![0u8; n];
        s.read_exact(&mut v)?;
        serde_json::from_slice(&v).map_err(io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stops the agent and removes its arena file when the test ends (also on failure):
    /// the serving thread may outlive the test process's last test.
    struct Running(Arc<AtomicBool>, PathBuf);
    impl Running {
        fn store(&self, v: bool, o: Ordering) {
            self.0.store(v, o)
        }
    }
    impl Drop for Running {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
            let _ = std::fs::remove_file(&self.1);
        }
    }

    fn start(arena: u64, lifetime: Duration) -> (Arc<Agent>, Running) {
        start_with(AgentConfig {
            arena_bytes: arena,
            lifetime,
            arena_dir: std::env::temp_dir(),
            ..Default::default()
        })
    }

    fn start_with(cfg: AgentConfig) -> (Arc<Agent>, Running) {
        let (a, l) = Agent::bind(cfg).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (a2, s2) = (a.clone(), stop.clone());
        std::thread::spawn(move || a2.serve(l, s2));
        let path = a.arena.path.clone();
        (a, Running(stop, path))
    }

    #[test]
    fn a_test_agent_leaves_no_arena_file() {
        let path;
        {
            let (a, _stop) = start(4096, Duration::from_secs(30));
            path = a.arena.path.clone();
            assert_eq!(
                client::alloc(a.addr(), 4096).unwrap().0,
                ST_OK,
                "a live buffer"
            );
            assert!(path.exists());
        }
        assert!(!path.exists(), "{} left behind", path.display());
    }

    #[test]
    fn fetch_checks_id_and_bounds() {
        let (a, stop) = start(1 << 20, Duration::from_secs(30));
        let (st, off, id) = client::alloc(a.addr(), 100).unwrap();
        assert_eq!(st, ST_OK);
        // SAFETY: the test writes the range it was just given, before any fetch.
        unsafe { std::ptr::write_bytes(a.arena.ptr.add(off as usize), 0xAB, 100) };
        assert_eq!(
            client::fetch(a.addr(), id, 10, 90).unwrap(),
            Some(vec![0xAB; 90])
        );
        assert_eq!(
            client::fetch(a.addr(), id, 10, 91).unwrap(),
            None,
            "out of bounds"
        );
        assert_eq!(
            client::fetch(a.addr(), id ^ 1, 0, 1).unwrap(),
            None,
            "forged id"
        );
        stop.store(true, Ordering::SeqCst);
    }

    /// A file under `--files`: registered once, its ranges fetched over TCP (the agent's
    /// `sendfile`) byte for byte, bounded by the reference; a file changed since fails the
    /// fetch; a file outside the roots is refused.
    #[test]
    fn file_ranges_are_sent_from_the_file_and_fail_once_it_changed() {
        let dir = std::env::temp_dir().join(format!("odb-agent-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("payload");
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 4096) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let (a, stop) = start_with(AgentConfig {
            arena_bytes: 1 << 20,
            arena_dir: std::env::temp_dir(),
            files: vec![dir.clone()],
            ..Default::default()
        });
        let (st, no, key) = client::register_file(a.addr(), &path).unwrap();
        assert_eq!(st, ST_OK);
        let id = file_buf_id(no, 4096, 200_000, &key);
        let got = client::fetch(a.addr(), id, 100, 199_900).unwrap();
        assert!(got.as_deref() == Some(&bytes[4196..204_096]), "other bytes");
        assert_eq!(client::fetch(a.addr(), id, 100, 199_901).unwrap(), None);
        assert_eq!(client::fetch(a.addr(), id ^ 4, 0, 10).unwrap(), None);
        let outside = std::env::current_exe().unwrap();
        assert_eq!(
            client::register_file(a.addr(), &outside).unwrap().0,
            ST_UNKNOWN
        );
        std::fs::write(&path, &bytes[..250_000]).unwrap();
        assert_eq!(client::fetch(a.addr(), id, 0, 10).unwrap(), None, "changed");
        let s = a.stats();
        assert_eq!((s.files_registered, s.file_fetches), (1, 1));
        stop.store(true, Ordering::SeqCst);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A draining agent keeps answering file references while they keep coming (minted
    /// before the drain, still in flight), and exits once they stop. Before, it exited at
    /// once, since file references hold no arena buffer, and an agent restart under load cut
    /// responses short.
    #[test]
    fn a_draining_agent_serves_file_references_still_in_flight() {
        let dir = std::env::temp_dir().join(format!("odb-agent-drain-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("payload");
        std::fs::write(&path, vec![0x5Au8; 65536]).unwrap();
        let (a, l) = Agent::bind(AgentConfig {
            arena_bytes: 1 << 20,
            arena_dir: std::env::temp_dir(),
            files: vec![dir.clone()],
            ..Default::default()
        })
        .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (a2, s2) = (a.clone(), stop.clone());
        let served = std::thread::spawn(move || a2.serve(l, s2));
        let (st, no, key) = client::register_file(a.addr(), &path).unwrap();
        assert_eq!(st, ST_OK);
        let id = file_buf_id(no, 0, 65536, &key);
        let drain_start = Instant::now();
        stop.store(true, Ordering::SeqCst);
        for _ in 0..4 {
            std::thread::sleep(FILE_DRAIN_QUIET / 2);
            let got = client::fetch(a.addr(), id, 0, 65536).unwrap();
            assert!(
                got.is_some_and(|v| v == vec![0x5A; 65536]),
                "a fetch during the drain"
            );
        }
        served.join().unwrap().unwrap();
        let took = drain_start.elapsed();
        assert!(
            took >= FILE_DRAIN_QUIET * 2 && took < Duration::from_secs(4),
            "the drain ended {took:?} after it began"
        );
        let _ = std::fs::remove_file(a.arena_path());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A lease: buffers cut by the sender are fetched by their ids alone, bounded each to
    /// its own bytes; a forged or foreign id is refused; the lease's unused tail needs no
    /// fetch once released, and a fully fetched, released lease is evicted for room (its
    /// ids then answer DELIVERED).
    #[test]
    fn lease_buffers_are_fetched_bounded_and_evicted_when_delivered() {
        let (a, stop) = start(3 * 4096, Duration::from_secs(40));
        let mut s = TcpStream::connect(a.addr()).unwrap();
        let (st, base, no, key, valid) = client::lease(&mut s, 8192, None).unwrap();
        assert_eq!((st, valid), (ST_OK, 10_000), "a quarter of the lifetime");
        for i in 0..8192 {
            // SAFETY: the test writes the lease it was just given, before any fetch.
            unsafe { *a.arena.ptr.add(base as usize + i) = (i / 100) as u8 };
        }
        let b1 = lease_buf_id(no, 0, 300, &key);
        let b2 = lease_buf_id(no, 300, 500, &key);
        let want = |o: usize, n: usize| (o..o + n).map(|i| (i / 100) as u8).collect::<Vec<_>>();
        assert_eq!(
            client::fetch(a.addr(), b1, 0, 300).unwrap(),
            Some(want(0, 300))
        );
        assert_eq!(
            client::fetch(a.addr(), b2, 100, 400).unwrap(),
            Some(want(400, 400))
        );
        assert_eq!(
            client::fetch(a.addr(), b2, 100, 401).unwrap(),
            None,
            "past its end"
        );
        // (bytes 300..400 of the lease are still unfetched: the lease stays live)
        assert_eq!(
            client::fetch(a.addr(), b1 ^ 1, 0, 1).unwrap(),
            None,
            "forged MAC"
        );
        let wider = lease_buf_id(no, 0, 8192, &[0u8; 16]);
        assert_eq!(
            client::fetch(a.addr(), wider, 0, 8192).unwrap(),
            None,
            "foreign key"
        );
        // the ring is full (8 KiB lease + nothing else fits 8 KiB more) while the lease lives
        assert_eq!(client::alloc(a.addr(), 8192).unwrap().0, ST_FULL);
        // a release from another connection is not the owner's: ignored (the lease stays
        // live: nothing of it may be reused)
        let mut other = TcpStream::connect(a.addr()).unwrap();
        let (st_o, ..) = client::lease(&mut other, 0, Some((no, 0))).unwrap();
        assert_eq!(st_o, ST_FULL, "a release only");
        assert_eq!(
            client::alloc(a.addr(), 8192).unwrap().0,
            ST_FULL,
            "still live"
        );
        // release it having used 800 bytes: live until all of them are fetched
        let (st2, _, no2, _, _) = client::lease(&mut s, 4096, Some((no, 800))).unwrap();
        assert_eq!(st2, ST_OK);
        assert_ne!(no2, no);
        assert_eq!(
            client::alloc(a.addr(), 8192).unwrap().0,
            ST_FULL,
            "300..400 unfetched"
        );
        assert_eq!(
            client::fetch(a.addr(), b2, 0, 100).unwrap(),
            Some(want(300, 100))
        );
        assert_eq!(
            client::alloc(a.addr(), 8192).unwrap().0,
            ST_OK,
            "delivered: evicted"
        );
        let mut c = TcpStream::connect(a.addr()).unwrap();
        c.write_all(&fetch_request(b1, 0, 1)).unwrap();
        let mut st3 = [0u8; 1];
        c.read_exact(&mut st3).unwrap();
        assert_eq!(st3[0], ST_DELIVERED);
        stop.store(true, Ordering::SeqCst);
    }

    /// Requests arrive as the stream cuts them: several in one segment (a pipelined
    /// FETCH batch), or one spread over several reads. Each gets its own reply, in order.
    #[test]
    fn pipelined_and_cut_requests_are_each_answered() {
        let (a, stop) = start(1 << 20, Duration::from_secs(30));
        let (st, off, id) = client::alloc(a.addr(), 300).unwrap();
        assert_eq!(st, ST_OK);
        for i in 0..300 {
            // SAFETY: the test writes the range it was just given, before any fetch.
            unsafe { *a.arena.ptr.add(off as usize + i) = i as u8 };
        }
        let mut s = TcpStream::connect(a.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut batch = Vec::new();
        for (o, l) in [(0u64, 10u32), (100, 200), (290, 10)] {
            batch.extend_from_slice(&fetch_request(id, o, l));
        }
        batch.extend_from_slice(&fetch_request(id ^ 1, 0, 1)); // forged: status only
        s.write_all(&batch).unwrap();
        for (o, l) in [(0usize, 10usize), (100, 200), (290, 10)] {
            let mut b = vec![0u8; 1 + l];
            s.read_exact(&mut b).unwrap();
            assert_eq!(b[0], ST_OK);
            assert!(b[1..].iter().enumerate().all(|(i, &v)| v == (o + i) as u8));
        }
        let mut st = [0u8; 1];
        s.read_exact(&mut st).unwrap();
        assert_eq!(st[0], ST_UNKNOWN);
        // one request, a byte per write, with the stream idle between them
        s.set_nodelay(true).unwrap();
        for byte in fetch_request(id, 5, 3) {
            s.write_all(&[byte]).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        assert_eq!(b, [ST_OK, 5, 6, 7]);
        stop.store(true, Ordering::SeqCst);
    }

    #[test]
    fn full_when_live_then_evicts_done_buffers() {
        let (a, stop) = start(8192, Duration::from_secs(30));
        let (st, _, id1) = client::alloc(a.addr(), 8192).unwrap();
        assert_eq!(st, ST_OK);
        assert_eq!(
            client::alloc(a.addr(), 1).unwrap().0,
            ST_FULL,
            "live buffer kept"
        );
        assert!(client::fetch(a.addr(), id1, 0, 4096).unwrap().is_some());
        assert_eq!(
            client::alloc(a.addr(), 1).unwrap().0,
            ST_FULL,
            "half fetched is live"
        );
        assert!(client::fetch(a.addr(), id1, 4096, 4096).unwrap().is_some());
        assert_eq!(
            client::alloc(a.addr(), 4096).unwrap().0,
            ST_OK,
            "fully fetched evicted"
        );
        assert_eq!(
            client::fetch(a.addr(), id1, 0, 1).unwrap(),
            None,
            "evicted is unknown"
        );
        stop.store(true, Ordering::SeqCst);
    }

    #[test]
    fn a_stuck_buffer_does_not_block_the_ring() {
        let (a, stop) = start(3 * 4096, Duration::from_secs(30));
        let (_, _, _stuck) = client::alloc(a.addr(), 4096).unwrap(); // never fetched
        let (_, _, b) = client::alloc(a.addr(), 4096).unwrap();
        let (_, _, c) = client::alloc(a.addr(), 4096).unwrap();
        assert!(client::fetch(a.addr(), b, 0, 4096).unwrap().is_some());
        assert!(client::fetch(a.addr(), c, 0, 4096).unwrap().is_some());
        let (st, off, _) = client::alloc(a.addr(), 8192).unwrap();
        assert_eq!((st, off), (ST_OK, 4096), "placed after the stuck buffer");
        assert_eq!(client::alloc(a.addr(), 1).unwrap().0, ST_FULL);
        stop.store(true, Ordering::SeqCst);
    }

    #[test]
    fn a_full_arena_of_fetched_buffers_evicts_only_what_is_in_the_way() {
        let (a, _stop) = start(256 * 4096, Duration::from_secs(30));
        // one connection for all requests (a connection per request costs an accept each)
        let mut s = TcpStream::connect(a.addr()).unwrap();
        let mut alloc = |len: u32| {
            s.write_all(&alloc_request(len)).unwrap();
            let mut b = [0u8; ALLOC_REP];
            s.read_exact(&mut b).unwrap();
            let off = u64::from_le_bytes(b[1..9].try_into().unwrap());
            (b[0], off, u128::from_le_bytes(b[9..25].try_into().unwrap()))
        };
        let ids: Vec<u128> = (0..256)
            .map(|_| {
                let (st, _, id) = alloc(4096);
                assert_eq!(st, ST_OK);
                id
            })
            .collect();
        let big = alloc(16 * 4096);
        let small = alloc(4096);
        assert_eq!(big.0, ST_FULL, "nothing fetched yet: nothing may go");
        assert_eq!(small.0, ST_FULL);
        for id in &ids {
            s.write_all(&fetch_request(*id, 0, 4096)).unwrap();
            let mut b = vec![0u8; 4097];
            s.read_exact(&mut b).unwrap();
            assert_eq!(b[0], ST_OK);
        }
        let (st, off, _) = client::alloc(a.addr(), 16 * 4096).unwrap();
        assert_eq!((st, off), (ST_OK, 0), "the ring comes round to its start");
        assert_eq!(
            a.stats().evicted_done,
            16,
            "16 buffers were in the way, no more"
        );
        let (st, off, _) = client::alloc(a.addr(), 4096).unwrap();
        assert_eq!((st, off, a.stats().evicted_done), (ST_OK, 16 * 4096, 17));
    }

    #[test]
    fn lifetime_expires_unfetched_buffers() {
        let (a, stop) = start(4096, Duration::from_millis(500));
        assert_eq!(client::alloc(a.addr(), 4096).unwrap().0, ST_OK);
        assert_eq!(client::alloc(a.addr(), 4096).unwrap().0, ST_FULL);
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(client::alloc(a.addr(), 4096).unwrap().0, ST_OK);
        assert_eq!(a.stats().evicted_expired, 1);
        stop.store(true, Ordering::SeqCst);
    }
}
