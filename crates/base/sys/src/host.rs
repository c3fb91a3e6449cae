//! The host probe: what a result records about the machine it was measured on (kernel, CPU,
//! memory, cgroup limits, sysctls, limits, block devices), read from `/proc` and `/sys` in
//! one place.
//!
//! The pieces return typed values and `None` when the machine does not say; each report maps
//! them to its own JSON (its keys and fallbacks are its own). [`Machine`] is the full record
//! the lab and the microbenchmarks store (`machine` in their JSON).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// The machine a result was measured on: kernel, CPU, and the settings that decide the
/// figures (sysctls, limits). Serialized (feature `serde`) with these field names.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Machine {
    pub hostname: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub mem_total_kib: u64,
    /// Selected sysctls ([`SYSCTLS`]), by their dotted name; absent ones are left out.
    pub sysctls: BTreeMap<String, String>,
    /// Soft limit of open files (`ulimit -n`).
    pub nofile_soft: u64,
    pub nofile_hard: u64,
    pub collected_at_unix: u64,
}

/// Sysctls that decide networking and I/O figures.
pub const SYSCTLS: [&str; 9] = [
    "net.core.somaxconn",
    "net.ipv4.tcp_max_syn_backlog",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_tw_reuse",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_syncookies",
    "net.core.netdev_max_backlog",
    "kernel.io_uring_disabled",
    "fs.file-max",
];

impl Machine {
    /// Reads this machine. What it cannot read is empty, 0 or "unknown" (the CPU model).
    pub fn collect() -> Machine {
        let sysctls = SYSCTLS
            .iter()
            .filter_map(|name| Some((name.to_string(), sysctl(name)?)))
            .collect();
        let (nofile_soft, nofile_hard) = crate::fdlimit::nofile_limit().unwrap_or((0, 0));
        Machine {
            hostname: hostname().unwrap_or_default(),
            kernel: kernel_release().unwrap_or_default(),
            cpu_model: cpu_model().unwrap_or_else(|| "unknown".into()),
            cpus: cpus(),
            mem_total_kib: meminfo()
                .ok()
                .and_then(|m| m.get("MemTotal"))
                .map_or(0, |b| b / 1024),
            sysctls,
            nofile_soft,
            nofile_hard,
            collected_at_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        }
    }

    /// A one-line summary for printed tables.
    pub fn summary(&self) -> String {
        format!(
            "{} | {} CPUs | kernel {} | somaxconn {} | ulimit -n {}",
            self.cpu_model,
            self.cpus,
            self.kernel,
            self.sysctls
                .get("net.core.somaxconn")
                .map(String::as_str)
                .unwrap_or("?"),
            self.nofile_soft
        )
    }
}

/// A file's text with its whitespace runs collapsed to single spaces (sysctls such as
/// `ip_local_port_range` separate their values by tabs).
pub fn read_collapsed(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The value of a sysctl by its dotted name (`net.core.somaxconn`), whitespace collapsed.
pub fn sysctl(name: &str) -> Option<String> {
    read_collapsed(format!("/proc/sys/{}", name.replace('.', "/")))
}

/// The kernel release (`uname -r`).
pub fn kernel_release() -> Option<String> {
    read_collapsed("/proc/sys/kernel/osrelease")
}

/// The host name.
pub fn hostname() -> Option<String> {
    read_collapsed("/proc/sys/kernel/hostname")
}

/// The CPU model, as the first `model name` line of `/proc/cpuinfo` gives it.
pub fn cpu_model() -> Option<String> {
    parse_cpu_model(&std::fs::read_to_string("/proc/cpuinfo").ok()?)
}

/// The `model name` of the text of `/proc/cpuinfo`.
pub fn parse_cpu_model(cpuinfo: &str) -> Option<String> {
    let line = cpuinfo.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

/// The CPUs this process may run on (`available_parallelism`; 1 if unknown).
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `/proc/meminfo`, field by field, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meminfo {
    fields: BTreeMap<String, u64>,
}

impl Meminfo {
    /// Parses the text of `/proc/meminfo`: `Name:  123 kB` is 123 × 1024 bytes, a value
    /// without unit (`HugePages_Total: 0`) is kept as it is; other lines are skipped.
    pub fn parse(text: &str) -> Meminfo {
        let mut fields = BTreeMap::new();
        for line in text.lines() {
            let Some((name, rest)) = line.split_once(':') else {
                continue;
            };
            let mut it = rest.split_whitespace();
            let Some(Ok(n)) = it.next().map(str::parse::<u64>) else {
                continue;
            };
            let v = match it.next() {
                Some("kB") => n.checked_mul(1024),
                None => Some(n),
                _ => None,
            };
            if let Some(v) = v {
                fields.insert(name.trim().to_string(), v);
            }
        }
        Meminfo { fields }
    }

    /// A field by its name without the colon (`MemTotal`, `MemAvailable`), in bytes.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.fields.get(name).copied()
    }
}

/// Reads `/proc/meminfo`.
pub fn meminfo() -> io::Result<Meminfo> {
    Ok(Meminfo::parse(&std::fs::read_to_string("/proc/meminfo")?))
}

/// A cgroup memory limit file's value (`memory.max`, `memory.limit_in_bytes`): `None` for
/// `max` (no limit) or anything that is not a number.
pub fn parse_cgroup_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse().ok()
}

