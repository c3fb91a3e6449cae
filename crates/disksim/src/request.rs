//! The request that travels down the component chain, and the completion (with its
//! per-request record) that travels back up.
//!
//! Units everywhere in the simulator: time in milliseconds (`f64`, simulated time, as DiskSim),
//! addresses and lengths in 512-byte sectors.

use serde::Serialize;

/// Bytes in one sector, the unit of `lba` and `sectors`.
pub const SECTOR: u64 = 512;

/// What a request asks the device to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Read,
    Write,
    /// Cache flush (SYNCHRONIZE CACHE / FLUSH): every dirty sector reaches the media.
    Flush,
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
        }
    }
}

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

    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn with(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }
}

/// A file-level address, for components above the block layer (the page cache of the next
/// issue). Devices only look at `Request::lba`.
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
}

impl Request {
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
