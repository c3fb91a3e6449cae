//! One uTP connection as pure code: packets in ([`Conn::on_packet`]), datagrams out
//! ([`Conn::poll_transmit`]), bytes written and read, the time passed in on every call, so
//! that every path (loss, reordering, timeouts, the handshake from either side) is tested
//! without sockets.
//!
//! Sequence numbers as the reference implementation has them: a SYN and each DATA or FIN
//! take one; a STATE carries the next one and takes none, and the initiator sets its
//! `ack_nr` to the SYN-ACK's `seq_nr - 1`. Connection ids: the initiator picks `r`, receives
//! on `r` and sends on `r + 1`; the SYN carries `r`.
//!
//! Bounds: at most [`SEND_BUFFER`] bytes written and not yet acknowledged, [`RECV_WINDOW`]
//! bytes received and not yet read (the window advertised), out-of-order packets at most
//! [`REORDER_MAX`] ahead. Every state has a deadline ([`Deadlines`]).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::ledbat::Ledbat;
use super::packet::{Kind, Packet, SACK_BYTES};

pub use super::packet::MSS;
/// Bytes written and not yet acknowledged, at most.
pub const SEND_BUFFER: usize = 256 * 1024;
/// Bytes received and not yet read (in order or waiting for a hole), at most.
pub const RECV_WINDOW: usize = 256 * 1024;
/// Out-of-order packets are kept up to this many past the next expected one.
pub const REORDER_MAX: u16 = 200;
/// Three later packets acknowledged past one: it is lost (as TCP's three duplicate ACKs).
const DUP_ACKS: u32 = 3;
const INITIAL_RTO: Duration = Duration::from_secs(1);
const MIN_RTO: Duration = Duration::from_millis(500);
const MAX_RTO: Duration = Duration::from_secs(30);

/// The deadline of every state.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// SYN sent (or received) until the connection is established.
    pub handshake: Duration,
    /// Nothing received for this long once connected: gone.
    pub idle: Duration,
    /// A STATE is sent after this long without sending anything (the peer's idle clock).
    pub keepalive: Duration,
    /// Our FIN sent until it is acknowledged.
    pub fin: Duration,
    /// Retransmission timeouts in a row without progress before the peer is given up.
    pub max_timeouts: u32,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            handshake: Duration::from_secs(10),
            idle: Duration::from_secs(120),
            keepalive: Duration::from_secs(29),
            fin: Duration::from_secs(10),
            max_timeouts: 6,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    SynSent,
    SynRecv,
    Connected,
    Closed,
}

/// Why a connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// Both FINs exchanged, or our FIN acknowledged after the peer's.
    Done,
    Reset,
    /// No answer to the SYN, to the SYN-ACK, to retransmissions, or to our FIN.
    Timeout,
    Idle,
}

/// A packet sent and not yet acknowledged (or waiting to be sent again).
#[derive(Debug)]
struct Sent {
    seq: u16,
    kind: Kind,
    payload: Vec<u8>,
    /// `None`: to be sent (again).
    sent_at: Option<Instant>,
    transmissions: u32,
    acked: bool,
    /// Later packets acknowledged past this one (selective ACKs).
    skipped: u32,
}

#[derive(Debug)]
pub struct Conn {
    state: State,
    recv_id: u16,
    send_id: u16,
    epoch: Instant,
    lim: Deadlines,
    /// The next sequence number we send, the last one received in order.
    seq_nr: u16,
    ack_nr: u16,
    /// The SYN's sequence number (responder: a SYN sent again is answered again).
    syn_seq: u16,
    // ---- sending
    pending: Vec<u8>,
    unacked: VecDeque<Sent>,
    cc: Ledbat,
    peer_wnd: usize,
    srtt: Option<(Duration, Duration)>,
    rto: Duration,
    timeouts: u32,
    dup_acks: u32,
    /// Loss halves the window at most once per window: not again until this is acked.
    recovery_until: Option<u16>,
    fin_queued: bool,
    fin_sent_at: Option<Instant>,
    // ---- receiving
    received: Vec<u8>,
    reorder: BTreeMap<u16, (Kind, Vec<u8>)>,
    reorder_bytes: usize,
    peer_fin: Option<u16>,
    eof: bool,
    ack_due: bool,
    /// The delay we measured of the peer's last packet, sent back in ours.
    reply_delay: u32,
    started: Instant,
    last_recv: Instant,
    last_sent: Instant,
    close: Option<Close>,
    /// Closed with the peer's FIN just received: its acknowledgement is still to go out.
    final_ack: bool,
}

