//! A started server's logs: the start marker, the tail shown when it fails.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context;

/// The tail of a target's stderr (else its stdout) since its last start marker.
pub fn log_tail(stderr: &Path, stdout: &Path) -> String {
    let since_marker = |p: &Path| {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        match text.rfind(START_MARKER) {
            Some(i) => text[i..].lines().skip(1).collect::<Vec<_>>().join("\n"),
            None => text,
        }
    };
    let err = since_marker(stderr);
    let (which, text) = if err.trim().is_empty() {
        ("stdout", since_marker(stdout))
    } else {
        ("stderr", err)
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    match lines.len() {
        0 => "(nothing on stderr or stdout)".into(),
        n => format!("{which}: {}", lines[n.saturating_sub(5)..].join(" | ")),
    }
}

/// The line the lab writes into a target's logs before each start.
pub const START_MARKER: &str = "--- iolab lab: start ";

/// Appends the start marker and the command to both logs; returns the open files.
pub fn open_logs(
    stdout: &Path,
    stderr: &Path,
    command: &str,
) -> anyhow::Result<(std::fs::File, std::fs::File)> {
    let open = |p: &Path| -> anyhow::Result<std::fs::File> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .with_context(|| format!("opening {}", p.display()))?;
        writeln!(f, "{START_MARKER}(unix {}): sh -c {command:?}", unix_now())?;
        Ok(f)
    };
    Ok((open(stdout)?, open(stderr)?))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The reason in a failed benchmark's output: its "Error:" line (and the causes after it),
/// else its last lines.
pub fn why(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if let Some(i) = lines
        .iter()
        .position(|l| l.starts_with("Error:") || l.contains("panicked at"))
    {
        return lines[i..]
            .iter()
            .take_while(|l| !l.starts_with("Stack backtrace") && !l.starts_with("note: run with"))
            .take(4)
            .copied()
            .collect::<Vec<_>>()
            .join(" | ");
    }
    let n = lines.len();
    lines[n.saturating_sub(3)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_tail_is_of_the_last_start() {
        let dir = iolab_sys::testing::tempdir("lab-byo-logs").unwrap();
        let (out, err) = (dir.path().join("o"), dir.path().join("e"));
        let (_, mut e) = open_logs(&out, &err, "a").unwrap();
        writeln!(e, "old failure").unwrap();
        let (_, mut e) = open_logs(&out, &err, "b").unwrap();
        assert_eq!(log_tail(&err, &out), "(nothing on stderr or stdout)");
        writeln!(e, "bind: address in use").unwrap();
        assert_eq!(log_tail(&err, &out), "stderr: bind: address in use");
        // Both starts are kept.
        let text = std::fs::read_to_string(&err).unwrap();
        assert_eq!(text.matches(START_MARKER).count(), 2);
    }

    #[test]
    fn failure_reason_skips_the_backtrace() {
        let log = "table...\nError: micro echo is not written yet\n\nStack backtrace:\n   0: anyhow::x\n  19: _start\n";
        assert_eq!(why(log), "Error: micro echo is not written yet");
        let p = "thread 'main' panicked at src/x.rs:3:5:\nboom\nnote: run with `RUST_BACKTRACE=1`";
        assert_eq!(why(p), "thread 'main' panicked at src/x.rs:3:5: | boom");
        assert_eq!(why("a\nb\nc\nd"), "b | c | d");
        assert_eq!(why(""), "");
    }
}
