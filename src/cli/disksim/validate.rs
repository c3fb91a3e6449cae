//! `iolab disksim validate`: real fio against the simulator on this machine.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use iolab_disksim::report::{machine, write_json};
use iolab_disksim::{calibrate, fio, linuxval};

use super::{check_replaceable, on_bar, progress_bar, scratch_device};

#[derive(Args, Debug)]
pub struct LinuxValidateArgs {
    /// Directory on the device to test (files are created there and removed at the end).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Measure on a zram device of this size (e.g. 2g; fio size syntax) made for the run
    /// instead of --dir: ext4 on it, mounted on a new directory, all removed at the end (also
    /// on an error or Ctrl-C; a killed run's leftovers are removed by the next). zram's speed
    /// is the CPU's and memory's, the steadiest block device a kernel without modules
    /// offers. Needs root.
    #[arg(long, value_name = "SIZE", conflicts_with = "dir")]
    pub zram: Option<String>,
    /// Measured-device config from an earlier `calibrate --out` (default: run
    /// `calibrate` first, separately from the validation runs).
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Smaller suite (32 and 512 KiB, 3 runs, 1 s jobs, 64 MiB cgroup): about 5 minutes.
    #[arg(long)]
    pub quick: bool,
    /// Only the jobs whose name contains one of these (comma-separated), e.g. randread-32k.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Runs of each job (default 3 with --quick, 5 without), plus one with fio's per-request
    /// latency log for the latency distribution.
    #[arg(long)]
    pub runs: Option<u32>,
    /// Seconds per job (default 1 with --quick, 3 without).
    #[arg(long)]
    pub runtime: Option<f64>,
    /// Cold-case file size (fio size syntax; default 96m with --quick, 256m without).
    #[arg(long)]
    pub file_size: Option<String>,
    /// Memory cgroup limit (fio size syntax; default 64m with --quick, 128m without).
    #[arg(long)]
    pub mem: Option<String>,
    /// Parent directory of the cgroup (default: the memory controller's root).
    #[arg(long)]
    pub cgroup_root: Option<PathBuf>,
    /// Write every job's real and simulated figures (and the machine) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// HTML report (table, throughput bars, latency CDFs).
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Fail if the mean throughput error exceeds the value recorded in this JSON
    /// ({"mean_abs_error_pct": X, "spread_pct": S}) by more than the run-to-run spread.
    #[arg(long)]
    pub check: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// The simulator alone: no fio, no cgroup, no file created; prints each job's simulated
    /// figures and simulated time / wall time (the fastest of `--runs` repeats, default 1).
    /// Needs --calibration.
    #[arg(long, requires = "calibration", conflicts_with_all = ["html", "check"])]
    pub sim_only: bool,
}

/// How old a calibration may be before `validate` warns: on the shared VM this was built
/// on, the device's latencies and the host's copy costs drift within hours (28 Nov, seven
/// minutes apart: the 36 jobs 11.8% off on average with a calibration just taken, 31.4%
/// with one taken 1 h 45 min before; crates/sim/disksim/README.md).
const CALIBRATION_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// A warning when the calibration file `path` was written more than
/// [`CALIBRATION_MAX_AGE`] before `now` (its modification time).
fn stale_calibration(path: &std::path::Path, now: std::time::SystemTime) -> Option<String> {
    let written = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
    let age = now.duration_since(written).ok()?;
    (age > CALIBRATION_MAX_AGE).then(|| {
        let mins = age.as_secs() / 60;
        format!(
            "the calibration {} was written {} h {:02} min ago: this machine's device and copy \
             costs may have moved since (they drift within hours on a shared VM); for a \
             validation that measures the model, calibrate again just before",
            path.display(),
            mins / 60,
            mins % 60
        )
    })
}

