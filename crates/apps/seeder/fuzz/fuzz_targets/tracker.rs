//! The tracker's side of HTTP from anywhere: a request to `iolab tracker` (request line,
//! query string, percent-encoding) and a tracker's reply to our announce. Never panics; an
//! answered announce is bencode; a reply's interval is bounded.
#![no_main]

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use iolab_seeder::tracker::{parse_announce_reply, Tracker, MAX_REANNOUNCE_SECS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let t = Tracker::new(Duration::from_secs(60));
    let from = IpAddr::V4(Ipv4Addr::LOCALHOST);
    // The same bytes twice: the second request sees the first one's peer in the swarm.
    for _ in 0..2 {
        let (status, body) = t.handle(data, from);
        assert!(matches!(status, 200 | 400 | 404 | 405));
        assert!(lava_torrent::bencode::BencodeElem::from_bytes(&body).is_ok());
    }
    if let Ok(r) = parse_announce_reply("http://fuzz/announce", data) {
        assert!(r.interval <= Duration::from_secs(MAX_REANNOUNCE_SECS));
        assert!(std::time::Instant::now().checked_add(r.interval).is_some());
    }
});
