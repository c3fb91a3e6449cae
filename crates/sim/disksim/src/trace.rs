//! Trace readers. Each streams its input (one line in memory at a time), declares its units,
//! rejects implausible values with the line number, and never panics on malformed input.
//!
//! | format | line | units |
//! |---|---|---|
//! | `validate` (DiskSim) | `R\|W Hit\|Miss LBA SECTORS SERVICE_US NEXT_US` | sectors of 512 B; µs; each request issued NEXT_US after the previous one *completes* (DiskSim's replay) |
//! | `ascii` (DiskSim) | `TIME_MS DEVNO LBA SECTORS FLAGS` (flags bit 0: read) | ms since start; sectors |
//! | `fio` (iolog v2/v3) | v2: `FILE ACTION [OFFSET LENGTH]`; v3: `TIME_MS FILE ACTION [OFFSET LENGTH]` | bytes; ms (v3), `wait` in µs (v2) |
//! | `blkparse` | blkparse's default text output; `Q` (queued) events | seconds; sectors |
//! | `msr` (MSR Cambridge CSV) | `Timestamp,Hostname,Disk,Type,Offset,Size,ResponseTime` | Windows filetime (100 ns); bytes |
//! | `iolab` | `TIME_MS OP LBA SECTORS` (OP: R, W, F; `#` comments) | ms; sectors |

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::BufRead;
use std::rc::Rc;

use anyhow::{bail, Result};

use crate::engine::{Pending, Source, When};
use crate::request::{Flags, Op, Request, SECTOR};

/// Limits on what a trace line may say.
pub const MAX_SECTORS: u64 = 1 << 24; // 8 GiB in one request
pub const MAX_LBA: u64 = 1 << 48;
pub const MAX_TIME_MS: f64 = 1e12; // ~31 years
const MAX_LINE: usize = 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Format {
    Validate,
    Ascii,
    Fio,
    Blkparse,
    Msr,
    Iolab,
}

impl Format {
    pub fn parse(s: &str) -> Result<Format> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "validate" | "disksim-validate" => Format::Validate,
            "ascii" | "disksim" | "disksim-ascii" => Format::Ascii,
            "fio" | "iolog" => Format::Fio,
            "blkparse" => Format::Blkparse,
            "msr" | "msr-cambridge" => Format::Msr,
            "iolab" => Format::Iolab,
            _ => bail!("unknown trace format '{s}' (validate, ascii, fio, blkparse, msr, iolab)"),
        })
    }
    /// Guesses the format from a file name and its first line.
    pub fn guess(name: &str, first_line: &str) -> Format {
        Format::guess_why(name, first_line).0
    }
    /// [`Format::guess`] and what the guess rests on (for the user's note).
    pub fn guess_why(name: &str, first_line: &str) -> (Format, &'static str) {
        let l = first_line.trim_start();
        if l.starts_with("fio version") {
            (Format::Fio, "the first line starts with 'fio version'")
        } else if name.ends_with(".csv") {
            (Format::Msr, "the name ends in .csv")
        } else if l.split(',').count() >= 7 {
            (
                Format::Msr,
                "the first line has 7 or more comma-separated fields",
            )
        } else if l.starts_with('R') || l.starts_with('W') {
            (Format::Validate, "the first line starts with R or W")
        } else if l.contains(" Q ") || l.contains(',') && l.split_whitespace().count() > 6 {
            (
                Format::Blkparse,
                "the first line looks like a blkparse event",
            )
        } else if name.ends_with(".iolab") {
            (Format::Iolab, "the name ends in .iolab")
        } else if l.starts_with('#') {
            (Format::Iolab, "the first line is a # comment")
        } else {
            (
                Format::Ascii,
                "nothing else matched: DiskSim's ascii is the default",
            )
        }
    }
    /// Whether the format's lines carry a device number (`--device` chooses among them).
    pub fn numbers_devices(self) -> bool {
        matches!(self, Format::Ascii | Format::Msr)
    }

    pub fn units(self) -> &'static str {
        match self {
            Format::Validate => "LBA and size in 512-byte sectors; service and next-request times in microseconds",
            Format::Ascii => "time in ms; LBA and size in 512-byte sectors",
            Format::Fio => "offset and length in bytes; v3 timestamps in ms, v2 wait in microseconds",
            Format::Blkparse => "time in seconds; sector and count in 512-byte sectors",
            Format::Msr => "timestamp and response time in 100 ns units (Windows filetime); offset and size in bytes",
            Format::Iolab => "time in ms; LBA and size in 512-byte sectors",
        }
    }
}

