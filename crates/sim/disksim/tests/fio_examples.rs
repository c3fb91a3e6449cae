//! The job files of Debian's fio-examples package (fio 3.33, /usr/share/doc/fio/examples;
//! `scripts/deps/disksim` installs it): the ones the simulator models run to the end with
//! every job doing I/O, and every other one is refused naming a line. The table of all 86
//! is docs/results/disksim-fio-examples.md.

use std::path::{Path, PathBuf};

use iolab_disksim::config::Config;
use iolab_disksim::engine::Simulator;
use iolab_disksim::fio;
use iolab_disksim::host::HostParams;

/// Those that simulate, each in under a few seconds (the others that simulate run their
/// 60-900 s runtime or size at < 100× real time: too long for a test).
const SIMULATED: &[&str] = &[
    "1mbs_clients.fio",
    "aio-read.fio",
    "backwards-read.fio",
    "iometer-file-access-server.fio",
    "numa.fio",
    "tiobench-example.fio",
    "waitfor.fio",
    // fio's null engine, random distributions, exitall, submission modes (src/fio/extra.rs).
    "zipf.fio",
    "rand-zones.fio",
    "exitwhat.fio",
    "fixed-rate-submission.fio",
    "poisson-rate-submission.fio",
    // fio's cpuio engine (no I/O), data-content options of no effect (src/fio/inert.rs).
    "cpuio.fio",
    "dedupe-global.fio",
];

/// fio's cpuio engine does no I/O: its jobs' counts are 0, as fio reports them.
const NO_IO: &[&str] = &["cpuio.fio"];

/// How many of the 86 the reader takes (docs/results/disksim-fio-examples.md's table: the
/// others are refused, each naming the option, its line and why).
const TAKEN: usize = 29;

fn examples() -> Option<PathBuf> {
    let d = Path::new("/usr/share/doc/fio/examples");
    if d.join("aio-read.fio").exists() {
        Some(d.to_path_buf())
    } else {
        eprintln!(
            "skipped: Debian's fio-examples is not installed (scripts/deps/disksim installs it)"
        );
        None
    }
}

/// Simulates a job file as `run --fio` does, on the NVMe config under Linux's defaults;
/// returns (job, ios) per job.
fn simulate(text: &str) -> anyhow::Result<Vec<(String, u64)>> {
    let jf = fio::parse(text, false)?;
    // (Linux's defaults: mq-deadline, where I/O priorities are refused)
    jf.check_scheduler(false)?;
    let cfg_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/nvme.toml");
    let cfg = Config::load(&cfg_path)?;
    let dev = cfg.device(&cfg_path)?;
    let mut src = fio::FioSource::new(&jf, 0, dev.blocks)?;
    let mut stats = fio::JobStats::new(&src);
    let chain = HostParams::linux_defaults()
        .stack()
        .files(&src.file_sizes())
        .on(dev.component)?;
    Simulator::new(chain).run_streams(&mut src, &mut |c, s| stats.add(c, s))?;
    Ok(stats
        .results()
        .into_iter()
        .map(|r| (r.job, r.read.ios + r.write.ios))
        .collect())
}

#[test]
fn the_examples_that_simulate_run_every_job() {
    let Some(dir) = examples() else { return };
    for name in SIMULATED {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        let jobs = simulate(&text).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert!(!jobs.is_empty(), "{name}");
        for (job, ios) in jobs {
            if NO_IO.contains(name) {
                assert_eq!(ios, 0, "{name}: job {job}");
            } else {
                assert!(ios > 0, "{name}: job {job} did no I/O");
            }
        }
    }
}

/// Every example the reader refuses says on which line, and what.
#[test]
fn every_refusal_names_a_line() {
    let Some(dir) = examples() else { return };
    let (mut refused, mut taken) = (0, 0);
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) != Some("fio") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let r = fio::parse(&text, false).and_then(|jf| {
            jf.check_scheduler(false)?;
            fio::FioSource::new(&jf, 0, 1 << 40)
        });
        match r {
            Err(e) => {
                let e = format!("{e:#}");
                assert!(e.contains("line "), "{}: {e}", p.display());
                refused += 1;
            }
            Ok(_) => taken += 1,
        }
    }
    assert!(refused > 0);
    assert_eq!(taken, TAKEN);
}
