//! BEP 52 merkle trees: SHA-256 over 16 KiB blocks, one tree per file.
//!
//! A file's tree has one leaf per 16 KiB block (the last one hashed as it is, shorter), the
//! leaves past the end are zeros, and the number of leaves is a power of two. Its root is
//! the file's `pieces root`. For a file longer than one piece the tree is built over the
//! *piece layer* (one hash per piece, each the root of that piece's blocks padded with zero
//! leaves to a whole piece), padded to a power of two with the root of an all-zero piece;
//! the piece layer is what a torrent's `piece layers` holds. A file of one piece or less has
//! no entry there, and its tree is padded only to the next power of two of its own blocks
//! (as libtorrent 2.0 does).

use std::io::{self, Read};

use sha2::{Digest, Sha256};

/// The unit of a merkle leaf (and of a request).
pub const BLOCK: u64 = 16 * 1024;
/// A SHA-256 digest.
pub type Hash = [u8; 32];
/// The leaf hash of the blocks past a file's end.
pub const ZERO: Hash = [0; 32];

/// A file's merkle tree, as far as the metainfo keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHashes {
    pub root: Hash,
    /// One hash per piece; empty for a file of one piece or less.
    pub piece_layer: Vec<Hash>,
}

/// The parent of two nodes.
pub fn pair(a: &Hash, b: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update(a);
    h.update(b);
    h.finalize().into()
}

/// The root of a tree of `width` leaves (a power of two, at least `leaves.len()`): `leaves`
/// then `pad` for the rest (and, a layer up, the hash of two pads, and so on).
pub fn merkle_root(leaves: &[Hash], width: usize, pad: Hash) -> Hash {
    debug_assert!(width.is_power_of_two() && width >= leaves.len());
    if leaves.is_empty() {
        return pad_root(pad, width);
    }
    let mut layer = leaves.to_vec();
    let mut pad = pad;
    let mut w = width.max(1);
    while w > 1 {
        layer = layer
            .chunks(2)
            .map(|p| pair(&p[0], p.get(1).unwrap_or(&pad)))
            .collect();
        pad = pair(&pad, &pad);
        w /= 2;
    }
    layer[0]
}

/// The root of `width` leaves that are all `pad`.
fn pad_root(mut pad: Hash, mut width: usize) -> Hash {
    while width > 1 {
        pad = pair(&pad, &pad);
        width /= 2;
    }
    pad
}

/// The leaves of a piece of `piece_length` bytes that lies wholly past a file's end: the
/// pad of a piece layer.
pub fn zero_piece(piece_length: u64) -> Hash {
    pad_root(ZERO, (piece_length / BLOCK) as usize)
}

/// The root of a file longer than one piece from its piece layer.
pub fn root_of_layer(layer: &[Hash], piece_length: u64) -> Hash {
    merkle_root(
        layer,
        layer.len().next_power_of_two(),
        zero_piece(piece_length),
    )
}

/// Hashes `length` bytes of `r` into their merkle tree; `progress` is told of every chunk
/// read. `piece_length` is a power of two of at least [`BLOCK`].
pub fn hash_file(
    r: &mut impl Read,
    length: u64,
    piece_length: u64,
    mut progress: impl FnMut(u64),
) -> io::Result<FileHashes> {
    let blocks_per_piece = (piece_length / BLOCK) as usize;
    let mut buf = vec![0u8; piece_length as usize];
    let mut layer = Vec::with_capacity(length.div_ceil(piece_length) as usize);
    let mut left = length;
    let mut single = None;
    while left > 0 {
        let n = left.min(piece_length) as usize;
        r.read_exact(&mut buf[..n])?;
        progress(n as u64);
        let leaves: Vec<Hash> = buf[..n]
            .chunks(BLOCK as usize)
            .map(|b| Sha256::digest(b).into())
            .collect();
        if length <= piece_length {
            single = Some(merkle_root(&leaves, leaves.len().next_power_of_two(), ZERO));
        } else {
            layer.push(merkle_root(&leaves, blocks_per_piece, ZERO));
        }
        left -= n as u64;
    }
    Ok(match single {
        Some(root) => FileHashes {
            root,
            piece_layer: Vec::new(),
        },
        None => FileHashes {
            root: root_of_layer(&layer, piece_length),
            piece_layer: layer,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(b: &[u8]) -> Hash {
        Sha256::digest(b).into()
    }

    #[test]
    fn a_small_file_is_padded_to_its_own_blocks_only() {
        let one = vec![5u8; 10_000];
        let h = hash_file(&mut one.as_slice(), 10_000, 64 * 1024, |_| {}).unwrap();
        assert_eq!(h.root, sha(&one), "one block: the root is the block's hash");
        assert!(h.piece_layer.is_empty());
        let three = vec![6u8; 40_000];
        let h = hash_file(&mut three.as_slice(), 40_000, 64 * 1024, |_| {}).unwrap();
        let l: Vec<Hash> = three.chunks(16384).map(sha).collect();
        assert_eq!(h.root, pair(&pair(&l[0], &l[1]), &pair(&l[2], &ZERO)));
    }

    #[test]
    fn a_long_file_has_a_piece_layer_padded_with_zero_pieces() {
        // 3 pieces of 32 KiB (2 blocks each), the last one 1 block of 100 bytes.
        let data: Vec<u8> = (0..(2 * 32768 + 100)).map(|i| (i % 251) as u8).collect();
        let h = hash_file(&mut data.as_slice(), data.len() as u64, 32768, |_| {}).unwrap();
        let l: Vec<Hash> = data.chunks(16384).map(sha).collect();
        let p = [pair(&l[0], &l[1]), pair(&l[2], &l[3]), pair(&l[4], &ZERO)];
        assert_eq!(h.piece_layer, p);
        let zero_piece = pair(&ZERO, &ZERO);
        assert_eq!(h.root, pair(&pair(&p[0], &p[1]), &pair(&p[2], &zero_piece)));
        // A short read is an error, not a wrong hash.
        assert!(hash_file(&mut &data[..100], 200, 32768, |_| {}).is_err());
    }
}
