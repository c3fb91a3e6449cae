//! Shared by the disc integration tests: the checks that decide whether a test can run
//! here, and the capture reader.

#![allow(dead_code)] // each test file uses its own part

pub mod pcap;

/// True when this process runs as root (namespaces, CAP_BPF, raw sockets).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

/// Whether a test of `what` can run: true, or one line saying why not (a failure under
/// CI=true, where scripts/install-deps has installed everything).
pub fn can_run(what: &str, missing: Option<&str>) -> bool {
    let Some(why) = missing else { return true };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{what}: {why}");
    }
    eprintln!("skipping {what}: {why}");
    false
}

/// The FE's eBPF programs can be loaded: built with clang and run as root.
pub fn bpf_ready(what: &str, root_for: &str) -> bool {
    let why = if !iolab_disc::bpf::available() {
        Some("iolab-disc was built without clang/libbpf-dev (scripts/deps/disc)".to_string())
    } else if !is_root() {
        Some(format!("needs root ({root_for})"))
    } else {
        None
    };
    can_run(what, why.as_deref())
}
