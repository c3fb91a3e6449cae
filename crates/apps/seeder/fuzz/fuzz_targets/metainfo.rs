//! `.torrent` bytes and bencode (as in a BEP 10 extension handshake) from anywhere: loading
//! never panics, and a torrent that loads has a consistent layout.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = lava_torrent::bencode::BencodeElem::from_bytes(data);
    if let Ok(m) = iolab_seeder::metainfo::Meta::from_bytes(data, std::path::Path::new("/nonexistent")) {
        assert_eq!(m.pieces.len() as u64, m.total.div_ceil(m.piece_length));
        let last = m.num_pieces() - 1;
        let segs = m.segments(last as u64 * m.piece_length, m.piece_len(last));
        assert_eq!(segs.iter().map(|s| s.2).sum::<u64>(), m.piece_len(last));
        for f in &m.files {
            assert!(f.disk_path.starts_with("/nonexistent"));
        }
    }
});
