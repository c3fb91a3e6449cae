//! `iolab disksim calibrate|validate --zram SIZE`: the device is made for the run and
//! removed when it ends, also on Ctrl-C; sizes that cannot hold the measurements and a
//! --dir given with it are refused before anything is made.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use iolab_sys::testing::{require, require_tool};

fn iolab() -> Command {
    Command::new(env!("CARGO_BIN_EXE_iolab"))
}

#[test]
fn too_small_or_with_a_dir_is_refused() {
    for sub in ["calibrate", "validate"] {
        let out = iolab()
            .args(["disksim", sub, "--zram", "10m", "--quiet"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("at least 64 MiB"),
            "{sub}: {err}"
        );
        let out = iolab()
            .args(["disksim", sub, "--zram", "1g", "--dir", "/tmp"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("cannot be used with"),
            "{sub}: {err}"
        );
    }
}

/// Our zram mounts of process `pid` now.
fn mounts_of(pid: u32) -> Vec<PathBuf> {
    let prefix = std::env::temp_dir().join(format!("iolab-zram-{pid}-"));
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|t| t.starts_with(prefix.to_str().unwrap()))
        .map(PathBuf::from)
        .collect()
}

#[test]
fn ctrl_c_removes_the_device() {
    let usable = require(iolab_sys::process::is_root(), "zram needs root")
        && require(
            std::path::Path::new("/sys/class/zram-control/hot_add").exists(),
            "this kernel has no zram hot-add",
        )
        && require_tool("mkfs.ext4", "e2fsprogs").is_some()
        && require_tool("fio", "fio").is_some();
    if !usable {
        return;
    }
    let mut child = iolab()
        .args(["disksim", "calibrate", "--zram", "1g", "--quick", "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let t0 = Instant::now();
    let dir = loop {
        if let Some(d) = mounts_of(pid).pop() {
            break d;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no zram mount");
        assert!(child.try_wait().unwrap().is_none(), "calibrate ended early");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Let it start measuring (its file on the device), then interrupt it.
    std::thread::sleep(Duration::from_millis(1500));
    iolab_sys::process::signal(pid, libc::SIGINT).unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "{err}");
    assert!(mounts_of(pid).is_empty(), "still mounted: {err}");
    assert!(!dir.exists(), "{} left: {err}", dir.display());
    let id = dir
        .to_str()
        .unwrap()
        .rsplit('-')
        .next()
        .unwrap()
        .to_string();
    assert!(
        !std::path::Path::new(&format!("/sys/block/zram{id}")).exists(),
        "zram{id} left: {err}"
    );
}
