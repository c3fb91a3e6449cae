//! Path resolution under the root and the shared file cache.
//!
//! Resolution on a cache miss opens the candidate path, then asks the kernel where the open
//! descriptor really lives (`/proc/self/fd/N`, or `realpath` when /proc is absent) and refuses
//! it unless that path is under the canonical root. Checking the opened descriptor rather than
//! the name closes the race where a component is swapped for a symlink between check and use.
//!
//! A cache hit older than `CacheConfig::revalidate_after` costs one `stat` of the path the
//! entry was loaded from; the entry is used only if device, inode, size, mtime and ctime all
//! still match, so an edited, replaced or re-linked file is reloaded (and re-checked against
//! the root). Younger hits cost no system call at all.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::response::content_type;

/// Settings of the file cache shared by every connection of a [`crate::Site`].
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Files larger than this (or than `capacity`) are never cached nor read whole: each
    /// response streams them from disk in chunks of [`crate::STREAM_CHUNK`] bytes.
    pub max_cached_file: u64,
    /// Total bytes of cached bodies; when an insertion would exceed it, the cache is emptied
    /// first (a static site's working set is expected to fit).
    pub capacity: u64,
    /// A cached file is re-validated (one `stat`) at most this often; in between, hits cost
    /// no system call. `Duration::ZERO` stats on every hit. A file changed on disk is served
    /// fresh at the latest this long after the change.
    pub revalidate_after: Duration,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            max_cached_file: 16 * 1024 * 1024,
            capacity: 256 * 1024 * 1024,
            revalidate_after: Duration::from_millis(200),
        }
    }
}

/// What a request path maps to.
pub(crate) enum Lookup {
    /// A regular file.
    File(FileRef),
    /// A directory named without its trailing slash: redirect to this (encoded) path.
    Redirect(Vec<u8>),
    /// 403, 404 or 500.
    Status(u16),
}

/// A regular file to answer with: its header lines, validators and body.
pub(crate) struct FileRef {
    pub(crate) fields: FileFields,
    pub(crate) len: u64,
    pub(crate) body: Body,
}

/// What every response about a file says of it, built once when the file is opened.
#[derive(Clone)]
pub(crate) struct FileFields {
    /// The `Content-Type: ...\r\n` line.
    pub(crate) content_type: Bytes,
    /// The `Last-Modified` (when the mtime is representable) and `ETag` lines, each ending
    /// in CRLF: sent with 200, 206 and 304 alike.
    pub(crate) validators: Bytes,
    /// The entity tag, quotes included: `"<mtime hex>-<size hex>"`.
    pub(crate) etag: Bytes,
    /// Modification time in whole seconds since the epoch (`Last-Modified` resolution).
    pub(crate) mtime: Option<u64>,
}

/// Where a file's bytes come from.
pub(crate) enum Body {
    /// Whole in memory, shared with the cache.
    Memory(Bytes),
    /// Too large to cache: read from this open descriptor in bounded chunks as the response
    /// is sent, so that a response never holds the whole file.
    Disk(Arc<File>),
    /// A cache miss on a file small enough to cache: opened and checked, not read yet. The
    /// session reads it whole (itself, or through the model: [`crate::FileReads`]) and hands
    /// the bytes to [`Files::finish_load`], which caches them.
    Load(Arc<Load>),
}

/// A file opened on a cache miss, waiting for its bytes to be read and cached.
pub(crate) struct Load {
    pub(crate) file: Arc<File>,
    key: Box<[u8]>,
    source: Source,
}

/// Where cached bytes come from: the file as it was when opened.
#[derive(Clone)]
struct Source {
    /// The path that was opened (not canonicalised), so that a symlink change along it is
    /// seen by the validating `stat` as a different inode.
    fs_path: PathBuf,
    id: FileId,
    fields: FileFields,
}

/// Identity and version of a file: any change means the cached bytes may be stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
    ctime: i64,
    ctime_nsec: i64,
}

