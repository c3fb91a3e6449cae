//! `iolab disc ...`: run our tiers (BE, proxy as FE or IS) and check a chain end to end.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use clap::{Args, Subcommand};

use iolab_disc::proxy::ProxyConfig;
use iolab_tiers::children::{
    BeDp, DiscBeSpec, DiscProxySpec, DiscRole, DpSend, DpSetupSpec, TierTimeouts,
};

use super::choice_enum;

choice_enum! {
    /// How DP puts segments on the wire ([`iolab_disc::dp::SendPath`]; the variants' help is
    /// the library's doc text, verbatim, and its links name the library's modules).
    #[allow(rustdoc::broken_intra_doc_links)]
    pub enum SendPath => iolab_disc::dp::SendPath {
        /// A packet socket with GSO: one send per up to 64 KiB ([`crate::gso`]); the raw
        /// socket while the client's next hop is not resolved.
        Gso,
        /// A raw IPv4 socket: one `sendto` per segment ([`crate::sender::RawSocket`]).
        Raw,
        /// A TCP socket of the BE's stack continuing the FE's connection (`TCP_REPAIR`,
        /// [`crate::repair`]): the kernel segments, paces by its congestion window, takes the
        /// client's ACKs (cloned to it by the FE's hooks) and SACK blocks, and retransmits;
        /// closed silently once the client has everything. Needs DP one hop from the FE with
        /// its tap (the ACK clone), the FE's address local in DP's namespace (the clones are
        /// addressed to it; the testbed puts it on `lo`) and the route to the client; without
        /// the tap, or for an FE that does not describe its end in HELLO, DP sends as `gso`.
        Repair,
        /// An AF_XDP socket in copy mode on DP's link ([`crate::xdp`]): segments written into
        /// frames shared with the kernel, one `sendto` per 32; the raw socket while the client's
        /// next hop is not resolved, or where AF_XDP is refused.
        Xdp,
    }
}

choice_enum! {
    /// How a tier takes part in DISC ([`iolab_disc::proxy::DiscMode`]).
    pub enum DiscMode => iolab_disc::proxy::DiscMode {
        /// No DISC fields written or acted on (fields from upstream pass through).
        Off,
        /// Accept the bypass; as FE role fetch the payload from DP and write it ourselves.
        Relay,
        /// Accept the bypass; as FE role have DP send the payload on the client's connection
        /// (the FE's eBPF hooks on `hook_iface` keep one sequence space).
        Direct,
    }
}

#[derive(Debug, Args)]
#[command(
    about = "DISC (seed 004 ch. 3): our FE/IS/BE tiers and the back end's shortcut to the client"
)]
pub struct DiscArgs {
    #[command(subcommand)]
    pub command: DiscCommand,
}

#[derive(Debug, Subcommand)]
pub enum DiscCommand {
    /// The BE: a static file server (iolab-http's answers) with beHook and DP.
    Be(BeArgs),
    /// FE or IS: a reverse proxy (keep-alive on both sides, round robin over upstreams).
    Proxy(ProxyArgs),
    /// Sets up the namespace it runs in for DP's repaired sockets (`--dp-send repair`) and
    /// prints the commands it ran: what `tiers bench --disc` starts in its BE's namespace.
    #[command(hide = true)]
    DpSetup(DpSetupArgs),
    /// Builds a client/FE/IS/BE chain in network namespaces (root), fetches 1 B .. 64 MiB
    /// through it and straight from the BE, and compares the bytes.
    Check {
        #[arg(long, value_enum, default_value_t = DiscMode::Relay)]
        disc: DiscMode,
        /// Sizes in bytes, comma separated.
        #[arg(long, value_delimiter = ',', default_values_t = [1u64, 16383, 16384, 65536, 1 << 20, 64 << 20])]
        sizes: Vec<u64>,
        /// How DP sends in direct mode (`repair` also sets up DP's namespace for it).
        #[arg(long, value_enum, default_value_t = SendPath::Gso)]
        dp_send: SendPath,
    },
    /// A first side-by-side measurement (root): for each mode (off, relay, direct) a chain in
    /// namespaces, N GETs per size on one keep-alive connection with curl; requests/s and
    /// bytes through the FE's and IS's interfaces per request. Not yet `tiers bench --disc`
    /// (no nginx chain, no CPU per tier, no latency percentiles).
    Measure {
        /// Sizes in bytes, comma separated.
        #[arg(long, value_delimiter = ',', default_values_t = [1024u64, 65536, 1 << 20])]
        sizes: Vec<u64>,
        /// GETs per size and mode.
        #[arg(long, default_value_t = 50)]
        requests: u64,
    },
}

