//! The bench's namespaces and links, and the FE hooks' cost from the kernel's BPF
//! accounting.

use super::TAG;
use crate::children::DpSetupSpec;
use anyhow::{bail, Context};
use serde_json::Value;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

/// Addresses of the bench's namespaces.
pub(super) struct Net {
    net: Option<iolab_netns::Net>,
    pub(super) ns: [String; 4],
    pub(super) fe_client: Ipv4Addr,
    pub(super) fe: Ipv4Addr,
    pub(super) is: Ipv4Addr,
    pub(super) be: Ipv4Addr,
    pub(super) dp: Ipv4Addr,
    /// The FE's address on link D (its control connections to DP come from it).
    pub(super) fe_dp: Ipv4Addr,
    /// The IS's address on link C (its connections to the BE come from it).
    pub(super) is_be: Ipv4Addr,
    /// The FE's interface on link A (where the hooks go).
    pub(super) fe_if: String,
    pub(super) sysctls: Vec<String>,
}

impl Net {
    /// `repair`: DP sends from repaired sockets (`--dp-send repair`): the BE's namespace is
    /// set up for them by `exe` (`iolab disc dp-setup` there).
    pub(super) fn build(exe: &Path, repair: bool) -> anyhow::Result<Net> {
        let _ = iolab_netns::cleanup_stale(TAG);
        let (mut net, ns, sub) = crate::testbed::namespaces(TAG, 4)?;
        let a = |s: u8, host: u8| sub.at(s, 32, host);
        // (left, right, subnet): A, B, C, D, E
        let links = [
            (0usize, 1usize, 0u8),
            (1, 2, 1),
            (2, 3, 2),
            (1, 3, 3),
            (0, 3, 4),
        ];
        let mut ifs = Vec::new();
        for (l, r, s) in links {
            ifs.push(crate::testbed::link(
                &mut net,
                &ns[l],
                &ns[r],
                a(s, 1),
                a(s, 2),
                27,
            )?);
        }
        // DP's segments to the client leave the BE on E
        let client_net = format!("{}/27", a(0, 0));
        ns[3].run(
            "ip",
            &["route", "add", &client_net, "via", &a(4, 1).to_string()],
        )?;
        // every neighbour resolved before the first measured packet: DP's first segments
        // to the client must not wait in an unresolved neighbour's queue (seen: a first
        // 64 KiB DISC answer stalled on a fresh link E)
        // (a connection attempt to a closed port: ARP, SYN, RST; ping is not installed)
        for (l, r, s) in links {
            for (from, to) in [(l, a(s, 2)), (r, a(s, 1))] {
                let url = format!("http://{to}:9/");
                let _ = ns[from].run("curl", &["-s", "--noproxy", "*", "-m", "2", &url]);
            }
        }
        let mut sysctls = Vec::new();
        let e = format!("net.ipv4.conf.{}.rp_filter=0", ifs[4].0.name);
        for kv in ["net.ipv4.conf.all.rp_filter=0", e.as_str()] {
            ns[0].run("sysctl", &["-q", "-w", kv])?;
            sysctls.push(format!("client: {kv}"));
        }
        if repair {
            let setup = DpSetupSpec {
                fe: a(0, 2),
                client_net,
                via: a(4, 1),
                fe_link: ifs[3].1.name.clone(),
            };
            let ran = dp_setup(exe, &ns[3], &setup)?;
            sysctls.extend(ran.into_iter().map(|c| format!("be: {c}")));
        }
        Ok(Net {
            ns: [0, 1, 2, 3].map(|i| ns[i].name().to_string()),
            net: Some(net),
            fe_client: a(0, 2),
            fe: a(1, 1),
            is: a(1, 2),
            be: a(2, 2),
            dp: a(3, 2),
            fe_dp: a(3, 1),
            is_be: a(2, 1),
            fe_if: ifs[0].1.name.clone(),
            sysctls,
        })
    }

