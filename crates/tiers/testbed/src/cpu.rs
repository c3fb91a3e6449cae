//! Per-tier figures: CPU time (a cgroup per tier: v1 `cpuacct.usage`, v2 `cpu.stat`), bytes
//! through interfaces (`ip -s -j link` in the tier's namespace), ODB counters.

use anyhow::Context;
use iolab_odb::counters::OdbCounters;
use std::path::{Path, PathBuf};

/// One cgroup per tier under `<root>/iolab-tiers-<pid>-<tag>/<tier>`, removed on drop.
pub struct Cgroups {
    pub base: PathBuf,
    v2: bool,
}

const V1: &str = "/sys/fs/cgroup/cpuacct";
const V2: &str = "/sys/fs/cgroup";

pub fn cgroup_root() -> Option<(PathBuf, bool)> {
    if Path::new(V1).join("cpuacct.usage").exists() {
        return Some((V1.into(), false));
    }
    if Path::new(V2).join("cgroup.controllers").exists() {
        return Some((V2.into(), true));
    }
    None
}

impl Cgroups {
    pub fn new(tag: &str, tiers: &[&str]) -> anyhow::Result<Cgroups> {
        let (root, v2) = cgroup_root().context("no cgroup cpu accounting (v1 cpuacct or v2)")?;
        let base = root.join(format!("iolab-tiers-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
        for t in tiers {
            std::fs::create_dir_all(base.join(t))?;
        }
        Ok(Cgroups { base, v2 })
    }

    pub fn dir(&self, tier: &str) -> PathBuf {
        self.base.join(tier)
    }

    /// A cgroup v2 hierarchy (`cpu.stat`) rather than v1's `cpuacct.usage`.
    pub fn is_v2(&self) -> bool {
        self.v2
    }

    /// CPU seconds used so far by the tier's processes (and the ones that exited).
    pub fn cpu_seconds(&self, tier: &str) -> f64 {
        let d = self.dir(tier);
        let file = if self.v2 { "cpu.stat" } else { "cpuacct.usage" };
        let text = std::fs::read_to_string(d.join(file)).unwrap_or_default();
        cgroup_cpu_seconds(&text, self.v2).unwrap_or(0.0)
    }
}

/// The CPU seconds in a cgroup's `cpu.stat` (v2: `usage_usec`) or `cpuacct.usage` (v1:
/// nanoseconds) text.
pub fn cgroup_cpu_seconds(text: &str, v2: bool) -> Option<f64> {
    if v2 {
        text.lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|us| us / 1e6)
    } else {
        text.trim().parse::<f64>().ok().map(|ns| ns / 1e9)
    }
}

fn remove_tree(base: &Path) {
    if let Ok(rd) = std::fs::read_dir(base) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(base);
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        remove_tree(&self.base);
    }
}

/// Removes cgroups `iolab-tiers-<pid>-*` whose owner pid is dead (and that are empty).
pub fn cleanup_stale_cgroups() -> Vec<String> {
    let mut removed = Vec::new();
    let Some((root, _)) = cgroup_root() else {
        return removed;
    };
    let Ok(rd) = std::fs::read_dir(&root) else {
        return removed;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("iolab-tiers-") else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !iolab_sys::process::exists(pid) {
            remove_tree(&e.path());
            removed.push(name);
        }
    }
    removed
}

/// rx/tx bytes of every non-loopback interface in a namespace (None: ours).
pub fn iface_bytes(ns: Option<&str>) -> anyhow::Result<Vec<(String, u64, u64)>> {
    let mut c = std::process::Command::new("ip");
    if let Some(ns) = ns {
        c.args(["-n", ns]);
    }
    let out = c
        .args(["-s", "-j", "link", "show"])
        .output()
        .context("running ip -s -j link")?;
    parse_iface_bytes(&out.stdout)
}

/// rx/tx bytes of every non-loopback interface in `ip -s -j link show`'s output.
pub fn parse_iface_bytes(json: &[u8]) -> anyhow::Result<Vec<(String, u64, u64)>> {
    let v: serde_json::Value = serde_json::from_slice(json).context("parsing ip -j")?;
    let mut r = Vec::new();
    for l in v.as_array().into_iter().flatten() {
        let name = l["ifname"].as_str().unwrap_or("").to_string();
        if name == "lo" {
            continue;
        }
        let st = &l["stats64"];
        r.push((
            name,
            st["rx"]["bytes"].as_u64().unwrap_or(0),
            st["tx"]["bytes"].as_u64().unwrap_or(0),
        ));
    }
    Ok(r)
}

/// The ODB counters of one stack's tiers, each summed over its processes' files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TierCounters {
    pub fe: OdbCounters,
    pub is: OdbCounters,
    pub be: OdbCounters,
}

impl TierCounters {
    pub fn tier(&self, tier: &str) -> &OdbCounters {
        match tier {
            "fe" => &self.fe,
            "is" => &self.is,
            _ => &self.be,
        }
    }
}

impl std::fmt::Display for TierCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&serde_json::to_string(self).map_err(|_| std::fmt::Error)?)
    }
}

/// Sums the ODB counter files of each tier directory under `dir` (dir/<tier>/odb-*.json).
/// A tier without a file, or a file that is not the library's counters, is an error (a
/// counter read as zero would pass a check it should fail).
pub fn odb_counters(dir: &Path) -> anyhow::Result<TierCounters> {
    let mut out = TierCounters::default();
    for (tier, sum) in [
        ("fe", &mut out.fe),
        ("is", &mut out.is),
        ("be", &mut out.be),
    ] {
        *sum = sum_counter_files(&dir.join(tier))
            .with_context(|| format!("ODB counters of the {tier}"))?;
    }
    Ok(out)
}

/// The sum of the `odb-*.json` files in `dir` (one per process).
pub fn sum_counter_files(dir: &Path) -> anyhow::Result<OdbCounters> {
    let mut sum = OdbCounters::default();
    let mut files = 0;
    for e in std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
    {
        let n = e.file_name().to_string_lossy().into_owned();
        if !(n.starts_with("odb-") && n.ends_with(".json")) {
            continue;
        }
        let text = std::fs::read(e.path())?;
        sum += serde_json::from_slice::<OdbCounters>(&text)
            .with_context(|| format!("parsing {}", e.path().display()))?;
        files += 1;
    }
    anyhow::ensure!(files > 0, "no odb-*.json in {}", dir.display());
    Ok(sum)
}

/// The ODB agent's STATS, asked from inside its namespace (a thread that enters it).
pub fn agent_stats_in(ns: Option<&str>, addr: std::net::SocketAddrV4) -> Option<serde_json::Value> {
    let path = ns.map(|n| PathBuf::from(format!("/var/run/netns/{n}")));
    // a short-lived thread of its own: only it enters the namespace
    std::thread::spawn(move || {
        if let Some(p) = path {
            iolab_sys::process::enter_net_namespace_this_thread(&p).ok()?;
        }
        iolab_odb::agent::client::stats(addr).ok()
    })
    .join()
    .ok()
    .flatten()
}
