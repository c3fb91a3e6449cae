//! ODB, on-demand buffers (seed 004, chapter 4): the reference wire format and the buffer
//! agent. The interposing library itself is `crates/tiers/odb-preload` (`libiolab_odb.so`); the
//! testbed that runs it across nginx tiers is `crates/tiers/testbed`.

pub mod agent;
pub mod counters;
pub mod files;
pub mod proto;
mod random;
pub mod spec;
