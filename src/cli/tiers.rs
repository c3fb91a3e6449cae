//! `iolab tiers up|down|status|bench|agent`.

use anyhow::Context;
use iolab_odb::spec::AgentSpec;
use iolab_tiers::children::{DpSend, SuperviseSpec};
use iolab_tiers::stack::{AgentProgram, Odb};
use std::path::PathBuf;

use super::choice_enum;

choice_enum! {
    /// `tiers bench --disc --dp-send`: what `iolab disc be --dp-send` is given (see there).
    pub enum BenchDpSend => DpSend {
        Gso,
        Raw,
        Xdp,
        Repair,
    }
}

#[derive(Debug, clap::Args)]
pub struct TiersArgs {
    #[command(subcommand)]
    pub cmd: TiersCmd,
}

#[derive(Debug, clap::Subcommand)]
pub enum TiersCmd {
    /// Build the testbed: client, FE, IS, BE network namespaces joined by veths, nginx in
    /// each tier (configs printed), ODB agent on the BE. Stays up until `down`.
    Up(UpArgs),
    /// Remove the testbed (and anything a killed testbed left behind).
    Down,
    /// Show the testbed: namespaces, addresses, processes, per-tier CPU, interface bytes.
    Status {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Measure vanilla nginx against nginx with ODB, side by side (needs `up`).
    Bench(BenchArgs),
    /// Run the ODB buffer agent in the foreground (what `up` starts on the BE).
    Agent(AgentArgs),
    /// Measure ODB's two page-fetch-on-fault paths in this process: SIGSEGV on a PROT_NONE
    /// page (the default) and userfaultfd (SIGBUS mode, UFFDIO_COPY); says whether
    /// userfaultfd is allowed here.
    Faults {
        /// Pages per round.
        #[arg(long, default_value_t = 4096)]
        pages: usize,
        /// Rounds (the median is reported).
        #[arg(long, default_value_t = 9)]
        rounds: usize,
    },
    #[command(hide = true)]
    Supervise(UpArgs),
    /// One tier on this host for `up --hosts` (started over ssh by the controller).
    #[command(hide = true)]
    Node {
        /// The node's spec (JSON, `iolab_tiers::hosts::node::NodeSpec`).
        #[arg(long)]
        spec: String,
    },
}

#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Rate limit on every link (tbf), e.g. 1gbit, 100mbit.
    #[arg(long)]
    pub rate: Option<String>,
    /// One-way delay on every link (netem), e.g. 1ms. This machine's kernel may lack netem.
    #[arg(long)]
    pub delay: Option<String>,
    /// The testbed's own nginx run without ODB (the bench always runs both).
    #[arg(long)]
    pub vanilla: bool,
    /// Base port of the testbed's nginx (FE; IS +1, BE +2, agent +3).
    #[arg(long, default_value_t = 18080)]
    pub port: u16,
    /// Put client, FE, IS and BE on the hosts of this TOML file (tables [client], [fe],
    /// [is], [be]; see crates/tiers/testbed/README.md), reached over ssh, instead of
    /// network namespaces here.
    #[arg(long)]
    pub hosts: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Short run: 4 sizes, 3 repeats of 2 s per mode.
    #[arg(long)]
    pub quick: bool,
    /// Payload sizes in bytes (comma-separated); default 1 KiB .. 1 MiB.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<usize>>,
    /// Repeats per size and mode (at least 3).
    #[arg(long)]
    pub repeats: Option<usize>,
    /// Seconds per run.
    #[arg(long)]
    pub seconds: Option<f64>,
    /// wrk connections.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Write the result as JSON.
    #[arg(long, default_value = "tiers-bench.json")]
    pub json: PathBuf,
    /// Write the report section (HTML, checked in headless Chromium).
    #[arg(long, default_value = "tiers-bench.html")]
    pub html: PathBuf,
    /// Skip the Chromium check of the report.
    #[arg(long)]
    pub no_chromium: bool,
    /// DISC instead of ODB: the nginx chain, our tiers without DISC and our tiers with DISC
    /// (direct mode) side by side, in namespaces of the bench's own with a client-BE link
    /// (sizes 1 KiB..1 MiB; --quick: 3 sizes, 3 repeats of 1 s; JSON and HTML default to
    /// tiers-disc-bench.*). See crates/tiers/testbed/README.md.
    #[arg(long)]
    pub disc: bool,
    /// With --disc: how DP sends the payload: `gso` (a packet socket, one send per up to
    /// 64 KiB, segmented by the kernel), `raw` (a raw IPv4 socket, one send per segment),
    /// `xdp` (an AF_XDP socket in copy mode: segments written into frames shared with the
    /// kernel, one send per 32) or `repair` (a TCP socket of the BE's stack continuing the
    /// FE's connection, TCP_REPAIR: the kernel's segmentation, congestion control and
    /// retransmission).
    #[arg(long, value_enum, default_value = "gso")]
    pub dp_send: BenchDpSend,
    /// With --disc: how the client's ACKs reach DP: `tap` (the FE's hooks clone them to
    /// DP's packet-socket tap) or `forwarder` (the FE forwards them as control lines, woken
    /// by a BPF ring: the way when DP is not on the FE's link).
    #[arg(long, default_value = "tap", value_parser = ["tap", "forwarder"])]
    pub dp_acks: String,
    /// With --disc: an open loop at this many requests/s for every configuration (`iolab
    /// load --rate`, keep-alive, at most --connections connections) instead of wrk's closed
    /// loop: the CPU each configuration spends per request at the same offered load, seed
    /// 004's own condition (§3.6.3: a constant 600 requests/s). A configuration that cannot
    /// keep up is reported with the rate it reached. The req/s goal needs the closed loop.
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// Payloads from PHP through php-fpm on the BE (`/payload.php?n=SIZE`, FastCGI over a
    /// unix socket) instead of static files; ODB on the nginx tiers.
    #[arg(long)]
    pub php: bool,
}

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// Address to serve on (IPv4:port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Arena size in MiB (the agent's whole payload memory).
    #[arg(long, default_value_t = 256)]
    pub memory: u64,
    /// Seconds a buffer is kept for a receiver that has not fetched it all.
    #[arg(long, default_value_t = 30.0)]
    pub lifetime: f64,
    /// Longest drain after SIGTERM, seconds.
    #[arg(long, default_value_t = 5.0)]
    pub drain: f64,
    /// Owner of the arena file (the senders' user, e.g. nginx's workers: nobody).
    #[arg(long)]
    pub arena_user: Option<String>,
    /// A directory whose files senders on this host may send by reference: the agent
    /// answers their fetches with `sendfile`, so nobody copies the bytes into the arena
    /// (repeatable; none: every payload is copied). Only files under these are opened.
    #[arg(long = "files", value_name = "DIR")]
    pub files: Vec<PathBuf>,
}

