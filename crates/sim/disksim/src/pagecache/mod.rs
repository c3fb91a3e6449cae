//! The Linux page cache: 4 KiB pages, the two-list (active/inactive) LRU, the on-demand
//! read-ahead of `mm/readahead.c`, dirty pages with write-back, throttling, the flusher and
//! fsync, as an [`engine::Component`](crate::engine).
//!
//! What is modelled (our own code, written from the kernel's documented behaviour):
//!
//! * **Pages**: 4 KiB, keyed by (device, file, page index). A request without a file (a raw
//!   block-device read) uses the block device's own mapping, page = `lba / 8`.
//! * **LRU** (`mm/swap.c` `folio_mark_accessed`, `mm/vmscan.c`): a new page enters the
//!   inactive list unreferenced; a read marks it referenced; a second read of a referenced
//!   inactive page moves it to the active list. Accessing a page does not move it inside its
//!   list. Reclaim takes the inactive tail; when the active list is larger than the inactive
//!   one (the kernel's `inactive_is_low` with ratio 1, i.e. a cache under 1 GiB), the active
//!   tail is first moved to the inactive head. Pages whose read is in flight (locked in the
//!   kernel) are never evicted.
//! * **Read-ahead** (`page_cache_sync_ra`, `page_cache_async_ra`, `get_init_ra_size`,
//!   `get_next_ra_size`): a read that misses at page `index` with `req` pages requested starts
//!   a window if the read is at the start of the file, larger than the maximum, or sequential
//!   to the previous read (`index - prev_index <= 1`): `size = get_init_ra_size(req, max)`,
//!   `async_size = size - req` (or `size` when `size <= req`). Otherwise the pages just before
//!   `index` are looked at (context read-ahead, for interleaved streams) and, if they are not a
//!   run longer than the request, the read is done as is and the window state is left alone:
//!   a random read does not read ahead, and the next read after it starts again from the
//!   initial window. The page at `start + size - async_size` carries the read-ahead marker
//!   (`PG_readahead`); reading it (even as a cache hit) clears the marker and pushes the
//!   window forward: `start += size`, `size = get_next_ra_size(size, max)`,
//!   `async_size = size`. `max` = `read_ahead_kb / 4` pages.
//! * **posix_fadvise**: SEQUENTIAL doubles the file's maximum window, RANDOM turns read-ahead
//!   off (only the requested pages are read), NORMAL restores the defaults.
//! * **Hits and misses**: a read whose pages are all cached and ready completes at once
//!   (`ctx.up`, cache outcome `hit`); otherwise it waits for the page-aligned reads it or an
//!   earlier read-ahead sent down (`ctx.down`) and completes as `miss` or `partial`.
//!
//! * **Write path** (`mm/page-writeback.c`, `fs/fs-writeback.c`): a buffered write dirties
//!   its pages (created without reading: a partial page is taken as whole) and returns after
//!   its CPU time ([`PageCacheConfig::cpu_ms`]). The file remembers when it went from clean
//!   to dirty (`dirtied_when`). Thresholds ([`PageCache::thresholds`]): `background` and
//!   `limit` from the `vm.dirty_*` ratios (of [`DirtyConfig::dirtyable_pages`]) or bytes, the
//!   limit capped by the cache's capacity, a background threshold at or above the limit
//!   halved (`domain_dirty_limits`).
//!   - **Background write-back**: whenever more pages are dirty than `background`, the file
//!     dirtied longest ago is written, 1024 pages (4 MiB, `MAX_WRITEBACK_PAGES`) at most per
//!     round, resuming at its `writeback_index`, rounds repeated until the dirty count is
//!     under the threshold. Checked after each write and each write-back completion.
//!   - **Periodic flusher**: armed `dirty_writeback_centisecs` after the first page is
//!     dirtied and re-armed while dirty pages remain; each run writes every file dirtied more
//!     than `dirty_expire_centisecs` ago, whole. Below the background threshold nothing
//!     else writes.
//!   - **Throttling** (`balance_dirty_pages`), *simplified*: the kernel (3.2+, IO-less
//!     throttling) pauses a writer in proportion to how far dirty + write-back pages are
//!     above the setpoint `(freerun + limit) / 2`, `freerun = (background + limit) / 2`, so
//!     that the count settles at the setpoint and writers go at the device's write-back
//!     rate. Here a write that leaves dirty + write-back above the setpoint is held until
//!     write-back completions bring the count back to it (oldest writer first): the same
//!     steady state and rate, with the pauses bunched at write-back completions rather than
//!     spread as the kernel's (≤ 200 ms) pauses are.
//!   - **fsync / fdatasync** (`Op::Flush` with a file): the file's dirty pages are written
//!     (a `SYNC` write per run of consecutive pages), the call waits for them and for the
//!     file's pages already under write-back (not for pages dirtied after the call), then a
//!     device flush is sent; the call returns after the flush. The flush of an fdatasync
//!     (and of an O_DSYNC write) carries `Flags::DATASYNC`: no journal commit, and a
//!     measured device charges it its own, smaller, cost; fsync's (and O_SYNC's) the cost
//!     of a flush with the journal commit of the inode's new times.
//!   - **O_DSYNC / O_SYNC writes**: the write, then `vfs_fsync_range` on its range.
//!   - **POSIX_FADV_DONTNEED**: write-back of the range's dirty pages starts, its clean pages
//!     not under I/O are dropped. WILLNEED reads the range now.
//!   - **O_DIRECT**: the range's dirty pages are sent down first (ahead of the direct
//!     request, which does not wait for them: the kernel waits), the clean ones dropped; a
//!     direct write drops the range again when it completes.
//!   - **Reclaim** never takes a dirty page or one under write-back.
//!
//! Not modelled: the `io_pages` (max_sectors_kb) enlargement of the read-ahead window for
//! very large reads, large folios, workingset refault detection, the read of a partial page
//! before a write, per-device (bdi) write-back bandwidth estimation and cgroup v2 writeback
//! domains, the journal.
//!
//! Units: time in ms, addresses in 512-byte sectors (see `request.rs`), page indices in
//! 4 KiB pages.

use std::collections::BTreeSet;

use crate::engine::{Component, Ctx, Finished};
use crate::lru::LruList;
use crate::request::{
    CacheOutcome, Completion, Flags, Op, Record, Request, LARGE_FOLIO_ORDER, SECTOR,
};
use crate::Map;

/// Page size in bytes.
pub const PAGE: u64 = 4096;
const SECTORS_PER_PAGE: u64 = PAGE / SECTOR;
/// Ids of the reads this component sends down have this bit set, so they never collide with
/// the engine's ids of workload requests.
const CHILD_ID_BIT: u64 = 1 << 63;
/// The flusher's periodic timer.
const FLUSH_TOKEN: u64 = 1 << 61;
/// Wake tokens of reads held while their folios are brought in: this bit and the read's id
/// (child ids have CHILD_ID_BIT, which this bit leaves clear).
const DELAYED_READ_BIT: u64 = 1 << 60;
/// Pages in one write-back write (the kernel's `MAX_WRITEBACK_PAGES`, 4 MiB; the block layer
/// splits it at `max_sectors_kb`), and the least background write-back writes of a file in
/// one go (`MIN_WRITEBACK_PAGES`, also 4 MiB).
const WB_CHUNK_PAGES: u64 = 1024;

pub use crate::request::Advice;
pub use read::{init_ra_size, next_folio_order, next_ra_size, RaState, MAX_FOLIO_ORDER};