/// Whether `a` comes after `b` in wrapping sequence space.
fn after(a: u16, b: u16) -> bool {
    a != b && a.wrapping_sub(b) < 0x8000
}

impl Conn {
    fn new(state: State, recv_id: u16, send_id: u16, now: Instant, lim: Deadlines) -> Conn {
        Conn {
            state,
            recv_id,
            send_id,
            epoch: now,
            lim,
            seq_nr: 1,
            ack_nr: 0,
            syn_seq: 0,
            pending: Vec::new(),
            unacked: VecDeque::new(),
            cc: Ledbat::new(2 * MSS),
            peer_wnd: RECV_WINDOW,
            srtt: None,
            rto: INITIAL_RTO,
            timeouts: 0,
            dup_acks: 0,
            recovery_until: None,
            fin_queued: false,
            fin_sent_at: None,
            received: Vec::new(),
            reorder: BTreeMap::new(),
            reorder_bytes: 0,
            peer_fin: None,
            eof: false,
            ack_due: false,
            reply_delay: 0,
            started: now,
            last_recv: now,
            last_sent: now,
            close: None,
            final_ack: false,
        }
    }

    /// An outgoing connection receiving on `recv_id`: its SYN is the first datagram out.
    pub fn connect(recv_id: u16, now: Instant, lim: Deadlines) -> Conn {
        let mut c = Conn::new(State::SynSent, recv_id, recv_id.wrapping_add(1), now, lim);
        c.push_sent(Kind::Syn, Vec::new());
        c
    }

    /// An incoming connection from its SYN, our first sequence number `seq`: the SYN-ACK
    /// (a STATE) is the first datagram out.
    pub fn accept(syn: &Packet, seq: u16, now: Instant, lim: Deadlines) -> Conn {
        let id = syn.conn_id;
        let mut c = Conn::new(State::SynRecv, id.wrapping_add(1), id, now, lim);
        c.seq_nr = seq;
        c.ack_nr = syn.seq_nr;
        c.syn_seq = syn.seq_nr;
        c.peer_wnd = syn.wnd_size as usize;
        c.reply_delay = c.now_us(now).wrapping_sub(syn.timestamp_us);
        c.ack_due = true;
        c
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// The id the peer's packets carry.
    pub fn recv_id(&self) -> u16 {
        self.recv_id
    }

    pub fn closed(&self) -> Option<Close> {
        self.close
    }

    pub fn cwnd(&self) -> usize {
        self.cc.cwnd()
    }

    fn now_us(&self, now: Instant) -> u32 {
        now.saturating_duration_since(self.epoch).as_micros() as u32
    }

    fn shut(&mut self, why: Close) {
        if self.close.is_none() {
            self.close = Some(why);
            self.state = State::Closed;
            self.pending = Vec::new();
            self.unacked.clear();
        }
    }

    fn push_sent(&mut self, kind: Kind, payload: Vec<u8>) {
        self.unacked.push_back(Sent {
            seq: self.seq_nr,
            kind,
            payload,
            sent_at: None,
            transmissions: 0,
            acked: false,
            skipped: 0,
        });
        self.seq_nr = self.seq_nr.wrapping_add(1);
    }

    fn buffered(&self) -> usize {
        self.pending.len() + self.unacked.iter().map(|s| s.payload.len()).sum::<usize>()
    }

    /// Bytes [`write`](Conn::write) takes now.
    pub fn writable(&self) -> usize {
        if self.close.is_some() || self.fin_queued {
            return 0;
        }
        SEND_BUFFER.saturating_sub(self.buffered())
    }

    /// Takes as much of `data` as the send buffer has room for; returns how much.
    pub fn write(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.writable());
        self.pending.extend_from_slice(&data[..n]);
        n
    }

    /// Our side is done: a FIN follows what was written.
    pub fn close(&mut self) {
        self.fin_queued = true;
    }

