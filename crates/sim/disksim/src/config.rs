//! The TOML configuration of `iolab disksim run`. Every key, with its unit, is documented in
//! the crate README ("Configuration") and in `configs/*.toml`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::engine::Component;
use crate::hdd::{Hdd, HddSpec};
use crate::sched::Policy;
use crate::ssd::{Ssd, SsdSpec};
use crate::workload::WorkloadSpec;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub device: DeviceSection,
    #[serde(default)]
    pub ssd: Option<SsdSpec>,
    #[serde(default)]
    pub measured: Option<crate::measured::MeasuredSpec>,
    #[serde(default)]
    pub workload: Option<WorkloadSpec>,
    /// CPU cost of buffered system calls (written by `calibrate`; used with `run --fio`).
    #[serde(default)]
    pub host_cpu: Option<crate::host::HostCpu>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSection {
    /// "hdd", "ssd" or "measured".
    pub kind: String,
    /// hdd: DiskSim 4.0 parameter file (.parv or .diskspecs), relative to the config file.
    #[serde(default)]
    pub disksim: Option<PathBuf>,
    /// hdd: name of the disksim_disk block when the file has several.
    #[serde(default)]
    pub disk_name: Option<String>,
    /// hdd: override the drive's queue depth (requests).
    #[serde(default)]
    pub queue_depth: Option<usize>,
    /// hdd: override the drive's scheduler (fcfs, scan, look, c-look, sstf).
    #[serde(default)]
    pub scheduler: Option<String>,
}

/// A device built from a config: the component and its capacity (sectors).
pub struct Device {
    pub component: Box<dyn Component>,
    pub blocks: u64,
    pub description: String,
    /// What the user should know about how the device was built (which of a parameter
    /// file's disks was taken, values DiskSim would read differently): for stderr.
    pub notes: Vec<String>,
}

impl Config {
    /// Reads a TOML config, or a DiskSim parameter file (`.parv`, `.diskspecs`) given as
    /// it is: an HDD of that file's disk.
    pub fn load(path: &Path) -> Result<Config> {
        if is_disksim_file(path) {
            return Ok(Config::disksim(path));
        }
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        match toml::from_str(&text) {
            Ok(c) => Ok(c),
            Err(e) if text.contains("disksim_") => Err(anyhow::anyhow!(e)).with_context(|| {
                format!(
                    "{}: not TOML; it looks like DiskSim parameters: name it .parv (or .diskspecs)",
                    path.display()
                )
            }),
            Err(e) => Err(anyhow::anyhow!(e)).with_context(|| format!("{}", path.display())),
        }
    }

    /// The config of an HDD built from DiskSim parameter file `path`.
    pub fn disksim(path: &Path) -> Config {
        let file = path.file_name().map_or_else(|| path.into(), PathBuf::from);
        Config {
            device: DeviceSection {
                kind: "hdd".into(),
                disksim: Some(file),
                disk_name: None,
                queue_depth: None,
                scheduler: None,
            },
            ssd: None,
            measured: None,
            workload: None,
            host_cpu: None,
        }
    }

    /// Takes disk `name` of the DiskSim file (a `.parv` may describe several).
    pub fn with_disk_name(mut self, name: Option<&str>) -> Config {
        if let Some(n) = name {
            self.device.disk_name = Some(n.to_string());
        }
        self
    }

