//! A TCP connection continued on another socket (`TCP_REPAIR`, the way CRIU restores
//! connections): how DP sends a payload through the BE's own TCP stack (`--dp-send repair`,
//! crate::dp) instead of building segments on a packet socket.
//!
//! Invariant: a socket in repair mode puts nothing on the wire — `connect` sends no SYN and
//! `close` no FIN or RST — so a connection can be frozen on one socket, its state read
//! ([`freeze`]), and continued on a new one with the same four-tuple ([`restore`]), the peer
//! seeing one stream. Both need CAP_NET_ADMIN in the socket's network namespace.

use std::io;
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::sockopt::{self, get_bytes, set, Plain};
use anyhow::Context;

/// `TCP_REPAIR_QUEUE` selectors (include/uapi/linux/tcp.h).
const TCP_RECV_QUEUE: libc::c_int = 1;
const TCP_SEND_QUEUE: libc::c_int = 2;
/// `TCP_REPAIR_OPTIONS` codes: the TCP option kinds.
const TCPOPT_MAXSEG: u32 = 2;
const TCPOPT_WINDOW: u32 = 3;
const TCPOPT_SACK_PERM: u32 = 4;
const TCPOPT_TIMESTAMP: u32 = 8;
/// `tcpi_options` bits.
const TCPI_OPT_TIMESTAMPS: u8 = 1;
const TCPI_OPT_SACK: u8 = 2;
const TCPI_OPT_WSCALE: u8 = 4;

/// `struct tcp_repair_window`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RepairWindow {
    pub snd_wl1: u32,
    pub snd_wnd: u32,
    pub max_window: u32,
    pub rcv_wnd: u32,
    pub rcv_wup: u32,
}

// SAFETY: five u32, no padding: any bytes are a valid value.
unsafe impl Plain for RepairWindow {}

/// What a new socket needs to continue a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpState {
    pub local: SocketAddrV4,
    pub peer: SocketAddrV4,
    /// Sequence number of the next byte this end sends.
    pub snd_seq: u32,
    /// Sequence number of the next byte expected from the peer.
    pub rcv_seq: u32,
    pub mss: u32,
    /// Window scales (`None`: not negotiated): the peer's (applied to its windows) and ours.
    pub wscale: Option<(u8, u8)>,
    pub sack: bool,
    /// The connection's timestamp clock now (`TCP_TIMESTAMP`), when timestamps are on.
    pub timestamp: Option<u32>,
    pub window: RepairWindow,
}

/// A TCP-level option set.
fn tcp<T: Plain + ?Sized>(fd: RawFd, name: libc::c_int, v: &T) -> io::Result<()> {
    set(fd, libc::IPPROTO_TCP, name, v)
}

/// A TCP-level option read.
fn get<T: Plain + Default>(fd: RawFd, name: libc::c_int) -> io::Result<T> {
    sockopt::get(fd, libc::IPPROTO_TCP, name)
}

/// The sequence number of a queue (send or receive) of a socket in repair mode: read, or
/// set to `to`.
fn queue_seq(fd: RawFd, queue: libc::c_int, to: Option<u32>) -> io::Result<u32> {
    tcp(fd, libc::TCP_REPAIR_QUEUE, &queue)?;
    match to {
        Some(seq) => tcp(fd, libc::TCP_QUEUE_SEQ, &seq).map(|()| seq),
        None => get(fd, libc::TCP_QUEUE_SEQ),
    }
}

fn v4(a: SocketAddr) -> io::Result<SocketAddrV4> {
    match a {
        SocketAddr::V4(a) => Ok(a),
        SocketAddr::V6(_) => Err(io::Error::other("TCP repair here handles IPv4 only")),
    }
}

/// Puts `s` in repair mode and reads its connection's state. `s` stays in repair mode: it
/// sends nothing more, and closing it drops the connection silently.
pub fn freeze(s: &TcpStream) -> io::Result<TcpState> {
    let fd = s.as_raw_fd();
    let (local, peer) = (v4(s.local_addr()?)?, v4(s.peer_addr()?)?);
    let mss: libc::c_int = get(fd, libc::TCP_MAXSEG)?;
    // struct tcp_info: tcpi_options is byte 5, the window scales the nibbles of byte 6.
    let mut info = [0u8; 8];
    get_bytes(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut info)?;
    let (options, scales) = (info[5], info[6]);
    tcp(fd, libc::TCP_REPAIR, &1 as &libc::c_int)?;
    let snd_seq = queue_seq(fd, TCP_SEND_QUEUE, None)?;
    let rcv_seq = queue_seq(fd, TCP_RECV_QUEUE, None)?;
    let window: RepairWindow = get(fd, libc::TCP_REPAIR_WINDOW)?;
    let timestamp = if options & TCPI_OPT_TIMESTAMPS != 0 {
        Some(get::<u32>(fd, libc::TCP_TIMESTAMP)?)
    } else {
        None
    };
    Ok(TcpState {
        local,
        peer,
        snd_seq,
        rcv_seq,
        mss: mss as u32,
        wscale: (options & TCPI_OPT_WSCALE != 0).then_some((scales & 0x0f, scales >> 4)),
        sack: options & TCPI_OPT_SACK != 0,
        timestamp,
        window,
    })
}