/// The deadlines of a tier's client connections.
#[derive(Debug, Args)]
pub struct TimeoutArgs {
    /// Seconds a whole request head may take from its first byte (the connection's start
    /// for the first); 0: none. Default 60, as nginx's `client_header_timeout`.
    #[arg(long, value_name = "SECS")]
    header_timeout: Option<u64>,
    /// Seconds bytes sent to a client may wait with none acknowledged; 0: none. Default
    /// 60, as nginx's `send_timeout`.
    #[arg(long, value_name = "SECS")]
    send_timeout: Option<u64>,
}

impl From<TimeoutArgs> for TierTimeouts {
    fn from(a: TimeoutArgs) -> TierTimeouts {
        TierTimeouts {
            header_secs: a.header_timeout,
            send_secs: a.send_timeout,
        }
    }
}

/// The library's deadlines for the spec's (None: the default).
fn client_timeouts(t: TierTimeouts) -> iolab_disc::deadline::ClientTimeouts {
    let d = iolab_disc::deadline::ClientTimeouts::default();
    let secs = |s: Option<u64>, default| s.map_or(default, std::time::Duration::from_secs);
    iolab_disc::deadline::ClientTimeouts {
        header: secs(t.header_secs, d.header),
        send: secs(t.send_secs, d.send),
    }
}

#[derive(Debug, Args)]
pub struct BeArgs {
    /// HTTP listen address.
    #[arg(long)]
    listen: SocketAddr,
    /// Directory served.
    #[arg(long)]
    root: PathBuf,
    /// DP's control endpoint (enables the shortcut).
    #[arg(long)]
    dp: Option<SocketAddr>,
    /// Address the FE reaches DP at, written in X-Disc (default: --dp).
    #[arg(long)]
    dp_advertise: Option<SocketAddr>,
    /// Smallest payload shortcut, in bytes.
    #[arg(long, default_value_t = iolab_disc::proto::DEFAULT_THRESHOLD)]
    threshold: u64,
    /// How DP puts the payload on the wire: `gso` (a packet socket, one send per up to
    /// 64 KiB, segmented by the kernel), `raw` (a raw IPv4 socket, one send per
    /// segment), `xdp` (an AF_XDP socket in copy mode on DP's link: segments written
    /// into frames shared with the kernel, one send per 32) or `repair` (a TCP socket
    /// of this namespace continuing the FE's
    /// connection, TCP_REPAIR: needs the FE's client-facing address local here and the
    /// FE's hooks cloning the ACKs to this DP, one hop away; see the crate's README).
    #[arg(long, value_enum, default_value_t = SendPath::Gso)]
    dp_send: SendPath,
    /// DP takes no ACK from a tap: the FE forwards the client's ACKs as control lines
    /// (the way when DP is not on the FE's link; for comparison).
    #[arg(long)]
    no_ack_tap: bool,
    /// Where to write the run's key of DP's control connections (a new random key, mode
    /// 0600, replacing the file): the FE reads it (`disc proxy --dp-key-file`). Required
    /// with --dp.
    #[arg(long, requires = "dp")]
    dp_key_file: Option<PathBuf>,
    /// Address an FE tier's control connections come from (repeat for several); DP
    /// refuses connections from any other. Required with --dp.
    #[arg(long, requires = "dp")]
    dp_peer: Vec<IpAddr>,
    /// Address of an upstream tier (repeat for several): with --dp, the BE closes
    /// connections from any other, so only they may offer the shortcut. Required with
    /// --dp.
    #[arg(long, requires = "dp")]
    upstream_peer: Vec<IpAddr>,
    #[command(flatten)]
    timeouts: TimeoutArgs,
}

