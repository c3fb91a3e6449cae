//! The per-job figures of a simulated job file, as fio reports them.

use serde::Serialize;

use super::source::FioSource;
use crate::request::{IoPrio, Op};

/// Per-job results of a simulated job file, as fio reports them: bandwidth over the job's
/// run (from its first request to its last completion: a job behind a `stonewall` starts
/// when the jobs before it end), IOPS and total latency (`lat`: from
/// submission to completion), for reads and writes.
#[derive(Clone, Debug, Serialize)]
pub struct JobResult {
    pub job: String,
    pub read: DirResult,
    pub write: DirResult,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct DirResult {
    pub ios: u64,
    pub bytes: u64,
    /// bytes / job runtime, MB/s (10^6 B/s).
    pub mb_s: f64,
    pub iops: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Latency quantiles at 0, 1, ..., 100 % (for CDF figures), ms.
    pub cdf_ms: Vec<f64>,
    /// Per I/O priority (fio's `prios`, its `clat_prio`), in the kernel's order (class,
    /// level), when there were several: how many and their mean latency.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_prio: Vec<PrioResult>,
}

/// The I/Os of one priority in a direction.
#[derive(Clone, Debug, Serialize)]
pub struct PrioResult {
    pub prio: IoPrio,
    pub ios: u64,
    pub mean_ms: f64,
}

/// Latencies are kept in a histogram of nanoseconds with 3 significant digits (quantiles
/// within 0.1 %), its size set by the range of values, not their number: a run's memory is
/// O(in flight), however many requests (a vector of samples was 8 B a request: 38 MB at
/// 4.74 M requests). The mean is exact (a sum).
type LatHist = hdrhistogram::Histogram<u64>;

fn lat_hist() -> LatHist {
    // (3 significant digits is always a valid setting: `new` cannot fail)
    LatHist::new(3).unwrap_or_else(|_| unreachable!())
}

/// Priority value → (priority, I/Os, latency sum ms).
type PrioCounts = std::collections::BTreeMap<u16, (IoPrio, u64, f64)>;

/// Collects completions per job and direction.
pub struct JobStats {
    names: Vec<String>,
    /// Stream (clone) → job: a completion is credited to the job of its stream (jobs may
    /// share a file, `filename=`).
    job_of_stream: Vec<usize>,
    /// Per job, per direction (read, write): latencies (ns), their sum (ms) and count.
    lat: Vec<[LatHist; 2]>,
    sum_ms: Vec<[f64; 2]>,
    ios: Vec<[u64; 2]>,
    /// Per job and direction: priority value → (priority, I/Os, latency sum ms).
    prios: Vec<[PrioCounts; 2]>,
    bytes: Vec<[u64; 2]>,
    end: Vec<f64>,
    /// Each job's first request (its own start), ms.
    first: Vec<f64>,
    /// When each job's figures restart (a latency-target search's end), shared with the
    /// source; whether that was done.
    resets: Option<std::sync::Arc<std::sync::Mutex<Vec<Option<f64>>>>>,
    reset_done: Vec<bool>,
}

impl JobStats {
    pub fn new(src: &FioSource) -> JobStats {
        let n = src.jobs.len();
        JobStats {
            names: src.jobs.iter().map(|j| j.name.clone()).collect(),
            job_of_stream: src.job_of_streams(),
            lat: (0..n).map(|_| [lat_hist(), lat_hist()]).collect(),
            sum_ms: vec![[0.0; 2]; n],
            ios: vec![[0; 2]; n],
            prios: vec![Default::default(); n],
            bytes: vec![[0, 0]; n],
            end: vec![0.0; n],
            first: vec![f64::INFINITY; n],
            resets: src
                .jobs
                .iter()
                .any(|j| j.extra.lat.target_ms > 0.0)
                .then(|| src.resets.clone()),
            reset_done: vec![false; n],
        }
    }

    /// fio's `reset_all_stats` for job `j` if its figures restart before `arrival`: the
    /// source waits for the job's I/O in flight first, so every earlier completion is in.
    fn maybe_reset(&mut self, j: usize, arrival: f64) {
        let Some(r) = &self.resets else { return };
        let at = r.lock().ok().and_then(|r| r.get(j).copied().flatten());
        if self.reset_done[j] || at.is_none_or(|t| arrival < t) {
            return;
        }
        self.reset_done[j] = true;
        self.lat[j] = [lat_hist(), lat_hist()];
        self.sum_ms[j] = [0.0; 2];
        self.ios[j] = [0; 2];
        self.prios[j] = Default::default();
        self.bytes[j] = [0; 2];
        self.end[j] = 0.0;
        self.first[j] = f64::INFINITY;
    }

