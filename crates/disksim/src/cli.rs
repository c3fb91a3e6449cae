//! `iolab disksim ...` subcommands.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::validate;

#[derive(Args, Debug)]
pub struct DisksimArgs {
    #[command(subcommand)]
    pub command: DisksimCommand,
}

#[derive(Subcommand, Debug)]
pub enum DisksimCommand {
    /// Replay DiskSim's real-disk validation traces on our disk models and score them.
    ValidateDisksim(ValidateArgs),
}

#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// Directory with NAME.parv / NAME.trace pairs (default: the copy shipped in the repository).
    pub dir: Option<PathBuf>,
    /// Only these disks (file stems), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub disks: Vec<String>,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the HTML report (table and CDF figures) here.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

pub fn run(a: DisksimArgs) -> Result<()> {
    match a.command {
        DisksimCommand::ValidateDisksim(v) => validate_disksim(v),
    }
}

fn validate_disksim(a: ValidateArgs) -> Result<()> {
    let dir = a.dir.unwrap_or_else(crate::default_valid_dir);
    let mut results = Vec::new();
    for (name, parv, trace) in validate::find_disks(&dir)? {
        if !a.disks.is_empty() && !a.disks.contains(&name) {
            continue;
        }
        results.push(validate::run_disk(&name, &parv, &trace)?);
    }
    print!("{}", validate::table(&results));
    if let Some(p) = a.json {
        std::fs::write(&p, serde_json::to_string_pretty(&results)?)?;
    }
    if let Some(p) = a.html {
        std::fs::write(&p, validate::html(&results, "unknown"))?;
    }
    Ok(())
}
