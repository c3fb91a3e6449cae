//! Counters of what the library did in this process, written as JSON to
//! `$IOLAB_ODB_STATS_DIR/odb-<pid>.json` at most once a second (and read by `iolab tiers`).

use iolab_odb::counters::OdbCounters;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($n:ident => $field:ident),* $(,)?) => {
        $(pub static $n: AtomicU64 = AtomicU64::new(0);)*

        /// The counters now (the struct literal names every field: a counter added to
        /// `OdbCounters` and not here, or the other way round, does not compile).
        pub fn snapshot() -> OdbCounters {
            OdbCounters {
                $($field: $n.load(Relaxed),)*
                // the registry's size now (live and dead regions), a gauge
                regions: crate::REGION_COUNT.load(Relaxed) as u64,
            }
        }
    };
}

counters!(
    R_OUT_BYTES => r_out_bytes,
    V_OUT_BYTES => v_out_bytes,
    V_OUT_FRAMES => v_out_frames,
    STORED_BYTES => stored_bytes,
    FILE_REF_BYTES => file_ref_bytes,
    STORE_FALLBACKS => store_fallbacks,
    STORE_WASTED => store_wasted,
    R_IN_BYTES => r_in_bytes,
    V_IN_BYTES => v_in_bytes,
    PROTECTED_BYTES => protected_bytes,
    FETCHES => fetches,
    FETCH_BYTES => fetch_bytes,
    FETCH_ERRORS => fetch_errors,
    FAULTS => faults,
    MATERIALIZED => materialized,
    RAW_CONNS => raw_conns,
    PROTO_ERRORS => proto_errors,
    DOMAIN_CONNS => domain_conns,
    GONE_PAGES => gone_pages,
    ALIGNED_ALLOCS => aligned_allocs,
    FREED_REGIONS => freed_regions,
    ALIGN_PADS => align_pads,
    MPROTECTS => mprotects,
    DEAD_REUSED => dead_reused,
    POOL_ALLOCS => pool_allocs,
    POOL_FALLBACKS => pool_fallbacks,
);

pub fn json() -> String {
    serde_json::to_string(&snapshot()).unwrap_or_default()
}

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

#[cfg(test)]
mod tests {
    /// The file says what `iolab tiers` reads: every counter, under its own name.
    #[test]
    fn the_counters_file_reads_back_as_the_testbed_s_struct() {
        let before = super::snapshot();
        super::FAULTS.fetch_add(2, super::Relaxed);
        let c: iolab_odb::counters::OdbCounters = serde_json::from_str(&super::json()).unwrap();
        assert!(c.faults >= before.faults + 2, "{c:?}");
    }
}
