//! The parameters of our HDD model, and their loading from DiskSim 4.0 files.
//!
//! Every field is documented with its unit; the DiskSim parameter it comes from is named in
//! brackets.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::layout::{Layout, Mapping, Sparing, Zone};
use super::mech::{Mech, SeekCurve};
use super::params::{self, Block, ParamFile, Value};
use crate::sched::Policy;

/// Command-processing overheads of the drive's controller (ms).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Overheads {
    /// Added to every request on arrival [Per-request overhead time].
    pub per_request: f64,
    /// Read served from the cache, previous request a read / a write [Read hit over. after ...].
    pub read_hit_after_read: f64,
    pub read_hit_after_write: f64,
    /// Read that needs the media [Read miss over. after ...].
    pub read_miss_after_read: f64,
    pub read_miss_after_write: f64,
    /// Write reported complete from the cache (write-back) [Write hit over. after ...].
    pub write_hit_after_read: f64,
    pub write_hit_after_write: f64,
    /// Write reported complete only once on the media [Write miss over. after ...].
    pub write_miss_after_read: f64,
    pub write_miss_after_write: f64,
    /// Before the completion message [Read/Write completion overhead].
    pub read_completion: f64,
    pub write_completion: f64,
    /// Before the first data transfer on the bus [Data preparation overhead].
    pub data_prep: f64,
    /// Every reconnection to the host before sending data read from the media [First
    /// reselect overhead] (DiskSim's code charges it on each, not only the first).
    pub reselect: f64,
    /// A read's disconnection when its buffer runs dry, previous request a read / a write
    /// [Read disconnect afterread / afterwrite].
    pub read_disconnect_after_read: f64,
    pub read_disconnect_after_write: f64,
    /// A write's disconnection when its segment is full [Write disconnect overhead], and
    /// for a drive with an extra write disconnect [Extradisc 2nd disconnect overhead].
    pub write_disconnect: f64,
    pub extradisc_write_disconnect: f64,
    /// Reconnection of a drive with an extra write disconnect [Other reselect overhead].
    pub reselect_other: f64,
    /// A nonsequential write waits at least this long before touching the media [Minimum seek delay].
    pub min_seek_delay: f64,
    /// Drives that disconnect before taking a write's data [Extra write disconnect and the
    /// "Extradisc" parameters]: (command overhead, delay until the data is requested
    /// (disconnect + inter-disconnect delay), delay before positioning starts).
    pub extra_write_disconnect: Option<(f64, f64, f64)>,
}

