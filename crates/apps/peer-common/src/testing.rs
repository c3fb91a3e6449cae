//! For the peers' wire tests: a peer binary started on a free port, its start line read
//! and its address taken from it. Test support: it panics on what a test cannot go on
//! without.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

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
