//! The persistent testbed behind `iolab tiers up|down|status`: four network namespaces
//! (client, FE, IS, BE) joined by veth pairs, real nginx in each tier, kept alive by a
//! supervisor process that `up` starts and `down` stops.
//!
//! ```text
//!  client ──A── FE ──B── IS ──C── BE        A, B, C, D: /26 subnets of one free /24
//!               └────────D────────┘         D: the FE's direct path to the BE's agent
//! ```
//!
//! D exists for ODB: the FE fetches the pages the IS never touched straight from the BE's
//! agent (the seed's tiers share a datacenter network); payload bytes that cross the IS are
//! exactly those on its two interfaces.
//!
//! Cleanup: the supervisor owns everything (namespaces, veths via iolab-netns; cgroups;
//! nginx and agent processes) and removes it on SIGTERM/SIGINT (`down`, Ctrl-C). If it is
//! killed, the next `up` (or `down`) removes what a dead supervisor left: namespaces and
//! veths tagged `tie` (iolab-netns kills the processes inside), cgroups
//! `iolab-tiers-<deadpid>-*`, arena files `/dev/shm/iolab-tiers-odb-<deadpid>-*`.

use crate::stack::{Place, Stack};
use crate::state::{load_state, state_dir, state_path, write_state, State, UpConfig};
use anyhow::{bail, Context};
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

pub const TAG: &str = "tie";

/// Removes what dead supervisors left behind; returns a line per thing removed.
pub fn cleanup_stale() -> Vec<String> {
    let mut out = Vec::new();
    match iolab_netns::cleanup_stale(TAG) {
        Ok(v) => out.extend(v),
        Err(e) => out.push(format!("(netns cleanup: {e:#})")),
    }
    out.extend(crate::cpu::cleanup_stale_cgroups());
    if let Ok(rd) = std::fs::read_dir("/dev/shm") {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = n.strip_prefix("iolab-tiers-odb-") else {
                continue;
            };
            let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if !iolab_sys::process::exists(pid) && std::fs::remove_file(e.path()).is_ok() {
                out.push(format!("/dev/shm/{n}"));
            }
        }
    }
    if let Ok(b) = std::fs::read(state_path()) {
        if let Ok(s) = serde_json::from_slice::<State>(&b) {
            if !iolab_sys::process::exists(s.supervisor_pid) {
                if let Some(h) = &s.hosts {
                    out.extend(crate::hosts::cleanup_stale(h));
                }
                let _ = std::fs::remove_file(state_path());
                let _ = std::fs::remove_dir_all(&s.dir);
                out.push(state_path().display().to_string());
            }
        }
    }
    out
}

/// A free /24 for a set of namespaces' links, cut into subnets.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Subnets([u8; 3]);

impl Subnets {
    /// Host `host` of subnet `sub`, subnets of `size` addresses each.
    pub(crate) fn at(self, sub: u8, size: u8, host: u8) -> Ipv4Addr {
        let [x, y, z] = self.0;
        Ipv4Addr::new(x, y, z, sub * size + host)
    }
}

/// `n` namespaces with names tagged `tag` (removed with the returned guard), and a free
/// /24 for their links.
pub(crate) fn namespaces(
    tag: &str,
    n: usize,
) -> anyhow::Result<(iolab_netns::Net, Vec<iolab_netns::Namespace>, Subnets)> {
    let mut net = iolab_netns::Net::new(tag)?;
    let ns = (0..n)
        .map(|_| net.namespace())
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((net, ns, Subnets(iolab_netns::free_subnet()?)))
}

/// A veth pair from `l` (address `la`) to `r` (`ra`), both `/prefix`, both ends up.
pub(crate) fn link(
    net: &mut iolab_netns::Net,
    l: &iolab_netns::Namespace,
    r: &iolab_netns::Namespace,
    la: Ipv4Addr,
    ra: Ipv4Addr,
    prefix: u8,
) -> anyhow::Result<(iolab_netns::Iface, iolab_netns::Iface)> {
    let (il, ir) = net.veth(Some(l), Some(r))?;
    il.add_addr(&format!("{la}/{prefix}"))?;
    ir.add_addr(&format!("{ra}/{prefix}"))?;
    il.up()?;
    ir.up()?;
    Ok((il, ir))
}

/// The supervisor: builds the testbed, writes the state, waits for SIGTERM/SIGINT, removes
/// everything. Runs in its own process (started by `up`).
pub fn supervise(up: UpConfig, odb: Option<crate::stack::Odb>) -> anyhow::Result<()> {
    iolab_netns::external_signal_handling();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    let result = match &up.hosts {
        Some(file) => {
            crate::hosts::build_and_wait(&up, file, odb.as_ref().map(|o| o.lib.as_path()), &stop)
        }
        None => build_and_wait(&up, odb, &stop),
    };
    iolab_netns::cleanup_all();
    let _ = std::fs::remove_file(state_path());
    result
}

