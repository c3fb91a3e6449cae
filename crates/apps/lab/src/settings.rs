//! The settings that decide the result, recorded with it, and warnings for the ones that
//! would distort it (seed 000 §1.4: a short backlog turns into SYN retransmits, TIME_WAIT
//! into port exhaustion).

use std::collections::BTreeMap;
use std::net::IpAddr;

use iolab_sys::host::Machine;

/// What the run will ask of the machine.
#[derive(Debug, Clone)]
pub struct Demand {
    pub max_concurrency: usize,
    pub backlog: u32,
    /// New connections in one point.
    pub max_requests_per_point: u64,
    pub source_addrs: usize,
}

/// Loopback source addresses 127.0.0.2.. that can actually be bound (all of 127/8 is
/// local on Linux; checked anyway).
pub fn source_addrs(n: usize) -> Vec<IpAddr> {
    (2..2 + n as u8)
        .map(|i| IpAddr::from([127, 0, 0, i]))
        .filter(|ip| std::net::TcpListener::bind((*ip, 0)).is_ok())
        .collect()
}

fn port_range(m: &Machine) -> Option<(u64, u64)> {
    let s = m.sysctls.get("net.ipv4.ip_local_port_range")?;
    let mut it = s.split_whitespace().filter_map(|x| x.parse().ok());
    Some((it.next()?, it.next()?))
}

fn sysctl_u64(m: &Machine, k: &str) -> Option<u64> {
    m.sysctls.get(k).and_then(|v| v.trim().parse().ok())
}

