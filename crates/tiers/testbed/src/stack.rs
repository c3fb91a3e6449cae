//! One run of the three nginx tiers (and the ODB agent): processes started in their network
//! namespaces (or all on loopback), stopped on drop. The testbed (`testbed.rs`) makes the
//! namespaces; the bench and the tests start one `Stack` per configuration they compare.

use crate::nginx;
use anyhow::{bail, Context};
use iolab_odb::spec::AgentSpec;
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const TIERS: [&str; 3] = ["fe", "is", "be"];

/// Where a tier runs.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Place {
    /// Network namespace (None: the caller's).
    pub ns: Option<String>,
    /// Address the tier listens on and connects from.
    pub addr: Ipv4Addr,
}

#[derive(Clone, Debug)]
pub struct StackConfig {
    pub fe: Place,
    pub is: Place,
    pub be: Place,
    /// Base port: FE listens on base, IS base+1, BE base+2, agent base+3.
    pub port: u16,
    /// Directory for configs, logs, ODB counters (created).
    pub dir: PathBuf,
    /// Static files served by the BE.
    pub root: PathBuf,
    /// ODB on every tier (None: vanilla nginx).
    pub odb: Option<Odb>,
    /// Tiers share one namespace (loopback): proxies bind their source address.
    pub loopback: bool,
    pub workers: u32,
    /// Start no BE nginx (a test puts its own server at the BE's address).
    pub skip_be: bool,
    /// Where the FE listens for clients (None: `fe.addr`). In the testbed the client
    /// reaches the FE on its own link.
    pub fe_listen: Option<Ipv4Addr>,
    /// The ODB domain (None: the three tier addresses).
    pub domain: Option<String>,
    /// CPUs the tiers run on (taskset list, e.g. "0"); None: anywhere.
    pub cpus: Option<String>,
    /// php-fpm beside the BE nginx (its namespace, cgroup and lifetime), serving
    /// `/payload.php?n=SIZE` (written into `root`). ODB is preloaded into the nginx tiers
    /// only: php-fpm talks to the BE nginx over a unix socket, outside the ODB domain.
    pub php: bool,
}

#[derive(Clone, Debug)]
pub struct Odb {
    /// libiolab_odb.so
    pub lib: PathBuf,
    /// The program that runs the buffer agent.
    pub agent: AgentProgram,
    pub agent_memory_mib: u64,
    pub threshold: usize,
    /// The BE's static files sent by reference (the agent serves the docroot with
    /// `sendfile`); false: copied into the arena, as before (for before/after runs).
    pub file_refs: bool,
}

/// The program that runs the ODB buffer agent (with an [`AgentSpec`]'s flags).
#[derive(Clone, Debug)]
pub enum AgentProgram {
    /// `iolab tiers agent` of this `iolab`.
    Iolab(PathBuf),
    /// `iolab-odb-agent`.
    Standalone(PathBuf),
}

impl AgentProgram {
    /// The program, and the words before the agent's flags.
    fn program(&self) -> (&Path, &'static [&'static str]) {
        match self {
            AgentProgram::Iolab(exe) => (exe, &AgentSpec::IOLAB_ROLE),
            AgentProgram::Standalone(bin) => (bin, &[]),
        }
    }
}

pub struct Stack {
    pub cfg: StackConfig,
    pub procs: Vec<(String, Child)>,
    pub configs: Vec<(String, String)>,
}

/// Makes `cmd` run in network namespace `ns` (setns before exec).
pub fn enter_ns(cmd: &mut Command, ns: &str) -> anyhow::Result<()> {
    let path = format!("/var/run/netns/{ns}");
    iolab_sys::process::enter_net_namespace(cmd, Path::new(&path))
        .with_context(|| format!("opening {path}"))
}

/// Puts the child into `cgroup.procs` of a cgroup directory before exec, so every process it
/// forks is counted there from its first instruction.
pub fn enter_cgroup(cmd: &mut Command, cg: &Path) -> anyhow::Result<()> {
    let path = cg.join("cgroup.procs");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    use std::os::fd::AsRawFd;
    // SAFETY: write(2) of a constant on an fd the parent opened: async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::write(f.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// The child gets SIGTERM when the thread that started it dies (`PR_SET_PDEATHSIG`): a test
/// or command killed by Ctrl-C or SIGKILL, which runs no destructor, does not leave nginx
/// or agent processes behind (nginx's master stops its workers on SIGTERM, the agent drains
/// and removes its arena). Hence a `Stack` is owned by the thread that starts it.
pub fn die_with_parent(cmd: &mut Command) {
    iolab_sys::process::die_with_parent(cmd, libc::SIGTERM);
}

/// Removes the arena files an agent process left (`iolab-tiers-odb-<pid>-*` in /dev/shm and
/// the temp dir) once it has exited: a SIGKILLed agent cannot remove its own.
fn remove_arena_files(agent_pid: u32) {
    for dir in [PathBuf::from("/dev/shm"), std::env::temp_dir()] {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let prefix = format!("{}{agent_pid}-", ARENA_PREFIX);
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Debian's php-fpm binary (`php-fpm8.2` on bookworm: versioned name, in /usr/sbin).
pub fn php_fpm_bin() -> Option<PathBuf> {
    if let Some(p) = which("php-fpm") {
        return Some(p);
    }
    let mut v: Vec<PathBuf> = std::fs::read_dir("/usr/sbin")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("php-fpm"))
        })
        .collect();
    v.sort();
    v.pop()
}