/// A new socket carrying on the connection `st` describes, out of repair mode: what it
/// sends continues the stream at `st.snd_seq`. Its local address must be one the kernel
/// lets it bind here (the connection's own address, or any with `IP_TRANSPARENT`).
pub fn restore(st: &TcpState) -> io::Result<TcpStream> {
    // SAFETY: socket(2) returns a new descriptor or -1.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor just returned to us and owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let s = TcpStream::from(fd);
    let fd = s.as_raw_fd();
    tcp(fd, libc::TCP_REPAIR, &1 as &libc::c_int)?;
    set(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, &1 as &libc::c_int)?;
    // Several connections of the FE's address and port continue here at once: once one is
    // out of repair mode, binding the next fails (EADDRINUSE) without SO_REUSEPORT (seen:
    // one wrk connection of 16 served, the others refused).
    set(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, &1 as &libc::c_int)?;
    // The MSS before connect too, so that the segment size connect works out comes from
    // the peer's MSS and not from the default clamp (TCP_REPAIR_OPTIONS sets the clamp after
    // it). The option takes at most 32,767 (MAX_TCP_WINDOW); loopback's MSS is larger.
    tcp(fd, libc::TCP_MAXSEG, &(st.mss.min(32_767) as libc::c_int))?;
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let local = sockopt::sockaddr_in(st.local);
    // SAFETY: bind reads `len` bytes of the sockaddr_in `local`, alive for the call.
    if unsafe { libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    queue_seq(fd, TCP_SEND_QUEUE, Some(st.snd_seq))?;
    queue_seq(fd, TCP_RECV_QUEUE, Some(st.rcv_seq))?;
    let peer = sockopt::sockaddr_in(st.peer);
    // In repair mode: no SYN, the socket is established at once.
    // SAFETY: connect reads `len` bytes of the sockaddr_in `peer`, alive for the call.
    if unsafe { libc::connect(fd, (&peer as *const libc::sockaddr_in).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut opts = vec![[TCPOPT_MAXSEG, st.mss]];
    if let Some((snd, rcv)) = st.wscale {
        opts.push([TCPOPT_WINDOW, u32::from(snd) | (u32::from(rcv) << 16)]);
    }
    if st.sack {
        opts.push([TCPOPT_SACK_PERM, 0]);
    }
    if st.timestamp.is_some() {
        opts.push([TCPOPT_TIMESTAMP, 0]);
    }
    // (struct tcp_repair_opt: (code, value) pairs of u32)
    tcp(fd, libc::TCP_REPAIR_OPTIONS, opts.as_slice())?;
    if let Some(ts) = st.timestamp {
        tcp(fd, libc::TCP_TIMESTAMP, &ts)?;
    }
    tcp(fd, libc::TCP_REPAIR_WINDOW, &st.window)?;
    // Out of repair mode without the window probe (a segment below the peer's window that
    // makes it answer with an ACK), where the kernel knows TCP_REPAIR_OFF_NO_WP.
    if tcp(fd, libc::TCP_REPAIR, &TCP_REPAIR_OFF_NO_WP).is_err() {
        tcp(fd, libc::TCP_REPAIR, &0 as &libc::c_int)?;
    }
    Ok(s)
}

/// `TCP_REPAIR_OFF_NO_WP` (include/uapi/linux/tcp.h).
const TCP_REPAIR_OFF_NO_WP: libc::c_int = -1;

/// Closes `s` without a FIN or RST: the connection goes on elsewhere (the FE's socket).
/// The connection leaves the socket tables at once (a disconnect, `connect` to AF_UNSPEC,
/// which in repair mode sends nothing), not at the descriptor's last close: a process
/// forking at that moment holds the descriptor until its `exec`, and the next payload's
/// socket on the same four-tuple failed to connect (EADDRNOTAVAIL, one chain test run in a
/// few, where test threads spawn curl beside DP).
pub fn close_silently(s: TcpStream) {
    let fd = s.as_raw_fd();
    let _ = tcp(fd, libc::TCP_REPAIR, &1 as &libc::c_int);
    // SAFETY: a zeroed sockaddr with family AF_UNSPEC, alive for the call.
    unsafe {
        let mut unspec: libc::sockaddr = std::mem::zeroed();
        unspec.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
        libc::connect(
            fd,
            &unspec,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        );
    }
    drop(s);
}

/// Bytes written on `s` its peer has not acknowledged yet (SIOCOUTQ: sent or not).
pub fn unacknowledged(s: &TcpStream) -> io::Result<u32> {
    let mut n: libc::c_int = 0;
    // SAFETY: ioctl(SIOCOUTQ = TIOCOUTQ) writes one int into `n`, alive for the call.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as u32)
}

/// One line of the socket's TCP_INFO for a stalled transfer's warning: what it waits for
/// (unacknowledged and lost segments, retransmissions, the timer's backoff, the congestion
/// window, the client's last window, how long since the last ACK it took).
pub fn stall_summary(s: &TcpStream) -> String {
    use libc::tcp_info as I;
    use std::mem::offset_of;
    // Read as bytes (a field past what the kernel returned reads as absent); tcpi_snd_wnd
    // is past libc's struct.
    let mut b = [0u8; 512];
    let len = match get_bytes(s.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, &mut b) {
        Ok(n) => n,
        Err(e) => return format!("TCP_INFO: {e}"),
    };
    let byte = |at: usize| (at < len).then(|| u32::from(b[at]));
    let word = |at: usize| crate::sockopt::u32_at(&b, len, at);
    let fields = [
        ("state", byte(offset_of!(I, tcpi_state))),
        ("retransmits", byte(offset_of!(I, tcpi_retransmits))),
        ("backoff", byte(offset_of!(I, tcpi_backoff))),
        ("rto_us", word(offset_of!(I, tcpi_rto))),
        ("unacked", word(offset_of!(I, tcpi_unacked))),
        ("lost", word(offset_of!(I, tcpi_lost))),
        ("retrans", word(offset_of!(I, tcpi_retrans))),
        ("total_retrans", word(offset_of!(I, tcpi_total_retrans))),
        ("cwnd", word(offset_of!(I, tcpi_snd_cwnd))),
        ("snd_wnd", word(crate::sockopt::TCPI_SND_WND)),
        ("last_ack_recv_ms", word(offset_of!(I, tcpi_last_ack_recv))),
    ];
    fields
        .iter()
        .map(|(name, v)| format!("{name} {}", v.map_or("-".to_string(), |v| v.to_string())))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a socket of the BE needs, besides the sequence numbers and windows of the moment, to
/// continue the FE's end of a connection (DP's `--dp-send repair`): the FE's window scale
/// (the shift of the windows it advertises), the MSS the client announced and whether SACK
/// was negotiated. The FE reads it once per connection and sends it in HELLO.
///
/// Not timestamps: DP's segments carry none, as the packet-socket paths' (Linux accepts
/// segments without the option on a connection that negotiated it; RFC 7323 lets it). To
/// carry them DP would need the FE's clock to the millisecond, and the kernel does not give
/// it: `TCP_TIMESTAMP` reads each connection's clock rounded to even (its low bit written
/// selects microsecond timestamps, Linux 6.7), and a clock 2 ms behind the FE's makes the
/// client drop DP's segments (PAWS), one 2 ms ahead the FE's next ones. Seen on the first
/// version: a payload after the first on a connection waited for the new socket's 1 s
/// retransmission timer (client `TcpExtPAWSEstab`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeEnd {
    pub rcv_wscale: Option<u8>,
    pub mss: u32,
    pub sack: bool,
}

impl FeEnd {
    /// The FE's end of the connection `s`.
    pub fn read(s: &impl AsRawFd) -> io::Result<FeEnd> {
        // struct tcp_info: tcpi_snd_mss is the u32 at byte 16.
        let fd = s.as_raw_fd();
        let mut info = [0u8; 24];
        if get_bytes(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut info)? < 20 {
            return Err(io::Error::other("TCP_INFO too short"));
        }
        let (options, scales) = (info[5], info[6]);
        let ts = options & TCPI_OPT_TIMESTAMPS != 0;
        let snd_mss = u32::from_ne_bytes([info[16], info[17], info[18], info[19]]);
        Ok(FeEnd {
            rcv_wscale: (options & TCPI_OPT_WSCALE != 0).then_some(scales >> 4),
            // The FE's MSS less the option bytes its segments carry (timestamps: 12).
            mss: snd_mss + if ts { 12 } else { 0 },
            sack: options & TCPI_OPT_SACK != 0,
        })
    }

    /// As HELLO carries it: `<window scale|-> <mss> <sack 0|1>`.
    pub fn fields(&self) -> String {
        let ws = self.rcv_wscale.map_or("-".to_string(), |v| v.to_string());
        format!("{ws} {} {}", self.mss, u8::from(self.sack))
    }

    /// [`FeEnd::fields`] read back; None if any is missing or out of range.
    pub fn parse<'a>(w: &mut impl Iterator<Item = &'a str>) -> Option<FeEnd> {
        let rcv_wscale = match w.next()? {
            "-" => None,
            n => Some(n.parse::<u8>().ok().filter(|s| *s <= 14)?),
        };
        let mss = w
            .next()?
            .parse::<u32>()
            .ok()
            .filter(|m| (64..=65535).contains(m))?;
        let sack = match w.next()? {
            "0" => false,
            "1" => true,
            _ => return None,
        };
        Some(FeEnd {
            rcv_wscale,
            mss,
            sack,
        })
    }
}

/// Initial congestion window (segments) of the route from DP's namespace to the client with
/// `--dp-send repair`: a new socket continues a connection whose window the FE's traffic
/// has opened (Linux offers no way to hand a congestion window over; a route's `initcwnd`
/// is how deployments set a sender's first flight). 64 segments: a 64 KiB payload at once.
pub const INITCWND: u32 = 64;

/// Sets up DP's namespace `ns` (None: this process's, as in `iolab disc dp-setup`, which a
/// bench starts inside DP's namespace) for `--dp-send repair`: the FE's client-facing
/// address `fe` on `lo` (the client's ACKs the FE's hooks clone to DP are addressed to it,
/// and DP's sockets bind it), reverse-path filtering off (those ACKs arrive on the FE's link
/// `fe_link`, the route to the client is another) and the route to the client's network
/// `client_net` through `via` with [`INITCWND`]. Returns the commands it ran, for the record.
pub fn dp_namespace_setup(
    ns: Option<&iolab_netns::Namespace>,
    fe: std::net::Ipv4Addr,
    client_net: &str,
    via: std::net::Ipv4Addr,
    fe_link: &str,
) -> anyhow::Result<Vec<String>> {
    run_dp_setup(fe, client_net, via, fe_link, |program, args| {
        if let Some(ns) = ns {
            return ns.run(program, args).map(drop);
        }
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .with_context(|| format!("running {program}"))?;
        anyhow::ensure!(
            out.status.success(),
            "{program} {}: {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    })
}

fn run_dp_setup(
    fe: std::net::Ipv4Addr,
    client_net: &str,
    via: std::net::Ipv4Addr,
    fe_link: &str,
    run: impl Fn(&str, &[&str]) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<String>> {
    let (addr, rp, via, cwnd) = (
        format!("{fe}/32"),
        format!("net.ipv4.conf.{fe_link}.rp_filter=0"),
        via.to_string(),
        INITCWND.to_string(),
    );
    let commands: [(&str, &[&str]); 5] = [
        ("ip", &["link", "set", "lo", "up"]),
        ("ip", &["addr", "add", &addr, "dev", "lo"]),
        ("sysctl", &["-q", "-w", "net.ipv4.conf.all.rp_filter=0"]),
        ("sysctl", &["-q", "-w", &rp]),
        (
            "ip",
            &[
                "route", "replace", client_net, "via", &via, "initcwnd", &cwnd,
            ],
        ),
    ];
    let mut ran = Vec::new();
    for (program, args) in commands {
        run(program, args)?;
        ran.push(format!("{program} {}", args.join(" ")));
    }
    Ok(ran)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_summary_reads_the_sockets_state() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut a, _) = l.accept().unwrap();
        std::io::Write::write_all(&mut a, b"x").unwrap();
        let line = stall_summary(&c);
        // TCP_ESTABLISHED is 1; nothing sent, so nothing unacknowledged or lost
        assert!(line.starts_with("state 1, "), "{line}");
        assert!(line.contains("unacked 0, lost 0,"), "{line}");
        assert!(!line.contains(" -"), "every field read: {line}");
    }

    #[test]
    fn the_fe_end_goes_through_hello_and_bad_fields_are_refused() {
        for end in [
            FeEnd {
                rcv_wscale: Some(7),
                mss: 1460,
                sack: true,
            },
            FeEnd {
                rcv_wscale: None,
                mss: 536,
                sack: false,
            },
        ] {
            let text = end.fields();
            assert_eq!(FeEnd::parse(&mut text.split_ascii_whitespace()), Some(end));
        }
        for bad in [
            "",
            "7",
            "7 1460",
            "15 1460 1",
            "7 10 1",
            "7 70000 1",
            "7 1460 2",
            "x 1460 1",
        ] {
            assert_eq!(
                FeEnd::parse(&mut bad.split_ascii_whitespace()),
                None,
                "{bad:?}"
            );
        }
    }
}
