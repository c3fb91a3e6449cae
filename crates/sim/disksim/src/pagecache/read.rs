//! The read path: read-ahead (the kernel's window and folio-size formulas and the
//! synchronous and asynchronous read-ahead), `posix_fadvise`, and buffered reads, from the
//! cache or waiting for the reads sent down.

use super::*;

/// The first window of a new read-ahead stream, in pages (kernel `get_init_ra_size`): the
/// request rounded up to a power of two, ×4 when small (≤ max/32), ×2 when medium (≤ max/4),
/// else the maximum.
pub fn init_ra_size(req_pages: u64, max: u64) -> u64 {
    let size = req_pages.max(1).next_power_of_two();
    if size <= max / 32 {
        size * 4
    } else if size <= max / 4 {
        size * 2
    } else {
        max
    }
}

/// The next window after one of `cur` pages (kernel `get_next_ra_size`): ×4 while under
/// max/16, ×2 up to max/2, then the maximum.
pub fn next_ra_size(cur: u64, max: u64) -> u64 {
    if cur < max / 16 {
        4 * cur
    } else if cur <= max / 2 {
        2 * cur
    } else {
        max
    }
}

/// Per-file read-ahead state (kernel `struct file_ra_state`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaState {
    /// First page of the current window.
    pub start: u64,
    /// Window length in pages.
    pub size: u64,
    /// Pages at the end of the window read asynchronously; the marker is on the first.
    pub async_size: u64,
    /// Folio order (log2 pages) of the window's new folios (kernel `ra->order`, 6.18): 0
    /// from a synchronous read-ahead, 2 more at each asynchronous one, at most
    /// [`MAX_FOLIO_ORDER`] and log2 of the window.
    pub order: u8,
}

/// Largest page-cache folio (kernel `MAX_PAGECACHE_ORDER` on x86-64: a PMD, 2 MiB).
pub const MAX_FOLIO_ORDER: u8 = 9;

/// The order of an asynchronous read-ahead's folios after a window of order `prev`
/// (kernel `page_cache_async_ra` then `page_cache_ra_order`): 2 more, at most
/// [`MAX_FOLIO_ORDER`] and log2 of the new window; 0 for a window under 4 pages.
pub fn next_folio_order(prev: u8, size_pages: u64) -> u8 {
    if size_pages < 4 {
        return 0;
    }
    (prev + 2)
        .min(MAX_FOLIO_ORDER)
        .min(size_pages.ilog2() as u8)
}

