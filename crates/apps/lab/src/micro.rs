//! The Microbenchmarks section: each `iolab micro NAME --json` run as a child process, so a
//! benchmark that pins threads, changes limits, crashes or hangs cannot disturb the lab;
//! it is killed at its time limit and its failure is shown in the report.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// `iolab micro NAME`: one benchmark, the child role the lab runs it in. The binary's
/// command line parses `to_args()` back into the same spec (src/cli/micro.rs,
/// `MicroArgs::to_spec`, with the round-trip test).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicroSpec {
    pub name: String,
    /// Seconds instead of minutes (`--quick`).
    pub quick: bool,
    /// Write the results as JSON to this file (`--json`).
    pub json: Option<PathBuf>,
}

impl MicroSpec {
    /// The arguments after the program name: `micro NAME [--quick] [--json FILE]`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["micro".into(), self.name.clone().into()];
        if self.quick {
            a.push("--quick".into());
        }
        if let Some(p) = &self.json {
            a.push("--json".into());
            a.push(p.clone().into());
        }
        a
    }
}

/// Runs one micro and returns its JSON (the convention in `iolab_micro`).
pub fn run_one(
    name: &str,
    out: &Path,
    quick: bool,
    limit: Duration,
) -> anyhow::Result<serde_json::Value> {
    let dir = out.join("micro");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = dir.join(format!("{name}.json"));
    let log_path = dir.join(format!("{name}.log"));
    let _ = std::fs::remove_file(&json);
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let exe = std::env::current_exe().context("finding the iolab executable")?;
    let spec = MicroSpec {
        name: name.to_string(),
        quick,
        json: Some(json.clone()),
    };
    let mut cmd = Command::new(exe);
    cmd.args(spec.to_args())
        // A short error line in the report, not a backtrace.
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    // The benchmark dies with the lab.
    iolab_sys::process::die_with_parent(&mut cmd, libc::SIGKILL);
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting iolab micro {name}"))?;
    let pgid = child.id() as i32;
    crate::server::register(pgid);
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if t0.elapsed() > limit => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => {
                crate::server::signal_group(pgid, libc::SIGKILL);
                let _ = child.wait();
                crate::server::unregister(pgid);
                bail!("waiting for iolab micro {name}: {e}");
            }
        }
    };
    // Whatever it left in its group goes too.
    crate::server::signal_group(pgid, libc::SIGKILL);
    let _ = child.wait();
    crate::server::unregister(pgid);
    let tail = || crate::server::logs::why(&std::fs::read_to_string(&log_path).unwrap_or_default());
    match status {
        None => bail!(
            "killed after {:.0} s (its time limit): {}",
            limit.as_secs_f64(),
            tail()
        ),
        Some(s) if !s.success() => bail!("exited with {s}: {}", tail()),
        Some(_) => {}
    }
    let text =
        std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_args() {
        let mut m = MicroSpec {
            name: "queue".into(),
            quick: true,
            json: Some("/r/micro/queue.json".into()),
        };
        assert_eq!(
            m.to_args(),
            ["micro", "queue", "--quick", "--json", "/r/micro/queue.json"].map(OsString::from)
        );
        m.quick = false;
        m.json = None;
        assert_eq!(m.to_args(), ["micro", "queue"].map(OsString::from));
    }
}
