//! Logical organisations of devices (DiskSim's `disksim_logorg`): how a request on a logical
//! device becomes requests on physical ones.
//!
//! The rules, as DiskSim 4.0 applies them (`disksim_logorg.c`, `disksim_redun.c`):
//!
//! * **Addressing.** `Parts`: each device of the organisation stays a logical device of its
//!   own (part `p` covers logical blocks `p × blocks_per_part ..`); `Array`: the whole
//!   organisation is one logical device, addressed by its first device's number.
//! * **Distribution.** `Asis`: a part maps to its device unchanged. `Striped` with a stripe
//!   unit of `u` sectors over `n` data devices: logical block `L` is in unit `L / u`, on data
//!   device `(L / u) mod n` at `(L / u / n) × u + L mod u`; a request crossing units becomes one
//!   request per device (consecutive stripes of a device are contiguous on it).
//! * **Shadowed** (mirroring) with `c` copies: the data devices are the first `n / c`; copy
//!   `k` of data device `d` is device `d + k × n / c`. A write goes to every copy; a read to
//!   one, chosen by "Copy choice on read" (1 primary, 3 round robin, 4 shortest distance from
//!   the copy's last access, 5 shortest queue, 6 shortest queue then shortest distance).
//! * **Parity** (`Parity_rotated`: RAID 5, left-symmetric, DiskSim's rotation type 1;
//!   `Parity_disk`: RAID 4, parity on the last device): rows of `n − 1` data units and one
//!   parity unit, all of the stripe unit. Row `r`'s parity is on device `n − 1 − (r mod n)`
//!   (RAID 5) and its data unit `k` on the device after the parity one, `k` further on. A read
//!   reads the data. A write of whole rows writes data and parity; a row partly written
//!   first reads, then writes: when it touches fewer units than "RMW vs. reconstruct" × `n`
//!   (DiskSim's `rmwpoint`), the old data it overwrites and the old parity
//!   (read-modify-write), else the units it does not write (reconstruct-write). Here every
//!   write of a request waits for all of its reads (DiskSim, without "Synch writes for
//!   safety", lets a row's writes go as soon as that row's reads are done).

use anyhow::{bail, Result};

use crate::request::Op;

/// "Copy choice on read" of a shadowed organisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyChoice {
    Primary,
    RoundRobin,
    ShortestDistance,
    ShortestQueue,
    /// Shortest queue, ties by shortest distance.
    ShortestQueueThenDistance,
}

impl CopyChoice {
    /// DiskSim's numbers; 2 (random) is refused (it would need DiskSim's random stream).
    pub fn from_disksim(n: u32) -> Result<CopyChoice> {
        Ok(match n {
            1 => CopyChoice::Primary,
            3 => CopyChoice::RoundRobin,
            4 => CopyChoice::ShortestDistance,
            5 => CopyChoice::ShortestQueue,
            6 => CopyChoice::ShortestQueueThenDistance,
            _ => bail!("copy choice {n} is not modelled (1 primary, 3 round robin, 4 shortest distance, 5 shortest queue, 6 shortest queue then distance)"),
        })
    }
}

/// How the logical blocks are spread and made redundant.
#[derive(Clone, Debug, PartialEq)]
pub enum Scheme {
    /// `Asis`, no redundancy: each part is its device.
    Asis,
    /// `Striped` with this stripe unit (sectors), no redundancy.
    Striped { unit: u64 },
    /// Mirroring: `copies` copies of the data devices, each `Asis` or striped (`unit`).
    Shadowed {
        copies: usize,
        unit: Option<u64>,
        read: CopyChoice,
    },
    /// RAID 5 (`rotated`) or RAID 4: stripe unit `unit`, read-modify-write below `rmw_point`
    /// units written in a row, reconstruct-write from it.
    Parity {
        unit: u64,
        rotated: bool,
        rmw_point: usize,
    },
}

