//! The host I/O stack above a device: the operating system's page cache and block layer,
//! built from one set of parameters. **This is the entry point for simulating file I/O**
//! (fio jobs, recorded applications).
//!
//! # Contract
//!
//! ```text
//!   workload (fio job, recorded trace) ── file-level Requests
//!      │
//!   HostParams::stack().on(device)  =  [ syscalls , page cache , block layer , device ]
//! ```
//!
//! * Build: `let chain = params.stack().cpu(cal).files(&sizes).on(device)?; let sim =
//!   Simulator::new(chain);`, or `.components()?` for the components alone (top first) to
//!   put above a device yourself. The system-call level is there with a calibration's CPU
//!   table ([`HostCpu`]) only. [`HostPolicy::None`] gives no page cache or block layer: the
//!   requests reach the device as they are (today's `disksim run`).
//! * Parameters: [`HostParams::linux_defaults`] (the kernel's defaults), or
//!   [`HostParams::from_system`] (this machine: `/sys/block/<dev>/queue/*`,
//!   `/proc/sys/vm/dirty_*`, the memory limit of this process's memory cgroup, v1 or v2, or
//!   the RAM). Every field is public and documented with its unit; override what a flag or a
//!   calibration file says.
//! * Requests (see [`crate::request::Op`] for the table of system calls):
//!   - a file-level request has `file: Some(FileRef { file, offset })` with `offset` in
//!     bytes, and `lba` = the sector where the file's byte `offset` lives: files are laid out
//!     contiguously, `lba = file_base_lba + offset / 512`, each file at its own base. The
//!     page cache reads and writes back whole 4 KiB pages at `file_base_lba + page * 8`.
//!   - `Read` / `Write`: buffered `pread` / `pwrite`; [`Flags::DIRECT`](crate::request::Flags)
//!     is `O_DIRECT` (bypasses the cache; a direct write first writes back and then drops
//!     the cached pages it covers, as the kernel's `invalidate_inode_pages2_range`);
//!     `Flags::DSYNC` / `Flags::OSYNC` on a write are `O_DSYNC` / `O_SYNC`.
//!   - `Flush` with a file is `fsync`, with `Flags::DATASYNC` `fdatasync`: it completes
//!     once every page of that file dirty at the call is written and the device flushed.
//!   - `Advise(advice)` is `posix_fadvise` on `[offset, offset + sectors*512)` (0 sectors:
//!     to the end of the file). Set `fadvise_hint` (fio) by sending an `Advise` on the
//!     whole file before the first I/O; `invalidate=1` (fio's default) is an
//!     `Advise(DontNeed)` on the whole file.
//!   - A request's completion is the system call's return: a buffered write completes when
//!     copied into the cache (later if the writer is throttled), a buffered read when its
//!     pages are ready, plus the CPU costs in [`PageCacheConfig`].
//!   - Requests without a file (block-level traces) use the block device's own page cache
//!     (as reads of `/dev/vda` would) when buffered, and go straight down when `DIRECT`.
//! * Statistics: every component's `Component::stats()` (page-cache hits, misses,
//!   read-ahead pages, dirty and write-back pages, throttled time; block-layer merges and
//!   splits) for the summary.
//! * The simulation ends when the workload's requests are all complete; write-back still
//!   pending then (dirty pages not yet expired) is not run — call `fsync` (a `Flush` with the
//!   file) at the end of a job to include it, as fio's `end_fsync=1` does.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use iolab_sys::host::{self, CgroupLimit};
use serde::Serialize;

use crate::blocklayer::{BlockConfig, BlockLayer, IoScheduler};
use crate::engine::Component;
use crate::pagecache::{DirtyConfig, PageCache, PageCacheConfig, Threshold, PAGE};
use crate::wincache::{WinXpCache, WinXpConfig, BLOCK};

mod cpu;
pub use cpu::{fit_affine, table_us, HostCpu, Syscalls, CACHED_TABLE_SET_MIB};

/// Which operating system's caching policy sits above the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostPolicy {
    /// No host stack: requests go to the device as they are.
    None,
    /// Linux: page cache (LRU, on-demand read-ahead, dirty throttling, flusher) and blk-mq.
    Linux,
    /// Windows XP's cache manager as seed 002 describes it (64 KB views, read-ahead after
    /// three sequential requests, lazy writer).
    WindowsXp,
}

