//! What every lab run sets up before its first server and takes down after its last, the
//! matrix ([`crate::lab`]) and `--scaling` ([`crate::scaling`]) alike: the output directory
//! and the site, the signal handler, the network between client and servers (loopback, or
//! a shaped link with `--link`), and each server's launch on it.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context;

use crate::link::Link;
use crate::options::Options;
use crate::results::{Results, SCHEMA};
use crate::server::Launch;

pub struct Stage {
    /// The site every server serves (`lab::write_site`).
    pub www: PathBuf,
    /// The binary the models run in (`iolab serve`).
    pub iolab: PathBuf,
    pub backlog: u32,
    /// The shaped link, when asked for; None on loopback.
    pub link: Option<Link>,
    /// Where the client connects from, and where the servers listen.
    pub sources: Vec<IpAddr>,
    pub server_ip: IpAddr,
}

impl Stage {
    /// Creates `opts.out` (with `logs/` when `logs`), writes the site into `www/`, stops
    /// the servers on SIGINT/SIGTERM, and builds the link `opts.link` asks for (`what`
    /// names the run in its progress line).
    pub fn prepare(opts: &Options, logs: bool, what: &str) -> anyhow::Result<Stage> {
        let out = &opts.out;
        let dir = if logs { out.join("logs") } else { out.clone() };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", out.display()))?;
        let www = out.join("www");
        crate::site::write_site(&www)?;
        crate::server::install_signal_handler()?;
        let link = match &opts.link {
            Some(spec) => {
                let mut l = Link::create(spec, opts.backlog)?;
                l.info.seed_conditions = opts.seed_conditions;
                l.measure()?;
                tracing::info!(target: "progress", "{what}: {}", l.describe());
                Some(l)
            }
            None => None,
        };
        let (sources, server_ip) = match &link {
            Some(l) => (l.client_ips.clone(), l.server_ip),
            None => (crate::settings::source_addrs(8), [127, 0, 0, 1].into()),
        };
        Ok(Stage {
            www,
            iolab: std::env::current_exe().context("finding the iolab executable")?,
            backlog: opts.backlog,
            link,
            sources,
            server_ip,
        })
    }

    /// A server's launch on a free port of the servers' address: `run_dir` its scratch
    /// directory, pinned to `cpu` or to `cpus` when not empty.
    pub fn launch(
        &self,
        run_dir: PathBuf,
        workers: usize,
        cpu: Option<usize>,
        cpus: Vec<usize>,
    ) -> anyhow::Result<Launch> {
        Ok(Launch {
            iolab: self.iolab.clone(),
            www: self.www.clone(),
            run_dir,
            addr: SocketAddr::new(self.server_ip, crate::server::free_port()?),
            workers,
            backlog: self.backlog,
            cpu,
            cpus,
            netns: self.link.as_ref().map(|l| l.ns.clone()),
        })
    }

    /// Records the link in `results` and removes it.
    pub fn finish(self, results: &mut Results) -> anyhow::Result<()> {
        if let Some(l) = self.link {
            results.link = Some(l.info.clone());
            l.remove().context("removing the link")?;
        }
        Ok(())
    }
}

/// What every results.json starts with: the schema, the run's profile and command, the
/// machine.
pub fn results_header(
    opts: &Options,
    machine: &iolab_sys::host::Machine,
) -> anyhow::Result<Results> {
    Ok(Results {
        schema: SCHEMA.into(),
        profile: opts.profile.name().into(),
        command: opts.command.clone(),
        started_unix: machine.collected_at_unix,
        machine: serde_json::to_value(machine)?,
        ..Results::default()
    })
}
