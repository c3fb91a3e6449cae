//! Network namespaces, veth pairs and `tc` shaping that are always removed.
//!
//! A [`Net`] guard creates namespaces ([`Net::namespace`]) and veth pairs ([`Net::veth`])
//! and removes everything it created when dropped. Every name carries a tag, the owner's pid
//! and a counter (see [`names`]), so that
//! - a process-wide SIGINT / SIGTERM handler removes what the process still owns, then exits
//!   with 130 / 143 (installed by the first [`Net::new`] unless the program said it handles
//!   signals itself with [`external_signal_handling`] and calls [`cleanup_all`]);
//! - [`cleanup_stale`] removes what a killed process left behind: only names with our tag
//!   whose owner pid is dead, never anything live or not ours.
//!
//! Everything goes through iproute2 (`ip`, `tc`): the commands are the ones a person would
//! type, their errors are iproute2's own, and nothing here parses netlink by hand. A program
//! runs inside a namespace through `setns(2)` in a `pre_exec` hook ([`Namespace::enter`]), so
//! the child's pid is the program's own (killable, waitable) with no `ip netns exec` between.

pub mod delayline;
pub mod names;
pub mod shape;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, Once};

use anyhow::{bail, Context};

pub use shape::{format_rate, parse_duration, parse_rate, Shape};

/// Something this process created and must remove.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Owned {
    Namespace(String),
    /// One end of a veth pair (deleting it deletes the pair), and the namespace it is in.
    Link {
        name: String,
        ns: Option<String>,
    },
}

/// Everything the process owns, for the signal handler. Held while a create command runs,
/// so the handler never misses a resource that is being made.
static OWNED: Mutex<Vec<Owned>> = Mutex::new(Vec::new());
static COUNTER: AtomicU32 = AtomicU32::new(0);
static EXTERNAL_SIGNALS: AtomicBool = AtomicBool::new(false);
static HANDLER: Once = Once::new();
static TEARING_DOWN: AtomicBool = AtomicBool::new(false);

/// A guard over the namespaces and veths it created: all are removed on drop.
#[derive(Debug)]
pub struct Net {
    tag: String,
    owned: Vec<Owned>,
}

/// A network namespace made by a [`Net`] (its loopback is up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    name: String,
}

/// One end of a veth pair: its name and the namespace it lives in (None: the namespace of
/// this process).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    pub ns: Option<String>,
}

/// One qdisc as `tc -j qdisc show` reports it.
#[derive(Debug, Clone)]
pub struct Qdisc {
    pub kind: String,
    pub handle: String,
    /// "root" or the parent's handle.
    pub parent: String,
    /// tbf's rate in bits per second, if this is a tbf.
    pub rate_bps: Option<u64>,
    /// netem's delay, if this is a netem with a delay.
    pub delay_us: Option<u64>,
    /// tc's own JSON for this qdisc.
    pub json: serde_json::Value,
}

impl Net {
    /// A new guard for names tagged `tag` (1 to 3 of `a-z0-9`). Checks that iproute2 is
    /// there and that we may create namespaces, and installs the signal handler.
    pub fn new(tag: &str) -> anyhow::Result<Net> {
        names::check_tag(tag)?;
        preflight()?;
        if !EXTERNAL_SIGNALS.load(Ordering::SeqCst) {
            install_signal_handler()?;
        }
        Ok(Net {
            tag: tag.to_string(),
            owned: Vec::new(),
        })
    }

    fn next_counter(&self) -> anyhow::Result<u32> {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        if n > names::MAX_COUNTER {
            bail!(
                "this process already made {} namespaces and veths; names would no longer fit",
                names::MAX_COUNTER + 1
            );
        }
        Ok(n)
    }

