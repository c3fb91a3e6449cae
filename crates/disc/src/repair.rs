//! A TCP connection continued on another socket (`TCP_REPAIR`, the way CRIU restores
//! connections): the groundwork for DP sending a payload through the BE's own TCP stack with
//! `sendfile` instead of building segments on a packet socket (README, "What remains").
//! Not used by DP yet.
//!
//! Invariant: a socket in repair mode puts nothing on the wire — `connect` sends no SYN and
//! `close` no FIN or RST — so a connection can be frozen on one socket, its state read
//! ([`freeze`]), and continued on a new one with the same four-tuple ([`restore`]), the peer
//! seeing one stream. Both need CAP_NET_ADMIN in the socket's network namespace.

use std::io;
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::sockopt::{self, get_bytes, set, Plain};

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
    tcp(fd, libc::TCP_REPAIR, &0 as &libc::c_int)?;
    Ok(s)
}
