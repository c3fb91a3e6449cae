//! End to end: `iolab lab --hosts` over three hosts that are network namespaces on one
//! bridge, each running Debian's sshd with a key this test makes: the server on one, the
//! load from the two others, their results merged; then the controller killed mid-run
//! (SIGKILL) leaves no process on any host. Needs root (namespaces) and openssh-server.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
#[path = "common/ssh_rig.rs"]
mod ssh_rig;

use ssh_rig::SshRig as Rig;

/// One rig at a time: each takes a free subnet, and two built at once could take the same.
static ONE_RIG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn rig(tag: &str) -> Option<(Rig, std::sync::MutexGuard<'static, ()>)> {
    let guard = ONE_RIG.lock().unwrap_or_else(|e| e.into_inner());
    Some((Rig::new(tag, 3)?, guard))
}

/// What this test asks of the shared rig.
trait LabRig {
    fn inventory(&self, copy: bool) -> PathBuf;
    fn leftovers(&self, needles: &[&str]) -> Vec<String>;
}

impl LabRig for Rig {
    /// The inventory: the first host serves (its iolab is this build's), the two others
    /// load it (with `copy`, the second gets a copy of the binary: 160 MB in a debug
    /// build, so only once).
    fn inventory(&self, copy: bool) -> PathBuf {
        let exe = env!("CARGO_BIN_EXE_iolab");
        let at = format!("iolab = \"{exe}\"");
        let text = format!(
            "[server]\n{}\n[[client]]\n{}\n[[client]]\n{}",
            self.host_lines(0, "h0", &at),
            self.host_lines(1, "h1", &at),
            self.host_lines(2, "h2", if copy { "copy = true" } else { &at })
        );
        let path = self.dir.path().join(format!("hosts-{copy}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Processes of the run on any host: their command lines name the run's directory or
    /// the lab's out directory.
    fn leftovers(&self, needles: &[&str]) -> Vec<String> {
        common::processes(|l| needles.iter().any(|n| l.contains(n)))
    }
}

fn lab(out: &Path, inventory: &Path, extra: &[&str]) -> Command {
    lab_of("epoll", out, inventory, extra)
}

fn lab_of(models: &str, out: &Path, inventory: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_iolab"));
    c.args([
        "lab",
        "--profile",
        "tiny",
        "--models",
        models,
        "--no-micro",
        "--out",
    ])
    .arg(out)
    .arg("--hosts")
    .arg(inventory)
    .args(extra);
    c
}

#[test]
fn lab_over_three_hosts_merges_and_leaves_nothing() {
    let Some((rig, _one)) = rig("lh") else {
        return;
    };
    let out = rig.dir.path().join("report");
    let res = lab(&out, &rig.inventory(true), &[]).output().unwrap();
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(res.status.success(), "{stderr}");
    assert!(stderr.contains("clock offset"), "{stderr}");
    let r = iolab_lab::validate::load_results(&out).unwrap();
    let h = r.hosts.as_ref().expect("a hosts block");
    assert!(h.failures.is_empty(), "{:?}", h.failures);
    assert_eq!(h.hosts.len(), 3);
    assert_eq!(h.hosts[0].role, "server");
    for x in &h.hosts {
        assert!(x.machine.contains_key("kernel"), "{x:?}");
        // The same clock: the namespaces share this machine's.
        assert!(x.clock_offset_ms.abs() < 50.0, "{x:?}");
    }
    let plan = iolab_lab::lab::Plan::for_profile(iolab_lab::lab::Profile::Tiny);
    assert_eq!(h.points.len(), plan.points().len());
    for p in &h.points {
        assert_eq!(p.per_host.len(), 2, "{p:?}");
        let ok: u64 = p.per_host.iter().map(|x| x.ok).sum();
        assert!(ok > 0, "{p:?}");
        assert_eq!(p.merged.ok, ok);
        assert_eq!(
            p.merged.connections,
            p.per_host.iter().map(|x| x.connections).sum::<usize>()
        );
        let rps: f64 = p.per_host.iter().map(|x| x.rps).sum();
        assert!((p.merged.rps - rps).abs() < 1e-6);
        // Merged quantiles lie within the hosts' own.
        let lo = p.per_host.iter().map(|x| x.p50_ms).fold(f64::MAX, f64::min);
        let hi = p.per_host.iter().map(|x| x.p50_ms).fold(0.0, f64::max);
        assert!(
            p.merged.p50_ms >= lo * 0.95 - 0.01 && p.merged.p50_ms <= hi * 1.05 + 0.01,
            "{p:?}"
        );
        assert!(p.server_cpu_s.is_some(), "{p:?}");
    }
    // Figure 2 over hosts: at the top close-mode level, both hosts' requests on one time
    // axis, so more in flight at once than either host's share.
    let top: Vec<_> = h.points.iter().filter(|p| p.trace.is_some()).collect();
    assert!(!top.is_empty(), "no Figure 2 trace");
    for p in top {
        assert!(plan.is_top_close(iolab_lab::plan::PointSpec {
            file: p.file,
            mode: p.mode,
            concurrency: p.concurrency
        }));
        let t = p.trace.as_ref().unwrap();
        assert!(!t.scatter.is_empty(), "{p:?}");
        let peak = t.client.iter().map(|x| x[1]).fold(0.0, f64::max);
        let share = p.per_host.iter().map(|x| x.connections).max().unwrap();
        assert!(peak > share as f64, "peak {peak} in flight, shares {share}");
    }
    // Each agent wrote its own records: h1 and h2 share this filesystem, and one shared run
    // directory once had both read one file (equal counts and quantiles at every point).
    let same = |p: &&iolab_lab::results::HostPoint| {
        let (a, b) = (&p.per_host[0], &p.per_host[1]);
        (a.ok, a.errors, a.p50_ms, a.p99_ms) == (b.ok, b.errors, b.p50_ms, b.p99_ms)
    };
    assert!(
        h.points.iter().filter(same).count() < h.points.len(),
        "{:?}",
        h.points
    );
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("iolab lab over hosts") && html.contains("<td>h2</td>"));
    assert!(html.contains("Figure 2") && html.contains("<svg"));
    let needles = ["/tmp/iolab-lab-", out.to_str().unwrap()];
    assert!(
        rig.leftovers(&needles).is_empty(),
        "{:?}",
        rig.leftovers(&needles)
    );

    // The controller killed mid-run: its agents and server end with their leases.
    let out2 = rig.dir.path().join("killed");
    let mut run = lab(&out2, &rig.inventory(false), &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while rig.leftovers(&[" load -c "]).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(30), "no agent started");
        assert!(run.try_wait().unwrap().is_none(), "the lab ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Each agent logs into its own host's directory: h1 and h2 share this /tmp, and one
    // shared run directory once had one agent's log truncated while the other's was read.
    let mut logs = std::collections::BTreeSet::new();
    let t2 = Instant::now();
    while logs.len() < 2 && t2.elapsed() < Duration::from_secs(15) {
        for l in rig.leftovers(&[" load -c "]) {
            if let Some(path) = l.split(" --log ").nth(1).and_then(|x| x.split(' ').next()) {
                logs.insert(path.to_string());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(logs.len(), 2, "the agents' logs: {logs:?}");
    assert!(!rig.leftovers(&[" serve "]).is_empty(), "no server running");
    iolab_sys::process::signal(run.id(), libc::SIGKILL).unwrap();
    let _ = run.wait();
    // A killed controller cannot remove its files; the hosts share this /tmp.
    let killed = run.id();
    for e in std::fs::read_dir("/tmp").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        for prefix in ["iolab-lab-", "iolab-ssh-"] {
            if name.starts_with(&format!("{prefix}{killed}-")) {
                let _ =
                    std::fs::remove_dir_all(e.path()).or_else(|_| std::fs::remove_file(e.path()));
            }
        }
    }
    let needles = ["/tmp/iolab-lab-"];
    let t1 = Instant::now();
    while !rig.leftovers(&needles).is_empty() && t1.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        rig.leftovers(&needles).is_empty(),
        "left running: {:?}",
        rig.leftovers(&needles)
    );
}

/// A `--target` command over hosts: Python's http.server started on the server host (its
/// address and the run's directory there in the placeholders), loaded from both client
/// hosts, its session's CPU counted; nothing of it left running afterwards.
#[test]
fn a_target_command_runs_on_the_server_host() {
    let Some(_) = iolab_sys::testing::require_tool("python3", "python3") else {
        return;
    };
    let Some((rig, _one)) = rig("lt") else {
        return;
    };
    let out = rig.dir.path().join("target-report");
    let target = "py=exec python3 -m http.server {port} --bind {ip} --directory {root}";
    let res = lab_of("none", &out, &rig.inventory(false), &["--target", target])
        .output()
        .unwrap();
    for p in &served_from_both_clients(&res, &out, "py").points {
        // The command's whole session on the server host, read from its /proc.
        assert!(p.server_cpu_s.is_some_and(|s| s > 0.0), "{p:?}");
    }
    // A server that never serves: nothing measured, a failure exit, the report written.
    let failed = rig.dir.path().join("failed-report");
    let res = lab_of(
        "none",
        &failed,
        &rig.inventory(false),
        &["--target", "bad=exec false {port}"],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(!res.status.success(), "{stderr}");
    assert!(stderr.contains("nothing measured on the hosts"), "{stderr}");
    assert!(failed.join("index.html").exists());
    let needles = ["http.server", "/tmp/iolab-lab-"];
    let t0 = Instant::now();
    while !rig.leftovers(&needles).is_empty() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        rig.leftovers(&needles).is_empty(),
        "{:?}",
        rig.leftovers(&needles)
    );
}

/// A `--url` server already running on the server host (python3's http.server in its
/// namespace, serving the lab's files): loaded from both client hosts, merged, and its CPU
/// reported as not measured rather than as zero.
#[test]
fn a_running_server_is_loaded_from_the_client_hosts() {
    let Some(_) = iolab_sys::testing::require_tool("python3", "python3") else {
        return;
    };
    let Some((rig, _one)) = rig("lu") else {
        return;
    };
    let out = rig.dir.path().join("url-report");
    let www = out.join("www");
    std::fs::create_dir_all(&www).unwrap();
    let (ns, addr) = &rig.hosts[0];
    let port = 18_300;
    let mut server = ns
        .command("python3")
        .unwrap()
        .args(["-m", "http.server", &port.to_string(), "--bind"])
        .arg(addr.to_string())
        .arg("--directory")
        .arg(&www)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::net::TcpStream::connect((*addr, port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "http.server not up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = format!("mine=http://{addr}:{port}/");
    let res = lab_of("none", &out, &rig.inventory(false), &["--url", &url])
        .output()
        .unwrap();
    iolab_sys::testing::stop_child(&mut server);
    for p in &served_from_both_clients(&res, &out, "mine").points {
        assert_eq!(p.server_cpu_s, None, "{p:?}");
        assert_eq!(p.us_per_request, None, "{p:?}");
    }
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.contains("<td>mine</td>"));
}

/// A hosts run that succeeded: its hosts block, every point `server`'s, each loaded and
/// answered from both client hosts.
fn served_from_both_clients(
    res: &std::process::Output,
    out: &Path,
    server: &str,
) -> iolab_lab::results::HostsRun {
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(res.status.success(), "{stderr}");
    let r = iolab_lab::validate::load_results(out).unwrap();
    let h = r.hosts.expect("a hosts block");
    assert!(h.failures.is_empty(), "{:?}", h.failures);
    assert!(!h.points.is_empty());
    for p in &h.points {
        assert_eq!(p.server, server, "{p:?}");
        assert_eq!(p.per_host.len(), 2, "{p:?}");
        assert!(p.per_host.iter().all(|x| x.ok > 0), "{p:?}");
    }
    h
}
