//! The Linux block layer (blk-mq) between the page cache and the device: splitting at
//! `max_sectors_kb`, front and back merges, plugging, `nr_requests` tags, the I/O schedulers
//! (`none`, `mq-deadline`, and the seed's FCFS/SCAN/LOOK) and the device's queue depth, as an
//! [`engine::Component`](crate::engine).
//!
//! Parameters are [`BlockConfig`] (from `/sys/block/<dev>/queue/*`, see
//! [`crate::host::HostParams::from_system`]).
//!
//! The path of a request (a *bio* in the kernel), written from `block/blk-mq.c`,
//! `blk-merge.c`, `mq-deadline.c` (our own code):
//!
//! 1. **Split** (`bio_split_to_limits`): a bio larger than `max_sectors_kb` is cut into
//!    pieces of `max_sectors_kb` from its start; the request above completes when every
//!    piece has.
//! 2. **Merge** (`blk_attempt_plug_merge`, `blk_mq_sched_try_merge`): a piece whose start is
//!    the end of a request not yet dispatched (same device and direction) is appended to it
//!    (*back merge*); one whose end is a request's start is prepended (*front merge*), as
//!    long as the result stays within `max_sectors_kb`. FUA and flush requests never merge.
//!    After a merge, the grown request is merged with the request it now touches, if any
//!    (`attempt_back_merge`/`attempt_front_merge`), which frees a request. Merging needs no
//!    new request.
//! 3. **Request allocation** (`nr_requests`): a piece that did not merge needs a request;
//!    with all `nr_requests` in use (queued, plugged or at the device), the submitter sleeps:
//!    the piece and every later one wait, in order, until a request completes.
//! 4. **Plugging** (`blk_start_plug`): requests submitted at the same simulated instant — one
//!    system call's pieces, one read-ahead window, one write-back batch, the requests of one
//!    `io_submit` — are held in a plug list, where they merge, and go to the scheduler
//!    together at the end of the instant (a timer at the next representable instant,
//!    `next_instant`, which the engine runs after every event of this one).
//! 5. **Scheduling and dispatch**: while fewer than `queue_depth` requests are at the
//!    device, the scheduler picks the next: `none` in insertion order; `mq-deadline` by its
//!    rules (below); FCFS/SCAN/LOOK/C-LOOK/SSTF by [`crate::sched`] with the head at the end
//!    of the last dispatched request. Flushes (and any zero-length request) bypass the
//!    scheduler and go first, within the queue depth, as the kernel's flush machinery does.
//!
//! **mq-deadline** (`dd_dispatch_request`): reads and writes each have a list sorted by
//! sector and a FIFO with deadlines (`read_expire` 500 ms, `write_expire` 5 s after
//! insertion). A batch continues in sorted order in its direction while fewer than
//! `fifo_batch` requests were sent and a next request exists; otherwise a direction is
//! chosen — reads, unless writes are pending and reads were preferred `writes_starved` times
//! already — and the first request is the FIFO's head if its deadline has passed or the
//! sorted list has nothing after the last position, else the next in sorted order.
//! These queues are kept per I/O priority class, RT served before BE before IDLE, with
//! `prio_aging_expire` (10 s) against starvation ([`deadline`]).
//!
//! I/O priorities: requests merge only with the same priority (`blk_rq_merge_ok`,
//! `attempt_merge`), under any scheduler; only mq-deadline serves by priority.
//!
//! Simplifications: merging looks at every queued request (the kernel's `none` looks at the
//! last few of the software queue only); one hardware queue; no zone locking, no
//! per-cgroup throttling; a dispatch that finds nothing to send waits for the next
//! submission or completion (the kernel also reruns the queue after 3 ms,
//! `BLK_MQ_BUDGET_DELAY`).

mod deadline;

use std::collections::VecDeque;

use crate::Map;

use serde::Serialize;

use crate::engine::{Component, Ctx};
use crate::request::{Completion, Flags, IoPrio, Op, Record, Request};
use crate::sched::{Policy, Scheduler};

/// The I/O scheduler of a block device (`/sys/block/<dev>/queue/scheduler`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IoScheduler {
    /// `none`: requests go to the device in submission order (after merging).
    None,
    /// `mq-deadline`: sorted dispatch per direction, read and write FIFOs with expiry
    /// (`read_expire`, `write_expire`), batches of `fifo_batch`, writes starved at most
    /// `writes_starved` times.
    MqDeadline,
    /// The seed's textbook policies (FCFS, SCAN, LOOK, C-LOOK, SSTF) from [`crate::sched`].
    Classic(Policy),
}

