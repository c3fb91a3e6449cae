//! Pins the page cache's results: a long pseudo-random mix of every request kind the cache
//! takes (buffered, direct and O_DSYNC reads and writes, fsync, every fadvise) through a
//! small cache over a serial device, reduced to one digest of every completion, every
//! request the device saw and the counters. A change to how the cache keeps its pages (by
//! chunk, by range, in bulk) must leave the digest as it is; a change of behaviour changes
//! it and must say why (and update the constant).

use super::*;
use crate::engine::{Pending, Simulator, VecSource, When};
use crate::testdev::{Log, TestDev};
use std::cell::RefCell;
use std::rc::Rc;

use super::tests::Shared;

/// FNV-1a over the text of what the run did (f64's `Debug` round-trips exactly).
fn fnv(h: &mut u64, s: &str) {
    for b in s.bytes() {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(0x100_0000_01b3);
    }
}

const FILE_PAGES: u64 = 1024;

fn request(op: Op, flags: Flags, file: u32, page: u64, pages: u64) -> Request {
    super::tests::file_request(u64::from(file) * FILE_PAGES, op, flags, file, page, pages)
}

/// `n` requests on two files of FILE_PAGES pages, from seed `seed`; `writes`: three in four
/// are buffered writes (enough to meet the dirty throttle).
fn workload(n: usize, seed: u64, writes: bool) -> Vec<Pending> {
    let mut x = seed;
    let mut rnd = move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let mut seq = [0u64; 2];
    (0..n)
        .map(|_| {
            let file = rnd(2) as u32;
            let pages = 1 + rnd(16);
            let at = rnd(FILE_PAGES - pages);
            let next = &mut seq[file as usize];
            let kind = match rnd(4) {
                0..=2 if writes => 55,
                _ => rnd(100),
            };
            let req = match kind {
                // sequential reads (read-ahead windows, markers, large folios)
                0..=34 => {
                    let r = request(Op::Read, Flags::default(), file, *next, pages);
                    *next = (*next + pages) % (FILE_PAGES - 16);
                    r
                }
                35..=54 => request(Op::Read, Flags::default(), file, at, pages),
                55..=74 => request(Op::Write, Flags::default(), file, at, pages),
                75..=79 => request(Op::Write, Flags::DSYNC, file, at, pages),
                80..=82 => request(Op::Read, Flags::DIRECT, file, at, pages),
                83..=85 => request(Op::Write, Flags::DIRECT, file, at, pages),
                86..=87 => request(Op::Flush, Flags::DATASYNC, file, 0, 0),
                88..=90 => request(
                    Op::Advise(Advice::DontNeed),
                    Flags::default(),
                    file,
                    at,
                    pages * 8,
                ),
                91 => request(Op::Advise(Advice::DontNeed), Flags::default(), file, 0, 0),
                92..=93 => request(
                    Op::Advise(Advice::WillNeed),
                    Flags::default(),
                    file,
                    at,
                    pages,
                ),
                94 => request(Op::Advise(Advice::Random), Flags::default(), file, 0, 0),
                95 => request(Op::Advise(Advice::Sequential), Flags::default(), file, 0, 0),
                96 => request(Op::Advise(Advice::Normal), Flags::default(), file, 0, 0),
                _ => request(Op::Read, Flags::default(), file, 0, pages),
            };
            Pending {
                when: When::AfterCompletion { think: 0.01 },
                req,
            }
        })
        .collect()
}

/// The digest of `n` requests from `seed` through a cache of `capacity` pages over a device
/// serving one request at a time in `service` ms, and the cache's counters.
fn digest(
    capacity: u64,
    reclaim_waits: bool,
    service: f64,
    writes: bool,
    seed: u64,
) -> (u64, PageCacheStats) {
    let n = 4000;
    let mut cfg = PageCacheConfig::new(capacity, 128);
    cfg.dirty.background = Threshold::Bytes(capacity / 4 * PAGE);
    cfg.dirty.limit = Threshold::Bytes(capacity / 2 * PAGE);
    cfg.dirty.expire_centisecs = 10;
    cfg.dirty.writeback_centisecs = 5;
    cfg.syscall_ms = 0.001;
    cfg.copy_mb_s = 4000.0;
    cfg.miss_folio_ms = 0.0005;
    cfg.reclaim_folio_ms = 0.0002;
    cfg.dontneed_dirty_page_ms = 0.0001;
    cfg.reclaim_waits_on_writeback = reclaim_waits;
    let pc = Rc::new(RefCell::new(
        PageCache::new(cfg).with_file_sizes(0, &[(0, FILE_PAGES * PAGE), (1, FILE_PAGES * PAGE)]),
    ));
    let log: Log<String> = Rc::new(RefCell::new(Vec::new()));
    let dev = TestDev::new(
        &log,
        |t, r| {
            format!(
                "{t:?} {} {} {} {:?}",
                r.op.letter(),
                r.lba,
                r.sectors,
                r.flags
            )
        },
        service,
        true,
    );
    let mut sim = Simulator::new(vec![Box::new(Shared(pc.clone())), Box::new(dev)]);
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut done = 0usize;
    sim.run(&mut VecSource::new(workload(n, seed, writes)), &mut |c| {
        done += 1;
        fnv(&mut h, &format!("{} {:?} {:?}", c.req.id, c.req.op, c.rec));
    })
    .unwrap();
    assert_eq!(done, n, "every request completes");
    for e in log.borrow().iter() {
        fnv(&mut h, e);
    }
    let pc = pc.borrow();
    fnv(
        &mut h,
        &format!("{:?} {} {:?}", pc.counters(), pc.len(), pc.dirty_pages()),
    );
    (h, pc.counters())
}

#[test]
fn the_cache_gives_the_same_results_as_it_did() {
    let seed = 0x9e37_79b9_7f4a_7c15;
    let runs = [
        digest(256, false, 0.05, false, seed),
        digest(256, true, 0.05, false, 0x2545_f491_4f6c_dd1d),
        digest(4096, false, 0.05, false, seed),
        digest(256, true, 0.5, true, seed),
        digest(1024, false, 0.5, true, seed),
    ];
    // The mix reaches every path that keeps pages: reclaim, DONTNEED, read-ahead into
    // large folios, write-back of each kind, the throttle and reclaim's wait.
    let sum = |f: fn(&PageCacheStats) -> u64| runs.iter().map(|r| f(&r.1)).sum::<u64>();
    assert!(sum(|s| s.evicted_pages) > 0);
    assert!(sum(|s| s.dropped_pages) > 0);
    assert!(sum(|s| s.large_folio_reads) > 0);
    assert!(sum(|s| s.expire_runs) > 0 && sum(|s| s.background_runs) > 0);
    assert!(sum(|s| s.fsyncs) > 0 && sum(|s| s.dsync_writes) > 0);
    assert!(sum(|s| s.throttled_writes) > 0, "{:?}", runs.map(|r| r.1));
    assert!(sum(|s| s.reclaim_waits) > 0);
    let got = runs.map(|r| r.0);
    // (the digests of the cache as it stood at 9e720dc, page by page)
    let want = [
        8_624_481_811_739_813_197,
        15_689_638_698_305_452_898,
        10_005_711_344_134_488_041,
        7_223_852_305_795_053_122,
        17_757_227_672_526_057_436,
    ];
    assert_eq!(got, want);
}
