//! DP's payload sender (seed 004 §3.5.4, payload_sender): TCP segments on the client's
//! connection as the FE — the FE's address and port as source, the sequence numbers the
//! FE's kHook reserved, the ACK of the client's last byte and the FE's window — built here
//! and sent through a raw IPv4 socket (`IPPROTO_RAW`, the IP header ours; the kernel routes
//! it and resolves the next hop). AF_XDP is the seed's choice; the raw socket is the first
//! step (see the README).
//!
//! [`Transfer`] is the reliability: every segment's bytes stay in the payload until
//! acknowledged (the payload is the frame store), go-back-N from the first unacknowledged
//! byte on three duplicate ACKs or on the retransmission timer (the seed's 200 ms until a
//! round trip is measured, then RFC 6298's estimate, at least 20 ms; doubling on each
//! timeout, at most 3.2 s), and never more in flight than the client's window allows —
//! nor, once a payload larger than that window has lost a segment, than a congestion
//! window ([`Transfer::on_loss`]).

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::packet::{self, Segment, ACK, PSH};

/// Where and as whom DP sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// The FE's address and port (the segments' source).
    pub fe: SocketAddrV4,
    pub client: SocketAddrV4,
    /// Client-view sequence number of the payload's first byte.
    pub seq: u32,
    /// The client's next byte (the ACK DP's segments carry).
    pub ack: u32,
    /// The raw window field DP's segments carry (the FE's last one).
    pub window: u16,
    /// Largest payload per segment.
    pub mss: usize,
}

impl Flow {
    /// The header fields of DP's segment from `seq` with `flags`, between these link
    /// addresses (zero when the kernel routes it).
    pub fn segment(&self, seq: u32, flags: u8, src_mac: [u8; 6], dst_mac: [u8; 6]) -> Segment {
        Segment {
            src_mac,
            dst_mac,
            src: *self.fe.ip(),
            dst: *self.client.ip(),
            sport: self.fe.port(),
            dport: self.client.port(),
            seq,
            ack: self.ack,
            flags,
            window: self.window,
        }
    }
}

/// Something that emits segments (the raw socket, the GSO packet socket; a recorder in
/// tests).
pub trait Emit {
    /// Most payload bytes one [`Emit::emit`] call takes for segments of `mss` bytes: `mss`
    /// when each call is one segment on the wire.
    fn burst(&self, mss: usize) -> usize {
        mss
    }
    /// Most payload bytes in one packet on the link (what a loss takes away): `mss`,
    /// unless a send stays one packet there (a GSO burst crosses a veth whole).
    fn packet(&self, mss: usize) -> usize {
        mss
    }
    /// Sends `data` (its two pieces one after the other, at most [`Emit::burst`] bytes in
    /// all) from sequence number `seq`, as segments of at most `flow.mss` bytes; `flags`
    /// (PSH) belong to the last one.
    fn emit(&mut self, flow: &Flow, seq: u32, data: Pieces<'_>, flags: u8) -> io::Result<()>;
}

/// Bytes to send in two pieces (the end of the head DP sends in front of a payload, then
/// payload bytes), so that neither is copied to join them.
pub type Pieces<'a> = [&'a [u8]; 2];

/// The length of `data`.
pub fn pieces_len(data: Pieces<'_>) -> usize {
    data[0].len() + data[1].len()
}

/// A raw IPv4 socket sending our own IP + TCP headers.
pub struct RawSocket {
    fd: OwnedFd,
}

