//! The hard-disk model: the seed's "disk cache" and "disk" modules, as one component.
//!
//! ```text
//!   request ─► queue (drive scheduler, depth) ─► controller overheads
//!                                                 │
//!                      ┌──── cache (segments) ◄───┤ hit: bus transfer only
//!                      │                          │ miss: media access
//!                      ▼                          ▼
//!                 read-ahead            seek ─► rotation ─► media transfer ─► bus
//!                 write-back destage    (mech.rs)  (layout.rs: zones, skews, spares)
//! ```
//!
//! The device serves one request at a time (the drive's controller); others wait in its
//! queue in scheduler order. The service of a request is computed when it starts, from the
//! drive's state (head position, spindle angle = simulated time, cache contents); background
//! work — read-ahead after a read, destaging of write-back data — is kept as a timeline and
//! evaluated lazily when the next request arrives: read-ahead is abandoned at a sector
//! boundary when the mechanism is needed, while a destage must finish first.

mod bus;
pub mod layout;
pub mod mech;
pub mod params;
pub mod spec;

use crate::engine::{Component, Ctx};
use crate::request::{CacheOutcome, Completion, Op, Record, Request};
use crate::sched::Scheduler;
use layout::{Mapped, Pbn};
pub use spec::HddSpec;

/// A contiguous range of sectors in one buffer segment.
#[derive(Clone, Debug, Default)]
struct Segment {
    start: u64,
    end: u64,
    /// Holds write data (counts against the write-segment limit).
    write: bool,
    /// LRU stamp.
    used: u64,
}

impl Segment {
    fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    /// Slides the start so that the segment holds at most its last `size` sectors.
    fn keep_last(&mut self, size: u64) {
        if self.end - self.start > size {
            self.start = self.end - size;
        }
    }
}

/// Sectors transferred by the media on one track: `n` sectors, the first starting at `t0`,
/// one every `ms`.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    n: u32,
    t0: f64,
    ms: f64,
    cyl: u32,
    head: u32,
}

/// Read-ahead running in the background into segment `seg`. Its tracks are computed lazily
/// (`extend_prefetch`): a read-ahead is usually stopped by the next request within its first
/// track, so the later ones are only worked out when time reaches them.
#[derive(Clone, Debug)]
struct Prefetch {
    seg: usize,
    /// First LBA read ahead.
    first: u64,
    media: Media,
}

/// A media access, computed one track at a time (`Hdd::media_step`): the chunks done so far,
/// the time split, and where the transfer stands.
#[derive(Clone, Debug, Default)]
struct Media {
    chunks: Vec<Chunk>,
    seek: f64,
    rotation: f64,
    transfer: f64,
    /// When the last chunk ends (the mechanism is free).
    end: f64,
    /// Arm position after the last chunk.
    pos: (u32, u32),
    /// Next LBA to transfer and sectors left.
    lba: u64,
    left: u64,
    write: bool,
    /// The next sector may not start before this.
    not_before: f64,
    /// A write's data: sector `i` of the request can be written from `max(enough_at,
    /// data_at + i * data_per)`: once the bus has brought it, and not before the drive holds
    /// enough of the request to start (`enough_at`, see [`Hdd::write_start_blocks`]). The
    /// media writes a sector only if it can when the head reaches it; otherwise that sector
    /// waits for the next revolution.
    enough_at: f64,
    data_at: f64,
    data_per: f64,
    /// Sectors of the access done in chunks before the current one.
    done: u64,
}

impl Media {
    /// When the chunks computed so far end (the start if none yet).
    fn last_end(&self) -> f64 {
        self.chunks
            .last()
            .map(|c| c.t0 + f64::from(c.n) * c.ms)
            .unwrap_or(f64::NEG_INFINITY)
    }
}

/// A read's controller costs (ms): command overhead, data preparation, completion message,
/// and the bus time per sector.
struct ReadCosts {
    command: f64,
    prep: f64,
    completion: f64,
    bus: f64,
}

/// When the mechanism was asked for (`asked`), and when and where it is free.
struct MechStart {
    asked: f64,
    free: f64,
    pos: (u32, u32),
}

/// The last run of LBAs `Layout::map` returned (consecutive sectors of one track): read-ahead
/// continues on the track the request ended on, so most media steps map an LBA of the run
/// mapped just before. Inside a run the answer follows from its first LBA's.
#[derive(Clone, Copy, Debug)]
struct RunMemo {
    lba: u64,
    end: u64,
    mapped: Mapped,
}

/// Counters for the summary.
#[derive(Clone, Debug, Default)]
pub struct HddStats {
    pub reads: u64,
    pub writes: u64,
    pub read_hits: u64,
    pub read_partial: u64,
    pub write_back: u64,
    pub seek_ms: f64,
    pub rotation_ms: f64,
    pub transfer_ms: f64,
    pub busy_ms: f64,
    pub prefetched_sectors: u64,
}

pub struct Hdd {
    spec: HddSpec,
    queue: Scheduler<Request>,
    active: Option<(Request, Record)>,
    /// Arm position (cylinder, head) when the mechanism is next free.
    pos: (u32, u32),
    /// The mechanism is busy with background work (destage) until then.
    busy_until: f64,
    last_read: bool,
    segs: Vec<Segment>,
    clock: u64,
    prefetch: Option<Prefetch>,
    /// End LBA of the last write (for appends that join the running destage).
    last_write_end: Option<u64>,
    /// The last request the queue handed out: its first sector and its end.
    last_started: Option<(u64, u64)>,
    /// See [`RunMemo`] (a `Cell`: mapping is a query, done from `&self`).
    memo: std::cell::Cell<Option<RunMemo>>,
    /// Chunk buffers kept for reuse (no allocation per media access or read-ahead).
    spare_chunks: Vec<Chunk>,
    spare_prefetch: Vec<Chunk>,
    pub stats: HddStats,
}

impl Hdd {
    pub fn new(spec: HddSpec) -> Hdd {
        let n = spec.cache.segments;
        let edge = spec.blocks();
        Hdd {
            queue: Scheduler::new(spec.scheduler, edge),
            spec,
            active: None,
            pos: (0, 0),
            busy_until: 0.0,
            last_read: true,
            segs: vec![Segment::default(); n],
            clock: 0,
            prefetch: None,
            last_write_end: None,
            last_started: None,
            memo: std::cell::Cell::new(None),
            spare_chunks: Vec::with_capacity(8),
            spare_prefetch: Vec::with_capacity(8),
            stats: HddStats::default(),
        }
    }

    pub fn spec(&self) -> &HddSpec {
        &self.spec
    }

    fn oh(&self, v: f64) -> f64 {
        v * self.spec.overhead_scale
    }

