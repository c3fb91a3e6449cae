//! The host's CPU cost of system calls, as `calibrate` measures it ([`HostCpu`]), and the
//! component that charges it ([`Syscalls`]).

use anyhow::{bail, Result};
use iolab_sys::percentile::median;
use serde::Serialize;

use crate::engine::{Component, Ctx, Finished};
use crate::request::{Completion, Flags, Op, Request};

/// CPU time of a buffered read or write system call on the host, measured by `calibrate`
/// (reads of a cached file at several sizes): `cached_read_us` lists (KiB, µs) points,
/// interpolated linearly in log2(size) and extrapolated in proportion to the size beyond the
/// largest. The cost is not smooth on every machine (on this VM 128 KiB reads take 9 µs and
/// 512 KiB ones 700 µs), hence a table. O_DIRECT requests carry none (the device latency
/// measured with O_DIRECT already holds the system call).
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HostCpu {
    pub cached_read_us: Vec<[f64; 2]>,
    /// Buffered writes into new page-cache pages, (KiB, µs) as `cached_read_us`: the copy
    /// plus page allocation and dirtying, about twice a cached read's cost. Empty (older
    /// calibrations): writes cost the affine part of the read table.
    #[serde(default)]
    pub cached_write_us: Vec<[f64; 2]>,
    /// The application's own time between a completion and its next request (fio's loop,
    /// µs): measured as (run time / I/Os) − mean latency on cached 4 KiB reads.
    #[serde(default)]
    pub app_gap_us: f64,
    /// A read's cost per new folio it brings into the cache, µs (allocation, memcg charge,
    /// insertion, reclaim; see `PageCacheConfig::miss_folio_ms`): measured as buffered
    /// random cold reads (no read-ahead: 4 KiB folios) less O_DIRECT ones and less the
    /// copy, per page. 0 (older calibrations): free.
    #[serde(default)]
    pub miss_folio_us: f64,
    /// What reclaiming room for such a folio adds when the cache is full, µs (see
    /// `PageCacheConfig::reclaim_folio_ms`): the same reads run in a small memory cgroup kept
    /// full, per page, less `miss_folio_us`. 0 (older calibrations): free.
    #[serde(default)]
    pub reclaim_folio_us: f64,
    /// `POSIX_FADV_DONTNEED`'s cost per dirty page it sends to write-back, µs (see
    /// `PageCacheConfig::dontneed_dirty_page_ms`): measured on a fresh file of dirty pages.
    /// 0 (older calibrations): free.
    #[serde(default)]
    pub dontneed_dirty_page_us: f64,
    /// Cached 32 KiB reads by the size of the cached set they go over, (MiB, µs): a copy
    /// out of a set the CPU's caches hold runs faster than one from memory (this VM, 28 Nov:
    /// 2.2 µs over 24 MiB, 4.5 over 64 MiB), and `cached_read_us` was measured over
    /// [`CACHED_TABLE_SET_MIB`]. A job's reads are scaled by this profile at its own set
    /// ([`HostCpu::for_cached_set`]). Empty (older calibrations): no scaling.
    #[serde(default)]
    pub cached_set_us: Vec<[f64; 2]>,
}

/// The cached set (MiB) `cached_read_us` is measured over by `calibrate`.
pub const CACHED_TABLE_SET_MIB: u64 = 64;

impl HostCpu {
    /// Cost (µs) of a buffered read of `kib` KiB.
    pub fn cost_us(&self, kib: f64) -> f64 {
        table_us(&self.cached_read_us, kib)
    }

    /// Cost (µs) of a buffered write of `kib` KiB into new pages (0 without a write table).
    pub fn write_cost_us(&self, kib: f64) -> f64 {
        table_us(&self.cached_write_us, kib)
    }

