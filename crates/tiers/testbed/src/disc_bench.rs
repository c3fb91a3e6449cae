//! `iolab tiers bench --disc`: the unmodified nginx chain, our tiers without DISC and our
//! tiers with DISC (direct mode: the BE's DP sends payloads on the FE's client connection)
//! side by side in one run.
//!
//! DISC needs a path the nginx testbed lacks, so the bench builds its own four namespaces
//! (tag `dsb`, removed on exit and by the next run if it was killed):
//!
//! ```text
//!  client ──A── FE ──B── IS ──C── BE        /27 subnets of one free /24
//!    │          └────────D────────┘│        D: the FE reaches DP on the BE
//!    └───────────────E─────────────┘        E: DP's segments to the client
//! ```
//!
//! TCP runs with Linux's defaults (timestamps, window scaling, SACK) everywhere; the
//! client has reverse-path filtering off (DP's segments carry the FE's address and arrive
//! on E). Every configuration runs in these same
//! namespaces under the same settings, so the nginx chain meets the same TCP.
//!
//! Each tier is its own process (nginx master + worker; `iolab disc be|proxy`), started in
//! its namespace and in a cgroup of its own (the BE's DP is a part of the BE process, so
//! its CPU counts as the BE's), pinned to CPU 0; wrk runs in the client's namespace on CPU 1.
//! A configuration runs only during its own runs (started, checked, measured, stopped): the
//! FE's eBPF hooks exist only while DISC runs, and idle peers cost nothing to the others.
//! Each repeat runs the three configurations in a shuffled order.
//!
//! Stalls: wrk's own `--timeout` counts requests that waited too long, and the whole wrk run
//! is bounded by `timeout(1)`; a stalled run is counted in the table, never waited for.
//!
//! Hook cost: `kernel.bpf_stats_enabled=1` during the bench (the previous value restored
//! after), `bpftool prog show --json` before and after each DISC run: run_time_ns/run_cnt of
//! the FE process's `disc_egress` and `disc_ingress` programs.

use crate::bench::{check_in_chromium, esc, machine, nginx_configs_html, parse_wrk, stats};
use crate::stack::{die_with_parent, enter_cgroup, enter_ns, reap_by, Place, Stack, StackConfig};
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Namespace/veth tag of this bench (names carry it and the owner's pid).
pub const TAG: &str = "dsb";
pub const FULL_SIZES: [usize; 5] = [1024, 16384, 65536, 262144, 1 << 20];
pub const QUICK_SIZES: [usize; 3] = [1024, 65536, 1 << 20];
/// The three configurations, in the table's order.
pub const CONFIGS: [&str; 3] = ["nginx", "ours", "disc"];

pub fn config_label(c: &str) -> &'static str {
    match c {
        "nginx" => "nginx chain",
        "ours" => "our tiers, DISC off",
        _ => "our tiers, DISC direct",
    }
}

#[derive(Clone, Debug)]
pub struct DiscOpts {
    pub sizes: Vec<usize>,
    pub repeats: usize,
    pub seconds: u64,
    pub connections: usize,
    /// Payload files f<size> (the testbed's root).
    pub root: PathBuf,
    /// Scratch directory (configs, logs), removed at the end.
    pub dir: PathBuf,
    /// This program (`iolab`), to start our tiers as `iolab disc be|proxy`.
    pub exe: PathBuf,
    pub tier_cpus: String,
    pub client_cpus: String,
    /// DP's send path (`iolab disc be --dp-send`): gso, raw, xdp or repair.
    pub dp_send: String,
    /// The FE forwards the client's ACKs to DP (`iolab disc be --no-ack-tap`).
    pub dp_acks_forwarded: bool,
    /// Open loop at this many requests/s (`iolab load --rate`) instead of wrk's closed loop.
    pub rate: Option<f64>,
}

/// One wrk run of one configuration at one size.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Run {
    pub config: String,
    pub size: usize,
    pub repeat: usize,
    /// The bytes of one GET before the run were those of the file.
    pub bytes_ok: bool,
    /// What the check's GET received instead, when it was wrong.
    pub bytes_error: Option<String>,
    pub requests: u64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Non-2xx answers and socket errors other than timeouts.
    pub errors: u64,
    /// Requests wrk gave up waiting for (`--timeout`), and runs cut by the outer bound.
    pub stalled: u64,
    /// CPU seconds per tier (FE, IS, BE) during the run.
    pub cpu_s: [f64; 3],
    pub fe_bytes: u64,
    pub is_bytes: u64,
    /// (run_time_ns, run_cnt) of disc_egress and disc_ingress during the run (DISC only).
    pub hook_egress: Option<(u64, u64)>,
    pub hook_ingress: Option<(u64, u64)>,
    /// Percent of the tiers' CPU time the host took during the run (`bench::Steal`).
    pub steal_pct: Option<f64>,
}

/// Addresses of the bench's namespaces.
struct Net {
    net: Option<iolab_netns::Net>,
    ns: [String; 4],
    fe_client: Ipv4Addr,
    fe: Ipv4Addr,
    is: Ipv4Addr,
    be: Ipv4Addr,
    dp: Ipv4Addr,
    /// The FE's interface on link A (where the hooks go).
    fe_if: String,
    sysctls: Vec<String>,
}

impl Net {
    /// `repair`: DP sends from repaired sockets (`--dp-send repair`): the BE's namespace is
    /// set up for them.
    fn build(repair: bool) -> anyhow::Result<Net> {
        let _ = iolab_netns::cleanup_stale(TAG);
        let mut net = iolab_netns::Net::new(TAG)?;
        let mut ns = Vec::new();
        for _ in 0..4 {
            ns.push(net.namespace()?);
        }
        let [x, y, z] = iolab_netns::free_subnet()?;
        let a = |sub: u8, host: u8| Ipv4Addr::new(x, y, z, sub * 32 + host);
        // (left, right, subnet): A, B, C, D, E
        let links = [
            (0usize, 1usize, 0u8),
            (1, 2, 1),
            (2, 3, 2),
            (1, 3, 3),
            (0, 3, 4),
        ];
        let mut ifs = Vec::new();
        for (l, r, sub) in links {
            let (il, ir) = net.veth(Some(&ns[l]), Some(&ns[r]))?;
            il.add_addr(&format!("{}/27", a(sub, 1)))?;
            ir.add_addr(&format!("{}/27", a(sub, 2)))?;
            il.up()?;
            ir.up()?;
            ifs.push((il, ir));
        }
        // DP's segments to the client leave the BE on E
        let client_net = format!("{}/27", a(0, 0));
        ns[3].run(
            "ip",
            &["route", "add", &client_net, "via", &a(4, 1).to_string()],
        )?;
        // every neighbour resolved before the first measured packet: DP's first segments
        // to the client must not wait in an unresolved neighbour's queue (seen: a first
        // 64 KiB DISC answer stalled on a fresh link E)
        // (a connection attempt to a closed port: ARP, SYN, RST; ping is not installed)
        for (l, r, sub) in links {
            for (from, to) in [(l, a(sub, 2)), (r, a(sub, 1))] {
                let url = format!("http://{to}:9/");
                let _ = ns[from].run("curl", &["-s", "--noproxy", "*", "-m", "2", &url]);
            }
        }
        let mut sysctls = Vec::new();
        let e = format!("net.ipv4.conf.{}.rp_filter=0", ifs[4].0.name);
        for kv in ["net.ipv4.conf.all.rp_filter=0", e.as_str()] {
            ns[0].run("sysctl", &["-q", "-w", kv])?;
            sysctls.push(format!("client: {kv}"));
        }
        if repair {
            let ran = iolab_disc::repair::dp_namespace_setup(
                &ns[3],
                a(0, 2),
                &client_net,
                a(4, 1),
                &ifs[3].1.name,
            )?;
            sysctls.extend(ran.into_iter().map(|c| format!("be: {c}")));
        }
        Ok(Net {
            ns: [0, 1, 2, 3].map(|i| ns[i].name().to_string()),
            net: Some(net),
            fe_client: a(0, 2),
            fe: a(1, 1),
            is: a(1, 2),
            be: a(2, 2),
            dp: a(3, 2),
            fe_if: ifs[0].1.name.clone(),
            sysctls,
        })
    }