pub(super) fn linux_validate_cmd(a: LinuxValidateArgs) -> Result<()> {
    let mut settings = linuxval::Settings::new(a.quick);
    if let Some(r) = a.runs {
        if r == 0 || r > 100 {
            bail!("--runs must be within 1..=100");
        }
        settings.runs = r;
    }
    if let Some(t) = a.runtime {
        if !(t > 0.0 && t <= 3600.0) {
            bail!("--runtime must be within (0, 3600] seconds");
        }
        settings.runtime_ms = (t * 1000.0) as u64;
    }
    let size =
        |s: &str, what: &str| fio::parse_size(s).map_err(|e| anyhow::anyhow!("{what} {s}: {e}"));
    if let Some(m) = &a.mem {
        settings.cgroup_limit = size(m, "--mem")?.max(16 << 20);
        settings.warm_file = settings.cgroup_limit * 3 / 8;
    }
    if let Some(f) = &a.file_size {
        settings.cold_file = size(f, "--file-size")?.max(1 << 20);
    }
    if let Some(p) = &a.json {
        check_replaceable(p, "{")?;
    }
    let flag = calibrate::install_interrupt_flag()?;
    let (_zram, dir) = if a.sim_only {
        (None, a.dir.clone())
    } else {
        scratch_device(a.zram.as_deref(), &a.dir)?
    };
    let a = LinuxValidateArgs { dir, ..a };
    let bar = progress_bar(a.quiet);
    if a.sim_only {
        let cal = a
            .calibration
            .as_deref()
            .expect("clap requires --calibration");
        let model = linuxval::Model::load(cal, &a.dir)?;
        let v = linuxval::simulate_suite(
            &a.dir,
            &model,
            &settings,
            &a.only,
            a.runs.unwrap_or(1),
            &flag,
            &mut on_bar(&bar),
        );
        bar.finish_and_clear();
        let v = v?;
        print!("{}", linuxval::sim_only_table(&v));
        return write_json(
            a.json.as_deref(),
            &serde_json::json!({
                "machine": machine(),
                "calibration": cal.display().to_string(),
                "settings": settings,
                "results": v,
            }),
        );
    }
    let _cal_dir;
    let cal_path = match &a.calibration {
        Some(p) => {
            if let Some(w) = stale_calibration(p, std::time::SystemTime::now()) {
                eprintln!("warning: {w}");
            }
            p.clone()
        }
        None => {
            println!("no --calibration: calibrating first (a separate run; --quick)");
            let c = calibrate::calibrate(&a.dir, true, &flag, &mut |d, t, w| {
                bar.set_length(t);
                bar.set_position(d);
                bar.set_message(format!("calibrate: {w}"));
            })?;
            print!("{}", calibrate::table(&c));
            let d = iolab_sys::testing::tempdir("disksim-validate-cal")?;
            let p = d.path().join("calibration.toml");
            std::fs::write(&p, calibrate::config_toml(&c))?;
            _cal_dir = d;
            p
        }
    };
    let model = linuxval::Model::load(&cal_path, &a.dir)?;
    let r = linuxval::validate(
        &a.dir,
        &model,
        settings,
        a.cgroup_root.as_deref(),
        &a.only,
        &flag,
        &mut on_bar(&bar),
    );
    bar.finish_and_clear();
    let r = r?;
    print!("{}", linuxval::table(&r));
    write_json(a.json.as_deref(), &r)?;
    if let Some(p) = &a.html {
        check_replaceable(p, "<!doctype html>")?;
        std::fs::write(p, linuxval::html(&r))
            .with_context(|| format!("writing {}", p.display()))?;
        println!("report: {}", p.display());
    }
    if let Some(p) = &a.check {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let b: linuxval::Baseline =
            serde_json::from_str(&text).with_context(|| format!("{}", p.display()))?;
        println!("{}", linuxval::check(&r, &b)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_old_calibration_is_warned_about_and_a_fresh_one_is_not() {
        let dir = iolab_sys::testing::tempdir("disksim-stale-cal").unwrap();
        let p = dir.path().join("cal.toml");
        std::fs::write(&p, "").unwrap();
        let now = std::time::SystemTime::now();
        assert_eq!(stale_calibration(&p, now), None);
        let later = now + std::time::Duration::from_secs(2 * 3600 + 5 * 60);
        let w = stale_calibration(&p, later).expect("two hours old");
        assert!(w.contains("2 h 05 min ago"), "{w}");
        assert_eq!(
            stale_calibration(&dir.path().join("missing.toml"), later),
            None
        );
    }
}