/// The ODB library and agent command for this build of iolab.
pub fn odb_for_this_build() -> anyhow::Result<Odb> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("exe dir")?.to_path_buf();
    let lib = match std::env::var_os("IOLAB_ODB_LIB") {
        Some(l) => PathBuf::from(l),
        None => {
            let lib = dir.join("libiolab_odb.so");
            // In a cargo target directory the library is (re)built with this binary's
            // profile: `cargo build` of the workspace does not rebuild the cdylib, and a
            // stale one would be preloaded into nginx unnoticed.
            let in_target = dir.ends_with("target/release") || dir.ends_with("target/debug");
            if in_target || !lib.exists() {
                let mut c = std::process::Command::new("cargo");
                c.args(["build", "-q", "-p", "iolab-odb-preload"]);
                if dir.ends_with("release") {
                    c.arg("--release");
                }
                if let Some(ws) = dir.parent().and_then(|t| t.parent()) {
                    c.current_dir(ws);
                }
                let ok = c.status().map(|s| s.success()).unwrap_or(false);
                if !ok && !lib.exists() {
                    anyhow::bail!("{} is missing; build it with `cargo build --release -p iolab-odb-preload` (or set IOLAB_ODB_LIB)", lib.display());
                }
                if !ok {
                    eprintln!(
                        "warning: could not rebuild {}; using it as it is",
                        lib.display()
                    );
                }
            }
            lib
        }
    };
    Ok(Odb {
        lib,
        agent: AgentProgram::Iolab(exe),
        agent_memory_mib: 256,
        threshold: 4096,
        // IOLAB_ODB_FILE_REFS=0: the BE's files copied into the arena (the earlier design),
        // for before/after measurements of one build
        file_refs: std::env::var_os("IOLAB_ODB_FILE_REFS").is_none_or(|v| v != "0"),
    })
}

