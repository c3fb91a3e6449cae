//! BEP 52 (BitTorrent v2) metainfo: the `file tree` of the info dictionary and the `piece
//! layers` beside it (the hashes themselves: [`crate::merkle`]).
//!
//! Everything here that reads a `.torrent` takes outside data: every length is checked
//! before use, nesting is bounded, and nothing panics (fuzzed through `Meta::from_bytes`).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use lava_torrent::bencode::BencodeElem;
use sha2::{Digest, Sha256};

use super::{
    check_piece_length, hash_pieces, progress_bar, safe_relative, top_level_keys, CreateOptions,
    FileEntry, Meta, MetaVersion,
};
use crate::merkle::{hash_file, root_of_layer, Hash, ZERO};

/// Deepest `file tree` we follow (directory levels of one path).
pub const MAX_DEPTH: usize = 64;
/// Most files a `file tree` may hold.
pub const MAX_FILES: usize = 1_000_000;

/// One file of a `file tree`, in the tree's order (keys sorted bytewise, depth first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeFile {
    pub path: PathBuf,
    pub length: u64,
    /// Absent for an empty file.
    pub root: Option<Hash>,
}

/// The entries of a bencoded dictionary, keys as bytes, in key order; None if `e` is not a
/// dictionary. (The parser gives a dictionary with a non-UTF-8 key as a `RawDictionary`.)
pub fn entries(e: &BencodeElem) -> Option<Vec<(Vec<u8>, &BencodeElem)>> {
    let mut v: Vec<(Vec<u8>, &BencodeElem)> = match e {
        BencodeElem::Dictionary(d) => d.iter().map(|(k, v)| (k.as_bytes().to_vec(), v)).collect(),
        BencodeElem::RawDictionary(d) => d.iter().map(|(k, v)| (k.clone(), v)).collect(),
        _ => return None,
    };
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Some(v)
}

/// The value of `key` in the dictionary `e`.
pub fn get<'a>(e: &'a BencodeElem, key: &str) -> Option<&'a BencodeElem> {
    match e {
        BencodeElem::Dictionary(d) => d.get(key),
        BencodeElem::RawDictionary(d) => d.get(key.as_bytes()),
        _ => None,
    }
}

/// A bencoded string's bytes (text or not).
pub fn bytes(e: &BencodeElem) -> Option<&[u8]> {
    match e {
        BencodeElem::String(s) => Some(s.as_bytes()),
        BencodeElem::Bytes(b) => Some(b),
        _ => None,
    }
}

/// The files of a `file tree`, in its order. Each path component must be a valid UTF-8
/// name (no `/`, not `.` or `..`, not empty); a file is a dictionary whose `""` key holds
/// `length` and, unless it is 0, a 32-byte `pieces root`.
pub fn parse_file_tree(tree: &BencodeElem) -> anyhow::Result<Vec<TreeFile>> {
    let mut out = Vec::new();
    walk_tree(tree, &mut PathBuf::new(), 0, &mut out)?;
    if out.is_empty() {
        bail!("the `file tree` holds no file");
    }
    Ok(out)
}

fn walk_tree(
    node: &BencodeElem,
    path: &mut PathBuf,
    depth: usize,
    out: &mut Vec<TreeFile>,
) -> anyhow::Result<()> {
    if depth > MAX_DEPTH {
        bail!("the `file tree` is deeper than {MAX_DEPTH} levels");
    }
    let items = entries(node).context("a `file tree` node is not a dictionary")?;
    for (key, child) in items {
        if key.is_empty() {
            if depth == 0 {
                bail!("the `file tree` has a file with no name");
            }
            if out.len() >= MAX_FILES {
                bail!("the `file tree` holds more than {MAX_FILES} files");
            }
            out.push(leaf(child, path)?);
            continue;
        }
        let name = std::str::from_utf8(&key)
            .map_err(|_| anyhow::anyhow!("a file name in the `file tree` is not UTF-8"))?;
        if name == "." || name == ".." || name.contains('/') || name.contains('\0') {
            bail!("file name {name:?} in the `file tree` is not a plain name: refused");
        }
        path.push(name);
        let r = walk_tree(child, path, depth + 1, out);
        path.pop();
        r?;
    }
    Ok(())
}

