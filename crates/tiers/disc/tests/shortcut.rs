//! The shortcut at the packet level, with a real Linux client: the FE writes a head on its
//! connection, DP (in the BE's namespace) sends the payload on that same connection as the
//! FE through a raw socket, the FE's eBPF programs keep one sequence space (its later
//! segments shifted, the client's ACKs translated, DP's ACKs kept from the FE's stack and
//! forwarded to DP), and the FE then writes a tail. The client must read head + payload +
//! tail, in order, as one ordinary TCP stream.
//!
//! ```text
//!  client ──A── FE        BE ──E── client     (E: DP's path to the client)
//! ```
//!
//! Set on the FE's side only (the client is untouched): the FE's namespace has TCP
//! timestamps, SACK and window scaling off (this test feeds DP raw window fields; the
//! chain tests run with timestamps and window scaling on), and the client's namespace accepts the FE's address arriving on link E
//! (rp_filter 0, as a flat datacenter network would). Needs root and clang; skips otherwise.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iolab_disc::bpf::{ConnKey, ConnState, Hooks};
use iolab_disc::sender::{Flow, RawSocket, Transfer};

fn ready() -> bool {
    common::bpf_ready("the disc shortcut test", "namespaces, CAP_BPF, raw sockets")
}

fn sysctl(ns: &iolab_netns::Namespace, kv: &str) {
    ns.run("sysctl", &["-q", "-w", kv]).unwrap();
}

/// Bytes the socket has not had acknowledged yet (SIOCOUTQ).
fn unacked(s: &std::net::TcpStream) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: ioctl(SIOCOUTQ) writes one int into `n`, alive for the call.
    unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    n
}

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

const SIZE: usize = 300_000;
const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 300000\r\n\r\n";
const TAIL: &[u8] = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";

