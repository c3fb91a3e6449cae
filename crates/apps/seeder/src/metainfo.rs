//! Metainfo (`.torrent`): create one from files, load an existing one, check the data
//! against the piece hashes. v1 (BEP 3) here, with bencode and the v1 structure from the
//! `lava_torrent` crate; v2 and hybrid (BEP 52) in [`v2`]. This module adds the
//! layout (which bytes of which file make a piece), path safety, the hash check with a
//! progress bar, and the optional keys: `private` (BEP 27), `url-list` (BEP 19 web seeds),
//! `comment`.

use std::fs;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context as _};
use indicatif::{ProgressBar, ProgressStyle};
use lava_torrent::bencode::BencodeElem;
use lava_torrent::torrent::v1::{File as LtFile, Torrent};
use sha1::{Digest, Sha1};

pub mod v2;

pub use v2::{V2File, V2Meta};

/// Smallest piece we create or accept: one request block.
pub const MIN_PIECE: u64 = 16 * 1024;
/// Largest piece we create or accept (libtorrent's own upper bound for creation is 16 MiB).
pub const MAX_PIECE: u64 = 64 * 1024 * 1024;
/// Largest `.torrent` file read (libtorrent's default `max_metadata_size` is 30 MiB... for
/// the info dict; a whole file of 64 MiB is far beyond any real torrent).
pub const MAX_TORRENT_FILE: u64 = 64 * 1024 * 1024;

/// One file of the torrent: where it sits in the torrent's byte stream and on disk.
#[derive(Debug, Clone)]
pub struct FileEntry {
    /// Path inside the torrent (relative, components checked: no `..`, no root).
    pub path: PathBuf,
    /// Where the data is on this machine.
    pub disk_path: PathBuf,
    pub length: u64,
    /// Offset of the file's first byte in the concatenation of all files.
    pub offset: u64,
    /// A BEP 47 pad file (`attr` holds `p`, or under `.pad/`): zeros, never on disk.
    pub pad: bool,
}

/// Which metainfo format a torrent has (BEP 52).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetaVersion {
    /// SHA-1 `pieces` only (BEP 3).
    #[default]
    V1,
    /// `meta version` 2, `file tree` and `piece layers` only: SHA-256 merkle trees.
    V2,
    /// Both: v1 `pieces` over files padded to piece boundaries (BEP 47), and the v2 keys.
    Hybrid,
}

impl MetaVersion {
    pub fn name(self) -> &'static str {
        match self {
            MetaVersion::V1 => "v1",
            MetaVersion::V2 => "v2",
            MetaVersion::Hybrid => "hybrid",
        }
    }
}

/// A loaded or created torrent.
#[derive(Debug, Clone)]
pub struct Meta {
    /// The info hash of the handshake and the tracker: SHA-1 of the info dictionary, or
    /// for a v2-only torrent its SHA-256 truncated to 20 bytes (BEP 52).
    pub info_hash: [u8; 20],
    pub name: String,
    pub piece_length: u64,
    /// The v1 SHA-1 piece hashes; empty for a v2-only torrent (its hashes are in `v2`).
    pub pieces: Vec<[u8; 20]>,
    /// The files in piece order, pad files included (a v2-only torrent's are implied:
    /// each file starts at a piece boundary, so the gaps are pads with no entry in it).
    pub files: Vec<FileEntry>,
    pub total: u64,
    /// True for a torrent with a `files` list (even of one file).
    pub multi: bool,
    pub announce: Option<String>,
    /// BEP 12 `announce-list`: tiers of tracker URLs (empty when the torrent has none).
    pub announce_list: Vec<Vec<String>>,
    /// The raw info dictionary (BEP 9 serves it); empty if its SHA-1 is not the info hash.
    pub info: Vec<u8>,
    pub version: MetaVersion,
    /// The v2 side (v2-only and hybrid torrents).
    pub v2: Option<V2Meta>,
    /// BEP 27 `private`: peers only from the trackers (no DHT, PEX or LSD; Hekate has none
    /// of them anyway).
    pub private: bool,
    /// BEP 19 `url-list`: HTTP servers that hold the same files.
    pub web_seeds: Vec<String>,
    pub comment: Option<String>,
}

