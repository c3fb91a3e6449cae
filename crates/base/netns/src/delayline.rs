//! A user-space stand-in for netem where the kernel has no `sch_netem` (this machine): a
//! forwarder between two interfaces of one namespace that holds every frame for a fixed
//! delay and lets a share of them through at once, so they overtake the held ones
//! (netem's `delay D reorder P%`). Frames are moved whole with their `virtio_net_hdr`
//! (`PACKET_VNET_HDR` on both sockets), so GSO bursts and checksum offload pass through
//! unchanged.
//!
//! Wiring: put a namespace between two others with two veth pairs, bring the middle ends
//! up without addresses, and start a line on them: the outer ends then see each other as
//! on one link (ARP included), one-way delay `delay` each way.

use std::collections::BinaryHeap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iolab_sys::cvt;

/// netem's `delay` and `reorder`, for both directions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LineParams {
    /// Every held frame goes out this long after it came in.
    pub delay: Duration,
    /// Percent of frames sent at once instead of held (they overtake the held ones).
    pub reorder_pct: f64,
    /// Seed of the choice of those frames.
    pub seed: u64,
}

/// Frames forwarded, and those of them sent at once (reordered).
#[derive(Debug, Default)]
pub struct LineCounts {
    pub forwarded: AtomicU64,
    pub reordered: AtomicU64,
}

/// A running line; stopped (threads joined) on [`DelayLine::stop`] or drop.
pub struct DelayLine {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<io::Result<()>>>,
    pub counts: Arc<LineCounts>,
}

/// Largest frame handled: a 64 KiB GSO burst, its Ethernet header and the vnet header.
const MAX_FRAME: usize = 65_536 + 14 + 10 + 64;
/// How often an idle thread looks at the stop flag.
const TICK: Duration = Duration::from_millis(5);
/// Frames held at most per direction (a bound on memory: ~70 KiB each).
const MAX_HELD: usize = 4096;

impl DelayLine {
    /// Forwards between interfaces `a` and `b` of namespace `ns` (None: this one), both
    /// ways. Needs CAP_NET_RAW there.
    pub fn start(ns: Option<&str>, a: &str, b: &str, p: LineParams) -> anyhow::Result<DelayLine> {
        anyhow::ensure!(
            (0.0..=100.0).contains(&p.reorder_pct),
            "reorder must be 0..=100 %, not {}",
            p.reorder_pct
        );
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(LineCounts::default());
        let mut threads = Vec::new();
        for (i, (from, to)) in [(a, b), (b, a)].into_iter().enumerate() {
            let (from, to) = (from.to_string(), to.to_string());
            let ns = ns.map(str::to_string);
            let (stop, counts) = (stop.clone(), counts.clone());
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let seed = p.seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            threads.push(
                std::thread::Builder::new()
                    .name("delay-line".into())
                    .spawn(move || {
                        let opened = (|| {
                            if let Some(ns) = &ns {
                                crate::enter_thread(ns)?;
                            }
                            Ok::<_, io::Error>((open(&from, true)?, open(&to, false)?))
                        })();
                        let (rx, tx) = match opened {
                            Ok(s) => {
                                let _ = ready_tx.send(Ok(()));
                                s
                            }
                            Err(e) => {
                                let _ = ready_tx.send(Err(io::Error::new(e.kind(), e.to_string())));
                                return Err(e);
                            }
                        };
                        forward(&rx, &tx, p, seed, &stop, &counts)
                    })?,
            );
            ready_rx
                .recv()
                .map_err(|_| anyhow::anyhow!("the delay line's thread ended"))?
                .map_err(|e| anyhow::anyhow!("delay line {a} <-> {b}: {e}"))?;
        }
        Ok(DelayLine {
            stop,
            threads,
            counts,
        })
    }

    /// Stops both directions; the first error either met, if any.
    pub fn stop(mut self) -> io::Result<()> {
        self.halt()
    }

