//! Logical-to-physical mapping of a zoned disk: zones (bands) of cylinders with the same
//! sectors per track, track and cylinder skews, spare sectors and slipped defects.
//!
//! Model (as DiskSim's "layout g1"): physical sectors of a zone are numbered zone-relatively,
//! cylinder by cylinder, surface by surface, sector by sector (`p`). Logical blocks fill them
//! in order, skipping the zone's management area at its front ("empty space"), the spare
//! sectors reserved by the sparing scheme and the slipped (defective) sectors or tracks. The
//! angular position of a sector is its index on the track shifted by the zone's first-block
//! offset and by one track skew per head switch and one cylinder skew per cylinder switch
//! since the start of the zone: with the skews, the first logical sector of the next track
//! arrives under the head just after the switch, so sequential transfers lose no revolution.

use anyhow::{bail, Result};

/// Where spare sectors are kept and how slips are counted (DiskSim's "sparing scheme").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sparing {
    /// 0: no spares.
    None,
    /// 1: whole spare tracks at the end of each zone; slips are zone-relative track numbers.
    Track,
    /// 2 (4 when slips go to the end of the zone): `spares` sectors at the end of each
    /// cylinder — 5 and 6: at its front; slips are zone-relative physical sectors. A slip
    /// uses a spare of its own cylinder, or (slip to end) shifts every later block by one.
    PerCylinder { slip_to_end: bool, at_front: bool },
    /// 3: `spares` sectors at the end of each track.
    PerTrack,
    /// 7: spares at the end of the disk; each slip shifts every later sector by one.
    AtEnd,
    /// 8: `spares` sectors at the end of each range of `rangesize` cylinders.
    PerRange { cylinders: u32 },
    /// 9 (10 when slips also go to the end): `spares` sectors at the end of each zone.
    PerZone { slip_to_end: bool },
}

impl Sparing {
    pub fn from_disksim(scheme: u32, rangesize: u32) -> Result<Sparing> {
        Ok(match scheme {
            0 => Sparing::None,
            1 => Sparing::Track,
            2 => Sparing::PerCylinder {
                slip_to_end: false,
                at_front: false,
            },
            3 => Sparing::PerTrack,
            4 => Sparing::PerCylinder {
                slip_to_end: true,
                at_front: false,
            },
            5 => Sparing::PerCylinder {
                slip_to_end: false,
                at_front: true,
            },
            6 => Sparing::PerCylinder {
                slip_to_end: true,
                at_front: true,
            },
            7 => Sparing::AtEnd,
            8 => {
                if rangesize == 0 {
                    bail!("sparing scheme 8 needs 'Rangesize for sparing' > 0");
                }
                Sparing::PerRange {
                    cylinders: rangesize,
                }
            }
            9 => Sparing::PerZone { slip_to_end: false },
            10 => Sparing::PerZone { slip_to_end: true },
            _ => bail!("unknown sparing scheme {scheme} (DiskSim knows 0..=10)"),
        })
    }
}

/// One zone (band).
#[derive(Clone, Debug, PartialEq)]
pub struct Zone {
    pub first_cyl: u32,
    pub last_cyl: u32,
    /// Sectors per track.
    pub spt: u32,
    /// Angular offset of the zone's first block, in sectors.
    pub first_offset: f64,
    /// Skew per head (track) switch, in sectors.
    pub track_skew: f64,
    /// Additional skew per cylinder switch, in sectors.
    pub cyl_skew: f64,
    /// Management area at the zone's front, in sectors (not mapped).
    pub deadspace: u64,
    /// Spare sectors (or tracks, for track sparing) per region of the sparing scheme.
    pub spares: u64,
    /// Slipped defects, sorted: zone-relative physical sectors (tracks for track sparing).
    pub slips: Vec<u64>,
    /// Remapped defects: (defective sector, replacement sector), zone-relative physical
    /// sectors, sorted by defect. The block the layout puts on the defective sector lives on
    /// the replacement (normally a spare) instead; its neighbours do not move.
    pub remaps: Vec<(u64, u64)>,
    /// First LBA of the zone and number of LBAs it holds (computed).
    pub first_lba: u64,
    pub blocks: u64,
}

impl Zone {
    pub fn cylinders(&self) -> u32 {
        self.last_cyl - self.first_cyl + 1
    }