    /// Creates a namespace `iolab-<tag>-<pid>-<n>` and brings its loopback up.
    pub fn namespace(&mut self) -> anyhow::Result<Namespace> {
        let n = self.next_counter()?;
        let name = names::namespace(&self.tag, std::process::id(), n);
        let owned = Owned::Namespace(name.clone());
        create(&owned, &["netns", "add", &name])?;
        self.owned.push(owned);
        ip(Some(&name), &["link", "set", "lo", "up"])?;
        Ok(Namespace { name })
    }

    /// Creates a veth pair, end `a` in namespace `a_ns` and end `b` in `b_ns` (None: this
    /// process's namespace). Both ends are down and have no address yet.
    pub fn veth(
        &mut self,
        a_ns: Option<&Namespace>,
        b_ns: Option<&Namespace>,
    ) -> anyhow::Result<(Iface, Iface)> {
        let n = self.next_counter()?;
        let pid = std::process::id();
        let a = Iface {
            name: names::veth(&self.tag, pid, n, 'a'),
            ns: a_ns.map(|n| n.name.clone()),
        };
        let b = Iface {
            name: names::veth(&self.tag, pid, n, 'b'),
            ns: b_ns.map(|n| n.name.clone()),
        };
        let mut args = vec!["link", "add", a.name.as_str()];
        if let Some(ns) = &a.ns {
            args.extend(["netns", ns.as_str()]);
        }
        args.extend(["type", "veth", "peer", "name", b.name.as_str()]);
        if let Some(ns) = &b.ns {
            args.extend(["netns", ns.as_str()]);
        }
        let owned = Owned::Link {
            name: a.name.clone(),
            ns: a.ns.clone(),
        };
        create(&owned, &args)?;
        self.owned.push(owned);
        Ok((a, b))
    }

    /// The names of everything this guard created and has not removed.
    pub fn names(&self) -> Vec<String> {
        self.owned
            .iter()
            .map(|o| match o {
                Owned::Namespace(n) => n.clone(),
                Owned::Link { name, .. } => name.clone(),
            })
            .collect()
    }

    /// Removes everything now, reporting the first failure (drop does the same silently).
    pub fn remove(mut self) -> anyhow::Result<()> {
        self.remove_all()
    }

    fn remove_all(&mut self) -> anyhow::Result<()> {
        let owned = std::mem::take(&mut self.owned);
        let r = remove_set(&owned);
        if let Ok(mut g) = OWNED.lock() {
            g.retain(|o| !owned.contains(o));
        }
        r
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Err(e) = self.remove_all() {
            tracing::warn!("iolab-netns: {e:#}");
        }
    }
}

impl Namespace {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A `Command` for `program` that runs inside this namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> anyhow::Result<Command> {
        let mut c = Command::new(program);
        self.enter(&mut c)?;
        Ok(c)
    }

    /// Makes `cmd` enter this namespace (setns in the child, before exec). Other pre_exec
    /// hooks of `cmd` still run.
    pub fn enter(&self, cmd: &mut Command) -> anyhow::Result<()> {
        let path = format!("/var/run/netns/{}", self.name);
        iolab_sys::process::enter_net_namespace(cmd, Path::new(&path))
            .with_context(|| format!("opening {path}"))
    }

