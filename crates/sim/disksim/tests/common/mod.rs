//! What the disksim CLI tests share.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace `iolab` binary: the one `cargo test --workspace` built, or built here on
/// demand when this crate's tests run alone.
pub fn iolab() -> Command {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..");
    let exe = std::env::var_os("CARGO_BIN_EXE_iolab")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let st = Command::new(env!("CARGO"))
                .args(["build", "-q", "-p", "iolab"])
                .current_dir(&root)
                .status()
                .unwrap();
            assert!(st.success(), "building iolab");
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join("target"));
            target.join("debug/iolab")
        });
    Command::new(exe)
}

/// Runs `c`, requires success (its stderr in the failure message) and returns its stdout.
pub fn stdout_of(c: &mut Command) -> String {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
