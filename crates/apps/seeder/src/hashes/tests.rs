use std::fs;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::*;
use crate::merkle::ZERO;
use crate::metainfo::{CreateOptions, Meta, MetaVersion};

/// Deterministic bytes, a different run for each `k`.
fn bytes(n: usize, k: u8) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8 ^ k).collect()
}

/// `dir/d/{big (37 blocks + 100 bytes), mid (5 blocks), small (100 bytes)}`.
fn sample(dir: &Path) -> (std::path::PathBuf, Vec<(&'static str, Vec<u8>)>) {
    let d = dir.join("d");
    fs::create_dir_all(&d).unwrap();
    let files = vec![
        ("big", bytes(37 * 16384 + 100, 1)),
        ("mid", bytes(5 * 16384, 2)),
        ("small", bytes(100, 3)),
    ];
    for (name, data) in &files {
        fs::write(d.join(name), data).unwrap();
    }
    (d, files)
}

fn make(src: &Path, version: MetaVersion, piece: u64) -> Meta {
    let opts = CreateOptions {
        piece_length: Some(piece),
        version,
        ..Default::default()
    };
    Meta::create(&[src.to_path_buf()], &opts).unwrap().0
}

/// Every layer of a file's tree from its 16 KiB blocks up, computed here from the data
/// alone (not from the piece layer), layer 0 the blocks padded with zero leaves.
fn full_tree(data: &[u8]) -> Vec<Vec<Hash>> {
    let mut layer: Vec<Hash> = data
        .chunks(BLOCK as usize)
        .map(|b| Sha256::digest(b).into())
        .collect();
    layer.resize(layer.len().next_power_of_two(), ZERO);
    let mut layers = vec![layer];
    while layers[layers.len() - 1].len() > 1 {
        let l = &layers[layers.len() - 1];
        let next = l.chunks(2).map(|p| merkle::pair(&p[0], &p[1])).collect();
        layers.push(next);
    }
    layers
}

fn req(root: Hash, base: u32, index: u32, length: u32, proof_layers: u32) -> HashReq {
    HashReq {
        root,
        base,
        index,
        length,
        proof_layers,
    }
}

#[test]
fn every_valid_request_is_answered_with_the_tree_hashes_and_proves_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let (src, files) = sample(dir.path());
    for piece in [16384u64, 65536] {
        let meta = make(&src, MetaVersion::V2, piece);
        let trees = Trees::new(&meta);
        let piece_height = (piece / BLOCK).trailing_zeros();
        let mut checked = 0;
        for (name, data) in &files {
            let full = full_tree(data);
            let root = full[full.len() - 1][0];
            let served = data.len() as u64 > piece;
            assert_eq!(trees.files.contains_key(&root), served, "{name} at {piece}");
            if !served {
                // The root alone is the proof of a file of one piece: nothing to serve.
                assert_eq!(trees.answer(&req(root, piece_height, 0, 2, 0)), None);
                continue;
            }
            let height = full.len() as u32 - 1;
            for base in piece_height..height {
                let width = full[base as usize].len() as u32;
                let mut length = 1;
                while length <= width {
                    for index in (0..width).step_by(length as usize) {
                        for proof in 0..height - base {
                            let r = req(root, base, index, length, proof);
                            let a = trees.answer(&r).unwrap_or_else(|| panic!("{r:?}"));
                            let want = &full[base as usize][index as usize..][..length as usize];
                            assert_eq!(&a[..length as usize], want, "{name}: {r:?}");
                            let k = length.trailing_zeros();
                            let uncles = (proof + 1).saturating_sub(k) as usize;
                            assert_eq!(a.len(), length as usize + uncles, "{r:?}");
                            // The hashes and uncles fold into the node `proof + 1` layers
                            // above the base (that of the subtree when fewer): the root
                            // with the most proof layers.
                            let up = (base + (proof + 1).max(k)) as usize;
                            let node = full[up][(index >> (up as u32 - base)) as usize];
                            assert_eq!(root_of_answer(&r, &a), Some(node), "{r:?}");
                            if proof == height - base - 1 {
                                assert_eq!(node, root);
                            }
                            checked += 1;
                        }
                    }
                    length *= 2;
                }
            }
        }
        assert!(checked > 50, "{checked} requests checked at {piece}");
    }
}

#[test]
fn requests_out_of_bounds_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let (src, files) = sample(dir.path());
    // 64 KiB pieces: `big` has 10 pieces, 16 in its padded piece layer (height 2), and
    // its root is 4 layers above that.
    let meta = make(&src, MetaVersion::V2, 65536);
    let trees = Trees::new(&meta);
    let full = full_tree(&files[0].1);
    let root = full[full.len() - 1][0];
    assert_eq!(full.len() - 1, 2 + 4);
    assert!(
        trees.answer(&req(root, 2, 0, 16, 3)).is_some(),
        "the largest"
    );
    let bad = [
        req([9; 32], 2, 0, 2, 0),     // no such file
        req(root, 2, 0, 0, 0),        // nothing asked for
        req(root, 2, 0, 3, 0),        // not a power of two
        req(root, 2, 2, 4, 0),        // index not a multiple of the length
        req(root, 2, 16, 2, 0),       // past the layer
        req(root, 2, 8, 16, 0),       // running past it (and unaligned)
        req(root, 1, 0, 2, 0),        // below the piece layer: block hashes are not kept
        req(root, 0, 0, 2, 0),        // the blocks
        req(root, 6, 0, 1, 0),        // the root's layer
        req(root, 7, 0, 1, 0),        // above the root
        req(root, 2, 0, 2, 4),        // a proof layer at the root
        req(root, 2, 0, 2, u32::MAX), // no overflow
        req(root, u32::MAX, u32::MAX, 1 << 31, u32::MAX),
    ];
    for r in bad {
        assert_eq!(trees.answer(&r), None, "{r:?}");
    }
    // More than 512 hashes: a file of 1,025 pieces of 16 KiB (2,048 in the padded layer).
    let d = dir.path().join("long");
    fs::create_dir_all(&d).unwrap();
    fs::write(d.join("x"), bytes(1025 * 16384, 4)).unwrap();
    let meta = make(&d, MetaVersion::V2, 16384);
    let trees = Trees::new(&meta);
    let root = meta.v2.as_ref().unwrap().files[0].root.unwrap();
    let a = trees.answer(&req(root, 0, 1024, 512, 10)).unwrap();
    assert_eq!(a.len(), 512 + 2);
    assert_eq!(trees.answer(&req(root, 0, 0, 1024, 0)), None, "over 512");
    // A v1 torrent has no trees: every request is rejected.
    let v1 = make(&src, MetaVersion::V1, 16384);
    assert!(Trees::new(&v1).files.is_empty());
}

#[test]
fn a_hybrid_serves_the_same_trees_as_its_v2_only_twin() {
    let dir = tempfile::tempdir().unwrap();
    let (src, files) = sample(dir.path());
    let meta = make(&src, MetaVersion::Hybrid, 16384);
    let trees = Trees::new(&meta);
    let full = full_tree(&files[1].1);
    let root = full[full.len() - 1][0];
    let r = req(root, 0, 0, 8, 2);
    let a = trees.answer(&r).unwrap();
    assert_eq!(&a[..8], &full[0][..]);
    assert_eq!(root_of_answer(&r, &a), Some(root));
}