    /// Reads or writes `n` sectors from `lba`, the mechanism free at `t` at `pos`; the first
    /// sector may not start before `not_before`. `buf` is reused for the chunks.
    #[allow(clippy::too_many_arguments)]
    fn media(
        &self,
        t: f64,
        pos: (u32, u32),
        lba: u64,
        n: u64,
        write: bool,
        not_before: f64,
        buf: Vec<Chunk>,
    ) -> Media {
        let mut m = Self::media_start(t, pos, lba, n, write, not_before, buf);
        while self.media_step(&mut m) {}
        m
    }

    /// A media access not started yet (no chunk computed).
    fn media_start(
        t: f64,
        pos: (u32, u32),
        lba: u64,
        n: u64,
        write: bool,
        not_before: f64,
        mut buf: Vec<Chunk>,
    ) -> Media {
        buf.clear();
        Media {
            chunks: buf,
            seek: 0.0,
            rotation: 0.0,
            transfer: 0.0,
            end: t,
            pos,
            lba,
            left: n,
            write,
            not_before,
            enough_at: f64::NEG_INFINITY,
            data_at: f64::NEG_INFINITY,
            data_per: 0.0,
            done: 0,
        }
    }

    /// `Layout::map`, answered from the last run mapped when `lba` lies in it.
    fn map(&self, lba: u64) -> Option<Mapped> {
        if let Some(m) = self.memo.get() {
            if m.lba <= lba && lba < m.end {
                let k = lba - m.lba;
                return Some(Mapped {
                    pbn: Pbn {
                        sector: m.mapped.pbn.sector + k as u32,
                        ..m.mapped.pbn
                    },
                    zone: m.mapped.zone,
                    run: (m.end - lba) as u32,
                });
            }
        }
        let mapped = self.spec.layout.map(lba)?;
        self.memo.set(Some(RunMemo {
            lba,
            end: lba + u64::from(mapped.run),
            mapped,
        }));
        Some(mapped)
    }

    /// Computes the next track of a media access; false when nothing is left.
    fn media_step(&self, out: &mut Media) -> bool {
        if out.left == 0 {
            return false;
        }
        let l = &self.spec.layout;
        let m = &self.spec.mech;
        let Some(mp) = self.map(out.lba) else {
            out.left = 0;
            return false;
        };
        let first = out.chunks.is_empty();
        let k = u64::from(mp.run).min(out.left);
        let to = (mp.pbn.cyl, mp.pbn.head);
        let p = m.position(out.pos, to, out.write);
        let mut t = out.end + p;
        let ms = m.period() / f64::from(l.zones[mp.zone].spt);
        let angle = l.angle(mp.zone, mp.pbn);
        let mut ready = t.max(out.not_before);
        let mut w = m.wait_for(ready, angle);
        // Data of this chunk's first sector late under the head: wait for it, then for the
        // sector to come round again.
        let linear = out.data_at + out.done as f64 * out.data_per;
        let first_data = linear.max(out.enough_at);
        if first_data > ready + w {
            ready = first_data;
            w = m.wait_for(ready, angle);
        }
        if first {
            out.seek += p;
            out.rotation += ready - t + w;
        } else {
            // Track and cylinder switches of a multi-track transfer count as transfer; a wait
            // for late write data counts as rotation.
            out.transfer += p;
            out.rotation += ready - t + w;
        }
        t = ready + w;
        out.not_before = f64::NEG_INFINITY;
        // The bus slower than the media: the head overtakes the data at sector `j`, which is
        // written one revolution (or more) later.
        let mut k = k;
        if out.data_per > ms {
            let gap0 = linear - t;
            let j = (-gap0 / (out.data_per - ms)).floor() as i64 + 1;
            if j >= 1 && (j as u64) < k {
                k = j as u64;
                out.not_before = out.data_at + (out.done + k) as f64 * out.data_per;
            }
        }
        out.chunks.push(Chunk {
            n: k as u32,
            t0: t,
            ms,
            cyl: to.0,
            head: to.1,
        });
        out.end = t + k as f64 * ms;
        out.transfer += k as f64 * ms;
        out.pos = to;
        out.lba += k;
        out.left -= k;
        out.done += k;
        true
    }

    /// Computes the running read-ahead's tracks up to the one in progress at `t`.
    fn extend_prefetch(&self, p: &mut Prefetch, t: f64) {
        while p.media.left > 0 && p.media.last_end() <= t {
            if !self.media_step(&mut p.media) {
                break;
            }
        }
    }

    /// Keeps a finished read-ahead's chunk buffer for the next one.
    fn recycle(&mut self, p: Prefetch) {
        if p.media.chunks.capacity() > self.spare_prefetch.capacity() {
            self.spare_prefetch = p.media.chunks;
        }
    }

    /// Sectors of the running read-ahead done by `t`, and whether it is finished.
    fn prefetch_progress(p: &Prefetch, t: f64) -> (u64, bool) {
        let mut done = 0u64;
        for c in &p.media.chunks {
            if t >= c.t0 + f64::from(c.n) * c.ms {
                done += u64::from(c.n);
            } else {
                if t > c.t0 {
                    done += ((t - c.t0) / c.ms) as u64;
                }
                return (done, false);
            }
        }
        (done, p.media.left == 0)
    }

    /// Moves read-ahead data done by `t` into its segment (the read-ahead keeps running).
    fn advance_prefetch(&mut self, t: f64) {
        let Some(mut p) = self.prefetch.take() else {
            return;
        };
        self.extend_prefetch(&mut p, t);
        let (done, finished) = Self::prefetch_progress(&p, t);
        self.fill(p.seg, p.first + done);
        if finished {
            // The head stays where the read-ahead ended, not where the request left it.
            self.pos = p.media.pos;
            self.recycle(p);
        } else {
            self.prefetch = Some(p);
        }
    }

    /// Extends segment `seg` to `end` (read-ahead), sliding its start when read-ahead may
    /// replace the requested data.
    fn fill(&mut self, seg: usize, end: u64) {
        let size = self.spec.cache.segment_sectors;
        let s = &mut self.segs[seg];
        if end > s.end {
            self.stats.prefetched_sectors += end - s.end;
            s.end = end;
            s.keep_last(size);
        }
    }

    /// Stops the read-ahead when the mechanism is wanted at `t`: returns when and where the
    /// mechanism is free (at the end of the sector under the head).
    fn stop_prefetch(&mut self, t: f64) -> (f64, (u32, u32)) {
        let Some(mut p) = self.prefetch.take() else {
            return (t.max(self.busy_until), self.pos);
        };
        self.extend_prefetch(&mut p, t);
        let first = p.first;
        let mut done = 0u64;
        let mut free = t;
        let mut pos = self.pos;
        for c in &p.media.chunks {
            let end = c.t0 + f64::from(c.n) * c.ms;
            if t >= end {
                done += u64::from(c.n);
                pos = (c.cyl, c.head);
                free = free.max(end);
                continue;
            }
            if t > c.t0 {
                let whole = ((t - c.t0) / c.ms).floor() as u64;
                if self.spec.cache.stop_prefetch_in_sector {
                    // Abandon the sector under the head: free now.
                    done += whole.min(u64::from(c.n));
                    free = t;
                } else {
                    // Finish the sector under the head.
                    let k = (whole + 1).min(u64::from(c.n));
                    done += k;
                    free = c.t0 + k as f64 * c.ms;
                }
                pos = (c.cyl, c.head);
            } else {
                // Between tracks or waiting for the first sector: the arm is (going) there.
                pos = (c.cyl, c.head);
                free = t;
            }
            break;
        }
        self.fill(p.seg, first + done);
        self.recycle(p);
        (free, pos)
    }

