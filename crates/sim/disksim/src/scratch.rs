//! The files `calibrate` and `validate` create on the device they measure: each is a new
//! file (never one already there) removed when dropped, also on an error; Ctrl-C and
//! SIGTERM set a flag the measurements poll ([`install_interrupt_flag`]), so that they stop
//! and the drops run.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};

/// Ctrl-C / SIGTERM seen (set by the handler [`install_interrupt_flag`] registers).
pub fn install_interrupt_flag() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, flag.clone()).context("installing a signal handler")?;
    }
    Ok(flag)
}

/// Writes a regular file's dirty pages to the device and waits, then drops its cached
/// pages: the file starts cold and no write-back of it is left running. Opens read-only, so
/// nothing is written but what was already written to the file; errors are ignored (a file
/// that vanished has no cache).
pub fn drop_file_cache(path: &Path) {
    use std::os::unix::io::AsRawFd;
    if let Ok(file) = std::fs::File::open(path) {
        if file.metadata().is_ok_and(|m| m.is_file()) {
            let _ = file.sync_all();
            // SAFETY: a valid descriptor owned by `file` for the whole call.
            unsafe {
                libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        }
    }
}

/// A file created by this tool, removed when dropped.
pub struct OwnedFile {
    pub path: PathBuf,
}

impl OwnedFile {
    /// Creates the empty file `DIR/iolab-disksim-TAG-PID.dat` (never one already there: O_EXCL).
    pub fn create_new(dir: &Path, tag: &str) -> Result<OwnedFile> {
        let path = dir.join(format!("iolab-disksim-{tag}-{}.dat", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(OwnedFile { path })
    }
}

impl Drop for OwnedFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A 4096-aligned buffer of `len` bytes (for O_DIRECT), filled with a non-repeating pattern.
fn aligned_buffer(len: usize) -> (Vec<u8>, usize) {
    let mut v = vec![0u8; len + 4096];
    let off = v.as_ptr().align_offset(4096);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in v[off..off + len].iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    (v, off)
}

/// Creates `dir/iolab-disksim-<tag>-<pid>.dat` (never an existing file), checks that it can be
/// opened with O_DIRECT, and fills `bytes` of it with O_DIRECT writes (so every block is
/// allocated and written: reads of unwritten extents would never reach the device).
pub fn create_direct_file(dir: &Path, tag: &str, bytes: u64) -> Result<OwnedFile> {
    let md = std::fs::metadata(dir).with_context(|| format!("{}", dir.display()))?;
    if !md.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let owned = OwnedFile::create_new(dir, tag)?;
    let mut f = match std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&owned.path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => bail!(
            "the filesystem of {} refuses O_DIRECT (open: {e}); calibrate measures the device without the page cache, so it needs a directory on a filesystem that supports O_DIRECT (ext4, xfs, btrfs...)",
            dir.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("opening {} with O_DIRECT", owned.path.display())),
    };
    const CHUNK: usize = 1 << 20;
    let (buf, off) = aligned_buffer(CHUNK);
    let mut done = 0u64;
    while done < bytes {
        let n = (bytes - done).min(CHUNK as u64) as usize;
        let n = n.div_ceil(4096) * 4096;
        match f.write(&buf[off..off + n]) {
            Ok(w) if w > 0 => done += w as u64,
            Ok(_) => bail!("writing {}: no progress", owned.path.display()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => bail!(
                "the filesystem of {} refuses O_DIRECT writes ({e})",
                dir.display()
            ),
            Err(e) => return Err(e).with_context(|| format!("writing {}", owned.path.display())),
        }
    }
    f.sync_all()?;
    Ok(owned)
}
