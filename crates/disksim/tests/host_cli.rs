//! `iolab disksim run --host linux|windows-xp` end to end through the binary: the summary
//! reports the page cache's and block layer's counters, and bad host flags give one clear
//! error.

use std::path::{Path, PathBuf};

mod common;
use common::iolab;

/// Removes the directory even when the test fails.
struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(args: &[&str], trace: &Path) -> (bool, String, String) {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/sata-ssd.toml");
    let out = iolab()
        .args(["disksim", "run", "--quiet", "--format", "iolab", "--config"])
        .arg(&config)
        .arg("--trace")
        .arg(trace)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn stat(out: &str, name: &str) -> f64 {
    out.lines()
        .find(|l| l.trim_start().starts_with(name))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn run_with_a_host_reports_its_counters() {
    let dir =
        TempDir(std::env::temp_dir().join(format!("iolab-dlmodel-host-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    // 256 sequential 4 KiB reads of the raw device, then 256 sequential 4 KiB writes.
    let mut t = String::from("# time_ms op lba sectors\n");
    for i in 0..256u64 {
        t += &format!("{} R {} 8\n", i as f64 * 0.01, i * 8);
    }
    for i in 0..256u64 {
        t += &format!("{} W {} 8\n", 10.0 + i as f64 * 0.01, 100_000 + i * 8);
    }
    let trace = dir.0.join("t.iolab");
    std::fs::write(&trace, t).unwrap();

    let (ok, out, err) = run(&["--host", "linux", "--read-ahead-kb", "128"], &trace);
    assert!(ok, "{err}");
    assert!(out.contains("host        "), "{out}");
    // Read-ahead: 256 pages read with far fewer device reads, most pages hits.
    assert!(stat(&out, "pagecache hit pages") >= 200.0, "{out}");
    assert!(stat(&out, "pagecache readahead pages") > 0.0, "{out}");
    assert!(stat(&out, "pagecache dirtied pages") == 256.0, "{out}");
    // The dirty pages expire 30 s later and reach the device merged.
    assert!(stat(&out, "pagecache written-back pages") == 256.0, "{out}");
    assert!(stat(&out, "blocklayer requests to device") < 100.0, "{out}");

    let (ok, out, err) = run(&["--host", "windows-xp"], &trace);
    assert!(ok, "{err}");
    assert!(stat(&out, "winxp hit blocks (64 KB)") > 0.0, "{out}");

    let (ok, out, _) = run(&[], &trace);
    assert!(ok);
    assert!(!out.contains("pagecache"), "no host by default: {out}");

    for (bad, says) in [
        (&["--host", "beos"][..], "unknown host 'beos'"),
        (
            &["--host", "linux", "--dirty-ratio", "120"][..],
            "percentage",
        ),
        (
            &["--host", "linux", "--io-scheduler", "bfq"][..],
            "unknown I/O scheduler",
        ),
    ] {
        let (ok, _, err) = run(bad, &trace);
        assert!(!ok);
        assert!(err.contains(says), "{bad:?}: {err}");
    }
}
