//! fio options modelled as fio defines them (src/fio/extra.rs): each against a small real fio
//! run (fio 3.33 on a file in /tmp, figures in the comments) or fio's documented semantics.

use iolab_disksim::engine::{ConstantDevice, Simulator};
use iolab_disksim::fio::{self, JobResult};
use iolab_disksim::request::Op;

/// Runs a job file on a device serving each request in `ms` (no host stack; fio's fadvise
/// calls off, they would take device time here); returns per-job results and the end, ms.
fn run(text: &str, ms: f64) -> (Vec<JobResult>, f64, Vec<Op>) {
    let text = format!("[global]\ninvalidate=0\nfadvise_hint=0\n{text}");
    let jf = fio::parse(&text, false).unwrap();
    let mut src = fio::FioSource::new(&jf, 0, 1 << 30).unwrap();
    let mut stats = fio::JobStats::new(&src);
    let mut sim = Simulator::new(vec![Box::new(ConstantDevice::new(ms))]);
    let mut ops = Vec::new();
    let t = sim
        .run_streams(&mut src, &mut |c, s| {
            ops.push(c.req.op);
            stats.add(c, s)
        })
        .unwrap();
    (stats.results(), t.sim_end, ops)
}

/// fio's `null` engine completes each I/O at once: the time is fio's own loop (0.15 µs per
/// I/O with no calibration: fio 3.33 did 6.55 M null 4 KiB reads/s here). Before, `ioengine=
/// null` was refused.
#[test]
fn null_engine_completes_at_once() {
    let (r, end, _) = run(
        "[n]\nioengine=null\nrw=randread\nnorandommap\nsize=4m\n",
        1.0,
    );
    assert_eq!(r[0].read.ios, 1024);
    assert_eq!(r[0].read.mean_ms, 0.0);
    assert!(
        (end - 1023.0 * fio::source::NULL_IO_MS).abs() < 1e-9,
        "{end}"
    );
    // /dev/null and /dev/zero are the same: no device I/O.
    let (r, end, _) = run("[w]\nfilename=/dev/null\nrw=write\nbs=128k\nsize=1m\n", 1.0);
    assert_eq!(r[0].write.ios, 8);
    assert!(end < 0.01, "{end}");
}

/// `number_ios=10` ends a 256-block job after 10 I/Os (fio: `--size=1m --bs=4k --rw=read
/// --number_ios=10` did 10 reads).
#[test]
fn number_ios_ends_the_clone() {
    let (r, _, _) = run("[j]\nrw=read\nsize=1m\nnumber_ios=10\n", 0.1);
    assert_eq!(r[0].read.ios, 10);
    // The latency quantiles (a histogram within 0.1 %): every read took the device's 0.1 ms.
    for q in [r[0].read.p50_ms, r[0].read.p99_ms, r[0].read.cdf_ms[0]] {
        assert!((q - 0.1).abs() < 1e-4, "{q}");
    }
}

/// `verify=crc32c` on a 256 KiB random write job: fio did 64 writes, then 64 reads (its
/// read-back), after an fsync and a cache drop. Before, `verify` was refused.
#[test]
fn verify_reads_back_what_was_written() {
    let (r, _, ops) = run(
        "[v]\nrw=randwrite\nsize=256k\nverify=crc32c\niodepth=4\nioengine=libaio\ndirect=1\n",
        0.1,
    );
    assert_eq!((r[0].write.ios, r[0].read.ios), (64, 64));
    let first_read = ops.iter().position(|o| *o == Op::Read).unwrap();
    assert!(
        ops[..first_read].contains(&Op::Flush),
        "fsync before the read-back"
    );
    assert!(ops[first_read..].iter().all(|o| *o == Op::Read));
    let e = fio::parse("[v]\nrw=randrw\nsize=1m\nverify=md5\n", false).unwrap_err();
    assert!(e.to_string().contains("line 4"), "{e}");
}