/// Streaming line reader with line numbers and a line-length limit.
struct Lines<R> {
    r: R,
    buf: Vec<u8>,
    pub lineno: u64,
}

impl<R: BufRead> Lines<R> {
    fn new(r: R) -> Self {
        Lines {
            r,
            buf: Vec::with_capacity(256),
            lineno: 0,
        }
    }
    /// Next non-empty line (trimmed), or None at the end.
    fn next(&mut self) -> Result<Option<String>> {
        loop {
            self.buf.clear();
            let n = std::io::Read::take(&mut self.r, MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut self.buf)?;
            if n == 0 {
                return Ok(None);
            }
            self.lineno += 1;
            if self.buf.len() > MAX_LINE {
                bail!("line {}: longer than {MAX_LINE} bytes", self.lineno);
            }
            let s = String::from_utf8_lossy(&self.buf);
            let t = s.trim();
            if !t.is_empty() {
                return Ok(Some(t.to_string()));
            }
        }
    }
}

fn num<T: std::str::FromStr>(s: Option<&str>, what: &str, line: u64) -> Result<T> {
    let Some(s) = s else {
        bail!("line {line}: missing {what}")
    };
    match s.parse() {
        Ok(v) => Ok(v),
        Err(_) => bail!("line {line}: bad {what} '{s}'"),
    }
}

fn check_time(t: f64, what: &str, line: u64) -> Result<f64> {
    if !t.is_finite() || !(0.0..=MAX_TIME_MS).contains(&t) {
        bail!("line {line}: implausible {what} {t}");
    }
    Ok(t)
}

fn check_extent(lba: u64, sectors: u64, line: u64) -> Result<()> {
    if sectors == 0 || sectors > MAX_SECTORS {
        bail!("line {line}: implausible size {sectors} sectors (1..={MAX_SECTORS})");
    }
    if lba > MAX_LBA || lba + sectors > MAX_LBA {
        bail!("line {line}: implausible LBA {lba}");
    }
    Ok(())
}

fn request(lba: u64, sectors: u64, op: Op) -> Request {
    Request::block(lba, sectors as u32, op)
}

/// What the validate reader knows about each request beyond the request itself: the real
/// drive's response time (ms) and its cache outcome, kept for scoring in issue order.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub service_ms: f64,
    pub outcome: String,
}

/// Shared queue of measured values, pushed by the reader, popped by the scorer (requests
/// complete in issue order in a validate replay: one at a time).
pub type MeasuredQueue = Rc<RefCell<VecDeque<Measured>>>;

/// A trace as a [`Source`].
pub struct TraceSource<R> {
    format: Format,
    lines: Lines<R>,
    /// Validate: think time before the next request (the previous line's NEXT_US).
    next_think: f64,
    last_time: f64,
    fio_version: u8,
    fio_files: Vec<String>,
    fio_wait: f64,
    pub measured: Option<MeasuredQueue>,
    /// The one device replayed from a trace that numbers its devices (ascii); None: the
    /// trace must address a single device.
    pub dev_filter: Option<u32>,
    /// The modelled device's capacity, sectors: a request beyond it is an error.
    capacity: Option<u64>,
    /// A system of several devices (`with_system`): the trace's device numbers it maps, each
    /// with its capacity in sectors; another number is an error with its line.
    system: Option<std::collections::BTreeMap<u32, u64>>,
    first: Option<String>,
    /// Requests handed out, and lines not recognised as this format (skipped).
    pub requests: u64,
    pub unrecognised: u64,
    /// Requests per device number (ascii), including the ones `dev_filter` skips.
    pub per_device: std::collections::BTreeMap<u32, u64>,
}