/// The on-board buffer/cache.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheSpec {
    /// Use the buffer as a cache [Enable caching in buffer].
    pub enabled: bool,
    /// Number of segments [Number of buffer segments].
    pub segments: usize,
    /// Sectors per segment [Segment size (in blks)].
    pub segment_sectors: u64,
    /// Segments that may hold write data [Maximum number of write segments].
    pub max_write_segments: usize,
    /// [Use separate write segment]: read, without effect, as in DiskSim 4.0 (which never
    /// sets it): no segment is reserved for writes.
    pub separate_write_segment: bool,
    /// Read-ahead extent: 0 none, 1 to end of track, 2 to end of cylinder, 3 until the segment
    /// is full, 4 DEC's: to the end of the track after the request, one track further for a
    /// stream that crossed tracks, the segment sliding [Buffer continuous read].
    pub prefetch: u8,
    /// Sectors [Minimum read-ahead (blks)] / [Maximum read-ahead (blks)].
    pub min_readahead: u64,
    pub max_readahead: u64,
    /// Read-ahead may push the just-read data out of the segment [Read-ahead over requested].
    pub readahead_over_requested: bool,
    /// With it, the data just returned stays in the segment until read-ahead fills it, as
    /// DiskSim 4.0's code runs the value 1 (it erases the data only for -1). Off (the data
    /// is dropped at once) for the real-disk validation, where it was chosen on the real
    /// drives: DiskSim's rule there gives the Barracuda and Cheetah 4LP DiskSim's own
    /// demerits (0.350, 0.319 ms) against 0.314 and 0.289. On for systems (`system/`), which
    /// are checked against DiskSim itself.
    pub keep_returned_data: bool,
    /// Start read-ahead after a full hit when the mechanism is idle [Read-ahead on idle hit].
    pub readahead_on_idle_hit: bool,
    /// A request stops a running read-ahead at once, in the middle of a sector, instead of
    /// at the end of the sector under the head [Stop prefetch in sector].
    pub stop_prefetch_in_sector: bool,
    /// Read sectors that pass under the head before the requested ones [Read any free blocks].
    /// Parsed but without effect: the IBM 18ES trace, whose drive sets it, shows no cache hits
    /// on such sectors (backward re-reads all miss), so they are not kept.
    pub read_any_free_blocks: bool,
    /// 0 write-through, 1 write-back of sequential streams, 2 write-back always [Fast write level].
    /// With one request at a time (DiskSim's validation) 1 and 2 both report a write
    /// complete once its data is in the buffer.
    pub fast_write: u8,
    /// Reads may hit data left by writes [Allow read hits on write data].
    pub read_hits_on_write_data: bool,
    /// A write that appends to the data being written joins it [Combine seq writes].
    pub combine_seq_writes: bool,
    /// A read reconnects when this fraction of the request (or of the segment, see
    /// `watermark_by_request`) is in the buffer past what was sent [High (read) water mark].
    pub read_watermark: f64,
    /// The water mark is a fraction of the request, not of the segment [Set watermark by
    /// reqsize].
    pub watermark_by_request: bool,
    /// The drive keeps the bus when a read's buffer runs dry and waits for the media
    /// [Hold bus entire read xfer]; otherwise it disconnects and reconnects at the water
    /// mark (see `bus.rs` for DiskSim's rules).
    pub hold_bus_read: bool,
    /// A write reconnects when no more than this fraction of the request (or segment) is
    /// left in the buffer to write [Low (write) water mark].
    pub write_watermark: f64,
    /// The drive keeps the bus while a write's segment is full [Hold bus entire write xfer].
    pub hold_bus_write: bool,
}

/// Everything the HDD model needs.
#[derive(Clone, Debug, PartialEq)]
pub struct HddSpec {
    pub name: String,
    pub layout: Layout,
    pub mech: Mech,
    /// Interface time per sector (ms): the slowest of disk, bus and controller
    /// [Bulk sector transfer time; bus Read/Write block transfer time].
    pub bus_read_ms: f64,
    pub bus_write_ms: f64,
    /// Multiplies every overhead [Time scale for overheads].
    pub overhead_scale: f64,
    pub overheads: Overheads,
    pub cache: CacheSpec,
    /// Requests the drive accepts at once [Max queue length].
    pub queue_depth: usize,
    /// The drive's own scheduler [Scheduler / Scheduling policy].
    pub scheduler: Policy,
}

fn flag(b: &Block, k: &str) -> Result<bool> {
    Ok(b.num(k)? != 0.0)
}

/// A value in `min..=1e6`.
fn at_least(b: &Block, k: &str, min: f64) -> Result<f64> {
    let v = b.num(k)?;
    if !(min..=1e6).contains(&v) {
        bail!(
            "{}: '{k}' = {v} is out of range ({min}..1e6)",
            b.file.display()
        );
    }
    Ok(v)
}

fn nonneg(b: &Block, k: &str) -> Result<f64> {
    at_least(b, k, 0.0)
}

/// A time in ms that may be negative (down to a second below zero).
fn signed_ms(b: &Block, k: &str) -> Result<f64> {
    at_least(b, k, -1e3)
}

fn count(b: &Block, k: &str, max: f64) -> Result<u64> {
    let v = b.num(k)?;
    if !(0.0..=max).contains(&v) || v.fract() != 0.0 {
        bail!(
            "{}: '{k}' = {v} must be a whole number in 0..={max}",
            b.file.display()
        );
    }
    Ok(v as u64)
}

