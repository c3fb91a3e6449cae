//! `iolab disksim run --host linux|windows-xp` end to end through the binary: the summary
//! reports the page cache's and block layer's counters, and bad host flags give one clear
//! error.

use std::path::Path;

mod common;
use common::{iolab, stdout_of};

/// A scratch directory, removed even when the test fails.
fn tempdir(tag: &str) -> iolab_sys::testing::TempDir {
    iolab_sys::testing::tempdir(tag).unwrap()
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
    let dir = tempdir("dlmodel-host");
    // 256 sequential 4 KiB reads of the raw device, then 256 sequential 4 KiB writes.
    let mut t = String::from("# time_ms op lba sectors\n");
    for i in 0..256u64 {
        t += &format!("{} R {} 8\n", i as f64 * 0.01, i * 8);
    }
    for i in 0..256u64 {
        t += &format!("{} W {} 8\n", 10.0 + i as f64 * 0.01, 100_000 + i * 8);
    }
    let trace = dir.path().join("t.iolab");
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

/// Whether an external tool is there; outside CI a missing one skips with its package named,
/// under `CI=true` it is a failure.
fn have(tool: &str, package: &str) -> bool {
    let ok = std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{tool} is missing (Debian package: {package})"
        );
        eprintln!("SKIPPED: {tool} not installed (Debian package: {package})");
    }
    ok
}

/// `record` of a real `tar` over a tree we create: the trace holds every byte tar read from
/// the tree and wrote to the archive, with the archive's offsets in order; `--compare`
/// times tar without strace and replays the trace; `run --trace` replays the file.
#[test]
fn record_tar_of_a_tree_and_replay_it() {
    if !have("strace", "strace") || !have("tar", "tar") {
        return;
    }
    let dir = tempdir("dlinux-rec");
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    for i in 0..10u64 {
        std::fs::write(tree.join(format!("f{i}")), vec![i as u8; 40960]).unwrap();
    }
    let trace = dir.path().join("t.trace");
    let json = dir.path().join("r.json");
    let cal = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/calibration-vda-quick.toml");
    let out = iolab()
        .args(["disksim", "record", "--compare", "1", "--config"])
        .arg(&cal)
        .arg("--only-under")
        .arg(dir.path())
        .arg("--out")
        .arg(&trace)
        .arg("--json")
        .arg(&json)
        .arg("--")
        .args(["tar", "-cf"])
        .arg(dir.path().join("out.tar"))
        .arg("-C")
        .arg(dir.path())
        .arg("tree")
        .output()
        .unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{o}\n{e}");
    assert!(o.contains("recorded") && o.contains("compare"), "{o}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["read_bytes"], 10 * 40960, "{v}");
    // The archive: a 512-byte header per file and the data, in 10240-byte records.
    let archive = std::fs::metadata(dir.path().join("out.tar")).unwrap().len();
    assert_eq!(v["write_bytes"].as_u64(), Some(archive), "{v}");
    assert!(v["compare"]["sim_s"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["compare"]["real_wall_s"].as_f64().unwrap() > 0.0, "{v}");
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.starts_with("# iolab file trace"));
    let archive_path = format!(" {}", dir.path().join("out.tar").display());
    let aid = text
        .lines()
        .find(|l| l.starts_with("file ") && l.ends_with(&archive_path))
        .and_then(|l| l.split(' ').nth(1))
        .expect("the archive is a file of the trace")
        .to_string();
    let offsets: Vec<u64> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("file ") && !l.starts_with("overhead"))
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .filter(|f| f[3] == aid && f[4] == "W")
        .map(|f| f[5].parse().unwrap())
        .collect();
    assert!(
        offsets.windows(2).all(|w| w[0] < w[1]) && offsets[0] == 0,
        "{offsets:?}"
    );
    let replay = || {
        iolab()
            .args(["disksim", "run", "--config"])
            .arg(&cal)
            .arg("--trace")
            .arg(&trace)
            .output()
            .unwrap()
    };
    let out = replay();
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && o.contains("replayed") && o.contains("simulated"),
        "{o}"
    );
    // A bad line in a file trace is one error naming the line.
    std::fs::write(
        &trace,
        "# iolab file trace v1\nfile 0 10 /x\n0 0 1 0 Q 0 10 -\n",
    )
    .unwrap();
    let out = replay();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("line 3") && e.contains("unknown OP"),
        "{e}"
    );
    // A path that is not ours is never replaced.
    std::fs::write(dir.path().join("mine.txt"), "not a trace").unwrap();
    let out = iolab()
        .args(["disksim", "record", "--out"])
        .arg(dir.path().join("mine.txt"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("mine.txt")).unwrap(),
        "not a trace"
    );
}