/// The flags as the spec `tiers bench --disc` starts the BE with (a flag left at its
/// default is the spec's None; the DP flags mean something only with --dp).
impl TryFrom<BeArgs> for DiscBeSpec {
    type Error = anyhow::Error;
    fn try_from(a: BeArgs) -> anyhow::Result<DiscBeSpec> {
        if a.dp.is_some()
            && (a.dp_key_file.is_none() || a.dp_peer.is_empty() || a.upstream_peer.is_empty())
        {
            anyhow::bail!(
                "--dp needs --dp-key-file, at least one --dp-peer (the FE tiers) and one \
                 --upstream-peer (the tiers in front of the BE)"
            );
        }
        Ok(DiscBeSpec {
            listen: a.listen,
            root: a.root,
            dp: a.dp.map(|listen| BeDp {
                listen,
                advertise: a.dp_advertise,
                threshold: (a.threshold != iolab_disc::proto::DEFAULT_THRESHOLD)
                    .then_some(a.threshold),
                send: a.dp_send.into(),
                no_ack_tap: a.no_ack_tap,
                key_file: a.dp_key_file.unwrap_or_default(),
                peers: a.dp_peer,
                upstreams: a.upstream_peer,
            }),
            timeouts: a.timeouts.into(),
        })
    }
}

#[derive(Debug, Args)]
pub struct ProxyArgs {
    #[arg(long)]
    listen: SocketAddr,
    /// Upstream address (repeat for several: round robin per client connection).
    #[arg(long, required = true)]
    upstream: Vec<SocketAddr>,
    /// This tier holds the clients' connections (the FE): it writes X-Disc-Path.
    #[arg(long)]
    first: bool,
    /// DISC participation.
    #[arg(long, value_enum, default_value_t = DiscMode::Off)]
    disc: DiscMode,
    /// The FE's client-side interface for the eBPF hooks (`--disc direct --first`).
    #[arg(long)]
    hook_iface: Option<String>,
    /// Direct mode: seconds a payload sent by DP may make no progress (no client ACK
    /// for more of it) before the FE closes the client's connection.
    #[arg(long, default_value_t = iolab_disc::proxy::DIRECT_STALL.as_secs())]
    stall_secs: u64,
    /// The FE role: the file the BE wrote the run's DP key to (`disc be --dp-key-file`;
    /// must be mode 0600). Without it the FE takes the normal path.
    #[arg(long)]
    dp_key_file: Option<PathBuf>,
    #[command(flatten)]
    timeouts: TimeoutArgs,
}

impl From<ProxyArgs> for DiscProxySpec {
    fn from(a: ProxyArgs) -> DiscProxySpec {
        DiscProxySpec {
            listen: a.listen,
            upstream: a.upstream,
            first: a.first,
            disc: a.disc.into(),
            hook_iface: a.hook_iface,
            stall_secs: (a.stall_secs != iolab_disc::proxy::DIRECT_STALL.as_secs())
                .then_some(a.stall_secs),
            dp_key_file: a.dp_key_file,
            timeouts: a.timeouts.into(),
        }
    }
}

#[derive(Debug, Args)]
pub struct DpSetupArgs {
    /// The FE's client-facing address (put on `lo` here).
    #[arg(long)]
    fe: Ipv4Addr,
    /// The client's network (CIDR).
    #[arg(long)]
    client_net: String,
    /// The next hop to the client's network.
    #[arg(long)]
    via: Ipv4Addr,
    /// This namespace's interface on the FE's link.
    #[arg(long)]
    fe_link: String,
}

impl From<DpSetupArgs> for DpSetupSpec {
    fn from(a: DpSetupArgs) -> DpSetupSpec {
        DpSetupSpec {
            fe: a.fe,
            client_net: a.client_net,
            via: a.via,
            fe_link: a.fe_link,
        }
    }
}

/// The spec's send path and the library's, both ways (the spec names the flag's values for
/// the tiers, which do not link iolab-disc).
impl From<SendPath> for DpSend {
    fn from(v: SendPath) -> DpSend {
        match v {
            SendPath::Gso => DpSend::Gso,
            SendPath::Raw => DpSend::Raw,
            SendPath::Repair => DpSend::Repair,
            SendPath::Xdp => DpSend::Xdp,
        }
    }
}

impl From<DpSend> for SendPath {
    fn from(v: DpSend) -> SendPath {
        match v {
            DpSend::Gso => SendPath::Gso,
            DpSend::Raw => SendPath::Raw,
            DpSend::Repair => SendPath::Repair,
            DpSend::Xdp => SendPath::Xdp,
        }
    }
}

