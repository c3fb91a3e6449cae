//! A storage system of several devices, as DiskSim's `.parv` describes one: the devices
//! (`instantiate`), the trace's device numbers mapped to them (`disksim_iosim`'s I/O
//! mappings), the driver's scheduler, and logical organisations (`disksim_logorg`: striping,
//! mirroring, RAID 4/5) that turn a logical request into requests on the devices.
//!
//! ```text
//!  request (dev = the trace's device number)
//!    │ route: trace device → (organisation, logical device)       parv.rs
//!    ▼ plan: accesses on member devices (reads first for parity)  logorg.rs
//!  device 0   device 1  ...  (each an `Hdd` with the driver's scheduler in front)
//!    │ completions: the request completes with its last access
//! ```
//!
//! Each device is a [`Component`] driven through a context of its own: its timers and
//! delayed completions become this component's timers. Buses and controllers shared by
//! several devices are not modelled (each device has its own path, at the slowest bus's
//! time per sector): see the crate README's limits.

pub mod logorg;
pub mod parv;
pub mod stats;
pub mod synthio;

use std::collections::{BTreeMap, HashMap};

use crate::engine::{Action, Component, Ctx};
use crate::request::{Completion, Record, Request};
use crate::sched::{Policy, Scheduler};
use logorg::{Access, Logorg};

/// Where a trace device number goes: an organisation and its logical device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub org: usize,
    pub part: usize,
}

/// A logical request in flight: its accesses left, and those waiting for them.
struct Op {
    req: Request,
    org: usize,
    left: usize,
    then: Vec<Access>,
    rec: Record,
}

enum Timer {
    /// A device's own timer.
    Device(usize, u64),
    /// A device's completion due later (its `up_at`).
    Done(usize, Completion),
}

/// The system: devices, organisations over them, routes from trace device numbers.
pub struct System {
    devices: Vec<Box<dyn Component>>,
    names: Vec<String>,
    orgs: Vec<Logorg>,
    /// Each organisation's members, as indices into `devices`.
    members: Vec<Vec<usize>>,
    routes: BTreeMap<u32, Route>,
    ops: HashMap<u64, Op>,
    /// Access id → the logical request's id.
    parent: HashMap<u64, u64>,
    timers: HashMap<u64, Timer>,
    next_access: u64,
    next_token: u64,
    /// Requests at each device now (for "shortest queue" copy choice).
    queued: Vec<usize>,
    /// Per device: accesses served and the sum of their response times (ms).
    served: Vec<(u64, f64)>,
    /// Per device: the driver's queue (None: accesses go to the device at once).
    drivers: Vec<Option<DriverQueue>>,
}

/// The device driver's queue in front of one device (DiskSim's `disksim_iodriver`
/// scheduler): accesses wait here, in the driver's scheduling order, while the device holds
/// `depth` of them. A completion is handled (its dependent accesses queued) before the next
/// access is chosen, as DiskSim's driver does.
pub struct DriverQueue {
    queue: Scheduler<Request>,
    policy: Policy,
    depth: usize,
    /// The last access handed to the device: first sector and end (the elevators' head is
    /// its first sector, SSTF's its end, as DiskSim's `ioqueue` keeps `lastblkno`).
    last: Option<(u64, u64)>,
}

impl DriverQueue {
    pub fn new(policy: Policy, depth: usize, blocks: u64) -> DriverQueue {
        DriverQueue {
            queue: Scheduler::new(policy, blocks),
            policy,
            depth: depth.max(1),
            last: None,
        }
    }
    fn head(&self) -> u64 {
        match (self.policy, self.last) {
            (_, None) => 0,
            (Policy::Sstf, Some((_, end))) => end,
            (_, Some((start, _))) => start,
        }
    }
}

/// Access ids live above the engine's request ids.
const ACCESS_BASE: u64 = 1 << 62;