impl HddSpec {
    /// Loads a disk from a DiskSim `.parv` (whole configuration, which sources the
    /// `.diskspecs`) or a `.diskspecs` file. Bus and controller transfer times are read from
    /// a `.parv` when present. `disk_name` picks one `disksim_disk` block when several exist.
    pub fn from_disksim(path: &Path, disk_name: Option<&str>) -> Result<HddSpec> {
        let pf = params::parse_file(path)?;
        let disks: Vec<&Block> = pf.find("disksim_disk").collect();
        let disk = match disk_name {
            Some(n) => pf
                .by_name(n)
                .with_context(|| format!("{}: no disk named {n}", path.display()))?,
            None => {
                // The instantiated disk if the file says, else the only one.
                let inst = pf
                    .instances
                    .iter()
                    .find_map(|(_, ty)| disks.iter().find(|d| &d.name == ty));
                match (inst, disks.len()) {
                    (Some(d), _) => d,
                    (None, 1) => disks[0],
                    (None, 0) => bail!("{}: no disksim_disk block", path.display()),
                    (None, n) => bail!("{}: {n} disks, name one", path.display()),
                }
            }
        };
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Self::from_blocks(disk, &pf, &dir)
    }

    pub(crate) fn from_blocks(d: &Block, pf: &ParamFile, dir: &Path) -> Result<HddSpec> {
        let model = d.block("Model")?;
        let layout_b = model.block("Layout Model")?;
        let mech_b = model.block("Mechanical Model")?;
        let layout = layout_from(model, layout_b)?;
        let mech = mech_from(mech_b, dir, layout.cylinders)?;
        let (bus_read_ms, bus_write_ms) = bus_times(d, pf)?;
        let overheads = overheads_from(d)?;
        let cache = cache_from(d)?;
        let sched = d.block("Scheduler")?;
        Ok(HddSpec {
            name: d.name.clone(),
            layout,
            mech,
            bus_read_ms,
            bus_write_ms,
            overhead_scale: nonneg(d, "Time scale for overheads")?,
            overheads,
            cache,
            queue_depth: (count(d, "Max queue length", 1e6)? as usize).max(1),
            scheduler: Policy::from_disksim(count(sched, "Scheduling policy", 1000.0)? as u32)?,
        })
    }

    /// Capacity in sectors.
    pub fn blocks(&self) -> u64 {
        self.layout.blocks
    }
}

fn params_path(dir: &Path, file: &Path, name: &str) -> Result<PathBuf> {
    let p = Path::new(name);
    if p.is_absolute()
        || p.components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        bail!(
            "{}: '{name}' must be a relative name inside the parameter directory",
            file.display()
        );
    }
    let base = file.parent().unwrap_or(dir);
    Ok(base.join(p))
}

/// The layout of a disk's `Model` block: zones, sparing and mapping of its `Layout Model`.
fn layout_from(model: &Block, layout_b: &Block) -> Result<Layout> {
    let surfaces = count(model, "Number of data surfaces", 1024.0)? as u32;
    let cylinders = count(model, "Number of cylinders", 10_000_000.0)? as u32;
    if layout_b.ty != "dm_layout_g1" {
        bail!(
            "{}: layout model '{}' not supported (dm_layout_g1 is)",
            layout_b.file.display(),
            layout_b.ty
        );
    }
    let mapping = Mapping::from_disksim(count(layout_b, "LBN-to-PBN mapping scheme", 10.0)? as u32)
        .with_context(|| layout_b.file.display().to_string())?;
    let sparing = Sparing::from_disksim(
        count(layout_b, "Sparing scheme used", 100.0)? as u32,
        layout_b.num_or("Rangesize for sparing", 1.0)? as u32,
    )?;
    let revolutions =
        matches!(layout_b.get("Skew units"), Some(Value::Word(w)) if w == "revolutions");
    let mut zones = Vec::new();
    for (i, zv) in layout_b.list("Zones")?.iter().enumerate() {
        let Value::Block(z) = zv else {
            bail!("{}: zone {i} is not a block", layout_b.file.display())
        };
        zones.push(zone_from(z, i, revolutions)?);
    }
    // The HP C2490A's file ends its last zone on cylinder 2629 of "2629 cylinders"
    // (DiskSim does not check): a count one short is taken as the zones say.
    let mut cylinders = cylinders;
    if zones.iter().map(|z| z.last_cyl).max() == Some(cylinders) {
        tracing::warn!(
            "{}: the last zone ends on cylinder {cylinders}, one past 'Number of cylinders' \
             = {cylinders}: taken as {} cylinders",
            layout_b.file.display(),
            cylinders + 1
        );
        cylinders += 1;
    }
    Ok(Layout::new(surfaces, cylinders, sparing, zones)
        .with_context(|| format!("{}", layout_b.file.display()))?
        .with_mapping(mapping))
}