impl From<DiscMode> for DiscRole {
    fn from(v: DiscMode) -> DiscRole {
        match v {
            DiscMode::Off => DiscRole::Off,
            DiscMode::Relay => DiscRole::Relay,
            DiscMode::Direct => DiscRole::Direct,
        }
    }
}

impl From<DiscRole> for DiscMode {
    fn from(v: DiscRole) -> DiscMode {
        match v {
            DiscRole::Off => DiscMode::Off,
            DiscRole::Relay => DiscMode::Relay,
            DiscRole::Direct => DiscMode::Direct,
        }
    }
}

pub fn run(args: DiscArgs) -> anyhow::Result<()> {
    match args.command {
        DiscCommand::Be(a) => run_be(a.try_into()?),
        DiscCommand::Proxy(a) => run_proxy(a.into()),
        DiscCommand::DpSetup(a) => {
            let s = DpSetupSpec::from(a);
            for line in iolab_disc::repair::dp_namespace_setup(
                None,
                s.fe,
                &s.client_net,
                s.via,
                &s.fe_link,
            )? {
                println!("{line}");
            }
            Ok(())
        }
        DiscCommand::Check {
            disc,
            sizes,
            dp_send,
        } => check(disc.into(), &sizes, dp_send.into()),
        DiscCommand::Measure { sizes, requests } => measure(&sizes, requests),
    }
}

fn run_be(s: DiscBeSpec) -> anyhow::Result<()> {
    let stop = iolab_disc::stop::Stop::new()?;
    hook_signals(&stop)?;
    let site = iolab_http::Site::new(&s.root, iolab_http::Limits::default())?;
    let l = std::net::TcpListener::bind(s.listen)?;
    let (dpl, disc) = match s.dp {
        Some(d) => (
            Some(std::net::TcpListener::bind(d.listen)?),
            Some(iolab_disc::be::BeDisc {
                access: std::sync::Arc::new(iolab_disc::dp::Access {
                    key: iolab_disc::control::ControlKey::create_file(&d.key_file)?,
                    peers: d.peers,
                }),
                upstreams: d.upstreams,
                store: iolab_disc::dp::Store::new(),
                advertise: d.advertise.unwrap_or(d.listen),
                policy: iolab_disc::proto::Policy {
                    threshold: d.threshold.unwrap_or(iolab_disc::proto::DEFAULT_THRESHOLD),
                },
                send: SendPath::from(d.send).into(),
                ack_tap: !d.no_ack_tap,
            }),
        ),
        None => (None, None),
    };
    iolab_disc::be::run(l, dpl, site, disc, client_timeouts(s.timeouts), stop)?;
    Ok(())
}

fn run_proxy(s: DiscProxySpec) -> anyhow::Result<()> {
    let stop = iolab_disc::stop::Stop::new()?;
    hook_signals(&stop)?;
    let l = std::net::TcpListener::bind(s.listen)?;
    let stall = s
        .stall_secs
        .unwrap_or(iolab_disc::proxy::DIRECT_STALL.as_secs());
    iolab_disc::proxy::run(
        l,
        ProxyConfig {
            upstreams: s.upstream,
            first: s.first,
            disc: DiscMode::from(s.disc).into(),
            hook_iface: s.hook_iface,
            stall: std::time::Duration::from_secs(stall.max(1)),
            dp_key: s
                .dp_key_file
                .as_deref()
                .map(iolab_disc::control::ControlKey::read_file)
                .transpose()?,
            timeouts: client_timeouts(s.timeouts),
        },
        stop,
    )?;
    Ok(())
}

fn hook_signals(stop: &std::sync::Arc<iolab_disc::stop::Stop>) -> anyhow::Result<()> {
    let s = stop.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sigs = match signal_hook::iterator::Signals::new([
                signal_hook::consts::SIGINT,
                signal_hook::consts::SIGTERM,
            ]) {
                Ok(s) => s,
                Err(_) => return,
            };
            if sigs.forever().next().is_some() {
                s.trigger();
            }
        })?;
    Ok(())
}

