//! The write path: dirty pages, write-back (flusher, background, reclaim), the dirty
//! throttle, fsync and O_DSYNC, and O_DIRECT requests.

use super::*;

/// The write path: dirty pages, write-back, throttling, fsync.
impl PageCache {
    /// Dirty pages now, and dirty plus under write-back.
    pub fn dirty_pages(&self) -> (u64, u64) {
        (self.nr_dirty, self.nr_dirty + self.nr_writeback)
    }

    /// Whether page `index` of the file is dirty.
    pub fn is_dirty(&self, dev: u32, file: Option<u32>, index: u64) -> bool {
        self.pages
            .get(&PageKey {
                stream: key(dev, file),
                index,
            })
            .is_some_and(|p| p.dirty)
    }

    /// The background threshold and the dirty limit in pages, after the kernel's
    /// `domain_dirty_limits` (a background threshold at or above the limit becomes half the
    /// limit), over the dirtyable memory: the cgroup's under cgroup v2, the whole machine's
    /// under v1, whose memory cgroups have no dirty limits of their own. A cache full of
    /// dirty pages below those limits makes its writers wait in reclaim instead
    /// ([`PageCache::reclaim_writeback`]).
    pub fn thresholds(&self) -> (u64, u64) {
        let d = self.cfg.dirty;
        let limit = d.limit.pages(d.dirtyable_pages);
        let mut bg = d.background.pages(d.dirtyable_pages);
        if bg >= limit {
            bg = limit / 2;
        }
        (bg, limit)
    }

    /// The dirty (+ write-back) level above which writers are held: the setpoint of the
    /// kernel's IO-less throttling, `(freerun + limit) / 2` with
    /// `freerun = (background + limit) / 2`.
    pub fn throttle_pages(&self) -> u64 {
        let (bg, limit) = self.thresholds();
        let freerun = (bg + limit) / 2;
        (freerun + limit) / 2
    }

    pub(super) fn arm_flusher(&mut self, ctx: &mut Ctx) {
        let period = f64::from(self.cfg.dirty.writeback_centisecs) * 10.0;
        if self.flusher_at.is_none() && period > 0.0 && self.nr_dirty > 0 {
            let at = ctx.now() + period;
            self.flusher_at = Some(at);
            ctx.wake_at(at, FLUSH_TOKEN);
        }
    }

    pub(super) fn note_levels(&mut self) {
        self.stats.max_dirty_pages = self.stats.max_dirty_pages.max(self.nr_dirty);
        self.stats.max_dirty_writeback_pages = self
            .stats
            .max_dirty_writeback_pages
            .max(self.nr_dirty + self.nr_writeback);
    }

    /// Marks the pages of `[first, last)` dirty, creating those not cached (a partial page
    /// is taken as whole: no read before the write, see the module notes).
    pub(super) fn dirty_range(&mut self, sk: StreamKey, first: u64, last: u64, now: f64) {
        let mut newly = false;
        let mut activated = false;
        let (lru, nr_dirty, stats) = (&mut self.lru, &mut self.nr_dirty, &mut self.stats);
        // Page by page in index order, as `insert_page`, `Page::accessed` and `activate`
        // would, with one map lookup per chunk; the inactive list is compacted once at the
        // end (renumbering keeps the order, so when it happens changes nothing).
        self.pages.for_each_slot(sk, first, last, |index, slot| {
            let k = PageKey { stream: sk, index };
            let p = slot.get_or_insert_with(|| Page {
                list: List::Inactive,
                seq: lru[List::Inactive].push(k, true),
                referenced: false,
                marker: false,
                pending: None,
                dirty: false,
                wb: None,
            });
            if p.accessed() {
                lru[List::Inactive].remove(p.seq);
                p.list = List::Active;
                p.referenced = false;
                p.seq = lru[List::Active].push(k, p.reclaimable());
                activated = true;
            }
            if !p.dirty {
                lru[p.list].set_reclaimable(p.seq, false);
                p.dirty = true;
                *nr_dirty += 1;
                stats.dirtied_pages += 1;
                newly = true;
            }
        });
        if activated {
            self.compact(List::Inactive);
        }
        if newly {
            // (the set holds exactly the dirty pages: adding those already dirty is nothing)
            let s = self.streams.entry(sk).or_default();
            s.dirty.insert_range(first, last);
            s.dirtied_when.get_or_insert(now);
        }
        self.note_levels();
    }

