//! The Microbenchmarks section: each `iolab micro NAME --json` run as a child process, so a
//! benchmark that pins threads, changes limits, crashes or hangs cannot disturb the lab;
//! it is killed at its time limit and its failure is shown in the report.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

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
    let mut cmd = Command::new(exe);
    cmd.arg("micro").arg(name);
    if quick {
        cmd.arg("--quick");
    }
    cmd.arg("--json")
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    // SAFETY: only a raw prctl between fork and exec: the benchmark dies with the lab.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
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
    let tail = || {
        let s = std::fs::read_to_string(&log_path).unwrap_or_default();
        let lines: Vec<&str> = s.lines().rev().take(3).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    };
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
