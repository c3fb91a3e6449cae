//! Reading blocks of the torrent's files, three ways (seed 000 §2.3 is about exactly this):
//!
//! - `uring`: an asynchronous read through the runtime's operation records
//!   ([`iolab_runtime::fs::File::read_at`]: IORING_OP_READ). The task gives its buffer to the
//!   kernel and gets it back full: nothing blocks, but the buffer must exist before the read
//!   starts (no delayed allocation), the IOCP design of the Windows port of Hekate.
//! - `mmap`: Hekate's Unix design. The files are mapped; before touching a block the task asks
//!   the kernel whether its pages are in memory (`mincore`). If they are, the copy cannot
//!   block. If not, the task yields once (another task may be faulting them in) and asks
//!   again; still missing, it detaches the copy to the blocking pool (`cpc_detach`) so the
//!   loop never waits on the disk.
//! - `pread`: every read on the blocking pool, the plain thread-pool design.
//!
//! On the epoll driver, `uring` reads run as plain syscalls on the loop (the runtime's
//! documented behaviour for files).

use std::fs;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::Mmap;

use crate::metainfo::Meta;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskMode {
    Uring,
    Mmap,
    Pread,
}

impl std::fmt::Display for DiskMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DiskMode::Uring => "uring",
            DiskMode::Mmap => "mmap",
            DiskMode::Pread => "pread",
        })
    }
}

/// Counters of the disk path (shared with the stats printer).
#[derive(Debug, Default)]
pub struct DiskStats {
    pub reads: AtomicU64,
    pub bytes: AtomicU64,
    /// mmap: blocks found resident at the first `mincore`.
    pub resident: AtomicU64,
    /// mmap: blocks resident after one yield.
    pub resident_after_yield: AtomicU64,
    /// mmap: blocks found missing whose read was started at once (MADV_WILLNEED).
    pub prefetched: AtomicU64,
    /// mmap and pread: copies/reads run on the blocking pool.
    pub detached: AtomicU64,
    pub errors: AtomicU64,
}

enum Backing {
    Empty,
    Uring(iolab_runtime::fs::File),
    Pread(Arc<fs::File>),
    Mmap(Arc<Mmap>),
}

/// The torrent's files, opened for one disk path. Lives on one loop (not `Send`).
pub struct Storage {
    meta: Arc<Meta>,
    files: Vec<Backing>,
    pub mode: DiskMode,
    pub stats: Arc<DiskStats>,
}

impl Storage {
    /// Opens every file of the torrent read-only (nothing is ever written). Without
    /// `read_ahead`, each file gets the random-access hint (POSIX_FADV_RANDOM, or
    /// MADV_RANDOM on its mapping): the kernel then reads exactly the pages asked for.
    /// A swarm asks for pieces scattered over the torrent, so read-ahead mostly reads
    /// pages no peer wants yet (measured: crates/seeder/README.md, "Read-ahead").
    pub fn open(meta: Arc<Meta>, mode: DiskMode, read_ahead: bool) -> io::Result<Storage> {
        let mut files = Vec::with_capacity(meta.files.len());
        for f in &meta.files {
            if f.length == 0 {
                files.push(Backing::Empty);
                continue;
            }
            let fh = fs::File::open(&f.disk_path).map_err(|e| {
                io::Error::new(e.kind(), format!("opening {}: {e}", f.disk_path.display()))
            })?;
            if !read_ahead && mode != DiskMode::Mmap {
                advise_random(&fh)?;
            }
            files.push(match mode {
                DiskMode::Uring => Backing::Uring(iolab_runtime::fs::File::from_std(fh)),
                DiskMode::Pread => Backing::Pread(Arc::new(fh)),
                DiskMode::Mmap => {
                    // SAFETY: the mapping is read-only and private to this process. Another
                    // process truncating the file under us would make a copy fault (SIGBUS):
                    // the same contract every mmap-based seeder has; data files are ours to
                    // serve, and their sizes were checked at start.
                    let m = unsafe { Mmap::map(&fh)? };
                    if !read_ahead {
                        m.advise(memmap2::Advice::Random)?;
                    }
                    Backing::Mmap(Arc::new(m))
                }
            });
        }
        Ok(Storage {
            meta,
            files,
            mode,
            stats: Arc::new(DiskStats::default()),
        })
    }