    /// Runs `program args…` inside this namespace and waits for it; an error if it fails.
    pub fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<Output> {
        let out = self
            .command(program)?
            .args(args)
            .output()
            .with_context(|| format!("running {program} in {}", self.name))?;
        if !out.status.success() {
            bail!(
                "{program} {} in {}: {}: {}",
                args.join(" "),
                self.name,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out)
    }

    /// True while the namespace exists.
    pub fn exists(&self) -> bool {
        namespace_exists(&self.name)
    }

    /// A TCP listener bound to `addr` inside this namespace, usable from this process (a
    /// socket stays in the namespace it was created in): a short-lived thread enters the
    /// namespace, binds, and hands the listener back.
    pub fn tcp_listener(
        &self,
        addr: std::net::SocketAddr,
    ) -> anyhow::Result<std::net::TcpListener> {
        let name = self.name.clone();
        // The thread does nothing but enter, bind and end.
        std::thread::spawn(move || -> anyhow::Result<std::net::TcpListener> {
            enter_thread(&name).with_context(|| format!("entering namespace {name}"))?;
            std::net::TcpListener::bind(addr).with_context(|| format!("binding {addr}"))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the namespace thread panicked"))?
    }
}

impl Iface {
    /// Adds an address in CIDR form (`10.77.0.1/24`).
    pub fn add_addr(&self, cidr: &str) -> anyhow::Result<()> {
        ip(
            self.ns.as_deref(),
            &["addr", "add", cidr, "dev", &self.name],
        )
        .map(drop)
    }

    pub fn up(&self) -> anyhow::Result<()> {
        ip(self.ns.as_deref(), &["link", "set", &self.name, "up"]).map(drop)
    }

    /// Replaces this interface's root qdisc with `shape` (tbf and/or netem). Only our own
    /// veth ends can be shaped, so removing them removes the qdiscs.
    pub fn shape(&self, shape: &Shape) -> anyhow::Result<()> {
        shape.check()?;
        if shape.needs_netem() && !netem_available() {
            bail!(
                "a delay, loss or reordering needs the kernel's netem qdisc (sch_netem), which \
                 this kernel ({}) does not have; a rate alone (tbf) works",
                kernel_release()
            );
        }
        // Start from the default qdisc, so shaping twice replaces instead of failing.
        let _ = tc(
            self.ns.as_deref(),
            &["qdisc", "del", "dev", &self.name, "root"],
        );
        for args in shape.tc_args() {
            let mut a = vec!["qdisc", "add", "dev", self.name.as_str()];
            a.extend(args.iter().map(String::as_str));
            tc(self.ns.as_deref(), &a)?;
        }
        Ok(())
    }

    /// The qdiscs on this interface, read back from `tc -j qdisc show`.
    pub fn qdiscs(&self) -> anyhow::Result<Vec<Qdisc>> {
        let out = tc(
            self.ns.as_deref(),
            &["-j", "qdisc", "show", "dev", &self.name],
        )?;
        parse_qdiscs(&out)
    }

    /// `tc qdisc show dev IFACE` as tc prints it, one line per qdisc.
    pub fn qdisc_text(&self) -> anyhow::Result<String> {
        let out = tc(self.ns.as_deref(), &["qdisc", "show", "dev", &self.name])?;
        Ok(out.trim().to_string())
    }

    /// True while the interface exists.
    pub fn exists(&self) -> bool {
        ip(self.ns.as_deref(), &["link", "show", "dev", &self.name]).is_ok()
    }
}

/// Parses `tc -j qdisc show` output.
pub fn parse_qdiscs(json: &str) -> anyhow::Result<Vec<Qdisc>> {
    let v: serde_json::Value =
        serde_json::from_str(json.trim()).context("parsing tc's JSON qdisc list")?;
    let arr = v.as_array().context("tc's qdisc list is not an array")?;
    Ok(arr
        .iter()
        .map(|q| {
            let s = |k: &str| q.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
            let opts = q.get("options");
            let kind = s("kind");
            let rate_bps = if kind == "tbf" {
                // tc -j gives tbf's rate in bytes per second.
                opts.and_then(|o| o.get("rate"))
                    .and_then(|r| r.as_u64())
                    .map(|b| b * 8)
            } else {
                None
            };
            let delay_us = opts
                .and_then(|o| o.get("delay"))
                .and_then(|d| d.get("delay"))
                .and_then(|d| d.as_f64())
                .map(|secs| (secs * 1e6).round() as u64);
            let parent = if q.get("root").and_then(|r| r.as_bool()) == Some(true) {
                "root".to_string()
            } else {
                s("parent")
            };
            Qdisc {
                kind,
                handle: s("handle"),
                parent,
                rate_bps,
                delay_us,
                json: q.clone(),
            }
        })
        .collect())
}

/// Tells this crate that the program handles SIGINT / SIGTERM itself and calls
/// [`cleanup_all`] from its handler: no handler of ours is installed (two handlers that
/// both exit would race). Call it before the first [`Net::new`].
pub fn external_signal_handling() {
    EXTERNAL_SIGNALS.store(true, Ordering::SeqCst);
}

/// Records that a signal handler has begun tearing the process down and will exit with
/// 128 + the signal number. Called by our handler and by programs with their own.
pub fn note_signal() {
    TEARING_DOWN.store(true, Ordering::SeqCst);
}

/// Whether a signal handler is tearing the process down. The teardown (servers killed,
/// links removed, reads interrupted) makes the main thread's work fail; that failure is an
/// echo of the signal, not the result, so the main thread should wait for the handler's
/// exit instead of reporting it (see [`wait_if_tearing_down`]).
pub fn tearing_down() -> bool {
    TEARING_DOWN.load(Ordering::SeqCst)
}

/// If a signal handler is tearing the process down, blocks forever: the handler exits with
/// 128 + the signal. Otherwise returns at once.
pub fn wait_if_tearing_down() {
    while tearing_down() {
        std::thread::park();
    }
}

/// Installs the process-wide handler (once): on SIGINT or SIGTERM it removes everything the
/// process owns, then exits with 128 + the signal number (130, 143).
pub fn install_signal_handler() -> anyhow::Result<()> {
    let mut result = Ok(());
    HANDLER.call_once(|| {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) {
            Ok(s) => s,
            Err(e) => {
                result = Err(anyhow::Error::new(e).context("installing the signal handler"));
                return;
            }
        };
        let mut signals = signals;
        let spawned = std::thread::Builder::new()
            .name("netns-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    note_signal();
                    cleanup_all();
                    std::process::exit(128 + sig);
                }
            });
        if let Err(e) = spawned {
            result = Err(anyhow::Error::new(e).context("starting the signal thread"));
        }
    });
    result
}

