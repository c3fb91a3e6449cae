//! The real fio, as `calibrate` and `validate` run it: job files built from typed [`Job`]s
//! ([`JobFile::text`]), and fio's JSON output read into [`Output`].
//!
//! The output types hold what this tool reads of fio 3's `--output-format=json`, each field
//! as fio names it; a field fio leaves out reads as "not measured" (a latency as NaN, a
//! count or rate as 0), so a job fio could not run shows as a gap, not as an error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::Rw;

/// fio's I/O engines this tool runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Psync,
    Libaio,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::Psync => "psync",
            Engine::Libaio => "libaio",
        }
    }
}

/// One section of a job file (a job, or `[global]`): the options it sets, in fio's units
/// where the field names say none.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Job {
    pub name: String,
    pub filename: Option<PathBuf>,
    pub size_bytes: Option<u64>,
    pub rw: Option<Rw>,
    /// Sequential I/O skipping this many KiB after each request (`rw=read:SKIPk`).
    pub skip_kib: Option<u64>,
    pub bs_kib: Option<u64>,
    pub ioengine: Option<Engine>,
    pub direct: Option<bool>,
    pub iodepth: Option<u32>,
    pub runtime_ms: Option<u64>,
    pub time_based: bool,
    pub ramp_time_ms: Option<u64>,
    pub randrepeat: Option<bool>,
    pub invalidate: Option<bool>,
    /// An fsync after every this many writes.
    pub fsync: Option<u32>,
    /// O_DSYNC writes (`sync=dsync`).
    pub dsync: bool,
    /// The job starts once the jobs before it are done.
    pub stonewall: bool,
    /// Percentiles of the total latency (`lat_percentiles=1`): fio reports percentiles of
    /// the completion latency only by default, and `lat_ns` then has none.
    pub lat_percentiles: bool,
}

impl Job {
    /// A job of this name, no option set.
    pub fn named(name: impl Into<String>) -> Job {
        Job {
            name: name.into(),
            ..Default::default()
        }
    }

    /// `[name]` and a `key=value` line (or a bare `key` for a flag) per option set.
    fn section(&self) -> String {
        let mut opts: Vec<(&str, String)> = Vec::new();
        let flag = |b: bool| u8::from(b).to_string();
        if let Some(f) = &self.filename {
            // fio splits filename= at ':' (several files): escape it.
            opts.push(("filename", f.to_string_lossy().replace(':', "\\:")));
        }
        if let Some(b) = self.size_bytes {
            opts.push(("size", b.to_string()));
        }
        if let Some(rw) = self.rw {
            let skip = self.skip_kib.map(|k| format!(":{k}k")).unwrap_or_default();
            opts.push(("rw", format!("{}{skip}", rw.name())));
        }
        if let Some(k) = self.bs_kib {
            opts.push(("bs", format!("{k}k")));
        }
        if let Some(e) = self.ioengine {
            opts.push(("ioengine", e.name().into()));
        }
        if let Some(d) = self.direct {
            opts.push(("direct", flag(d)));
        }
        if let Some(q) = self.iodepth {
            opts.push(("iodepth", q.to_string()));
        }
        if let Some(ms) = self.runtime_ms {
            opts.push(("runtime", format!("{ms}ms")));
        }
        if self.time_based {
            opts.push(("time_based", String::new()));
        }
        if let Some(ms) = self.ramp_time_ms {
            opts.push(("ramp_time", format!("{ms}ms")));
        }
        if let Some(r) = self.randrepeat {
            opts.push(("randrepeat", flag(r)));
        }
        if let Some(i) = self.invalidate {
            opts.push(("invalidate", flag(i)));
        }
        if let Some(n) = self.fsync {
            opts.push(("fsync", n.to_string()));
        }
        if self.dsync {
            opts.push(("sync", "dsync".into()));
        }
        if self.stonewall {
            opts.push(("stonewall", String::new()));
        }
        if self.lat_percentiles {
            opts.push(("lat_percentiles", "1".into()));
        }
        let mut s = format!("[{}]\n", self.name);
        for (k, v) in opts {
            s.push_str(k);
            if !v.is_empty() {
                s.push('=');
                s.push_str(&v);
            }
            s.push('\n');
        }
        s
    }
}

