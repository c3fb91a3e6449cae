//! DP's fast path: a packet socket (`AF_PACKET`) with `PACKET_VNET_HDR`, so that one send
//! carries up to 64 KiB of payload as one GSO burst: the kernel cuts it into MSS-sized
//! segments (in software, or not at all on a veth, whose peer takes the burst whole as a
//! receiving NIC's GRO would) and finishes the TCP checksum. This is how tap and virtio
//! devices hand TSO work to the kernel. Against the raw socket (one `sendto`, one trip
//! through IP output and one through the client's TCP receive per 1,400 bytes) it saves
//! the per-segment costs, most of which were charged to DP's own CPU.
//!
//! A packet socket bypasses routing and neighbour resolution, so [`Neighbour::resolve`]
//! reads them from the calling thread's network namespace (`/proc/thread-self/net/route`
//! and `arp`). When the next hop is not resolved yet, there is no fast path for that
//! transfer: DP uses its raw socket, whose first packet makes the kernel resolve it.

use std::cell::RefCell;
use std::ffi::CString;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;

use crate::packet::{self, HDRS_LEN, TCP_OFF};
use crate::sender::{Emit, Flow, Pieces};

/// `struct virtio_net_hdr` (legacy layout, host byte order: what packet sockets read).
const VNET_HDR_LEN: usize = 10;
const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
const VIRTIO_NET_HDR_GSO_NONE: u8 = 0;
const VIRTIO_NET_HDR_GSO_TCPV4: u8 = 1;
/// Largest IPv4 packet: a burst's IP total length must fit its 16-bit field.
const MAX_IP_PACKET: usize = 65_535;
/// Segments per burst at most. Measured (`tiers bench --disc`, 64 KiB and 1 MiB, wrk -c16):
/// bursts of the whole unscaled window (46 segments of 1,400 B) gave the same req/s as
/// 8, 24 or 32 segments but a p99 of 190-207 ms (RTO-long stalls) against 13-39 ms. The
/// stalls were DP's first window overshooting the client's right edge (fixed 27 Nov: the
/// whole last burst was dropped); since, 46 segments give a 64 KiB p99 of 4.6-5.5 ms
/// against 2.0-2.4 with 32.
pub const MAX_BURST_SEGMENTS: usize = 32;

/// Where a packet for a destination leaves: the interface and both link addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    pub ifname: String,
    pub ifindex: i32,
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    /// The destination itself is the next hop (no router between).
    pub on_link: bool,
}

impl Neighbour {
    /// The route to `dst` and its next hop's link address in the calling thread's network
    /// namespace; Ok(None) when there is no route or the next hop is not resolved (yet).
    pub fn resolve(dst: Ipv4Addr) -> io::Result<Option<Neighbour>> {
        let routes = std::fs::read_to_string("/proc/thread-self/net/route")?;
        let Some((ifname, hop)) = route_lookup(&routes, dst) else {
            return Ok(None);
        };
        let arp = std::fs::read_to_string("/proc/thread-self/net/arp")?;
        let Some(dst_mac) = arp_lookup(&arp, hop, &ifname) else {
            return Ok(None);
        };
        let name = CString::new(ifname.clone()).map_err(io::Error::other)?;
        // SAFETY: if_nametoindex reads a NUL-terminated string alive for the call.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Some(Neighbour {
            src_mac: hw_addr(&ifname)?,
            ifname,
            ifindex: ifindex as i32,
            dst_mac,
            on_link: hop == dst,
        }))
    }
}

