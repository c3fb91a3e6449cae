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

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
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
    /// A BEP 47 pad file: zeros, no file on disk.
    Zeros,
    Uring(iolab_runtime::fs::File),
    Pread(Arc<fs::File>),
    Mmap(Arc<Mmap>),
}

/// A block's bytes, as the disk path produced them: a buffer of ours, or (mmap) the block's
/// pages in the file's mapping, sent from there with no copy in user space.
pub enum Block {
    Owned(Vec<u8>),
    Mapped {
        map: Arc<Mmap>,
        off: usize,
        len: usize,
    },
}

impl std::ops::Deref for Block {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Block::Owned(v) => v,
            Block::Mapped { map, off, len } => &map[*off..*off + *len],
        }
    }
}

/// A piece of a gathered send: a block, or protocol bytes, minus what a partial send
/// already took (`skip`).
pub struct Chunk {
    block: Block,
    skip: usize,
}

impl Chunk {
    pub fn new(block: Block) -> Chunk {
        Chunk { block, skip: 0 }
    }

    /// The bytes still to send.
    pub fn bytes(&self) -> &[u8] {
        &self.block[self.skip..]
    }
}

// SAFETY: an Owned block's heap buffer does not move when the value moves; a Mapped block
// holds an Arc of the read-only mapping, which stays mapped (and unmoved) while the Arc lives,
// and [off, off + len) was checked against the mapping's length when the block was made.
// `skip` never exceeds the block's length (`advance` keeps it so) and is not changed while
// the kernel holds the chunk (an operation owns its buffers).
unsafe impl iolab_runtime::IoBuf for Chunk {
    fn stable_ptr(&self) -> *const u8 {
        // SAFETY: skip <= len, so the pointer stays within (or one past) the block.
        unsafe { self.block.as_ptr().add(self.skip) }
    }
    fn len(&self) -> usize {
        self.block.len() - self.skip
    }
}

/// Drops the first `n` bytes of `chunks` (what a partial gathered send took).
pub fn advance(chunks: &mut Vec<Chunk>, mut n: usize) {
    let mut done = 0;
    for c in chunks.iter_mut() {
        let left = c.block.len() - c.skip;
        if n >= left {
            n -= left;
            done += 1;
        } else {
            c.skip += n;
            break;
        }
    }
    chunks.drain(..done);
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
    /// pages no peer wants yet (measured: crates/apps/seeder/README.md, "Read-ahead").
    pub fn open(meta: Arc<Meta>, mode: DiskMode, read_ahead: bool) -> io::Result<Storage> {
        let mut files = Vec::with_capacity(meta.files.len());
        for f in &meta.files {
            if f.length == 0 {
                files.push(Backing::Empty);
                continue;
            }
            if f.pad {
                files.push(Backing::Zeros);
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
    pub async fn read(&self, off: u64, len: usize) -> io::Result<Block> {
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
            res.map(|_| Block::Owned(out))
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

    async fn read_file(&self, fi: usize, off: u64, len: usize) -> io::Result<Block> {
        match &self.files[fi] {
            Backing::Empty => Ok(Block::Owned(Vec::new())),
            Backing::Zeros => Ok(Block::Owned(vec![0u8; len])),
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
                Ok(Block::Owned(buf))
            }
            Backing::Pread(f) => {
                let f = f.clone();
                self.stats.detached.fetch_add(1, Ordering::Relaxed);
                iolab_runtime::detach(move || {
                    let mut buf = vec![0u8; len];
                    f.read_exact_at(&mut buf, off).map(|_| Block::Owned(buf))
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
                let mapped = || Block::Mapped {
                    map: m.clone(),
                    off: off as usize,
                    len,
                };
                // Resident pages are sent straight from the mapping (the kernel copies them
                // into the socket; no copy of ours). Evicted between this check and the send,
                // a page would be read back in by that copy, on the loop: rare, and the price
                // of no copy.
                if resident(m, off as usize, len) {
                    self.stats.resident.fetch_add(1, Ordering::Relaxed);
                    return Ok(mapped());
                }
                // Missing pages: ask the kernel to read the whole block now, in one request
                // (MADV_WILLNEED starts the reads and returns without waiting for them;
                // MADV_RANDOM would otherwise have the copy fault in one page per read).
                // Then, as Hekate does, give the loop a turn and ask again before paying
                // for a thread; a thread that still has to wait waits on reads in flight.
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
                    return Ok(mapped());
                }
                self.stats.detached.fetch_add(1, Ordering::Relaxed);
                let map = m.clone();
                // The thread faults the pages in (one read of a byte per page) and the loop
                // sends them from the mapping.
                iolab_runtime::detach(move || {
                    let ps = page_size();
                    let b = &map[off as usize..end];
                    let mut sum = 0u8;
                    for i in (0..b.len()).step_by(ps).chain(std::iter::once(b.len() - 1)) {
                        sum = sum.wrapping_add(b[i]);
                    }
                    std::hint::black_box(sum);
                })
                .await;
                Ok(mapped())
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
        if f.length == 0 || f.pad {
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
            ..Default::default()
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
        assert!(matches!(got, Block::Mapped { .. }), "sent from the mapping");
        assert_eq!(*got, bytes[off..off + len]);
        assert_eq!(storage.stats.prefetched.load(Ordering::Relaxed), 1);
        assert!(resident(m, off, len));
    }

    fn chunks(parts: &[&[u8]]) -> Vec<Chunk> {
        parts
            .iter()
            .map(|p| Chunk::new(Block::Owned(p.to_vec())))
            .collect()
    }

    fn bytes_of(c: &[Chunk]) -> Vec<u8> {
        use iolab_runtime::IoBuf;
        c.iter()
            .flat_map(|c| {
                // SAFETY: stable_ptr/len describe initialised bytes of the chunk.
                unsafe { std::slice::from_raw_parts(c.stable_ptr(), c.len()) }.to_vec()
            })
            .collect()
    }

    /// A partial gathered send: what is left is exactly the bytes not yet sent, whatever
    /// chunk boundary the kernel stopped at.
    #[test]
    fn advance_leaves_exactly_the_unsent_bytes() {
        let parts: [&[u8]; 3] = [b"head", b"", b"0123456789"];
        let all = bytes_of(&chunks(&parts));
        for n in 0..=all.len() {
            let mut c = chunks(&parts);
            advance(&mut c, n);
            assert_eq!(bytes_of(&c), all[n..], "after {n} bytes");
            // and again, from the partially sent state
            for m in 0..=(all.len() - n) {
                let mut d = chunks(&parts);
                advance(&mut d, n);
                advance(&mut d, m);
                assert_eq!(bytes_of(&d), all[n + m..]);
            }
        }
        let mut c = chunks(&parts);
        advance(&mut c, all.len());
        assert!(c.is_empty(), "nothing left once all is sent");
    }
}
