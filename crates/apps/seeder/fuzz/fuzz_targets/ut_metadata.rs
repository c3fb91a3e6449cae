//! BEP 9 and BEP 10 input from anywhere: a peer's extension handshake, its ut_metadata
//! messages, and the info dictionary found in a `.torrent`. Never panics; an answer is
//! one metadata piece at most; the raw info lies inside the file.
#![no_main]

use iolab_seeder::metadata::{answer, parse_message, peer_handshake, raw_info, METADATA_PIECE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = peer_handshake(data);
    if let Ok(Some(piece)) = parse_message(data) {
        let a = answer(data, piece);
        assert!(a.len() <= METADATA_PIECE + 100, "{} bytes", a.len());
    }
    if let Some(info) = raw_info(data) {
        assert!(info.len() < data.len());
    }
});