fn leaf(e: &BencodeElem, path: &std::path::Path) -> anyhow::Result<TreeFile> {
    let length = match get(e, "length") {
        Some(BencodeElem::Integer(n)) if *n >= 0 => *n as u64,
        _ => bail!("file {} has no valid `length`", path.display()),
    };
    let root = match get(e, "pieces root").map(bytes) {
        Some(Some(b)) => Some(<Hash>::try_from(b).map_err(|_| {
            anyhow::anyhow!("file {}: `pieces root` is not 32 bytes", path.display())
        })?),
        Some(None) => bail!("file {}: `pieces root` is not a string", path.display()),
        None if length > 0 => bail!("file {} has no `pieces root`", path.display()),
        None => None,
    };
    Ok(TreeFile {
        path: path.to_path_buf(),
        length,
        // An empty file has no tree, whatever a torrent says.
        root: root.filter(|_| length > 0),
    })
}

/// The piece layer of each file longer than one piece from the torrent's `piece layers`,
/// checked: as many hashes as the file has pieces, and their root is the file's.
pub fn piece_layers(
    layers: Option<&BencodeElem>,
    files: &[TreeFile],
    piece_length: u64,
) -> anyhow::Result<Vec<Vec<Hash>>> {
    let map: HashMap<Vec<u8>, &BencodeElem> = match layers {
        Some(l) => entries(l)
            .context("`piece layers` is not a dictionary")?
            .into_iter()
            .collect(),
        None => HashMap::new(),
    };
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let (Some(root), true) = (f.root, f.length > piece_length) else {
            out.push(Vec::new());
            continue;
        };
        let raw = map
            .get(root.as_slice())
            .and_then(|e| bytes(e))
            .with_context(|| format!("`piece layers` has no layer for {}", f.path.display()))?;
        let pieces = f.length.div_ceil(piece_length);
        if raw.len() as u64 != pieces * 32 {
            bail!(
                "the piece layer of {} has {} bytes; {pieces} pieces need {}",
                f.path.display(),
                raw.len(),
                pieces * 32
            );
        }
        let layer: Vec<Hash> = raw
            .chunks_exact(32)
            .map(|c| <Hash>::try_from(c).unwrap_or(ZERO))
            .collect();
        if root_of_layer(&layer, piece_length) != root {
            bail!(
                "the piece layer of {} does not hash to its `pieces root`",
                f.path.display()
            );
        }
        out.push(layer);
    }
    Ok(out)
}

/// The `file tree` of `files` (path inside the torrent, length, root), as bencode.
pub fn file_tree(files: &[(PathBuf, u64, Option<Hash>)]) -> anyhow::Result<BencodeElem> {
    let mut top: HashMap<String, BencodeElem> = HashMap::new();
    for (path, length, root) in files {
        let mut node = &mut top;
        for c in path.iter() {
            let name = c
                .to_str()
                .with_context(|| format!("{} is not valid UTF-8", path.display()))?;
            let next = node
                .entry(name.to_string())
                .or_insert_with(|| BencodeElem::Dictionary(HashMap::new()));
            let BencodeElem::Dictionary(d) = next else {
                bail!("{} is both a file and a directory", path.display());
            };
            node = d;
        }
        let mut leaf = HashMap::new();
        leaf.insert("length".to_string(), BencodeElem::Integer(*length as i64));
        if let Some(r) = root {
            leaf.insert("pieces root".to_string(), BencodeElem::Bytes(r.to_vec()));
        }
        if node
            .insert(String::new(), BencodeElem::Dictionary(leaf))
            .is_some()
        {
            bail!("two files would be {} in the torrent", path.display());
        }
    }
    Ok(BencodeElem::Dictionary(top))
}

/// The v2 side of a torrent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V2Meta {
    /// SHA-256 of the info dictionary (its first 20 bytes are the v2 info hash of the
    /// handshake and the trackers).
    pub info_hash: [u8; 32],
    /// The files of the `file tree`, in its order.
    pub files: Vec<V2File>,
}

/// One file's v2 hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V2File {
    /// Its index in [`Meta::files`].
    pub index: usize,
    /// Absent for an empty file.
    pub root: Option<Hash>,
    /// Empty for a file of one piece or less.
    pub piece_layer: Vec<Hash>,
}

