//! The lab: runs the seed's experiments over every model and writes the report.
//!
//! `iolab lab` starts each server model (and the peers: nginx, the tokio server) in turn as
//! a child process pinned to one CPU, drives it with `iolab-load` pinned to another, and
//! writes `results.json`, per-request logs and `index.html` (see [`results`] and [`report`]).
//!
//! A run is [`lab::run`]: the [`plan`] (the profile's points and how each is sized), the
//! [`matrix`] (every server through those points) and the [`point`] (one load run, analysed
//! by [`steady`]), on a [`stage`] shared with `--scaling` ([`scaling`]). Each child process
//! is started from one typed spec that its own command line parses back:
//! `iolab_servers::spec::{ServeSpec, TokioSpec}` ([`server`]) and [`micro::MicroSpec`].

pub mod byo;
pub mod catalog;
pub mod compare;
pub mod efficiency;
pub mod hosts;
pub mod lab;
pub mod link;
pub mod matrix;
pub mod micro;
pub mod options;
pub mod plan;
pub mod point;
pub mod report;
pub mod results;
pub mod scaling;
pub mod seedbench;
pub mod seedtable;
pub mod select;
pub mod server;
pub mod settings;
pub mod site;
pub mod stage;
pub mod steady;
pub mod utest;
pub use iolab_report::svg;
pub mod validate;
