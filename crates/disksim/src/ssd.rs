//! SSD / NVMe model: channels × dies × planes of flash behind a controller, a DRAM write
//! buffer, and a host interface.
//!
//! * Addressing: logical pages (`page_bytes`) are striped channel-first, then die, then plane
//!   (a static page-level mapping: the FTL's steady state for reads; no garbage collection —
//!   see below).
//! * A page read occupies its die for `read_us` (tR), then its channel for the page transfer
//!   (`page_bytes / channel_mb_s`). Planes of a die work in parallel on pages of different
//!   planes: each plane is its own resource (multi-plane operation).
//! * A write is taken into the write buffer at host speed and reported complete; each page
//!   is then transferred over its channel and programmed (`program_us`, tPROG) in the
//!   background. When the buffer is full, a write waits for programs to free room — the
//!   sustained write rate is the flash's.
//! * Requests are served concurrently up to `queue_depth` (NVMe submission queue); resources
//!   are reserved first come, first served, so the model is deterministic.
//! * Garbage collection is not modelled (every write lands on an erased page); `erase_ms` is
//!   reported in the configuration only. This is documented as a limit: sustained random
//!   writes on a full drive will be faster in the model than on a real one.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use anyhow::{bail, Result};
use serde::Deserialize;

use crate::engine::{Component, Ctx};
use crate::request::{CacheOutcome, Completion, Op, Record, Request, SECTOR};

fn d_queue() -> usize {
    32
}
fn d_planes() -> u32 {
    1
}

/// `[ssd]` section of a config. Units in the names.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SsdSpec {
    pub channels: u32,
    pub dies_per_channel: u32,
    #[serde(default = "d_planes")]
    pub planes_per_die: u32,
    /// Flash page size (bytes).
    pub page_bytes: u64,
    /// Page read time tR (µs).
    pub read_us: f64,
    /// Page program time tPROG (µs).
    pub program_us: f64,
    /// Block erase time (ms) — documented, not used (no GC).
    #[serde(default)]
    pub erase_ms: f64,
    /// Per-channel transfer rate (MB/s, 10^6 bytes).
    pub channel_mb_s: f64,
    /// Host interface rate (MB/s): ~550 SATA 3, ~3500 PCIe 3 x4.
    pub host_mb_s: f64,
    /// Controller overhead per request (µs).
    pub overhead_us: f64,
    /// Write buffer (KiB); 0 = write-through to flash.
    pub write_buffer_kib: u64,
    /// Requests served at once.
    #[serde(default = "d_queue")]
    pub queue_depth: usize,
    /// Capacity (GiB).
    pub capacity_gib: u64,
}

impl SsdSpec {
    pub fn validate(&self) -> Result<()> {
        let pos = |x: f64| x.is_finite() && x > 0.0;
        if self.channels == 0
            || self.channels > 1024
            || self.dies_per_channel == 0
            || self.dies_per_channel > 1024
        {
            bail!("ssd: channels and dies_per_channel must be within 1..=1024");
        }
        if self.planes_per_die == 0 || self.planes_per_die > 16 {
            bail!("ssd: planes_per_die must be within 1..=16");
        }
        if self.page_bytes < SECTOR || self.page_bytes > 1 << 20 || self.page_bytes % SECTOR != 0 {
            bail!("ssd: page_bytes must be a multiple of 512 up to 1 MiB");
        }
        if !(pos(self.read_us)
            && pos(self.program_us)
            && pos(self.channel_mb_s)
            && pos(self.host_mb_s))
        {
            bail!("ssd: read_us, program_us, channel_mb_s and host_mb_s must be > 0");
        }
        if !(self.overhead_us.is_finite() && self.overhead_us >= 0.0) {
            bail!("ssd: overhead_us must be >= 0");
        }
        if self.queue_depth == 0 || self.queue_depth > 65536 {
            bail!("ssd: queue_depth must be within 1..=65536");
        }
        if self.capacity_gib == 0 || self.capacity_gib > 1 << 20 {
            bail!("ssd: capacity_gib must be within 1..=1048576");
        }
        Ok(())
    }
    pub fn blocks(&self) -> u64 {
        self.capacity_gib << 21
    }
}

pub struct Ssd {
    spec: SsdSpec,
    /// Busy-until per (die, plane) unit and per channel (ms).
    unit_free: Vec<f64>,
    chan_free: Vec<f64>,
    host_free: f64,
    /// Programs pending in the write buffer: (done time, bytes), earliest first.
    pending: BinaryHeap<Reverse<(u64, u64)>>,
    buffered: u64,
    in_service: usize,
    queue: VecDeque<Request>,
    done: std::collections::HashMap<u64, (Request, Record)>,
    pub reads: u64,
    pub writes: u64,
    pub buffer_stalls: u64,
}

/// f64 ms as an orderable key (ns).
fn key(t: f64) -> u64 {
    (t * 1e6).max(0.0) as u64
}

