//! The remote side of `tiers up --hosts`: `iolab tiers node --spec JSON`, one tier of one
//! stack on the host it runs on, started by the controller under a lease
//! ([`iolab_hosts::Leased`]). It creates its own directory (which must not exist), writes
//! the tier's nginx configuration and the BE's payloads there, starts nginx (and on the BE
//! with ODB the buffer agent) in a cgroup of its own when it can make one, writes
//! `node.json` ([`NodeStatus`]) once the tier listens, and on SIGTERM (the lease's end)
//! stops them and removes its directory.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::stack::{AgentProgram, Odb, Place, Stack, StackConfig, TIERS};

/// Most payload files a BE node writes, and the largest (the bench's sizes are up to 1 MiB).
pub const MAX_PAYLOADS: usize = 32;
pub const MAX_PAYLOAD: usize = 64 << 20;
/// The node's status file in its directory.
pub const STATUS_FILE: &str = "node.json";

/// One tier of one stack on one host: what the controller serialises and the node reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// `fe`, `is` or `be`.
    pub tier: String,
    /// The node's directory (absolute; made by the node, so it must not exist yet).
    pub dir: PathBuf,
    /// The tiers' addresses (each one its host's).
    pub fe: Ipv4Addr,
    pub is: Ipv4Addr,
    pub be: Ipv4Addr,
    /// Base port: FE on it, IS +1, BE +2, the BE's agent +3.
    pub port: u16,
    /// CPUs the tier's processes are pinned to (empty: not pinned).
    pub cpus: Vec<usize>,
    /// BE: the payload files `/f<size>` to write.
    pub payload_sizes: Vec<usize>,
    /// ODB in this tier's nginx (and the agent, on the BE).
    pub odb: Option<NodeOdb>,
}

/// ODB on a host: the preload library there and the agent's settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeOdb {
    pub lib: PathBuf,
    pub agent_memory_mib: u64,
    pub threshold: usize,
}

/// What a running node tells the controller (its `node.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node's pid: the leader of the lease's session, which holds the tier's processes.
    pub pid: u32,
    /// The tier's cgroup directory (None: none could be made; CPU is then read from the
    /// session's processes in /proc).
    pub cgroup: Option<PathBuf>,
    pub cgroup_v2: bool,
    /// The tier's nginx configuration as written.
    pub config: String,
}

impl NodeSpec {
    /// The words after `iolab` that run this node.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "tiers".into(),
            "node".into(),
            "--spec".into(),
            serde_json::to_string(self).expect("a spec serialises"),
        ]
    }

    /// The spec of `--spec`, checked.
    pub fn from_json(text: &str) -> anyhow::Result<NodeSpec> {
        let s: NodeSpec = serde_json::from_str(text).context("--spec: a node spec (JSON)")?;
        s.check()?;
        Ok(s)
    }

    fn check(&self) -> anyhow::Result<()> {
        if !TIERS.contains(&self.tier.as_str()) {
            bail!("node spec: tier {:?} is none of fe, is, be", self.tier);
        }
        if !self.dir.is_absolute() || self.dir.parent().is_none() {
            bail!(
                "node spec: directory {} is not an absolute path",
                self.dir.display()
            );
        }
        if self.payload_sizes.len() > MAX_PAYLOADS
            || self.payload_sizes.iter().any(|&s| s > MAX_PAYLOAD)
        {
            bail!("node spec: at most {MAX_PAYLOADS} payloads of at most {MAX_PAYLOAD} bytes");
        }
        if self.port > u16::MAX - 3 {
            bail!(
                "node spec: port {} leaves no room for IS, BE and agent",
                self.port
            );
        }
        Ok(())
    }

    /// The address and port this node's tier serves on.
    pub fn listen(&self) -> SocketAddrV4 {
        self.stack_config(PathBuf::new(), None).listen(&self.tier)
    }

    /// The ODB domain: the three tiers' hosts.
    pub fn stack_domain(&self) -> String {
        format!("{},{},{}", self.fe, self.is, self.be)
    }

    fn stack_config(&self, exe: PathBuf, root: Option<PathBuf>) -> StackConfig {
        let place = |addr| Place { ns: None, addr };
        let cpus: Vec<String> = self.cpus.iter().map(usize::to_string).collect();
        StackConfig {
            fe: place(self.fe),
            is: place(self.is),
            be: place(self.be),
            port: self.port,
            dir: self.dir.join("stack"),
            root: root.unwrap_or_else(|| self.dir.join("www")),
            odb: self.odb.as_ref().map(|o| Odb {
                lib: o.lib.clone(),
                agent: AgentProgram::Iolab(exe),
                agent_memory_mib: o.agent_memory_mib,
                threshold: o.threshold,
                file_refs: true,
            }),
            loopback: false,
            workers: 1,
            skip_be: false,
            fe_listen: None,
            domain: Some(self.stack_domain()),
            cpus: (!cpus.is_empty()).then(|| cpus.join(",")),
            php: false,
        }
    }
}