/// One access to a physical device: the index of the device in the organisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub member: usize,
    pub lba: u64,
    pub sectors: u64,
    pub op: Op,
}

/// The accesses of one logical request: `first` (the reads a parity write needs), then
/// `then` once all of `first` are done.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub first: Vec<Access>,
    pub then: Vec<Access>,
}

/// A logical organisation of `members` devices of `blocks_per_part` sectors each.
#[derive(Clone, Debug)]
pub struct Logorg {
    pub name: String,
    /// `Parts` addressing (else `Array`).
    pub parts: bool,
    pub scheme: Scheme,
    pub members: usize,
    pub blocks_per_part: u64,
    /// Round-robin position, and each member's last accessed block (copy choice).
    toggle: usize,
    last: Vec<Option<u64>>,
}

impl Logorg {
    pub fn new(
        name: &str,
        parts: bool,
        scheme: Scheme,
        members: usize,
        blocks_per_part: u64,
    ) -> Result<Logorg> {
        if members == 0 {
            bail!("logorg {name}: no devices");
        }
        match &scheme {
            Scheme::Striped { unit } | Scheme::Parity { unit, .. } if *unit == 0 => {
                bail!("logorg {name}: a stripe unit of 0 (DiskSim's block interleaving) is not modelled")
            }
            Scheme::Shadowed { copies, .. } if *copies < 2 || members % copies != 0 => {
                bail!("logorg {name}: {members} devices cannot hold {copies} copies (a multiple of the copies, at least 2)")
            }
            Scheme::Parity { .. } if members < 3 => {
                bail!("logorg {name}: parity needs at least 3 devices, not {members}")
            }
            _ => {}
        }
        Ok(Logorg {
            name: name.to_string(),
            parts,
            scheme,
            members,
            blocks_per_part,
            toggle: 0,
            last: vec![None; members],
        })
    }

    /// Data devices (the others hold copies or parity).
    fn data_members(&self) -> usize {
        match &self.scheme {
            Scheme::Shadowed { copies, .. } => self.members / copies,
            Scheme::Parity { .. } => self.members - 1,
            _ => self.members,
        }
    }

    /// Logical devices: one per data device with `Parts`, one with `Array`.
    pub fn logical_devices(&self) -> usize {
        if self.parts {
            self.data_members()
        } else {
            1
        }
    }

    /// Sectors of one logical device.
    pub fn logical_blocks(&self) -> u64 {
        let per = match &self.scheme {
            Scheme::Parity { unit, .. } => self.blocks_per_part / unit * unit,
            _ => self.blocks_per_part,
        };
        if self.parts {
            per
        } else {
            per * self.data_members() as u64
        }
    }

    /// The accesses of a request of `sectors` at `lba` on logical device `part` (0 for an
    /// array); `queued(member)` is the member's queue length (copy choice).
    pub fn map(
        &mut self,
        part: usize,
        lba: u64,
        sectors: u64,
        op: Op,
        queued: &dyn Fn(usize) -> usize,
    ) -> Plan {
        let l = if self.parts {
            part as u64 * self.logical_blocks() + lba
        } else {
            lba
        };
        let plan = match self.scheme.clone() {
            Scheme::Asis => Plan {
                first: Vec::new(),
                then: vec![Access {
                    member: part,
                    lba,
                    sectors,
                    op,
                }],
            },
            Scheme::Striped { unit } => Plan {
                first: Vec::new(),
                then: striped(l, sectors, unit, self.members, op),
            },
            Scheme::Shadowed { copies, unit, read } => {
                self.shadowed(part, l, sectors, op, (copies, unit, read), queued)
            }
            Scheme::Parity {
                unit,
                rotated,
                rmw_point,
            } => parity(l, sectors, op, unit, self.members, rotated, rmw_point),
        };
        for a in plan.first.iter().chain(&plan.then) {
            self.last[a.member] = Some(a.lba + a.sectors);
        }
        plan
    }

