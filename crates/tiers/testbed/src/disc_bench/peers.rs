//! The three configurations' tiers: the nginx chain (a [`Stack`]) or our tiers (`iolab disc
//! be|proxy` processes, started from their [`children`](crate::children) specs), each in its
//! namespace, cgroup and CPUs, stopped when dropped.

use super::net::Net;
use super::{Config, DiscOpts};
use crate::children::{BeDp, DiscBeSpec, DiscProxySpec, DiscRole};
use crate::stack::{die_with_parent, enter_cgroup, enter_ns, reap_by, Place, Stack, StackConfig};
use anyhow::Context;
use std::net::{SocketAddr, SocketAddrV4};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One configuration while it runs.
pub(super) enum Peers {
    Nginx(Box<Stack>),
    Ours {
        procs: Vec<(String, Child)>,
        fe_if: Option<(String, String)>,
    },
}

impl Peers {
    pub(super) fn fe_pid(&self) -> Option<u32> {
        match self {
            Peers::Ours { procs, .. } => procs.iter().find(|(t, _)| t == "fe").map(|(_, c)| c.id()),
            _ => None,
        }
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        if let Peers::Ours { procs, fe_if } = self {
            for (_, c) in procs.iter().rev() {
                let _ = iolab_sys::process::signal(c.id(), libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            for (_, c) in procs.iter_mut() {
                reap_by(c, deadline);
            }
            // the hooks go with the FE's process; the qdisc it attached them to must too, so
            // the next configuration meets a plain interface
            if let Some((ns, iface)) = fe_if {
                let _ = Command::new("ip")
                    .args([
                        "netns", "exec", ns, "tc", "qdisc", "del", "dev", iface, "clsact",
                    ])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

impl Config {
    /// The FE's port of this configuration (IS +1, BE +2, DP +3).
    fn port(self) -> u16 {
        match self {
            Config::Nginx => 8080,
            Config::Ours => 8090,
            Config::Disc => 8100,
        }
    }
}

pub(super) fn fe_url(net: &Net, config: Config, size: usize) -> String {
    format!("http://{}:{}/f{size}", net.fe_client, config.port())
}

fn nginx_config(net: &Net, o: &DiscOpts) -> StackConfig {
    let place = |ns: &str, addr| Place {
        ns: Some(ns.to_string()),
        addr,
    };
    StackConfig {
        fe: place(&net.ns[1], net.fe),
        is: place(&net.ns[2], net.is),
        be: place(&net.ns[3], net.be),
        port: Config::Nginx.port(),
        dir: o.dir.join("nginx"),
        root: o.root.clone(),
        odb: None,
        loopback: false,
        workers: 1,
        skip_be: false,
        fe_listen: Some(net.fe_client),
        domain: None,
        cpus: Some(o.tier_cpus.clone()),
        php: false,
    }
}

/// One of our tiers: the BE or a proxy.
pub(super) enum OurTier {
    Be(DiscBeSpec),
    Proxy(DiscProxySpec),
}

impl OurTier {
    /// The arguments after `iolab`.
    pub(super) fn to_args(&self) -> Vec<String> {
        match self {
            OurTier::Be(s) => s.to_args(),
            OurTier::Proxy(s) => s.to_args(),
        }
    }

    fn listen(&self) -> SocketAddr {
        match self {
            OurTier::Be(s) => s.listen,
            OurTier::Proxy(s) => s.listen,
        }
    }
}

/// Where the BE writes the run's DP key (mode 0600) and the FE reads it.
fn dp_key_file(o: &DiscOpts) -> std::path::PathBuf {
    o.dir.join("dp.key")
}

/// Our tiers in a configuration (DISC direct or off), BE first: (tier, what it runs).
pub(super) fn our_tiers(net: &Net, o: &DiscOpts, disc: bool) -> Vec<(&'static str, OurTier)> {
    let p = if disc { Config::Disc } else { Config::Ours }.port();
    let at = |addr, port| SocketAddr::V4(SocketAddrV4::new(addr, port));
    let (fe, is, be) = (at(net.fe_client, p), at(net.is, p + 1), at(net.be, p + 2));
    let mode = if disc {
        DiscRole::Direct
    } else {
        DiscRole::Off
    };
    let be_spec = DiscBeSpec {
        listen: be,
        root: o.root.clone(),
        dp: disc.then(|| BeDp {
            listen: at(net.dp, p + 3),
            advertise: None,
            threshold: None,
            send: o.dp_send,
            no_ack_tap: o.dp_acks_forwarded,
            key_file: dp_key_file(o),
            peers: vec![net.fe_dp.into()],
            upstreams: vec![net.is_be.into()],
        }),
        timeouts: Default::default(),
    };
    let proxy = |listen, up, first: bool| DiscProxySpec {
        listen,
        upstream: vec![up],
        first,
        disc: mode,
        hook_iface: (first && disc).then(|| net.fe_if.clone()),
        stall_secs: None,
        dp_key_file: (first && disc).then(|| dp_key_file(o)),
        timeouts: Default::default(),
    };
    vec![
        ("be", OurTier::Be(be_spec)),
        ("is", OurTier::Proxy(proxy(is, be, false))),
        ("fe", OurTier::Proxy(proxy(fe, is, true))),
    ]
}

pub(super) fn start(
    config: Config,
    net: &Net,
    o: &DiscOpts,
    cg: &crate::cpu::Cgroups,
) -> anyhow::Result<Peers> {
    if config == Config::Nginx {
        return Ok(Peers::Nginx(Box::new(Stack::start(
            nginx_config(net, o),
            Some(cg),
        )?)));
    }
    let disc = config == Config::Disc;
    let dir = o.dir.join(config.name());
    std::fs::create_dir_all(&dir)?;
    let mut peers = Peers::Ours {
        procs: Vec::new(),
        fe_if: disc.then(|| (net.ns[1].clone(), net.fe_if.clone())),
    };
    for (tier, spec) in our_tiers(net, o, disc) {
        let mut c = Command::new("taskset");
        c.args(["-c", &o.tier_cpus])
            .arg(&o.exe)
            .args(spec.to_args());
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{tier}.log")))?);
        enter_ns(&mut c, net.tier_ns(tier))?;
        enter_cgroup(&mut c, &cg.dir(tier))?;
        die_with_parent(&mut c);
        let mut child = c.spawn().with_context(|| format!("starting our {tier}"))?;
        let SocketAddr::V4(listen) = spec.listen() else {
            unreachable!("the bench's addresses are IPv4")
        };
        let r = crate::stack::wait_listening(
            listen,
            Some(net.tier_ns(tier)),
            &mut child,
            &format!("our {tier}"),
        );
        if let Peers::Ours { procs, .. } = &mut peers {
            procs.push((tier.to_string(), child));
        }
        r.with_context(|| {
            std::fs::read_to_string(dir.join(format!("{tier}.log"))).unwrap_or_default()
        })?;
    }
    Ok(peers)
}