impl<R: BufRead> TraceSource<R> {
    pub fn new(r: R, format: Format) -> Self {
        TraceSource {
            format,
            lines: Lines::new(r),
            next_think: 0.0,
            last_time: 0.0,
            fio_version: 0,
            fio_files: Vec::new(),
            fio_wait: 0.0,
            measured: None,
            dev_filter: None,
            capacity: None,
            system: None,
            first: None,
            requests: 0,
            unrecognised: 0,
            per_device: Default::default(),
        }
    }

    /// Refuses, with its line, a request that ends beyond `blocks` sectors (the modelled
    /// device's capacity): a device would otherwise complete it at once and count it.
    pub fn with_capacity(mut self, blocks: u64) -> Self {
        self.capacity = Some(blocks);
        self
    }

    /// Replays only device `dev` of a trace that numbers its devices; refused for a format
    /// without device numbers (its requests would all come out as device 0).
    pub fn with_device(mut self, dev: u32) -> Result<Self> {
        if !self.format.numbers_devices() {
            bail!(
                "device {dev} chosen, but a {:?} trace does not number its devices (ascii and msr traces do): it addresses one device",
                self.format
            );
        }
        self.dev_filter = Some(dev);
        Ok(self)
    }

    /// Replays every device of a trace that numbers its devices onto a system: `devices`
    /// maps each trace device number it serves to that device's capacity (sectors). A
    /// request on another number, or past its device's end, is an error with its line.
    pub fn with_system(mut self, devices: std::collections::BTreeMap<u32, u64>) -> Result<Self> {
        if !self.format.numbers_devices() && devices.len() > 1 {
            bail!(
                "a system of {} devices, but a {:?} trace does not number its devices (ascii and msr traces do)",
                devices.len(),
                self.format
            );
        }
        self.system = Some(devices);
        Ok(self)
    }

    /// Keeps each line's measured service time (validate format) in `q`.
    pub fn with_measured(mut self, q: MeasuredQueue) -> Self {
        self.measured = Some(q);
        self
    }

    fn line(&mut self) -> Result<Option<String>> {
        if let Some(f) = self.first.take() {
            return Ok(Some(f));
        }
        self.lines.next()
    }

    fn validate(&mut self, l: &str) -> Result<Pending> {
        let n = self.lines.lineno;
        let mut it = l.split_whitespace();
        let op = match it.next() {
            Some("R") => Op::Read,
            Some("W") => Op::Write,
            other => bail!("line {n}: expected R or W, found {:?}", other.unwrap_or("")),
        };
        let outcome = it.next().unwrap_or("").to_string();
        if !matches!(outcome.as_str(), "Hit" | "Miss" | "Doub" | "Trip") {
            bail!("line {n}: expected Hit, Miss, Doub or Trip, found '{outcome}'");
        }
        let lba: u64 = num(it.next(), "LBA", n)?;
        let sectors: u64 = num(it.next(), "size", n)?;
        check_extent(lba, sectors, n)?;
        let service_us: f64 = num(it.next(), "service time", n)?;
        let next_us: f64 = num(it.next(), "next-request time", n)?;
        let service = check_time(service_us / 1000.0, "service time", n)?;
        let next = check_time(next_us / 1000.0, "next-request time", n)?;
        if it.next().is_some() {
            bail!("line {n}: more than 6 fields");
        }
        let think = std::mem::replace(&mut self.next_think, next);
        if let Some(q) = &self.measured {
            q.borrow_mut().push_back(Measured {
                service_ms: service,
                outcome,
            });
        }
        Ok(Pending {
            when: When::AfterCompletion { think },
            req: request(lba, sectors, op),
        })
    }

    /// Counts a request on device `dev` (a trace that numbers its devices) and tells whether
    /// it is replayed: one device is modelled, so a second one is an error unless
    /// `dev_filter` chose one (they would otherwise be merged onto one disk, silently).
    fn admit_device(&mut self, dev: u32, n: u64) -> Result<bool> {
        *self.per_device.entry(dev).or_default() += 1;
        if let Some(sys) = &self.system {
            if !sys.contains_key(&dev) {
                let known: Vec<u32> = sys.keys().copied().collect();
                bail!("line {n}: device {dev} is not a device of the system (it maps the trace's devices {known:?})");
            }
            return Ok(true);
        }
        match self.dev_filter {
            Some(d) => Ok(d == dev),
            None if self.per_device.len() > 1 => {
                let seen: Vec<String> = self
                    .per_device
                    .iter()
                    .map(|(d, k)| format!("device {d}: {k}"))
                    .collect();
                bail!(
                    "line {n}: the trace addresses several devices ({} requests so far) and one is modelled: choose one with --device N, or run the system on its DiskSim .parv (--config SYSTEM.parv)",
                    seen.join(", ")
                );
            }
            None => Ok(true),
        }
    }

