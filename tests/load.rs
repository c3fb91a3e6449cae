//! `iolab load` end to end, as a user runs it: the real binary against `iolab serve`, its CSV
//! log and its JSON report.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

const IOLAB: &str = env!("CARGO_BIN_EXE_iolab");

/// `iolab serve --model epoll` on a free port of loopback, serving `root`; killed on drop.
struct Served {
    child: Child,
    addr: String,
}

impl Served {
    fn start(root: &Path) -> Served {
        // The start line prints the address asked for, so ask for a port known to be free.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let mut child = Command::new(IOLAB)
            .args([
                "serve",
                "--model",
                "epoll",
                "--workers",
                "1",
                "--addr",
                &addr,
            ])
            .arg("--root")
            .arg(root)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start iolab serve");
        // "serving DIR on ADDR with model M (N workers)"
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains(&format!(" on {addr} ")), "{line:?}");
        // The line comes before the model binds: wait until it accepts.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "{addr} never accepted"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Served { child, addr }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn load(args: &[&str]) -> std::process::Output {
    let out = Command::new(IOLAB).arg("load").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "iolab load {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json_of(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn log_and_json_files() {
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::write(www.join("x"), b"hello").unwrap();
    let server = Served::start(&www);
    let log = dir.path().join("requests.csv");
    let json = dir.path().join("report.json");
    let url = server.url("/x");
    let out = load(&[
        &url,
        "-c",
        "3",
        "-n",
        "60",
        "--quiet",
        "--log",
        log.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.stdout.is_empty(), "--quiet printed a summary");

    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().next(), Some(iolab_load::stats::CSV_HEADER));
    let records = iolab_load::read_csv(&text).unwrap();
    assert_eq!(records.len(), 60);
    assert!(records
        .windows(2)
        .all(|w| w[0].scheduled_us <= w[1].scheduled_us));
    assert!(records
        .iter()
        .all(|r| r.status == Some(200) && r.error.is_none()));

    let v = json_of(&json);
    for key in [
        "requests",
        "ok",
        "errors",
        "elapsed_s",
        "rps",
        "bytes_per_s",
        "mean_ms",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "p999_ms",
        "p9999_ms",
        "max_ms",
        "syn_retries",
        "client_cpu_s",
        "schedule_lag_ms",
        "timeline",
        "warnings",
        "saturated",
        "connects",
        "url",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {v}");
    }
    assert_eq!(v["requests"], 60);
    assert_eq!(v["ok"], 60);
    // A new connection per request is the default.
    assert_eq!(v["keepalive"], false);
    assert_eq!(v["connects"], 60);
    assert_eq!(v["url"], url);
    let timeline = v["timeline"].as_array().unwrap();
    assert!(!timeline.is_empty());
    let total: u64 = timeline
        .iter()
        .map(|s| s["requests"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 60);
    assert!(timeline[0].get("mean_ms").is_some() && timeline[0].get("errors").is_some());
    // The report round-trips through serde (records are not part of the JSON).
    let back: iolab_load::LoadReport = serde_json::from_value(v).unwrap();
    assert_eq!(back.ok, 60);
    assert!(back.records.is_empty());
}

#[test]
fn errors_are_keyed_by_kind_in_the_json() {
    let dir = tempfile::tempdir().unwrap();
    let server = Served::start(dir.path());
    let json = dir.path().join("r.json");
    let url = server.url("/missing");
    load(&[&url, "-n", "4", "--quiet", "--json", json.to_str().unwrap()]);
    let v = json_of(&json);
    assert_eq!(v["errors"]["non2xx"], 4);
    assert_eq!(v["ok"], 0);
}

#[test]
fn the_summary_goes_to_stdout_and_json_to_dash_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x"), b"hello").unwrap();
    let server = Served::start(dir.path());
    let url = server.url("/x");
    let text = String::from_utf8(load(&[&url, "-n", "5"]).stdout).unwrap();
    assert!(
        text.starts_with(&format!(
            "{url}: closed loop, 1 clients, new connection per request"
        )),
        "{text}"
    );
    assert!(text.contains("  requests  5 in "), "{text}");
    let out = load(&[&url, "-n", "5", "--keepalive", "--json", "-"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["ok"].as_u64(), v["keepalive"].as_bool()),
        (Some(5), Some(true))
    );
}
