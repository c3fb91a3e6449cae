//! What a lab run measures: the profile's matrix of points, how many requests each point
//! gets (fixed, or sized from the time left), and the Method table that says so.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::options::Options;
use crate::results::{ConnMode, FileKind};
use crate::steady;

pub use crate::options::Profile;

/// One point of the matrix for one server: a file, a connection mode, a concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PointSpec {
    pub file: FileKind,
    pub mode: ConnMode,
    pub concurrency: usize,
}

/// The matrix of a profile.
#[derive(Debug, Clone)]
pub struct Plan {
    pub levels: Vec<usize>,
    pub ka_levels: Vec<usize>,
    pub repeats: usize,
    /// Requests per point when fixed (tiny, full); None = from the time budget (quick).
    pub small_requests: Option<u64>,
    pub big_requests: Option<u64>,
    pub budget: Option<Duration>,
    pub timeout: Duration,
    pub log_all: bool,
    pub warmup: (u64, u64),
    /// Each keep-alive point runs this long (wrk-style, by duration, not by count)...
    pub ka_duration: Duration,
    /// ...this many times back to back per server start (the spread is over these).
    pub ka_repeats: usize,
}

/// How many requests one run of a point makes, and the time after which it is cut short.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sizing {
    /// None: by duration (keep-alive, as wrk does), for `cap`.
    pub requests: Option<u64>,
    /// A cap so that one stuck point cannot eat the run; requests still in flight then are
    /// "unfinished", not errors.
    pub cap: Duration,
}

impl Plan {
    pub fn for_profile(p: Profile) -> Plan {
        let seed_levels = vec![1, 10, 50, 100, 200, 500, 1000];
        match p {
            Profile::Tiny => Plan {
                levels: vec![1, 10, 50],
                ka_levels: vec![10],
                repeats: 1,
                small_requests: Some(300),
                big_requests: Some(150),
                budget: None,
                timeout: Duration::from_secs(3),
                log_all: false,
                warmup: (50, 10),
                ka_duration: Duration::from_millis(500),
                ka_repeats: 2,
            },
            Profile::Quick => Plan {
                levels: seed_levels,
                ka_levels: vec![100],
                repeats: 1,
                small_requests: None,
                big_requests: None,
                budget: Some(Duration::from_secs(600)),
                timeout: Duration::from_secs(5),
                log_all: false,
                warmup: (300, 40),
                ka_duration: Duration::from_secs(3),
                ka_repeats: 3,
            },
            Profile::Full => Plan {
                levels: seed_levels,
                ka_levels: vec![10, 100, 1000],
                repeats: 3,
                small_requests: Some(50_000),
                big_requests: Some(50_000),
                budget: None,
                timeout: Duration::from_secs(10),
                log_all: true,
                warmup: (2000, 200),
                ka_duration: Duration::from_secs(10),
                ka_repeats: 1,
            },
        }
    }

    /// The profile's plan as the options change it (`--repeat`, `--seed-conditions`,
    /// `--budget`).
    pub fn for_run(opts: &Options) -> Plan {
        let mut plan = Plan::for_profile(opts.profile);
        if let Some(r) = opts.repeat {
            plan.repeats = r.max(1);
        }
        if opts.seed_conditions {
            // The seed measured a new connection per request only.
            plan.ka_levels.clear();
            if plan.budget.is_some() {
                plan.budget = Some(Duration::from_secs(crate::link::SEED_QUICK_BUDGET_S));
            }
        }
        if opts.budget.is_some() {
            plan.budget = opts.budget;
        }
        plan
    }

    /// The points in the order they are run for one server.
    pub fn points(&self) -> Vec<PointSpec> {
        let mut v = Vec::new();
        for file in FileKind::ALL {
            for &concurrency in &self.levels {
                v.push(PointSpec {
                    file,
                    mode: ConnMode::Close,
                    concurrency,
                });
            }
        }
        for &concurrency in &self.ka_levels {
            v.push(PointSpec {
                file: FileKind::Small,
                mode: ConnMode::KeepAlive,
                concurrency,
            });
        }
        v
    }

    pub fn max_concurrency(&self) -> usize {
        self.levels
            .iter()
            .chain(&self.ka_levels)
            .copied()
            .max()
            .unwrap_or(1)
    }

    /// The point of Figure 2 and of the per-request log: the top close-mode level.
    pub fn is_top_close(&self, p: PointSpec) -> bool {
        p.mode == ConnMode::Close && Some(&p.concurrency) == self.levels.last()
    }

    /// Requests per point of a file when the plan fixes them (tiny, full).
    fn fixed_requests(&self, file: FileKind) -> u64 {
        match file {
            FileKind::Small => self.small_requests,
            FileKind::Big => self.big_requests,
        }
        .unwrap_or(1000)
    }