pub fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// nginx workers run as `nobody` when started as root: the agent's arena must be theirs.
fn worker_user() -> Option<String> {
    iolab_sys::process::is_root().then(|| WORKER_USER.to_string())
}

pub use crate::nginx::WORKER_USER;

/// Prefix of the agent's arena files (`iolab-tiers-odb-<agent pid>-<n>`).
pub const ARENA_PREFIX: &str = "iolab-tiers-odb-";

impl StackConfig {
    pub fn listen(&self, tier: &str) -> SocketAddrV4 {
        let (p, off) = match tier {
            "fe" => return SocketAddrV4::new(self.fe_listen.unwrap_or(self.fe.addr), self.port),
            "is" => (&self.is, 1),
            "be" => (&self.be, 2),
            _ => unreachable!(),
        };
        SocketAddrV4::new(p.addr, self.port + off)
    }
    pub fn agent_addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(self.be.addr, self.port + 3)
    }
    /// The agent's flags: at its address, with its memory, its arena the workers'.
    fn agent_spec(&self, odb: &Odb) -> AgentSpec {
        AgentSpec {
            listen: self.agent_addr(),
            memory_mib: odb.agent_memory_mib,
            arena_user: worker_user(),
            files: if odb.file_refs {
                vec![self.root.clone()]
            } else {
                Vec::new()
            },
            ..Default::default()
        }
    }
    pub fn place(&self, tier: &str) -> &Place {
        match tier {
            "fe" => &self.fe,
            "is" => &self.is,
            _ => &self.be,
        }
    }
    /// The ODB domain: the three tiers' addresses (the client is outside).
    pub fn domain(&self) -> String {
        self.domain
            .clone()
            .unwrap_or_else(|| format!("{},{},{}", self.fe.addr, self.is.addr, self.be.addr))
    }

    fn command(&self, program: &std::ffi::OsStr) -> Command {
        match &self.cpus {
            Some(cpus) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(cpus).arg(program);
                c
            }
            None => Command::new(program),
        }
    }
}

