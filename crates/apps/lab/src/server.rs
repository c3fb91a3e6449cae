//! The servers under test, run as child processes that never outlive the lab.
//!
//! Each child gets its own process group (so nginx's workers go with their master), is
//! pinned to the server CPU before `exec`, and dies with the lab (PR_SET_PDEATHSIG) even if
//! the lab is killed outright. A [`ServerProc`] kills its group on drop, and the SIGINT /
//! SIGTERM handler kills every registered group before the lab exits.

use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use iolab_servers::spec::{model_named, GlommioSpec, MonoioSpec, PeerBasics, ServeSpec, TokioSpec};
use iolab_servers::{AcceptMode, Config, Model};

pub mod command;
pub mod logs;
pub mod probe;

/// Process groups of the running children, for the signal handler, and whether the lab
/// is stopping (then no group may be added).
static GROUPS: Mutex<(Vec<i32>, bool)> = Mutex::new((Vec::new(), false));

/// Records a child's group for the signal handler. Once the lab is stopping, the group is
/// killed instead and false returned: the run goes on for a moment after the handler's
/// sweep, and a server started then would outlive it (a `--target`'s processes are not
/// all covered by PR_SET_PDEATHSIG, which only the `sh` gets).
pub(crate) fn register(pgid: i32) -> bool {
    let Ok(mut g) = GROUPS.lock() else {
        return true;
    };
    if g.1 {
        signal_group(pgid, libc::SIGKILL);
        return false;
    }
    g.0.push(pgid);
    true
}

pub(crate) fn unregister(pgid: i32) {
    if let Ok(mut g) = GROUPS.lock() {
        g.0.retain(|&p| p != pgid);
    }
}

/// Signals a group we created with `process_group(0)`; one already gone is no error.
pub(crate) fn signal_group(pgid: i32, sig: i32) {
    if let Ok(pgid) = u32::try_from(pgid) {
        let _ = iolab_sys::process::signal_group(pgid, sig);
    }
}

/// The CPU set of `cpus` (those below `CPU_SETSIZE`), for `sched_setaffinity`.
pub(crate) fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: all-zero bytes are a valid (empty) cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: c < CPU_SETSIZE, so CPU_SET writes inside the set.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    set
}

/// Kills every registered child group (SIGTERM, then SIGKILL after a grace period); no
/// child may register after it started.
pub fn kill_all() {
    let groups: Vec<i32> = GROUPS
        .lock()
        .map(|mut g| {
            g.1 = true;
            g.0.clone()
        })
        .unwrap_or_default();
    for &g in &groups {
        signal_group(g, libc::SIGTERM);
    }
    std::thread::sleep(Duration::from_millis(300));
    for &g in &groups {
        signal_group(g, libc::SIGKILL);
    }
}

/// On SIGINT or SIGTERM: kill the servers, remove the link's namespace and veths, then
/// exit (130 / 143).
pub fn install_signal_handler() -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("installing the signal handler")?;
    std::thread::Builder::new()
        .name("lab-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                iolab_netns::note_signal();
                tracing::warn!("iolab lab: interrupted; stopping the servers");
                kill_all();
                // Then the link (--link), once nothing runs inside its namespace.
                iolab_netns::cleanup_all();
                std::process::exit(128 + sig);
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// What to run.
#[derive(Debug, Clone)]
pub enum Kind {
    /// `iolab serve` with this model, accepting so.
    Model {
        model: Model,
        accept: AcceptMode,
    },
    Nginx(PathBuf),
    Tokio(PathBuf),
    /// iolab-monoio-server (its defaults: monoio's recommended ring size).
    Monoio(PathBuf),
    /// iolab-glommio-server (its defaults: glommio's default executor settings).
    Glommio(PathBuf),
    /// `--target`: a user's command, run with `sh -c` after the placeholders of
    /// [`command::substitute`] are replaced.
    Command(String),
    /// `--url`: a server already running, which the lab only loads.
    Url(probe::UrlTarget),
}

#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub kind: Kind,
    pub describe: String,
}