impl HostPolicy {
    pub fn parse(s: &str) -> Result<HostPolicy> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "none" | "" => HostPolicy::None,
            "linux" => HostPolicy::Linux,
            "windows-xp" | "windowsxp" | "xp" => HostPolicy::WindowsXp,
            _ => bail!("unknown host '{s}' (linux, windows-xp, none)"),
        })
    }
}

/// Everything the host stack needs. Serialize it to print the configuration with results.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct HostParams {
    pub policy: HostPolicy,
    pub page_cache: PageCacheConfig,
    pub block: BlockConfig,
}

impl HostParams {
    /// Linux defaults: a 1 GiB page cache (dirty ratios over the same), `read_ahead_kb`
    /// 128, dirty 10 % / 20 %, expiry 30 s, flusher every 5 s, the block layer of
    /// [`BlockConfig::linux_defaults`], 1 µs per system call and 4,000 MB/s copies.
    pub fn linux_defaults() -> Self {
        let pages = (1u64 << 30) / PAGE;
        HostParams {
            policy: HostPolicy::Linux,
            page_cache: PageCacheConfig {
                syscall_ms: 0.001,
                copy_mb_s: 4000.0,
                ..PageCacheConfig::new(pages, 128)
            },
            block: BlockConfig::linux_defaults(),
        }
    }

    /// This machine's settings for `device`: a block device name (`vda`), its node
    /// (`/dev/vda`, `/dev/vda1`), or any file or directory (the device holding it; a
    /// partition maps to its disk).
    ///
    /// Reads `/sys/block/<disk>/queue/{read_ahead_kb,max_sectors_kb,nr_requests,scheduler}` (a
    /// bio-based disk, zram for one, has no request queue: [`BlockConfig::bio_based`])
    /// and the hardware queue depth (`mq/*/nr_tags` summed, else `device/queue_depth`),
    /// `/proc/sys/vm/dirty_*` (`_bytes` wins over `_ratio` when non-zero, as in the kernel),
    /// and the memory: page-cache capacity = the memory cgroup limit of this process (v2
    /// `memory.max` or v1 `memory.limit_in_bytes`, the smallest up the hierarchy) if any,
    /// else `MemAvailable`; the dirty ratios apply to `MemAvailable` (the kernel's global
    /// dirtyable memory; under cgroup v2 the cgroup's limit caps it, under v1 the global
    /// figure stands, as in the kernel, where v1 memory cgroups have no dirty limits of
    /// their own). The CPU costs stay at the defaults (calibration measures them).
    pub fn from_system(device: &str) -> Result<Self> {
        let disk = resolve_disk(device)?;
        let q = Path::new("/sys/block").join(&disk).join("queue");
        let mut p = HostParams::linux_defaults();
        p.page_cache.read_ahead_kb = read_num(&q.join("read_ahead_kb"))?;
        p.block.max_sectors_kb = read_num(&q.join("max_sectors_kb"))?;
        if is_bio_based(&Path::new("/sys/block").join(&disk)) {
            // No request queue: no scheduler, no requests to allocate, no tags to wait for.
            p.block.bio_based = true;
            p.block.scheduler = IoScheduler::None;
            p.block.plug = false;
            p.block.queue_depth = u32::MAX;
        } else {
            p.block.nr_requests = read_num(&q.join("nr_requests"))? as u32;
            let sched = read_text(&q.join("scheduler"))?;
            p.block.scheduler = IoScheduler::from_sysfs(&sched)
                .with_context(|| format!("{}", q.join("scheduler").display()))?;
            if let Some(qd) = queue_depth(&Path::new("/sys/block").join(&disk)) {
                p.block.queue_depth = qd;
            }
        }
        let mem = read_memory()?;
        p.page_cache.capacity_pages = mem.cache_bytes / PAGE;
        p.page_cache.dirty = read_vm_dirty(Path::new("/proc/sys/vm"), mem.dirtyable_bytes / PAGE)?;
        Ok(p)
    }

