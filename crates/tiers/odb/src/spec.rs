//! How the buffer agent is started as a process of its own (`iolab tiers agent` or
//! `iolab-odb-agent`): [`AgentSpec`] is both the arguments the testbed passes and what either
//! program reads from them.

use crate::agent::{user_uid, AgentConfig};
use std::net::SocketAddrV4;
use std::time::Duration;

/// The agent's flags: `--listen IP:PORT --memory MIB [--lifetime SECS] [--drain SECS]
/// [--arena-user NAME] [--files DIR]...`.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentSpec {
    /// Address to serve on.
    pub listen: SocketAddrV4,
    /// Arena size in MiB (the agent's whole payload memory).
    pub memory_mib: u64,
    /// Seconds a buffer is kept for a receiver that has not fetched it all.
    pub lifetime_s: f64,
    /// Longest drain after SIGTERM, seconds.
    pub drain_s: f64,
    /// Owner of the arena file (the senders' user, e.g. nginx's workers: nobody).
    pub arena_user: Option<String>,
    /// Directories whose files senders may send by reference (`sendfile` at fetch time).
    pub files: Vec<std::path::PathBuf>,
}

impl Default for AgentSpec {
    fn default() -> AgentSpec {
        let d = AgentConfig::default();
        AgentSpec {
            listen: d.listen,
            memory_mib: d.arena_bytes >> 20,
            lifetime_s: d.lifetime.as_secs_f64(),
            drain_s: d.drain.as_secs_f64(),
            arena_user: None,
            files: Vec::new(),
        }
    }
}

impl AgentSpec {
    /// `iolab`'s words for this role: `iolab tiers agent FLAGS`.
    pub const IOLAB_ROLE: [&'static str; 2] = ["tiers", "agent"];

    /// The arguments after the program (`--lifetime` and `--drain` only where they differ
    /// from the defaults).
    pub fn to_args(&self) -> Vec<String> {
        let d = AgentSpec::default();
        let mut v = vec![
            "--listen".to_string(),
            self.listen.to_string(),
            "--memory".into(),
            self.memory_mib.to_string(),
        ];
        if self.lifetime_s != d.lifetime_s {
            v.extend(["--lifetime".into(), self.lifetime_s.to_string()]);
        }
        if self.drain_s != d.drain_s {
            v.extend(["--drain".into(), self.drain_s.to_string()]);
        }
        if let Some(u) = &self.arena_user {
            v.extend(["--arena-user".into(), u.clone()]);
        }
        for d in &self.files {
            v.extend(["--files".into(), d.display().to_string()]);
        }
        v
    }

    /// Reads the flags (`iolab-odb-agent`'s own parser; `iolab tiers agent` has clap's).
    /// `Ok(None)`: `-h`/`--help`.
    pub fn parse(args: &[String]) -> Result<Option<AgentSpec>, String> {
        let mut spec = AgentSpec::default();
        let mut i = 0;
        while i < args.len() {
            let v = args.get(i + 1).cloned().unwrap_or_default();
            let secs = |flag: &str| -> Result<f64, String> {
                v.parse().map_err(|e| format!("{flag} {v}: {e}"))
            };
            match args[i].as_str() {
                "--listen" => spec.listen = v.parse().map_err(|e| format!("--listen {v}: {e}"))?,
                "--memory" => {
                    spec.memory_mib = v.parse().map_err(|e| format!("--memory {v}: {e}"))?
                }
                "--lifetime" => spec.lifetime_s = secs("--lifetime")?,
                "--drain" => spec.drain_s = secs("--drain")?,
                "--arena-user" => spec.arena_user = Some(v),
                "--files" => spec.files.push(v.into()),
                "-h" | "--help" => return Ok(None),
                o => return Err(format!("unknown argument {o}")),
            }
            i += 2;
        }
        Ok(Some(spec))
    }

    /// The agent's configuration; an error names a user that does not exist.
    pub fn config(&self) -> Result<AgentConfig, String> {
        let mut cfg = AgentConfig {
            listen: self.listen,
            arena_bytes: self.memory_mib << 20,
            lifetime: Duration::from_secs_f64(self.lifetime_s),
            drain: Duration::from_secs_f64(self.drain_s),
            files: self.files.clone(),
            ..Default::default()
        };
        if let Some(u) = &self.arena_user {
            cfg.arena_uid =
                Some(user_uid(u).ok_or_else(|| format!("--arena-user {u}: no such user"))?);
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_spec_goes_through_its_arguments_and_back() {
        let plain = AgentSpec {
            listen: "10.1.2.3:18083".parse().unwrap(),
            memory_mib: 64,
            ..Default::default()
        };
        assert_eq!(
            plain.to_args(),
            strings(&["--listen", "10.1.2.3:18083", "--memory", "64"])
        );
        let every = AgentSpec {
            lifetime_s: 2.5,
            drain_s: 0.5,
            arena_user: Some("nobody".into()),
            files: vec!["/srv/www".into(), "/srv/more files".into()],
            ..plain.clone()
        };
        for spec in [plain, every] {
            assert_eq!(AgentSpec::parse(&spec.to_args()), Ok(Some(spec.clone())));
        }
    }

    #[test]
    fn bad_agent_arguments_say_which() {
        let e = AgentSpec::parse(&strings(&["--memory", "lots"])).unwrap_err();
        assert!(e.starts_with("--memory lots: "), "{e}");
        let e = AgentSpec::parse(&strings(&["--port", "1"])).unwrap_err();
        assert_eq!(e, "unknown argument --port");
        assert_eq!(AgentSpec::parse(&strings(&["--help"])), Ok(None));
        let e = AgentSpec {
            arena_user: Some("no-such-user-here".into()),
            ..Default::default()
        }
        .config()
        .unwrap_err();
        assert_eq!(e, "--arena-user no-such-user-here: no such user");
    }
}
