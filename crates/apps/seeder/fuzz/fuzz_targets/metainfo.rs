//! `.torrent` bytes and bencode (as in a BEP 10 extension handshake) from anywhere: loading
//! never panics, and a torrent that loads (v1, v2 or hybrid) has a consistent layout.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = lava_torrent::bencode::BencodeElem::from_bytes(data);
    if let Ok(m) = iolab_seeder::metainfo::Meta::from_bytes(data, std::path::Path::new("/nonexistent")) {
        assert_eq!(m.num_pieces() as u64, m.total.div_ceil(m.piece_length));
        match &m.v2 {
            // v2-only: no v1 hashes; hybrid: both.
            Some(v2) => {
                assert!(m.pieces.is_empty() || m.pieces.len() as u64 == m.num_pieces() as u64);
                for f in &v2.files {
                    let e = &m.files[f.index];
                    assert!(!e.pad);
                    assert!(e.length == 0 || e.offset % m.piece_length == 0, "v2 files start at a piece");
                    assert_eq!(f.root.is_none(), e.length == 0);
                }
            }
            None => assert_eq!(m.pieces.len() as u64, m.num_pieces() as u64),
        }
        let last = m.num_pieces() - 1;
        let segs = m.segments(last as u64 * m.piece_length, m.piece_len(last));
        assert_eq!(segs.iter().map(|s| s.2).sum::<u64>(), m.piece_len(last));
        for f in &m.files {
            // A v2 torrent's alignment pad is no file at all (no path on disk); every other
            // file lies under the data directory.
            assert!(
                (f.pad && f.disk_path.as_os_str().is_empty()) || f.disk_path.starts_with("/nonexistent"),
                "{:?} at {:?}",
                f.path,
                f.disk_path
            );
        }
    }
});