/// A job file: the options every job shares, then the jobs, run in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobFile {
    pub global: Job,
    pub jobs: Vec<Job>,
}

impl JobFile {
    /// The job file's text (the global section named `global`, whatever its name).
    pub fn text(&self) -> String {
        let global = Job {
            name: "global".into(),
            ..self.global.clone()
        };
        std::iter::once(&global)
            .chain(&self.jobs)
            .map(Job::section)
            .collect()
    }

    /// Writes the job file to `path` and runs fio on it (see [`run`]).
    pub fn run(
        &self,
        path: &Path,
        cgroup_procs: Option<&Path>,
        interrupted: &AtomicBool,
    ) -> Result<Output> {
        std::fs::write(path, self.text()).with_context(|| format!("writing {}", path.display()))?;
        run(cgroup_procs, path, interrupted)
    }
}

/// fio's JSON output: the jobs, in the job file's order.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Output {
    #[serde(default)]
    pub jobs: Vec<JobOutput>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct JobOutput {
    #[serde(default)]
    pub jobname: String,
    #[serde(default)]
    pub read: DirOutput,
    #[serde(default)]
    pub write: DirOutput,
    /// The fsync/fdatasync calls of a job that makes them.
    #[serde(default)]
    pub sync: SyncOutput,
}

impl JobOutput {
    /// The read or write half, whichever moved more bytes.
    pub fn active(&self) -> &DirOutput {
        if self.write.io_bytes > self.read.io_bytes {
            &self.write
        } else {
            &self.read
        }
    }
}

/// One direction (reads or writes) of a job.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct DirOutput {
    #[serde(default)]
    pub io_bytes: u64,
    /// Bytes per second.
    #[serde(default)]
    pub bw_bytes: f64,
    #[serde(default)]
    pub iops: f64,
    /// The job's run time, ms.
    #[serde(default)]
    pub runtime: f64,
    #[serde(default)]
    pub total_ios: f64,
    /// Total latency, submission to completion.
    #[serde(default)]
    pub lat_ns: Latency,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Latency {
    #[serde(default = "not_measured")]
    pub mean: f64,
    /// By percent as fio prints it (`"50.000000"`), ns.
    #[serde(default)]
    pub percentile: BTreeMap<String, f64>,
}

fn not_measured() -> f64 {
    f64::NAN
}

impl Default for Latency {
    fn default() -> Latency {
        Latency {
            mean: not_measured(),
            percentile: BTreeMap::new(),
        }
    }
}

impl Latency {
    pub fn mean_us(&self) -> f64 {
        self.mean / 1000.0
    }

    /// The latency at `percent` (a key of fio's table, `"99.000000"`), µs; NaN if absent.
    pub fn percentile_us(&self, percent: &str) -> f64 {
        self.percentile
            .get(percent)
            .map_or(f64::NAN, |ns| ns / 1000.0)
    }
}

/// A job's sync calls: their mean latency, 0 when it made none.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct SyncOutput {
    #[serde(default)]
    pub lat_ns: SyncLatency,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SyncLatency {
    #[serde(default)]
    pub mean: f64,
}

/// fio's version line; fails with the package name when fio is missing.
pub fn require_fio() -> Result<String> {
    match Command::new("fio").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).trim().to_string()),
        _ => bail!("fio is not installed (Debian package: fio; scripts/install-deps installs it)"),
    }
}