/// The supervisor's spec: `up`'s flags as given.
impl From<&UpArgs> for SuperviseSpec {
    fn from(a: &UpArgs) -> SuperviseSpec {
        SuperviseSpec {
            rate: a.rate.clone(),
            delay: a.delay.clone(),
            vanilla: a.vanilla,
            port: a.port,
            hosts: a.hosts.clone(),
        }
    }
}

impl TryFrom<&AgentArgs> for AgentSpec {
    type Error = anyhow::Error;
    fn try_from(a: &AgentArgs) -> anyhow::Result<AgentSpec> {
        Ok(AgentSpec {
            listen: a
                .listen
                .parse()
                .with_context(|| format!("--listen {}", a.listen))?,
            memory_mib: a.memory,
            lifetime_s: a.lifetime,
            drain_s: a.drain,
            arena_user: a.arena_user.clone(),
            files: a.files.clone(),
        })
    }
}

fn up_config(a: &UpArgs) -> anyhow::Result<iolab_tiers::state::UpConfig> {
    Ok(iolab_tiers::state::UpConfig {
        rate_bps: a.rate.as_deref().map(iolab_netns::parse_rate).transpose()?,
        delay_us: a
            .delay
            .as_deref()
            .map(iolab_netns::parse_duration)
            .transpose()?
            .map(|d| d.as_micros() as u64),
        odb: !a.vanilla,
        port: a.port,
        hosts: a.hosts.clone(),
    })
}

pub fn run(args: TiersArgs) -> anyhow::Result<()> {
    match args.cmd {
        TiersCmd::Up(a) => {
            let cfg = up_config(&a)?;
            if let Some(h) = &cfg.hosts {
                if cfg.rate_bps.is_some() || cfg.delay_us.is_some() {
                    anyhow::bail!("--rate and --delay shape this machine's veths; with --hosts the links are the hosts' own");
                }
                // its errors now, before a supervisor is started
                iolab_tiers::hosts::TiersInventory::read(h)?;
            }
            if let Some(d) = cfg.delay_us {
                if d > 0 && !iolab_netns::netem_available() {
                    anyhow::bail!("--delay needs the netem qdisc, which this kernel lacks (modprobe sch_netem)");
                }
            }
            if !cfg.odb {
                eprintln!("testbed nginx without ODB (--vanilla)");
            } else {
                odb_for_this_build()?;
            }
            let s = iolab_tiers::testbed::up(&std::env::current_exe()?, &SuperviseSpec::from(&a))?;
            print_state(&s);
            Ok(())
        }
        TiersCmd::Supervise(a) => {
            let cfg = up_config(&a)?;
            let odb = if cfg.odb {
                Some(odb_for_this_build()?)
            } else {
                None
            };
            iolab_tiers::testbed::supervise(cfg, odb)
        }
        TiersCmd::Node { spec } => {
            let spec = iolab_tiers::hosts::node::NodeSpec::from_json(&spec)?;
            iolab_tiers::hosts::node::run(&spec, &std::env::current_exe()?)
        }
        TiersCmd::Down => {
            for l in iolab_tiers::testbed::down()? {
                println!("{l}");
            }
            println!("testbed down; nothing of iolab tiers left");
            Ok(())
        }
        TiersCmd::Status { json } => status(json),
        TiersCmd::Bench(b) => bench(b),
        TiersCmd::Faults { pages, rounds } => {
            let v = iolab_tiers::faults::measure(pages.max(1), rounds.max(1))?;
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(())
        }
        TiersCmd::Agent(a) => {
            let cfg = AgentSpec::try_from(&a)?
                .config()
                .map_err(anyhow::Error::msg)?;
            let s = iolab_odb::agent::run_foreground(cfg)?;
            eprintln!(
                "odb agent: exit after drain; {}",
                serde_json::to_string(&s)?
            );
            Ok(())
        }
    }
}

