//! `iolab load` end to end through its argument parser: the CSV log and the JSON report.

mod common;

use clap::Parser;
use common::{Mode, TestServer};
use iolab_load::cli::LoadArgs;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    load: LoadArgs,
}

fn parse(args: &[&str]) -> Result<LoadArgs, clap::Error> {
    Cli::try_parse_from(std::iter::once("iolab-load").chain(args.iter().copied())).map(|c| c.load)
}

#[test]
fn log_and_json_files() {
    let server = TestServer::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.csv");
    let json = dir.path().join("report.json");
    let url = server.url("/x");
    let args = parse(&[
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
    ])
    .unwrap();
    assert!(
        !args.keepalive,
        "a new connection per request is the default"
    );
    iolab_load::cli::run(args).unwrap();

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

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
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
    assert_eq!(v["url"], format!("http://{}/x", server.addr));
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
    let server = TestServer::start(Mode::NotFound);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let url = server.url("/");
    let args = parse(&[&url, "-n", "4", "--quiet", "--json", json.to_str().unwrap()]).unwrap();
    iolab_load::cli::run(args).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["errors"]["non2xx"], 4);
    assert_eq!(v["ok"], 0);
}

#[test]
fn bad_arguments_are_refused_with_a_message() {
    assert!(parse(&["http://127.0.0.1:1/", "-n", "5", "-d", "5s"]).is_err());
    assert!(parse(&["http://127.0.0.1:1/", "--keepalive", "--no-keepalive"]).is_err());
    assert!(parse(&["http://127.0.0.1:1/", "-d", "five"]).is_err());
    assert!(parse(&["http://127.0.0.1:1/", "--source", "not-an-ip"]).is_err());
    let args = parse(&["ftp://example.com/"]).unwrap();
    let err = iolab_load::cli::run(args).unwrap_err().to_string();
    assert!(err.contains("http://"), "{err}");
    let args = parse(&["http://127.0.0.1:1/", "-c", "0"]).unwrap();
    let err = iolab_load::cli::run(args).unwrap_err().to_string();
    assert!(err.contains("connections"), "{err}");
}

#[test]
fn defaults_and_options_map_to_the_config() {
    let a = parse(&[
        "http://[::1]:8080/p",
        "-c",
        "7",
        "-d",
        "2s",
        "--keepalive",
        "--rate",
        "100",
        "--timeout",
        "250ms",
        "--source",
        "::1",
        "--threads",
        "3",
        "--cpu",
        "1",
    ])
    .unwrap();
    let c = a.to_config().unwrap();
    assert_eq!(c.connections, 7);
    assert_eq!(c.requests, None);
    assert_eq!(c.duration, Some(std::time::Duration::from_secs(2)));
    assert!(c.keepalive);
    assert_eq!(c.rate, Some(100.0));
    assert_eq!(c.timeout, std::time::Duration::from_millis(250));
    assert_eq!(
        c.source_addrs,
        vec!["::1".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!((c.threads, c.pin_cpu), (3, Some(1)));
    assert!(!c.keep_records);
    let c = parse(&["http://127.0.0.1/"]).unwrap().to_config().unwrap();
    assert_eq!(
        (c.requests, c.connections, c.keepalive),
        (Some(1), 1, false)
    );
}
