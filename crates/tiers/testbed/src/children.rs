//! The roles in which the tiers start `iolab` again as a child process: one type per role,
//! turned into the child's arguments here (`to_args`, the words after `iolab`) and built from
//! them by the command line (src/cli/tiers.rs, src/cli/disc.rs converts its flags to the same
//! type; src/cli has the round trip tests), so that a renamed field is a compile error and a
//! renamed flag a failed test, not a child started with flags it ignores. The buffer agent's
//! role is `iolab_odb::spec::AgentSpec` (also read by `iolab-odb-agent`).
//!
//! Optional fields stand for flags the launcher leaves out: `None` is the child's default.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

fn words(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `iolab tiers supervise`: the testbed's supervisor (started by `up`, with `up`'s flags).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuperviseSpec {
    /// Rate limit on every link (tbf), as given (`1gbit`).
    pub rate: Option<String>,
    /// One-way delay on every link (netem), as given (`1ms`).
    pub delay: Option<String>,
    /// The testbed's own nginx without ODB.
    pub vanilla: bool,
    /// Base port of the testbed's nginx.
    pub port: u16,
    /// The hosts file of `up --hosts` (None: namespaces on this machine).
    pub hosts: Option<PathBuf>,
}

impl SuperviseSpec {
    pub fn to_args(&self) -> Vec<String> {
        let mut v = words(&["tiers", "supervise", "--port"]);
        v.push(self.port.to_string());
        if let Some(r) = &self.rate {
            v.extend(["--rate".into(), r.clone()]);
        }
        if let Some(d) = &self.delay {
            v.extend(["--delay".into(), d.clone()]);
        }
        if self.vanilla {
            v.push("--vanilla".into());
        }
        if let Some(h) = &self.hosts {
            v.extend(["--hosts".into(), h.display().to_string()]);
        }
        v
    }
}

/// How DP puts the payload on the wire (`iolab disc be --dp-send`; the library's
/// `iolab_disc::dp::SendPath`, which the tiers do not link).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DpSend {
    #[default]
    Gso,
    Raw,
    Xdp,
    Repair,
}

impl DpSend {
    /// The flag's value.
    pub fn name(self) -> &'static str {
        match self {
            DpSend::Gso => "gso",
            DpSend::Raw => "raw",
            DpSend::Xdp => "xdp",
            DpSend::Repair => "repair",
        }
    }
}

/// How a proxy takes part in DISC (`iolab disc proxy --disc`; the library's
/// `iolab_disc::proxy::DiscMode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DiscRole {
    #[default]
    Off,
    Relay,
    Direct,
}

impl DiscRole {
    /// The flag's value.
    pub fn name(self) -> &'static str {
        match self {
            DiscRole::Off => "off",
            DiscRole::Relay => "relay",
            DiscRole::Direct => "direct",
        }
    }
}

/// The client-connection deadlines of our tiers (`--header-timeout`, `--send-timeout`), in
/// seconds: None is the tier's default (60 s, as nginx), 0 none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierTimeouts {
    /// A whole request head, from its first byte.
    pub header_secs: Option<u64>,
    /// Bytes waiting for the client with none acknowledged.
    pub send_secs: Option<u64>,
}

impl TierTimeouts {
    fn push_args(&self, v: &mut Vec<String>) {
        if let Some(s) = self.header_secs {
            v.extend(["--header-timeout".into(), s.to_string()]);
        }
        if let Some(s) = self.send_secs {
            v.extend(["--send-timeout".into(), s.to_string()]);
        }
    }
}

/// `iolab disc be`: our BE, a static file server, with DP when `dp` is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscBeSpec {
    pub listen: SocketAddr,
    /// Directory served.
    pub root: PathBuf,
    pub dp: Option<BeDp>,
    pub timeouts: TierTimeouts,
}

/// The BE's DP (the flags that mean something only with `--dp`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BeDp {
    /// DP's control endpoint.
    pub listen: SocketAddr,
    /// Address the FE reaches DP at (None: `listen`).
    pub advertise: Option<SocketAddr>,
    /// Smallest payload shortcut, in bytes (None: the BE's default).
    pub threshold: Option<u64>,
    pub send: DpSend,
    /// The FE forwards the client's ACKs (no tap).
    pub no_ack_tap: bool,
    /// Where the BE writes the run's key of DP's control connections (mode 0600, replaced
    /// at each start); the FE reads it ([`DiscProxySpec::dp_key_file`]).
    pub key_file: PathBuf,
    /// Addresses the FE tiers' control connections come from; DP refuses any other.
    pub peers: Vec<IpAddr>,
    /// Addresses of the BE's upstream tiers: the BE closes connections from any other.
    pub upstreams: Vec<IpAddr>,
}

impl DiscBeSpec {
    pub fn to_args(&self) -> Vec<String> {
        let mut v = words(&["disc", "be", "--listen"]);
        v.push(self.listen.to_string());
        v.extend(["--root".into(), self.root.display().to_string()]);
        if let Some(dp) = &self.dp {
            v.extend(["--dp".into(), dp.listen.to_string()]);
            v.extend(["--dp-send".into(), dp.send.name().into()]);
            if dp.no_ack_tap {
                v.push("--no-ack-tap".into());
            }
            if let Some(a) = dp.advertise {
                v.extend(["--dp-advertise".into(), a.to_string()]);
            }
            if let Some(t) = dp.threshold {
                v.extend(["--threshold".into(), t.to_string()]);
            }
            v.extend(["--dp-key-file".into(), dp.key_file.display().to_string()]);
            for p in &dp.peers {
                v.extend(["--dp-peer".into(), p.to_string()]);
            }
            for u in &dp.upstreams {
                v.extend(["--upstream-peer".into(), u.to_string()]);
            }
        }
        self.timeouts.push_args(&mut v);
        v
    }
}

