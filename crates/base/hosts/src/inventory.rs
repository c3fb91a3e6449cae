//! The hosts file of `iolab lab --hosts FILE`.
//!
//! ```toml
//! # optional: a known_hosts file to trust; without it the lab keeps its own file and
//! # accepts a host's key the first time (StrictHostKeyChecking=accept-new)
//! known_hosts = "/etc/iolab/known_hosts"
//!
//! [server]
//! address = "10.0.0.2"      # what ssh connects to; also the address the clients load
//! user = "bench"            # default: root
//! port = 22                 # default: 22
//! identity = "~/.ssh/id_ed25519"   # optional
//! cpus = [2, 3]             # optional: where the server runs (taskset)
//! iolab = "/usr/local/bin/iolab"   # or copy = true: the lab copies its own binary
//!
//! [[client]]
//! address = "10.0.0.3"
//! copy = true
//! ```

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;

/// Most client hosts one file may name (each gets an SSH session per point).
pub const MAX_CLIENTS: usize = 64;

/// One host of the inventory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// A name for the report (default: the address).
    #[serde(default)]
    pub name: String,
    pub address: IpAddr,
    #[serde(default = "root")]
    pub user: String,
    #[serde(default = "ssh_port")]
    pub port: u16,
    pub identity: Option<PathBuf>,
    /// CPUs the lab's processes on this host are pinned to (empty: not pinned).
    #[serde(default)]
    pub cpus: Vec<usize>,
    /// The iolab binary on this host.
    pub iolab: Option<PathBuf>,
    /// Copy the controller's own binary to the host (into the run's directory there).
    #[serde(default)]
    pub copy: bool,
}

fn root() -> String {
    "root".into()
}

fn ssh_port() -> u16 {
    22
}

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    pub known_hosts: Option<PathBuf>,
    pub server: Host,
    #[serde(rename = "client", default)]
    pub clients: Vec<Host>,
}

impl Inventory {
    /// Parses and checks an inventory; errors name the file and what is wrong.
    pub fn parse(text: &str, origin: &Path) -> anyhow::Result<Inventory> {
        let mut inv: Inventory =
            toml::from_str(text).with_context(|| format!("{}", origin.display()))?;
        if inv.clients.is_empty() {
            bail!(
                "{}: no [[client]] host: the lab needs at least one host to load the server from",
                origin.display()
            );
        }
        if inv.clients.len() > MAX_CLIENTS {
            bail!(
                "{}: {} client hosts, at most {MAX_CLIENTS}",
                origin.display(),
                inv.clients.len()
            );
        }
        let mut names = Vec::new();
        for (role, h) in std::iter::once(("server", &mut inv.server))
            .chain(inv.clients.iter_mut().map(|c| ("client", c)))
        {
            check_host(origin, role, h, &mut names)?;
        }
        Ok(inv)
    }

    /// Reads and parses `path`.
    pub fn read(path: &Path) -> anyhow::Result<Inventory> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the hosts file {}", path.display()))?;
        Inventory::parse(&text, path)
    }

    /// The server host first, then the clients.
    pub fn hosts(&self) -> impl Iterator<Item = &Host> {
        std::iter::once(&self.server).chain(&self.clients)
    }
}

/// Fills in a host's default name and checks it (how its binary is given, its name, its
/// user, a name given twice: `names` holds those seen so far).
pub(crate) fn check_host(
    origin: &Path,
    role: &str,
    h: &mut Host,
    names: &mut Vec<String>,
) -> anyhow::Result<()> {
    check_host_iolab(origin, role, h, names, true)
}

/// [`check_host`], where `needs_iolab` false lets a host give neither `iolab` nor `copy`
/// (a host that runs no iolab of its own).
pub(crate) fn check_host_iolab(
    origin: &Path,
    role: &str,
    h: &mut Host,
    names: &mut Vec<String>,
    needs_iolab: bool,
) -> anyhow::Result<()> {
    if h.name.is_empty() {
        h.name = h.address.to_string();
    }
    let neither = h.iolab.is_none() && !h.copy;
    if (h.iolab.is_some() && h.copy) || (neither && needs_iolab) {
        bail!(
            "{}: {role} {}: give either iolab = \"PATH\" (the binary on that host) or copy = true",
            origin.display(),
            h.name
        );
    }
    let valid = |c: char| c.is_ascii_alphanumeric() || "-_.:".contains(c);
    if h.name.len() > 64 || !h.name.chars().all(valid) {
        bail!(
            "{}: host name {:?}: up to 64 of a-z A-Z 0-9 - _ . :",
            origin.display(),
            h.name
        );
    }
    if h.user.is_empty() || h.user.starts_with('-') || h.user.contains(char::is_whitespace) {
        bail!(
            "{}: {role} {}: bad user {:?}",
            origin.display(),
            h.name,
            h.user
        );
    }
    if names.contains(&h.name) {
        bail!("{}: host name {} given twice", origin.display(), h.name);
    }
    names.push(h.name.clone());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_inventory_parses_with_defaults() {
        let inv = Inventory::parse(
            "[server]\naddress = \"10.0.0.2\"\niolab = \"/bin/iolab\"\ncpus = [1]\n\n[[client]]\naddress = \"10.0.0.3\"\ncopy = true\nport = 2222\nuser = \"bench\"\n",
            Path::new("h.toml"),
        )
        .unwrap();
        assert_eq!(inv.server.name, "10.0.0.2");
        assert_eq!(inv.server.user, "root");
        assert_eq!(inv.server.cpus, [1]);
        assert_eq!(inv.clients[0].port, 2222);
        assert!(inv.clients[0].copy);
        assert_eq!(inv.hosts().count(), 2);
    }

    #[test]
    fn bad_inventories_say_what_is_wrong() {
        for (text, why) in [
            ("[server]\naddress = \"10.0.0.2\"\ncopy = true\n", "no [[client]]"),
            ("[server]\naddress = \"10.0.0.2\"\n[[client]]\naddress = \"10.0.0.3\"\ncopy = true\n", "either iolab"),
            ("[server]\naddress = \"nope\"\ncopy = true\n", "h.toml"),
            ("[server]\naddress = \"10.0.0.2\"\ncopy = true\ncolour = 1\n", "unknown field"),
            ("[server]\naddress = \"10.0.0.2\"\ncopy = true\nuser = \"-oProxy\"\n[[client]]\naddress = \"10.0.0.3\"\ncopy = true\n", "bad user"),
            ("[server]\naddress = \"10.0.0.2\"\ncopy = true\n[[client]]\naddress = \"10.0.0.2\"\ncopy = true\n", "twice"),
        ] {
            let e = format!("{:#}", Inventory::parse(text, Path::new("h.toml")).unwrap_err());
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }
}