/// `flow=1` and `flow=3` on two time-based jobs: fio did 16,276 and 48,824 reads (1 : 3.00).
#[test]
fn flow_weights_share_the_ios() {
    let (r, _, _) = run(
        "[a]\nrw=read\nsize=1m\nflow=1\ntime_based\nruntime=200ms\n[b]\nrw=read\nsize=1m\nflow=3\ntime_based\nruntime=200ms\n",
        0.01,
    );
    let ratio = r[1].read.ios as f64 / r[0].read.ios as f64;
    assert!(
        (ratio - 3.0).abs() < 0.05,
        "{ratio}: {} {}",
        r[0].read.ios,
        r[1].read.ios
    );
}

/// `exitall` with `exit_what=stonewall`: when the slow job ends, the rate-bound job beside it
/// stops at once (not at its next rate slot) and the next stonewall group starts.
#[test]
fn exitall_stops_the_running_jobs() {
    let (r, _, _) = run(
        "[slow]\nrw=read\nsize=1m\nnumber_ios=100\nthinktime=1000\nexitall\nexit_what=stonewall\n[fast]\nrw=read\nsize=1m\nrate=4k\n[next]\nstonewall\nrw=read\nsize=64k\n",
        0.01,
    );
    assert_eq!(r[0].read.ios, 100);
    assert!(r[1].read.ios <= 2, "fast: {}", r[1].read.ios);
    assert_eq!(r[2].read.ios, 16, "the next group ran");
}

/// `rate_iops=100` with `rate_process=poisson`: exponential gaps, the same mean rate.
#[test]
fn poisson_rate_keeps_the_mean() {
    let (r, _, _) = run(
        "[p]\nrw=randread\nsize=16m\nrate_iops=100\nrate_process=poisson\nio_submit_mode=offload\nio_size=4m\n",
        0.01,
    );
    assert!((r[0].read.iops - 100.0).abs() < 5.0, "{}", r[0].read.iops);
}

/// A distribution needs norandommap (fio's free-block search is not modelled), and a job on a
/// block device with no size takes the device's (fio's rule).
#[test]
fn distributions_and_whole_devices() {
    let e = fio::parse(
        "[z]\nrw=randread\nsize=1m\nrandom_distribution=zipf:1.2\n",
        false,
    );
    assert!(e.unwrap_err().to_string().contains("line 4"));
    let jf = fio::parse("[d]\nrw=read\nfilename=/dev/sdz\n", false).unwrap();
    let src = fio::FioSource::new(&jf, 0, 2048).unwrap();
    assert_eq!(src.files[0].bytes, 1 << 20);
}

/// I/O priorities: accepted under `none` (blk-mq without an elevator dispatches in
/// submission order, whatever the priority) and mq-deadline (served by class, modelled);
/// a job priority on buffered I/O is refused under mq-deadline (the read-ahead's priority
/// is not carried), and every priority under the seed's policies (no classes). Before,
/// mq-deadline refused every priority option.
#[test]
fn priorities_where_they_are_modelled() {
    use iolab_disksim::blocklayer::IoScheduler;
    use iolab_disksim::sched::Policy;
    let text = "[r]\nrw=randread\nsize=1m\nprioclass=3\ncmdprio_percentage=20\ncmdprio_class=1\nlog_prio=1\n";
    let jf = fio::parse(text, false).unwrap();
    jf.check_scheduler(IoScheduler::None).unwrap();
    let e = jf
        .check_scheduler(IoScheduler::MqDeadline)
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 4") && e.contains("buffered"), "{e}");
    let e = jf
        .check_scheduler(IoScheduler::Classic(Policy::Look))
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 4") && e.contains("look"), "{e}");
    let direct = text.replace("[r]\n", "[r]\ndirect=1\n");
    let jf = fio::parse(&direct, false).unwrap();
    jf.check_scheduler(IoScheduler::MqDeadline).unwrap();
    let plain = run("[r]\nrw=randread\nsize=1m\n", 0.1).0;
    let with = run(text, 0.1).0;
    assert_eq!(plain[0].read.ios, with[0].read.ios);
    assert_eq!(plain[0].read.mean_ms, with[0].read.mean_ms);
    // fio's clat_prio: each priority's count (about 20 % RT, the rest the job's IDLE).
    let by: Vec<(String, u64)> = with[0]
        .read
        .by_prio
        .iter()
        .map(|p| (format!("{:?}", p.prio.class), p.ios))
        .collect();
    assert_eq!(by.len(), 2, "{by:?}");
    assert_eq!(by[0].0, "Rt");
    assert!((20..=90).contains(&by[0].1), "{by:?}");
    assert_eq!(by[0].1 + by[1].1, 256);
}

