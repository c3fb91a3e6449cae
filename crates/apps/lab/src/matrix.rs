//! The matrix: every server through every point of the plan, `repeats` times (the server
//! order shuffled each time when more than once), each point sized as it comes to the time
//! left (quick) at the rate last measured for its file and mode.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::seq::SliceRandom;

use crate::plan::{hms, PointSpec, Sizing};
use crate::point::{settle, Bench, Shot};
use crate::results::{
    ConnMode, FileKind, Point, Repeat, Results, Status, TargetInfo, TargetKind, Trace,
};
use crate::server::{Kind, Launch, ServerProc, Target};

/// Progress lines on stderr with an ETA.
pub struct Progress {
    /// The start of the whole run (shown) and of the points (for the ETA).
    pub t0: Instant,
    pub points0: Instant,
    pub done: usize,
    pub total: usize,
    pub deadline: Option<Instant>,
}

impl Progress {
    pub fn line(&self, msg: &str) {
        let el = self.t0.elapsed().as_secs_f64();
        let eta = if self.done > 0 && self.done < self.total {
            let per = self.points0.elapsed().as_secs_f64() / self.done as f64;
            let mut left = per * (self.total - self.done) as f64;
            if let Some(d) = self.deadline {
                left = left.min(d.saturating_duration_since(Instant::now()).as_secs_f64());
            }
            format!(" ETA {}", hms(left))
        } else {
            String::new()
        };
        tracing::info!(target: "progress", "[{:>3}/{} {}{eta}] {msg}", self.done, self.total, hms(el));
    }
}

/// A server as results.json lists it, before anything has happened to it.
fn info(t: &Target) -> TargetInfo {
    let mut i = TargetInfo {
        name: t.name.clone(),
        kind: TargetKind::Model,
        describe: t.describe.clone(),
        status: Status::Ok,
        not_measured: crate::byo::not_measured(&t.kind),
        ..TargetInfo::default()
    };
    match &t.kind {
        Kind::Model { .. } => {}
        Kind::Nginx(_) | Kind::Tokio(_) | Kind::Monoio(_) | Kind::Glommio(_) => {
            i.kind = TargetKind::Peer
        }
        Kind::Command(c) => {
            i.kind = TargetKind::Command;
            i.command = Some(c.clone());
            i.logs = ["stdout.log", "stderr.log"]
                .map(|f| format!("run/{}/{f}", t.name))
                .into();
        }
        Kind::Url(u) => {
            i.kind = TargetKind::Url;
            i.url = Some(u.url.clone());
        }
    }
    i
}

/// A point of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct PointKey {
    target: usize,
    point: PointSpec,
}

/// The last rate measured per file and mode, which sizes the next point of the same kind.
struct Rates {
    small: f64,
    big: f64,
    keepalive: f64,
}

impl Rates {
    fn slot(&mut self, p: PointSpec) -> &mut f64 {
        match (p.file, p.mode) {
            (_, ConnMode::KeepAlive) => &mut self.keepalive,
            (FileKind::Big, _) => &mut self.big,
            (FileKind::Small, _) => &mut self.small,
        }
    }
}

/// The matrix of one run, and what it has measured so far.
pub struct Matrix<'a> {
    bench: &'a Bench<'a>,
    targets: &'a [Target],
    launch: &'a dyn Fn(&Target) -> anyhow::Result<Launch>,
    /// When the last point must be done (quick): each server gets its share of the time left.
    deadline: Option<Instant>,
    points: Vec<PointSpec>,
    prog: Progress,
    /// Each point's repeats, and the first repeat's trace.
    runs: BTreeMap<PointKey, (Vec<Repeat>, Option<Trace>)>,
    infos: Vec<TargetInfo>,
}