/// The settings table and the warnings for this machine and demand.
pub fn assess(
    m: &Machine,
    d: &Demand,
    cpus_for: (Option<usize>, Option<usize>),
) -> (BTreeMap<String, String>, Vec<String>) {
    let mut s = BTreeMap::new();
    let mut w = Vec::new();
    for (k, v) in &m.sysctls {
        s.insert(k.clone(), v.clone());
    }
    s.insert("kernel".into(), m.kernel.clone());
    s.insert(
        "cpu".into(),
        format!("{} ({} CPUs available)", m.cpu_model, m.cpus),
    );
    s.insert("memory".into(), format!("{} MiB", m.mem_total_kib / 1024));
    s.insert(
        "ulimit -n".into(),
        format!("{} (hard {})", m.nofile_soft, m.nofile_hard),
    );
    s.insert("listen backlog asked".into(), d.backlog.to_string());
    if let Ok(l) = std::fs::read_to_string("/proc/loadavg") {
        s.insert(
            "load average at start".into(),
            l.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        );
    }
    s.insert(
        "pinning".into(),
        match cpus_for {
            (Some(a), Some(b)) => format!("server on CPU {a}, client on CPU {b}"),
            _ => "none (fewer than 2 CPUs)".into(),
        },
    );
    s.insert(
        "client source addresses".into(),
        if d.source_addrs == 0 {
            "kernel's choice (127.0.0.1)".into()
        } else {
            format!(
                "127.0.0.2..127.0.0.{} ({} addresses, spread round-robin)",
                d.source_addrs + 1,
                d.source_addrs
            )
        },
    );

    let somaxconn = sysctl_u64(m, "net.core.somaxconn");
    if let Some(sx) = somaxconn {
        if sx < d.backlog as u64 {
            w.push(format!(
                "net.core.somaxconn = {sx} caps the listen backlog below the {} asked: bursts of connections will see dropped SYNs (raise it: sysctl -w net.core.somaxconn={})",
                d.backlog, d.backlog
            ));
        }
        if sx < d.max_concurrency as u64 {
            w.push(format!("net.core.somaxconn = {sx} is below the concurrency asked ({}): expect SYN retransmits at the top levels", d.max_concurrency));
        }
    }
    if let Some(sb) = sysctl_u64(m, "net.ipv4.tcp_max_syn_backlog") {
        if sb < d.max_concurrency as u64 {
            w.push(format!(
                "net.ipv4.tcp_max_syn_backlog = {sb} is below the concurrency asked ({})",
                d.max_concurrency
            ));
        }
    }
    // Client and server each hold up to max_concurrency sockets, plus files and margin.
    let need = d.max_concurrency as u64 + 256;
    if m.nofile_soft < need {
        w.push(format!("ulimit -n = {} is below the {need} descriptors needed at concurrency {}: expect EMFILE errors (raise the hard limit)", m.nofile_soft, d.max_concurrency));
    }
    if let Some((lo, hi)) = port_range(m) {
        let ports = hi.saturating_sub(lo) + 1;
        let tuples = ports * d.source_addrs.max(1) as u64;
        let tw_reuse = m
            .sysctls
            .get("net.ipv4.tcp_tw_reuse")
            .map(|v| v.trim() != "0")
            .unwrap_or(false);
        s.insert(
            "ephemeral ports per point".into(),
            format!(
                "{ports} ports x {} source addresses = {tuples} (TIME_WAIT lasts 60 s)",
                d.source_addrs.max(1)
            ),
        );
        if tuples < d.max_requests_per_point && !tw_reuse {
            w.push(format!(
                "{tuples} ephemeral (address, port) pairs for {} new connections per point with tcp_tw_reuse off: ports may run out (EADDRNOTAVAIL)",
                d.max_requests_per_point
            ));
        }
    }
    if m.cpus < 2 {
        w.push("fewer than 2 CPUs: client and server share one, so the figures mix both".into());
    }
    if let Some(l1) = std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| {
        l.split_whitespace()
            .next()
            .and_then(|x| x.parse::<f64>().ok())
    }) {
        if l1 > m.cpus as f64 {
            w.push(format!("load average {l1:.1} exceeds the {} CPUs at start: other work shares the machine and slows every server alike (compare ratios, not absolutes)", m.cpus));
        }
    }
    (s, w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(somaxconn: &str, nofile: u64) -> Machine {
        let mut sysctls = BTreeMap::new();
        sysctls.insert("net.core.somaxconn".to_string(), somaxconn.to_string());
        sysctls.insert(
            "net.ipv4.ip_local_port_range".to_string(),
            "32768 60999".to_string(),
        );
        sysctls.insert("net.ipv4.tcp_tw_reuse".to_string(), "0".to_string());
        Machine {
            hostname: "h".into(),
            kernel: "6.18".into(),
            cpu_model: "cpu".into(),
            cpus: 2,
            mem_total_kib: 1 << 20,
            sysctls,
            nofile_soft: nofile,
            nofile_hard: nofile,
            collected_at_unix: 0,
        }
    }

    #[test]
    fn warns_on_small_somaxconn_and_ulimit() {
        let d = Demand {
            max_concurrency: 1000,
            backlog: 4096,
            max_requests_per_point: 50_000,
            source_addrs: 0,
        };
        let (s, w) = assess(&machine("128", 512), &d, (Some(0), Some(1)));
        assert!(
            w.iter().any(|x| x.contains("somaxconn = 128 caps")),
            "{w:?}"
        );
        assert!(
            w.iter().any(|x| x.contains("below the concurrency asked")),
            "{w:?}"
        );
        assert!(w.iter().any(|x| x.contains("ulimit -n = 512")), "{w:?}");
        // 28232 ports for 50,000 connections, one address, no tw_reuse.
        assert!(w.iter().any(|x| x.contains("ports may run out")), "{w:?}");
        assert_eq!(s["pinning"], "server on CPU 0, client on CPU 1");
    }

    #[test]
    fn no_port_warning_with_enough_source_addresses() {
        let d = Demand {
            max_concurrency: 1000,
            backlog: 1024,
            max_requests_per_point: 50_000,
            source_addrs: 8,
        };
        let (s, w) = assess(&machine("4096", 65536), &d, (Some(0), Some(1)));
        assert!(
            !w.iter().any(|x| x.contains("somaxconn")
                || x.contains("ulimit")
                || x.contains("ports may")),
            "{w:?}"
        );
        assert!(s["client source addresses"].contains("8 addresses"));
    }

    #[test]
    fn source_addresses_bind() {
        let a = source_addrs(3);
        assert_eq!(a.len(), 3);
        assert_eq!(a[0], IpAddr::from([127, 0, 0, 2]));
    }
}