    fn ascii(&mut self, l: &str) -> Result<Option<Pending>> {
        let n = self.lines.lineno;
        let mut it = l.split_whitespace();
        let t = check_time(num(it.next(), "time", n)?, "time", n)?;
        let dev: u32 = num(it.next(), "device", n)?;
        let lba: u64 = num(it.next(), "LBA", n)?;
        let sectors: u64 = num(it.next(), "size", n)?;
        let flags: u32 = num(it.next(), "flags", n)?;
        check_extent(lba, sectors, n)?;
        if !self.admit_device(dev, n)? {
            return Ok(None);
        }
        let op = if flags & 1 == 1 { Op::Read } else { Op::Write };
        let mut r = request(lba, sectors, op);
        r.dev = dev;
        Ok(Some(Pending {
            when: When::At(t),
            req: r,
        }))
    }

    fn iolab(&mut self, l: &str) -> Result<Option<Pending>> {
        let n = self.lines.lineno;
        if l.starts_with('#') {
            return Ok(None);
        }
        let mut it = l.split_whitespace();
        let t = check_time(num(it.next(), "time", n)?, "time", n)?;
        let op = match it.next() {
            Some("R") | Some("r") => Op::Read,
            Some("W") | Some("w") => Op::Write,
            Some("F") | Some("f") => Op::Flush,
            other => bail!(
                "line {n}: expected R, W or F, found {:?}",
                other.unwrap_or("")
            ),
        };
        let lba: u64 = num(it.next(), "LBA", n)?;
        let sectors: u64 = num(it.next(), "size", n)?;
        if op != Op::Flush {
            check_extent(lba, sectors, n)?;
        }
        Ok(Some(Pending {
            when: When::At(t),
            req: request(lba, sectors, op),
        }))
    }

    fn msr(&mut self, l: &str) -> Result<Option<Pending>> {
        let n = self.lines.lineno;
        let f: Vec<&str> = l.split(',').map(str::trim).collect();
        if f.len() < 6 {
            bail!(
                "line {n}: expected Timestamp,Hostname,DiskNumber,Type,Offset,Size[,ResponseTime]"
            );
        }
        if f[0].eq_ignore_ascii_case("timestamp") {
            return Ok(None); // a header line
        }
        let ts: u64 = num(Some(f[0]), "timestamp", n)?;
        let dev: u32 = num(Some(f[2]), "disk number", n)?;
        let op = match f[3].to_ascii_lowercase().as_str() {
            "read" => Op::Read,
            "write" => Op::Write,
            other => bail!("line {n}: type must be Read or Write, found '{other}'"),
        };
        let off: u64 = num(Some(f[4]), "offset", n)?;
        let size: u64 = num(Some(f[5]), "size", n)?;
        let lba = off / SECTOR;
        let sectors = size.div_ceil(SECTOR);
        check_extent(lba, sectors, n)?;
        // Filetime in 100 ns units; times relative to the first request.
        let t_ms = ts as f64 / 10_000.0;
        if self.fio_files.is_empty() {
            self.fio_files.push(String::new());
            self.last_time = t_ms;
            self.fio_wait = t_ms; // origin
        }
        let rel = check_time(t_ms - self.fio_wait, "time (before the first request)", n)?;
        if !self.admit_device(dev, n)? {
            return Ok(None);
        }
        let mut r = request(lba, sectors, op);
        r.dev = dev;
        Ok(Some(Pending {
            when: When::At(rel),
            req: r,
        }))
    }