impl System {
    pub fn new(
        devices: Vec<(String, Box<dyn Component>)>,
        orgs: Vec<(Logorg, Vec<usize>)>,
        routes: BTreeMap<u32, Route>,
    ) -> System {
        let n = devices.len();
        let (names, devices) = devices.into_iter().unzip();
        let (orgs, members) = orgs.into_iter().unzip();
        System {
            devices,
            names,
            orgs,
            members,
            routes,
            ops: HashMap::new(),
            parent: HashMap::new(),
            timers: HashMap::new(),
            next_access: ACCESS_BASE,
            next_token: 0,
            queued: vec![0; n],
            served: vec![(0, 0.0); n],
            drivers: (0..n).map(|_| None).collect(),
        }
    }

    /// Puts a driver queue in front of each device (`None` for none).
    pub fn with_drivers(mut self, drivers: Vec<Option<DriverQueue>>) -> System {
        if drivers.len() == self.devices.len() {
            self.drivers = drivers;
        }
        self
    }

    /// Hands the device the driver's next accesses while it has room.
    fn dispatch(&mut self, dev: usize, ctx: &mut Ctx) {
        loop {
            let Some(d) = self.drivers[dev].as_mut() else {
                return;
            };
            if self.queued[dev] - d.queue.len() >= d.depth {
                return;
            }
            let head = d.head();
            let Some(r) = d.queue.pop(head) else {
                return;
            };
            d.last = Some((r.lba, r.end()));
            self.drive(dev, ctx, |x, c| x.submit(r, c));
        }
    }

    /// The trace device numbers served, each with its logical device's capacity (sectors).
    pub fn capacities(&self) -> BTreeMap<u32, u64> {
        self.routes
            .iter()
            .map(|(d, r)| (*d, self.orgs[r.org].logical_blocks()))
            .collect()
    }

    pub fn device_names(&self) -> &[String] {
        &self.names
    }

    /// Runs `f` on device `dev` and turns its actions into this component's.
    fn drive(&mut self, dev: usize, ctx: &mut Ctx, f: impl FnOnce(&mut dyn Component, &mut Ctx)) {
        let mut sub = Ctx::at(ctx.now());
        f(self.devices[dev].as_mut(), &mut sub);
        for a in sub.into_actions() {
            match a {
                Action::Up(c) => self.access_done(dev, c, ctx),
                Action::UpAt(c) if c.rec.completion > ctx.now() => {
                    let at = c.rec.completion;
                    let t = self.token(Timer::Done(dev, c));
                    ctx.wake_at(at, t);
                }
                Action::UpAt(c) => self.access_done(dev, c, ctx),
                Action::Wake { at, token } => {
                    let t = self.token(Timer::Device(dev, token));
                    ctx.wake_at(at, t);
                }
                // A device has nothing below it: what it sends down is not served.
                Action::Down(r) => {
                    let rec = Record::unserved(r.arrival, ctx.now());
                    self.access_done(dev, Completion { req: r, rec }, ctx);
                }
            }
        }
    }

    fn token(&mut self, t: Timer) -> u64 {
        self.next_token += 1;
        self.timers.insert(self.next_token, t);
        self.next_token
    }

    /// Sends the accesses of logical request `id` (organisation `org`) to their devices.
    fn issue(&mut self, id: u64, org: usize, accesses: Vec<Access>, ctx: &mut Ctx) {
        for a in accesses {
            let dev = self.members[org][a.member];
            let aid = self.next_access;
            self.next_access += 1;
            self.parent.insert(aid, id);
            let mut r = Request::block(a.lba, a.sectors.min(u64::from(u32::MAX)) as u32, a.op);
            r.id = aid;
            r.arrival = ctx.now();
            if let Some(op) = self.ops.get(&id) {
                r.flags = op.req.flags;
            }
            self.queued[dev] += 1;
            match self.drivers[dev].as_mut() {
                Some(d) => {
                    d.queue.push(r.lba, r);
                    self.dispatch(dev, ctx);
                }
                None => self.drive(dev, ctx, |d, c| d.submit(r, c)),
            }
        }
    }

    fn access_done(&mut self, dev: usize, c: Completion, ctx: &mut Ctx) {
        self.queued[dev] = self.queued[dev].saturating_sub(1);
        self.finish_access(dev, c, ctx);
        self.dispatch(dev, ctx);
    }

