//! DP's AF_XDP path (`--dp-send xdp`): DP writes each segment, headers and payload, straight
//! into a frame of a memory area it shares with the kernel (the UMEM) and hands the frames
//! over through a ring; one system call (`sendto`, the "kick") sends a burst of up to 32.
//! The seed's DP used AF_XDP this way.
//!
//! An interface's queue takes one AF_XDP socket (a second bind fails, `EBUSY`), so the
//! socket belongs to the thread and the interface ([`XdpLink::open`]), shared by every
//! transfer DP's loop sends there; each link adds the neighbour's addresses.
//!
//! On a veth there is no zero-copy driver, so the socket runs in copy mode (`XDP_COPY`): the
//! kernel copies each frame into an skb and gives it to the device directly (no qdisc, no
//! IP output, no routing). What it cannot do is what GSO does: every segment is its own skb
//! all the way into the client's TCP receive. The TCP checksum is left to the kernel where
//! it takes AF_XDP's TX metadata (Linux 6.11+ in copy mode: each frame asks for checksum
//! offload, the skb goes out CHECKSUM_PARTIAL as the GSO path's do); elsewhere it is
//! computed here, as the raw socket's is. The frame is free again once the kernel reports
//! it on the completion ring (it has been copied by then).
//!
//! Invariants of the unsafe code (all in this module):
//! - the UMEM (an `iolab_sys::AnonMap`) and the three ring mappings live as long as the
//!   socket value; the kernel pinned the UMEM's pages at registration and holds them until
//!   the socket is released, so the order in which the fields' drops unmap our views and
//!   close the socket does not matter;
//! - ring indices (`producer`, `consumer`) are free-running u32 counters in shared memory,
//!   read and written as atomics: we produce on the TX and fill rings and consume on the
//!   completion ring, the kernel the other way round; a slot is written before the producer
//!   index that publishes it (release), and read after the index that published it
//!   (acquire);
//! - a frame is in exactly one place: `free` (by its start), a TX descriptor not yet
//!   completed or the completion ring (by its packet's address, `DATA_OFF` into it); so no
//!   frame is written while the kernel may read it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::gso::Neighbour;
use crate::packet::{self, HDRS_LEN, TCP_OFF};
use crate::sender::{Emit, Flow, Pieces};

/// Bytes per UMEM frame (aligned mode: a power of two from 2048 to the page size). Holds
/// the TX metadata, then a 1,500-byte IP packet and its Ethernet header.
const FRAME: usize = 2048;
/// Where the packet starts in its frame; the TX metadata (`struct xsk_tx_metadata`) sits
/// right before it.
const DATA_OFF: usize = 64;
/// `sizeof(struct xsk_tx_metadata)`: flags (u64), then csum_start and csum_offset (u16
/// each) and launch_time (u64, aligned).
const META_LEN: usize = 24;
/// Largest payload per frame.
const MAX_SEG: usize = FRAME - DATA_OFF - HDRS_LEN;
/// Frames in the UMEM; the TX and completion rings have as many slots (a power of two).
const FRAMES: usize = 512;
/// The fill ring feeds received frames; this socket receives nothing, but a UMEM needs one.
const FILL_SLOTS: u32 = 16;
/// Segments per kick: what the kernel's copy mode sends per `sendto` (its TX_BATCH_SIZE).
pub const MAX_BURST_SEGMENTS: usize = 32;
/// Kicks per burst at most: a kick stops early when the device is busy (`EAGAIN`,
/// `EBUSY`); what is left goes out with the next kick.
const KICKS: usize = 4;

/// One ring mapping: its indices and its slots.
struct Ring {
    map: *mut libc::c_void,
    map_len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    slots: *mut u8,
    size: u32,
}