impl IoScheduler {
    /// `none`, `mq-deadline` (or `deadline`), `fcfs`, `scan`, `look`, `c-look`, `sstf`.
    pub fn parse(s: &str) -> anyhow::Result<IoScheduler> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "none" | "noop" => IoScheduler::None,
            "mq-deadline" | "deadline" => IoScheduler::MqDeadline,
            other => IoScheduler::Classic(Policy::parse(other).map_err(|_| {
                anyhow::anyhow!(
                    "unknown I/O scheduler '{s}' (none, mq-deadline, fcfs, scan, look, c-look, sstf)"
                )
            })?),
        })
    }

    /// The active scheduler in a `queue/scheduler` file: `none [mq-deadline] kyber bfq`.
    /// Schedulers we do not model (kyber, bfq) are an error naming them.
    pub fn from_sysfs(text: &str) -> anyhow::Result<IoScheduler> {
        let active = text
            .split_whitespace()
            .find(|w| w.starts_with('[') && w.ends_with(']'))
            .map(|w| w.trim_matches(|c| c == '[' || c == ']'))
            .or_else(|| {
                let t = text.trim();
                (!t.is_empty() && !t.contains(' ')).then_some(t)
            })
            .ok_or_else(|| anyhow::anyhow!("no active scheduler in '{}'", text.trim()))?;
        match active {
            "none" => Ok(IoScheduler::None),
            "mq-deadline" => Ok(IoScheduler::MqDeadline),
            other => anyhow::bail!(
                "the device uses the '{other}' scheduler, which is not modelled (none, mq-deadline); pass --scheduler"
            ),
        }
    }

    pub fn name(self) -> String {
        match self {
            IoScheduler::None => "none".into(),
            IoScheduler::MqDeadline => "mq-deadline".into(),
            IoScheduler::Classic(p) => format!("{p:?}").to_ascii_lowercase(),
        }
    }
}

/// Block-layer parameters (units in the names; sysfs names in the docs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BlockConfig {
    /// `queue/max_sectors_kb`: larger requests are split, merges stop at this size (KiB).
    pub max_sectors_kb: u64,
    /// `queue/nr_requests`: requests the scheduler holds; a submitter finding them all in
    /// use sleeps until one completes.
    pub nr_requests: u32,
    pub scheduler: IoScheduler,
    /// Requests the device holds at once (the hardware queue's tags: `mq/*/nr_tags`, NCQ
    /// depth).
    pub queue_depth: u32,
    /// Plugging: requests submitted at the same instant (one system call, one read-ahead
    /// window, one write-back batch) are held and merged before dispatch.
    pub plug: bool,
    /// mq-deadline `read_expire`, ms (kernel default 500).
    pub read_expire_ms: f64,
    /// mq-deadline `write_expire`, ms (kernel default 5000).
    pub write_expire_ms: f64,
    /// mq-deadline `fifo_batch`: requests dispatched in one direction before the FIFO
    /// deadlines are looked at again (kernel default 16).
    pub fifo_batch: u32,
    /// mq-deadline `writes_starved`: read batches allowed before a write batch (default 2).
    pub writes_starved: u32,
    /// mq-deadline `prio_aging_expire`, ms (kernel default 10,000): a BE or IDLE request
    /// queued this long is served before higher classes' requests.
    pub prio_aging_expire_ms: f64,
    /// A bio-based driver (`submit_bio` of its own, no blk-mq queue: zram, brd, md,
    /// device-mapper; sysfs shows no `queue/scheduler`, no `mq/`): the block layer hands
    /// each bio to the driver as it comes, so nothing is split to `max_sectors_kb`, merged,
    /// plugged, scheduled or held for a request (`nr_requests` does not apply).
    pub bio_based: bool,
}

impl BlockConfig {
    /// Kernel defaults for a SATA disk: `max_sectors_kb` 1280, `nr_requests` 256 (with a
    /// scheduler the kernel sets 2 × min(tags, 128)), mq-deadline with its default tunables,
    /// NCQ depth 32, plugging on.
    pub fn linux_defaults() -> Self {
        BlockConfig {
            max_sectors_kb: 1280,
            nr_requests: 256,
            scheduler: IoScheduler::MqDeadline,
            queue_depth: 32,
            plug: true,
            read_expire_ms: 500.0,
            write_expire_ms: 5000.0,
            fifo_batch: 16,
            writes_starved: 2,
            prio_aging_expire_ms: 10_000.0,
            bio_based: false,
        }
    }
}

/// Counters for the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BlockStats {
    /// Requests received from above.
    pub requests_in: u64,
    /// Requests sent to the device.
    pub requests_out: u64,
    /// Extra pieces made by splitting at `max_sectors_kb`.
    pub splits: u64,
    pub back_merges: u64,
    pub front_merges: u64,
    /// Requests merged into a neighbour after it grew.
    pub request_merges: u64,
    /// Pieces that waited for a free request (`nr_requests` all in use).
    pub tag_waits: u64,
    /// Most requests allocated at once (≤ `nr_requests`).
    pub max_requests: u64,
    /// mq-deadline: requests dispatched because their FIFO deadline had passed.
    pub expired_dispatches: u64,
    /// mq-deadline: BE or IDLE requests dispatched by `prio_aging_expire` before a higher
    /// class's.
    pub aged_dispatches: u64,
}

/// One piece of a request from above.
#[derive(Clone, Copy, Debug)]
struct Bio {
    parent: u64,
    dev: u32,
    lba: u64,
    sectors: u32,
    op: Op,
    flags: Flags,
    prio: IoPrio,
}

/// A block-layer request: merged bios, contiguous.
#[derive(Debug)]
struct Rq {
    dev: u32,
    lba: u64,
    sectors: u32,
    op: Op,
    flags: Flags,
    parents: Vec<u64>,
    inserted: f64,
    prio: IoPrio,
    /// Inserted into mq-deadline's queues (counted in its `in_use` until it completes or
    /// is merged away).
    scheduled: bool,
}

impl Rq {
    fn end(&self) -> u64 {
        self.lba + u64::from(self.sectors)
    }
    fn mergeable(&self) -> bool {
        matches!(self.op, Op::Read | Op::Write) && !self.flags.contains(Flags::FUA)
    }
    fn dir(&self) -> usize {
        usize::from(self.op != Op::Read)
    }
}