    /// Sectors the sparing scheme keeps from data (spares, and slips where they go to the
    /// end), on `surfaces` surfaces.
    fn spare_sectors(&self, sparing: Sparing, surfaces: u32) -> u64 {
        let cyls = u64::from(self.cylinders());
        let slips = self.slips.len() as u64;
        match sparing {
            Sparing::None => 0,
            Sparing::Track => self.spares * u64::from(self.spt),
            Sparing::PerCylinder {
                slip_to_end: false, ..
            } => self.spares * cyls,
            Sparing::PerCylinder {
                slip_to_end: true, ..
            } => self.spares * cyls + slips,
            Sparing::PerTrack => self.spares * cyls * u64::from(surfaces),
            Sparing::AtEnd => slips,
            Sparing::PerRange { cylinders } => self.spares * (cyls / u64::from(cylinders)),
            Sparing::PerZone { slip_to_end: false } => self.spares,
            Sparing::PerZone { slip_to_end: true } => self.spares + slips,
        }
    }

    /// Zone `i`'s spares fit their regions, and (per-cylinder sparing, slips in place) each
    /// cylinder's slips its spares.
    fn check_spares(&self, i: usize, sparing: Sparing, surfaces: u32) -> Result<()> {
        let per_track = u64::from(self.spt);
        let per_cylinder = per_track * u64::from(surfaces);
        let region = match sparing {
            Sparing::PerTrack => per_track,
            Sparing::PerCylinder { .. } => per_cylinder,
            Sparing::PerRange { cylinders } => per_cylinder * u64::from(cylinders),
            _ => return Ok(()),
        };
        if self.spares >= region {
            bail!(
                "zone {i}: {} spares per region of {region} sectors",
                self.spares
            );
        }
        if let Sparing::PerCylinder {
            slip_to_end: false, ..
        } = sparing
        {
            // A slip takes a spare of its own cylinder.
            let mut k = 0;
            while k < self.slips.len() {
                let c = self.slips[k] / per_cylinder;
                let n = self.slips[k..]
                    .iter()
                    .take_while(|&&s| s / per_cylinder == c)
                    .count();
                if n as u64 > self.spares {
                    bail!(
                        "zone {i}: {n} slips on cylinder {} but {} spares per cylinder",
                        u64::from(self.first_cyl) + c,
                        self.spares
                    );
                }
                k += n;
            }
        }
        Ok(())
    }

    /// Sorts zone `i`'s remaps and checks them: each defect once, each replacement once,
    /// both within the zone's `phys` sectors and apart.
    fn check_remaps(&mut self, i: usize, phys: u64) -> Result<()> {
        self.remaps.sort_unstable();
        for w in self.remaps.windows(2) {
            if w[0].0 == w[1].0 {
                bail!("zone {i}: sector {} remapped twice", w[0].0);
            }
        }
        let mut targets: Vec<u64> = self.remaps.iter().map(|r| r.1).collect();
        targets.sort_unstable();
        if targets.windows(2).any(|w| w[0] == w[1]) {
            bail!("zone {i}: two defects remapped to the same sector");
        }
        if let Some(&(d, r)) = self
            .remaps
            .iter()
            .find(|&&(d, r)| d >= phys || r >= phys || d == r)
        {
            bail!("zone {i}: defect {d} -> replacement {r}: outside the zone's {phys} sectors or to itself");
        }
        Ok(())
    }
}

/// A physical sector address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pbn {
    pub cyl: u32,
    pub head: u32,
    pub sector: u32,
}

/// The result of mapping one LBA.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mapped {
    pub pbn: Pbn,
    pub zone: usize,
    /// Logical blocks from this one that lie on consecutive sectors of the same track
    /// (this one included): the media can transfer them in one sweep.
    pub run: u32,
}

/// The order of a cylinder's tracks in LBA order [LBN-to-PBN mapping scheme].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// Surface 0 to the last on every cylinder (0).
    Conventional,
    /// Every other cylinder of a zone runs from the last surface back to 0, the zone's first
    /// cylinder forwards, so a cylinder switch stays on its surface (1).
    SerpentineInZone,
    /// The same with odd-numbered cylinders backwards, counted over the disk (2).
    SerpentineOddCylinders,
}

