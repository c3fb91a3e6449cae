//! uTP datagrams from anywhere (BEP 29). One datagram: parsing never panics, and what parses
//! encodes back to the same packet. A stream of datagrams cut by length bytes, fed to a
//! connection accepted from a SYN: whatever arrives, what it holds received stays within its
//! receive window, it takes no more to send than it said it had room for, every datagram it sends
//! parses, and once the peer falls silent its deadlines close it.
#![no_main]

use std::time::{Duration, Instant};

use iolab_seeder::utp::conn::{Conn, Deadlines, RECV_WINDOW};
use iolab_seeder::utp::packet::{self, Kind, Packet};
use libfuzzer_sys::fuzz_target;

/// Datagrams a connection may send in answer to one event (a full window of 1,400-byte
/// packets is ~190): more means it does not stop.
const MAX_SENDS_PER_EVENT: usize = 4096;

fn drain(c: &mut Conn, now: Instant) {
    let mut sent = 0;
    let mut out = Vec::new();
    while c.poll_transmit(now, &mut out) {
        let p = packet::parse(&out).expect("a datagram we send parses");
        assert!(p.payload.len() <= packet::MSS);
        out.clear();
        sent += 1;
        assert!(sent <= MAX_SENDS_PER_EVENT, "poll_transmit does not stop");
    }
}

fn check_one(d: &[u8]) {
    if let Ok(p) = packet::parse(d) {
        let mut out = Vec::new();
        p.encode(&mut out);
        assert_eq!(packet::parse(&out).expect("an encoded packet parses"), p);
    }
}

fuzz_target!(|data: &[u8]| {
    check_one(data);
    let start = Instant::now();
    let mut now = start;
    let syn = Packet {
        kind: Kind::Syn,
        conn_id: 0x1234,
        timestamp_us: 0,
        timestamp_diff_us: 0,
        wnd_size: 1 << 20,
        seq_nr: 100,
        ack_nr: 0,
        sack: None,
        payload: &[],
    };
    let mut c = Conn::accept(&syn, 5000, now, Deadlines::default());
    drain(&mut c, now);
    let mut rest = data;
    // Each event: a control byte. High bit: the clock moves on by the low bits × 50 ms (a
    // tick). Else a datagram of that many bytes follows, its connection id set to ours (the
    // multiplexer matches ids before a connection sees a packet); what it carries is also
    // written back, and half the received bytes read.
    while let Some((&ctl, tail)) = rest.split_first() {
        if ctl & 0x80 != 0 {
            now += Duration::from_millis(50 * u64::from(ctl & 0x7F));
            c.on_tick(now);
            rest = tail;
        } else {
            let len = (ctl as usize).min(tail.len());
            let mut d = tail[..len].to_vec();
            rest = &tail[len..];
            if d.len() >= 4 {
                d[2..4].copy_from_slice(&c.recv_id().to_be_bytes());
            }
            if let Ok(p) = packet::parse(&d) {
                c.on_packet(&p, now);
                let room = c.writable();
                let wrote = c.write(p.payload);
                assert!(wrote <= room.min(p.payload.len()));
            }
            let half = c.received().len() / 2;
            c.consume(half);
        }
        assert!(c.received().len() <= RECV_WINDOW);
        drain(&mut c, now);
    }
    // The peer falls silent: ticks at each deadline close the connection by the idle limit
    // at the latest (the handshake, FIN and retransmission limits all come sooner).
    let silent = now;
    for _ in 0..10_000 {
        if c.closed().is_some() {
            break;
        }
        now = c.next_deadline().max(now + Duration::from_millis(1));
        c.on_tick(now);
        drain(&mut c, now);
    }
    assert!(c.closed().is_some(), "still open {:?} after the peer fell silent", now - silent);
    assert!(now - silent <= Deadlines::default().idle + Duration::from_secs(1));
});
