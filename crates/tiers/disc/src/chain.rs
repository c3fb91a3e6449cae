//! A self-contained chain of our tiers in network namespaces (tests, `iolab disc check`):
//!
//! ```text
//!  client ──A── FE ──B── IS ──C── BE        A..E: /27 subnets of one free /24
//!    │          └────────D────────┘  │      D: the FE reaches DP on the BE
//!    └───────────────E───────────────┘      E (direct mode): DP's path to the client
//! ```
//!
//! TCP runs with Linux's defaults on both sides (timestamps, window scaling, SACK: DP's
//! segments carry no options, which Linux clients accept; DP counts the client's window in
//! bytes from the FE's TCP_INFO; the FE's ingress hook translates the client's SACK blocks
//! to the FE's view once the connection is shifted). Direct mode sets, on the client's side, rp_filter 0
//! (the FE's address arrives on link E, as on a flat datacenter network).
//!
//! The same shape as iolab-tiers' testbed (whose namespaces run nginx); here each tier is a
//! thread of this process inside its namespace, so a test needs no binary and no daemon.
//! Names carry the tag `dsc` and this process's pid (iolab-netns); everything is removed when
//! the [`Chain`] is dropped, and a dead owner's leftovers by `iolab_netns::cleanup_stale`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use crate::be::BeDisc;
use crate::proxy::{DiscMode, ProxyConfig};
use crate::stop::Stop;

pub const TAG: &str = "dsc";

/// What to start.
#[derive(Debug, Clone)]
pub struct ChainConfig {
    pub root: PathBuf,
    pub disc: DiscMode,
    pub threshold: u64,
    /// Advertise a DP address where nothing listens (tests the FE's fallback).
    pub broken_dp: bool,
    /// Drop this % of the TCP packets in and out of the client's interfaces
    /// ([`crate::bpf::Lossy`], the netem substitute); 0: none.
    pub loss_pct: f64,
    /// How DP sends (direct mode).
    pub dp_send: crate::dp::SendPath,
    /// Delay and reorder the client's links (A, and E in direct mode) with a user-space
    /// line ([`iolab_netns::delayline`], the netem substitute) in a namespace between the
    /// client and the other end.
    pub line: Option<iolab_netns::delayline::LineParams>,
    /// The FE's [`ProxyConfig::stall`] (None: the default).
    pub stall: Option<std::time::Duration>,
    /// DP without its ACK tap: the FE forwards the client's ACKs ([`BeDisc::ack_tap`]).
    pub no_ack_tap: bool,
}

impl ChainConfig {
    /// The settings a chain starts from: the default threshold, a reachable DP with its
    /// tap, DP's default send path, no loss, no delay line, the default stall time.
    pub fn new(root: PathBuf, disc: DiscMode) -> ChainConfig {
        ChainConfig {
            root,
            disc,
            threshold: crate::proto::DEFAULT_THRESHOLD,
            broken_dp: false,
            loss_pct: 0.0,
            dp_send: Default::default(),
            line: None,
            stall: None,
            no_ack_tap: false,
        }
    }
}

pub struct Chain {
    /// The client's namespace (run curl, wrk, iolab load there).
    pub client_ns: String,
    pub fe_ns: String,
    pub is_ns: String,
    pub be_ns: String,
    /// The FE's client-facing listener.
    pub fe: SocketAddr,
    pub is: SocketAddr,
    /// The BE's HTTP listener (on link C).
    pub be: SocketAddr,
    /// DP's control endpoint (on link D).
    pub dp: SocketAddr,
    pub client_addr: Ipv4Addr,
    /// Direct mode: the BE's address on link E (DP's link to the client).
    pub be_link_e: Option<Ipv4Addr>,
    /// The FE's and client's interfaces on link A.
    pub fe_if: String,
    pub client_if: String,
    /// DP's store (None without DISC): its counts show which path the payloads took.
    pub store: Option<Arc<crate::dp::Store>>,
    /// The loss injector on the client's interfaces, if any.
    pub lossy: Option<crate::bpf::Lossy>,
    /// (tier, namespace, interface) of every tier-side veth end.
    pub tier_ifaces: Vec<(String, String, String)>,
    /// The delay lines on the client's links, if any.
    pub lines: Vec<iolab_netns::delayline::DelayLine>,
    stops: Vec<Arc<Stop>>,
    threads: Vec<std::thread::JoinHandle<anyhow::Result<()>>>,
    net: Option<iolab_netns::Net>,
}

