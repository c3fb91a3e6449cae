//! `iolab disksim ...` subcommands: their flags, turned into iolab-disksim's typed calls, and
//! the text they print.

mod bench;
mod calibrate;
mod host;
mod record;
mod run;
mod validate;
mod validate_disksim;

use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use iolab_sys::zram::Zram;

#[derive(Args, Debug)]
pub struct DisksimArgs {
    #[command(subcommand)]
    pub command: DisksimCommand,
}

#[derive(Subcommand, Debug)]
// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
pub enum DisksimCommand {
    /// Replay DiskSim's real-disk validation traces on our disk models and score them
    /// (demerit figure, mean response time, simulation speed).
    ValidateDisksim(validate_disksim::ValidateArgs),
    /// Simulate a trace (or the config's [workload]) on the configured device.
    Run(run::RunArgs),
    /// Measure the simulator's speed: 1,000,000 requests, random and sequential.
    Bench(bench::BenchArgs),
    /// Measure a real device through a file created in DIR (O_DIRECT, fio): latency and
    /// throughput by size, read/write, sequential/random, queue depth; seek profile;
    /// write-cache behaviour; host settings. Writes a measured-device config for `run`.
    Calibrate(calibrate::CalibrateArgs),
    /// Run real fio (in a memory cgroup) and the simulator on the same jobs and compare them
    /// job by job: throughput, mean/p50/p99 latency, demerit, simulation speed.
    Validate(validate::LinuxValidateArgs),
    /// Run a command under strace and write its file I/O (read/write/pread/pwrite/readv/
    /// writev, lseek, fsync/fdatasync, fadvise, with sizes and offsets per file) as an iolab
    /// file trace; `run --trace T --format files` replays it; `--compare N --config CAL`
    /// also times the command N times without strace and compares with the replay.
    Record(record::RecordArgs),
}

pub fn run(a: DisksimArgs) -> Result<()> {
    match a.command {
        DisksimCommand::ValidateDisksim(v) => validate_disksim::validate_disksim(v),
        DisksimCommand::Run(r) => run::run_cmd(r),
        DisksimCommand::Bench(b) => bench::bench(b),
        DisksimCommand::Calibrate(c) => calibrate::calibrate_cmd(c),
        DisksimCommand::Validate(v) => validate::linux_validate_cmd(v),
        DisksimCommand::Record(r) => record::record_cmd(r),
    }
}

/// Refuses to replace a file this tool did not write (its first line must start with
/// `marker`).
/// The directory to measure in: `dir`, or with `--zram SIZE` a zram device made for the run
/// (returned too: dropping it removes the device, its filesystem and the mount). A device a
/// killed run left is removed first.
fn scratch_device(zram: Option<&str>, dir: &Path) -> Result<(Option<Zram>, std::path::PathBuf)> {
    let Some(size) = zram else {
        return Ok((None, dir.to_path_buf()));
    };
    let bytes =
        iolab_disksim::fio::parse_size(size).map_err(|e| anyhow::anyhow!("--zram {size}: {e}"))?;
    if bytes < 64 << 20 {
        bail!("--zram {size}: at least 64 MiB (the measurements' files must fit)");
    }
    for stale in iolab_sys::zram::cleanup_stale()? {
        eprintln!(
            "removed a zram device a killed run left: {}",
            stale.display()
        );
    }
    let z = Zram::create(bytes).with_context(|| format!("making a {size} zram device"))?;
    eprintln!(
        "measuring on /dev/{} ({size}, ext4, mounted on {}; compression {})",
        z.name(),
        z.dir().display(),
        z.attr("comp_algorithm").unwrap_or_default().trim()
    );
    let dir = z.dir().to_path_buf();
    Ok((Some(z), dir))
}

fn check_replaceable(p: &Path, marker: &str) -> Result<()> {
    if p.exists() {
        let head = std::fs::read(p).unwrap_or_default();
        if !head.starts_with(marker.as_bytes()) {
            bail!(
                "{} exists and was not written by iolab disksim: refusing to replace it (choose another path)",
                p.display()
            );
        }
    }
    Ok(())
}

fn progress_bar(quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(1);
    b.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}] {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    b
}

/// A progress callback `(done, total, what)` that drives `bar`.
fn on_bar(bar: &indicatif::ProgressBar) -> impl FnMut(u64, u64, &str) + '_ {
    move |done, total, what| {
        bar.set_length(total);
        bar.set_position(done);
        bar.set_message(what.to_string());
    }
}