/// A request from above waiting for its pieces.
struct Upper {
    req: Request,
    outstanding: usize,
}

/// Merge lookup key: device, direction, priority (`IoPrio::value`), sector.
type Edge = (u32, bool, u16, u64);

/// The scheduler's queue of request ids.
enum Queue {
    Fifo(VecDeque<u64>),
    Deadline(Box<deadline::Deadline>),
    Classic(Scheduler<u64>),
}

/// The block layer component.
pub struct BlockLayer {
    cfg: BlockConfig,
    stats: BlockStats,
    uppers: Map<u64, Upper>,
    /// Requests allocated and not yet at the device (plugged or queued).
    queued: Map<u64, Rq>,
    by_start: Map<Edge, u64>,
    by_end: Map<Edge, u64>,
    plug: Vec<u64>,
    plug_armed: bool,
    queue: Queue,
    /// Flushes and empty requests, dispatched first.
    bypass: VecDeque<u64>,
    /// Pieces waiting for a free request, in order.
    waiting: VecDeque<Bio>,
    /// Requests at the device.
    at_device: Map<u64, Rq>,
    /// Requests allocated (plugged, queued, at the device).
    allocated: u64,
    next_id: u64,
    /// End of the last dispatched request (the head, for the classic policies).
    head: u64,
}

/// Ids of the requests this layer sends down.
const RQ_ID_BIT: u64 = 1 << 60;
/// The end-of-instant plug flush timer.
const PLUG_TOKEN: u64 = 1;

impl BlockLayer {
    pub fn new(cfg: BlockConfig) -> Self {
        let queue = match cfg.scheduler {
            IoScheduler::None => Queue::Fifo(VecDeque::new()),
            IoScheduler::MqDeadline => Queue::Deadline(Box::default()),
            IoScheduler::Classic(p) => Queue::Classic(Scheduler::new(p, u64::MAX >> 8)),
        };
        BlockLayer {
            cfg,
            stats: BlockStats::default(),
            uppers: Map::default(),
            queued: Map::default(),
            by_start: Map::default(),
            by_end: Map::default(),
            plug: Vec::new(),
            plug_armed: false,
            queue,
            bypass: VecDeque::new(),
            waiting: VecDeque::new(),
            at_device: Map::default(),
            allocated: 0,
            next_id: 0,
            head: 0,
        }
    }
    pub fn config(&self) -> &BlockConfig {
        &self.cfg
    }
    pub fn counters(&self) -> BlockStats {
        self.stats
    }

    /// Whether submissions are held in a plug: a bio-based driver has no requests to hold.
    fn plugs(&self) -> bool {
        self.cfg.plug && !self.cfg.bio_based
    }

    /// The largest request, in sectors: a bio-based driver takes bios of any size.
    fn max_sectors(&self) -> u64 {
        if self.cfg.bio_based {
            return u64::from(u32::MAX);
        }
        (self.cfg.max_sectors_kb * 2).max(8)
    }

    fn index(&mut self, id: u64) {
        let rq = &self.queued[&id];
        if rq.mergeable() {
            let (read, p) = (rq.op == Op::Read, rq.prio.value());
            self.by_start.insert((rq.dev, read, p, rq.lba), id);
            self.by_end.insert((rq.dev, read, p, rq.end()), id);
        }
    }

    fn unindex(&mut self, id: u64) {
        let Some(rq) = self.queued.get(&id) else {
            return;
        };
        let (read, p) = (rq.op == Op::Read, rq.prio.value());
        let (s, e) = ((rq.dev, read, p, rq.lba), (rq.dev, read, p, rq.end()));
        if self.by_start.get(&s) == Some(&id) {
            self.by_start.remove(&s);
        }
        if self.by_end.get(&e) == Some(&id) {
            self.by_end.remove(&e);
        }
    }

    /// Tries to merge `bio` into a queued request; true if it did.
    fn try_merge(&mut self, bio: &Bio) -> bool {
        if self.cfg.bio_based
            || !matches!(bio.op, Op::Read | Op::Write)
            || bio.flags.contains(Flags::FUA)
        {
            return false;
        }
        let (read, p) = (bio.op == Op::Read, bio.prio.value());
        let max = self.max_sectors();
        let end = bio.lba + u64::from(bio.sectors);
        if let Some(&id) = self.by_end.get(&(bio.dev, read, p, bio.lba)) {
            if u64::from(self.queued[&id].sectors) + u64::from(bio.sectors) <= max {
                self.unindex(id);
                let rq = self.queued.get_mut(&id).expect("indexed");
                rq.sectors += bio.sectors;
                rq.parents.push(bio.parent);
                self.stats.back_merges += 1;
                self.index(id);
                self.merge_neighbour(id, true);
                return true;
            }
        }
        if let Some(&id) = self.by_start.get(&(bio.dev, read, p, end)) {
            if u64::from(self.queued[&id].sectors) + u64::from(bio.sectors) <= max {
                self.unindex(id);
                let rq = self.queued.get_mut(&id).expect("indexed");
                rq.lba = bio.lba;
                rq.sectors += bio.sectors;
                rq.parents.push(bio.parent);
                let lba = rq.lba;
                self.stats.front_merges += 1;
                self.index(id);
                self.queue_moved(id, end, lba);
                self.merge_neighbour(id, false);
                return true;
            }
        }
        false
    }

