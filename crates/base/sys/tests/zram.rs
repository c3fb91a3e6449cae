//! A zram device made, used and removed, also when its owner is killed (root and a kernel
//! with zram: the VM CI runs on has both; elsewhere one line says why the test skipped).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use iolab_sys::testing::{require, require_tool};
use iolab_sys::zram::{self, Zram};

fn usable() -> bool {
    require(iolab_sys::process::is_root(), "zram needs root")
        && require(
            Path::new("/sys/class/zram-control/hot_add").exists(),
            "this kernel has no zram hot-add",
        )
        && require_tool("mkfs.ext4", "e2fsprogs").is_some()
}

fn mounted(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let dir = dir.to_str().unwrap();
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(dir))
}

#[test]
fn a_device_is_made_mounted_and_removed() {
    if !usable() {
        return;
    }
    let z = Zram::create(64 << 20).unwrap();
    let (dir, name) = (z.dir().to_path_buf(), z.name());
    assert!(mounted(&dir), "{} not mounted", dir.display());
    let size: u64 = z.attr("disksize").unwrap().trim().parse().unwrap();
    assert_eq!(size, 64 << 20);
    let mut f = std::fs::File::create(dir.join("data")).unwrap();
    f.write_all(&vec![7u8; 1 << 20]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    drop(z);
    assert!(!mounted(&dir), "{} still mounted", dir.display());
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(
        !Path::new("/sys/block").join(&name).exists(),
        "{name} left behind"
    );
}

/// The child half of the test below: makes a device, says where, and waits to be killed.
#[test]
fn zram_child_that_waits_to_be_killed() {
    if std::env::var_os("IOLAB_ZRAM_CHILD").is_none() {
        return;
    }
    let z = Zram::create(16 << 20).unwrap();
    println!("dir {}", z.dir().display());
    std::io::stdout().flush().unwrap();
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn a_killed_owners_device_is_removed_by_cleanup_stale() {
    if !usable() {
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "zram_child_that_waits_to_be_killed",
            "--nocapture",
        ])
        .env("IOLAB_ZRAM_CHILD", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut dir = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        if let Some(d) = line.unwrap().strip_prefix("dir ") {
            dir = Some(PathBuf::from(d));
            break;
        }
    }
    let dir = dir.expect("the child printed its directory");
    assert!(mounted(&dir));
    // Not stale while its owner lives.
    assert!(!zram::cleanup_stale().unwrap().contains(&dir));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(mounted(&dir), "SIGKILL runs no drop");
    assert!(zram::cleanup_stale().unwrap().contains(&dir));
    assert!(!mounted(&dir) && !dir.exists());
}
