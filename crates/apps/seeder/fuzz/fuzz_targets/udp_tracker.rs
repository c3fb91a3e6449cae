//! BEP 15 packets from anywhere: a request to `iolab tracker`'s UDP side (connect, announce,
//! scrape, with made-up connection ids) and a tracker's reply to our connect and announce.
//! Never panics; an answer fits one packet; a reply's interval is bounded.
#![no_main]

use std::net::SocketAddr;
use std::time::Duration;

use iolab_seeder::tracker::{Tracker, MAX_NUMWANT, MAX_REANNOUNCE_SECS};
use iolab_seeder::udp_tracker::{
    parse_announce_reply, parse_connect_reply, parse_request, UdpServer,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let srv = UdpServer::new(Tracker::new(Duration::from_secs(60)));
    let from: SocketAddr = "127.0.0.1:6881".parse().unwrap();
    let _ = parse_request(data);
    // Twice: the second announce sees the first one's peer in the swarm.
    for _ in 0..2 {
        if let Some(reply) = srv.answer(data, from) {
            // An announce answer is the largest: 20 bytes and 6 per peer.
            assert!(reply.len() <= 20 + 6 * MAX_NUMWANT, "{} bytes", reply.len());
        }
    }
    if data.len() >= 8 {
        let tid = u32::from_be_bytes([data[4], data[5], data[6], data[7]]);
        let _ = parse_connect_reply(data, tid);
        if let Ok(r) = parse_announce_reply(data, tid) {
            assert!(r.interval <= Duration::from_secs(MAX_REANNOUNCE_SECS));
        }
    }
});