    /// After request `id` grew at its end (`back`) or start, merges it with the request it
    /// now touches, if that fits: the later one is folded into the earlier one.
    fn merge_neighbour(&mut self, id: u64, back: bool) {
        let rq = &self.queued[&id];
        let (read, p) = (rq.op == Op::Read, rq.prio.value());
        let other = if back {
            self.by_start.get(&(rq.dev, read, p, rq.end())).copied()
        } else {
            self.by_end.get(&(rq.dev, read, p, rq.lba)).copied()
        };
        let Some(other) = other.filter(|&o| o != id) else {
            return;
        };
        if u64::from(rq.sectors) + u64::from(self.queued[&other].sectors) > self.max_sectors() {
            return;
        }
        // Only requests both waiting in the same place (both plugged, or both queued).
        if self.plug.contains(&id) != self.plug.contains(&other) {
            return;
        }
        let (keep, gone) = if back { (id, other) } else { (other, id) };
        self.unindex(keep);
        self.unindex(gone);
        let g = self.queued.remove(&gone).expect("queued");
        let k = self.queued.get_mut(&keep).expect("queued");
        k.sectors += g.sectors;
        k.parents.extend(g.parents.iter().copied());
        k.inserted = k.inserted.min(g.inserted);
        self.index(keep);
        self.plug.retain(|&x| x != gone);
        self.queue_remove(gone, &g);
        self.allocated -= 1;
        self.stats.request_merges += 1;
    }

    fn queue_moved(&mut self, id: u64, old_lba: u64, new_lba: u64) {
        if self.plug.contains(&id) {
            return;
        }
        match &mut self.queue {
            Queue::Fifo(_) => {}
            Queue::Deadline(d) => {
                let rq = &self.queued[&id];
                let sort = &mut d.prio[deadline::level(rq.prio.class)].sort[rq.dir()];
                if let Some(due) = sort.remove(&(old_lba, id)) {
                    sort.insert((new_lba, id), due);
                }
            }
            Queue::Classic(s) => {
                s.reposition(new_lba, |&x| x == id);
            }
        }
    }

    fn queue_remove(&mut self, id: u64, rq: &Rq) {
        match &mut self.queue {
            Queue::Fifo(q) => q.retain(|&x| x != id),
            Queue::Deadline(d) => {
                let level = deadline::level(rq.prio.class);
                d.prio[level].sort[rq.dir()].remove(&(rq.lba, id));
                // The FIFO entry is skipped lazily; the freed request is no longer in use
                // (`dd_finish_request` of the request merged away).
                if rq.scheduled {
                    d.in_use[level] = d.in_use[level].saturating_sub(1);
                }
            }
            Queue::Classic(s) => {
                s.remove_where(|&x| x == id);
            }
        }
    }

    fn queue_insert(&mut self, id: u64) {
        let rq = &self.queued[&id];
        if !matches!(rq.op, Op::Read | Op::Write) || rq.sectors == 0 {
            self.bypass.push_back(id);
            return;
        }
        let (lba, dir, inserted) = (rq.lba, rq.dir(), rq.inserted);
        let level = deadline::level(rq.prio.class);
        match &mut self.queue {
            Queue::Fifo(q) => q.push_back(id),
            Queue::Deadline(d) => {
                let expire = if dir == 0 {
                    self.cfg.read_expire_ms
                } else {
                    self.cfg.write_expire_ms
                };
                let p = &mut d.prio[level];
                p.sort[dir].insert((lba, id), inserted + expire);
                p.fifo[dir].push_back((inserted + expire, id));
                d.in_use[level] += 1;
                self.queued.get_mut(&id).expect("queued").scheduled = true;
            }
            Queue::Classic(s) => s.push(lba, id),
        }
    }

    /// The next request the scheduler sends to the device.
    fn queue_pop(&mut self, now: f64) -> Option<u64> {
        if let Some(id) = self.bypass.pop_front() {
            return Some(id);
        }
        let head = self.head;
        match &mut self.queue {
            Queue::Fifo(q) => q.pop_front(),
            Queue::Classic(s) => s.pop(head),
            Queue::Deadline(d) => {
                let queued = &self.queued;
                let c = self.cfg;
                let t = deadline::Tunables {
                    expire: [c.read_expire_ms, c.write_expire_ms],
                    fifo_batch: c.fifo_batch,
                    writes_starved: c.writes_starved,
                    prio_aging_expire: c.prio_aging_expire_ms,
                };
                let pick = d.pick(t, now, &|id| queued.get(&id).map(|rq| rq.lba))?;
                self.stats.expired_dispatches += u64::from(pick.expired);
                self.stats.aged_dispatches += u64::from(pick.aged);
                let rq = &queued[&pick.id];
                let (dir, p) = (rq.dir(), &mut d.prio[deadline::level(rq.prio.class)]);
                p.sort[dir].remove(&(rq.lba, pick.id));
                p.next_pos[dir] = Some(rq.end());
                Some(pick.id)
            }
        }
    }

    /// A piece arrives (or leaves the wait list): merge, or allocate a request.
    fn admit(&mut self, bio: Bio, ctx: &mut Ctx) -> bool {
        if self.try_merge(&bio) {
            return true;
        }
        if !self.cfg.bio_based && self.allocated >= u64::from(self.cfg.nr_requests.max(1)) {
            return false;
        }
        self.allocated += 1;
        self.stats.max_requests = self.stats.max_requests.max(self.allocated);
        let id = RQ_ID_BIT | self.next_id;
        self.next_id += 1;
        self.queued.insert(
            id,
            Rq {
                dev: bio.dev,
                lba: bio.lba,
                sectors: bio.sectors,
                op: bio.op,
                flags: bio.flags,
                parents: vec![bio.parent],
                inserted: ctx.now(),
                prio: bio.prio,
                scheduled: false,
            },
        );
        self.index(id);
        if self.plugs() {
            self.plug.push(id);
            if !self.plug_armed {
                self.plug_armed = true;
                // The next representable instant: after every event of this one.
                ctx.wake_at(next_instant(ctx.now()), PLUG_TOKEN);
            }
        } else {
            self.queue_insert(id);
        }
        true
    }

