//! Two [`Conn`]s talking through a simulated network: loss, reordering, deadlines.

use std::time::{Duration, Instant};

use super::conn::{Close, Conn, Deadlines, State, MSS, RECV_WINDOW, SEND_BUFFER};
use super::packet::{parse, Kind};

/// A network between an initiator `a` and a responder `b`; `fate(n)` says what becomes of
/// the n-th datagram: delivered, dropped, or held back one round (reordered).
struct Net {
    a: Conn,
    b: Conn,
    now: Instant,
    sent: usize,
    held: Vec<(bool, Vec<u8>)>,
}

#[derive(Clone, Copy, PartialEq)]
enum Fate {
    Deliver,
    Drop,
    Hold,
}

impl Net {
    fn open(fate: &mut impl FnMut(usize) -> Fate) -> Net {
        let now = Instant::now();
        let mut a = Conn::connect(100, now, Deadlines::default());
        let mut syn = Vec::new();
        assert!(a.poll_transmit(now, &mut syn));
        let p = parse(&syn).unwrap();
        assert_eq!((p.kind, p.conn_id, p.seq_nr), (Kind::Syn, 100, 1));
        let b = Conn::accept(&p, 5000, now, Deadlines::default());
        let mut net = Net {
            a,
            b,
            now,
            sent: 1,
            held: Vec::new(),
        };
        for _ in 0..300 {
            net.round(fate);
            if net.a.state() == State::Connected {
                break;
            }
        }
        assert_eq!(net.a.state(), State::Connected);
        net
    }

    /// One round: every datagram either side has to send, then 10 ms pass.
    fn round(&mut self, fate: &mut impl FnMut(usize) -> Fate) {
        let mut flying = std::mem::take(&mut self.held);
        for (to_b, conn) in [(true, &mut self.a), (false, &mut self.b)] {
            loop {
                let mut d = Vec::new();
                if !conn.poll_transmit(self.now, &mut d) {
                    break;
                }
                self.sent += 1;
                match fate(self.sent) {
                    Fate::Deliver => flying.push((to_b, d)),
                    Fate::Drop => {}
                    Fate::Hold => self.held.push((to_b, d)),
                }
            }
        }
        for (to_b, d) in flying {
            let p = parse(&d).unwrap();
            let (conn, id) = if to_b {
                (&mut self.b, 101)
            } else {
                (&mut self.a, 100)
            };
            if p.kind != Kind::Syn {
                assert_eq!(p.conn_id, id, "A sends on its id + 1, B on A's id");
            }
            conn.on_packet(&p, self.now);
        }
        self.now += Duration::from_millis(10);
        self.a.on_tick(self.now);
        self.b.on_tick(self.now);
    }

    /// Sends `data` from `a` to `b` (reading as it comes); returns what `b` read.
    fn transfer(&mut self, data: &[u8], fate: &mut impl FnMut(usize) -> Fate) -> Vec<u8> {
        self.transfer_dir(true, data, fate)
    }

