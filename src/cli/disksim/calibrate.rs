//! `iolab disksim calibrate`: measures a real device and writes the measured-device config.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use iolab_disksim::calibrate;
use iolab_disksim::report::write_json;

use super::{check_replaceable, on_bar, progress_bar, scratch_device};

#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Directory on the device to measure (a file is created there and removed at the end).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Measure on a zram device of this size (e.g. 2g; fio size syntax) made for the run
    /// instead of --dir: ext4 on it, mounted on a new directory, all removed at the end (also
    /// on an error or Ctrl-C; a killed run's leftovers are removed by the next). zram's speed
    /// is the CPU's and memory's, the steadiest block device a kernel without modules
    /// offers. Needs root.
    #[arg(long, value_name = "SIZE", conflicts_with = "dir")]
    pub zram: Option<String>,
    /// Fewer points and shorter runs: under 2 minutes (512 MiB file, 250 ms per point).
    #[arg(long)]
    pub quick: bool,
    /// Write the measured-device config (TOML) here (refuses to replace a file it did not
    /// write).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write every figure as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

pub(super) fn calibrate_cmd(a: CalibrateArgs) -> Result<()> {
    const MARK: &str = "# Written by `iolab disksim calibrate";
    if let Some(p) = &a.out {
        check_replaceable(p, MARK)?;
    }
    if let Some(p) = &a.json {
        check_replaceable(p, "{")?;
    }
    let flag = calibrate::install_interrupt_flag()?;
    let (_zram, dir) = scratch_device(a.zram.as_deref(), &a.dir)?;
    let bar = progress_bar(a.quiet);
    let c = calibrate::calibrate(&dir, a.quick, &flag, &mut on_bar(&bar));
    bar.finish_and_clear();
    let c = c?;
    print!("{}", calibrate::table(&c));
    if let Some(p) = &a.out {
        std::fs::write(p, calibrate::config_toml(&c))
            .with_context(|| format!("writing {}", p.display()))?;
        println!(
            "config: {} (iolab disksim run --config {} ...)",
            p.display(),
            p.display()
        );
    }
    write_json(a.json.as_deref(), &c)?;
    Ok(())
}
