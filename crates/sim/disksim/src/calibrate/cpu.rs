//! The page cache's CPU costs (the host's [`HostCpu`]), each measured with fio in rounds
//! minutes apart and kept as the median of its samples: buffered reads of cached data by
//! size and by the size of the set they go over, buffered writes into new pages, a read's
//! cost per new folio and per folio reclaimed, and what `POSIX_FADV_DONTNEED` costs per dirty
//! page.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use iolab_sys::percentile::median;

use super::{
    OwnedFile, Setup, CACHED_READ_MS, CACHED_READ_SET_MIB, CACHED_SETS_MIB, MISS_CGROUP_BYTES,
    MISS_CGROUP_RAMP_MS,
};
use crate::fio::real::{DirOutput, Engine, Job, JobFile, JobOutput};
use crate::fio::Rw;
use crate::host::HostCpu;
use crate::linuxval::MemCgroup;

/// The sizes of the cached-read and buffered-write tables (KiB). The validation's sizes (32,
/// 128, 512 KiB) are among them: no interpolation there.
const CPU_SIZES: [u64; 9] = [4, 16, 32, 64, 128, 256, 512, 1024, 4096];
/// The sizes of the miss-cost reads (KiB).
const MISS_SIZES: [u64; 2] = [128, 512];

/// The jobs of every round, by measurement, then the costs they give ([`CpuCosts::finish`]).
pub(super) struct CpuCosts<'a> {
    s: &'a Setup<'a>,
    /// The memory cgroup of the reclaim cost (none without a memory controller, not root:
    /// reclaim then counts as free).
    miss_cgroup: Option<MemCgroup>,
    reads: Vec<JobOutput>,
    sets: Vec<JobOutput>,
    writes: Vec<JobOutput>,
    misses: Vec<JobOutput>,
    reclaims: Vec<JobOutput>,
}

/// A job reading cached data for CACHED_READ_MS.
fn cached_read(name: String, bs_kib: u64) -> Job {
    Job {
        rw: Some(Rw::Read),
        bs_kib: Some(bs_kib),
        invalidate: Some(false),
        time_based: true,
        runtime_ms: Some(CACHED_READ_MS),
        ..Job::named(name)
    }
}

/// Buffered psync I/O, one job after the other.
fn buffered_global() -> Job {
    Job {
        ioengine: Some(Engine::Psync),
        direct: Some(false),
        stonewall: true,
        ..Default::default()
    }
}

