//! Our tiers in network namespaces (client → FE → IS → BE), checked against the BE's own
//! answers with real curl. Needs root and curl; without them the tests skip with one line
//! (a failure under CI=true).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use iolab_disc::chain::{compare_sizes, write_payloads, Chain, ChainConfig};
use iolab_disc::dp::{Fault, SendPath};
use iolab_disc::proxy::DiscMode;

mod common;

const SIZES: [u64; 12] = [
    1,
    4095,
    4096,
    16383,
    16384,
    16385,
    65536,
    // Past one 64 KiB read: a tail the relay waits for, and one just too long to wait for.
    65536 + 16384,
    65536 + 16385,
    1 << 20,
    (1 << 20) + 1,
    64 << 20,
];

/// The tiers' warnings (and RUST_LOG's choice) into each test's captured output, shown
/// when it fails: a stalled payload's DP and FE say what they saw.
fn logs() {
    use tracing_subscriber::{fmt, EnvFilter};
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .with_ansi(false)
        .try_init();
}

fn ready() -> bool {
    logs();
    let curl = std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_ok();
    let why = if !common::is_root() {
        Some("needs root (network namespaces)")
    } else if !curl {
        Some("needs curl (Debian package curl)")
    } else {
        None
    };
    common::can_run("the disc chain tests", why)
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("iolab-disc-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Direct mode needs the eBPF programs too (built with clang; a failure under CI=true).
fn direct_ready() -> bool {
    if !ready() {
        return false;
    }
    assert!(
        iolab_disc::bpf::available() || std::env::var("CI").as_deref() != Ok("true"),
        "built without eBPF"
    );
    iolab_disc::bpf::available()
}

fn chain(root: &Path, disc: DiscMode, broken_dp: bool) -> Chain {
    Chain::start(&ChainConfig {
        broken_dp,
        ..config(root, disc)
    })
    .expect("starting the chain")
}

/// A chain's settings as every test starts from: the default threshold, a reachable DP
/// with its tap, no loss, no delay line, the default stall time.
fn config(root: &Path, disc: DiscMode) -> ChainConfig {
    ChainConfig::new(root.to_path_buf(), disc)
}

fn assert_identical(chain: &Chain, scratch: &Path) {
    let rows = compare_sizes(chain, &SIZES, scratch).expect("fetching");
    for r in &rows {
        assert!(
            r.identical,
            "size {}: the chain's answer differs from the BE's ({} bytes received)\n\
             via the chain:\n{}\nstraight from the BE:\n{}",
            r.size, r.via_chain_bytes, r.via_head, r.direct_head
        );
    }
}

/// Fetches [`SIZES`] through the chain (one keep-alive connection) and straight from the BE,
/// asserts the bytes identical and every payload of 16 KiB or more kept back by the BE and
/// claimed by the FE (none below); returns their number and DP's store.
fn every_big_payload_through_dp(
    c: &Chain,
    scratch: &Path,
) -> (u64, std::sync::Arc<iolab_disc::dp::Store>) {
    assert_identical(c, scratch);
    let big = SIZES.iter().filter(|&&n| n >= 16384).count() as u64;
    let store = c.store.clone().unwrap();
    assert_eq!(
        store.counts(),
        (big, big),
        "every big payload was sent by DP"
    );
    (big, store)
}

/// Sends `requests` in one write from the client's namespace and reads until the FE closes
/// (the last request says `Connection: close`).
fn pipelined(chain: &Chain, requests: &str) -> Vec<u8> {
    let (ns, fe, req) = (chain.client_ns.clone(), chain.fe, requests.to_string());
    iolab_disc::netns::spawn_in(Some(ns), "client", move || {
        let mut s = std::net::TcpStream::connect(fe)?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(60)))?;
        s.write_all(req.as_bytes())?;
        let mut out = Vec::new();
        s.read_to_end(&mut out)?;
        Ok(out)
    })
    .join()
    .unwrap()
    .expect("pipelined client")
}

/// Splits a stream of Content-Length-framed responses into (status, head, body).
fn split_responses(mut b: &[u8]) -> Vec<(u16, String, Vec<u8>)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let end = b.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
        let head = String::from_utf8_lossy(&b[..end]).into_owned();
        let status: u16 = head[9..12].parse().unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0);
        out.push((status, head, b[end..end + len].to_vec()));
        b = &b[end + len..];
    }
    out
}

