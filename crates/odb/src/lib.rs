//! ODB, on-demand buffers (seed 004, chapter 4): the reference wire format and the buffer
//! agent. The interposing library itself is `crates/odb-preload` (`libiolab_odb.so`); the
//! testbed that runs it across nginx tiers is `crates/tiers`.

pub mod agent;
pub mod proto;
