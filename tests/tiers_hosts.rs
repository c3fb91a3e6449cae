//! End to end: `iolab tiers up --hosts` over four hosts that are network namespaces on one
//! bridge, each running Debian's sshd with a key this test makes (client, FE, IS, BE), then
//! `iolab tiers bench --quick` through them, `down`, and a supervisor killed by SIGKILL
//! whose nodes end with their leases and whose directories the next `down` removes.
//! The hosts share this machine's CPUs: this proves the mechanics, not seed 004's figures.
//! Needs root (namespaces), openssh-server, nginx, wrk and curl.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;
#[path = "common/ssh_rig.rs"]
mod ssh_rig;

use ssh_rig::SshRig as Rig;

/// The testbed's state lives in a directory of the test's own (`IOLAB_TIERS_DIR`), so a
/// testbed a user has up on this machine is neither seen nor touched. Dropped before the
/// rig (declared after it), it brings the testbed down also when an assertion fails: with
/// the hosts' links gone first, their sshd sessions, and the nodes under them, would wait
/// for a controller they can no longer hear from.
struct Tiers {
    state: PathBuf,
}

impl Drop for Tiers {
    fn drop(&mut self) {
        let _ = self.iolab(&["tiers", "down"]);
    }
}

impl Tiers {
    fn iolab(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_iolab"))
            .args(args)
            .env("IOLAB_TIERS_DIR", &self.state)
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.iolab(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "iolab {args:?}: {text}");
        text
    }

    fn supervisor(&self) -> u32 {
        let state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.state.join("state.json")).unwrap()).unwrap();
        state["supervisor_pid"].as_u64().unwrap() as u32
    }
}

