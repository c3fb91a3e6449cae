//! DP's ACK tap: the client's ACKs for DP's bytes, cloned to DP's link by the FE's
//! `disc_ingress` ([`crate::bpf::NOTIFY_CLONE`]) with the link destination
//! [`crate::bpf::DP_ACK_MAC`], read here from a packet socket in the BE's namespace. The
//! address is no interface's, so the BE's IP stack drops the copies; only this socket, whose
//! classic BPF filter passes nothing else, sees them. Per ACK: no FE user-space work, no
//! control-line message, no TCP on either side (the FE's ack forwarder did all three).
//!
//! The same way, `disc_egress` clones the FE's segment carrying an answer's head to
//! [`crate::bpf::DP_START_MAC`] ([`crate::bpf::ConnState::start_id`]): DP's signal to start
//! that answer's payload right behind it (it replaced a `SEND` line per payload). A short
//! head is redirected instead, addressed to [`crate::bpf::DP_HEAD_MAC`]: DP then sends the
//! head's bytes in front of the payload.

use std::io;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::bpf::{DP_ACK_MAC, DP_HEAD_MAC, DP_START_MAC};

/// A packet socket receiving only frames addressed to [`DP_ACK_MAC`], [`DP_START_MAC`] or
/// [`DP_HEAD_MAC`].
pub struct AckTap {
    fd: OwnedFd,
}

/// A client ACK as DP reads it: the flow (client, FE), the cumulative ACK (client view)
/// and the raw window field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TapAck {
    pub client: SocketAddrV4,
    pub fe: SocketAddrV4,
    pub ack: u32,
    pub window: u16,
}

/// The FE's head segment cloned (or redirected) as a payload's start: the flow, where the
/// payload starts (client view: the byte after the head), the FE's ACK and raw window
/// fields to carry, the payload id and the client's window from the payload's start to its
/// right edge (raw: in the client's window scale); and, when the segment was redirected to
/// DP rather than cloned, the head's bytes, which DP sends in front of the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TapStart {
    pub client: SocketAddrV4,
    pub fe: SocketAddrV4,
    pub seq: u32,
    pub ack: u32,
    pub window: u16,
    pub id: u32,
    pub client_window: u16,
    pub head: Vec<u8>,
}

/// A frame the tap read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TapFrame {
    Ack(TapAck),
    Start(TapStart),
}

/// The tap's receive buffer, bytes.
const TAP_BUFFER: libc::c_int = 4 << 20;

/// Largest frame read (an Ethernet MTU; only the headers matter).
const FRAME: usize = 2048;