    /// The builder of the host stack over a device: the one place the chain of components
    /// is put together (`run`, `validate`, `record`'s replay).
    pub fn stack(&self) -> HostStack<'_> {
        HostStack {
            params: self,
            cpu: None,
            files: &[],
        }
    }

    /// One line per parameter, for printing the configuration next to results.
    pub fn describe(&self) -> Vec<(String, String)> {
        let pc = &self.page_cache;
        let d = &pc.dirty;
        let th = |t: Threshold| match t {
            Threshold::Ratio(r) => {
                format!("{r} % ({} MiB)", (t.pages(d.dirtyable_pages) * PAGE) >> 20)
            }
            Threshold::Bytes(b) => format!("{} MiB", b >> 20),
        };
        vec![
            ("host".into(), format!("{:?}", self.policy)),
            (
                "page cache".into(),
                format!("{} MiB", (pc.capacity_pages * PAGE) >> 20),
            ),
            ("read_ahead_kb".into(), pc.read_ahead_kb.to_string()),
            ("dirty_background".into(), th(d.background)),
            ("dirty_limit".into(), th(d.limit)),
            (
                "dirtyable memory".into(),
                format!("{} MiB", (d.dirtyable_pages * PAGE) >> 20),
            ),
            (
                "dirty_expire_centisecs".into(),
                d.expire_centisecs.to_string(),
            ),
            (
                "dirty_writeback_centisecs".into(),
                d.writeback_centisecs.to_string(),
            ),
            ("syscall µs".into(), format!("{}", pc.syscall_ms * 1000.0)),
            ("copy MB/s".into(), format!("{}", pc.copy_mb_s)),
            (
                "max_sectors_kb".into(),
                self.block.max_sectors_kb.to_string(),
            ),
            ("nr_requests".into(), self.block.nr_requests.to_string()),
            ("scheduler".into(), self.block.scheduler.name()),
            (
                "request queue".into(),
                if self.block.bio_based {
                    "none: a bio-based driver (no split, merge, plug or request limit)".into()
                } else {
                    "blk-mq".into()
                },
            ),
            ("queue depth".into(), self.block.queue_depth.to_string()),
        ]
    }
}

/// The host stack over a device, as [`HostParams::stack`] starts it: with a calibration's
/// [`HostCpu`] table ([`HostStack::cpu`]) the page cache's affine CPU costs come from the
/// table's affine part and a system-call level on top ([`Syscalls`]) adds what buffered
/// calls cost beyond it; the workload's file sizes ([`HostStack::files`]) stop the Linux
/// page cache's read-ahead at each file's end, as the kernel's does.
pub struct HostStack<'a> {
    params: &'a HostParams,
    cpu: Option<&'a HostCpu>,
    files: &'a [(u32, u64)],
}

impl<'a> HostStack<'a> {
    /// The calibrated CPU costs of system calls (none: the page cache's own parameters).
    pub fn cpu(mut self, cpu: Option<&'a HostCpu>) -> Self {
        self.cpu = cpu;
        self
    }

    /// The workload's files as (file id, bytes).
    pub fn files(mut self, files: &'a [(u32, u64)]) -> Self {
        self.files = files;
        self
    }

    /// The host components, top first (none for [`HostPolicy::None`] without a CPU table).
    pub fn components(self) -> Result<Vec<Box<dyn Component>>> {
        let mut params = *self.params;
        let mut chain: Vec<Box<dyn Component>> = Vec::new();
        if let Some(c) = self.cpu.filter(|c| !c.cached_read_us.is_empty()) {
            c.validate()?;
            // The set the job's cached reads go over: its files, at most what the cache holds.
            let files: u64 = self.files.iter().map(|f| f.1).sum();
            let pc = &mut params.page_cache;
            let capacity = pc.capacity_pages.saturating_mul(PAGE);
            let c = &c.for_cached_set(files.min(capacity));
            let (a, b) = c.affine();
            pc.syscall_ms = a / 1000.0;
            // b µs per KiB = 1024 / b bytes per µs = MB/s; 0 means free copies.
            pc.copy_mb_s = if b > 1e-9 { 1024.0 / b } else { 0.0 };
            pc.miss_folio_ms = c.miss_folio_us / 1000.0;
            pc.reclaim_folio_ms = c.reclaim_folio_us / 1000.0;
            pc.dontneed_dirty_page_ms = c.dontneed_dirty_page_us / 1000.0;
            chain.push(Box::new(Syscalls::new(c.clone())));
        }
        match params.policy {
            HostPolicy::None => {}
            HostPolicy::Linux => {
                let cache = PageCache::new(params.page_cache).with_file_sizes(0, self.files);
                chain.push(Box::new(cache));
                chain.push(Box::new(BlockLayer::new(params.block)));
            }
            HostPolicy::WindowsXp => {
                let pc = &params.page_cache;
                let cfg = WinXpConfig {
                    syscall_ms: pc.syscall_ms,
                    copy_mb_s: pc.copy_mb_s,
                    ..WinXpConfig::new((pc.capacity_pages * PAGE / BLOCK).max(1))
                };
                // The seed's I/O scheduler is FCFS, SCAN or LOOK (§4.1.5): the block layer
                // keeps its queue and merges, with the scheduler given (FCFS by default).
                let mut block = params.block;
                if matches!(block.scheduler, IoScheduler::MqDeadline) {
                    block.scheduler = IoScheduler::Classic(crate::sched::Policy::Fcfs);
                }
                chain.push(Box::new(WinXpCache::new(cfg)));
                chain.push(Box::new(BlockLayer::new(block)));
            }
        }
        Ok(chain)
    }

