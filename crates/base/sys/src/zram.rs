//! A zram block device with an ext4 filesystem on it, made for one measurement and always
//! removed: the steadiest block device a kernel without modules offers (no null_blk, brd
//! or device-mapper), since its speed is the CPU's and memory's, not a shared disk's.
//!
//! [`Zram::create`] adds a device through the kernel's hot-add interface
//! (`/sys/class/zram-control/hot_add`, Documentation/admin-guide/blockdev/zram.rst), sizes
//! it, makes an ext4 filesystem on it and mounts it on a new directory
//! `/tmp/iolab-zram-PID-N`. Dropping the guard unmounts it, removes the directory, resets
//! the device and hot-removes it. Nothing that was there before is touched: the device
//! number is the one the kernel hands out for this call, the directory is new
//! (`mkdir` fails on an existing one). A process killed before its drop leaves a mount
//! whose name carries its dead pid; [`cleanup_stale`] removes exactly those.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

const CONTROL: &str = "/sys/class/zram-control";
const MOUNT_PREFIX: &str = "iolab-zram-";

/// A zram device this process created, with ext4 mounted on [`Zram::dir`].
#[derive(Debug)]
pub struct Zram {
    id: u32,
    dir: PathBuf,
    mounted: bool,
}

impl Zram {
    /// A new zram device of `bytes` (rounded down to 4 KiB by the kernel), ext4 on it,
    /// mounted on a new directory. Needs root, CONFIG_ZRAM and `mkfs.ext4` (e2fsprogs).
    pub fn create(bytes: u64) -> io::Result<Zram> {
        if !Path::new(CONTROL).join("hot_add").exists() {
            return Err(io::Error::other(format!(
                "this kernel offers no zram hot-add ({CONTROL}/hot_add is missing: \
                 CONFIG_ZRAM off, or the zram module not loaded)"
            )));
        }
        let added = std::fs::read_to_string(Path::new(CONTROL).join("hot_add"))
            .map_err(|e| context(e, "adding a zram device (hot_add; needs root)"))?;
        let id: u32 = added.trim().parse().map_err(|_| {
            io::Error::other(format!("zram hot_add answered {added:?}, not a number"))
        })?;
        // From here the guard owns the device: an error below removes it.
        let mut zram = Zram {
            id,
            dir: std::env::temp_dir().join(format!("{MOUNT_PREFIX}{}-{id}", std::process::id())),
            mounted: false,
        };
        zram.write_attr("disksize", &bytes.to_string())?;
        zram.make_and_mount()?;
        Ok(zram)
    }

    /// The mounted filesystem's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The block device, `/dev/zramN`.
    pub fn device(&self) -> PathBuf {
        PathBuf::from(format!("/dev/zram{}", self.id))
    }

    /// The device's name in /sys/block, `zramN`.
    pub fn name(&self) -> String {
        format!("zram{}", self.id)
    }

    /// A sysfs attribute of the device, as the kernel writes it (`comp_algorithm`, `mm_stat`).
    pub fn attr(&self, name: &str) -> io::Result<String> {
        let path = self.sys().join(name);
        std::fs::read_to_string(&path).map_err(|e| context(e, &path.display().to_string()))
    }

    fn sys(&self) -> PathBuf {
        PathBuf::from(format!("/sys/block/zram{}", self.id))
    }

    fn write_attr(&self, name: &str, value: &str) -> io::Result<()> {
        let path = self.sys().join(name);
        std::fs::write(&path, value)
            .map_err(|e| context(e, &format!("writing {value} to {}", path.display())))
    }

    fn make_and_mount(&mut self) -> io::Result<()> {
        let dev = self.device();
        // -E nodiscard: the device is empty; lazy init off so no background writer runs
        // during the measurement.
        let out = Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-E",
                "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
            ])
            .arg(&dev)
            .output()
            .map_err(|e| context(e, "running mkfs.ext4 (package e2fsprogs)"))?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "mkfs.ext4 {}: {}",
                dev.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        std::fs::create_dir(&self.dir)
            .map_err(|e| context(e, &format!("creating {}", self.dir.display())))?;
        let out = Command::new("mount")
            .args(["-t", "ext4"])
            .arg(&dev)
            .arg(&self.dir)
            .output()
            .map_err(|e| context(e, "running mount"))?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "mount {} on {}: {}",
                dev.display(),
                self.dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        self.mounted = true;
        Ok(())
    }
}

impl Drop for Zram {
    fn drop(&mut self) {
        remove(self.id, &self.dir, self.mounted);
    }
}

/// Unmounts `dir` (when `mounted`), removes it if it carries our name, resets and
/// hot-removes device `id`. Best effort and silent (it runs in a drop): each step is tried
/// whatever the one before did. A mount left behind is found again by [`cleanup_stale`];
/// a device whose mount is gone but whose reset failed is not.
fn remove(id: u32, dir: &Path, mounted: bool) {
    if mounted {
        let _ = Command::new("umount").arg(dir).status();
    }
    if dir
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with(MOUNT_PREFIX))
    {
        let _ = std::fs::remove_dir(dir);
    }
    let _ = std::fs::write(format!("/sys/block/zram{id}/reset"), "1");
    let _ = std::fs::write(Path::new(CONTROL).join("hot_remove"), id.to_string());
}

/// Removes what a killed process of ours left: every `/tmp/iolab-zram-PID-N` mount whose
/// PID is not alive, its directory and its device N. Names without our prefix, and those
/// of live processes, are never touched. Returns the directories removed.
pub fn cleanup_stale() -> io::Result<Vec<PathBuf>> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    let tmp = std::env::temp_dir();
    let mut removed = Vec::new();
    for line in mounts.lines() {
        let mut fields = line.split_whitespace();
        let (Some(dev), Some(target)) = (fields.next(), fields.next()) else {
            continue;
        };
        let target = Path::new(target);
        let Some((pid, id)) = stale_name(target, &tmp) else {
            continue;
        };
        // The device mounted there must be the one the name says: never reset another.
        if dev != format!("/dev/zram{id}") || crate::process::exists(pid) {
            continue;
        }
        remove(id, target, true);
        removed.push(target.to_path_buf());
    }
    Ok(removed)
}

/// `(pid, device)` of `TMP/iolab-zram-PID-N`, or None for any other path.
fn stale_name(path: &Path, tmp: &Path) -> Option<(u32, u32)> {
    if path.parent()? != tmp {
        return None;
    }
    let rest = path.file_name()?.to_str()?.strip_prefix(MOUNT_PREFIX)?;
    let (pid, id) = rest.split_once('-')?;
    Some((pid.parse().ok()?, id.parse().ok()?))
}

fn context(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_names_are_stale_candidates() {
        let tmp = Path::new("/tmp");
        assert_eq!(
            stale_name(Path::new("/tmp/iolab-zram-123-4"), tmp),
            Some((123, 4))
        );
        for other in [
            "/tmp/iolab-zram-123",
            "/tmp/iolab-zram-x-4",
            "/mnt/iolab-zram-123-4",
            "/tmp/sub/iolab-zram-123-4",
            "/tmp/zram-123-4",
        ] {
            assert_eq!(stale_name(Path::new(other), tmp), None, "{other}");
        }
    }
}