    fn shadowed(
        &mut self,
        part: usize,
        l: u64,
        sectors: u64,
        op: Op,
        (copies, unit, read): (usize, Option<u64>, CopyChoice),
        queued: &dyn Fn(usize) -> usize,
    ) -> Plan {
        let n = self.data_members();
        let data = match unit {
            Some(u) => striped(l, sectors, u, n, op),
            None => vec![Access {
                member: part,
                lba: l - part as u64 * self.blocks_per_part,
                sectors,
                op,
            }],
        };
        let mut then = Vec::new();
        for a in data {
            if op == Op::Read {
                let k = self.copy_for(a, copies, n, read, queued);
                then.push(Access {
                    member: a.member + k * n,
                    ..a
                });
            } else {
                then.extend((0..copies).map(|k| Access {
                    member: a.member + k * n,
                    ..a
                }));
            }
        }
        Plan {
            first: Vec::new(),
            then,
        }
    }

    /// Which copy (0..copies) of data device `a.member` serves a read.
    fn copy_for(
        &mut self,
        a: Access,
        copies: usize,
        n: usize,
        read: CopyChoice,
        queued: &dyn Fn(usize) -> usize,
    ) -> usize {
        let dist = |k: usize| match self.last[a.member + k * n] {
            Some(p) => p.abs_diff(a.lba),
            None => u64::MAX,
        };
        match read {
            CopyChoice::Primary => 0,
            CopyChoice::RoundRobin => {
                let k = self.toggle;
                self.toggle = (self.toggle + 1) % copies;
                k
            }
            CopyChoice::ShortestDistance => (0..copies).min_by_key(|&k| dist(k)).unwrap_or(0),
            CopyChoice::ShortestQueue => (0..copies)
                .min_by_key(|&k| queued(a.member + k * n))
                .unwrap_or(0),
            CopyChoice::ShortestQueueThenDistance => (0..copies)
                .min_by_key(|&k| (queued(a.member + k * n), dist(k)))
                .unwrap_or(0),
        }
    }
}

/// Striping of `sectors` at logical `l` over `n` devices with stripe unit `unit`: one access
/// per device touched (its units are contiguous on it), in the order first touched.
pub fn striped(l: u64, sectors: u64, unit: u64, n: usize, op: Op) -> Vec<Access> {
    let n64 = n as u64;
    let mut out: Vec<Access> = Vec::new();
    let (mut at, mut left) = (l, sectors);
    while left > 0 {
        let u = at / unit;
        let member = (u % n64) as usize;
        let off = at % unit;
        let take = (unit - off).min(left);
        let lba = u / n64 * unit + off;
        match out.iter_mut().find(|a| a.member == member) {
            Some(a) => a.sectors += take,
            None => out.push(Access {
                member,
                lba,
                sectors: take,
                op,
            }),
        }
        at += take;
        left -= take;
        if out.len() == n && left > unit * n64 {
            // Every device touched: the rest adds whole units to each.
            let rounds = (left / (unit * n64)).saturating_sub(1);
            for a in &mut out {
                a.sectors += rounds * unit;
            }
            at += rounds * unit * n64;
            left -= rounds * unit * n64;
        }
    }
    out
}

/// The device of row `row`'s parity and of its data unit `k`, over `n` devices.
fn parity_place(row: u64, k: u64, n: u64, rotated: bool) -> (u64, u64) {
    let p = if rotated { n - 1 - row % n } else { n - 1 };
    let d = if rotated { (p + 1 + k) % n } else { k };
    (p, d)
}

