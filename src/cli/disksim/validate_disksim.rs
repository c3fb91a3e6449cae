//! `iolab disksim validate-disksim`: DiskSim's real-disk traces on our disk models.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use iolab_disksim::report::{machine, write_json};
use iolab_disksim::validate;

use super::check_replaceable;

#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// Directory with NAME.parv / NAME.trace pairs, the trace in DiskSim's validate format
    /// (default: the copy in the repository, crates/sim/disksim/data/disksim-valid; DiskSim
    /// 4.0's own valid/ works as it is).
    pub dir: Option<PathBuf>,
    /// Only these disks (file stems), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub disks: Vec<String>,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the HTML report (table and response-time CDF per disk) here.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Fail (exit 1) if a disk's demerit exceeds the value recorded in this JSON file
    /// ({"disk": max_demerit_ms, ...}).
    #[arg(long)]
    pub check: Option<PathBuf>,
    /// Write DIR/DISK.csv per disk: each request's real and simulated response time (ms),
    /// the drive's own hit/miss label, ours, and the simulated overhead/seek/rotation/
    /// transfer/bus split. The directory is created if missing.
    #[arg(long, value_name = "DIR")]
    pub per_request: Option<PathBuf>,
    /// Also print, per disk, simulated minus real response time by what the model did with
    /// each request (write, read hit, read miss without a seek, by seek time): where a model
    /// errs. Always in the JSON (`by_class`).
    #[arg(long)]
    pub by_class: bool,
}

pub(super) fn validate_disksim(a: ValidateArgs) -> Result<()> {
    let dir = a.dir.unwrap_or_else(iolab_disksim::default_valid_dir);
    let mut results = Vec::new();
    for (name, parv, trace) in validate::find_disks(&dir)? {
        if !a.disks.is_empty() && !a.disks.contains(&name) {
            continue;
        }
        let r = match &a.per_request {
            Some(d) => {
                std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
                let p = d.join(format!("{name}.csv"));
                check_replaceable(&p, validate::PER_REQUEST_HEADER)?;
                let f = std::fs::File::create(&p)
                    .with_context(|| format!("creating {}", p.display()))?;
                let mut w = std::io::BufWriter::new(f);
                let r = validate::run_disk_logged(&name, &parv, &trace, Some(&mut w))?;
                std::io::Write::flush(&mut w)
                    .with_context(|| format!("writing {}", p.display()))?;
                r
            }
            None => validate::run_disk(&name, &parv, &trace)?,
        };
        results.push(r);
    }
    if results.is_empty() {
        bail!(
            "no disk selected (known: {})",
            validate::find_disks(&dir)?
                .into_iter()
                .map(|d| d.0)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    print!("{}", validate::table(&results));
    println!("demerit: RMS of real vs simulated response-time distributions at 10,000 percentiles; vs DS: ours / DiskSim 4.0's; goal: <= {}x DiskSim's and |mean| <= {}% (\"-\": DiskSim has no figure)", validate::DEMERIT_GOAL_RATIO, validate::MEAN_GOAL_PCT);
    println!("req rms: RMS of simulated minus real response time request by request (ms); DiskSim: DiskSim 4.0's on the same trace");
    if a.by_class {
        println!();
        print!("{}", validate::class_table(&results));
        println!("mean, rms: of simulated minus real response time over the class's requests (negative mean: the model is too fast)");
    }
    write_json(a.json.as_deref(), &results)?;
    if let Some(p) = &a.html {
        std::fs::write(p, validate::html(&results, &machine()))
            .with_context(|| format!("writing {}", p.display()))?;
        println!("report: {}", p.display());
    }
    if let Some(p) = &a.check {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let limits: std::collections::BTreeMap<String, f64> =
            serde_json::from_str(&text).with_context(|| format!("{}", p.display()))?;
        let mut bad = Vec::new();
        for r in &results {
            if let Some(&max) = limits.get(&r.disk) {
                if r.demerit_ms > max {
                    bad.push(format!(
                        "{}: demerit {:.4} ms > recorded {:.4} ms",
                        r.disk, r.demerit_ms, max
                    ));
                }
            }
        }
        if !bad.is_empty() {
            bail!("demerit regressed:\n  {}", bad.join("\n  "));
        }
        println!(
            "check: every demerit within the values recorded in {}",
            p.display()
        );
    }
    Ok(())
}