    fn finish_access(&mut self, dev: usize, c: Completion, ctx: &mut Ctx) {
        let s = &mut self.served[dev];
        *s = (s.0 + 1, s.1 + c.rec.completion - c.req.arrival);
        let Some(id) = self.parent.remove(&c.req.id) else {
            return;
        };
        let Some(op) = self.ops.get_mut(&id) else {
            return;
        };
        op.left -= 1;
        // The request's record is that of its access that finished last.
        if c.rec.completion >= op.rec.completion {
            let arrival = op.rec.arrival;
            let start = op.rec.device_start.min(c.rec.device_start);
            op.rec = Record {
                arrival,
                device_start: start,
                queue_wait: (start - arrival).max(0.0),
                ..c.rec
            };
        }
        if op.left > 0 {
            return;
        }
        if !op.then.is_empty() {
            let then = std::mem::take(&mut op.then);
            op.left = then.len();
            let org = op.org;
            self.issue(id, org, then, ctx);
            return;
        }
        if let Some(op) = self.ops.remove(&id) {
            let mut rec = op.rec;
            rec.completion = rec.completion.max(ctx.now());
            ctx.up(Completion { req: op.req, rec });
        }
    }
}

impl Component for System {
    fn name(&self) -> &str {
        "system"
    }

    fn submit(&mut self, req: Request, ctx: &mut Ctx) {
        let Some(route) = self.routes.get(&req.dev).copied() else {
            // The trace source refuses such requests; complete it unserved if one comes.
            let rec = Record::unserved(req.arrival, ctx.now());
            ctx.up(Completion { req, rec });
            return;
        };
        let queued = self.queued.clone();
        let members = self.members[route.org].clone();
        let plan =
            self.orgs[route.org].map(route.part, req.lba, u64::from(req.sectors), req.op, &|m| {
                members.get(m).map_or(0, |&d| queued[d])
            });
        let (first, then) = if plan.first.is_empty() {
            (plan.then, Vec::new())
        } else {
            (plan.first, plan.then)
        };
        if first.is_empty() {
            let rec = Record::unserved(req.arrival, ctx.now());
            ctx.up(Completion { req, rec });
            return;
        }
        let id = req.id;
        let rec = Record {
            arrival: req.arrival,
            device_start: f64::INFINITY,
            completion: f64::NEG_INFINITY,
            ..Default::default()
        };
        self.ops.insert(
            id,
            Op {
                req,
                org: route.org,
                left: first.len(),
                then,
                rec,
            },
        );
        self.issue(id, route.org, first, ctx);
    }

    fn complete(&mut self, done: Completion, ctx: &mut Ctx) {
        ctx.up(done);
    }

    fn wake(&mut self, token: u64, ctx: &mut Ctx) {
        match self.timers.remove(&token) {
            Some(Timer::Device(dev, t)) => self.drive(dev, ctx, |d, c| d.wake(t, c)),
            Some(Timer::Done(dev, c)) => self.access_done(dev, c, ctx),
            None => {}
        }
    }

    fn stats(&self) -> Vec<(String, f64)> {
        let (n, mean) = self.access_totals();
        let mut out = vec![
            ("accesses".to_string(), n as f64),
            ("access_mean_ms".to_string(), mean),
        ];
        for (i, d) in self.devices.iter().enumerate() {
            let (n, sum) = self.served[i];
            let name = &self.names[i];
            out.push((format!("{name}.accesses"), n as f64));
            if n > 0 {
                out.push((format!("{name}.mean_response_ms"), sum / n as f64));
            }
            out.extend(
                d.stats()
                    .into_iter()
                    .map(|(k, v)| (format!("{name}.{k}"), v)),
            );
        }
        out
    }
}

/// What a replay on a system gives, in DiskSim's two levels: the logical requests
/// ("Overall I/O System" in a `.outv`) and the accesses to the devices ("IOdriver").
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Replay {
    pub requests: stats::ResponseStats,
    pub accesses: u64,
    pub access_mean_ms: f64,
}