    fn blkparse(&mut self, l: &str) -> Result<Option<Pending>> {
        let n = self.lines.lineno;
        // "  8,0    3        1     0.000000000   697  Q   R 223490 + 8 [kjournald]"
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 7 || !f[0].contains(',') {
            // Summary lines at the end of blkparse output ("CPU0 (8,0):", totals): skip,
            // counted (a file of nothing else is not a trace).
            self.unrecognised += 1;
            return Ok(None);
        }
        if f[5] != "Q" {
            return Ok(None);
        }
        let t = check_time(num::<f64>(Some(f[3]), "time", n)? * 1000.0, "time", n)?;
        let rwbs = f[6];
        let op = if rwbs.contains('F') && !rwbs.contains('R') && !rwbs.contains('W') {
            Op::Flush
        } else if rwbs.contains('R') {
            Op::Read
        } else if rwbs.contains('W') {
            Op::Write
        } else {
            return Ok(None); // discards (D), none (N)
        };
        if op == Op::Flush && f.len() < 10 {
            return Ok(Some(Pending {
                when: When::At(t),
                req: request(0, 0, Op::Flush),
            }));
        }
        if f.len() < 10 || f[8] != "+" {
            bail!("line {n}: expected 'SECTOR + COUNT' after the RWBS field");
        }
        let lba: u64 = num(Some(f[7]), "sector", n)?;
        let sectors: u64 = num(Some(f[9]), "count", n)?;
        check_extent(lba, sectors, n)?;
        let mut r = request(lba, sectors, op);
        if rwbs.contains('F') {
            r.flags = r.flags.with(Flags::FUA);
        }
        if rwbs.contains('S') {
            r.flags = r.flags.with(Flags::SYNC);
        }
        Ok(Some(Pending {
            when: When::At(t),
            req: r,
        }))
    }

    fn fio(&mut self, l: &str) -> Result<Option<Pending>> {
        let n = self.lines.lineno;
        if l.starts_with("fio version") {
            self.fio_version = match l.split_whitespace().nth(2) {
                Some("2") => 2,
                Some("3") => 3,
                other => bail!(
                    "line {n}: unsupported fio iolog version {:?}",
                    other.unwrap_or("")
                ),
            };
            return Ok(None);
        }
        if self.fio_version == 0 {
            bail!(
                "line {n}: a fio iolog starts with 'fio version 2 iolog' or 'fio version 3 iolog'"
            );
        }
        let mut it = l.split_whitespace();
        let t = if self.fio_version == 3 {
            Some(check_time(num(it.next(), "timestamp", n)?, "timestamp", n)?)
        } else {
            None
        };
        let file = it.next().unwrap_or("").to_string();
        let action = it.next();
        let Some(action) = action else {
            bail!("line {n}: expected 'FILE ACTION'")
        };
        // Files get consecutive 2^40-byte regions of one address space.
        let fileno = match self.fio_files.iter().position(|f| *f == file) {
            Some(i) => i,
            None => {
                if self.fio_files.len() >= 1024 {
                    bail!("line {n}: more than 1024 files");
                }
                self.fio_files.push(file);
                self.fio_files.len() - 1
            }
        } as u64;
        let op = match action {
            "read" => Op::Read,
            "write" => Op::Write,
            "sync" | "datasync" => Op::Flush,
            "wait" if self.fio_version == 2 => {
                let us: f64 = num(it.next(), "wait time", n)?;
                self.fio_wait += check_time(us / 1000.0, "wait", n)?;
                return Ok(None);
            }
            "add" | "open" | "close" | "trim" => return Ok(None),
            other => bail!("line {n}: unknown fio action '{other}'"),
        };
        let (lba, sectors) = if op == Op::Flush {
            (0, 0)
        } else {
            let off: u64 = num(it.next(), "offset", n)?;
            let len: u64 = num(it.next(), "length", n)?;
            let sectors = len.div_ceil(SECTOR);
            if off >= 1 << 40 {
                bail!("line {n}: offset {off} beyond 1 TiB per file");
            }
            let lba = (fileno << 40) / SECTOR + off / SECTOR;
            check_extent(lba, sectors, n)?;
            (lba, sectors)
        };
        let mut r = request(lba, sectors, op);
        r.file = Some(crate::request::FileRef {
            file: fileno as u32,
            offset: lba * SECTOR,
        });
        let when = match t {
            Some(t) => When::At(t),
            None => When::AfterCompletion {
                think: std::mem::take(&mut self.fio_wait),
            },
        };
        Ok(Some(Pending { when, req: r }))
    }
}

