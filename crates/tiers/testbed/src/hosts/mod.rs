//! The tiers on real hosts (`iolab tiers up --hosts FILE`): client, FE, IS and BE each on
//! the host its role names in a [`TiersInventory`], reached over OpenSSH
//! ([`iolab_hosts`]), instead of network namespaces on this machine.
//!
//! The supervisor that `up` starts opens an SSH master connection to each host, makes the
//! run's directory there (`/tmp/iolab-tiers-<pid>-<time>-<role>`, which must not exist:
//! nothing outside it is written), copies iolab and the ODB library into it when the host
//! says `copy = true`, and starts each tier as `iolab tiers node` ([`node::NodeSpec`], one
//! JSON argument) under a lease: it ends when the lease does, on `down`, on Ctrl-C and when
//! the controller dies, even by SIGKILL. The tiers are ready once a GET from the client
//! host returns the file's bytes. `down` removes the run's directories; after a killed
//! supervisor the next `down` (or `up`, `status`) does.
//!
//! The bench ([`bench`]) starts its own vanilla and ODB stacks the same way, runs wrk and
//! curl on the client host and reads each tier's CPU on its host (its cgroup, else its
//! processes' `/proc/PID/stat`).
//!
//! No link is made or shaped on real hosts: the tiers reach one another at the hosts'
//! addresses over the user's network. DISC's bench needs a client–BE link of its own and
//! raw sends the hosts' routing may not carry: it stays on this machine's namespaces.

pub mod bench;
pub mod node;

use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use iolab_hosts::ssh::quote;
pub use iolab_hosts::TiersInventory;
use iolab_hosts::{Host, Leased, Master, Ssh};

use crate::state::{HostsState, RemoteDir};
use node::{NodeOdb, NodeSpec, NodeStatus};

/// Longest remote step (copying a binary included).
pub const STEP_LIMIT: Duration = Duration::from_secs(60);
/// Longest wait for a node to serve (its status file), and for a removal at the end.
pub const NODE_START_LIMIT: Duration = Duration::from_secs(30);
const CLEANUP_LIMIT: Duration = Duration::from_secs(10);
/// The ODB library's file name, beside iolab on a host.
pub const ODB_LIB: &str = "libiolab_odb.so";

/// A host with its SSH connection and the run's directory there.
pub struct Remote {
    pub role: &'static str,
    pub ssh: Ssh,
    _master: Option<Master>,
    pub dir: RemoteDir,
}

impl Remote {
    pub fn run(&self, script: &str, limit: Duration) -> anyhow::Result<Vec<u8>> {
        self.ssh.run(script, limit)
    }

    fn put(&self, data: Vec<u8>, path: &str) -> anyhow::Result<()> {
        self.ssh
            .run_with_input(&format!("cat > {}", quote(path)), Some(data), STEP_LIMIT)
            .map(drop)
    }

    /// A GET from this host (curl): the body; an error unless the answer was a 2xx.
    pub fn fetch(&self, url: &str) -> anyhow::Result<Vec<u8>> {
        self.run(
            &format!("curl -s -f -m 20 {}", quote(url)),
            Duration::from_secs(30),
        )
        .with_context(|| format!("GET {url} from the {}", self.role))
    }

    /// The last lines of a file of the run (for an error message).
    fn tail(&self, path: &str) -> String {
        self.run(&format!("tail -n 8 {}", quote(path)), CLEANUP_LIMIT)
            .map(|o| String::from_utf8_lossy(&o).trim().to_string())
            .unwrap_or_default()
    }
}

/// Every host of a run; the run's directories are removed on drop by the run that made
/// them.
pub struct Hosts {
    pub remotes: Vec<Remote>,
    owns_dirs: bool,
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if self.owns_dirs {
            for r in &self.remotes {
                let _ = r.run(&format!("rm -rf {}", quote(&r.dir.dir)), CLEANUP_LIMIT);
            }
        }
    }
}