fn print_state(s: &iolab_tiers::state::State) {
    if let Some(h) = &s.hosts {
        print_hosts_state(s, h);
        return;
    }
    println!(
        "testbed up (supervisor pid {}), ODB {}",
        s.supervisor_pid,
        if s.up.odb { "on" } else { "off" }
    );
    for (t, n) in &s.namespaces {
        println!("  {t:<6} namespace {n}");
    }
    print_chain(s);
    for q in &s.qdiscs {
        println!("  qdisc {q}");
    }
    for (t, c) in &s.configs {
        println!("---- nginx.conf ({t}) ----\n{c}");
    }
    println!(
        "try: ip netns exec {} curl -s http://{}:{}/f65536 | wc -c",
        s.ns("client").unwrap_or("?"),
        s.fe_client,
        s.up.port
    );
}

/// The chain's addresses and ports, and the ODB domain: the same in namespaces and on hosts.
fn print_chain(s: &iolab_tiers::state::State) {
    println!(
        "  client {} → FE {}:{} → IS {}:{} → BE {}:{} (agent :{})",
        s.client.addr,
        s.fe_client,
        s.up.port,
        s.is.addr,
        s.up.port + 1,
        s.be.addr,
        s.up.port + 2,
        s.up.port + 3
    );
    println!("  ODB domain {}", s.domain);
}

/// The testbed of `up --hosts`: the hosts, their run directories, the nodes.
fn print_hosts_state(s: &iolab_tiers::state::State, h: &iolab_tiers::state::HostsState) {
    println!(
        "testbed up on hosts ({}; supervisor pid {}), ODB {}",
        h.inventory_file.display(),
        s.supervisor_pid,
        if s.up.odb { "on" } else { "off" }
    );
    for (role, host) in h.inventory.hosts() {
        let dir = h.dirs.iter().find(|d| d.role == role);
        println!(
            "  {role:<6} {} ({}@{}) run directory {}",
            host.name,
            host.user,
            host.address,
            dir.map_or("?", |d| d.dir.as_str())
        );
    }
    print_chain(s);
    for (t, c) in &s.configs {
        println!("---- nginx.conf ({t}) ----\n{c}");
    }
}

