//! # iolab-seeder: Hekate, a BitTorrent seeder on iolab-runtime
//!
//! Seed 000 §2.3: Hekate was a BitTorrent seeder in CPC whose Unix version mapped its files,
//! asked the kernel whether a block was in memory (`mincore`) and detached the task to a
//! native thread when it was not; its Windows port used completion I/O, where the read is
//! simply asynchronous. This crate brings it to Linux on iolab-runtime, with the three disk
//! paths side by side ([`disk`]), a wire protocol with limits on everything a peer can make
//! it do ([`wire`], [`seed`]), a small HTTP tracker ([`tracker`]), metainfo creation and
//! checking ([`metainfo`], bencode by `lava_torrent`) and a swarm benchmark against
//! libtorrent ([`bench`]).
//!
//! The command line (`iolab seed`, `iolab tracker`) is the `iolab` binary's (src/cli/seed.rs,
//! src/cli/tracker.rs): it turns flags into [`spec::SeedSpec`], [`bench::BenchConfig`] and
//! [`swarm::SwarmConfig`]; the bench starts its seeding and swarm processes from the same
//! types ([`spec`]).

pub mod announce;
pub mod bench;
pub mod choker;
pub mod dial;
pub mod disk;
pub mod hashes;
pub mod https;
pub mod link;
pub mod merkle;
pub mod metadata;
pub mod metainfo;
pub mod mse;
pub mod opening;
pub mod seed;
pub mod spec;
pub mod swarm;
pub mod tracker;
pub mod udp_tracker;
pub mod utp;
pub mod wire;