    pub fn device(&self, config_path: &Path) -> Result<Device> {
        match self.device.kind.as_str() {
            "hdd" => {
                let Some(f) = &self.device.disksim else {
                    bail!("device.kind = \"hdd\" needs device.disksim = \"FILE.parv\" (DiskSim 4.0 parameters)");
                };
                let base = config_path.parent().unwrap_or(Path::new("."));
                let p = if f.is_absolute() {
                    f.clone()
                } else {
                    base.join(f)
                };
                let mut spec = HddSpec::from_disksim(&p, self.device.disk_name.as_deref())?;
                let notes = disksim_notes(&p, &spec.name)?;
                if let Some(q) = self.device.queue_depth {
                    if q == 0 || q > 65536 {
                        bail!("device.queue_depth must be within 1..=65536");
                    }
                    spec.queue_depth = q;
                }
                if let Some(s) = &self.device.scheduler {
                    spec.scheduler = Policy::parse(s)?;
                }
                let description = format!(
                    "HDD {} ({:.0} rpm, {} zones, {:.1} GB, {} cache segments of {} sectors)",
                    spec.name,
                    spec.mech.rpm,
                    spec.layout.zones.len(),
                    spec.blocks() as f64 * 512.0 / 1e9,
                    spec.cache.segments,
                    spec.cache.segment_sectors
                );
                let blocks = spec.blocks();
                Ok(Device {
                    component: Box::new(Hdd::new(spec)),
                    blocks,
                    description,
                    notes,
                })
            }
            "ssd" => {
                let Some(s) = &self.ssd else {
                    bail!("device.kind = \"ssd\" needs an [ssd] section")
                };
                let description = format!(
                    "SSD {}ch x {}dies x {}planes, page {} B, tR {} us, tPROG {} us, host {} MB/s, QD {}",
                    s.channels, s.dies_per_channel, s.planes_per_die, s.page_bytes, s.read_us, s.program_us, s.host_mb_s, s.queue_depth
                );
                let blocks = s.blocks();
                Ok(Device {
                    component: Box::new(Ssd::new(s.clone())?),
                    blocks,
                    description,
                    notes: Vec::new(),
                })
            }
            "measured" => {
                let Some(m) = &self.measured else {
                    bail!("device.kind = \"measured\" needs a [measured] section")
                };
                let d = crate::measured::MeasuredDevice::new(m.clone())?;
                let blocks = d.blocks();
                let description = format!(
                    "measured device ({} latency points, QD {})",
                    m.points.len(),
                    m.queue_depth
                );
                Ok(Device {
                    component: Box::new(d),
                    blocks,
                    description,
                    notes: Vec::new(),
                })
            }
            other => bail!("device.kind must be \"hdd\", \"ssd\" or \"measured\", not \"{other}\""),
        }
    }
}

/// A DiskSim parameter file, by its name.
fn is_disksim_file(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("parv" | "diskspecs")
    )
}