impl Ssd {
    pub fn new(spec: SsdSpec) -> Result<Ssd> {
        spec.validate()?;
        let units = (spec.channels * spec.dies_per_channel * spec.planes_per_die) as usize;
        Ok(Ssd {
            unit_free: vec![0.0; units],
            chan_free: vec![0.0; spec.channels as usize],
            host_free: 0.0,
            pending: BinaryHeap::new(),
            buffered: 0,
            in_service: 0,
            queue: VecDeque::new(),
            done: Default::default(),
            reads: 0,
            writes: 0,
            buffer_stalls: 0,
            spec,
        })
    }

    fn place(&self, page: u64) -> (usize, usize) {
        let c = u64::from(self.spec.channels);
        let d = u64::from(self.spec.dies_per_channel);
        let p = u64::from(self.spec.planes_per_die);
        let chan = page % c;
        let die = (page / c) % d;
        let plane = (page / (c * d)) % p;
        (chan as usize, ((chan * d + die) * p + plane) as usize)
    }

    /// Fraction of flash page `page` that `req` covers.
    fn fraction(&self, page: u64, req: &Request) -> f64 {
        let pb = self.spec.page_bytes;
        let (a, b) = (page * pb, (page + 1) * pb);
        let (s, e) = ((req.lba * SECTOR).max(a), (req.end() * SECTOR).min(b));
        (e.saturating_sub(s)) as f64 / pb as f64
    }

    /// Computes the request's completion time, reserving flash and bus time.
    fn serve(&mut self, req: &Request, now: f64) -> Record {
        let s = &self.spec;
        let mut rec = Record {
            arrival: req.arrival,
            device_start: now,
            queue_wait: now - req.arrival,
            ..Default::default()
        };
        let t0 = now + s.overhead_us / 1000.0;
        let bytes = req.bytes();
        let host_ms = bytes as f64 / (s.host_mb_s * 1000.0);
        let page_xfer = s.page_bytes as f64 / (s.channel_mb_s * 1000.0);
        let first = req.lba * SECTOR / s.page_bytes;
        let last = (req.end() * SECTOR).div_ceil(s.page_bytes);
        match req.op {
            Op::Read => {
                self.reads += 1;
                let mut data_ready = t0;
                for page in first..last {
                    let (ch, unit) = self.place(page);
                    let start = t0.max(self.unit_free[unit]);
                    let sensed = start + s.read_us / 1000.0;
                    let xfer_start = sensed.max(self.chan_free[ch]);
                    // Only the requested bytes of the page cross the channel.
                    let xfer_end = xfer_start + page_xfer * self.fraction(page, req);
                    self.unit_free[unit] = xfer_end; // the page register is busy until moved out
                    self.chan_free[ch] = xfer_end;
                    data_ready = data_ready.max(xfer_end);
                }
                let host_start = (t0.max(self.host_free)).max(data_ready - host_ms);
                let end = host_start + host_ms;
                self.host_free = end;
                rec.cache = CacheOutcome::Miss;
                rec.transfer = data_ready - t0;
                rec.bus = end - data_ready;
                rec.overhead = t0 - now;
                rec.completion = end;
            }
            // Host-level advice (no host stack above): no device work.
            Op::Advise(_) => {
                rec.completion = now;
            }
            Op::Write | Op::Flush => {
                let host_start = t0.max(self.host_free);
                let mut in_buffer = host_start + host_ms;
                self.host_free = in_buffer;
                let cap = s.write_buffer_kib * 1024;
                let mut programmed = in_buffer;
                if req.op == Op::Write {
                    self.writes += 1;
                    // Room in the buffer: wait for the earliest programs to finish if full.
                    if cap > 0 {
                        while self.buffered + bytes > cap {
                            let Some(Reverse((t, b))) = self.pending.pop() else {
                                break;
                            };
                            self.buffered -= b;
                            let t = t as f64 / 1e6;
                            if t > in_buffer {
                                self.buffer_stalls += 1;
                                in_buffer = t;
                            }
                        }
                    }
                    for page in first..last {
                        let (ch, unit) = self.place(page);
                        // The buffer gathers partial pages into full ones: a write costs its
                        // share of a page transfer and a page program.
                        let share = self.fraction(page, req);
                        let xfer_start = in_buffer.max(self.chan_free[ch]);
                        let xfer_end = xfer_start + page_xfer * share;
                        self.chan_free[ch] = xfer_end;
                        let prog_start = xfer_end.max(self.unit_free[unit]);
                        let prog_end =
                            prog_start + s.program_us / 1000.0 * if cap > 0 { share } else { 1.0 };
                        self.unit_free[unit] = prog_end;
                        programmed = programmed.max(prog_end);
                        if cap > 0 {
                            let b = s.page_bytes.min(bytes);
                            self.pending.push(Reverse((key(prog_end), b)));
                            self.buffered += b;
                        }
                    }
                } else {
                    // Flush: every buffered page programmed.
                    while let Some(Reverse((t, b))) = self.pending.pop() {
                        self.buffered -= b;
                        programmed = programmed.max(t as f64 / 1e6);
                    }
                }
                let write_through = cap == 0
                    || req.flags.contains(crate::request::Flags::FUA)
                    || req.op == Op::Flush;
                rec.completion = if write_through { programmed } else { in_buffer };
                rec.cache = if write_through {
                    CacheOutcome::Miss
                } else {
                    CacheOutcome::WriteBack
                };
                rec.overhead = t0 - now;
                rec.bus = host_ms;
                rec.transfer = rec.completion - t0 - host_ms;
            }
        }
        rec
    }

