//! The device's measurements: latency and throughput by size, pattern and depth, the seek
//! profile and the write cache (fio, O_DIRECT through libaio, on the test file), and reads
//! into huge pages (threads of our own: fio cannot ask for such buffers).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::{CalPoint, HostSettings, Plan, SeekPoint, Setup, WriteCache, COMBOS};
use crate::fio::real::{DirOutput, Job, JobFile};
use crate::fio::Rw;

/// A measured point of fio's figures for one direction of a job.
fn point(op: &str, sequential: bool, size_kib: u64, qd: u32, d: &DirOutput) -> CalPoint {
    CalPoint {
        op: op.into(),
        pattern: if sequential { "sequential" } else { "random" }.into(),
        size_kib,
        qd,
        mean_us: d.lat_ns.mean_us(),
        p50_us: d.lat_ns.percentile_us("50.000000"),
        p99_us: d.lat_ns.percentile_us("99.000000"),
        mb_s: d.bw_bytes / 1e6,
        iops: d.iops,
    }
}

/// Mean latency and throughput by request size, op and pattern (one fio run each, calling
/// `step(what)` before it), a job per queue depth.
pub(super) fn points(s: &Setup, step: &mut dyn FnMut(&str)) -> Result<Vec<CalPoint>> {
    let mut points = Vec::new();
    for (op, pat, rw) in COMBOS {
        for &kib in &s.plan.sizes_kib {
            s.check_interrupted()?;
            step(&format!("{op} {pat} {kib} KiB"));
            let jobs = s
                .plan
                .qds
                .iter()
                // Big requests at high depth only measure the same bandwidth limit longer.
                .filter(|&&qd| !(kib >= 1024 && qd > 16))
                .map(|&qd| Job {
                    rw: Some(rw),
                    bs_kib: Some(kib),
                    iodepth: Some(qd),
                    ..Job::named(format!("p{qd}"))
                })
                .collect();
            let global = s.device_global();
            for job in s.fio(None, "cal.fio", JobFile { global, jobs })? {
                let qd = job
                    .jobname
                    .get(1..)
                    .and_then(|q| q.parse().ok())
                    .unwrap_or(1);
                points.push(point(op, pat == "seq", kib, qd, job.active()));
            }
        }
    }
    Ok(points)
}

/// The seek profile: 4 KiB reads, QD1, each job skipping its distance between them.
pub(super) fn seek_profile(s: &Setup) -> Result<Vec<SeekPoint>> {
    let jobs = s
        .plan
        .seek_kib
        .iter()
        .map(|&d| Job {
            rw: Some(Rw::Read),
            skip_kib: (d > 0).then_some(d),
            bs_kib: Some(4),
            iodepth: Some(1),
            ..Job::named(format!("s{d}"))
        })
        .collect();
    let global = s.device_global();
    let mut seek: Vec<SeekPoint> = s
        .fio(None, "seek.fio", JobFile { global, jobs })?
        .iter()
        .map(|job| SeekPoint {
            distance_kib: job
                .jobname
                .get(1..)
                .and_then(|d| d.parse().ok())
                .unwrap_or(0),
            mean_us: job.read.lat_ns.mean_us(),
        })
        .collect();
    seek.sort_by_key(|p| p.distance_kib);
    Ok(seek)
}

/// The write cache: 4 KiB random writes, QD1, plain, each followed by fsync, and O_DSYNC.
pub(super) fn write_cache(s: &Setup, host: &HostSettings) -> Result<WriteCache> {
    let write = |name: &str| Job {
        rw: Some(Rw::RandWrite),
        bs_kib: Some(4),
        iodepth: Some(1),
        ..Job::named(name)
    };
    let jobs = vec![
        write("plain"),
        Job {
            fsync: Some(1),
            ..write("fsync")
        },
        Job {
            dsync: true,
            ..write("dsync")
        },
    ];
    let global = s.device_global();
    let out = s.fio(None, "wc.fio", JobFile { global, jobs })?;
    // (write µs, sync call µs) of a job; NaN for a job fio did not report.
    let get = |name: &str| -> (f64, f64) {
        out.iter()
            .find(|j| j.jobname == name)
            .map(|j| (j.write.lat_ns.mean_us(), j.sync.lat_ns.mean / 1000.0))
            .unwrap_or((f64::NAN, 0.0))
    };
    let (plain, _) = get("plain");
    let (fw, fs) = get("fsync");
    let (dsync, _) = get("dsync");
    let verdict = if fw + fs > plain * 1.5 || dsync > plain * 1.5 {
        format!(
            "volatile write cache: a flush costs {:.0} µs over a plain write ({plain:.0} µs); O_DSYNC writes take {dsync:.0} µs",
            (fw + fs - plain).max(0.0)
        )
    } else {
        format!(
            "flushes are cheap: plain {plain:.0} µs, with fsync {:.0} µs, O_DSYNC {dsync:.0} µs (write-through or a battery-backed cache)",
            fw + fs
        )
    };
    Ok(WriteCache {
        write_us: plain,
        write_fsync_us: fw + fs,
        write_dsync_us: dsync,
        volatile_cache: host.queue.get("write_cache").cloned(),
        fua: host.queue.get("fua").cloned(),
        verdict,
    })
}