    /// Sizes the first of `rest` (this server's points still to run) at the `rate` last
    /// measured for its file and mode: keep-alive points run for a fixed time; with a
    /// `deadline` (quick) the close-mode points share what is left of this server's time.
    pub fn size(&self, rest: &[PointSpec], rate: f64, deadline: Option<Instant>) -> Sizing {
        let p = rest[0];
        if p.mode.keepalive() {
            return Sizing {
                requests: None,
                cap: self.ka_duration,
            };
        }
        let ka_left = rest.iter().filter(|p| p.mode.keepalive()).count();
        let close_left = (rest.len() - ka_left).max(1);
        let ka_reserve =
            ka_left as f64 * self.ka_repeats as f64 * (self.ka_duration.as_secs_f64() + 0.2);
        let per_point = deadline.map(|d| {
            let left = d.saturating_duration_since(Instant::now()).as_secs_f64();
            ((left - 0.3 - ka_reserve) / close_left as f64).max(0.25)
        });
        match per_point {
            Some(ps) => Sizing {
                requests: Some(budget_requests(rate, ps, p.concurrency)),
                cap: Duration::from_secs_f64((ps * 3.0).max(1.5) + 1.5),
            },
            None => Sizing {
                requests: Some(self.fixed_requests(p.file)),
                cap: Duration::from_secs(3600),
            },
        }
    }

    /// What the run will take, for the first progress line.
    pub fn estimate(&self, servers: usize, micro_s: f64) -> String {
        match self.budget {
            Some(b) => format!(
                "at most {} (time budget; requests per point sized to fit)",
                hms(b.as_secs_f64())
            ),
            None => {
                let reqs: f64 = self
                    .points()
                    .iter()
                    .map(|p| self.fixed_requests(p.file) as f64)
                    .sum();
                // A pessimistic 3,000 requests/s on a shared 2-core machine.
                hms(micro_s
                    + reqs * (servers * self.repeats) as f64 / 3000.0
                    + 2.0 * servers as f64)
            }
        }
    }
}

/// Requests for a point of `point_s` seconds at an estimated `rps`: enough to pass the
/// ramp-up at concurrency `c` (2c + 100), at most 50,000 as the seed.
pub fn budget_requests(rps: f64, point_s: f64, c: usize) -> u64 {
    let min = 2 * c as u64 + 100;
    let est = if rps.is_finite() && rps > 0.0 {
        (rps * point_s * 0.8) as u64
    } else {
        min
    };
    est.clamp(min, 50_000)
}