/// Longest-prefix match in `/proc/net/route`'s text: (interface, next hop).
pub fn route_lookup(text: &str, dst: Ipv4Addr) -> Option<(String, Ipv4Addr)> {
    // Addresses are printed as the network-order word read in host order (%08X).
    let addr = |h: &str| u32::from_str_radix(h, 16).ok().map(|v| v.to_le_bytes());
    let d = dst.octets();
    let mut best: Option<(u32, String, Ipv4Addr)> = None;
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let (Some(net), Some(gw), Some(mask)) = (addr(f[1]), addr(f[2]), addr(f[7])) else {
            continue;
        };
        let flags = u32::from_str_radix(f[3], 16).unwrap_or(0);
        if flags & 1 == 0 {
            continue; // RTF_UP
        }
        if (0..4).any(|i| d[i] & mask[i] != net[i]) {
            continue;
        }
        let bits = u32::from_be_bytes(mask).count_ones();
        if best.as_ref().is_some_and(|b| b.0 >= bits) {
            continue;
        }
        let hop = if flags & 2 != 0 {
            Ipv4Addr::from(gw) // RTF_GATEWAY
        } else {
            dst
        };
        best = Some((bits, f[0].to_string(), hop));
    }
    best.map(|(_, i, h)| (i, h))
}

/// `ip`'s link address on `ifname` in `/proc/net/arp`'s text, if complete.
pub fn arp_lookup(text: &str, ip: Ipv4Addr, ifname: &str) -> Option<[u8; 6]> {
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[5] != ifname || f[0].parse::<Ipv4Addr>().ok() != Some(ip) {
            continue;
        }
        let flags = u32::from_str_radix(f[2].trim_start_matches("0x"), 16).unwrap_or(0);
        if flags & 2 == 0 {
            continue; // ATF_COM: not resolved
        }
        let mut mac = [0u8; 6];
        let mut parts = f[3].split(':');
        for b in &mut mac {
            *b = u8::from_str_radix(parts.next()?, 16).ok()?;
        }
        if parts.next().is_some() || mac == [0; 6] {
            return None;
        }
        return Some(mac);
    }
    None
}

/// The interface's own link address (SIOCGIFHWADDR).
fn hw_addr(ifname: &str) -> io::Result<[u8; 6]> {
    let fd = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    // SAFETY: an all-zero ifreq is a valid value of this plain C struct.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = ifname.as_bytes();
    if name.len() >= req.ifr_name.len() {
        return Err(io::Error::other(format!(
            "interface name too long: {ifname}"
        )));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCGIFHWADDR reads the name and writes the address into `req`, alive for
    // the call.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after SIOCGIFHWADDR the union holds the hardware address.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(sa.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok(mac)
}

pub(crate) fn socket(
    domain: libc::c_int,
    ty: libc::c_int,
    proto: libc::c_int,
) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with plain integer arguments; the result is checked.
    let fd = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The virtio_net_hdr for a burst of `payload_len` bytes in segments of `mss`.
fn vnet_hdr(payload_len: usize, mss: usize) -> [u8; VNET_HDR_LEN] {
    let gso = if payload_len > mss {
        VIRTIO_NET_HDR_GSO_TCPV4
    } else {
        VIRTIO_NET_HDR_GSO_NONE
    };
    let mut h = [0u8; VNET_HDR_LEN];
    h[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM;
    h[1] = gso;
    h[2..4].copy_from_slice(&(HDRS_LEN as u16).to_ne_bytes()); // hdr_len
    h[4..6].copy_from_slice(&(mss as u16).to_ne_bytes()); // gso_size
    h[6..8].copy_from_slice(&(TCP_OFF as u16).to_ne_bytes()); // csum_start
    h[8..10].copy_from_slice(&16u16.to_ne_bytes()); // csum_offset: TCP's check field
    h
}

/// Sends GSO bursts on one interface to one neighbour.
pub struct GsoSocket {
    fd: Rc<OwnedFd>,
    to: Neighbour,
}

thread_local! {
    /// The packet socket every [`GsoSocket`] of this thread sends through, kept for the
    /// thread's life. Closing a packet socket waits for an RCU grace period
    /// (`packet_release` calls `synchronize_net`: 11-20 ms measured here), and DP closed
    /// one per control connection on the BE's loop, stalling every answer behind it: at
    /// 600 requests/s in an open loop, whose clients come and go, a 64 KiB p50 of 36 ms.
    /// The interface and the link address travel in each send's address, so one socket
    /// serves every neighbour. Kept with the network namespace it was made in (a thread
    /// that moved to another namespace makes another).
    static SHARED: RefCell<Option<(u64, Rc<OwnedFd>)>> = const { RefCell::new(None) };
}

/// The calling thread's network namespace (its inode number).
fn thread_netns() -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata("/proc/thread-self/ns/net")?.ino())
}