    /// The costs for a job whose cached reads go over `set_bytes` (its files, at most the
    /// page cache's size): the read table scaled by the set profile's value there over its
    /// value at [`CACHED_TABLE_SET_MIB`] (clamped to the profile's ends: past its largest
    /// set a copy runs at memory speed). No profile, or no set: unchanged.
    pub fn for_cached_set(&self, set_bytes: u64) -> HostCpu {
        let mut c = self.clone();
        if self.cached_set_us.is_empty() || set_bytes == 0 {
            return c;
        }
        // (the tables' interpolation, but held at the largest set: no proportional growth)
        let [largest, at_largest] = self.cached_set_us[self.cached_set_us.len() - 1];
        let at = |mib: f64| {
            if mib >= largest {
                at_largest
            } else {
                table_us(&self.cached_set_us, mib)
            }
        };
        let (here, table) = (
            at(set_bytes as f64 / 1048576.0),
            at(CACHED_TABLE_SET_MIB as f64),
        );
        if here > 0.0 && table > 0.0 && here.is_finite() && table.is_finite() {
            for p in &mut c.cached_read_us {
                p[1] *= here / table;
            }
        }
        c
    }

    /// The affine part `(syscall µs, µs per KiB)`: the slope of a robust fit of the table up
    /// to 128 KiB, where the cost is a copy, under every one of those points (the smallest
    /// intercept, at least 0). The page cache charges it to every buffered call, reads and
    /// writes; [`Syscalls`] adds what reads (and, with a write table, writes) cost beyond it,
    /// and can only add: a line above a point would price that size above its own
    /// measurement. So [`fit_affine`]'s intercept (the median, held at 1 µs or more for
    /// device latencies) is not used: on this VM it lay 0.2-0.6 µs above the points (a 4 KiB
    /// cached read takes 0.89 µs), and a 32 KiB hit cost 4.3 µs against the table's 3.2.
    pub fn affine(&self) -> (f64, f64) {
        let pts: Vec<(f64, f64)> = self
            .cached_read_us
            .iter()
            .filter(|p| p[0] <= 128.0)
            .map(|p| (p[0], p[1]))
            .collect();
        match fit_affine(&pts) {
            Some((_, b)) => {
                let a = pts
                    .iter()
                    .map(|(x, y)| y - b * x)
                    .fold(f64::INFINITY, f64::min);
                (a.max(0.0), b)
            }
            None => (self.cost_us(4.0), 0.0),
        }
    }

    /// Extra cost of a buffered read or write beyond the affine part `(a, b)` (which the page
    /// cache charges; see [`HostCpu::affine`]), ms.
    fn cost_ms(&self, req: &Request, (a, b): (f64, f64)) -> f64 {
        if req.flags.contains(Flags::DIRECT) {
            return 0.0;
        }
        let kib = req.bytes() as f64 / 1024.0;
        let table = match req.op {
            Op::Read => self.cost_us(kib),
            Op::Write if !self.cached_write_us.is_empty() => self.write_cost_us(kib),
            _ => return 0.0,
        };
        (table - (a + b * kib)).max(0.0) / 1000.0
    }

    /// Checks the table: sizes ascending and positive, costs finite and >= 0.
    pub fn validate(&self) -> Result<()> {
        for (name, t) in [
            ("cached_read_us", &self.cached_read_us),
            ("cached_write_us", &self.cached_write_us),
            ("cached_set_us", &self.cached_set_us),
        ] {
            let mut prev = 0.0;
            for [k, us] in t {
                if !(k.is_finite() && *k > prev && us.is_finite() && *us >= 0.0) {
                    bail!("host_cpu.{name}: [size, µs] pairs with sizes ascending and µs >= 0");
                }
                prev = *k;
            }
        }
        if !(self.app_gap_us.is_finite() && (0.0..1e6).contains(&self.app_gap_us)) {
            bail!("host_cpu.app_gap_us must be within 0..1000000");
        }
        for (name, v) in [
            ("miss_folio_us", self.miss_folio_us),
            ("reclaim_folio_us", self.reclaim_folio_us),
            ("dontneed_dirty_page_us", self.dontneed_dirty_page_us),
        ] {
            if !(v.is_finite() && (0.0..1e6).contains(&v)) {
                bail!("host_cpu.{name} must be within 0..1000000");
            }
        }
        Ok(())
    }
}