/// Seconds as the progress lines show them: `5s`, `2m05s`.
pub fn hms(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// The Method table of results.json and the report: how the points were measured.
pub fn method(plan: &Plan, sources: &[IpAddr], opts: &Options) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let lv = |v: &[usize]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    m.insert(
        "concurrency levels (new connection per request)".into(),
        lv(&plan.levels),
    );
    m.insert(
        "keep-alive connections".into(),
        if plan.ka_levels.is_empty() {
            "none (the seed's method: a new connection per request)".into()
        } else {
            lv(&plan.ka_levels)
        },
    );
    m.insert(
        "network path".into(),
        match &opts.link {
            Some(l) => format!(
                "a veth pair shaped with tc to {} each way{}; the server in its own network namespace (see The link)",
                iolab_netns::format_rate(l.rate_bps),
                l.delay
                    .map(|d| format!(", {} ms one-way delay", d.as_secs_f64() * 1e3))
                    .unwrap_or_default()
            ),
            None => "loopback (no link: --link RATE or --seed-conditions for one)".into(),
        },
    );
    m.insert(
        "keep-alive points".into(),
        format!(
            "{} s each (by duration, as wrk), {} back to back per server start and repeat; requests/s is their median, min..max their spread",
            plan.ka_duration.as_secs_f64(),
            plan.ka_repeats
        ),
    );
    m.insert(
        "requests per point".into(),
        match (plan.small_requests, plan.budget) {
            (Some(n), _) => format!(
                "{n} (small file), {} (700 KB file)",
                plan.big_requests.unwrap_or(n)
            ),
            (None, Some(b)) => format!(
                "sized from the warm-up rate to fit {} in all; at least 2c + 100, at most 50,000",
                hms(b.as_secs_f64())
            ),
            _ => "-".into(),
        },
    );
    m.insert(
        "repeats".into(),
        format!(
            "{} (model order shuffled when more than 1; medians and min..max reported)",
            plan.repeats
        ),
    );
    m.insert(
        "per-request timeout".into(),
        format!("{} s", plan.timeout.as_secs()),
    );
    m.insert(
        "steady-state filter".into(),
        format!(
            "means over the requests started while the client had the requested concurrency in flight (within {:.0}%; requests stalled in a SYN retransmit do not count, the client's own turnaround between requests, up to half the median response time within {}..{} ms, does) and the server did not hold more; SYN-retried (connect >= {} ms) and failed requests are counted, never averaged",
            steady::DEFAULT_TOLERANCE * 100.0,
            steady::BRIDGE_US / 1000,
            steady::BRIDGE_MAX_US / 1000,
            steady::SYN_RETRY_CONNECT_US / 1000
        ),
    );
    m.insert("sustained (Figure 1)".into(), "errors <= 1% of requests, achieved concurrency within 10% of the requested, at least a quarter of the successful requests steady".into());
    m.insert(
        "ephemeral ports".into(),
        if sources.is_empty() {
            "one source address (127.0.0.1); no spreading possible".into()
        } else {
            format!("client connections spread round-robin over {} {} source addresses ({}..{}) so that 50,000 new connections per point cannot exhaust the ephemeral ports", sources.len(), if opts.link.is_some() { "link" } else { "loopback" }, sources[0], sources[sources.len() - 1])
        },
    );
    m.insert(
        "warm-up".into(),
        format!(
            "{} + {} requests at concurrency 10 (small, 700 KB) after each server start",
            plan.warmup.0, plan.warmup.1
        ),
    );
    m.insert(
        "per-request logs".into(),
        if plan.log_all {
            "every point (logs/*.csv)".into()
        } else {
            "the top concurrency level of each server (logs/*.csv)".into()
        },
    );
    m.insert(
        "server workers".into(),
        if opts.workers == 0 {
            "model's default (0), nginx and tokio: 1".into()
        } else {
            opts.workers.to_string()
        },
    );
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans() {
        let q = Plan::for_profile(Profile::Quick);
        assert_eq!(q.levels, vec![1, 10, 50, 100, 200, 500, 1000]);
        assert_eq!(q.points().len(), 15);
        assert!(q.budget.is_some());
        let f = Plan::for_profile(Profile::Full);
        assert_eq!(f.small_requests, Some(50_000));
        assert!(f.repeats >= 3);
        let t = Plan::for_profile(Profile::Tiny);
        assert!(t.points().iter().all(|p| p.concurrency <= 50));
    }

    #[test]
    fn request_budget_bounds() {
        assert_eq!(budget_requests(10_000.0, 1.0, 10), 8000);
        // At least enough to get past the ramp-up at c = 1000.
        assert_eq!(budget_requests(100.0, 1.0, 1000), 2100);
        assert_eq!(budget_requests(1e9, 10.0, 1), 50_000);
        assert_eq!(budget_requests(f64::NAN, 1.0, 1), 102);
        assert_eq!(budget_requests(0.0, 1.0, 50), 200);
    }

    /// Fixed plans give each file its count; keep-alive runs by time; a deadline shares
    /// the time left among the close-mode points after keep-alive's share is set aside.
    #[test]
    fn points_are_sized_by_the_plan_or_the_time_left() {
        let t = Plan::for_profile(Profile::Tiny);
        let pts = t.points();
        let big = pts.iter().position(|p| p.file == FileKind::Big).unwrap();
        assert_eq!(t.size(&pts, 1e4, None).requests, Some(300));
        assert_eq!(t.size(&pts[big..], 1e4, None).requests, Some(150));
        let ka = t.size(&pts[pts.len() - 1..], 1e4, None);
        assert_eq!(ka.requests, None);
        assert_eq!(ka.cap, t.ka_duration);
        let q = Plan::for_profile(Profile::Quick);
        let pts = q.points();
        // 15 points: 14 close-mode ones share 10 s less 3 x 3.2 s kept for keep-alive and
        // 0.3 s, under the floor of 0.25 s each.
        let s = q.size(&pts, 1000.0, Some(Instant::now() + Duration::from_secs(10)));
        assert_eq!(s.requests, Some(budget_requests(1000.0, 0.25, 1)));
        assert_eq!(s.cap, Duration::from_secs_f64(1.5 + 1.5));
        let s = q.size(
            &pts[..1],
            1000.0,
            Some(Instant::now() + Duration::from_secs(60)),
        );
        assert!(s.requests.unwrap() > 40_000, "{s:?}");
    }

    #[test]
    fn options_change_the_plan() {
        let mut o = Options {
            profile: Profile::Quick,
            models: Vec::new(),
            peers: Vec::new(),
            out: "report".into(),
            repeat: Some(0),
            micro: Vec::new(),
            workers: 0,
            backlog: 4096,
            budget: None,
            command: String::new(),
            efficiency: false,
            efficiency_rate: None,
            link: None,
            seed_conditions: true,
            targets: Vec::new(),
        };
        let p = Plan::for_run(&o);
        assert_eq!(p.repeats, 1);
        assert!(p.ka_levels.is_empty());
        assert_eq!(
            p.budget,
            Some(Duration::from_secs(crate::link::SEED_QUICK_BUDGET_S))
        );
        o.budget = Some(Duration::from_secs(30));
        assert_eq!(Plan::for_run(&o).budget, Some(Duration::from_secs(30)));
        assert!(Plan::for_run(&o).is_top_close(PointSpec {
            file: FileKind::Big,
            mode: ConnMode::Close,
            concurrency: 1000
        }));
    }

    #[test]
    fn hms_format() {
        assert_eq!(hms(5.2), "5s");
        assert_eq!(hms(125.0), "2m05s");
        assert_eq!(hms(-1.0), "0s");
    }
}