    /// The file dirtied longest ago (ties: the lowest key).
    pub(super) fn oldest_dirty_file(&self) -> Option<StreamKey> {
        self.streams
            .iter()
            .filter_map(|(k, s)| s.dirtied_when.map(|t| (t, *k)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, k)| k)
    }

    /// Starts write-back of the file's dirty pages with indices in `range` (every site that
    /// writes a range: flusher expiry, throttling with nothing in flight, DONTNEED, fsync,
    /// O_DSYNC, O_DIRECT); returns the writes' ids.
    pub(super) fn start_writeback(
        &mut self,
        sk: StreamKey,
        range: std::ops::Range<u64>,
        sync: bool,
        ctx: &mut Ctx,
    ) -> Vec<u64> {
        // (Nothing dirty in the file, as for every O_DIRECT request of a job that only does
        // O_DIRECT: nothing to collect or send.)
        let Some(s) = self.streams.get(&sk) else {
            return Vec::new();
        };
        if range.start >= range.end || s.dirty.is_empty() {
            return Vec::new();
        }
        let dirty: Vec<u64> = s.dirty.range(range).collect();
        self.write_back(sk, &dirty, sync, ctx)
    }

    /// Sends the given dirty pages of a file (sorted indices) to the device, one write per
    /// run of consecutive pages (at most `WB_CHUNK_PAGES`); returns the writes' ids.
    pub(super) fn write_back(
        &mut self,
        sk: StreamKey,
        indices: &[u64],
        sync: bool,
        ctx: &mut Ctx,
    ) -> Vec<u64> {
        let base = self.streams.get(&sk).map_or(0, |s| s.base_lba);
        let mut ids = Vec::new();
        let mut i = 0;
        while i < indices.len() {
            let first = indices[i];
            let mut n = 1u64;
            while i + (n as usize) < indices.len()
                && indices[i + n as usize] == first + n
                && n < WB_CHUNK_PAGES
            {
                n += 1;
            }
            i += n as usize;
            let id = self.child_id();
            let mut sent = 0u64;
            let (lru, nr_dirty, nr_writeback) =
                (&mut self.lru, &mut self.nr_dirty, &mut self.nr_writeback);
            self.pages.for_each_mut(sk, first, first + n, |_, p| {
                lru[p.list].set_reclaimable(p.seq, false);
                if p.dirty {
                    p.dirty = false;
                    *nr_dirty -= 1;
                }
                if p.wb.is_none() {
                    *nr_writeback += 1;
                }
                p.wb = Some(id);
                sent += 1;
            });
            if let Some(s) = self.streams.get_mut(&sk) {
                // (dirty pages are cached: the run's absent pages were not in the set)
                s.dirty.remove_range(first, first + n);
                if s.dirty.is_empty() {
                    s.dirtied_when = None;
                }
            }
            self.stats.written_pages += sent;
            self.stats.writes_down += 1;
            self.wb_children.insert(id, (sk, first..first + n));
            ctx.down(Request {
                flags: if sync { Flags::SYNC } else { Flags::default() },
                ..child_request(id, ctx.now(), sk, base, first..first + n, Op::Write)
            });
            ids.push(id);
        }
        self.note_levels();
        ids
    }

