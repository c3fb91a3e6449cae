//! `iolab lab --compare` finds a model made 20% costlier and nothing in a model left alone;
//! a run that measured nothing is an error.
//!
//! Tiny runs of the lab over epoll and poll, taken in turns A B B A A B; in the B runs,
//! epoll's requests each cost 20% more server CPU (the debug build's
//! `IOLAB_TEST_CPU_PER_REQUEST_US=epoll:US` hook, US being a fifth of the CPU per request
//! the first run measured). poll is the same build in both: its figures are runs of one
//! build, and most of them must show no significant difference; epoll's CPU per request
//! (Figure 1b) must come out worse. The turns matter: run back to back, A then B, a build
//! that started on the shared machine between them made poll "worse" on 14 of 23 figures.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::run_ok;

/// Repeats per point and per efficiency row in each run; three runs a side pool 6 against
/// 6 (p down to 0.002).
const REPEATS: &str = "2";
/// The order of the runs: each side takes the machine's early and late turns alike.
const TURNS: [bool; 6] = [false, true, true, false, false, true];
/// One fixed offered rate for both runs' efficiency pass (by default it follows each run's
/// peaks, which differ).
const RATE: &str = "400";

fn lab(out: &Path, cost: Option<String>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_iolab"));
    cmd.args([
        "lab",
        "--profile",
        "tiny",
        "--models",
        "epoll,poll",
        "--peers",
        "none",
        "--no-micro",
        "--repeat",
        REPEATS,
        "--efficiency-rate",
        RATE,
        "--out",
    ])
    .arg(out);
    cmd.env_remove("IOLAB_TEST_CPU_PER_REQUEST_US");
    if let Some(c) = cost {
        cmd.env("IOLAB_TEST_CPU_PER_REQUEST_US", c);
    }
    run_ok(&mut cmd);
    let results = json(&out.join("results.json"));
    for t in results["targets"].as_array().expect("targets") {
        assert_eq!(t["status"], "ok", "{t}");
    }
}

fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The median CPU per request of `server`'s keep-alive efficiency row in a results.json.
fn us_per_request(results: &serde_json::Value, server: &str) -> f64 {
    let rows = results["efficiency"]["rows"]
        .as_array()
        .expect("efficiency rows");
    let row = rows
        .iter()
        .find(|r| r["server"] == server && r["mode"].as_str().is_some_and(|m| m.contains("keep")))
        .unwrap_or_else(|| panic!("no keep-alive efficiency row for {server}: {rows:?}"));
    let mut v: Vec<f64> = row["repeats"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["us_per_request"].as_f64())
        .collect();
    v.sort_by(f64::total_cmp);
    assert!(!v.is_empty(), "{row}");
    v[v.len() / 2]
}

