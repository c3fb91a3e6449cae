//! The hosts file of `iolab tiers up --hosts FILE`: one host per tier of seed 004's
//! testbed, the client that loads it and the three nginx tiers.
//!
//! ```toml
//! known_hosts = "/etc/iolab/known_hosts"   # optional, as for `lab --hosts`
//!
//! [client]                  # runs wrk and curl (installed there); no iolab needed
//! address = "10.0.0.1"
//! cpus = [1]
//!
//! [fe]                      # nginx as reverse proxy
//! address = "10.0.0.2"      # what ssh connects to, and the address the tier serves on
//! copy = true               # the controller copies iolab and libiolab_odb.so there
//!
//! [is]                      # nginx as load balancer
//! address = "10.0.0.3"
//! iolab = "/usr/local/bin/iolab"   # libiolab_odb.so beside it
//!
//! [be]                      # nginx as web server, and the ODB buffer agent
//! address = "10.0.0.4"
//! copy = true
//! ```
//!
//! Each table takes the fields of a [`Host`] (`user`, `port`, `identity`, `cpus`, `name`).
//! The tiers reach one another at these addresses: the user's network links them (the FE
//! also reaches the BE's agent directly, as in seed 004's datacenter).

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

use crate::inventory::{check_host_iolab, Host};

/// The roles of a tiers hosts file, in the order the tiers are chained.
pub const ROLES: [&str; 4] = ["client", "fe", "is", "be"];

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TiersInventory {
    pub known_hosts: Option<PathBuf>,
    pub client: Host,
    pub fe: Host,
    pub is: Host,
    pub be: Host,
}

impl TiersInventory {
    /// Parses and checks a tiers inventory; errors name the file and what is wrong.
    pub fn parse(text: &str, origin: &Path) -> anyhow::Result<TiersInventory> {
        let mut inv: TiersInventory =
            toml::from_str(text).with_context(|| format!("{}", origin.display()))?;
        let mut names = Vec::new();
        for (role, h) in [
            ("client", &mut inv.client),
            ("fe", &mut inv.fe),
            ("is", &mut inv.is),
            ("be", &mut inv.be),
        ] {
            check_host_iolab(origin, role, h, &mut names, role != "client")?;
        }
        Ok(inv)
    }

    /// Reads and parses `path`.
    pub fn read(path: &Path) -> anyhow::Result<TiersInventory> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the hosts file {}", path.display()))?;
        TiersInventory::parse(&text, path)
    }

    /// The host of a role (one of [`ROLES`]).
    pub fn host(&self, role: &str) -> Option<&Host> {
        match role {
            "client" => Some(&self.client),
            "fe" => Some(&self.fe),
            "is" => Some(&self.is),
            "be" => Some(&self.be),
            _ => None,
        }
    }

    /// (role, host) in chain order.
    pub fn hosts(&self) -> impl Iterator<Item = (&'static str, &Host)> {
        ROLES
            .into_iter()
            .map(|r| (r, self.host(r).expect("a role of ROLES")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FOUR: &str = "[client]\naddress = \"10.0.0.1\"\ncpus = [1]\n[fe]\naddress = \"10.0.0.2\"\ncopy = true\n[is]\naddress = \"10.0.0.3\"\niolab = \"/usr/local/bin/iolab\"\nuser = \"bench\"\n[be]\naddress = \"10.0.0.4\"\ncopy = true\nport = 2222\n";

    #[test]
    fn four_hosts_parse_with_defaults_and_the_client_needs_no_iolab() {
        let inv = TiersInventory::parse(FOUR, Path::new("t.toml")).unwrap();
        assert_eq!(inv.client.name, "10.0.0.1");
        assert_eq!(inv.client.cpus, [1]);
        assert!(inv.client.iolab.is_none() && !inv.client.copy);
        assert!(inv.fe.copy);
        assert_eq!(inv.is.user, "bench");
        assert_eq!(inv.be.port, 2222);
        let roles: Vec<&str> = inv.hosts().map(|(r, _)| r).collect();
        assert_eq!(roles, ROLES);
        assert_eq!(inv.host("is").unwrap().address.to_string(), "10.0.0.3");
        assert!(inv.host("db").is_none());
    }

    #[test]
    fn bad_tiers_inventories_say_what_is_wrong() {
        let no_be = FOUR.split("[be]").next().unwrap().to_string();
        let be_without_iolab = FOUR.replace("copy = true\nport", "port");
        let same_name = FOUR.replace("10.0.0.3", "10.0.0.2");
        let both = FOUR.replace("cpus = [1]", "copy = true\niolab = \"/x\"");
        let lab_file = "[server]\naddress = \"10.0.0.2\"\ncopy = true\n[[client]]\naddress = \"10.0.0.3\"\ncopy = true\n";
        for (text, why) in [
            (no_be.as_str(), "missing field `be`"),
            (&be_without_iolab, "be 10.0.0.4: give either iolab"),
            (&same_name, "given twice"),
            (&both, "client 10.0.0.1: give either"),
            (lab_file, "unknown field `server`"),
        ] {
            let e = format!(
                "{:#}",
                TiersInventory::parse(text, Path::new("t.toml")).unwrap_err()
            );
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }
}
