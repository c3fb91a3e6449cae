//! Live counters of a server, written by the model and read by `iolab stats` and the lab,
//! the table of the models' names ([`models`]) and the list of the microbenchmarks'
//! ([`microbenchmarks`]).
//!
//! This crate is small on purpose: what reads a running server's counters or lists the
//! models need not link the server stack (`iolab-servers`), which links this.
//!
//! The counters live in a small fixed-layout block of shared memory: with `--stats PATH` it
//! is a file mapped with `mmap(MAP_SHARED)`, so another process can map the same file
//! read-only and sample it as often as it likes (10 Hz, 1 kHz) without a single syscall or
//! lock on the server side. Without `--stats` the same block lives in private memory.
//!
//! Layout (little-endian, every field 8-byte aligned, version 1):
//!
//! | offset | size | field                                                |
//! |--------|------|------------------------------------------------------|
//! | 0      | 8    | magic `b"IOLABST\0"` (written last, with Release)     |
//! | 8      | 4    | version (1)                                          |
//! | 12     | 4    | number of counters (`COUNTERS`)                      |
//! | 16     | 8    | server pid                                           |
//! | 24     | 8    | start time, ns since the Unix epoch                  |
//! | 64*(i+1) | 8  | counter `i` (see [`Counter`]), one per 64-byte line  |
//!
//! Each counter has its own cache line, so the hot path of a server (one relaxed
//! `fetch_add` per event) never shares a line with another counter or with the header the
//! readers poll.

pub mod microbenchmarks;
pub mod models;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// `b"IOLABST\0"` read as a little-endian u64.
const MAGIC: u64 = u64::from_le_bytes(*b"IOLABST\0");
const VERSION: u32 = 1;
const LINE: usize = 64;

/// The counters before the errors, in file order; the error counters follow them, one per
/// [`ErrorKind`] in its order. New counters are appended (readers check the count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    /// Connections open now (a gauge: +1 on open, -1 on close).
    Open,
    Accepted,
    /// Responses queued (one per request answered, whatever its status).
    Requests,
    Refused,
}

/// The slot of the first error counter.
const FIRST_ERROR: usize = Counter::Refused as usize + 1;

/// Number of counters in the block.
pub const COUNTERS: usize = FIRST_ERROR + ErrorKind::ALL.len();
const _: () = assert!(COUNTERS == 14, "the file layout is version 1's");

/// Error kinds, as counted and as named in [`Snapshot::errors`]; their order is their
/// counters' order in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum ErrorKind {
    /// 400: malformed request.
    BadRequest,
    /// 404.
    NotFound,
    /// 405: a method other than GET/HEAD.
    Method,
    /// 414: request line too long.
    UriTooLong,
    /// 431: header block too large or too many header lines.
    HeaderTooLarge,
    /// Any 5xx.
    ServerError,
    /// Any other 4xx (413, ...).
    Other4xx,
    /// The peer reset the connection or closed it while we were writing (ECONNRESET, EPIPE).
    Reset,
    /// Connection closed by the server after `idle_timeout` without progress.
    Timeout,
    /// Any other socket error.
    Io,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 10] = [
        ErrorKind::BadRequest,
        ErrorKind::NotFound,
        ErrorKind::Method,
        ErrorKind::UriTooLong,
        ErrorKind::HeaderTooLarge,
        ErrorKind::ServerError,
        ErrorKind::Other4xx,
        ErrorKind::Reset,
        ErrorKind::Timeout,
        ErrorKind::Io,
    ];

    /// The key used in [`Snapshot::errors`] and in `iolab stats` output.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Method => "method",
            ErrorKind::UriTooLong => "uri_too_long",
            ErrorKind::HeaderTooLarge => "header_too_large",
            ErrorKind::ServerError => "server_error",
            ErrorKind::Other4xx => "other_4xx",
            ErrorKind::Reset => "reset",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Io => "io",
        }
    }

    /// This kind's counter slot in the block.
    fn slot(self) -> usize {
        FIRST_ERROR + self as usize
    }

    /// The error kind of an HTTP status, or None for 1xx/2xx/3xx.
    pub fn of_status(status: u16) -> Option<ErrorKind> {
        match status {
            400 => Some(ErrorKind::BadRequest),
            404 => Some(ErrorKind::NotFound),
            405 => Some(ErrorKind::Method),
            414 => Some(ErrorKind::UriTooLong),
            431 => Some(ErrorKind::HeaderTooLarge),
            500..=599 => Some(ErrorKind::ServerError),
            401..=499 => Some(ErrorKind::Other4xx),
            _ => None,
        }
    }

    /// The kind of a socket error: resets and broken pipes are the peer's doing, timeouts
    /// are ours, anything else is `Io`.
    pub fn of_io(e: &io::Error) -> ErrorKind {
        match e.kind() {
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted => ErrorKind::Reset,
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ErrorKind::Timeout,
            _ => ErrorKind::Io,
        }
    }
}

