//! mq-deadline's queues and choice of the next request, after Linux 6.x's
//! `block/mq-deadline.c` (our own code): per I/O priority class (RT, BE, IDLE; a request
//! without a priority is BE, `ioprio_class_to_prio`) a list sorted by sector and a FIFO with
//! deadlines per direction, and the batch's position; the batch count, the direction of the
//! batch and the count of read batches that passed writes over are shared by the classes,
//! as in `struct deadline_data`.

use std::collections::{BTreeMap, VecDeque};

use crate::request::IoClass;

/// mq-deadline's priority levels (`enum dd_prio`): RT 0, BE 1, IDLE 2.
pub(super) const CLASSES: usize = 3;

/// The level a class is queued at (`ioprio_class_to_prio`): no class is best effort.
pub(super) fn level(c: IoClass) -> usize {
    match c {
        IoClass::Rt => 0,
        IoClass::None | IoClass::Be => 1,
        IoClass::Idle => 2,
    }
}

/// One class's queues (`struct dd_per_prio`).
#[derive(Default)]
pub(super) struct PerPrio {
    /// Per direction (0 read, 1 write): sorted by (sector, id), with the FIFO deadline.
    pub sort: [BTreeMap<(u64, u64), f64>; 2],
    /// Per direction: (deadline, id) in insertion order; ids no longer queued are skipped.
    pub fifo: [VecDeque<(f64, u64)>; 2],
    /// Per direction: the sector after the last dispatched request (the batch's position).
    pub next_pos: [Option<u64>; 2],
}

#[derive(Default)]
pub(super) struct Deadline {
    pub prio: [PerPrio; CLASSES],
    /// Per level: requests inserted and not yet completed, at the device included
    /// (`dd_queued`: `inserted - completed`).
    pub in_use: [u32; CLASSES],
    last_dir: usize,
    batching: u32,
    starved: u32,
}

/// The tunables the choice reads (`BlockConfig`'s, in ms).
#[derive(Clone, Copy)]
pub(super) struct Tunables {
    pub expire: [f64; 2],
    pub fifo_batch: u32,
    pub writes_starved: u32,
    pub prio_aging_expire: f64,
}

/// A dispatch: the request, whether its FIFO deadline had passed, whether it was a lower
/// class's request served by `prio_aging_expire`.
pub(super) struct Pick {
    pub id: u64,
    pub expired: bool,
    pub aged: bool,
}

impl Deadline {
    /// The next request (`dd_dispatch_request`): first a BE or IDLE request waiting for
    /// `prio_aging_expire` or more while another class has requests
    /// (`dd_dispatch_prio_aged_requests`), then by class, RT first; a class with requests
    /// still in use (queued or at the device) holds back the classes below it even when it
    /// has none to dispatch. `live` says whether a request id is still queued at `lba`.
    pub fn pick(
        &mut self,
        t: Tunables,
        now: f64,
        live: &dyn Fn(u64) -> Option<u64>,
    ) -> Option<Pick> {
        for p in &mut self.prio {
            p.drop_gone(live);
        }
        let busy = self.in_use.iter().filter(|&&n| n > 0).count();
        if busy >= 2 {
            for level in 1..CLASSES {
                if let Some((id, expired)) = self.pick_in(level, t, now, now - t.prio_aging_expire)
                {
                    return Some(Pick {
                        id,
                        expired,
                        aged: true,
                    });
                }
            }
        }
        for level in 0..CLASSES {
            // (every queued request started before now: no start time to compare)
            if let Some((id, expired)) = self.pick_in(level, t, now, f64::INFINITY) {
                return Some(Pick {
                    id,
                    expired,
                    aged: false,
                });
            }
            if self.in_use[level] > 0 {
                break;
            }
        }
        None
    }

    /// One class's choice (`__dd_dispatch_request`), of a request inserted no later than
    /// `latest_start`: a batch goes on in sorted order in its direction while fewer than
    /// `fifo_batch` were sent; otherwise reads, unless writes wait and reads were preferred
    /// `writes_starved` times already; the FIFO's head if its deadline passed or nothing
    /// follows the position, else the next in sorted order. As the kernel's, a new batch's
    /// direction and counts are set before the start time is looked at (`started_after`),
    /// so a choice refused for being too recent still moves them.
    fn pick_in(
        &mut self,
        level: usize,
        t: Tunables,
        now: f64,
        latest_start: f64,
    ) -> Option<(u64, bool)> {
        let started = |t: Tunables, dir: usize, deadline: f64| deadline - t.expire[dir];
        let p = &self.prio[level];
        if self.batching < t.fifo_batch.max(1) {
            if let Some((id, deadline)) = p.next_in(self.last_dir) {
                if started(t, self.last_dir, deadline) > latest_start {
                    return None;
                }
                self.batching += 1;
                return Some((id, false));
            }
        }
        let reads = !p.sort[0].is_empty();
        let writes = !p.sort[1].is_empty();
        let dir = if reads {
            if writes && self.starved >= t.writes_starved {
                self.starved = 0;
                1
            } else {
                if writes {
                    self.starved += 1;
                }
                0
            }
        } else if writes {
            self.starved = 0;
            1
        } else {
            return None;
        };
        let head = p.fifo[dir].front().copied();
        let expired = head.is_some_and(|(deadline, _)| deadline <= now);
        let (id, deadline, by_fifo) = match (expired, p.next_in(dir)) {
            (false, Some((id, deadline))) => (id, deadline, false),
            _ => {
                let (deadline, id) = head?;
                (id, deadline, expired)
            }
        };
        self.last_dir = dir;
        self.batching = 0;
        if started(t, dir, deadline) > latest_start {
            return None;
        }
        self.batching = 1;
        Some((id, by_fifo))
    }
}

impl PerPrio {
    /// Drops FIFO entries of requests gone (merged away or dispatched).
    fn drop_gone(&mut self, live: &dyn Fn(u64) -> Option<u64>) {
        for dir in 0..2 {
            while let Some(&(_, id)) = self.fifo[dir].front() {
                if live(id).is_some_and(|lba| self.sort[dir].contains_key(&(lba, id))) {
                    break;
                }
                self.fifo[dir].pop_front();
            }
        }
    }

    /// The next request in sorted order from the batch's position, with its deadline.
    fn next_in(&self, dir: usize) -> Option<(u64, f64)> {
        let pos = self.next_pos[dir]?;
        let (&(_, id), &deadline) = self.sort[dir].range((pos, 0)..).next()?;
        Some((id, deadline))
    }
}