/// How to make a torrent.
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// Piece size in bytes; None = chosen from the total size.
    pub piece_length: Option<u64>,
    pub announce: Option<String>,
    /// Name of a multi-file torrent made of several paths (default: "files").
    pub name: Option<String>,
    pub progress: bool,
    pub version: MetaVersion,
    /// BEP 19 web seeds (http:// or https:// URLs).
    pub web_seeds: Vec<String>,
    /// BEP 27: `private` = 1 in the info dictionary.
    pub private: bool,
    pub comment: Option<String>,
}

/// What a created torrent says it was made by.
pub fn created_by() -> String {
    format!("iolab-seeder {}", env!("CARGO_PKG_VERSION"))
}

/// The top-level keys of a created torrent besides `info` (and v2's `piece layers`).
pub(crate) fn top_level_keys(opts: &CreateOptions) -> anyhow::Result<Vec<(String, BencodeElem)>> {
    let mut keys = vec![("created by".to_string(), BencodeElem::String(created_by()))];
    if let Some(c) = &opts.comment {
        keys.push(("comment".to_string(), BencodeElem::String(c.clone())));
    }
    if !opts.web_seeds.is_empty() {
        for url in &opts.web_seeds {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                bail!("web seed {url:?} is not an http:// or https:// URL (BEP 19)");
            }
        }
        let list = opts.web_seeds.iter().cloned().map(BencodeElem::String);
        keys.push(("url-list".to_string(), BencodeElem::List(list.collect())));
    }
    Ok(keys)
}

/// The piece size chosen for `total` bytes: about 1,000 to 2,000 pieces, a power of two
/// between 16 KiB and 4 MiB (what mktorrent and libtorrent aim for).
pub fn auto_piece_length(total: u64) -> u64 {
    let target = (total / 1500).max(1);
    target.next_power_of_two().clamp(MIN_PIECE, 4 * 1024 * 1024)
}

pub(crate) fn check_piece_length(p: u64) -> anyhow::Result<()> {
    if !p.is_power_of_two() || !(MIN_PIECE..=MAX_PIECE).contains(&p) {
        bail!(
            "piece length {p} is not a power of two between {} KiB and {} MiB",
            MIN_PIECE / 1024,
            MAX_PIECE >> 20
        );
    }
    Ok(())
}

pub(crate) fn safe_relative(p: &Path) -> anyhow::Result<()> {
    if p.as_os_str().is_empty() {
        bail!("a file has an empty path");
    }
    for c in p.components() {
        match c {
            Component::Normal(s) if !s.is_empty() => {}
            _ => bail!(
                "file path {:?} leaves the torrent's directory (absolute, `..` or `.`): refused",
                p
            ),
        }
    }
    Ok(())
}

impl Meta {
    /// Reads a `.torrent` file; `data` is the directory holding the torrent's data (a
    /// single-file torrent's file is `data/NAME`, a multi-file torrent's files are under
    /// `data/NAME/`).
    pub fn load(torrent: &Path, data: &Path) -> anyhow::Result<Meta> {
        let len = fs::metadata(torrent)
            .with_context(|| format!("reading {}", torrent.display()))?
            .len();
        if len > MAX_TORRENT_FILE {
            bail!(
                "{}: {len} bytes, larger than the {} MiB a .torrent may have",
                torrent.display(),
                MAX_TORRENT_FILE >> 20
            );
        }
        let bytes = fs::read(torrent).with_context(|| format!("reading {}", torrent.display()))?;
        Meta::from_bytes(&bytes, data)
            .with_context(|| format!("{} is not a valid .torrent", torrent.display()))
    }

    /// Parses the bytes of a `.torrent`. Never panics; every malformation is an error.
    pub fn from_bytes(bytes: &[u8], data: &Path) -> anyhow::Result<Meta> {
        if bytes.is_empty() {
            bail!("the file is empty");
        }
        // The whole torrent as bencode, for the keys lava_torrent's v1 view does not give.
        let top = BencodeElem::from_bytes(bytes)
            .ok()
            .and_then(|v| v.into_iter().next());
        let info = top.as_ref().and_then(|t| v2::get(t, "info"));
        let v2 = info
            .is_some_and(|i| matches!(v2::get(i, "meta version"), Some(BencodeElem::Integer(2))));
        let has_pieces = info.is_some_and(|i| v2::get(i, "pieces").is_some());
        let mut meta = match (top.as_ref(), info) {
            (Some(top), Some(info)) if !has_pieces && v2 => {
                Meta::from_v2_only(top, info, bytes, data)?
            }
            (_, Some(info)) if !has_pieces && v2::get(info, "file tree").is_some() => {
                bail!(
                    "a `file tree` without `meta version` 2 or v1 `pieces`: not a torrent we know"
                )
            }
            _ => {
                let t = Torrent::read_from_bytes(bytes).map_err(|e| {
                    anyhow::anyhow!("malformed bencode or metainfo ({e}); a truncated download?")
                })?;
                let mut meta = Meta::from_torrent(&t, data)?;
                meta.set_info(bytes);
                if let (Some(top), Some(info), true) = (top.as_ref(), info, v2) {
                    meta.attach_v2(top, info, bytes)
                        .context("the v2 side of this hybrid torrent")?;
                }
                meta
            }
        };
        if let (Some(top), Some(info)) = (top.as_ref(), info) {
            meta.read_optional_keys(top, info);
        }
        Ok(meta)
    }