    fn submit_bio(&mut self, bio: Bio, ctx: &mut Ctx) {
        if !self.waiting.is_empty() || !self.admit(bio, ctx) {
            self.stats.tag_waits += 1;
            self.waiting.push_back(bio);
        }
    }

    /// Sends requests to the device while it has room.
    fn dispatch(&mut self, ctx: &mut Ctx) {
        while self.at_device.len() < self.cfg.queue_depth.max(1) as usize {
            let Some(id) = self.queue_pop(ctx.now()) else {
                break;
            };
            self.unindex(id);
            let rq = self.queued.remove(&id).expect("queued");
            self.head = rq.end();
            self.stats.requests_out += 1;
            ctx.down(Request {
                id,
                arrival: ctx.now(),
                dev: rq.dev,
                lba: rq.lba,
                sectors: rq.sectors,
                op: rq.op,
                flags: rq.flags,
                file: None,
                prio: rq.prio,
            });
            self.at_device.insert(id, rq);
        }
    }

    fn unplug(&mut self, ctx: &mut Ctx) {
        self.plug_armed = false;
        for id in std::mem::take(&mut self.plug) {
            if self.queued.contains_key(&id) {
                self.queue_insert(id);
            }
        }
        self.dispatch(ctx);
    }
}

/// The smallest time after `t` (`f64::next_up`, spelled out for Rust 1.85); simulated
/// times are finite and ≥ 0.
fn next_instant(t: f64) -> f64 {
    if t == 0.0 {
        f64::from_bits(1)
    } else if t.is_finite() && t > 0.0 {
        f64::from_bits(t.to_bits() + 1)
    } else {
        t
    }
}

impl Component for BlockLayer {
    fn name(&self) -> &str {
        "blocklayer"
    }

    fn submit(&mut self, req: Request, ctx: &mut Ctx) {
        self.stats.requests_in += 1;
        let max = self.max_sectors();
        let total = u64::from(req.sectors);
        let pieces = if total == 0 { 1 } else { total.div_ceil(max) };
        self.stats.splits += pieces - 1;
        let mut off = 0u64;
        let mut bios = Vec::with_capacity(pieces as usize);
        for _ in 0..pieces {
            let n = (total - off).min(max);
            bios.push(Bio {
                parent: req.id,
                dev: req.dev,
                lba: req.lba + off,
                sectors: n as u32,
                op: req.op,
                flags: req.flags,
                prio: req.prio,
            });
            off += n;
        }
        self.uppers.insert(
            req.id,
            Upper {
                req,
                outstanding: bios.len(),
            },
        );
        for bio in bios {
            self.submit_bio(bio, ctx);
        }
        if !self.plugs() {
            self.dispatch(ctx);
        }
    }

    fn complete(&mut self, done: Completion, ctx: &mut Ctx) {
        let Some(rq) = self.at_device.remove(&done.req.id) else {
            ctx.up(done); // not ours (cannot happen): pass it on
            return;
        };
        self.allocated -= 1;
        if let (true, Queue::Deadline(d)) = (rq.scheduled, &mut self.queue) {
            let n = &mut d.in_use[deadline::level(rq.prio.class)];
            *n = n.saturating_sub(1);
        }
        for parent in rq.parents {
            let finished = match self.uppers.get_mut(&parent) {
                Some(u) => {
                    u.outstanding -= 1;
                    u.outstanding == 0
                }
                None => false,
            };
            if finished {
                let u = self.uppers.remove(&parent).expect("present");
                let rec = Record {
                    arrival: u.req.arrival,
                    queue_wait: done.rec.queue_wait + (done.req.arrival - u.req.arrival),
                    ..done.rec
                };
                ctx.up(Completion { req: u.req, rec });
            }
        }
        // Sleeping submitters get the freed request, in order.
        while let Some(bio) = self.waiting.pop_front() {
            if !self.admit(bio, ctx) {
                self.waiting.push_front(bio);
                break;
            }
        }
        if !self.plug_armed {
            self.dispatch(ctx);
        }
    }

    fn wake(&mut self, token: u64, ctx: &mut Ctx) {
        if token == PLUG_TOKEN {
            self.unplug(ctx);
        }
    }