/// `run --fio --log` writes one CSV line per request, like `run --trace --log` (it used to
/// accept the flag and write nothing).
#[test]
fn a_fio_run_writes_its_request_log() {
    let dir = tempdir("fio-log");
    let job = dir.path().join("j.fio");
    std::fs::write(
        &job,
        "[j]\nfilename=/nonexistent/iolab-fio-log/f\nsize=1m\nrw=randwrite\nbs=32k\nsync=1\n",
    )
    .unwrap();
    let log = dir.path().join("log.csv");
    let cal = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/sata-ssd.toml");
    stdout_of(
        iolab()
            .args(["disksim", "run", "--quiet", "--host", "linux", "--config"])
            .arg(&cal)
            .arg("--fio")
            .arg(&job)
            .arg("--log")
            .arg(&log),
    );
    let text = std::fs::read_to_string(&log).expect("the log is written");
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("id,op,lba,sectors,arrival_ms"),
        "{}",
        lines[0]
    );
    // 1 MiB in 32 KiB O_SYNC writes: 32 write requests, each logged once (besides the
    // job's fadvise calls, op `A`).
    let writes: Vec<&str> = lines[1..]
        .iter()
        .copied()
        .filter(|l| l.split(',').nth(1) == Some("W"))
        .collect();
    assert_eq!(writes.len(), 32, "{text}");
    let response: Vec<f64> = writes
        .iter()
        .map(|l| l.rsplit(',').next().unwrap().parse().unwrap())
        .collect();
    assert!(
        response.iter().all(|&r| r > 0.0),
        "a synchronous write takes time: {response:?}"
    );
}

/// Missing files (job file, trace, calibration) each give one clear error naming the path.
#[test]
fn missing_files_give_one_clear_error() {
    let cal = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/sata-ssd.toml");
    let missing = "/nonexistent/iolab-dlinux/x";
    for args in [
        vec![
            "disksim",
            "run",
            "--config",
            cal.to_str().unwrap(),
            "--fio",
            missing,
        ],
        vec![
            "disksim",
            "run",
            "--config",
            cal.to_str().unwrap(),
            "--trace",
            missing,
        ],
        vec!["disksim", "run", "--config", missing, "--fio", missing],
        vec![
            "disksim",
            "validate",
            "--calibration",
            missing,
            "--dir",
            "/nonexistent/iolab-dlinux",
        ],
    ] {
        let out = iolab()
            .args(&args)
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE")
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            e.contains(missing) || e.contains("/nonexistent/iolab-dlinux"),
            "{args:?}: {e}"
        );
        assert!(!e.contains("panicked"), "{e}");
        // "Error: ...", and the cause ("Caused by: ... No such file or directory").
        assert!(
            e.lines().filter(|l| !l.trim().is_empty()).count() <= 4,
            "{args:?}: {e}"
        );
    }
}

/// A filesystem that refuses O_DIRECT (ramfs, mounted in a private mount namespace so that
/// nothing outside sees it): `calibrate` stops with one clear error and leaves nothing.
#[test]
fn calibrate_on_a_filesystem_refusing_o_direct_is_one_clear_error() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !have("unshare", "util-linux") {
        eprintln!("SKIPPED: needs root and unshare (mount namespace)");
        return;
    }
    let dir = tempdir("dlinux-ramfs");
    let exe = iolab().get_program().to_owned();
    let script = format!(
        "mount -t ramfs iolab-dlinux {d} && {exe} disksim calibrate --quick --quiet --dir {d}; rc=$?; ls -A {d}; exit $rc",
        d = dir.path().display(),
        exe = Path::new(&exe).display()
    );
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success(), "{o}\n{e}");
    assert!(e.contains("refuses O_DIRECT"), "{e}");
    assert!(!e.contains("panicked"), "{e}");
    assert_eq!(o.trim(), "", "calibrate left files: {o}");
}

/// `validate --sim-only`: the suite's jobs through the simulator alone, on a recorded
/// calibration — figures identical from run to run (the simulator is deterministic),
/// nothing created in `--dir`, no fio needed; without `--calibration` it is refused.
#[test]
fn validate_sim_only_is_deterministic_and_touches_nothing() {
    let tmp = tempdir("simonly");
    let cal = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/calibration-vda-quick.toml");
    let run = |json: &Path| {
        let out = iolab()
            .args(["disksim", "validate", "--quick", "--sim-only", "--quiet"])
            .args([
                "--only",
                "read-32k-nobuffer-cold,write-512k-writethrough,randread-32k-normal-warm",
            ])
            .arg("--calibration")
            .arg(&cal)
            .arg("--dir")
            .arg(tmp.path())
            .arg("--json")
            .arg(json)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        (text, v)
    };
    let out_dir = tempdir("simonly-out");
    let (text, a) = run(&out_dir.path().join("a.json"));
    let (_, b) = run(&out_dir.path().join("b.json"));
    assert!(
        text.contains("sim/wall") && text.contains("slowest by kind"),
        "{text}"
    );
    let (ra, rb) = (
        a["results"].as_array().unwrap(),
        b["results"].as_array().unwrap(),
    );
    // (names match as substrings: the random-pattern twins of the first two come too)
    assert_eq!(ra.len(), 5, "{a}");
    for (x, y) in ra.iter().zip(rb) {
        assert_eq!(x["case"]["name"], y["case"]["name"]);
        assert!(x["requests"].as_u64().unwrap() > 100, "{x}");
        assert!(x["sim"]["mb_s"].as_f64().unwrap() > 0.0, "{x}");
        for k in ["sim", "requests", "sim_ms"] {
            assert_eq!(x[k], y[k], "{k} differs between two runs");
        }
    }
    assert!(a["machine"].as_str().is_some_and(|m| !m.is_empty()));
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "nothing written in --dir"
    );
    let out = iolab()
        .args(["disksim", "validate", "--quick", "--sim-only"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--calibration"));
}