fn bind_in(ns: &str, addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    let ns = ns.to_string();
    crate::netns::spawn_in(Some(ns), "bind", move || {
        std::net::TcpListener::bind(addr).with_context(|| format!("binding {addr}"))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("bind thread panicked"))?
}

/// The chain's addresses: one free /24, cut into /27 subnets (one per link).
#[derive(Clone, Copy)]
struct Subnets([u8; 3]);

impl Subnets {
    /// Host `host` of link `sub`'s subnet.
    fn at(self, sub: u8, host: u8) -> Ipv4Addr {
        let [x, y, z] = self.0;
        Ipv4Addr::new(x, y, z, sub * 32 + host)
    }
}

/// (left tier, right tier, subnet) of each link: A, B, C, D, and E in direct mode.
type Link = (usize, usize, u8);

/// Each link's two ends (left, right), in the order of the links.
type Ends = Vec<(iolab_netns::Iface, iolab_netns::Iface)>;

/// The veth pairs of `links` between the namespaces (the client's links through a delay
/// line in a namespace of its own when `line` says so), addressed and up.
fn wire_links(
    net: &mut iolab_netns::Net,
    ns: &[iolab_netns::Namespace],
    links: &[Link],
    line: Option<iolab_netns::delayline::LineParams>,
    sub: Subnets,
) -> anyhow::Result<(Ends, Vec<iolab_netns::delayline::DelayLine>)> {
    let wire = match line {
        Some(_) => Some(net.namespace()?),
        None => None,
    };
    let mut ifaces = Vec::new();
    let mut lines = Vec::new();
    for &(l, r, s) in links {
        let (il, ir) = match (&wire, line) {
            // client ⇄ wire ⇄ other end: the line forwards between the middle ends.
            (Some(w), Some(p)) if l == 0 => {
                let (il, wl) = net.veth(Some(&ns[l]), Some(w))?;
                let (wr, ir) = net.veth(Some(w), Some(&ns[r]))?;
                wl.up()?;
                wr.up()?;
                lines.push(iolab_netns::delayline::DelayLine::start(
                    Some(w.name()),
                    &wl.name,
                    &wr.name,
                    p,
                )?);
                (il, ir)
            }
            _ => net.veth(Some(&ns[l]), Some(&ns[r]))?,
        };
        il.add_addr(&format!("{}/27", sub.at(s, 1)))?;
        ir.add_addr(&format!("{}/27", sub.at(s, 2)))?;
        il.up()?;
        ir.up()?;
        ifaces.push((il, ir));
    }
    Ok((ifaces, lines))
}

/// Direct mode: DP's segments to the client leave the BE on link E, the client takes the
/// FE's address from there (rp_filter off), and DP's namespace is set up for repaired
/// sockets when they are DP's send path.
fn direct_path(
    ns: &[iolab_netns::Namespace],
    ifaces: &Ends,
    sub: Subnets,
    dp_send: crate::dp::SendPath,
) -> anyhow::Result<()> {
    let client_net = format!("{}/27", sub.at(0, 0));
    ns[3].run(
        "ip",
        &[
            "route",
            "add",
            &client_net,
            "via",
            &sub.at(4, 1).to_string(),
        ],
    )?;
    let e = format!("net.ipv4.conf.{}.rp_filter=0", ifaces[4].0.name);
    for kv in ["net.ipv4.conf.all.rp_filter=0", e.as_str()] {
        ns[0].run("sysctl", &["-q", "-w", kv])?;
    }
    if dp_send == crate::dp::SendPath::Repair {
        crate::repair::dp_namespace_setup(
            Some(&ns[3]),
            sub.at(0, 2),
            &client_net,
            sub.at(4, 1),
            &ifaces[3].1.name,
        )?;
    }
    Ok(())
}

/// The loss injector on the client's interfaces (`pct` of their TCP packets), if any.
fn lossy_client(
    client_ns: &str,
    ifaces: &Ends,
    links: &[Link],
    pct: f64,
) -> anyhow::Result<Option<crate::bpf::Lossy>> {
    if pct <= 0.0 {
        return Ok(None);
    }
    let client_ifs: Vec<String> = ifaces
        .iter()
        .zip(links)
        .filter(|(_, (l, _, _))| *l == 0)
        .map(|(i, _)| i.0.name.clone())
        .collect();
    let l = crate::netns::spawn_in(Some(client_ns.to_string()), "lossy", move || {
        let mut l = crate::bpf::Lossy::load(pct)?;
        for i in &client_ifs {
            l.attach(i)?;
        }
        Ok(l)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("lossy thread panicked"))??;
    Ok(Some(l))
}

/// The listening addresses of the chain's tiers: FE (client-facing), IS, BE, DP.
struct Listeners {
    fe: SocketAddr,
    is: SocketAddr,
    be: SocketAddr,
    dp: SocketAddr,
    /// The FE's address on link D (its control connections to DP come from it).
    fe_dp: Ipv4Addr,
    /// The IS's address on link C (its connections to the BE come from it).
    is_be: Ipv4Addr,
}

/// The running tiers: a stop and a thread each.
type Tiers = (
    Vec<Arc<Stop>>,
    Vec<std::thread::JoinHandle<anyhow::Result<()>>>,
);

/// Starts the BE (with DP) and the two proxies, each a thread inside its namespace (the
/// sockets it opens, upstream and DP, live there).
fn start_tiers(
    cfg: &ChainConfig,
    names: &[String],
    at: &Listeners,
    broken_dp: SocketAddr,
    fe_iface: &str,
    store: Option<Arc<crate::dp::Store>>,
) -> anyhow::Result<Tiers> {
    let fe_l = bind_in(&names[1], at.fe)?;
    let is_l = bind_in(&names[2], at.is)?;
    let be_l = bind_in(&names[3], at.be)?;
    let dp_l = bind_in(&names[3], at.dp)?;
    let site = iolab_http::Site::new(&cfg.root, iolab_http::Limits::default())?;
    let mut stops = Vec::new();
    let mut threads = Vec::new();
    // The run's key, handed to the BE and the FE in memory (the processes of `tiers bench
    // --disc` share it through a file of mode 0600).
    let key = crate::control::ControlKey::random()?;
    let access = Arc::new(crate::dp::Access {
        key: key.clone(),
        peers: vec![at.fe_dp.into()],
    });
    let be_disc = store.map(|store| BeDisc {
        access,
        upstreams: vec![at.is_be.into()],
        store,
        advertise: if cfg.broken_dp { broken_dp } else { at.dp },
        policy: crate::proto::Policy {
            threshold: cfg.threshold,
        },
        send: cfg.dp_send,
        ack_tap: !cfg.no_ack_tap,
    });
    let s = Stop::new()?;
    stops.push(s.clone());
    threads.push(crate::netns::spawn_in(
        Some(names[3].clone()),
        "disc-be",
        move || {
            crate::be::run(be_l, Some(dp_l), site, be_disc, Default::default(), s)
                .map_err(Into::into)
        },
    ));
    for (l, up, first, ns) in [
        (is_l, at.be, false, &names[2]),
        (fe_l, at.is, true, &names[1]),
    ] {
        let s = Stop::new()?;
        stops.push(s.clone());
        let pc = ProxyConfig {
            upstreams: vec![up],
            first,
            disc: cfg.disc,
            hook_iface: first.then(|| fe_iface.to_string()),
            stall: cfg.stall.unwrap_or(crate::proxy::DIRECT_STALL),
            dp_key: first.then(|| key.clone()),
            timeouts: Default::default(),
        };
        threads.push(crate::netns::spawn_in(
            Some(ns.clone()),
            "disc-proxy",
            move || crate::proxy::run(l, pc, s).map_err(Into::into),
        ));
    }
    Ok((stops, threads))
}

impl Chain {
    pub fn start(cfg: &ChainConfig) -> anyhow::Result<Chain> {
        let _ = iolab_netns::cleanup_stale(TAG);
        let mut net = iolab_netns::Net::new(TAG)?;
        let mut ns = Vec::new();
        for _ in 0..4 {
            ns.push(net.namespace()?);
        }
        let sub = Subnets(iolab_netns::free_subnet()?);
        let direct = cfg.disc == DiscMode::Direct;
        let mut links: Vec<Link> = vec![(0, 1, 0), (1, 2, 1), (2, 3, 2), (1, 3, 3)];
        if direct {
            links.push((0, 3, 4));
        }
        let (ifaces, lines) = wire_links(&mut net, &ns, &links, cfg.line, sub)?;
        if direct {
            direct_path(&ns, &ifaces, sub, cfg.dp_send)?;
        }
        let names: Vec<String> = ns.iter().map(|n| n.name().to_string()).collect();
        let lossy = lossy_client(&names[0], &ifaces, &links, cfg.loss_pct)?;
        let at = Listeners {
            fe: SocketAddr::from((sub.at(0, 2), 8080)),
            is: SocketAddr::from((sub.at(1, 2), 8080)),
            be: SocketAddr::from((sub.at(2, 2), 8080)),
            dp: SocketAddr::from((sub.at(3, 2), 8081)),
            fe_dp: sub.at(3, 1),
            is_be: sub.at(2, 1),
        };
        let store = (cfg.disc != DiscMode::Off).then(crate::dp::Store::new);
        let fe_iface = ifaces[0].1.name.clone();
        let broken_dp = SocketAddr::from((sub.at(3, 2), 9));
        let (stops, threads) = start_tiers(cfg, &names, &at, broken_dp, &fe_iface, store.clone())?;
        let tiers = ["client", "fe", "is", "be"];
        let mut tier_ifaces = Vec::new();
        for ((il, ir), (l, r, _)) in ifaces.iter().zip(&links) {
            tier_ifaces.push((tiers[*l].to_string(), names[*l].clone(), il.name.clone()));
            tier_ifaces.push((tiers[*r].to_string(), names[*r].clone(), ir.name.clone()));
        }
        Ok(Chain {
            client_ns: names[0].clone(),
            fe_ns: names[1].clone(),
            is_ns: names[2].clone(),
            be_ns: names[3].clone(),
            fe: at.fe,
            is: at.is,
            be: at.be,
            dp: at.dp,
            client_addr: sub.at(0, 1),
            be_link_e: direct.then(|| sub.at(4, 2)),
            fe_if: fe_iface,
            client_if: ifaces[0].0.name.clone(),
            store,
            lossy,
            tier_ifaces,
            lines,
            stops,
            threads,
            net: Some(net),
        })
    }

    /// Stops the tiers and removes the namespaces, reporting errors.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.stop_all()
    }

    fn stop_all(&mut self) -> anyhow::Result<()> {
        for s in &self.stops {
            s.trigger();
        }
        let mut first_err = None;
        for t in self.threads.drain(..) {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(anyhow::anyhow!("a tier thread panicked"));
                }
            }
        }
        for l in self.lines.drain(..) {
            if let Err(e) = l.stop() {
                first_err.get_or_insert(anyhow::anyhow!("delay line: {e}"));
            }
        }
        if let Some(net) = self.net.take() {
            net.remove()?;
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        if let Err(e) = self.stop_all() {
            tracing::warn!("disc chain: {e:#}");
        }
    }
}