    /// The bytes received in order and not yet read.
    pub fn received(&self) -> &[u8] {
        &self.received
    }

    /// `n` bytes of [`received`](Conn::received) were read.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.received.len());
        if self.window_left() < 2 * MSS {
            // The peer may have stopped on our closed window: tell it the window is open.
            self.ack_due = n > 0;
        }
        self.received.drain(..n);
        if self.received.is_empty() {
            self.received = Vec::new();
        }
    }

    /// The peer's FIN arrived and everything before it was received.
    pub fn eof(&self) -> bool {
        self.eof
    }

    fn window_left(&self) -> usize {
        RECV_WINDOW.saturating_sub(self.received.len() + self.reorder_bytes)
    }

    fn in_flight(&self) -> usize {
        self.unacked
            .iter()
            .filter(|s| s.sent_at.is_some() && !s.acked)
            .map(|s| s.payload.len())
            .sum()
    }

    fn send_window(&self) -> usize {
        self.cc.cwnd().min(self.peer_wnd)
    }

    /// A packet from the peer (its connection id already matched).
    pub fn on_packet(&mut self, p: &Packet, now: Instant) {
        if self.close.is_some() {
            return;
        }
        self.last_recv = now;
        self.reply_delay = self.now_us(now).wrapping_sub(p.timestamp_us);
        match (p.kind, self.state) {
            (Kind::Reset, _) => return self.shut(Close::Reset),
            (Kind::Syn, State::SynRecv | State::Connected) => {
                // The SYN again: our SYN-ACK was lost.
                if p.seq_nr == self.syn_seq {
                    self.ack_due = true;
                }
                return;
            }
            (Kind::Syn, _) => return,
            (Kind::State, State::SynSent) => {
                self.state = State::Connected;
                self.ack_nr = p.seq_nr.wrapping_sub(1);
            }
            (_, State::SynSent) => return, // data before the SYN-ACK: nothing to order it by
            (_, State::SynRecv) => self.state = State::Connected,
            _ => {}
        }
        self.peer_wnd = p.wnd_size as usize;
        self.cc.delay_sample(p.timestamp_diff_us, now);
        self.on_ack(p, now);
        if matches!(p.kind, Kind::Data | Kind::Fin) {
            self.on_data(p);
        }
        self.check_done();
    }

    /// What the packet's `ack_nr` and selective ACK acknowledge.
    fn on_ack(&mut self, p: &Packet, now: Instant) {
        let window_limited = self.in_flight() + MSS > self.send_window();
        let mut bytes = 0;
        let mut newest_sacked = None;
        for s in self.unacked.iter_mut() {
            let cum = !after(s.seq, p.ack_nr);
            let sacked = !cum && p.sacked().any(|q| q == s.seq);
            if s.acked || s.sent_at.is_none() && s.transmissions == 0 || !(cum || sacked) {
                continue;
            }
            s.acked = true;
            bytes += s.payload.len();
            if sacked {
                newest_sacked = Some(s.seq);
            }
            if let (1, Some(at)) = (s.transmissions, s.sent_at) {
                let sample = now.saturating_duration_since(at);
                self.srtt = Some(match self.srtt {
                    None => (sample, sample / 2),
                    Some((srtt, var)) => {
                        let diff = srtt.abs_diff(sample);
                        ((srtt * 7 + sample) / 8, (var * 3 + diff) / 4)
                    }
                });
            }
        }
        if let Some((srtt, var)) = self.srtt {
            self.rto = (srtt + var * 4).clamp(MIN_RTO, MAX_RTO);
        }
        let mut lost = false;
        if let Some(newest) = newest_sacked {
            // Packets before a selectively acknowledged one were skipped over once more.
            for s in self
                .unacked
                .iter_mut()
                .filter(|s| !s.acked && after(newest, s.seq))
            {
                s.skipped += 1;
                if s.skipped == DUP_ACKS && s.sent_at.is_some() {
                    s.sent_at = None;
                    lost = true;
                }
            }
        }
        let progress = bytes > 0 || self.unacked.front().is_some_and(|s| s.acked);
        if progress {
            self.dup_acks = 0;
            self.timeouts = 0;
        } else if p.kind == Kind::State && p.payload.is_empty() {
            if let Some(first) = self.unacked.front_mut() {
                if first.sent_at.is_some() && p.ack_nr == first.seq.wrapping_sub(1) {
                    self.dup_acks += 1;
                    if self.dup_acks == DUP_ACKS {
                        first.sent_at = None;
                        lost = true;
                    }
                }
            }
        }
        while self.unacked.front().is_some_and(|s| s.acked) {
            self.unacked.pop_front();
        }
        if let Some(r) = self.recovery_until {
            if !after(r, p.ack_nr) {
                self.recovery_until = None;
            }
        }
        if lost && self.recovery_until.is_none() {
            self.cc.on_loss();
            self.recovery_until = Some(self.seq_nr.wrapping_sub(1));
        }
        self.cc.on_ack(bytes, window_limited);
    }

    /// A DATA or FIN packet: in order, delivered; ahead, kept for later; behind, acked again.
    fn on_data(&mut self, p: &Packet) {
        self.ack_due = true;
        let dist = p.seq_nr.wrapping_sub(self.ack_nr.wrapping_add(1));
        if dist == 0 {
            if !self.take(p.kind, p.payload) {
                return;
            }
            // Packets that waited for this one.
            loop {
                let next = self.ack_nr.wrapping_add(1);
                let Some((kind, data)) = self.reorder.remove(&next) else {
                    break;
                };
                self.reorder_bytes -= data.len();
                self.take(kind, &data);
            }
        } else if dist < REORDER_MAX
            && !self.reorder.contains_key(&p.seq_nr)
            && p.payload.len() <= self.window_left()
        {
            self.reorder_bytes += p.payload.len();
            self.reorder.insert(p.seq_nr, (p.kind, p.payload.to_vec()));
        }
    }

    /// The next packet in order: its bytes appended if they fit the window.
    fn take(&mut self, kind: Kind, payload: &[u8]) -> bool {
        if self.peer_fin.is_some() || payload.len() > self.window_left() {
            return false; // after the FIN nothing counts; too big: sent again later
        }
        self.received.extend_from_slice(payload);
        self.ack_nr = self.ack_nr.wrapping_add(1);
        if kind == Kind::Fin {
            self.peer_fin = Some(self.ack_nr);
            self.eof = true;
            self.reorder.clear();
            self.reorder_bytes = 0;
        }
        true
    }

    /// Closed once our FIN is acknowledged and the peer's received (or the FIN deadline
    /// passes with ours acknowledged).
    fn check_done(&mut self) {
        if self.fin_acked() && self.eof {
            self.final_ack = self.ack_due;
            self.shut(Close::Done);
        }
    }

    fn fin_acked(&self) -> bool {
        self.fin_sent_at.is_some() && self.unacked.is_empty()
    }

    /// Timers: the handshake, idle and FIN deadlines, retransmission timeouts.
    pub fn on_tick(&mut self, now: Instant) {
        if self.close.is_some() {
            return;
        }
        let since = |t: Instant| now.saturating_duration_since(t);
        if matches!(self.state, State::SynSent | State::SynRecv)
            && since(self.started) >= self.lim.handshake
        {
            return self.shut(Close::Timeout);
        }
        if since(self.last_recv) >= self.lim.idle {
            return self.shut(Close::Idle);
        }
        if self.fin_sent_at.is_some_and(|t| since(t) >= self.lim.fin) {
            let why = if self.fin_acked() {
                Close::Done
            } else {
                Close::Timeout
            };
            return self.shut(why);
        }
        let oldest = self
            .unacked
            .iter()
            .filter(|s| !s.acked)
            .find_map(|s| s.sent_at);
        if oldest.is_some_and(|t| since(t) >= self.rto) {
            self.timeouts += 1;
            if self.timeouts > self.lim.max_timeouts {
                return self.shut(Close::Timeout);
            }
            self.cc.on_timeout();
            self.rto = (self.rto * 2).min(MAX_RTO);
            for s in self.unacked.iter_mut().filter(|s| !s.acked) {
                s.sent_at = None;
            }
        }
    }

    /// When [`on_tick`](Conn::on_tick) has something to do next.
    pub fn next_deadline(&self) -> Instant {
        let mut t = self.last_recv + self.lim.idle;
        if matches!(self.state, State::SynSent | State::SynRecv) {
            t = t.min(self.started + self.lim.handshake);
        }
        if let Some(f) = self.fin_sent_at {
            t = t.min(f + self.lim.fin);
        }
        if let Some(s) = self
            .unacked
            .iter()
            .filter(|s| !s.acked)
            .find_map(|s| s.sent_at)
        {
            t = t.min(s + self.rto);
        }
        if self.state == State::Connected {
            t = t.min(self.last_sent + self.lim.keepalive);
        }
        t
    }

    /// The next datagram to send, appended to `out` (`false`: nothing to send now).
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        if self.close.is_some() {
            if std::mem::take(&mut self.final_ack) {
                self.header(Kind::State, self.seq_nr, now, &[], out);
                return true;
            }
            return false;
        }
        let (cwnd, peer_wnd) = (self.cc.cwnd(), self.peer_wnd);
        // The congestion window always lets one packet out; the peer's window is a limit
        // on new data (a closed one is reopened by its STATE when it reads).
        let room = |inflight: usize, len: usize| inflight == 0 || inflight + len <= cwnd;
        let new_room =
            |inflight: usize, len: usize| room(inflight, len) && inflight + len <= peer_wnd;
        let inflight = self.in_flight();
        let connected = self.state == State::Connected;
        // 1. A packet to send again (or the SYN the first time).
        let again = self
            .unacked
            .iter()
            .position(|s| !s.acked && s.sent_at.is_none() && (connected || s.kind == Kind::Syn));
        if let Some(i) = again {
            if room(inflight, self.unacked[i].payload.len()) {
                return self.emit(i, now, out);
            }
            return false;
        }
        if connected {
            // 2. New data.
            if !self.pending.is_empty() {
                let len = self.pending.len().min(MSS);
                if new_room(inflight, len) {
                    let payload: Vec<u8> = self.pending.drain(..len).collect();
                    if self.pending.is_empty() {
                        self.pending = Vec::new();
                    }
                    self.push_sent(Kind::Data, payload);
                    return self.emit(self.unacked.len() - 1, now, out);
                }
            }
            // 3. Our FIN once everything before it is out.
            if self.fin_queued && self.fin_sent_at.is_none() && self.pending.is_empty() {
                self.push_sent(Kind::Fin, Vec::new());
                self.fin_sent_at = Some(now);
                return self.emit(self.unacked.len() - 1, now, out);
            }
        }
        // 4. An acknowledgement, or a keep-alive.
        let keepalive =
            connected && now.saturating_duration_since(self.last_sent) >= self.lim.keepalive;
        if (self.ack_due && self.state != State::SynSent) || keepalive {
            self.header(Kind::State, self.seq_nr, now, &[], out);
            return true;
        }
        false
    }

    fn emit(&mut self, i: usize, now: Instant, out: &mut Vec<u8>) -> bool {
        let (kind, seq) = (self.unacked[i].kind, self.unacked[i].seq);
        let payload = std::mem::take(&mut self.unacked[i].payload);
        self.header(kind, seq, now, &payload, out);
        let s = &mut self.unacked[i];
        s.payload = payload;
        s.sent_at = Some(now);
        s.transmissions += 1;
        true
    }

    /// Appends a packet of ours: our ack, window, timestamps and selective ACK.
    fn header(&mut self, kind: Kind, seq: u16, now: Instant, payload: &[u8], out: &mut Vec<u8>) {
        let mut mask = [0u8; SACK_BYTES];
        let base = self.ack_nr.wrapping_add(2);
        for &q in self.reorder.keys() {
            let i = q.wrapping_sub(base) as usize;
            if i < SACK_BYTES * 8 {
                mask[i / 8] |= 1 << (i % 8);
            }
        }
        let sack = (!self.reorder.is_empty() && kind != Kind::Syn).then_some(&mask[..]);
        Packet {
            kind,
            conn_id: if kind == Kind::Syn {
                self.recv_id
            } else {
                self.send_id
            },
            timestamp_us: self.now_us(now),
            timestamp_diff_us: self.reply_delay,
            wnd_size: self.window_left() as u32,
            seq_nr: seq,
            ack_nr: self.ack_nr,
            sack,
            payload,
        }
        .encode(out);
        self.ack_due = false;
        self.last_sent = now;
    }
}