    pub(super) fn tier_ns(&self, tier: &str) -> &str {
        match tier {
            "client" => &self.ns[0],
            "fe" => &self.ns[1],
            "is" => &self.ns[2],
            _ => &self.ns[3],
        }
    }

    pub(super) fn bytes(&self, tier: &str) -> u64 {
        crate::cpu::iface_bytes(Some(self.tier_ns(tier)))
            .map(|v| v.iter().map(|(_, rx, tx)| rx + tx).sum())
            .unwrap_or(0)
    }
}

/// Runs `iolab disc dp-setup` (`exe`) inside `ns`: the commands it ran, one per line.
fn dp_setup(
    exe: &Path,
    ns: &iolab_netns::Namespace,
    spec: &DpSetupSpec,
) -> anyhow::Result<Vec<String>> {
    let out = ns
        .command(exe)?
        .args(spec.to_args())
        .output()
        .context("running iolab disc dp-setup")?;
    if !out.status.success() {
        bail!(
            "iolab disc dp-setup in {}: {}: {}",
            ns.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect())
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(n) = self.net.take() {
            if let Err(e) = n.remove() {
                tracing::warn!("disc bench: removing namespaces: {e:#}");
            }
        }
    }
}

/// Restores `kernel.bpf_stats_enabled` when dropped.
pub(super) struct BpfStats(Option<String>);
const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";
impl BpfStats {
    pub(super) fn enable() -> BpfStats {
        let old = std::fs::read_to_string(BPF_STATS).ok();
        if std::fs::write(BPF_STATS, "1").is_err() {
            return BpfStats(None);
        }
        BpfStats(old)
    }
}
impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write(BPF_STATS, old.trim());
        }
    }
}

/// The ids of the BPF programs process `pid` holds open (`prog_id:` in its fds' fdinfo):
/// Debian's bpftool does not list a program's owners, and other DISC runs on the machine
/// may hold programs of the same name.
pub(super) fn prog_ids_of(pid: u32) -> Vec<u64> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("prog_id:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .collect()
}

/// (run_time_ns, run_cnt) of the `disc_egress` and `disc_ingress` programs among `ids`,
/// from the kernel's own accounting (`bpftool prog show --json`).
pub(super) fn hook_stats(ids: &[u64]) -> Option<[(u64, u64); 2]> {
    if ids.is_empty() {
        return None;
    }
    let out = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
        .ok()?;
    parse_hook_stats(&String::from_utf8_lossy(&out.stdout), ids)
}

pub fn parse_hook_stats(json: &str, ids: &[u64]) -> Option<[(u64, u64); 2]> {
    let v: Value = serde_json::from_str(json).ok()?;
    let mut r = [(0, 0); 2];
    let mut found = false;
    for p in v.as_array()? {
        if !p["id"].as_u64().is_some_and(|id| ids.contains(&id)) {
            continue;
        }
        let i = match p["name"].as_str() {
            Some("disc_egress") => 0,
            Some("disc_ingress") => 1,
            _ => continue,
        };
        found = true;
        r[i].0 += p["run_time_ns"].as_u64().unwrap_or(0);
        r[i].1 += p["run_cnt"].as_u64().unwrap_or(0);
    }
    found.then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_stats_count_only_the_fe_process_programs() {
        let j = r#"[{"id":7,"name":"disc_egress","run_time_ns":500,"run_cnt":5},
                    {"id":8,"name":"disc_ingress","run_time_ns":90,"run_cnt":3},
                    {"id":9,"name":"disc_egress","run_time_ns":99999,"run_cnt":1},
                    {"id":10,"name":"other","run_time_ns":1,"run_cnt":1}]"#;
        assert_eq!(parse_hook_stats(j, &[7, 8]), Some([(500, 5), (90, 3)]));
        assert_eq!(parse_hook_stats(j, &[10]), None);
        assert_eq!(parse_hook_stats("not json", &[7]), None);
    }
}