/// The tiers inventory: client on the first host, FE, IS and BE on the others; the BE gets
/// a copy of iolab and the ODB library (the `copy = true` path), the others run this
/// build's binary in place.
fn inventory(rig: &Rig) -> PathBuf {
    let exe = env!("CARGO_BIN_EXE_iolab");
    let at = format!("iolab = \"{exe}\"");
    let text = format!(
        "[client]\n{}\n[fe]\n{}\n[is]\n{}\n[be]\n{}",
        rig.host_lines(0, "tc", ""),
        rig.host_lines(1, "tfe", &at),
        rig.host_lines(2, "tis", &at),
        rig.host_lines(3, "tbe", "copy = true"),
    );
    let path = rig.dir.path().join("tiers-hosts.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Processes of a hosts testbed: every node runs in, and names, a run directory
/// `/tmp/iolab-tiers-<supervisor pid>-...`.
fn nodes_running(supervisor: u32) -> Vec<String> {
    let needle = format!("/tmp/iolab-tiers-{supervisor}-");
    common::processes(|l| l.contains(&needle))
}

fn run_dirs(supervisor: u32) -> Vec<PathBuf> {
    let prefix = format!("iolab-tiers-{supervisor}-");
    std::fs::read_dir("/tmp")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < limit, "{what} after {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn have_tools() -> bool {
    for (tool, package) in [("nginx", "nginx"), ("wrk", "wrk"), ("curl", "curl")] {
        if iolab_sys::testing::require_tool(tool, package).is_none() {
            return false;
        }
    }
    true
}

fn fetch(url: &str) -> Vec<u8> {
    let out = Command::new("curl")
        .args(["-s", "-f", "-m", "10", url])
        .output()
        .unwrap();
    assert!(out.status.success(), "GET {url}: {out:?}");
    out.stdout
}

fn check_bench(json: &Path, rig: &Rig) {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    let hosts = v["hosts"].as_array().expect("the hosts of the run");
    let roles: Vec<&str> = hosts.iter().map(|h| h["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["client", "fe", "is", "be"], "{hosts:?}");
    for (h, (_, addr)) in hosts.iter().zip(&rig.hosts) {
        assert_eq!(h["address"].as_str().unwrap(), addr.to_string(), "{h}");
        assert!(h["machine"]["kernel"].is_string(), "{h}");
    }
    let sizes = v["sizes"].as_array().unwrap();
    assert_eq!(sizes.len(), 2, "{sizes:?}");
    for row in sizes {
        for mode in ["vanilla", "odb"] {
            let m = &row[mode];
            assert!(m["rps"]["median"].as_f64().unwrap() > 0.0, "{mode}: {m}");
            // the IS's CPU read on its host, per request
            assert!(
                m["is_cpu_us_per_req"]["median"].as_f64().unwrap() > 0.0,
                "{mode}: {m}"
            );
        }
    }
    // A 64 KiB answer crosses the IS as one page of real bytes and the rest by reference it
    // never fetches (seed 004: 93.75%), on hosts as in namespaces.
    let big = sizes.iter().find(|r| r["size"] == 65536).unwrap();
    let by_ref = big["is_payload_by_reference_pct"].as_f64().unwrap();
    assert!((93.0..=100.5).contains(&by_ref), "{big}");
}

#[test]
fn tiers_up_bench_and_down_over_four_hosts() {
    if !have_tools() {
        return;
    }
    let Some(rig) = Rig::new("th", 4) else {
        return;
    };
    let tiers = Tiers {
        state: rig.dir.path().join("state"),
    };
    let hosts = inventory(&rig);
    let hosts = hosts.to_str().unwrap();
    let up = tiers.ok(&["tiers", "up", "--hosts", hosts]);
    let supervisor = tiers.supervisor();
    let status = tiers.ok(&["tiers", "status"]);
    assert!(status.contains("testbed up on hosts"), "{up}\n{status}");
    for name in ["tc", "tfe", "tis", "tbe"] {
        assert!(status.contains(name), "{status}");
    }
    // The testbed's own chain answers at the FE's host address with the BE's file.
    let fe = rig.hosts[1].1;
    assert_eq!(
        fetch(&format!("http://{fe}:18080/f65536")),
        iolab_tiers::testutil::payload(65536)
    );
    assert!(!nodes_running(supervisor).is_empty(), "no node running");

    let json = rig.dir.path().join("bench.json");
    let html = rig.dir.path().join("bench.html");
    let out = tiers.ok(&[
        "tiers",
        "bench",
        "--quick",
        "--sizes",
        "1024,65536",
        "--seconds",
        "1",
        "--json",
        json.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
        "--no-chromium",
    ]);
    assert!(out.contains("on the hosts of `up --hosts`"), "{out}");
    check_bench(&json, &rig);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("id='hosts'") && page.contains("<td>tbe</td>"),
        "the report names the hosts"
    );
    assert!(
        !page.contains("network namespace"),
        "the report says where the tiers ran"
    );
    // --disc needs links of its own: refused with the reason, nothing started.
    let disc = tiers.iolab(&["tiers", "bench", "--disc", "--no-chromium"]);
    assert!(!disc.status.success());
    assert!(String::from_utf8_lossy(&disc.stderr).contains("namespaces only"));

    tiers.ok(&["tiers", "down"]);
    wait_until(Duration::from_secs(15), "nodes left running", || {
        nodes_running(supervisor).is_empty()
    });
    assert!(
        run_dirs(supervisor).is_empty(),
        "{:?}",
        run_dirs(supervisor)
    );
    assert!(!iolab_sys::process::exists(supervisor));

    // The supervisor killed: its nodes end with their leases; the next `down` removes
    // the directories it could not.
    tiers.ok(&["tiers", "up", "--hosts", hosts]);
    let supervisor = tiers.supervisor();
    assert!(!nodes_running(supervisor).is_empty(), "no node running");
    iolab_sys::process::signal(supervisor, libc::SIGKILL).unwrap();
    wait_until(
        Duration::from_secs(20),
        "nodes outlived their lease",
        || nodes_running(supervisor).is_empty(),
    );
    assert!(
        !run_dirs(supervisor).is_empty(),
        "the killed run's directories"
    );
    let down = tiers.ok(&["tiers", "down"]);
    assert!(
        run_dirs(supervisor).is_empty(),
        "{down}: {:?}",
        run_dirs(supervisor)
    );
}