#[cfg(test)]
mod pin_tests;
mod read;
mod writeback;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct StreamKey {
    dev: u32,
    /// `u32::MAX` for the raw block device.
    file: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct PageKey {
    stream: StreamKey,
    index: u64,
}

#[derive(Debug, Default)]
struct Stream {
    ra: RaState,
    /// Byte position just after the previous read (kernel `prev_pos`); None before the first.
    prev_pos: Option<u64>,
    advice: Advice,
    /// Sector of the file's byte 0 (files are taken as laid out contiguously).
    base_lba: i64,
    /// When the file went from clean to dirty (kernel `inode->dirtied_when`), ms.
    dirtied_when: Option<f64>,
    /// Indices of the file's dirty pages.
    dirty: crate::pageset::PageSet,
    /// Where background write-back resumes in this file (kernel `writeback_index`).
    wb_index: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum List {
    Inactive,
    Active,
}

/// The inactive and active lists, indexed by [`List`].
#[derive(Default)]
struct Lists([LruList<PageKey>; 2]);

impl std::ops::Index<List> for Lists {
    type Output = LruList<PageKey>;
    fn index(&self, l: List) -> &LruList<PageKey> {
        &self.0[l as usize]
    }
}

impl std::ops::IndexMut<List> for Lists {
    fn index_mut(&mut self, l: List) -> &mut LruList<PageKey> {
        &mut self.0[l as usize]
    }
}

#[derive(Debug)]
struct Page {
    list: List,
    /// Position in its list (larger = nearer the head, more recent).
    seq: u64,
    referenced: bool,
    /// `PG_readahead`.
    marker: bool,
    /// The read filling this page, while in flight.
    pending: Option<u64>,
    /// `PG_dirty`: written by the workload, not yet sent to the device.
    dirty: bool,
    /// `PG_writeback`: the latest write sending this page down, while in flight.
    wb: Option<u64>,
}

/// Pages per [`PageMap`] chunk (a chunk's pages fit the bits of a `u64`).
const CHUNK_PAGES: u64 = 64;

/// What [`PageMap::read_in_chunk`] did.
enum ChunkRead {
    /// The pages were read; the bits of the pages to promote.
    Done(u64),
    /// Some page is missing, marked or in flight (nothing done).
    NotPlain,
    /// The pages span chunks (nothing done).
    Spans,
}

/// The cached pages by file and index (the kernel's per-file xarray, flattened): runs of
/// CHUNK_PAGES consecutive pages of a file share one hash-map entry, so the pages of a
/// request (and of its neighbours) are one lookup and adjacent in memory, where a map by
/// page spent most of a write's simulation waiting for a cache miss per page.
#[derive(Default)]
struct PageMap {
    chunks: Map<(StreamKey, u64), Box<Chunk>>,
    len: usize,
}

struct Chunk {
    pages: [Option<Page>; CHUNK_PAGES as usize],
    len: u8,
}

impl PageMap {
    fn at(k: &PageKey) -> ((StreamKey, u64), usize) {
        (
            (k.stream, k.index / CHUNK_PAGES),
            (k.index % CHUNK_PAGES) as usize,
        )
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn get(&self, k: &PageKey) -> Option<&Page> {
        let (c, i) = Self::at(k);
        self.chunks.get(&c)?.pages[i].as_ref()
    }

    fn get_mut(&mut self, k: &PageKey) -> Option<&mut Page> {
        let (c, i) = Self::at(k);
        self.chunks.get_mut(&c)?.pages[i].as_mut()
    }

    fn contains_key(&self, k: &PageKey) -> bool {
        self.get(k).is_some()
    }

    #[cfg(test)]
    fn insert(&mut self, k: PageKey, p: Page) -> Option<Page> {
        let (c, i) = Self::at(&k);
        let chunk = self.chunks.entry(c).or_insert_with(|| {
            Box::new(Chunk {
                pages: std::array::from_fn(|_| None),
                len: 0,
            })
        });
        let old = chunk.pages[i].replace(p);
        if old.is_none() {
            chunk.len += 1;
            self.len += 1;
        }
        old
    }

    /// Whether pages `[first, last)` of `stream` are all cached, uptodate and unmarked: a
    /// read of them starts no read-ahead and waits for nothing (one lookup per chunk).
    fn all_plain(&self, stream: StreamKey, first: u64, last: u64) -> bool {
        let mut i = first;
        while i < last {
            let c = i / CHUNK_PAGES;
            let Some(chunk) = self.chunks.get(&(stream, c)) else {
                return false;
            };
            let end = last.min((c + 1) * CHUNK_PAGES);
            let lo = (i % CHUNK_PAGES) as usize;
            let hi = lo + (end - i) as usize;
            if !chunk.pages[lo..hi]
                .iter()
                .all(|p| p.as_ref().is_some_and(Page::plain))
            {
                return false;
            }
            i = end;
        }
        true
    }

    /// A read of pages `[first, last)` of `stream` lying in one chunk and all plain (as
    /// [`PageMap::all_plain`]): each page is accessed ([`Page::accessed`], the first one not
    /// when `skip_first`) with one lookup, and bit `i` of the result says page `first + i`
    /// is to be promoted. Nothing is done unless the result is `Done`.
    fn read_in_chunk(
        &mut self,
        stream: StreamKey,
        first: u64,
        last: u64,
        skip_first: bool,
    ) -> ChunkRead {
        let c = first / CHUNK_PAGES;
        if last == first || (last - 1) / CHUNK_PAGES != c {
            return ChunkRead::Spans;
        }
        let Some(chunk) = self.chunks.get_mut(&(stream, c)) else {
            return ChunkRead::NotPlain;
        };
        let lo = (first % CHUNK_PAGES) as usize;
        let pages = &mut chunk.pages[lo..lo + (last - first) as usize];
        if !pages.iter().all(|p| p.as_ref().is_some_and(Page::plain)) {
            return ChunkRead::NotPlain;
        }
        let mut promote = 0u64;
        for (i, p) in pages.iter_mut().enumerate() {
            let p = p.as_mut().expect("checked above");
            if !(i == 0 && skip_first) && p.accessed() {
                promote |= 1 << i;
            }
        }
        ChunkRead::Done(promote)
    }

    /// The cached pages among `[first, last)` of `stream`, in index order, chunk by chunk
    /// (one lookup per chunk).
    fn for_each_mut(
        &mut self,
        stream: StreamKey,
        first: u64,
        last: u64,
        mut f: impl FnMut(u64, &mut Page),
    ) {
        let mut i = first;
        while i < last {
            let c = i / CHUNK_PAGES;
            let end = last.min((c + 1) * CHUNK_PAGES);
            if let Some(chunk) = self.chunks.get_mut(&(stream, c)) {
                let lo = (i % CHUNK_PAGES) as usize;
                for (j, p) in chunk.pages[lo..lo + (end - i) as usize]
                    .iter_mut()
                    .enumerate()
                {
                    if let Some(p) = p {
                        f(i + j as u64, p);
                    }
                }
            }
            i = end;
        }
    }

    /// Every slot of `[first, last)` of `stream`, cached or not, in index order, chunk by
    /// chunk (one lookup per chunk, chunks created as needed): `f` may fill or empty a slot,
    /// and the counts follow (a chunk left empty is freed).
    fn for_each_slot(
        &mut self,
        stream: StreamKey,
        first: u64,
        last: u64,
        mut f: impl FnMut(u64, &mut Option<Page>),
    ) {
        let mut i = first;
        while i < last {
            let c = i / CHUNK_PAGES;
            let end = last.min((c + 1) * CHUNK_PAGES);
            let chunk = self.chunks.entry((stream, c)).or_insert_with(|| {
                Box::new(Chunk {
                    pages: std::array::from_fn(|_| None),
                    len: 0,
                })
            });
            let lo = (i % CHUNK_PAGES) as usize;
            for (j, slot) in chunk.pages[lo..lo + (end - i) as usize]
                .iter_mut()
                .enumerate()
            {
                let was = slot.is_some();
                f(i + j as u64, slot);
                match (was, slot.is_some()) {
                    (false, true) => {
                        chunk.len += 1;
                        self.len += 1;
                    }
                    (true, false) => {
                        chunk.len -= 1;
                        self.len -= 1;
                    }
                    _ => {}
                }
            }
            if chunk.len == 0 {
                self.chunks.remove(&(stream, c));
            }
            i = end;
        }
    }

    /// The numbers of the chunks of `stream` that hold pages of `[first, last)`, in
    /// increasing order: by number when the range spans fewer chunks than the map holds, else
    /// from the map's keys (a whole-file range, `last` = `u64::MAX`, costs the map's chunks,
    /// never the range's width), sorted: pages that joined the LRU in file order (read-ahead,
    /// sequential writes) then leave their lists in the order their slots lie in memory.
    fn chunks_in(&self, stream: StreamKey, first: u64, last: u64) -> Vec<u64> {
        if first >= last {
            return Vec::new();
        }
        let (lo, hi) = (first / CHUNK_PAGES, (last - 1) / CHUNK_PAGES);
        if hi - lo < self.chunks.len() as u64 {
            (lo..=hi)
                .filter(|c| self.chunks.contains_key(&(stream, *c)))
                .collect()
        } else {
            let mut cs: Vec<u64> = self
                .chunks
                .keys()
                .filter(|(s, c)| *s == stream && (lo..=hi).contains(c))
                .map(|&(_, c)| c)
                .collect();
            cs.sort_unstable();
            cs
        }
    }

    /// Removes the reclaimable pages of `[first, last)` of `stream` (clean, not in flight),
    /// taking each off its LRU list, one lookup per chunk; returns how many. The lists are
    /// left for the caller to compact (once, not after each page).
    fn drop_reclaimable(
        &mut self,
        stream: StreamKey,
        first: u64,
        last: u64,
        lru: &mut Lists,
    ) -> u64 {
        let mut dropped = 0;
        for c in self.chunks_in(stream, first, last) {
            let Some(chunk) = self.chunks.get_mut(&(stream, c)) else {
                continue;
            };
            let base = c * CHUNK_PAGES;
            let lo = first.saturating_sub(base).min(CHUNK_PAGES) as usize;
            let hi = (last - base).min(CHUNK_PAGES) as usize;
            for slot in &mut chunk.pages[lo..hi] {
                if slot.as_ref().is_some_and(Page::reclaimable) {
                    let p = slot.take().expect("checked");
                    lru[p.list].remove(p.seq);
                    chunk.len -= 1;
                    dropped += 1;
                }
            }
            if chunk.len == 0 {
                self.chunks.remove(&(stream, c));
            }
        }
        self.len -= dropped as usize;
        dropped
    }

    /// Removes the pages `keys` (those cached), looking each chunk up once per run of keys
    /// in it.
    fn remove_all(&mut self, keys: &[PageKey]) {
        let mut i = 0;
        while i < keys.len() {
            let (c, _) = Self::at(&keys[i]);
            let Some(chunk) = self.chunks.get_mut(&c) else {
                i += 1;
                continue;
            };
            while let Some(k) = keys.get(i).filter(|k| Self::at(k).0 == c) {
                let old = chunk.pages[Self::at(k).1].take();
                debug_assert!(old.as_ref().is_none_or(|p| !p.dirty && p.wb.is_none()));
                if old.is_some() {
                    chunk.len -= 1;
                    self.len -= 1;
                }
                i += 1;
            }
            if chunk.len == 0 {
                self.chunks.remove(&c);
            }
        }
    }

    #[cfg(test)]
    fn remove(&mut self, k: &PageKey) -> Option<Page> {
        let (c, i) = Self::at(k);
        let chunk = self.chunks.get_mut(&c)?;
        let old = chunk.pages[i].take()?;
        chunk.len -= 1;
        self.len -= 1;
        if chunk.len == 0 {
            self.chunks.remove(&c);
        }
        Some(old)
    }

    /// Every page (in no particular order).
    fn iter(&self) -> impl Iterator<Item = (PageKey, &Page)> + '_ {
        self.chunks.iter().flat_map(|(&(stream, c), chunk)| {
            chunk.pages.iter().enumerate().filter_map(move |(i, p)| {
                Some((
                    PageKey {
                        stream,
                        index: c * CHUNK_PAGES + i as u64,
                    },
                    p.as_ref()?,
                ))
            })
        })
    }
}

impl std::ops::Index<&PageKey> for PageMap {
    type Output = Page;
    fn index(&self, k: &PageKey) -> &Page {
        self.get(k).expect("a cached page")
    }
}

/// A request waiting for write-back (fsync, an O_DSYNC write, ...) and then, if `flush`,
/// for a device cache flush.
struct SyncWait {
    req: Request,
    outstanding: BTreeSet<u64>,
    flush: bool,
    cache: CacheOutcome,
}

impl Page {
    /// `folio_mark_accessed` on the page's own flags: referenced on the first access; true
    /// on the second of an inactive page, which then moves to the active list
    /// ([`PageCache::activate`]).
    fn accessed(&mut self) -> bool {
        if (self.list, self.referenced) == (List::Inactive, true) {
            return true;
        }
        self.referenced = true;
        false
    }

    /// Cached, uptodate and unmarked: a read of it starts no read-ahead and waits for
    /// nothing.
    fn plain(&self) -> bool {
        !self.marker && self.pending.is_none()
    }