    /// Background write-back (`wb_start_background_writeback`): while more pages are dirty
    /// than the background threshold, write the file dirtied longest ago, up to
    /// `WB_CHUNK_PAGES` of it per round, resuming where its last round stopped.
    pub(super) fn background(&mut self, ctx: &mut Ctx) {
        let (bg, _) = self.thresholds();
        let mut rounds = 0;
        while self.nr_dirty > bg {
            let Some(sk) = self.oldest_dirty_file() else {
                break;
            };
            let s = &self.streams[&sk];
            let from = s.wb_index;
            let mut pick: Vec<u64> = s
                .dirty
                .range(from..)
                .take(WB_CHUNK_PAGES as usize)
                .collect();
            if (pick.len() as u64) < WB_CHUNK_PAGES {
                let more = WB_CHUNK_PAGES as usize - pick.len();
                let mut wrapped: Vec<u64> = s.dirty.range(..from).take(more).collect();
                wrapped.append(&mut pick);
                pick = wrapped;
                pick.sort_unstable();
            }
            let next = pick.iter().rev().find(|&&i| i >= from).or(pick.last());
            if let Some(&last) = next {
                self.streams.get_mut(&sk).expect("exists").wb_index = last + 1;
            }
            self.write_back(sk, &pick, false, ctx);
            rounds += 1;
        }
        if rounds > 0 {
            self.stats.background_runs += 1;
        }
    }

    /// The flusher's periodic run (`wb_check_old_data_flush`): every file dirty for longer
    /// than `dirty_expire_centisecs` is written whole; then the background check.
    pub(super) fn flusher_run(&mut self, ctx: &mut Ctx) {
        let expire = f64::from(self.cfg.dirty.expire_centisecs) * 10.0;
        let cutoff = ctx.now() - expire;
        let mut expired: Vec<(f64, StreamKey)> = self
            .streams
            .iter()
            .filter_map(|(k, s)| s.dirtied_when.filter(|&t| t <= cutoff).map(|t| (t, *k)))
            .collect();
        expired.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        if !expired.is_empty() {
            self.stats.expire_runs += 1;
        }
        for (_, sk) in expired {
            self.start_writeback(sk, 0..u64::MAX, false, ctx);
        }
        self.background(ctx);
    }

    /// More pages than the capacity after reclaim: the rest are dirty, under write-back or
    /// being read.
    pub(super) fn over_capacity(&self) -> bool {
        self.pages.len() as u64 > self.cfg.capacity_pages
    }

    /// Reclaim found the cache (a memory cgroup) full of pages it cannot drop: as the
    /// kernel's `shrink_folio_list` does on dirty file pages it wakes the flusher for every
    /// dirty page (`WB_REASON_VMSCAN`), oldest file first, and the allocating writer waits
    /// until write-back has cleaned pages it can reclaim.
    pub(super) fn reclaim_writeback(&mut self, ctx: &mut Ctx) {
        self.stats.reclaim_writebacks += 1;
        let mut files: Vec<(f64, StreamKey)> = self
            .streams
            .iter()
            .filter_map(|(k, s)| s.dirtied_when.map(|t| (t, *k)))
            .collect();
        files.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (_, sk) in files {
            self.start_writeback(sk, 0..u64::MAX, false, ctx);
        }
    }

    /// Holds a buffered write's completion while dirty + write-back pages are above the
    /// throttle level or the cache is full of pages reclaim cannot take, or completes it
    /// after its CPU time.
    pub(super) fn finish_write(&mut self, done: Completion, ctx: &mut Ctx) {
        self.background(ctx);
        let full = self.over_capacity();
        if full && self.nr_dirty > 0 {
            self.reclaim_writeback(ctx);
        }
        if full || self.nr_dirty + self.nr_writeback > self.throttle_pages() {
            self.stats.throttled_writes += 1;
            if self.nr_writeback == 0 {
                // Nothing in flight would ever release it: write the oldest file now.
                if let Some(sk) = self.oldest_dirty_file() {
                    self.start_writeback(sk, 0..u64::MAX, false, ctx);
                }
            }
            self.throttled.push_back((done, ctx.now()));
            return;
        }
        if self.cfg.reclaim_waits_on_writeback && self.pages.len() as u64 >= self.cfg.capacity_pages
        {
            let oldest = self.lru[List::Inactive]
                .oldest()
                .and_then(|(_, k)| self.pages.get(&k));
            if let Some(id) = oldest.and_then(|p| p.wb) {
                self.stats.reclaim_waits += 1;
                self.reclaim_waiters
                    .entry(id)
                    .or_default()
                    .push((done, ctx.now()));
                return;
            }
        }
        self.deliver(done, ctx);
    }