/// The offsets of a job's reads, MiB, in issue order, with how many in a row (as `uniq -c`).
fn read_runs_mib(text: &str) -> Vec<(u64, u64)> {
    let text = format!("[global]\ninvalidate=0\nfadvise_hint=0\n{text}");
    let jf = fio::parse(&text, false).unwrap();
    let mut src = fio::FioSource::new(&jf, 0, 1 << 30).unwrap();
    let mut sim = Simulator::new(vec![Box::new(ConstantDevice::new(0.01))]);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    sim.run_streams(&mut src, &mut |c, _| {
        if c.req.op != Op::Read {
            return;
        }
        let mib = c.req.file.map_or(0, |f| f.offset >> 20);
        match runs.last_mut() {
            Some((m, n)) if *m == mib => *n += 1,
            _ => runs.push((mib, 1)),
        }
    })
    .unwrap();
    runs
}

/// `zonemode=strided`: fio 3.33 (`--size=8m --bs=64k --zonemode=strided --zonesize=1m
/// --zoneskip=1m`, its `write_iolog`) read 16 blocks in each of the zones at 0, 2, 4, 6 MiB,
/// then again from the start (128 reads, its size), for `rw=read` and `rw=randread` alike.
/// Before, zonemode was refused.
#[test]
fn strided_zones_as_fio_reads_them() {
    let want: Vec<(u64, u64)> = [0, 2, 4, 6, 0, 2, 4, 6].iter().map(|&m| (m, 16)).collect();
    for rw in ["read", "randread"] {
        let job =
            format!("[z]\nrw={rw}\nsize=8m\nbs=64k\nzonemode=strided\nzonesize=1m\nzoneskip=1m\n");
        assert_eq!(read_runs_mib(&job), want, "{rw}");
    }
    // zonesize alone is strided (fio's rule); zonemode=zbd writers are refused with their
    // line and why (a reader of fio's emulated, empty zones reads nothing: src/fio/extra.rs).
    let alone = "[z]\nrw=read\nsize=8m\nbs=64k\nzonesize=1m\nzoneskip=1m\n";
    assert_eq!(read_runs_mib(alone), want);
    let e = fio::parse("[z]\nrw=write\nsize=8m\nzonemode=zbd\nzonesize=1m\n", false).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("zonemode=zbd (line 4): fio's emulated zones with writes"),
        "{e}"
    );
}

/// fio's `cpuio` engine: no I/O; cycles of `cpuchunks` µs of CPU and the rest of the
/// `cpuload` share asleep until the runtime ends; the job after its stonewall starts then.
#[test]
fn cpuio_burns_its_runtime_without_io() {
    let (r, end, ops) = run(
        "[burn]\nioengine=cpuio\ncpuload=50\ncpumode=qsort\ntime_based\nruntime=1\n[after]\nstonewall\nrw=read\nsize=64k\n",
        0.1,
    );
    assert_eq!((r[0].read.ios, r[0].write.ios), (0, 0));
    assert_eq!(r[1].read.ios, 16);
    // 50 ms of CPU + 50 ms asleep per cycle: the last cycle starts before 1 s, the reads after.
    assert!((1000.0..1102.0).contains(&end), "{end}");
    assert_eq!(ops.iter().filter(|o| **o == Op::Read).count(), 16);
    let e = fio::parse("[c]\nioengine=cpuio\nruntime=1\n", false).unwrap_err();
    assert!(e.to_string().contains("cpuload"), "{e}");
}