    /// The whole chain: the host components over `device`, ready for `Simulator::new`.
    pub fn on(self, device: Box<dyn Component>) -> Result<Vec<Box<dyn Component>>> {
        let mut chain = self.components()?;
        chain.push(device);
        Ok(chain)
    }
}

/// `/proc/sys/vm/dirty_*` in `dir` → the dirty configuration over `dirtyable_pages`.
pub fn read_vm_dirty(dir: &Path, dirtyable_pages: u64) -> Result<DirtyConfig> {
    let num = |name: &str| read_num(&dir.join(name));
    let pick = |bytes: u64, ratio: u64| {
        if bytes > 0 {
            Threshold::Bytes(bytes)
        } else {
            Threshold::Ratio(ratio.min(100) as u32)
        }
    };
    Ok(DirtyConfig {
        background: pick(
            num("dirty_background_bytes")?,
            num("dirty_background_ratio")?,
        ),
        limit: pick(num("dirty_bytes")?, num("dirty_ratio")?),
        expire_centisecs: num("dirty_expire_centisecs")?.min(u64::from(u32::MAX)) as u32,
        writeback_centisecs: num("dirty_writeback_centisecs")?.min(u64::from(u32::MAX)) as u32,
        dirtyable_pages,
    })
}

/// Memory figures of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    /// What the page cache may hold (cgroup limit, else MemAvailable), bytes.
    pub cache_bytes: u64,
    /// What the dirty ratios apply to, bytes.
    pub dirtyable_bytes: u64,
    /// The memory cgroup limit, if any.
    pub cgroup_limit: Option<CgroupLimit>,
}

/// Reads `/proc/meminfo` and the limit of this process's memory cgroup.
pub fn read_memory() -> Result<Memory> {
    let meminfo = host::meminfo().context("reading /proc/meminfo")?;
    let total = meminfo
        .get("MemTotal")
        .context("no MemTotal in /proc/meminfo")?;
    let available = meminfo.get("MemAvailable").unwrap_or(total);
    let limit = host::own_cgroup_memory_limit();
    let (cache_bytes, dirtyable_bytes) = match limit {
        Some(CgroupLimit { bytes: l, v2 }) => {
            (l.min(total), if v2 { available.min(l) } else { available })
        }
        None => (available, available),
    };
    Ok(Memory {
        cache_bytes,
        dirtyable_bytes,
        cgroup_limit: limit,
    })
}

