//! The flags every peer binary shares, parsed into the spec's [`PeerBasics`].
//!
//! Each peer's `main.rs` compiles this file as a module of its own (`#[path]`) and flattens
//! [`BasicFlags`] into its clap `Args`: it is not a module of the iolab-peer-common library,
//! because no library crate depends on clap (flags live in the binaries).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use iolab_servers::spec::PeerBasics;

// What to serve, where, on how many threads, with which backlog and idle timeout (a plain
// comment: clap would take a doc comment here for the whole command's about line).
#[derive(Debug, clap::Args)]
pub struct BasicFlags {
    /// Directory to serve; `/` maps to it, a directory to its index.html. Nothing outside it
    /// is ever served (same rules as `iolab serve`: iolab_http::Site)
    #[arg(long)]
    pub root: PathBuf,
    /// Address to listen on (port 0 picks a free port; the chosen address is printed)
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Threads: tokio's worker threads, or one monoio runtime or glommio executor per thread,
    /// each bound to one CPU (0 = one per CPU the process may run on)
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// Length of each listener's queue of connections not yet accepted (listen(2) backlog)
    #[arg(long, default_value_t = 1024)]
    pub backlog: u32,
    /// Seconds a connection may stay without any byte moving before it is closed (tokio's
    /// hyper engine: waiting for the next request head); 0 = never
    #[arg(long, default_value_t = 60.0)]
    pub idle_timeout: f64,
}

impl BasicFlags {
    /// The flags as the spec the lab launches a peer with; an idle timeout must be seconds
    /// >= 0.
    pub fn to_basics(&self) -> Result<PeerBasics> {
        Ok(PeerBasics {
            root: self.root.clone(),
            addr: self.addr,
            workers: self.workers,
            backlog: self.backlog,
            idle_timeout: iolab_peer_common::idle_timeout(self.idle_timeout)?,
        })
    }
}

/// A peer's `main`: its flags parsed, turned into its spec and run; an error is printed
/// under the program's name and the process exits 1 (the lab reads that line).
pub fn main_with<A: clap::Parser, S>(
    program: &str,
    to_spec: impl FnOnce(&A) -> Result<S>,
    run: impl FnOnce(S) -> Result<()>,
) {
    if let Err(e) = to_spec(&A::parse()).and_then(run) {
        eprintln!("{program}: {e:#}");
        std::process::exit(1);
    }
}

/// For the round-trip tests: the arguments after the program name, through the peer's
/// clap, into its spec (a flag clap refuses fails the test there and then).
#[cfg(test)]
pub fn parse_spec<A: clap::Parser, S>(
    args: Vec<std::ffi::OsString>,
    to_spec: impl FnOnce(&A) -> Result<S>,
) -> Result<S> {
    let program = std::iter::once(std::ffi::OsString::from("peer"));
    let parsed = A::try_parse_from(program.chain(args))
        .unwrap_or_else(|e| panic!("the peer refuses the spec's arguments: {e}"));
    to_spec(&parsed)
}