    fn tier_ns(&self, tier: &str) -> &str {
        match tier {
            "client" => &self.ns[0],
            "fe" => &self.ns[1],
            "is" => &self.ns[2],
            _ => &self.ns[3],
        }
    }

    fn bytes(&self, tier: &str) -> u64 {
        crate::cpu::iface_bytes(Some(self.tier_ns(tier)))
            .map(|v| v.iter().map(|(_, rx, tx)| rx + tx).sum())
            .unwrap_or(0)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(n) = self.net.take() {
            if let Err(e) = n.remove() {
                tracing::warn!("disc bench: removing namespaces: {e:#}");
            }
        }
    }
}

/// Restores `kernel.bpf_stats_enabled` when dropped.
struct BpfStats(Option<String>);
const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";
impl BpfStats {
    fn enable() -> BpfStats {
        let old = std::fs::read_to_string(BPF_STATS).ok();
        if std::fs::write(BPF_STATS, "1").is_err() {
            return BpfStats(None);
        }
        BpfStats(old)
    }
}
impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write(BPF_STATS, old.trim());
        }
    }
}

/// The ids of the BPF programs process `pid` holds open (`prog_id:` in its fds' fdinfo):
/// Debian's bpftool does not list a program's owners, and other DISC runs on the machine
/// may hold programs of the same name.
fn prog_ids_of(pid: u32) -> Vec<u64> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("prog_id:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .collect()
}

/// (run_time_ns, run_cnt) of the `disc_egress` and `disc_ingress` programs among `ids`,
/// from the kernel's own accounting (`bpftool prog show --json`).
fn hook_stats(ids: &[u64]) -> Option<[(u64, u64); 2]> {
    if ids.is_empty() {
        return None;
    }
    let out = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
        .ok()?;
    parse_hook_stats(&String::from_utf8_lossy(&out.stdout), ids)
}

pub fn parse_hook_stats(json: &str, ids: &[u64]) -> Option<[(u64, u64); 2]> {
    let v: Value = serde_json::from_str(json).ok()?;
    let mut r = [(0, 0); 2];
    let mut found = false;
    for p in v.as_array()? {
        if !p["id"].as_u64().is_some_and(|id| ids.contains(&id)) {
            continue;
        }
        let i = match p["name"].as_str() {
            Some("disc_egress") => 0,
            Some("disc_ingress") => 1,
            _ => continue,
        };
        found = true;
        r[i].0 += p["run_time_ns"].as_u64().unwrap_or(0);
        r[i].1 += p["run_cnt"].as_u64().unwrap_or(0);
    }
    found.then_some(r)
}

/// One configuration while it runs.
enum Peers {
    Nginx(Box<Stack>),
    Ours {
        procs: Vec<(String, Child)>,
        fe_if: Option<(String, String)>,
    },
}