    /// Sends a completion up at `rec.completion` (now, or later through a timer).
    pub(super) fn deliver(&mut self, done: Completion, ctx: &mut Ctx) {
        if done.rec.completion > ctx.now() {
            self.later(done, ctx);
        } else {
            ctx.up(done);
        }
    }

    /// Releases the throttled writers the dirty level now allows, oldest first.
    pub(super) fn release_throttled(&mut self, ctx: &mut Ctx) {
        self.shrink();
        while !self.throttled.is_empty()
            && self.nr_dirty + self.nr_writeback <= self.throttle_pages()
            && !self.over_capacity()
        {
            let (done, since) = self.throttled.pop_front().expect("not empty");
            self.release_held(done, since, ctx);
        }
    }

    /// Completes a buffered write held since `since` (by the throttle or reclaim): the wait
    /// counted, then its CPU time.
    pub(super) fn release_held(&mut self, mut done: Completion, since: f64, ctx: &mut Ctx) {
        let now = ctx.now();
        self.stats.throttled_ms += now - since;
        done.rec.queue_wait += now - since;
        done.rec.completion = now + self.cfg.cpu_ms(done.req.bytes());
        self.deliver(done, ctx);
    }

    /// A buffered write (with `O_DSYNC`/`O_SYNC`: written through, then a device flush).
    pub(super) fn buffered_write(&mut self, req: Request, ctx: &mut Ctx) {
        let (sk, offset, end) = Self::range_of(&req);
        let end = end.unwrap_or(offset);
        self.stream_mut(sk).base_lba = req.lba as i64 - (offset / SECTOR) as i64;
        let first = offset / PAGE;
        let last = end.div_ceil(PAGE);
        let now = ctx.now();
        self.dirty_range(sk, first, last, now);
        self.shrink();
        if req.flags.contains(Flags::DSYNC) || req.flags.contains(Flags::OSYNC) {
            // generic_write_sync → vfs_fsync_range on the written range.
            self.stats.dsync_writes += 1;
            self.sync_range(req, sk, first, last, CacheOutcome::Miss, ctx);
            return;
        }
        self.arm_flusher(ctx);
        let rec = Record {
            arrival: req.arrival,
            device_start: now,
            cache: CacheOutcome::WriteBack,
            completion: now + self.cfg.cpu_ms(req.bytes()),
            ..Default::default()
        };
        self.finish_write(Completion { req, rec }, ctx);
    }

    /// `vfs_fsync_range`: writes the dirty pages of `[first, last)`, waits for them and for
    /// the range's pages already under write-back, then flushes the device cache; `req`
    /// completes after the flush.
    pub(super) fn sync_range(
        &mut self,
        req: Request,
        sk: StreamKey,
        first: u64,
        last: u64,
        cache: CacheOutcome,
        ctx: &mut Ctx,
    ) {
        // The range's own pages when it is the smaller set (an O_DSYNC write's few pages),
        // else one pass over the cache (an fsync of a whole file): never both.
        let mut outstanding: BTreeSet<u64> =
            if last.saturating_sub(first) <= self.pages.len() as u64 {
                (first..last)
                    .filter_map(|index| self.pages.get(&PageKey { stream: sk, index }))
                    .filter_map(|p| p.wb)
                    .collect()
            } else {
                self.pages
                    .iter()
                    .filter(|(k, _)| k.stream == sk && (first..last).contains(&k.index))
                    .filter_map(|(_, p)| p.wb)
                    .collect()
            };
        outstanding.extend(self.start_writeback(sk, first..last, true, ctx));
        let id = req.id;
        for &c in &outstanding {
            self.sync_waiters.entry(c).or_default().push(id);
        }
        let empty = outstanding.is_empty();
        self.syncs.insert(
            id,
            SyncWait {
                req,
                outstanding,
                flush: true,
                cache,
            },
        );
        if empty {
            self.sync_done(id, ctx);
        }
    }