    /// Sectors of `req` from its start found in one segment: (segment, count).
    fn cached_prefix(&self, lba: u64, end: u64) -> Option<(usize, u64)> {
        if !self.spec.cache.enabled {
            return None;
        }
        let mut best: Option<(usize, u64)> = None;
        for (i, s) in self.segs.iter().enumerate() {
            if s.is_empty() || (s.write && !self.spec.cache.read_hits_on_write_data) {
                continue;
            }
            if s.start <= lba && lba < s.end {
                let n = s.end.min(end) - lba;
                if best.is_none_or(|(_, b)| n > b) {
                    best = Some((i, n));
                }
            }
        }
        best
    }

    fn touch(&mut self, i: usize) {
        self.clock += 1;
        self.segs[i].used = self.clock;
    }

    /// A segment for new read data: the least recently used one. No segment is reserved for
    /// writes: DiskSim 4.0 reads "Use separate write segment" but never sets it (its
    /// `disk.modspec` has no assignment), so every segment holds reads; honouring it cut the
    /// HP C2249A's read hits from 27% to 10% on `ascii.trace` (the validate traces, one
    /// request at a time, do not change).
    fn victim_read(&self) -> usize {
        (0..self.segs.len())
            .min_by_key(|&i| (self.segs[i].used, i))
            .unwrap_or(0)
    }

    /// A segment for write data.
    fn victim_write(&self) -> usize {
        if self.segs.len() == 1 {
            return 0;
        }
        let writes = self
            .segs
            .iter()
            .filter(|s| s.write && !s.is_empty())
            .count();
        let candidates = (0..self.segs.len())
            .filter(|&i| writes < self.spec.cache.max_write_segments || self.segs[i].write);
        candidates
            .min_by_key(|&i| (self.segs[i].used, i))
            .unwrap_or(0)
    }

    /// Drops cached copies of sectors a write replaces (the whole segment holding them).
    fn invalidate(&mut self, lba: u64, end: u64, keep: Option<usize>) {
        for (i, s) in self.segs.iter_mut().enumerate() {
            if Some(i) == keep || s.is_empty() || s.end <= lba || s.start >= end {
                continue;
            }
            // A segment is one contiguous run: a write into it drops it whole.
            s.end = s.start;
        }
        if let Some(p) = &self.prefetch {
            if keep != Some(p.seg) && self.segs[p.seg].start >= self.segs[p.seg].end {
                self.prefetch = None;
            }
        }
    }

    /// With "read-ahead over requested", data already sent to the host may be replaced: the
    /// segment keeps only what lies past the request (the rule chosen on the real drives;
    /// DiskSim 4.0 erases it only for the value -1, `keep_returned_data`).
    fn release_returned(&mut self, seg: usize, end: u64) {
        if self.spec.cache.readahead_over_requested && !self.spec.cache.keep_returned_data {
            let s = &mut self.segs[seg];
            if s.start < end {
                s.start = end.min(s.end.max(end));
                s.end = s.end.max(s.start);
            }
        }
    }

    /// Starts read-ahead at `from` for the read that ended at LBA `req_end`, the mechanism
    /// free at `t` at `pos`. The minimum and maximum read-ahead count from the end of the
    /// request, not from `from`: a read-ahead resumed after a hit (`from` past the request)
    /// stays within "Maximum read-ahead" of what the host has asked for, so it never slides
    /// the segment past data not yet read. Scheme 4 (DEC's) has its own limits, below.
    fn start_prefetch(&mut self, seg: usize, from: u64, req_end: u64, t: f64, pos: (u32, u32)) {
        let c = &self.spec.cache;
        if !c.enabled || c.prefetch == 0 || (c.max_readahead == 0 && c.prefetch != 4) {
            return;
        }
        let l = &self.spec.layout;
        let last = from.saturating_sub(1);
        let mut limit = match c.prefetch {
            1 => l.track_end(last),
            2 => {
                // To the end of the cylinder: follow tracks while the cylinder is the same.
                let cyl = l.map(last).map(|m| m.pbn.cyl);
                let mut e = l.track_end(last);
                while let (Some(m), Some(cy)) = (l.map(e), cyl) {
                    if m.pbn.cyl != cy {
                        break;
                    }
                    e += u64::from(m.run);
                }
                e
            }
            4 => {
                // DEC's scheme, as DiskSim 4.0 runs it: to the end of the track holding the
                // sector after the request, and one track further when the segment began on
                // an earlier track (a stream crossing tracks). Neither "Maximum read-ahead"
                // nor the segment's size stops it: the segment slides, keeping the sectors
                // read last, so the request's successors survive only when the track ends
                // within a segment of them (the Atlas III's 64-sector segments: 17% of its
                // sequential reads hit on the real drive, 276 of 1,307 here; the Cheetah
                // 9LP's 561: 75%, 84% here).
                let track = |x: u64| l.map(x).map(|m| (m.pbn.cyl, m.pbn.head));
                let e = l.track_end(req_end);
                if track(self.segs[seg].start) == track(req_end) {
                    e
                } else {
                    l.track_end(e)
                }
            }
            _ => u64::MAX,
        };
        let dec = c.prefetch == 4;
        if !dec {
            limit = limit.min(req_end + c.max_readahead);
        }
        limit = limit.max(req_end + c.min_readahead);
        if !c.readahead_over_requested && !dec {
            limit = limit.min(self.segs[seg].start + c.segment_sectors);
        }
        limit = limit.min(l.blocks);
        if limit <= from {
            return;
        }
        let buf = std::mem::take(&mut self.spare_prefetch);
        self.prefetch = Some(Prefetch {
            seg,
            first: from,
            media: Self::media_start(t, pos, from, limit - from, false, t, buf),
        });
    }

    /// Sectors of an `n`-sector write the buffer must hold before the media starts on it.
    /// Drives with "Extra write disconnect" (the HP C22xx family) wait for a share of the
    /// request, as DiskSim 4.0 models them: all of it up to 10 sectors, 10 sectors for
    /// requests under 45, 15 from 45. Others start on the first sector.
    fn write_start_blocks(&self, n: u64) -> u64 {
        if self.spec.overheads.extra_write_disconnect.is_none() {
            return 1;
        }
        if n < 45 {
            n.min(10)
        } else {
            15
        }
    }