impl FileId {
    fn of(m: &Metadata) -> FileId {
        FileId {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
            ctime: m.ctime(),
            ctime_nsec: m.ctime_nsec(),
        }
    }
}

struct Entry {
    source: Source,
    body: Bytes,
    /// When `id` was last confirmed, in nanoseconds since `Files::epoch`.
    checked: AtomicU64,
}

#[derive(Default)]
struct Cache {
    map: HashMap<Box<[u8]>, Arc<Entry>>,
    bytes: u64,
}

pub(crate) struct Files {
    root: PathBuf,
    config: CacheConfig,
    cache: RwLock<Cache>,
    epoch: Instant,
    revalidate_ns: u64,
    /// Test hook ([`crate::Site::inject_read_delay`]): every read of a file's bytes takes at
    /// least this long, in nanoseconds; 0 (always, unless a test sets it) for none.
    read_delay_ns: AtomicU64,
}

impl Files {
    pub(crate) fn new(root: PathBuf, config: CacheConfig) -> Files {
        Files {
            root,
            revalidate_ns: u64::try_from(config.revalidate_after.as_nanos()).unwrap_or(u64::MAX),
            config,
            cache: RwLock::new(Cache::default()),
            epoch: Instant::now(),
            read_delay_ns: AtomicU64::new(0),
        }
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// Number of cached files and their total size.
    pub(crate) fn cache_usage(&self) -> (usize, u64) {
        let cache = self.cache.read().unwrap_or_else(|e| e.into_inner());
        (cache.map.len(), cache.bytes)
    }

    /// See [`crate::Site::inject_read_delay`].
    pub(crate) fn set_read_delay(&self, delay: Duration) {
        let ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.read_delay_ns.store(ns, Ordering::Relaxed);
    }

    pub(crate) fn read_delay(&self) -> Duration {
        Duration::from_nanos(self.read_delay_ns.load(Ordering::Relaxed))
    }

    /// As [`Files::lookup_deferred`], with a cache miss read at once on this thread (for
    /// callers that need the whole body now: `direct`).
    pub(crate) fn lookup(&self, key: &[u8]) -> Lookup {
        match self.lookup_deferred(key) {
            Lookup::File(mut file) => {
                if let Body::Load(load) = &file.body {
                    let len = usize::try_from(file.len).unwrap_or(usize::MAX);
                    let data = match read_at_blocking(&load.file, 0, len, self.read_delay()) {
                        Ok(data) if data.len() == len => Bytes::from(data),
                        // A short read: the file changed while read; nothing true to serve.
                        _ => return Lookup::Status(500),
                    };
                    self.finish_load(load, data.clone());
                    file.body = Body::Memory(data);
                }
                Lookup::File(file)
            }
            other => other,
        }
    }

    /// Caches the bytes read for `load`, unless the file changed size meanwhile.
    pub(crate) fn finish_load(&self, load: &Load, body: Bytes) {
        if body.len() as u64 != load.source.id.len {
            return;
        }
        self.insert(
            &load.key,
            Entry {
                source: load.source.clone(),
                body,
                checked: AtomicU64::new(self.now_ns()),
            },
        );
    }

    /// `key` is a normalised, percent-decoded path: starts with `/`, no empty, `.` or `..`
    /// segment, no NUL; ends with `/` only when the request named a directory. A hit is
    /// answered from memory; a miss opens and checks the file (on this thread: `open`,
    /// `fstat`, the root check) but leaves its bytes unread ([`Body::Load`] or
    /// [`Body::Disk`]).
    pub(crate) fn lookup_deferred(&self, key: &[u8]) -> Lookup {
        let hit = {
            let cache = self.cache.read().unwrap_or_else(|e| e.into_inner());
            cache.map.get(key).cloned()
        };
        if let Some(entry) = hit {
            let now = self.now_ns();
            // A stat costs a system call (17 us on a loaded VM): skip it while the last
            // confirmation is recent enough.
            let fresh = self.revalidate_ns > 0
                && now.saturating_sub(entry.checked.load(Ordering::Relaxed)) < self.revalidate_ns;
            if fresh {
                return Lookup::File(entry.file_ref());
            }
            if let Ok(m) = std::fs::metadata(&entry.source.fs_path) {
                if m.is_file() && FileId::of(&m) == entry.source.id {
                    entry.checked.store(now, Ordering::Relaxed);
                    return Lookup::File(entry.file_ref());
                }
            }
            self.forget(key);
        }
        self.resolve(key)
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn forget(&self, key: &[u8]) {
        let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = cache.map.remove(key) {
            cache.bytes -= old.body.len() as u64;
        }
    }

    fn resolve(&self, key: &[u8]) -> Lookup {
        let trailing = key.ends_with(b"/");
        let rel = key.strip_prefix(b"/").unwrap_or(key);
        let rel = rel.strip_suffix(b"/").unwrap_or(rel);
        let mut path = self.root.join(OsStr::from_bytes(rel));
        let (mut file, mut meta) = match self.open_under_root(&path) {
            Ok(v) => v,
            Err(status) => return Lookup::Status(status),
        };
        if meta.is_dir() {
            if !trailing {
                return Lookup::Redirect(encode_location(key));
            }
            path.push("index.html");
            (file, meta) = match self.open_under_root(&path) {
                Ok(v) => v,
                Err(status) => return Lookup::Status(status),
            };
        } else if trailing {
            // "/file.txt/" names a directory that does not exist.
            return Lookup::Status(404);
        }
        if !meta.is_file() {
            // Directories (an index.html that is a directory), FIFOs, sockets and devices
            // are never served; opening was harmless thanks to O_NONBLOCK.
            return Lookup::Status(404);
        }
        let len = meta.len();
        let mtime = u64::try_from(meta.mtime()).ok();
        let etag = entity_tag(meta.mtime(), len);
        let mut ct = Vec::with_capacity(64);
        ct.extend_from_slice(b"Content-Type: ");
        ct.extend_from_slice(content_type(path.as_os_str().as_bytes()).as_bytes());
        ct.extend_from_slice(b"\r\n");
        let mut validators = Vec::with_capacity(80);
        if let Some(secs) = mtime {
            validators.extend_from_slice(b"Last-Modified: ");
            push_http_date(&mut validators, secs);
            validators.extend_from_slice(b"\r\n");
        }
        validators.extend_from_slice(b"ETag: ");
        validators.extend_from_slice(&etag);
        validators.extend_from_slice(b"\r\n");
        let fields = FileFields {
            content_type: Bytes::from(ct),
            validators: Bytes::from(validators),
            etag,
            mtime,
        };
        if len > self.config.max_cached_file.min(self.config.capacity) {
            // Never read whole: the session streams it in bounded chunks.
            return Lookup::File(FileRef {
                fields,
                len,
                body: Body::Disk(Arc::new(file)),
            });
        }
        Lookup::File(FileRef {
            fields: fields.clone(),
            len,
            body: Body::Load(Arc::new(Load {
                file: Arc::new(file),
                key: key.into(),
                source: Source {
                    fs_path: path,
                    id: FileId::of(&meta),
                    fields,
                },
            })),
        })
    }

    fn insert(&self, key: &[u8], entry: Entry) {
        let size = entry.body.len() as u64;
        if size > self.config.capacity {
            return;
        }
        let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = cache.map.remove(key) {
            cache.bytes -= old.body.len() as u64;
        }
        if cache.bytes + size > self.config.capacity {
            cache.map.clear();
            cache.bytes = 0;
        }
        cache.bytes += size;
        cache.map.insert(key.into(), Arc::new(entry));
    }

    /// Opens `path` without blocking (a FIFO must not hang the server) and returns it only if
    /// the opened object lies under the root.
    fn open_under_root(&self, path: &Path) -> Result<(File, Metadata), u16> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(|e| open_error_status(&e))?;
        let meta = file.metadata().map_err(|_| 500u16)?;
        let real = match std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
            Ok(real) => real,
            Err(_) => {
                // No /proc: resolve the name instead, and make sure it still names the very
                // file that was opened.
                let real = std::fs::canonicalize(path).map_err(|e| open_error_status(&e))?;
                let m = std::fs::metadata(&real).map_err(|e| open_error_status(&e))?;
                if (m.dev(), m.ino()) != (meta.dev(), meta.ino()) {
                    return Err(404);
                }
                real
            }
        };
        if real.starts_with(&self.root) {
            Ok((file, meta))
        } else {
            Err(404)
        }
    }
}

