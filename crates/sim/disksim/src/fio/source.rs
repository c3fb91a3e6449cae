//! The workload ([`FioSource`]): each job's `numjobs` clones are independent *streams*, each a
//! closed loop of `iodepth` requests (1 for the synchronous engines psync/sync/pvsync, and for
//! libaio on buffered files, where the kernel completes the submission synchronously), issued
//! through the engine's [`When::Stream`]. Each clone has its own file(s) unless `filename`
//! names a shared one, laid out contiguously on the device, one after another from sector 0.
//! Random offsets follow fio's default random map (each block once per pass, in a seeded
//! random order; `norandommap` draws with replacement, as do clones past the maps' bounds,
//! `MAX_RANDOM_MAP` and `MAX_RANDOM_MAPS`). `rate` delays issues to keep the
//! clone's bytes within the rate; `thinktime` waits after each completion.

use std::collections::HashMap;

use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::extra::{ExitWhat, Sampler};
use super::job::{FioJob, IoEngine, JobFile, RwModifier};
use super::phases::{verify_calls, FlowGroup, Verify};
use crate::engine::{Pending, Source, When};
use crate::request::{Advice, FileRef, Flags, Op, Request, SECTOR};

mod watch;

/// The time of one I/O of fio's `null` engine when no calibrated loop time is given, ms:
/// fio 3.33 on this project's 2-core machine did 6.55 M null 4 KiB random reads a second
/// with `norandommap` (`fio --name=n --ioengine=null --size=1g --bs=4k --rw=randread
/// --norandommap`), 0.15 µs each.
pub const NULL_IO_MS: f64 = 0.15e-3;

/// Random maps (fio's per-block "done" bitmap, here a permutation of 4-byte block numbers)
/// up to this many blocks per stream (4 MiB); larger regions draw with replacement, as
/// `norandommap`.
const MAX_RANDOM_MAP: u64 = 1 << 20;
/// All the streams' random maps together, blocks (64 MiB): streams that would pass it draw
/// with replacement. Before this bound a job of many clones over a file of tiny blocks built
/// a map per clone (found by the fuzzer: 160 clones of a 4 MiB file at `bs=2`, 2 M blocks
/// each, took 9 s; 4,096 clones of 16 M blocks would have taken 256 GiB).
const MAX_RANDOM_MAPS: u64 = 1 << 24;

/// A file of the simulated run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimFile {
    pub name: String,
    /// First sector on the device.
    pub lba: u64,
    pub bytes: u64,
    #[serde(skip)]
    pub advice: Option<Advice>,
}

/// Per-clone state.
struct Stream {
    job: usize,
    files: Vec<u32>,
    /// Bytes of the region used in each file.
    region: u64,
    rng: ChaCha8Rng,
    /// fio's own random state for the I/O priorities (`td->prio_state`), apart from the
    /// offsets' and sizes' so that a priority option leaves them as they were.
    prio_rng: ChaCha8Rng,
    /// Sequential position (bytes) and file index.
    pos: u64,
    file_i: usize,
    /// Random map: the block order of this pass, and how far through it.
    perm: Vec<u32>,
    perm_i: usize,
    /// No random map for this stream: the run's budget was spent ([`MAX_RANDOM_MAPS`]).
    no_map: bool,
    issued_bytes: u64,
    /// Bytes per op for the rate cap.
    rate_bytes: [u64; 2],
    done: bool,
    /// `posix_fadvise` calls made before the first I/O (fio's `invalidate` and
    /// `fadvise_hint`), still to hand out.
    prelude: Vec<Request>,
    /// Completions of prelude calls still to come: they free no I/O slot.
    prelude_pending: u64,
    /// `time_based` or `loops`: the bytes issued at which the next pass over the job's
    /// `io_size` starts.
    pass_end: u64,
    /// When the clone started (its job's `runtime` and `rate` count from here), ms.
    start: f64,
    /// Requests handed out and not yet completed (prelude calls included).
    in_flight: u64,
    /// `rw=randread:N`: sequential I/Os left before the next random offset.
    run_left: u64,
    /// The generator's seed (the verify phase replays the writes' offsets from it).
    seed: u64,
    /// I/Os issued (`number_ios`).
    ios: u64,
    /// The random map's room was taken from the run's budget (once, not again on replay).
    map_charged: bool,
    /// `random_distribution`'s generator, made on the first random offset.
    sampler: Option<Sampler>,
    /// `rate_process=poisson`: the last I/O's due time per direction, ms.
    poisson_due: [f64; 2],
    /// `flow`: I/Os this clone issued; waiting for its share (since when, ms).
    flow_count: u64,
    flow_parked: Option<f64>,
    verify: Verify,
    verify_calls: Vec<Request>,
    /// Stopped by another job's `exitall`: requests handed out are dropped at issue.
    stopped: bool,
    /// The latest time of a request handed out, ms (later than now: not issued yet).
    last_at: f64,
    /// `zonemode=strided`: the zone's first byte, and the bytes done in it.
    zone_start: u64,
    zone_bytes: u64,
    /// `latency_target`: the queue-depth search, and a wait for the I/O in flight before
    /// the next cycle (true: the job's figures restart then).
    lat: Option<super::latency::Search>,
    quiesce: Option<bool>,
}

/// A `posix_fadvise(fd, 0, 0, a)` on file `id`.
fn advise_request(f: &SimFile, id: u32, a: Advice) -> Request {
    Request {
        file: Some(FileRef {
            file: id,
            offset: 0,
        }),
        ..Request::block(f.lba, 0, Op::Advise(a))
    }
}