impl<R: BufRead> Source for TraceSource<R> {
    fn next(&mut self) -> Result<Option<Pending>> {
        loop {
            let Some(l) = self.line()? else {
                if self.requests == 0 {
                    bail!("{}", self.no_request());
                }
                return Ok(None);
            };
            let p = match self.format {
                Format::Validate => Some(self.validate(&l)?),
                Format::Ascii => self.ascii(&l)?,
                Format::Iolab => self.iolab(&l)?,
                Format::Msr => self.msr(&l)?,
                Format::Blkparse => self.blkparse(&l)?,
                Format::Fio => self.fio(&l)?,
            };
            if let Some(p) = p {
                if let When::At(t) = p.when {
                    // Open-loop traces must be in time order (a small jitter is tolerated).
                    if t + 1e-6 < self.last_time && self.format != Format::Msr {
                        bail!(
                            "line {}: time {t} ms goes back before {} ms",
                            self.lines.lineno,
                            self.last_time
                        );
                    }
                    self.last_time = self.last_time.max(t);
                }
                let cap = match &self.system {
                    Some(sys) if self.format.numbers_devices() => sys.get(&p.req.dev).copied(),
                    Some(sys) => sys.values().next().copied(),
                    None => self.capacity,
                };
                if let Some(cap) = cap {
                    let r = &p.req;
                    if matches!(r.op, Op::Read | Op::Write) && r.end() > cap {
                        bail!(
                            "line {}: {} of {} sectors at LBA {} ends at sector {}, beyond the device's {cap} sectors",
                            self.lines.lineno,
                            if r.op == Op::Read { "read" } else { "write" },
                            r.sectors,
                            r.lba,
                            r.end()
                        );
                    }
                }
                self.requests += 1;
                return Ok(Some(p));
            }
        }
    }
}

impl<R> TraceSource<R> {
    /// Why a trace that ended without a request is not one.
    fn no_request(&self) -> String {
        let lines = self.lines.lineno;
        let mut why = format!(
            "the trace yields no request: {lines} line{} read as {:?}",
            if lines == 1 { "" } else { "s" },
            self.format
        );
        if self.unrecognised > 0 {
            why += &format!(
                ", {} of them not {:?} events",
                self.unrecognised, self.format
            );
        }
        if let Some(d) = self.dev_filter.filter(|_| !self.per_device.is_empty()) {
            why += &format!(
                ", none on device {d} (the trace's devices: {:?})",
                self.per_device
            );
        }
        why + " (is it the right file, and --format?)"
    }
}

