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
//! Without the default `engine` feature only the parsers of outside data are built
//! ([`wire`], [`metainfo`] loading, [`tracker`] requests and replies): the fuzz targets'
//! build (crates/apps/seeder/fuzz).

#[cfg(feature = "engine")]
pub mod bench;
#[cfg(feature = "engine")]
pub mod cli;
#[cfg(feature = "engine")]
pub mod disk;
pub mod metainfo;
#[cfg(feature = "engine")]
pub mod seed;
#[cfg(feature = "engine")]
pub mod swarm;
pub mod tracker;
pub mod wire;
