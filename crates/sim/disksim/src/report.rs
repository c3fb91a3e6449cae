//! What every report of a run carries: the machine it ran on, and the JSON file it is
//! written to (`--json` of each `iolab disksim` command).

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

/// This machine in one line: CPU model (from `/proc/cpuinfo`), cores, architecture.
pub fn machine() -> String {
    let cpu = iolab_sys::host::cpu_model().unwrap_or_else(|| "unknown CPU".into());
    let cores = iolab_sys::host::cpus();
    format!("{cpu}, {cores} cores, {}", std::env::consts::ARCH)
}

/// Writes `value` as pretty JSON to `path` when one was asked for (`--json`).
pub fn write_json(path: Option<&Path>, value: &impl Serialize) -> Result<()> {
    if let Some(p) = path {
        std::fs::write(p, serde_json::to_string_pretty(value)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_line_names_cores_and_architecture() {
        let m = machine();
        assert!(m.contains(" cores, "), "{m}");
        assert!(m.ends_with(std::env::consts::ARCH), "{m}");
    }

    #[test]
    fn json_is_written_only_when_asked_for() {
        let dir = iolab_sys::testing::tempdir("disksim-report-json").unwrap();
        let p = dir.path().join("out.json");
        write_json(None, &serde_json::json!({"a": 1})).unwrap();
        assert!(!p.exists());
        write_json(Some(&p), &serde_json::json!({"a": 1})).unwrap();
        let back: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(back["a"], 1);
        assert!(write_json(Some(&dir.path().join("no/such/dir/x.json")), &1).is_err());
    }
}
