//! The peer message parser on arbitrary bytes: a handshake, then a stream of messages, as
//! the seeder reads them. Never panics; every message consumed is within the limits; a
//! BEP 52 hash request (its root one of a small torrent's files, picked by its first byte)
//! is answered with at most 512 hashes and one uncle a layer, which prove the file's root
//! when all the proof layers are asked for, or rejected.
#![no_main]

use std::sync::OnceLock;

use iolab_seeder::hashes::{self, Trees};
use iolab_seeder::merkle::{self, Hash};
use iolab_seeder::wire::{self, Handshake, Limits};
use libfuzzer_sys::fuzz_target;

/// Three files of 2, 5 and 600 pieces of 32 KiB (arbitrary piece hashes), and their roots.
fn trees() -> &'static (Trees, Vec<Hash>) {
    static T: OnceLock<(Trees, Vec<Hash>)> = OnceLock::new();
    T.get_or_init(|| {
        let layers: Vec<Vec<Hash>> = [2u32, 5, 600]
            .iter()
            .map(|&n| (0..n).map(|i| [(i * 7 + n) as u8; 32]).collect())
            .collect();
        let roots: Vec<Hash> = layers.iter().map(|l| merkle::root_of_layer(l, 32768)).collect();
        let trees = Trees::of(32768, roots.iter().copied().zip(layers));
        (trees, roots)
    })
}

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
        if let wire::Message::HashRequest(mut req) = msg {
            let (trees, roots) = trees();
            if let Some(&root) = roots.get(req.root[0] as usize % 4) {
                req.root = root;
            }
            if let Some(answer) = trees.answer(&req) {
                assert!(answer.len() >= req.length as usize);
                assert!(answer.len() <= hashes::MAX_HASHES as usize + 32);
                let proved = hashes::root_of_answer(&req, &answer);
                assert!(proved.is_some());
                // The piece layer is layer 1 (32 KiB pieces); the 600-piece file's root is
                // 10 layers above it.
                if req.base + req.proof_layers == 10 && req.root == roots[2] {
                    assert_eq!(proved, Some(roots[2]));
                }
            }
        }
        let mut out = Vec::new();
        wire::encode(&msg, &mut out);
        pos += n;
    }
});