impl Entry {
    fn file_ref(&self) -> FileRef {
        FileRef {
            fields: self.source.fields.clone(),
            len: self.body.len() as u64,
            body: Body::Memory(self.body.clone()),
        }
    }
}

/// A strong entity tag from modification time and size, `"<mtime hex>-<size hex>"`: the
/// form nginx uses, so that a client switching between the two sees the same validators.
fn entity_tag(mtime: i64, len: u64) -> Bytes {
    Bytes::from(format!("\"{mtime:x}-{len:x}\"").into_bytes())
}

/// Appends `secs` since the epoch as an IMF-fixdate.
fn push_http_date(out: &mut Vec<u8>, secs: u64) {
    let t = std::time::UNIX_EPOCH + Duration::from_secs(secs);
    out.extend_from_slice(httpdate::fmt_http_date(t).as_bytes());
}

/// Reads up to `len` bytes of `file` at `offset` on this thread (`pread` until `len` or end
/// of file), after sleeping `delay` (the test hook; zero otherwise). The one place where the
/// bytes of a file are read synchronously: by the session in [`crate::FileReads::Blocking`]
/// mode, by [`crate::FileRead::read_blocking`] on a model's thread pool, and by `direct`.
pub(crate) fn read_at_blocking(
    file: &File,
    offset: u64,
    len: usize,
    delay: Duration,
) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    let mut data = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match file.read_at(&mut data[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if got == 0 => return Err(e),
            Err(_) => break,
        }
    }
    data.truncate(got);
    Ok(data)
}