/// A parity organisation's accesses (see the module's rules).
fn parity(
    l: u64,
    sectors: u64,
    op: Op,
    unit: u64,
    n: usize,
    rotated: bool,
    rmw_point: usize,
) -> Plan {
    let n64 = n as u64;
    let per_row = unit * (n64 - 1);
    let mut plan = Plan::default();
    let (mut at, end) = (l, l + sectors);
    while at < end {
        let row = at / per_row;
        let row_end = ((row + 1) * per_row).min(end);
        // The row's pieces: (unit k, offset in the unit, sectors).
        let mut pieces = Vec::new();
        let mut p = at;
        while p < row_end {
            let k = (p - row * per_row) / unit;
            let off = p % unit;
            let take = (unit - off).min(row_end - p);
            pieces.push((k, off, take));
            p += take;
        }
        row_plan(&mut plan, row, &pieces, op, unit, n64, rotated, rmw_point);
        at = row_end;
    }
    merge(&mut plan.first);
    merge(&mut plan.then);
    plan
}

#[allow(clippy::too_many_arguments)]
fn row_plan(
    plan: &mut Plan,
    row: u64,
    pieces: &[(u64, u64, u64)],
    op: Op,
    unit: u64,
    n: u64,
    rotated: bool,
    rmw_point: usize,
) {
    let base = row * unit;
    let at = |dev: u64, off: u64, sectors: u64, op: Op| Access {
        member: dev as usize,
        lba: base + off,
        sectors,
        op,
    };
    for &(k, off, s) in pieces {
        let (_, d) = parity_place(row, k, n, rotated);
        plan.then.push(at(d, off, s, op));
    }
    if op != Op::Write {
        return;
    }
    let (pdev, _) = parity_place(row, 0, n, rotated);
    let lo = pieces.iter().map(|p| p.1).min().unwrap_or(0);
    let hi = pieces.iter().map(|p| p.1 + p.2).max().unwrap_or(0);
    plan.then.push(at(pdev, lo, hi - lo, Op::Write));
    let written: u64 = pieces.iter().map(|p| p.2).sum();
    if written == unit * (n - 1) {
        return; // a whole row: nothing to read
    }
    if pieces.len() < rmw_point {
        for &(k, off, s) in pieces {
            let (_, d) = parity_place(row, k, n, rotated);
            plan.first.push(at(d, off, s, Op::Read));
        }
        plan.first.push(at(pdev, lo, hi - lo, Op::Read));
    } else {
        for k in 0..n - 1 {
            if pieces.iter().any(|p| p.0 == k) {
                continue;
            }
            let (_, d) = parity_place(row, k, n, rotated);
            plan.first.push(at(d, lo, hi - lo, Op::Read));
        }
    }
}