fn status(json: bool) -> anyhow::Result<()> {
    let Some(s) = iolab_tiers::state::load_state() else {
        let stale = iolab_tiers::testbed::cleanup_stale();
        if json {
            println!(
                "{}",
                serde_json::json!({"up": false, "removed_stale": stale})
            );
        } else {
            println!(
                "no testbed up{}",
                if stale.is_empty() {
                    String::new()
                } else {
                    format!(" (removed stale: {})", stale.join(", "))
                }
            );
        }
        return Ok(());
    };
    if let Some(h) = &s.hosts {
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({"up": true, "state": s}))?
            );
        } else {
            print_hosts_state(&s, h);
        }
        return Ok(());
    }
    let mut cpu = serde_json::Map::new();
    if let Some(cg) = &s.cgroup {
        for t in iolab_tiers::stack::TIERS {
            let v1 = std::fs::read_to_string(cg.join(t).join("cpuacct.usage"))
                .ok()
                .and_then(|x| x.trim().parse::<f64>().ok())
                .map(|ns| ns / 1e9);
            let v2 = std::fs::read_to_string(cg.join(t).join("cpu.stat"))
                .ok()
                .and_then(|x| {
                    x.lines().find_map(|l| {
                        l.strip_prefix("usage_usec ")
                            .and_then(|v| v.trim().parse::<f64>().ok())
                    })
                })
                .map(|us| us / 1e6);
            cpu.insert(t.into(), v1.or(v2).into());
        }
    }
    let mut ifaces = Vec::new();
    for (t, n) in &s.namespaces {
        for (name, rx, tx) in iolab_tiers::cpu::iface_bytes(Some(n)).unwrap_or_default() {
            ifaces.push(
                serde_json::json!({"tier": t, "iface": name, "rx_bytes": rx, "tx_bytes": tx}),
            );
        }
    }
    let agent = if s.up.odb {
        iolab_tiers::cpu::agent_stats_in(
            s.ns("be"),
            std::net::SocketAddrV4::new(s.be.addr, s.up.port + 3),
        )
    } else {
        None
    };
    let v = serde_json::json!({"up": true, "state": s, "cpu_seconds": cpu, "ifaces": ifaces, "agent": agent});
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "testbed up (supervisor pid {}), ODB {}",
        s.supervisor_pid,
        if s.up.odb { "on" } else { "off" }
    );
    println!(
        "  client {} → FE {}:{} → IS {} → BE {}",
        s.client.addr, s.fe_client, s.up.port, s.is.addr, s.be.addr
    );
    for t in iolab_tiers::stack::TIERS {
        println!(
            "  {t}: namespace {}  cpu {:.3} s",
            s.ns(t).unwrap_or("?"),
            cpu.get(t).and_then(|c| c.as_f64()).unwrap_or(f64::NAN)
        );
    }
    for i in &ifaces {
        println!(
            "  {:<6} {:<16} rx {:>12} B  tx {:>12} B",
            i["tier"].as_str().unwrap_or(""),
            i["iface"].as_str().unwrap_or(""),
            i["rx_bytes"],
            i["tx_bytes"]
        );
    }
    if let Some(a) = agent {
        println!("  agent: {a}");
    }
    Ok(())
}

fn bench(b: BenchArgs) -> anyhow::Result<()> {
    let Some(state) = iolab_tiers::state::load_state() else {
        anyhow::bail!("no testbed up: run `iolab tiers up` first");
    };
    if b.disc {
        if state.hosts.is_some() {
            anyhow::bail!("--disc runs on this machine's namespaces only: DP sends the payload from the BE straight to the client (raw or packet sockets) over a client–BE link the bench makes, which real hosts' routing need not carry; `iolab tiers down` and `iolab tiers up` without --hosts");
        }
        return disc_bench(&state, b);
    }
    if b.rate.is_some() {
        anyhow::bail!("--rate is for --disc (the ODB bench runs wrk's closed loop)");
    }
    let quick = b.quick;
    let sizes = b.sizes.clone().unwrap_or_else(|| {
        if quick {
            iolab_tiers::bench::QUICK_SIZES.to_vec()
        } else {
            iolab_tiers::bench::FULL_SIZES.to_vec()
        }
    });
    if state.hosts.is_none() {
        for &s in &sizes {
            if !state.root.join(format!("f{s}")).exists() {
                iolab_tiers::testutil::write_payloads(&state.root, &[s])?;
            }
        }
    }
    let repeats = b.repeats.unwrap_or(if quick { 3 } else { 5 }).max(3);
    let opts = iolab_tiers::bench::BenchOpts {
        sizes,
        repeats,
        seconds: b
            .seconds
            .unwrap_or(iolab_tiers::bench::default_seconds(quick)),
        connections: b.connections,
        odb: odb_for_this_build()?,
        tier_cpus: Some("0".into()),
        client_cpus: Some("1".into()),
        php: b.php,
    };
    let on_hosts = state.hosts.is_some();
    println!(
        "tiers bench{}: {} sizes x {} repeats x 2 modes x {} s ({})",
        if opts.php { " --php" } else { "" },
        opts.sizes.len(),
        opts.repeats,
        opts.seconds,
        if on_hosts {
            "on the hosts of `up --hosts`, CPUs as the hosts file pins them"
        } else {
            "tiers on CPU 0, wrk on CPU 1"
        }
    );
    finish_run_on_signals()?;
    let v = if on_hosts {
        iolab_tiers::hosts::bench::run(&state, &opts, &|l| println!("{l}"))?
    } else {
        iolab_tiers::bench::run(&state, &opts, &|l| println!("{l}"))?
    };
    println!("\n{}", iolab_tiers::bench::table(&v));
    let page = iolab_tiers::bench::html(&v);
    write_report(&v, &page, &b.json, &b.html, !b.no_chromium)
}