/// `iolab disc proxy`: our FE (`first`) or IS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscProxySpec {
    pub listen: SocketAddr,
    /// Round robin per client connection.
    pub upstream: Vec<SocketAddr>,
    /// This tier holds the clients' connections (the FE).
    pub first: bool,
    pub disc: DiscRole,
    /// The FE's client-side interface for the eBPF hooks (direct mode).
    pub hook_iface: Option<String>,
    /// Direct mode: seconds a payload may make no progress (None: the proxy's default).
    pub stall_secs: Option<u64>,
    /// The FE role: the file the BE wrote the run's DP key to ([`BeDp::key_file`]).
    pub dp_key_file: Option<PathBuf>,
    pub timeouts: TierTimeouts,
}

impl DiscProxySpec {
    pub fn to_args(&self) -> Vec<String> {
        let mut v = words(&["disc", "proxy", "--listen"]);
        v.push(self.listen.to_string());
        for u in &self.upstream {
            v.extend(["--upstream".into(), u.to_string()]);
        }
        v.extend(["--disc".into(), self.disc.name().into()]);
        if self.first {
            v.push("--first".into());
        }
        if let Some(i) = &self.hook_iface {
            v.extend(["--hook-iface".into(), i.clone()]);
        }
        if let Some(s) = self.stall_secs {
            v.extend(["--stall-secs".into(), s.to_string()]);
        }
        if let Some(k) = &self.dp_key_file {
            v.extend(["--dp-key-file".into(), k.display().to_string()]);
        }
        self.timeouts.push_args(&mut v);
        v
    }
}

/// `iolab disc dp-setup`, run inside DP's namespace: makes it ready for DP's repaired
/// sockets (`--dp-send repair`) and prints each command it ran, one per line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DpSetupSpec {
    /// The FE's client-facing address (made local here: the ACK clones are addressed to it).
    pub fe: Ipv4Addr,
    /// The client's subnet (CIDR) and the next hop to it.
    pub client_net: String,
    pub via: Ipv4Addr,
    /// DP's interface on the FE's link.
    pub fe_link: String,
}

impl DpSetupSpec {
    pub fn to_args(&self) -> Vec<String> {
        let mut v = words(&["disc", "dp-setup", "--fe"]);
        v.push(self.fe.to_string());
        v.extend(["--client-net".into(), self.client_net.clone()]);
        v.extend(["--via".into(), self.via.to_string()]);
        v.extend(["--fe-link".into(), self.fe_link.clone()]);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `tiers bench --disc` starts (its JSON and table print these command lines).
    #[test]
    fn the_disc_bench_s_command_lines_are_as_they_were() {
        let be = DiscBeSpec {
            listen: "10.0.0.66:8102".parse().unwrap(),
            root: "/run/www".into(),
            dp: Some(BeDp {
                listen: "10.0.0.98:8103".parse().unwrap(),
                advertise: None,
                threshold: None,
                send: DpSend::Repair,
                no_ack_tap: true,
                key_file: "/run/dp.key".into(),
                peers: vec!["10.0.0.97".parse().unwrap()],
                upstreams: vec!["10.0.0.65".parse().unwrap()],
            }),
            timeouts: TierTimeouts::default(),
        };
        assert_eq!(
            be.to_args().join(" "),
            "disc be --listen 10.0.0.66:8102 --root /run/www --dp 10.0.0.98:8103 --dp-send repair --no-ack-tap \
             --dp-key-file /run/dp.key --dp-peer 10.0.0.97 --upstream-peer 10.0.0.65"
        );
        let fe = DiscProxySpec {
            listen: "10.0.0.2:8100".parse().unwrap(),
            upstream: vec!["10.0.0.34:8101".parse().unwrap()],
            first: true,
            disc: DiscRole::Direct,
            hook_iface: Some("tie0".into()),
            stall_secs: None,
            dp_key_file: Some("/run/dp.key".into()),
            timeouts: TierTimeouts::default(),
        };
        assert_eq!(
            fe.to_args().join(" "),
            "disc proxy --listen 10.0.0.2:8100 --upstream 10.0.0.34:8101 --disc direct --first --hook-iface tie0 \
             --dp-key-file /run/dp.key"
        );
        let up = SuperviseSpec {
            rate: Some("1gbit".into()),
            delay: None,
            vanilla: true,
            port: 18080,
            hosts: None,
        };
        assert_eq!(
            up.to_args().join(" "),
            "tiers supervise --port 18080 --rate 1gbit --vanilla"
        );
        let on_hosts = SuperviseSpec {
            rate: None,
            hosts: Some("/etc/iolab/tiers.toml".into()),
            ..up
        };
        assert_eq!(
            on_hosts.to_args().join(" "),
            "tiers supervise --port 18080 --vanilla --hosts /etc/iolab/tiers.toml"
        );
    }
}