/// The inventory's known_hosts (strict), or the testbed's own file (first key accepted).
pub fn known_hosts(inv: &TiersInventory, state_dir: &Path) -> (PathBuf, bool) {
    match &inv.known_hosts {
        Some(k) => (k.clone(), false),
        None => (state_dir.join("known_hosts"), true),
    }
}

/// An IPv4 address of a host (the tiers' configurations are IPv4).
pub fn ipv4(h: &Host) -> anyhow::Result<Ipv4Addr> {
    match h.address {
        std::net::IpAddr::V4(a) => Ok(a),
        a => bail!("{}: {a}: the tiers need an IPv4 address", h.name),
    }
}

impl Hosts {
    /// Opens an SSH master to every host of `inv`, sockets `<sockets>/<tag>-<role>`.
    pub fn open(
        inv: &TiersInventory,
        (known, accept_new): (&Path, bool),
        sockets: &Path,
        tag: &str,
    ) -> anyhow::Result<Hosts> {
        let mut remotes = Vec::new();
        for (role, h) in inv.hosts() {
            ipv4(h)?;
            let mut ssh = Ssh::new(h, known, accept_new);
            let master = ssh.start_master(&sockets.join(format!("{tag}-{role}")))?;
            remotes.push(Remote {
                role,
                ssh,
                _master: Some(master),
                dir: RemoteDir {
                    role: role.into(),
                    dir: String::new(),
                    iolab: String::new(),
                    odb_lib: String::new(),
                },
            });
        }
        Ok(Hosts {
            remotes,
            owns_dirs: false,
        })
    }

    pub fn get(&self, role: &str) -> &Remote {
        self.remotes
            .iter()
            .find(|r| r.role == role)
            .expect("every role is opened")
    }

    /// Makes the run's directory on every host (removed when `self` is dropped), copies
    /// iolab and `odb_lib` (this machine's) to the tier hosts that ask for a copy, and
    /// checks that each tier host has both.
    pub fn make_dirs(&mut self, odb_lib: Option<&Path>) -> anyhow::Result<Vec<RemoteDir>> {
        let stamp = format!(
            "/tmp/iolab-tiers-{}-{}",
            std::process::id(),
            iolab_sys::host::Machine::collect().collected_at_unix
        );
        let me = std::env::current_exe().context("finding the iolab binary")?;
        self.owns_dirs = true;
        for r in &mut self.remotes {
            let dir = format!("{stamp}-{}", r.role);
            // mkdir without -p: a directory already there is someone else's
            r.run(&format!("mkdir -m 0755 {}", quote(&dir)), STEP_LIMIT)?;
            r.dir.dir = dir.clone();
            if r.role == "client" {
                continue;
            }
            let h = &r.ssh.host;
            (r.dir.iolab, r.dir.odb_lib) = match &h.iolab {
                Some(p) => {
                    let p = p.to_string_lossy().into_owned();
                    let lib = Path::new(&p).with_file_name(ODB_LIB);
                    (p, lib.to_string_lossy().into_owned())
                }
                None => (format!("{dir}/iolab"), format!("{dir}/{ODB_LIB}")),
            };
            if h.copy {
                tracing::info!(target: "progress", "copying iolab to {} ({})", h.name, r.role);
                let bin =
                    std::fs::read(&me).with_context(|| format!("reading {}", me.display()))?;
                r.put(bin, &r.dir.iolab)?;
                r.run(&format!("chmod 0755 {}", quote(&r.dir.iolab)), STEP_LIMIT)?;
                if let Some(lib) = odb_lib {
                    let data =
                        std::fs::read(lib).with_context(|| format!("reading {}", lib.display()))?;
                    r.put(data, &r.dir.odb_lib)?;
                }
            }
            let mut check = format!("test -x {}", quote(&r.dir.iolab));
            if odb_lib.is_some() {
                check += &format!(" && test -r {}", quote(&r.dir.odb_lib));
            }
            r.run(&check, STEP_LIMIT).with_context(|| {
                format!(
                    "{} ({}): {} (and {} for ODB) must be there",
                    h.name, r.role, r.dir.iolab, r.dir.odb_lib
                )
            })?;
        }
        Ok(self.remotes.iter().map(|r| r.dir.clone()).collect())
    }