impl System {
    /// Accesses served by all devices, and their mean response time (ms).
    pub fn access_totals(&self) -> (u64, f64) {
        let n: u64 = self.served.iter().map(|s| s.0).sum();
        let sum: f64 = self.served.iter().map(|s| s.1).sum();
        (n, sum / n.max(1) as f64)
    }
}

/// Replays a DiskSim ascii trace (`time_ms device block sectors flags`) read from `trace`
/// on the system of `parv`.
pub fn replay_ascii(
    parv: &std::path::Path,
    trace: impl std::io::BufRead,
) -> anyhow::Result<Replay> {
    let loaded = parv::load(parv)?;
    let caps = loaded.system.capacities();
    let mut src =
        crate::trace::TraceSource::new(trace, crate::trace::Format::Ascii).with_system(caps)?;
    finish_replay(loaded.system, &mut src)
}

/// Runs the synthetic workload (`disksim_synthio`) of `parv` on its system.
pub fn replay_synthio(parv: &std::path::Path) -> anyhow::Result<Replay> {
    let loaded = parv::load(parv)?;
    let Some(mut src) = parv::synthio(parv)? else {
        anyhow::bail!("{}: no disksim_synthio block", parv.display());
    };
    finish_replay(loaded.system, &mut src)
}

fn finish_replay(system: System, src: &mut dyn crate::engine::Source) -> anyhow::Result<Replay> {
    let mut sim = crate::engine::Simulator::new(vec![Box::new(system)]);
    let mut requests = stats::ResponseStats::default();
    sim.run(src, &mut |c| requests.add(c.response()))?;
    let mut out = Replay {
        requests,
        ..Default::default()
    };
    // The one component is the system: its totals of accesses.
    for (k, v) in sim.components()[0].stats() {
        match k.as_str() {
            "accesses" => out.accesses = v as u64,
            "access_mean_ms" => out.access_mean_ms = v,
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::logorg::Scheme;
    use super::*;
    use crate::engine::{ConstantDevice, Pending, Simulator, VecSource, When};
    use crate::request::Op as ReqOp;

    fn system(scheme: Scheme, members: usize) -> System {
        let devices = (0..members)
            .map(|i| {
                let d: Box<dyn Component> = Box::new(ConstantDevice::new(2.0));
                (format!("disk{i}"), d)
            })
            .collect();
        let org = Logorg::new("org0", false, scheme, members, 1000).unwrap();
        let routes = BTreeMap::from([(0, Route { org: 0, part: 0 })]);
        System::new(devices, vec![(org, (0..members).collect())], routes)
    }

    fn run(sys: System, reqs: Vec<Request>) -> Vec<f64> {
        let items = reqs
            .into_iter()
            .map(|req| Pending {
                when: When::At(0.0),
                req,
            })
            .collect();
        let mut sim = Simulator::new(vec![Box::new(sys)]);
        let mut out = Vec::new();
        sim.run(&mut VecSource::new(items), &mut |c| out.push(c.response()))
            .unwrap();
        out
    }

    #[test]
    fn a_request_completes_with_its_last_access() {
        // Striped over 4 constant 2 ms devices: a request over two devices takes 2 ms,
        // two requests on one device 2 and 4 ms.
        let s = system(Scheme::Striped { unit: 8 }, 4);
        let r = run(s, vec![Request::block(4, 8, ReqOp::Read)]);
        assert_eq!(r, vec![2.0]);
        let s = system(Scheme::Striped { unit: 8 }, 4);
        let mut r = run(
            s,
            vec![
                Request::block(0, 4, ReqOp::Read),
                Request::block(1, 4, ReqOp::Read),
            ],
        );
        r.sort_by(f64::total_cmp);
        assert_eq!(r, vec![2.0, 4.0]);
    }

    #[test]
    fn a_raid5_small_write_reads_then_writes() {
        let s = system(
            Scheme::Parity {
                unit: 8,
                rotated: true,
                rmw_point: 2,
            },
            5,
        );
        // Read old data and parity (2 ms, in parallel), then write both (2 ms).
        assert_eq!(run(s, vec![Request::block(2, 2, ReqOp::Write)]), vec![4.0]);
    }
}