impl Peers {
    fn fe_pid(&self) -> Option<u32> {
        match self {
            Peers::Ours { procs, .. } => procs.iter().find(|(t, _)| t == "fe").map(|(_, c)| c.id()),
            _ => None,
        }
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        if let Peers::Ours { procs, fe_if } = self {
            for (_, c) in procs.iter().rev() {
                // SAFETY: kill(2) on our own child.
                unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            for (_, c) in procs.iter_mut() {
                reap_by(c, deadline);
            }
            // the hooks go with the FE's process; the qdisc it attached them to must too, so
            // the next configuration meets a plain interface
            if let Some((ns, iface)) = fe_if {
                let _ = Command::new("ip")
                    .args([
                        "netns", "exec", ns, "tc", "qdisc", "del", "dev", iface, "clsact",
                    ])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

const PORT_NGINX: u16 = 8080;
const PORT_OURS: u16 = 8090;
const PORT_DISC: u16 = 8100;

fn port(config: &str) -> u16 {
    match config {
        "nginx" => PORT_NGINX,
        "ours" => PORT_OURS,
        _ => PORT_DISC,
    }
}

fn fe_url(net: &Net, config: &str, size: usize) -> String {
    format!("http://{}:{}/f{size}", net.fe_client, port(config))
}

fn nginx_config(net: &Net, o: &DiscOpts) -> StackConfig {
    let place = |ns: &str, addr| Place {
        ns: Some(ns.to_string()),
        addr,
    };
    StackConfig {
        fe: place(&net.ns[1], net.fe),
        is: place(&net.ns[2], net.is),
        be: place(&net.ns[3], net.be),
        port: PORT_NGINX,
        dir: o.dir.join("nginx"),
        root: o.root.clone(),
        odb: None,
        loopback: false,
        workers: 1,
        skip_be: false,
        fe_listen: Some(net.fe_client),
        domain: None,
        cpus: Some(o.tier_cpus.clone()),
        php: false,
    }
}

/// The command lines of our tiers in a configuration: (tier, args after `iolab`).
fn our_tiers(net: &Net, o: &DiscOpts, disc: bool) -> Vec<(&'static str, Vec<String>)> {
    let p = port(if disc { "disc" } else { "ours" });
    let be = SocketAddrV4::new(net.be, p + 2);
    let is = SocketAddrV4::new(net.is, p + 1);
    let fe = SocketAddrV4::new(net.fe_client, p);
    let mode = if disc { "direct" } else { "off" };
    let mut be_args = vec![
        "disc".into(),
        "be".into(),
        "--listen".into(),
        be.to_string(),
        "--root".into(),
        o.root.display().to_string(),
    ];
    if disc {
        be_args.extend([
            "--dp".into(),
            SocketAddrV4::new(net.dp, p + 3).to_string(),
            "--dp-send".into(),
            o.dp_send.clone(),
        ]);
        if o.dp_acks_forwarded {
            be_args.push("--no-ack-tap".into());
        }
    }
    let proxy = |listen: SocketAddrV4, up: SocketAddrV4, first: bool| {
        let mut v: Vec<String> = vec![
            "disc".into(),
            "proxy".into(),
            "--listen".into(),
            listen.to_string(),
            "--upstream".into(),
            up.to_string(),
            "--disc".into(),
            mode.into(),
        ];
        if first {
            v.push("--first".into());
            if disc {
                v.extend(["--hook-iface".into(), net.fe_if.clone()]);
            }
        }
        v
    };
    vec![
        ("be", be_args),
        ("is", proxy(is, be, false)),
        ("fe", proxy(fe, is, true)),
    ]
}

fn start(config: &str, net: &Net, o: &DiscOpts, cg: &crate::cpu::Cgroups) -> anyhow::Result<Peers> {
    if config == "nginx" {
        return Ok(Peers::Nginx(Box::new(Stack::start(
            nginx_config(net, o),
            Some(cg),
        )?)));
    }
    let disc = config == "disc";
    let dir = o.dir.join(config);
    std::fs::create_dir_all(&dir)?;
    let mut peers = Peers::Ours {
        procs: Vec::new(),
        fe_if: disc.then(|| (net.ns[1].clone(), net.fe_if.clone())),
    };
    for (tier, args) in our_tiers(net, o, disc) {
        let mut c = Command::new("taskset");
        c.args(["-c", &o.tier_cpus]).arg(&o.exe).args(&args);
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{tier}.log")))?);
        enter_ns(&mut c, net.tier_ns(tier))?;
        enter_cgroup(&mut c, &cg.dir(tier))?;
        die_with_parent(&mut c);
        let mut child = c.spawn().with_context(|| format!("starting our {tier}"))?;
        let listen: SocketAddrV4 = args[3].parse()?;
        let r = crate::stack::wait_listening(
            listen,
            Some(net.tier_ns(tier)),
            &mut child,
            &format!("our {tier}"),
        );
        if let Peers::Ours { procs, .. } = &mut peers {
            procs.push((tier.to_string(), child));
        }
        r.with_context(|| {
            std::fs::read_to_string(dir.join(format!("{tier}.log"))).unwrap_or_default()
        })?;
    }
    Ok(peers)
}

/// GETs `url` once from the client's namespace (never through a proxy); what went wrong
/// when the bytes are not the file's.
fn check_bytes(net: &Net, url: &str, want: &[u8]) -> Option<String> {
    let mut c = Command::new("curl");
    c.args(["-s", "-S", "--noproxy", "*", "-m", "20", url]);
    if let Err(e) = enter_ns(&mut c, &net.ns[0]) {
        return Some(format!("{e:#}"));
    }
    let t0 = Instant::now();
    let out = match c.output() {
        Ok(o) => o,
        Err(e) => return Some(format!("running curl: {e}")),
    };
    if !out.status.success() {
        return Some(format!(
            "curl: {} after {:.1} s with {} of {} bytes: {}",
            out.status,
            t0.elapsed().as_secs_f64(),
            out.stdout.len(),
            want.len(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    if out.stdout != want {
        let first = out.stdout.iter().zip(want).position(|(a, b)| a != b);
        return Some(format!(
            "{} bytes received ({} expected), first difference at {:?}",
            out.stdout.len(),
            want.len(),
            first
        ));
    }
    None
}

/// Socket-error timeouts in wrk's output.
fn wrk_timeouts(out: &str) -> u64 {
    out.lines()
        .find_map(|l| l.trim().strip_prefix("Socket errors:"))
        .and_then(|r| {
            r.split(',')
                .find(|p| p.trim().starts_with("timeout"))
                .and_then(|p| p.split_whitespace().last())
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// Runs `program args` from the client's namespace on the client's CPU, bounded to the run
/// and 30 s more; None when the bound killed it (the run is counted as stalled).
fn client_output(
    net: &Net,
    o: &DiscOpts,
    name: &str,
    program: &std::ffi::OsStr,
    args: &[String],
) -> anyhow::Result<Option<std::process::Output>> {
    let bound = (o.seconds + 30).to_string();
    let mut c = Command::new("timeout");
    c.args(["-k", "5", &bound, "taskset", "-c", &o.client_cpus])
        .arg(program)
        .args(args);
    enter_ns(&mut c, &net.ns[0])?;
    let out = c.output().with_context(|| format!("running {name}"))?;
    match out.status.code() {
        Some(0) => Ok(Some(out)),
        Some(124) | Some(137) | None => Ok(None),
        Some(_) => bail!("{name} failed: {}", String::from_utf8_lossy(&out.stderr)),
    }
}

/// What a client run gave: (requests, p50, p99, errors, stalled).
type ClientRun = (u64, f64, f64, u64, u64);

/// A run the bound killed.
const KILLED: ClientRun = (0, f64::NAN, f64::NAN, 0, 1);

/// Runs wrk from the client's namespace.
fn wrk(net: &Net, url: &str, o: &DiscOpts) -> anyhow::Result<ClientRun> {
    let args = [
        "-t1".to_string(),
        format!("-c{}", o.connections),
        format!("-d{}s", o.seconds),
        "--latency".into(),
        "--timeout".into(),
        "5s".into(),
        url.into(),
    ];
    let Some(out) = client_output(net, o, "wrk (Debian package wrk)", "wrk".as_ref(), &args)?
    else {
        return Ok(KILLED);
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let (req, p50, p99, errors) = parse_wrk(&text)?;
    let timeouts = wrk_timeouts(&text);
    Ok((req, p50, p99, errors.saturating_sub(timeouts), timeouts))
}

/// The client's run: wrk's closed loop, or `iolab load`'s open loop at `o.rate`.
fn client_run(net: &Net, url: &str, o: &DiscOpts) -> anyhow::Result<ClientRun> {
    match o.rate {
        None => wrk(net, url, o),
        Some(rate) => load(net, url, o, rate),
    }
}

/// Runs `iolab load --rate` from the client's namespace, as [`wrk`] runs wrk.
fn load(net: &Net, url: &str, o: &DiscOpts, rate: f64) -> anyhow::Result<ClientRun> {
    let args = [
        "load".to_string(),
        "--rate".into(),
        rate.to_string(),
        "--keepalive".into(),
        "-c".into(),
        o.connections.to_string(),
        "--threads".into(),
        "1".into(),
        "-d".into(),
        format!("{}s", o.seconds),
        "--timeout".into(),
        "5s".into(),
        "--json".into(),
        "-".into(),
        "-q".into(),
        url.into(),
    ];
    match client_output(net, o, "iolab load", o.exe.as_os_str(), &args)? {
        Some(out) => parse_load(&String::from_utf8_lossy(&out.stdout)),
        None => Ok(KILLED),
    }
}

/// `iolab load --json -`'s report as (requests, p50, p99, errors, stalled): the requests
/// answered 2xx, the errors other than timeouts and unfinished requests, and those two
/// (requests that waited too long, or were still due when the run ended) as stalled.
fn parse_load(text: &str) -> anyhow::Result<ClientRun> {
    let v: Value = serde_json::from_str(text).context("iolab load's JSON report")?;
    let n = |k: &str| {
        v[k].as_u64()
            .with_context(|| format!("iolab load's report has no {k}"))
    };
    let ms = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let timeouts = v["errors"]["timeout"].as_u64().unwrap_or(0);
    let unfinished = n("unfinished")?;
    let errors = n("error_count")?.saturating_sub(timeouts + unfinished);
    Ok((
        n("ok")?,
        ms("p50_ms"),
        ms("p99_ms"),
        errors,
        timeouts + unfinished,
    ))
}

fn one_run(
    config: &str,
    size: usize,
    repeat: usize,
    net: &Net,
    peers: &Peers,
    cg: &crate::cpu::Cgroups,
    o: &DiscOpts,
) -> anyhow::Result<Run> {
    let url = fe_url(net, config, size);
    let want = crate::testutil::payload(size);
    let bytes_error = check_bytes(net, &url, &want);
    let ids = peers
        .fe_pid()
        .filter(|_| config == "disc")
        .map(prog_ids_of)
        .unwrap_or_default();
    let h0 = hook_stats(&ids);
    let cpu0 = crate::stack::TIERS.map(|t| cg.cpu_seconds(t));
    let (fe0, is0) = (net.bytes("fe"), net.bytes("is"));
    let steal = crate::bench::Steal::start(Some(&o.tier_cpus));
    let (requests, p50, p99, errors, stalled) = client_run(net, &url, o)?;
    let steal_pct = steal.pct();
    let (fe1, is1) = (net.bytes("fe"), net.bytes("is"));
    let cpu1 = crate::stack::TIERS.map(|t| cg.cpu_seconds(t));
    let h1 = hook_stats(&ids);
    let hook = |i: usize| match (h0, h1) {
        (Some(a), Some(b)) => Some((b[i].0.saturating_sub(a[i].0), b[i].1.saturating_sub(a[i].1))),
        _ => None,
    };
    Ok(Run {
        config: config.to_string(),
        size,
        repeat,
        bytes_ok: bytes_error.is_none(),
        bytes_error,
        requests,
        rps: requests as f64 / o.seconds as f64,
        p50_ms: p50,
        p99_ms: p99,
        errors,
        stalled,
        cpu_s: [0, 1, 2].map(|i| cpu1[i] - cpu0[i]),
        fe_bytes: fe1 - fe0,
        is_bytes: is1 - is0,
        hook_egress: hook(0),
        hook_ingress: hook(1),
        steal_pct,
    })
}

/// A small xorshift for the order of the configurations (no dependency for a shuffle).
fn shuffled(seed: &mut u64) -> [&'static str; 3] {
    let mut c = CONFIGS;
    for i in (1..c.len()).rev() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        c.swap(i, (*seed % (i as u64 + 1)) as usize);
    }
    c
}

/// One size's row of the result: each configuration's summary and the ratios between them.
fn size_row(runs: &[Run], size: usize) -> Value {
    let mut x = serde_json::Map::new();
    x.insert("size".into(), size.into());
    for c in CONFIGS {
        let rs: Vec<&Run> = runs
            .iter()
            .filter(|r| r.size == size && r.config == c)
            .collect();
        x.insert(c.into(), summarize(&rs));
    }
    let r = |a: &str, b: &str, k: &str| m(&x[a], k) / m(&x[b], k);
    // The same ratio within each repeat (its configurations run one after the other): the
    // machine's drift between repeats, which moves the nginx chain by ±10% here, cancels.
    let paired = |a: &str, b: &str| {
        let cpu = |c: &str, rep: usize| {
            runs.iter()
                .find(|x| x.size == size && x.config == c && x.repeat == rep && x.requests > 0)
                .map(|x| x.cpu_s.iter().sum::<f64>() / x.requests as f64)
        };
        let reps = runs.iter().map(|x| x.repeat + 1).max().unwrap_or(0);
        crate::bench::stats(
            (0..reps)
                .filter_map(|rep| Some(cpu(a, rep)? / cpu(b, rep)?))
                .collect(),
        )
    };
    let ratios = json!({
        "cpu_disc_vs_nginx_per_repeat": paired("disc", "nginx"),
        "cpu_disc_vs_nginx": r("disc", "nginx", "cpu_us_per_req"),
        "cpu_disc_vs_ours": r("disc", "ours", "cpu_us_per_req"),
        "rps_disc_vs_nginx": r("disc", "nginx", "rps"),
        "rps_ours_vs_nginx": r("ours", "nginx", "rps"),
        "p99_disc_vs_nginx": r("disc", "nginx", "p99_ms"),
        "p99_disc_vs_ours": r("disc", "ours", "p99_ms"),
    });
    x.insert("ratios".into(), ratios);
    Value::Object(x)
}

fn summarize(runs: &[&Run]) -> Value {
    let per_req = |f: &dyn Fn(&Run) -> f64| -> Vec<f64> {
        runs.iter()
            .filter(|r| r.requests > 0)
            .map(|r| f(r) / r.requests as f64)
            .collect()
    };
    json!({
        "rps": stats(runs.iter().map(|r| r.rps).collect()),
        "p50_ms": stats(runs.iter().map(|r| r.p50_ms).collect()),
        "p99_ms": stats(runs.iter().map(|r| r.p99_ms).collect()),
        "cpu_us_per_req": stats(per_req(&|r| r.cpu_s.iter().sum::<f64>() * 1e6)),
        "fe_cpu_us_per_req": stats(per_req(&|r| r.cpu_s[0] * 1e6)),
        "is_cpu_us_per_req": stats(per_req(&|r| r.cpu_s[1] * 1e6)),
        "be_cpu_us_per_req": stats(per_req(&|r| r.cpu_s[2] * 1e6)),
        "fe_bytes_per_req": stats(per_req(&|r| r.fe_bytes as f64)),
        "is_bytes_per_req": stats(per_req(&|r| r.is_bytes as f64)),
        "errors": runs.iter().map(|r| r.errors).sum::<u64>(),
        "stalled": runs.iter().map(|r| r.stalled).sum::<u64>(),
        "bytes_ok": runs.iter().all(|r| r.bytes_ok),
    })
}

fn m(v: &Value, k: &str) -> f64 {
    v[k]["median"].as_f64().unwrap_or(f64::NAN)
}

/// ns per packet over every DISC run.
fn hook_ns(runs: &[Run], egress: bool) -> Value {
    let (mut t, mut n) = (0u64, 0u64);
    for r in runs {
        if let Some((a, b)) = if egress {
            r.hook_egress
        } else {
            r.hook_ingress
        } {
            t += a;
            n += b;
        }
    }
    json!({"run_time_ns": t, "run_cnt": n, "ns_per_packet": if n > 0 { t as f64 / n as f64 } else { f64::NAN }})
}

/// Runs the bench; returns the JSON result (every run in it).
pub fn run(o: &DiscOpts, progress: &dyn Fn(&str)) -> anyhow::Result<Value> {
    for tool in ["wrk", "curl", "nginx", "taskset", "timeout"] {
        crate::stack::which(tool).with_context(|| format!("{tool} not found"))?;
    }
    let bpftool = crate::stack::which("bpftool").is_some();
    if !bpftool {
        progress("bpftool not found (Debian package bpftool): no hook cost");
    }
    std::fs::create_dir_all(&o.dir)?;
    let _dir = RemoveDir(o.dir.clone());
    let net = Net::build(o.dp_send == "repair").context("building the bench's namespaces")?;
    let _stats = BpfStats::enable();
    let cgs = [
        crate::cpu::Cgroups::new("dn", &crate::stack::TIERS)?,
        crate::cpu::Cgroups::new("do", &crate::stack::TIERS)?,
        crate::cpu::Cgroups::new("dd", &crate::stack::TIERS)?,
    ];
    let mut nginx_configs = Vec::new();
    let mut seed = (std::process::id() as u64) << 20 | 0x9e37;
    let mut runs: Vec<Run> = Vec::new();
    let mut orders = Vec::new();
    for rep in 0..o.repeats {
        let order = shuffled(&mut seed);
        orders.push(order.to_vec());
        for config in order {
            if crate::bench::INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed) {
                bail!("interrupted");
            }
            let ci = CONFIGS.iter().position(|c| *c == config).unwrap_or(0);
            let peers = start(config, &net, o, &cgs[ci])
                .with_context(|| format!("starting the {}", config_label(config)))?;
            if let Peers::Nginx(st) = &peers {
                if nginx_configs.is_empty() {
                    nginx_configs = st.configs.clone();
                }
            }
            for &size in &o.sizes {
                let r = one_run(config, size, rep, &net, &peers, &cgs[ci], o)?;
                let req = r.requests.max(1) as f64;
                progress(&format!(
                    "  {:>8} B  {:<5} rep {}: {:>7.0} req/s  CPU {:>6.1} us/req (FE {:.1} IS {:.1} BE {:.1})  FE B/req {:>8.0}  p99 {:>6.2} ms  steal {:.0}%{}{}",
                    size,
                    config,
                    rep + 1,
                    r.rps,
                    r.cpu_s.iter().sum::<f64>() * 1e6 / req,
                    r.cpu_s[0] * 1e6 / req,
                    r.cpu_s[1] * 1e6 / req,
                    r.cpu_s[2] * 1e6 / req,
                    r.fe_bytes as f64 / req,
                    r.p99_ms,
                    r.steal_pct.unwrap_or(f64::NAN),
                    r.bytes_error.as_ref().map(|e| format!("  WRONG BYTES: {e}")).unwrap_or_default(),
                    if r.stalled > 0 { format!("  stalled {}", r.stalled) } else { String::new() },
                ));
                runs.push(r);
            }
            drop(peers);
        }
    }
    let sizes_out: Vec<Value> = o.sizes.iter().map(|&size| size_row(&runs, size)).collect();
    let ours: Vec<Value> = [false, true]
        .iter()
        .map(|&d| {
            json!({
                "config": if d { "disc" } else { "ours" },
                "tiers": our_tiers(&net, o, d).into_iter().map(|(t, a)| json!({"tier": t, "command": format!("iolab {}", a.join(" "))})).collect::<Vec<_>>(),
            })
        })
        .collect();
    let v = json!({
        "bench": "tiers-disc",
        "machine": machine(),
        "method": {
            "repeats": o.repeats, "seconds": o.seconds, "connections": o.connections,
            // what the table and the HTML name as the client
            "client": match o.rate {
                None => format!("wrk -t1 -c{} --latency --timeout 5s", o.connections),
                Some(r) => format!(
                    "iolab load --rate {r} --keepalive -c {} --threads 1 --timeout 5s (open loop)",
                    o.connections
                ),
            },
            "rate": o.rate,
            "tier_cpus": o.tier_cpus, "client_cpus": o.client_cpus,
            "orders": orders,
            "namespaces": net.ns, "sysctls": net.sysctls,
            "hook_iface": net.fe_if,
            "bpf_stats": if bpftool { "kernel.bpf_stats_enabled=1 during the run; bpftool prog show --json" } else { "bpftool missing" },
        },
        "nginx_configs": nginx_configs.iter().map(|(t, c)| json!({"tier": t, "config": c})).collect::<Vec<_>>(),
        "our_tiers": ours,
        "hooks": {"egress": hook_ns(&runs, true), "ingress": hook_ns(&runs, false)},
        "sizes": sizes_out,
        "runs": runs,
    });
    Ok(v)
}

struct RemoveDir(PathBuf);
impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The nginx directives that matter for a fair fight, one line per tier.
fn nginx_summary(config: &str) -> String {
    let keys = [
        "worker_processes",
        "sendfile",
        "tcp_nopush",
        "keepalive ",
        "proxy_http_version",
        "proxy_buffers",
        "proxy_buffer_size",
        "proxy_max_temp_file_size",
        "access_log",
    ];
    config
        .lines()
        .map(str::trim)
        .filter(|l| keys.iter().any(|k| l.starts_with(k)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Seed 004's goals for DISC (issue 15), each with what this run measured and whether it
/// is met: total CPU −50% or better from 64 KiB (the ratio of medians, and within each
/// repeat), ≥ 1.5× the nginx chain's requests/s at 64 KiB, no p99 regression at any size.
/// (The hook cost per packet, the fourth, is a measurement: printed below.)
pub fn goals(v: &Value) -> String {
    let pick = |keep: &dyn Fn(u64) -> bool, at: &dyn Fn(&Value) -> Option<f64>| {
        crate::bench::goal_values(v, keep, &|x| at(&x["ratios"]))
    };
    let line = |name: &str, vals: Vec<(u64, f64)>, ok: &dyn Fn(f64) -> bool| {
        crate::bench::goal_line(name, vals, "x", ok)
    };
    let from64 = |n: u64| n >= 65536;
    let mut s = String::from("goals (seed 004):\n");
    s += &line(
        "total CPU DISC/nginx <= 0.50x from 64 KiB",
        pick(&from64, &|r| r["cpu_disc_vs_nginx"].as_f64()),
        &|x| x <= 0.5,
    );
    s += &line(
        "  the same, median within each repeat",
        pick(&from64, &|r| {
            r["cpu_disc_vs_nginx_per_repeat"]["median"].as_f64()
        }),
        &|x| x <= 0.5,
    );
    if let Some(rate) = v["method"]["rate"].as_f64() {
        s += &format!(
            "  req/s DISC/nginx >= 1.5x at 64 KiB: not measured at a fixed rate ({rate} req/s offered to every configuration; run without --rate)\n"
        );
    } else {
        s += &line(
            "req/s DISC/nginx >= 1.5x at 64 KiB",
            pick(&|n| n == 65536, &|r| r["rps_disc_vs_nginx"].as_f64()),
            &|x| x >= 1.5,
        );
    }
    s += &line(
        "p99 DISC/nginx <= 1.00x at every size",
        pick(&|_| true, &|r| r["p99_disc_vs_nginx"].as_f64()),
        &|x| x <= 1.0,
    );
    s
}

/// The plain-text table (what the closing note pastes), with every peer's configuration.
pub fn table(v: &Value) -> String {
    let mut s = String::new();
    s.push_str("size B   | config | req/s (min-max)        | p50 ms | p99 ms | CPU us/req total (FE/IS/BE)  | FE B/req  | IS B/req  | bytes | err | stalled\n");
    for x in v["sizes"].as_array().into_iter().flatten() {
        for c in CONFIGS {
            let y = &x[c];
            s.push_str(&format!(
                "{:>8} | {:<6} | {:>7.0} ({:>6.0}-{:>6.0}) | {:>6.2} | {:>6.2} | {:>7.1} ({:>5.1}/{:>5.1}/{:>5.1}) | {:>9.0} | {:>9.0} | {:<5} | {:>3} | {:>3}\n",
                x["size"].as_u64().unwrap_or(0),
                c,
                m(y, "rps"),
                y["rps"]["min"].as_f64().unwrap_or(f64::NAN),
                y["rps"]["max"].as_f64().unwrap_or(f64::NAN),
                m(y, "p50_ms"),
                m(y, "p99_ms"),
                m(y, "cpu_us_per_req"),
                m(y, "fe_cpu_us_per_req"),
                m(y, "is_cpu_us_per_req"),
                m(y, "be_cpu_us_per_req"),
                m(y, "fe_bytes_per_req"),
                m(y, "is_bytes_per_req"),
                if y["bytes_ok"].as_bool() == Some(true) { "ok" } else { "WRONG" },
                y["errors"].as_u64().unwrap_or(0),
                y["stalled"].as_u64().unwrap_or(0),
            ));
        }
        let r = &x["ratios"];
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        let p = &r["cpu_disc_vs_nginx_per_repeat"];
        let pf = |k: &str| p[k].as_f64().unwrap_or(f64::NAN);
        s.push_str(&format!(
            "{:>8} | DISC vs nginx: CPU/req {:.2}x (within each repeat: median {:.2}x, {:.2}-{:.2}x), req/s {:.2}x, p99 {:.2}x; DISC vs ours: CPU/req {:.2}x, p99 {:.2}x\n",
            "",
            f("cpu_disc_vs_nginx"),
            pf("median"),
            pf("min"),
            pf("max"),
            f("rps_disc_vs_nginx"),
            f("p99_disc_vs_nginx"),
            f("cpu_disc_vs_ours"),
            f("p99_disc_vs_ours"),
        ));
    }
    s.push_str(&goals(v));
    let h = &v["hooks"];
    s.push_str(&format!(
        "eBPF hook cost (kernel bpf_stats, all DISC runs): disc_egress {:.0} ns/packet ({} packets), disc_ingress {:.0} ns/packet ({} packets)\n",
        h["egress"]["ns_per_packet"].as_f64().unwrap_or(f64::NAN),
        h["egress"]["run_cnt"],
        h["ingress"]["ns_per_packet"].as_f64().unwrap_or(f64::NAN),
        h["ingress"]["run_cnt"],
    ));
    let steal: Vec<(&str, Vec<f64>)> = CONFIGS
        .iter()
        .map(|c| {
            let runs = v["runs"].as_array().into_iter().flatten();
            let of_c = runs.filter(|r| r["config"] == *c);
            (*c, of_c.filter_map(|r| r["steal_pct"].as_f64()).collect())
        })
        .collect();
    s.push_str(&crate::bench::steal_line(&steal));
    let me = &v["method"];
    s.push_str(&format!(
        "method: medians of {} repeats x {} s, {} on CPU {}, tiers on CPU {}; order per repeat {}\n",
        me["repeats"], me["seconds"], me["client"].as_str().unwrap_or(""), me["client_cpus"].as_str().unwrap_or(""),
        me["tier_cpus"].as_str().unwrap_or(""), me["orders"]
    ));
    s.push_str(&format!(
        "TCP in the bench's namespaces (all configurations): {}\n",
        me["sysctls"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    for c in v["nginx_configs"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "nginx {}: {}\n",
            c["tier"].as_str().unwrap_or(""),
            nginx_summary(c["config"].as_str().unwrap_or(""))
        ));
    }
    for c in v["our_tiers"].as_array().into_iter().flatten() {
        for t in c["tiers"].as_array().into_iter().flatten() {
            s.push_str(&format!(
                "{} {}: {}\n",
                c["config"].as_str().unwrap_or(""),
                t["tier"].as_str().unwrap_or(""),
                t["command"].as_str().unwrap_or("")
            ));
        }
    }
    s
}

const COLOURS: [&str; 3] = ["#8a8a8a", "#d69e2e", "#2b6cb0"];

/// A grouped bar chart: one group per size, one bar per configuration.
fn chart(v: &Value, key: &str, title: &str) -> String {
    let sizes: Vec<&Value> = v["sizes"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let max = sizes
        .iter()
        .flat_map(|x| CONFIGS.map(|c| m(&x[c], key)))
        .filter(|x| x.is_finite())
        .fold(1e-9, f64::max);
    let (w, h, pad) = (
        (140.0 * sizes.len().max(1) as f64 + 80.0).max(620.0),
        290.0,
        52.0,
    );
    // log scale: 1 KiB and 1 MiB differ by orders of magnitude
    let scale = |v: f64| (h - 2.0 * pad) * (1.0 + v).ln() / (1.0 + max).ln();
    let mut svg = format!("<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' role='img' aria-label='{}'>", esc(title));
    svg.push_str(&format!(
        "<line x1='{pad}' y1='{}' x2='{}' y2='{}' stroke='#333'/>",
        h - pad,
        w - 10.0,
        h - pad
    ));
    for (i, x) in sizes.iter().enumerate() {
        let x0 = pad + 20.0 + i as f64 * 140.0;
        for (j, c) in CONFIGS.iter().enumerate() {
            let val = m(&x[*c], key);
            let bh = if val.is_finite() { scale(val) } else { 0.0 };
            svg.push_str(&format!(
                "<rect x='{:.1}' y='{:.1}' width='36' height='{bh:.1}' fill='{}'><title>{}: {val:.1}</title></rect>",
                x0 + j as f64 * 38.0,
                h - pad - bh,
                COLOURS[j],
                config_label(c)
            ));
            svg.push_str(&format!(
                "<text x='{:.1}' y='{:.1}' font-size='9' text-anchor='middle'>{val:.0}</text>",
                x0 + j as f64 * 38.0 + 18.0,
                h - pad - bh - 3.0
            ));
        }
        svg.push_str(&format!(
            "<text x='{}' y='{}' font-size='11' text-anchor='middle'>{} B</text>",
            x0 + 55.0,
            h - pad + 14.0,
            x["size"]
        ));
    }
    svg.push_str(&format!(
        "<text x='{pad}' y='16' font-size='12'>{} (log scale, max {max:.1})</text><text x='{pad}' y='32' font-size='11'><tspan fill='{}'>■ nginx chain</tspan> <tspan fill='{}'>■ our tiers, DISC off</tspan> <tspan fill='{}'>■ our tiers, DISC direct</tspan></text></svg>",
        esc(title), COLOURS[0], COLOURS[1], COLOURS[2]
    ));
    svg
}

/// The report section: a self-contained HTML page with the table and two SVG figures.
pub fn html(v: &Value) -> String {
    let mut rows = String::new();
    for x in v["sizes"].as_array().into_iter().flatten() {
        for (j, c) in CONFIGS.iter().enumerate() {
            let y = &x[*c];
            rows.push_str(&format!(
                "<tr><td>{}</td><td style='color:{}'>{}</td><td>{:.0} <small>({:.0}–{:.0})</small></td><td>{:.2}</td><td>{:.2}</td><td>{:.1}</td><td>{:.1} / {:.1} / {:.1}</td><td>{:.0}</td><td>{:.0}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                x["size"], COLOURS[j], config_label(c), m(y, "rps"), y["rps"]["min"].as_f64().unwrap_or(f64::NAN), y["rps"]["max"].as_f64().unwrap_or(f64::NAN),
                m(y, "p50_ms"), m(y, "p99_ms"), m(y, "cpu_us_per_req"), m(y, "fe_cpu_us_per_req"), m(y, "is_cpu_us_per_req"), m(y, "be_cpu_us_per_req"),
                m(y, "fe_bytes_per_req"), m(y, "is_bytes_per_req"),
                if y["bytes_ok"].as_bool() == Some(true) { "ok" } else { "WRONG" }, y["errors"], y["stalled"]
            ));
        }
    }
    let configs = nginx_configs_html(v, "nginx ");
    let text = table(v);
    format!(
        "<!doctype html><html><head><meta charset='utf-8'><title>iolab tiers: DISC against the nginx chain</title>\
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}pre{{background:#f6f6f6;padding:6px;font-size:11px;overflow-x:auto}}</style></head><body>\
<section id='tiers-disc'><h2>DISC: the back end answers on the front end's connection</h2>\
<p>client → FE → IS → BE in network namespaces: the unmodified nginx chain, our tiers (crates/tiers/disc) without DISC, our tiers with DISC in direct mode. Medians of {} repeats of {} s (min–max), client <code>{}</code> in the client's namespace; CPU per tier from a cgroup per tier (the BE's DP counts as BE). Goals (seed 004): total CPU −50% from 64 KiB with an IS, no p99 regression, ≥1.5× the nginx chain's req/s at 64 KiB.</p>\
<table><tr><th>size B</th><th>configuration</th><th>req/s</th><th>p50 ms</th><th>p99 ms</th><th>CPU µs/req</th><th>FE / IS / BE µs/req</th><th>FE bytes/req</th><th>IS bytes/req</th><th>bytes</th><th>errors</th><th>stalled</th></tr>\n{rows}</table>\
<figure>{}</figure><figure>{}</figure><pre>{}</pre><p>Machine: {}</p><details><summary>nginx configurations</summary>{configs}</details></section></body></html>\n",
        v["method"]["repeats"], v["method"]["seconds"],
        esc(v["method"]["client"].as_str().unwrap_or("")),
        chart(v, "rps", "requests/s by payload size"),
        chart(v, "cpu_us_per_req", "total CPU µs per request by payload size"),
        esc(&text),
        esc(&v["machine"].to_string())
    )
}

/// Writes the JSON and HTML, prints the table, checks the HTML in Chromium unless told not.
/// An error when a configuration served wrong bytes (after printing everything).
pub fn report(v: &Value, json_path: &Path, html_path: &Path, chromium: bool) -> anyhow::Result<()> {
    println!("\n{}", table(v));
    std::fs::write(json_path, serde_json::to_string_pretty(v)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    std::fs::write(html_path, html(v))
        .with_context(|| format!("writing {}", html_path.display()))?;
    println!("wrote {} and {}", json_path.display(), html_path.display());
    if chromium {
        let png = check_in_chromium(html_path)?;
        println!("report rendered in headless Chromium: {}", png.display());
    }
    let wrong: Vec<String> = v["sizes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|x| {
            CONFIGS
                .iter()
                .filter(|c| x[**c]["bytes_ok"].as_bool() != Some(true))
                .map(|c| format!("{} at {} B", config_label(c), x["size"]))
                .collect::<Vec<_>>()
        })
        .collect();
    if !wrong.is_empty() {
        bail!("wrong bytes served: {}", wrong.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each goal is judged on the sizes it names, a miss at any of them is a miss, and a
    /// goal with none of its sizes measured says so.
    #[test]
    fn goals_are_judged_on_their_own_sizes() {
        let v = serde_json::json!({"sizes": [
            {"size": 1024, "ratios": {"cpu_disc_vs_nginx": 0.74, "rps_disc_vs_nginx": 1.3,
                "p99_disc_vs_nginx": 0.8, "cpu_disc_vs_nginx_per_repeat": {"median": 0.7}}},
            {"size": 65536, "ratios": {"cpu_disc_vs_nginx": 0.52, "rps_disc_vs_nginx": 1.9,
                "p99_disc_vs_nginx": 0.03, "cpu_disc_vs_nginx_per_repeat": {"median": 0.49}}},
            {"size": 1048576, "ratios": {"cpu_disc_vs_nginx": 0.14, "rps_disc_vs_nginx": 8.0,
                "p99_disc_vs_nginx": 1.2, "cpu_disc_vs_nginx_per_repeat": {"median": 0.14}}},
        ]});
        let g = goals(&v);
        let line = |start: &str| crate::bench::tests::goal_named(&g, start);
        assert!(
            line("total CPU").contains("65536 B 0.52x, 1048576 B 0.14x — NOT met"),
            "{g}"
        );
        assert!(line("the same, median").ends_with("— met"), "{g}");
        assert!(line("req/s").contains("65536 B 1.90x — met"), "{g}");
        assert!(line("p99").ends_with("— NOT met"), "{g}");
        let small = serde_json::json!({"sizes": [{"size": 1024, "ratios": {}}]});
        assert!(goals(&small).contains("req/s DISC/nginx >= 1.5x at 64 KiB: no size measured"));
    }

    /// At a fixed rate every configuration is offered the same requests/s: the req/s goal
    /// is not judged from it (it would read 1.00x, a miss that measures nothing).
    #[test]
    fn a_fixed_rate_leaves_the_req_s_goal_unjudged() {
        let v = serde_json::json!({"method": {"rate": 600.0}, "sizes": [
            {"size": 65536, "ratios": {"cpu_disc_vs_nginx": 0.9, "rps_disc_vs_nginx": 1.0,
                "p99_disc_vs_nginx": 0.05, "cpu_disc_vs_nginx_per_repeat": {"median": 0.9}}},
        ]});
        let g = goals(&v);
        let line = |start: &str| crate::bench::tests::goal_named(&g, start);
        assert!(
            line("req/s").contains("not measured at a fixed rate (600 req/s"),
            "{g}"
        );
        assert!(
            line("total CPU").ends_with("65536 B 0.90x — NOT met"),
            "{g}"
        );
        assert!(line("p99").ends_with("— met"), "{g}");
    }

    /// `iolab load --json`'s report: 2xx answers counted as requests, timeouts and requests
    /// still due at the end as stalled, the other errors as errors.
    #[test]
    fn the_open_loop_report_is_read_as_wrk_s() {
        let text = r#"{"requests": 1805, "ok": 1790, "errors": {"timeout": 3, "unfinished": 7,
            "reset": 5}, "error_count": 15, "unfinished": 7, "p50_ms": 0.41, "p99_ms": 2.5,
            "rps": 596.7}"#;
        let (req, p50, p99, errors, stalled) = parse_load(text).unwrap();
        assert_eq!((req, errors, stalled), (1790, 5, 10));
        assert_eq!((p50, p99), (0.41, 2.5));
        assert!(parse_load("not json").is_err());
        assert!(
            parse_load(r#"{"ok": 1}"#).is_err(),
            "a report without its counts"
        );
    }

    fn run(config: &str, size: usize, rps: f64, ok: bool) -> Run {
        Run {
            config: config.into(),
            size,
            repeat: 0,
            bytes_ok: ok,
            bytes_error: (!ok).then(|| "x".into()),
            requests: rps as u64,
            rps,
            p50_ms: 1.0,
            p99_ms: 2.0,
            errors: 0,
            stalled: u64::from(config == "disc"),
            cpu_s: [0.1, 0.2, 0.3],
            fe_bytes: 1000 * rps as u64,
            is_bytes: 2000 * rps as u64,
            hook_egress: (config == "disc").then_some((1000, 10)),
            hook_ingress: (config == "disc").then_some((600, 20)),
            steal_pct: Some(if config == "nginx" { 4.0 } else { 2.0 }),
        }
    }

    /// A result as `run` builds it, from runs made up here.
    fn result(runs: Vec<Run>) -> Value {
        let sizes: Vec<Value> = [1024usize, 65536]
            .iter()
            .map(|&size| size_row(&runs, size))
            .collect();
        json!({
            "method": {"repeats": 1, "seconds": 1, "connections": 4, "orders": [], "sysctls": ["FE: x=0"]},
            "hooks": {"egress": hook_ns(&runs, true), "ingress": hook_ns(&runs, false)},
            "nginx_configs": [{"tier": "fe", "config": "worker_processes 1;\nsendfile on;\nevents {}"}],
            "our_tiers": [{"config": "disc", "tiers": [{"tier": "fe", "command": "iolab disc proxy --disc direct"}]}],
            "sizes": sizes,
            "runs": runs,
            "machine": {},
        })
    }

    #[test]
    fn the_table_has_a_row_per_size_and_configuration_and_the_peers_settings() {
        let mut runs = Vec::new();
        for size in [1024, 65536] {
            runs.push(run("nginx", size, 100.0, true));
            runs.push(run("ours", size, 150.0, true));
            runs.push(run("disc", size, 300.0, size == 1024));
        }
        let v = result(runs);
        let t = table(&v);
        for size in ["1024", "65536"] {
            for c in CONFIGS {
                let rows = t
                    .lines()
                    .filter(|l| {
                        let f: Vec<&str> = l.split('|').map(str::trim).collect();
                        f.len() == 11 && f[0] == size && f[1] == c
                    })
                    .count();
                assert_eq!(rows, 1, "{size} {c} in\n{t}");
            }
        }
        assert!(t.contains("req/s 3.00x"), "{t}");
        assert!(
            t.contains("CPU/req 0.33x (within each repeat: median 0.33x, 0.33-0.33x)"),
            "{t}"
        );
        assert!(t.contains("WRONG"), "the wrong bytes at 64 KiB show:\n{t}");
        // 1000 ns over 10 packets twice (two DISC runs): 100 ns; ingress 600/20: 30 ns
        assert!(t.contains("disc_egress 100 ns/packet (20 packets)"), "{t}");
        assert!(
            t.contains("host steal on the tiers' CPU during the runs (/proc/stat): median 2.0% (2.0-4.0%); nginx 4.0%, ours 2.0%, disc 2.0%"),
            "{t}"
        );
        assert!(t.contains("disc_ingress 30 ns/packet (40 packets)"), "{t}");
        assert!(
            t.contains("nginx fe: worker_processes 1; sendfile on;"),
            "{t}"
        );
        assert!(t.contains("disc fe: iolab disc proxy --disc direct"), "{t}");
        let h = html(&v);
        assert_eq!(h.matches("<svg").count(), 2);
        assert_eq!(h.matches("<tr><td>").count(), 6);
        let dir =
            std::env::temp_dir().join(format!("iolab-tiers-discbench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _rm = RemoveDir(dir.clone());
        let e = report(&v, &dir.join("r.json"), &dir.join("r.html"), false).unwrap_err();
        assert!(format!("{e}").contains("DISC direct at 65536 B"), "{e}");
    }

    /// The ratio within each repeat pairs runs of the same repeat (the machine drifts
    /// between repeats); the ratio of the medians does not.
    #[test]
    fn the_per_repeat_cpu_ratio_pairs_runs_of_one_repeat() {
        let mut runs = Vec::new();
        // CPU per request (nginx, disc) by repeat: (1.0, 0.6), (3.0, 1.2), (2.0, 0.7).
        for (rep, nginx, disc) in [(0, 1.0, 0.6), (1, 3.0, 1.2), (2, 2.0, 0.7)] {
            for (c, cpu) in [("nginx", nginx), ("disc", disc), ("ours", 1.0)] {
                let mut r = run(c, 65536, 1.0, true);
                r.repeat = rep;
                r.requests = 1;
                r.cpu_s = [cpu, 0.0, 0.0];
                runs.push(r);
            }
        }
        let x = size_row(&runs, 65536);
        let p = &x["ratios"]["cpu_disc_vs_nginx_per_repeat"];
        let close = |v: &Value, want: f64| (v.as_f64().unwrap() - want).abs() < 1e-9;
        assert!(close(&p["median"], 0.4), "{p}");
        assert!(close(&p["min"], 0.35) && close(&p["max"], 0.6), "{p}");
        assert!(
            close(&x["ratios"]["cpu_disc_vs_nginx"], 0.35),
            "medians: 0.7 / 2.0"
        );
    }

    #[test]
    fn hook_stats_count_only_the_fe_process_programs() {
        let j = r#"[{"id":7,"name":"disc_egress","run_time_ns":500,"run_cnt":5},
                    {"id":8,"name":"disc_ingress","run_time_ns":90,"run_cnt":3},
                    {"id":9,"name":"disc_egress","run_time_ns":99999,"run_cnt":1},
                    {"id":10,"name":"other","run_time_ns":1,"run_cnt":1}]"#;
        assert_eq!(parse_hook_stats(j, &[7, 8]), Some([(500, 5), (90, 3)]));
        assert_eq!(parse_hook_stats(j, &[10]), None);
        assert_eq!(parse_hook_stats("not json", &[7]), None);
    }

    #[test]
    fn wrk_timeouts_are_counted_apart() {
        let out = "  Latency Distribution\n     50%  1.00ms\n     99%  9.00ms\n  12 requests in 1.00s, 1 MB read\n  Socket errors: connect 0, read 1, write 0, timeout 4\n";
        assert_eq!(wrk_timeouts(out), 4);
        assert_eq!(wrk_timeouts("  12 requests in 1.00s\n"), 0);
    }

    #[test]
    fn every_order_holds_the_three_configurations() {
        let mut seed = 12345;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..50 {
            let mut o = shuffled(&mut seed).to_vec();
            seen.insert(o.clone());
            o.sort_unstable();
            assert_eq!(o, ["disc", "nginx", "ours"]);
        }
        assert!(seen.len() > 1, "the order changes");
    }
}