fn check(
    disc: iolab_disc::proxy::DiscMode,
    sizes: &[u64],
    dp_send: iolab_disc::dp::SendPath,
) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("iolab-disc-check-{}", std::process::id()));
    let _guard = RemoveDir(dir.clone());
    let root = dir.join("www");
    iolab_disc::chain::write_payloads(&root, sizes)?;
    let chain = iolab_disc::chain::Chain::start(&iolab_disc::chain::ChainConfig {
        dp_send,
        ..iolab_disc::chain::ChainConfig::new(root, disc)
    })?;
    println!(
        "chain up: client {} -> FE {} -> IS {} -> BE {} (DP {}), DISC {:?}",
        chain.client_addr, chain.fe, chain.is, chain.be, chain.dp, disc
    );
    let t0 = std::time::Instant::now();
    let rows = iolab_disc::chain::compare_sizes(&chain, sizes, &dir)?;
    println!("fetched in {:.2} s", t0.elapsed().as_secs_f64());
    if let Some(s) = &chain.store {
        let (kept, claimed) = s.counts();
        println!("DP: {kept} payloads kept back by the BE, {claimed} claimed by the FE");
    }
    let mut bad = 0;
    println!("{:>12}  {:>12}  result", "size", "received");
    for r in &rows {
        println!(
            "{:>12}  {:>12}  {}",
            r.size,
            r.via_chain_bytes,
            if r.identical {
                "identical"
            } else {
                "DIFFERENT"
            }
        );
        bad += usize::from(!r.identical);
    }
    chain.stop()?;
    if bad > 0 {
        anyhow::bail!("{bad} of {} sizes differ", rows.len());
    }
    println!("all {} sizes identical to the BE's own answers", rows.len());
    Ok(())
}

fn measure(sizes: &[u64], requests: u64) -> anyhow::Result<()> {
    use iolab_disc::proxy::DiscMode;
    let dir = std::env::temp_dir().join(format!("iolab-disc-measure-{}", std::process::id()));
    let _guard = RemoveDir(dir.clone());
    let root = dir.join("www");
    iolab_disc::chain::write_payloads(&root, sizes)?;
    println!(
        "{:>8}  {:>9}  {:>10}  {:>14}  {:>14}",
        "mode", "size", "req/s", "FE bytes/req", "IS bytes/req"
    );
    for mode in [DiscMode::Off, DiscMode::Relay, DiscMode::Direct] {
        let chain = iolab_disc::chain::Chain::start(&iolab_disc::chain::ChainConfig::new(
            root.clone(),
            mode,
        ))?;
        for &size in sizes {
            let m = iolab_disc::chain::measure(&chain, size, requests, &dir)?;
            println!(
                "{:>8}  {:>9}  {:>10.0}  {:>14.0}  {:>14.0}",
                format!("{mode:?}").to_lowercase(),
                size,
                m.requests as f64 / m.seconds,
                m.fe_bytes,
                m.is_bytes
            );
        }
        chain.stop()?;
    }
    println!(
        "(one curl per size and mode on one keep-alive connection; tiers are threads of this \
         process in their namespaces; debug builds and a shared machine: compare within a run)"
    );
    Ok(())
}

struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    fn names<T: ValueEnum>() -> Vec<String> {
        T::value_variants()
            .iter()
            .map(|v| {
                v.to_possible_value()
                    .expect("a value")
                    .get_name()
                    .to_string()
            })
            .collect()
    }

    /// The flags' values are the names `tiers bench --disc` passes to `disc be --dp-send`
    /// and the scripts use; each maps to its library variant and back.
    #[test]
    fn the_flag_values_keep_their_names_and_map_both_ways() {
        assert_eq!(names::<SendPath>(), ["gso", "raw", "repair", "xdp"]);
        assert_eq!(names::<DiscMode>(), ["off", "relay", "direct"]);
        for &v in SendPath::value_variants() {
            assert_eq!(SendPath::from(iolab_disc::dp::SendPath::from(v)), v);
        }
        for &v in DiscMode::value_variants() {
            assert_eq!(DiscMode::from(iolab_disc::proxy::DiscMode::from(v)), v);
        }
        assert_eq!(
            iolab_disc::dp::SendPath::from(SendPath::Gso),
            iolab_disc::dp::SendPath::default(),
            "--dp-send's default is the library's"
        );
    }

    /// `iolab ARGS` as the binary parses them: the `iolab disc` command.
    fn parse(args: Vec<String>) -> DiscCommand {
        use clap::Parser;
        let all = std::iter::once("iolab".to_string()).chain(args.iter().cloned());
        match crate::Cli::try_parse_from(all) {
            Ok(crate::Cli {
                command: crate::Command::Disc(d),
                ..
            }) => d.command,
            Ok(_) => panic!("{args:?}: not `iolab disc`"),
            Err(e) => panic!("{args:?}: {e}"),
        }
    }

    /// What `tiers bench --disc` starts our tiers with, through their flags and back: every
    /// field of each spec survives (a renamed flag fails here).
    #[test]
    fn each_disc_child_spec_goes_through_its_flags_and_back() {
        let at = |s: &str| -> SocketAddr { s.parse().unwrap() };
        let mut bes = vec![DiscBeSpec {
            listen: at("10.0.0.66:8102"),
            root: "/srv/www".into(),
            dp: None,
            timeouts: TierTimeouts::default(),
        }];
        for &send in SendPath::value_variants() {
            for every in [false, true] {
                bes.push(DiscBeSpec {
                    dp: Some(BeDp {
                        listen: at("10.0.0.98:8103"),
                        advertise: every.then(|| at("10.9.9.9:7")),
                        threshold: every.then_some(12345),
                        send: send.into(),
                        no_ack_tap: every,
                        key_file: "/run/dp.key".into(),
                        peers: if every {
                            vec!["10.0.0.97".parse().unwrap(), "10.0.0.1".parse().unwrap()]
                        } else {
                            vec!["10.0.0.97".parse().unwrap()]
                        },
                        upstreams: vec!["10.0.0.65".parse().unwrap()],
                    }),
                    timeouts: TierTimeouts {
                        header_secs: every.then_some(3),
                        send_secs: every.then_some(0),
                    },
                    ..bes[0].clone()
                });
            }
        }
        for spec in bes {
            match parse(spec.to_args()) {
                DiscCommand::Be(a) => assert_eq!(DiscBeSpec::try_from(a).unwrap(), spec),
                other => panic!("{spec:?} parsed as {other:?}"),
            }
        }
        for &mode in DiscMode::value_variants() {
            for every in [false, true] {
                let spec = DiscProxySpec {
                    listen: at("10.0.0.2:8100"),
                    upstream: if every {
                        vec![at("10.0.0.34:8101"), at("10.0.0.35:8101")]
                    } else {
                        vec![at("10.0.0.34:8101")]
                    },
                    first: every,
                    disc: mode.into(),
                    hook_iface: every.then(|| "tie3".into()),
                    stall_secs: every.then_some(7),
                    dp_key_file: every.then(|| "/run/dp.key".into()),
                    timeouts: TierTimeouts {
                        header_secs: every.then_some(0),
                        send_secs: every.then_some(9),
                    },
                };
                match parse(spec.to_args()) {
                    DiscCommand::Proxy(a) => assert_eq!(DiscProxySpec::from(a), spec),
                    other => panic!("{spec:?} parsed as {other:?}"),
                }
            }
        }
        let setup = DpSetupSpec {
            fe: "10.0.0.2".parse().unwrap(),
            client_net: "10.0.0.0/27".into(),
            via: "10.0.0.129".parse().unwrap(),
            fe_link: "tie7".into(),
        };
        match parse(setup.to_args()) {
            DiscCommand::DpSetup(a) => assert_eq!(DpSetupSpec::from(a), setup),
            other => panic!("{setup:?} parsed as {other:?}"),
        }
    }

    /// A flag left at its default is the spec's None, so that the spec the bench builds
    /// (no threshold, no stall) is the one the BE and the proxy run.
    #[test]
    fn flags_at_their_defaults_are_the_spec_s_none() {
        match parse(vec![
            "disc".into(),
            "be".into(),
            "--listen".into(),
            "1.2.3.4:5".into(),
            "--root".into(),
            "/r".into(),
            "--dp".into(),
            "1.2.3.4:6".into(),
            "--threshold".into(),
            iolab_disc::proto::DEFAULT_THRESHOLD.to_string(),
            "--dp-key-file".into(),
            "/k".into(),
            "--dp-peer".into(),
            "1.2.3.7".into(),
            "--upstream-peer".into(),
            "1.2.3.8".into(),
        ]) {
            DiscCommand::Be(a) => {
                let dp = DiscBeSpec::try_from(a).unwrap().dp.expect("--dp");
                assert_eq!(
                    (dp.threshold, dp.send, dp.advertise),
                    (None, DpSend::Gso, None)
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