    /// Reclaim may take it: uptodate, clean, not under write-back.
    fn reclaimable(&self) -> bool {
        self.pending.is_none() && !self.dirty && self.wb.is_none()
    }
}

/// A workload read waiting for pages in flight.
struct Waiting {
    req: Request,
    outstanding: usize,
    outcome: CacheOutcome,
}

/// A dirty-memory threshold: `vm.dirty_*_ratio` (percent of dirtyable memory) or
/// `vm.dirty_*_bytes` (the kernel uses the bytes form when it is non-zero).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Threshold {
    /// Percent of the dirtyable memory ([`DirtyConfig::dirtyable_pages`]).
    Ratio(u32),
    /// Bytes.
    Bytes(u64),
}

impl Threshold {
    /// The threshold in pages for `dirtyable` pages of dirtyable memory.
    pub fn pages(self, dirtyable: u64) -> u64 {
        match self {
            Threshold::Ratio(pct) => dirtyable * u64::from(pct.min(100)) / 100,
            Threshold::Bytes(b) => b.div_ceil(PAGE),
        }
    }
}

/// Write-back parameters, in the kernel's own units (`/proc/sys/vm/dirty_*`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct DirtyConfig {
    /// `dirty_background_ratio` / `dirty_background_bytes`: above it the flusher writes
    /// back in the background, the writer is not slowed.
    pub background: Threshold,
    /// `dirty_ratio` / `dirty_bytes`: at it a writer is throttled (balance_dirty_pages).
    pub limit: Threshold,
    /// `dirty_expire_centisecs` (1/100 s): a page dirty for longer is written by the next
    /// flusher run, whatever the thresholds.
    pub expire_centisecs: u32,
    /// `dirty_writeback_centisecs` (1/100 s): the flusher's period; 0 turns periodic
    /// write-back off (only the thresholds and fsync write).
    pub writeback_centisecs: u32,
    /// Memory the ratios apply to, in pages ("dirtyable memory": free plus file pages; the
    /// kernel's `global_dirtyable_memory`, or the memory cgroup's under cgroup v2).
    pub dirtyable_pages: u64,
}

impl DirtyConfig {
    /// The kernel defaults (10 %, 20 %, 30 s, 5 s) over `dirtyable_pages`.
    pub fn linux_defaults(dirtyable_pages: u64) -> Self {
        DirtyConfig {
            background: Threshold::Ratio(10),
            limit: Threshold::Ratio(20),
            expire_centisecs: 3000,
            writeback_centisecs: 500,
            dirtyable_pages,
        }
    }
}

/// Page-cache parameters.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct PageCacheConfig {
    /// Capacity in 4 KiB pages (see [`capacity_pages_from_system`]).
    pub capacity_pages: u64,
    /// The device's `queue/read_ahead_kb`; 0 turns read-ahead off.
    pub read_ahead_kb: u64,
    /// Dirty pages and write-back.
    pub dirty: DirtyConfig,
    /// CPU time of one system call through the page cache (entry, lookup, exit), ms: the
    /// whole cost of a cache hit besides the copy. 0 = free.
    pub syscall_ms: f64,
    /// Memory copy rate between the cache and the user buffer, MB/s (10^6 B/s);
    /// 0 = infinitely fast.
    pub copy_mb_s: f64,
    /// CPU time of bringing one new folio into the cache for a read (allocation, memcg
    /// charge, insertion), ms, spent by the reading thread before the read goes down. Per
    /// folio, not per page: read-ahead's large folios pay it once per up to 512 pages.
    /// 0 = free.
    pub miss_folio_ms: f64,
    /// CPU time of reclaiming room for one such folio when the cache is full, ms, on top of
    /// `miss_folio_ms`: the reading thread reclaims itself (a memory cgroup at its limit
    /// reclaims in the task that charges the page, `try_charge` → `try_to_free_mem_cgroup_pages`:
    /// LRU isolation, unmapping from the page cache, freeing). Charged per folio a read
    /// brings in beyond the capacity. On this VM (28 Nov) random 128-512 KiB buffered cold
    /// reads in a full 64 MiB cgroup paid 0.6-1.0 µs a page more than the same reads with
    /// room to spare. 0 = free.
    pub reclaim_folio_ms: f64,
    /// CPU time `POSIX_FADV_DONTNEED` spends per dirty page it sends to write-back (the
    /// caller builds and submits those writes itself, and drains the LRU caches), ms: on
    /// this VM 9-20 ms for 64 MiB of dirty pages, and fio calls it at the start of each
    /// pass of an `invalidate=1` job. 0 = free.
    pub dontneed_dirty_page_ms: f64,
    /// Reclaim in a full cache waits on the oldest page when it is under write-back, as a
    /// legacy (cgroup v1) memory cgroup's does (`shrink_folio_list`: a folio under
    /// write-back already marked for reclaim is waited for, where cgroup v2 and global
    /// reclaim throttle instead): a buffered write into a full cache whose oldest inactive
    /// page is being written completes only once that write has. Random writes meet it
    /// often (the flusher cleans in file order, the LRU ages in time order), sequential
    /// ones rarely.
    pub reclaim_waits_on_writeback: bool,
}

impl PageCacheConfig {
    /// `capacity_pages` and `read_ahead_kb`, the kernel's dirty defaults over the whole
    /// capacity, and free system calls and copies (the unit tests' baseline).
    pub fn new(capacity_pages: u64, read_ahead_kb: u64) -> Self {
        PageCacheConfig {
            capacity_pages,
            read_ahead_kb,
            dirty: DirtyConfig::linux_defaults(capacity_pages),
            syscall_ms: 0.0,
            copy_mb_s: 0.0,
            miss_folio_ms: 0.0,
            reclaim_folio_ms: 0.0,
            dontneed_dirty_page_ms: 0.0,
            reclaim_waits_on_writeback: false,
        }
    }

    /// CPU time the calling thread spends on `bytes` through the cache, ms.
    pub fn cpu_ms(&self, bytes: u64) -> f64 {
        let copy = if self.copy_mb_s > 0.0 {
            bytes as f64 / (self.copy_mb_s * 1000.0)
        } else {
            0.0
        };
        self.syscall_ms + copy
    }
}

/// Counters for the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PageCacheStats {
    pub hit_pages: u64,
    pub miss_pages: u64,
    /// Pages read that no request had asked for (read-ahead beyond the request).
    pub readahead_pages: u64,
    pub evicted_pages: u64,
    /// Pages dropped by `POSIX_FADV_DONTNEED`.
    pub dropped_pages: u64,
    pub reads_down: u64,
    /// Of `reads_down`, those into large folios ([`Flags::LARGE_FOLIOS`]).
    pub large_folio_reads: u64,
    /// Pages made dirty (clean → dirty transitions) by buffered writes.
    pub dirtied_pages: u64,
    /// Pages sent to the device by write-back (flusher, fsync, O_DSYNC, DONTNEED).
    pub written_pages: u64,
    /// Write requests sent down by write-back.
    pub writes_down: u64,
    /// Largest number of dirty pages at once.
    pub max_dirty_pages: u64,
    /// Largest number of dirty plus under-write-back pages at once.
    pub max_dirty_writeback_pages: u64,
    /// Buffered writes the dirty throttle or a full cache held, and their total wait, ms.
    pub throttled_writes: u64,
    /// Times reclaim found the cache full of dirty pages and started writing them all.
    pub reclaim_writebacks: u64,
    /// Buffered writes that waited on a page under write-back at the LRU's old end
    /// ([`PageCacheConfig::reclaim_waits_on_writeback`]).
    pub reclaim_waits: u64,
    pub throttled_ms: f64,
    /// Flusher runs that wrote expired pages (`dirty_expire_centisecs`).
    pub expire_runs: u64,
    /// Background write-back rounds (dirty pages above the background threshold).
    pub background_runs: u64,
    /// fsync / fdatasync calls, O_DSYNC/O_SYNC writes, device flushes sent down.
    pub fsyncs: u64,
    pub dsync_writes: u64,
    pub flushes_down: u64,
}

/// The page cache component.
pub struct PageCache {
    cfg: PageCacheConfig,
    streams: Map<StreamKey, Stream>,
    pages: PageMap,
    /// The inactive and active lists (by [`List`]), each marking the pages reclaim may
    /// take: the oldest reclaimable page is found without walking past the pages reclaim
    /// may not take (a scan from the list's old end did that for every page inserted into
    /// a full cache, and when write-back had made most of the cache unreclaimable, buffered
    /// writes in a small memory cgroup simulated slower than real time).
    lru: Lists,
    next_child: u64,
    /// Reads sent down: the pages they fill.
    children: Map<u64, (StreamKey, std::ops::Range<u64>)>,
    /// Which waiting workload reads each child read holds up.
    waiters: Map<u64, Vec<u64>>,
    waiting: Map<u64, Waiting>,
    /// Pages dirty, and pages under write-back (kernel NR_FILE_DIRTY, NR_WRITEBACK).
    nr_dirty: u64,
    nr_writeback: u64,
    /// Writes sent down by write-back: the file and the run of pages each carries (the
    /// pages of the run under write-back by it are those whose `wb` is its id: a page
    /// dropped and cached again meanwhile is not).
    wb_children: Map<u64, (StreamKey, std::ops::Range<u64>)>,
    /// Device flushes sent down, and the sync each one finishes.
    flush_children: Map<u64, u64>,
    /// Which syncs each write-back write holds up.
    sync_waiters: Map<u64, Vec<u64>>,
    syncs: Map<u64, SyncWait>,
    /// Buffered writes held by the dirty throttle (with the time they started waiting).
    throttled: std::collections::VecDeque<(Completion, f64)>,
    /// The flusher's next periodic run, when armed.
    flusher_at: Option<f64>,
    /// Files' sizes in pages where the workload told them ([`PageCache::with_file_sizes`]):
    /// read-ahead stops at the end of the file, as the kernel's `do_page_cache_ra` does
    /// (`i_size`). Unknown files: no limit.
    file_pages: Map<StreamKey, u64>,
    /// Until when the reading thread is busy bringing folios in ([`PageCacheConfig::
    /// miss_folio_ms`]), and the reads that go down then (by wake token).
    alloc_until: f64,
    delayed: Map<u64, Request>,
    /// Buffered writes waiting for a write-back write (by its id) that reclaim met at the
    /// LRU's old end ([`PageCacheConfig::reclaim_waits_on_writeback`]), with when they began.
    reclaim_waiters: Map<u64, Vec<(Completion, f64)>>,
    stats: PageCacheStats,
}