/// Timed: it asserts a difference of performance, which the shared 2-core machine's noise
/// hides, so it is not part of `scripts/test`. Here it passed 2 of 4 tries on a quiet
/// machine (load 0.1): the tiny profile's 0.5 s efficiency runs of one build moved 62..124
/// µs per request (at 2,000/s: 0 of 4), more than the fifth added. Run it by hand:
/// `cargo test --test lab_compare -- --ignored --nocapture`.
#[test]
#[ignore = "timed: run on a quiet machine (cargo test --test lab_compare -- --ignored)"]
fn compare_reports_the_slowed_model_and_not_the_other() {
    let base: PathBuf = std::env::temp_dir().join(format!("iolab-compare-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let cmp = base.join("cmp");
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut cost = None;
    for (i, slowed) in TURNS.into_iter().enumerate() {
        let dir = base.join(format!("run{i}"));
        lab(&dir, slowed.then(|| format!("epoll:{}", cost.unwrap())));
        if cost.is_none() {
            let us = us_per_request(&json(&dir.join("results.json")), "epoll");
            cost = Some((us * 0.2).round().max(1.0) as u64);
        }
        if slowed { &mut b } else { &mut a }.push(dir.display().to_string());
    }
    let cost = cost.unwrap();

    let out = run_ok(
        Command::new(env!("CARGO_BIN_EXE_iolab"))
            .args(["lab", "--json", "--compare"])
            .args([a.join(","), b.join(",")])
            .arg("--out")
            .arg(&cmp),
    );
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--compare --json");
    assert!(cmp.join("compare.html").is_file());
    let rows = c["rows"].as_array().expect("rows");
    let of = |server: &str| -> Vec<&serde_json::Value> {
        rows.iter().filter(|r| r["server"] == server).collect()
    };
    let significant = |r: &serde_json::Value| r["verdict"] == "better" || r["verdict"] == "worse";
    let summary = |rs: &[&serde_json::Value]| -> String {
        rs.iter()
            .map(|r| {
                format!(
                    "{} {} {} {:?}",
                    r["point"],
                    r["metric"],
                    r["verdict"],
                    r["ratio"].as_f64()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };

    // epoll's CPU per request: worse, by about the fifth added.
    let epoll = of("epoll");
    let cpu: Vec<_> = epoll
        .iter()
        .filter(|r| r["metric"] == "us_per_request")
        .copied()
        .collect();
    assert!(
        !cpu.is_empty(),
        "no Figure 1b rows compared:\n{}",
        summary(&epoll)
    );
    let keepalive = cpu
        .iter()
        .find(|r| r["point"].as_str().is_some_and(|p| p.contains("keep")))
        .expect("epoll's keep-alive efficiency row");
    assert_eq!(
        keepalive["verdict"],
        "worse",
        "epoll made {cost} µs (a fifth of the first run's) costlier per request:\n{}",
        summary(&cpu)
    );
    let ratio = keepalive["ratio"].as_f64().unwrap();
    assert!(
        (1.05..1.6).contains(&ratio),
        "B/A {ratio:.2} for a 20% slowdown"
    );

    // poll, the same build in both runs: most of its figures show no difference.
    let poll = of("poll");
    assert!(poll.len() >= 10, "{}", summary(&poll));
    let flagged = poll.iter().filter(|r| significant(r)).count();
    // "Most": closed-loop throughput and latency move with the shared machine (under a
    // fuzzer on the other core, 6 of 23 poll figures came out different even in turns);
    // the CPU per request at a fixed rate, the figure the slowdown is judged on, did not.
    assert!(
        flagged * 2 < poll.len(),
        "{flagged} of {} figures of an unchanged model judged different:\n{}",
        poll.len(),
        summary(&poll)
    );
    assert!(
        poll.iter().all(|r| r["verdict"] != "n too small"),
        "6 repeats a side can show a difference:\n{}",
        summary(&poll)
    );
    eprintln!(
        "lab --compare: epoll +{cost} µs a request: keep-alive CPU per request B/A {ratio:.2} ({}); poll: {flagged} of {} figures different",
        keepalive["verdict"],
        poll.len()
    );
    let _ = std::fs::remove_dir_all(&base);
}

/// A run whose every server fails to start writes its report and exits non-zero with the
/// reason (it exited 0, and the compare above took the empty run for a result).
#[test]
fn a_run_that_measured_nothing_fails() {
    let out = std::env::temp_dir().join(format!("iolab-nothing-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let o = Command::new(env!("CARGO_BIN_EXE_iolab"))
        .args([
            "lab",
            "--profile",
            "tiny",
            "--models",
            "poll",
            "--peers",
            "none",
        ])
        .args(["--no-micro", "--no-efficiency", "--out"])
        .arg(&out)
        .env("IOLAB_TEST_CPU_PER_REQUEST_US", "not-a-number")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "exit 0 with every server failed:\n{stderr}"
    );
    assert!(
        stderr.contains("nothing measured")
            && stderr.contains("poll")
            && stderr.contains("not-a-number"),
        "{stderr}"
    );
    assert!(out.join("results.json").is_file() && out.join("index.html").is_file());
    let _ = std::fs::remove_dir_all(&out);
}
