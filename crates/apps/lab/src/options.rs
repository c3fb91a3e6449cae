//! What one `iolab lab` run is asked to do: the typed options the CLI fills in.

use std::path::PathBuf;
use std::time::Duration;

use crate::server::Target;

/// How much a run measures (the CLI's `--profile` lists what each does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Tiny,
    Quick,
    Full,
}

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Tiny => "tiny",
            Profile::Quick => "quick",
            Profile::Full => "full",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    pub profile: Profile,
    pub models: Vec<String>,
    pub peers: Vec<String>,
    pub out: PathBuf,
    pub repeat: Option<usize>,
    /// Micro names to run (empty = none).
    pub micro: Vec<String>,
    pub workers: usize,
    pub backlog: u32,
    /// Whole-run time budget (quick); None = the profile's.
    pub budget: Option<Duration>,
    pub command: String,
    /// Measure server CPU time per request at a fixed offered rate (see [`crate::efficiency`]).
    pub efficiency: bool,
    /// The offered rate of the efficiency pass (requests/s, both modes); None = half the
    /// slowest server's peak in this run.
    pub efficiency_rate: Option<f64>,
    /// Run the server behind a shaped link instead of loopback (`--link`).
    pub link: Option<crate::link::LinkSpec>,
    /// `--seed-conditions`: the seed's method (new connection per request only).
    pub seed_conditions: bool,
    /// The user's servers (`--target`, `--url`), run after the built-in ones.
    pub targets: Vec<Target>,
}