impl PageCache {
    /// The sizes (bytes) of the files of `dev` (file id, size): read-ahead is clipped at
    /// each file's last page.
    pub fn with_file_sizes(mut self, dev: u32, sizes: &[(u32, u64)]) -> Self {
        for &(file, bytes) in sizes {
            self.file_pages
                .insert(key(dev, Some(file)), bytes.div_ceil(PAGE));
        }
        self
    }

    pub fn new(cfg: PageCacheConfig) -> Self {
        PageCache {
            cfg,
            streams: Map::default(),
            pages: PageMap::default(),
            lru: Default::default(),
            next_child: 0,
            children: Map::default(),
            waiters: Map::default(),
            waiting: Map::default(),
            nr_dirty: 0,
            nr_writeback: 0,
            wb_children: Map::default(),
            flush_children: Map::default(),
            sync_waiters: Map::default(),
            syncs: Map::default(),
            throttled: Default::default(),
            flusher_at: None,
            file_pages: Map::default(),
            alloc_until: 0.0,
            delayed: Map::default(),
            reclaim_waiters: Map::default(),
            stats: PageCacheStats::default(),
        }
    }

    /// `posix_fadvise(fd, 0, 0, advice)` on `file` of `dev` (`None`: the raw device).
    /// Only the whole-file modes (NORMAL, SEQUENTIAL, RANDOM) are kept per file; the range
    /// advice (DONTNEED, WILLNEED) needs a range: send an `Op::Advise` request.
    pub fn fadvise(&mut self, dev: u32, file: Option<u32>, advice: Advice) {
        if matches!(advice, Advice::Normal | Advice::Sequential | Advice::Random) {
            self.stream_mut(key(dev, file)).advice = advice;
        }
    }

    /// The read-ahead state of a file (for tests and reports).
    pub fn ra_state(&self, dev: u32, file: Option<u32>) -> RaState {
        self.streams
            .get(&key(dev, file))
            .map(|s| s.ra)
            .unwrap_or_default()
    }

    /// Whether page `index` of the file is cached.
    pub fn is_cached(&self, dev: u32, file: Option<u32>, index: u64) -> bool {
        self.pages.contains_key(&PageKey {
            stream: key(dev, file),
            index,
        })
    }

    /// Whether page `index` is on the active list.
    pub fn is_active(&self, dev: u32, file: Option<u32>, index: u64) -> bool {
        self.pages
            .get(&PageKey {
                stream: key(dev, file),
                index,
            })
            .is_some_and(|p| p.list == List::Active)
    }

    /// Pages cached.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    pub fn counters(&self) -> PageCacheStats {
        self.stats
    }

    fn stream_mut(&mut self, k: StreamKey) -> &mut Stream {
        self.streams.entry(k).or_default()
    }

    fn max_pages(&self, s: &Stream) -> u64 {
        let base = self.cfg.read_ahead_kb / 4;
        match s.advice {
            Advice::Sequential => base * 2,
            _ => base,
        }
    }

    /// Renumbers list `l` if it has become sparse (see [`LruList::compact`]).
    fn compact(&mut self, l: List) {
        let pages = &mut self.pages;
        self.lru[l].compact(|k, pos| {
            if let Some(p) = pages.get_mut(&k) {
                p.seq = pos;
            }
        });
    }

    /// Drops the reclaimable pages of `[first, last)` of a file (DONTNEED, O_DIRECT's
    /// invalidation); returns how many. Which order they leave their lists in changes
    /// nothing (a list keeps the order of the entries that stay), so they leave chunk by
    /// chunk and the lists are compacted once.
    fn drop_range(&mut self, sk: StreamKey, first: u64, last: u64) -> u64 {
        if self.pages.is_empty() {
            return 0;
        }
        let dropped = self.pages.drop_reclaimable(sk, first, last, &mut self.lru);
        if dropped > 0 {
            self.compact(List::Inactive);
            self.compact(List::Active);
        }
        dropped
    }

    /// Moves an inactive page accessed a second time ([`Page::accessed`]) to the active list.
    fn activate(&mut self, k: PageKey) {
        let Some(p) = self.pages.get_mut(&k) else {
            return;
        };
        self.lru[List::Inactive].remove(p.seq);
        p.list = List::Active;
        p.referenced = false;
        p.seq = self.lru[List::Active].push(k, p.reclaimable());
        self.compact(List::Inactive);
    }

    /// Reclaims until the cache fits its capacity (pages in flight are skipped).
    ///
    /// Each victim leaves its list at once (the next choice sees it gone) but the map only
    /// at the end, all together: victims come in LRU order, mostly runs of one file's
    /// consecutive pages, so [`PageMap::remove_all`] looks a chunk up once per run instead
    /// of once per page. Nothing in the loop reads a victim's map entry: the aging takes
    /// pages still on the active list, and the choice reads the lists' marks only.
    fn shrink(&mut self) {
        let cap = self.cfg.capacity_pages;
        let mut len = self.pages.len() as u64;
        if len <= cap {
            return;
        }
        let (inactive, active) = (List::Inactive, List::Active);
        let mut victims = Vec::with_capacity((len - cap).min(1 << 16) as usize);
        while len > cap {
            // Age the active list while it is larger than the inactive one.
            while self.lru[active].len() > self.lru[inactive].len() {
                let Some((old, k)) = self.lru[active].oldest() else {
                    break;
                };
                self.lru[active].remove(old);
                if let Some(p) = self.pages.get_mut(&k) {
                    p.list = inactive;
                    p.referenced = false;
                    p.seq = self.lru[inactive].push(k, p.reclaimable());
                }
                self.compact(active);
            }
            // The oldest reclaimable page of the inactive list, else of the active one.
            let victim = [inactive, active]
                .into_iter()
                .find_map(|l| Some((l, self.lru[l].oldest_reclaimable()?)));
            // (Tests: the same page as a walk from the old end of each list.)
            #[cfg(test)]
            assert_eq!(
                victim.map(|(_, (_, k))| k),
                self.lru[inactive]
                    .iter()
                    .chain(self.lru[active].iter())
                    .map(|(_, k)| k)
                    .find(|k| self.pages.get(k).is_some_and(Page::reclaimable))
            );
            match victim {
                Some((l, (pos, k))) => {
                    self.lru[l].remove(pos);
                    victims.push(k);
                    len -= 1;
                    self.stats.evicted_pages += 1;
                }
                // Everything is in flight, dirty or under write-back: over capacity until
                // reads finish and write-back (see `throttle_pages`) cleans pages.
                None => break,
            }
        }
        self.pages.remove_all(&victims);
        self.compact(inactive);
        self.compact(active);
    }
}

impl PageCache {
    /// The id of a new request this component sends down.
    fn child_id(&mut self) -> u64 {
        let id = CHILD_ID_BIT | self.next_child;
        self.next_child += 1;
        id
    }
}

/// The request (no flags) for `pages` of file `sk`, whose byte 0 is at sector `base`, that
/// this component sends down at `now` as `id`.
fn child_request(
    id: u64,
    now: f64,
    sk: StreamKey,
    base: i64,
    pages: std::ops::Range<u64>,
    op: Op,
) -> Request {
    let lba = base + (pages.start * SECTORS_PER_PAGE) as i64;
    Request {
        id,
        arrival: now,
        dev: sk.dev,
        ..Request::block(
            lba.max(0) as u64,
            ((pages.end - pages.start) * SECTORS_PER_PAGE) as u32,
            op,
        )
    }
}

fn key(dev: u32, file: Option<u32>) -> StreamKey {
    StreamKey {
        dev,
        file: file.unwrap_or(u32::MAX),
    }
}

fn file_of(sk: StreamKey) -> Option<u32> {
    (sk.file != u32::MAX).then_some(sk.file)
}

impl Component for PageCache {
    fn name(&self) -> &str {
        "pagecache"
    }

    /// A buffered read of pages all cached, unmarked and not in flight: served from the
    /// cache with nothing below (what `submit` does with it, without the queues).
    fn serve_now(&mut self, req: &Request, now: f64, rec: &mut Record) -> Option<Finished> {
        let plain_read = req.op == Op::Read
            && req.sectors > 0
            && !req.flags.contains(crate::request::Flags::DIRECT);
        if !plain_read {
            return None;
        }
        *rec = self.try_cached_read(req, now).ok()?;
        Some(if rec.completion > now {
            Finished::UpAt
        } else {
            Finished::Up
        })
    }

    fn submit(&mut self, req: Request, ctx: &mut Ctx) {
        let direct = req.flags.contains(crate::request::Flags::DIRECT);
        if let Op::Advise(advice) = req.op {
            let busy = self.advise(&req, advice, ctx);
            let now = ctx.now();
            let rec = Record {
                arrival: req.arrival,
                device_start: now,
                completion: now + self.cfg.syscall_ms + busy,
                ..Default::default()
            };
            if self.cfg.syscall_ms + busy > 0.0 {
                self.later(Completion { req, rec }, ctx);
            } else {
                ctx.up(Completion { req, rec });
            }
            return;
        }
        match req.op {
            Op::Read if !direct && req.sectors > 0 => self.buffered_read(req, ctx),
            Op::Write if !direct && req.sectors > 0 => self.buffered_write(req, ctx),
            Op::Flush if req.file.is_some() => self.fsync(req, ctx),
            Op::Read | Op::Write if direct && req.sectors > 0 => self.direct(req, ctx),
            // A raw device flush, an empty request.
            _ => ctx.down(req),
        }
    }

    fn complete(&mut self, done: Completion, ctx: &mut Ctx) {
        if let Some((sk, pages)) = self.wb_children.remove(&done.req.id) {
            self.writeback_done(done.req.id, sk, pages, ctx);
            return;
        }
        if let Some(sync) = self.flush_children.remove(&done.req.id) {
            self.sync_done(sync, ctx);
            return;
        }
        let Some((sk, pages)) = self.children.remove(&done.req.id) else {
            // An O_DIRECT request or a raw flush passed through. After a direct write the
            // kernel invalidates the range again (pages read into it meanwhile are stale).
            if done.req.op == Op::Write && done.req.flags.contains(Flags::DIRECT) {
                let (sk, offset, end) = Self::range_of(&done.req);
                let (first, last) = (offset / PAGE, end.unwrap_or(offset).div_ceil(PAGE));
                self.drop_range(sk, first, last);
                self.release_throttled(ctx);
            }
            ctx.up(done);
            return;
        };
        let lru = &mut self.lru;
        self.pages.for_each_mut(sk, pages.start, pages.end, |_, p| {
            if p.pending == Some(done.req.id) {
                p.pending = None;
                lru[p.list].set_reclaimable(p.seq, p.reclaimable());
            }
        });
        // The read's pages are reclaimable now: a writer held because the cache was full
        // of pages being read may go on (write-back need not be in flight to release it).
        self.release_throttled(ctx);
        for parent in self.waiters.remove(&done.req.id).unwrap_or_default() {
            let finished = match self.waiting.get_mut(&parent) {
                Some(w) => {
                    w.outstanding -= 1;
                    w.outstanding == 0
                }
                None => false,
            };
            if finished {
                if let Some(w) = self.waiting.remove(&parent) {
                    let rec = Record {
                        arrival: w.req.arrival,
                        cache: w.outcome,
                        completion: ctx.now() + self.cfg.cpu_ms(w.req.bytes()),
                        ..done.rec
                    };
                    self.deliver(Completion { req: w.req, rec }, ctx);
                }
            }
        }
    }

