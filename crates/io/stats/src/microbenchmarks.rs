//! The names of the microbenchmarks (`iolab micro <name>`), in the order `micro all` runs
//! them.
//!
//! It lives here, beside the model table, so that the lab can list and check microbenchmark
//! names without linking `iolab-micro`; `iolab_micro::NAMES` is this list, and its tests check
//! that its dispatcher knows every name.

/// Every microbenchmark name, in the order `micro all` runs them.
pub const NAMES: [&str; 6] = [
    "runtime",
    "ctxswitch",
    "queue",
    "syscalls",
    "echo",
    "limits",
];