impl<'a> CpuCosts<'a> {
    pub(super) fn new(s: &'a Setup<'a>) -> CpuCosts<'a> {
        let miss_cgroup = match crate::linuxval::create_cgroup(None, MISS_CGROUP_BYTES) {
            Ok(cg) => Some(cg),
            Err(e) => {
                tracing::warn!(
                    "the reclaim cost of a full cache is not measured (counts as free): {e}"
                );
                None
            }
        };
        CpuCosts {
            s,
            miss_cgroup,
            reads: Vec::new(),
            sets: Vec::new(),
            writes: Vec::new(),
            misses: Vec::new(),
            reclaims: Vec::new(),
        }
    }

    /// System-call cost of buffered reads served by the page cache: the first
    /// CACHED_READ_SET_MIB of the test file read once to warm it, then read at each size,
    /// round and round (one pass was 4 reads at 4 MiB and a few ms in all, which fio times
    /// in whole ms).
    pub(super) fn cached_reads(&mut self, round: usize) -> Result<()> {
        let mut jobs = vec![Job {
            rw: Some(Rw::Read),
            bs_kib: Some(1024),
            invalidate: Some(true),
            ..Job::named("warm")
        }];
        for r in 0..self.s.per_round {
            for k in CPU_SIZES {
                jobs.push(cached_read(format!("c{k}_{round}{r}"), k));
            }
        }
        let global = Job {
            filename: Some(self.s.file.to_path_buf()),
            size_bytes: Some(CACHED_READ_SET_MIB << 20),
            ..buffered_global()
        };
        let out = self.s.fio(None, "cpu.fio", JobFile { global, jobs })?;
        self.reads.extend(out);
        Ok(())
    }

    /// How the copy's cost depends on the set a job's cached reads go over (see
    /// HostCpu::cached_set_us): 32 KiB reads of a file of each size in CACHED_SETS_MIB,
    /// created here, read whole once and then CACHED_READ_SAMPLES times back to back, each
    /// set in a file of its own as a job's is (reading the first part of the 64 MiB file
    /// instead measured sets below the CPU's cache at the large set's cost, 4.0 against
    /// 2.7-3.0 µs at 24 MiB, 28 Nov).
    pub(super) fn cached_sets(&mut self, round: usize) -> Result<()> {
        let mut files = Vec::new();
        let mut jobs = Vec::new();
        for m in CACHED_SETS_MIB {
            let owned = OwnedFile::create_new(self.s.dir, &format!("cset{m}_{round}"))?;
            let in_set = |job: Job| Job {
                filename: Some(owned.path.clone()),
                size_bytes: Some(m << 20),
                ..job
            };
            jobs.push(in_set(Job {
                rw: Some(Rw::Read),
                bs_kib: Some(1024),
                ..Job::named(format!("l{m}_{round}"))
            }));
            for r in 0..self.s.per_round {
                jobs.push(in_set(cached_read(format!("s{m}_{round}{r}"), 32)));
            }
            files.push(owned);
        }
        let global = buffered_global();
        let out = self.s.fio(None, "cset.fio", JobFile { global, jobs })?;
        drop(files);
        self.sets.extend(out);
        Ok(())
    }

    /// Buffered writes into new pages (the cost `write` jobs pay before write-back): one
    /// fresh file per size and sample, created here (never a file already there) and removed
    /// after its round, 16 MiB each, well under the dirty thresholds so nothing waits for the
    /// device. CACHED_READ_SAMPLES samples in each round, like the cached reads: one pass at
    /// each size, once, measured a 512 KiB write at half its cost on a bad minute.
    pub(super) fn buffered_writes(&mut self, round: usize) -> Result<()> {
        let mut files = Vec::new();
        let mut jobs = Vec::new();
        for r in 0..self.s.per_round {
            for k in CPU_SIZES {
                let owned = OwnedFile::create_new(self.s.dir, &format!("wcost{k}_{round}{r}"))?;
                jobs.push(Job {
                    filename: Some(owned.path.clone()),
                    rw: Some(Rw::Write),
                    bs_kib: Some(k),
                    ..Job::named(format!("w{k}_{round}{r}"))
                });
                files.push(owned);
            }
        }
        let global = Job {
            size_bytes: Some(16 << 20),
            ..buffered_global()
        };
        let out = self.s.fio(None, "wcost.fio", JobFile { global, jobs })?;
        drop(files);
        self.writes.extend(out);
        Ok(())
    }

    /// A read's cost per new 4 KiB folio: buffered random reads of a cold file
    /// (fadvise_hint: POSIX_FADV_RANDOM, so no read-ahead and order-0 folios) against
    /// O_DIRECT ones of the same size, interleaved, less the copy; the median per page over
    /// two rounds (one round measured 0.22 µs where five others measured 1.7-3.2).
    pub(super) fn misses(&mut self, round: usize) -> Result<()> {
        let out = self.s.fio(None, "miss.fio", self.miss_jobs(round, false))?;
        self.misses.extend(out);
        Ok(())
    }

    /// The same jobs as [`CpuCosts::misses`] in a memory cgroup of MISS_CGROUP_BYTES kept
    /// full (each buffered job first reads MISS_CGROUP_RAMP_MS unmeasured, which fills it:
    /// `invalidate` empties it at the job's start), whose reads reclaim a page for every page
    /// they bring in: the difference is the reclaim's cost.
    pub(super) fn reclaims(&mut self, round: usize) -> Result<()> {
        if let Some(cg) = &self.miss_cgroup {
            let jobs = self.miss_jobs(round, true);
            let out = self.s.fio(Some(&cg.procs), "miss-cg.fio", jobs)?;
            self.reclaims.extend(out);
        }
        Ok(())
    }

    /// The miss-cost jobs of a round: `b{k}_{round}{sample}` buffered and its O_DIRECT twin
    /// `d{k}_{round}{sample}`, over the device measurements' file and times.
    fn miss_jobs(&self, round: usize, in_cgroup: bool) -> JobFile {
        let mut jobs = Vec::new();
        for r in 0..self.s.per_round {
            for k in MISS_SIZES {
                for (name, direct) in [("b", false), ("d", true)] {
                    jobs.push(Job {
                        rw: Some(Rw::RandRead),
                        ioengine: Some(Engine::Psync),
                        bs_kib: Some(k),
                        direct: Some(direct),
                        invalidate: Some(true),
                        runtime_ms: Some(CACHED_READ_MS),
                        ramp_time_ms: (in_cgroup && !direct).then_some(MISS_CGROUP_RAMP_MS),
                        ..Job::named(format!("{name}{k}_{round}{r}"))
                    });
                }
            }
        }
        let global = Job {
            direct: None,
            invalidate: None,
            ..self.s.device_global()
        };
        JobFile { global, jobs }
    }

    /// The costs of every round's samples.
    pub(super) fn finish(self) -> Result<HostCpu> {
        let read: fn(&JobOutput) -> &DirOutput = |j| &j.read;
        let cached_read_us = cost_table(&self.reads, "c", read, &CPU_SIZES);
        let cached_set_us = cost_table(&self.sets, "s", read, &CACHED_SETS_MIB);
        // fio's own time per I/O: the 4 KiB jobs' run time per I/O beyond their latency.
        // (Every sample is >= 0: `max` turns the median of none, NaN, into 0.)
        let app_gap_us = median(&samples(&self.reads, "c4", |j| {
            let d = &j.read;
            if d.total_ios > 0.0 {
                (d.runtime * 1000.0 / d.total_ios - d.lat_ns.mean_us()).max(0.0)
            } else {
                f64::NAN
            }
        }))
        .unwrap_or(f64::NAN)
        .max(0.0);
        let cached_write_us = cost_table(&self.writes, "w", |j| &j.write, &CPU_SIZES);
        let miss = |jobs: &[JobOutput]| {
            median(&miss_samples(jobs, &MISS_SIZES, &cached_read_us)).unwrap_or(f64::NAN)
        };
        let miss_folio_us = miss(&self.misses).max(0.0);
        drop(self.miss_cgroup);
        // (no cgroup: the median of nothing, NaN, which `max` turns into 0)
        let reclaim_folio_us = (miss(&self.reclaims) - miss_folio_us).max(0.0);
        let dontneed_dirty_page_us = dontneed_cost(self.s.dir, self.s.interrupted)?;
        Ok(HostCpu {
            cached_read_us,
            cached_write_us,
            app_gap_us,
            miss_folio_us,
            reclaim_folio_us,
            dontneed_dirty_page_us,
            cached_set_us,
        })
    }
}