    /// `private`, `url-list` and `comment` (none of them required; a malformed one is left
    /// out).
    fn read_optional_keys(&mut self, top: &BencodeElem, info: &BencodeElem) {
        use v2::{bytes, get};
        self.private = matches!(get(info, "private"), Some(BencodeElem::Integer(1)));
        let text = |e: &BencodeElem| bytes(e).and_then(|b| String::from_utf8(b.to_vec()).ok());
        self.comment = get(top, "comment").and_then(text);
        self.web_seeds = match get(top, "url-list") {
            Some(BencodeElem::List(l)) => l.iter().filter_map(text).collect(),
            Some(one) => text(one).into_iter().collect(),
            None => Vec::new(),
        };
        self.web_seeds.retain(|u| !u.is_empty());
    }

    /// Keeps the raw info dictionary of `torrent` when its hash is our info hash (SHA-1, or
    /// SHA-256 truncated for a v2-only torrent).
    pub(crate) fn set_info(&mut self, torrent: &[u8]) {
        use sha1::Digest as _;
        if let Some(info) = crate::metadata::raw_info(torrent) {
            let v1 = sha1::Sha1::digest(info);
            let v2 = sha2::Sha256::digest(info);
            let h = match self.version {
                MetaVersion::V2 => &v2[..20],
                _ => &v1[..],
            };
            if h == self.info_hash {
                self.info = info.to_vec();
            }
        }
    }

    fn from_torrent(t: &Torrent, data: &Path) -> anyhow::Result<Meta> {
        if t.piece_length <= 0 {
            bail!("piece length {} is not positive", t.piece_length);
        }
        let piece_length = t.piece_length as u64;
        check_piece_length(piece_length)?;
        safe_relative(Path::new(&t.name)).context("the torrent's name")?;
        if t.name.contains('/') {
            bail!("the torrent's name {:?} contains '/'", t.name);
        }
        let mut files = Vec::new();
        let mut offset = 0u64;
        let multi = t.files.is_some();
        match &t.files {
            Some(list) => {
                if list.is_empty() {
                    bail!("the `files` list is empty");
                }
                for f in list {
                    if f.length < 0 {
                        bail!("file {:?} has a negative length", f.path);
                    }
                    safe_relative(&f.path)?;
                    files.push(FileEntry {
                        path: f.path.clone(),
                        disk_path: data.join(&t.name).join(&f.path),
                        length: f.length as u64,
                        offset,
                        pad: is_pad(f),
                    });
                    offset = offset
                        .checked_add(f.length as u64)
                        .context("total length overflows")?;
                }
            }
            None => {
                if t.length < 0 {
                    bail!("negative length");
                }
                files.push(FileEntry {
                    path: PathBuf::from(&t.name),
                    disk_path: data.join(&t.name),
                    length: t.length as u64,
                    offset: 0,
                    pad: false,
                });
                offset = t.length as u64;
            }
        }
        let total = offset;
        if total == 0 {
            bail!("the torrent holds no data (total length 0)");
        }
        let npieces = total.div_ceil(piece_length);
        if t.pieces.len() as u64 != npieces {
            bail!(
                "{} piece hashes for {total} bytes in pieces of {piece_length}: {npieces} expected",
                t.pieces.len()
            );
        }
        let mut pieces = Vec::with_capacity(t.pieces.len());
        for p in &t.pieces {
            let h: [u8; 20] = p
                .as_slice()
                .try_into()
                .map_err(|_| anyhow::anyhow!("a piece hash is not 20 bytes"))?;
            pieces.push(h);
        }
        let mut info_hash = [0u8; 20];
        info_hash.copy_from_slice(&t.info_hash_bytes());
        Ok(Meta {
            info_hash,
            name: t.name.clone(),
            piece_length,
            pieces,
            files,
            total,
            multi,
            announce: t.announce.clone(),
            announce_list: t.announce_list.clone().unwrap_or_default(),
            info: Vec::new(),
            version: MetaVersion::V1,
            v2: None,
            private: false,
            web_seeds: Vec::new(),
            comment: None,
        })
    }