/// Writes `f<size>.bin` for each size into `root` (deterministic bytes, position-dependent
/// so a shifted or repeated segment shows).
pub fn write_payloads(root: &std::path::Path, sizes: &[u64]) -> anyhow::Result<()> {
    std::fs::create_dir_all(root)?;
    for &n in sizes {
        let data: Vec<u8> = (0..n)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ (i % 251) as u8)
            .collect();
        std::fs::write(root.join(format!("f{n}.bin")), data)?;
    }
    Ok(())
}

/// `curl -sS ARGS...` inside namespace `ns` (several URLs: one keep-alive
/// connection). Returns curl's stderr on failure.
pub fn curl_in(ns: &str, args: &[String]) -> anyhow::Result<()> {
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "curl",
            "-sS",
            "--noproxy",
            "*",
            "--max-time",
            "120",
        ])
        .args(args)
        .output()
        .context("running curl (Debian package curl)")?;
    if !out.status.success() {
        anyhow::bail!(
            "curl {}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// One size fetched through the chain and straight from the BE.
#[derive(Debug, Clone)]
pub struct Compared {
    pub size: u64,
    pub identical: bool,
    pub via_chain_bytes: u64,
    /// The head received through the chain (`Date` removed), for a report on a mismatch.
    pub via_head: String,
    pub direct_head: String,
}

/// Fetches every `f<size>.bin` through the FE (from the client's namespace, all on one
/// keep-alive connection) and straight from the BE (from the IS's namespace), and compares
/// the bodies and the heads (less `Date`, which may tick).
pub fn compare_sizes(
    chain: &Chain,
    sizes: &[u64],
    scratch: &std::path::Path,
) -> anyhow::Result<Vec<Compared>> {
    let mut via = Vec::new();
    let mut direct = Vec::new();
    for (dir, ns, addr, tag) in [
        (&mut via, &chain.client_ns, chain.fe, "via"),
        (&mut direct, &chain.is_ns, chain.be, "direct"),
    ] {
        let mut args = Vec::new();
        // A size given twice is fetched twice (one output file per position).
        for (i, &n) in sizes.iter().enumerate() {
            let file = scratch.join(format!("{tag}-{i}-{n}.out"));
            args.extend([
                "-i".to_string(),
                "-o".into(),
                file.display().to_string(),
                format!("http://{addr}/f{n}.bin"),
            ]);
            dir.push((n, file));
        }
        curl_in(ns, &args)?;
    }
    // (head less `Date`, body)
    let split = |b: Vec<u8>| -> (Vec<u8>, Vec<u8>) {
        let end = crate::http1::find_head_end(&b, 0).unwrap_or(b.len());
        let head = b[..end]
            .split_inclusive(|&c| c == b'\n')
            .filter(|l| !l.to_ascii_lowercase().starts_with(b"date:"))
            .flatten()
            .copied()
            .collect();
        (head, b[end..].to_vec())
    };
    let mut out = Vec::new();
    for ((n, vf), (_, df)) in via.into_iter().zip(direct) {
        let (hv, v) = split(std::fs::read(&vf)?);
        let (hd, d) = split(std::fs::read(&df)?);
        out.push(Compared {
            size: n,
            identical: v == d && hv == hd && v.len() as u64 == n,
            via_chain_bytes: v.len() as u64,
            via_head: String::from_utf8_lossy(&hv).into_owned(),
            direct_head: String::from_utf8_lossy(&hd).into_owned(),
        });
        let _ = std::fs::remove_file(vf);
        let _ = std::fs::remove_file(df);
    }
    Ok(out)
}

/// Bytes received + sent on every interface of `tier`, read with `ip -s` in its namespace.
pub fn tier_bytes(chain: &Chain, tier: &str) -> anyhow::Result<u64> {
    let mut total = 0;
    for (t, ns, iface) in &chain.tier_ifaces {
        if t != tier {
            continue;
        }
        for dir in ["rx_bytes", "tx_bytes"] {
            let p = std::process::Command::new("ip")
                .args(["netns", "exec", ns, "cat"])
                .arg(format!("/sys/class/net/{iface}/statistics/{dir}"))
                .output()?;
            total += String::from_utf8_lossy(&p.stdout)
                .trim()
                .parse::<u64>()
                .with_context(|| format!("reading {dir} of {iface}"))?;
        }
    }
    Ok(total)
}

/// One size measured through the chain: `n` GETs on one keep-alive connection (curl).
#[derive(Debug, Clone)]
pub struct Measured {
    pub size: u64,
    pub requests: u64,
    pub seconds: f64,
    /// Bytes in + out of the FE's and IS's interfaces, per request.
    pub fe_bytes: f64,
    pub is_bytes: f64,
}

pub fn measure(
    chain: &Chain,
    size: u64,
    n: u64,
    scratch: &std::path::Path,
) -> anyhow::Result<Measured> {
    let out = scratch.join(format!("m-{size}.out"));
    let mut args = Vec::new();
    for _ in 0..n {
        args.extend([
            "-o".to_string(),
            out.display().to_string(),
            format!("http://{}/f{size}.bin", chain.fe),
        ]);
    }
    let (fe0, is0) = (tier_bytes(chain, "fe")?, tier_bytes(chain, "is")?);
    let t0 = std::time::Instant::now();
    curl_in(&chain.client_ns, &args)?;
    let seconds = t0.elapsed().as_secs_f64();
    let (fe1, is1) = (tier_bytes(chain, "fe")?, tier_bytes(chain, "is")?);
    let _ = std::fs::remove_file(&out);
    Ok(Measured {
        size,
        requests: n,
        seconds,
        fe_bytes: (fe1 - fe0) as f64 / n as f64,
        is_bytes: (is1 - is0) as f64 / n as f64,
    })
}