    /// The directories of a run made by another process (the supervisor's).
    pub fn use_dirs(&mut self, dirs: &[RemoteDir]) {
        for r in &mut self.remotes {
            if let Some(d) = dirs.iter().find(|d| d.role == r.role) {
                r.dir = d.clone();
            }
        }
    }
}

/// One tier of a stack on its host, under its lease.
pub struct Node {
    pub spec: NodeSpec,
    pub status: NodeStatus,
    lease: Leased,
}

/// A stack of nodes (FE, IS, BE) on the hosts; stopped (their leases ended) on drop.
pub struct HostsStack {
    pub name: String,
    pub port: u16,
    pub fe: Ipv4Addr,
    /// BE, IS, FE: the order they were started in.
    pub nodes: Vec<Node>,
}

impl HostsStack {
    /// Starts BE, IS and FE (each finds its upstream serving) as `<name>-<tier>` in the
    /// run's directories; `odb`: (threshold, agent MiB); `sizes`: the BE's payloads, the
    /// first one fetched from the client host as the readiness check.
    pub fn start(
        hosts: &Hosts,
        name: &str,
        port: u16,
        odb: Option<(usize, u64)>,
        sizes: &[usize],
    ) -> anyhow::Result<HostsStack> {
        let addr = |role| ipv4(&hosts.get(role).ssh.host);
        let mut st = HostsStack {
            name: name.into(),
            port,
            fe: addr("fe")?,
            nodes: Vec::new(),
        };
        for tier in ["be", "is", "fe"] {
            let r = hosts.get(tier);
            let spec = NodeSpec {
                tier: tier.into(),
                dir: format!("{}/{name}-{tier}", r.dir.dir).into(),
                fe: addr("fe")?,
                is: addr("is")?,
                be: addr("be")?,
                port,
                cpus: r.ssh.host.cpus.clone(),
                payload_sizes: if tier == "be" { sizes.to_vec() } else { vec![] },
                odb: odb.map(|(threshold, agent_memory_mib)| NodeOdb {
                    lib: r.dir.odb_lib.clone().into(),
                    agent_memory_mib,
                    threshold,
                }),
            };
            st.nodes.push(start_node(r, spec, name)?);
        }
        if let Some(&size) = sizes.first() {
            let body = hosts.get("client").fetch(&st.url(&format!("/f{size}")))?;
            if body != crate::testutil::payload(size) {
                bail!(
                    "{name}: the FE answered {} bytes for /f{size}, not the file",
                    body.len()
                );
            }
        }
        Ok(st)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}:{}{path}", self.fe, self.port)
    }

    pub fn node(&self, tier: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.spec.tier == tier)
            .expect("a stack has every tier")
    }

    /// (tier, nginx configuration) in FE, IS, BE order.
    pub fn configs(&self) -> Vec<(String, String)> {
        crate::stack::TIERS
            .iter()
            .map(|t| (t.to_string(), self.node(t).status.config.clone()))
            .collect()
    }

    /// Ends every lease (FE first) and waits for the nodes to go.
    pub fn stop(&mut self) {
        for n in self.nodes.iter_mut().rev() {
            n.lease.stop();
        }
        self.nodes.clear();
    }
}

impl Drop for HostsStack {
    fn drop(&mut self) {
        self.stop();
    }
}