/// Checks the answers to four pipelined requests; returns the bytes the client read.
fn check_pipelined(chain: &Chain, root: &Path) -> Vec<u8> {
    // Two shortcuts back to back (the second's epoch follows the first's with nothing
    // written between), then answers on the normal path, then a shortcut again.
    let req = "GET /f65536.bin HTTP/1.1\r\nHost: t\r\n\r\n\
               GET /f65536.bin HTTP/1.1\r\nHost: t\r\n\r\n\
               GET /missing HTTP/1.1\r\nHost: t\r\n\r\n\
               GET /f1.bin HTTP/1.1\r\nHost: t\r\nX-Disc-Path: nb=1;bypass=1\r\n\r\n\
               GET /f16384.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    let bytes = pipelined(chain, req);
    let got = split_responses(&bytes);
    let statuses: Vec<u16> = got.iter().map(|r| r.0).collect();
    assert_eq!(statuses, [200, 200, 404, 200, 200]);
    for (i, name) in [
        (0, "f65536.bin"),
        (1, "f65536.bin"),
        (3, "f1.bin"),
        (4, "f16384.bin"),
    ] {
        assert_eq!(got[i].2, std::fs::read(root.join(name)).unwrap(), "{name}");
        assert!(
            !got[i].1.to_ascii_lowercase().contains("x-disc"),
            "no DISC field reaches the client: {}",
            got[i].1
        );
    }
    bytes
}

#[test]
fn our_tiers_without_disc_serve_the_bes_bytes() {
    if !ready() {
        return;
    }
    let dir = TempDir::new("plain");
    let root = dir.0.join("www");
    write_payloads(&root, &SIZES).unwrap();
    let c = chain(&root, DiscMode::Off, false);
    assert_identical(&c, &dir.0);
    check_pipelined(&c, &root);
    // A size given twice (`iolab disc check --sizes 1,1`) is compared twice (it failed on a
    // file of the first fetch overwritten and removed by the second).
    let twice = [SIZES[0], SIZES[0]];
    let rows = compare_sizes(&c, &twice, &dir.0).expect("fetching a size twice");
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r.identical));
    c.stop().unwrap();
}

#[test]
fn disc_relay_takes_the_shortcut_and_serves_the_same_bytes() {
    if !ready() {
        return;
    }
    let dir = TempDir::new("relay");
    let root = dir.0.join("www");
    write_payloads(&root, &SIZES).unwrap();
    let c = chain(&root, DiscMode::Relay, false);
    // Every payload of 16 KiB or more went through DP (none below), and every one was claimed.
    let (big, store) = every_big_payload_through_dp(&c, &dir.0);
    check_pipelined(&c, &root);
    // f65536 and f16384 of the pipelined requests took the shortcut too.
    assert_eq!(store.counts(), (big + 3, big + 3));
    assert_eq!(store.usage(), (0, 0));
    c.stop().unwrap();
}

#[test]
fn an_unreachable_dp_falls_back_to_the_normal_path() {
    if !ready() {
        return;
    }
    let dir = TempDir::new("fallback");
    let root = dir.0.join("www");
    // Every size but 64 MiB: a fallback answers on the normal path, which the test without
    // DISC already runs at 64 MiB; generating and fetching it twice here cost CI seconds.
    let sizes = &SIZES[..SIZES.len() - 1];
    write_payloads(&root, sizes).unwrap();
    let c = chain(&root, DiscMode::Relay, true);
    let rows = compare_sizes(&c, sizes, &dir.0).expect("fetching");
    for r in &rows {
        assert!(r.identical, "{} B differ after the fallback", r.size);
    }
    let big = sizes.iter().filter(|&&n| n >= 16384).count() as u64;
    let (kept, claimed) = c.store.clone().unwrap().counts();
    assert_eq!(
        kept, big,
        "the BE offered the shortcut for each big payload"
    );
    assert_eq!(claimed, 0, "no FE could reach DP: every one was re-asked");
    c.stop().unwrap();
}

