//! What several root test files do the same way. Each `tests/*.rs` is its own crate and
//! includes this module with `mod common;`, using only some of it.
#![allow(dead_code)]

use std::io::Read as _;
use std::net::TcpStream;
use std::process::{Command, Output};
use std::time::Duration;

/// Runs `cmd` to the end and returns its output; panics with the command, its status, its
/// stdout and its stderr unless it succeeded.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// True once the peer has closed (EOF or reset) within the timeout; false on a timeout or
/// another error. Whatever the peer sends before closing is read and dropped.
pub fn closed_by_peer(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// The processes (`pid args`, as `ps -eo pid,args` prints them) whose line `wanted` keeps,
/// `ps` itself left out: what a test checks is gone after a run.
pub fn processes(wanted: impl Fn(&str) -> bool) -> Vec<String> {
    let ps = Command::new("ps")
        .args(["-eo", "pid,args"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&ps.stdout)
        .lines()
        .filter(|l| wanted(l) && !l.contains(" ps -eo"))
        .map(String::from)
        .collect()
}