/// The whole-disk name in /sys/block for a name, a device node or a file on a device.
pub fn resolve_disk(device: &str) -> Result<String> {
    let name = device.trim_start_matches("/dev/");
    // "." and ".." are paths (the current directory), never disk names.
    if !name.contains('/') && !name.starts_with('.') && Path::new("/sys/block").join(name).exists()
    {
        return Ok(name.to_string());
    }
    let path = Path::new(device);
    let meta = std::fs::metadata(path).with_context(|| {
        format!("'{device}' is neither a block device in /sys/block nor a path")
    })?;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    let (major, minor) = (libc_major(dev), libc_minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let real = std::fs::canonicalize(&sys).with_context(|| {
        format!("'{device}' is on device {major}:{minor}, which has no {} (not a block device: tmpfs, overlay?)", sys.display())
    })?;
    // A partition's directory sits inside its disk's and has a `partition` file.
    let disk_dir = if real.join("partition").exists() {
        real.parent().map(Path::to_path_buf).unwrap_or(real)
    } else {
        real
    };
    let name = disk_dir
        .file_name()
        .and_then(|n| n.to_str())
        .context("unnamed block device")?
        .to_string();
    if !Path::new("/sys/block").join(&name).join("queue").exists() {
        bail!("'{device}' is on {name}, which has no queue settings in /sys/block (a device-mapper or virtual device: name the disk under it)");
    }
    Ok(name)
}

// Linux's dev_t encoding (glibc's gnu_dev_major / gnu_dev_minor).
fn libc_major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)
}
fn libc_minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)
}

/// The hardware queue depth: the tags of every hardware queue, else the SCSI queue depth.
/// A disk whose driver takes bios itself (zram, brd, md, device-mapper): the kernel
/// registers no blk-mq queue for it, so sysfs has neither `mq/` nor `queue/scheduler`
/// (block/blk-sysfs.c shows `scheduler` and `nr_requests` only for a queue with requests).
fn is_bio_based(disk_dir: &Path) -> bool {
    !disk_dir.join("mq").exists() && !disk_dir.join("queue/scheduler").exists()
}