    fn start(&mut self, req: Request, ctx: &mut Ctx) {
        let rec = self.serve(&req, ctx.now());
        self.in_service += 1;
        ctx.wake_at(rec.completion, req.id);
        self.done.insert(req.id, (req, rec));
    }
}

impl Component for Ssd {
    fn name(&self) -> &str {
        "ssd"
    }
    fn submit(&mut self, req: Request, ctx: &mut Ctx) {
        if req.end() > self.spec.blocks() {
            let rec = Record {
                arrival: req.arrival,
                device_start: ctx.now(),
                completion: ctx.now(),
                ..Default::default()
            };
            ctx.up(Completion { req, rec });
            return;
        }
        if self.in_service < self.spec.queue_depth {
            self.start(req, ctx);
        } else {
            self.queue.push_back(req);
        }
    }
    fn wake(&mut self, token: u64, ctx: &mut Ctx) {
        if let Some((req, mut rec)) = self.done.remove(&token) {
            self.in_service -= 1;
            rec.completion = ctx.now();
            ctx.up(Completion { req, rec });
        }
        if self.in_service < self.spec.queue_depth {
            if let Some(next) = self.queue.pop_front() {
                self.start(next, ctx);
            }
        }
    }
    fn stats(&self) -> Vec<(String, f64)> {
        vec![
            ("reads".into(), self.reads as f64),
            ("writes".into(), self.writes as f64),
            ("write_buffer_stalls".into(), self.buffer_stalls as f64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Pending, Simulator, VecSource, When};
    use crate::request::Flags;

    fn spec() -> SsdSpec {
        SsdSpec {
            channels: 4,
            dies_per_channel: 2,
            planes_per_die: 1,
            page_bytes: 4096,
            read_us: 50.0,
            program_us: 500.0,
            erase_ms: 3.0,
            channel_mb_s: 400.0,
            host_mb_s: 4000.0,
            overhead_us: 10.0,
            write_buffer_kib: 64,
            queue_depth: 32,
            capacity_gib: 1,
        }
    }

    fn run(reqs: Vec<(f64, u64, u32, Op)>) -> Vec<f64> {
        let mut sim = Simulator::new(vec![Box::new(Ssd::new(spec()).unwrap())]);
        let items = reqs
            .into_iter()
            .map(|(t, lba, n, op)| Pending {
                when: When::At(t),
                req: Request {
                    id: 0,
                    arrival: 0.0,
                    dev: 0,
                    lba,
                    sectors: n,
                    op,
                    flags: Flags::default(),
                    file: None,
                },
            })
            .collect();
        let mut out = Vec::new();
        sim.run(&mut VecSource::new(items), &mut |c| out.push(c.response()))
            .unwrap();
        out
    }

    #[test]
    fn single_page_read_is_overhead_tr_transfer_host() {
        let r = run(vec![(0.0, 0, 8, Op::Read)]);
        // 10 µs + 50 µs + 4096 B at 400 MB/s (10.24 µs); the host transfer (4000 MB/s) runs
        // cut-through behind the channel transfer and ends with it.
        assert!((r[0] - (0.010 + 0.050 + 0.01024)).abs() < 1e-9, "{}", r[0]);
    }

    #[test]
    fn reads_on_different_channels_overlap_same_die_serialises() {
        // Pages 0 and 1 are on channels 0 and 1: in parallel. Pages 0 and 8 share die 0 of
        // channel 0: the second waits for the first.
        let par = run(vec![(0.0, 0, 8, Op::Read), (0.0, 8, 8, Op::Read)]);
        let ser = run(vec![(0.0, 0, 8, Op::Read), (0.0, 64, 8, Op::Read)]);
        assert!(par[1] < 0.075, "{par:?}");
        assert!(ser[1] > 0.11, "{ser:?}");
    }

    #[test]
    fn writes_are_buffered_until_the_buffer_fills() {
        // 64 KiB buffer = 16 pages; 32 writes of one page at once to the same die: the first
        // 16 complete at host speed, the rest wait for programs (500 µs each, serialised).
        let reqs = (0..32).map(|i| (0.0, i * 64, 8, Op::Write)).collect();
        let r = run(reqs);
        assert!(r[..16].iter().all(|&t| t < 0.05), "{:?}", &r[..16]);
        assert!(r[16] > 0.5, "{:?}", &r[16..]);
    }
}
