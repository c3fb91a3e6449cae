//! The request that travels down the component chain, and the completion (with its
//! per-request record) that travels back up.
//!
//! Units everywhere in the simulator: time in milliseconds (`f64`, simulated time, as DiskSim),
//! addresses and lengths in 512-byte sectors.

use serde::Serialize;

/// Bytes in one sector, the unit of `lba` and `sectors`.
pub const SECTOR: u64 = 512;

/// What a request asks the device (or, for file-level requests, the host) to do.
///
/// File-level meaning (a request with `file: Some(..)` entering a host stack, see
/// [`crate::host`]):
///
/// | request | system call it stands for |
/// |---|---|
/// | `Read`, `Write` | `pread`/`pwrite` of `sectors * 512` bytes at `file.offset`; buffered unless [`Flags::DIRECT`]; a write with [`Flags::DSYNC`] / [`Flags::OSYNC`] is an `O_DSYNC` / `O_SYNC` write |
/// | `Flush` with a file | `fsync(fd)`; with [`Flags::DATASYNC`] `fdatasync(fd)`: the file's dirty pages are written, then the device's cache is flushed (`lba` = the file's first sector, `sectors` 0) |
/// | `Flush` without a file | a raw device cache flush (`REQ_PREFLUSH`, what DiskSim-style traces mean) |
/// | `Advise(a)` | `posix_fadvise(fd, file.offset, sectors * 512, a)`; `sectors == 0` means "to the end of the file", as `len == 0` does |
///
/// Devices see only `Read`, `Write` and `Flush`; an `Advise` reaching a device (no host
/// stack) completes at once and does nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Read,
    Write,
    /// Cache flush (SYNCHRONIZE CACHE / FLUSH): every dirty sector reaches the media.
    /// With a file at a host stack: `fsync` / `fdatasync` (see the table above).
    Flush,
    /// `posix_fadvise` on a file range (no I/O by itself; DONTNEED may start write-back).
    Advise(Advice),
}

/// `posix_fadvise` advice (`<fcntl.h>` `POSIX_FADV_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Advice {
    /// `POSIX_FADV_NORMAL`: the device's read-ahead window.
    #[default]
    Normal,
    /// `POSIX_FADV_SEQUENTIAL`: Linux doubles the file's maximum read-ahead window.
    Sequential,
    /// `POSIX_FADV_RANDOM`: no read-ahead (only the requested pages are read).
    Random,
    /// `POSIX_FADV_DONTNEED`: start write-back of the range's dirty pages and drop its clean,
    /// unmapped pages (pages still dirty or under write-back stay).
    DontNeed,
    /// `POSIX_FADV_WILLNEED`: read the range into the cache now (asynchronously).
    WillNeed,
}

impl Advice {
    pub fn parse(s: &str) -> Option<Advice> {
        Some(match s.to_ascii_lowercase().as_str() {
            "normal" => Advice::Normal,
            "sequential" => Advice::Sequential,
            "random" => Advice::Random,
            "dontneed" => Advice::DontNeed,
            "willneed" => Advice::WillNeed,
            _ => return None,
        })
    }
}

impl Op {
    pub fn is_read(self) -> bool {
        self == Op::Read
    }
    pub fn letter(self) -> char {
        match self {
            Op::Read => 'R',
            Op::Write => 'W',
            Op::Flush => 'F',
            Op::Advise(_) => 'A',
        }
    }
}

/// The folio order (log2 pages) from which a read carries [`Flags::LARGE_FOLIOS`]: 16 pages,
/// 64 KiB, at most 8 segments for a 512 KiB request against 128 from 4 KiB pages.
pub const LARGE_FOLIO_ORDER: u8 = 4;

/// Request flags (a small bit set; `Flags::default()` is none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Flags(pub u8);

impl Flags {
    /// The caller waits for this request (synchronous I/O).
    pub const SYNC: Flags = Flags(1);
    /// O_DIRECT: bypasses the page cache.
    pub const DIRECT: Flags = Flags(2);
    /// Force unit access: the device reports completion only once the data is on the media.
    pub const FUA: Flags = Flags(4);
    /// `O_DSYNC` (file-level write): the write returns once its data (and the metadata
    /// needed to read it back) is on stable storage: written through the page cache, then a
    /// device flush (or FUA when the device has no volatile cache).
    pub const DSYNC: Flags = Flags(8);
    /// `O_SYNC` (file-level write): as `DSYNC`, plus all of the inode's metadata. Linux's
    /// `O_SYNC` is `__O_SYNC | O_DSYNC`; set both bits (`Flags::OSYNC.with(Flags::DSYNC)`) or
    /// just this one, the host treats them alike except for the metadata write.
    pub const OSYNC: Flags = Flags(16);
    /// With `Op::Flush` and a file: `fdatasync` rather than `fsync` (no inode-only metadata).
    pub const DATASYNC: Flags = Flags(32);
    /// A page-cache read into large folios (64 KiB or more each, [`LARGE_FOLIO_ORDER`]): few
    /// memory segments per request, which some devices serve faster (a measured device's
    /// `large_folio_points`).
    pub const LARGE_FOLIOS: Flags = Flags(64);
    /// No I/O at all (fio's `null` engine, `/dev/null`, `/dev/zero`): the engine completes the
    /// request the instant it is issued, without the chain ([`crate::engine::Simulator`]).
    pub const NO_IO: Flags = Flags(128);

    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn with(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }
}