fn queue_depth(disk_dir: &Path) -> Option<u32> {
    let mut total = 0u64;
    if let Ok(rd) = std::fs::read_dir(disk_dir.join("mq")) {
        for e in rd.flatten() {
            if let Ok(n) = read_num(&e.path().join("nr_tags")) {
                total += n;
            }
        }
    }
    if total == 0 {
        total = read_num(&disk_dir.join("device/queue_depth")).ok()?;
    }
    (total > 0).then(|| total.min(u64::from(u32::MAX)) as u32)
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn read_num(path: &Path) -> Result<u64> {
    let t = read_text(path)?;
    t.trim()
        .parse()
        .with_context(|| format!("{}: '{}' is not a number", path.display(), t.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_is_the_current_directory_not_a_disk_name() {
        // /sys/block/. exists; "." must still resolve as a path.
        let cwd = std::env::current_dir().unwrap();
        match (resolve_disk("."), resolve_disk(&cwd.to_string_lossy())) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(_), Err(_)) => {}
            (a, b) => panic!("'.' gave {a:?}, the same directory by name {b:?}"),
        }
    }

    #[test]
    fn vm_dirty_bytes_win_over_ratios() {
        let dir = std::env::temp_dir().join(format!("iolab-dlmodel-vm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        struct Rm(PathBuf);
        impl Drop for Rm {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _rm = Rm(dir.clone());
        for (f, v) in [
            ("dirty_background_bytes", "0"),
            ("dirty_background_ratio", "10"),
            ("dirty_bytes", "67108864"),
            ("dirty_ratio", "20"),
            ("dirty_expire_centisecs", "3000"),
            ("dirty_writeback_centisecs", "500"),
        ] {
            std::fs::write(dir.join(f), format!("{v}\n")).unwrap();
        }
        let d = read_vm_dirty(&dir, 1000).unwrap();
        assert_eq!(d.background, Threshold::Ratio(10));
        assert_eq!(d.limit, Threshold::Bytes(64 << 20));
        assert_eq!(d.background.pages(1000), 100);
        assert_eq!(d.limit.pages(1000), (64 << 20) / PAGE);
        assert_eq!((d.expire_centisecs, d.writeback_centisecs), (3000, 500));
        std::fs::write(dir.join("dirty_ratio"), "x\n").unwrap();
        std::fs::write(dir.join("dirty_bytes"), "0\n").unwrap();
        let e = read_vm_dirty(&dir, 1000).unwrap_err();
        assert!(format!("{e:#}").contains("dirty_ratio"), "{e:#}");
    }

    #[test]
    fn cgroup_limits_take_the_smallest_up_the_tree() {
        let root = std::env::temp_dir().join(format!("iolab-dlmodel-cg-{}", std::process::id()));
        struct Rm(PathBuf);
        impl Drop for Rm {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _rm = Rm(root.clone());
        let leaf = root.join("memory/a/b");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(
            root.join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        std::fs::write(root.join("memory/a/memory.limit_in_bytes"), "268435456\n").unwrap();
        std::fs::write(leaf.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        let cg = "9:name=systemd:/\n4:memory:/a/b\n0::/\n";
        let want = CgroupLimit {
            bytes: 256 << 20,
            v2: false,
        };
        assert_eq!(host::cgroup_memory_limit(cg, &root), Some(want));
        assert_eq!(host::cgroup_memory_limit("4:memory:/\n", &root), None);
    }

    #[test]
    fn this_machine_reads() {
        // Any machine with a /sys/block disk: the root filesystem's device resolves and its
        // settings parse (a container on overlayfs may have none: then the error names why).
        match HostParams::from_system("/") {
            Ok(p) => {
                assert!(p.page_cache.capacity_pages > 0);
                assert!(p.block.max_sectors_kb > 0);
                assert!(p.block.queue_depth > 0);
                let chain = p.stack().components().unwrap();
                assert_eq!(chain.len(), 2);
            }
            Err(e) => eprintln!("skipping: {e:#}"),
        }
        assert!(HostParams::from_system("/nonexistent/x").is_err());
    }

    /// The contract end to end: a file read twice is a miss then a hit; after
    /// `Advise(DontNeed)` on the file it is a miss again.
    #[test]
    fn a_stack_serves_file_requests() {
        use crate::engine::{ConstantDevice, Pending, Simulator, VecSource, When};
        use crate::request::{Advice, CacheOutcome, FileRef, Flags, Op, Request};
        let params = HostParams::linux_defaults();
        let mut sim = Simulator::new(
            params
                .stack()
                .on(Box::new(ConstantDevice::new(1.0)))
                .unwrap(),
        );
        let base = 1 << 20; // the file's first sector
        let file_req = |op: Op, offset: u64, sectors: u32| Pending {
            when: When::AfterCompletion { think: 0.0 },
            req: Request {
                id: 0,
                arrival: 0.0,
                dev: 0,
                lba: base + offset / 512,
                sectors,
                op,
                flags: Flags::default(),
                file: Some(FileRef { file: 3, offset }),
                prio: crate::request::IoPrio::NONE,
            },
        };
        let items = vec![
            file_req(Op::Read, 0, 8),
            file_req(Op::Read, 0, 8),
            file_req(Op::Advise(Advice::DontNeed), 0, 0),
            file_req(Op::Read, 0, 8),
        ];
        let mut out = Vec::new();
        sim.run(&mut VecSource::new(items), &mut |c| {
            out.push((c.req.op, c.rec.cache))
        })
        .unwrap();
        assert_eq!(
            out,
            vec![
                (Op::Read, CacheOutcome::Miss),
                (Op::Read, CacheOutcome::Hit),
                (Op::Advise(Advice::DontNeed), CacheOutcome::None),
                (Op::Read, CacheOutcome::Miss),
            ]
        );
        let stats = sim.components()[0].stats();
        assert!(stats
            .iter()
            .any(|(k, v)| k == "pagecache hit pages" && *v == 1.0));
    }

    #[test]
    fn policies_parse() {
        assert_eq!(HostPolicy::parse("linux").unwrap(), HostPolicy::Linux);
        assert_eq!(
            HostPolicy::parse("windows-xp").unwrap(),
            HostPolicy::WindowsXp
        );
        assert!(HostPolicy::parse("beos").is_err());
        assert_eq!(
            IoScheduler::from_sysfs("none [mq-deadline] kyber bfq\n").unwrap(),
            IoScheduler::MqDeadline
        );
        assert_eq!(
            IoScheduler::from_sysfs("[none] mq-deadline\n").unwrap(),
            IoScheduler::None
        );
        assert!(IoScheduler::from_sysfs("none mq-deadline [bfq]").is_err());
        assert!(
            HostParams::linux_defaults()
                .stack()
                .components()
                .unwrap()
                .len()
                == 2
        );
        let none = HostParams {
            policy: HostPolicy::None,
            ..HostParams::linux_defaults()
        };
        assert!(none.stack().components().unwrap().is_empty());
    }
}
