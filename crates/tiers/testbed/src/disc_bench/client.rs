//! The client's side of a run, from the client's namespace on the client's CPU: the check
//! of one answer's bytes, then wrk's closed loop or `iolab load`'s open loop.

use super::net::Net;
use super::DiscOpts;
use crate::bench::parse_wrk;
use crate::stack::enter_ns;
use anyhow::{bail, Context};
use serde_json::Value;
use std::process::Command;
use std::time::Instant;

/// GETs `url` once from the client's namespace (never through a proxy); what went wrong
/// when the bytes are not the file's.
pub(super) fn check_bytes(net: &Net, url: &str, want: &[u8]) -> Option<String> {
    let mut c = Command::new("curl");
    c.args(["-s", "-S", "--noproxy", "*", "-m", "20", url]);
    if let Err(e) = enter_ns(&mut c, &net.ns[0]) {
        return Some(format!("{e:#}"));
    }
    let t0 = Instant::now();
    let out = match c.output() {
        Ok(o) => o,
        Err(e) => return Some(format!("running curl: {e}")),
    };
    if !out.status.success() {
        return Some(format!(
            "curl: {} after {:.1} s with {} of {} bytes: {}",
            out.status,
            t0.elapsed().as_secs_f64(),
            out.stdout.len(),
            want.len(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    if out.stdout != want {
        let first = out.stdout.iter().zip(want).position(|(a, b)| a != b);
        return Some(format!(
            "{} bytes received ({} expected), first difference at {:?}",
            out.stdout.len(),
            want.len(),
            first
        ));
    }
    None
}

/// Socket-error timeouts in wrk's output.
pub(super) fn wrk_timeouts(out: &str) -> u64 {
    out.lines()
        .find_map(|l| l.trim().strip_prefix("Socket errors:"))
        .and_then(|r| {
            r.split(',')
                .find(|p| p.trim().starts_with("timeout"))
                .and_then(|p| p.split_whitespace().last())
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// Runs `program args` from the client's namespace on the client's CPU, bounded to the run
/// and 30 s more; None when the bound killed it (the run is counted as stalled).
fn client_output(
    net: &Net,
    o: &DiscOpts,
    name: &str,
    program: &std::ffi::OsStr,
    args: &[impl AsRef<std::ffi::OsStr>],
) -> anyhow::Result<Option<std::process::Output>> {
    let bound = (o.seconds + 30).to_string();
    let mut c = Command::new("timeout");
    c.args(["-k", "5", &bound, "taskset", "-c", &o.client_cpus])
        .arg(program)
        .args(args);
    enter_ns(&mut c, &net.ns[0])?;
    let out = c.output().with_context(|| format!("running {name}"))?;
    match out.status.code() {
        Some(0) => Ok(Some(out)),
        Some(124) | Some(137) | None => Ok(None),
        Some(_) => bail!("{name} failed: {}", String::from_utf8_lossy(&out.stderr)),
    }
}

/// What a client run gave: (requests, p50, p99, errors, stalled).
pub(super) type ClientRun = (u64, f64, f64, u64, u64);

/// A run the bound killed.
const KILLED: ClientRun = (0, f64::NAN, f64::NAN, 0, 1);

/// Runs wrk from the client's namespace.
fn wrk(net: &Net, url: &str, o: &DiscOpts) -> anyhow::Result<ClientRun> {
    let args = [
        "-t1".to_string(),
        format!("-c{}", o.connections),
        format!("-d{}s", o.seconds),
        "--latency".into(),
        "--timeout".into(),
        "5s".into(),
        url.into(),
    ];
    let Some(out) = client_output(net, o, "wrk (Debian package wrk)", "wrk".as_ref(), &args)?
    else {
        return Ok(KILLED);
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let (req, p50, p99, errors) = parse_wrk(&text)?;
    let timeouts = wrk_timeouts(&text);
    Ok((req, p50, p99, errors.saturating_sub(timeouts), timeouts))
}

/// The client's run: wrk's closed loop, or `iolab load`'s open loop at `o.rate`.
pub(super) fn client_run(net: &Net, url: &str, o: &DiscOpts) -> anyhow::Result<ClientRun> {
    match o.rate {
        None => wrk(net, url, o),
        Some(rate) => load(net, url, o, rate),
    }
}

/// Runs `iolab load --rate` from the client's namespace, as [`wrk`] runs wrk.
fn load(net: &Net, url: &str, o: &DiscOpts, rate: f64) -> anyhow::Result<ClientRun> {
    let spec = iolab_load::spec::LoadSpec {
        connections: o.connections,
        duration: std::time::Duration::from_secs(o.seconds),
        keepalive: true,
        rate: Some(rate),
        timeout: std::time::Duration::from_secs(5),
        threads: 1,
        json: Some("-".into()),
        quiet: true,
        ..iolab_load::spec::LoadSpec::new(url)
    };
    let args = spec.to_args();
    match client_output(net, o, "iolab load", o.exe.as_os_str(), &args)? {
        Some(out) => parse_load(&String::from_utf8_lossy(&out.stdout)),
        None => Ok(KILLED),
    }
}

/// `iolab load --json -`'s report as (requests, p50, p99, errors, stalled): the requests
/// answered 2xx, the errors other than timeouts and unfinished requests, and those two
/// (requests that waited too long, or were still due when the run ended) as stalled.
pub(super) fn parse_load(text: &str) -> anyhow::Result<ClientRun> {
    let v: Value = serde_json::from_str(text).context("iolab load's JSON report")?;
    let n = |k: &str| {
        v[k].as_u64()
            .with_context(|| format!("iolab load's report has no {k}"))
    };
    let ms = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let timeouts = v["errors"]["timeout"].as_u64().unwrap_or(0);
    let unfinished = n("unfinished")?;
    let errors = n("error_count")?.saturating_sub(timeouts + unfinished);
    Ok((
        n("ok")?,
        ms("p50_ms"),
        ms("p99_ms"),
        errors,
        timeouts + unfinished,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `iolab load --json`'s report: 2xx answers counted as requests, timeouts and requests
    /// still due at the end as stalled, the other errors as errors.
    #[test]
    fn the_open_loop_report_is_read_as_wrk_s() {
        let text = r#"{"requests": 1805, "ok": 1790, "errors": {"timeout": 3, "unfinished": 7,
            "reset": 5}, "error_count": 15, "unfinished": 7, "p50_ms": 0.41, "p99_ms": 2.5,
            "rps": 596.7}"#;
        let (req, p50, p99, errors, stalled) = parse_load(text).unwrap();
        assert_eq!((req, errors, stalled), (1790, 5, 10));
        assert_eq!((p50, p99), (0.41, 2.5));
        assert!(parse_load("not json").is_err());
        assert!(
            parse_load(r#"{"ok": 1}"#).is_err(),
            "a report without its counts"
        );
    }

    #[test]
    fn wrk_timeouts_are_counted_apart() {
        let out = "  Latency Distribution\n     50%  1.00ms\n     99%  9.00ms\n  12 requests in 1.00s, 1 MB read\n  Socket errors: connect 0, read 1, write 0, timeout 4\n";
        assert_eq!(wrk_timeouts(out), 4);
        assert_eq!(wrk_timeouts("  12 requests in 1.00s\n"), 0);
    }
}