fn build_and_wait(
    up: &UpConfig,
    odb: Option<crate::stack::Odb>,
    stop: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<()> {
    let names = ["client", "fe", "is", "be"];
    let (mut net, ns, sub) = namespaces(TAG, names.len())?;
    let a = |s: u8, host: u8| sub.at(s, 64, host);
    let shape = match (up.rate_bps, up.delay_us) {
        (None, None) => None,
        (r, d) => {
            let mut s = iolab_netns::Shape::rate(r.unwrap_or(0));
            if r.is_none() {
                s.rate_bps = None;
            }
            if let Some(d) = d {
                s = s.with_delay(Duration::from_micros(d));
            }
            Some(s)
        }
    };
    // (left tier, right tier, subnet index)
    let links = [(0usize, 1usize, 0u8), (1, 2, 1), (2, 3, 2), (1, 3, 3)];
    let mut ifaces = Vec::new();
    let mut qdiscs = Vec::new();
    for (l, r, s) in links {
        let (il, ir) = link(&mut net, &ns[l], &ns[r], a(s, 1), a(s, 2), 26)?;
        if let Some(s) = &shape {
            il.shape(s)?;
            ir.shape(s)?;
            qdiscs.push(format!("{}: {}", il.name, il.qdisc_text()?.trim()));
        }
        ifaces.push((names[l].to_string(), il.name.clone()));
        ifaces.push((names[r].to_string(), ir.name.clone()));
    }
    // the FE reaches the BE's agent (link C's BE address) over link D
    ns[1].run(
        "ip",
        &[
            "route",
            "add",
            &format!("{}/26", a(2, 0)),
            "via",
            &a(3, 2).to_string(),
        ],
    )?;
    let dir = state_dir().join(format!("run-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let root = dir.join("www");
    crate::testutil::write_payloads(&root, &crate::testutil::all_sizes())?;
    let state = State {
        supervisor_pid: std::process::id(),
        up: up.clone(),
        namespaces: names
            .iter()
            .zip(&ns)
            .map(|(t, n)| (t.to_string(), n.name().to_string()))
            .collect(),
        client: Place {
            ns: Some(ns[0].name().into()),
            addr: a(0, 1),
        },
        fe: Place {
            ns: Some(ns[1].name().into()),
            addr: a(1, 1),
        },
        fe_client: a(0, 2),
        is: Place {
            ns: Some(ns[2].name().into()),
            addr: a(1, 2),
        },
        be: Place {
            ns: Some(ns[3].name().into()),
            addr: a(2, 2),
        },
        domain: format!("{}/26,{}/26,{}/26", a(1, 0), a(2, 0), a(3, 0)),
        ifaces,
        dir: dir.clone(),
        root,
        cgroup: None,
        configs: Vec::new(),
        qdiscs,
        hosts: None,
    };
    // The IS reaches the BE on link C from a(2,1), the FE reaches the IS from a(1,1): the
    // addresses above are what each tier is known by inside the domain.
    let cg = crate::cpu::Cgroups::new("up", &crate::stack::TIERS).ok();
    let cfg = state.stack_config(
        up.port,
        dir.join("stack"),
        if up.odb { odb } else { None },
        None,
    );
    let stack = Stack::start(cfg, cg.as_ref()).context("starting the tiers")?;
    let mut state = state;
    state.cgroup = cg.as_ref().map(|c| c.base.clone());
    state.configs = stack.configs.clone();
    write_state(&state)?;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(stack);
    drop(cg);
    net.remove()?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `up`: starts the supervisor (this program, `tiers supervise`) detached and waits until
/// it has written the state (or died).
pub fn up(exe: &Path, spec: &crate::children::SuperviseSpec) -> anyhow::Result<State> {
    if let Some(s) = load_state() {
        bail!(
            "a testbed is already up (supervisor pid {}); `iolab tiers down` first",
            s.supervisor_pid
        );
    }
    for line in cleanup_stale() {
        tracing::info!(target: "progress", "removed stale: {line}");
    }
    std::fs::create_dir_all(state_dir())?;
    let log = state_dir().join("supervisor.log");
    let mut c = std::process::Command::new(exe);
    c.args(spec.to_args());
    c.stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::options().append(true).open(&log)?);
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid in the child before exec: async-signal-safe, no allocation. The
    // supervisor then outlives this command and ignores the terminal's Ctrl-C.
    unsafe {
        c.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = c.spawn().context("starting the supervisor")?;
    let t0 = std::time::Instant::now();
    loop {
        if let Some(s) = load_state() {
            if s.supervisor_pid == child.id() {
                return Ok(s);
            }
        }
        if let Some(st) = child.try_wait()? {
            bail!(
                "the supervisor exited ({st}):\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        // hosts: copies of iolab, an SSH session per step
        let limit = Duration::from_secs(if spec.hosts.is_some() { 300 } else { 60 });
        if t0.elapsed() > limit {
            let _ = iolab_sys::process::signal(child.id(), libc::SIGTERM);
            bail!(
                "the testbed did not come up in {} s:\n{}",
                limit.as_secs(),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `down`: stops the supervisor (it removes everything) and cleans what a dead one left.
pub fn down() -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    if let Some(s) = load_state() {
        let _ = iolab_sys::process::signal(s.supervisor_pid, libc::SIGTERM);
        let t0 = std::time::Instant::now();
        while iolab_sys::process::exists(s.supervisor_pid) {
            if t0.elapsed() > Duration::from_secs(30) {
                bail!(
                    "the supervisor (pid {}) did not exit in 30 s",
                    s.supervisor_pid
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        out.push(format!(
            "stopped the testbed (supervisor pid {})",
            s.supervisor_pid
        ));
    }
    out.extend(
        cleanup_stale()
            .into_iter()
            .map(|l| format!("removed stale: {l}")),
    );
    Ok(out)
}