#[test]
fn dp_sends_on_the_fes_connection_and_the_fe_continues_after_it() {
    if !ready() {
        return;
    }
    let _ = iolab_netns::cleanup_stale("dsh");
    let mut net = iolab_netns::Net::new("dsh").unwrap();
    let client = net.namespace().unwrap();
    let fe = net.namespace().unwrap();
    let be = net.namespace().unwrap();
    let [x, y, z] = iolab_netns::free_subnet().unwrap();
    let a = |sub: u8, host: u8| Ipv4Addr::new(x, y, z, sub * 64 + host);
    let (c_a, fe_a) = net.veth(Some(&client), Some(&fe)).unwrap();
    let (c_e, be_e) = net.veth(Some(&client), Some(&be)).unwrap();
    for (i, addr) in [
        (&c_a, a(0, 1)),
        (&fe_a, a(0, 2)),
        (&c_e, a(1, 1)),
        (&be_e, a(1, 2)),
    ] {
        i.add_addr(&format!("{addr}/26")).unwrap();
        i.up().unwrap();
    }
    // DP reaches the client's address on link A through link E.
    be.run(
        "ip",
        &[
            "route",
            "add",
            &format!("{}/26", a(0, 0)),
            "via",
            &a(1, 1).to_string(),
        ],
    )
    .unwrap();
    for kv in [
        "net.ipv4.tcp_timestamps=0",
        "net.ipv4.tcp_sack=0",
        "net.ipv4.tcp_window_scaling=0",
    ] {
        sysctl(&fe, kv);
    }
    sysctl(&client, "net.ipv4.conf.all.rp_filter=0");
    sysctl(&client, &format!("net.ipv4.conf.{}.rp_filter=0", c_e.name));

    let fe_addr = SocketAddrV4::new(a(0, 2), 8080);
    let listener = fe.tcp_listener(SocketAddr::V4(fe_addr)).unwrap();

    // DP: waits for the FE's start message, then sends, fed with ACKs by the FE.
    let (start_tx, start_rx) = mpsc::channel::<Flow>();
    let (ack_tx, ack_rx) = mpsc::channel::<(u32, usize)>();
    let dp = iolab_disc::netns::spawn_in(Some(be.name().to_string()), "dp", move || {
        let flow = start_rx.recv_timeout(Duration::from_secs(60))?;
        let mut raw = RawSocket::new()?;
        let mut t = Transfer::new(flow, Bytes::from(payload(SIZE)), 65535);
        t.pump(&mut raw)?;
        let t0 = Instant::now();
        while !t.done() {
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(60),
                "DP: not acknowledged in 60 s ({} of {SIZE} bytes)",
                t.acked()
            );
            match ack_rx.recv_timeout(Duration::from_millis(10)) {
                Ok((ack, win)) => t.on_ack(ack, win, &mut raw)?,
                Err(_) => t.on_tick(Instant::now(), &mut raw)?,
            }
        }
        Ok((t.segments, t.retransmits))
    });

    // The FE: its hooks on link A, a head, DP's payload, a tail.
    let (fe_ready_tx, fe_ready_rx) = mpsc::channel::<()>();
    let fe_if = fe_a.name.clone();
    let fe_thread = iolab_disc::netns::spawn_in(Some(fe.name().to_string()), "fe", move || {
        let mut hooks = Hooks::load()?;
        hooks.attach(&fe_if)?;
        fe_ready_tx.send(())?;
        let (mut s, peer) = listener.accept()?;
        let SocketAddr::V4(peer) = peer else {
            anyhow::bail!("not IPv4")
        };
        let key = ConnKey::new(*peer.ip(), peer.port(), *fe_addr.ip(), fe_addr.port());
        hooks.set(key, ConnState::default())?;
        let mut req = [0u8; 64];
        let _ = s.read(&mut req)?;
        s.write_all(HEAD)?;
        let t0 = Instant::now();
        while unacked(&s) > 0 {
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(30),
                "head not acknowledged"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // The payload goes at the FE's next sequence number.
        let st = hooks.get(&key)?.expect("registered");
        let n = SIZE as u32;
        hooks.set_epoch(key, st.fe_nxt, 0, n)?;
        start_tx.send(Flow {
            fe: fe_addr,
            client: peer,
            seq: st.fe_nxt,
            ack: st.fe_ack,
            window: st.fe_win as u16,
            mss: 1400,
        })?;
        // The ack forwarder: the client's ACKs for DP, as the ingress program saw them.
        let t0 = Instant::now();
        let (mut acked, mut win) = (0u32, 0u32);
        while acked != n {
            anyhow::ensure!(
                t0.elapsed() < Duration::from_secs(60),
                "payload not acknowledged"
            );
            let s2 = hooks.get(&key)?.expect("registered");
            if let Some((a, w)) = iolab_disc::bpf::dp_progress(&s2, st.fe_nxt, n, acked, win) {
                (acked, win) = (a, w);
                let _ = ack_tx.send((st.fe_nxt.wrapping_add(a), w as usize));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        s.write_all(TAIL)?;
        s.shutdown(std::net::Shutdown::Write)?;
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        let st = hooks.get(&key)?.expect("registered");
        Ok(st)
    });
    fe_ready_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("FE hooks attached");

    // The client: an ordinary socket in its namespace.
    let got = iolab_disc::netns::spawn_in(Some(client.name().to_string()), "client", move || {
        let mut s = std::net::TcpStream::connect(fe_addr)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        s.write_all(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")?;
        let mut got = Vec::new();
        s.read_to_end(&mut got)?;
        Ok(got)
    })
    .join()
    .unwrap()
    .expect("client");

    let st = fe_thread.join().unwrap().expect("FE");
    let (segments, retransmits) = dp.join().unwrap().expect("DP");
    let mut want = HEAD.to_vec();
    want.extend_from_slice(&payload(SIZE));
    want.extend_from_slice(TAIL);
    assert_eq!(got.len(), want.len(), "head + payload + tail");
    assert!(
        got == want,
        "the client read exactly head, DP's payload, tail"
    );
    assert!(st.shifted > 0, "the FE's tail was shifted past DP's bytes");
    assert!(
        st.dp_acks > 0,
        "the client's ACKs for DP were seen on the FE"
    );
    eprintln!(
        "DP: {segments} segments, {retransmits} go-back-N rounds; FE: {} segments shifted, \
         {} ACKs for DP, {} kept from its stack",
        st.shifted, st.dp_acks, st.dropped
    );
    drop(net);
}