impl V2Meta {
    pub fn info_hash_hex(&self) -> String {
        self.info_hash.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A torrent's v2 keys: its files, their piece layers and the v2 info hash.
type V2Keys = (Vec<TreeFile>, Vec<Vec<Hash>>, [u8; 32]);

/// The v2 keys of a torrent: its files, their piece layers (checked) and the info hash.
fn read_v2(
    top: &BencodeElem,
    info: &BencodeElem,
    torrent: &[u8],
    piece_length: u64,
) -> anyhow::Result<V2Keys> {
    let raw = crate::metadata::raw_info(torrent).context("no info dictionary")?;
    let tree = parse_file_tree(get(info, "file tree").context("no `file tree`")?)?;
    let layers = piece_layers(get(top, "piece layers"), &tree, piece_length)?;
    Ok((tree, layers, Sha256::digest(raw).into()))
}

fn v2_files(tree: &[TreeFile], layers: Vec<Vec<Hash>>, index: &[usize]) -> Vec<V2File> {
    tree.iter()
        .zip(layers)
        .zip(index)
        .map(|((t, piece_layer), &index)| V2File {
            index,
            root: t.root,
            piece_layer,
        })
        .collect()
}

impl Meta {
    /// A v2-only torrent: its files laid out as its pieces are (each from a piece boundary,
    /// the gaps pad entries of zeros), its info hash the truncated SHA-256 of the info.
    pub(crate) fn from_v2_only(
        top: &BencodeElem,
        info: &BencodeElem,
        torrent: &[u8],
        data: &Path,
    ) -> anyhow::Result<Meta> {
        let name = get(info, "name")
            .and_then(bytes)
            .and_then(|b| std::str::from_utf8(b).ok())
            .context("no valid `name`")?
            .to_string();
        safe_relative(Path::new(&name)).context("the torrent's name")?;
        if name.contains('/') {
            bail!("the torrent's name {name:?} contains '/'");
        }
        let piece_length = match get(info, "piece length") {
            Some(BencodeElem::Integer(n)) if *n > 0 => *n as u64,
            _ => bail!("no valid `piece length`"),
        };
        check_piece_length(piece_length)?;
        let (tree, layers, info_hash) = read_v2(top, info, torrent, piece_length)?;
        let multi = !(tree.len() == 1 && tree[0].path == Path::new(&name));
        let mut files = Vec::with_capacity(tree.len() * 2);
        let mut index = Vec::with_capacity(tree.len());
        let mut offset = 0u64;
        for (i, t) in tree.iter().enumerate() {
            if i > 0 && t.length > 0 {
                offset = pad_to_piece(&mut files, offset, piece_length)?;
            }
            index.push(files.len());
            files.push(FileEntry {
                path: t.path.clone(),
                disk_path: match multi {
                    true => data.join(&name).join(&t.path),
                    false => data.join(&name),
                },
                length: t.length,
                offset,
                pad: false,
            });
            offset = offset
                .checked_add(t.length)
                .context("total length overflows")?;
        }
        if offset == 0 {
            bail!("the torrent holds no data (total length 0)");
        }
        // The last file is padded to a piece boundary too, as BEP 52's reference
        // implementation and libtorrent 2.0 lay a v2 torrent out: its last piece is a whole
        // piece, zeros past the data, and libtorrent asks for all of it (a request we
        // refused as beyond the torrent, so its download never finished).
        offset = pad_to_piece(&mut files, offset, piece_length)?;
        if offset.div_ceil(piece_length) > u32::MAX as u64 {
            bail!("more than 2^32 pieces");
        }
        let mut meta = Meta {
            info_hash: info_hash[..20].try_into().unwrap_or([0; 20]),
            name,
            piece_length,
            pieces: Vec::new(),
            files,
            total: offset,
            multi,
            announce: get(top, "announce")
                .and_then(bytes)
                .and_then(|b| String::from_utf8(b.to_vec()).ok()),
            announce_list: announce_list(top),
            info: Vec::new(),
            version: MetaVersion::V2,
            v2: Some(V2Meta {
                info_hash,
                files: v2_files(&tree, layers, &index),
            }),
            private: false,
            web_seeds: Vec::new(),
            comment: None,
        };
        meta.set_info(torrent);
        Ok(meta)
    }

    /// A hybrid torrent's v2 side, checked against its v1 side: the same files in the same
    /// order, each starting at a piece boundary (BEP 52).
    pub(crate) fn attach_v2(
        &mut self,
        top: &BencodeElem,
        info: &BencodeElem,
        torrent: &[u8],
    ) -> anyhow::Result<()> {
        let (tree, layers, info_hash) = read_v2(top, info, torrent, self.piece_length)?;
        let real: Vec<usize> = (0..self.files.len())
            .filter(|&i| !self.files[i].pad)
            .collect();
        if real.len() != tree.len() {
            bail!(
                "{} files in the v1 list, {} in the `file tree`: not the same torrent",
                real.len(),
                tree.len()
            );
        }
        for (&i, t) in real.iter().zip(&tree) {
            let f = &self.files[i];
            if f.path != t.path || f.length != t.length {
                bail!(
                    "v1 has {} ({} bytes) where the `file tree` has {} ({} bytes)",
                    f.path.display(),
                    f.length,
                    t.path.display(),
                    t.length
                );
            }
            if f.length > 0 && f.offset % self.piece_length != 0 {
                bail!(
                    "{} does not start at a piece boundary (a pad file is missing before it)",
                    f.path.display()
                );
            }
        }
        self.version = MetaVersion::Hybrid;
        self.v2 = Some(V2Meta {
            info_hash,
            files: v2_files(&tree, layers, &real),
        });
        Ok(())
    }

    /// Checks every file against its merkle root (and says which piece differs).
    pub(crate) fn verify_v2(&self, v2: &V2Meta, progress: bool) -> anyhow::Result<()> {
        let bar = progress_bar(self.total, "checking", progress);
        for vf in &v2.files {
            let (Some(root), Some(f)) = (vf.root, self.files.get(vf.index)) else {
                continue;
            };
            let mut fh = fs::File::open(&f.disk_path)
                .with_context(|| format!("opening {}", f.disk_path.display()))?;
            let got = hash_file(&mut fh, f.length, self.piece_length, |n| bar.inc(n))
                .with_context(|| format!("reading {}", f.disk_path.display()))?;
            if got.root != root {
                let bad = got
                    .piece_layer
                    .iter()
                    .zip(&vf.piece_layer)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0) as u64;
                bail!(
                    "piece {} ({} at byte {}) does not match its v2 hash: the data is not the \
                     torrent's",
                    f.offset / self.piece_length + bad,
                    f.disk_path.display(),
                    bad * self.piece_length
                );
            }
        }
        bar.finish_and_clear();
        Ok(())
    }
}

/// A pad entry from `offset` to the next piece boundary (none when on one); the boundary.
fn pad_to_piece(files: &mut Vec<FileEntry>, offset: u64, piece_length: u64) -> anyhow::Result<u64> {
    let end = offset
        .checked_next_multiple_of(piece_length)
        .context("total length overflows")?;
    if end > offset {
        files.push(pad_entry(end - offset, offset));
    }
    Ok(end)
}

fn pad_entry(length: u64, offset: u64) -> FileEntry {
    let path: PathBuf = [".pad".to_string(), length.to_string()].iter().collect();
    FileEntry {
        disk_path: PathBuf::new(),
        path,
        length,
        offset,
        pad: true,
    }
}

fn announce_list(top: &BencodeElem) -> Vec<Vec<String>> {
    let Some(BencodeElem::List(tiers)) = get(top, "announce-list") else {
        return Vec::new();
    };
    let text = |e: &BencodeElem| bytes(e).and_then(|b| String::from_utf8(b.to_vec()).ok());
    tiers
        .iter()
        .filter_map(|t| match t {
            BencodeElem::List(urls) => Some(urls.iter().filter_map(text).collect()),
            _ => None,
        })
        .collect()
}

fn dict(items: Vec<(&str, BencodeElem)>) -> BencodeElem {
    BencodeElem::Dictionary(items.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// A v1 `files` entry.
fn v1_file(f: &FileEntry) -> BencodeElem {
    let path = f
        .path
        .iter()
        .map(|c| BencodeElem::String(c.to_string_lossy().into_owned()))
        .collect();
    let mut items = vec![
        ("length", BencodeElem::Integer(f.length as i64)),
        ("path", BencodeElem::List(path)),
    ];
    if f.pad {
        items.push(("attr", BencodeElem::String("p".into())));
    }
    dict(items)
}

/// Makes a v2 or hybrid torrent of `list` (path inside the torrent, disk path, length).
/// Multi-file: the files in `file tree` order (sorted by path, bytewise); a hybrid's v1
/// list has a BEP 47 pad file (`.pad/N`, `attr` `p`) after each file that does not end on
/// a piece boundary, the last one too (as libtorrent 2.0 makes them: the same files and
/// piece size give the same info hashes). The result is read back through
/// [`Meta::from_bytes`], so a created torrent passes the checks of a loaded one.
pub(crate) fn create(
    mut list: Vec<(PathBuf, PathBuf, u64)>,
    name: String,
    multi: bool,
    piece_length: u64,
    opts: &CreateOptions,
) -> anyhow::Result<(Meta, Vec<u8>)> {
    if multi {
        list.sort_by(|a, b| a.0.iter().cmp(b.0.iter()));
    }
    let total: u64 = list.iter().map(|x| x.2).sum();
    let bar = progress_bar(total, "hashing (v2)", opts.progress);
    let mut tree = Vec::with_capacity(list.len());
    let mut layers = HashMap::new();
    for (path, disk, length) in &list {
        let root = match length {
            0 => None,
            _ => {
                let mut fh =
                    fs::File::open(disk).with_context(|| format!("opening {}", disk.display()))?;
                let h = hash_file(&mut fh, *length, piece_length, |n| bar.inc(n))
                    .with_context(|| format!("reading {}", disk.display()))?;
                if !h.piece_layer.is_empty() {
                    let layer = BencodeElem::Bytes(h.piece_layer.concat());
                    layers.insert(h.root.to_vec(), layer);
                }
                Some(h.root)
            }
        };
        tree.push((path.clone(), *length, root));
    }
    bar.finish_and_clear();
    let mut info = vec![
        ("file tree", file_tree(&tree)?),
        ("meta version", BencodeElem::Integer(2)),
        ("name", BencodeElem::String(name.clone())),
        ("piece length", BencodeElem::Integer(piece_length as i64)),
    ];
    if opts.private {
        info.push(("private", BencodeElem::Integer(1)));
    }
    if opts.version == MetaVersion::Hybrid {
        let mut files = Vec::with_capacity(list.len() * 2);
        let mut offset = 0u64;
        for (path, disk, length) in &list {
            files.push(FileEntry {
                path: path.clone(),
                disk_path: disk.clone(),
                length: *length,
                offset,
                pad: false,
            });
            offset += length;
            let pad = offset.next_multiple_of(piece_length) - offset;
            if multi && pad > 0 {
                files.push(pad_entry(pad, offset));
                offset += pad;
            }
        }
        let pieces = hash_pieces(&files, piece_length, offset, opts.progress, "hashing (v1)")?;
        info.push(("pieces", BencodeElem::Bytes(pieces.concat())));
        match multi {
            true => info.push((
                "files",
                BencodeElem::List(files.iter().map(v1_file).collect()),
            )),
            false => info.push(("length", BencodeElem::Integer(offset as i64))),
        }
    }
    let mut top: HashMap<String, BencodeElem> = top_level_keys(opts)?.into_iter().collect();
    top.insert("info".into(), dict(info));
    top.insert("piece layers".into(), BencodeElem::RawDictionary(layers));
    if let Some(a) = &opts.announce {
        top.insert("announce".into(), BencodeElem::String(a.clone()));
    }
    let bytes = BencodeElem::Dictionary(top).encode();
    let mut meta =
        Meta::from_bytes(&bytes, Path::new("")).context("reading back the torrent just made")?;
    let mut disk = list.iter().map(|x| &x.1);
    for f in meta.files.iter_mut().filter(|f| !f.pad) {
        f.disk_path = disk.next().context("a file went missing")?.clone();
    }
    Ok((meta, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `dir/{a (40,000 bytes), empty, sub/b (100), c (3 × 16 KiB)}`.
    fn sample(dir: &Path) -> PathBuf {
        let d = dir.join("d");
        fs::create_dir_all(d.join("sub")).unwrap();
        let bytes = |n: usize, k: u8| (0..n).map(|i| (i * 7 % 253) as u8 ^ k).collect::<Vec<u8>>();
        fs::write(d.join("a"), bytes(40_000, 1)).unwrap();
        fs::write(d.join("empty"), b"").unwrap();
        fs::write(d.join("sub/b"), bytes(100, 2)).unwrap();
        fs::write(d.join("c"), bytes(3 * 16384, 3)).unwrap();
        d
    }

    fn make(src: &Path, version: MetaVersion, piece: u64) -> (Meta, Vec<u8>) {
        let opts = CreateOptions {
            piece_length: Some(piece),
            version,
            private: true,
            comment: Some("hello".into()),
            web_seeds: vec!["http://w/x/".into()],
            ..Default::default()
        };
        Meta::create(&[src.to_path_buf()], &opts).unwrap()
    }

    #[test]
    fn a_created_v2_torrent_loads_back_and_its_data_checks() {
        let dir = tempfile::tempdir().unwrap();
        let src = sample(dir.path());
        let (m, bytes) = make(&src, MetaVersion::V2, 32768);
        let back = Meta::from_bytes(&bytes, dir.path()).unwrap();
        assert_eq!(back.version, MetaVersion::V2);
        assert!(back.pieces.is_empty(), "no v1 hashes");
        let v2 = back.v2.clone().unwrap();
        assert_eq!(
            back.info_hash[..],
            v2.info_hash[..20],
            "BEP 52: truncated SHA-256"
        );
        assert_eq!(back.info_hash, m.info_hash);
        assert_eq!(back.info_hashes(), [back.info_hash], "v2-only: one name");
        let info = crate::metadata::raw_info(&bytes).unwrap();
        assert_eq!(v2.info_hash, <[u8; 32]>::from(Sha256::digest(info)));
        assert_eq!(back.info, info, "kept for BEP 9: its hash is the info hash");
        assert!(!info.windows(8).any(|w| w == b"6:pieces"), "no v1 pieces");
        // Tree order: a, c, empty, sub/b; each non-empty file from a piece boundary (an
        // empty one takes no room).
        let real: Vec<(String, u64)> = back
            .files
            .iter()
            .filter(|f| !f.pad)
            .map(|f| (f.path.display().to_string(), f.offset))
            .collect();
        assert_eq!(
            real,
            [("a", 0), ("c", 65536), ("empty", 114688), ("sub/b", 131072)]
                .map(|(p, o)| (p.to_string(), o))
        );
        // The last file's piece is whole: zeros after its 100 bytes, as libtorrent asks.
        assert_eq!(back.total, 5 * 32768);
        assert_eq!(back.num_pieces(), 5);
        assert_eq!(back.piece_len(4), 32768);
        let tail = back.files.last().unwrap();
        assert!(tail.pad && tail.offset == 131072 + 100, "{tail:?}");
        assert_eq!(
            v2.files
                .iter()
                .filter(|f| !f.piece_layer.is_empty())
                .count(),
            2
        );
        assert!(back.private && back.comment.as_deref() == Some("hello"));
        assert_eq!(back.web_seeds, ["http://w/x/"]);
        back.verify(false).unwrap();
        // One byte changed in c's second piece: that piece is named.
        let mut c = fs::read(src.join("c")).unwrap();
        c[32768 + 5] ^= 0xff;
        fs::write(src.join("c"), c).unwrap();
        let e = back.verify(false).unwrap_err().to_string();
        assert!(e.starts_with("piece 3 ("), "{e}");
    }

    #[test]
    fn a_created_hybrid_torrent_has_pad_files_and_both_sides_agree() {
        let dir = tempfile::tempdir().unwrap();
        let src = sample(dir.path());
        let (m, bytes) = make(&src, MetaVersion::Hybrid, 32768);
        let back = Meta::from_bytes(&bytes, dir.path()).unwrap();
        assert_eq!(back.version, MetaVersion::Hybrid);
        assert_eq!(
            (back.info_hash, back.v2.clone()),
            (m.info_hash, m.v2.clone())
        );
        let info = crate::metadata::raw_info(&bytes).unwrap();
        assert_eq!(back.info_hash, <[u8; 20]>::from(sha1::Sha1::digest(info)));
        let v2_hash = back.v2.as_ref().unwrap().info_hash;
        assert_eq!(back.info_hashes()[1][..], v2_hash[..20]);
        assert_eq!(back.info_hashes().len(), 2);
        // Pads after a (24,768 bytes), c (16,384) and the last file, sub/b.
        let pads: Vec<u64> = back
            .files
            .iter()
            .filter(|f| f.pad)
            .map(|f| f.length)
            .collect();
        assert_eq!(pads, [25536, 16384, 32668]);
        assert_eq!(back.total % 32768, 0);
        assert_eq!(back.pieces.len() as u32, back.num_pieces());
        back.verify(false).unwrap();
        assert!(back.private);
        // A v1 list that is not the file tree's: refused.
        let mut top = BencodeElem::from_bytes(&bytes).unwrap().remove(0);
        let BencodeElem::Dictionary(t) = &mut top else {
            panic!()
        };
        let Some(BencodeElem::Dictionary(info)) = t.get_mut("info") else {
            panic!()
        };
        let Some(BencodeElem::List(files)) = info.get_mut("files") else {
            panic!()
        };
        let BencodeElem::Dictionary(first) = &mut files[0] else {
            panic!()
        };
        first.insert(
            "path".into(),
            BencodeElem::List(vec![BencodeElem::String("z".into())]),
        );
        let e = Meta::from_bytes(&top.encode(), dir.path()).unwrap_err();
        assert!(format!("{e:#}").contains("v1 has z"), "{e:#}");
    }

    #[test]
    fn a_v1_torrent_keeps_private_comment_and_web_seeds() {
        let dir = tempfile::tempdir().unwrap();
        let src = sample(dir.path());
        let (m, bytes) = make(&src, MetaVersion::V1, 16384);
        let back = Meta::from_bytes(&bytes, dir.path()).unwrap();
        assert_eq!(
            (back.version, back.info_hash),
            (MetaVersion::V1, m.info_hash)
        );
        assert!(back.v2.is_none() && back.private);
        assert_eq!(back.comment.as_deref(), Some("hello"));
        assert_eq!(back.web_seeds, ["http://w/x/"]);
        assert!(bytes.windows(10).any(|w| w == b"7:privatei"));
        let bad = CreateOptions {
            web_seeds: vec!["ftp://x".into()],
            ..Default::default()
        };
        assert!(
            Meta::create(&[src], &bad).is_err(),
            "BEP 19 here: http(s) only"
        );
    }

    #[test]
    fn file_trees_round_trip_and_bad_ones_are_errors() {
        let files = vec![
            (PathBuf::from("a"), 5, Some([1; 32])),
            (PathBuf::from("d/b"), 0, None),
            (PathBuf::from("d/c"), 7, Some([2; 32])),
        ];
        let tree = file_tree(&files).unwrap();
        let back = BencodeElem::from_bytes(tree.encode()).unwrap();
        let got = parse_file_tree(&back[0]).unwrap();
        let want: Vec<TreeFile> = files
            .iter()
            .map(|(p, l, r)| TreeFile {
                path: p.clone(),
                length: *l,
                root: *r,
            })
            .collect();
        assert_eq!(got, want);
        assert!(file_tree(&[files[0].clone(), files[0].clone()]).is_err());
        for bad in [
            &b"de"[..],                                 // no file
            b"d2:..d0:d6:lengthi0eeee",                 // `..`
            b"d1:ad0:d6:lengthi5eeee",                  // no pieces root
            b"d1:ad0:d6:lengthi5e11:pieces root1:xeee", // short root
            b"d1:ad0:d6:lengthi-1eeee",                 // negative
            b"d0:d6:lengthi0eee",                       // a file with no name
        ] {
            let e = BencodeElem::from_bytes(bad).unwrap();
            assert!(
                parse_file_tree(&e[0]).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn piece_layers_are_checked_against_the_root() {
        let data = vec![9u8; 3 * 16384];
        let h = hash_file(&mut data.as_slice(), data.len() as u64, 16384, |_| {}).unwrap();
        let f = TreeFile {
            path: "x".into(),
            length: data.len() as u64,
            root: Some(h.root),
        };
        let layer: Vec<u8> = h.piece_layer.concat();
        let mut d = HashMap::new();
        d.insert(h.root.to_vec(), BencodeElem::Bytes(layer.clone()));
        let ok = BencodeElem::RawDictionary(d.clone());
        assert_eq!(
            piece_layers(Some(&ok), std::slice::from_ref(&f), 16384).unwrap(),
            vec![h.piece_layer.clone()]
        );
        let mut wrong = layer.clone();
        wrong[0] ^= 1;
        d.insert(h.root.to_vec(), BencodeElem::Bytes(wrong));
        let bad = BencodeElem::RawDictionary(d);
        assert!(piece_layers(Some(&bad), std::slice::from_ref(&f), 16384).is_err());
        assert!(piece_layers(None, std::slice::from_ref(&f), 16384).is_err());
        // One piece or less: no layer needed.
        assert_eq!(
            piece_layers(None, std::slice::from_ref(&f), 65536).unwrap(),
            vec![Vec::<Hash>::new()]
        );
    }
}