/// Joins accesses of one device that follow each other (same operation, contiguous).
fn merge(v: &mut Vec<Access>) {
    v.sort_by_key(|a| (a.member, a.op == Op::Write, a.lba));
    let mut out: Vec<Access> = Vec::with_capacity(v.len());
    for a in v.drain(..) {
        match out.last_mut() {
            Some(b) if b.member == a.member && b.op == a.op && b.lba + b.sectors == a.lba => {
                b.sectors += a.sectors
            }
            _ => out.push(a),
        }
    }
    *v = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acc(member: usize, lba: u64, sectors: u64, op: Op) -> Access {
        Access {
            member,
            lba,
            sectors,
            op,
        }
    }

    #[test]
    fn striping_follows_disksims_addressing() {
        // Unit 64 over 4 devices: block 300 is unit 4 (stripe 1, device 0) at offset 44.
        assert_eq!(
            striped(300, 8, 64, 4, Op::Read),
            vec![acc(0, 108, 8, Op::Read)]
        );
        // Crossing into the next unit: 20 sectors on device 0, the rest on device 1.
        assert_eq!(
            striped(300, 30, 64, 4, Op::Read),
            vec![acc(0, 108, 20, Op::Read), acc(1, 64, 10, Op::Read)]
        );
        // Over every device and around: each gets contiguous whole units.
        let v = striped(0, 64 * 9, 64, 4, Op::Write);
        assert_eq!(
            v,
            vec![
                acc(0, 0, 192, Op::Write),
                acc(1, 0, 128, Op::Write),
                acc(2, 0, 128, Op::Write),
                acc(3, 0, 128, Op::Write)
            ]
        );
        assert_eq!(v.iter().map(|a| a.sectors).sum::<u64>(), 64 * 9);
    }

    #[test]
    fn mirrors_write_every_copy_and_read_one() {
        let shadow = Scheme::Shadowed {
            copies: 2,
            unit: None,
            read: CopyChoice::RoundRobin,
        };
        let mut o = Logorg::new("m", true, shadow, 4, 1000).unwrap();
        assert_eq!(o.logical_devices(), 2);
        let w = o.map(1, 10, 8, Op::Write, &|_| 0);
        assert_eq!(
            w.then,
            vec![acc(1, 10, 8, Op::Write), acc(3, 10, 8, Op::Write)]
        );
        let r1 = o.map(1, 10, 8, Op::Read, &|_| 0).then;
        let r2 = o.map(1, 10, 8, Op::Read, &|_| 0).then;
        assert_eq!((r1[0].member, r2[0].member), (1, 3));
        // Shortest queue picks the idle copy.
        let sq = Scheme::Shadowed {
            copies: 2,
            unit: None,
            read: CopyChoice::ShortestQueue,
        };
        let mut o = Logorg::new("m", true, sq, 4, 1000).unwrap();
        let r = o
            .map(0, 5, 1, Op::Read, &|m| if m == 0 { 3 } else { 0 })
            .then;
        assert_eq!(r, vec![acc(2, 5, 1, Op::Read)]);
    }

    #[test]
    fn raid5_is_left_symmetric_with_read_modify_write() {
        // 5 devices, unit 8: row 0's parity on device 4, row 1's on 3 (data from device 4).
        assert_eq!(parity_place(0, 0, 5, true), (4, 0));
        assert_eq!(parity_place(1, 0, 5, true), (3, 4));
        assert_eq!(parity_place(1, 3, 5, true), (3, 2));
        assert_eq!(parity_place(5, 0, 5, true), (4, 0));
        let rmw = 2; // 0.5 × 5 devices, as DiskSim's rmwpoint
                     // A read of one unit of row 1: device 4 at row 1's blocks.
        let r = parity(32, 8, Op::Read, 8, 5, true, rmw);
        assert!(r.first.is_empty());
        assert_eq!(r.then, vec![acc(4, 8, 8, Op::Read)]);
        // A small write: read old data and parity, then write both.
        let w = parity(34, 2, Op::Write, 8, 5, true, rmw);
        assert_eq!(
            w.first,
            vec![acc(3, 10, 2, Op::Read), acc(4, 10, 2, Op::Read)]
        );
        assert_eq!(
            w.then,
            vec![acc(3, 10, 2, Op::Write), acc(4, 10, 2, Op::Write)]
        );
        // Three units of a row: reconstruct (read the fourth unit), write data and parity.
        let w = parity(32, 24, Op::Write, 8, 5, true, rmw);
        assert_eq!(w.first, vec![acc(2, 8, 8, Op::Read)]);
        assert_eq!(w.then.len(), 4);
        // A whole row: no read.
        let w = parity(0, 32, Op::Write, 8, 5, true, rmw);
        assert!(w.first.is_empty());
        assert_eq!(w.then.len(), 5);
        // RAID 4: parity always on the last device.
        assert_eq!(parity_place(7, 2, 5, false), (4, 2));
    }

    #[test]
    fn unmodelled_organisations_are_refused() {
        assert!(Logorg::new("x", false, Scheme::Striped { unit: 0 }, 4, 100).is_err());
        let s = Scheme::Shadowed {
            copies: 2,
            unit: None,
            read: CopyChoice::Primary,
        };
        assert!(Logorg::new("x", true, s, 3, 100).is_err());
        assert!(CopyChoice::from_disksim(2).is_err());
    }
}
