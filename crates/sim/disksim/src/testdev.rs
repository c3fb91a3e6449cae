//! A device for the unit tests of the host-side components (block layer, page cache,
//! Windows cache manager): it logs what reaches it, in the form each test compares, and
//! completes every request a fixed time after it starts.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use crate::engine::{Component, Ctx, Pending, Simulator, VecSource, When};
use crate::request::{Completion, Op, Record, Request};

/// What the device saw, one entry per request it started.
pub type Log<T> = Rc<RefCell<Vec<T>>>;

/// Completes each request `service` ms after it starts: all at once (`serial` false), or one
/// at a time in arrival order (`serial` true, FCFS). `entry` turns the start time and the
/// request into the log's entry.
pub struct TestDev<T> {
    log: Log<T>,
    entry: fn(f64, &Request) -> T,
    service: f64,
    serial: bool,
    queue: VecDeque<Request>,
    busy: HashMap<u64, Request>,
}

impl<T> TestDev<T> {
    pub fn new(log: &Log<T>, entry: fn(f64, &Request) -> T, service: f64, serial: bool) -> Self {
        TestDev {
            log: log.clone(),
            entry,
            service,
            serial,
            queue: VecDeque::new(),
            busy: HashMap::new(),
        }
    }

    /// The function that makes the log's entries (to build a device like another one).
    pub fn entry(&self) -> fn(f64, &Request) -> T {
        self.entry
    }

    fn start(&mut self, req: Request, ctx: &mut Ctx) {
        self.log.borrow_mut().push((self.entry)(ctx.now(), &req));
        ctx.wake_at(ctx.now() + self.service, req.id);
        self.busy.insert(req.id, req);
    }
}

impl<T> Component for TestDev<T> {
    fn name(&self) -> &str {
        "test device"
    }
    fn submit(&mut self, req: Request, ctx: &mut Ctx) {
        if self.serial && !self.busy.is_empty() {
            self.queue.push_back(req);
        } else {
            self.start(req, ctx);
        }
    }
    fn wake(&mut self, token: u64, ctx: &mut Ctx) {
        let req = self.busy.remove(&token).expect("a request in service");
        let rec = Record {
            arrival: req.arrival,
            device_start: req.arrival,
            completion: ctx.now(),
            ..Default::default()
        };
        ctx.up(Completion { req, rec });
        if let Some(next) = self.queue.pop_front() {
            self.start(next, ctx);
        }
    }
}

/// Runs `(arrival ms, lba, sectors, op)` requests, each arriving at its time, on `device`
/// alone; returns the completions in completion order.
pub fn run_at(device: Box<dyn Component>, reqs: &[(f64, u64, u32, Op)]) -> Vec<Completion> {
    let items = reqs
        .iter()
        .map(|&(t, lba, sectors, op)| pending_at(t, op, lba, sectors))
        .collect();
    let mut sim = Simulator::new(vec![device]);
    let mut out = Vec::new();
    sim.run(&mut VecSource::new(items), &mut |c| out.push(c.clone()))
        .expect("a test run");
    out
}

/// A request of `sectors` from `lba` arriving at `t` ms.
pub fn pending_at(t: f64, op: Op, lba: u64, sectors: u32) -> Pending {
    Pending {
        when: When::At(t),
        req: Request::block(lba, sectors, op),
    }
}