impl GsoSocket {
    /// Needs CAP_NET_RAW in the calling thread's network namespace (the socket is the
    /// thread's, made in the namespace of its first use). Protocol 0: the socket receives
    /// nothing, so nothing queues up on it.
    pub fn new(to: Neighbour) -> io::Result<GsoSocket> {
        let ns = thread_netns()?;
        let fd = SHARED.with(|s| -> io::Result<Rc<OwnedFd>> {
            let mut s = s.borrow_mut();
            match &*s {
                Some((n, fd)) if *n == ns => Ok(fd.clone()),
                _ => {
                    let fd = Rc::new(iolab_netns::delayline::vnet_packet_socket(0)?);
                    *s = Some((ns, fd.clone()));
                    Ok(fd)
                }
            }
        })?;
        Ok(GsoSocket { fd, to })
    }

    /// The descriptor bursts go out on.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

impl Emit for GsoSocket {
    fn burst(&self, mss: usize) -> usize {
        let mss = mss.clamp(1, MAX_IP_PACKET - 40);
        ((MAX_IP_PACKET - 40) / mss).min(MAX_BURST_SEGMENTS) * mss
    }

    /// A burst stays one packet on a veth (segmented only where it leaves for a NIC).
    fn packet(&self, mss: usize) -> usize {
        self.burst(mss)
    }

    fn emit(&mut self, flow: &Flow, seq: u32, data: Pieces<'_>, flags: u8) -> io::Result<()> {
        let len = crate::sender::pieces_len(data);
        if len > self.burst(flow.mss) {
            return Err(io::Error::other("burst over 64 KiB"));
        }
        let mut head = [0u8; VNET_HDR_LEN + HDRS_LEN];
        head[..VNET_HDR_LEN].copy_from_slice(&vnet_hdr(len, flow.mss));
        head[VNET_HDR_LEN..].copy_from_slice(&packet::headers_offloaded(
            &flow.segment(seq, flags, self.to.src_mac, self.to.dst_mac),
            len,
        ));
        // SAFETY: an all-zero sockaddr_ll is valid; the fields that matter are set below.
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_protocol = (libc::ETH_P_IP as u16).to_be();
        to.sll_ifindex = self.to.ifindex;
        to.sll_halen = 6;
        to.sll_addr[..6].copy_from_slice(&self.to.dst_mac);
        let mut iov = [
            libc::iovec {
                iov_base: head.as_mut_ptr().cast(),
                iov_len: head.len(),
            },
            libc::iovec {
                iov_base: data[0].as_ptr() as *mut libc::c_void,
                iov_len: data[0].len(),
            },
            libc::iovec {
                iov_base: data[1].as_ptr() as *mut libc::c_void,
                iov_len: data[1].len(),
            },
        ];
        // SAFETY: an all-zero msghdr is valid; it points at `to` and `iov`, alive for the
        // call, and sendmsg only reads through those pointers.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut to as *mut libc::sockaddr_ll).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len();
        // SAFETY: see above.
        let n = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTE: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0102A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
vb4\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
vb3\t8000000A\t00000000\t0001\t0\t0\t0\tE0FFFFFF\t0\t0\t0
vb5\t0000000A\t8100000A\t0003\t0\t0\t0\tE0FFFFFF\t0\t0\t0
down\t08080808\t00000000\t0000\t0\t0\t0\tFFFFFFFF\t0\t0\t0
";

    #[test]
    fn the_longest_prefix_wins_and_gateways_are_next_hops() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        // 10.0.0.5 is in 10.0.0.0/24 (vb4) and 10.0.0.0/27 via 10.0.0.129 (vb5): /27 wins.
        assert_eq!(
            route_lookup(ROUTE, ip("10.0.0.5")),
            Some(("vb5".into(), ip("10.0.0.129")))
        );
        // 10.0.0.130 is in 10.0.0.128/27, on link (no gateway): the destination itself.
        assert_eq!(
            route_lookup(ROUTE, ip("10.0.0.130")),
            Some(("vb3".into(), ip("10.0.0.130")))
        );
        assert_eq!(
            route_lookup(ROUTE, ip("10.0.0.200")),
            Some(("vb4".into(), ip("10.0.0.200")))
        );
        // The default route; a route that is down is never taken.
        assert_eq!(
            route_lookup(ROUTE, ip("8.8.8.8")),
            Some(("eth0".into(), ip("192.168.2.1")))
        );
        assert_eq!(route_lookup("", ip("8.8.8.8")), None);
        assert_eq!(route_lookup("header\ngarbage line\n", ip("8.8.8.8")), None);
    }