pub fn wait_listening(
    addr: SocketAddrV4,
    ns: Option<&str>,
    child: &mut Child,
    what: &str,
) -> anyhow::Result<()> {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            bail!("{what} exited at start ({st})");
        }
        let ok = match ns {
            None => TcpStream::connect_timeout(&addr.into(), Duration::from_millis(200)).is_ok(),
            Some(ns) => {
                // a listening socket in the namespace: ss -ltn there
                let mut c = Command::new("ss");
                enter_ns(&mut c, ns)?;
                let out = c.args(["-Hltn", &format!("src = {addr}")]).output()?;
                !String::from_utf8_lossy(&out.stdout).trim().is_empty()
            }
        };
        if ok {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(10) {
            bail!("{what} is not listening on {addr} after 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Stack {
    pub fn start(cfg: StackConfig, cgroups: Option<&crate::cpu::Cgroups>) -> anyhow::Result<Stack> {
        Stack::start_tiers(cfg, cgroups, &TIERS)
    }

    /// Starts only `tiers` of the configuration here (the agent and php-fpm with the BE):
    /// one tier per host, the others at their addresses on other hosts.
    pub fn start_tiers(
        cfg: StackConfig,
        cgroups: Option<&crate::cpu::Cgroups>,
        tiers: &[&str],
    ) -> anyhow::Result<Stack> {
        let with_be = tiers.contains(&"be");
        let nginx_bin = which("nginx").context("nginx not found (Debian package nginx)")?;
        std::fs::create_dir_all(&cfg.dir)?;
        let mut st = Stack {
            cfg: cfg.clone(),
            procs: Vec::new(),
            configs: Vec::new(),
        };
        let odb_dir = cfg.dir.join("odb");
        if cfg.odb.is_some() {
            std::fs::create_dir_all(&odb_dir)?;
            for t in TIERS.into_iter().filter(|t| tiers.contains(t)) {
                // the workers (user nobody under a root master) write their counters here
                std::fs::create_dir_all(odb_dir.join(t))?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(odb_dir.join(t), std::fs::Permissions::from_mode(0o777))?;
            }
        }
        if let Some(odb) = cfg.odb.as_ref().filter(|_| with_be) {
            let (program, role) = odb.agent.program();
            let mut c = cfg.command(program.as_os_str());
            c.args(role)
                .args(cfg.agent_spec(odb).to_args())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(cfg.dir.join("agent.log"))?);
            if let Some(ns) = &cfg.be.ns {
                enter_ns(&mut c, ns)?;
            }
            if let Some(cg) = cgroups {
                enter_cgroup(&mut c, &cg.dir("be"))?;
            }
            die_with_parent(&mut c);
            let mut child = c.spawn().context("starting the ODB agent")?;
            wait_listening(
                cfg.agent_addr(),
                cfg.be.ns.as_deref(),
                &mut child,
                "ODB agent",
            )?;
            st.procs.push(("agent".into(), child));
        }
        let php_sock = cfg.dir.join("be").join("php.sock");
        if cfg.php && with_be {
            st.start_php(cgroups, &php_sock)?;
        }
        // BE first, then IS, then FE: each finds its upstream listening.
        for tier in ["be", "is", "fe"] {
            if (tier == "be" && cfg.skip_be) || !tiers.contains(&tier) {
                continue;
            }
            let tdir = cfg.dir.join(tier);
            std::fs::create_dir_all(&tdir)?;
            let env: Vec<String> = if cfg.odb.is_some() {
                [
                    "LD_PRELOAD",
                    "IOLAB_ODB_DOMAIN",
                    "IOLAB_ODB_AGENT",
                    "IOLAB_ODB_THRESHOLD",
                    "IOLAB_ODB_STATS_DIR",
                    "IOLAB_ODB_TRACE",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect()
            } else {
                vec![]
            };
            let common = nginx::Common {
                workers: cfg.workers,
                env,
            };
            let bind = cfg.loopback.then(|| cfg.place(tier).addr);
            let text = match tier {
                "be" => nginx::be(
                    &tdir,
                    &common,
                    cfg.listen("be"),
                    &cfg.root,
                    cfg.php.then_some(php_sock.as_path()),
                ),
                "is" => nginx::proxy(&tdir, &common, cfg.listen("is"), &[cfg.listen("be")], bind),
                _ => nginx::proxy(&tdir, &common, cfg.listen("fe"), &[cfg.listen("is")], bind),
            };
            let conf = tdir.join("nginx.conf");
            std::fs::write(&conf, &text)?;
            st.configs.push((tier.to_string(), text));
            let mut c = cfg.command(nginx_bin.as_os_str());
            c.arg("-p")
                .arg(&tdir)
                .arg("-c")
                .arg(&conf)
                .arg("-e")
                .arg(tdir.join("error.log"));
            c.stdout(Stdio::null())
                .stderr(std::fs::File::create(tdir.join("stderr.log"))?);
            c.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
            if let Some(odb) = &cfg.odb {
                c.env("LD_PRELOAD", &odb.lib)
                    .env("IOLAB_ODB_DOMAIN", cfg.domain())
                    .env("IOLAB_ODB_THRESHOLD", odb.threshold.to_string())
                    .env("IOLAB_ODB_STATS_DIR", odb_dir.join(tier));
                // a call trace for debugging, when the caller asks for one (see the library)
                if let Some(t) = std::env::var_os("IOLAB_ODB_TRACE") {
                    c.env("IOLAB_ODB_TRACE", t);
                }
                if tier == "be" {
                    c.env("IOLAB_ODB_AGENT", cfg.agent_addr().to_string());
                }
            }
            if let Some(ns) = &cfg.place(tier).ns {
                enter_ns(&mut c, ns)?;
            }
            if let Some(cg) = cgroups {
                enter_cgroup(&mut c, &cg.dir(tier))?;
            }
            die_with_parent(&mut c);
            let mut child = c
                .spawn()
                .with_context(|| format!("starting nginx ({tier})"))?;
            wait_listening(
                cfg.listen(tier),
                cfg.place(tier).ns.as_deref(),
                &mut child,
                &format!("nginx {tier}"),
            )
            .with_context(|| std::fs::read_to_string(tdir.join("error.log")).unwrap_or_default())?;
            st.procs.push((tier.to_string(), child));
        }
        Ok(st)
    }

    /// php-fpm (master in the foreground, a static pool) in the BE's namespace and cgroup,
    /// stopped with the stack and by `PR_SET_PDEATHSIG` when its starter dies.
    fn start_php(
        &mut self,
        cgroups: Option<&crate::cpu::Cgroups>,
        sock: &Path,
    ) -> anyhow::Result<()> {
        let cfg = self.cfg.clone();
        let bin = php_fpm_bin().context("php-fpm not found (Debian package php-fpm)")?;
        let dir = cfg.dir.join("php");
        std::fs::create_dir_all(&dir)?;
        std::fs::create_dir_all(sock.parent().unwrap())?;
        std::fs::create_dir_all(&cfg.root)?;
        std::fs::write(cfg.root.join("payload.php"), nginx::PHP_SCRIPT)?;
        let root_user = iolab_sys::process::is_root();
        let text = nginx::php_fpm(&dir, sock, 4, root_user.then_some(WORKER_USER));
        let conf = dir.join("php-fpm.conf");
        std::fs::write(&conf, &text)?;
        self.configs.push(("php-fpm".into(), text));
        let mut c = cfg.command(bin.as_os_str());
        c.arg("-F").arg("-y").arg(&conf).arg("-p").arg(&dir);
        c.stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log"))?);
        c.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        if let Some(ns) = &cfg.be.ns {
            enter_ns(&mut c, ns)?;
        }
        if let Some(cg) = cgroups {
            enter_cgroup(&mut c, &cg.dir("be"))?;
        }
        die_with_parent(&mut c);
        let mut child = c.spawn().context("starting php-fpm")?;
        let t0 = Instant::now();
        while !sock.exists() {
            if let Some(st) = child.try_wait()? {
                bail!(
                    "php-fpm exited at start ({st}): {}",
                    std::fs::read_to_string(dir.join("php-fpm.log")).unwrap_or_default()
                );
            }
            if t0.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                let _ = child.wait();
                bail!("php-fpm made no socket at {} in 10 s", sock.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.procs.push(("php".into(), child));
        Ok(())
    }

    /// The agent's pid (ODB runs only).
    pub fn agent_pid(&self) -> Option<u32> {
        self.procs
            .iter()
            .find(|(n, _)| n == "agent")
            .map(|(_, c)| c.id())
    }

    /// Kills the agent at once (SIGKILL): a crash.
    pub fn kill_agent(&mut self) {
        if let Some(i) = self.procs.iter().position(|(n, _)| n == "agent") {
            let (_, mut c) = self.procs.remove(i);
            let _ = c.kill();
            let _ = c.wait();
            remove_arena_files(c.id());
        }
    }

    /// Stops the agent with SIGTERM (it drains) and starts a new one at the same address.
    pub fn restart_agent(&mut self) -> anyhow::Result<()> {
        let Some(odb) = self.cfg.odb.clone() else {
            bail!("no agent in a vanilla stack")
        };
        if let Some(i) = self.procs.iter().position(|(n, _)| n == "agent") {
            let (_, mut c) = self.procs.remove(i);
            let _ = iolab_sys::process::signal(c.id(), libc::SIGTERM);
            let _ = c.wait();
            remove_arena_files(c.id());
        }
        let (program, role) = odb.agent.program();
        let mut c = Command::new(program);
        c.args(role)
            .args(self.cfg.agent_spec(&odb).to_args())
            .stdout(Stdio::null());
        if let Some(ns) = &self.cfg.be.ns {
            enter_ns(&mut c, ns)?;
        }
        die_with_parent(&mut c);
        let mut child = c.spawn()?;
        wait_listening(
            self.cfg.agent_addr(),
            self.cfg.be.ns.as_deref(),
            &mut child,
            "ODB agent",
        )?;
        self.procs.push(("agent".into(), child));
        Ok(())
    }

    /// ODB counters summed per tier (from the stats files of its processes).
    pub fn odb_counters(&self) -> anyhow::Result<crate::cpu::TierCounters> {
        crate::cpu::odb_counters(&self.cfg.dir.join("odb"))
    }

    pub fn stop(&mut self) {
        // FE first: nothing new arrives at the tiers behind it. The agent goes last, at
        // once: with every nginx gone nobody can fetch what its drain would wait for.
        for (name, c) in self.procs.iter_mut().rev() {
            if name != "agent" {
                // (nginx: SIGTERM is a fast shutdown)
                let _ = iolab_sys::process::signal(c.id(), libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for (name, c) in self.procs.iter_mut() {
            if name == "agent" {
                continue;
            }
            reap_by(c, deadline);
        }
        self.kill_agent();
        self.procs.clear();
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits for a child already asked to stop (SIGTERM) until `deadline`, then kills it; either
/// way it is reaped, so no zombie is left. One deadline serves a group stopped together.
pub(crate) fn reap_by(c: &mut Child, deadline: Instant) {
    if !matches!(iolab_sys::process::wait_until(c, deadline), Ok(Some(_))) {
        let _ = c.kill();
        let _ = c.wait();
    }
}