/// Removes everything this process created and still owns (links first, then namespaces).
/// For a program's own signal handler; guards dropped later find nothing left to do.
pub fn cleanup_all() {
    let owned: Vec<Owned> = match OWNED.lock() {
        Ok(mut g) => std::mem::take(&mut *g),
        Err(p) => std::mem::take(&mut *p.into_inner()),
    };
    if let Err(e) = remove_set(&owned) {
        tracing::warn!("iolab-netns: {e:#}");
    }
}

/// Removes the namespaces and veths tagged `tag` whose owner process is dead, and kills the
/// processes still running inside such namespaces (a dead owner's children). Never touches
/// a name without our tag, nor one whose owner is alive. Returns what it removed.
pub fn cleanup_stale(tag: &str) -> anyhow::Result<Vec<String>> {
    names::check_tag(tag)?;
    preflight()?;
    let me = std::process::id();
    let mut removed = Vec::new();
    let stale = |owner: Option<u32>| matches!(owner, Some(p) if p != me && !names::pid_alive(p));
    // Root-namespace veth ends first: deleting one end deletes its peer wherever it is.
    for name in link_names(None)? {
        if stale(names::veth_owner(tag, &name)) {
            match ip(None, &["link", "del", &name]) {
                Ok(_) => removed.push(name),
                Err(e) if !link_exists(&name) => drop(e),
                Err(e) => return Err(e),
            }
        }
    }
    for ns in namespace_names()? {
        if !stale(names::namespace_owner(tag, &ns)) {
            continue;
        }
        kill_pids_in(&ns);
        // Veths between two namespaces go with the namespaces; delete ours explicitly in
        // case a process we could not kill still pins the namespace.
        if let Ok(links) = link_names(Some(&ns)) {
            for l in links {
                if names::veth_owner(tag, &l).is_some() {
                    let _ = ip(Some(&ns), &["link", "del", &l]);
                }
            }
        }
        ip(None, &["netns", "del", &ns])?;
        removed.push(ns);
    }
    Ok(removed)
}

