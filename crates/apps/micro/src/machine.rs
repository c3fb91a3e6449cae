//! The machine a result was measured on: kernel, CPU, and the settings that decide the
//! figures (sysctls, limits). Recorded with every result, as the seeds' method asks.

use std::collections::BTreeMap;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Machine {
    pub hostname: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub mem_total_kib: u64,
    /// Selected sysctls, by their dotted name; absent ones are left out.
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

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
}

impl Machine {
    pub fn collect() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let mem_total_kib = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut sysctls = BTreeMap::new();
        for name in SYSCTLS {
            let path = format!("/proc/sys/{}", name.replace('.', "/"));
            if let Some(v) = read_trim(&path) {
                sysctls.insert(name.to_string(), v);
            }
        }
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the rlimit we pass.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
        Machine {
            hostname: read_trim("/proc/sys/kernel/hostname").unwrap_or_default(),
            kernel: read_trim("/proc/sys/kernel/osrelease").unwrap_or_default(),
            cpu_model,
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            mem_total_kib,
            sysctls,
            nofile_soft: lim.rlim_cur,
            nofile_hard: lim.rlim_max,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_kernel_and_cpus() {
        let m = Machine::collect();
        assert!(!m.kernel.is_empty());
        assert!(m.cpus >= 1);
        assert!(m.nofile_soft > 0);
        assert!(m.sysctls.contains_key("net.core.somaxconn"));
    }
}
