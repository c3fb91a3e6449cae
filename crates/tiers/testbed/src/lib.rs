//! The tiers testbed (seed 004): client → FE (reverse proxy) → IS (load balancer) → BE (web
//! server), real unmodified nginx in each tier, each in its own network namespace, and ODB
//! (on-demand buffers, `libiolab_odb.so`) across them.
//!
//! Layers: `nginx` (configurations), `stack` (one run of the three tiers + the ODB agent),
//! `cpu` (per-tier CPU, interface bytes, ODB counters), `testbed` (namespaces and veths, the
//! persistent `up`/`down` testbed), `bench`. The command line (`iolab tiers`) lives in the
//! `iolab` binary.

pub mod bench;
pub mod children;
pub mod cpu;
pub mod disc_bench;
pub mod faults;
pub mod hosts;
pub mod nginx;
pub mod report;
pub mod stack;
pub mod state;
pub mod testbed;
pub mod testutil;