    fn stats(&self) -> Vec<(String, f64)> {
        let s = self.stats;
        let stats = [
            ("requests in", s.requests_in as f64),
            ("requests to device", s.requests_out as f64),
            ("splits", s.splits as f64),
            ("back merges", s.back_merges as f64),
            ("front merges", s.front_merges as f64),
            ("request merges", s.request_merges as f64),
            ("waits for a request (nr_requests)", s.tag_waits as f64),
            ("max requests allocated", s.max_requests as f64),
            ("deadline-expired dispatches", s.expired_dispatches as f64),
            ("priority-aged dispatches", s.aged_dispatches as f64),
        ];
        crate::engine::prefixed_stats("blocklayer", &stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Pending, Simulator, VecSource};
    use crate::testdev::{Log, TestDev};

    fn ns(t: f64) -> f64 {
        (t * 1e6).round() / 1e6
    }

    /// What the device saw: (time, op letter, lba, sectors).
    type DevLog = Log<(f64, char, u64, u32)>;

    struct Rig {
        sim: Simulator,
        log: DevLog,
    }

    fn rig(cfg: BlockConfig, service: f64) -> Rig {
        let log: DevLog = Default::default();
        let sim = Simulator::new(vec![
            Box::new(BlockLayer::new(cfg)),
            // Plugged requests leave one representable instant (`next_up`) after they came:
            // times are logged to the nanosecond.
            Box::new(TestDev::new(
                &log,
                |t, r| (ns(t), r.op.letter(), r.lba, r.sectors),
                service,
                false,
            )),
        ]);
        Rig { sim, log }
    }

    fn req(at: f64, op: Op, lba: u64, sectors: u32) -> Pending {
        crate::testdev::pending_at(at, op, lba, sectors)
    }

    fn run(r: &mut Rig, items: Vec<Pending>) -> (Vec<Completion>, BlockStats) {
        let mut out = Vec::new();
        r.sim
            .run(&mut VecSource::new(items), &mut |c| out.push(c.clone()))
            .unwrap();
        (out, BlockStats::default())
    }

    fn stat(r: &Rig, name: &str) -> f64 {
        r.sim.components()[0]
            .stats()
            .into_iter()
            .find(|(k, _)| k == name)
            .unwrap()
            .1
    }

    /// 512 sequential 4 KiB writes submitted at once (one plug) merge into requests of
    /// max_sectors_kb = 1280 KiB: 2 MiB reach the device as 1280 + 768 KiB.
    #[test]
    fn adjacent_4k_writes_merge_up_to_max_sectors_kb() {
        let cfg = BlockConfig::linux_defaults();
        assert_eq!(cfg.max_sectors_kb, 1280);
        let mut r = rig(cfg, 1.0);
        let items = (0..512).map(|i| req(0.0, Op::Write, i * 8, 8)).collect();
        let (out, _) = run(&mut r, items);
        assert_eq!(out.len(), 512);
        assert_eq!(
            *r.log.borrow(),
            vec![(0.0, 'W', 0, 2560), (0.0, 'W', 2560, 1536)]
        );
        assert_eq!(stat(&r, "blocklayer back merges"), 510.0);
        // Every 4 KiB write completes with the device request that carried it.
        assert!(out.iter().all(|c| ns(c.rec.completion) == 1.0));
    }

    /// Descending 4 KiB writes merge at the front.
    #[test]
    fn front_merges_and_a_request_merge() {
        let mut r = rig(BlockConfig::linux_defaults(), 1.0);
        // 16 and 8 (front merge onto 16), then 32 — 24 joins 8..24 at the back and the
        // result touches 32..40: the two requests become one.
        let items = vec![
            req(0.0, Op::Read, 16, 8),
            req(0.0, Op::Read, 8, 8),
            req(0.0, Op::Read, 32, 8),
            req(0.0, Op::Read, 24, 8),
        ];
        run(&mut r, items);
        assert_eq!(*r.log.borrow(), vec![(0.0, 'R', 8, 32)]);
        assert_eq!(stat(&r, "blocklayer front merges"), 1.0);
        assert_eq!(stat(&r, "blocklayer request merges"), 1.0);
    }

    /// A 4 MiB request is split at 1280 KiB: 1280 + 1280 + 1280 + 256 KiB, and completes
    /// when the last piece does.
    #[test]
    fn a_4mib_request_splits_at_1280k() {
        let mut cfg = BlockConfig::linux_defaults();
        cfg.queue_depth = 1;
        let mut r = rig(cfg, 1.0);
        let (out, _) = run(&mut r, vec![req(0.0, Op::Read, 0, 8192)]);
        assert_eq!(
            *r.log.borrow(),
            vec![
                (0.0, 'R', 0, 2560),
                (1.0, 'R', 2560, 2560),
                (2.0, 'R', 5120, 2560),
                (3.0, 'R', 7680, 512)
            ]
        );
        assert_eq!(out.len(), 1);
        assert_eq!(ns(out[0].rec.completion), 4.0);
        assert_eq!(stat(&r, "blocklayer splits"), 3.0);
    }

    /// Device queue depth 1. Without plugging, the first of a burst goes to the idle device
    /// alone and the rest merge behind it; with plugging, the whole burst merges first.
    #[test]
    fn plugging_batches_a_burst() {
        let burst = || (0..16).map(|i| req(0.0, Op::Write, i * 8, 8)).collect();
        let mut cfg = BlockConfig::linux_defaults();
        cfg.queue_depth = 1;
        let mut r = rig(cfg, 1.0);
        run(&mut r, burst());
        assert_eq!(*r.log.borrow(), vec![(0.0, 'W', 0, 128)]);
        cfg.plug = false;
        let mut r = rig(cfg, 1.0);
        run(&mut r, burst());
        assert_eq!(*r.log.borrow(), vec![(0.0, 'W', 0, 8), (1.0, 'W', 8, 120)]);
    }

    /// A bio-based driver (zram) takes every bio as it comes: a burst of adjacent writes is
    /// not merged or plugged, a 4 MiB request is not split, and nr_requests holds nothing.
    #[test]
    fn a_bio_based_driver_gets_every_bio_as_it_comes() {
        let mut cfg = BlockConfig::linux_defaults();
        cfg.bio_based = true;
        cfg.queue_depth = u32::MAX;
        cfg.nr_requests = 4;
        let mut r = rig(cfg, 1.0);
        let mut items: Vec<_> = (0..16).map(|i| req(0.0, Op::Write, i * 8, 8)).collect();
        items.push(req(0.0, Op::Read, 100_000, 8192));
        let (out, _) = run(&mut r, items);
        assert_eq!(out.len(), 17);
        let log = r.log.borrow();
        assert_eq!(log.len(), 17, "{log:?}");
        assert!(log.iter().all(|e| e.0 == 0.0), "{log:?}");
        assert!(log.iter().any(|e| e.2 == 100_000 && e.3 == 8192), "{log:?}");
        assert_eq!(stat(&r, "blocklayer back merges"), 0.0);
        assert_eq!(stat(&r, "blocklayer splits"), 0.0);
        assert_eq!(
            stat(&r, "blocklayer waits for a request (nr_requests)"),
            0.0
        );
    }

    /// nr_requests = 4: ten scattered writes hold at most 4 requests; the others wait for
    /// completions, in order.
    #[test]
    fn nr_requests_bounds_the_requests_and_submitters_wait() {
        let mut cfg = BlockConfig::linux_defaults();
        cfg.nr_requests = 4;
        cfg.queue_depth = 2;
        cfg.scheduler = IoScheduler::None;
        let mut r = rig(cfg, 1.0);
        let items = (0..10).map(|i| req(0.0, Op::Write, i * 1000, 8)).collect();
        let (out, _) = run(&mut r, items);
        assert_eq!(out.len(), 10);
        assert_eq!(stat(&r, "blocklayer max requests allocated"), 4.0);
        assert_eq!(
            stat(&r, "blocklayer waits for a request (nr_requests)"),
            6.0
        );
        let lbas: Vec<u64> = r.log.borrow().iter().map(|e| e.2).collect();
        assert_eq!(lbas, (0..10).map(|i| i * 1000).collect::<Vec<_>>());
        // Two at a time at the device: 0, 0, 1, 1, 2, 2, ...
        let times: Vec<f64> = r.log.borrow().iter().map(|e| e.0).collect();
        assert_eq!(
            times,
            vec![0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]
        );
    }

    /// One request at a time, 100 ms each, fifo_batch 1. A read at sector 1000 goes first;
    /// a read at 0 arrives at t=1 (deadline 501), then reads at 2000, 2100, ... 2500.
    /// mq-deadline serves in sorted order from the head (2000, 2100, ...) until the read at
    /// 0 expires: at t=600 it goes, then the sweep resumes. `none` serves in arrival order,
    /// LOOK sweeps up and comes back for 0 last.
    #[test]
    fn deadline_serves_sorted_until_a_fifo_deadline_expires() {
        let items = || {
            let mut v = vec![req(0.0, Op::Read, 1000, 8), req(1.0, Op::Read, 0, 8)];
            for (i, lba) in [2000u64, 2100, 2200, 2300, 2400, 2500].iter().enumerate() {
                v.push(req(2.0 + i as f64, Op::Read, *lba, 8));
            }
            v
        };
        let order = |sched: IoScheduler| {
            let mut cfg = BlockConfig::linux_defaults();
            cfg.queue_depth = 1;
            cfg.fifo_batch = 1;
            cfg.scheduler = sched;
            let mut r = rig(cfg, 100.0);
            run(&mut r, items());
            let v: Vec<(f64, u64)> = r.log.borrow().iter().map(|e| (e.0, e.2)).collect();
            (v, stat(&r, "blocklayer deadline-expired dispatches"))
        };
        let (dl, expired) = order(IoScheduler::MqDeadline);
        assert_eq!(
            dl,
            vec![
                (0.0, 1000),
                (100.0, 2000),
                (200.0, 2100),
                (300.0, 2200),
                (400.0, 2300),
                (500.0, 2400),
                (600.0, 0),
                (700.0, 2500)
            ]
        );
        // 0 went by its deadline, and so did 2500 (inserted at 7 ms: due at 507).
        assert_eq!(expired, 2.0);
        let lbas = |v: Vec<(f64, u64)>| v.into_iter().map(|e| e.1).collect::<Vec<_>>();
        assert_eq!(
            lbas(order(IoScheduler::None).0),
            vec![1000, 0, 2000, 2100, 2200, 2300, 2400, 2500]
        );
        assert_eq!(
            lbas(order(IoScheduler::Classic(Policy::Look)).0),
            vec![1000, 2000, 2100, 2200, 2300, 2400, 2500, 0]
        );
        assert_eq!(
            lbas(order(IoScheduler::Classic(Policy::Fcfs)).0),
            vec![1000, 0, 2000, 2100, 2200, 2300, 2400, 2500]
        );
    }

    /// Reads are preferred, but after `writes_starved` (2) read batches a write batch goes.
    #[test]
    fn deadline_prefers_reads_but_does_not_starve_writes() {
        let mut cfg = BlockConfig::linux_defaults();
        cfg.queue_depth = 1;
        cfg.fifo_batch = 1;
        let mut r = rig(cfg, 10.0);
        let mut items = vec![req(0.0, Op::Read, 0, 8), req(1.0, Op::Write, 50_000, 8)];
        for i in 0..6 {
            items.push(req(1.0, Op::Read, 1000 + i * 100, 8));
        }
        run(&mut r, items);
        let ops: String = r.log.borrow().iter().map(|e| e.1).collect();
        // R (first, alone), then two read batches, the write, the remaining reads.
        assert_eq!(ops, "RRRWRRRR");
    }

    fn with_class(mut p: Pending, class: crate::request::IoClass) -> Pending {
        p.req.prio = IoPrio { class, level: 0 };
        p
    }

    /// mq-deadline serves RT, then BE (and requests without a priority), then IDLE
    /// (`dd_dispatch_request`'s loop over the levels); the first read, alone, went at once.
    #[test]
    fn deadline_serves_by_priority_class() {
        use crate::request::IoClass::{Be, Idle, None as NoClass, Rt};
        let mut cfg = BlockConfig::linux_defaults();
        cfg.queue_depth = 1;
        let mut r = rig(cfg, 1.0);
        let items = vec![
            with_class(req(0.0, Op::Read, 0, 8), Be),
            with_class(req(0.5, Op::Read, 1000, 8), Idle),
            with_class(req(0.5, Op::Read, 2000, 8), NoClass),
            with_class(req(0.5, Op::Read, 3000, 8), Rt),
            with_class(req(0.5, Op::Read, 4000, 8), Rt),
        ];
        run(&mut r, items);
        let order: Vec<u64> = r.log.borrow().iter().map(|e| e.2).collect();
        assert_eq!(order, vec![0, 3000, 4000, 2000, 1000]);
        // Without classes the same queue goes in sorted order from the last position.
        let mut r = rig(cfg, 1.0);
        let plain = [0, 1000, 2000, 3000, 4000]
            .map(|l| req(if l == 0 { 0.0 } else { 0.5 }, Op::Read, l, 8));
        run(&mut r, plain.to_vec());
        let order: Vec<u64> = r.log.borrow().iter().map(|e| e.2).collect();
        assert_eq!(order, vec![0, 1000, 2000, 3000, 4000]);
    }

    /// A class with requests at the device holds the lower classes back even with the
    /// device's queue free (`dd_queued` counts requests until they complete): the BE read
    /// waits for the RT read's completion at 10 ms.
    #[test]
    fn a_higher_class_in_flight_holds_back_the_lower() {
        use crate::request::IoClass::{Be, Rt};
        let mut cfg = BlockConfig::linux_defaults();
        cfg.queue_depth = 2;
        let mut r = rig(cfg, 10.0);
        let items = vec![
            with_class(req(0.0, Op::Read, 0, 8), Rt),
            with_class(req(0.0, Op::Read, 5000, 8), Be),
        ];
        run(&mut r, items);
        let log: Vec<(f64, u64)> = r.log.borrow().iter().map(|e| (e.0.round(), e.2)).collect();
        assert_eq!(log, vec![(0.0, 0), (10.0, 5000)]);
    }

    /// `prio_aging_expire` (10 s): a BE read under a stream of RT reads that never lets the
    /// RT queue empty is served once it has waited 10 s (`dd_dispatch_prio_aged_requests`),
    /// not after the stream (12 s).
    #[test]
    fn a_starved_be_request_is_served_after_prio_aging_expire() {
        use crate::request::IoClass::{Be, Rt};
        let mut cfg = BlockConfig::linux_defaults();
        cfg.queue_depth = 1;
        let mut r = rig(cfg, 1.0);
        let mut items = vec![with_class(req(0.0, Op::Read, 1 << 30, 8), Be)];
        for i in 0..24_000u64 {
            items.push(with_class(req(i as f64 * 0.5, Op::Read, i * 8, 8), Rt));
        }
        run(&mut r, items);
        let log = r.log.borrow();
        let be = log.iter().position(|e| e.2 == 1 << 30).unwrap();
        let t = log[be].0;
        assert!((10_000.0..10_002.0).contains(&t), "BE served at {t} ms");
        assert!(log[be + 1..].len() > 1_000, "RT requests were still queued");
        drop(log);
        assert_eq!(stat(&r, "blocklayer priority-aged dispatches"), 1.0);
    }

    /// Requests of different priorities do not merge (`blk_rq_merge_ok`), under any
    /// scheduler; of the same priority they do.
    #[test]
    fn only_requests_of_one_priority_merge() {
        use crate::request::IoClass::Rt;
        let mut cfg = BlockConfig::linux_defaults();
        cfg.scheduler = IoScheduler::None;
        let mut r = rig(cfg, 1.0);
        let items = vec![
            with_class(req(0.0, Op::Write, 0, 8), Rt),
            req(0.0, Op::Write, 8, 8),
            req(0.0, Op::Write, 16, 8),
        ];
        run(&mut r, items);
        let sizes: Vec<(u64, u32)> = r.log.borrow().iter().map(|e| (e.2, e.3)).collect();
        assert_eq!(sizes, vec![(0, 8), (8, 16)]);
    }

    /// Flushes bypass the queue.
    #[test]
    fn a_flush_goes_first() {
        let mut cfg = BlockConfig::linux_defaults();
        cfg.queue_depth = 1;
        let mut r = rig(cfg, 1.0);
        let (out, _) = run(
            &mut r,
            vec![
                req(0.0, Op::Write, 0, 8),
                req(0.5, Op::Write, 5000, 8),
                req(0.5, Op::Flush, 0, 0),
            ],
        );
        assert_eq!(out.len(), 3);
        let ops: Vec<(char, u64)> = r.log.borrow().iter().map(|e| (e.1, e.2)).collect();
        assert_eq!(ops, vec![('W', 0), ('F', 0), ('W', 5000)]);
    }
}