/// Which of the file's disks was taken, when it has several (DiskSim systems name one type
/// per instance; one device is modelled), and the values the HDD model cannot take as
/// DiskSim wrote them: a segment size of 0 is an error, 0 buffer segments or write segments
/// a warning (the model keeps one, caching off).
fn disksim_notes(path: &Path, taken: &str) -> Result<Vec<String>> {
    let pf = crate::hdd::params::parse_file(path)?;
    let mut notes = Vec::new();
    let names: Vec<&str> = pf.find("disksim_disk").map(|b| b.name.as_str()).collect();
    let instances: Vec<String> = pf
        .instances
        .iter()
        .filter(|(_, ty)| names.contains(&ty.as_str()))
        .map(|(what, ty)| format!("{} × {ty}", what.len().max(1)))
        .collect();
    if names.len() > 1 || instances.len() > 1 {
        notes.push(format!(
            "{}: {} disk types ({}){}; modelled: one {taken} (choose with device.disk_name or run --disk NAME)",
            path.display(),
            names.len(),
            names.join(", "),
            if instances.is_empty() {
                String::new()
            } else {
                format!(", instantiated {}", instances.join(", "))
            }
        ));
    }
    let Some(d) = pf.by_name(taken) else {
        return Ok(notes);
    };
    let val = |k: &str| d.num(k).ok();
    if val("Segment size (in blks)") == Some(0.0) {
        bail!(
            "{}: disk {taken}: 'Segment size (in blks) = 0': a cache segment must hold at least one sector (give the drive's segment size, or 'Enable caching in buffer = 0')",
            path.display()
        );
    }
    if val("Number of buffer segments") == Some(0.0) {
        notes.push(format!(
            "{}: disk {taken}: 'Number of buffer segments = 0': simulated with the cache off",
            path.display()
        ));
    }
    if val("Maximum number of write segments") == Some(0.0) {
        notes.push(format!(
            "{}: disk {taken}: 'Maximum number of write segments = 0' taken as 1",
            path.display()
        ));
    }
    if let Some(w) = val("High (read) water mark").filter(|w| !(0.0..=1.0).contains(w)) {
        notes.push(format!(
            "{}: disk {taken}: 'High (read) water mark = {w}' outside 0..1, taken as {}",
            path.display(),
            w.clamp(0.0, 1.0)
        ));
    }
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_parv(edit: impl Fn(String) -> String) -> (iolab_sys::testing::TempDir, PathBuf) {
        let src = crate::default_valid_dir();
        let dir = iolab_sys::testing::tempdir("disksim-cfg").unwrap();
        for f in [
            "ibm18es.parv",
            "ibm18es.diskspecs",
            "ibm18es.seek",
            "ibm18es.model",
        ] {
            let text = std::fs::read_to_string(src.join(f)).unwrap();
            let text = if f.ends_with(".diskspecs") {
                edit(text)
            } else {
                text
            };
            std::fs::write(dir.path().join(f), text).unwrap();
        }
        let p = dir.path().join("ibm18es.parv");
        (dir, p)
    }

    /// A DiskSim `.parv` given as the config is an HDD of its disk (it was a TOML error);
    /// a second disk type in it is named, with the one taken.
    #[test]
    fn a_disksim_file_is_a_config() {
        let (_d, p) = scratch_parv(|m| m);
        let cfg = Config::load(&p).unwrap();
        let dev = cfg.device(&p).unwrap();
        assert!(dev.description.starts_with("HDD"), "{}", dev.description);
        assert!(dev.notes.is_empty(), "{:?}", dev.notes);
        let (_d2, p2) = scratch_parv(|m| {
            let second = m.replace(
                "disksim_disk IBM_DNES-309170W_validate",
                "disksim_disk OTHER",
            );
            format!("{m}\n{second}")
        });
        let dev = Config::load(&p2).unwrap().device(&p2).unwrap();
        assert!(
            dev.notes.iter().any(|n| n.contains("2 disk types")
                && n.contains("modelled: one IBM_DNES-309170W_validate")),
            "{:?}",
            dev.notes
        );
        let cfg = Config::load(&p2).unwrap().with_disk_name(Some("OTHER"));
        assert!(cfg.device(&p2).unwrap().description.contains("OTHER"));
        let toml_named = p.with_extension("toml");
        std::fs::copy(&p, &toml_named).unwrap();
        let e = format!("{:#}", Config::load(&toml_named).unwrap_err());
        assert!(e.contains("looks like DiskSim parameters"), "{e}");
    }

    /// DiskSim's 0-sized cache values, clamped silently before: an error naming the
    /// parameter, or a warning.
    #[test]
    fn zero_cache_values_are_named() {
        let (_d, p) = scratch_parv(|m| {
            let i = m.find("Segment size (in blks) =").unwrap();
            let end = i + m[i..].find(',').unwrap();
            format!("{}Segment size (in blks) = 0{}", &m[..i], &m[end..])
        });
        let e = format!("{:#}", Config::load(&p).unwrap().device(&p).err().unwrap());
        assert!(e.contains("'Segment size (in blks) = 0'"), "{e}");
        let (_d, p) = scratch_parv(|m| {
            let i = m.find("Number of buffer segments =").unwrap();
            let end = i + m[i..].find(',').unwrap();
            format!("{}Number of buffer segments = 0{}", &m[..i], &m[end..])
        });
        let dev = Config::load(&p).unwrap().device(&p).unwrap();
        assert!(
            dev.notes
                .iter()
                .any(|n| n.contains("Number of buffer segments = 0")),
            "{:?}",
            dev.notes
        );
    }
}