    /// Serves `req` starting at `now`; returns its record (completion time set).
    fn serve(&mut self, req: &Request, now: f64) -> Record {
        let appending = req.op == Op::Write
            && self.spec.cache.fast_write > 0
            && self.spec.cache.combine_seq_writes
            && self.last_write_end == Some(req.lba);
        // Background destage must finish first (no "sneaky" hits), except for a write that
        // appends to it.
        let t = if appending {
            now
        } else {
            now.max(self.busy_until)
        };
        let mut rec = Record {
            arrival: req.arrival,
            device_start: t,
            queue_wait: t - now,
            ..Default::default()
        };
        match req.op {
            Op::Read => self.read(req, t, &mut rec),
            Op::Write => self.write(req, t, appending, &mut rec),
            Op::Flush => self.flush(t, &mut rec),
            // Host-level advice is no device work (submit answers it before this).
            Op::Advise(_) => rec.completion = t,
        }
        self.stats.busy_ms += rec.completion - t;
        rec
    }

    /// A read at `t`: from the cache when a segment holds all of it, else through the
    /// mechanism.
    fn read(&mut self, req: &Request, t: f64, rec: &mut Record) {
        self.stats.reads += 1;
        self.advance_prefetch(t);
        let prefix = self.cached_prefix(req.lba, req.end());
        let costs = self.read_costs(prefix.is_some_and(|(_, c)| c > 0));
        match prefix {
            Some((seg, c)) if c == u64::from(req.sectors) => {
                self.read_hit(req, seg, t, &costs, rec)
            }
            _ => self.read_miss(req, t, &costs, rec),
        }
        self.last_read = true;
    }

    /// The controller's costs of a read, found in the cache (`hit`, whole or in part) or not.
    fn read_costs(&self, hit: bool) -> ReadCosts {
        let o = &self.spec.overheads;
        let command = match (hit, self.last_read) {
            (true, true) => o.read_hit_after_read,
            (true, false) => o.read_hit_after_write,
            (false, true) => o.read_miss_after_read,
            (false, false) => o.read_miss_after_write,
        };
        ReadCosts {
            command: self.oh(o.per_request) + self.oh(command),
            prep: self.oh(o.data_prep),
            completion: self.oh(o.read_completion),
            bus: self.spec.bus_read_ms,
        }
    }

    /// A read segment `seg` holds whole, at `t`: the bus transfer only. A drive that reads
    /// ahead on an idle hit resumes past the segment's end.
    fn read_hit(&mut self, req: &Request, seg: usize, t: f64, c: &ReadCosts, rec: &mut Record) {
        let n = u64::from(req.sectors);
        self.touch(seg);
        self.release_returned(seg, req.end());
        self.stats.read_hits += 1;
        rec.cache = CacheOutcome::Hit;
        let bus_end = t + c.command + c.prep + n as f64 * c.bus;
        rec.overhead = c.command + c.prep + c.completion;
        rec.bus = n as f64 * c.bus;
        rec.completion = bus_end + c.completion;
        if self.prefetch.is_none() && self.spec.cache.readahead_on_idle_hit {
            let from = self.segs[seg].end;
            let free = (t + c.command).max(self.busy_until);
            self.start_prefetch(seg, from, req.end(), free, self.pos);
        }
    }

    /// A read the cache does not hold whole at `t`: the read-ahead stops for the mechanism
    /// (having perhaps brought the rest meanwhile), and what is still missing comes from the
    /// media.
    fn read_miss(&mut self, req: &Request, t: f64, c: &ReadCosts, rec: &mut Record) {
        let n = u64::from(req.sectors);
        let asked = t + c.command;
        let (free, pos) = self.stop_prefetch(asked);
        let prefix = self.cached_prefix(req.lba, req.end());
        let hit = prefix.map(|(_, c)| c).unwrap_or(0);
        let seg = match prefix {
            Some((s, _)) if !self.segs[s].write => s,
            _ => {
                let s = self.victim_read();
                self.segs[s] = Segment {
                    start: req.lba,
                    end: req.lba,
                    write: false,
                    used: 0,
                };
                s
            }
        };
        self.touch(seg);
        rec.overhead = c.command + c.prep + c.completion;
        if hit < n {
            rec.cache = if hit > 0 {
                self.stats.read_partial += 1;
                CacheOutcome::Partial
            } else {
                CacheOutcome::Miss
            };
            let mech = MechStart { asked, free, pos };
            return self.read_media(req, seg, hit, mech, c, rec);
        }
        self.stats.read_hits += 1;
        rec.cache = CacheOutcome::Hit;
        rec.bus = n as f64 * c.bus;
        rec.completion = asked + c.prep + hit as f64 * c.bus + c.completion;
        self.release_returned(seg, req.end());
        self.pos = pos;
        self.start_prefetch(seg, self.segs[seg].end, req.end(), free, pos);
    }

    /// The sectors of a read past its first `hit` (those in segment `seg`) from the media:
    /// the cached part goes to the host at once, the rest follows the media. Read-ahead then
    /// continues from the request's end.
    fn read_media(
        &mut self,
        req: &Request,
        seg: usize,
        hit: u64,
        mech: MechStart,
        c: &ReadCosts,
        rec: &mut Record,
    ) {
        let n = u64::from(req.sectors);
        let (free, pos) = (mech.free, mech.pos);
        let buf = std::mem::take(&mut self.spare_chunks);
        let m = self.media(free, pos, req.lba + hit, n - hit, false, free, buf);
        let rb = bus::ReadBus::of(&self.spec, n, self.last_read);
        let bus_done = rb.done(&m.chunks, Self::bus_start(hit, &mech, c, &rb));
        rec.seek = m.seek;
        rec.rotation = m.rotation + (free - mech.asked).max(0.0);
        rec.transfer = m.transfer;
        rec.bus = (bus_done - m.end).max(0.0);
        rec.completion = bus_done + c.completion;
        let size = self.spec.cache.segment_sectors;
        let s = &mut self.segs[seg];
        if hit == 0 {
            s.start = req.lba;
        }
        s.end = req.end();
        s.keep_last(size);
        self.add_media_stats(&m);
        self.pos = m.pos;
        self.release_returned(seg, req.end());
        let (end, mpos) = (m.end, m.pos);
        self.spare_chunks = m.chunks;
        self.start_prefetch(seg, req.end(), req.end(), end, mpos);
    }

    /// The bus when a read's media transfer starts: a cached prefix (`hit` sectors) goes to
    /// the host at once and the drive stays connected; a miss disconnected after its command
    /// (DiskSim's `disk_read_arrive`).
    fn bus_start(hit: u64, mech: &MechStart, c: &ReadCosts, rb: &bus::ReadBus) -> bus::BusState {
        if hit > 0 {
            bus::BusState::Connected(mech.asked + c.prep + hit as f64 * c.bus)
        } else {
            bus::BusState::Disconnected(mech.asked + rb.disconnect)
        }
    }