    /// Reads `len` bytes at `off` in the torrent's byte stream.
    pub async fn read(&self, off: u64, len: usize) -> io::Result<Vec<u8>> {
        let segs = self.meta.segments(off, len as u64);
        let r = if segs.len() == 1 {
            let (fi, foff, n) = segs[0];
            self.read_file(fi, foff, n as usize).await
        } else {
            let mut out = Vec::with_capacity(len);
            let mut res = Ok(());
            for (fi, foff, n) in segs {
                match self.read_file(fi, foff, n as usize).await {
                    Ok(v) => out.extend_from_slice(&v),
                    Err(e) => {
                        res = Err(e);
                        break;
                    }
                }
            }
            res.map(|_| out)
        };
        match &r {
            Ok(v) if v.len() == len => {
                self.stats.reads.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes.fetch_add(len as u64, Ordering::Relaxed);
                r
            }
            Ok(_) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "a data file became shorter than the torrent says",
                ))
            }
            Err(_) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                r
            }
        }
    }

    async fn read_file(&self, fi: usize, off: u64, len: usize) -> io::Result<Vec<u8>> {
        match &self.files[fi] {
            Backing::Empty => Ok(Vec::new()),
            Backing::Uring(f) => {
                let (r, mut buf) = f.read_at(vec![0u8; len], off).await;
                let n = r?;
                if n < len {
                    // Short read (end of file, or a signal): read the rest, or stop at EOF.
                    buf.truncate(n);
                    let mut got = n;
                    while got < len {
                        let (r, more) = f.read_at(vec![0u8; len - got], off + got as u64).await;
                        let k = r?;
                        if k == 0 {
                            break;
                        }
                        buf.extend_from_slice(&more[..k]);
                        got += k;
                    }
                }
                Ok(buf)
            }
            Backing::Pread(f) => {
                let f = f.clone();
                self.stats.detached.fetch_add(1, Ordering::Relaxed);
                iolab_runtime::detach(move || {
                    let mut buf = vec![0u8; len];
                    f.read_exact_at(&mut buf, off).map(|_| buf)
                })
                .await
            }
            Backing::Mmap(m) => {
                let end = off as usize + len;
                if end > m.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "read past the end of a mapped file",
                    ));
                }
                if resident(m, off as usize, len) {
                    self.stats.resident.fetch_add(1, Ordering::Relaxed);
                    return Ok(m[off as usize..end].to_vec());
                }
                // Missing pages: ask the kernel to read the whole block now, in one request
                // (MADV_WILLNEED starts the reads and returns without waiting for them;
                // MADV_RANDOM would otherwise have the copy fault in one page per read).
                // Then, as Hekate does, give the loop a turn and ask again before paying
                // for a thread; a thread that still has to copy waits on reads in flight.
                if m.advise_range(memmap2::Advice::WillNeed, off as usize, len)
                    .is_ok()
                {
                    self.stats.prefetched.fetch_add(1, Ordering::Relaxed);
                }
                iolab_runtime::yield_now().await;
                if resident(m, off as usize, len) {
                    self.stats
                        .resident_after_yield
                        .fetch_add(1, Ordering::Relaxed);
                    return Ok(m[off as usize..end].to_vec());
                }
                self.stats.detached.fetch_add(1, Ordering::Relaxed);
                let m = m.clone();
                Ok(iolab_runtime::detach(move || m[off as usize..end].to_vec()).await)
            }
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Whether every page of `m[off..off+len]` is in the page cache (mincore(2)).
fn resident(m: &Mmap, off: usize, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    let ps = page_size();
    let start = (m.as_ptr() as usize + off) & !(ps - 1);
    let end = m.as_ptr() as usize + off + len;
    let pages = (end - start).div_ceil(ps);
    // Up to 16 KiB blocks: at most 5 pages (or 2 huge ones); a small stack vector suffices.
    let mut vec = [0u8; 64];
    if pages > vec.len() {
        return false;
    }
    // SAFETY: [start, start + pages*ps) lies within the mapping (start is the page holding
    // the block's first byte, the mapping is page-aligned and covers the block's last byte's
    // page); `vec` has room for one byte per page.
    let r = unsafe {
        libc::mincore(
            start as *mut libc::c_void,
            end - start,
            vec.as_mut_ptr() as *mut libc::c_uchar,
        )
    };
    r == 0 && vec[..pages].iter().all(|b| b & 1 == 1)
}

/// The random-access hint on an open file: no read-ahead on its reads.
fn advise_random(fh: &fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain advisory call on a descriptor we own.
    let r = unsafe { libc::posix_fadvise(fh.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// Drops the page cache of the torrent's files (posix_fadvise DONTNEED): a cold start for
/// measurements. Only our own files are touched; dirty pages are not an issue (read-only).
pub fn drop_cache(meta: &Meta) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    for f in &meta.files {
        if f.length == 0 {
            continue;
        }
        let fh = fs::File::open(&f.disk_path)?;
        // SAFETY: plain advisory call on a descriptor we own.
        let r = unsafe { libc::posix_fadvise(fh.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metainfo::CreateOptions;
    use std::io::Write;

    /// The mmap path's miss: a block whose pages are out of memory has its read started as
    /// one request (MADV_WILLNEED) before the task yields, and the bytes come back right.
    #[test]
    fn a_cold_mmap_block_is_prefetched_whole_and_read_right() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let bytes: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
        let mut f = fs::File::create(&path).unwrap();
        f.write_all(&bytes).unwrap();
        f.sync_all().unwrap(); // clean pages, so that DONTNEED can drop them
        drop(f);
        let opts = CreateOptions {
            piece_length: Some(256 * 1024),
            announce: None,
            name: None,
            progress: false,
        };
        let (meta, _) = crate::metainfo::Meta::create(&[path], &opts).unwrap();
        let meta = Arc::new(meta);
        drop_cache(&meta).unwrap();
        let storage = Storage::open(meta.clone(), DiskMode::Mmap, false).unwrap();
        let Backing::Mmap(m) = &storage.files[0] else {
            panic!("not mapped")
        };
        let (off, len) = (512 * 1024, 16 * 1024);
        if resident(m, off, len) {
            // tmpfs keeps its pages whatever we advise: nothing to observe there.
            eprintln!(
                "SKIPPED: {} cannot drop its page cache",
                dir.path().display()
            );
            return;
        }
        let rt = iolab_runtime::Runtime::new().unwrap();
        let got = rt.block_on(async { storage.read(off as u64, len).await.unwrap() });
        assert_eq!(got, bytes[off..off + len]);
        assert_eq!(storage.stats.prefetched.load(Ordering::Relaxed), 1);
        assert!(resident(m, off, len));
    }
}