fn start_node(r: &Remote, spec: NodeSpec, name: &str) -> anyhow::Result<Node> {
    let mut argv: Vec<OsString> = vec![r.dir.iolab.clone().into()];
    argv.extend(spec.to_args().into_iter().map(OsString::from));
    let log = format!("{}/{name}-{}.log", r.dir.dir, spec.tier);
    let mut lease = r.ssh.spawn_leased(&argv, &[], &log)?;
    let status_file = spec.dir.join(node::STATUS_FILE);
    let what = || format!("{} on {} ({})", spec.tier, r.ssh.host.name, name);
    let t0 = Instant::now();
    loop {
        if let Some(st) = lease.try_wait() {
            bail!("{}: the node exited ({st}): {}", what(), r.tail(&log));
        }
        let out = r.run(
            &format!(
                "cat {} 2>/dev/null || true",
                quote(&status_file.to_string_lossy())
            ),
            STEP_LIMIT,
        )?;
        if !out.is_empty() {
            let status: NodeStatus = serde_json::from_slice(&out)
                .with_context(|| format!("{}: {}", what(), status_file.display()))?;
            return Ok(Node {
                spec,
                status,
                lease,
            });
        }
        if t0.elapsed() > NODE_START_LIMIT {
            bail!(
                "{}: not serving after {:?}: {}",
                what(),
                NODE_START_LIMIT,
                r.tail(&log)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The supervisor of a hosts testbed: connects, makes the run's directories, starts the
/// testbed's own stack, writes the state, waits for `stop`, removes everything.
pub fn build_and_wait(
    up: &crate::state::UpConfig,
    inventory_file: &Path,
    odb_lib: Option<&Path>,
    stop: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<()> {
    let inv = TiersInventory::read(inventory_file)?;
    let state_dir = crate::state::state_dir();
    let (known, accept_new) = known_hosts(&inv, &state_dir);
    let dir = state_dir.join(format!("run-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _dir = crate::bench::RemoveDir(dir.clone());
    let mut hosts = Hosts::open(&inv, (&known, accept_new), &dir, "s")?;
    let dirs = hosts.make_dirs(odb_lib)?;
    let mut machines = Vec::new();
    for r in &hosts.remotes {
        machines.push((r.role.to_string(), r.ssh.machine()?));
    }
    let odb = (up.odb && odb_lib.is_some()).then_some((4096, 256));
    let stack = HostsStack::start(&hosts, "up", up.port, odb, &crate::testutil::all_sizes())
        .context("starting the tiers on the hosts")?;
    let place = |role| -> anyhow::Result<crate::stack::Place> {
        Ok(crate::stack::Place {
            ns: None,
            addr: ipv4(&hosts.get(role).ssh.host)?,
        })
    };
    let state = crate::state::State {
        supervisor_pid: std::process::id(),
        up: up.clone(),
        namespaces: Vec::new(),
        client: place("client")?,
        fe: place("fe")?,
        fe_client: stack.fe,
        is: place("is")?,
        be: place("be")?,
        domain: stack.nodes[0].spec.stack_domain(),
        ifaces: Vec::new(),
        dir: dir.clone(),
        root: dir.join("www"),
        cgroup: None,
        configs: stack.configs(),
        qdiscs: Vec::new(),
        hosts: Some(HostsState {
            inventory_file: inventory_file.to_path_buf(),
            inventory: inv.clone(),
            known_hosts: known.clone(),
            accept_new,
            dirs,
            nodes: stack
                .nodes
                .iter()
                .map(|n| (n.spec.tier.clone(), n.spec.dir.display().to_string()))
                .collect(),
            machines,
        }),
    };
    crate::state::write_state(&state)?;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(stack);
    drop(hosts);
    Ok(())
}

/// What a killed supervisor left on the hosts: its run's directories (its processes ended
/// with their leases). Best effort: a line per host reached.
pub fn cleanup_stale(h: &HostsState) -> Vec<String> {
    let mut out = Vec::new();
    for d in &h.dirs {
        let Some(host) = h.inventory.host(&d.role) else {
            continue;
        };
        let ssh = Ssh::new(host, &h.known_hosts, h.accept_new);
        match ssh.run(&format!("rm -rf {}", quote(&d.dir)), CLEANUP_LIMIT) {
            Ok(_) => out.push(format!("{}:{}", host.name, d.dir)),
            Err(e) => out.push(format!("({}: {e:#})", host.name)),
        }
    }
    out
}