    /// Counts a completed request of `stream` (as the engine's
    /// [`crate::engine::Simulator::run_streams`] tells it).
    pub fn add(&mut self, c: &crate::request::Completion, stream: Option<u32>) {
        let Some(&j) = stream.and_then(|s| self.job_of_stream.get(s as usize)) else {
            return;
        };
        self.maybe_reset(j, c.rec.arrival);
        self.first[j] = self.first[j].min(c.rec.arrival);
        if !matches!(c.req.op, Op::Read | Op::Write) {
            return;
        }
        let d = usize::from(c.req.op != Op::Read);
        let ms = c.response().max(0.0);
        let ns = (ms * 1e6).round() as u64;
        let h = &mut self.lat[j][d];
        // `record` grows the histogram to the value (`saturating_record` would clamp it to
        // the range so far: every latency was 0); past what it can grow to, the top.
        if h.record(ns).is_err() {
            h.saturating_record(ns);
        }
        self.sum_ms[j][d] += ms;
        self.ios[j][d] += 1;
        let p = self.prios[j][d]
            .entry(c.req.prio.value())
            .or_insert((c.req.prio, 0, 0.0));
        p.1 += 1;
        p.2 += ms;
        self.bytes[j][d] += c.req.bytes();
        self.end[j] = self.end[j].max(c.rec.completion);
    }

    pub fn results(self) -> Vec<JobResult> {
        let mut out = Vec::new();
        for j in 0..self.names.len() {
            let start = if self.first[j].is_finite() {
                self.first[j]
            } else {
                0.0
            };
            let runtime_s = ((self.end[j] - start) / 1000.0).max(1e-12);
            let mut dirs = [DirResult::default(), DirResult::default()];
            for (d, dir) in dirs.iter_mut().enumerate() {
                let h = &self.lat[j][d];
                let n = self.ios[j][d];
                if n == 0 {
                    continue;
                }
                let q = |p: f64| h.value_at_quantile(p) as f64 / 1e6;
                *dir = DirResult {
                    ios: n,
                    bytes: self.bytes[j][d],
                    mb_s: self.bytes[j][d] as f64 / 1e6 / runtime_s,
                    iops: n as f64 / runtime_s,
                    mean_ms: self.sum_ms[j][d] / n as f64,
                    p50_ms: q(0.5),
                    p99_ms: q(0.99),
                    cdf_ms: (0..=100)
                        .map(|k| {
                            if k == 0 {
                                h.min() as f64 / 1e6
                            } else {
                                q(k as f64 / 100.0)
                            }
                        })
                        .collect(),
                    by_prio: by_prio(&self.prios[j][d]),
                };
            }
            let [read, write] = dirs;
            out.push(JobResult {
                job: self.names[j].clone(),
                read,
                write,
            });
        }
        out
    }
}

/// The per-priority figures when a direction's I/Os had more than one priority (as fio's
/// JSON lists `prios` then only).
fn by_prio(m: &PrioCounts) -> Vec<PrioResult> {
    if m.len() < 2 {
        return Vec::new();
    }
    m.values()
        .map(|&(prio, ios, sum)| PrioResult {
            prio,
            ios,
            mean_ms: sum / ios.max(1) as f64,
        })
        .collect()
}

/// The per-job table `run --fio` prints.
pub fn job_table(results: &[JobResult]) -> String {
    let mut s = format!(
        "{:<20} {:>3} {:>9} {:>10} {:>10} {:>9} {:>9} {:>9}\n",
        "job", "dir", "ios", "MB/s", "IOPS", "mean ms", "p50 ms", "p99 ms"
    );
    for r in results {
        for (name, d) in [("R", &r.read), ("W", &r.write)] {
            if d.ios == 0 {
                continue;
            }
            s.push_str(&format!(
                "{:<20} {:>3} {:>9} {:>10.2} {:>10.1} {:>9.3} {:>9.3} {:>9.3}\n",
                r.job, name, d.ios, d.mb_s, d.iops, d.mean_ms, d.p50_ms, d.p99_ms
            ));
            for p in &d.by_prio {
                let class = format!("{:?}", p.prio.class).to_ascii_lowercase();
                s.push_str(&format!(
                    "{:<20} {:>3} {:>9}   prio {class}/{}, mean {:.3} ms\n",
                    "", "", p.ios, p.prio.level, p.mean_ms
                ));
            }
        }
    }
    s
}