impl Mapping {
    pub fn from_disksim(scheme: u32) -> Result<Mapping> {
        Ok(match scheme {
            0 => Mapping::Conventional,
            1 => Mapping::SerpentineInZone,
            2 => Mapping::SerpentineOddCylinders,
            _ => bail!("unknown LBN-to-PBN mapping scheme {scheme} (DiskSim knows 0, 1, 2)"),
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    pub surfaces: u32,
    pub cylinders: u32,
    pub sparing: Sparing,
    pub mapping: Mapping,
    pub zones: Vec<Zone>,
    pub blocks: u64,
}

impl Layout {
    /// The same layout with tracks in `mapping`'s order.
    pub fn with_mapping(mut self, mapping: Mapping) -> Layout {
        self.mapping = mapping;
        self
    }

    /// Builds the layout and computes each zone's LBA range.
    pub fn new(
        surfaces: u32,
        cylinders: u32,
        sparing: Sparing,
        mut zones: Vec<Zone>,
    ) -> Result<Layout> {
        if surfaces == 0 || surfaces > 1024 {
            bail!("implausible number of surfaces {surfaces}");
        }
        if zones.is_empty() {
            bail!("a layout needs at least one zone");
        }
        let mut lba = 0u64;
        let mut prev_last: Option<u32> = None;
        for (i, z) in zones.iter_mut().enumerate() {
            if z.last_cyl < z.first_cyl || z.last_cyl >= cylinders.max(1) {
                bail!(
                    "zone {i}: cylinders {}..={} outside 0..{cylinders}",
                    z.first_cyl,
                    z.last_cyl
                );
            }
            if let Some(p) = prev_last {
                if z.first_cyl <= p {
                    bail!(
                        "zone {i}: first cylinder {} overlaps the previous zone",
                        z.first_cyl
                    );
                }
            }
            prev_last = Some(z.last_cyl);
            if z.spt == 0 || z.spt > 100_000 {
                bail!("zone {i}: implausible sectors per track {}", z.spt);
            }
            if !(z.first_offset.is_finite() && z.track_skew.is_finite() && z.cyl_skew.is_finite()) {
                bail!("zone {i}: skews must be finite");
            }
            z.slips.sort_unstable();
            let phys = u64::from(z.cylinders()) * u64::from(z.spt) * u64::from(surfaces);
            let taken = z.deadspace + z.spare_sectors(sparing, surfaces);
            if taken >= phys {
                bail!("zone {i}: spares and reserved space ({taken}) leave no room for data");
            }
            z.check_spares(i, sparing, surfaces)?;
            if z.slips.last().is_some_and(|&s| s >= phys) && sparing != Sparing::Track {
                bail!("zone {i}: slip past the zone's {phys} sectors");
            }
            z.check_remaps(i, phys)?;
            z.first_lba = lba;
            z.blocks = phys - taken;
            lba += z.blocks;
        }
        let layout = Layout {
            surfaces,
            cylinders,
            sparing,
            mapping: Mapping::Conventional,
            zones,
            blocks: lba,
        };
        layout.check_replacements()?;
        Ok(layout)
    }

    /// A replacement must be a sector no block uses (a spare), and a defect one some block
    /// would use. `phys` increases with the block, so a binary search finds them.
    fn check_replacements(&self) -> Result<()> {
        for (i, z) in self.zones.iter().enumerate() {
            let holder = |p: u64| {
                let (lo, hi) = (z.deadspace, z.deadspace + z.blocks);
                let (mut a, mut b) = (lo, hi);
                while a < b {
                    let m = a + (b - a) / 2;
                    if self.phys(z, m) < p {
                        a = m + 1;
                    } else {
                        b = m;
                    }
                }
                (a < hi && self.phys(z, a) == p).then_some(a - z.deadspace)
            };
            for &(d, r) in &z.remaps {
                if let Some(b) = holder(r) {
                    bail!("zone {i}: defect {d} remapped to sector {r}, which holds block {b} of the zone (not a spare)");
                }
                if holder(d).is_none() {
                    bail!(
                        "zone {i}: defect {d} is not a sector the layout uses (a spare or a slip)"
                    );
                }
            }
        }
        Ok(())
    }

    /// A single-zone layout without spares (tests, synthetic disks).
    pub fn uniform(
        surfaces: u32,
        cylinders: u32,
        spt: u32,
        track_skew: f64,
        cyl_skew: f64,
    ) -> Result<Layout> {
        let z = Zone {
            first_cyl: 0,
            last_cyl: cylinders - 1,
            spt,
            first_offset: 0.0,
            track_skew,
            cyl_skew,
            deadspace: 0,
            spares: 0,
            slips: Vec::new(),
            remaps: Vec::new(),
            first_lba: 0,
            blocks: 0,
        };
        Layout::new(surfaces, cylinders, Sparing::None, vec![z])
    }

    pub fn zone_of(&self, lba: u64) -> Option<usize> {
        if lba >= self.blocks {
            return None;
        }
        // Zones are few (tens): a binary search on first_lba.
        let i = self.zones.partition_point(|z| z.first_lba <= lba);
        Some(i - 1)
    }

    /// Zone-relative physical sector index of zone-relative logical block `l`
    /// (deadspace already added).
    fn phys(&self, z: &Zone, l: u64) -> u64 {
        let spt = u64::from(z.spt);
        let surf = u64::from(self.surfaces);
        match self.sparing {
            Sparing::None => l,
            Sparing::Track => {
                let mut track = l / spt;
                // Slips are sorted: once one lies past the position, all later ones do.
                for &s in &z.slips {
                    if s > track {
                        break;
                    }
                    track += 1;
                }
                track * spt + l % spt
            }
            Sparing::PerTrack => {
                let per = spt - z.spares;
                let track = l / per;
                let mut r = l % per;
                let first = track * spt;
                let mut slips = 0;
                for &s in &z.slips[z.slips.partition_point(|&s| s < first)..] {
                    if s - first > r + slips {
                        break;
                    }
                    slips += 1;
                }
                r += slips;
                track * spt + r
            }
            Sparing::PerCylinder {
                slip_to_end,
                at_front,
            } => {
                let percyl = spt * surf;
                let per = percyl - z.spares;
                let front = if at_front { z.spares } else { 0 };
                if slip_to_end {
                    // Data fill the non-spare sectors in order, skipping every slip: a slip
                    // shifts all later blocks of the zone by one. `d` counts data positions
                    // (spares excluded); a slip on a spare sector takes nothing.
                    let data_index = |s: u64| {
                        let (c, q) = (s / percyl, s % percyl);
                        let q = q.checked_sub(front)?;
                        (q < per).then_some(c * per + q)
                    };
                    let mut d = l;
                    for s in z.slips.iter().filter_map(|&s| data_index(s)) {
                        if s <= d {
                            d += 1;
                        }
                    }
                    (d / per) * percyl + front + d % per
                } else {
                    // A slip uses a spare of its own cylinder (at most `spares` per cylinder:
                    // checked in `new`): with spares at the end the blocks after it move one
                    // sector on; with spares at the front the cylinder's data start one
                    // sector earlier per slip.
                    let cyl = l / per;
                    let first = cyl * percyl;
                    let from = z.slips.partition_point(|&s| s < first);
                    let on_cyl = z.slips[from..].partition_point(|&s| s < first + percyl) as u64;
                    let mut q = front.saturating_sub(on_cyl) + l % per;
                    for &s in &z.slips[from..] {
                        if s - first <= q {
                            q += 1;
                        } else {
                            break;
                        }
                    }
                    first + q
                }
            }
            Sparing::AtEnd | Sparing::PerZone { .. } => {
                // Each slip at or before the (shifted) position pushes the block one further.
                let mut p = l;
                for &s in &z.slips {
                    if s > p {
                        break;
                    }
                    p += 1;
                }
                p
            }
            Sparing::PerRange { cylinders } => {
                let perrange = spt * surf * u64::from(cylinders);
                let per = perrange - z.spares;
                let range = l / per;
                let r = l % per;
                let first = range * perrange;
                let mut slips = 0;
                for &s in &z.slips[z.slips.partition_point(|&s| s < first)..] {
                    if s - first > r + slips {
                        break;
                    }
                    slips += 1;
                }
                range * perrange + r + slips
            }
        }
    }

    /// With a serpentine mapping, the physical surface of the `nth` track of `cyl` in LBA
    /// order, and the other way round (the map is its own inverse).
    fn surface(&self, z: &Zone, cyl: u32, nth: u32) -> u32 {
        let backwards = match self.mapping {
            Mapping::Conventional => false,
            Mapping::SerpentineInZone => (cyl - z.first_cyl) % 2 == 1,
            Mapping::SerpentineOddCylinders => cyl % 2 == 1,
        };
        if backwards {
            self.surfaces - 1 - nth
        } else {
            nth
        }
    }

    fn pbn_of(&self, z: &Zone, p: u64) -> Pbn {
        let spt = u64::from(z.spt);
        let percyl = spt * u64::from(self.surfaces);
        let cyl = z.first_cyl + (p / percyl) as u32;
        Pbn {
            cyl,
            head: self.surface(z, cyl, ((p % percyl) / spt) as u32),
            sector: (p % spt) as u32,
        }
    }

    /// Maps an LBA to its physical sector, with the length of the contiguous run on the
    /// track. `None` past the last block.
    pub fn map(&self, lba: u64) -> Option<Mapped> {
        let zi = self.zone_of(lba)?;
        let z = &self.zones[zi];
        let l = lba - z.first_lba + z.deadspace;
        let p = self.phys(z, l);
        if !z.remaps.is_empty() {
            if let Ok(i) = z.remaps.binary_search_by_key(&p, |r| r.0) {
                // A remapped defect: the block is alone on its replacement sector.
                return Some(Mapped {
                    pbn: self.pbn_of(z, z.remaps[i].1),
                    zone: zi,
                    run: 1,
                });
            }
        }
        let pbn = self.pbn_of(z, p);
        // Longest k with phys(l + k - 1) == p + k - 1 on the same track (phys is strictly
        // increasing, so equality means no gap in between).
        let left_on_track = u64::from(z.spt - pbn.sector);
        let left_in_zone = z.first_lba + z.blocks - lba;
        let max = left_on_track.min(left_in_zone);
        let ok = |k: u64| self.phys(z, l + k - 1) == p + k - 1;
        let run = if ok(max) {
            max
        } else {
            let (mut lo, mut hi) = (1u64, max); // ok(lo), !ok(hi)
            while hi - lo > 1 {
                let mid = (lo + hi) / 2;
                if ok(mid) {
                    lo = mid
                } else {
                    hi = mid
                }
            }
            lo
        };
        // A remapped defect inside the run ends it (the sectors after it do not move, so
        // the test above cannot see it).
        let next_defect = z.remaps.partition_point(|r| r.0 <= p);
        let run = match z.remaps.get(next_defect) {
            Some(&(d, _)) if d < p + run => d - p,
            _ => run,
        };
        Some(Mapped {
            pbn,
            zone: zi,
            run: run as u32,
        })
    }

    /// Angular position (fraction of a revolution, 0..1) where physical sector `pbn` starts.
    pub fn angle(&self, zone: usize, pbn: Pbn) -> f64 {
        let z = &self.zones[zone];
        let c = u64::from(pbn.cyl - z.first_cyl);
        // Skew accumulates over the tracks in LBA order (a serpentine cylinder's first
        // track is on its last surface).
        let nth = self.surface(z, pbn.cyl, pbn.head);
        let switches = u64::from(nth) + u64::from(self.surfaces - 1) * c;
        let mut pos = z.first_offset
            + switches as f64 * z.track_skew
            + c as f64 * z.cyl_skew
            + f64::from(pbn.sector);
        // Schemes that slip within a cylinder or track push the skew on by one sector per slip
        // before this track.
        if matches!(
            self.sparing,
            Sparing::PerCylinder { .. } | Sparing::PerTrack
        ) {
            // (Remapped defects do not move the skew.)
            let mut tracks = c * u64::from(self.surfaces);
            if self.sparing == Sparing::PerTrack {
                tracks += u64::from(nth);
            }
            let cutoff = tracks * u64::from(z.spt);
            pos += z.slips.iter().filter(|&&s| s < cutoff).count() as f64;
        }
        super::mech::frac(pos / f64::from(z.spt))
    }

    /// Sectors per track at an LBA's zone.
    pub fn spt_at(&self, lba: u64) -> Option<u32> {
        self.zone_of(lba).map(|z| self.zones[z].spt)
    }

    /// Last LBA (exclusive) of the track and cylinder holding `lba` (for read-ahead limits).
    pub fn track_end(&self, lba: u64) -> u64 {
        match self.map(lba) {
            Some(m) => lba + u64::from(m.run),
            None => lba,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(first: u32, last: u32, spt: u32, spares: u64, slips: Vec<u64>) -> Zone {
        Zone {
            first_cyl: first,
            last_cyl: last,
            spt,
            first_offset: 0.0,
            track_skew: 10.0,
            cyl_skew: 20.0,
            deadspace: 0,
            spares,
            slips,
            remaps: Vec::new(),
            first_lba: 0,
            blocks: 0,
        }
    }

    #[test]
    fn serpentine_mappings_reverse_every_other_cylinder_and_keep_the_skew_in_lba_order() {
        // Two zones of 2 surfaces and 10 sectors: cylinders 0..=2 and 3..=5.
        let z = || vec![zone(0, 2, 10, 0, vec![]), zone(3, 5, 10, 0, vec![])];
        let conv = Layout::new(2, 6, Sparing::None, z()).unwrap();
        let pbn = |l: &Layout, lba: u64| {
            let p = l.map(lba).unwrap().pbn;
            (p.cyl, p.head, p.sector)
        };
        for mapping in [Mapping::SerpentineInZone, Mapping::SerpentineOddCylinders] {
            let l = conv.clone().with_mapping(mapping);
            check_bijective(&l);
            // Cylinder 1 (odd, second of its zone) runs backwards: its first track is on
            // the last surface, where cylinder 0 ended: a cylinder switch, no head switch.
            assert_eq!(pbn(&l, 19), (0, 1, 9));
            assert_eq!(pbn(&l, 20), (1, 1, 0));
            assert_eq!(pbn(&l, 30), (1, 0, 0));
            assert_eq!(pbn(&l, 40), (2, 0, 0));
            // The skew counts tracks in LBA order, as the conventional layout does.
            for lba in [20, 25, 30, 45, 67] {
                let (a, b) = (l.map(lba).unwrap(), conv.map(lba).unwrap());
                assert!((l.angle(a.zone, a.pbn) - conv.angle(b.zone, b.pbn)).abs() < 1e-12);
                assert_eq!(a.run, b.run);
            }
        }
        // The two differ where a zone starts on an odd cylinder: scheme 1 starts each zone
        // forwards, scheme 2 follows the cylinder's number.
        let in_zone = conv.clone().with_mapping(Mapping::SerpentineInZone);
        let odd = conv.clone().with_mapping(Mapping::SerpentineOddCylinders);
        assert_eq!(pbn(&in_zone, 60), (3, 0, 0));
        assert_eq!(pbn(&odd, 60), (3, 1, 0));
        assert_eq!(pbn(&conv, 60), (3, 0, 0));
        assert!(Mapping::from_disksim(3).is_err());
    }

    /// Every LBA maps to a distinct sector that is neither a slip nor a remapped defect, and
    /// runs cover consecutive LBAs on consecutive sectors of one track.
    fn check_bijective(l: &Layout) {
        let mut seen = std::collections::HashSet::new();
        for lba in 0..l.blocks {
            let m = l.map(lba).unwrap();
            let z = &l.zones[m.zone];
            let spt = u64::from(z.spt);
            let p = u64::from(m.pbn.cyl - z.first_cyl) * spt * u64::from(l.surfaces)
                + u64::from(m.pbn.head) * spt
                + u64::from(m.pbn.sector);
            assert!(seen.insert((m.zone, p)), "LBA {lba}: sector {p} used twice");
            assert!(!z.slips.contains(&p), "LBA {lba} on slipped sector {p}");
            assert!(
                !z.remaps.iter().any(|r| r.0 == p),
                "LBA {lba} on defect {p}"
            );
            for k in 1..u64::from(m.run) {
                let n = l.map(lba + k).unwrap().pbn;
                assert_eq!(
                    (n.cyl, n.head, n.sector),
                    (m.pbn.cyl, m.pbn.head, m.pbn.sector + k as u32),
                    "run of LBA {lba}"
                );
            }
        }
    }

    #[test]
    fn spares_at_the_front_of_each_cylinder() {
        // 2 surfaces x 10 spt = 20 sectors per cylinder, the first 2 spare (scheme 5).
        let s5 = Sparing::from_disksim(5, 1).unwrap();
        let l = Layout::new(2, 4, s5, vec![zone(0, 3, 10, 2, vec![])]).unwrap();
        assert_eq!(l.blocks, 4 * 18);
        let at = |lba| {
            let p = l.map(lba).unwrap().pbn;
            (p.cyl, p.head, p.sector)
        };
        assert_eq!(
            at(0),
            (0, 0, 2),
            "the cylinder's first two sectors are spares"
        );
        assert_eq!(l.map(0).unwrap().run, 8);
        assert_eq!(at(8), (0, 1, 0));
        assert_eq!(at(17), (0, 1, 9));
        assert_eq!(at(18), (1, 0, 2));
        check_bijective(&l);
        // A slip on sector 5 of cylinder 1 (zone sector 25) uses a spare of cylinder 1: its
        // data start one sector earlier and skip the slip; cylinder 2 does not move.
        let l = Layout::new(2, 4, s5, vec![zone(0, 3, 10, 2, vec![25])]).unwrap();
        assert_eq!(l.blocks, 4 * 18);
        let at = |lba| {
            let p = l.map(lba).unwrap().pbn;
            (p.cyl, p.head, p.sector)
        };
        assert_eq!(at(18), (1, 0, 1));
        assert_eq!(at(18 + 3), (1, 0, 4));
        assert_eq!(at(18 + 4), (1, 0, 6));
        assert_eq!(at(35), (1, 1, 9));
        assert_eq!(at(36), (2, 0, 2));
        check_bijective(&l);
        // Slip to the end (scheme 6): the same slip shifts every later block; the zone
        // holds one block less.
        let s6 = Sparing::from_disksim(6, 1).unwrap();
        let l = Layout::new(2, 4, s6, vec![zone(0, 3, 10, 2, vec![25])]).unwrap();
        assert_eq!(l.blocks, 4 * 18 - 1);
        let at = |lba| {
            let p = l.map(lba).unwrap().pbn;
            (p.cyl, p.head, p.sector)
        };
        assert_eq!(at(21), (1, 0, 6));
        assert_eq!(
            at(35),
            (2, 0, 2),
            "the last block of cylinder 1 moved to cylinder 2"
        );
        check_bijective(&l);
        // More slips on a cylinder than it has spares is refused.
        assert!(Layout::new(2, 4, s5, vec![zone(0, 3, 10, 2, vec![21, 22, 23])]).is_err());
    }

    #[test]
    fn spares_at_the_end_of_each_cylinder_keep_slips_on_their_cylinder() {
        let s2 = Sparing::from_disksim(2, 1).unwrap();
        // Slip on the last data sector's neighbour: cylinder 0 sector 17 (of 18 data).
        let l = Layout::new(2, 4, s2, vec![zone(0, 3, 10, 2, vec![17])]).unwrap();
        let p = l.map(17).unwrap().pbn;
        assert_eq!(
            (p.cyl, p.head, p.sector),
            (0, 1, 8),
            "the slip uses cylinder 0's spare"
        );
        let p = l.map(18).unwrap().pbn;
        assert_eq!((p.cyl, p.head, p.sector), (1, 0, 0));
        check_bijective(&l);
    }

    #[test]
    fn remapped_defects_move_one_block_to_its_spare() {
        // Spares at the end of each cylinder (scheme 2, 2 per cylinder: sectors 18, 19 of
        // each); sector 5 is bad and remapped to spare 18.
        let s2 = Sparing::from_disksim(2, 1).unwrap();
        let mut z = zone(0, 3, 10, 2, vec![]);
        z.remaps = vec![(5, 18)];
        let l = Layout::new(2, 4, s2, vec![z]).unwrap();
        assert_eq!(l.blocks, 4 * 18, "remapping takes no extra capacity");
        let m = l.map(5).unwrap();
        assert_eq!((m.pbn.cyl, m.pbn.head, m.pbn.sector), (0, 1, 8));
        assert_eq!(m.run, 1);
        // The neighbours keep their places; a run stops before the defect.
        assert_eq!(l.map(4).unwrap().pbn.sector, 4);
        assert_eq!(l.map(6).unwrap().pbn.sector, 6);
        assert_eq!(l.map(0).unwrap().run, 5);
        assert_eq!(l.map(6).unwrap().run, 4);
        check_bijective(&l);
        // Reading across the defect costs an extra trip: see hdd::tests.
        let mut z = zone(0, 3, 10, 2, vec![]);
        z.remaps = vec![(5, 18), (6, 18)];
        assert!(
            Layout::new(2, 4, s2, vec![z]).is_err(),
            "two defects, one spare sector"
        );
        let mut z = zone(0, 3, 10, 2, vec![]);
        z.remaps = vec![(5, 500)];
        assert!(
            Layout::new(2, 4, s2, vec![z]).is_err(),
            "replacement outside the zone"
        );
    }

    #[test]
    fn plain_mapping_walks_track_then_surface_then_cylinder() {
        let l = Layout::uniform(2, 10, 100, 0.0, 0.0).unwrap();
        assert_eq!(l.blocks, 2000);
        assert_eq!(
            l.map(0).unwrap().pbn,
            Pbn {
                cyl: 0,
                head: 0,
                sector: 0
            }
        );
        assert_eq!(
            l.map(150).unwrap().pbn,
            Pbn {
                cyl: 0,
                head: 1,
                sector: 50
            }
        );
        assert_eq!(
            l.map(250).unwrap().pbn,
            Pbn {
                cyl: 1,
                head: 0,
                sector: 50
            }
        );
        assert_eq!(l.map(250).unwrap().run, 50);
        assert!(l.map(2000).is_none());
    }

    #[test]
    fn skews_accumulate_per_switch() {
        let l = Layout::uniform(2, 10, 100, 10.0, 20.0).unwrap();
        // Track 1 (head switch): skew 10 sectors. Cylinder 1, head 0: one head switch within
        // cylinder 0 (surfaces-1 = 1) plus one cylinder skew = 10 + 20.
        // Sector 95 there: (30 + 95) mod 100 = 25 sectors past the index.
        for (cyl, head, sector, revolutions) in [(0, 1, 0, 0.10), (1, 0, 0, 0.30), (1, 0, 95, 0.25)]
        {
            let pbn = Pbn { cyl, head, sector };
            let angle = l.angle(0, pbn);
            assert!((angle - revolutions).abs() < 1e-12, "{pbn:?}: {angle}");
        }
    }

    #[test]
    fn range_sparing_with_a_slip() {
        // 2 surfaces x 10 spt = 20 per cylinder, ranges of 2 cylinders (40), 4 spares each.
        let z = zone(0, 3, 10, 4, vec![5]);
        let l = Layout::new(2, 4, Sparing::PerRange { cylinders: 2 }, vec![z]).unwrap();
        assert_eq!(l.blocks, 80 - 8);
        // LBA 4 is before the slip, LBA 5 lands after it.
        assert_eq!(l.map(4).unwrap().pbn.sector, 4);
        assert_eq!(l.map(5).unwrap().pbn.sector, 6);
        assert_eq!(
            l.map(0).unwrap().run,
            5,
            "the run stops at the slipped sector"
        );
        // Range 1 starts at LBA 36 on cylinder 2.
        assert_eq!(
            l.map(36).unwrap().pbn,
            Pbn {
                cyl: 2,
                head: 0,
                sector: 0
            }
        );
    }

    #[test]
    fn track_sparing_skips_slipped_tracks_and_zone_front() {
        let mut z = zone(0, 9, 10, 2, vec![1]);
        z.deadspace = 10;
        let l = Layout::new(2, 10, Sparing::Track, vec![z]).unwrap();
        assert_eq!(l.blocks, 200 - 10 - 20);
        // LBA 0 = zone-relative block 10 = track 1, which is slipped: track 2 = cyl 1 head 0.
        assert_eq!(
            l.map(0).unwrap().pbn,
            Pbn {
                cyl: 1,
                head: 0,
                sector: 0
            }
        );
    }

    #[test]
    fn zones_follow_each_other() {
        let zs = vec![zone(0, 1, 10, 0, vec![]), zone(3, 4, 8, 0, vec![])];
        let l = Layout::new(1, 5, Sparing::None, zs).unwrap();
        assert_eq!(l.blocks, 20 + 16);
        assert_eq!(
            l.map(20).unwrap().pbn,
            Pbn {
                cyl: 3,
                head: 0,
                sector: 0
            }
        );
        assert_eq!(l.zone_of(19), Some(0));
        assert_eq!(l.zone_of(35), Some(1));
    }

    #[test]
    fn bad_layouts_are_refused() {
        assert!(Layout::new(0, 5, Sparing::None, vec![zone(0, 1, 10, 0, vec![])]).is_err());
        assert!(Layout::new(1, 5, Sparing::None, vec![zone(3, 1, 10, 0, vec![])]).is_err());
        assert!(Layout::new(1, 5, Sparing::PerTrack, vec![zone(0, 1, 10, 10, vec![])]).is_err());
    }
}
