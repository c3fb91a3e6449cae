//! DP's AF_XDP sender on a real veth between two namespaces: every frame it hands the kernel
//! arrives once, whole, with right checksums, also when the frames are reused many times
//! over. Needs root (namespaces, AF_XDP); otherwise skips with one line (a failure under
//! CI=true).

mod common;

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use iolab_disc::gso::Neighbour;
use iolab_disc::packet::{headers_offloaded, parse, ACK, PSH};
use iolab_disc::sender::{Emit, Flow};
use iolab_disc::xdp::{XdpLink, XdpSocket, MAX_BURST_SEGMENTS};

fn mac_of(ns: &iolab_netns::Namespace, ifname: &str) -> String {
    let out = ns.run("ip", &["-o", "link", "show", ifname]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let at = text.find("link/ether ").expect("an Ethernet address") + "link/ether ".len();
    text[at..at + 17].to_string()
}

/// A packet socket on `ifname` of the calling thread's namespace, taking IPv4 frames.
fn capture(ifname: &str) -> OwnedFd {
    let proto = (libc::ETH_P_IP as u16).to_be();
    // SAFETY: socket(2) with constant arguments; checked.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto as i32) };
    assert!(
        fd >= 0,
        "packet socket: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a new descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(ifname).unwrap();
    // SAFETY: an all-zero sockaddr_ll is valid.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = proto;
    // SAFETY: if_nametoindex reads a NUL-terminated string alive for the call.
    sa.sll_ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) } as i32;
    // SAFETY: bind reads a valid sockaddr_ll; setsockopt reads an int.
    unsafe {
        assert_eq!(
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32
            ),
            0
        );
        let big: libc::c_int = 32 << 20;
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&big as *const libc::c_int).cast(),
            4,
        );
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 200_000,
        };
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
    }
    fd
}

#[test]
fn every_frame_arrives_once_whole_and_checksummed_as_frames_are_reused() {
    let why = (!common::is_root()).then_some("needs root (namespaces, AF_XDP)");
    if !common::can_run("the AF_XDP sender test", why) {
        return;
    }
    let mut net = iolab_netns::Net::new("xdp").unwrap();
    let (dp, client) = (net.namespace().unwrap(), net.namespace().unwrap());
    let (a, b) = net.veth(Some(&dp), Some(&client)).unwrap();
    let [x, y, z] = iolab_netns::free_subnet().unwrap();
    let (dp_ip, client_ip) = (Ipv4Addr::new(x, y, z, 1), Ipv4Addr::new(x, y, z, 2));
    a.add_addr(&format!("{dp_ip}/24")).unwrap();
    b.add_addr(&format!("{client_ip}/24")).unwrap();
    a.up().unwrap();
    b.up().unwrap();
    let client_mac = mac_of(&client, &b.name);
    dp.run(
        "ip",
        &[
            "neigh",
            "replace",
            &client_ip.to_string(),
            "lladdr",
            &client_mac,
            "dev",
            &a.name,
        ],
    )
    .unwrap();

    // The client's side: a capture of everything arriving on its end.
    let (bname, cns) = (b.name.clone(), client.name().to_string());
    let (tx_ready, rx_ready) = std::sync::mpsc::channel();
    const BURSTS: usize = 256; // 256 × 32 segments: each of the 512 frames used 16 times
    const MSS: usize = 1400;
    let total = BURSTS * MAX_BURST_SEGMENTS * MSS;
    let body: Vec<u8> = (0..total).map(|i| (i * 7 + i / 251) as u8).collect();
    let want = body.clone();
    let rx = iolab_disc::netns::spawn_in(Some(cns), "capture", move || {
        let fd = capture(&bname);
        tx_ready.send(()).unwrap();
        let mut got = vec![false; total.div_ceil(MSS)];
        let (mut frames, mut dups, mut offloaded) = (0usize, 0usize, 0usize);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = vec![0u8; 4096];
        let mut f = std::fs::File::from(fd);
        while got.iter().any(|g| !g) && Instant::now() < deadline {
            let Ok(n) = f.read(&mut buf) else { continue };
            let Some((s, payload, ok)) = parse(&buf[..n]) else {
                continue;
            };
            if s.sport != 8080 {
                continue; // not ours
            }
            // Checksums right, or (TX metadata: CHECKSUM_PARTIAL, finished by nobody on a
            // veth, trusted by the receiving stack) the TCP field holding the pseudo-header's
            // sum exactly as the GSO path's segments carry it.
            let partial = [&headers_offloaded(&s, payload.len())[..], payload].concat();
            assert!(
                ok || buf[..n] == partial[..],
                "checksums of the frame at seq {}",
                s.seq
            );
            offloaded += usize::from(!ok);
            let off = s.seq.wrapping_sub(5000) as usize;
            assert_eq!(off % MSS, 0);
            assert_eq!(
                payload,
                &want[off..(off + MSS).min(total)],
                "bytes at {off}"
            );
            let last = off + payload.len() == total;
            assert_eq!(s.flags & PSH != 0, last, "PSH on the last segment only");
            frames += 1;
            if std::mem::replace(&mut got[off / MSS], true) {
                dups += 1;
            }
        }
        anyhow::Ok((got.iter().filter(|g| **g).count(), frames, dups, offloaded))
    });
    rx_ready.recv().unwrap();

    let dns = dp.name().to_string();
    let tx = iolab_disc::netns::spawn_in(Some(dns), "dp", move || {
        let n = Neighbour::resolve(client_ip)?.expect("the static neighbour");
        let mut s = XdpLink::open(n.clone())?;
        assert!(
            s.offloads_checksums(),
            "Linux 6.11+ takes TX metadata in copy mode"
        );
        // the queue takes one socket: a second link on the interface shares it
        let e = XdpSocket::new(n.ifindex)
            .err()
            .expect("a second socket on the queue");
        assert_eq!(e.raw_os_error(), Some(libc::EBUSY), "{e}");
        let again = XdpLink::open(n)?;
        drop(again);
        let flow = Flow {
            fe: SocketAddrV4::new(dp_ip, 8080),
            client: SocketAddrV4::new(client_ip, 40000),
            seq: 5000,
            ack: 1,
            window: 1000,
            mss: MSS,
        };
        let burst = s.burst(MSS);
        assert_eq!(burst, MAX_BURST_SEGMENTS * MSS);
        let (mut at, mut blocked) = (0, 0);
        let t0 = Instant::now();
        while at < total {
            let end = (at + burst).min(total);
            let flags = if end == total { ACK | PSH } else { ACK };
            match s.emit(&flow, 5000 + at as u32, [&[], &body[at..end]], flags) {
                Ok(()) => at = end,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    blocked += 1;
                    assert!(
                        t0.elapsed() < Duration::from_secs(5),
                        "frames never completed"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e.into()),
            }
        }
        anyhow::Ok(blocked)
    });
    let blocked = tx.join().unwrap().unwrap();
    let (distinct, frames, dups, offloaded) = rx.join().unwrap().unwrap();
    eprintln!(
        "AF_XDP: {frames} frames received, {distinct} distinct, {offloaded} with the checksum \
         offloaded, {blocked} blocked emits"
    );
    assert_eq!(distinct, total / MSS, "every segment arrived");
    assert_eq!(dups, 0, "no segment twice");
    net.remove().unwrap();
}
