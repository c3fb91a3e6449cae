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
    // Steady-state detection (src/fio/steady.rs), the latency target's queue-depth search
    // (src/fio/latency.rs): shortened, SHORTENED.
    "steadystate.fio",
    "latency-profile.fio",
    // fio's emulated zones on a device that is not zoned, all empty: the reader reads
    // nothing (src/fio/extra.rs); `offset`.
    "zbd-seq-read.fio",
    // I/O priorities under mq-deadline (src/fio/prio.rs, src/blocklayer/deadline.rs): the
    // whole 1 TiB device shortened, SHORTENED.
    "cmdprio-bssplit.fio",
    "cmdprio-percentage.fio",
];

/// Examples that simulate with a shorter run for the test: (example, [(text, in its place)]).
/// steadystate.fio: 3 s windows after a 1 s ramp, at 1,000 I/Os a second per clone (its
/// null I/O at fio's own speed is 26 M a second for 40 s); latency-profile.fio: 50 ms
/// windows instead of 5 s.
const SHORTENED: &[(&str, &[(&str, &str)])] = &[
    (
        "steadystate.fio",
        &[
            ("ss_dur=30s", "ss_dur=3s"),
            ("ss_ramp=10s", "ss_ramp=1s"),
            ("ss_dur=10s", "ss_dur=3s"),
            ("ss_ramp=5s", "ss_ramp=1s"),
            ("time_based\n", "time_based\nrate_iops=1000\n"),
        ],
    ),
    (
        "latency-profile.fio",
        &[("latency_window=5000000", "latency_window=50000")],
    ),
    (
        "cmdprio-bssplit.fio",
        &[("iodepth=16\n", "iodepth=16\nsize=256m\n")],
    ),
    (
        "cmdprio-percentage.fio",
        &[("iodepth=8\n", "iodepth=8\nsize=64m\n")],
    ),
];

fn shortened(name: &str, text: String) -> String {
    let Some((_, subs)) = SHORTENED.iter().find(|(n, _)| *n == name) else {
        return text;
    };
    subs.iter().fold(text, |t, (from, to)| {
        assert!(t.contains(from), "{name}: no '{from}'");
        t.replacen(from, to, 1)
    })
}

/// Example `name` as the tests run it ([`SHORTENED`] applied).
fn example_text(dir: &Path, name: &str) -> String {
    shortened(name, std::fs::read_to_string(dir.join(name)).unwrap())
}

/// Example `name`'s per-job results (shortened); `None` when the examples are not installed.
fn example_results(name: &str) -> Option<Vec<fio::JobResult>> {
    let dir = examples()?;
    Some(simulate_results(&example_text(&dir, name)).unwrap_or_else(|e| panic!("{name}: {e:#}")))
}

/// fio's cpuio engine does no I/O, nor a zbd reader of empty zones: their jobs' counts are
/// 0, as fio reports them.
const NO_IO: &[&str] = &["cpuio.fio", "zbd-seq-read.fio"];

/// How many of the 86 the reader takes (docs/results/disksim-fio-examples.md's table: the
/// others are refused, each naming the option, its line and why).
const TAKEN: usize = 34;

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
    Ok(simulate_results(text)?
        .into_iter()
        .map(|r| (r.job, r.read.ios + r.write.ios))
        .collect())
}

/// [`simulate`]'s per-job results.
fn simulate_results(text: &str) -> anyhow::Result<Vec<fio::JobResult>> {
    let jf = fio::parse(text, false)?;
    // (Linux's defaults: mq-deadline)
    jf.check_scheduler(HostParams::linux_defaults().block.scheduler)?;
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
    Ok(stats.results())
}

/// A job's runtime as its figures give it, s.
fn runtime_s(r: &fio::JobResult) -> f64 {
    let d = if r.read.ios > 0 { &r.read } else { &r.write };
    d.ios as f64 / d.iops
}

/// steadystate.fio shortened (SHORTENED), as fio 3.33 ran the same file here
/// (`fio --output-format=json`, 2 shared cores, 4 Dec 2026): each group stopped once its
/// 3 samples after the ramp were within 10 % (1 %): ss-write 19,567 writes in 4.89 s a
/// clone, ss-read 19,056 reads in 4.76 s, both "attained". The simulator samples at whole
/// seconds from the run's start: the first sample at 3 s, steady at 5 s, 4 × 5,001 I/Os
/// (fio started its jobs ~0.1 s after its clock). Without the detection the jobs would run
/// their 5 minutes.
#[test]
fn steadystate_ends_each_group_once_steady() {
    let Some(r) = example_results("steadystate.fio") else {
        return;
    };
    let jobs: Vec<(&str, u64, f64)> = r
        .iter()
        .map(|j| (j.job.as_str(), j.read.ios + j.write.ios, runtime_s(j)))
        .collect();
    // (the 4 clones of each group summed, as fio's group_reporting)
    for (job, ios, secs) in &jobs {
        assert!((4.5..=5.5).contains(secs), "{job}: {secs} s");
        assert!((19_000..=20_100).contains(ios), "{job}: {ios} I/Os");
    }
    assert_eq!(jobs.len(), 2);
}