impl Ring {
    /// Maps ring `pgoff` of `fd` with `size` slots of `slot` bytes, at the offsets the kernel
    /// gave.
    fn map(
        fd: &OwnedFd,
        off: &libc::xdp_ring_offset,
        pgoff: libc::off_t,
        size: u32,
        slot: usize,
    ) -> io::Result<Ring> {
        let map_len = off.desc as usize + size as usize * slot;
        // SAFETY: a shared mapping of the socket's ring, of the length the kernel's offsets
        // and our slot count imply; checked.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                pgoff,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let at = |o: u64| (map as usize + o as usize) as *mut u8;
        Ok(Ring {
            map,
            map_len,
            producer: at(off.producer).cast(),
            consumer: at(off.consumer).cast(),
            slots: at(off.desc),
            size,
        })
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: a u32 index in the ring mapping, alive while `self` is; the kernel
        // accesses it atomically too.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { &*self.consumer }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// An AF_XDP socket sending on one interface (queue 0).
pub struct XdpSocket {
    fd: OwnedFd,
    tx: Ring,
    completion: Ring,
    _fill: Ring,
    umem: iolab_sys::AnonMap,
    /// Frame addresses (offsets in the UMEM) we may write.
    free: Vec<u64>,
    /// The kernel finishes the TCP checksum (TX metadata).
    offload: bool,
}

fn setsockopt<T>(fd: &OwnedFd, opt: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` is a plain value of the size we pass, alive for the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            opt,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl XdpSocket {
    /// Needs CAP_NET_RAW (and CAP_IPC_LOCK or enough locked-memory limit for the 1 MiB
    /// UMEM) in the calling thread's network namespace. Fails on a kernel without
    /// `CONFIG_XDP_SOCKETS` (`EAFNOSUPPORT`).
    pub fn new(ifindex: i32) -> io::Result<XdpSocket> {
        let fd = crate::gso::socket(libc::AF_XDP, libc::SOCK_RAW, 0)?;
        // Unmapped when the socket value is dropped (or on an error below, with it).
        let umem = iolab_sys::AnonMap::new(FRAMES * FRAME, true)?;
        let mut reg = libc::xdp_umem_reg {
            addr: umem.as_ptr() as u64,
            len: (FRAMES * FRAME) as u64,
            chunk_size: FRAME as u32,
            headroom: 0,
            flags: libc::XDP_UMEM_TX_METADATA_LEN,
            tx_metadata_len: META_LEN as u32,
        };
        // A kernel without TX metadata refuses the flag: checksums in software then.
        let offload = match setsockopt(&fd, libc::XDP_UMEM_REG, &reg) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                (reg.flags, reg.tx_metadata_len) = (0, 0);
                setsockopt(&fd, libc::XDP_UMEM_REG, &reg)?;
                false
            }
            Err(e) => return Err(e),
        };
        let rings = (|| {
            setsockopt(&fd, libc::XDP_UMEM_FILL_RING, &FILL_SLOTS)?;
            setsockopt(&fd, libc::XDP_UMEM_COMPLETION_RING, &(FRAMES as u32))?;
            setsockopt(&fd, libc::XDP_TX_RING, &(FRAMES as u32))?;
            // SAFETY: an all-zero xdp_mmap_offsets is a valid value of this plain C struct.
            let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
            // SAFETY: getsockopt writes at most `len` bytes into `off`, alive for the call.
            let r = unsafe {
                libc::getsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_XDP,
                    libc::XDP_MMAP_OFFSETS,
                    (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                    &mut len,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            if len as usize != std::mem::size_of::<libc::xdp_mmap_offsets>() {
                return Err(io::Error::other("AF_XDP: an old kernel's ring offsets"));
            }
            let desc = std::mem::size_of::<libc::xdp_desc>();
            let tx = Ring::map(&fd, &off.tx, libc::XDP_PGOFF_TX_RING, FRAMES as u32, desc)?;
            let completion = Ring::map(
                &fd,
                &off.cr,
                libc::XDP_UMEM_PGOFF_COMPLETION_RING as libc::off_t,
                FRAMES as u32,
                8,
            )?;
            let fill = Ring::map(
                &fd,
                &off.fr,
                libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t,
                FILL_SLOTS,
                8,
            )?;
            Ok((tx, completion, fill))
        })();
        let (tx, completion, fill) = rings?;
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: libc::XDP_COPY,
            sxdp_ifindex: ifindex as u32,
            sxdp_queue_id: 0,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: bind reads a valid sockaddr_xdp of the given size.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_xdp).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(XdpSocket {
            fd,
            tx,
            completion,
            _fill: fill,
            umem,
            free: (0..FRAMES as u64).map(|i| i * FRAME as u64).collect(),
            offload,
        })
    }

    /// Takes back the frames the kernel is done with.
    fn reclaim(&mut self) {
        let c = &self.completion;
        let head = c.consumer().load(Ordering::Relaxed);
        let tail = c.producer().load(Ordering::Acquire);
        for i in head..tail {
            let slot = (i & (c.size - 1)) as usize;
            // SAFETY: slot < size: an 8-byte entry of the completion ring, published by the
            // kernel's producer index (acquire above).
            let addr = unsafe { (c.slots as *const u64).add(slot).read() };
            // the descriptor's address, DATA_OFF into its frame
            self.free.push(addr & !(FRAME as u64 - 1));
        }
        c.consumer().store(tail, Ordering::Release);
    }

    /// Asks the kernel to send what the TX ring holds.
    fn kick(&self) -> io::Result<()> {
        for _ in 0..KICKS {
            // SAFETY: sendto with no buffer and no address: the AF_XDP "send the ring" call.
            let r = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            let pending = self.tx.producer().load(Ordering::Relaxed)
                != self.tx.consumer().load(Ordering::Acquire);
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS) => {}
                    _ => return Err(e),
                }
            }
            if !pending {
                return Ok(());
            }
        }
        // Left in the ring: the next kick sends them.
        Ok(())
    }
}

/// A thread's socket on one interface, or the errno that refused it (not tried again: each
/// try maps and pins a UMEM).
type Opened = Result<Rc<RefCell<XdpSocket>>, i32>;

thread_local! {
    /// This thread's sockets by interface index.
    static SOCKETS: RefCell<HashMap<i32, Opened>> = RefCell::new(HashMap::new());
}

/// Sending to one neighbour through the thread's socket on its interface.
pub struct XdpLink {
    sock: Rc<RefCell<XdpSocket>>,
    to: Neighbour,
}

impl XdpLink {
    /// The thread's socket on `to`'s interface, opened on first use.
    pub fn open(to: Neighbour) -> io::Result<XdpLink> {
        let sock = SOCKETS.with(|m| {
            let mut m = m.borrow_mut();
            let got = m
                .entry(to.ifindex)
                .or_insert_with(|| match XdpSocket::new(to.ifindex) {
                    Ok(s) => Ok(Rc::new(RefCell::new(s))),
                    Err(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
                });
            got.clone().map_err(io::Error::from_raw_os_error)
        })?;
        Ok(XdpLink { sock, to })
    }

    /// Whether the kernel finishes the TCP checksums.
    pub fn offloads_checksums(&self) -> bool {
        self.sock.borrow().offload
    }
}

impl Emit for XdpLink {
    fn burst(&self, mss: usize) -> usize {
        mss.clamp(1, MAX_SEG) * MAX_BURST_SEGMENTS
    }

    fn emit(&mut self, flow: &Flow, seq: u32, data: Pieces<'_>, flags: u8) -> io::Result<()> {
        self.sock
            .borrow_mut()
            .emit(&self.to, flow, seq, data, flags)
    }
}

impl XdpSocket {
    fn emit(
        &mut self,
        hop: &Neighbour,
        flow: &Flow,
        seq: u32,
        data: Pieces<'_>,
        flags: u8,
    ) -> io::Result<()> {
        let mss = flow.mss.clamp(1, MAX_SEG);
        let len = crate::sender::pieces_len(data);
        let n = len.div_ceil(mss).max(1);
        if n > MAX_BURST_SEGMENTS {
            return Err(io::Error::other("AF_XDP: burst over 32 segments"));
        }
        if self.free.len() < n {
            self.reclaim();
        }
        let tail = self.tx.producer().load(Ordering::Relaxed);
        let head = self.tx.consumer().load(Ordering::Acquire);
        if self.free.len() < n || (self.tx.size - tail.wrapping_sub(head)) < n as u32 {
            // Frames or ring slots all in flight: the rest goes with the next ACK or tick.
            let _ = self.kick();
            return Err(io::ErrorKind::WouldBlock.into());
        }
        for k in 0..n {
            let (from, to) = (k * mss, ((k + 1) * mss).min(len));
            let last = k + 1 == n;
            let seg_flags = if last { flags } else { flags & !packet::PSH };
            let s = flow.segment(
                seq.wrapping_add(from as u32),
                seg_flags,
                hop.src_mac,
                hop.dst_mac,
            );
            let chunk = self.free.pop().expect("counted above");
            // SAFETY: `chunk` is a free frame (not in the kernel's hands: see the module's
            // invariants) of FRAME bytes inside the UMEM, and DATA_OFF + HDRS_LEN + mss <=
            // FRAME.
            let frame = unsafe {
                std::slice::from_raw_parts_mut(
                    self.umem.as_ptr().add(chunk as usize),
                    DATA_OFF + HDRS_LEN + (to - from),
                )
            };
            let (meta, packet) = frame.split_at_mut(DATA_OFF);
            write_segment(packet, &s, data, from, to, self.offload);
            if self.offload {
                write_checksum_request(&mut meta[DATA_OFF - META_LEN..]);
            }
            let slot = (tail.wrapping_add(k as u32) & (self.tx.size - 1)) as usize;
            let desc = libc::xdp_desc {
                addr: chunk + DATA_OFF as u64,
                len: packet.len() as u32,
                options: if self.offload {
                    libc::XDP_TX_METADATA
                } else {
                    0
                },
            };
            // SAFETY: slot < size: a descriptor of the TX ring that the kernel has consumed
            // (free slots counted above) and reads only once the producer index covers it.
            unsafe { (self.tx.slots as *mut libc::xdp_desc).add(slot).write(desc) };
        }
        self.tx
            .producer()
            .store(tail.wrapping_add(n as u32), Ordering::Release);
        self.kick()
    }
}

/// The TX metadata in front of a packet: finish the TCP checksum (its field holds the
/// pseudo-header's sum, see [`packet::headers_offloaded`]).
fn write_checksum_request(meta: &mut [u8]) {
    meta[..META_LEN].fill(0);
    meta[..8].copy_from_slice(&u64::from(libc::XDP_TXMD_FLAGS_CHECKSUM).to_ne_bytes());
    meta[8..10].copy_from_slice(&(TCP_OFF as u16).to_ne_bytes()); // csum_start
    meta[10..12].copy_from_slice(&16u16.to_ne_bytes()); // csum_offset: TCP's check field
}

/// One frame in `frame`: headers for `s` and bytes [from, to) of `data`; the TCP checksum
/// left to the kernel (`offload`) or computed.
fn write_segment(
    frame: &mut [u8],
    s: &packet::Segment,
    data: Pieces<'_>,
    from: usize,
    to: usize,
    offload: bool,
) {
    let h = packet::headers_offloaded(s, to - from);
    frame[..HDRS_LEN].copy_from_slice(&h);
    let mut at = HDRS_LEN;
    let mut off = 0;
    for piece in data {
        let (a, b) = (from.max(off), to.min(off + piece.len()));
        if a < b {
            frame[at..at + (b - a)].copy_from_slice(&piece[a - off..b - off]);
            at += b - a;
        }
        off += piece.len();
    }
    if offload {
        return;
    }
    frame[TCP_OFF + 16..TCP_OFF + 18].fill(0);
    let c = packet::tcp_checksum(s.src, s.dst, &frame[TCP_OFF..]);
    frame[TCP_OFF + 16..TCP_OFF + 18].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_spanning_both_pieces_is_one_valid_frame() {
        let flow = Flow {
            fe: "10.0.0.2:80".parse().unwrap(),
            client: "10.0.0.1:4000".parse().unwrap(),
            seq: 1000,
            ack: 7,
            window: 512,
            mss: 1400,
        };
        let (head, body): (Vec<u8>, Vec<u8>) =
            ((0..100).collect(), (0..3000u32).map(|i| i as u8).collect());
        let data: Pieces<'_> = [&head, &body];
        let joined = [head.clone(), body.clone()].concat();
        // the second segment: bytes 1400..2800, all from the body
        for (from, to) in [(0, 1400), (1400, 2800), (2800, 3100)] {
            let s = flow.segment(1000 + from as u32, packet::ACK, [1; 6], [2; 6]);
            let mut f = vec![0u8; HDRS_LEN + to - from];
            write_segment(&mut f, &s, data, from, to, true);
            let h = packet::headers_offloaded(&s, to - from);
            assert_eq!(f[..HDRS_LEN], h, "offloaded: the headers as the GSO path's");
            write_segment(&mut f, &s, data, from, to, false);
            let (got, payload, ok) = packet::parse(&f).expect("a frame");
            assert!(ok, "both checksums right ({from}..{to})");
            assert_eq!(got.seq, 1000 + from as u32);
            assert_eq!(payload, &joined[from..to]);
            assert_eq!(
                f,
                packet::frame(&s, &joined[from..to]),
                "as the raw path builds it"
            );
        }
    }
}