    /// Makes a torrent of `paths`: one regular file gives a single-file torrent; one
    /// directory a multi-file torrent named after it (files in name order, recursively);
    /// several paths a multi-file torrent named `opts.name`. Returns the metainfo and the
    /// encoded `.torrent`.
    pub fn create(paths: &[PathBuf], opts: &CreateOptions) -> anyhow::Result<(Meta, Vec<u8>)> {
        if paths.is_empty() {
            bail!("no file or directory given");
        }
        // (path in torrent, disk path, length)
        let mut list: Vec<(PathBuf, PathBuf, u64)> = Vec::new();
        let name;
        let multi;
        if paths.len() == 1 {
            let p = &paths[0];
            let md = fs::metadata(p).with_context(|| format!("reading {}", p.display()))?;
            name = file_name(p)?;
            if md.is_dir() {
                multi = true;
                walk(p, Path::new(""), &mut list)?;
                if list.is_empty() {
                    bail!("{} holds no file", p.display());
                }
            } else if md.is_file() {
                multi = false;
                list.push((PathBuf::from(&name), p.clone(), md.len()));
            } else {
                bail!("{} is neither a file nor a directory", p.display());
            }
        } else {
            multi = true;
            name = opts.name.clone().unwrap_or_else(|| "files".to_string());
            for p in paths {
                let md = fs::metadata(p).with_context(|| format!("reading {}", p.display()))?;
                let base = PathBuf::from(file_name(p)?);
                if md.is_dir() {
                    walk(p, &base, &mut list)?;
                } else {
                    list.push((base, p.clone(), md.len()));
                }
            }
            let mut seen = std::collections::HashSet::new();
            for (tp, _, _) in &list {
                if !seen.insert(tp.clone()) {
                    bail!("two files would be {} in the torrent", tp.display());
                }
            }
        }
        let total: u64 = list.iter().map(|x| x.2).sum();
        if total == 0 {
            bail!("nothing to share: every file is empty");
        }
        let piece_length = opts
            .piece_length
            .unwrap_or_else(|| auto_piece_length(total));
        check_piece_length(piece_length)?;
        if opts.version != MetaVersion::V1 {
            return v2::create(list, name, multi, piece_length, opts);
        }

        let mut files = Vec::new();
        let mut offset = 0;
        for (tp, dp, len) in &list {
            files.push(FileEntry {
                path: tp.clone(),
                disk_path: dp.clone(),
                length: *len,
                offset,
                pad: false,
            });
            offset += len;
        }
        let pieces = hash_pieces(&files, piece_length, total, opts.progress, "hashing")?;
        let t = Torrent {
            announce: opts.announce.clone(),
            announce_list: None,
            length: total as i64,
            files: if multi {
                Some(
                    files
                        .iter()
                        .map(|f| LtFile {
                            length: f.length as i64,
                            path: f.path.clone(),
                            extra_fields: None,
                        })
                        .collect(),
                )
            } else {
                None
            },
            name: name.clone(),
            piece_length: piece_length as i64,
            pieces: pieces.iter().map(|p| p.to_vec()).collect(),
            extra_fields: Some(top_level_keys(opts)?.into_iter().collect()),
            extra_info_fields: opts
                .private
                .then(|| [("private".to_string(), BencodeElem::Integer(1))].into()),
        };
        let mut info_hash = [0u8; 20];
        info_hash.copy_from_slice(&t.info_hash_bytes());
        let bytes = t.encode().map_err(|e| anyhow::anyhow!("encoding: {e}"))?;
        let mut meta = Meta {
            info_hash,
            name,
            piece_length,
            pieces,
            files,
            total,
            multi,
            announce: opts.announce.clone(),
            announce_list: Vec::new(),
            info: Vec::new(),
            version: MetaVersion::V1,
            v2: None,
            private: opts.private,
            web_seeds: opts.web_seeds.clone(),
            comment: opts.comment.clone(),
        };
        meta.set_info(&bytes);
        Ok((meta, bytes))
    }

