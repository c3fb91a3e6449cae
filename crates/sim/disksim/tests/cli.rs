//! The `iolab disksim` subcommands end to end, through the real binary: validate-disksim's
//! table, JSON and HTML (rendered in headless Chromium), run with a config and each trace
//! format, bench, and clear errors on bad input.

use std::path::{Path, PathBuf};

mod common;
use common::{iolab, stdout_of};

/// A scratch directory removed when the guard drops, also when the test fails or returns early.
fn tempdir(tag: &str) -> iolab_sys::testing::TempDir {
    iolab_sys::testing::tempdir(&format!("disksim-{tag}")).unwrap()
}

fn configs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("configs")
}

#[test]
fn validate_disksim_table_json_html_in_chromium() {
    let tmp = tempdir("validate");
    let dir = tmp.path();
    let (json, html) = (dir.join("v.json"), dir.join("v.html"));
    let text = stdout_of(
        iolab()
            .args(["disksim", "validate-disksim", "--json"])
            .arg(&json)
            .arg("--html")
            .arg(&html)
            .arg("--check")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("data/validation-baseline.json")),
    );
    for d in [
        "barracuda",
        "cheetah4LP",
        "ibm18es",
        "atlas_III",
        "hp_c2247a",
    ] {
        assert!(text.contains(d), "table lacks {d}:\n{text}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 5);
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(page.matches("<figure class=\"cdf\"").count(), 5);

    let Some(dom) = iolab_sys::testing::chromium_renders(&html) else {
        return;
    };
    // Every figure reached the DOM as SVG with both curves (real and simulated).
    assert_eq!(dom.matches("<svg").count(), 5, "five CDF figures rendered");
    assert_eq!(dom.matches("<path").count(), 10, "two curves per figure");
    assert!(dom.contains("id=\"results\""));
    // The table of errors by class: every trace has requests of all six classes.
    assert!(dom.contains("id=\"by-class\""));
    assert_eq!(dom.matches("read miss, seek 2-6 ms").count(), 5);
}

#[test]
fn validate_disksim_by_class_prints_where_the_model_errs() {
    let text = stdout_of(iolab().args([
        "disksim",
        "validate-disksim",
        "--disks",
        "hp_c2247a",
        "--by-class",
    ]));
    assert!(text.contains("class (what the model did)"), "{text}");
    // One line per class the trace has, each with its count; they add up to the trace.
    let n: u64 = text
        .lines()
        .filter(|l| l.starts_with("hp_c2247a   ") && (l.contains("write") || l.contains("read ")))
        .map(|l| {
            l.split_whitespace()
                .rev()
                .nth(2)
                .and_then(|v| v.parse::<u64>().ok())
                .expect(l)
        })
        .sum();
    assert_eq!(n, 9999, "{text}");
}

#[test]
fn validate_disksim_per_request_csv_matches_the_table() {
    // One line per request; its sim_ms column averages to the table's simulated mean; a
    // rerun replaces its own file, and a file the tool did not write is never replaced.
    let tmp = tempdir("perreq");
    let dir = tmp.path().join("per");
    let json = tmp.path().join("v.json");
    let run = || {
        iolab()
            .args([
                "disksim",
                "validate-disksim",
                "--disks",
                "hp_c2247a",
                "--per-request",
            ])
            .arg(&dir)
            .arg("--json")
            .arg(&json)
            .output()
            .unwrap()
    };
    for _ in 0..2 {
        let out = run();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let (reqs, sim_mean) = (
        v[0]["requests"].as_u64().unwrap() as usize,
        v[0]["sim_mean_ms"].as_f64().unwrap(),
    );
    let csv = std::fs::read_to_string(dir.join("hp_c2247a.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<_> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (sim, real, op) = (col("sim_ms"), col("real_ms"), col("op"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), reqs);
    let mean = rows
        .iter()
        .map(|r| r[sim].parse::<f64>().unwrap())
        .sum::<f64>()
        / reqs as f64;
    assert!((mean - sim_mean).abs() < 1e-3, "{mean} vs {sim_mean}");
    assert!(rows.iter().all(|r| r[real].parse::<f64>().unwrap() > 0.0));
    assert!(rows.iter().any(|r| r[op] == "W") && rows.iter().any(|r| r[op] == "R"));

    std::fs::write(dir.join("hp_c2247a.csv"), "precious\n").unwrap();
    let out = run();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to replace"));
    assert_eq!(
        std::fs::read_to_string(dir.join("hp_c2247a.csv")).unwrap(),
        "precious\n"
    );
}

#[test]
fn run_with_each_example_config_and_a_trace() {
    let tmp = tempdir("run");
    let dir = tmp.path();
    for cfg in [
        "hdd-7200.toml",
        "sata-ssd.toml",
        "nvme.toml",
        "measured-vda.toml",
    ] {
        let json = dir.join(format!("{cfg}.json"));
        let text = stdout_of(
            iolab()
                .args(["disksim", "run", "--quiet", "--config"])
                .arg(configs().join(cfg))
                .arg("--json")
                .arg(&json),
        );
        assert!(text.contains("p99.9"), "{cfg}: {text}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert!(v["requests"].as_u64().unwrap() > 0);
        assert!(v["mean_ms"].as_f64().unwrap() > 0.0);
    }
    // A trace in iolab's own format with a per-request log.
    let trace = dir.join("t.iolab");
    std::fs::write(
        &trace,
        "# time_ms op lba sectors\n0 R 0 8\n0.5 R 8 8\n1 W 1000 16\n20 R 500000 8\n",
    )
    .unwrap();
    let log = dir.join("log.csv");
    let run_trace = || {
        let mut c = iolab();
        c.args(["disksim", "run", "--quiet", "--config"])
            .arg(configs().join("hdd-7200.toml"))
            .arg("--trace")
            .arg(&trace)
            .args(["--format", "iolab"]);
        c
    };
    stdout_of(run_trace().arg("--log").arg(&log));
    let csv = std::fs::read_to_string(&log).unwrap();
    assert_eq!(csv.lines().count(), 5, "header and four requests:\n{csv}");
    assert!(csv.lines().next().unwrap().contains("seek_ms,rotation_ms"));
    // A bad trace line: one clear error with the line number, no panic.
    std::fs::write(&trace, "0 R 0 8\n1 X 0 8\n").unwrap();
    let out = run_trace().output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("line 2"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bench_prints_rates() {
    let out = iolab()
        .args(["disksim", "bench", "--requests", "20000"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.contains("20000")).count(),
        3,
        "{text}"
    );
}

/// `bench --quick`: 100,000 requests a workload, simulated time over wall time in the table.
#[test]
fn bench_quick_prints_sim_per_wall() {
    let out = iolab()
        .args(["disksim", "bench", "--quick"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("sim/wall"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.contains(" 100000 ")).count(),
        3,
        "{text}"
    );
}

/// Bad input is an error, not a plausible run: random bytes or an empty file (0 requests,
/// exit 0 before), a request past the device's end (completed in 0 ms and counted), a
/// second device number (merged onto one disk); a `.parv` is a config.
#[test]
fn bad_traces_are_errors_and_a_parv_is_a_config() {
    let dir = tempdir("disksim-bad");
    let dir = dir.path();
    let run = |trace: &Path, config: &Path| {
        let out = iolab()
            .args(["disksim", "run", "--quiet", "--config"])
            .arg(config)
            .arg("--trace")
            .arg(trace)
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!err.contains("panicked"), "{err}");
        (out.status.success(), err)
    };
    let hdd = configs().join("hdd-7200.toml");
    let noise = dir.join("noise.bin");
    std::fs::write(&noise, iolab_sys::testing::random_bytes(100_000, 7)).unwrap();
    let empty = dir.join("empty.trace");
    std::fs::write(&empty, "").unwrap();
    for t in [&noise, &empty] {
        let (ok, err) = run(t, &hdd);
        assert!(!ok && err.contains("guessed as"), "{}: {err}", t.display());
    }
    let (ok, err) = run(&empty, &hdd);
    assert!(!ok && err.contains("no request"), "{err}");
    let big = dir.join("big.iolab");
    std::fs::write(&big, "0 R 0 8\n1 R 99999999999 8\n").unwrap();
    for c in ["hdd-7200.toml", "nvme.toml", "measured-vda.toml"] {
        let (ok, err) = run(&big, &configs().join(c));
        assert!(
            !ok && err.contains("line 2") && err.contains("beyond"),
            "{c}: {err}"
        );
    }
    let multi = dir.join("multi.ascii");
    std::fs::write(&multi, "0.0 0 10 8 1\n1.0 1 10 8 1\n").unwrap();
    let (ok, err) = run(&multi, &hdd);
    assert!(!ok && err.contains("--device"), "{err}");
    let parv = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/disksim-valid/barracuda.parv");
    let ok_trace = dir.join("ok.iolab");
    std::fs::write(&ok_trace, "0 R 0 8\n1 R 800 8\n").unwrap();
    let (ok, err) = run(&ok_trace, &parv);
    assert!(ok, "{err}");
}

/// DiskSim's `ascii.parv` given as it is runs as its system of 18 disks, the trace's device
/// numbers routed to them, and `--stats disksim` prints DiskSim's names and buckets.
#[test]
fn a_system_parv_runs_as_its_disks_with_disksims_statistics() {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/disksim-systems");
    let text = stdout_of(
        iolab()
            .args([
                "disksim", "run", "--quiet", "--format", "ascii", "--stats", "disksim", "--config",
            ])
            .arg(d.join("ascii.parv"))
            .arg("--trace")
            .arg(d.join("ascii-20k.trace")),
    );
    assert!(text.contains("system of 18 disks"), "{text}");
    assert!(text.contains("IOdriver Response time average:"), "{text}");
    assert!(
        text.contains("Overall I/O System Response time distribution"),
        "{text}"
    );
    assert!(text.contains("Disk #17 Seek time average:"), "{text}");
}
