//! The testbed's state file: what `up` was asked for and what the supervisor built (the
//! namespaces' places, or the hosts' directories and nodes), read by `status`, `bench` and
//! `down`, and by the next `up` to find what a dead supervisor left.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use iolab_hosts::TiersInventory;
use serde::{Deserialize, Serialize};

use crate::stack::{Place, StackConfig};

/// What `up` was asked for.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct UpConfig {
    /// Link rate in bit/s on every veth (tbf), if any.
    pub rate_bps: Option<u64>,
    /// One-way delay on every veth (netem), if any.
    pub delay_us: Option<u64>,
    /// Run the testbed's own stack with ODB.
    pub odb: bool,
    /// Base port of the testbed's stack (the bench uses others).
    pub port: u16,
    /// The hosts file of `up --hosts` (None: namespaces on this machine).
    #[serde(default)]
    pub hosts: Option<PathBuf>,
}

/// Everything `status`, `bench` and `down` need, written by the supervisor.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct State {
    pub supervisor_pid: u32,
    pub up: UpConfig,
    pub namespaces: Vec<(String, String)>,
    pub client: Place,
    pub fe: Place,
    /// The FE's client-facing address.
    pub fe_client: Ipv4Addr,
    pub is: Place,
    pub be: Place,
    /// ODB domain (the subnets of links B, C, D).
    pub domain: String,
    /// (tier, interface) for every tier-side interface.
    pub ifaces: Vec<(String, String)>,
    pub dir: PathBuf,
    pub root: PathBuf,
    pub cgroup: Option<PathBuf>,
    pub configs: Vec<(String, String)>,
    pub qdiscs: Vec<String>,
    /// The hosts of `up --hosts` (None: this machine's namespaces).
    #[serde(default)]
    pub hosts: Option<HostsState>,
}

impl State {
    pub fn ns(&self, tier: &str) -> Option<&str> {
        self.namespaces
            .iter()
            .find(|(t, _)| t == tier)
            .map(|(_, n)| n.as_str())
    }

    /// A stack config in this testbed's namespaces on `port`.
    pub fn stack_config(
        &self,
        port: u16,
        dir: PathBuf,
        odb: Option<crate::stack::Odb>,
        cpus: Option<String>,
    ) -> StackConfig {
        StackConfig {
            fe: self.fe.clone(),
            is: self.is.clone(),
            be: self.be.clone(),
            port,
            dir,
            root: self.root.clone(),
            odb,
            loopback: false,
            workers: 1,
            skip_be: false,
            fe_listen: Some(self.fe_client),
            domain: Some(self.domain.clone()),
            cpus,
            php: false,
        }
    }
}

/// Where the state lives: /run/iolab-tiers (or $IOLAB_TIERS_DIR).
pub fn state_dir() -> PathBuf {
    std::env::var_os("IOLAB_TIERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/iolab-tiers"))
}

pub fn state_path() -> PathBuf {
    state_dir().join("state.json")
}

/// The state of a running testbed (None if none is up; a state left by a dead supervisor
/// counts as none).
pub fn load_state() -> Option<State> {
    let s: State = serde_json::from_slice(&std::fs::read(state_path()).ok()?).ok()?;
    iolab_sys::process::exists(s.supervisor_pid).then_some(s)
}

/// Writes the state file (whole or not at all: a new file renamed over the old).
pub fn write_state(state: &State) -> anyhow::Result<()> {
    let tmp = state_dir().join(".state.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(state)?)?;
    std::fs::rename(&tmp, state_path())?;
    Ok(())
}

/// Where a run's files are on one host (kept in the state: `bench`, `status` and `down`
/// find them there).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteDir {
    pub role: String,
    pub dir: String,
    pub iolab: String,
    pub odb_lib: String,
}

/// The hosts part of the testbed's state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostsState {
    pub inventory_file: PathBuf,
    pub inventory: TiersInventory,
    pub known_hosts: PathBuf,
    pub accept_new: bool,
    pub dirs: Vec<RemoteDir>,
    /// The testbed's own stack's nodes: (tier, node directory on its host).
    pub nodes: Vec<(String, String)>,
    /// Each host's description (kernel, CPUs, model, memory, hostname), by role.
    pub machines: Vec<(String, BTreeMap<String, String>)>,
}