#[test]
fn disc_direct_dp_sends_on_the_clients_connection() {
    if !ready() {
        return;
    }
    if !iolab_disc::bpf::available() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("built without the eBPF programs (clang, libbpf-dev)");
        }
        eprintln!("skipping the direct-mode chain test: built without clang/libbpf-dev");
        return;
    }
    let dir = TempDir::new("direct");
    let root = dir.0.join("www");
    write_payloads(&root, &SIZES).unwrap();
    let c = chain(&root, DiscMode::Direct, false);
    // One keep-alive connection for all sizes: every head after the first payload goes
    // through the FE's shifted sequence space.
    let (big, store) = every_big_payload_through_dp(&c, &dir.0);
    // The first transfer finds the client's link address unresolved (raw socket, whose
    // first packet resolves it); the others go as GSO bursts.
    let (gso, raw) = store.send_paths();
    assert_eq!(gso + raw, big);
    assert!(raw <= 1 && gso >= big - 1, "gso {gso}, raw {raw}");
    // DP is on the FE's link: the hooks clone the client's ACKs to DP's tap, and the FE
    // forwards none itself.
    let (tap, lines) = store.ack_sources();
    assert!(
        tap >= big && lines == 0,
        "ACKs from the tap {tap}, as lines {lines}"
    );
    // The hooks clone each answer's head to DP as its start signal, but for a connection's
    // first answer (the FE's next sequence number is known once its first bytes went
    // through the hooks): a SEND line starts that one.
    let (signal, line) = store.start_sources();
    assert!(
        line <= 1 && signal == big - line,
        "started by the signal {signal}, by a line {line}"
    );
    c.stop().unwrap();
}

/// Direct mode with DP sending from sockets of the BE's stack that continue the FE's
/// connection (`--dp-send repair`): the client's bytes are the BE's for every size (1 B ...
/// 64 MiB on one keep-alive connection), and every payload went out that way.
#[test]
fn disc_direct_from_a_repaired_socket() {
    if !direct_ready() {
        return;
    }
    let (dir, c) = direct_chain("direct-repair", &SIZES, SendPath::Repair, false);
    let (big, store) = every_big_payload_through_dp(&c, &dir.0);
    assert_eq!(store.send_paths(), (0, 0), "no packet-socket transfer");
    assert_eq!(
        store.repaired_sends(),
        big,
        "every payload from the BE's stack"
    );
    // Several client connections at once: DP's sockets share the FE's address and port
    // (before SO_REUSEPORT, only the first could bind).
    concurrent_clients(&c, &dir.0, 6, 3);
    assert_eq!(
        store.repaired_sends(),
        big + 18,
        "kept/claimed {:?}, gso/raw {:?}, started by signal/line {:?}",
        store.counts(),
        store.send_paths(),
        store.start_sources()
    );
    c.stop().unwrap();
}

/// Direct mode with DP sending through its AF_XDP socket (`--dp-send xdp`, copy mode on
/// the veth): the client's bytes are the BE's for every size (1 B ... 64 MiB on one
/// keep-alive connection), and every payload but one whose client was not resolved yet went
/// out that way.
#[test]
fn disc_direct_through_af_xdp() {
    if !direct_ready() {
        return;
    }
    let (dir, c) = direct_chain("direct-xdp", &SIZES, SendPath::Xdp, false);
    let (big, store) = every_big_payload_through_dp(&c, &dir.0);
    let (gso, raw) = store.send_paths();
    let xdp = store.xdp_sends();
    assert!(
        gso == 0 && raw <= 1 && xdp + raw == big,
        "xdp {xdp}, raw {raw}, gso {gso}"
    );
    // Several client connections at once, each with its own sender in DP: they share the
    // one socket the interface's queue takes (a socket each sent through the raw socket).
    concurrent_clients(&c, &dir.0, 6, 3);
    assert_eq!(
        store.xdp_sends(),
        xdp + 18,
        "gso/raw {:?}",
        store.send_paths()
    );
    c.stop().unwrap();
}

