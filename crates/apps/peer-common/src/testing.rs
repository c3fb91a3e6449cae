//! For the peers' wire tests: a peer binary started on a free port, its start line read
//! and its address taken from it. Test support: it panics on what a test cannot go on
//! without.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use iolab_servers::spec::PeerBasics;

/// A running peer, killed when dropped.
pub struct Peer {
    pub child: Child,
    pub addr: SocketAddr,
    pub start_line: String,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `bin --root ROOT ARGS...` and returns once it has printed its start line
/// ("serving DIR on ADDR with ...").
pub fn start(bin: &str, root: &Path, args: &[&str]) -> Peer {
    let mut child = Command::new(bin)
        .arg("--root")
        .arg(root)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("start {bin}: {e}"));
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped stdout");
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addr = line
        .split(" on ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("{bin}: no address in {line:?}"));
    Peer {
        child,
        addr,
        start_line: line,
    }
}

/// The command-line contract every peer keeps, given its argv parser (`to_spec`: the
/// arguments after the program name, through the peer's clap, into its spec), its spec for
/// given shared flags with its own flag at its default (`with`), and its `to_args`:
///
/// - what the lab launches is what the peer runs (spec -> arguments -> clap -> spec), for
///   the defaults, every shared field set (a path with a space, IPv6) and no idle timeout;
/// - the spec's defaults are the command line's when a flag is left out;
/// - a negative idle timeout is refused, naming the flag.
pub fn check_command_line<S: PartialEq + std::fmt::Debug>(
    to_spec: impl Fn(Vec<OsString>) -> anyhow::Result<S>,
    with: impl Fn(PeerBasics) -> S,
    to_args: impl Fn(&S) -> Vec<OsString>,
) {
    let mut every = PeerBasics::new("dir with space".into(), "[::1]:9000".parse().unwrap());
    every.workers = 3;
    every.backlog = 200;
    every.idle_timeout = Duration::from_millis(1500);
    let mut never_idle = PeerBasics::new("/w".into(), "127.0.0.1:8099".parse().unwrap());
    never_idle.idle_timeout = Duration::ZERO;
    let defaults = PeerBasics::new("/w".into(), "127.0.0.1:8099".parse().unwrap());
    for basics in [defaults.clone(), every, never_idle] {
        let spec = with(basics);
        assert_eq!(to_spec(to_args(&spec)).unwrap(), spec);
    }
    let args = ["--root", "/w", "--addr", "127.0.0.1:8099"].map(OsString::from);
    assert_eq!(to_spec(args.to_vec()).unwrap(), with(defaults));
    let args = ["--root", "/w", "--idle-timeout=-1"].map(OsString::from);
    let e = to_spec(args.to_vec()).unwrap_err().to_string();
    assert!(e.contains("--idle-timeout must be"), "{e}");
}