    fn halt(&mut self) -> io::Result<()> {
        self.stop.store(true, Ordering::SeqCst);
        let mut first = Ok(());
        for t in self.threads.drain(..) {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("delay line thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// An `AF_PACKET` raw socket of `protocol` (network order; 0 receives nothing) whose
/// frames start with a `virtio_net_hdr` (`PACKET_VNET_HDR`): GSO and checksum offload
/// pass through it. Needs CAP_NET_RAW in the calling thread's namespace.
pub fn vnet_packet_socket(protocol: u16) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with plain integer arguments; the result is checked.
    let fd = cvt(unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(protocol),
        )
    })?;
    // SAFETY: a new descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let on: libc::c_int = 1;
    // SAFETY: setsockopt reads one int, alive for the call.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_VNET_HDR,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(fd)
}

/// A packet socket with vnet headers bound to `ifname`: receiving every frame (`rx`), or
/// sending only (protocol 0: nothing is queued on it).
fn open(ifname: &str, rx: bool) -> io::Result<OwnedFd> {
    let proto = if rx {
        (libc::ETH_P_ALL as u16).to_be()
    } else {
        0
    };
    let fd = vnet_packet_socket(proto)?;
    let name = std::ffi::CString::new(ifname).map_err(io::Error::other)?;
    // SAFETY: if_nametoindex reads a NUL-terminated string alive for the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: an all-zero sockaddr_ll is valid; the fields that matter are set below.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = index as i32;
    // SAFETY: bind reads `sll`, alive for the call, of the size given.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    })?;
    Ok(fd)
}

/// A held frame: when it goes, in arrival order among equals.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Held {
    at: std::cmp::Reverse<(Instant, u64)>,
    frame: Vec<u8>,
}

fn forward(
    rx: &OwnedFd,
    tx: &OwnedFd,
    p: LineParams,
    mut seed: u64,
    stop: &AtomicBool,
    counts: &LineCounts,
) -> io::Result<()> {
    let mut held: BinaryHeap<Held> = BinaryHeap::new();
    let mut n = 0u64;
    let mut buf = vec![0u8; MAX_FRAME];
    let threshold = (p.reorder_pct / 100.0 * u64::MAX as f64) as u64;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let wait = held
            .peek()
            .map_or(TICK, |h| h.at.0 .0.saturating_duration_since(now).min(TICK));
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: wait.as_nanos() as libc::c_long,
        };
        let mut pfd = libc::pollfd {
            fd: rx.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: ppoll reads one pollfd and the timespec, alive for the call.
        if let Err(e) = cvt(unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) }) {
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        loop {
            // SAFETY: an all-zero sockaddr_ll is valid; recvfrom writes at most `len`.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: recvfrom writes at most buf.len() bytes into `buf` and the address
            // into `from`, all alive for the call.
            let got = match cvt(unsafe {
                libc::recvfrom(
                    rx.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            }) {
                Ok(n) => n as usize,
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::Interrupted =>
                {
                    break
                }
                Err(e) => return Err(e),
            };
            // Our own transmissions on this interface come back as outgoing: never again.
            if from.sll_pkttype == libc::PACKET_OUTGOING || got > buf.len() {
                continue;
            }
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let at_once = seed < threshold;
            let at = if at_once {
                counts.reordered.fetch_add(1, Ordering::Relaxed);
                Instant::now()
            } else {
                Instant::now() + p.delay
            };
            if held.len() >= MAX_HELD {
                continue; // a full line drops, as a full queue does
            }
            n += 1;
            held.push(Held {
                at: std::cmp::Reverse((at, n)),
                frame: buf[..got].to_vec(),
            });
        }
        let now = Instant::now();
        while held.peek().is_some_and(|h| h.at.0 .0 <= now) {
            let h = held.pop().expect("peeked");
            // SAFETY: send reads the frame, alive for the call.
            let sent = cvt(unsafe {
                libc::send(tx.as_raw_fd(), h.frame.as_ptr().cast(), h.frame.len(), 0)
            });
            match sent {
                Ok(_) => {
                    counts.forwarded.fetch_add(1, Ordering::Relaxed);
                }
                // A frame the other side cannot take is lost, as on a wire.
                Err(e) => tracing::debug!(
                    "delay line: a frame of {} bytes not sent: {e}",
                    h.frame.len()
                ),
            }
        }
    }
    Ok(())
}