/// `clients` curl processes at once in the client's namespace, each fetching the 64 KiB
/// payload `each` times on one connection: every copy identical to the file.
fn concurrent_clients(c: &Chain, scratch: &Path, clients: usize, each: usize) {
    let want = std::fs::read(scratch.join("www").join("f65536.bin")).unwrap();
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let (ns, fe, out) = (c.client_ns.clone(), c.fe, scratch.join(format!("par{i}")));
            std::thread::spawn(move || {
                let url = format!("http://{fe}/f65536.bin");
                let args: Vec<String> = (0..each)
                    .flat_map(|k| ["-o".into(), format!("{}-{k}", out.display()), url.clone()])
                    .collect();
                iolab_disc::chain::curl_in(&ns, &args).map(|()| out)
            })
        })
        .collect();
    for t in threads {
        let out = t.join().unwrap().expect("a concurrent client");
        for k in 0..each {
            let got = std::fs::read(format!("{}-{k}", out.display())).unwrap();
            assert!(got == want, "a concurrent client's payload differs");
        }
    }
}

/// A direct-mode chain with DP sending by `dp_send` (and DP's tap unless `no_ack_tap`)
/// serving payloads of `sizes` from a scratch directory named after `tag`.
fn direct_chain(tag: &str, sizes: &[u64], dp_send: SendPath, no_ack_tap: bool) -> (TempDir, Chain) {
    let dir = TempDir::new(tag);
    let root = dir.0.join("www");
    write_payloads(&root, sizes).unwrap();
    let c = Chain::start(&ChainConfig {
        dp_send,
        no_ack_tap,
        ..config(&root, DiscMode::Direct)
    })
    .expect("starting the chain");
    (dir, c)
}

/// `--dp-send repair` with a DP that takes no ACK from a tap (the FE's forwarder sends them
/// as control lines, which a TCP socket cannot take): DP answers HELLO without `repair` and
/// sends as `gso` does; the bytes are the BE's.
#[test]
fn a_dp_without_its_tap_sends_repair_payloads_as_gso() {
    if !direct_ready() {
        return;
    }
    let sizes = [1, 16384, 65536, 1 << 20];
    let (dir, c) = direct_chain("direct-repair-no-tap", &sizes, SendPath::Repair, true);
    for r in compare_sizes(&c, &sizes, &dir.0).expect("fetching") {
        assert!(r.identical, "size {}: differs", r.size);
    }
    let store = c.store.clone().unwrap();
    assert_eq!(store.counts(), (3, 3), "every big payload was sent by DP");
    assert_eq!(store.repaired_sends(), 0);
    let (gso, raw) = store.send_paths();
    assert!(gso + raw == 3 && gso >= 2, "gso {gso}, raw {raw}");
    c.stop().unwrap();
}

/// Pipelined requests in direct mode (two DP payloads on one connection with the FE's
/// answers around them), captured with tcpdump on the client's side: the client's capture
/// must hold one valid TCP stream (contiguous sequence numbers, a byte sent twice always the
/// same byte, the FIN after the last byte), carried by both the FE's link and DP's, equal to
/// what the client read. This stalled about 1 run in 3 before the ACK forwarder's fix (see
/// `Hooks::set_epoch`): it runs in CI since.
#[test]
fn disc_direct_pipelined_requests_make_one_tcp_stream() {
    if !direct_ready() {
        return;
    }
    let dir = TempDir::new("direct-pipelined");
    let root = dir.0.join("www");
    write_payloads(&root, &[1, 16384, 65536]).unwrap();
    let c = chain(&root, DiscMode::Direct, false);
    let store = c.store.clone().unwrap();
    let SocketAddr::V4(fe) = c.fe else {
        panic!("the testbed is IPv4")
    };
    let filter = format!("tcp and src host {} and src port {}", fe.ip(), fe.port());
    let cap = common::pcap::Tcpdump::start(&c.client_ns, &filter, dir.0.join("client.pcap"));
    if cap.is_none() {
        common::can_run(
            "the capture check",
            Some("needs tcpdump (Debian package tcpdump)"),
        );
    }
    let read = check_pipelined(&c, &root);
    assert_eq!(
        store.counts(),
        (3, 3),
        "the three big pipelined payloads were sent by DP"
    );
    if let Some(cap) = cap {
        let seen = cap.finish(|s| s.flags & common::pcap::FIN != 0);
        let (stream, ifaces) = common::pcap::reassemble(&seen, fe);
        assert_eq!(stream.len(), read.len(), "captured stream length");
        assert!(
            stream == read,
            "the captured stream is what the client read"
        );
        assert_eq!(
            ifaces.len(),
            2,
            "data came over two links (the FE's and DP's)"
        );
        eprintln!(
            "capture: {} segments from the FE's address, {} bytes, one stream",
            seen.len(),
            stream.len()
        );
    }
    c.stop().unwrap();
}