/// A (KiB, mean µs) table from fio jobs named PREFIX + size in KiB, or PREFIX + size + "_" +
/// sample (the median of the samples' means), of the direction `dir` picks; sizes with no
/// usable job are left out.
fn cost_table(
    jobs: &[JobOutput],
    prefix: &str,
    dir: fn(&JobOutput) -> &DirOutput,
    sizes: &[u64],
) -> Vec<[f64; 2]> {
    let mut t = Vec::new();
    for &k in sizes {
        let us = samples(jobs, &format!("{prefix}{k}"), |j| dir(j).lat_ns.mean_us());
        if let Some(m) = median(&us) {
            t.push([k as f64, m]);
        }
    }
    t
}

/// `f` of each job named NAME or NAME + "_" + anything, where finite and >= 0.
fn samples(jobs: &[JobOutput], name: &str, f: impl Fn(&JobOutput) -> f64) -> Vec<f64> {
    jobs.iter()
        .filter(|j| {
            let n = &j.jobname;
            n == name || n.strip_prefix(name).is_some_and(|r| r.starts_with('_'))
        })
        .map(f)
        .filter(|v| v.is_finite() && *v >= 0.0)
        .collect()
}

/// A page miss's cost (µs per 4 KiB page) of each pair of miss-cost jobs: buffered job
/// `b{k}_{sample}` less its O_DIRECT twin `d{k}_{sample}` less the copy of `k` KiB from
/// `copy_us` ((KiB, µs) table), per page; pairs with a missing or unusable half are left out.
fn miss_samples(jobs: &[JobOutput], sizes: &[u64], copy_us: &[[f64; 2]]) -> Vec<f64> {
    let mut per_page = Vec::new();
    for &k in sizes {
        let copy = crate::host::table_us(copy_us, k as f64);
        let prefix = format!("b{k}_");
        for job in jobs {
            let Some(sample) = job.jobname.strip_prefix(&prefix) else {
                continue;
            };
            let twin = format!("d{k}_{sample}");
            let Some(d) = jobs.iter().find(|j| j.jobname == twin) else {
                continue;
            };
            let extra =
                (job.read.lat_ns.mean_us() - d.read.lat_ns.mean_us() - copy) / (k / 4) as f64;
            if extra.is_finite() {
                per_page.push(extra.max(0.0));
            }
        }
    }
    per_page
}