/// Zone `i` of a layout; skews in revolutions when the zone says so, else when the layout
/// does (`revolutions`).
fn zone_from(z: &Block, i: usize, revolutions: bool) -> Result<Zone> {
    let spt = count(z, "Blocks per track", 100_000.0)? as u32;
    let zrev = match z.get("Skew units") {
        Some(Value::Word(w)) => w == "revolutions",
        _ => revolutions,
    };
    let unit = if zrev { f64::from(spt) } else { 1.0 };
    let nums = |k: &str| -> Result<Vec<u64>> {
        z.nums(k)?
            .into_iter()
            .map(|v| {
                if v >= 0.0 && v.fract() == 0.0 {
                    Ok(v as u64)
                } else {
                    bail!("{}: bad {k} entry {v}", z.file.display())
                }
            })
            .collect()
    };
    let defects = nums("defects").unwrap_or_default();
    // (defect, replacement) pairs; a defect "remapped" to itself changes nothing.
    if defects.len() % 2 != 0 {
        bail!(
            "{}: zone {i}: defects must be (defect, replacement) pairs",
            z.file.display()
        );
    }
    let remaps = defects
        .chunks(2)
        .filter(|p| p[0] != p[1])
        .map(|p| (p[0], p[1]))
        .collect();
    Ok(Zone {
        first_cyl: count(z, "First cylinder number", 1e7)? as u32,
        last_cyl: count(z, "Last cylinder number", 1e7)? as u32,
        spt,
        first_offset: z.num("Offset of first block")? * unit,
        track_skew: z.num_or("Skew for track switch", 0.0)? * unit,
        cyl_skew: z.num_or("Skew for cylinder switch", 0.0)? * unit,
        deadspace: count(z, "Empty space at zone front", 1e12)?,
        spares: count(z, "Number of spares", 1e12)?,
        slips: nums("slips")?,
        remaps,
        first_lba: 0,
        blocks: 0,
    })
}

/// The mechanism of a `Mechanical Model` block over `cylinders` (its seek curve's files
/// relative to the parameter file's directory, else `dir`).
fn mech_from(mech_b: &Block, dir: &Path, cylinders: u32) -> Result<Mech> {
    let seek = seek_from(mech_b, dir, cylinders)?;
    seek.validate()?;
    match mech_b.word("Access time type")? {
        "trackSwitchPlusRotation" => {}
        other => bail!(
            "{}: access time type '{other}' not supported (trackSwitchPlusRotation is)",
            mech_b.file.display()
        ),
    }
    let rpm = mech_b.num("Rotation speed (in rpms)")?;
    if !(100.0..=100_000.0).contains(&rpm) {
        bail!(
            "{}: implausible rotation speed {rpm} rpm",
            mech_b.file.display()
        );
    }
    Ok(Mech {
        seek,
        head_switch: nonneg(mech_b, "Head switch time")?,
        write_settle: signed_ms(mech_b, "Add. write settling delay")?,
        rpm,
    })
}