/// The memory limit of a cgroup, and whether it is cgroup v2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimit {
    pub bytes: u64,
    pub v2: bool,
}

/// The effective memory limit of the cgroup named in `proc_self_cgroup` (the text of
/// `/proc/self/cgroup`) under the cgroup mount `root`: the smallest limit from the cgroup up
/// to the root. `None` when there is none (v1 writes "no limit" as a huge number).
pub fn cgroup_memory_limit(proc_self_cgroup: &str, root: &Path) -> Option<CgroupLimit> {
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        let (base, file, v2) = if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes", false)
        } else if controllers.is_empty() && root.join("cgroup.controllers").exists() {
            (root.to_path_buf(), "memory.max", true)
        } else {
            continue;
        };
        let mut dir: PathBuf = base.join(rel);
        let mut best: Option<u64> = None;
        loop {
            if let Some(l) = std::fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|t| parse_cgroup_limit(&t))
            {
                // v1 writes "no limit" as a page-rounded i64::MAX.
                if l < 1 << 60 {
                    best = Some(best.map_or(l, |b| b.min(l)));
                }
            }
            if dir == base || !dir.pop() {
                break;
            }
        }
        if let Some(bytes) = best {
            return Some(CgroupLimit { bytes, v2 });
        }
    }
    None
}

/// The memory limit of this process's cgroup (see [`cgroup_memory_limit`]).
pub fn own_cgroup_memory_limit() -> Option<CgroupLimit> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_memory_limit(&cg, Path::new("/sys/fs/cgroup"))
}

/// The single-line settings of block device `disk` (`/sys/block/<disk>/queue/*`: scheduler,
/// read_ahead_kb, nr_requests, ...), by file name; multi-line and long files are left out.
pub fn block_queue(disk: &str) -> BTreeMap<String, String> {
    let mut queue = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(Path::new("/sys/block").join(disk).join("queue")) else {
        return queue;
    };
    for e in rd.flatten() {
        if let Ok(t) = std::fs::read_to_string(e.path()) {
            let t = t.trim();
            if !t.contains('\n') && t.len() < 200 {
                queue.insert(e.file_name().to_string_lossy().into_owned(), t.into());
            }
        }
    }
    queue
}

/// The size of block device `disk` in bytes (`/sys/block/<disk>/size` counts 512-byte
/// sectors whatever the device's own sector size).
pub fn block_device_bytes(disk: &str) -> Option<u64> {
    let s = std::fs::read_to_string(Path::new("/sys/block").join(disk).join("size")).ok()?;
    s.trim().parse::<u64>().ok()?.checked_mul(512)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_kernel_and_cpus() {
        let m = Machine::collect();
        assert!(!m.kernel.is_empty());
        assert!(m.cpus >= 1);
        assert!(m.nofile_soft > 0);
        assert!(m.mem_total_kib > 0);
        assert!(m.sysctls.contains_key("net.core.somaxconn"));
        assert!(m.summary().contains(&format!("| {} CPUs |", m.cpus)));
        assert_eq!(Some(m.kernel), kernel_release());
    }

    #[test]
    fn cpu_model_and_meminfo_parse() {
        let cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 7B13: x\nflags\t: fpu\n";
        assert_eq!(
            parse_cpu_model(cpuinfo).as_deref(),
            Some("AMD EPYC 7B13: x")
        );
        assert_eq!(parse_cpu_model("processor: 0\n"), None);
        let m = Meminfo::parse(
            "MemTotal:       16316412 kB\nMemAvailable: 2 kB\nHugePages_Total:       3\nOdd: 5 MB\nbad line\n",
        );
        assert_eq!(m.get("MemTotal"), Some(16316412 * 1024));
        assert_eq!(m.get("MemAvailable"), Some(2048));
        assert_eq!(m.get("HugePages_Total"), Some(3));
        assert_eq!(m.get("Odd"), None);
        assert_eq!(m.get("MemFree"), None);
        assert!(meminfo().unwrap().get("MemTotal").is_some());
    }

    #[test]
    fn cgroup_limits_take_the_smallest_up_the_tree() {
        assert_eq!(parse_cgroup_limit("max\n"), None);
        assert_eq!(parse_cgroup_limit("268435456\n"), Some(268435456));
        let root = std::env::temp_dir().join(format!("iolab-sys-cgroup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let leaf = root.join("memory/a/b");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(root.join("memory/a/memory.limit_in_bytes"), "268435456\n").unwrap();
        std::fs::write(leaf.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        let cg = "5:cpu:/x\n4:memory:/a/b\n";
        let want = CgroupLimit {
            bytes: 256 << 20,
            v2: false,
        };
        assert_eq!(cgroup_memory_limit(cg, &root), Some(want));
        assert_eq!(cgroup_memory_limit("4:memory:/\n", &root), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn block_devices_read_as_sysfs_says() {
        assert!(block_queue("iolab-no-such-disk").is_empty());
        assert_eq!(block_device_bytes("iolab-no-such-disk"), None);
        let Some(disk) = std::fs::read_dir("/sys/block")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|d| {
                Path::new("/sys/block")
                    .join(d)
                    .join("queue/scheduler")
                    .exists()
            })
        else {
            return; // no block device with a queue in this container: nothing more to read
        };
        assert!(block_queue(&disk).contains_key("scheduler"), "{disk}");
        assert!(block_device_bytes(&disk).is_some(), "{disk}");
    }
}