    fn add_media_stats(&mut self, m: &Media) {
        self.stats.seek_ms += m.seek;
        self.stats.rotation_ms += m.rotation;
        self.stats.transfer_ms += m.transfer;
    }

    /// A write at `t` (`appending` to the destage in progress): reported once the bus has
    /// brought its data when the write-back cache takes it, else once on the media; its
    /// data is cached either way.
    fn write(&mut self, req: &Request, t: f64, appending: bool, rec: &mut Record) {
        self.stats.writes += 1;
        let o = self.spec.overheads;
        let n = u64::from(req.sectors);
        let bt = self.spec.bus_write_ms;
        let fast = self.spec.cache.enabled
            && self.spec.cache.fast_write > 0
            && !req.flags.contains(crate::request::Flags::FUA);
        let (oh, data_delay, pos_delay) = self.write_costs(fast);
        let t_cmd = t + oh;
        let bus_start = t_cmd + data_delay + self.oh(o.data_prep);
        let bus_end = bus_start + n as f64 * bt;
        let (free, pos) = self.stop_prefetch(t_cmd + pos_delay);
        let free = if appending {
            free.max(self.busy_until)
        } else {
            free
        };
        let mut not_before = f64::NEG_INFINITY;
        // The minimum seek delay spares only a write that joins a media write still in
        // progress (a stream the drive is already writing); a write arriving after the
        // previous one finished positions anew, even to the next sector.
        let streaming = appending && self.busy_until > t_cmd;
        if !streaming {
            not_before = not_before.max(free + self.oh(o.min_seek_delay));
        }
        let buf = std::mem::take(&mut self.spare_chunks);
        let mut m = Self::media_start(free, pos, req.lba, n, true, not_before, buf);
        m.enough_at = bus_start + self.write_start_blocks(n) as f64 * bt;
        m.data_at = bus_start + bt;
        m.data_per = bt;
        while self.media_step(&mut m) {}
        self.add_media_stats(&m);
        let bus_end = bus::WriteBus::of(&self.spec, n)
            .done(&m.chunks, bus_start, n)
            .max(bus_end);
        let completion = self.oh(o.write_completion);
        rec.overhead = oh + completion;
        rec.bus = n as f64 * bt;
        if fast {
            self.stats.write_back += 1;
            rec.cache = CacheOutcome::WriteBack;
            rec.completion = bus_end + completion;
            self.busy_until = m.end;
        } else {
            rec.cache = CacheOutcome::Miss;
            rec.seek = m.seek;
            rec.rotation = m.rotation;
            rec.transfer = m.transfer;
            rec.completion = m.end.max(bus_end) + completion;
            self.busy_until = self.busy_until.max(m.end);
        }
        self.pos = m.pos;
        self.spare_chunks = m.chunks;
        if self.spec.cache.enabled {
            self.cache_write(req);
        }
        self.last_write_end = Some(req.end());
        self.last_read = false;
    }

    /// A write's controller costs: (command overhead, delay until the bus takes its data,
    /// delay before positioning), `fast` when the write-back cache takes it.
    fn write_costs(&self, fast: bool) -> (f64, f64, f64) {
        let o = &self.spec.overheads;
        let per_req = self.oh(o.per_request);
        if let Some((cmd, data, seek_delta)) = o.extra_write_disconnect {
            let data_delay = self.oh(data) + self.oh(o.reselect);
            return (per_req + self.oh(cmd), data_delay, self.oh(seek_delta));
        }
        let base = match (fast, self.last_read) {
            (true, true) => o.write_hit_after_read,
            (true, false) => o.write_hit_after_write,
            (false, true) => o.write_miss_after_read,
            (false, false) => o.write_miss_after_write,
        };
        (per_req + self.oh(base), 0.0, 0.0)
    }

    /// Caches a write's data in a write segment (the one it appends to, when writes are
    /// combined), dropping stale copies elsewhere.
    fn cache_write(&mut self, req: &Request) {
        let seg = match self
            .segs
            .iter()
            .position(|s| s.write && s.end == req.lba && !s.is_empty())
        {
            Some(s) if self.spec.cache.combine_seq_writes => s,
            _ => self.victim_write(),
        };
        self.invalidate(req.lba, req.end(), Some(seg));
        let size = self.spec.cache.segment_sectors;
        let s = &mut self.segs[seg];
        if s.write && s.end == req.lba && !s.is_empty() {
            s.end = req.end();
        } else {
            *s = Segment {
                start: req.lba,
                end: req.end(),
                write: true,
                used: 0,
            };
        }
        s.keep_last(size);
        self.touch(seg);
    }

    /// A cache flush at `t`: done once the destage in progress, if any, is.
    fn flush(&mut self, t: f64, rec: &mut Record) {
        let (free, pos) = self.stop_prefetch(t);
        self.pos = pos;
        let per_req = self.oh(self.spec.overheads.per_request);
        let completion = self.oh(self.spec.overheads.write_completion);
        rec.overhead = per_req + completion;
        rec.completion = free.max(self.busy_until) + per_req + completion;
    }

    fn start(&mut self, req: Request, ctx: &mut Ctx) {
        self.last_started = Some((req.lba, req.end()));
        let now = ctx.now();
        let mut rec = self.serve(&req, now);
        rec.queue_wait += now - req.arrival;
        let token = req.id;
        ctx.wake_at(rec.completion, token);
        self.active = Some((req, rec));
    }

    /// Where the scheduler takes the head to be, as DiskSim's `ioqueue` does: the first
    /// sector of the last request handed out for the elevators (LOOK, C-LOOK: a request at
    /// that sector or after is ahead), its end for SSTF. (It was the end of the last write,
    /// which put a parity write behind requests the head had to wrap around for.)
    fn head_lba(&self) -> u64 {
        match (self.spec.scheduler, self.last_started) {
            (_, None) => 0,
            (crate::sched::Policy::Sstf, Some((_, end))) => end,
            (_, Some((start, _))) => start,
        }
    }
}

impl Component for Hdd {
    fn name(&self) -> &str {
        "hdd"
    }

    fn submit(&mut self, req: Request, ctx: &mut Ctx) {
        if req.end() > self.spec.blocks()
            || (req.sectors == 0 && req.op != Op::Flush)
            || matches!(req.op, Op::Advise(_))
        {
            // Out of range: complete with no service so the run goes on; the trace readers
            // reject such lines before they get here.
            let rec = Record::unserved(req.arrival, ctx.now());
            ctx.up(Completion { req, rec });
            return;
        }
        if self.active.is_none() {
            self.start(req, ctx);
        } else {
            let lba = req.lba;
            self.queue.push(lba, req);
        }
    }

    fn wake(&mut self, _token: u64, ctx: &mut Ctx) {
        if let Some((req, mut rec)) = self.active.take() {
            rec.completion = ctx.now();
            ctx.up(Completion { req, rec });
        }
        let head = self.head_lba();
        if let Some(next) = self.queue.pop(head) {
            self.start(next, ctx);
        }
    }

