//! Running a tier inside a network namespace: a thread enters it (`setns(2)` affects only
//! the calling thread) and every socket it creates lives there.

use anyhow::Context;
use std::os::fd::AsRawFd;

/// Moves the calling thread into the namespace `name` (`/var/run/netns/<name>`).
pub fn enter(name: &str) -> anyhow::Result<()> {
    let path = format!("/var/run/netns/{name}");
    let f = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    // SAFETY: setns(2) on a descriptor we hold open; it changes this thread's namespace only.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error()).context("setns");
    }
    Ok(())
}

/// Runs `f` on a new thread inside namespace `ns` (None: this one).
pub fn spawn_in<T: Send + 'static>(
    ns: Option<String>,
    name: &str,
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> std::thread::JoinHandle<anyhow::Result<T>> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            if let Some(ns) = ns {
                enter(&ns)?;
            }
            f()
        })
        .expect("spawning a thread")
}