    fn wake(&mut self, token: u64, ctx: &mut Ctx) {
        if let Some(mut req) = self.delayed.remove(&token) {
            req.arrival = ctx.now();
            ctx.down(req);
            return;
        }
        if token == FLUSH_TOKEN {
            self.flusher_at = None;
            self.flusher_run(ctx);
            self.arm_flusher(ctx);
        }
    }

    fn stats(&self) -> Vec<(String, f64)> {
        let s = self.stats;
        let stats = [
            ("hit pages", s.hit_pages as f64),
            ("miss pages", s.miss_pages as f64),
            ("readahead pages", s.readahead_pages as f64),
            ("evicted pages", s.evicted_pages as f64),
            ("reads down", s.reads_down as f64),
            ("reads into large folios", s.large_folio_reads as f64),
            ("dropped pages (DONTNEED)", s.dropped_pages as f64),
            ("dirtied pages", s.dirtied_pages as f64),
            ("written-back pages", s.written_pages as f64),
            ("write-back writes", s.writes_down as f64),
            ("max dirty pages", s.max_dirty_pages as f64),
            (
                "max dirty+writeback pages",
                s.max_dirty_writeback_pages as f64,
            ),
            ("throttled writes", s.throttled_writes as f64),
            ("throttled ms", s.throttled_ms),
            (
                "reclaim write-backs (cache full of dirty pages)",
                s.reclaim_writebacks as f64,
            ),
            (
                "writes waiting on reclaim (v1 memcg)",
                s.reclaim_waits as f64,
            ),
            ("expired-page flusher runs", s.expire_runs as f64),
            ("background write-back runs", s.background_runs as f64),
            ("fsyncs", s.fsyncs as f64),
            ("O_DSYNC writes", s.dsync_writes as f64),
            ("device flushes", s.flushes_down as f64),
        ];
        crate::engine::prefixed_stats("pagecache", &stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Pending, Simulator, VecSource, When};
    use crate::request::{FileRef, Flags};
    use crate::testdev::{Log, TestDev};
    use std::cell::RefCell;
    use std::rc::Rc;

    /// Lets a test look at the page cache after the engine ran it (`pin_tests` too).
    pub(super) struct Shared(pub(super) Rc<RefCell<PageCache>>);
    impl Component for Shared {
        fn name(&self) -> &str {
            "pagecache"
        }
        fn submit(&mut self, req: Request, ctx: &mut Ctx) {
            self.0.borrow_mut().submit(req, ctx)
        }
        fn complete(&mut self, done: Completion, ctx: &mut Ctx) {
            self.0.borrow_mut().complete(done, ctx)
        }
        fn wake(&mut self, token: u64, ctx: &mut Ctx) {
            self.0.borrow_mut().wake(token, ctx)
        }
    }

    /// What the device saw, as (first page, pages); it serves each request in 1 ms.
    fn pages_log(_t: f64, r: &Request) -> (u64, u64) {
        (
            r.lba / SECTORS_PER_PAGE,
            u64::from(r.sectors) / SECTORS_PER_PAGE,
        )
    }

    struct Rig {
        pc: Rc<RefCell<PageCache>>,
        log: Rc<RefCell<Vec<(u64, u64)>>>,
        sim: Simulator,
    }

    fn rig(capacity_pages: u64, read_ahead_kb: u64) -> Rig {
        let pc = Rc::new(RefCell::new(PageCache::new(PageCacheConfig::new(
            capacity_pages,
            read_ahead_kb,
        ))));
        let log = Rc::new(RefCell::new(Vec::new()));
        let sim = Simulator::new(vec![
            Box::new(Shared(pc.clone())),
            Box::new(TestDev::new(&log, pages_log, 1.0, false)),
        ]);
        Rig { pc, log, sim }
    }

    /// One-page reads of file 0 (laid out from sector 0), one after another (closed loop).
    fn read_pages_seq(r: &mut Rig, pages: &[u64]) -> Vec<Completion> {
        let items = pages
            .iter()
            .map(|&p| Pending {
                when: When::AfterCompletion { think: 0.5 },
                req: Request {
                    id: 0,
                    arrival: 0.0,
                    dev: 0,
                    lba: p * SECTORS_PER_PAGE,
                    sectors: SECTORS_PER_PAGE as u32,
                    op: Op::Read,
                    flags: Flags::default(),
                    file: Some(FileRef {
                        file: 0,
                        offset: p * PAGE,
                    }),
                    prio: crate::request::IoPrio::NONE,
                },
            })
            .collect();
        let mut out = Vec::new();
        r.sim
            .run(&mut VecSource::new(items), &mut |c| out.push(c.clone()))
            .unwrap();
        out
    }

    #[test]
    fn window_sizes_follow_the_kernel_formulas() {
        // read_ahead_kb = 128 → max 32 pages.
        assert_eq!(init_ra_size(1, 32), 4); // 1 ≤ 32/32: ×4
        assert_eq!(init_ra_size(3, 32), 8); // 4 ≤ 32/4: ×2
        assert_eq!(init_ra_size(8, 32), 16);
        assert_eq!(init_ra_size(9, 32), 32); // 16 > 32/4: max
                                             // This machine's vda: read_ahead_kb = 8192 → max 2048 pages. Ramp from a 4 KiB read:
                                             // 4 (×4: 4 < 128), 16, 64 (×4 while < 2048/16 = 128), 256, 512, 1024 (×2 while
                                             // ≤ 1024), then 2048 for good.
        let mut w = vec![init_ra_size(1, 2048)];
        while w.len() < 8 {
            w.push(next_ra_size(*w.last().unwrap(), 2048));
        }
        assert_eq!(w, vec![4, 16, 64, 256, 512, 1024, 2048, 2048]);
    }

    /// Sequential 4 KiB reads, read_ahead_kb = 128 (max 32 pages), derived from
    /// mm/readahead.c:
    /// * read of page 0 misses: sync read-ahead, index 0 → initial window
    ///   `get_init_ra_size(1, 32)` = 4 pages (16 KiB), `async_size = 4 - 1 = 3`: pages 0–3,
    ///   marker on page 0 + 4 - 3 = 1;
    /// * read of page 1 hits the marker: `start = 4`, `size = get_next_ra_size(4)` = 8
    ///   (4 ≥ 32/16, ≤ 32/2: ×2), `async_size = 8`: pages 4–11, marker on 4;
    /// * page 4 → pages 12–27 (16), marker 12; page 12 → 28–59 (32), marker 28;
    /// * page 28 → 60–91 (32 = max), page 60 → 92–123, page 92 → 124–155, and so on.
    ///
    /// So the device sees 16, 32, 64, 128, 128, 128, 128 KiB for pages 0–99: the kernel's
    /// ramp-up, each window read when the reader reaches the first page of the previous one.
    #[test]
    fn sequential_reads_ramp_the_window_like_linux() {
        let mut r = rig(1 << 20, 128);
        let pages: Vec<u64> = (0..100).collect();
        let out = read_pages_seq(&mut r, &pages);
        assert_eq!(
            *r.log.borrow(),
            vec![
                (0, 4),
                (4, 8),
                (12, 16),
                (28, 32),
                (60, 32),
                (92, 32),
                (124, 32)
            ]
        );
        assert_eq!(out.len(), 100);
        assert_eq!(out[0].rec.cache, CacheOutcome::Miss);
        // Every later read was a hit served at once: read-ahead kept ahead of the reader.
        for c in &out[1..] {
            assert_eq!(c.rec.cache, CacheOutcome::Hit, "page {}", c.req.lba / 8);
            assert_eq!(c.rec.completion, c.rec.arrival);
        }
        let s = r.pc.borrow().counters();
        assert_eq!((s.miss_pages, s.hit_pages), (1, 99));
        assert_eq!(s.readahead_pages, 156 - 1);
        assert_eq!(
            r.pc.borrow().ra_state(0, Some(0)),
            RaState {
                start: 124,
                size: 32,
                async_size: 32,
                // 0, then 2 more a window, at most log2 of the 32-page window.
                order: 5,
            }
        );
    }

    /// The response time (ms, to the µs) of one read of `pages` pages of file 0 from `first`.
    fn read_ms(r: &mut Rig, first: u64, pages: u64) -> f64 {
        let when = When::AfterCompletion { think: 0.5 };
        let read = freq(when, Op::Read, Flags::default(), 0, first, pages);
        (run_items(&mut r.sim, vec![read])[0].response() * 1e3).round() / 1e3
    }

    /// A read brings its new folios in before its read goes down (8 order-0 folios for a
    /// random 8-page read: 8 × 10 µs before the device's 1 ms), and pays nothing for them
    /// once cached; a read that starts an asynchronous read-ahead pays for its folios though
    /// its own pages were cached.
    #[test]
    fn a_read_pays_for_each_new_folio() {
        let mut r = rig(1 << 20, 128);
        r.pc.borrow_mut().cfg.miss_folio_ms = 0.01;
        r.pc.borrow_mut().fadvise(0, Some(0), Advice::Random);
        assert_eq!(read_ms(&mut r, 100, 8), 1.08);
        assert_eq!(read_ms(&mut r, 100, 8), 0.0);
        // Sequential: page 0 reads the first window (4 folios, order 0) and waits; page 1
        // finds its page cached and the marker on it: the next window's 8 pages (order 2:
        // 2 folios) are brought in on its time.
        let mut r = rig(1 << 20, 128);
        r.pc.borrow_mut().cfg.miss_folio_ms = 0.01;
        assert_eq!(read_ms(&mut r, 0, 1), 1.04);
        assert_eq!(read_ms(&mut r, 1, 1), 0.02);
    }

    /// A read into a full cache also pays for the room it reclaims, per folio beyond the
    /// capacity; reads while there is room pay the folios alone.
    #[test]
    fn a_read_into_a_full_cache_pays_for_the_room_it_reclaims() {
        let mut r = rig(20, 128);
        {
            let mut pc = r.pc.borrow_mut();
            pc.cfg.miss_folio_ms = 0.01;
            pc.cfg.reclaim_folio_ms = 0.005;
            pc.fadvise(0, Some(0), Advice::Random);
        }
        // 8 and 16 pages cached: room for both.
        assert_eq!(read_ms(&mut r, 100, 8), 1.08);
        assert_eq!(read_ms(&mut r, 200, 8), 1.08);
        // 24 pages for a capacity of 20: 4 folios' room reclaimed, then 8.
        assert_eq!(read_ms(&mut r, 300, 8), 1.1);
        assert_eq!(read_ms(&mut r, 400, 8), 1.12);
        assert_eq!(r.pc.borrow().counters().evicted_pages, 12);
        assert_eq!(read_ms(&mut r, 400, 8), 0.0);
    }

    /// Read-ahead's folios grow by two orders a window from 0 (kernel 6.18 `ra->order`), up
    /// to a PMD; the reads into folios of 64 KiB or more go down flagged.
    #[test]
    fn read_ahead_folios_grow_two_orders_a_window() {
        assert_eq!(next_folio_order(0, 2), 0);
        assert_eq!(next_folio_order(8, 4096), MAX_FOLIO_ORDER);
        let mut r = rig(1 << 20, 8192);
        let mut orders = vec![];
        for p in 0..4 + 16 + 64 + 256 + 1024 + 1 {
            read_pages_seq(&mut r, &[p]);
            let st = r.pc.borrow().ra_state(0, Some(0));
            if orders.last() != Some(&(st.size, st.order)) {
                orders.push((st.size, st.order));
            }
        }
        assert_eq!(
            orders,
            vec![
                (4, 0),
                (16, 2),
                (64, 4),
                (256, 6),
                (512, 8),
                (1024, 9),
                (2048, 9)
            ]
        );
        let s = r.pc.borrow().counters();
        // One read a window; those of 64 pages and more into large folios.
        assert_eq!((s.reads_down, s.large_folio_reads), (7, 5));
    }

    /// The same ramp on a file of 20 pages (80 KiB) whose size the workload gave: the
    /// windows stop at its last page (`do_page_cache_ra` clips at `i_size`), where without
    /// the size the third window would read pages 12–27, 8 of them past the end.
    #[test]
    fn read_ahead_stops_at_the_end_of_the_file() {
        let mut r = rig(1 << 20, 128);
        let pc = std::mem::replace(
            &mut *r.pc.borrow_mut(),
            PageCache::new(PageCacheConfig::new(1, 0)),
        );
        *r.pc.borrow_mut() = pc.with_file_sizes(0, &[(0, 20 * PAGE - 100)]);
        let pages: Vec<u64> = (0..20).collect();
        let out = read_pages_seq(&mut r, &pages);
        assert_eq!(*r.log.borrow(), vec![(0, 4), (4, 8), (12, 8)]);
        assert_eq!(out.len(), 20);
        assert_eq!(r.pc.borrow().counters().readahead_pages, 20 - 1);
    }

    #[test]
    fn a_page_read_ahead_is_a_hit() {
        let mut r = rig(1 << 20, 128);
        let out = read_pages_seq(&mut r, &[0, 2]);
        // Page 2 came with page 0's initial window (pages 0–3) and needed no device read.
        assert_eq!(*r.log.borrow(), vec![(0, 4)]);
        assert_eq!(out[1].rec.cache, CacheOutcome::Hit);
        assert_eq!(out[1].response(), 0.0);
        assert!(out[0].response() > 0.0);
    }

    /// A random read is read as is (no window) and leaves the state; a read continuing from
    /// it starts a new stream with the initial window again.
    #[test]
    fn a_random_read_resets_the_window() {
        let mut r = rig(1 << 20, 128);
        let seq: Vec<u64> = (0..40).collect();
        read_pages_seq(&mut r, &seq);
        let ramped = r.pc.borrow().ra_state(0, Some(0));
        assert_eq!(ramped.size, 32);
        r.log.borrow_mut().clear();
        read_pages_seq(&mut r, &[1000]);
        assert_eq!(*r.log.borrow(), vec![(1000, 1)]);
        assert_eq!(r.pc.borrow().ra_state(0, Some(0)), ramped);
        read_pages_seq(&mut r, &[1001]);
        assert_eq!(*r.log.borrow(), vec![(1000, 1), (1001, 4)]);
        assert_eq!(
            r.pc.borrow().ra_state(0, Some(0)),
            RaState {
                start: 1001,
                size: 4,
                async_size: 3,
                order: 0,
            }
        );
    }

    #[test]
    fn fadvise_random_reads_only_what_is_asked_and_sequential_doubles_the_window() {
        let mut r = rig(1 << 20, 128);
        r.pc.borrow_mut().fadvise(0, Some(0), Advice::Random);
        read_pages_seq(&mut r, &[0, 1, 2]);
        assert_eq!(*r.log.borrow(), vec![(0, 1), (1, 1), (2, 1)]);

        let mut r = rig(1 << 20, 128);
        r.pc.borrow_mut().fadvise(0, Some(0), Advice::Sequential);
        let pages: Vec<u64> = (0..80).collect();
        read_pages_seq(&mut r, &pages);
        // max 64 pages: init 4 (1 ≤ 64/32: ×4), then 8 (4 ≥ 64/16: ×2), 16, 32, 64, 64;
        // page 60 (the marker of the 60–123 window) reads 124–187.
        assert_eq!(
            *r.log.borrow(),
            vec![(0, 4), (4, 8), (12, 16), (28, 32), (60, 64), (124, 64)]
        );
    }

    /// Capacity 4 pages, no read-ahead: pages enter the inactive list, a second read
    /// promotes to active, reclaim takes the oldest inactive page first.
    #[test]
    fn lru_evicts_the_oldest_inactive_page_and_spares_the_active_one() {
        let mut r = rig(4, 0);
        read_pages_seq(&mut r, &[0, 1, 2, 3]);
        assert!(!r.pc.borrow().is_active(0, Some(0), 0));
        read_pages_seq(&mut r, &[0]); // second access: promoted
        assert!(r.pc.borrow().is_active(0, Some(0), 0));
        read_pages_seq(&mut r, &[4, 5]);
        let pc = r.pc.borrow();
        let cached: Vec<u64> = (0..6).filter(|&p| pc.is_cached(0, Some(0), p)).collect();
        assert_eq!(cached, vec![0, 3, 4, 5]);
        assert_eq!(pc.counters().evicted_pages, 2);
        assert_eq!(pc.len(), 4);
        drop(pc);
        // Page 0 was cached: reading it again costs no device read.
        r.log.borrow_mut().clear();
        let out = read_pages_seq(&mut r, &[0]);
        assert!(r.log.borrow().is_empty());
        assert_eq!(out[0].rec.cache, CacheOutcome::Hit);
    }

    #[test]
    fn direct_reads_bypass_and_invalidate() {
        let mut r = rig(1 << 20, 0);
        read_pages_seq(&mut r, &[7]);
        assert!(r.pc.borrow().is_cached(0, Some(0), 7));
        let req = Request {
            id: 0,
            arrival: 0.0,
            dev: 0,
            lba: 7 * 8,
            sectors: 8,
            op: Op::Read,
            flags: Flags::DIRECT,
            file: Some(FileRef {
                file: 0,
                offset: 7 * PAGE,
            }),
            prio: crate::request::IoPrio::NONE,
        };
        let mut out = Vec::new();
        r.sim
            .run(
                &mut VecSource::new(vec![Pending {
                    when: When::At(0.0),
                    req,
                }]),
                &mut |c| out.push(c.clone()),
            )
            .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(*r.log.borrow(), vec![(7, 1), (7, 1)]);
        assert!(!r.pc.borrow().is_cached(0, Some(0), 7));
    }

    /// What a test device saw: (time, op letter, first page, pages).
    type DevLog = Log<(f64, char, u64, u64)>;

    /// A device that logs (time, op letter, first page, pages) and serves each request in
    /// `service` ms, one at a time (FCFS).
    fn serial_device(log: &DevLog, service: f64) -> TestDev<(f64, char, u64, u64)> {
        TestDev::new(
            log,
            |t, r| {
                (
                    t,
                    r.op.letter(),
                    r.lba / SECTORS_PER_PAGE,
                    u64::from(r.sectors) / SECTORS_PER_PAGE,
                )
            },
            service,
            true,
        )
    }

    struct WRig {
        pc: Rc<RefCell<PageCache>>,
        log: DevLog,
        sim: Simulator,
    }

    /// Page cache with the given dirty thresholds (bytes), no read-ahead, over a serial
    /// device of `service` ms per request.
    fn wrig(bg_bytes: u64, limit_bytes: u64, service: f64) -> WRig {
        let mut cfg = PageCacheConfig::new(1 << 20, 0);
        cfg.dirty.background = Threshold::Bytes(bg_bytes);
        cfg.dirty.limit = Threshold::Bytes(limit_bytes);
        let pc = Rc::new(RefCell::new(PageCache::new(cfg)));
        let log = Rc::new(RefCell::new(Vec::new()));
        let sim = Simulator::new(vec![
            Box::new(Shared(pc.clone())),
            Box::new(serial_device(&log, service)),
        ]);
        WRig { pc, log, sim }
    }

    /// A request of `pages` pages at page `page` of file `file`, which starts at device page
    /// `base` (`pin_tests` too).
    pub(super) fn file_request(
        base: u64,
        op: Op,
        flags: Flags,
        file: u32,
        page: u64,
        pages: u64,
    ) -> Request {
        Request {
            id: 0,
            arrival: 0.0,
            dev: 0,
            lba: (base + page) * SECTORS_PER_PAGE,
            sectors: (pages * SECTORS_PER_PAGE) as u32,
            op,
            flags,
            file: Some(FileRef {
                file,
                offset: page * PAGE,
            }),
            prio: crate::request::IoPrio::NONE,
        }
    }

    /// A file request: file `file` laid out from page `file * 2^20`.
    fn freq(when: When, op: Op, flags: Flags, file: u32, page: u64, pages: u64) -> Pending {
        let req = file_request(u64::from(file) << 20, op, flags, file, page, pages);
        Pending { when, req }
    }

    fn run_items(sim: &mut Simulator, items: Vec<Pending>) -> Vec<Completion> {
        let mut out = Vec::new();
        sim.run(&mut VecSource::new(items), &mut |c| out.push(c.clone()))
            .unwrap();
        out
    }

    const NOW: When = When::AfterCompletion { think: 0.0 };

    /// Under the background threshold nothing is written until the pages are older than
    /// `dirty_expire_centisecs` (30 s): the flusher wakes every 5 s from the first dirtying
    /// and writes them at its 30 s run, in one write.
    #[test]
    fn below_the_background_threshold_nothing_is_written_until_expiry() {
        let mut r = wrig(1 << 20, 4 << 20, 1.0);
        let out = run_items(
            &mut r.sim,
            vec![freq(NOW, Op::Write, Flags::default(), 0, 0, 16)],
        );
        assert_eq!(out[0].rec.completion, 0.0);
        assert_eq!(out[0].rec.cache, CacheOutcome::WriteBack);
        assert_eq!(*r.log.borrow(), vec![(30_000.0, 'W', 0, 16)]);
        let pc = r.pc.borrow();
        assert_eq!(pc.dirty_pages(), (0, 0));
        assert!(pc.is_cached(0, Some(0), 3) && !pc.is_dirty(0, Some(0), 3));
        assert_eq!(pc.counters().expire_runs, 1);
    }

    /// Above the background threshold (16 pages) the flusher writes at once, the oldest
    /// file first, until the dirty count is back under it; what stays under it waits for
    /// expiry.
    #[test]
    fn above_the_background_threshold_the_flusher_starts() {
        let mut r = wrig(16 * PAGE, 1 << 20, 1.0);
        let items = (0..8)
            .map(|i| freq(NOW, Op::Write, Flags::default(), 0, i * 4, 4))
            .collect();
        run_items(&mut r.sim, items);
        // The 5th write made 20 dirty pages > 16: pages 0–19 go down at t=0; 20–31 (12) wait
        // for the 30 s run.
        assert_eq!(
            *r.log.borrow(),
            vec![(0.0, 'W', 0, 20), (30_000.0, 'W', 20, 12)]
        );
        assert_eq!(r.pc.borrow().counters().background_runs, 1);
    }

    /// bg 16 pages, limit 64: freerun 40, setpoint 52. One-page writes at memory speed: the
    /// first 52 complete at once, the 53rd waits for write-back; dirty + write-back never
    /// exceeds 53; afterwards the writer goes at the device's pace.
    #[test]
    fn at_the_dirty_limit_the_writer_is_throttled() {
        let mut r = wrig(16 * PAGE, 64 * PAGE, 10.0);
        assert_eq!(r.pc.borrow().thresholds(), (16, 64));
        assert_eq!(r.pc.borrow().throttle_pages(), 52);
        let items = (0..200)
            .map(|i| freq(NOW, Op::Write, Flags::default(), 0, i, 1))
            .collect();
        let out = run_items(&mut r.sim, items);
        assert_eq!(out.len(), 200);
        let at_once = out.iter().filter(|c| c.rec.completion == 0.0).count();
        assert_eq!(at_once, 52);
        let pc = r.pc.borrow();
        let s = pc.counters();
        assert_eq!(s.max_dirty_writeback_pages, 53);
        assert!(s.throttled_writes > 0 && s.throttled_ms > 0.0);
        assert_eq!(s.written_pages, 200);
        // Every throttled write was released by a write-back completion (a device instant).
        let device_done: Vec<f64> = r.log.borrow().iter().map(|e| e.0 + 10.0).collect();
        for c in out.iter().filter(|c| c.rec.completion > 0.0) {
            assert!(
                device_done.contains(&c.rec.completion),
                "released at {}",
                c.rec.completion
            );
        }
    }

    /// A write held because the cache is full of pages being read (not of dirty ones) goes
    /// on when a read frees pages, not only when write-back completes: with write-back
    /// finishing before the reads (a fuzzed fio job of 41 readers and a writer over a
    /// 1 MiB cache) nothing else would ever release it and the run stalled.
    #[test]
    fn a_write_held_by_a_cache_full_of_reads_goes_on_when_a_read_ends() {
        let mut cfg = PageCacheConfig::new(8, 0);
        cfg.dirty.background = Threshold::Bytes(1 << 20);
        cfg.dirty.limit = Threshold::Bytes(4 << 20);
        let pc = Rc::new(RefCell::new(PageCache::new(cfg)));
        let log: DevLog = Rc::new(RefCell::new(Vec::new()));
        let mut sim = Simulator::new(vec![
            Box::new(Shared(pc.clone())),
            Box::new(TestDev::new(
                &log,
                serial_device(&log, 0.0).entry(),
                10.0,
                false,
            )),
        ]);
        // Each request takes 10 ms, all in parallel. Reads A (file 0) at 0 and B (file 1) at
        // 3 fill the 8 pages with pages being read; the write (file 2) at 3.5 makes 9 with
        // nothing reclaimable: it waits, its page's write-back runs [3.5, 13.5). Read A ends
        // at 10 and its pages can go.
        let out = run_items(
            &mut sim,
            vec![
                freq(When::At(0.0), Op::Read, Flags::default(), 0, 0, 4),
                freq(When::At(3.0), Op::Read, Flags::default(), 1, 0, 4),
                freq(When::At(3.5), Op::Write, Flags::default(), 2, 0, 1),
            ],
        );
        let write = out
            .iter()
            .find(|c| c.req.op == Op::Write)
            .expect("the write completed");
        assert_eq!(write.rec.completion, 10.0, "released when read A ended");
        assert_eq!(pc.borrow().counters().throttled_writes, 1);
    }

    /// fsync writes exactly the file's dirty pages, then flushes the device, and returns
    /// after the flush; the other file's dirty pages wait for expiry.
    #[test]
    fn fsync_waits_for_exactly_the_files_dirty_pages() {
        let mut r = wrig(1 << 20, 4 << 20, 1.0);
        let out = run_items(
            &mut r.sim,
            vec![
                freq(When::At(0.0), Op::Write, Flags::default(), 0, 0, 8),
                freq(When::At(0.0), Op::Write, Flags::default(), 1, 0, 8),
                freq(When::At(1.0), Op::Flush, Flags::default(), 0, 0, 0),
            ],
        );
        let fsync = out.iter().find(|c| c.req.op == Op::Flush).unwrap();
        assert_eq!((fsync.rec.arrival, fsync.rec.completion), (1.0, 3.0));
        assert_eq!(
            *r.log.borrow(),
            vec![
                (1.0, 'W', 0, 8),
                (2.0, 'F', 0, 0),
                (30_000.0, 'W', 1 << 20, 8)
            ]
        );
        assert_eq!(r.pc.borrow().counters().fsyncs, 1);
    }

    /// fsync waits for the file's pages already under write-back too, and for no write of
    /// pages dirtied after it was called.
    #[test]
    fn fsync_waits_for_write_back_in_flight() {
        let mut r = wrig(16 * PAGE, 1 << 20, 10.0);
        let out = run_items(
            &mut r.sim,
            vec![
                // 20 pages: background write-back of 0–19 starts at t=0 (done at 10).
                freq(When::At(0.0), Op::Write, Flags::default(), 0, 0, 20),
                freq(When::At(1.0), Op::Flush, Flags::DATASYNC, 0, 0, 0),
            ],
        );
        let fsync = out.iter().find(|c| c.req.op == Op::Flush).unwrap();
        // Nothing dirty at t=1: it waits for the write in flight (10), then the flush (20).
        assert_eq!(fsync.rec.completion, 20.0);
        assert_eq!(*r.log.borrow(), vec![(0.0, 'W', 0, 20), (10.0, 'F', 0, 0)]);
    }

    /// O_DSYNC: the write's pages go down at once, a flush follows, the call returns after
    /// it; nothing stays dirty.
    #[test]
    fn o_dsync_writes_go_through_and_flush() {
        let mut r = wrig(1 << 20, 4 << 20, 1.0);
        let out = run_items(
            &mut r.sim,
            vec![freq(NOW, Op::Write, Flags::DSYNC, 0, 4, 4)],
        );
        assert_eq!(out[0].rec.completion, 2.0);
        assert_eq!(*r.log.borrow(), vec![(0.0, 'W', 4, 4), (1.0, 'F', 0, 0)]);
        assert_eq!(r.pc.borrow().dirty_pages(), (0, 0));
        assert!(r.pc.borrow().is_cached(0, Some(0), 4));
    }

    /// The page map holds each page once, across chunk and file boundaries, and frees a
    /// chunk with its last page.
    #[test]
    fn the_page_map_is_a_map_of_pages() {
        let page = |seq| Page {
            list: List::Inactive,
            seq,
            referenced: false,
            marker: false,
            pending: None,
            dirty: false,
            wb: None,
        };
        let k = |file, index| PageKey {
            stream: key(0, Some(file)),
            index,
        };
        let mut m = PageMap::default();
        let keys = [k(0, 0), k(0, 63), k(0, 64), k(1, 64), k(0, 1 << 40)];
        for (i, key) in keys.iter().enumerate() {
            assert!(m.insert(*key, page(i as u64)).is_none());
        }
        assert!(m.insert(k(0, 63), page(9)).is_some_and(|p| p.seq == 1));
        assert_eq!(m.len(), 5);
        assert_eq!(m[&k(0, 63)].seq, 9);
        assert!(!m.contains_key(&k(1, 63)) && m.get(&k(0, 65)).is_none());
        let mut all: Vec<(u32, u64, u64)> = m
            .iter()
            .map(|(k, p)| (k.stream.file, k.index, p.seq))
            .collect();
        all.sort();
        assert_eq!(
            all,
            vec![
                (0, 0, 0),
                (0, 63, 9),
                (0, 64, 2),
                (0, 1 << 40, 4),
                (1, 64, 3)
            ]
        );
        assert!(m.remove(&k(0, 0)).is_some() && m.remove(&k(0, 0)).is_none());
        assert!(m.remove(&k(0, 63)).is_some());
        assert_eq!(m.chunks.len(), 3, "the first chunk went with its last page");
        for key in [k(0, 64), k(1, 64), k(0, 1 << 40)] {
            m.get_mut(&key).unwrap().dirty = true;
            assert!(m.remove(&key).is_some_and(|p| p.dirty));
        }
        assert!(m.is_empty() && m.chunks.is_empty());
    }

    /// The device flush of an fdatasync or an O_DSYNC write is a datasync one; fsync's and
    /// O_SYNC's are not.
    #[test]
    fn datasync_flushes_are_marked_for_the_device() {
        let flush_flags = |op: Op, flags: Flags| {
            let cfg = PageCacheConfig::new(1 << 20, 0);
            let pc = Rc::new(RefCell::new(PageCache::new(cfg)));
            let log: Rc<RefCell<Vec<(char, bool)>>> = Rc::new(RefCell::new(Vec::new()));
            let dev = TestDev::new(
                &log,
                |_, r| (r.op.letter(), r.flags.contains(Flags::DATASYNC)),
                1.0,
                true,
            );
            let mut sim = Simulator::new(vec![Box::new(Shared(pc)), Box::new(dev)]);
            let items = if op == Op::Write {
                vec![freq(NOW, Op::Write, flags, 0, 0, 4)]
            } else {
                vec![
                    freq(NOW, Op::Write, Flags::default(), 0, 0, 4),
                    freq(When::At(1.0), op, flags, 0, 0, 0),
                ]
            };
            run_items(&mut sim, items);
            let log = log.borrow();
            let flushes: Vec<bool> = log.iter().filter(|e| e.0 == 'F').map(|e| e.1).collect();
            assert_eq!(flushes.len(), 1, "{log:?}");
            flushes[0]
        };
        assert!(flush_flags(Op::Write, Flags::DSYNC));
        assert!(!flush_flags(Op::Write, Flags::OSYNC.with(Flags::DSYNC)));
        assert!(flush_flags(Op::Flush, Flags::DATASYNC));
        assert!(!flush_flags(Op::Flush, Flags::default()));
    }

    /// DONTNEED drops the range's clean pages and starts write-back of its dirty ones,
    /// which stay cached while under write-back.
    /// A v1 memory cgroup's reclaim waits on the oldest page when it is under write-back:
    /// random writes into a full cache meet it (the flusher writes in file order, the LRU
    /// ages in time order), sequential ones seldom, and without the setting nobody waits.
    #[test]
    fn legacy_memcg_reclaim_waits_on_the_oldest_page_under_write_back() {
        let run = |random: bool, legacy: bool| {
            let mut r = wrig(16 * PAGE, 1 << 30, 1.0);
            {
                let mut pc = r.pc.borrow_mut();
                pc.cfg.capacity_pages = 64;
                pc.cfg.reclaim_waits_on_writeback = legacy;
            }
            let items = (0..400u64)
                .map(|i| {
                    // 4-page blocks of a 256-page file: in order, or a fixed permutation.
                    let block = if random { (i * 37 + 11) % 64 } else { i % 64 };
                    freq(
                        When::AfterCompletion { think: 0.0 },
                        Op::Write,
                        Flags::default(),
                        0,
                        block * 4,
                        4,
                    )
                })
                .collect();
            let out = run_items(&mut r.sim, items);
            assert_eq!(out.len(), 400);
            let c = r.pc.borrow().counters();
            c.reclaim_waits
        };
        let (random, sequential) = (run(true, true), run(false, true));
        assert!(random > 0, "random writes never waited");
        assert!(
            random > 2 * sequential,
            "random {random}, sequential {sequential}"
        );
        assert_eq!(run(true, false), 0);
    }

    #[test]
    fn dontneed_drops_clean_pages_and_writes_dirty_ones() {
        let mut r = wrig(1 << 20, 4 << 20, 1.0);
        let out = run_items(
            &mut r.sim,
            vec![
                freq(When::At(0.0), Op::Read, Flags::default(), 0, 0, 4),
                freq(When::At(5.0), Op::Write, Flags::default(), 0, 4, 4),
                freq(
                    When::At(6.0),
                    Op::Advise(Advice::DontNeed),
                    Flags::default(),
                    0,
                    0,
                    0,
                ),
            ],
        );
        assert_eq!(out.len(), 3);
        assert_eq!(*r.log.borrow(), vec![(0.0, 'R', 0, 4), (6.0, 'W', 4, 4)]);
        let pc = r.pc.borrow();
        assert!(!pc.is_cached(0, Some(0), 0));
        assert!(pc.is_cached(0, Some(0), 4) && !pc.is_dirty(0, Some(0), 4));
        assert_eq!(pc.counters().dropped_pages, 4);
        drop(pc);
        // The call itself is free unless it has a cost per dirty page it writes back.
        assert_eq!(out[2].response(), 0.0);
        let mut r = wrig(1 << 20, 4 << 20, 1.0);
        r.pc.borrow_mut().cfg.dontneed_dirty_page_ms = 0.25;
        let advise = |at| {
            freq(
                At(at),
                Op::Advise(Advice::DontNeed),
                Flags::default(),
                0,
                0,
                0,
            )
        };
        use When::At;
        let out = run_items(
            &mut r.sim,
            vec![
                freq(At(0.0), Op::Read, Flags::default(), 0, 0, 4),
                freq(At(5.0), Op::Write, Flags::default(), 0, 4, 4),
                advise(6.0),
                advise(8.0),
            ],
        );
        // 4 dirty pages sent down by the first call; none left for the second.
        assert_eq!(out[2].response(), 1.0);
        assert_eq!(out[3].response(), 0.0);
    }

    /// O_DIRECT write over dirty cached pages: they are written first, then the direct
    /// write, and the range is dropped from the cache.
    #[test]
    fn direct_writes_write_back_then_invalidate() {
        let mut r = wrig(1 << 20, 4 << 20, 1.0);
        run_items(
            &mut r.sim,
            vec![
                freq(When::At(0.0), Op::Write, Flags::default(), 0, 0, 4),
                freq(When::At(1.0), Op::Write, Flags::DIRECT, 0, 0, 4),
            ],
        );
        assert_eq!(*r.log.borrow(), vec![(1.0, 'W', 0, 4), (2.0, 'W', 0, 4)]);
        assert!(!r.pc.borrow().is_cached(0, Some(0), 0));
        assert_eq!(r.pc.borrow().dirty_pages(), (0, 0));
    }

    /// The sets of reclaimable pages hold exactly the reclaimable pages, where they are.
    fn check_reclaimable(pc: &PageCache) {
        for l in [List::Inactive, List::Active] {
            let list = &pc.lru[l];
            let by_scan: Vec<u64> = list
                .iter()
                .filter(|(_, k)| pc.pages[k].reclaimable())
                .map(|(seq, _)| seq)
                .collect();
            let marked: Vec<u64> = list.reclaimable_positions().collect();
            assert_eq!(marked, by_scan, "{l:?}");
        }
    }

    /// Random writes over a file four times the cache, the dirty limits far above it:
    /// reclaim writes the full cache back in many writes that finish one by one, and the
    /// writer takes each page they clean (the victims are checked against a walk of the
    /// lists in `shrink` under test). Before the reclaimable sets, every insertion walked
    /// past the pages still under write-back: this ran 0.2x real time in a 64 MiB cgroup.
    #[test]
    fn reclaim_takes_the_oldest_clean_page_past_pages_under_write_back() {
        let mut cfg = PageCacheConfig::new(256, 0);
        cfg.dirty.dirtyable_pages = 1 << 20; // global ratios far above the cgroup
        let pc = Rc::new(RefCell::new(PageCache::new(cfg)));
        let log = Rc::new(RefCell::new(Vec::new()));
        let mut sim = Simulator::new(vec![
            Box::new(Shared(pc.clone())),
            Box::new(serial_device(&log, 0.1)),
        ]);
        let writes = 3000u64;
        let mut x = 12345u64;
        let items = (0..writes)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let page = (x >> 33) % 1024;
                freq(NOW, Op::Write, Flags::default(), 0, page, 1)
            })
            .collect();
        let out = run_items(&mut sim, items);
        assert_eq!(out.len(), writes as usize);
        let c = pc.borrow();
        let s = c.counters();
        assert!(s.evicted_pages > 1000, "{}", s.evicted_pages);
        assert!(s.reclaim_writebacks > 0 && s.writes_down > 100, "{s:?}");
        assert!(c.len() <= 257);
        check_reclaimable(&c);
    }

    /// A memory cgroup under v1: the dirty ratios are the whole machine's, far above the
    /// cgroup, so nothing is written back while the cache fills; the write that overfills
    /// it makes reclaim write every dirty page and wait for clean ones. Every page is
    /// written and the cache stays within its capacity plus the page being written.
    #[test]
    fn a_small_cache_bounds_the_dirty_pages() {
        let mut cfg = PageCacheConfig::new(64, 0);
        cfg.dirty.dirtyable_pages = 1 << 20; // global ratios far above the cgroup
        let pc = Rc::new(RefCell::new(PageCache::new(cfg)));
        assert_eq!(pc.borrow().thresholds(), (104_857, 209_715));
        let log = Rc::new(RefCell::new(Vec::new()));
        let mut sim = Simulator::new(vec![
            Box::new(Shared(pc.clone())),
            Box::new(serial_device(&log, 1.0)),
        ]);
        let items = (0..500)
            .map(|i| freq(NOW, Op::Write, Flags::default(), 0, i, 1))
            .collect();
        let out = run_items(&mut sim, items);
        assert_eq!(out.len(), 500);
        let s = pc.borrow().counters();
        // The first device write is the 65 pages dirty when the 65th write overfilled it.
        assert_eq!(log.borrow()[0], (0.0, 'W', 0, 65));
        assert!(
            s.max_dirty_writeback_pages <= 65,
            "{}",
            s.max_dirty_writeback_pages
        );
        assert!(s.reclaim_writebacks > 0 && s.throttled_writes > 0);
        assert_eq!(s.written_pages, 500);
        assert!(pc.borrow().len() <= 65);
        check_reclaimable(&pc.borrow());
    }

    /// What the page cache's size comes from on this machine (`HostParams::from_system`):
    /// MemTotal in kB, a cgroup limit of `max` or a byte count.
    #[test]
    fn memory_limits_parse() {
        let m = iolab_sys::host::Meminfo::parse("MemFree: 1 kB\nMemTotal:       16316412 kB\n");
        assert_eq!(m.get("MemTotal"), Some(16316412 * 1024));
        assert_eq!(
            iolab_sys::host::Meminfo::parse("nothing").get("MemTotal"),
            None
        );
        let limit = iolab_sys::host::parse_cgroup_limit;
        assert_eq!(limit("max\n"), None);
        assert_eq!(limit("268435456\n"), Some(268435456));
        assert_eq!(limit("junk"), None);
        assert!(crate::host::read_memory().unwrap().cache_bytes / PAGE > 0);
    }
}