impl RawSocket {
    /// Needs CAP_NET_RAW in the socket's network namespace (the calling thread's).
    pub fn new() -> io::Result<RawSocket> {
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::IPPROTO_RAW,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RawSocket {
            // SAFETY: a new descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }
}

impl Emit for RawSocket {
    fn emit(&mut self, flow: &Flow, seq: u32, data: Pieces<'_>, flags: u8) -> io::Result<()> {
        let f = packet::frame(&flow.segment(seq, flags, [0; 6], [0; 6]), &data.concat());
        let ip = &f[packet::ETH_HLEN..];
        let dst = crate::sockopt::sockaddr_in(SocketAddrV4::new(*flow.client.ip(), 0));
        // SAFETY: sendto(2) reads `ip` (alive for the call) and a valid sockaddr_in.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                ip.as_ptr().cast(),
                ip.len(),
                libc::MSG_DONTWAIT,
                (&dst as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Payload bytes per segment DP sends (an Ethernet MTU less IP and TCP headers, rounded
/// down for the options DP does not write).
pub const SEND_MSS: usize = 1400;
/// The retransmission timeout before a round trip is measured (the seed's timer).
pub const RTO_INITIAL: Duration = Duration::from_millis(200);
pub const RTO_MAX: Duration = Duration::from_millis(3200);
/// The least timeout once round trips are measured: two of DP's timer ticks (`dp::TICK`),
/// where Linux keeps 200 ms but recovers a lost tail within two round trips by a probe
/// (RFC 8985), which DP does not send.
pub const RTO_MIN: Duration = Duration::from_millis(20);

/// One payload being sent: go-back-N. Offsets count from the first byte DP sends: the
/// head's bytes it sends in front of the payload (`prefix`, often none), then the payload.
pub struct Transfer {
    pub flow: Flow,
    prefix: Vec<u8>,
    /// The payload, read in bounded pieces where it is a file's.
    payload: crate::payload::Reader,
    /// Offset of the first unacknowledged byte.
    una: usize,
    /// Offset of the next byte to send.
    nxt: usize,
    /// The client's window in bytes (already scaled).
    window: usize,
    dupacks: u32,
    /// The congestion window, bytes: None until a loss, and always for a payload the
    /// client's window held whole at the start (see [`Transfer::on_loss`]).
    cwnd: Option<usize>,
    /// Slow start below it, one segment per window's worth acknowledged above it.
    ssthresh: usize,
    /// The client's window held the whole transfer at its start: the FE then clones DP
    /// only the last byte's ACK and duplicate ACKs (`bpf::NOTIFY_ENDS`), too few to pace.
    whole_in_window: bool,
    rto: Duration,
    /// The smoothed round trip and its variation (RFC 6298), once measured.
    srtt: Option<(Duration, Duration)>,
    /// The one segment being timed: the offset its ACK must reach, when it left. Only
    /// new bytes are timed, and a go-back forgets it (Karn: a resent segment's ACK says
    /// nothing of the round trip).
    timed: Option<(usize, Instant)>,
    /// The highest offset sent so far.
    high: usize,
    /// When the oldest unacknowledged byte was (re)sent or last acknowledged.
    armed: Instant,
    pub retransmits: u64,
    /// Segments on the wire, and the send calls that carried them.
    pub segments: u64,
    pub emits: u64,
    /// Pumps cut short by a full socket buffer.
    pub blocked: u64,
}

impl Transfer {
    /// `window`: the client's receive window in bytes when the transfer starts.
    pub fn new(flow: Flow, payload: impl Into<crate::payload::Payload>, window: usize) -> Transfer {
        Transfer::with_prefix(flow, Vec::new(), payload, window)
    }

    /// A transfer of `prefix` then `payload`, `flow.seq` being the prefix's first byte and
    /// `window` counted from it.
    pub fn with_prefix(
        flow: Flow,
        prefix: Vec<u8>,
        payload: impl Into<crate::payload::Payload>,
        window: usize,
    ) -> Transfer {
        let payload = payload.into().reader();
        let whole_in_window = prefix.len() + payload.len() <= window;
        Transfer {
            flow,
            prefix,
            payload,
            una: 0,
            nxt: 0,
            window,
            dupacks: 0,
            cwnd: None,
            ssthresh: usize::MAX,
            whole_in_window,
            rto: RTO_INITIAL,
            srtt: None,
            timed: None,
            high: 0,
            armed: Instant::now(),
            retransmits: 0,
            segments: 0,
            emits: 0,
            blocked: 0,
        }
    }

    /// Bytes to send, the prefix included.
    fn len(&self) -> usize {
        self.prefix.len() + self.payload.len()
    }

    pub fn done(&self) -> bool {
        self.una == self.len()
    }

    /// Bytes [from, to) of prefix and payload (a file payload's read here, if not held).
    fn pieces(&mut self, from: usize, to: usize) -> io::Result<Pieces<'_>> {
        let p = self.prefix.len();
        Ok([
            &self.prefix[from.min(p)..to.min(p)],
            self.payload.get(from.max(p) - p, to.max(p) - p)?,
        ])
    }

    /// Bytes acknowledged so far.
    pub fn acked(&self) -> usize {
        self.una
    }

    /// Sends what the window allows.
    pub fn pump(&mut self, out: &mut impl Emit) -> io::Result<()> {
        let allowed = self.cwnd.map_or(self.window, |c| c.min(self.window));
        let limit = (self.una + allowed.max(1)).min(self.len());
        if self.nxt == self.una {
            self.armed = Instant::now();
        }
        let burst = out.burst(self.flow.mss).max(1);
        while self.nxt < limit {
            let end = (self.nxt + burst).min(limit);
            let flags = if end == self.len() { ACK | PSH } else { ACK };
            let flow = self.flow;
            let seq = flow.seq.wrapping_add(self.nxt as u32);
            match out.emit(&flow, seq, self.pieces(self.nxt, end)?, flags) {
                Ok(()) => {}
                // The socket's buffer is full: the rest goes with the next ACK or tick.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.blocked += 1;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
            self.segments += (end - self.nxt).div_ceil(self.flow.mss.max(1)) as u64;
            self.emits += 1;
            if self.nxt >= self.high && self.timed.is_none() {
                self.timed = Some((end, Instant::now()));
            }
            self.high = self.high.max(end);
            self.nxt = end;
        }
        Ok(())
    }

    /// A client ACK (client view) with its window in bytes.
    pub fn on_ack(&mut self, ack: u32, window: usize, out: &mut impl Emit) -> io::Result<()> {
        let off = ack.wrapping_sub(self.flow.seq) as usize;
        if off > self.len() {
            // Before the payload (an old ACK) or not ours: ignored.
            return Ok(());
        }
        // A window update (same ACK, another window) is not a duplicate ACK.
        let update = window != self.window;
        self.window = window;
        if off > self.una {
            let now = Instant::now();
            if let Some((_, sent)) = self.timed.filter(|&(end, _)| off >= end) {
                self.sample(now.duration_since(sent));
                self.timed = None;
            }
            self.grow(off - self.una);
            self.una = off;
            self.nxt = self.nxt.max(off);
            self.dupacks = 0;
            self.rto = self.base_rto();
            self.armed = now;
        } else if off == self.una && self.nxt > self.una && !update {
            self.dupacks += 1;
            if self.dupacks == 3 {
                self.on_loss(false, out.packet(self.flow.mss));
                self.go_back();
            }
        }
        self.pump(out)
    }

    /// Call periodically: go back to the first unacknowledged byte after the timeout.
    pub fn on_tick(&mut self, now: Instant, out: &mut impl Emit) -> io::Result<()> {
        if self.nxt > self.una && now.duration_since(self.armed) >= self.rto {
            self.on_loss(true, out.packet(self.flow.mss));
            self.go_back();
            self.rto = (self.rto * 2).min(RTO_MAX);
            self.armed = now;
        }
        self.pump(out)
    }

    fn go_back(&mut self) {
        self.retransmits += 1;
        self.nxt = self.una;
        self.timed = None;
    }

    /// One round trip measured: RFC 6298's estimator (gains 1/8 and 1/4).
    fn sample(&mut self, rtt: Duration) {
        self.srtt = Some(match self.srtt {
            None => (rtt, rtt / 2),
            Some((srtt, var)) => {
                let err = srtt.abs_diff(rtt);
                (srtt * 7 / 8 + rtt / 8, var * 3 / 4 + err / 4)
            }
        });
    }

    /// The timeout before backing off: RTO_INITIAL until a round trip is measured, then
    /// the smoothed round trip plus four variations, within [RTO_MIN, RTO_MAX].
    fn base_rto(&self) -> Duration {
        match self.srtt {
            None => RTO_INITIAL,
            Some((srtt, var)) => (srtt + var * 4).clamp(RTO_MIN, RTO_MAX),
        }
    }

    /// A loss (three duplicate ACKs, or the timer when `timeout`): halves what may be in
    /// flight, as TCP's congestion control does, down to four packets. Go-back-N resends
    /// everything from the hole, so without it every lost segment made DP send the
    /// client's whole window again: a 64 MiB payload at 1% loss put 18 million segments on
    /// the wire in 92 s (now 0.3 million in 4 s: CI test
    /// `disc_direct_under_one_percent_loss`). A transfer the client's window held whole
    /// keeps no congestion window: the FE clones it no ACK but the last byte's and
    /// duplicates, so it could not open one again, and what it resends is bounded by its
    /// own size.
    /// `packet`: payload bytes per packet on the link ([`Emit::packet`]).
    fn on_loss(&mut self, timeout: bool, packet: usize) {
        if self.whole_in_window {
            return;
        }
        // Four packets at least (a GSO burst is one on a veth): a loss among them still
        // leaves three to be acknowledged as duplicates (fewer, and every loss waits for
        // the timer: with a floor of four segments, GSO's 64 MiB at 5% took 8-11 s, now
        // 2.5 s, test `disc_direct_under_five_percent_loss`).
        let floor = 4 * packet.max(1);
        let in_flight = self.nxt - self.una;
        self.ssthresh = (in_flight / 2).max(floor);
        self.cwnd = Some(if timeout { floor } else { self.ssthresh });
    }

    /// `acked` new bytes acknowledged: the congestion window opens, by as much below
    /// `ssthresh` (slow start), by one segment per window's worth above it.
    fn grow(&mut self, acked: usize) {
        let Some(c) = self.cwnd else { return };
        let mss = self.flow.mss.max(1);
        self.cwnd = Some(if c < self.ssthresh {
            (c + acked).min(self.ssthresh.max(c + mss))
        } else {
            c + (mss * acked / c).max(1)
        });
    }
}

/// The client's window in bytes from a raw window field and the client's window scale.
pub fn window_bytes(raw: u32, scale: u8) -> usize {
    (raw as usize) << scale.min(14)
}

/// Client-view address helpers for tests and the CLI.
pub fn v4(ip: Ipv4Addr, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip, port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[derive(Default)]
    struct Record(Vec<(u32, usize, u8)>);

    impl Emit for Record {
        fn emit(&mut self, _: &Flow, seq: u32, data: Pieces<'_>, flags: u8) -> io::Result<()> {
            self.0.push((seq, pieces_len(data), flags));
            Ok(())
        }
    }

    fn flow(seq: u32) -> Flow {
        Flow {
            fe: v4(Ipv4Addr::new(10, 0, 0, 2), 8080),
            client: v4(Ipv4Addr::new(10, 0, 0, 1), 40000),
            seq,
            ack: 1,
            window: 100,
            mss: 1000,
        }
    }

    #[test]
    fn the_window_bounds_what_is_in_flight() {
        let mut t = Transfer::new(flow(u32::MAX - 1500), Bytes::from(vec![7u8; 10_000]), 3000);
        let mut r = Record::default();
        t.pump(&mut r).unwrap();
        assert_eq!(
            r.0.len(),
            3,
            "3,000 bytes of window: three 1,000-byte segments"
        );
        assert_eq!(r.0[0].0, u32::MAX - 1500);
        assert_eq!(
            r.0[2].0,
            (u32::MAX - 1500).wrapping_add(2000),
            "wraps modulo 2^32"
        );
        r.0.clear();
        // 2,000 acknowledged, window still 3,000: two more segments.
        t.on_ack((u32::MAX - 1500).wrapping_add(2000), 3000, &mut r)
            .unwrap();
        assert_eq!(r.0.len(), 2);
        assert_eq!(t.acked(), 2000);
        // A zero window stops everything but a one-byte probe's worth.
        r.0.clear();
        t.on_ack((u32::MAX - 1500).wrapping_add(5000), 0, &mut r)
            .unwrap();
        assert_eq!(r.0.iter().map(|s| s.1).sum::<usize>(), 1);
    }

    /// Records the bytes too.
    #[derive(Default)]
    struct Bytes2(Vec<(u32, Vec<u8>)>);

    impl Emit for Bytes2 {
        fn emit(&mut self, _: &Flow, seq: u32, data: Pieces<'_>, _: u8) -> io::Result<()> {
            self.0.push((seq, data.concat()));
            Ok(())
        }
    }

    /// A head DP sends in front of the payload: one stream from the head's first byte,
    /// segments across the join carry both, a go-back-N resends from the hole.
    #[test]
    fn a_head_in_front_of_the_payload_is_one_stream() {
        let head = b"HTTP/1.1 200 OK\r\n\r\n".to_vec(); // 19 bytes
        let payload: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        let want = [head.clone(), payload.clone()].concat();
        let mut t = Transfer::with_prefix(flow(500), head, Bytes::from(payload), 1 << 20);
        assert_eq!(t.len(), 2519);
        let mut r = Bytes2::default();
        t.pump(&mut r).unwrap();
        let seqs: Vec<u32> = r.0.iter().map(|s| s.0).collect();
        assert_eq!(seqs, [500, 1500, 2500]);
        assert_eq!(
            r.0.iter().flat_map(|s| s.1.clone()).collect::<Vec<_>>(),
            want
        );
        // The second segment lost: three duplicate ACKs resend from it.
        r.0.clear();
        t.on_ack(1500, 1 << 20, &mut r).unwrap();
        for _ in 0..3 {
            t.on_ack(1500, 1 << 20, &mut r).unwrap();
        }
        assert_eq!(r.0.len(), 2);
        assert_eq!(r.0[0], (1500, want[1000..2000].to_vec()));
        t.on_ack(500 + 2519, 1 << 20, &mut r).unwrap();
        assert!(t.done());
    }

    #[test]
    fn a_loss_halves_what_a_payload_larger_than_the_window_keeps_in_flight() {
        let seqs = |r: &Record| r.0.iter().map(|s| s.0).collect::<Vec<u32>>();
        let mut t = Transfer::new(flow(1000), Bytes::from(vec![1u8; 40_000]), 10_000);
        let mut r = Record::default();
        t.pump(&mut r).unwrap();
        assert_eq!(seqs(&r), (1..=10).map(|k| k * 1000).collect::<Vec<u32>>());
        r.0.clear();
        // The second segment is lost: one new ACK, then three duplicates.
        t.on_ack(2000, 10_000, &mut r).unwrap();
        assert_eq!(seqs(&r), [11_000], "the window slid by one segment");
        r.0.clear();
        for _ in 0..3 {
            t.on_ack(2000, 10_000, &mut r).unwrap();
        }
        // 10,000 bytes were in flight from the hole: half go again, not the window.
        assert_eq!(
            seqs(&r),
            [2000, 3000, 4000, 5000, 6000],
            "within half the flight"
        );
        r.0.clear();
        // The hole filled (the client kept the rest): 10,000 bytes acknowledged open the
        // window by two segments (one per window's worth).
        t.on_ack(12_000, 10_000, &mut r).unwrap();
        assert_eq!(seqs(&r), (12..=18).map(|k| k * 1000).collect::<Vec<u32>>());
        r.0.clear();
        // A timeout: four packets in flight (so that a loss among them still brings
        // three duplicate ACKs).
        let later = Instant::now() + RTO_MIN;
        t.on_tick(later, &mut r).unwrap();
        assert_eq!(seqs(&r), [12_000, 13_000, 14_000, 15_000]);
        r.0.clear();
        t.on_ack(16_000, 10_000, &mut r).unwrap();
        assert_eq!(seqs(&r), (16..=20).map(|k| k * 1000).collect::<Vec<u32>>());
        r.0.clear();
        // The client's window still bounds it.
        t.on_ack(21_000, 2000, &mut r).unwrap();
        assert_eq!(seqs(&r), [21_000, 22_000]);
        assert_eq!(t.retransmits, 2);
    }

    #[test]
    fn the_timeout_follows_the_measured_round_trip() {
        let mut t = Transfer::new(flow(1000), Bytes::from(vec![1u8; 50_000]), 1 << 20);
        assert_eq!(
            t.base_rto(),
            RTO_INITIAL,
            "nothing measured yet: the seed's 200 ms"
        );
        t.sample(Duration::from_millis(50));
        assert_eq!(t.base_rto(), Duration::from_millis(150), "50 + 4 x 25");
        t.sample(Duration::from_millis(50));
        assert_eq!(t.base_rto(), Duration::from_millis(125), "50 + 4 x 18.75");
        for _ in 0..100 {
            t.sample(Duration::from_micros(100));
        }
        assert_eq!(t.base_rto(), RTO_MIN, "a veth's round trip: the floor");
        for _ in 0..100 {
            t.sample(Duration::from_secs(5));
        }
        assert_eq!(t.base_rto(), RTO_MAX);
        // Karn: after a go-back, the resent bytes' ACK is no sample.
        let mut t = Transfer::new(flow(1000), Bytes::from(vec![1u8; 5000]), 1 << 20);
        let mut r = Record::default();
        t.pump(&mut r).unwrap();
        t.on_tick(Instant::now() + RTO_INITIAL, &mut r).unwrap();
        assert_eq!(t.retransmits, 1);
        t.on_ack(6000, 1 << 20, &mut r).unwrap();
        assert!(t.done());
        assert_eq!(t.srtt, None, "the ACK of resent bytes measured nothing");
    }

    #[test]
    fn go_back_n_on_timeout_and_on_three_duplicate_acks() {
        let mut t = Transfer::new(flow(1000), Bytes::from(vec![1u8; 5000]), 1 << 20);
        let mut r = Record::default();
        t.pump(&mut r).unwrap();
        assert_eq!(r.0.len(), 5);
        assert_eq!(r.0[4], (5000, 1000, ACK | PSH), "the last segment pushes");
        r.0.clear();
        // Segment 2 lost: the client acks 2000 four times (one new, three duplicates).
        for _ in 0..4 {
            t.on_ack(3000, 1 << 20, &mut r).unwrap();
        }
        assert_eq!(t.retransmits, 1);
        let seqs: Vec<u32> = r.0.iter().map(|s| s.0).collect();
        assert_eq!(
            seqs,
            [3000, 4000, 5000],
            "everything from the hole is resent"
        );
        r.0.clear();
        // Nothing acked for a timeout (RTO_MIN: the round trip measured by the first ACK
        // is microseconds): everything from una again, and the timer doubles.
        assert_eq!(t.rto, RTO_MIN);
        let later = Instant::now() + RTO_MIN;
        t.on_tick(later, &mut r).unwrap();
        assert_eq!(r.0.len(), 3);
        assert_eq!(t.retransmits, 2);
        r.0.clear();
        t.on_tick(later + RTO_MIN, &mut r).unwrap();
        assert!(r.0.is_empty(), "the second timeout is twice the first");
        t.on_tick(later + RTO_MIN * 2, &mut r).unwrap();
        assert_eq!(t.retransmits, 3);
        r.0.clear();
        t.on_ack(6000, 1 << 20, &mut r).unwrap();
        assert!(t.done());
        // Late and foreign ACKs change nothing.
        t.on_ack(10, 1 << 20, &mut r).unwrap();
        assert!(t.done() && r.0.is_empty());
    }
}