/// A (KiB, µs) table's value at `kib`: linear in log2(size) between points, the first
/// point's below them, in proportion to the size beyond the last; 0 for an empty table.
pub fn table_us(t: &[[f64; 2]], kib: f64) -> f64 {
    if t.is_empty() {
        return 0.0;
    }
    let i = t.partition_point(|p| p[0] < kib);
    let v = if i == 0 {
        t[0][1]
    } else if i >= t.len() {
        let [k, us] = t[t.len() - 1];
        us * kib / k.max(1e-9)
    } else {
        let ([k0, u0], [k1, u1]) = (t[i - 1], t[i]);
        let f = (kib.max(1e-9).log2() - k0.max(1e-9).log2())
            / (k1.max(1e-9).log2() - k0.max(1e-9).log2()).max(1e-12);
        u0 + f * (u1 - u0)
    };
    if v.is_finite() {
        v.max(0.0)
    } else {
        0.0
    }
}

/// The system-call level: adds [`HostCpu`]'s cost to each buffered request's completion.
pub struct Syscalls {
    cpu: HostCpu,
    /// `cpu.affine()`, fitted once (a robust fit per request was a tenth of the run time).
    affine: (f64, f64),
    /// The last cost worked out: (bytes, op, flags, ms). A job repeats one size, and the
    /// table's log interpolation was a twentieth of a cache hit's simulation.
    memo: Option<(u64, Op, Flags, f64)>,
}

impl Syscalls {
    pub fn new(cpu: HostCpu) -> Syscalls {
        let mut cpu = cpu;
        cpu.cached_read_us.sort_by(|a, b| a[0].total_cmp(&b[0]));
        cpu.cached_write_us.sort_by(|a, b| a[0].total_cmp(&b[0]));
        Syscalls {
            affine: cpu.affine(),
            cpu,
            memo: None,
        }
    }

    /// A completion on its way up at `now`: its system call's CPU cost added.
    fn finish(&mut self, done: &mut Completion, now: f64) -> Finished {
        let key = (done.req.bytes(), done.req.op, done.req.flags);
        let cost = match self.memo {
            Some((b, o, f, c)) if (b, o, f) == key => c,
            _ => {
                let c = self.cpu.cost_ms(&done.req, self.affine);
                self.memo = Some((key.0, key.1, key.2, c));
                c
            }
        };
        if cost <= 0.0 {
            return Finished::Up;
        }
        done.rec.overhead += cost;
        done.rec.completion = now + cost;
        Finished::UpAt
    }
}

impl Component for Syscalls {
    fn name(&self) -> &str {
        "syscalls"
    }
    fn submit(&mut self, req: Request, ctx: &mut Ctx) {
        ctx.down(req);
    }
    fn passes_requests(&self) -> bool {
        true
    }
    fn complete(&mut self, mut done: Completion, ctx: &mut Ctx) {
        match self.finish(&mut done, ctx.now()) {
            Finished::Up => ctx.up(done),
            Finished::UpAt => ctx.up_at(done),
        }
    }
    fn complete_now(&mut self, done: &mut Completion, now: f64) -> Option<Finished> {
        Some(self.finish(done, now))
    }
}