impl Target {
    pub fn is_peer(&self) -> bool {
        !matches!(self.kind, Kind::Model { .. })
    }
}

/// How to start a server.
#[derive(Debug, Clone)]
pub struct Launch {
    pub iolab: PathBuf,
    pub www: PathBuf,
    /// Scratch directory for this server (stats file, nginx config, logs).
    pub run_dir: PathBuf,
    pub addr: SocketAddr,
    pub workers: usize,
    pub backlog: u32,
    pub cpu: Option<usize>,
    /// Pin to these CPUs instead (when not empty; `--scaling` gives the server several).
    pub cpus: Vec<usize>,
    /// Run the server inside this network namespace (`--link`).
    pub netns: Option<iolab_netns::Namespace>,
}

pub struct ServerProc {
    child: Option<Child>,
    pgid: i32,
    pub name: String,
    pub addr: SocketAddr,
    /// The Host header the load sends (the address, or a `--url`'s authority).
    pub host: String,
    /// The path the lab's files are under ("" but for a `--url` with a path).
    pub prefix: String,
    pub stats_path: Option<PathBuf>,
    /// Where its output goes (a `--target`'s stderr; its stdout is beside it).
    pub log_path: PathBuf,
    /// A `--target`'s stdout.
    pub stdout_path: Option<PathBuf>,
}

/// Lab targets that run a model with options: (target name, model, how it accepts).
/// `uring-callback-sync` is seed 000's CR (completion routines, synchronous accept); plain
/// `uring-callback` accepts asynchronously (CR-iocp).
pub const MODEL_VARIANTS: [(&str, Model, AcceptMode); 1] = [(
    "uring-callback-sync",
    Model::UringCallback,
    AcceptMode::Sync,
)];

/// The model and accept mode of a lab target name: a variant's, or a model's own with
/// `iolab serve`'s default accept mode.
pub fn model_of(name: &str) -> Option<(Model, AcceptMode)> {
    MODEL_VARIANTS
        .iter()
        .find(|v| v.0 == name)
        .map(|v| (v.1, v.2))
        .or_else(|| model_named(name).map(|m| (m, Config::default().accept)))
}

/// How the lab runs a model: `iolab serve` on the launch's site, address, workers and
/// backlog, publishing its counters in `stats`.
pub fn serve_spec(model: Model, accept: AcceptMode, l: &Launch, stats: PathBuf) -> ServeSpec {
    ServeSpec {
        workers: l.workers,
        backlog: l.backlog,
        stats: Some(stats),
        accept,
        ..ServeSpec::new(model, l.www.clone(), l.addr)
    }
}

/// What the lab tells every peer: at least one worker (one thread each for monoio's
/// runtimes and glommio's executors), the lab's backlog.
fn peer_basics(l: &Launch) -> PeerBasics {
    PeerBasics {
        workers: l.workers.max(1),
        backlog: l.backlog,
        ..PeerBasics::new(l.www.clone(), l.addr)
    }
}

/// How the lab runs the tokio peer.
pub fn tokio_spec(l: &Launch) -> TokioSpec {
    TokioSpec::with(peer_basics(l))
}

/// How the lab runs the monoio peer.
pub fn monoio_spec(l: &Launch) -> MonoioSpec {
    MonoioSpec::with(peer_basics(l))
}

/// How the lab runs the glommio peer.
pub fn glommio_spec(l: &Launch) -> GlommioSpec {
    GlommioSpec::with(peer_basics(l))
}