fn streams_files_dedup(ids: &[u32]) -> Vec<u32> {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

/// A job file as a workload.
pub struct FioSource {
    pub jobs: Vec<FioJob>,
    pub files: Vec<SimFile>,
    streams: Vec<Stream>,
    /// Initial requests of started clones not yet handed out: (stream, remaining, at ms).
    initial: std::collections::VecDeque<(u32, u64, f64)>,
    /// Per job: the jobs it waits for (`stonewall`: all before it; `wait_for`: one), its
    /// clones still running, whether it has started.
    waits_on: Vec<Vec<usize>>,
    clones_left: Vec<u64>,
    started: Vec<bool>,
    /// Each clone's initial requests (stream, iodepth + prelude calls).
    depth_of: Vec<(u32, u64)>,
    /// Simulated time the jobs start at (ms): runtime and rate count from here.
    start: f64,
    /// The application's time between a completion and its next request, ms.
    gap: f64,
    /// Blocks of random maps still allowed ([`MAX_RANDOM_MAPS`]).
    map_budget: u64,
    /// fio's flow groups by `flow_id`, and how many clones wait for their share.
    flows: HashMap<u32, FlowGroup>,
    parked: usize,
    /// fio's steady-state detection, if a job has it ([`super::steady`]).
    steady: Option<super::steady::Monitor>,
    /// Per job, when its figures restart (fio's `reset_all_stats` at the end of a
    /// latency-target search), shared with [`super::JobStats`].
    pub(super) resets: std::sync::Arc<std::sync::Mutex<Vec<Option<f64>>>>,
}

impl FioSource {
    /// Starts the jobs at `t` ms instead of 0 (a second run in the same simulator, after a
    /// warm-up pass).
    pub fn start_at(mut self, t: f64) -> FioSource {
        let t = t.max(0.0);
        let shift = t - self.start;
        self.start = t;
        for i in &mut self.initial {
            i.2 += shift;
        }
        for s in &mut self.streams {
            s.start += shift;
        }
        self
    }

    pub fn start(&self) -> f64 {
        self.start
    }

    /// The application's own time between a completion and its next request, µs (fio's
    /// per-I/O loop: [`crate::host::HostCpu::app_gap_us`]).
    pub fn with_app_gap_us(mut self, us: f64) -> FioSource {
        self.gap = (us / 1000.0).max(0.0);
        self
    }

    /// Lays out the files from sector `first_lba` and checks they fit `capacity` sectors.
    pub fn new(jf: &JobFile, first_lba: u64, capacity: u64) -> Result<FioSource> {
        let mut files: Vec<SimFile> = Vec::new();
        let mut by_name: HashMap<String, u32> = HashMap::new();
        let mut next_lba = first_lba;
        let mut streams = Vec::new();
        let mut initial = Vec::new();
        let mut jobs = jf.jobs.clone();
        for j in &mut jobs {
            if j.whole_device {
                // fio takes a block device's size: here the simulated device's.
                let b = capacity.saturating_sub(first_lba) * SECTOR;
                // (from `offset` to the end, as fio's io_size on a device)
                let Some(b) = b.checked_sub(j.offset).filter(|&b| b > 0) else {
                    bail!(
                        "line {}: job '{}': offset={} is past the device's end ({b} bytes)",
                        j.line,
                        j.name,
                        j.offset
                    );
                };
                j.size = Some(b);
                j.io_bytes.get_or_insert(b);
                if b < j.bs[0].1.max(j.bs[1].1) {
                    bail!(
                        "line {}: job '{}': the device is smaller than a block",
                        j.line,
                        j.name
                    );
                }
            }
        }
        let mut flows: HashMap<u32, FlowGroup> = HashMap::new();
        for (ji, job) in jobs.iter_mut().enumerate() {
            size_at_layout(job, &files, &by_name, capacity - next_lba.min(capacity))?;
            let job = &*job;
            let fb = job.file_bytes();
            // fio lays a new file out to `offset` + its size (checked with fio 3.33:
            // offset=1m size=4m made a 5 MiB file, written from 1 MiB).
            let fbytes = job.offset.saturating_add(fb);
            for clone in 0..job.numjobs {
                let mut ids = Vec::new();
                for f in 0..job.nrfiles {
                    let name = match (&job.filename, &job.filename_format) {
                        (Some(n), _) => n.clone(),
                        (None, Some(fmt)) => expand_filename(fmt, &job.name, clone, f),
                        (None, None) => format!("{}.{}.{}", job.name, clone, f),
                    };
                    if let Some(&id) = by_name.get(&name) {
                        let existing = &mut files[id as usize];
                        if existing.bytes < fbytes {
                            bail!("file '{name}' is used by several jobs with different sizes");
                        }
                        ids.push(id);
                        continue;
                    }
                    let id = files.len() as u32;
                    // Files start on 1 MiB boundaries, as an empty ext4 lays out large files;
                    // a whole device is its sectors.
                    let sectors = if job.whole_device {
                        fbytes / SECTOR
                    } else {
                        fbytes.div_ceil(1 << 20) * ((1 << 20) / SECTOR)
                    };
                    if next_lba + sectors > capacity {
                        bail!(
                            "the job file's files ({} MiB so far) do not fit the device ({} MiB)",
                            ((next_lba + sectors) * SECTOR) >> 20,
                            (capacity * SECTOR) >> 20
                        );
                    }
                    files.push(SimFile {
                        name: name.clone(),
                        lba: next_lba,
                        bytes: fbytes,
                        advice: job.advice(),
                    });
                    next_lba += sectors;
                    by_name.insert(name, id);
                    ids.push(id);
                }
                let region = job.size.unwrap_or(fb).min(fb);
                let seed = job
                    .randseed
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    .wrapping_add(ji as u64 * 1_000_003 + clone);
                let sid = streams.len() as u32;
                streams.push(Stream::new(
                    ji,
                    ids.clone(),
                    region,
                    seed,
                    job.io_bytes.unwrap_or(0),
                ));
                if job.extra.flow > 0 {
                    flows.entry(job.extra.flow_id).or_default().weight += u64::from(job.extra.flow);
                }
                let mut prelude = Vec::new();
                // (fio's null engine opens no file: no cache drop, no advice)
                let ids_used = if matches!(job.ioengine, IoEngine::Null | IoEngine::Cpuio) {
                    Vec::new()
                } else {
                    streams_files_dedup(&ids)
                };
                for &id in &ids_used {
                    let advise = |a: Advice| advise_request(&files[id as usize], id, a);
                    if job.invalidate {
                        prelude.push(advise(Advice::DontNeed));
                    }
                    if let Some(a) = job.advice() {
                        prelude.push(advise(a));
                    }
                }
                let np = prelude.len() as u64;
                if let Some(s) = streams.last_mut() {
                    let s: &mut Stream = s;
                    s.prelude = prelude;
                    s.prelude_pending = np;
                }
                initial.push((sid, job.effective_depth() + np));
            }
        }
        let waits_on = waits_on(&jobs);
        let job_of: Vec<usize> = streams.iter().map(|s: &Stream| s.job).collect();
        let steady = super::steady::Monitor::new(&jobs, &job_of);
        let mut src = FioSource {
            clones_left: jobs.iter().map(|j| j.numjobs).collect(),
            started: vec![false; jobs.len()],
            jobs,
            waits_on,
            files,
            streams,
            initial: Default::default(),
            depth_of: initial,
            start: 0.0,
            gap: 0.0,
            map_budget: MAX_RANDOM_MAPS,
            flows,
            parked: 0,
            steady,
            resets: Default::default(),
        };
        if let Ok(mut r) = src.resets.lock() {
            *r = vec![None; src.jobs.len()];
        }
        src.start_ready_jobs(0.0);
        Ok(src)
    }

    /// Starts, at `now`, every job not started whose waits are over.
    fn start_ready_jobs(&mut self, now: f64) {
        for j in 0..self.jobs.len() {
            if self.started[j] || self.waits_on[j].iter().any(|&w| self.clones_left[w] > 0) {
                continue;
            }
            self.started[j] = true;
            let at = now + self.jobs[j].startdelay_ms;
            for &(sid, depth) in &self.depth_of {
                let s = &mut self.streams[sid as usize];
                if s.job == j {
                    s.start = at;
                    let job = &self.jobs[j];
                    let mut depth = depth;
                    if job.extra.lat.target_ms > 0.0 {
                        // (the search starts at depth 1, its ceiling fio's iodepth even where
                        // the engine issues one at a time: fio's latency_qd_high)
                        s.lat = Some(super::latency::Search::new(job.iodepth, at));
                        depth = s.prelude_pending + 1;
                    }
                    self.initial.push_back((sid, depth, at));
                }
            }
        }
    }

    /// A clone with nothing in flight and nothing more to issue has ended: its job ends with
    /// its last clone, and the jobs waiting for it may start.
    fn clone_may_end(&mut self, sid: u32, now: f64) {
        let Some(s) = self.streams.get_mut(sid as usize) else {
            return;
        };
        if !s.done || s.in_flight > 0 || !s.prelude.is_empty() {
            return;
        }
        s.in_flight = u64::MAX; // ended: counted once
        if s.flow_parked.take().is_some() {
            self.parked -= 1;
        }
        let j = s.job;
        self.clones_left[j] -= 1;
        let x = self.jobs[j].extra.clone();
        if x.flow > 0 {
            // fio's flow_exit_job: the group's weight without this clone.
            let id = x.flow_id;
            if let Some(g) = self.flows.get_mut(&id) {
                g.weight = g.weight.saturating_sub(u64::from(x.flow));
            }
            self.release_parked(id, now);
        }
        if x.exitall {
            self.stop_jobs(j, x.exit_what, now);
        }
        if self.clones_left[j] == 0 {
            self.start_ready_jobs(now);
        }
    }

    /// fio's `exitall` when a clone of job `j` ends: the jobs of its reporting group, every
    /// job started (`stonewall`) or every job (`all`) issue no more.
    fn stop_jobs(&mut self, j: usize, what: ExitWhat, now: f64) {
        let group = self.jobs[j].group;
        // The targets first: ending them may start the jobs after them, which stay.
        let hit: Vec<bool> = (0..self.jobs.len())
            .map(|k| match what {
                ExitWhat::Group => self.jobs[k].group == group && self.started[k],
                ExitWhat::Stonewall => self.started[k],
                ExitWhat::All => true,
            })
            .collect();
        for sid in 0..self.streams.len() {
            if hit[self.streams[sid].job] {
                self.stop_stream(sid as u32, now);
            }
        }
    }

    /// Clone `sid` issues no more (fio's `td->terminate`): it ends once its I/O in flight
    /// has completed.
    fn stop_stream(&mut self, sid: u32, now: f64) {
        let Some(t) = self.streams.get_mut(sid as usize) else {
            return;
        };
        if t.stopped {
            return;
        }
        t.stopped = true;
        t.done = true;
        t.prelude.clear();
        t.verify_calls.clear();
        // A clone whose requests all wait for a later time (its rate) ends now, as fio's
        // does; those requests are dropped when due ([`Source::still_wanted`]).
        if self.started[t.job] && (t.in_flight == 0 || t.last_at > now) {
            t.in_flight = 0;
            self.clone_may_end(sid, now);
        }
    }

    /// Lets the clones of flow group `id` that waited for their share go on, if it is theirs
    /// now: after their `flow_sleep` steps (fio sleeps, then checks again), with as many
    /// requests as they have free slots.
    fn release_parked(&mut self, id: u32, now: f64) {
        if self.parked == 0 {
            return;
        }
        let Some(g) = self.flows.get(&id) else {
            return;
        };
        for sid in 0..self.streams.len() {
            let s = &mut self.streams[sid];
            let x = &self.jobs[s.job].extra;
            let Some(since) = s.flow_parked else {
                continue;
            };
            if x.flow_id != id || g.exceeded(s.flow_count, x.flow) {
                continue;
            }
            s.flow_parked = None;
            self.parked -= 1;
            let at = if x.flow_sleep_us > 0.0 {
                let step = x.flow_sleep_us / 1000.0;
                since + ((now - since) / step).ceil().max(1.0) * step
            } else {
                now
            };
            let free = self.jobs[s.job]
                .effective_depth()
                .saturating_sub(s.in_flight);
            if free > 0 {
                self.initial.push_back((sid as u32, free, at));
            }
        }
    }

    /// Verify's steps once the writes are issued: wait for the last to complete, then the
    /// `fsync` and cache drop calls one at a time, then the read-back (the clone's replay).
    fn verify_step(&mut self, sid: u32, now: f64) -> Option<Pending> {
        let s = self.streams.get_mut(sid as usize)?;
        if s.in_flight > 0 {
            return None;
        }
        if s.verify == Verify::Pending {
            let files: Vec<(u32, u64)> = streams_files_dedup(&s.files)
                .into_iter()
                .map(|id| (id, self.files[id as usize].lba))
                .collect();
            s.verify_calls = verify_calls(&files);
            s.verify = Verify::Calls(0);
        }
        if let Verify::Calls(i) = s.verify {
            if let Some(req) = s.verify_calls.get(i).cloned() {
                s.verify = Verify::Calls(i + 1);
                return Some(Pending {
                    when: When::Stream {
                        stream: sid,
                        at: now,
                    },
                    req,
                });
            }
            let job = &self.jobs[s.job];
            s.verify = Verify::Reading;
            s.verify_calls = Vec::new();
            s.replay(job.io_bytes.unwrap_or(0));
            let depth = job.effective_depth();
            if depth > 1 {
                self.initial.push_back((sid, depth - 1, now));
            }
            return self.make(sid, now, true);
        }
        None
    }

    /// The job a file belongs to (its first user).
    pub fn job_of_stream(&self, stream: u32) -> Option<usize> {
        self.streams.get(stream as usize).map(|s| s.job)
    }

    /// The next request of a stream at `now` ms (None: the stream is finished).
    fn make(&mut self, sid: u32, now: f64, first: bool) -> Option<Pending> {
        let s = self.streams.get_mut(sid as usize)?;
        if !s.prelude.is_empty() {
            let req = s.prelude.remove(0);
            return Some(Pending {
                when: When::Stream {
                    stream: sid,
                    at: now,
                },
                req,
            });
        }
        if s.done {
            return None;
        }
        if self.jobs[s.job].extra.zonemode == Some(super::extra::ZoneMode::Zbd) {
            // (fio's emulated zones are all empty: a reader finds nothing to read)
            s.done = true;
            return None;
        }
        if matches!(s.verify, Verify::Pending | Verify::Calls(_)) {
            return self.verify_step(sid, now);
        }
        let job = &self.jobs[s.job];
        let total = job.io_bytes.unwrap_or(0);
        let issued_all = !job.time_based && s.issued_bytes >= total.saturating_mul(job.loops);
        if issued_all || job.extra.number_ios.is_some_and(|n| s.ios >= n) {
            // (a read-only job checks what it reads: no read-back)
            let writes = job.rw.read_share(job.rwmixread) == 0.0;
            if issued_all
                && writes
                && s.verify == Verify::Off
                && job.extra.verify
                && job.extra.do_verify
            {
                s.verify = Verify::Pending;
                return self.verify_step(sid, now);
            }
            s.done = true;
            return None;
        }
        if job.extra.flow > 0 {
            let x = &job.extra;
            let g = self.flows.entry(x.flow_id).or_default();
            if g.exceeded(s.flow_count, x.flow) {
                if s.flow_parked.is_none() {
                    s.flow_parked = Some(now);
                    self.parked += 1;
                }
                return None;
            }
            g.issued += 1;
            s.flow_count += 1;
            let id = x.flow_id;
            self.release_parked(id, now);
        }
        let s = &mut self.streams[sid as usize];
        let job = &self.jobs[s.job];
        if total > 0 && s.issued_bytes >= s.pass_end {
            s.start_pass(total, job.invalidate, &self.files);
            if !s.prelude.is_empty() {
                return self.make(sid, now, first);
            }
        }
        let share = job.rw.read_share(job.rwmixread);
        let read = share >= 1.0 || (share > 0.0 && s.rng.random::<f64>() < share);
        // The read-back reads the writes' blocks: their sizes, drawn as they were.
        let slot = usize::from(!read);
        let read = read || s.verify == Verify::Reading;
        s.ios += 1;
        let (lo, hi) = job.bs[slot];
        let split = &job.bssplit[slot];
        let weights: u64 = split.iter().map(|b| u64::from(b.1)).sum();
        let bs = if weights > 0 {
            let mut x = s.rng.random_range(0..weights);
            let mut pick = lo;
            for &(b, w) in split {
                if x < u64::from(w) {
                    pick = b;
                    break;
                }
                x -= u64::from(w);
            }
            pick
        } else if hi > lo {
            // Multiples of the smallest size, as fio picks within bsrange.
            lo * s.rng.random_range(1..=hi / lo)
        } else {
            lo
        };
        let region = s.region.max(bs);
        let (fi, offset) = if let Some(z) = job.extra.strided(job.nrfiles) {
            s.strided_offset(job, z, share, region, bs, &mut self.map_budget)
        } else if job.rw.random() {
            s.random_offset(job, share, region, bs, &mut self.map_budget)
        } else {
            s.sequential_offset(region, bs, job.rw_mod)
        };
        // The last request of a size-bound pass is cut to what is left (fio does the same).
        let bs = if job.time_based {
            bs
        } else {
            bs.min(s.pass_end.saturating_sub(s.issued_bytes))
                .max(SECTOR.min(bs))
        };
        let fid = s.files[fi];
        // (the region starts at the job's `offset` in each file)
        let offset = offset + job.offset;
        s.issued_bytes += bs;
        // When: after the think time, and no earlier than the rate allows.
        let null = matches!(job.ioengine, IoEngine::Null | IoEngine::Cpuio);
        let gap = match job.ioengine {
            IoEngine::Null => self.gap.max(NULL_IO_MS),
            IoEngine::Cpuio => job.extra.cpuio_cycle_ms(),
            _ => self.gap,
        };
        let at = s.issue_at(job, now, first, gap, slot, bs)?;
        let f = &self.files[fid as usize];
        if job.ioengine == IoEngine::Cpuio {
            // A burn cycle: no I/O, not counted as one (fio's cpuio is FIO_NOIO).
            let mut req = Request::block(0, 0, Op::Flush);
            req.flags = Flags::default().with(Flags::NO_IO);
            return Some(Pending {
                when: When::Stream { stream: sid, at },
                req,
            });
        }
        Some(Pending {
            when: When::Stream { stream: sid, at },
            req: Request {
                id: 0,
                arrival: 0.0,
                dev: 0,
                lba: f.lba + offset / SECTOR,
                sectors: (bs.div_ceil(SECTOR)) as u32,
                op: if read { Op::Read } else { Op::Write },
                flags: if null {
                    job.flags(read).with(Flags::NO_IO)
                } else {
                    job.flags(read)
                },
                file: Some(FileRef { file: fid, offset }),
                prio: job.extra.prio.pick(usize::from(!read), bs, &mut s.prio_rng),
            },
        })
    }
}

impl Stream {
    /// A clone of job `job` over `files`, at its start.
    fn new(job: usize, files: Vec<u32>, region: u64, seed: u64, pass_end: u64) -> Stream {
        Stream {
            job,
            files,
            region,
            rng: ChaCha8Rng::seed_from_u64(seed),
            prio_rng: ChaCha8Rng::seed_from_u64(seed ^ 0x7072_696f),
            pos: 0,
            file_i: 0,
            perm: Vec::new(),
            perm_i: 0,
            no_map: false,
            issued_bytes: 0,
            rate_bytes: [0, 0],
            done: false,
            prelude: Vec::new(),
            prelude_pending: 0,
            pass_end,
            start: 0.0,
            in_flight: 0,
            run_left: 0,
            seed,
            ios: 0,
            map_charged: false,
            sampler: None,
            poisson_due: [0.0; 2],
            flow_count: 0,
            flow_parked: None,
            verify: Verify::Off,
            verify_calls: Vec::new(),
            stopped: false,
            last_at: 0.0,
            zone_start: 0,
            zone_bytes: 0,
            lat: None,
            quiesce: None,
        }
    }

    /// When the clone's next request (direction `slot`, `bs` bytes) issues, `gap` ms after a
    /// completion at `now` (at once if `first`): after the think time, and no earlier than
    /// the rate allows; None when that is past the runtime (the clone is done).
    fn issue_at(
        &mut self,
        job: &FioJob,
        now: f64,
        first: bool,
        gap: f64,
        slot: usize,
        bs: u64,
    ) -> Option<f64> {
        let mut at = if first {
            now
        } else {
            now + gap + job.thinktime_us / 1000.0
        };
        if let (Some(iops), true) = (job.rate_iops[slot], job.extra.poisson) {
            // fio's rate_process=poisson: exponential gaps from the clone's start.
            let base = self.poisson_due[slot].max(self.start);
            let due = base + super::extra::poisson_gap_ms(&mut self.rng, iops);
            self.poisson_due[slot] = due;
            at = at.max(due);
        } else if let Some(iops) = job.rate_iops[slot] {
            // One I/O every 1/iops s from the clone's start (bytes counted as I/Os here).
            let due = self.start + self.rate_bytes[slot] as f64 / iops as f64 * 1000.0;
            at = at.max(due);
            self.rate_bytes[slot] += 1;
        } else if let Some(rate) = job.rate[slot] {
            let due = self.start + self.rate_bytes[slot] as f64 / rate as f64 * 1000.0;
            at = at.max(due);
            self.rate_bytes[slot] += bs;
        }
        match job.runtime_ms {
            // fio's cpuio checks the runtime after each cycle's sleep: the last cycle's end
            // is the job's (a no-I/O marker at the runtime's end).
            Some(rt) if job.ioengine == IoEngine::Cpuio => {
                if now - self.start >= rt {
                    self.done = true;
                    return None;
                }
                at = at.min(self.start + rt);
            }
            Some(rt) if at - self.start >= rt => {
                self.done = true;
                return None;
            }
            _ => {}
        }
        Some(at)
    }

    /// Back to the clone's first request, with the same generator: fio's verify reads the
    /// blocks in the order they were written (its verify list, with a random map).
    fn replay(&mut self, total: u64) {
        self.rng = ChaCha8Rng::seed_from_u64(self.seed);
        self.pos = 0;
        self.file_i = 0;
        self.perm.clear();
        self.perm_i = 0;
        self.issued_bytes = 0;
        self.pass_end = total;
        self.run_left = 0;
        self.ios = 0;
        self.rate_bytes = [0, 0];
        self.poisson_due = [0.0; 2];
    }

    /// A time_based job goes over its `io_size` again and again; each pass starts from the
    /// first block with a new random map and, with `invalidate`, drops the files' cached
    /// pages first (fio 3.33, checked: a 32 MiB file read for 1 s with invalidate=1 came
    /// from the device on every pass, 1,409 MiB of pgpgin for 1,382 MiB read; with
    /// invalidate=0 it was read once). The drops are issued in the I/O's place: each
    /// completion frees its slot, unlike the first pass's prelude.
    fn start_pass(&mut self, total: u64, invalidate: bool, files: &[SimFile]) {
        self.pass_end = self.issued_bytes + total;
        self.pos = 0;
        self.file_i = 0;
        self.perm_i = self.perm.len();
        if invalidate {
            self.prelude = streams_files_dedup(&self.files)
                .into_iter()
                .map(|id| advise_request(&files[id as usize], id, Advice::DontNeed))
                .collect();
        }
    }

    /// The next sequential (file index, offset) of a `bs`-byte request; `rw=read:N` adds N
    /// bytes (maybe negative) to each offset after the first, wrapping to the region's start
    /// (holes) or to its last block (backwards) as fio's `get_next_seq_offset`.
    fn sequential_offset(&mut self, region: u64, bs: u64, m: RwModifier) -> (usize, u64) {
        if let RwModifier::Hole(add) = m {
            if self.pos > 0 && add != 0 {
                let p = self.pos as i128 + i128::from(add);
                self.pos = if p >= 0 && p as u64 + bs <= region {
                    p as u64
                } else if add > 0 {
                    0
                } else {
                    region - bs
                };
            }
            let offset = self.pos;
            self.pos += bs;
            return (self.file_i, offset);
        }
        if self.pos + bs > region {
            self.pos = 0;
            self.file_i = (self.file_i + 1) % self.files.len();
        }
        let offset = self.pos;
        self.pos += bs;
        (self.file_i, offset)
    }

    /// The (file index, offset) of a `bs`-byte request in fio's strided zones
    /// (`setup_strided_zone_mode`): the next zone once `size` bytes were done in this one
    /// (back to the start past the region's end), sequential offsets wrapping within the
    /// zone's `range`, random ones drawn within it with a new random map every `range` bytes.
    fn strided_offset(
        &mut self,
        job: &FioJob,
        z: super::extra::Strided,
        share: f64,
        region: u64,
        bs: u64,
        map_budget: &mut u64,
    ) -> (usize, u64) {
        if self.zone_bytes >= z.size {
            self.zone_bytes = 0;
            self.zone_start = self
                .zone_start
                .saturating_add(z.range.saturating_add(z.skip));
            if self.zone_start >= region.saturating_sub(bs.min(region)).saturating_add(1) {
                self.zone_start = 0;
            }
            self.pos = self.zone_start;
        }
        let zone = z.range.min(region - self.zone_start).max(bs);
        if self.zone_bytes % z.range == 0 {
            // fio's fio_file_reset: a new random map.
            self.perm_i = self.perm.len();
        }
        self.zone_bytes = self.zone_bytes.saturating_add(bs);
        if job.rw.random() {
            let (fi, o) = self.random_start(job, share, zone, bs, map_budget);
            return (fi, self.zone_start + o);
        }
        if self.pos >= self.zone_start + z.range || self.pos + bs > region {
            self.pos = self.zone_start;
        }
        let offset = self.pos;
        self.pos += bs;
        (0, offset)
    }

    /// A random (file index, offset) of a `bs`-byte request, `share` of the job's requests
    /// being reads: from the stream's random map, when it has one (its room taken from the
    /// run's `map_budget` on the first pass), else drawn with replacement.
    fn random_offset(
        &mut self,
        job: &FioJob,
        share: f64,
        region: u64,
        bs: u64,
        map_budget: &mut u64,
    ) -> (usize, u64) {
        if self.run_left > 0 && self.pos + bs <= region {
            // `rw=randread:N`: the run from the last random offset goes on.
            self.run_left -= 1;
            let offset = self.pos;
            self.pos += bs;
            return (self.file_i, offset);
        }
        let (fi, offset) = self.random_start(job, share, region, bs, map_budget);
        if let RwModifier::RandomRun(n) = job.rw_mod {
            self.run_left = n - 1;
            (self.file_i, self.pos) = (fi, offset + bs);
        }
        (fi, offset)
    }

    fn random_start(
        &mut self,
        job: &FioJob,
        share: f64,
        region: u64,
        bs: u64,
        map_budget: &mut u64,
    ) -> (usize, u64) {
        let fi = self.rng.random_range(0..self.files.len());
        // Offsets in units of the job's smallest block (fio's random map is on the minimum
        // block size): with one size per direction, or a range, a unit of this request's
        // size gave a map that the next request's larger size overran past the file's end
        // (found by the fuzzer: `bs=,3k`, reads of 4 KiB at 3 KiB blocks).
        let unit = job
            .extra
            .blockalign
            .unwrap_or(match share {
                x if x >= 1.0 => job.bs[0].0,
                x if x <= 0.0 => job.bs[1].0,
                _ => job.bs[0].0.min(job.bs[1].0),
            })
            .max(1);
        let blocks = (region / unit).max(1);
        let dist = &job.extra.distribution;
        if *dist != super::extra::Distribution::Random {
            // (with norandommap, checked by the reader: drawn with replacement)
            let d = super::extra::with_unit(dist, unit);
            if self.sampler.as_ref().is_none_or(|s| s.blocks() != blocks) {
                self.sampler = Some(Sampler::new(&d, blocks));
            }
            let drawn = self
                .sampler
                .as_ref()
                .map_or(0, |sm| sm.next(&d, &mut self.rng));
            return (fi, (drawn * unit).min((region - bs) / unit * unit));
        }
        let mut mapped =
            !(job.norandommap || blocks > MAX_RANDOM_MAP || self.files.len() > 1 || self.no_map);
        if mapped && self.perm.is_empty() && !self.map_charged {
            // The stream's first pass: its map's room comes out of the run's budget.
            if blocks > *map_budget {
                (self.no_map, mapped) = (true, false);
            } else {
                *map_budget -= blocks;
                self.map_charged = true;
            }
        }
        let drawn = if !mapped {
            self.rng.random_range(0..blocks)
        } else {
            if self.perm_i >= self.perm.len() {
                self.perm = (0..blocks as u32).collect();
                // Fisher-Yates with the stream's generator.
                for i in (1..self.perm.len()).rev() {
                    let j = self.rng.random_range(0..=i);
                    self.perm.swap(i, j);
                }
                self.perm_i = 0;
            }
            self.perm_i += 1;
            u64::from(self.perm[self.perm_i - 1])
        };
        // A block too near the end for this size moves back to the last that fits.
        (fi, (drawn * unit).min((region - bs) / unit * unit))
    }
}

impl FioSource {
    /// The job of each stream (clone), indexed by stream number.
    pub fn job_of_streams(&self) -> Vec<usize> {
        self.streams.iter().map(|s| s.job).collect()
    }

    /// The jobs' files as (file id, bytes), for the page cache's end-of-file read-ahead
    /// limit ([`crate::host::HostStack::files`]).
    pub fn file_sizes(&self) -> Vec<(u32, u64)> {
        self.files
            .iter()
            .enumerate()
            .map(|(i, f)| (i as u32, f.bytes))
            .collect()
    }
}

impl Source for FioSource {
    fn next(&mut self) -> Result<Option<Pending>> {
        // The first `depth` requests of every started clone, at its start.
        while let Some(&(sid, left, at)) = self.initial.front() {
            if left == 0 {
                self.initial.pop_front();
                continue;
            }
            self.initial[0].1 -= 1;
            if let Some(p) = self.make(sid, at, true) {
                let s = &mut self.streams[sid as usize];
                s.in_flight += 1;
                s.last_at = stream_at(&p);
                return Ok(Some(p));
            }
            self.initial.pop_front();
            self.clone_may_end(sid, at);
        }
        Ok(None)
    }
    fn next_in_stream(&mut self, stream: u32, now: f64) -> Result<Option<Pending>> {
        let Some(s) = self.streams.get_mut(stream as usize) else {
            return Ok(None);
        };
        s.in_flight = s.in_flight.saturating_sub(1);
        // A completed prelude call (fadvise) frees no I/O slot. The prelude is issued first
        // and completes at once, so its completions come before any I/O's.
        if s.prelude_pending > 0 {
            s.prelude_pending -= 1;
            return Ok(None);
        }
        if !self.lat_may_issue(stream, now) {
            return Ok(None);
        }
        match self.make(stream, now, false) {
            Some(p) => {
                let s = &mut self.streams[stream as usize];
                s.in_flight += 1;
                s.last_at = stream_at(&p);
                Ok(Some(p))
            }
            None => {
                self.clone_may_end(stream, now);
                Ok(None)
            }
        }
    }
    fn stream_completed(&mut self, stream: u32, done: &crate::request::Completion, now: f64) {
        let data = matches!(done.req.op, Op::Read | Op::Write);
        self.steady_completed(stream, data.then(|| done.req.bytes()), now);
        if data {
            self.lat_completed(stream, done.response(), now);
        }
    }
    fn still_wanted(&mut self, stream: u32, now: f64) -> bool {
        let Some(s) = self.streams.get_mut(stream as usize) else {
            return true;
        };
        if !s.stopped {
            return true;
        }
        if s.in_flight != u64::MAX {
            s.in_flight = s.in_flight.saturating_sub(1);
            self.clone_may_end(stream, now);
        }
        false
    }
    fn len_hint(&self) -> Option<u64> {
        let mut n = 0u64;
        for s in &self.streams {
            let j = &self.jobs[s.job];
            if j.time_based {
                return None;
            }
            let bs = j.bs[0].0.min(j.bs[1].0).max(1);
            n = n.saturating_add(j.io_bytes.unwrap_or(0).saturating_mul(j.loops) / bs);
        }
        Some(n)
    }
}

/// The size of a job whose size comes from the layout: `fill_device` takes the device's
/// `free` sectors (split among its clones and files, whole blocks, as fio writes until
/// ENOSPC); a job on an earlier job's file takes that file's size.
fn size_at_layout(
    job: &mut FioJob,
    files: &[SimFile],
    by_name: &HashMap<String, u32>,
    free: u64,
) -> Result<()> {
    let bs = job.bs[0].1.max(job.bs[1].1).max(1);
    let bytes = if job.extra.size_of_earlier_file {
        let name = job.filename.as_deref().unwrap_or("");
        by_name
            .get(name)
            .map(|&id| files[id as usize].bytes.saturating_sub(job.offset))
    } else if job.extra.fill_device && job.size.is_none() && job.filesize.is_none() {
        // (1 MiB per file of layout slack: files start on 1 MiB boundaries)
        let per = (free * SECTOR / job.numjobs.max(1))
            .saturating_sub(1 << 20)
            .saturating_sub(job.offset);
        Some(per / bs * bs * job.nrfiles)
    } else {
        return Ok(());
    };
    match bytes.filter(|&b| b >= bs) {
        Some(b) => {
            job.size = Some(b);
            job.io_bytes.get_or_insert(b);
            Ok(())
        }
        None => bail!(
            "line {}: job '{}': no room for a block of its file on the device",
            job.line,
            job.name
        ),
    }
}

fn stream_at(p: &Pending) -> f64 {
    match p.when {
        When::Stream { at, .. } | When::At(at) => at,
        When::AfterCompletion { .. } => 0.0,
    }
}

/// fio's `filename_format` keywords: `$jobname`, `$jobnum` (the clone), `$filenum`,
/// `$clientuid`.
fn expand_filename(fmt: &str, job: &str, clone: u64, file: u64) -> String {
    // ($clientuid: the client's address in fio's client/server mode, empty otherwise)
    fmt.replace("$clientuid", "")
        .replace("$jobname", job)
        .replace("$jobnum", &clone.to_string())
        .replace("$filenum", &file.to_string())
}

/// What each job waits for before it starts: a `stonewall` job and every job after it
/// (fio's `run_threads` stops starting jobs at a stonewall while others run), all jobs of
/// the groups before; a `wait_for` job, the named earlier job.
fn waits_on(jobs: &[FioJob]) -> Vec<Vec<usize>> {
    let mut group_start = 0;
    let mut out = Vec::with_capacity(jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        if j.stonewall {
            group_start = i;
        }
        let mut w: Vec<usize> = (0..group_start).collect();
        if let Some(name) = &j.wait_for {
            w.extend(jobs[..i].iter().position(|e| &e.name == name));
        }
        out.push(w);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{ConstantDevice, Simulator};
    use crate::fio::{parse, JobStats};

    /// Runs a job on a constant-time device (no host stack): fio's fadvise calls are turned
    /// off, they would take the device's service time here.
    fn run(text: &str, service_ms: f64) -> Vec<crate::request::Completion> {
        let text = format!("[global]\ninvalidate=0\nfadvise_hint=0\n{text}");
        let jf = parse(&text, false).unwrap();
        let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
        let mut sim = Simulator::new(vec![Box::new(ConstantDevice::new(service_ms))]);
        let mut out = Vec::new();
        sim.run(&mut src, &mut |c| out.push(c.clone())).unwrap();
        out
    }

    /// A time_based job's passes: with invalidate=1 fio drops the file's cached pages at
    /// each pass and reads it from the device again; with invalidate=0 the first pass's
    /// pages serve the others.
    #[test]
    fn time_based_passes_drop_the_cache_with_invalidate() {
        let mut misses = Vec::new();
        for inv in [1, 0] {
            let jf = parse(
                &format!(
                    "[j]\nrw=read\nsize=256k\nbs=64k\nioengine=psync\nruntime=20ms\ntime_based\ninvalidate={inv}\n"
                ),
                false,
            )
            .unwrap();
            let host = crate::host::HostParams::linux_defaults();
            let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
            let dev = Box::new(ConstantDevice::new(0.1));
            let sizes = src.file_sizes();
            let chain = host.stack().files(&sizes).on(dev).unwrap();
            let mut stats = JobStats::new(&src);
            let mut sim = Simulator::new(chain);
            sim.run_streams(&mut src, &mut |c, s| stats.add(c, s))
                .unwrap();
            let read = &stats.results()[0].read;
            let passes = read.ios / 4;
            assert!(passes >= 5, "{} reads", read.ios);
            // Pages read from the device: asked for, or read ahead.
            let missed: u64 = sim
                .components()
                .iter()
                .flat_map(|c| c.stats())
                .filter(|(k, _)| k == "pagecache miss pages" || k == "pagecache readahead pages")
                .map(|(_, v)| v as u64)
                .sum();
            misses.push((missed, passes));
        }
        // 64 pages a pass: every pass read from the device, then only the first.
        let [(m1, p1), (m0, _)] = misses[..] else {
            unreachable!()
        };
        assert!(
            m1 >= 64 * (p1 - 1),
            "invalidate=1: {m1} pages missed in {p1} passes"
        );
        assert_eq!(m0, 64, "invalidate=0");
    }

    #[test]
    fn invalidate_and_fadvise_hint_are_advise_calls_before_the_first_io() {
        let jf = parse(
            "[j]\nrw=randread\nsize=64k\nioengine=libaio\ndirect=1\niodepth=2\n",
            false,
        )
        .unwrap();
        let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
        let ops: Vec<Op> = (0..4)
            .map(|_| src.next().unwrap().unwrap().req.op)
            .collect();
        assert_eq!(
            ops,
            [
                Op::Advise(Advice::DontNeed),
                Op::Advise(Advice::Random),
                Op::Read,
                Op::Read
            ]
        );
        assert!(
            src.next().unwrap().is_none(),
            "two advise calls and iodepth 2 reads"
        );
        // The advise calls' completions free no slot; the reads' do.
        assert!(src.next_in_stream(0, 0.0).unwrap().is_none());
        assert!(src.next_in_stream(0, 0.0).unwrap().is_none());
        assert_eq!(
            src.next_in_stream(0, 1.0).unwrap().unwrap().req.op,
            Op::Read
        );
        // Through the host stack: the job completes, every read counted once.
        let host = crate::host::HostParams::linux_defaults();
        let chain = host.stack().on(Box::new(ConstantDevice::new(0.1))).unwrap();
        let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
        let mut stats = JobStats::new(&src);
        Simulator::new(chain)
            .run_streams(&mut src, &mut |c, s| stats.add(c, s))
            .unwrap();
        assert_eq!(stats.results()[0].read.ios, 16);
    }

    #[test]
    fn sequential_job_reads_its_file_once_in_order() {
        let out = run("[j]\nrw=read\nsize=64k\nbs=4k\n", 1.0);
        assert_eq!(out.len(), 16);
        for (i, c) in out.iter().enumerate() {
            assert_eq!(c.req.file.unwrap().offset, i as u64 * 4096);
            assert_eq!(c.req.lba, i as u64 * 8);
            // QD1 closed loop on a 1 ms device: back to back.
            assert_eq!(c.rec.completion, (i + 1) as f64);
        }
    }

    /// fio 3.33 with offset=1m size=4m bs=64k on a new file: a 5 MiB file, 64 writes from
    /// 1 MiB on (`--debug=io`: the first at off=0x100000).
    #[test]
    fn offset_starts_the_region_and_grows_the_file() {
        let text = "[j]\nrw=write\noffset=1m\nsize=4m\nbs=64k\n";
        let jf = parse(text, false).unwrap();
        let src = FioSource::new(&jf, 0, 1 << 30).unwrap();
        assert_eq!(src.files[0].bytes, 5 << 20);
        let out = run(text, 1.0);
        let offsets: Vec<u64> = out.iter().map(|c| c.req.file.unwrap().offset).collect();
        assert_eq!(
            offsets,
            (0..64).map(|i| (1 << 20) + i * 65536).collect::<Vec<_>>()
        );
        assert_eq!(out[0].req.lba, (1 << 20) / SECTOR);
        // On a whole device the region runs from the offset to the end.
        let jf = parse("[d]\nfilename=/dev/sdx\nrw=read\noffset=1g\n", false).unwrap();
        let src = FioSource::new(&jf, 0, 4 << 21).unwrap();
        assert_eq!(src.jobs[0].size, Some(3 << 30));
        let jf = parse("[d]\nfilename=/dev/sdx\nrw=read\noffset=4g\n", false).unwrap();
        let e = FioSource::new(&jf, 0, 4 << 21).err().unwrap().to_string();
        assert!(
            e.contains("line 1") && e.contains("past the device's end"),
            "{e}"
        );
    }

    /// zonemode=zbd on the simulated (not zoned) device: fio's emulated zones are empty, a
    /// reader reads nothing (fio 3.33 on a file here: 0 I/O, no error); a writer, or a
    /// reader of a file another job writes, is refused naming the line.
    #[test]
    fn zbd_readers_of_empty_emulated_zones_read_nothing() {
        let zbd = "zonemode=zbd\nzonesize=256m\nsize=1g\nbs=256k\n";
        assert!(run(&format!("[r]\nrw=read\n{zbd}"), 1.0).is_empty());
        for (text, line) in [
            (format!("[w]\nrw=randwrite\n{zbd}"), "line 3"),
            (format!("[r]\nrw=read\nread_beyond_wp=1\n{zbd}"), "line 4"),
            (
                "[r]\nrw=read\nzonemode=zbd\nsize=1m\n".to_string(),
                "line 3",
            ),
            (
                format!("[w]\nfilename=f\nrw=write\nsize=1g\n[r]\nfilename=f\nrw=read\n{zbd}"),
                "line 8",
            ),
        ] {
            let e = parse(&text, false).err().unwrap().to_string();
            assert!(e.contains(line), "{text}: {e}");
        }
    }

    /// The latency search on a device serving one request at a time in 1 ms, 10 ms
    /// windows: with a 10 ms target libaio at iodepth 4 doubles 1, 2, 4, finds 4 again at
    /// 30 ms, waits for its I/O in flight (to 33 ms), runs one final window (to 43 ms) and
    /// completes the 3 I/Os still in flight: the end at 46 ms. psync keeps one
    /// I/O in flight but searches to fio's iodepth all the same: 1, 2, 4, 4 and the final
    /// window, 40 ms. With a 2 ms target, depth 4 queues I/Os for 3-4 ms: the first over
    /// lowers the depth to 3, and each one over during the wait for the I/O in flight lowers
    /// it again (fio's io_u_quiesce reaps them through the same check) down to 1, where the
    /// last ends the job ("max latency exceeded"), at 26 ms.
    #[test]
    fn latency_target_depths_through_the_source() {
        let job = |engine: &str, target: &str| {
            format!("[a]\nioengine={engine}\niodepth=4\nlatency_target={target}\nlatency_window=10ms\nsize=64m\nrw=randread\ndirect=1\n")
        };
        let end = |out: &[crate::request::Completion]| {
            out.iter().map(|c| c.rec.completion).fold(0.0, f64::max)
        };
        let out = run(&job("libaio", "10ms"), 1.0);
        let depth_at = |t: f64| {
            out.iter()
                .filter(|c| c.rec.arrival <= t && c.rec.completion > t)
                .count()
        };
        assert_eq!([5.5, 15.5, 25.5, 38.5].map(depth_at), [1, 2, 4, 4]);
        assert_eq!(end(&out), 46.0);
        let out = run(&job("psync", "10ms"), 1.0);
        assert_eq!(end(&out), 40.0);
        let out = run(&job("libaio", "2ms"), 1.0);
        assert_eq!((out.len(), end(&out)), (26, 26.0));
        let jf = parse("[a]\nlatency_target=1\nsize=1m\nnumjobs=2\n", false);
        assert!(jf.err().unwrap().to_string().contains("line 2"));
    }

    /// Steady state per clone without group_reporting: two clones at 100 and 1,000 I/Os a
    /// second stop each at their own third sample (5 s), a clone started later at its own;
    /// with group_reporting the group is one unit checked at its last clone.
    #[test]
    fn steady_state_by_clone_or_by_group() {
        let ss = "ss=iops:5%\nss_dur=3\nss_ramp=1\nruntime=60\ntime_based\nsize=1m\nbs=4k\nrw=randread\nioengine=null\n";
        let text = format!("[a]\nrate_iops=100\n{ss}[b]\nrate_iops=1000\n{ss}[c]\nrate_iops=1000\nstartdelay=1500ms\n{ss}");
        // When each job's last I/O completed.
        let last_completions = |text: &str| {
            let jf = parse(text, false).unwrap();
            let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
            let mut sim = Simulator::new(vec![Box::new(ConstantDevice::new(0.001))]);
            let mut last = [0.0f64; 3];
            sim.run_streams(&mut src, &mut |c, s| {
                let j = s.unwrap() as usize;
                last[j] = last[j].max(c.rec.completion);
            })
            .unwrap();
            last
        };
        let last = last_completions(&text);
        // (ticks at whole seconds: c starts at 1.5 s, its ramp over at 4 s > 1.5 + 2)
        assert!((last[0] - 5000.0).abs() < 11.0, "{last:?}");
        assert!((last[1] - 5000.0).abs() < 2.0, "{last:?}");
        assert!((last[2] - 6000.0).abs() < 2.0, "{last:?}");
        let grouped = format!("[global]\ngroup_reporting\n{text}");
        let last = last_completions(&grouped);
        // One group: its samples sum a, b and (from 4 s) c: 1,100 at 3 s, 2,100 at 4 s and
        // after, steady (within 5 %) on 4, 5, 6 s.
        for t in last {
            assert!((t - 6000.0).abs() < 11.0, "{last:?}");
        }
    }

    #[test]
    fn random_map_covers_every_block_once() {
        let out = run("[j]\nrw=randread\nsize=256k\nbs=4k\n", 0.1);
        let mut offs: Vec<u64> = out.iter().map(|c| c.req.file.unwrap().offset).collect();
        assert_ne!(
            offs,
            (0..64).map(|i| i * 4096).collect::<Vec<_>>(),
            "random order"
        );
        offs.sort();
        assert_eq!(offs, (0..64).map(|i| i * 4096).collect::<Vec<_>>());
    }

    /// Random maps are bounded for the whole run: many clones over a file of tiny blocks
    /// build maps until the budget is spent, the rest draw with replacement (the fuzzer's
    /// job: 160 clones of 2 M blocks each took 9 s to lay out). A region over the per-stream
    /// bound never gets a map.
    #[test]
    fn random_maps_are_bounded_for_the_whole_run() {
        let jf = parse("[j]\nrw=randread\nsize=32m\nbs=2\nnumjobs=40\n", false).unwrap();
        let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
        let blocks = (32u64 << 20) / 2;
        assert!(blocks > MAX_RANDOM_MAP, "over the per-stream bound");
        // A few requests each (the first may be fio's invalidate, an fadvise).
        let pull = |src: &mut FioSource| {
            for sid in 0..src.streams.len() as u32 {
                for _ in 0..3 {
                    let _ = src.make(sid, 0.0, true);
                }
            }
        };
        pull(&mut src);
        assert!(src.streams.iter().all(|s| s.perm.is_empty()));
        let jf = parse("[j]\nrw=randread\nsize=2m\nbs=2\nnumjobs=40\n", false).unwrap();
        let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
        pull(&mut src);
        let mapped: u64 = src.streams.iter().map(|s| s.perm.len() as u64).sum();
        let with_map = src.streams.iter().filter(|s| !s.perm.is_empty()).count();
        assert_eq!(mapped, 16 << 20, "the budget, 1 M blocks per stream");
        assert_eq!(with_map, 16);
        assert!(mapped <= MAX_RANDOM_MAPS);
        assert_eq!(src.streams.iter().filter(|s| s.no_map).count(), 24);
    }

    /// Reads and writes of different sizes (`bs=4k,3k`) or a size range share one random map
    /// in units of the smallest size, and every request lies within its file: the map was
    /// built in units of the first request's size, and larger requests drawn from it went
    /// past the file's end (the fuzzer's `bs=,3k`: 4 KiB reads at 3 KiB blocks, up to
    /// 1.36 MiB into a 1 MiB file).
    #[test]
    fn random_requests_of_mixed_sizes_stay_within_the_file() {
        for text in [
            "[j]\nrw=randrw\nsize=1m\nbs=4k,3k\n",
            "[j]\nrw=randrw\nsize=1m\nbs=,3k\n",
            "[j]\nrw=randread\nsize=1m\nbsrange=4k-16k\n",
        ] {
            let out = run(text, 0.1);
            assert!(!out.is_empty(), "{text}");
            for c in &out {
                let f = c.req.file.unwrap();
                assert!(
                    f.offset + c.req.bytes() <= 1 << 20,
                    "{text}: {} bytes at {}",
                    c.req.bytes(),
                    f.offset
                );
            }
        }
    }

    #[test]
    fn numjobs_and_iodepth_are_independent_closed_loops() {
        // Two clones, each with 4 in flight, on a device serving one at a time in 1 ms:
        // 8 requests queued at once, each clone's next issued when its own request completes.
        let text = "[j]\nrw=randread\nsize=64k\nbs=4k\nioengine=io_uring\niodepth=4\nnumjobs=2\n";
        let out = run(text, 1.0);
        assert_eq!(out.len(), 32);
        let files: std::collections::BTreeSet<u32> =
            out.iter().map(|c| c.req.file.unwrap().file).collect();
        assert_eq!(files.len(), 2, "one file per clone");
        // The device is never idle: completions at 1, 2, ..., 32 ms.
        for (i, c) in out.iter().enumerate() {
            assert_eq!(c.rec.completion, (i + 1) as f64);
        }
        // Never more than 8 in flight: each arrival is at or after the completion 8 earlier.
        let mut arrivals: Vec<f64> = out.iter().map(|c| c.rec.arrival).collect();
        arrivals.sort_by(f64::total_cmp);
        for (i, a) in arrivals.iter().enumerate().skip(8) {
            assert!(*a >= (i - 7) as f64, "{i}: {a}");
        }
    }

    #[test]
    fn time_based_runtime_rate_and_thinktime() {
        // 4 KiB every 1 ms device, rate 1 MiB/s → one request per ~3.9 ms, for 100 ms.
        let out = run(
            "[j]\nrw=read\nsize=64k\nbs=4k\nruntime=100ms\ntime_based\nrate=1m\n",
            1.0,
        );
        let bytes: u64 = out.iter().map(|c| c.req.bytes()).sum();
        let rate = bytes as f64 / 0.1;
        assert!((rate - 1048576.0).abs() / 1048576.0 < 0.05, "{rate} B/s");
        assert!(out.iter().all(|c| c.rec.arrival < 100.0));
        // Thinktime 2000 µs after each 1 ms completion: one request per 3 ms.
        let out = run("[j]\nrw=read\nsize=64k\nbs=4k\nthinktime=2000\n", 1.0);
        assert_eq!(out.len(), 16);
        assert!(
            (out[15].rec.arrival - 15.0 * 3.0).abs() < 1e-9,
            "{}",
            out[15].rec.arrival
        );
    }

    /// Runs a job file on a constant-time device and returns each job's results.
    fn results(text: &str) -> Vec<crate::fio::JobResult> {
        let text = format!("[global]\ninvalidate=0\nfadvise_hint=0\n{text}");
        let jf = parse(&text, false).unwrap();
        let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
        let mut stats = JobStats::new(&src);
        let mut sim = Simulator::new(vec![Box::new(ConstantDevice::new(0.1))]);
        sim.run_streams(&mut src, &mut |c, s| stats.add(c, s))
            .unwrap();
        stats.results()
    }

    /// A reader and a writer on one file: each job's I/O is its own (all of it went to
    /// the last job using the file: `reader` had none).
    #[test]
    fn jobs_sharing_a_file_keep_their_own_io() {
        let r = results(
            "[reader]\nfilename=shared\nsize=64k\nrw=read\n[writer]\nfilename=shared\nsize=64k\nrw=write\n",
        );
        assert_eq!((r[0].read.ios, r[0].write.ios), (16, 0), "reader");
        assert_eq!((r[1].read.ios, r[1].write.ios), (0, 16), "writer");
    }

    /// `stonewall` and `wait_for` start a job when the ones it waits for end; without them
    /// jobs run side by side. Each job's bandwidth counts from its own start.
    #[test]
    fn stonewall_and_wait_for_serialise_jobs() {
        let spans = |text: &str| -> Vec<(f64, f64)> {
            let text = format!("[global]\ninvalidate=0\nfadvise_hint=0\n{text}");
            let jf = parse(&text, false).unwrap();
            let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
            let jobs = src.job_of_streams();
            let mut span = vec![(f64::MAX, 0.0f64); jf.jobs.len()];
            let mut sim = Simulator::new(vec![Box::new(ConstantDevice::new(1.0))]);
            sim.run_streams(&mut src, &mut |c, st| {
                let j = jobs[st.unwrap() as usize];
                span[j].0 = span[j].0.min(c.rec.arrival);
                span[j].1 = span[j].1.max(c.rec.completion);
            })
            .unwrap();
            span
        };
        let two = "[a]\nsize=16k\nrw=read\n[b]\nsize=16k\nrw=read\n";
        let side = spans(two);
        assert_eq!(side[1].0, 0.0, "no stonewall: b starts at once");
        let wall = spans(&two.replace("[b]\n", "[b]\nstonewall\n"));
        assert_eq!(wall[0], (0.0, 4.0));
        assert_eq!(wall[1], (4.0, 8.0), "b after a");
        // A job after the stonewall runs with it, both after the first.
        let three = spans("[a]\nsize=16k\n[b]\nstonewall\nsize=16k\n[c]\nsize=16k\n");
        assert_eq!((three[1].0, three[2].0), (4.0, 4.0));
        // wait_for: c waits for a only (2 clones), b runs at once; startdelay adds to it.
        let w = spans(
            "[a]\nsize=16k\nnumjobs=2\n[b]\nsize=32k\n[c]\nwait_for=a\nstartdelay=5ms\nsize=16k\n",
        );
        assert_eq!(w[1].0, 0.0);
        assert!(w[2].0 >= w[0].1 + 5.0 && w[0].1 > 0.0, "{w:?}");
        let r = results("[a]\nsize=16k\n[b]\nstonewall\nsize=16k\n");
        assert!(
            (r[0].read.mb_s - r[1].read.mb_s).abs() < 1e-9,
            "b's rate from its start"
        );
        let e = parse("[a]\nsize=1m\nwait_for=z\n", false).unwrap_err();
        assert!(e.to_string().contains("wait_for=z"), "{e}");
    }

    /// `rw=read:-8k` at bs=4k reads backwards (fio: the first block, then from the end down);
    /// `rw=write:4k` leaves a 4 KiB hole after each write; `rw=randread:4` reads 4 blocks in
    /// a row from each random offset.
    #[test]
    fn offset_modifiers_of_rw() {
        let offs = |text: &str| -> Vec<u64> {
            run(text, 0.1)
                .iter()
                .map(|c| c.req.file.unwrap().offset / 4096)
                .collect()
        };
        assert_eq!(
            offs("[j]\nrw=read:-8k\nbs=4k\nsize=32k\n"),
            [0, 7, 6, 5, 4, 3, 2, 1]
        );
        assert_eq!(
            offs("[j]\nrw=write:4k\nbs=4k\nsize=32k\n"),
            [0, 2, 4, 6, 0, 2, 4, 6]
        );
        let r = offs("[j]\nrw=randread:4\nbs=4k\nsize=256k\n");
        assert_eq!(r.len(), 64);
        // A new random offset every 4 reads (or at the file's end): ~16 jumps, not ~63.
        let jumps = r.windows(2).filter(|w| w[1] != w[0] + 1).count();
        assert!((12..=20).contains(&jumps), "{jumps} jumps: {r:?}");
        assert!(parse("[j]\nsize=1m\nrw=randread:0\n", false).is_err());
    }

    /// fio's own `$jobnum`/`$filenum` in `filename_format`: clones of two jobs with
    /// `f.$jobnum` share files f.0, f.1; `loops` repeats the job.
    #[test]
    fn filename_format_and_loops() {
        let jf = parse(
            "[a]\nfilename_format=f.$jobnum.$filenum\nnumjobs=2\nsize=64k\n[b]\nfilename_format=f.$jobnum.$filenum\nnumjobs=2\nsize=64k\n",
            false,
        )
        .unwrap();
        let src = FioSource::new(&jf, 0, 1 << 30).unwrap();
        let names: Vec<&str> = src.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["f.0.0", "f.1.0"]);
        // `${VAR}` from the environment; fio's other `$` keywords are refused.
        let home = |k: &str| (k == "HOME").then(|| "/h".to_string());
        let jf = crate::fio::parse_with_env("[a]\nsize=1m\nfilename=${HOME}/x\n", false, &home);
        assert_eq!(jf.unwrap().jobs[0].filename.as_deref(), Some("/h/x"));
        assert!(parse("[a]\nsize=1m\nfilename=$ncpus\n", false).is_err());
        let r = results("[j]\nsize=16k\nloops=3\n");
        assert_eq!(r[0].read.ios, 12);
    }

    /// `bssplit` draws each size by its weight (the IOmeter file server pattern's syntax);
    /// `rate_iops` spaces a clone's I/Os.
    #[test]
    fn bssplit_weights_and_rate_iops() {
        let out = run(
            "[j]\nrw=randread\nsize=16m\nbssplit=4k/75:64k\nio_size=4m\n",
            0.01,
        );
        let small = out.iter().filter(|c| c.req.bytes() == 4096).count() as f64;
        let share = small / out.len() as f64;
        assert!((share - 0.75).abs() < 0.05, "{share}");
        assert!(out.iter().all(|c| matches!(c.req.bytes(), 4096 | 65536)));
        let out = run("[j]\nrw=read\nsize=64k\nrate_iops=100\n", 0.1);
        assert!(
            (out[15].rec.arrival - 150.0).abs() < 1e-6,
            "{}",
            out[15].rec.arrival
        );
        assert!(parse("[j]\nsize=1m\nbssplit=4k/80:8k/30\n", false).is_err());
    }
}
