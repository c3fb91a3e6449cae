//! Running a tier inside a network namespace: a thread enters it (`setns(2)` affects only
//! the calling thread) and every socket it creates lives there.

use anyhow::Context;

/// Moves the calling thread into the namespace `name` (`/var/run/netns/<name>`).
pub fn enter(name: &str) -> anyhow::Result<()> {
    iolab_netns::enter_thread(name).with_context(|| format!("entering namespace {name}"))
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