/// Removes the node's directory when dropped (after the stack has stopped).
struct OwnDir(PathBuf);
impl Drop for OwnDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the node until SIGTERM, SIGINT or SIGHUP, or until one of its processes exits
/// (an error). `exe`: this iolab, which runs the agent.
pub fn run(spec: &NodeSpec, exe: &Path) -> anyhow::Result<()> {
    spec.check()?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    std::fs::create_dir(&spec.dir)
        .with_context(|| format!("creating the node's directory {}", spec.dir.display()))?;
    let _own = OwnDir(spec.dir.clone());
    let tier = spec.tier.as_str();
    let cg = match crate::cpu::Cgroups::new(&format!("node{tier}"), &[tier]) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!("no cgroup for the {tier} ({e:#}): CPU read from /proc");
            None
        }
    };
    let cfg = spec.stack_config(exe.to_path_buf(), None);
    if tier == "be" {
        crate::testutil::write_payloads(&cfg.root, &spec.payload_sizes)?;
    }
    let mut stack = Stack::start_tiers(cfg, cg.as_ref(), &[tier])
        .with_context(|| format!("starting the {tier}"))?;
    let status = NodeStatus {
        pid: std::process::id(),
        cgroup: cg.as_ref().map(|c| c.dir(tier)),
        cgroup_v2: cg.as_ref().is_some_and(|c| c.is_v2()),
        config: stack
            .configs
            .iter()
            .find(|(t, _)| t == tier)
            .map(|(_, c)| c.clone())
            .unwrap_or_default(),
    };
    let tmp = spec.dir.join(".node.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(&status)?)?;
    std::fs::rename(&tmp, spec.dir.join(STATUS_FILE))?;
    tracing::info!(target: "progress", "{tier} serving on {}", spec.listen());
    let result = loop {
        if stop.load(Ordering::Relaxed) {
            break Ok(());
        }
        if let Some((name, st)) = stack
            .procs
            .iter_mut()
            .find_map(|(n, c)| c.try_wait().ok().flatten().map(|st| (n.clone(), st)))
        {
            break Err(anyhow::anyhow!("{name} exited ({st})"));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(stack);
    drop(cg);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> NodeSpec {
        NodeSpec {
            tier: "is".into(),
            dir: "/tmp/iolab-tiers-1-2/t-is".into(),
            fe: "10.0.0.2".parse().unwrap(),
            is: "10.0.0.3".parse().unwrap(),
            be: "10.0.0.4".parse().unwrap(),
            port: 18180,
            cpus: vec![0, 2],
            payload_sizes: vec![],
            odb: Some(NodeOdb {
                lib: "/x/libiolab_odb.so".into(),
                agent_memory_mib: 256,
                threshold: 4096,
            }),
        }
    }

    /// The spec goes through its one argument and back; each tier listens at its host's
    /// address on its port, the domain is the three hosts.
    #[test]
    fn a_node_spec_goes_through_its_argument_and_back() {
        let s = spec();
        let args = s.to_args();
        assert_eq!(args[..3], ["tiers", "node", "--spec"]);
        assert_eq!(NodeSpec::from_json(&args[3]).unwrap(), s);
        assert_eq!(s.listen().to_string(), "10.0.0.3:18181");
        let be = NodeSpec {
            tier: "be".into(),
            ..s.clone()
        };
        assert_eq!(be.listen().to_string(), "10.0.0.4:18182");
        let c = s.stack_config("/bin/iolab".into(), None);
        assert_eq!(c.domain(), "10.0.0.2,10.0.0.3,10.0.0.4");
        assert_eq!(c.cpus.as_deref(), Some("0,2"));
        assert_eq!(c.agent_addr().to_string(), "10.0.0.4:18183");
    }

    #[test]
    fn bad_node_specs_are_refused() {
        let json = |f: &dyn Fn(&mut NodeSpec)| {
            let mut s = spec();
            f(&mut s);
            serde_json::to_string(&s).unwrap()
        };
        for (text, why) in [
            (json(&|s| s.tier = "db".into()), "tier"),
            (json(&|s| s.dir = "rel/dir".into()), "absolute"),
            (json(&|s| s.payload_sizes = vec![1 << 30]), "at most"),
            (json(&|s| s.port = 65534), "port"),
            ("{\"tier\":\"fe\"}".into(), "node spec"),
            ("not json".into(), "node spec"),
        ] {
            let e = format!("{:#}", NodeSpec::from_json(&text).unwrap_err());
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
