//! What `libiolab_odb.so` counts in a process: the file it writes
//! (`$IOLAB_ODB_STATS_DIR/odb-<pid>.json`) and what the testbed reads back, one type on
//! both sides, so that a renamed counter fails to parse instead of reading as missing.

use serde::{Deserialize, Serialize};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// One process's counters, or the sum over several (`+=`). The JSON keys are the
        /// field names; an unknown or missing key is an error.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct OdbCounters {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl std::ops::AddAssign for OdbCounters {
            fn add_assign(&mut self, other: OdbCounters) {
                $( self.$name += other.$name; )*
            }
        }
    };
}

counters!(
    /// Application bytes sent as R frames' data.
    r_out_bytes,
    /// Application bytes sent as references.
    v_out_bytes,
    v_out_frames,
    /// Own bytes stored at the local agent (sent by reference).
    stored_bytes,
    /// Of those, bytes of files sent as references to their ranges (the agent answers
    /// with `sendfile`; nothing copied into the arena).
    file_ref_bytes,
    /// Stores the agent refused (unreachable, slow or full): the bytes were copied.
    store_fallbacks,
    /// Reservations at the agent left unused (a file that changed, a failed send).
    store_wasted,
    r_in_bytes,
    /// Bytes received as references (placed in the application's memory).
    v_in_bytes,
    /// Of those, bytes left protected (whole pages registered, fetched on touch).
    protected_bytes,
    fetches,
    fetch_bytes,
    fetch_errors,
    /// SIGSEGVs on registered pages.
    faults,
    /// Referenced bytes fetched for a destination outside the domain (client, file).
    materialized,
    /// Domain peers that turned out not to speak ODB.
    raw_conns,
    proto_errors,
    domain_conns,
    /// Pages of recycled memory zero-filled (the agent had evicted their buffer).
    gone_pages,
    aligned_allocs,
    freed_regions,
    /// `sendfile`s padded to the receiver's page boundary.
    align_pads,
    mprotects,
    /// Bytes of references that landed on dead pages (no `mprotect`).
    dead_reused,
    pool_allocs,
    pool_fallbacks,
    /// The registry's size when written (live and dead regions): a gauge, summed as is.
    regions,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renamed_or_missing_counter_does_not_parse() {
        let c = OdbCounters {
            v_in_bytes: 7,
            regions: 3,
            ..Default::default()
        };
        let text = serde_json::to_string(&c).unwrap();
        assert!(text.starts_with(r#"{"r_out_bytes":0,"#), "{text}");
        assert!(text.ends_with(r#""regions":3}"#), "{text}");
        assert_eq!(serde_json::from_str::<OdbCounters>(&text).unwrap(), c);
        let renamed = text.replace("v_in_bytes", "v_in_byte");
        assert!(serde_json::from_str::<OdbCounters>(&renamed).is_err());
        let missing = text.replace(r#""regions":3"#, r#""extra":3"#);
        assert!(serde_json::from_str::<OdbCounters>(&missing).is_err());
    }

    #[test]
    fn counters_add_field_by_field() {
        let mut a = OdbCounters {
            faults: 1,
            fetch_bytes: 10,
            ..Default::default()
        };
        a += OdbCounters {
            faults: 2,
            pool_fallbacks: 5,
            ..Default::default()
        };
        assert_eq!((a.faults, a.fetch_bytes, a.pool_fallbacks), (3, 10, 5));
    }
}