impl<'a> Matrix<'a> {
    pub fn new(
        bench: &'a Bench<'a>,
        targets: &'a [Target],
        launch: &'a dyn Fn(&Target) -> anyhow::Result<Launch>,
        t0: Instant,
        deadline: Option<Instant>,
    ) -> Matrix<'a> {
        let points = bench.plan.points();
        let total = targets.len() * points.len() * bench.plan.repeats;
        Matrix {
            bench,
            targets,
            launch,
            deadline,
            points,
            prog: Progress {
                t0,
                points0: Instant::now(),
                done: 0,
                total,
                deadline,
            },
            runs: BTreeMap::new(),
            infos: targets.iter().map(info).collect(),
        }
    }

    /// Runs every server through the matrix; returns what happened to each server, and
    /// puts the points (in server order, then plan order) and the peers' configurations in
    /// `results`.
    pub fn run(mut self, results: &mut Results) -> anyhow::Result<Vec<TargetInfo>> {
        let plan = self.bench.plan;
        let mut rng = rand::rng();
        for rep in 0..plan.repeats {
            let mut order: Vec<usize> = (0..self.targets.len()).collect();
            if plan.repeats > 1 {
                order.shuffle(&mut rng);
            }
            for (k, &ti) in order.iter().enumerate() {
                // This server's share of the time left (quick).
                let left_runs = (plan.repeats - rep) * self.targets.len() - k;
                let share = self.deadline.map(|d| {
                    d.saturating_duration_since(Instant::now()).as_secs_f64()
                        / left_runs.max(1) as f64
                });
                self.server(rep, ti, share, results)?;
            }
        }
        for (ti, t) in self.targets.iter().enumerate() {
            for &point in &self.points {
                if let Some((reps, tr)) = self.runs.remove(&PointKey { target: ti, point }) {
                    let mut p = Point::from_repeats(
                        &t.name,
                        point.file,
                        point.mode,
                        point.concurrency,
                        reps,
                    );
                    p.trace = tr;
                    results.points.push(p);
                }
            }
        }
        Ok(self.infos)
    }

    fn fail(&mut self, ti: usize, msg: String) {
        self.infos[ti].status = Status::Failed;
        self.infos[ti].failures.push(msg);
    }

    /// One start of server `ti`: its warm-up, then its points, in `share` seconds (quick).
    fn server(
        &mut self,
        rep: usize,
        ti: usize,
        share: Option<f64>,
        results: &mut Results,
    ) -> anyhow::Result<()> {
        let targets = self.targets;
        let t = &targets[ti];
        let target_start = Instant::now();
        let launch = (self.launch)(t)?;
        let mut srv = match ServerProc::start(t, &launch) {
            Ok(s) => s,
            Err(e) => {
                let msg = format!("repeat {rep}: failed to start: {e:#}");
                self.prog.done += self.points.len();
                self.prog.line(&format!("{}: {msg}", t.name));
                self.fail(ti, msg);
                return Ok(());
            }
        };
        if matches!(t.kind, Kind::Tokio(_) | Kind::Monoio(_) | Kind::Glommio(_))
            && !results.peer_configs.contains_key(&t.name)
        {
            // The peer's start line names the configuration it runs with.
            if let Some(line) = crate::server::start_line(&srv.log_path, Duration::from_secs(2)) {
                let copy = self.bench.out.join(format!("{}.conf", t.name));
                std::fs::write(&copy, format!("{line}\n"))
                    .with_context(|| format!("writing {}", copy.display()))?;
                results.peer_configs.insert(t.name.clone(), line);
            }
        }
        if let Kind::Nginx(_) = t.kind {
            // The configuration it really ran with, for the report and the results dir.
            let conf = launch.run_dir.join("nginx.conf");
            if let Ok(text) = std::fs::read_to_string(&conf) {
                if !results.peer_configs.contains_key(&t.name) {
                    let copy = self.bench.out.join("nginx.conf");
                    std::fs::write(&copy, &text)
                        .with_context(|| format!("writing {}", copy.display()))?;
                    results.peer_configs.insert(t.name.clone(), text);
                }
            }
        }
        if srv
            .stats_path
            .as_deref()
            .is_some_and(|p| iolab_stats::StatsReader::open(p).is_err())
        {
            let note = "server counters unavailable (stats file unreadable); achieved concurrency from the client log only".to_string();
            if !self.infos[ti].failures.contains(&note) {
                self.infos[ti].failures.push(note);
            }
        }
        let mut rates = self.warm_up(&srv, t, rep);
        // Points are sized as they go: the time left to this server spread over its
        // points left, at the rate last measured for the same file and mode.
        let target_deadline = share.map(|s| target_start + Duration::from_secs_f64(s));
        for pi in 0..self.points.len() {
            let point = self.points[pi];
            let sizing =
                self.bench
                    .plan
                    .size(&self.points[pi..], *rates.slot(point), target_deadline);
            self.prog.done += 1;
            self.point(&srv, ti, rep, point, sizing, &mut rates);
            if let Some(crash) = srv.crash_report() {
                let PointSpec {
                    file,
                    mode,
                    concurrency: c,
                } = point;
                let msg = format!("repeat {rep}: crashed during {file} {mode} c={c}: {crash}");
                self.prog.line(&msg);
                self.fail(ti, msg);
                self.prog.done += self.points.len() - pi - 1;
                break;
            }
        }
        srv.stop();
        Ok(())
    }

    /// The warm-up after a server start, which also measures the rates that size the first
    /// points (quick).
    fn warm_up(&self, srv: &ServerProc, t: &Target, rep: usize) -> Rates {
        let plan = self.bench.plan;
        let mut rate = [0.0f64; 2];
        for (i, (file, n)) in [
            (FileKind::Small, plan.warmup.0),
            (FileKind::Big, plan.warmup.1),
        ]
        .into_iter()
        .enumerate()
        {
            let shot = Shot {
                point: PointSpec {
                    file,
                    mode: ConnMode::Close,
                    concurrency: 10,
                },
                sizing: Sizing {
                    requests: Some(n),
                    cap: Duration::from_secs(5),
                },
                repeat: rep,
                trace: false,
                warmup: true,
            };
            match self.bench.run(srv, &t.name, &shot) {
                Ok(o) => rate[i] = o.repeat.metrics.rps,
                Err(e) => self
                    .prog
                    .line(&format!("{} warm-up ({file}) failed: {e:#}", t.name)),
            }
        }
        Rates {
            small: rate[0],
            big: rate[1],
            keepalive: rate[0] * 2.5,
        }
    }

    /// The runs of one point on a running server: one, or for keep-alive `ka_repeats` back
    /// to back on the same server start, so that even a single-repeat profile reports their
    /// spread.
    fn point(
        &mut self,
        srv: &ServerProc,
        ti: usize,
        rep: usize,
        point: PointSpec,
        sizing: Sizing,
        rates: &mut Rates,
    ) {
        let plan = self.bench.plan;
        let targets = self.targets;
        let name = &targets[ti].name;
        let PointSpec {
            file,
            mode,
            concurrency: c,
        } = point;
        let runs_here = if mode.keepalive() {
            plan.ka_repeats.max(1)
        } else {
            1
        };
        for k in 0..runs_here {
            settle(srv);
            let shot = Shot {
                point,
                sizing,
                repeat: rep * runs_here + k,
                trace: rep == 0 && plan.is_top_close(point),
                warmup: false,
            };
            match self.bench.run(srv, name, &shot) {
                Ok(o) => {
                    let m = &o.repeat.metrics;
                    if m.rps > 0.0 {
                        *rates.slot(point) = m.rps;
                    }
                    self.prog.line(&format!(
                        "{name} {file} {mode} c={c}{}: {} req, mean {} ms, p99 {} ms, {} req/s, {} errors, {} SYN-retried, achieved c {:.0}{}",
                        if runs_here > 1 { format!(" ({}/{runs_here}, {:.1} s)", k + 1, o.repeat.elapsed_s) } else { String::new() },
                        o.repeat.requests,
                        crate::report::short(m.mean_ms),
                        crate::report::short(m.p99_ms),
                        crate::report::short(m.rps.round()),
                        m.errors,
                        m.syn_retries,
                        m.achieved_concurrency,
                        if o.repeat.sustained { "" } else { " (not sustained)" }
                    ));
                    let e = self.runs.entry(PointKey { target: ti, point }).or_default();
                    e.0.push(o.repeat);
                    if e.1.is_none() {
                        e.1 = o.trace;
                    }
                }
                Err(e) => {
                    let msg = format!(
                        "repeat {}, {file} {mode} c={c}: load failed: {e:#}",
                        shot.repeat
                    );
                    self.prog.line(&format!("{name}: {msg}"));
                    self.fail(ti, msg);
                }
            }
        }
    }
}
