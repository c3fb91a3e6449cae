//! The host flags of `iolab disksim run` (the page cache and block layer above the device),
//! turned into iolab-disksim's [`HostParams`], and the host lines of a run's summary.

use anyhow::{bail, Result};
use clap::Args;
use iolab_disksim::blocklayer::IoScheduler;
use iolab_disksim::host::{HostParams, HostPolicy};
use iolab_disksim::pagecache::{Threshold, PAGE};

/// The host flags of `iolab disksim run` (and of any command simulating file I/O).
#[derive(Args, Debug, Clone, Default)]
pub struct HostArgs {
    /// Host I/O stack above the device: `linux` (page cache + block layer), `windows-xp`
    /// (seed 002's cache manager), `none` (requests reach the device as they are).
    #[arg(long, default_value = "none")]
    pub host: String,
    /// Start from this machine's settings for a device (name like vda, /dev/vda, or a path
    /// on it) instead of the kernel defaults; the flags below override them.
    #[arg(long, value_name = "DEV")]
    pub host_from: Option<String>,
    /// Page-cache capacity, MiB (default: kernel defaults 1024, or the memory limit).
    #[arg(long, value_name = "MIB")]
    pub page_cache_mb: Option<u64>,
    /// `queue/read_ahead_kb`, KiB.
    #[arg(long, value_name = "KIB")]
    pub read_ahead_kb: Option<u64>,
    /// `vm.dirty_background_ratio`, percent of the page cache.
    #[arg(long, value_name = "PCT", conflicts_with = "dirty_background_bytes")]
    pub dirty_background_ratio: Option<u32>,
    /// `vm.dirty_background_bytes`.
    #[arg(long, value_name = "BYTES")]
    pub dirty_background_bytes: Option<u64>,
    /// `vm.dirty_ratio`, percent of the page cache.
    #[arg(long, value_name = "PCT", conflicts_with = "dirty_bytes")]
    pub dirty_ratio: Option<u32>,
    /// `vm.dirty_bytes`.
    #[arg(long, value_name = "BYTES")]
    pub dirty_bytes: Option<u64>,
    /// `vm.dirty_expire_centisecs` (1/100 s).
    #[arg(long, value_name = "CS")]
    pub dirty_expire_centisecs: Option<u32>,
    /// `vm.dirty_writeback_centisecs` (1/100 s; 0 = no periodic flusher).
    #[arg(long, value_name = "CS")]
    pub dirty_writeback_centisecs: Option<u32>,
    /// `queue/max_sectors_kb`, KiB.
    #[arg(long, value_name = "KIB")]
    pub max_sectors_kb: Option<u64>,
    /// `queue/nr_requests`.
    #[arg(long, value_name = "N")]
    pub nr_requests: Option<u32>,
    /// Block-layer scheduler: none, mq-deadline, fcfs, scan, look, c-look, sstf.
    #[arg(long = "io-scheduler", value_name = "NAME")]
    pub io_scheduler: Option<String>,
    /// Requests the device holds at once (hardware queue tags).
    #[arg(long, value_name = "N")]
    pub host_queue_depth: Option<u32>,
    /// Turn block-layer plugging off.
    #[arg(long)]
    pub no_plug: bool,
}