    /// Every write a sync waited for is done: flush the device, or, after the flush, finish.
    pub(super) fn sync_done(&mut self, id: u64, ctx: &mut Ctx) {
        let Some(w) = self.syncs.get_mut(&id) else {
            return;
        };
        if w.flush {
            w.flush = false;
            // (not child_id(): `w` still borrows the syncs)
            let child = CHILD_ID_BIT | self.next_child;
            self.next_child += 1;
            self.flush_children.insert(child, id);
            self.stats.flushes_down += 1;
            let dev = w.req.dev;
            // fdatasync and O_DSYNC need no journal commit for an overwrite (only the
            // inode's times changed); fsync and O_SYNC commit it: the device tells the two
            // flushes apart (a measured device's `datasync_flush_us`).
            let datasync = match w.req.op {
                Op::Flush => w.req.flags.contains(Flags::DATASYNC),
                _ => !w.req.flags.contains(Flags::OSYNC),
            };
            ctx.down(Request {
                id: child,
                arrival: ctx.now(),
                dev,
                lba: 0,
                sectors: 0,
                op: Op::Flush,
                flags: if datasync {
                    Flags::SYNC.with(Flags::DATASYNC)
                } else {
                    Flags::SYNC
                },
                file: None,
                prio: crate::request::IoPrio::NONE,
            });
            return;
        }
        let w = self.syncs.remove(&id).expect("present");
        let now = ctx.now();
        let bytes = if w.req.op == Op::Write {
            w.req.bytes()
        } else {
            0
        };
        let rec = Record {
            arrival: w.req.arrival,
            device_start: w.req.arrival,
            cache: w.cache,
            completion: now + self.cfg.cpu_ms(bytes),
            ..Default::default()
        };
        self.deliver(Completion { req: w.req, rec }, ctx);
    }

    /// `fsync` / `fdatasync` of the request's file (the whole file).
    pub(super) fn fsync(&mut self, req: Request, ctx: &mut Ctx) {
        self.stats.fsyncs += 1;
        let sk = match req.file {
            Some(f) => key(req.dev, Some(f.file)),
            None => key(req.dev, None),
        };
        self.sync_range(req, sk, 0, u64::MAX, CacheOutcome::None, ctx);
    }

    /// A write-back write finished: its pages are clean (unless dirtied again meanwhile).
    pub(super) fn writeback_done(
        &mut self,
        id: u64,
        sk: StreamKey,
        pages: std::ops::Range<u64>,
        ctx: &mut Ctx,
    ) {
        let (lru, nr_writeback) = (&mut self.lru, &mut self.nr_writeback);
        self.pages.for_each_mut(sk, pages.start, pages.end, |_, p| {
            if p.wb == Some(id) {
                p.wb = None;
                *nr_writeback -= 1;
                lru[p.list].set_reclaimable(p.seq, p.reclaimable());
            }
        });
        for sync in self.sync_waiters.remove(&id).unwrap_or_default() {
            let finished = match self.syncs.get_mut(&sync) {
                Some(w) => {
                    w.outstanding.remove(&id);
                    w.outstanding.is_empty()
                }
                None => false,
            };
            if finished {
                self.sync_done(sync, ctx);
            }
        }
        for (done, since) in self.reclaim_waiters.remove(&id).unwrap_or_default() {
            self.release_held(done, since, ctx);
        }
        self.release_throttled(ctx);
        self.background(ctx);
        self.shrink();
    }

    /// `O_DIRECT`: the range's dirty pages are written back first (sent down ahead of the
    /// direct request, not waited for), its clean pages dropped, the request passed down.
    pub(super) fn direct(&mut self, req: Request, ctx: &mut Ctx) {
        let (sk, offset, end) = Self::range_of(&req);
        let end = end.unwrap_or(offset);
        let first = offset / PAGE;
        let last = end.div_ceil(PAGE);
        self.start_writeback(sk, first..last, true, ctx);
        self.drop_range(sk, first, last);
        ctx.down(req);
    }
}