    /// The trackers to announce to, as BEP 12 tiers: `announce-list` when the torrent has
    /// one (its `announce` is then ignored, as BEP 12 says), else `announce` alone.
    pub fn tracker_tiers(&self) -> Vec<Vec<String>> {
        let tiers: Vec<Vec<String>> = self
            .announce_list
            .iter()
            .filter(|t| !t.is_empty())
            .cloned()
            .collect();
        if !tiers.is_empty() {
            return tiers;
        }
        self.announce.iter().map(|a| vec![a.clone()]).collect()
    }

    /// Pieces in the torrent (v1 and hybrid: as many as `pieces` has hashes).
    pub fn num_pieces(&self) -> u32 {
        self.total.div_ceil(self.piece_length) as u32
    }

    /// Length of piece `i` (the last one may be shorter).
    pub fn piece_len(&self, i: u32) -> u64 {
        let start = i as u64 * self.piece_length;
        (self.total - start).min(self.piece_length)
    }

    /// The file pieces of the byte range `[off, off+len)`: (file index, offset in file,
    /// length), in order, skipping empty files.
    pub fn segments(&self, off: u64, len: u64) -> Vec<(usize, u64, u64)> {
        let mut out = Vec::new();
        let end = off + len;
        // First file whose end is past `off`.
        let mut i = self.files.partition_point(|f| f.offset + f.length <= off);
        let mut pos = off;
        while pos < end && i < self.files.len() {
            let f = &self.files[i];
            if f.length > 0 {
                let in_file = pos - f.offset;
                let n = (f.length - in_file).min(end - pos);
                out.push((i, in_file, n));
                pos += n;
            }
            i += 1;
        }
        out
    }

    /// Checks that every file is there with its size and every piece matches its hash.
    pub fn verify(&self, progress: bool) -> anyhow::Result<()> {
        for f in self.files.iter().filter(|f| !f.pad) {
            let md = fs::metadata(&f.disk_path)
                .with_context(|| format!("data file {} is missing", f.disk_path.display()))?;
            if md.len() != f.length {
                bail!(
                    "data file {} has {} bytes, the torrent says {}: not the torrent's data",
                    f.disk_path.display(),
                    md.len(),
                    f.length
                );
            }
        }
        if let (MetaVersion::V2, Some(v2)) = (self.version, &self.v2) {
            return self.verify_v2(v2, progress);
        }
        let got = hash_pieces(
            &self.files,
            self.piece_length,
            self.total,
            progress,
            "checking",
        )?;
        for (i, (a, b)) in got.iter().zip(&self.pieces).enumerate() {
            if a != b {
                let off = i as u64 * self.piece_length;
                let segs = self.segments(off, self.piece_len(i as u32));
                let where_ = segs
                    .iter()
                    .map(|(f, o, _)| format!("{} at byte {o}", self.files[*f].disk_path.display()))
                    .collect::<Vec<_>>()
                    .join(", ");
                let bad = got.iter().zip(&self.pieces).filter(|(a, b)| a != b).count();
                bail!(
                    "piece {i} ({where_}) does not match its hash ({bad} of {} pieces differ): \
                     the data is not the torrent's",
                    self.pieces.len()
                );
            }
        }
        Ok(())
    }

    /// Every info hash a peer may name this torrent by (in its handshake, and as MSE's
    /// SKEY): `info_hash`, then for a hybrid its v2 hash truncated to 20 bytes (BEP 52);
    /// the [`crate::seed::Host`] routes by all of them.
    pub fn info_hashes(&self) -> Vec<[u8; 20]> {
        let mut v = vec![self.info_hash];
        if let (MetaVersion::Hybrid, Some(v2)) = (self.version, &self.v2) {
            v.extend(<[u8; 20]>::try_from(&v2.info_hash[..20]));
        }
        v
    }