fn kill_pids_in(ns: &str) {
    let Ok(out) = ip(None, &["netns", "pids", ns]) else {
        return;
    };
    for pid in out.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
        if pid > 1 && pid as u32 != std::process::id() {
            // A process inside a namespace whose owner is dead (so a child of that owner);
            // pid > 1, never a group or init. Gone already: nothing to do.
            let _ = iolab_sys::process::signal(pid as u32, libc::SIGKILL);
        }
    }
}

/// Names of the namespaces under /var/run/netns (what `ip netns list` shows).
pub fn namespace_names() -> anyhow::Result<Vec<String>> {
    let dir = match std::fs::read_dir("/var/run/netns") {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).context("listing /var/run/netns"),
    };
    let mut v: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    v.sort();
    Ok(v)
}

pub fn namespace_exists(name: &str) -> bool {
    Path::new("/var/run/netns").join(name).exists()
}

/// Names of the links in a namespace (None: ours).
pub fn link_names(ns: Option<&str>) -> anyhow::Result<Vec<String>> {
    let out = ip(ns, &["-j", "link", "show"])?;
    let v: serde_json::Value = serde_json::from_str(out.trim()).context("parsing ip -j link")?;
    Ok(v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| l.get("ifname").and_then(|n| n.as_str()))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default())
}

fn link_exists(name: &str) -> bool {
    ip(None, &["link", "show", "dev", name]).is_ok()
}

/// A /24 in 10.0.0.0/8 that no interface of this namespace has an address in, as its first
/// three octets. The search starts at a point derived from the pid, so concurrent processes
/// rarely pick the same one.
pub fn free_subnet() -> anyhow::Result<[u8; 3]> {
    let out = ip(None, &["-j", "-4", "addr", "show"])?;
    let v: serde_json::Value = serde_json::from_str(out.trim()).context("parsing ip -j addr")?;
    let mut used: Vec<[u8; 4]> = Vec::new();
    let mut nets8 = Vec::new();
    for l in v.as_array().into_iter().flatten() {
        for a in l
            .get("addr_info")
            .and_then(|a| a.as_array())
            .into_iter()
            .flatten()
        {
            let Some(ip) = a
                .get("local")
                .and_then(|x| x.as_str())
                .and_then(|s| s.parse::<std::net::Ipv4Addr>().ok())
            else {
                continue;
            };
            let plen = a.get("prefixlen").and_then(|p| p.as_u64()).unwrap_or(32);
            if ip.octets()[0] == 10 && plen < 24 {
                nets8.push((ip.octets(), plen));
            }
            used.push(ip.octets());
        }
    }
    if nets8.iter().any(|(_, p)| *p <= 8) {
        bail!("10.0.0.0/8 is in use on this machine; no private /24 to pick");
    }
    let seed = std::process::id().wrapping_mul(2_654_435_761) ^ COUNTER.load(Ordering::SeqCst);
    for i in 0..(100 * 256u32) {
        let k = (seed.wrapping_add(i)) % (100 * 256);
        let net = [10u8, 150 + (k / 256) as u8, (k % 256) as u8];
        let clash = used
            .iter()
            .any(|u| u[0] == net[0] && u[1] == net[1] && u[2] == net[2])
            || nets8.iter().any(|(o, p)| {
                let mask = u32::MAX << (32 - *p as u32);
                let a = u32::from_be_bytes(*o) & mask;
                let b = u32::from_be_bytes([net[0], net[1], net[2], 0]) & mask;
                a == b
            });
        if !clash {
            return Ok(net);
        }
    }
    bail!("no free /24 in 10.150.0.0 .. 10.249.255.0")
}