/// Options of no effect on the simulated I/O (data content, error handling, io_uring's
/// submission flags) are accepted and change nothing; refusals name the option, its line and
/// why, the engine first.
#[test]
fn inert_options_change_nothing_and_refusals_say_why() {
    let plain = "[w]\nrw=randwrite\nsize=1m\nioengine=io_uring\niodepth=4\ndirect=1\n";
    let inert = format!(
        "{plain}dedupe_percentage=50\nbuffer_compress_percentage=50\nbuffer_pattern=0xaa\nscramble_buffers=1\ncontinue_on_error=all\nignore_error=,ENOSPC\nsqthread_poll=1\nregisterfiles\nfixedbufs\nverify_pattern=0x55\n"
    );
    let (a, ta, _) = run(plain, 0.1);
    let (b, tb, _) = run(&inert, 0.1);
    assert_eq!((a[0].write.ios, ta), (b[0].write.ios, tb));
    let e = fio::parse("[n]\nsize=1m\nport=8888\nioengine=net\n", false).unwrap_err();
    let first = e.to_string().lines().next().unwrap_or("").to_string();
    assert!(
        first.starts_with("ioengine=net (line 4): network I/O")
            && first.ends_with("(and 1 more refusal below)"),
        "{first}"
    );
    // An engine not modelled stays refused with --allow-unknown; options become warnings.
    assert!(fio::parse("[n]\nsize=1m\nioengine=rdma\n", true).is_err());
    let jf = fio::parse("[n]\nsize=1m\nramp_time=1\n", true).unwrap();
    assert!(jf.warnings[0].starts_with("ramp_time=1 (line 3)"));
}

/// `${VAR}` is taken from the environment, as fio's `fio_option_dup_subs`; an unset one is
/// refused by name (fio would put nothing in its place). Before, every `$` was refused.
#[test]
fn environment_variables_expand_as_in_fio() {
    let env = |k: &str| (k == "BS").then(|| "8k".to_string());
    let jf = fio::parse_with_env("[j]\nsize=1m\nbs=${BS}\n", false, &env).unwrap();
    assert_eq!(jf.jobs[0].bs, [(8192, 8192); 2]);
    let e = fio::parse_with_env("[j]\nsize=1m\nrw=${FIO_RW}\n", false, &env).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("rw=${FIO_RW} (line 3): environment variable FIO_RW is not set"),
        "{e}"
    );
    // fio's $clientuid is empty outside client/server mode.
    let jf = fio::parse(
        "[j]\nsize=1m\nfilename_format=f.$clientuid.$jobnum\n",
        false,
    )
    .unwrap();
    let src = fio::FioSource::new(&jf, 0, 1 << 20).unwrap();
    assert_eq!(src.files[0].name, "f..0");
}

/// `fill_device`: a file with no size takes the device's free space (fio writes until ENOSPC);
/// a later job on that file with no size takes its size (fio: the existing file's), and
/// verify on a read-only job adds no I/O (fio checks blocks as it reads them):
/// surface-scan.fio's pattern. A file no earlier job makes, with no size, is refused.
#[test]
fn fill_device_and_the_file_it_leaves() {
    let text = "[w]\nfilename=data\nrw=write\nbs=64k\nfill_device=1\nverify=meta\ndo_verify=0\n[r]\nstonewall\nfilename=data\nrw=read\nbs=64k\nverify=meta\ndo_verify=1\n";
    let jf = fio::parse(text, false).unwrap();
    // 64 MiB of device: the file takes all but the 1 MiB of layout slack.
    let src = fio::FioSource::new(&jf, 0, (64 << 20) / 512).unwrap();
    assert_eq!(src.files.len(), 1);
    assert_eq!(src.files[0].bytes, 63 << 20);
    let mut stats = fio::JobStats::new(&src);
    let mut src = src;
    let mut sim = Simulator::new(vec![Box::new(ConstantDevice::new(0.01))]);
    sim.run_streams(&mut src, &mut |c, s| stats.add(c, s))
        .unwrap();
    let r = stats.results();
    assert_eq!((r[0].write.ios, r[0].read.ios), (1008, 0));
    assert_eq!((r[1].write.ios, r[1].read.ios), (0, 1008));
    let e = fio::parse("[f]\nfilename=/tmp/x\nrw=read\n", false).unwrap_err();
    assert!(
        e.to_string().contains("no earlier job makes its file"),
        "{e}"
    );
}