/// Dirty data per `dontneed_cost` sample, and samples.
const DONTNEED_BYTES: usize = 32 << 20;
const DONTNEED_SAMPLES: usize = 3;

/// What `POSIX_FADV_DONTNEED` costs its caller per dirty page it sends to write-back (µs):
/// the median over samples of one call over a fresh file of DONTNEED_BYTES of buffered
/// writes (a file created here with O_EXCL and removed after each sample).
fn dontneed_cost(dir: &Path, interrupted: &AtomicBool) -> Result<f64> {
    use std::os::fd::AsRawFd;
    let chunk = vec![0x5au8; 1 << 20];
    let mut per_page = Vec::new();
    for r in 0..DONTNEED_SAMPLES {
        if interrupted.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        let owned = OwnedFile::create_new(dir, &format!("dontneed{r}"))?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&owned.path)
            .with_context(|| format!("opening {}", owned.path.display()))?;
        for _ in 0..DONTNEED_BYTES / chunk.len() {
            f.write_all(&chunk)
                .with_context(|| format!("writing {}", owned.path.display()))?;
        }
        let t = Instant::now();
        // SAFETY: posix_fadvise on a descriptor we own; no memory is passed.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let us = t.elapsed().as_secs_f64() * 1e6;
        if rc == 0 {
            per_page.push(us / (DONTNEED_BYTES / 4096) as f64);
        }
        // Written out before the file goes, so the next sample's pages are not waiting
        // behind this one's write-back.
        let _ = f.sync_all();
    }
    Ok(median(&per_page).unwrap_or(f64::NAN).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job of fio's output named `name` whose reads took `us` µs on average.
    fn read_job((name, us): (&str, f64)) -> JobOutput {
        let mut j = JobOutput {
            jobname: name.into(),
            ..Default::default()
        };
        j.read.lat_ns.mean = us * 1000.0;
        j
    }

    #[test]
    fn a_miss_cost_pairs_each_buffered_sample_with_its_direct_twin() {
        let jobs = [
            ("b128_00", 150.0),
            ("d128_00", 100.0),
            ("b128_11", 140.0),
            ("d128_01", 10.0),
            ("d128_11", 120.0),
            ("b512_10", 500.0),
        ]
        .map(read_job);
        // Copy 18 µs at 128 KiB (32 pages): (150 - 100 - 18) / 32 = 1.0 and
        // (140 - 120 - 18) / 32 = 0.0625; b512_10 has no twin, d128_01 no buffered half.
        let copy = [[128.0, 18.0], [512.0, 70.0]];
        let mut got = miss_samples(&jobs, &[128, 512], &copy);
        got.sort_by(f64::total_cmp);
        assert_eq!(got, vec![0.0625, 1.0]);
    }

    #[test]
    fn a_cost_is_the_median_of_its_samples() {
        let jobs = [
            ("c4_0", 1.0),
            ("c4096_0", 400.0),
            ("c4_1", 9.0),
            ("c4096_1", 300.0),
            ("c4_2", 2.0),
            ("c512", 80.0),
            ("c16_0", f64::NAN),
        ]
        .map(read_job);
        // c4's samples are 1, 9, 2 (not c4096's); c512 a single job; c16 none usable.
        let t = cost_table(&jobs, "c", |j| &j.read, &[4, 16, 512, 4096]);
        assert_eq!(t, vec![[4.0, 2.0], [512.0, 80.0], [4096.0, 350.0]]);
    }
}