/// The read path.
impl PageCache {
    /// Reads pages `[start, start + n)` not yet cached (kernel `page_cache_ra_unbounded`):
    /// each run of absent pages becomes one read sent down, into folios of `order`; the
    /// page `marker` (if a newly added one) gets `PG_readahead`.
    pub(super) fn read_pages(
        &mut self,
        sk: StreamKey,
        start: u64,
        n: u64,
        marker: Option<u64>,
        order: u8,
        ctx: &mut Ctx,
    ) {
        let flags = if order >= LARGE_FOLIO_ORDER {
            Flags::LARGE_FOLIOS
        } else {
            Flags::default()
        };
        let base = self.streams.get(&sk).map_or(0, |s| s.base_lba);
        // Nothing past the end of the file (a read of the file's own pages is always inside).
        let n = match self.file_pages.get(&sk) {
            Some(&eof) => n.min(eof.saturating_sub(start)),
            None => n,
        };
        // First every absent page is added, in index order, with one map lookup per chunk,
        // noting each run of added pages and how many pages were cached when it ended (what
        // a run's reclaim cost counts); then each run goes down, in order, as it would have
        // when the loop reached its end (sending a run changes no other page).
        let mut runs: Vec<(u64, u64, usize)> = Vec::new(); // (first, count, cached then)
        let mut run: Option<(u64, u64)> = None; // (first, count)
        let mut len = self.pages.len();
        let (lru, added) = (&mut self.lru, &mut self.stats.readahead_pages);
        self.pages
            .for_each_slot(sk, start, start + n, |index, slot| {
                if slot.is_some() {
                    if let Some((first, count)) = run.take() {
                        runs.push((first, count, len));
                    }
                    return;
                }
                // (not reclaimable: every page added here goes down in a run below, in flight)
                *slot = Some(Page {
                    list: List::Inactive,
                    seq: lru[List::Inactive].push(PageKey { stream: sk, index }, false),
                    referenced: false,
                    marker: marker == Some(index),
                    pending: None,
                    dirty: false,
                    wb: None,
                });
                len += 1;
                *added += 1; // corrected for the requested pages by the caller
                run = match run {
                    Some((first, count))
                        if first + count == index && count < u32::MAX as u64 / 8 =>
                    {
                        Some((first, count + 1))
                    }
                    other => {
                        if let Some((first, count)) = other {
                            runs.push((first, count, len));
                        }
                        Some((index, 1))
                    }
                };
            });
        if let Some((first, count)) = run {
            runs.push((first, count, len));
        }
        for (first, count, len_then) in runs {
            let id = self.child_id();
            let req = Request {
                flags,
                ..child_request(id, ctx.now(), sk, base, first..first + count, Op::Read)
            };
            self.children.insert(id, (sk, first..first + count));
            self.pages
                .for_each_mut(sk, first, first + count, |_, p| p.pending = Some(id));
            self.stats.reads_down += 1;
            if flags.contains(Flags::LARGE_FOLIOS) {
                self.stats.large_folio_reads += 1;
            }
            let folios = (count >> order).max(1);
            // The run's pages are in the map already: those past the capacity are
            // room this read has to reclaim (the shrink comes after the read's loop).
            let over = (len_then as u64)
                .saturating_sub(self.cfg.capacity_pages)
                .min(count);
            let reclaimed = if over > 0 { (over >> order).max(1) } else { 0 };
            let cost = folios as f64 * self.cfg.miss_folio_ms
                + reclaimed as f64 * self.cfg.reclaim_folio_ms;
            if cost > 0.0 {
                let now = ctx.now();
                self.alloc_until = self.alloc_until.max(now) + cost;
                let token = DELAYED_READ_BIT | (id & !CHILD_ID_BIT);
                self.delayed.insert(token, req);
                ctx.wake_at(self.alloc_until, token);
            } else {
                ctx.down(req);
            }
        }
    }

    /// The common tail of the kernel's on-demand read-ahead (`readit:`): if the read at
    /// `index` would hit the marker of its own window at once, merge the next window in;
    /// then read the window with the marker at `start + size - async_size`.
    pub(super) fn readit(&mut self, sk: StreamKey, index: u64, max: u64, ctx: &mut Ctx) {
        let s = self.stream_mut(sk);
        let mut ra = s.ra;
        if index == ra.start && ra.size == ra.async_size {
            let add = next_ra_size(ra.size, max);
            if ra.size + add <= max {
                ra.async_size = add;
                ra.size += add;
            } else {
                ra.size = max;
                ra.async_size = max / 2;
            }
        }
        s.ra = ra;
        let marker = (ra.async_size > 0).then(|| ra.start + ra.size - ra.async_size);
        self.read_pages(sk, ra.start, ra.size, marker, ra.order, ctx);
    }