/// Runs fio on the job file `jobfile` and reads its JSON output; inside a cgroup when
/// `cgroup_procs` names its `cgroup.procs`: a shell joins the cgroup and then becomes fio,
/// so fio and the page cache it fills are charged to the cgroup from its first byte.
pub fn run(
    cgroup_procs: Option<&Path>,
    jobfile: &Path,
    interrupted: &AtomicBool,
) -> Result<Output> {
    const NOT_JOINED: i32 = 97;
    let mut cmd = match cgroup_procs {
        None => Command::new("fio"),
        Some(procs) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!(
                    "echo $$ > \"$0\" || exit {NOT_JOINED}; exec fio \"$@\""
                ))
                .arg(procs);
            c
        }
    };
    let out = cmd
        .arg("--output-format=json")
        .arg(jobfile)
        .output()
        .context("running fio (Debian package: fio)")?;
    if interrupted.load(Ordering::Relaxed) {
        bail!("interrupted");
    }
    if let (Some(procs), Some(NOT_JOINED)) = (cgroup_procs, out.status.code()) {
        bail!("could not move fio into the cgroup of {}", procs.display());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "fio failed on {}: {}{}",
            jobfile.display(),
            String::from_utf8_lossy(&out.stderr).trim(),
            text.trim()
        );
    }
    // fio may print notes before the JSON object.
    let start = text.find('{').context("fio printed no JSON")?;
    serde_json::from_str(&text[start..]).context("reading fio's JSON output")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_file_names_each_option_as_fio_does() {
        let jf = JobFile {
            global: Job {
                filename: Some("/mnt/a:b/f.dat".into()),
                size_bytes: Some(512 << 20),
                direct: Some(true),
                ioengine: Some(Engine::Libaio),
                runtime_ms: Some(250),
                time_based: true,
                ramp_time_ms: Some(0),
                randrepeat: Some(false),
                invalidate: Some(true),
                stonewall: true,
                lat_percentiles: true,
                ..Default::default()
            },
            jobs: vec![
                Job {
                    rw: Some(Rw::Read),
                    skip_kib: Some(64),
                    bs_kib: Some(4),
                    iodepth: Some(1),
                    ..Job::named("s64")
                },
                Job {
                    rw: Some(Rw::RandWrite),
                    bs_kib: Some(4),
                    fsync: Some(1),
                    dsync: true,
                    ..Job::named("w")
                },
            ],
        };
        assert_eq!(
            jf.text(),
            "[global]\nfilename=/mnt/a\\:b/f.dat\nsize=536870912\nioengine=libaio\ndirect=1\n\
             runtime=250ms\ntime_based\nramp_time=0ms\nrandrepeat=0\ninvalidate=1\nstonewall\n\
             lat_percentiles=1\n[s64]\nrw=read:64k\nbs=4k\niodepth=1\n\
             [w]\nrw=randwrite\nbs=4k\nfsync=1\nsync=dsync\n"
        );
    }

    /// fio's JSON, as fio 3.33 prints it (cut down): what is there is read; a direction
    /// without latencies is "not measured", a job without sync calls has a sync mean of 0.
    #[test]
    fn fio_output_reads_into_the_typed_jobs() {
        let text = r#"{"fio version": "fio-3.33", "jobs": [
            {"jobname": "p4", "read": {"io_bytes": 4096, "bw_bytes": 1000000, "iops": 244.1,
              "runtime": 1000, "total_ios": 244,
              "lat_ns": {"mean": 150000.5, "percentile": {"50.000000": 140000}}},
             "write": {"io_bytes": 0, "bw_bytes": 0, "iops": 0.0, "runtime": 0,
              "total_ios": 0},
             "sync": {"lat_ns": {"mean": 2000.0}}},
            {"jobname": "w", "write": {"io_bytes": 8192, "lat_ns": {"mean": 30000}}}
        ]}"#;
        let out: Output = serde_json::from_str(text).unwrap();
        let [p4, w] = &out.jobs[..] else {
            panic!("{out:?}")
        };
        assert_eq!(p4.jobname, "p4");
        let d = p4.active();
        assert_eq!((d.io_bytes, d.bw_bytes, d.iops), (4096, 1e6, 244.1));
        assert_eq!((d.runtime, d.total_ios), (1000.0, 244.0));
        assert_eq!(d.lat_ns.mean_us(), 150.0005);
        assert_eq!(d.lat_ns.percentile_us("50.000000"), 140.0);
        assert!(d.lat_ns.percentile_us("99.000000").is_nan());
        assert!(p4.write.lat_ns.mean_us().is_nan());
        assert_eq!(p4.sync.lat_ns.mean, 2000.0);
        assert_eq!(w.active().lat_ns.mean_us(), 30.0);
        assert_eq!(w.sync.lat_ns.mean, 0.0);
        assert!(w.read.lat_ns.mean_us().is_nan());
    }
}