/// latency-profile.fio with 50 ms windows on the NVMe model, far under its 500 ms target:
/// fio's search doubles the depth each window, 1 to 128, finds 128 again, then runs one
/// more window whose figures are the job's (fio resets them): 50 ms of I/O at depth 128,
/// not the whole device read at depth 128 (without the search) nor nine windows (without
/// the reset). fio 3.33 took the same steps on a 2 GiB file of this VM's disk with 200 ms
/// windows (`--debug=rate`: ramped up 1, 2, 4 ... 128, 128 again, "Quiesce and final run",
/// "We are done"; docs/results/disksim-fio-examples.md) and reported 200 ms of figures at
/// `latency_depth` 128.
#[test]
fn latency_target_searches_the_depth_then_reports_the_last_window() {
    let Some(r) = example_results("latency-profile.fio") else {
        return;
    };
    assert_eq!(r.len(), 1);
    let secs = runtime_s(&r[0]);
    assert!((0.050..0.056).contains(&secs), "{secs} s");
    assert!(r[0].read.ios > 1_000, "{} reads", r[0].read.ios);
}

/// A direction's I/Os by priority: (class, level, I/Os, mean ms).
fn prios(d: &fio::DirResult) -> Vec<(String, u8, u64, f64)> {
    d.by_prio
        .iter()
        .map(|p| {
            (
                format!("{:?}", p.prio.class),
                p.prio.level,
                p.ios,
                p.mean_ms,
            )
        })
        .collect()
}

/// cmdprio-percentage.fio shortened to 64 MiB (512 reads of 128 KiB at depth 8): about 20 %
/// RT, the rest IDLE (the job's `prioclass=3`); mq-deadline serves the RT reads first, so
/// their mean latency is lower. fio 3.33 ran the same job on a 64 MiB file in /tmp (this
/// VM's disk under mq-deadline, 4 Dec 2026): 97 RT (mean 0.56 ms) and 415 IDLE (1.00 ms)
/// in its JSON's `prios`.
#[test]
fn cmdprio_percentage_gives_a_fifth_of_the_reads_rt_served_first() {
    let Some(r) = example_results("cmdprio-percentage.fio") else {
        return;
    };
    let p = prios(&r[0].read);
    assert_eq!(r[0].read.ios, 512);
    assert_eq!(p.len(), 2, "{p:?}");
    let (rt, idle) = (&p[0], &p[1]);
    assert_eq!((rt.0.as_str(), idle.0.as_str()), ("Rt", "Idle"));
    // (binomial: 20 % of 512 is 102 ± 9)
    assert!((75..=130).contains(&rt.2), "{p:?}");
    assert_eq!(rt.2 + idle.2, 512);
    assert!(rt.3 < idle.3, "{p:?}");
}

/// cmdprio-bssplit.fio shortened to 256 MiB a job: in its first job every 64 KiB read is
/// RT and nothing else has a priority (fio 3.33 on a 256 MiB file here: 66 RT reads, 75
/// without, writes all without); in the advanced jobs a quarter of the 64 KiB reads are
/// RT level 1 and three quarters IDLE level 2 (fio: 14 and 48; with the BE 7 default 13
/// and 53), whose mean latency is far above the others' (fio: 19.9 and 16.3 ms).
#[test]
fn cmdprio_bssplit_sets_the_priority_by_size() {
    let Some(r) = example_results("cmdprio-bssplit.fio") else {
        return;
    };
    assert_eq!(r.len(), 3);
    let p = prios(&r[0].read);
    assert_eq!(p.len(), 2, "{p:?}");
    assert_eq!((p[0].0.as_str(), p[1].0.as_str()), ("None", "Rt"));
    assert!(r[0].write.by_prio.is_empty());
    for j in &r[1..] {
        let p = prios(&j.read);
        assert_eq!(p.len(), 3, "{}: {p:?}", j.job);
        let rt = p.iter().find(|x| x.0 == "Rt").unwrap();
        let idle = p.iter().find(|x| x.0 == "Idle").unwrap();
        assert_eq!((rt.1, idle.1), (1, 2));
        assert!(idle.2 > 2 * rt.2, "{}: {p:?}", j.job);
        assert!(
            p.iter().all(|x| x.0 == "Idle" || x.3 < idle.3),
            "{}: {p:?}",
            j.job
        );
    }
}

#[test]
fn the_examples_that_simulate_run_every_job() {
    let Some(dir) = examples() else { return };
    for name in SIMULATED {
        let jobs = simulate(&example_text(&dir, name)).unwrap_or_else(|e| panic!("{name}: {e:#}"));
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
            jf.check_scheduler(HostParams::linux_defaults().block.scheduler)?;
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