/// Direct mode with packets dropped in and out of the client's interfaces (the netem
/// substitute, `disc_lossy`): DP's go-back-N, the FE's stack and the hooks recover, and
/// the client still gets exactly the BE's bytes.
fn direct_under_loss(pct: f64, dp_send: SendPath) {
    if !direct_ready() {
        return;
    }
    // 64 MiB at 1% or 5% loss: a few seconds on every path (DP's go-back-N with a
    // congestion window and a timeout from measured round trips; before, minutes without
    // the repaired socket's TCP). At 20% no TCP moves 64 MiB in curl's two minutes.
    let sizes: &[u64] = if pct <= 5.0 {
        &[1, 16384, 65536, 1 << 20, (1 << 20) + 1, 64 << 20]
    } else {
        &[1, 16384, 65536, 1 << 20, (1 << 20) + 1]
    };
    let dir = TempDir::new(&format!("loss{pct}-{dp_send:?}"));
    let root = dir.0.join("www");
    write_payloads(&root, sizes).unwrap();
    let c = Chain::start(&ChainConfig {
        loss_pct: pct,
        dp_send,
        ..config(&root, DiscMode::Direct)
    })
    .expect("starting the chain");
    // GSO bursts make few packets (a 1 MiB payload is ~25): the sizes are fetched again
    // until the injector has dropped something (at most 8 rounds).
    let mut rounds = 0;
    let (seen, dropped) = loop {
        rounds += 1;
        let rows = compare_sizes(&c, sizes, &dir.0).expect("fetching");
        for r in &rows {
            assert!(
                r.identical,
                "{pct}% loss, size {}: differs ({} bytes received)\n{}",
                r.size, r.via_chain_bytes, r.via_head
            );
        }
        let (seen, dropped) = c.lossy.as_ref().unwrap().counts().unwrap();
        if dropped > 0 || rounds == 8 {
            break (seen, dropped);
        }
    };
    assert!(dropped > 0, "{pct}%: no packet was dropped ({seen} seen)");
    let big = rounds * sizes.iter().filter(|&&n| n >= 16384).count() as u64;
    let store = c.store.clone().unwrap();
    assert_eq!(store.counts(), (big, big));
    let (gso, raw) = store.send_paths();
    match dp_send {
        SendPath::Raw => assert_eq!((gso, raw), (0, big)),
        SendPath::Gso => assert!(gso >= big - 1, "gso {gso}, raw {raw}"),
        SendPath::Repair => assert_eq!(store.repaired_sends(), big),
        SendPath::Xdp => {
            let xdp = store.xdp_sends();
            assert!(
                gso == 0 && raw <= 1 && xdp + raw == big,
                "xdp {xdp}, raw {raw}, gso {gso}"
            )
        }
    }
    eprintln!("{pct}% loss: {dropped} of {seen} TCP packets dropped on the client's links; bytes identical");
    c.stop().unwrap();
}

#[test]
fn disc_direct_under_one_percent_loss() {
    direct_under_loss(1.0, SendPath::Raw);
}

#[test]
fn disc_direct_under_five_percent_loss() {
    direct_under_loss(5.0, SendPath::Gso);
}

#[test]
fn disc_direct_under_five_percent_loss_through_af_xdp() {
    direct_under_loss(5.0, SendPath::Xdp);
}

#[test]
fn disc_direct_under_five_percent_loss_from_a_repaired_socket() {
    direct_under_loss(5.0, SendPath::Repair);
}