    /// As [`transfer`](Net::transfer), from `a` to `b` or back.
    fn transfer_dir(
        &mut self,
        a_to_b: bool,
        data: &[u8],
        fate: &mut impl FnMut(usize) -> Fate,
    ) -> Vec<u8> {
        let (mut off, mut got) = (0, Vec::new());
        for _ in 0..20_000 {
            let (from, to) = if a_to_b {
                (&mut self.a, &mut self.b)
            } else {
                (&mut self.b, &mut self.a)
            };
            off += from.write(&data[off..]);
            got.extend_from_slice(to.received());
            let n = to.received().len();
            to.consume(n);
            self.round(fate);
            if got.len() >= data.len() {
                break;
            }
        }
        got
    }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn handshake_and_a_megabyte_each_way() {
    let mut fate = |_| Fate::Deliver;
    let mut net = Net::open(&mut fate);
    assert_eq!(
        net.b.state(),
        State::SynRecv,
        "B is connected by A's first data"
    );
    let data = pattern(1 << 20);
    assert_eq!(net.transfer(&data, &mut fate), data);
    assert_eq!(net.b.state(), State::Connected);
    assert!(
        net.a.cwnd() > 2 * super::conn::MSS,
        "LEDBAT grew the window without queueing"
    );
    // And back.
    assert_eq!(net.transfer_dir(false, &data, &mut fate), data);
}

#[test]
fn loss_and_reordering_lose_no_byte() {
    // Every 7th datagram lost, every 5th held back a round, the SYN-ACK among the lost.
    let mut fate = |n: usize| match n {
        2 => Fate::Drop,
        n if n % 7 == 0 => Fate::Drop,
        n if n % 5 == 0 => Fate::Hold,
        _ => Fate::Deliver,
    };
    let mut net = Net::open(&mut fate);
    let data = pattern(300_000);
    assert_eq!(net.transfer(&data, &mut fate), data);
}

#[test]
fn fin_both_ways_closes_both() {
    let mut fate = |_| Fate::Deliver;
    let mut net = Net::open(&mut fate);
    assert_eq!(net.transfer(b"hello", &mut fate), b"hello");
    net.a.close();
    for _ in 0..5 {
        net.round(&mut fate);
    }
    assert!(net.b.eof(), "B saw A's FIN");
    assert_eq!(
        net.a.closed(),
        None,
        "A's FIN is acknowledged; A waits for B's"
    );
    net.b.close();
    for _ in 0..5 {
        net.round(&mut fate);
    }
    assert!(net.a.eof());
    assert_eq!(net.a.closed(), Some(Close::Done));
    assert_eq!(
        net.b.closed(),
        Some(Close::Done),
        "A's last acknowledgement went out"
    );
    // A peer that never sends its FIN: ours acknowledged, done at the FIN deadline.
    let mut net = Net::open(&mut fate);
    net.a.close();
    net.round(&mut fate);
    net.round(&mut fate);
    net.a.on_tick(net.now + Deadlines::default().fin);
    assert_eq!(net.a.closed(), Some(Close::Done));
}

#[test]
fn every_state_has_a_deadline() {
    let lim = Deadlines::default();
    // SYN sent, never answered: sent again as the timer doubles, given up at the deadline.
    let t0 = Instant::now();
    let mut a = Conn::connect(7, t0, lim);
    let mut syns = 0;
    let mut t = t0;
    while a.closed().is_none() && t < t0 + Duration::from_secs(60) {
        let mut d = Vec::new();
        while a.poll_transmit(t, &mut d) {
            syns += 1;
            d.clear();
        }
        t = a.next_deadline().max(t + Duration::from_millis(1));
        a.on_tick(t);
    }
    assert_eq!(a.closed(), Some(Close::Timeout));
    assert!(
        t <= t0 + lim.handshake + Duration::from_millis(5),
        "closed at {:?}",
        t - t0
    );
    assert!((3..=5).contains(&syns), "{syns} SYNs (1 s, 2 s, 4 s apart)");

    // Connected, then silence: keep-alives go out, the peer is dropped when idle.
    let mut fate = |_| Fate::Deliver;
    let mut net = Net::open(&mut fate);
    let t = net.now + lim.keepalive;
    let mut d = Vec::new();
    assert!(
        net.a.poll_transmit(t, &mut d),
        "a keep-alive after 29 s of sending nothing"
    );
    assert_eq!(parse(&d).unwrap().kind, Kind::State);
    net.a.on_tick(net.now + lim.idle);
    assert_eq!(net.a.closed(), Some(Close::Idle));

    // Our FIN never acknowledged.
    let mut net = Net::open(&mut fate);
    net.round(&mut fate);
    net.a.close();
    let mut d = Vec::new();
    assert!(net.a.poll_transmit(net.now, &mut d));
    assert_eq!(parse(&d).unwrap().kind, Kind::Fin);
    net.a.on_tick(net.now + lim.fin);
    assert_eq!(net.a.closed(), Some(Close::Timeout));
}

#[test]
fn windows_bound_what_either_side_holds() {
    let mut fate = |_| Fate::Deliver;
    let mut net = Net::open(&mut fate);
    let data = pattern(4 << 20);
    let mut off = 0;
    for _ in 0..2000 {
        off += net.a.write(&data[off..]);
        net.round(&mut fate); // B never reads
    }
    let held = net.b.received().len();
    assert!(
        held <= RECV_WINDOW && held > RECV_WINDOW - MSS,
        "B took its window: {held}"
    );
    assert_eq!(off, held + SEND_BUFFER, "A holds at most its send buffer");
    assert_eq!(net.a.writable(), 0);
    assert_eq!(net.a.closed(), None, "a full window is no failure");
    // B reads: the rest flows.
    // B reads: the rest flows (the window reopened by B's STATE).
    let mut got = net.b.received().to_vec();
    net.b.consume(held);
    for _ in 0..20_000 {
        off += net.a.write(&data[off..]);
        net.round(&mut fate);
        got.extend_from_slice(net.b.received());
        net.b.consume(net.b.received().len());
        if got.len() == data.len() {
            break;
        }
    }
    assert!(
        got == data,
        "{} of {} bytes, in order",
        got.len(),
        data.len()
    );
}

#[test]
fn a_reset_closes() {
    let mut fate = |_| Fate::Deliver;
    let mut net = Net::open(&mut fate);
    let mut d = Vec::new();
    super::packet::Packet {
        kind: Kind::Reset,
        conn_id: 100,
        timestamp_us: 0,
        timestamp_diff_us: 0,
        wnd_size: 0,
        seq_nr: 0,
        ack_nr: 0,
        sack: None,
        payload: &[],
    }
    .encode(&mut d);
    net.a.on_packet(&parse(&d).unwrap(), net.now);
    assert_eq!(net.a.closed(), Some(Close::Reset));
    assert!(!net.a.poll_transmit(net.now, &mut d));
}