    fn stats(&self) -> Vec<(String, f64)> {
        let s = &self.stats;
        let reads = s.reads.max(1) as f64;
        vec![
            ("reads".into(), s.reads as f64),
            ("writes".into(), s.writes as f64),
            ("read_hit_ratio".into(), s.read_hits as f64 / reads),
            (
                "read_partial_hit_ratio".into(),
                s.read_partial as f64 / reads,
            ),
            (
                "write_back_ratio".into(),
                s.write_back as f64 / s.writes.max(1) as f64,
            ),
            ("seek_ms_total".into(), s.seek_ms),
            ("rotation_ms_total".into(), s.rotation_ms),
            ("transfer_ms_total".into(), s.transfer_ms),
            ("prefetched_sectors".into(), s.prefetched_sectors as f64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::layout::Layout;
    use super::mech::{Mech, SeekCurve};
    use super::spec::{CacheSpec, HddSpec, Overheads};
    use super::*;
    use crate::sched::Policy;

    /// 6,000 rpm (10 ms per revolution), 2 surfaces, 100 sectors per track, head switch 0.5 ms
    /// covered by a 6-sector track skew (0.6 ms), a 1-cylinder seek (0.8 ms) covered by a
    /// 10-sector cylinder skew (1 ms; as in DiskSim, the whole skew at a cylinder switch),
    /// bus 0.01 ms per sector, no overheads.
    fn spec(cache: bool) -> HddSpec {
        HddSpec {
            name: "test".into(),
            layout: Layout::uniform(2, 1000, 100, 6.0, 10.0).unwrap(),
            mech: Mech {
                seek: SeekCurve::Table(vec![(1, 0.8), (999, 10.0)]),
                head_switch: 0.5,
                write_settle: 0.0,
                rpm: 6000.0,
            },
            bus_read_ms: 0.01,
            bus_write_ms: 0.01,
            overhead_scale: 1.0,
            overheads: Overheads::default(),
            cache: CacheSpec {
                enabled: cache,
                segments: 2,
                segment_sectors: 200,
                max_write_segments: 1,
                separate_write_segment: false,
                prefetch: if cache { 3 } else { 0 },
                min_readahead: 0,
                max_readahead: 200,
                readahead_over_requested: false,
                keep_returned_data: false,
                readahead_on_idle_hit: false,
                stop_prefetch_in_sector: false,
                read_any_free_blocks: false,
                fast_write: 0,
                read_hits_on_write_data: true,
                combine_seq_writes: false,
                read_watermark: 0.0,
                watermark_by_request: true,
                hold_bus_read: true,
                write_watermark: 0.0,
                hold_bus_write: true,
            },
            queue_depth: 1,
            scheduler: Policy::Fcfs,
        }
    }

    /// `got` is `want` (ms) to within a nanosecond.
    fn assert_ms(got: f64, want: f64, what: &dyn std::fmt::Debug) {
        assert!(
            (got - want).abs() < 1e-9,
            "{got} ms, want {want} ms: {what:?}"
        );
    }

    fn run(spec: HddSpec, reqs: &[(f64, u64, u32, Op)]) -> Vec<Completion> {
        crate::testdev::run_at(Box::new(Hdd::new(spec)), reqs)
    }

    #[test]
    fn one_track_reads_in_one_revolution_and_the_zone_rate_follows_the_skew() {
        // A whole track from sector 0 at t = 0: the head is at angle 0, no seek, no latency:
        // media transfer = one revolution (10 ms).
        let c = &run(spec(false), &[(0.0, 0, 100, Op::Read)])[0];
        assert_ms(c.rec.transfer, 10.0, &c.rec);
        assert!(c.rec.rotation.abs() < 1e-9 && c.rec.seek == 0.0);
        // Four tracks (two cylinders): each switch costs its skew (head switch: 6 sectors =
        // 0.6 ms; cylinder switch: 10 sectors = 1 ms), so the zone's sequential rate is
        // 400 sectors per 40 + 0.6 + 1.0 + 0.6 ms.
        let c = &run(spec(false), &[(0.0, 0, 400, Op::Read)])[0];
        let media = c.rec.transfer + c.rec.rotation;
        assert!(
            (media - (40.0 + 0.6 + 1.0 + 0.6)).abs() < 1e-6,
            "{media} {:?}",
            c.rec
        );
        let rate_mb_s = 400.0 * 512.0 / (media / 1000.0) / 1e6;
        assert!(
            (rate_mb_s - 400.0 * 512.0 / 0.0422 / 1e6).abs() < 1e-3,
            "{rate_mb_s}"
        );
    }

    #[test]
    fn rotational_latency_stays_within_a_revolution() {
        // Reads within one track (the record's rotation then is the initial latency alone).
        let reqs: Vec<_> = (0..500)
            .map(|i| {
                (
                    i as f64 * 37.3,
                    (i * 7919 % 1900) as u64 * 100 + (i % 90) as u64,
                    8,
                    Op::Read,
                )
            })
            .collect();
        for c in run(spec(false), &reqs) {
            assert!((0.0..10.0).contains(&c.rec.rotation), "{:?}", c.rec);
        }
    }

    #[test]
    fn dec_read_ahead_runs_to_the_tracks_end_past_the_segment_which_slides() {
        // Scheme 4 (DEC's, as DiskSim runs it) with 50-sector segments and a 50-sector
        // "Maximum read-ahead", which the scheme does not heed.
        let dec = || {
            let mut s = spec(true);
            s.cache.prefetch = 4;
            s.cache.segment_sectors = 50;
            s.cache.max_readahead = 50;
            s
        };
        // (first read's LBA, a later read at time t: its LBA, hit?)
        let cases = [
            // A lone read (0..8) reads ahead to its track's end (100), past the 50 sectors
            // of "Maximum read-ahead"...
            (0, 30.0, 90, true),
            // ...and the segment slides, keeping the last 50 sectors read: the request's
            // own successors are gone by then.
            (0, 30.0, 8, false),
            // A read that began on the track before (96..104) reads one track further, to
            // 300; one within a track (104..112) stops at that track's end, 200.
            (96, 60.0, 280, true),
            (104, 60.0, 280, false),
            (104, 60.0, 180, true),
        ];
        for (first, t, lba, hit) in cases {
            let out = run(dec(), &[(0.0, first, 8, Op::Read), (t, lba, 8, Op::Read)]);
            assert_eq!(out[0].rec.cache, CacheOutcome::Miss);
            let want = if hit {
                CacheOutcome::Hit
            } else {
                CacheOutcome::Miss
            };
            assert_eq!(out[1].rec.cache, want, "read {first} then {lba} at {t} ms");
        }
    }

    #[test]
    fn multi_track_read_ahead_is_worked_out_as_time_reaches_each_track() {
        // Read 0..8 at t = 0 (track 0 of 100 sectors, 10 ms a revolution): the media is done
        // at 0.8 ms, then read-ahead (up to the 200-sector segment) runs 8..100 until 10 ms,
        // switches head (skew 6 sectors: 0.6 ms) and reads track 1 (100..200) from 10.6 to
        // 20.6 ms. Its tracks are computed lazily: requests must see the same timeline.
        // At 17 ms sectors up to 164 are buffered: 150..158 is a hit (bus only, 8 x 0.01).
        // At 30 ms the whole segment (to 200) is there: 190..198 hits too.
        let out = run(
            spec(true),
            &[
                (0.0, 0, 8, Op::Read),
                (17.0, 150, 8, Op::Read),
                (30.0, 190, 8, Op::Read),
            ],
        );
        assert_eq!(out[0].rec.cache, CacheOutcome::Miss);
        assert_ms(out[0].rec.transfer, 0.8, &out[0].rec);
        assert_eq!(out[1].rec.cache, CacheOutcome::Hit, "{:?}", out[1].rec);
        assert_ms(out[1].response(), 0.08, &out[1].rec);
        assert_eq!(out[2].rec.cache, CacheOutcome::Hit, "{:?}", out[2].rec);
        // At 12 ms track 1 is only read up to sector 114: 150..158 misses. The read-ahead
        // finishes the sector under the head (114, until 12.1 ms) and stops; the head is
        // already on track 1, so no seek: sector 150 comes round at 15.6 ms (3.6 ms of
        // waiting from 12 ms), then 0.8 ms of transfer.
        let out = run(
            spec(true),
            &[(0.0, 0, 8, Op::Read), (12.0, 150, 8, Op::Read)],
        );
        assert_eq!(out[1].rec.cache, CacheOutcome::Miss, "{:?}", out[1].rec);
        assert!(out[1].rec.seek == 0.0, "{:?}", out[1].rec);
        assert!(
            (out[1].rec.rotation - 3.6).abs() < 1e-6 && (out[1].rec.transfer - 0.8).abs() < 1e-6,
            "{:?}",
            out[1].rec
        );
    }

    #[test]
    fn read_ahead_fills_the_segment_and_serves_the_next_read() {
        // Read 8 sectors at 1000, then (after read-ahead had time) 8 at 1008: a hit served
        // by the bus alone (8 x 0.01 ms); a read far away misses; then the first again hits.
        let out = run(
            spec(true),
            &[
                (0.0, 1000, 8, Op::Read),
                (50.0, 1008, 8, Op::Read),
                (100.0, 90_000, 8, Op::Read),
                (150.0, 1016, 8, Op::Read),
            ],
        );
        assert_eq!(out[0].rec.cache, CacheOutcome::Miss);
        assert_eq!(out[1].rec.cache, CacheOutcome::Hit);
        assert_ms(out[1].response(), 0.08, &out[1].rec);
        assert_eq!(out[2].rec.cache, CacheOutcome::Miss);
        assert_eq!(
            out[3].rec.cache,
            CacheOutcome::Hit,
            "two segments: the first stream survives one other read"
        );
        // Without a cache the same read is a miss.
        let out = run(
            spec(false),
            &[(0.0, 1000, 8, Op::Read), (50.0, 1008, 8, Op::Read)],
        );
        assert_eq!(out[1].rec.cache, CacheOutcome::Miss);
    }

    #[test]
    fn mapping_from_the_last_run_agrees_with_the_layout() {
        use super::layout::{Sparing, Zone};
        // Slips and a remapped defect end runs early: every LBA mapped through the memo
        // (forwards, which hits it, then backwards, which misses it) matches Layout::map.
        let mut s = spec(false);
        let z = Zone {
            first_cyl: 0,
            last_cyl: 9,
            spt: 20,
            first_offset: 0.0,
            track_skew: 6.0,
            cyl_skew: 10.0,
            deadspace: 0,
            spares: 3,
            slips: vec![7, 45],
            remaps: vec![(13, 38)],
            first_lba: 0,
            blocks: 0,
        };
        s.layout = Layout::new(2, 10, Sparing::from_disksim(2, 1).unwrap(), vec![z]).unwrap();
        let l = s.layout.clone();
        let hdd = Hdd::new(s);
        let lbas: Vec<u64> = (0..l.blocks).chain((0..l.blocks).rev()).collect();
        for lba in lbas {
            assert_eq!(hdd.map(lba), l.map(lba), "lba {lba}");
        }
        assert_eq!(hdd.map(l.blocks), None);
        // (Runs are longer than one sector, so the forward pass answers from the memo.)
        assert!(l.map(0).unwrap().run > 1);
    }

    #[test]
    fn a_read_across_a_remapped_defect_detours_to_the_spare() {
        use super::layout::{Sparing, Zone};
        // 2 spares at the end of each cylinder (scheme 2); sector 5 of cylinder 0 is bad
        // and remapped to the cylinder's first spare (head 1, sector 98).
        let disk = |remaps: Vec<(u64, u64)>| {
            let mut s = spec(false);
            let z = Zone {
                first_cyl: 0,
                last_cyl: 999,
                spt: 100,
                first_offset: 0.0,
                track_skew: 6.0,
                cyl_skew: 10.0,
                deadspace: 0,
                spares: 2,
                slips: Vec::new(),
                remaps,
                first_lba: 0,
                blocks: 0,
            };
            s.layout = Layout::new(2, 1000, Sparing::from_disksim(2, 1).unwrap(), vec![z]).unwrap();
            s
        };
        let plain = &run(disk(vec![]), &[(0.0, 0, 10, Op::Read)])[0];
        let remapped = &run(disk(vec![(5, 198)]), &[(0.0, 0, 10, Op::Read)])[0];
        // Without the defect: 10 sectors in one sweep, 1 ms from angle 0.
        assert_ms(plain.rec.transfer, 1.0, &plain.rec);
        // With it: sectors 0-4, a head switch to the spare, then back for 6-9: the spindle
        // must come round again (more than half a revolution more).
        let media = |c: &Completion| c.rec.transfer + c.rec.rotation;
        assert!(media(remapped) > media(plain) + 5.0, "{:?}", remapped.rec);
        assert!(
            media(remapped) < media(plain) + 2.0 * 10.0 + 1.0,
            "{:?}",
            remapped.rec
        );
    }

    #[test]
    fn write_back_reports_early_and_a_write_into_a_segment_drops_it() {
        let mut s = spec(true);
        s.cache.fast_write = 2;
        let out = run(
            s,
            &[
                (0.0, 1000, 8, Op::Read),
                (50.0, 1100, 8, Op::Write),
                (100.0, 1008, 8, Op::Read),
            ],
        );
        assert_eq!(out[1].rec.cache, CacheOutcome::WriteBack);
        assert_ms(out[1].response(), 0.08, &"bus only");
        // The write landed inside the read-ahead segment [1000, 1208): the segment is dropped.
        assert_eq!(out[2].rec.cache, CacheOutcome::Miss);
    }

    #[test]
    fn a_write_back_larger_than_its_segment_waits_for_the_media_to_make_room() {
        // A 40-sector segment, the bus 0.01 ms a sector, the media 0.1 (100 sectors a
        // track): a 40-sector write is in the buffer after 0.4 ms; of a 100-sector one the
        // last 60 wait for room, the last until sector 59 is on the media (DiskSim's
        // `disk_buffer_transfer_size`), where the bus alone would take 1 ms.
        let mut s = spec(true);
        s.cache.fast_write = 2;
        s.cache.segment_sectors = 40;
        let out = run(s.clone(), &[(0.0, 0, 40, Op::Write)]);
        assert_ms(out[0].response(), 0.4, &"within the segment");
        let out = run(s, &[(0.0, 0, 100, Op::Write)]);
        let r = out[0].response();
        assert!(
            r > 6.0,
            "{r} ms: the last sector goes after sector 59 is written"
        );
        assert!(r < out[0].rec.completion + 1e-9 && r < 20.0, "{r}");
    }

    /// Completion time of each request (ms).
    fn ends(out: &[Completion]) -> Vec<f64> {
        out.iter().map(|c| c.rec.completion).collect()
    }

    #[test]
    fn read_ahead_resumed_on_an_idle_hit_stays_within_reach_of_the_request() {
        // Max read-ahead 20 past the request, a 40-sector segment that read-ahead may slide
        // over data already sent. A sequential stream of 10-sector reads, each a hit: each
        // hit resumes read-ahead to its own end + 20, so the segment always still holds the
        // next request. (Counting the 20 from the segment's end instead ran 20 further per
        // hit and slid the segment past the stream's next request by the fourth.)
        let mut sp = spec(true);
        sp.cache.max_readahead = 20;
        sp.cache.segment_sectors = 40;
        sp.cache.readahead_over_requested = true;
        sp.cache.readahead_on_idle_hit = true;
        let reqs: Vec<_> = (0..8)
            .map(|i| (i as f64 * 50.0, i * 10, 10, Op::Read))
            .collect();
        let out = run(sp, &reqs);
        assert_eq!(out[0].rec.cache, CacheOutcome::Miss);
        for c in &out[1..] {
            assert_eq!(c.rec.cache, CacheOutcome::Hit, "{:?}", c.rec);
        }
    }

    #[test]
    fn the_head_stays_where_a_finished_read_ahead_left_it() {
        // A read of 50..58 at t = 0 reads ahead to the segment's end, 250: the rest of track
        // 0, track 1 (head switch), then 200..250 on cylinder 1. Long after, a read of 10
        // (cylinder 0, outside the segment) seeks back one cylinder (0.8 ms): the head is not
        // on cylinder 0 any more, where the first read had left it.
        let out = run(
            spec(true),
            &[(0.0, 50, 8, Op::Read), (100.0, 10, 8, Op::Read)],
        );
        let r = &out[1].rec;
        assert_eq!(r.cache, CacheOutcome::Miss, "{r:?}");
        assert_ms(r.seek, 0.8, &r);
    }

    #[test]
    fn stop_prefetch_in_sector_abandons_the_sector_under_the_head() {
        // Read-ahead after 0..8 reaches track 1 (sector 100 from 10.6 ms, 0.1 ms a sector);
        // at 12.05 ms it is inside sector 114 when a read of 150 stops it. Finishing the
        // sector keeps 114 in the buffer (a later read of it hits); stopping in the sector
        // keeps only up to 113 (it misses).
        let reqs = [
            (0.0, 0, 8, Op::Read),
            (12.05, 150, 8, Op::Read),
            (60.0, 114, 1, Op::Read),
        ];
        let out = run(spec(true), &reqs);
        assert_eq!(out[2].rec.cache, CacheOutcome::Hit, "{:?}", out[2].rec);
        let mut sp = spec(true);
        sp.cache.stop_prefetch_in_sector = true;
        let out = run(sp, &reqs);
        assert_eq!(out[2].rec.cache, CacheOutcome::Miss, "{:?}", out[2].rec);
    }

    #[test]
    fn a_drive_with_extra_write_disconnect_writes_once_enough_data_is_buffered() {
        // 20 sectors at LBA 1 at t = 0, bus 0.02 ms a sector: sector 1 passes under the head
        // at 0.1 ms. An ordinary drive holds the first sector's data by then (0.02 ms) and
        // writes on: 0.1 + 20 x 0.1 = 2.1 ms. A drive with extra write disconnect starts only
        // with 10 sectors buffered (0.2 ms): sector 1 comes round again at 10.1 ms, done at
        // 12.1 ms.
        let mut sp = spec(false);
        sp.bus_write_ms = 0.02;
        let w = [(0.0, 1, 20, Op::Write)];
        let e = ends(&run(sp.clone(), &w));
        assert_ms(e[0], 2.1, &e);
        sp.overheads.extra_write_disconnect = Some((0.0, 0.0, 0.0));
        let e = ends(&run(sp, &w));
        assert_ms(e[0], 12.1, &e);
    }

    #[test]
    fn the_head_overtaking_a_writes_data_waits_a_revolution_for_the_rest() {
        // Bus 0.2 ms a sector, media 0.1: 10 sectors from LBA 8, written from 0.8 ms when
        // sector 8 passes. Sector 8 + i is under the head at 0.8 + 0.1 i and its data is in
        // at 0.2 (i + 1): from i = 7 (LBA 15: head at 1.5, data at 1.6) the data is late,
        // so 8..15 are written at once and 15..18 one revolution later, 11.5 to 11.8 ms: 1 ms
        // of transfer, 0.8 + 10 ms of rotation.
        let mut sp = spec(false);
        sp.bus_write_ms = 0.2;
        let out = run(sp, &[(0.0, 8, 10, Op::Write)]);
        let r = &out[0].rec;
        assert_ms(r.completion, 11.8, &r);
        assert_ms(r.transfer, 1.0, &r);
        assert_ms(r.rotation, 10.8, &r);
    }

    #[test]
    fn a_sequential_write_after_idle_time_still_pays_the_minimum_seek_delay() {
        // Minimum seek delay 0.6 ms. 10..20 written at 1..2 ms; 20..30 arrives at 11.9 ms,
        // 0.1 ms before sector 20 comes round: although it follows the last write, the
        // drive positions anew and is ready at 12.5 ms, so it waits a revolution (22..23 ms).
        let mut sp = spec(false);
        sp.overheads.min_seek_delay = 0.6;
        let e = ends(&run(
            sp,
            &[(0.0, 10, 10, Op::Write), (11.9, 20, 10, Op::Write)],
        ));
        assert_ms(e[0], 2.0, &e);
        assert_ms(e[1], 23.0, &e);
    }
}