impl HostArgs {
    /// The parameters these flags ask for: the kernel's defaults or `--host-from`'s machine
    /// settings, with the flags given over them; `None` for `--host none`.
    pub fn to_params(&self) -> Result<Option<HostParams>> {
        let policy = HostPolicy::parse(&self.host)?;
        if policy == HostPolicy::None {
            return Ok(None);
        }
        let mut p = match &self.host_from {
            Some(dev) => HostParams::from_system(dev)?,
            None => HostParams::linux_defaults(),
        };
        p.policy = policy;
        let pc = &mut p.page_cache;
        if let Some(mb) = self.page_cache_mb {
            if mb == 0 {
                bail!("--page-cache-mb must be at least 1");
            }
            pc.capacity_pages = (mb << 20) / PAGE;
            pc.dirty.dirtyable_pages = pc.capacity_pages;
        }
        if let Some(v) = self.read_ahead_kb {
            pc.read_ahead_kb = v;
        }
        let ratio = |r: u32, name: &str| -> Result<Threshold> {
            if r > 100 {
                bail!("--{name} is a percentage (0-100), not {r}");
            }
            Ok(Threshold::Ratio(r))
        };
        if let Some(r) = self.dirty_background_ratio {
            pc.dirty.background = ratio(r, "dirty-background-ratio")?;
        }
        if let Some(b) = self.dirty_background_bytes {
            pc.dirty.background = Threshold::Bytes(b);
        }
        if let Some(r) = self.dirty_ratio {
            pc.dirty.limit = ratio(r, "dirty-ratio")?;
        }
        if let Some(b) = self.dirty_bytes {
            pc.dirty.limit = Threshold::Bytes(b);
        }
        if let Some(v) = self.dirty_expire_centisecs {
            pc.dirty.expire_centisecs = v;
        }
        if let Some(v) = self.dirty_writeback_centisecs {
            pc.dirty.writeback_centisecs = v;
        }
        let b = &mut p.block;
        if let Some(v) = self.max_sectors_kb {
            if v < 4 {
                bail!("--max-sectors-kb must be at least 4");
            }
            b.max_sectors_kb = v;
        }
        if let Some(v) = self.nr_requests {
            if v == 0 {
                bail!("--nr-requests must be at least 1");
            }
            b.nr_requests = v;
        }
        if let Some(s) = &self.io_scheduler {
            b.scheduler = IoScheduler::parse(s)?;
        }
        if let Some(v) = self.host_queue_depth {
            if v == 0 {
                bail!("--host-queue-depth must be at least 1");
            }
            b.queue_depth = v;
        }
        if self.no_plug {
            b.plug = false;
        }
        Ok(Some(p))
    }
}

/// Prints the host parameters and counters under a run's summary (nothing for no host).
pub fn print_host(params: Option<&[(String, String)]>, stats: &[(String, f64)]) {
    let Some(params) = params else {
        return;
    };
    let line: Vec<String> = params.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!("host        {}", line.join(", "));
    for (k, v) in stats {
        if *v != 0.0 {
            println!("  {k:<44} {v:>14.0}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_defaults_and_bad_values_are_refused() {
        let none = HostArgs {
            host: "none".into(),
            ..Default::default()
        };
        assert!(none.to_params().unwrap().is_none());
        let a = HostArgs {
            host: "linux".into(),
            page_cache_mb: Some(256),
            read_ahead_kb: Some(8192),
            dirty_bytes: Some(64 << 20),
            dirty_expire_centisecs: Some(100),
            max_sectors_kb: Some(4096),
            io_scheduler: Some("none".into()),
            host_queue_depth: Some(128),
            no_plug: true,
            ..Default::default()
        };
        let p = a.to_params().unwrap().unwrap();
        assert_eq!(p.page_cache.capacity_pages, 65536);
        assert_eq!(p.page_cache.read_ahead_kb, 8192);
        assert_eq!(p.page_cache.dirty.limit, Threshold::Bytes(64 << 20));
        assert_eq!(p.page_cache.dirty.background, Threshold::Ratio(10));
        assert_eq!(p.page_cache.dirty.expire_centisecs, 100);
        assert_eq!(p.block.max_sectors_kb, 4096);
        assert_eq!(p.block.scheduler, IoScheduler::None);
        assert_eq!(p.block.queue_depth, 128);
        assert!(!p.block.plug);
        for bad in [
            HostArgs {
                host: "linux".into(),
                dirty_ratio: Some(120),
                ..Default::default()
            },
            HostArgs {
                host: "linux".into(),
                io_scheduler: Some("bfq".into()),
                ..Default::default()
            },
            HostArgs {
                host: "linux".into(),
                nr_requests: Some(0),
                ..Default::default()
            },
            HostArgs {
                host: "solaris".into(),
                ..Default::default()
            },
        ] {
            assert!(bad.to_params().is_err(), "{bad:?}");
        }
    }
}