/// Direct mode with the client's links delayed (2 ms each way) and a quarter of the frames
/// overtaking the others (the netem substitute: `iolab_netns::delayline`, a user-space line
/// in a namespace of its own between the client and the FE, and between the client and
/// DP): the client still gets exactly the BE's bytes, on one keep-alive connection.
#[test]
fn disc_direct_under_delay_and_reordering() {
    if !direct_ready() {
        return;
    }
    const SIZES: [u64; 5] = [1, 16384, 65536, 1 << 20, (1 << 20) + 1];
    let dir = TempDir::new("reorder");
    let root = dir.0.join("www");
    write_payloads(&root, &SIZES).unwrap();
    let c = Chain::start(&ChainConfig {
        line: Some(iolab_netns::delayline::LineParams {
            delay: std::time::Duration::from_millis(2),
            reorder_pct: 25.0,
            seed: 7,
        }),
        ..config(&root, DiscMode::Direct)
    })
    .expect("starting the chain");
    let t0 = std::time::Instant::now();
    let rows = compare_sizes(&c, &SIZES, &dir.0).expect("fetching");
    let took = t0.elapsed();
    for r in &rows {
        assert!(r.identical, "size {}: differs\n{}", r.size, r.via_head);
    }
    let big = SIZES.iter().filter(|&&n| n >= 16384).count() as u64;
    assert_eq!(c.store.clone().unwrap().counts(), (big, big));
    let (mut fwd, mut reordered) = (0, 0);
    for l in &c.lines {
        fwd += l
            .counts
            .forwarded
            .load(std::sync::atomic::Ordering::Relaxed);
        reordered += l
            .counts
            .reordered
            .load(std::sync::atomic::Ordering::Relaxed);
    }
    assert_eq!(c.lines.len(), 2, "links A and E");
    // The delay is there: a connect takes a round trip, 4 ms unless the SYN or the SYN-ACK
    // was one of the frames sent at once (each way 1 in 4): the longest of 10 is >= 4 ms
    // but for a chance of 0.4375^10 (0.03 %).
    let fe = c.fe;
    let rtts = iolab_disc::netns::spawn_in(Some(c.client_ns.clone()), "rtt", move || {
        let mut v = Vec::new();
        for _ in 0..10 {
            let t = std::time::Instant::now();
            let s = std::net::TcpStream::connect(fe)?;
            v.push(t.elapsed());
            drop(s);
        }
        Ok(v)
    })
    .join()
    .unwrap()
    .unwrap();
    let longest = rtts.iter().max().unwrap();
    assert!(
        *longest >= std::time::Duration::from_micros(3900),
        "no connect took the delayed round trip: {rtts:?}"
    );
    assert!(
        fwd > 100 && reordered > 10,
        "{fwd} frames forwarded, {reordered} sent at once"
    );
    eprintln!("delay 2 ms, 25% reordered: {fwd} frames forwarded, {reordered} overtook; bytes identical ({took:.1?})");
    c.stop().unwrap();
}

/// DP accepts a payload and then sends nothing (it died mid-payload): the head is out, the
/// client waits for the body. The FE closes the client's connection once the payload made
/// no progress for the FE's stall time (2 s here), with its FIN right after the bytes the
/// client has (beyond the payload's hole the client would hold it and wait forever: the
/// first version of this test hung until curl's own timeout); a DP that sends again serves
/// the next connection. Both ways the ACKs reach DP: the tap (the FE's watchdog closes) and
/// the FE's forwarder (the forwarder gives up).
#[test]
fn a_payload_dp_never_sends_closes_the_clients_connection() {
    stalled_payload(false, Fault::HoldSends);
    stalled_payload(true, Fault::HoldSends);
}

/// DP refuses the SEND (it no longer holds the payload: it expired, or the BE restarted at
/// the same address): the head is out, DP says why on the control connection and closes
/// it. The FE closes the client's connection as soon as it looks (its watchdog, each
/// second; the forwarder, each 10 ms), not after the stall time, which stays at its
/// default (30 s) here; the next connection is served.
#[test]
fn a_payload_dp_refuses_closes_the_clients_connection_at_once() {
    stalled_payload(false, Fault::RefuseSends);
    stalled_payload(true, Fault::RefuseSends);
}