    /// A read of `req` pages missed at `index` (kernel `page_cache_sync_ra`).
    pub(super) fn sync_ra(&mut self, sk: StreamKey, index: u64, req: u64, ctx: &mut Ctx) {
        let s = self.stream_mut(sk);
        let advice = s.advice;
        let prev_index = s.prev_pos.map(|p| p / PAGE);
        let max = {
            let s = &self.streams[&sk];
            self.max_pages(s)
        };
        if advice == Advice::Random || max == 0 {
            // "be dumb": exactly the requested pages.
            self.read_pages(sk, index, req, None, 0, ctx);
            return;
        }
        let sequential = prev_index.is_some_and(|p| index >= p && index - p <= 1);
        if index == 0 || req > max || sequential {
            let size = init_ra_size(req, max);
            let s = self.stream_mut(sk);
            s.ra = RaState {
                start: index,
                size,
                async_size: if size > req { size - req } else { size },
                order: 0,
            };
            self.readit(sk, index, max, ctx);
            return;
        }
        // Context read-ahead: a run of cached pages just before `index` (another stream of
        // an interleaved pair left it) longer than the request means a sequential stream.
        let mut contig = 0;
        while contig < max
            && index > contig
            && self.is_cached(sk.dev, file_of(sk), index - 1 - contig)
        {
            contig += 1;
        }
        if contig <= req {
            // A random read: read as is, leave the window alone.
            self.read_pages(sk, index, req, None, 0, ctx);
            return;
        }
        if contig == index {
            // Cached from the start of the file: a long stream, be generous.
            contig *= 2;
        }
        let s = self.stream_mut(sk);
        s.ra = RaState {
            start: index,
            size: (contig + req).min(max),
            async_size: 1,
            order: 0,
        };
        self.readit(sk, index, max, ctx);
    }

    /// A read of `req` pages reached the marked page `index` (kernel `page_cache_async_ra`).
    pub(super) fn async_ra(&mut self, sk: StreamKey, index: u64, req: u64, ctx: &mut Ctx) {
        let (max, ra, advice) = {
            let s = &self.streams[&sk];
            (self.max_pages(s), s.ra, s.advice)
        };
        if advice == Advice::Random || max == 0 {
            return;
        }
        let expected = ra.start + ra.size - ra.async_size;
        if index == expected || index == ra.start + ra.size {
            // The expected marker: push the window forward, ramped up.
            let size = next_ra_size(ra.size, max);
            self.stream_mut(sk).ra = RaState {
                start: ra.start + ra.size,
                size,
                async_size: size,
                order: next_folio_order(ra.order, size),
            };
            self.readit(sk, index, max, ctx);
            return;
        }
        // A marker from a window this state no longer describes (interleaved reads): the
        // pages cached after it stand for the old async size.
        let mut next_miss = index + 1;
        while next_miss - index <= max && self.is_cached(sk.dev, file_of(sk), next_miss) {
            next_miss += 1;
        }
        if next_miss - index > max {
            return;
        }
        let size = next_ra_size(next_miss - index + req, max);
        self.stream_mut(sk).ra = RaState {
            start: next_miss,
            size,
            async_size: size,
            order: next_folio_order(ra.order, size),
        };
        self.readit(sk, index, max, ctx);
    }

    /// Completes `done` at `done.rec.completion` (a later instant).
    pub(super) fn later(&mut self, done: Completion, ctx: &mut Ctx) {
        ctx.up_at(done);
    }

    /// The file (stream) and byte range of a request; `sectors == 0` on an `Advise` means
    /// "to the end of the file".
    pub(super) fn range_of(req: &Request) -> (StreamKey, u64, Option<u64>) {
        let (sk, offset) = match req.file {
            Some(f) => (key(req.dev, Some(f.file)), f.offset),
            None => (key(req.dev, None), req.lba * SECTOR),
        };
        let end = (req.sectors > 0).then(|| offset + req.bytes());
        (sk, offset, end)
    }

