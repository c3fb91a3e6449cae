//! BEP 52 hash requests served from a torrent's merkle trees: a v2 client that did not get
//! the piece layers in a `.torrent` (a v2 magnet link) asks for them, 512 at most at a
//! time, with the uncle hashes that tie them to the file's root, which it has from the info
//! dictionary.
//!
//! What is kept: each file's piece layer (the metainfo has it), and, built on the first
//! request for that file, the layers above it up to the root (as many hashes again). The
//! block hashes under the piece layer are not kept (reading the file would be needed), so
//! a request below the piece layer is rejected; clients ask for them only when a piece
//! fails its hash check, which our data never does.
//!
//! Bounds (libtorrent's `validate_hash_request` and practice): `length` a power of two, at
//! most [`MAX_HASHES`], `index` a multiple of it and the range inside the layer, `base`
//! below the root's layer, `proof_layers` short of the root; anything else is rejected. An
//! answer is at most [`MAX_HASHES`] hashes and one uncle per layer, copied (the first
//! request for a file hashes its layers, once: as many hashes as its piece layer).

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::merkle::{self, Hash, BLOCK};
use crate::metainfo::Meta;
use crate::wire::HashReq;

/// The most hashes a request may ask for (BEP 52's recommendation and libtorrent's chunk of
/// piece hashes).
pub const MAX_HASHES: u32 = 512;

/// One file's tree from its piece layer up.
#[derive(Debug)]
struct FileTree {
    piece_layer: Vec<Hash>,
    /// Layers from the piece layer (padded to a power of two with the root of an all-zero
    /// piece) to the root, built when first asked for.
    layers: OnceLock<Vec<Vec<Hash>>>,
}

/// The merkle trees of a torrent's files longer than one piece, by their roots.
#[derive(Debug, Default)]
pub struct Trees {
    piece_length: u64,
    /// The piece layer's height above the 16 KiB blocks.
    piece_height: u32,
    files: HashMap<Hash, FileTree>,
}

impl Trees {
    /// The trees of `meta`'s v2 files that have a piece layer (none for a v1 torrent).
    pub fn new(meta: &Meta) -> Trees {
        let files = meta.v2.iter().flat_map(|v| &v.files);
        let layers = files.filter_map(|f| Some((f.root?, f.piece_layer.clone())));
        Trees::of(meta.piece_length, layers)
    }

    /// The trees of files with these roots and piece layers (those of one piece or less,
    /// with an empty layer, have none), pieces of `piece_length` bytes (a power of two of
    /// at least 16 KiB).
    pub fn of(piece_length: u64, layers: impl IntoIterator<Item = (Hash, Vec<Hash>)>) -> Trees {
        let mut files = HashMap::new();
        for (root, piece_layer) in layers {
            if !piece_layer.is_empty() {
                files.entry(root).or_insert_with(|| FileTree {
                    piece_layer,
                    layers: OnceLock::new(),
                });
            }
        }
        Trees {
            piece_length,
            piece_height: (piece_length / BLOCK).max(1).trailing_zeros(),
            files,
        }
    }

    /// The answer to `req`: the hashes asked for, then the uncles from the lowest layer
    /// up; `None` for a request to reject.
    pub fn answer(&self, req: &HashReq) -> Option<Vec<Hash>> {
        let file = self.files.get(&req.root)?;
        let layers = file
            .layers
            .get_or_init(|| build_layers(&file.piece_layer, self.piece_length));
        let top = layers.len() as u64 - 1; // the root's layer, above the piece layer
        let len = req.length as u64;
        if len == 0 || len > MAX_HASHES as u64 || !len.is_power_of_two() {
            return None;
        }
        if req.index as u64 % len != 0 || req.base < self.piece_height {
            return None;
        }
        let h = (req.base - self.piece_height) as u64;
        // The uncle of the highest proof layer must lie below the root.
        if h >= top || req.proof_layers as u64 >= top - h {
            return None;
        }
        let layer = &layers[h as usize];
        let (start, end) = (req.index as u64, req.index as u64 + len);
        if end > layer.len() as u64 {
            return None;
        }
        let mut out = layer[start as usize..end as usize].to_vec();
        // The hashes asked for make a subtree whose root is `log2(len)` layers up; the
        // uncles start at that root's sibling (libtorrent's count: proof layers - log2(len)
        // + 1).
        let first = h + len.trailing_zeros() as u64;
        for g in first..=h + req.proof_layers as u64 {
            let pos = (start >> (g - h)) ^ 1;
            out.push(layers[g as usize][pos as usize]);
        }
        Some(out)
    }
}

/// The layers from `piece_layer` (padded to a power of two with the root of an all-zero
/// piece of `piece_length` bytes) to the root.
fn build_layers(piece_layer: &[Hash], piece_length: u64) -> Vec<Vec<Hash>> {
    let width = piece_layer.len().next_power_of_two();
    let mut layer = piece_layer.to_vec();
    layer.resize(width, merkle::zero_piece(piece_length));
    let mut layers = vec![layer];
    while layers[layers.len() - 1].len() > 1 {
        let next = layers[layers.len() - 1]
            .chunks(2)
            .map(|p| merkle::pair(&p[0], &p[1]))
            .collect();
        layers.push(next);
    }
    layers
}

/// Folds the answer to `req` (hashes, then uncles) into the root it proves: what a client
/// checks against the root it has. `None` if the answer is shorter than the request.
pub fn root_of_answer(req: &HashReq, answer: &[Hash]) -> Option<Hash> {
    let len = req.length as usize;
    if len == 0 || !len.is_power_of_two() || answer.len() < len {
        return None;
    }
    let mut sub = answer[..len].to_vec();
    while sub.len() > 1 {
        sub = sub.chunks(2).map(|p| merkle::pair(&p[0], &p[1])).collect();
    }
    let mut node = sub[0];
    let mut pos = req.index as u64 >> len.trailing_zeros();
    for uncle in &answer[len..] {
        node = if pos % 2 == 0 {
            merkle::pair(&node, uncle)
        } else {
            merkle::pair(uncle, &node)
        };
        pos /= 2;
    }
    Some(node)
}

#[cfg(test)]
mod tests;