/// The FE's start signal for a payload is lost (the tap's socket was full): no byte of it
/// is acknowledged within the FE's watchdog's second, and the watchdog sends DP the payload's
/// `SEND` line; the client gets every byte, a second or two late, on the same connection.
#[test]
fn a_lost_start_signal_is_made_good_by_a_send_line() {
    if !direct_ready() {
        return;
    }
    let dir = TempDir::new("direct-lost-signal");
    let root = dir.0.join("www");
    write_payloads(&root, &[65536]).unwrap();
    let c = Chain::start(&config(&root, DiscMode::Direct)).expect("starting the chain");
    let store = c.store.clone().unwrap();
    store.set_fault(Fault::LoseSignals);
    let url = format!("http://{}/f65536.bin", c.fe);
    let t0 = std::time::Instant::now();
    // Three answers on one connection: the first is started by a line (the connection's
    // first), the others by signals, lost here.
    let out = curl(&c, 20, &[&url, &url, &url]);
    let took = t0.elapsed();
    assert_eq!(out.status.code(), Some(0), "curl after {took:?}");
    let one = std::fs::read(root.join("f65536.bin")).unwrap();
    assert_eq!(out.stdout, [&one[..], &one[..], &one[..]].concat());
    let (signal, line) = store.start_sources();
    assert_eq!((signal, line), (0, 3), "after {took:?}");
    assert!(
        took >= std::time::Duration::from_millis(1000),
        "the resends waited for the watchdog: {took:?}"
    );
    c.stop().unwrap();
}

/// curl in the client's namespace: `urls` on one connection, at most `secs` seconds.
fn curl(c: &Chain, secs: u32, urls: &[&str]) -> std::process::Output {
    let secs = secs.to_string();
    std::process::Command::new("ip")
        .args(["netns", "exec", &c.client_ns, "curl", "-s", "-m", &secs])
        .args(urls)
        .output()
        .expect("running curl")
}

fn stalled_payload(no_ack_tap: bool, fault: Fault) {
    if !direct_ready() {
        return;
    }
    let dir = TempDir::new(&format!("direct-{fault:?}-{no_ack_tap}"));
    let root = dir.0.join("www");
    write_payloads(&root, &[65536]).unwrap();
    let c = Chain::start(&ChainConfig {
        stall: (fault == Fault::HoldSends).then(|| std::time::Duration::from_secs(2)),
        no_ack_tap,
        ..config(&root, DiscMode::Direct)
    })
    .expect("starting the chain");
    let store = c.store.clone().unwrap();
    let url = format!("http://{}/f65536.bin", c.fe);
    let fetch = || {
        let t0 = std::time::Instant::now();
        let out = curl(&c, 30, &[&url]);
        (out.status.code(), out.stdout, t0.elapsed())
    };
    store.set_fault(fault);
    let (code, body, took) = fetch();
    eprintln!(
        "no_ack_tap {no_ack_tap}: curl {code:?} after {took:?}, {} bytes",
        body.len()
    );
    assert_ne!(code, Some(0), "curl cannot have succeeded");
    assert_ne!(
        code,
        Some(28),
        "closed by the FE, not by curl's own timeout"
    );
    assert!(body.len() < 65536, "{} bytes", body.len());
    // Held: after the stall time (2 s). Refused: the FE sees it in its next look (within
    // its watchdog's second, at once for the forwarder), not after the stall time (30 s).
    let (least, most) = match fault {
        Fault::HoldSends => (2, 10),
        _ => (0, 5),
    };
    assert!(
        took >= std::time::Duration::from_secs(least)
            && took < std::time::Duration::from_secs(most),
        "closed after {took:?}"
    );
    store.set_fault(Fault::None);
    let (code, body, _) = fetch();
    assert_eq!(code, Some(0));
    assert_eq!(body, std::fs::read(root.join("f65536.bin")).unwrap());
    c.stop().unwrap();
}

/// Heavy loss: with a fifth of the packets dropped, the segment DP sends first, which also
/// carries the end of the head (the head rides with the payload), is lost in more than half
/// the runs: the FE's stack then sends the head again itself and DP's timer the rest (about
/// 2-8 s per run here).
#[test]
fn disc_direct_under_twenty_percent_loss() {
    direct_under_loss(20.0, SendPath::Gso);
}

/// The same from the BE's stack: the kernel's retransmission and congestion control.
/// Not in CI: run beside the other chain tests, about one run in six ends with the client's
/// connection reset (curl: "Connection reset by peer", no stall logged by the FE), not yet
/// explained; alone it passed 8 runs of 8 (`cargo test -p iolab-disc --test chain --
/// --ignored twenty_percent_loss_from`).
#[test]
#[ignore = "intermittent connection reset under 20% loss beside other chains (crates/tiers/disc README)"]
fn disc_direct_under_twenty_percent_loss_from_a_repaired_socket() {
    direct_under_loss(20.0, SendPath::Repair);
}