    /// `posix_fadvise` on the request's range (`mm/fadvise.c`); returns the CPU time the
    /// call itself spends (ms) beyond its system call.
    pub(super) fn advise(&mut self, req: &Request, advice: Advice, ctx: &mut Ctx) -> f64 {
        let mut busy_ms = 0.0;
        let (sk, offset, end) = Self::range_of(req);
        if req.file.is_some() {
            let base = req.lba as i64 - (offset / SECTOR) as i64;
            self.stream_mut(sk).base_lba = base;
        }
        match advice {
            Advice::Normal | Advice::Sequential | Advice::Random => {
                self.stream_mut(sk).advice = advice;
            }
            Advice::DontNeed => {
                // Whole pages inside the range only (the kernel rounds the start up and the
                // end down); pages in flight stay.
                let first = offset.div_ceil(PAGE);
                let last = end.map_or(u64::MAX, |e| e / PAGE);
                // Dirty pages of the range start write-back (WB_SYNC_NONE, nobody waits)
                // and stay, as pages under write-back do.
                let hi = end.map_or(u64::MAX, |e| e.div_ceil(PAGE));
                let before = self.stats.written_pages;
                self.start_writeback(sk, offset / PAGE..hi, false, ctx);
                busy_ms +=
                    (self.stats.written_pages - before) as f64 * self.cfg.dontneed_dirty_page_ms;
                self.stats.dropped_pages += self.drop_range(sk, first, last);
            }
            Advice::WillNeed => {
                // force_page_cache_readahead: read the range now, nobody waits.
                let first = offset / PAGE;
                let last = end.map_or(first, |e| e.div_ceil(PAGE));
                if last > first {
                    self.read_pages(sk, first, last - first, None, 0, ctx);
                    self.shrink();
                }
            }
        }
        busy_ms
    }

    /// [`PageCache::buffered_read`] of pages all cached and unmarked (the loop there, with
    /// nothing to read and nothing to wait for): the same accesses, activations and
    /// statistics, found with one lookup per chunk of pages instead of one per page.
    /// Returns the read's record (it completes after its copy), or None, nothing done, when
    /// some page is not cached, marked or in flight.
    pub(super) fn cached_read(
        &mut self,
        req: &Request,
        sk: StreamKey,
        pages: std::ops::Range<u64>,
        same_first: bool,
        now: f64,
    ) -> Option<Record> {
        let (first, last) = (pages.start, pages.end);
        // (activate touches only the promoted page and list positions, which no access
        // reads: promoting after the accesses is promoting among them)
        match self.pages.read_in_chunk(sk, first, last, same_first) {
            ChunkRead::NotPlain => return None,
            ChunkRead::Done(mut promote) => {
                while promote != 0 {
                    let i = u64::from(promote.trailing_zeros());
                    promote &= promote - 1;
                    self.activate(PageKey {
                        stream: sk,
                        index: first + i,
                    });
                }
            }
            ChunkRead::Spans => {
                if !self.pages.all_plain(sk, first, last) {
                    return None;
                }
                let mut promote: Vec<u64> = Vec::new();
                self.pages.for_each_mut(sk, first, last, |index, p| {
                    if !(index == first && same_first) && p.accessed() {
                        promote.push(index);
                    }
                });
                for index in promote {
                    self.activate(PageKey { stream: sk, index });
                }
            }
        }
        self.stats.hit_pages += last - first;
        self.shrink();
        Some(self.hit(req, now, now))
    }

    /// The start of a buffered read: its file, its pages, whether it continues inside the
    /// page the previous read ended in, its end (bytes), and the file's previous read
    /// position. The position is moved to the read's end at once (one lookup of the file
    /// for a cached read, the common case); [`PageCache::try_cached_read`] puts the old one
    /// back for a read the cache cannot serve, before anything else.
    pub(super) fn read_span(
        &mut self,
        req: &Request,
    ) -> (StreamKey, std::ops::Range<u64>, bool, u64, Option<u64>) {
        let (sk, offset) = match req.file {
            Some(f) => (key(req.dev, Some(f.file)), f.offset),
            None => (key(req.dev, None), req.lba * SECTOR),
        };
        let base = req.lba as i64 - (offset / SECTOR) as i64;
        let first = offset / PAGE;
        let end = offset + req.bytes().max(1);
        let last = end.div_ceil(PAGE); // exclusive
        let stream = self.stream_mut(sk);
        stream.base_lba = base;
        let prev_pos = stream.prev_pos.replace(end);
        // A read continuing inside the page the previous one ended in does not count as a
        // new access to it (kernel filemap_read).
        let same_first = prev_pos.is_some_and(|p| p > 0 && (p - 1) / PAGE == first);
        (sk, first..last, same_first, end, prev_pos)
    }