fn seek_from(mech_b: &Block, dir: &Path, cylinders: u32) -> Result<SeekCurve> {
    Ok(match mech_b.word("Seek type")? {
        "extracted" => {
            let f = mech_b.word("Full seek curve")?;
            let p = params_path(dir, &mech_b.file, f)?;
            SeekCurve::Table(params::parse_seek_file(&p)?)
        }
        kind @ ("hpl" | "hplplus10") => {
            let v = mech_b.nums("HPL seek equation values")?;
            if v.len() < 6 {
                bail!(
                    "{}: HPL seek equation needs 6 values",
                    mech_b.file.display()
                );
            }
            let (boundary, a, b, c, e) = (v[0] as u32, v[1], v[2], v[3], v[4]);
            if kind == "hpl" {
                let one = if v[5] == -1.0 {
                    Some(nonneg(mech_b, "Single cylinder seek time")?)
                } else {
                    Some(v[5])
                };
                return Ok(SeekCurve::Hpl {
                    boundary,
                    a,
                    b,
                    c,
                    e,
                    one,
                });
            }
            let f = mech_b.nums("First ten seek times")?;
            if f.len() < 10 {
                bail!(
                    "{}: 'First ten seek times' needs 10 values",
                    mech_b.file.display()
                );
            }
            let mut first10 = [0.0; 10];
            first10.copy_from_slice(&f[..10]);
            SeekCurve::HplPlus10 {
                first10,
                boundary,
                a,
                b,
                c,
                e,
            }
        }
        "constant" => SeekCurve::Constant(nonneg(mech_b, "Constant seek time")?),
        "linear" | "curve" => SeekCurve::ThreePoint {
            single: nonneg(mech_b, "Single cylinder seek time")?,
            average: nonneg(mech_b, "Average seek time")?,
            full: nonneg(mech_b, "Full strobe seek time")?,
            cylinders,
        },
        other => bail!(
            "{}: seek type '{other}' not supported",
            mech_b.file.display()
        ),
    })
}

/// DiskSim's controller types whose own "Bulk sector transfer time" bounds a transfer from
/// the disk: 2 (53C700-based, `controller_53c700_data_transfer`) and 3 (smart). A pass-thru
/// controller (1) forwards the disk's transfer without a time of its own
/// (`controller_passthru_event_arrive`).
const CTLR_TYPES_WITH_TRANSFER_TIME: [f64; 2] = [2.0, 3.0];

/// The interface's time per sector (read, write), as DiskSim's `disk_get_blktranstime` and
/// its controllers take it: the slowest of the disk's "Bulk sector transfer time", the
/// buses' block transfer times and, for 53C700 and smart controllers, the controller's
/// bulk sector time (not multiplied by its "Scale for delays", which scales only its
/// overheads). The topology is not read, so every bus counts, not only the disk's own.
fn bus_times(d: &Block, pf: &ParamFile) -> Result<(f64, f64)> {
    let mut bus_read = nonneg(d, "Bulk sector transfer time")?;
    let mut bus_write = bus_read;
    for b in pf.find("disksim_bus") {
        bus_read = bus_read.max(b.num_or("Read block transfer time", 0.0)?);
        bus_write = bus_write.max(b.num_or("Write block transfer time", 0.0)?);
    }
    for c in pf.find("disksim_ctlr") {
        if !CTLR_TYPES_WITH_TRANSFER_TIME.contains(&c.num_or("type", 1.0)?) {
            continue;
        }
        let t = c.num_or("Bulk sector transfer time", 0.0)?;
        bus_read = bus_read.max(t);
        bus_write = bus_write.max(t);
    }
    Ok((bus_read, bus_write))
}

/// `NAME after read` and `NAME after write`, the overheads DiskSim gives by previous request.
fn after_read_write(d: &Block, name: &str) -> Result<(f64, f64)> {
    Ok((
        nonneg(d, &format!("{name} after read"))?,
        nonneg(d, &format!("{name} after write"))?,
    ))
}

