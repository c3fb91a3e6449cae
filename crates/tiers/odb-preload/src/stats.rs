//! Counters of what the library did in this process, written as JSON to
//! `$IOLAB_ODB_STATS_DIR/odb-<pid>.json` at most once a second (and read by `iolab tiers`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($n:ident),*) => {
        $(pub static $n: AtomicU64 = AtomicU64::new(0);)*
        pub fn json() -> String {
            let mut s = String::from("{");
            $(s.push_str(&format!("\"{}\":{},", stringify!($n).to_lowercase(), $n.load(Relaxed)));)*
            // the registry's size now (live and dead regions), a gauge
            s.push_str(&format!("\"regions\":{}}}", crate::REGION_COUNT.load(Relaxed)));
            s
        }
    };
}

counters!(
    R_OUT_BYTES,
    V_OUT_BYTES,
    V_OUT_FRAMES,
    STORED_BYTES,
    STORE_FALLBACKS,
    STORE_WASTED,
    R_IN_BYTES,
    V_IN_BYTES,
    PROTECTED_BYTES,
    FETCHES,
    FETCH_BYTES,
    FETCH_ERRORS,
    FAULTS,
    MATERIALIZED,
    RAW_CONNS,
    PROTO_ERRORS,
    DOMAIN_CONNS,
    GONE_PAGES,
    ALIGNED_ALLOCS,
    FREED_REGIONS,
    ALIGN_PADS,
    MPROTECTS,
    DEAD_REUSED,
    POOL_ALLOCS,
    POOL_FALLBACKS
);

static LAST_MS: AtomicU64 = AtomicU64::new(0);

pub fn maybe_dump(dir: &Option<std::path::PathBuf>) {
    let Some(dir) = dir else { return };
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    let now = ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000;
    let last = LAST_MS.load(Relaxed);
    if now < last + 1000
        || LAST_MS
            .compare_exchange(last, now, Relaxed, Relaxed)
            .is_err()
    {
        return;
    }
    dump_now(dir);
}

pub fn dump_now(dir: &std::path::Path) {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let tmp = dir.join(format!(".odb-{pid}.json.tmp"));
    let _ = std::fs::write(&tmp, json())
        .and_then(|_| std::fs::rename(&tmp, dir.join(format!("odb-{pid}.json"))));
}