/// Robust affine fit `latency = a + b × KiB` (Theil–Sen: the median of the pairwise slopes,
/// the median intercept) of points of one operation, pattern and queue depth: on a shared
/// machine one point in five can be several times too slow, and a table would keep it. The
/// fit is what the simulator gets; the raw points stay in the JSON.
pub fn fit_affine(pts: &[(f64, f64)]) -> Option<(f64, f64)> {
    if pts.len() < 3 {
        return None;
    }
    let mut slopes = Vec::new();
    for i in 0..pts.len() {
        for j in i + 1..pts.len() {
            let dx = pts[j].0 - pts[i].0;
            if dx.abs() > 1e-12 {
                slopes.push((pts[j].1 - pts[i].1) / dx);
            }
        }
    }
    let b = median(&slopes).unwrap_or(f64::NAN).max(0.0);
    let icpt: Vec<f64> = pts.iter().map(|(x, y)| y - b * x).collect();
    let a = median(&icpt).unwrap_or(f64::NAN);
    (a.is_finite() && b.is_finite()).then_some((a.max(1.0), b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_fit_ignores_an_outlier() {
        let pts = [
            (4.0, 160.0),
            (16.0, 1242.0),
            (64.0, 240.0),
            (256.0, 600.0),
            (1024.0, 2000.0),
            (4096.0, 7500.0),
        ];
        let (a, b) = fit_affine(&pts).unwrap();
        // The five regular points lie near 150 + 1.8 × KiB; the 16 KiB one is 1000 µs off.
        assert!((100.0..250.0).contains(&a), "{a}");
        assert!((1.6..2.0).contains(&b), "{b}");
        assert!(fit_affine(&pts[..2]).is_none());
    }

    use crate::engine::{ConstantDevice, Simulator};
    use crate::fio::{parse, FioSource};

    #[test]
    fn host_cpu_table_interpolates_in_log_size() {
        let c = HostCpu {
            cached_read_us: vec![[4.0, 2.0], [16.0, 6.0], [64.0, 10.0]],
            ..Default::default()
        };
        assert_eq!(c.cost_us(4.0), 2.0);
        assert_eq!(c.cost_us(1.0), 2.0);
        assert!((c.cost_us(8.0) - 4.0).abs() < 1e-9);
        assert!((c.cost_us(128.0) - 20.0).abs() < 1e-9);
        assert_eq!(HostCpu::default().cost_us(100.0), 0.0);
        assert!(HostCpu {
            cached_read_us: vec![[4.0, 1.0], [2.0, 1.0]],
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(HostCpu {
            cached_read_us: vec![[4.0, 1.0]],
            cached_write_us: vec![[4.0, -1.0]],
            ..Default::default()
        }
        .validate()
        .is_err());
        // The affine part of a table that jumps at 512 KiB (this VM) is the small-size copy.
        let vm = HostCpu {
            cached_read_us: vec![[4.0, 2.5], [32.0, 9.0], [128.0, 9.0], [512.0, 700.0]],
            ..Default::default()
        };
        let (a, b) = vm.affine();
        assert!(a <= 2.5 && b < 0.3, "{a} {b}");
    }

    /// The cached-set profile scales the read table by the job's set against the table's
    /// own set (64 MiB), clamped at the profile's ends; no profile, no change.
    #[test]
    fn cached_reads_of_a_smaller_set_cost_what_the_profile_says() {
        let table = vec![[4.0, 1.0], [32.0, 4.0], [512.0, 70.0]];
        let c = HostCpu {
            cached_read_us: table.clone(),
            cached_set_us: vec![[8.0, 2.0], [32.0, 2.0], [64.0, 4.0], [128.0, 4.0]],
            ..Default::default()
        };
        let mib = 1u64 << 20;
        assert_eq!(c.for_cached_set(64 * mib).cached_read_us, table);
        assert_eq!(c.for_cached_set(4096 * mib).cached_read_us, table);
        let small = c.for_cached_set(16 * mib);
        assert_eq!(
            small.cached_read_us,
            vec![[4.0, 0.5], [32.0, 2.0], [512.0, 35.0]]
        );
        assert_eq!(c.for_cached_set(mib).cached_read_us, small.cached_read_us);
        // halfway in log2 between 32 and 64 MiB: 3 of the table's 4
        let mid = c.for_cached_set((45.254834 * mib as f64) as u64);
        assert!(
            (mid.cost_us(32.0) - 3.0).abs() < 1e-3,
            "{}",
            mid.cost_us(32.0)
        );
        let none = HostCpu {
            cached_read_us: table.clone(),
            ..Default::default()
        };
        assert_eq!(none.for_cached_set(mib).cached_read_us, table);
        assert_eq!(c.for_cached_set(0).cached_read_us, table);
        assert!(HostCpu {
            cached_read_us: table,
            cached_set_us: vec![[64.0, 1.0], [8.0, 1.0]],
            ..Default::default()
        }
        .validate()
        .is_err());
    }

    /// The engine's shortcuts (a lone event run at once, cached reads served through the
    /// fast lane) leave real host chains' runs unchanged: jobs that read ahead, evict, hit,
    /// write back, throttle and mix streams complete the same requests at the same times
    /// with the same outcomes, through the same number of events, with and without them.
    #[test]
    fn the_engines_shortcuts_change_no_fio_job() {
        let cpu = HostCpu {
            cached_read_us: vec![[4.0, 0.9], [32.0, 3.2], [128.0, 12.3], [512.0, 67.0]],
            miss_folio_us: 1.5,
            reclaim_folio_us: 1.0,
            ..Default::default()
        };
        let jobs = [
            // Sequential reads through a cache smaller than the file: read-ahead, markers,
            // eviction, and hits on pages read ahead.
            "[j]\nrw=read\nsize=8m\nbs=32k\nioengine=psync\n",
            // Unaligned sizes: reads continuing inside the previous read's last page (whose
            // second access does not count), over a file larger than the cache, read again.
            "[j]\nrw=read\nsize=2m\nbs=6k\nioengine=psync\nfadvise_hint=sequential\n",
            "[j]\nrw=read\nsize=5m\nbs=6k\nioengine=psync\ntime_based\nruntime=80ms\ninvalidate=0\n",
            // A file read twice (time_based): the second pass hits, pages get promoted.
            "[j]\nrw=read\nsize=1m\nbs=16k\nioengine=psync\ntime_based\nruntime=40ms\ninvalidate=0\n",
            // Random reads by four closed loops at once, some hits, some misses.
            "[j]\nrw=randread\nsize=2m\nbs=32k\nioengine=libaio\niodepth=2\nnumjobs=2\ntime_based\nruntime=30ms\ninvalidate=0\n",
            // Reads and writes mixed: dirty pages, write-back, hits on dirty pages.
            "[j]\nrw=randrw\nrwmixread=60\nsize=4m\nbs=16k\nioengine=psync\ntime_based\nruntime=40ms\n",
            // Buffered writes past the dirty thresholds beside O_DIRECT reads.
            "[w]\nrw=write\nsize=8m\nbs=128k\nioengine=psync\n[r]\nrw=read\nsize=8m\nbs=64k\ndirect=1\nioengine=psync\n",
        ];
        for (i, text) in jobs.iter().enumerate() {
            let run = |shortcut: bool| {
                let jf = parse(text, false).unwrap();
                let mut host = crate::host::HostParams::linux_defaults();
                host.page_cache.capacity_pages = 1024; // 4 MiB
                host.page_cache.dirty.dirtyable_pages = 1024;
                let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
                let dev = Box::new(ConstantDevice::new(0.05));
                let chain = host
                    .stack()
                    .cpu(Some(&cpu))
                    .files(&src.file_sizes())
                    .on(dev)
                    .unwrap();
                let mut sim = Simulator::new(chain);
                if !shortcut {
                    sim = sim.without_shortcut();
                }
                let mut out = Vec::new();
                let t = sim
                    .run(&mut src, &mut |c| {
                        out.push((
                            c.req.id,
                            c.req.lba,
                            c.req.op.letter(),
                            c.rec.arrival.to_bits(),
                            c.rec.completion.to_bits(),
                            format!("{:?}", c.rec.cache),
                        ))
                    })
                    .unwrap();
                let stats: Vec<_> = sim.components().iter().flat_map(|c| c.stats()).collect();
                (out, t.events, t.sim_end.to_bits(), format!("{stats:?}"))
            };
            let with = run(true);
            assert!(with.0.len() > 20, "job {i}: {} requests", with.0.len());
            let without = run(false);
            assert_eq!(with.0.len(), without.0.len(), "job {i}: requests");
            for (a, b) in with.0.iter().zip(&without.0) {
                assert_eq!(a, b, "job {i}: first request that differs");
            }
            assert_eq!(with, without, "job {i}");
        }
    }

    /// A cache hit costs the read table's value at its size in all (the page cache's affine
    /// part plus what the system-call level adds), also on a host where a small cached read
    /// takes under a microsecond (the table: `calibrate --quick` on this VM, 28 Nov). With
    /// the affine fit's intercept held at 1 µs, 32 KiB hits took 4.3 µs here against the
    /// table's 3.2, and the validation's warm jobs ran 25% slow.
    #[test]
    fn a_cache_hit_costs_the_read_tables_value_at_its_size() {
        let cpu = HostCpu {
            cached_read_us: vec![
                [4.0, 0.89],
                [16.0, 2.04],
                [32.0, 3.20],
                [64.0, 6.00],
                [128.0, 12.32],
                [256.0, 20.09],
                [512.0, 66.89],
            ],
            ..Default::default()
        };
        let (a, _) = cpu.affine();
        assert!(a < 0.89, "intercept {a} µs");
        let host = crate::host::HostParams::linux_defaults();
        for (kib, us) in [(4u64, 0.89), (32, 3.20), (128, 12.32), (512, 66.89)] {
            let text = format!(
                "[j]\nrw=read\nsize={}k\nbs={kib}k\nioengine=psync\ntime_based\nruntime=30ms\ninvalidate=0\n",
                kib * 4
            );
            let jf = parse(&text, false).unwrap();
            let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
            let chain = host
                .stack()
                .cpu(Some(&cpu))
                .files(&src.file_sizes())
                .on(Box::new(ConstantDevice::new(1.0)))
                .unwrap();
            let mut hits = Vec::new();
            Simulator::new(chain)
                .run(&mut src, &mut |c| {
                    if c.rec.cache == crate::request::CacheOutcome::Hit {
                        hits.push(c.response());
                    }
                })
                .unwrap();
            assert!(hits.len() > 10, "{kib} KiB: {} hits", hits.len());
            for h in hits {
                assert!(
                    (h * 1000.0 - us).abs() < 1e-6,
                    "{kib} KiB: {} µs, table {us}",
                    h * 1000.0
                );
            }
        }
    }

    #[test]
    fn a_write_table_prices_buffered_writes_not_direct_ones() {
        // Read table: affine 1 µs + 0.25 µs/KiB up to 128 KiB. Write table: 40 µs at 32 KiB.
        // A buffered 32 KiB write then costs the write table's 40 µs in all (9 µs of it the
        // page cache's affine part); without a write table, the affine 9 µs alone; an O_DIRECT
        // write costs no CPU here (the device's measured latency holds its system call).
        let cpu = HostCpu {
            cached_read_us: vec![[4.0, 2.0], [32.0, 9.0], [128.0, 33.0]],
            cached_write_us: vec![[4.0, 6.0], [32.0, 40.0]],
            ..Default::default()
        };
        let host = crate::host::HostParams::linux_defaults();
        let one = |cpu: &HostCpu, direct: bool| {
            let text = format!(
                "[j]\nrw=write\nsize=32k\nbs=32k\ndirect={}\n",
                u8::from(direct)
            );
            let jf = parse(&text, false).unwrap();
            let chain = host
                .stack()
                .cpu(Some(cpu))
                .on(Box::new(ConstantDevice::new(1.0)))
                .unwrap();
            let mut src = FioSource::new(&jf, 0, 1 << 30).unwrap();
            let mut out = Vec::new();
            Simulator::new(chain)
                .run(&mut src, &mut |c| {
                    if c.req.op == Op::Write {
                        out.push(c.response())
                    }
                })
                .unwrap();
            assert_eq!(out.len(), 1);
            out[0]
        };
        assert!(
            (one(&cpu, false) - 0.040).abs() < 1e-6,
            "{}",
            one(&cpu, false)
        );
        let no_table = HostCpu {
            cached_write_us: vec![],
            ..cpu.clone()
        };
        assert!(
            (one(&no_table, false) - 0.009).abs() < 1e-6,
            "{}",
            one(&no_table, false)
        );
        assert!((one(&cpu, true) - 1.0).abs() < 1e-6, "{}", one(&cpu, true));
    }
}