fn disc_bench(state: &iolab_tiers::state::State, b: BenchArgs) -> anyhow::Result<()> {
    let sizes = b.sizes.clone().unwrap_or_else(|| {
        if b.quick {
            iolab_tiers::disc_bench::QUICK_SIZES.to_vec()
        } else {
            iolab_tiers::disc_bench::FULL_SIZES.to_vec()
        }
    });
    for &s in &sizes {
        if !state.root.join(format!("f{s}")).exists() {
            iolab_tiers::testutil::write_payloads(&state.root, &[s])?;
        }
    }
    let repeats = b.repeats.unwrap_or(3).max(1);
    if repeats < 3 {
        eprintln!("note: {repeats} repeat(s): no spread (use at least 3 for a result)");
    }
    let seconds = b
        .seconds
        .unwrap_or(if b.quick { 1.0 } else { 5.0 })
        .round()
        .max(1.0) as u64;
    let opts = iolab_tiers::disc_bench::DiscOpts {
        sizes,
        repeats,
        seconds,
        connections: b.connections,
        root: state.root.clone(),
        dir: state.dir.join(format!("disc-bench-{}", std::process::id())),
        exe: std::env::current_exe()?,
        tier_cpus: "0".into(),
        client_cpus: "1".into(),
        dp_send: b.dp_send.into(),
        dp_acks_forwarded: b.dp_acks == "forwarder",
        rate: b.rate,
    };
    println!(
        "tiers bench --disc: {} sizes x {} repeats x 3 configurations x {} s (tiers on CPU 0, {} on CPU 1)",
        opts.sizes.len(),
        opts.repeats,
        opts.seconds,
        match opts.rate {
            Some(r) => format!("iolab load at {r} req/s"),
            None => "wrk".into(),
        }
    );
    finish_run_on_signals()?;
    // the namespaces' guard removes them on our own signal handling: keep iolab-netns off
    // the signals (the bench stops after the run in progress)
    iolab_netns::external_signal_handling();
    let v = iolab_tiers::disc_bench::run(&opts, &|l| println!("{l}"))?;
    let default = |p: &std::path::Path, ext: &str| {
        if p == std::path::Path::new(&format!("tiers-bench.{ext}")) {
            PathBuf::from(format!("tiers-disc-bench.{ext}"))
        } else {
            p.to_path_buf()
        }
    };
    let (json, html) = (default(&b.json, "json"), default(&b.html, "html"));
    println!("\n{}", iolab_tiers::disc_bench::table(&v));
    let page = iolab_tiers::disc_bench::html(&v);
    write_report(&v, &page, &json, &html, !b.no_chromium)?;
    // after printing everything
    iolab_tiers::disc_bench::served_right_bytes(&v)
}

/// Writes a bench's JSON and page, says so, and checks the page in Chromium if asked.
fn write_report<T: serde::Serialize>(
    v: &T,
    page: &str,
    json: &std::path::Path,
    html: &std::path::Path,
    chromium: bool,
) -> anyhow::Result<()> {
    iolab_tiers::report::write_files(v, page, json, html)?;
    println!("wrote {} and {}", json.display(), html.display());
    if chromium {
        let png = iolab_tiers::report::check_in_chromium(html)?;
        println!("report rendered in headless Chromium: {}", png.display());
    }
    Ok(())
}