    pub fn info_hash_hex(&self) -> String {
        self.info_hash.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// BEP 47: a file whose `attr` holds `p` is padding; so is one under `.pad/` (the older
/// convention, which libtorrent's hybrid torrents also follow).
fn is_pad(f: &LtFile) -> bool {
    let attr = f.extra_fields.as_ref().and_then(|x| x.get("attr"));
    let by_attr = match attr {
        Some(lava_torrent::bencode::BencodeElem::String(a)) => a.contains('p'),
        Some(lava_torrent::bencode::BencodeElem::Bytes(a)) => a.contains(&b'p'),
        _ => false,
    };
    by_attr
        || f.path
            .components()
            .next()
            .is_some_and(|c| c.as_os_str() == ".pad")
}

fn file_name(p: &Path) -> anyhow::Result<String> {
    let canon = fs::canonicalize(p).with_context(|| format!("reading {}", p.display()))?;
    let n = canon
        .file_name()
        .with_context(|| format!("{} has no name", p.display()))?;
    n.to_str()
        .map(str::to_string)
        .with_context(|| format!("{} is not valid UTF-8", p.display()))
}

pub(crate) fn walk(
    dir: &Path,
    prefix: &Path,
    out: &mut Vec<(PathBuf, PathBuf, u64)>,
) -> anyhow::Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("listing {}", dir.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name();
        let name = name
            .to_str()
            .with_context(|| format!("{:?} in {} is not valid UTF-8", name, dir.display()))?;
        let ft = e.file_type()?;
        let tp = prefix.join(name);
        if ft.is_dir() {
            walk(&e.path(), &tp, out)?;
        } else if ft.is_file() {
            out.push((tp, e.path(), e.metadata()?.len()));
        }
        // Symlinks, sockets and devices are not followed or shared.
    }
    Ok(())
}

/// A progress bar over `total` bytes saying `what` (hidden unless `progress`).
pub(crate) fn progress_bar(total: u64, what: &str, progress: bool) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(total);
    b.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    b.set_message(what.to_string());
    b
}

/// SHA-1 of every piece of the concatenated files, read sequentially.
pub(crate) fn hash_pieces(
    files: &[FileEntry],
    piece_length: u64,
    total: u64,
    progress: bool,
    what: &str,
) -> anyhow::Result<Vec<[u8; 20]>> {
    let bar = progress_bar(total, what, progress);
    let mut pieces = Vec::with_capacity(total.div_ceil(piece_length) as usize);
    let mut hasher = Sha1::new();
    let mut in_piece = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for f in files {
        if f.length == 0 {
            continue;
        }
        // BEP 47: a pad file's bytes are zeros, with no file behind them.
        let mut fh = match f.pad {
            true => None,
            false => Some(
                fs::File::open(&f.disk_path)
                    .with_context(|| format!("opening {}", f.disk_path.display()))?,
            ),
        };
        let mut left = f.length;
        while left > 0 {
            let want = (piece_length - in_piece).min(left).min(buf.len() as u64) as usize;
            let n = match &mut fh {
                None => {
                    buf[..want].fill(0);
                    want
                }
                Some(fh) => fh
                    .read(&mut buf[..want])
                    .with_context(|| format!("reading {}", f.disk_path.display()))?,
            };
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "{} is shorter than the {} bytes expected",
                        f.disk_path.display(),
                        f.length
                    ),
                ))
                .context("data does not match");
            }
            hasher.update(&buf[..n]);
            in_piece += n as u64;
            left -= n as u64;
            bar.inc(n as u64);
            if in_piece == piece_length {
                pieces.push(hasher.finalize_reset().into());
                in_piece = 0;
            }
        }
    }
    if in_piece > 0 {
        pieces.push(hasher.finalize_reset().into());
    }
    bar.finish_and_clear();
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_piece_sizes() {
        assert_eq!(auto_piece_length(1), MIN_PIECE);
        assert_eq!(auto_piece_length(64 << 20), 64 * 1024);
        assert_eq!(auto_piece_length(1 << 40), 4 << 20);
    }

    #[test]
    fn segments_cross_files_and_skip_empty() {
        let d = tempfile::tempdir().unwrap();
        let mk = |n: &str, len: u64| {
            let p = d.path().join(n);
            fs::write(&p, vec![7u8; len as usize]).unwrap();
            p
        };
        let paths = vec![mk("a", 20_000), mk("b", 0), mk("c", 30_000)];
        let (m, bytes) = Meta::create(
            &paths,
            &CreateOptions {
                piece_length: Some(16384),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(m.num_pieces(), 4);
        assert_eq!(m.piece_len(3), 50_000 - 3 * 16384);
        assert_eq!(
            m.segments(16384, 16384),
            vec![(0, 16384, 3616), (2, 0, 12768)]
        );
        // Round trip through the encoded form gives the same info hash.
        let back = Meta::from_bytes(&bytes, d.path()).unwrap();
        assert_eq!(back.info_hash, m.info_hash);
        assert_eq!(back.files.len(), 3);
    }
}