/// An I/O priority class (`include/uapi/linux/ioprio.h`'s `IOPRIO_CLASS_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IoClass {
    /// `IOPRIO_CLASS_NONE` (0): no priority set; mq-deadline serves it as best effort.
    #[default]
    None,
    /// `IOPRIO_CLASS_RT` (1): real time.
    Rt,
    /// `IOPRIO_CLASS_BE` (2): best effort.
    Be,
    /// `IOPRIO_CLASS_IDLE` (3): only when nothing else is pending.
    Idle,
}

impl IoClass {
    /// The class of fio's `prioclass`/`cmdprio_class` number (0-3), as the kernel numbers them.
    pub fn from_number(n: u32) -> Option<IoClass> {
        Some(match n {
            0 => IoClass::None,
            1 => IoClass::Rt,
            2 => IoClass::Be,
            3 => IoClass::Idle,
            _ => return None,
        })
    }
}

/// The I/O priority a request carries (the kernel's `bio->bi_ioprio`: class and level 0-7).
/// The default, class `None`, is what every request had before priorities were modelled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct IoPrio {
    pub class: IoClass,
    pub level: u8,
}

impl IoPrio {
    pub const NONE: IoPrio = IoPrio {
        class: IoClass::None,
        level: 0,
    };

    /// The kernel's 16-bit value (`IOPRIO_PRIO_VALUE`: class << 13 | level): requests merge
    /// only when theirs are equal (`blk_rq_merge_ok`, `attempt_merge` in block/blk-merge.c).
    pub fn value(self) -> u16 {
        ((self.class as u16) << 13) | u16::from(self.level)
    }
}

/// A file-level address, for components above the block layer (the page cache, see
/// [`crate::host`]). Devices only look at `Request::lba`, which for a file-level request is
/// the file's first sector plus `offset / 512` (files are laid out contiguously).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FileRef {
    pub file: u32,
    /// Byte offset in the file.
    pub offset: u64,
}

/// One I/O request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Request {
    /// Unique id, assigned by the engine in arrival order.
    pub id: u64,
    /// When the request entered the simulated system (ms).
    pub arrival: f64,
    /// Device number (0 for a single-device run).
    pub dev: u32,
    /// First sector.
    pub lba: u64,
    /// Length in sectors (0 only for a flush).
    pub sectors: u32,
    pub op: Op,
    pub flags: Flags,
    /// File and offset when the request comes from a file-level workload.
    pub file: Option<FileRef>,
    /// The I/O priority (`IoPrio::NONE` unless the workload sets one).
    pub prio: IoPrio,
}

impl Request {
    /// A block-level request of `sectors` at `lba` (no file, no flags, device 0); the
    /// engine gives it its id and arrival.
    pub fn block(lba: u64, sectors: u32, op: Op) -> Request {
        Request {
            id: 0,
            arrival: 0.0,
            dev: 0,
            lba,
            sectors,
            op,
            flags: Flags::default(),
            file: None,
            prio: IoPrio::NONE,
        }
    }

    pub fn end(&self) -> u64 {
        self.lba + u64::from(self.sectors)
    }
    pub fn bytes(&self) -> u64 {
        u64::from(self.sectors) * SECTOR
    }
}

/// How a device's cache served a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheOutcome {
    /// No cache involved (or not reported by the device).
    #[default]
    None,
    /// Every sector came from the cache.
    Hit,
    /// Some sectors came from the cache, the rest from the media.
    Partial,
    /// Every sector came from the media.
    Miss,
    /// A write reported complete once in the cache (write-back, written to media later).
    WriteBack,
}

impl CacheOutcome {
    pub fn name(self) -> &'static str {
        match self {
            CacheOutcome::None => "none",
            CacheOutcome::Hit => "hit",
            CacheOutcome::Partial => "partial",
            CacheOutcome::Miss => "miss",
            CacheOutcome::WriteBack => "writeback",
        }
    }
}

/// Per-request record: where the time went, filled in by each component on the way.
/// All times in ms; the split fields are durations, the others are instants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Record {
    /// Arrival in the system.
    pub arrival: f64,
    /// Time spent waiting in queues (block layer, device queue) before the device took it.
    pub queue_wait: f64,
    /// When the device started working on it.
    pub device_start: f64,
    pub cache: CacheOutcome,
    /// Controller/firmware overheads (command processing, completion).
    pub overhead: f64,
    /// Seek and head switch before the first sector.
    pub seek: f64,
    /// Rotational latency (initial plus any between tracks).
    pub rotation: f64,
    /// Media transfer (reading or writing sectors, track switches included).
    pub transfer: f64,
    /// Time the request waited for the interface (bus) beyond the media transfer.
    pub bus: f64,
    /// Completion reported to the layer above.
    pub completion: f64,
}

impl Record {
    /// The record of a request a device completes at `now` without serving it (out of its
    /// range): the run goes on.
    pub fn unserved(arrival: f64, now: f64) -> Record {
        Record {
            arrival,
            device_start: now,
            completion: now,
            ..Default::default()
        }
    }

    pub fn response(&self) -> f64 {
        self.completion - self.arrival
    }
}

/// A finished request going back up the chain.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Completion {
    pub req: Request,
    pub rec: Record,
}

impl Completion {
    pub fn response(&self) -> f64 {
        self.rec.response()
    }
}