impl AckTap {
    /// Opens the tap on every interface of the calling thread's namespace (CAP_NET_RAW).
    pub fn open() -> io::Result<AckTap> {
        let fd = crate::gso::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK,
            i32::from((libc::ETH_P_IP as u16).to_be()),
        )?;
        let (a, s, h) = (DP_ACK_MAC, DP_START_MAC, DP_HEAD_MAC);
        debug_assert!(a[..4] == s[..4] && a[..4] == h[..4]);
        let word = u32::from_be_bytes([a[0], a[1], a[2], a[3]]);
        let low = |m: [u8; 6]| u32::from(u16::from_be_bytes([m[4], m[5]]));
        // ld [0]; jeq word → next else drop; ldh [4]; jeq ack, start or head → accept else
        // drop.
        let mut filter = [
            bpf_stmt(0x20, 0),          // BPF_LD | BPF_W | BPF_ABS
            bpf_jump(0x15, word, 0, 5), // BPF_JMP | BPF_JEQ | BPF_K
            bpf_stmt(0x28, 4),          // BPF_LD | BPF_H | BPF_ABS
            bpf_jump(0x15, low(a), 2, 0),
            bpf_jump(0x15, low(s), 1, 0),
            bpf_jump(0x15, low(h), 0, 1),
            bpf_stmt(0x06, FRAME as u32), // BPF_RET | BPF_K: accept
            bpf_stmt(0x06, 0),            // drop
        ];
        let prog = libc::sock_fprog {
            len: filter.len() as u16,
            filter: filter.as_mut_ptr(),
        };
        // SAFETY: SO_ATTACH_FILTER copies the program (`prog` and the array it points at,
        // both alive for the call); the length passed is the struct's.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                (&prog as *const libc::sock_fprog).cast(),
                std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // Room for a burst of ACKs while the BE's loop is busy: a dropped ACK can hold a
        // window-limited transfer until DP's retransmission timer (200 ms before a round
        // trip is measured, 20 ms at least after).
        // FORCE (root) may exceed rmem_max; if refused, the plain option is tried.
        for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
            let room: libc::c_int = TAP_BUFFER;
            if crate::sockopt::set(fd.as_raw_fd(), libc::SOL_SOCKET, opt, &room).is_ok() {
                break;
            }
        }
        // Frames queued before the filter was attached passed no filter: drop them.
        let tap = AckTap { fd };
        let mut buf = vec![0u8; FRAME];
        while tap.recv(&mut buf)?.is_some() {}
        Ok(tap)
    }

    /// One frame, if one is queued (the socket never blocks).
    fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: recv(2) writes at most buf.len() bytes into `buf`, alive for the call.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                io::ErrorKind::Interrupted => self.recv(buf),
                _ => Err(e),
            };
        }
        Ok(Some(n as usize))
    }

    /// The next frame queued, if any (frames that are neither are skipped).
    pub fn try_recv(&self) -> io::Result<Option<TapFrame>> {
        let mut buf = vec![0u8; FRAME];
        while let Some(n) = self.recv(&mut buf)? {
            if let Some(a) = parse(&buf[..n]) {
                return Ok(Some(a));
            }
        }
        Ok(None)
    }

    /// Frames the kernel dropped for want of room in the socket since the last call
    /// (PACKET_STATISTICS, which resets the counts).
    pub fn drops(&self) -> io::Result<u32> {
        // struct tpacket_stats { tp_packets, tp_drops }
        let [_, drops]: [u32; 2] = crate::sockopt::get(
            self.fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
        )?;
        Ok(drops)
    }

    /// Calls `on_frame` for every ACK and start the tap receives, until an error on the
    /// socket; says when the kernel dropped some (a lost ACK can hold a transfer until DP's
    /// timer, a lost start until the FE's watchdog sends it again).
    pub async fn run(self, mut on_frame: impl FnMut(TapFrame)) -> io::Result<()> {
        let mut buf = vec![0u8; FRAME];
        let mut since_check = 0u32;
        loop {
            while let Some(n) = self.recv(&mut buf)? {
                if let Some(f) = parse(&buf[..n]) {
                    on_frame(f);
                }
                since_check += 1;
            }
            if since_check >= 1024 {
                since_check = 0;
                match self.drops() {
                    Ok(0) => {}
                    Ok(d) => tracing::warn!("dp: the ACK tap dropped {d} frames (socket full)"),
                    Err(e) => tracing::debug!("dp: PACKET_STATISTICS: {e}"),
                }
            }
            iolab_runtime::wait_readable(self.fd.as_raw_fd()).await?;
        }
    }
}

/// The ACK or start in a frame the tap read (anything else: None).
pub fn parse(frame: &[u8]) -> Option<TapFrame> {
    let (seg, data, _) = crate::packet::parse(frame)?;
    if seg.flags & crate::packet::ACK == 0 {
        return None;
    }
    if seg.dst_mac == DP_ACK_MAC {
        return Some(TapFrame::Ack(TapAck {
            client: SocketAddrV4::new(seg.src, seg.sport),
            fe: SocketAddrV4::new(seg.dst, seg.dport),
            ack: seg.ack,
            window: seg.window,
        }));
    }
    let rides = seg.dst_mac == DP_HEAD_MAC;
    if !(rides || seg.dst_mac == DP_START_MAC) || data.is_empty() {
        return None;
    }
    let m = seg.src_mac;
    Some(TapFrame::Start(TapStart {
        client: SocketAddrV4::new(seg.dst, seg.dport),
        fe: SocketAddrV4::new(seg.src, seg.sport),
        seq: seg.seq.wrapping_add(data.len() as u32),
        ack: seg.ack,
        window: seg.window,
        id: u32::from_be_bytes([m[0], m[1], m[2], m[3]]),
        client_window: u16::from_be_bytes([m[4], m[5]]),
        head: if rides { data.to_vec() } else { Vec::new() },
    }))
}

fn bpf_stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn bpf_jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}
