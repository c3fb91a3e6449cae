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
}

impl Config {
    pub fn load(path: &Path) -> Result<Config> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let c: Config = toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
        Ok(c)
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
                })
            }
            other => bail!("device.kind must be \"hdd\", \"ssd\" or \"measured\", not \"{other}\""),
        }
    }
}