fn overheads_from(d: &Block) -> Result<Overheads> {
    let extra_write_disconnect = if flag(d, "Extra write disconnect")? {
        Some((
            nonneg(d, "Extradisc command overhead")?,
            nonneg(d, "Extradisc disconnect overhead")?
                + nonneg(d, "Extradisc inter-disconnect delay")?,
            nonneg(d, "Extradisc seek delta")?,
        ))
    } else {
        None
    };
    let per_request = nonneg(d, "Per-request overhead time")?;
    let (read_hit_after_read, read_hit_after_write) = after_read_write(d, "Read hit over.")?;
    let (read_miss_after_read, read_miss_after_write) = after_read_write(d, "Read miss over.")?;
    let (write_hit_after_read, write_hit_after_write) = after_read_write(d, "Write hit over.")?;
    let (write_miss_after_read, write_miss_after_write) = after_read_write(d, "Write miss over.")?;
    Ok(Overheads {
        per_request,
        read_hit_after_read,
        read_hit_after_write,
        read_miss_after_read,
        read_miss_after_write,
        write_hit_after_read,
        write_hit_after_write,
        write_miss_after_read,
        write_miss_after_write,
        read_completion: nonneg(d, "Read completion overhead")?,
        write_completion: nonneg(d, "Write completion overhead")?,
        data_prep: nonneg(d, "Data preparation overhead")?,
        reselect: nonneg(d, "First reselect overhead")?,
        read_disconnect_after_read: nonneg(d, "Read disconnect afterread")?,
        read_disconnect_after_write: nonneg(d, "Read disconnect afterwrite")?,
        write_disconnect: nonneg(d, "Write disconnect overhead")?,
        extradisc_write_disconnect: d.num_or("Extradisc 2nd disconnect overhead", 0.0)?.max(0.0),
        reselect_other: nonneg(d, "Other reselect overhead")?,
        min_seek_delay: d.num_or("Minimum seek delay", 0.0)?.max(0.0),
        extra_write_disconnect,
    })
}