/// Runs each (pattern, size, depth) of the plan's large-folio grid for `plan.runtime_ms`:
/// `depth` threads, each reading `path` with O_DIRECT into its own buffer of transparent
/// huge pages (one memory segment per 2 MiB, as a read into the page cache's largest
/// folios), sequential reads sharing one advancing offset, random ones aligned to their
/// size. fio cannot ask for such buffers without a hugetlbfs mount (a system setting);
/// `madvise` can. Ok(Err(why)) when huge pages are not to be had here.
pub(super) fn huge_page_reads(
    path: &Path,
    plan: &Plan,
    interrupted: &AtomicBool,
) -> Result<std::result::Result<Vec<CalPoint>, String>> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    use std::sync::atomic::AtomicU64;
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if !thp.contains("[always]") && !thp.contains("[madvise]") {
        return Ok(Err(format!(
            "transparent huge pages are off ({})",
            thp.trim()
        )));
    }
    let max_kib = plan.large_sizes_kib.iter().copied().max().unwrap_or(0);
    let max_qd = plan.large_qds.iter().copied().max().unwrap_or(0) as usize;
    let before = crate::hugebuf::anon_huge_bytes().unwrap_or(0);
    let mut bufs = (0..max_qd)
        .map(|_| crate::hugebuf::HugeBuffer::new(max_kib as usize * 1024))
        .collect::<std::io::Result<Vec<_>>>()
        .context("allocating the huge-page buffers")?;
    let want: u64 = bufs.iter().map(|b| b.len() as u64).sum();
    let got = crate::hugebuf::anon_huge_bytes()
        .unwrap_or(0)
        .saturating_sub(before);
    if got < want / 2 {
        return Ok(Err(format!(
            "the kernel gave {} MiB of the {} MiB asked for in huge pages",
            got >> 20,
            want >> 20
        )));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("opening {} with O_DIRECT", path.display()))?;
    let file_bytes = file.metadata()?.len();
    let mut points = Vec::new();
    for sequential in [true, false] {
        for &kib in &plan.large_sizes_kib {
            for &qd in &plan.large_qds {
                if interrupted.load(Ordering::Relaxed) {
                    bail!("interrupted");
                }
                let size = kib * 1024;
                let slots = file_bytes / size;
                if slots == 0 {
                    continue;
                }
                let next = AtomicU64::new(0);
                let deadline = Instant::now() + std::time::Duration::from_millis(plan.runtime_ms);
                let t0 = Instant::now();
                let lats: Vec<std::io::Result<Vec<f64>>> = std::thread::scope(|sc| {
                    let handles: Vec<_> = bufs
                        .iter_mut()
                        .take(qd as usize)
                        .enumerate()
                        .map(|(i, buf)| {
                            let (file, next) = (&file, &next);
                            sc.spawn(move || {
                                let dst = buf.slice_mut(0, size as usize);
                                let mut rng =
                                    0x9e37_79b9_7f4a_7c15u64 ^ ((i as u64 + 1) * 0x2545_f491);
                                let mut lat = Vec::new();
                                while Instant::now() < deadline {
                                    let slot = if sequential {
                                        next.fetch_add(1, Ordering::Relaxed) % slots
                                    } else {
                                        rng ^= rng << 13;
                                        rng ^= rng >> 7;
                                        rng ^= rng << 17;
                                        rng % slots
                                    };
                                    let t = Instant::now();
                                    file.read_exact_at(dst, slot * size)?;
                                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                                }
                                Ok(lat)
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("a reader thread panicked"))
                        .collect()
                });
                let secs = t0.elapsed().as_secs_f64();
                let mut all = Vec::new();
                for l in lats {
                    all.extend(l.with_context(|| format!("O_DIRECT read of {}", path.display()))?);
                }
                if all.is_empty() {
                    continue;
                }
                all.sort_by(f64::total_cmp);
                let n = all.len();
                let pct = |q: f64| all[((n as f64 * q) as usize).min(n - 1)];
                points.push(CalPoint {
                    op: "read".into(),
                    pattern: if sequential { "sequential" } else { "random" }.into(),
                    size_kib: kib,
                    qd,
                    mean_us: all.iter().sum::<f64>() / n as f64,
                    p50_us: pct(0.5),
                    p99_us: pct(0.99),
                    mb_s: (n as u64 * size) as f64 / secs / 1e6,
                    iops: n as f64 / secs,
                });
            }
        }
    }
    Ok(Ok(points))
}