/// The first line a server wrote to its log (a peer's start line, which names its
/// configuration), waiting up to `limit` for it: a peer listens before it prints.
pub fn start_line(log: &Path, limit: Duration) -> Option<String> {
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some((line, _)) = text.split_once('\n') {
            return Some(line.to_string());
        }
        if t0.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `worker_connections` per nginx worker: every connection the lab can open at once (its
/// top concurrency is 1,000) lands on one worker in the worst case, with room to spare.
pub const NGINX_WORKER_CONNECTIONS: usize = 16384;

/// An nginx configuration serving `www` on `addr`, with every path inside `run_dir`, tuned
/// as nginx's users tune it for static files (nginx.org docs: "Serving Static Content",
/// `ngx_http_core_module`): descriptors and metadata of open files cached
/// (`open_file_cache`, as our models cache files), `sendfile` with `tcp_nopush` (headers
/// and file start in one segment) and `tcp_nodelay`, no access log, keep-alive connections
/// never closed for their request count, one worker per `--workers` with `reuseport` (one
/// accept queue per worker, as the kernel balances) when there are several, and the same
/// listen backlog the models get.
pub fn nginx_conf(l: &Launch, as_root: bool) -> String {
    let d = l.run_dir.display();
    let user = if as_root {
        "user nobody nogroup;\n"
    } else {
        ""
    };
    let workers = l.workers.max(1);
    let reuseport = if workers > 1 { " reuseport" } else { "" };
    let lines = [
        "# Written by iolab lab: nginx tuned for static files.".to_string(),
        format!("{user}worker_processes {workers};"),
        format!("worker_rlimit_nofile {};", 4 * NGINX_WORKER_CONNECTIONS),
        format!("pid {d}/nginx.pid;"),
        format!("error_log {d}/nginx-error.log warn;"),
        "daemon off;".into(),
        "events {".into(),
        format!("  worker_connections {NGINX_WORKER_CONNECTIONS};"),
        "  use epoll;".into(),
        "}".into(),
        "http {".into(),
        "  access_log off;".into(),
        format!("  client_body_temp_path {d}/body;"),
        format!("  proxy_temp_path {d}/proxy;"),
        format!("  fastcgi_temp_path {d}/fastcgi;"),
        format!("  uwsgi_temp_path {d}/uwsgi;"),
        format!("  scgi_temp_path {d}/scgi;"),
        "  sendfile on;".into(),
        "  tcp_nopush on;".into(),
        "  tcp_nodelay on;".into(),
        "  open_file_cache max=1000 inactive=60s;".into(),
        "  open_file_cache_valid 30s;".into(),
        "  open_file_cache_min_uses 1;".into(),
        "  open_file_cache_errors on;".into(),
        "  keepalive_requests 100000000;".into(),
        "  keepalive_timeout 60s;".into(),
        "  server_tokens off;".into(),
        "  types { text/html html; application/octet-stream bin; }".into(),
        "  server {".into(),
        format!("    listen {} backlog={}{reuseport};", l.addr, l.backlog),
        format!("    root {};", l.www.display()),
        "  }".into(),
        "}".into(),
    ];
    lines.join("\n") + "\n"
}

impl ServerProc {
    pub fn start(t: &Target, l: &Launch) -> anyhow::Result<ServerProc> {
        // Absolute paths: nginx resolves relative ones against its prefix (`-p`), so a
        // relative `--out` would otherwise name a directory inside the run directory.
        let l = &Launch {
            www: std::path::absolute(&l.www)
                .with_context(|| format!("resolving {}", l.www.display()))?,
            run_dir: std::path::absolute(&l.run_dir)
                .with_context(|| format!("resolving {}", l.run_dir.display()))?,
            ..l.clone()
        };
        std::fs::create_dir_all(&l.run_dir)
            .with_context(|| format!("creating {}", l.run_dir.display()))?;
        match &t.kind {
            Kind::Url(u) => return ServerProc::url(t, u, l),
            Kind::Command(template) => return ServerProc::command(t, template, l),
            _ => {}
        }
        let log_path = l.run_dir.join("server.log");
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let mut stats_path = None;
        let mut cmd = match &t.kind {
            Kind::Model { model, accept } => {
                let sp = l.run_dir.join("stats");
                let _ = std::fs::remove_file(&sp);
                let mut c = Command::new(&l.iolab);
                c.args(serve_spec(*model, *accept, l, sp.clone()).to_args());
                stats_path = Some(sp);
                c
            }
            Kind::Nginx(bin) => {
                let conf = l.run_dir.join("nginx.conf");
                std::fs::write(&conf, nginx_conf(l, iolab_sys::process::is_root()))
                    .with_context(|| format!("writing {}", conf.display()))?;
                let mut c = Command::new(bin);
                c.arg("-p")
                    .arg(&l.run_dir)
                    .arg("-e")
                    .arg(l.run_dir.join("nginx-error.log"))
                    .arg("-c")
                    .arg(&conf);
                c
            }
            Kind::Tokio(bin) => {
                let mut c = Command::new(bin);
                c.args(tokio_spec(l).to_args());
                c
            }
            Kind::Monoio(bin) => {
                let mut c = Command::new(bin);
                c.args(monoio_spec(l).to_args());
                c
            }
            Kind::Glommio(bin) => {
                let mut c = Command::new(bin);
                c.args(glommio_spec(l).to_args());
                c
            }
            Kind::Command(_) | Kind::Url(_) => unreachable!("started above"),
        };
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let mut p = ServerProc::spawn(t, cmd, l, log_path, None)?;
        p.stats_path = stats_path;
        p.wait_ready(Duration::from_secs(10))?;
        Ok(p)
    }

    /// A `--target`: `sh -c` of its command with this start's values, in its own process
    /// group like the models; ready when it serves the lab's two files.
    fn command(t: &Target, template: &str, l: &Launch) -> anyhow::Result<ServerProc> {
        let line = command::substitute(template, l);
        let (stdout_path, log_path) = (l.run_dir.join("stdout.log"), l.run_dir.join("stderr.log"));
        let (out, err) = logs::open_logs(&stdout_path, &log_path, &line)?;
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(&line)
            .current_dir(&l.run_dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let mut p = ServerProc::spawn(t, cmd, l, log_path, Some(stdout_path))?;
        let ready = probe::wait_serving(l.addr, &l.www, Duration::from_secs(10), || p.exited());
        if let Err(e) = ready {
            let tail = p.log_tail();
            p.stop();
            bail!("{} {e:#}; {tail}", t.name);
        }
        Ok(p)
    }

    /// A `--url`: nothing to start; the server must serve the lab's files.
    fn url(t: &Target, u: &probe::UrlTarget, l: &Launch) -> anyhow::Result<ServerProc> {
        probe::check_url(u, &l.www).with_context(|| t.name.clone())?;
        Ok(ServerProc {
            child: None,
            pgid: 0,
            name: t.name.clone(),
            addr: u.addr,
            host: u.host.clone(),
            prefix: u.prefix.clone(),
            stats_path: None,
            log_path: l.run_dir.join("server.log"),
            stdout_path: None,
        })
    }

    /// Spawns `cmd` in its own process group, pinned to the launch's CPUs, dying with the
    /// lab, and registers the group for the signal handler.
    fn spawn(
        t: &Target,
        mut cmd: Command,
        l: &Launch,
        log_path: PathBuf,
        stdout_path: Option<PathBuf>,
    ) -> anyhow::Result<ServerProc> {
        cmd.process_group(0);
        if let Some(ns) = &l.netns {
            ns.enter(&mut cmd)?;
        }
        // The CPU set is built here, in the parent; the child only installs it.
        let cpus: Vec<usize> = if l.cpus.is_empty() {
            l.cpu.into_iter().collect()
        } else {
            l.cpus.clone()
        };
        if let Some(set) = (!cpus.is_empty()).then(|| cpu_set(&cpus)) {
            // SAFETY: the closure runs in the child between fork and exec and makes one raw
            // system call (no allocation, no locks): it pins the child to the server CPUs.
            unsafe {
                cmd.pre_exec(move || {
                    iolab_sys::cvt(libc::sched_setaffinity(
                        0,
                        std::mem::size_of::<libc::cpu_set_t>(),
                        &set,
                    ))
                    .map(drop)
                });
            }
        }
        // SIGKILL when the lab dies, so that no server outlives it.
        iolab_sys::process::die_with_parent(&mut cmd, libc::SIGKILL);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", t.name))?;
        let pgid = child.id() as i32;
        if !register(pgid) {
            let mut child = child;
            let _ = child.wait();
            // The signal thread is taking the lab down and exits with the signal's status;
            // going on would only fail every server left in moments and finish first.
            std::thread::sleep(Duration::from_secs(30));
            bail!("{}: not started, the lab is stopping", t.name);
        }
        Ok(ServerProc {
            child: Some(child),
            pgid,
            name: t.name.clone(),
            addr: l.addr,
            host: l.addr.to_string(),
            prefix: String::new(),
            stats_path: None,
            log_path,
            stdout_path,
        })
    }

    fn log_tail(&self) -> String {
        match &self.stdout_path {
            Some(out) => logs::log_tail(&self.log_path, out),
            None => logs::why(&std::fs::read_to_string(&self.log_path).unwrap_or_default()),
        }
    }

    fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let t0 = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                bail!(
                    "{} exited at start ({status}): {}",
                    self.name,
                    self.log_tail()
                );
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if t0.elapsed() > limit {
                bail!(
                    "{} did not accept connections on {} within {:?}: {}",
                    self.name,
                    self.addr,
                    limit,
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    /// The child's process group (the server and any process it started, e.g. nginx's
    /// workers); None for a `--url` server, which is not the lab's child.
    pub fn pgid(&self) -> Option<i32> {
        self.child.is_some().then_some(self.pgid)
    }

    /// `Some(status)` once the child has exited.
    pub fn exited(&mut self) -> Option<String> {
        let c = self.child.as_mut()?;
        match c.try_wait() {
            Ok(Some(s)) => Some(s.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("unknown ({e})")),
        }
    }

    /// Why the server died, if it did.
    pub fn crash_report(&mut self) -> Option<String> {
        self.exited()
            .map(|s| format!("{} exited ({s}): {}", self.name, self.log_tail()))
    }

    /// SIGTERM (a clean stop), then SIGKILL to the whole group if it lingers.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Whatever is left of the group after the grace (nginx workers, a stuck model) is
        // killed.
        let _ = iolab_sys::process::terminate_group(&mut child, Duration::from_secs(3));
        unregister(self.pgid);
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A free loopback port (bound then released; the server binds it right after).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// `name` in the directory of the running executable, then on PATH.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let p = dir.join(name);
            if is_executable(&p) {
                return Some(p);
            }
            // Test binaries live in target/<profile>/deps; the binaries one level up.
            if let Some(up) = dir.parent() {
                let p = up.join(name);
                if dir.ends_with("deps") && is_executable(&p) {
                    return Some(p);
                }
            }
        }
    }
    for extra in ["/usr/sbin", "/usr/local/sbin", "/sbin"] {
        let p = Path::new(extra).join(name);
        if is_executable(&p) {
            return Some(p);
        }
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_conf_keeps_everything_in_the_run_dir() {
        let l = Launch {
            iolab: "/x/iolab".into(),
            www: "/r/www".into(),
            run_dir: "/r/run/nginx".into(),
            addr: "127.0.0.1:8099".parse().unwrap(),
            workers: 1,
            backlog: 4096,
            cpu: Some(0),
            cpus: Vec::new(),
            netns: None,
        };
        let c = nginx_conf(&l, true);
        assert!(c.contains("listen 127.0.0.1:8099 backlog=4096;"));
        assert!(c.contains("root /r/www;"));
        assert!(c.contains("access_log off;"));
        assert!(c.contains("pid /r/run/nginx/nginx.pid;"));
        assert!(c.contains("user nobody nogroup;"));
        assert!(!nginx_conf(&l, false).contains("user "));
        for line in c
            .lines()
            .filter(|l| l.contains("_path") || l.contains("error_log"))
        {
            assert!(line.contains("/r/run/nginx/"), "{line}");
        }
    }

    #[test]
    fn nginx_conf_is_tuned_for_static_files() {
        let mut l = Launch {
            iolab: "/x/iolab".into(),
            www: "/r/www".into(),
            run_dir: "/r/run/nginx".into(),
            addr: "127.0.0.1:8099".parse().unwrap(),
            workers: 1,
            backlog: 200,
            cpu: None,
            cpus: Vec::new(),
            netns: None,
        };
        let c = nginx_conf(&l, false);
        for d in [
            "open_file_cache max=1000 inactive=60s;",
            "open_file_cache_valid 30s;",
            "sendfile on;",
            "tcp_nopush on;",
            "tcp_nodelay on;",
            "keepalive_requests 100000000;",
            "access_log off;",
            "worker_processes 1;",
            "worker_connections 16384;",
            "listen 127.0.0.1:8099 backlog=200;",
        ] {
            assert!(c.contains(d), "missing {d:?} in\n{c}");
        }
        // One worker: no reuseport; several: one per --workers, each with its own queue.
        assert!(!c.contains("reuseport"));
        l.workers = 4;
        let c = nginx_conf(&l, false);
        assert!(c.contains("worker_processes 4;"));
        assert!(c.contains("listen 127.0.0.1:8099 backlog=200 reuseport;"));
        // Enough descriptors for every connection plus an open file each.
        assert!(c.contains(&format!(
            "worker_rlimit_nofile {};",
            4 * NGINX_WORKER_CONNECTIONS
        )));
    }

    #[test]
    fn model_variants_map_to_serve_arguments() {
        assert_eq!(
            model_of("uring-callback-sync"),
            Some((Model::UringCallback, AcceptMode::Sync))
        );
        assert_eq!(model_of("epoll"), Some((Model::Epoll, AcceptMode::Async)));
        assert_eq!(model_of("nope"), None);
        let l = Launch {
            iolab: "/x/iolab".into(),
            www: "/r/www".into(),
            run_dir: "/r/run/x".into(),
            addr: "127.0.0.1:8099".parse().unwrap(),
            workers: 2,
            backlog: 200,
            cpu: None,
            cpus: Vec::new(),
            netns: None,
        };
        let args: Vec<String> = serve_spec(
            Model::UringCallback,
            AcceptMode::Sync,
            &l,
            "/r/run/x/stats".into(),
        )
        .to_args()
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect();
        for pair in [
            ["--model", "uring-callback"],
            ["--accept", "sync"],
            ["--root", "/r/www"],
            ["--addr", "127.0.0.1:8099"],
            ["--workers", "2"],
            ["--backlog", "200"],
            ["--stats", "/r/run/x/stats"],
        ] {
            assert!(args.windows(2).any(|w| w == pair), "{pair:?} in {args:?}");
        }
        assert_eq!(args[0], "serve");
        // The tokio peer gets at least one worker.
        let t = tokio_spec(&Launch {
            workers: 0,
            ..l.clone()
        });
        assert_eq!((t.peer.workers, t.peer.backlog), (1, 200));
        // So do the monoio and glommio peers, with their documented defaults otherwise.
        let m = monoio_spec(&Launch {
            workers: 0,
            ..l.clone()
        });
        assert_eq!((m.peer.workers, m.peer.backlog, m.entries), (1, 200, 32768));
        let g = glommio_spec(&Launch { workers: 2, ..l });
        assert_eq!((g.peer.workers, g.peer.backlog), (2, 200));
        assert_eq!(g.profile, iolab_servers::spec::GlommioProfile::Default);
    }

    #[test]
    fn a_start_line_is_waited_for_and_the_first_line_kept() {
        let dir = iolab_sys::testing::tempdir("lab-start-line").unwrap();
        let log = dir.path().join("server.log");
        assert_eq!(start_line(&log, Duration::from_millis(50)), None);
        std::fs::write(&log, "serving x on 127.0.0.1:1 with monoio (...)\nmore\n").unwrap();
        assert_eq!(
            start_line(&log, Duration::ZERO).as_deref(),
            Some("serving x on 127.0.0.1:1 with monoio (...)")
        );
    }

    /// A relative output directory (`iolab lab --out report`) still starts nginx: its
    /// configuration names absolute paths.
    #[test]
    fn nginx_starts_from_a_relative_directory() {
        let nginx = find_binary("nginx");
        if !iolab_sys::testing::require(
            nginx.is_some(),
            "needs `nginx` (Debian package nginx: sudo scripts/install-deps)",
        ) {
            return;
        }
        // Relative to the test's working directory (the crate directory).
        let rel = PathBuf::from(format!("target/iolab-lab-nginx-rel-{}", std::process::id()));
        std::fs::create_dir_all(rel.join("www")).unwrap();
        std::fs::write(rel.join("www/small.html"), b"hello\n").unwrap();
        let t = Target {
            name: "nginx".into(),
            kind: Kind::Nginx(nginx.unwrap()),
            describe: String::new(),
        };
        let l = Launch {
            iolab: "/bin/false".into(),
            www: rel.join("www"),
            run_dir: rel.join("run/nginx"),
            addr: format!("127.0.0.1:{}", free_port().unwrap())
                .parse()
                .unwrap(),
            workers: 1,
            backlog: 128,
            cpu: None,
            cpus: Vec::new(),
            netns: None,
        };
        let mut srv = ServerProc::start(&t, &l).expect("nginx starts with relative paths");
        let conf = std::fs::read_to_string(rel.join("run/nginx/nginx.conf")).unwrap();
        assert!(conf.contains("root /"), "{conf}");
        srv.stop();
        std::fs::remove_dir_all(&rel).unwrap();
    }

    /// The configuration the lab writes is valid for the installed nginx (`nginx -t`).
    #[test]
    fn nginx_accepts_the_config() {
        let nginx = find_binary("nginx");
        if !iolab_sys::testing::require(
            nginx.is_some(),
            "needs `nginx` (Debian package nginx: sudo scripts/install-deps)",
        ) {
            return;
        }
        let nginx = nginx.unwrap();
        let dir = std::env::temp_dir().join(format!("iolab-lab-nginx-t-{}", std::process::id()));
        let www = dir.join("www");
        std::fs::create_dir_all(&www).unwrap();
        for workers in [1, 2] {
            let l = Launch {
                iolab: "/bin/false".into(),
                www: www.clone(),
                run_dir: dir.join(format!("run{workers}")),
                addr: format!("127.0.0.1:{}", free_port().unwrap())
                    .parse()
                    .unwrap(),
                workers,
                backlog: 4096,
                cpu: None,
                cpus: Vec::new(),
                netns: None,
            };
            std::fs::create_dir_all(&l.run_dir).unwrap();
            let conf = l.run_dir.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(&l, iolab_sys::process::is_root())).unwrap();
            let out = Command::new(&nginx)
                .arg("-t")
                .arg("-p")
                .arg(&l.run_dir)
                .arg("-e")
                .arg(l.run_dir.join("nginx-error.log"))
                .arg("-c")
                .arg(&conf)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && text.contains("test is successful"),
                "nginx -t refused the config ({workers} workers): {text}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_server_that_fails_to_start_is_reported_and_reaped() {
        let dir = std::env::temp_dir().join(format!("iolab-lab-server-{}", std::process::id()));
        let t = Target {
            name: "false".into(),
            kind: Kind::Tokio("/bin/false".into()),
            describe: String::new(),
        };
        let l = Launch {
            iolab: "/bin/false".into(),
            www: dir.clone(),
            run_dir: dir.join("run"),
            addr: format!("127.0.0.1:{}", free_port().unwrap())
                .parse()
                .unwrap(),
            workers: 1,
            backlog: 16,
            cpu: None,
            cpus: Vec::new(),
            netns: None,
        };
        let e = ServerProc::start(&t, &l)
            .err()
            .expect("must fail")
            .to_string();
        assert!(e.contains("exited at start"), "{e}");
        assert!(GROUPS.lock().unwrap().0.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn finds_sh_on_path() {
        assert!(find_binary("sh").is_some());
        assert!(find_binary("no-such-binary-iolab").is_none());
    }
}