/// Moves the calling thread into namespace `name` (`/var/run/netns/<name>`); `setns(2)`
/// changes this thread only, and every socket it creates afterwards lives there.
pub fn enter_thread(name: &str) -> std::io::Result<()> {
    iolab_sys::process::enter_net_namespace_this_thread(Path::new(&format!(
        "/var/run/netns/{name}"
    )))
}

/// True if the kernel has the netem qdisc (probed once, on a throwaway namespace's loopback).
pub fn netem_available() -> bool {
    static PROBE: Mutex<Option<bool>> = Mutex::new(None);
    let mut g = PROBE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(v) = *g {
        return v;
    }
    let v = (|| -> anyhow::Result<bool> {
        let mut net = Net::new("nem")?;
        let ns = net.namespace()?;
        let ok = tc(
            Some(ns.name()),
            &["qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
        )
        .is_ok();
        net.remove()?;
        Ok(ok)
    })()
    .unwrap_or(false);
    *g = Some(v);
    v
}

/// The kernel release, "unknown" if it cannot be read.
pub fn kernel_release() -> String {
    iolab_sys::host::kernel_release().unwrap_or_else(|| "unknown".into())
}

/// Checks that iproute2 is installed and that this process may create namespaces.
pub fn preflight() -> anyhow::Result<()> {
    for tool in ["ip", "tc"] {
        if find_tool(tool).is_none() {
            bail!("`{tool}` not found: install iproute2 (scripts/install-deps)");
        }
    }
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("creating network namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)");
    }
    Ok(())
}

fn find_tool(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(Into::into))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn run_tool(tool: &str, args: &[&str]) -> anyhow::Result<String> {
    let exe = find_tool(tool)
        .with_context(|| format!("`{tool}` not found: install iproute2 (scripts/install-deps)"))?;
    let out = Command::new(&exe)
        .args(args)
        .output()
        .with_context(|| format!("running {tool}"))?;
    if !out.status.success() {
        bail!(
            "{tool} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip [-n NS] ARGS…`.
fn ip(ns: Option<&str>, args: &[&str]) -> anyhow::Result<String> {
    match ns {
        Some(n) => {
            let mut a = vec!["-n", n];
            a.extend_from_slice(args);
            run_tool("ip", &a)
        }
        None => run_tool("ip", args),
    }
}

/// `tc [-n NS] ARGS…`.
fn tc(ns: Option<&str>, args: &[&str]) -> anyhow::Result<String> {
    match ns {
        Some(n) => {
            let mut a = vec!["-n", n];
            a.extend_from_slice(args);
            run_tool("tc", &a)
        }
        None => run_tool("tc", args),
    }
}

/// Registers `owned` and runs the `ip` command that makes it, under the registry lock, so a
/// signal arriving meanwhile waits and then removes it.
fn create(owned: &Owned, args: &[&str]) -> anyhow::Result<()> {
    let mut g = OWNED.lock().unwrap_or_else(|p| p.into_inner());
    g.push(owned.clone());
    if let Err(e) = ip(None, args) {
        g.retain(|o| o != owned);
        return Err(e);
    }
    Ok(())
}

fn remove_set(owned: &[Owned]) -> anyhow::Result<()> {
    let mut first_err = None;
    for o in owned.iter().rev() {
        if let Owned::Link { name, ns } = o {
            if let Err(e) = ip(ns.as_deref(), &["link", "del", name]) {
                let gone = match ns {
                    Some(n) => {
                        !namespace_exists(n) || ip(Some(n), &["link", "show", "dev", name]).is_err()
                    }
                    None => !link_exists(name),
                };
                if !gone && first_err.is_none() {
                    first_err = Some(e);
                }
            }
        }
    }
    for o in owned.iter().rev() {
        if let Owned::Namespace(n) = o {
            if let Err(e) = ip(None, &["netns", "del", n]) {
                if namespace_exists(n) && first_err.is_none() {
                    first_err = Some(e);
                }
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