    #[test]
    fn only_complete_arp_entries_on_the_interface_count() {
        let arp = "IP address       HW type     Flags       HW address            Mask     Device
10.0.0.129       0x1         0x2         aa:bb:cc:00:11:22     *        vb5
10.0.0.130       0x1         0x0         00:00:00:00:00:00     *        vb3
10.0.0.131       0x1         0x2         aa:bb:cc:00:11:zz     *        vb3
";
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            arp_lookup(arp, ip("10.0.0.129"), "vb5"),
            Some([0xaa, 0xbb, 0xcc, 0, 0x11, 0x22])
        );
        assert_eq!(
            arp_lookup(arp, ip("10.0.0.129"), "vb3"),
            None,
            "other interface"
        );
        assert_eq!(arp_lookup(arp, ip("10.0.0.130"), "vb3"), None, "incomplete");
        assert_eq!(arp_lookup(arp, ip("10.0.0.131"), "vb3"), None, "malformed");
    }

    /// DP's loop never closes a packet socket (a close waits for an RCU grace period): every
    /// sender of a thread shares one, and it outlives them. Needs CAP_NET_RAW (root, as CI).
    #[test]
    fn senders_share_one_packet_socket_that_outlives_them() {
        let to = Neighbour {
            ifname: "lo".into(),
            ifindex: 1,
            src_mac: [0; 6],
            dst_mac: [0; 6],
            on_link: true,
        };
        let a = match GsoSocket::new(to.clone()) {
            Ok(a) => a,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                eprintln!("skipped: no CAP_NET_RAW ({e})");
                return;
            }
            Err(e) => panic!("packet socket: {e}"),
        };
        let b = GsoSocket::new(to.clone()).unwrap();
        let fd = a.raw_fd();
        assert_eq!(b.raw_fd(), fd, "two senders, two sockets");
        drop((a, b));
        // SAFETY: F_GETFD only reads the descriptor's flags.
        let open = unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0;
        assert!(open, "closed with its senders");
        assert_eq!(GsoSocket::new(to).unwrap().raw_fd(), fd);
    }

    #[test]
    fn bursts_fit_an_ip_packet_and_the_header_asks_for_tcp_segmentation() {
        let f = Flow {
            fe: "10.0.0.2:80".parse().unwrap(),
            client: "10.0.0.1:4000".parse().unwrap(),
            seq: 0,
            ack: 0,
            window: 0,
            mss: 1400,
        };
        let sock_burst = |mss: usize| ((MAX_IP_PACKET - 40) / mss).min(MAX_BURST_SEGMENTS) * mss;
        let burst = sock_burst(f.mss);
        assert_eq!(burst, 32 * 1400);
        // Large segments: bounded by the IP packet, in whole segments.
        assert_eq!(sock_burst(9000), 7 * 9000);
        assert!(sock_burst(65_000) + 40 <= MAX_IP_PACKET);
        let h = vnet_hdr(burst, f.mss);
        assert_eq!(h[0], VIRTIO_NET_HDR_F_NEEDS_CSUM);
        assert_eq!(h[1], VIRTIO_NET_HDR_GSO_TCPV4);
        assert_eq!(u16::from_ne_bytes([h[4], h[5]]), 1400);
        assert_eq!(u16::from_ne_bytes([h[6], h[7]]) as usize, TCP_OFF);
        // One segment's worth needs no segmentation, only the checksum.
        assert_eq!(vnet_hdr(1400, 1400)[1], VIRTIO_NET_HDR_GSO_NONE);
    }
}
