//! Request schedulers: the order in which a queue of requests is served (the seed's FCFS,
//! SCAN and LOOK, plus C-LOOK and SSTF). Used by the disk's own queue and, in the next issue,
//! by the block layer.
//!
//! Positions are LBAs (DiskSim's "LBN" variants): on a zoned disk LBA order is cylinder order.

use std::collections::VecDeque;

use anyhow::{bail, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// First come, first served.
    Fcfs,
    /// Elevator that sweeps to the edge of the disk before reversing.
    Scan,
    /// Elevator that reverses at the last request in its direction.
    Look,
    /// One-way elevator: sweeps up, then jumps back to the lowest request.
    CLook,
    /// Shortest seek (LBA distance) first.
    Sstf,
}

impl Policy {
    /// DiskSim's "Scheduling policy" numbers: 1 FCFS, 2 elevator, 3 cyclical elevator,
    /// 4 SSTF (LBN variants; 5-7 the cylinder variants map to the same).
    pub fn from_disksim(n: u32) -> Result<Policy> {
        Ok(match n {
            1 => Policy::Fcfs,
            2 | 5 | 17 | 18 => Policy::Look,
            3 | 6 => Policy::CLook,
            4 | 7 => Policy::Sstf,
            _ => bail!("DiskSim scheduling policy {n} is not supported (1 FCFS, 2/5 elevator, 3/6 C-LOOK, 4/7 SSTF)"),
        })
    }
    pub fn parse(s: &str) -> Result<Policy> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "fcfs" | "fifo" | "noop" | "none" => Policy::Fcfs,
            "scan" => Policy::Scan,
            "look" | "elevator" => Policy::Look,
            "c-look" | "clook" => Policy::CLook,
            "sstf" => Policy::Sstf,
            _ => bail!("unknown scheduler '{s}' (fcfs, scan, look, c-look, sstf)"),
        })
    }
}

/// A queue of items with a position, served in policy order.
pub struct Scheduler<T> {
    policy: Policy,
    items: VecDeque<(u64, T)>,
    /// Current direction of an elevator: true = increasing LBA.
    up: bool,
    /// Highest position (SCAN sweeps to it before reversing).
    edge: u64,
    /// Total head travel in LBAs (SCAN counts the trip to the edge).
    pub travel: u64,
}

impl<T> Scheduler<T> {
    pub fn new(policy: Policy, edge: u64) -> Self {
        Scheduler {
            policy,
            items: VecDeque::new(),
            up: true,
            edge,
            travel: 0,
        }
    }
    pub fn len(&self) -> usize {
        self.items.len()
    }
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
    pub fn push(&mut self, pos: u64, item: T) {
        self.items.push_back((pos, item));
    }

    /// Removes the first item `pick` selects (the block layer: a request merged into
    /// another), keeping the others' order.
    pub fn remove_where(&mut self, mut pick: impl FnMut(&T) -> bool) -> Option<T> {
        let i = self.items.iter().position(|(_, t)| pick(t))?;
        self.items.remove(i).map(|(_, t)| t)
    }

    /// Moves the first item `pick` selects to position `pos` (a front merge moves a
    /// request's start), keeping its place in arrival order.
    pub fn reposition(&mut self, pos: u64, mut pick: impl FnMut(&T) -> bool) -> bool {
        match self.items.iter_mut().find(|(_, t)| pick(t)) {
            Some(item) => {
                item.0 = pos;
                true
            }
            None => false,
        }
    }

    /// Removes and returns the next item to serve with the head at `head`.
    pub fn pop(&mut self, head: u64) -> Option<T> {
        if self.items.is_empty() {
            return None;
        }
        let i = match self.policy {
            Policy::Fcfs => 0,
            Policy::Sstf => self.nearest(head, |_| true),
            Policy::Look | Policy::Scan => {
                let ahead = |p: u64, up: bool| if up { p >= head } else { p <= head };
                if !self.items.iter().any(|&(p, _)| ahead(p, self.up)) {
                    if self.policy == Policy::Scan {
                        // Travel to the edge in the current direction before turning.
                        let edge = if self.up { self.edge } else { 0 };
                        self.travel += edge.abs_diff(head);
                        self.up = !self.up;
                        let i = self.nearest(edge, |_| true);
                        let p = self.items[i].0;
                        self.travel += p.abs_diff(edge);
                        return self.items.remove(i).map(|(_, t)| t);
                    }
                    self.up = !self.up;
                }
                let up = self.up;
                self.nearest(head, |p| ahead(p, up))
            }
            Policy::CLook => {
                if self.items.iter().any(|&(p, _)| p >= head) {
                    self.nearest(head, |p| p >= head)
                } else {
                    // Wrap to the lowest position.
                    let (i, _) = self
                        .items
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, (p, _))| *p)
                        .unwrap_or((0, &self.items[0]));
                    i
                }
            }
        };
        let (p, t) = self.items.remove(i)?;
        self.travel += p.abs_diff(head);
        Some(t)
    }

    /// Index of the item nearest `head` among those passing `keep` (ties: oldest).
    fn nearest(&self, head: u64, keep: impl Fn(u64) -> bool) -> usize {
        let mut best: Option<(u64, usize)> = None;
        for (i, &(p, _)) in self.items.iter().enumerate() {
            if !keep(p) {
                continue;
            }
            let d = p.abs_diff(head);
            if best.is_none_or(|(bd, _)| d < bd) {
                best = Some((d, i));
            }
        }
        best.map(|(_, i)| i).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves a fixed queue to the end; returns the order and the head travel.
    fn order(policy: Policy, start: u64) -> (Vec<u64>, u64) {
        let mut s = Scheduler::new(policy, 200);
        for p in [98, 183, 37, 122, 14, 124, 65, 67] {
            s.push(p, p);
        }
        let mut head = start;
        let mut out = Vec::new();
        while let Some(p) = s.pop(head) {
            out.push(p);
            head = p;
        }
        (out, s.travel)
    }

    // The textbook queue (Silberschatz): head at 53, cylinders 0..199.
    #[test]
    fn fcfs_serves_in_arrival_order() {
        assert_eq!(
            order(Policy::Fcfs, 53),
            (vec![98, 183, 37, 122, 14, 124, 65, 67], 640)
        );
    }

    #[test]
    fn sstf_serves_nearest_first() {
        assert_eq!(
            order(Policy::Sstf, 53),
            (vec![65, 67, 37, 14, 98, 122, 124, 183], 236)
        );
    }

    #[test]
    fn scan_sweeps_to_the_edge_look_turns_at_the_last_request() {
        let (scan, scan_travel) = order(Policy::Scan, 53);
        let (look, look_travel) = order(Policy::Look, 53);
        assert_eq!(scan, vec![65, 67, 98, 122, 124, 183, 37, 14]);
        assert_eq!(look, scan);
        // SCAN: 53 -> 200 (edge) -> 14 = 147 + 186; LOOK: 53 -> 183 -> 14 = 130 + 169.
        assert_eq!(scan_travel, 333);
        assert_eq!(look_travel, 299);
    }

    #[test]
    fn clook_wraps_to_the_lowest() {
        assert_eq!(
            order(Policy::CLook, 53).0,
            vec![65, 67, 98, 122, 124, 183, 14, 37]
        );
    }
}