fn open_error_status(e: &io::Error) -> u16 {
    match e.kind() {
        io::ErrorKind::NotFound => 404,
        io::ErrorKind::PermissionDenied => 403,
        _ => match e.raw_os_error() {
            Some(libc::ENOTDIR | libc::ELOOP | libc::ENAMETOOLONG | libc::ENXIO) => 404,
            _ => 500,
        },
    }
}

/// `key` plus a trailing slash, percent-encoded for a `Location` header. Built from the
/// normalised path, so it always starts with exactly one `/` (never `//host`, which a
/// browser would take for another site).
fn encode_location(key: &[u8]) -> Vec<u8> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(key.len() + 8);
    for &b in key {
        if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/".contains(&b) {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
    out.push(b'/');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_errors_map_to_statuses() {
        let os = io::Error::from_raw_os_error;
        assert_eq!(open_error_status(&os(libc::ENOENT)), 404);
        assert_eq!(open_error_status(&os(libc::ENOTDIR)), 404);
        assert_eq!(open_error_status(&os(libc::ELOOP)), 404);
        assert_eq!(open_error_status(&os(libc::ENAMETOOLONG)), 404);
        assert_eq!(open_error_status(&os(libc::EACCES)), 403);
        assert_eq!(open_error_status(&os(libc::EMFILE)), 500);
        assert_eq!(open_error_status(&os(libc::EIO)), 500);
    }

    #[test]
    fn location_is_encoded_and_single_slash() {
        assert_eq!(encode_location("/a b/ç".as_bytes()), b"/a%20b/%C3%A7/");
        assert_eq!(encode_location(b"/dir"), b"/dir/");
    }
}