/// The header line at offset 0.
#[repr(C, align(64))]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    count: AtomicU32,
    pid: AtomicU64,
    started_ns: AtomicU64,
}

#[repr(C, align(64))]
struct Line(AtomicU64);

/// The whole shared block.
#[repr(C)]
struct Block {
    header: Header,
    counters: [Line; COUNTERS],
}

const BLOCK_SIZE: usize = std::mem::size_of::<Block>();
const _: () = assert!(BLOCK_SIZE == LINE * (COUNTERS + 1));

enum Backing {
    Shared(#[allow(dead_code)] memmap2::MmapMut),
    Private(#[allow(dead_code)] Box<Block>),
}

/// The counters of one server. Cheap to update from any thread (`&self`, relaxed atomics).
pub struct Stats {
    block: *const Block,
    path: Option<PathBuf>,
    _backing: Backing,
}

// SAFETY: `block` points into `_backing`, which lives as long as `Stats` and is never moved
// out (the mmap's address and the Box's heap address are stable); every access through it
// is atomic.
unsafe impl Send for Stats {}
// SAFETY: as above; shared access only performs atomic operations.
unsafe impl Sync for Stats {}

impl Default for Stats {
    fn default() -> Self {
        Stats::private()
    }
}

impl Stats {
    /// Counters in private memory (no `--stats` file).
    pub fn private() -> Stats {
        let block = Box::new(new_block());
        let ptr: *const Block = &*block;
        let s = Stats {
            block: ptr,
            path: None,
            _backing: Backing::Private(block),
        };
        s.init_header();
        s
    }

    /// Counters in a shared-memory file at `path`, created (or atomically replaced: a reader
    /// still mapping an old file keeps reading the old one) and readable by [`StatsReader`].
    pub fn create(path: &Path) -> io::Result<Stats> {
        let ctx = |e: io::Error, what: &str| {
            io::Error::new(
                e.kind(),
                format!("stats file {}: {what}: {e}", path.display()),
            )
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = path.file_name().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("stats file {}: not a file name", path.display()),
            )
        })?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = dir.join(tmp_name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| ctx(e, "create"))?;
        let result = (|| {
            file.set_len(BLOCK_SIZE as u64)
                .map_err(|e| ctx(e, "set length"))?;
            // SAFETY: the file is ours, just created with the block's size; other processes
            // only map it read-only, and every access through the mapping is atomic.
            let map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(|e| ctx(e, "mmap"))?;
            let ptr = map.as_ptr() as *const Block;
            // A page-aligned mapping of BLOCK_SIZE bytes satisfies Block's size and alignment
            // (64), and zeroed bytes are valid AtomicU64/AtomicU32 values.
            assert!(map.len() >= BLOCK_SIZE && (ptr as usize) % LINE == 0);
            let s = Stats {
                block: ptr,
                path: Some(path.to_path_buf()),
                _backing: Backing::Shared(map),
            };
            s.init_header();
            std::fs::rename(&tmp, path).map_err(|e| ctx(e, "rename into place"))?;
            Ok(s)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// The stats file, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn block(&self) -> &Block {
        // SAFETY: see the Send/Sync impls: the block outlives self and is only accessed
        // atomically.
        unsafe { &*self.block }
    }

    fn init_header(&self) {
        let h = &self.block().header;
        h.version.store(VERSION, Ordering::Relaxed);
        h.count.store(COUNTERS as u32, Ordering::Relaxed);
        h.pid.store(std::process::id() as u64, Ordering::Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        h.started_ns.store(now, Ordering::Relaxed);
        // Readers check the magic first (Acquire), so they never see a half-written header.
        h.magic.store(MAGIC, Ordering::Release);
    }

    #[inline]
    fn add(&self, c: Counter, n: u64) {
        self.add_slot(c as usize, n);
    }

    fn add_slot(&self, slot: usize, n: u64) {
        self.block().counters[slot]
            .0
            .fetch_add(n, Ordering::Relaxed);
    }

    /// One value, as the server sees it now.
    pub fn get(&self, c: Counter) -> u64 {
        self.block().counters[c as usize].0.load(Ordering::Relaxed)
    }

    /// `accept(2)` returned a connection (whether it is then served or refused).
    #[inline]
    pub fn accepted(&self) {
        self.add(Counter::Accepted, 1);
    }

    /// A connection starts being served (`open` + 1). Pair with [`Stats::conn_closed`].
    #[inline]
    pub fn conn_opened(&self) {
        self.add(Counter::Open, 1);
    }

    /// A served connection is closed (`open` - 1).
    #[inline]
    pub fn conn_closed(&self) {
        self.block().counters[Counter::Open as usize]
            .0
            .fetch_sub(1, Ordering::Relaxed);
    }

    /// A connection was accepted, then closed at once because a limit was reached
    /// (`max_conns`, FD_SETSIZE, thread creation failed). Not counted as open.
    #[inline]
    pub fn refused(&self) {
        self.add(Counter::Refused, 1);
    }

    /// One response queued with this status (the `on_response` of `Session::feed`).
    #[inline]
    pub fn response(&self, status: u16) {
        self.add(Counter::Requests, 1);
        if let Some(kind) = ErrorKind::of_status(status) {
            self.error(kind);
        }
    }

    #[inline]
    pub fn error(&self, kind: ErrorKind) {
        self.add_slot(kind.slot(), 1);
    }

    /// A socket error ended a connection: counted under [`ErrorKind::of_io`].
    pub fn io_error(&self, e: &io::Error) {
        self.error(ErrorKind::of_io(e));
    }

    pub fn snapshot(&self) -> Snapshot {
        let mut values = [0u64; COUNTERS];
        for (v, line) in values.iter_mut().zip(&self.block().counters) {
            *v = line.0.load(Ordering::Relaxed);
        }
        Snapshot::from_values(&values)
    }
}

fn new_block() -> Block {
    Block {
        header: Header {
            magic: AtomicU64::new(0),
            version: AtomicU32::new(0),
            count: AtomicU32::new(0),
            pid: AtomicU64::new(0),
            started_ns: AtomicU64::new(0),
        },
        counters: std::array::from_fn(|_| Line(AtomicU64::new(0))),
    }
}

/// A copy of the counters at one instant (what `iolab stats` prints and the lab samples).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// Connections open now.
    pub open: u64,
    pub accepted: u64,
    pub requests: u64,
    /// Connections closed at once because a limit (max-conns, FD_SETSIZE) was reached.
    pub refused: u64,
    /// Errors by kind ("bad_request", "not_found", "header_too_large", "io", "reset", ...).
    pub errors: std::collections::BTreeMap<String, u64>,
}

impl Snapshot {
    fn from_values(v: &[u64; COUNTERS]) -> Snapshot {
        let errors: BTreeMap<String, u64> = ErrorKind::ALL
            .iter()
            .map(|k| (k.name().to_string(), v[k.slot()]))
            .collect();
        Snapshot {
            // A transiently "negative" gauge (close seen before open by a racing reader)
            // reads as 0 rather than 2^64-1.
            open: if (v[Counter::Open as usize] as i64) < 0 {
                0
            } else {
                v[Counter::Open as usize]
            },
            accepted: v[Counter::Accepted as usize],
            requests: v[Counter::Requests as usize],
            refused: v[Counter::Refused as usize],
            errors,
        }
    }

    /// The count of one error kind (0 if absent).
    pub fn error(&self, kind: ErrorKind) -> u64 {
        self.errors.get(kind.name()).copied().unwrap_or(0)
    }

    /// All errors together (saturating: a file not written by a server may hold anything).
    pub fn total_errors(&self) -> u64 {
        self.errors.values().fold(0u64, |a, &b| a.saturating_add(b))
    }
}

/// Reads a running server's `--stats` file without disturbing it: a read-only mapping,
/// sampled with plain atomic loads (no syscall per snapshot, no lock shared with the server).
pub struct StatsReader {
    _path: std::path::PathBuf,
    map: memmap2::Mmap,
    pid: u64,
    started_ns: u64,
}

impl StatsReader {
    pub fn open(path: &std::path::Path) -> std::io::Result<StatsReader> {
        let bad = |what: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {what}", path.display()),
            )
        };
        let file = File::open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("stats file {}: {e}", path.display())))?;
        let len = file.metadata()?.len();
        if len < BLOCK_SIZE as u64 {
            return Err(bad(format!(
                "not an iolab stats file ({len} bytes, expected at least {BLOCK_SIZE})"
            )));
        }
        // SAFETY: mapped read-only; the server only ever writes the file through atomics and
        // never shrinks it (a new server replaces it by rename, leaving this inode intact).
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        let r = StatsReader {
            _path: path.to_path_buf(),
            map,
            pid: 0,
            started_ns: 0,
        };
        let h = &r.block().header;
        if h.magic.load(Ordering::Acquire) != MAGIC {
            return Err(bad("not an iolab stats file (bad magic)".into()));
        }
        let version = h.version.load(Ordering::Relaxed);
        if version != VERSION {
            return Err(bad(format!(
                "stats format version {version}, this iolab reads {VERSION}"
            )));
        }
        let count = h.count.load(Ordering::Relaxed) as usize;
        if count < COUNTERS || len < (LINE * (count + 1)) as u64 {
            return Err(bad(format!(
                "stats file holds {count} counters, expected {COUNTERS}"
            )));
        }
        let (pid, started_ns) = (
            h.pid.load(Ordering::Relaxed),
            h.started_ns.load(Ordering::Relaxed),
        );
        Ok(StatsReader {
            pid,
            started_ns,
            ..r
        })
    }

    fn block(&self) -> &Block {
        // SAFETY: `open` checked the mapping holds at least BLOCK_SIZE bytes; mappings are
        // page-aligned; Rust permits Relaxed/Acquire atomic loads of lock-free atomics on
        // read-only memory, which is all a reader does.
        unsafe { &*(self.map.as_ptr() as *const Block) }
    }

    /// The pid of the server that wrote the file.
    pub fn pid(&self) -> u64 {
        self.pid
    }

    /// When that server started, in ns since the Unix epoch.
    pub fn started_ns(&self) -> u64 {
        self.started_ns
    }

    pub fn snapshot(&self) -> Snapshot {
        let mut values = [0u64; COUNTERS];
        for (v, line) in values.iter_mut().zip(&self.block().counters) {
            *v = line.0.load(Ordering::Relaxed);
        }
        Snapshot::from_values(&values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file layout: the error counters follow `Refused` in `ErrorKind::ALL`'s order,
    /// which is the enum's own, so a kind's slot never moves when the list is read.
    #[test]
    fn error_slots_follow_the_counters_in_order() {
        for (i, k) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i, "{k:?}");
            assert_eq!(k.slot(), 4 + i);
        }
        assert_eq!(ErrorKind::Io.slot(), COUNTERS - 1);
    }

    #[test]
    fn statuses_map_to_kinds() {
        let s = Stats::private();
        for st in [200, 200, 304, 400, 404, 405, 413, 414, 431, 500, 503] {
            s.response(st);
        }
        let snap = s.snapshot();
        assert_eq!(snap.requests, 11);
        assert_eq!(snap.error(ErrorKind::BadRequest), 1);
        assert_eq!(snap.error(ErrorKind::NotFound), 1);
        assert_eq!(snap.error(ErrorKind::Method), 1);
        assert_eq!(snap.error(ErrorKind::UriTooLong), 1);
        assert_eq!(snap.error(ErrorKind::HeaderTooLarge), 1);
        assert_eq!(snap.error(ErrorKind::Other4xx), 1);
        assert_eq!(snap.error(ErrorKind::ServerError), 2);
        assert_eq!(snap.total_errors(), 8);
        // a file's counters near 2^64 (found by the fuzz target) saturate rather than panic
        let mut huge = [0u64; COUNTERS];
        for k in ErrorKind::ALL {
            huge[k.slot()] = u64::MAX / 2;
        }
        assert_eq!(Snapshot::from_values(&huge).total_errors(), u64::MAX);
        assert_eq!(snap.errors.len(), ErrorKind::ALL.len());
    }

    #[test]
    fn file_is_shared_with_reader() {
        let dir = std::env::temp_dir().join(format!("iolab-stats-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.stats");
        let s = Stats::create(&path).unwrap();
        let r = StatsReader::open(&path).unwrap();
        assert_eq!(r.pid(), std::process::id() as u64);
        s.accepted();
        s.conn_opened();
        s.conn_opened();
        s.conn_closed();
        s.refused();
        s.response(200);
        s.io_error(&io::Error::from(io::ErrorKind::ConnectionReset));
        s.io_error(&io::Error::from(io::ErrorKind::WouldBlock));
        let snap = r.snapshot();
        assert_eq!(
            (snap.open, snap.accepted, snap.requests, snap.refused),
            (1, 1, 1, 1)
        );
        assert_eq!(snap.error(ErrorKind::Reset), 1);
        assert_eq!(snap.error(ErrorKind::Timeout), 1);

        // A new server replaces the file; the old reader keeps the old counters, a new
        // reader sees the new ones.
        let s2 = Stats::create(&path).unwrap();
        s2.response(404);
        assert_eq!(r.snapshot().requests, 1);
        let r2 = StatsReader::open(&path).unwrap();
        assert_eq!(r2.snapshot().error(ErrorKind::NotFound), 1);
        assert_eq!(r2.snapshot().accepted, 0);
        drop((s, s2));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reader_rejects_other_files() {
        let dir = std::env::temp_dir().join(format!("iolab-stats-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let short = dir.join("short");
        std::fs::write(&short, b"hello").unwrap();
        let e = StatsReader::open(&short).err().unwrap();
        assert!(e.to_string().contains("not an iolab stats file"), "{e}");
        let zeros = dir.join("zeros");
        std::fs::write(&zeros, vec![0u8; 4096]).unwrap();
        let e = StatsReader::open(&zeros).err().unwrap();
        assert!(e.to_string().contains("bad magic"), "{e}");
        assert!(StatsReader::open(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
