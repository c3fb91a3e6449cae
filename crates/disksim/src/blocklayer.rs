//! The Linux block layer (blk-mq) between the page cache and the device: splitting at
//! `max_sectors_kb`, front and back merges, plugging, `nr_requests` tags, the I/O schedulers
//! (`none`, `mq-deadline`, and the seed's FCFS/SCAN/LOOK) and the device's queue depth, as an
//! [`engine::Component`](crate::engine).
//!
//! Parameters are [`BlockConfig`] (from `/sys/block/<dev>/queue/*`, see
//! [`crate::host::HostParams::from_system`]).

use serde::Serialize;

use crate::engine::{Component, Ctx};
use crate::request::Request;
use crate::sched::Policy;

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
        }
    }
}

/// Counters for the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BlockStats {
    pub requests_in: u64,
    pub requests_out: u64,
    pub splits: u64,
    pub back_merges: u64,
    pub front_merges: u64,
}

/// The block layer component. (First landing: passes requests through unchanged; the
/// model follows.)
pub struct BlockLayer {
    cfg: BlockConfig,
    stats: BlockStats,
}

impl BlockLayer {
    pub fn new(cfg: BlockConfig) -> Self {
        BlockLayer {
            cfg,
            stats: BlockStats::default(),
        }
    }
    pub fn config(&self) -> &BlockConfig {
        &self.cfg
    }
    pub fn counters(&self) -> BlockStats {
        self.stats
    }
}

impl Component for BlockLayer {
    fn name(&self) -> &str {
        "blocklayer"
    }
    fn submit(&mut self, req: Request, ctx: &mut Ctx) {
        self.stats.requests_in += 1;
        self.stats.requests_out += 1;
        ctx.down(req);
    }
    fn stats(&self) -> Vec<(String, f64)> {
        let s = self.stats;
        vec![
            ("blocklayer requests in".into(), s.requests_in as f64),
            (
                "blocklayer requests to device".into(),
                s.requests_out as f64,
            ),
            ("blocklayer splits".into(), s.splits as f64),
            ("blocklayer back merges".into(), s.back_merges as f64),
            ("blocklayer front merges".into(), s.front_merges as f64),
        ]
    }
}