    /// A buffered read served from the cache if its pages are all plain: its record, or
    /// (nothing done, the read position where it was) its file, pages, whether it continues
    /// inside the previous read's last page, and its end, for the read's slow path.
    pub(super) fn try_cached_read(
        &mut self,
        req: &Request,
        now: f64,
    ) -> Result<Record, (StreamKey, std::ops::Range<u64>, bool, u64)> {
        let (sk, pages, same_first, end, prev_pos) = self.read_span(req);
        match self.cached_read(req, sk, pages.clone(), same_first, now) {
            Some(rec) => Ok(rec),
            None => {
                self.stream_mut(sk).prev_pos = prev_pos;
                Err((sk, pages, same_first, end))
            }
        }
    }

    /// A read served whole from the cache completes after its copy, which starts at `busy`.
    pub(super) fn hit(&self, req: &Request, busy: f64, now: f64) -> Record {
        Record {
            arrival: req.arrival,
            device_start: now,
            cache: CacheOutcome::Hit,
            completion: busy + self.cfg.cpu_ms(req.bytes()),
            ..Default::default()
        }
    }

    pub(super) fn buffered_read(&mut self, req: Request, ctx: &mut Ctx) {
        let (sk, pages, same_first, end) = match self.try_cached_read(&req, ctx.now()) {
            Ok(rec) => {
                self.deliver(Completion { req, rec }, ctx);
                return;
            }
            Err(span) => span,
        };
        let (first, last) = (pages.start, pages.end);
        let ra_before = self.stats.readahead_pages;
        let first_new_child = CHILD_ID_BIT | self.next_child;
        let alloc_before = self.alloc_until;
        let mut missed = 0u64;
        let mut children = BTreeSet::new();
        for index in first..last {
            let k = PageKey { stream: sk, index };
            // The common case, a cached page without the read-ahead mark, is looked up once;
            // a miss or a mark starts read-ahead, which changes the map: looked up again.
            let mut page = self.pages.get_mut(&k);
            match page {
                None => {
                    self.sync_ra(sk, index, last - index, ctx);
                    page = self.pages.get_mut(&k);
                }
                Some(ref mut p) if p.marker => {
                    p.marker = false;
                    self.async_ra(sk, index, last - index, ctx);
                    page = self.pages.get_mut(&k);
                }
                Some(_) => {}
            }
            let same_page = index == first && same_first;
            let mut promote = false;
            if let Some(p) = page {
                if let Some(c) = p.pending {
                    children.insert(c);
                    if c >= first_new_child {
                        missed += 1; // read from the device by this request
                    }
                }
                if !same_page {
                    promote = p.accessed();
                }
            }
            if promote {
                self.activate(k);
            }
        }
        let requested = last - first;
        // read_pages counted every new page as read-ahead; the requested ones are not.
        self.stats.readahead_pages = self
            .stats
            .readahead_pages
            .saturating_sub(missed)
            .max(ra_before);
        self.stats.miss_pages += missed;
        self.stats.hit_pages += requested - missed;
        self.stream_mut(sk).prev_pos = Some(end);
        self.shrink();
        if children.is_empty() {
            let now = ctx.now();
            // An asynchronous read-ahead this read started: its folios were brought in by
            // this thread before it copied its own pages.
            let busy = if self.alloc_until != alloc_before {
                self.alloc_until.max(now)
            } else {
                now
            };
            let rec = self.hit(&req, busy, now);
            self.deliver(Completion { req, rec }, ctx);
            return;
        }
        let outcome = if missed == requested {
            CacheOutcome::Miss
        } else {
            CacheOutcome::Partial
        };
        for &c in &children {
            self.waiters.entry(c).or_default().push(req.id);
        }
        self.waiting.insert(
            req.id,
            Waiting {
                outstanding: children.len(),
                req,
                outcome,
            },
        );
    }
}