/// Reads a whole trace from bytes into a list (for tests and the fuzz target); errors carry
/// the line number.
pub fn read_all(data: &[u8], format: Format) -> Result<Vec<Pending>> {
    let mut s = TraceSource::new(data, format);
    let mut out = Vec::new();
    while let Some(p) = s.next()? {
        out.push(p);
        if out.len() > 1_000_000 {
            bail!("more than a million requests");
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_lines_and_think_times() {
        let q: MeasuredQueue = Default::default();
        let mut s = TraceSource::new(
            &b"R Hit 100 4 13670.0 35942.0\nW Miss 8 8 1971.0 29108.0\n"[..],
            Format::Validate,
        )
        .with_measured(q.clone());
        let a = s.next().unwrap().unwrap();
        assert_eq!(a.when, When::AfterCompletion { think: 0.0 });
        assert_eq!((a.req.lba, a.req.sectors, a.req.op), (100, 4, Op::Read));
        let b = s.next().unwrap().unwrap();
        assert_eq!(b.when, When::AfterCompletion { think: 35.942 });
        assert_eq!(b.req.op, Op::Write);
        assert!(s.next().unwrap().is_none());
        assert_eq!(
            q.borrow().iter().map(|m| m.service_ms).collect::<Vec<_>>(),
            vec![13.67, 1.971]
        );
    }

    #[test]
    fn errors_name_the_line() {
        for (text, fmt, want) in [
            (
                &b"R Hit 1 4 1 1\nX Hit 1 4 1 1\n"[..],
                Format::Validate,
                "line 2",
            ),
            (
                &b"R Hit 1 0 1 1\n"[..],
                Format::Validate,
                "implausible size",
            ),
            (
                &b"R Hit 1 4 -5 1\n"[..],
                Format::Validate,
                "implausible service",
            ),
            (
                &b"0.0 0 1 8 1\n1.0 0 1 8\n"[..],
                Format::Ascii,
                "line 2: missing flags",
            ),
            (
                &b"5.0 0 1 8 1\n1.0 0 1 8 1\n"[..],
                Format::Ascii,
                "goes back",
            ),
            (&b"read 0 4096\n"[..], Format::Fio, "fio version"),
            (
                &b"fio version 2 iolog\nf add\nf read x 4096\n"[..],
                Format::Fio,
                "line 3: bad offset",
            ),
            (&b"1,h,0,Read,0,0,1\n"[..], Format::Msr, "implausible size"),
            (
                &b"0 R 1 99999999999\n"[..],
                Format::Iolab,
                "implausible size",
            ),
        ] {
            let e = read_all(text, fmt).unwrap_err().to_string();
            assert!(e.contains(want), "{fmt:?}: '{e}' lacks '{want}'");
        }
    }

    #[test]
    fn each_format_reads_its_example() {
        let a = read_all(b"0.5 0 1000 16 1\n2.0 0 50 8 0\n", Format::Ascii).unwrap();
        assert_eq!((a[1].when, a[1].req.op), (When::At(2.0), Op::Write));
        let f = read_all(b"fio version 3 iolog\n0 /f add\n0 /f open\n1 /f read 4096 8192\n3 /f write 0 512\n4 /f close\n", Format::Fio).unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(
            (f[0].req.lba, f[0].req.sectors, f[0].when),
            (8, 16, When::At(1.0))
        );
        let f2 = read_all(
            b"fio version 2 iolog\n/f add\n/f read 0 4096\n/f wait 2000\n/f write 4096 4096\n",
            Format::Fio,
        )
        .unwrap();
        assert_eq!(f2[1].when, When::AfterCompletion { think: 2.0 });
        let b = read_all(b"  8,0    3        1     0.000100000   697  Q   R 223490 + 8 [kjournald]\n  8,0    3        2     0.000200000   697  D   R 223490 + 8 [kjournald]\nCPU3 (8,0):\n", Format::Blkparse).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].req.lba, b[0].req.sectors), (223490, 8));
        assert!((matches!(b[0].when, When::At(t) if (t - 0.1).abs() < 1e-9)));
        let m = read_all(b"Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime\n128166372003061629,hm,1,Read,3221225472,4096,1000\n128166372003071629,hm,1,Write,512,1024,1000\n", Format::Msr).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].req.lba, m[1].req.sectors), (6291456, 2));
        assert!(matches!(m[1].when, When::At(t) if (t - 1.0).abs() < 1e-6));
        let i = read_all(b"# iolab\n0 R 0 8\n1.5 F 0 0\n", Format::Iolab).unwrap();
        assert_eq!(i[1].req.op, Op::Flush);
    }

    /// A request past the device's end is refused with its line (it completed in 0 ms and
    /// counted in the statistics), in every format that addresses sectors.
    #[test]
    fn a_request_beyond_the_capacity_is_refused_with_its_line() {
        for (text, fmt) in [
            (&b"0 R 0 8\n1 W 996 8\n"[..], Format::Iolab),
            (&b"0.0 0 0 8 1\n1.0 0 996 8 0\n"[..], Format::Ascii),
            (&b"R Miss 0 8 1 1\nW Miss 996 8 1 1\n"[..], Format::Validate),
        ] {
            let mut s = TraceSource::new(text, fmt).with_capacity(1000);
            assert!(s.next().unwrap().is_some());
            let e = s.next().unwrap_err().to_string();
            assert!(
                e.contains("line 2") && e.contains("beyond the device's 1000 sectors"),
                "{fmt:?}: {e}"
            );
        }
        // The last sector is still the device's.
        let mut s = TraceSource::new(&b"0 R 992 8\n"[..], Format::Iolab).with_capacity(1000);
        assert!(s.next().unwrap().is_some());
    }

    /// An empty file, or 100 KB of random bytes read as blkparse (whose reader skips what is
    /// not an event), yields no request: an error, not a run of zero requests.
    #[test]
    fn a_trace_with_no_request_is_an_error() {
        let e = read_all(b"", Format::Ascii).unwrap_err().to_string();
        assert!(e.contains("no request") && e.contains("0 lines"), "{e}");
        let noise = iolab_sys::testing::random_bytes(100_000, 44);
        let e = read_all(&noise, Format::Blkparse).unwrap_err().to_string();
        assert!(
            e.contains("no request") && e.contains("not Blkparse events"),
            "{e}"
        );
        let e = read_all(b"# only a comment\n", Format::Iolab)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no request"), "{e}");
    }

    #[test]
    fn the_guess_says_what_it_rests_on() {
        assert_eq!(Format::guess_why("t", "fio version 2 iolog").0, Format::Fio);
        let (f, why) = Format::guess_why("x.bin", "\u{1}\u{2}garbage");
        assert_eq!(f, Format::Ascii);
        assert!(why.contains("default"), "{why}");
    }

    /// DiskSim's ascii traces number their devices (ascii.trace: 18 disks); one device is
    /// modelled, so a second device number is an error unless one is chosen, and the
    /// choice counts what it skips (they were merged onto one disk, silently).
    #[test]
    fn several_devices_are_refused_or_one_is_chosen() {
        let text = &b"0.0 0 10 8 1\n1.0 1 10 8 1\n2.0 0 20 8 1\n3.0 2 20 8 1\n"[..];
        let e = read_all(text, Format::Ascii).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("--device"), "{e}");
        let mut s = TraceSource::new(text, Format::Ascii)
            .with_device(0)
            .unwrap();
        let mut n = 0;
        while let Some(p) = s.next().unwrap() {
            assert_eq!(p.req.dev, 0);
            n += 1;
        }
        assert_eq!(n, 2);
        assert_eq!(s.per_device.values().sum::<u64>(), 4);
        let e = read_all(text, Format::Ascii).map(|_| ());
        assert!(e.is_err());
        let mut s = TraceSource::new(text, Format::Ascii)
            .with_device(7)
            .unwrap();
        let e = s.next().unwrap_err().to_string();
        assert!(e.contains("none on device 7"), "{e}");
    }

    /// A device chosen on a trace without device numbers is refused (the fuzz target found
    /// its requests handed out as device 0), and an MSR trace's DiskNumber is honoured.
    #[test]
    fn a_device_is_chosen_only_where_the_trace_numbers_them() {
        let text = &b"#\n0 R 0 8\n1.5 W 8 8\n"[..];
        let e = TraceSource::new(text, Format::Iolab)
            .with_device(1)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("does not number its devices"), "{e}");
        assert_eq!(read_all(text, Format::Iolab).unwrap().len(), 2);
        let msr = &b"128166372003061629,src1,0,Read,0,4096,100\n128166372003061630,src1,1,Write,8192,4096,100\n"[..];
        let e = read_all(msr, Format::Msr).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("--device"), "{e}");
        let mut s = TraceSource::new(msr, Format::Msr).with_device(1).unwrap();
        let p = s.next().unwrap().unwrap();
        assert_eq!((p.req.dev, p.req.lba), (1, 16));
        assert!(s.next().unwrap().is_none());
    }

    #[test]
    fn never_panics_on_garbage() {
        let mut x: u64 = 0x9E3779B97F4A7C15;
        for _ in 0..2000 {
            let mut data = Vec::new();
            for _ in 0..(x % 200) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                data.push(b"RW HitMs 0123456789.+-,\n eE#Qfiover"[(x % 34) as usize]);
            }
            for f in [
                Format::Validate,
                Format::Ascii,
                Format::Fio,
                Format::Blkparse,
                Format::Msr,
                Format::Iolab,
            ] {
                let _ = read_all(&data, f);
            }
        }
    }
}
