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
    /// 2 (4 when slips go to the end of the disk): `spares` sectors at the end of each
    /// cylinder; slips are zone-relative physical sectors.
    PerCylinder { slip_to_end: bool },
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
            2 => Sparing::PerCylinder { slip_to_end: false },
            3 => Sparing::PerTrack,
            4 => Sparing::PerCylinder { slip_to_end: true },
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
            5 | 6 => bail!(
                "sparing scheme {scheme} (spares at the front of each cylinder) is not supported"
            ),
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
    /// First LBA of the zone and number of LBAs it holds (computed).
    pub first_lba: u64,
    pub blocks: u64,
}

impl Zone {
    pub fn cylinders(&self) -> u32 {
        self.last_cyl - self.first_cyl + 1
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

#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    pub surfaces: u32,
    pub cylinders: u32,
    pub sparing: Sparing,
    pub zones: Vec<Zone>,
    pub blocks: u64,
}

impl Layout {
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
            let cyls = u64::from(z.cylinders());
            let per_track = u64::from(z.spt);
            let phys = cyls * per_track * u64::from(surfaces);
            let taken = z.deadspace
                + match sparing {
                    Sparing::None => 0,
                    Sparing::Track => z.spares * per_track,
                    Sparing::PerCylinder { slip_to_end: false } => z.spares * cyls,
                    Sparing::PerCylinder { slip_to_end: true } => {
                        z.spares * cyls + z.slips.len() as u64
                    }
                    Sparing::PerTrack => z.spares * cyls * u64::from(surfaces),
                    Sparing::AtEnd => z.slips.len() as u64,
                    Sparing::PerRange { cylinders } => z.spares * (cyls / u64::from(cylinders)),
                    Sparing::PerZone { slip_to_end: false } => z.spares,
                    Sparing::PerZone { slip_to_end: true } => z.spares + z.slips.len() as u64,
                };
            if taken >= phys {
                bail!("zone {i}: spares and reserved space ({taken}) leave no room for data");
            }
            if let Sparing::PerCylinder { .. } | Sparing::PerRange { .. } | Sparing::PerTrack =
                sparing
            {
                let region = match sparing {
                    Sparing::PerTrack => per_track,
                    Sparing::PerCylinder { .. } => per_track * u64::from(surfaces),
                    Sparing::PerRange { cylinders } => {
                        per_track * u64::from(surfaces) * u64::from(cylinders)
                    }
                    _ => unreachable!(),
                };
                if z.spares >= region {
                    bail!(
                        "zone {i}: {} spares per region of {region} sectors",
                        z.spares
                    );
                }
            }
            z.first_lba = lba;
            z.blocks = phys - taken;
            lba += z.blocks;
        }
        Ok(Layout {
            surfaces,
            cylinders,
            sparing,
            zones,
            blocks: lba,
        })
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
                for &s in &z.slips {
                    if s <= track {
                        track += 1;
                    }
                }
                track * spt + l % spt
            }
            Sparing::PerTrack => {
                let per = spt - z.spares;
                let track = l / per;
                let mut r = l % per;
                let first = track * spt;
                let mut slips = 0;
                for &s in &z.slips {
                    if s >= first && s - first <= r + slips {
                        slips += 1;
                    }
                }
                r += slips;
                track * spt + r
            }
            Sparing::PerCylinder { slip_to_end } => {
                let percyl = spt * surf;
                let per = percyl - z.spares;
                let mut cyl = l / per;
                let mut r = l % per;
                let first = cyl * percyl;
                let mut slips = 0;
                for &s in &z.slips {
                    if (slip_to_end && s / percyl < cyl) || (s >= first && s - first <= r + slips) {
                        slips += 1;
                    }
                }
                r += slips;
                cyl += r / per;
                r %= per;
                cyl * percyl + r
            }
            Sparing::AtEnd | Sparing::PerZone { .. } => {
                // Each slip at or before the (shifted) position pushes the block one further.
                let mut p = l;
                for &s in &z.slips {
                    if s <= p {
                        p += 1;
                    }
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
                for &s in &z.slips {
                    if s >= first && s - first <= r + slips {
                        slips += 1;
                    }
                }
                range * perrange + r + slips
            }
        }
    }

    fn pbn_of(&self, z: &Zone, p: u64) -> Pbn {
        let spt = u64::from(z.spt);
        let percyl = spt * u64::from(self.surfaces);
        Pbn {
            cyl: z.first_cyl + (p / percyl) as u32,
            head: ((p % percyl) / spt) as u32,
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
        let switches = u64::from(pbn.head) + u64::from(self.surfaces - 1) * c;
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
            let mut tracks = c * u64::from(self.surfaces);
            if self.sparing == Sparing::PerTrack {
                tracks += u64::from(pbn.head);
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
            first_lba: 0,
            blocks: 0,
        }
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
        assert!(
            (l.angle(
                0,
                Pbn {
                    cyl: 0,
                    head: 1,
                    sector: 0
                }
            ) - 0.10)
                .abs()
                < 1e-12
        );
        assert!(
            (l.angle(
                0,
                Pbn {
                    cyl: 1,
                    head: 0,
                    sector: 0
                }
            ) - 0.30)
                .abs()
                < 1e-12
        );
        assert!(
            (l.angle(
                0,
                Pbn {
                    cyl: 1,
                    head: 0,
                    sector: 95
                }
            ) - 0.25)
                .abs()
                < 1e-12
        );
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