/// Ctrl-C or SIGTERM during a bench: finish the run in progress, then stop the stacks and
/// remove what the bench made (wrk, in the same process group, stops at once).
fn finish_run_on_signals() -> anyhow::Result<()> {
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe {
            signal_hook::low_level::register(sig, || {
                iolab_tiers::bench::INTERRUPTED.store(true, std::sync::atomic::Ordering::Relaxed)
            })?;
        }
    }
    Ok(())
}

/// `--rate`: requests per second, positive and finite.
fn parse_rate(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!(
            "{v:?}: a number of requests per second above 0 (e.g. 600)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_is_a_positive_finite_number_of_requests_per_second() {
        assert_eq!(parse_rate("600"), Ok(600.0));
        assert_eq!(parse_rate("2.5"), Ok(2.5));
        for bad in ["0", "-3", "inf", "NaN", "", "fast"] {
            let e = parse_rate(bad).unwrap_err();
            assert!(e.contains("requests per second"), "{bad}: {e}");
        }
    }

    /// `iolab ARGS` as the binary parses them: the `iolab tiers` command.
    fn parse(args: Vec<String>) -> TiersCmd {
        use clap::Parser;
        let all = std::iter::once("iolab".to_string()).chain(args.iter().cloned());
        match crate::Cli::try_parse_from(all) {
            Ok(crate::Cli {
                command: crate::Command::Tiers(t),
                ..
            }) => t.cmd,
            Ok(_) => panic!("{args:?}: not `iolab tiers`"),
            Err(e) => panic!("{args:?}: {e}"),
        }
    }

    /// The supervisor `up` starts and the agent a stack starts, through their flags and
    /// back (a renamed flag fails here, a renamed field does not compile).
    #[test]
    fn the_tiers_child_specs_go_through_their_flags_and_back() {
        for spec in [
            SuperviseSpec {
                rate: None,
                delay: None,
                vanilla: false,
                port: 18080,
                hosts: None,
            },
            SuperviseSpec {
                rate: Some("100mbit".into()),
                delay: Some("1ms".into()),
                vanilla: true,
                port: 19000,
                hosts: Some("/etc/iolab/tiers hosts.toml".into()),
            },
        ] {
            match parse(spec.to_args()) {
                TiersCmd::Supervise(a) => assert_eq!(SuperviseSpec::from(&a), spec),
                other => panic!("{spec:?} parsed as {other:?}"),
            }
        }
        let plain = AgentSpec {
            listen: "10.1.2.3:18083".parse().unwrap(),
            memory_mib: 64,
            ..Default::default()
        };
        let every = AgentSpec {
            lifetime_s: 2.5,
            drain_s: 0.25,
            arena_user: Some("nobody".into()),
            ..plain.clone()
        };
        for spec in [plain, every] {
            let args: Vec<String> = AgentSpec::IOLAB_ROLE
                .iter()
                .map(|w| w.to_string())
                .chain(spec.to_args())
                .collect();
            match parse(args) {
                TiersCmd::Agent(a) => assert_eq!(AgentSpec::try_from(&a).unwrap(), spec),
                other => panic!("{spec:?} parsed as {other:?}"),
            }
        }
    }

    /// `tiers bench --disc --dp-send X` starts `iolab disc be --dp-send X`: every value the
    /// one accepts, the other does, and means the same send path.
    #[test]
    fn every_bench_dp_send_is_a_disc_be_dp_send() {
        use clap::ValueEnum;
        let names: Vec<String> = BenchDpSend::value_variants()
            .iter()
            .map(|v| v.to_possible_value().unwrap().get_name().to_string())
            .collect();
        assert_eq!(
            names,
            ["gso", "raw", "xdp", "repair"],
            "as the flag listed them"
        );
        for &v in BenchDpSend::value_variants() {
            let send = DpSend::from(v);
            let disc = crate::cli::disc::SendPath::from_str(send.name(), false)
                .unwrap_or_else(|e| panic!("{}: {e}", send.name()));
            assert_eq!(DpSend::from(disc), send);
        }
    }
}
