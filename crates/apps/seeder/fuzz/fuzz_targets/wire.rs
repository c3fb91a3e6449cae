//! The peer message parser on arbitrary bytes: a handshake, then a stream of messages, as
//! the seeder reads them. Never panics; every message consumed is within the limits.
#![no_main]

use iolab_seeder::wire::{self, Handshake, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Handshake::parse(data);
    // The torrent's piece count comes from the first two bytes (1..=65536).
    let npieces = data.first().map(|b| *b as u32 * 256 + 1).unwrap_or(1);
    let limits = Limits::for_pieces(npieces);
    let mut pos = 0;
    while let Ok(Some((msg, n))) = wire::parse(&data[pos..], limits) {
        assert!(n >= 4 && n <= 4 + limits.max_message as usize);
        if let wire::Message::Request { index, begin, length } = msg {
            let _ = wire::check_request(index, begin, length, npieces, |_| 1 << 20);
        }
        let mut out = Vec::new();
        wire::encode(&msg, &mut out);
        pos += n;
    }
});