fn cache_from(d: &Block) -> Result<CacheSpec> {
    let segments = count(d, "Number of buffer segments", 4096.0)? as usize;
    Ok(CacheSpec {
        enabled: flag(d, "Enable caching in buffer")? && segments > 0,
        segments: segments.max(1),
        segment_sectors: count(d, "Segment size (in blks)", 1e9)?.max(1),
        max_write_segments: (count(d, "Maximum number of write segments", 4096.0)? as usize).max(1),
        separate_write_segment: flag(d, "Use separate write segment")?,
        prefetch: count(d, "Buffer continuous read", 4.0)? as u8,
        min_readahead: count(d, "Minimum read-ahead (blks)", 1e9)?,
        max_readahead: count(d, "Maximum read-ahead (blks)", 1e9)?,
        readahead_over_requested: flag(d, "Read-ahead over requested")?,
        keep_returned_data: false,
        readahead_on_idle_hit: flag(d, "Read-ahead on idle hit")?,
        stop_prefetch_in_sector: flag(d, "Stop prefetch in sector")?,
        read_any_free_blocks: flag(d, "Read any free blocks")?,
        fast_write: count(d, "Fast write level", 2.0)? as u8,
        read_hits_on_write_data: flag(d, "Allow read hits on write data")?,
        combine_seq_writes: flag(d, "Combine seq writes")?,
        hold_bus_read: flag(d, "Hold bus entire read xfer")?,
        read_watermark: d.num("High (read) water mark")?.clamp(0.0, 1.0),
        watermark_by_request: flag(d, "Set watermark by reqsize")?,
        write_watermark: d.num("Low (write) water mark")?.clamp(0.0, 1.0),
        hold_bus_write: flag(d, "Hold bus entire write xfer")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IBM 18ES's files, edited by `edit` (on the `.model` text), in a scratch directory.
    fn ibm_with(edit: impl Fn(String) -> String) -> (iolab_sys::testing::TempDir, Result<HddSpec>) {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/disksim-valid");
        let dir = iolab_sys::testing::tempdir("disksim-ibm").unwrap();
        for f in ["ibm18es.diskspecs", "ibm18es.seek"] {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
        }
        let model = std::fs::read_to_string(src.join("ibm18es.model")).unwrap();
        std::fs::write(dir.path().join("ibm18es.model"), edit(model)).unwrap();
        let spec = HddSpec::from_disksim(&dir.path().join("ibm18es.diskspecs"), None);
        (dir, spec)
    }

    /// The HP C2247's `.parv` with its controller block edited by `edit`.
    fn hp_bus_with(edit: impl Fn(String) -> String) -> HddSpec {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/disksim-valid");
        let dir = iolab_sys::testing::tempdir("disksim-hp-ctlr").unwrap();
        for f in ["hp_c2247a.diskspecs", "hp_c2247a_validate.model"] {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
        }
        let parv = std::fs::read_to_string(src.join("hp_c2247a.parv")).unwrap();
        std::fs::write(dir.path().join("hp_c2247a.parv"), edit(parv)).unwrap();
        HddSpec::from_disksim(&dir.path().join("hp_c2247a.parv"), None).unwrap()
    }

    #[test]
    fn a_controllers_transfer_time_counts_as_disksims_controller_types_use_it() {
        // The HP's bus1 takes 0.17010 ms per sector read, 0.18686 written.
        let plain = hp_bus_with(|p| p);
        assert_eq!((plain.bus_read_ms, plain.bus_write_ms), (0.17010, 0.18686));
        fn ctlr(ty: &'static str, scale: &'static str) -> impl Fn(String) -> String {
            move |p: String| {
                p.replace(
                    "type = 1,\nScale for delays = 0.0,\nBulk sector transfer time = 0.0,",
                    &format!("type = {ty},\nScale for delays = {scale},\nBulk sector transfer time = 0.5,"),
                )
            }
        }
        // A pass-thru controller's own time is not used, whatever its scale.
        assert_eq!(hp_bus_with(ctlr("1", "1.0")).bus_read_ms, 0.17010);
        // A 53C700 one bounds the transfer, its scale (0: no overheads) aside.
        let c700 = hp_bus_with(ctlr("2", "0.0"));
        assert_eq!((c700.bus_read_ms, c700.bus_write_ms), (0.5, 0.5));
    }

    #[test]
    fn files_other_disks_ship_with_load() {
        let (_d, plain) = ibm_with(|m| m);
        let plain = plain.unwrap();
        assert_eq!(plain.layout.mapping, Mapping::Conventional);
        // The DEC RZ26's negative write settle (DiskSim adds it as it is).
        let (_d, s) = ibm_with(|m| {
            m.replace(
                "Add. write settling delay = 0.126000",
                "Add. write settling delay = -0.483000",
            )
        });
        assert_eq!(s.unwrap().mech.write_settle, -0.483);
        // The Quantum Atlas 10K's serpentine mapping.
        let (_d, s) = ibm_with(|m| {
            m.replace(
                "LBN-to-PBN mapping scheme = 0",
                "LBN-to-PBN mapping scheme = 1",
            )
        });
        let s = s.unwrap();
        assert_eq!(s.layout.mapping, Mapping::SerpentineInZone);
        assert_eq!(s.layout.blocks, plain.layout.blocks);
        // The HP C2490A's last zone ending one cylinder past the count: taken as the zones
        // say. Two past is still an error.
        let (_d, s) =
            ibm_with(|m| m.replace("Number of cylinders = 11474", "Number of cylinders = 11473"));
        let s = s.unwrap();
        assert_eq!(s.layout.cylinders, 11474);
        assert_eq!(s.layout.blocks, plain.layout.blocks);
        let (_d, s) =
            ibm_with(|m| m.replace("Number of cylinders = 11474", "Number of cylinders = 11472"));
        assert!(format!("{:#}", s.unwrap_err()).contains("outside"));
        let (_d, s) = ibm_with(|m| {
            m.replace(
                "LBN-to-PBN mapping scheme = 0",
                "LBN-to-PBN mapping scheme = 3",
            )
        });
        assert!(format!("{:#}", s.unwrap_err()).contains("mapping scheme 3"));
    }
}
