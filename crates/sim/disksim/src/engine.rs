//! The discrete-event core.
//!
//! A simulation is a *chain* of components, top to bottom, fed by a workload source:
//!
//! ```text
//!   source (trace / generator)
//!     │ Arrive(req)            ▲ Complete(done)
//!   level 0  e.g. page cache   (issue 12)
//!     │ Arrive                 ▲ Complete
//!   level 1  e.g. block layer / I/O scheduler
//!     │ Arrive                 ▲ Complete
//!   level 2  device (HDD with its cache and queue, SSD, measured device)
//! ```
//!
//! Components never call each other: they return *actions* through [`Ctx`] — send a request
//! down, send a completion up, or set a timer for themselves — and the engine turns each
//! action into an event. Events at the same instant run in the order they were made (FIFO),
//! future events in time order with ties broken by creation order, so a run is a pure
//! function of its input and seed: the same input gives the same output, bit for bit.
//!
//! Memory is O(requests in flight): the source is pulled one request at a time, and
//! completions leave through an observer callback as they happen.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

use crate::request::{Completion, Record, Request};

/// What a component asks the engine to do.
#[derive(Debug)]
pub enum Action {
    /// Pass a request to the component below (or, from the bottom, an error).
    Down(Request),
    /// Report a finished request to the component above (or to the source).
    Up(Completion),
    /// The same at the completion's own `rec.completion` instant, when that is later: a
    /// component's CPU cost on the way up, without a timer and a table of held completions
    /// in the component.
    UpAt(Completion),
    /// Wake this component at `at` (ms) with `token`.
    Wake { at: f64, token: u64 },
}

/// The interface a component sees: the current time and a place to put actions.
pub struct Ctx {
    now: f64,
    actions: Vec<Action>,
}

impl Ctx {
    /// A context at `now` for a component that drives components of its own (a storage
    /// system's devices); their actions come back with [`Ctx::into_actions`].
    pub(crate) fn at(now: f64) -> Ctx {
        Ctx {
            now,
            actions: Vec::new(),
        }
    }
    pub(crate) fn into_actions(self) -> Vec<Action> {
        self.actions
    }
    pub fn now(&self) -> f64 {
        self.now
    }
    pub fn down(&mut self, req: Request) {
        self.actions.push(Action::Down(req));
    }
    pub fn up(&mut self, done: Completion) {
        self.actions.push(Action::Up(done));
    }
    /// Reports `done` to the level above at `done.rec.completion` (ms; before now is taken
    /// as now). Events run in the order a timer set now and firing then would have given.
    pub fn up_at(&mut self, done: Completion) {
        self.actions.push(Action::UpAt(done));
    }
    /// Sets a timer; `at` before now is treated as now.
    pub fn wake_at(&mut self, at: f64, token: u64) {
        self.actions.push(Action::Wake { at, token });
    }
}

/// One storage component: a module of the seed's diagram (page cache, scheduler, disk cache,
/// disk...). It receives requests from above, completions from below and its own timers.
pub trait Component {
    /// Short name for reports ("hdd", "blocklayer", ...).
    fn name(&self) -> &str;
    /// A request arrives from the level above at `ctx.now()`.
    fn submit(&mut self, req: Request, ctx: &mut Ctx);
    /// A request this component sent down has finished. The default passes it up unchanged.
    fn complete(&mut self, done: Completion, ctx: &mut Ctx) {
        ctx.up(done);
    }
    /// A timer set with [`Ctx::wake_at`] fired.
    fn wake(&mut self, _token: u64, _ctx: &mut Ctx) {}
    /// Whether `submit` only ever sends the request down, unchanged, doing nothing else: the
    /// engine may then hand requests to the level below directly.
    fn passes_requests(&self) -> bool {
        false
    }
    /// Serves `req`, arriving at `now`, at once if this component can without the levels
    /// below and without a timer: does what `submit` would have, fills in `rec`, and says
    /// whether the one action `submit` would have made is an `up` or an `up_at`. None:
    /// nothing done (`rec` untouched), the engine calls `submit`. The default never serves.
    /// (References, not values: a completion is ~160 bytes, and moving it in and out of
    /// these calls was a fifth of a cache hit's simulation.)
    fn serve_now(&mut self, _req: &Request, _now: f64, _rec: &mut Record) -> Option<Finished> {
        None
    }
    /// The same for `complete`: when it would only send `done` up (maybe later), changes
    /// `done` as it would have; None: nothing done, the engine calls `complete`.
    fn complete_now(&mut self, _done: &mut Completion, _now: f64) -> Option<Finished> {
        None
    }
    /// Component statistics for the summary (name, value); units in the name.
    fn stats(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
}

/// The one action of a [`Component::serve_now`] or [`Component::complete_now`]: the
/// completion goes up now ([`Ctx::up`]) or at its own time ([`Ctx::up_at`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finished {
    Up,
    UpAt,
}

/// When the source wants its next request issued.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum When {
    /// At an absolute simulated time (open loop; trace timestamps).
    At(f64),
    /// `think` ms after the next completion (closed loop; DiskSim's validate traces).
    AfterCompletion { think: f64 },
    /// At `at` (ms), as a request of `stream`, one of several independent closed loops (fio's
    /// `numjobs` × `iodepth`): when it completes, the engine asks the source for that
    /// stream's next request with [`Source::next_in_stream`]. `at` before now means now.
    Stream { stream: u32, at: f64 },
}

/// A request template from a workload (the engine assigns `id` and `arrival`).
#[derive(Clone, Debug, PartialEq)]
pub struct Pending {
    pub when: When,
    pub req: Request,
}

/// A workload: a trace reader or a generator, pulled one request at a time.
pub trait Source {
    /// The next request, `Ok(None)` at the end. Errors (a malformed trace line) stop the run.
    fn next(&mut self) -> anyhow::Result<Option<Pending>>;
    /// Total requests if known (for the progress bar).
    fn len_hint(&self) -> Option<u64> {
        None
    }
    /// The next request of `stream` after one of its requests completed at `now` (ms); only
    /// called for sources that issue [`When::Stream`] requests. `Ok(None)`: the stream ends
    /// (or idles: it gets no further call until another of its requests completes).
    fn next_in_stream(&mut self, _stream: u32, _now: f64) -> anyhow::Result<Option<Pending>> {
        Ok(None)
    }
    /// Whether a request of `stream` handed out earlier (for a later time) is still to be
    /// issued at `now`: false drops it, as if it had never been handed out (a fio job stopped
    /// by another's `exitall` while it waited for its rate). The default keeps every one.
    fn still_wanted(&mut self, _stream: u32, _now: f64) -> bool {
        true
    }
    /// A request of `stream` completed at `now` (told before [`Source::next_in_stream`]):
    /// for sources that watch what their streams did (fio's steady-state detection).
    fn stream_completed(&mut self, _stream: u32, _done: &Completion, _now: f64) {}
}

/// A source lent to a run (the caller reads its counters after).
impl<S: Source + ?Sized> Source for &mut S {
    fn next(&mut self) -> anyhow::Result<Option<Pending>> {
        (**self).next()
    }
    fn len_hint(&self) -> Option<u64> {
        (**self).len_hint()
    }
    fn next_in_stream(&mut self, stream: u32, now: f64) -> anyhow::Result<Option<Pending>> {
        (**self).next_in_stream(stream, now)
    }
    fn still_wanted(&mut self, stream: u32, now: f64) -> bool {
        (**self).still_wanted(stream, now)
    }
    fn stream_completed(&mut self, stream: u32, done: &Completion, now: f64) {
        (**self).stream_completed(stream, done, now)
    }
}

/// Marks an issued request that belongs to no stream.
const NO_STREAM: u32 = u32::MAX;

/// An event. Requests and completions wait in [`Payloads`] and events name them by slot:
/// events are moved through the queues several times each (the action list, the queue of
/// events due now, the heap's sifting), and a completion is ~160 bytes.
#[derive(Debug)]
enum Kind {
    Arrive {
        level: usize,
        req: u32,
    },
    Complete {
        level: usize,
        done: u32,
    },
    Wake {
        level: usize,
        token: u64,
    },
    /// An `up_at` falling due: the completion goes up from `level` now.
    Up {
        level: usize,
        done: u32,
    },
    /// The source's next request is due (with its stream, or `NO_STREAM`).
    Issue(u32, u32),
}

/// The requests and completions of queued events, by slot; a slot is reused once taken.
#[derive(Default)]
struct Payloads {
    requests: Vec<Option<Request>>,
    free_requests: Vec<u32>,
    completions: Vec<Option<Completion>>,
    free_completions: Vec<u32>,
}

impl Payloads {
    fn put_request(&mut self, r: Request) -> u32 {
        put(&mut self.requests, &mut self.free_requests, r)
    }
    fn take_request(&mut self, i: u32) -> Request {
        take(&mut self.requests, &mut self.free_requests, i)
    }
    fn put_completion(&mut self, c: Completion) -> u32 {
        put(&mut self.completions, &mut self.free_completions, c)
    }
    fn take_completion(&mut self, i: u32) -> Completion {
        take(&mut self.completions, &mut self.free_completions, i)
    }
}

fn put<T>(slots: &mut Vec<Option<T>>, free: &mut Vec<u32>, v: T) -> u32 {
    match free.pop() {
        Some(i) => {
            slots[i as usize] = Some(v);
            i
        }
        None => {
            slots.push(Some(v));
            (slots.len() - 1) as u32
        }
    }
}

fn take<T>(slots: &mut [Option<T>], free: &mut Vec<u32>, i: u32) -> T {
    let v = slots[i as usize]
        .take()
        .expect("an event's payload is taken once");
    free.push(i);
    v
}

struct Timed {
    at: f64,
    seq: u64,
    kind: Kind,
}

impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at && self.seq == o.seq
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    // BinaryHeap is a max-heap: reverse so the earliest (then oldest) comes first.
    fn cmp(&self, o: &Self) -> Ordering {
        o.at.total_cmp(&self.at).then(o.seq.cmp(&self.seq))
    }
}

/// Totals of a finished run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RunTotals {
    pub requests: u64,
    /// Simulated time at the last completion (ms).
    pub sim_end: f64,
    pub events: u64,
}

/// The simulator: a chain of components and an event queue.
///
/// Invariant of the shortcut (see [`Simulator::run`]): an event a step makes is run at once,
/// without a queue, only when it is the only event the step made, nothing is due now, and
/// it is due strictly before everything in the heap — that is, exactly when the queues would
/// have handed it out next. A run is the same with and without it, event for event
/// ([`Simulator::without_shortcut`], test `the_shortcut_changes_nothing`).
pub struct Simulator {
    chain: Vec<Box<dyn Component>>,
    heap: BinaryHeap<Timed>,
    /// Events due now, in creation order (cheaper than the heap for the common case).
    now_queue: VecDeque<Kind>,
    now: f64,
    seq: u64,
    next_id: u64,
    in_flight: u64,
    /// Whether the source may have another request for [`Source::next`]: false once it
    /// said None, true again if it does not after a stream's completion (a fio job that
    /// waits for others, `stonewall`, starts when they end).
    more: bool,
    /// Closed-loop issues waiting for a completion (think times, FIFO).
    waiting_for_completion: VecDeque<(f64, Request)>,
    /// Stream of each in-flight request issued with [`When::Stream`], by request id.
    stream_of: crate::Map<u64, u32>,
    events: u64,
    payloads: Payloads,
    /// The events the current step made, in order, with their times.
    made: Vec<(f64, Kind)>,
    shortcut: bool,
    /// Levels at the top that only pass requests down ([`Component::passes_requests`]).
    passing: usize,
}

impl Simulator {
    /// `chain[0]` is the top component, the last one the device.
    pub fn new(chain: Vec<Box<dyn Component>>) -> Self {
        assert!(!chain.is_empty(), "a simulation needs at least a device");
        let passing = chain.iter().take_while(|c| c.passes_requests()).count();
        Simulator {
            chain,
            heap: BinaryHeap::new(),
            now_queue: VecDeque::new(),
            now: 0.0,
            seq: 0,
            next_id: 0,
            in_flight: 0,
            more: true,
            waiting_for_completion: VecDeque::new(),
            stream_of: Default::default(),
            events: 0,
            payloads: Payloads::default(),
            made: Vec::with_capacity(8),
            shortcut: true,
            passing,
        }
    }

    /// Every event through the queues (the reference the shortcut is tested against).
    pub fn without_shortcut(mut self) -> Self {
        self.shortcut = false;
        self
    }

    pub fn components(&self) -> &[Box<dyn Component>] {
        &self.chain
    }

    pub fn now(&self) -> f64 {
        self.now
    }

    /// Notes an event the current step made (queued at the end of the step, or run next).
    fn push(&mut self, at: f64, kind: Kind) {
        self.made.push((at, kind));
    }

    fn enqueue(&mut self, at: f64, kind: Kind) {
        if at <= self.now {
            self.now_queue.push_back(kind);
        } else {
            self.seq += 1;
            self.heap.push(Timed {
                at,
                seq: self.seq,
                kind,
            });
        }
    }

    /// Pulls the source's next request and schedules it; returns false at the end.
    fn pull(&mut self, source: &mut dyn Source) -> anyhow::Result<bool> {
        match source.next()? {
            None => Ok(false),
            Some(p) => {
                match p.when {
                    When::At(t) => {
                        let at = if t.is_finite() {
                            t.max(self.now)
                        } else {
                            self.now
                        };
                        let r = self.payloads.put_request(p.req);
                        self.push(at, Kind::Issue(r, NO_STREAM));
                    }
                    When::Stream { stream, at } => self.push_stream(stream, at, p.req),
                    When::AfterCompletion { think } => {
                        if self.in_flight == 0 && self.waiting_for_completion.is_empty() {
                            // Nothing to wait for: the think time runs from now.
                            let at = self.now + think.max(0.0);
                            let r = self.payloads.put_request(p.req);
                            self.push(at, Kind::Issue(r, NO_STREAM));
                        } else {
                            self.waiting_for_completion
                                .push_back((think.max(0.0), p.req));
                        }
                    }
                }
                Ok(true)
            }
        }
    }

    /// Schedules a [`When::Stream`] request (the stream number `NO_STREAM` is taken as the
    /// last valid one's neighbour: it is mapped to `NO_STREAM - 1`).
    fn push_stream(&mut self, stream: u32, at: f64, req: Request) {
        let at = if at.is_finite() {
            at.max(self.now)
        } else {
            self.now
        };
        let r = self.payloads.put_request(req);
        self.push(at, Kind::Issue(r, stream.min(NO_STREAM - 1)));
    }

    /// Runs `source` to the end, calling `observe` for every completed request in completion
    /// order.
    pub fn run(
        &mut self,
        source: &mut dyn Source,
        observe: &mut dyn FnMut(&Completion),
    ) -> anyhow::Result<RunTotals> {
        self.run_streams(source, &mut |c, _| observe(c))
    }

    /// [`Simulator::run`], `observe` also told the stream of each completed request (None:
    /// not a [`When::Stream`] request): jobs sharing a file are told apart by it.
    pub fn run_streams(
        &mut self,
        source: &mut dyn Source,
        observe: &mut dyn FnMut(&Completion, Option<u32>),
    ) -> anyhow::Result<RunTotals> {
        self.more = self.pull(source)?;
        let mut done_count = 0u64;
        // The source is pulled again each time one of its requests is issued, so at most one
        // future request is held besides those in flight.
        let mut ctx = Ctx {
            now: 0.0,
            actions: Vec::with_capacity(8),
        };
        // The event to run next without queueing it (see the invariant on `Simulator`).
        let mut next: Option<(f64, Kind)> = None;
        loop {
            self.shortcut_or_queue(&mut next);
            let before = self.now;
            let kind = if let Some((at, k)) = next.take() {
                self.now = self.now.max(at);
                k
            } else if let Some(k) = self.now_queue.pop_front() {
                k
            } else if let Some(t) = self.heap.pop() {
                self.now = t.at;
                t.kind
            } else {
                break;
            };
            self.events += 1;
            ctx.now = self.now;
            let level = match kind {
                Kind::Issue(r, stream) => {
                    let mut req = self.payloads.take_request(r);
                    if stream != NO_STREAM && !source.still_wanted(stream, self.now) {
                        // Dropped: as if it had never been there (every later event is at
                        // or after it, so the clock may stay where it was).
                        self.now = before;
                        if !self.more {
                            // (its end may start jobs that waited for it)
                            self.more = self.pull(source)?;
                        }
                        continue;
                    }
                    req.id = self.next_id;
                    self.next_id += 1;
                    req.arrival = self.now;
                    self.in_flight += 1;
                    if self.more {
                        self.more = self.pull(source)?;
                    }
                    if req.flags.contains(crate::request::Flags::NO_IO) {
                        let rec = Record {
                            arrival: self.now,
                            device_start: self.now,
                            completion: self.now,
                            ..Record::default()
                        };
                        let done = Completion { req, rec };
                        self.queue_made();
                        self.arrived(&done, Some(stream), source, observe, &mut done_count)?;
                        continue;
                    }
                    if self.shortcut && self.passing < self.chain.len() {
                        // (The lane notes the request's stream only if it leaves the lane.)
                        match self.fast_lane(
                            req,
                            stream,
                            &mut ctx,
                            source,
                            observe,
                            &mut done_count,
                        )? {
                            None => continue,
                            Some((level, req)) => {
                                self.chain[level].submit(req, &mut ctx);
                                level
                            }
                        }
                    } else {
                        self.note_stream(req.id, stream);
                        self.chain[0].submit(req, &mut ctx);
                        0
                    }
                }
                Kind::Arrive { level, req } => {
                    let req = self.payloads.take_request(req);
                    self.chain[level].submit(req, &mut ctx);
                    level
                }
                Kind::Complete { level, done } => {
                    let done = self.payloads.take_completion(done);
                    self.chain[level].complete(done, &mut ctx);
                    level
                }
                Kind::Wake { level, token } => {
                    self.chain[level].wake(token, &mut ctx);
                    level
                }
                Kind::Up { level, done } if level > 0 => {
                    // What the action loop does with an `Up` above the top, with the
                    // completion left in its slot (taken out and put back, it was moved
                    // twice more per level; the slot it gets back is the same).
                    self.push(
                        self.now,
                        Kind::Complete {
                            level: level - 1,
                            done,
                        },
                    );
                    continue;
                }
                Kind::Up { level, done } => {
                    let done = self.payloads.take_completion(done);
                    ctx.actions.push(Action::Up(done));
                    level
                }
            };
            self.apply(level, &mut ctx, source, observe, &mut done_count)?;
        }
        if self.in_flight != 0 || !self.waiting_for_completion.is_empty() {
            anyhow::bail!(
                "simulation stalled with {} requests in flight (a component lost a request)",
                self.in_flight
            );
        }
        Ok(RunTotals {
            requests: done_count,
            sim_end: self.now,
            events: self.events,
        })
    }

    /// Carries out the actions of a step at `level`.
    fn apply(
        &mut self,
        level: usize,
        ctx: &mut Ctx,
        source: &mut dyn Source,
        observe: &mut dyn FnMut(&Completion, Option<u32>),
        done_count: &mut u64,
    ) -> anyhow::Result<()> {
        let mut actions = std::mem::take(&mut ctx.actions);
        for a in actions.drain(..) {
            match a {
                Action::Down(req) => {
                    if level + 1 >= self.chain.len() {
                        anyhow::bail!(
                            "component '{}' is at the bottom of the chain but sent a request down",
                            self.chain[level].name()
                        );
                    }
                    let req = self.payloads.put_request(req);
                    self.push(
                        self.now,
                        Kind::Arrive {
                            level: level + 1,
                            req,
                        },
                    );
                }
                Action::Up(done) => {
                    if level == 0 {
                        self.arrived(&done, None, source, observe, done_count)?;
                    } else {
                        let done = self.payloads.put_completion(done);
                        self.push(
                            self.now,
                            Kind::Complete {
                                level: level - 1,
                                done,
                            },
                        );
                    }
                }
                // (`max` also takes a NaN time as now)
                Action::Wake { at, token } => {
                    self.push(at.max(self.now), Kind::Wake { level, token })
                }
                Action::UpAt(done) => {
                    let at = done.rec.completion.max(self.now);
                    let done = self.payloads.put_completion(done);
                    self.push(at, Kind::Up { level, done })
                }
            }
        }
        ctx.actions = actions;
        Ok(())
    }

    /// Notes the stream of an issued request that goes through the queues.
    fn note_stream(&mut self, id: u64, stream: u32) {
        if stream != NO_STREAM {
            self.stream_of.insert(id, stream);
        }
    }

    /// A request leaves the top of the chain: counted, observed, and its stream (`lane`:
    /// the stream of a request that never left the fast lane, else noted by id) or the
    /// closed loop goes on.
    fn arrived(
        &mut self,
        done: &Completion,
        lane: Option<u32>,
        source: &mut dyn Source,
        observe: &mut dyn FnMut(&Completion, Option<u32>),
        done_count: &mut u64,
    ) -> anyhow::Result<()> {
        self.in_flight -= 1;
        *done_count += 1;
        // (Most runs have no streams: skip the hash then.)
        let stream = match lane {
            Some(s) => (s != NO_STREAM).then_some(s),
            None if self.stream_of.is_empty() => None,
            None => self.stream_of.remove(&done.req.id),
        };
        observe(done, stream);
        if let Some(stream) = stream {
            source.stream_completed(stream, done, self.now);
            if let Some(p) = source.next_in_stream(stream, self.now)? {
                let at = match p.when {
                    When::At(t) | When::Stream { at: t, .. } => t,
                    When::AfterCompletion { think } => self.now + think,
                };
                self.push_stream(stream, at, p.req);
            }
            if !self.more {
                // A stream's end may start streams that waited for it.
                self.more = self.pull(source)?;
            }
        } else if let Some((think, req)) = self.waiting_for_completion.pop_front() {
            let at = self.now + think;
            let req = self.payloads.put_request(req);
            self.push(at, Kind::Issue(req, NO_STREAM));
        }
        Ok(())
    }

    /// A request just issued, taken down the levels that pass requests and up again without
    /// the queues for as long as each of its events is the one the queues would hand out
    /// next (the invariant on `Simulator`; events are counted as if queued). Returns the
    /// level whose `submit` it still needs, or None once it is served or queued.
    fn fast_lane(
        &mut self,
        req: Request,
        stream: u32,
        ctx: &mut Ctx,
        source: &mut dyn Source,
        observe: &mut dyn FnMut(&Completion, Option<u32>),
        done_count: &mut u64,
    ) -> anyhow::Result<Option<(usize, Request)>> {
        // What this step made so far (the source's next request) is queued first.
        self.queue_made();
        if !self.now_queue.is_empty() {
            self.note_stream(req.id, stream);
            return Ok(Some((0, req)));
        }
        // Each `Arrive` down to the serving level is due now, with nothing before it.
        let mut level = self.passing;
        self.events += level as u64;
        let mut rec = Record::default();
        let Some(mut fin) = self.chain[level].serve_now(&req, self.now, &mut rec) else {
            self.note_stream(req.id, stream);
            return Ok(Some((level, req)));
        };
        let mut done = Completion { req, rec };
        loop {
            if fin == Finished::UpAt {
                // An `Up` event of its own, due at `at`.
                let at = done.rec.completion.max(self.now);
                if at > self.now && self.heap.peek().is_some_and(|t| t.at <= at) {
                    self.note_stream(done.req.id, stream);
                    let done = self.payloads.put_completion(done);
                    self.enqueue(at, Kind::Up { level, done });
                    return Ok(None);
                }
                self.now = at;
                ctx.now = at;
                self.events += 1;
            }
            if level == 0 {
                self.arrived(&done, Some(stream), source, observe, done_count)?;
                return Ok(None);
            }
            // The `Complete` event one level up, due now.
            level -= 1;
            self.events += 1;
            match self.chain[level].complete_now(&mut done, self.now) {
                Some(f) => fin = f,
                None => {
                    self.note_stream(done.req.id, stream);
                    self.chain[level].complete(done, ctx);
                    self.apply(level, ctx, source, observe, done_count)?;
                    return Ok(None);
                }
            }
        }
    }

    /// Takes the last step's one event as the next to run when the queues would hand it out
    /// next; otherwise queues the step's events in the order they were made.
    fn shortcut_or_queue(&mut self, next: &mut Option<(f64, Kind)>) {
        if self.shortcut && self.made.len() == 1 && self.now_queue.is_empty() {
            let at = self.made[0].0;
            // Queued at or before now it would go to the (empty) queue of events due now;
            // later, to the heap, where an event due at the same time was made earlier and
            // goes first.
            if at <= self.now || self.heap.peek().is_none_or(|t| at < t.at) {
                *next = self.made.pop();
                return;
            }
        }
        self.queue_made();
    }

    /// Queues the events made so far, in the order they were made.
    fn queue_made(&mut self) {
        // (taken and put back, to keep its allocation)
        let mut made = std::mem::take(&mut self.made);
        for (at, kind) in made.drain(..) {
            self.enqueue(at, kind);
        }
        self.made = made;
    }
}

/// A source over an in-memory list (tests, small examples).
pub struct VecSource {
    items: std::vec::IntoIter<Pending>,
    len: u64,
}

impl VecSource {
    pub fn new(items: Vec<Pending>) -> Self {
        let len = items.len() as u64;
        VecSource {
            items: items.into_iter(),
            len,
        }
    }
}

impl Source for VecSource {
    fn next(&mut self) -> anyhow::Result<Option<Pending>> {
        Ok(self.items.next())
    }
    fn len_hint(&self) -> Option<u64> {
        Some(self.len)
    }
}

/// A pass-through component (a placeholder level, and the simplest example of the trait).
pub struct PassThrough;

impl Component for PassThrough {
    fn name(&self) -> &str {
        "passthrough"
    }
    fn submit(&mut self, req: Request, ctx: &mut Ctx) {
        ctx.down(req);
    }
    fn passes_requests(&self) -> bool {
        true
    }
    fn complete_now(&mut self, _done: &mut Completion, _now: f64) -> Option<Finished> {
        Some(Finished::Up)
    }
}

/// A device with a constant service time and one request at a time (FCFS): the reference
/// for engine tests.
pub struct ConstantDevice {
    pub service_ms: f64,
    queue: VecDeque<Request>,
    busy: Option<(Request, f64)>,
}

impl ConstantDevice {
    pub fn new(service_ms: f64) -> Self {
        ConstantDevice {
            service_ms,
            queue: VecDeque::new(),
            busy: None,
        }
    }
    fn start(&mut self, req: Request, ctx: &mut Ctx) {
        let start = ctx.now();
        ctx.wake_at(start + self.service_ms, req.id);
        self.busy = Some((req, start));
    }
}

impl Component for ConstantDevice {
    fn name(&self) -> &str {
        "constant"
    }
    fn submit(&mut self, req: Request, ctx: &mut Ctx) {
        if self.busy.is_none() {
            self.start(req, ctx);
        } else {
            self.queue.push_back(req);
        }
    }
    fn wake(&mut self, _token: u64, ctx: &mut Ctx) {
        if let Some((req, start)) = self.busy.take() {
            let rec = crate::request::Record {
                arrival: req.arrival,
                queue_wait: start - req.arrival,
                device_start: start,
                transfer: self.service_ms,
                completion: ctx.now(),
                ..Default::default()
            };
            ctx.up(Completion { req, rec });
        }
        if let Some(next) = self.queue.pop_front() {
            self.start(next, ctx);
        }
    }
}

/// A component's statistics as [`Component::stats`] lists them, each name after the
/// component's own (`"pagecache hit pages"`).
pub fn prefixed_stats(component: &str, stats: &[(&str, f64)]) -> Vec<(String, f64)> {
    stats
        .iter()
        .map(|&(name, v)| (format!("{component} {name}"), v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Op;

    fn req(lba: u64) -> Request {
        Request::block(lba, 8, Op::Read)
    }

    #[test]
    fn open_loop_queues_fcfs_through_a_passthrough_level() {
        let mut sim = Simulator::new(vec![
            Box::new(PassThrough),
            Box::new(ConstantDevice::new(2.0)),
        ]);
        let items = (0..3)
            .map(|i| Pending {
                when: When::At(0.5 * i as f64),
                req: req(i),
            })
            .collect();
        let mut out = Vec::new();
        let t = sim
            .run(&mut VecSource::new(items), &mut |c| {
                out.push((c.req.id, c.rec.arrival, c.rec.completion))
            })
            .unwrap();
        assert_eq!(t.requests, 3);
        // Served back to back: 2, 4, 6 ms.
        assert_eq!(out, vec![(0, 0.0, 2.0), (1, 0.5, 4.0), (2, 1.0, 6.0)]);
    }

    /// Holds each completion `cost` ms on its way up, by timer (`by_timer`) or `up_at`.
    struct Cpu {
        cost: f64,
        by_timer: bool,
        held: std::collections::HashMap<u64, Completion>,
    }
    impl Component for Cpu {
        fn name(&self) -> &str {
            "cpu"
        }
        fn submit(&mut self, req: Request, ctx: &mut Ctx) {
            ctx.down(req);
        }
        fn complete(&mut self, mut done: Completion, ctx: &mut Ctx) {
            done.rec.completion = ctx.now() + self.cost;
            if self.by_timer {
                ctx.wake_at(done.rec.completion, done.req.id);
                self.held.insert(done.req.id, done);
            } else {
                ctx.up_at(done);
            }
        }
        fn wake(&mut self, token: u64, ctx: &mut Ctx) {
            ctx.up(self.held.remove(&token).unwrap());
        }
        fn passes_requests(&self) -> bool {
            true
        }
        fn complete_now(&mut self, done: &mut Completion, now: f64) -> Option<Finished> {
            if self.by_timer {
                return None;
            }
            done.rec.completion = now + self.cost;
            Some(Finished::UpAt)
        }
    }

    /// Serves requests to even sectors itself after `cost` ms (an `up_at`; a cost of 0 is an
    /// `up`), and sends the others down.
    struct EvenHits {
        cost: f64,
    }
    impl EvenHits {
        fn serve(&self, req: &Request, now: f64, rec: &mut Record) -> Option<Finished> {
            if req.lba % 2 != 0 {
                return None;
            }
            rec.arrival = req.arrival;
            rec.completion = now + self.cost;
            Some(if self.cost > 0.0 {
                Finished::UpAt
            } else {
                Finished::Up
            })
        }
    }
    impl Component for EvenHits {
        fn name(&self) -> &str {
            "evenhits"
        }
        fn submit(&mut self, req: Request, ctx: &mut Ctx) {
            let mut rec = Record::default();
            match self.serve(&req, ctx.now(), &mut rec) {
                Some(Finished::Up) => ctx.up(Completion { req, rec }),
                Some(Finished::UpAt) => ctx.up_at(Completion { req, rec }),
                None => ctx.down(req),
            }
        }
        fn serve_now(&mut self, req: &Request, now: f64, rec: &mut Record) -> Option<Finished> {
            self.serve(req, now, rec)
        }
    }

    /// `up_at` delivers at the completion's time, in the order a timer would have: the same
    /// run both ways, event for event, with ties (costs 0 and equal times) included.
    #[test]
    fn up_at_is_a_timer_without_the_table() {
        let run = |by_timer: bool, cost: f64| {
            let mut sim = Simulator::new(vec![
                Box::new(Cpu {
                    cost,
                    by_timer,
                    held: Default::default(),
                }),
                Box::new(Cpu {
                    cost: cost / 2.0,
                    by_timer,
                    held: Default::default(),
                }),
                Box::new(ConstantDevice::new(1.0)),
            ]);
            let items = (0..6)
                .map(|i| Pending {
                    when: When::At(0.25 * (i / 2) as f64),
                    req: req(i),
                })
                .collect();
            let mut out = Vec::new();
            let t = sim
                .run(&mut VecSource::new(items), &mut |c| {
                    out.push((c.req.id, c.rec.completion))
                })
                .unwrap();
            (out, t.sim_end)
        };
        for cost in [0.0, 0.5, 1.0] {
            let (timer, end) = run(true, cost);
            assert_eq!(run(false, cost), (timer.clone(), end), "cost {cost}");
            assert_eq!(end, 6.0 + 1.5 * cost, "cost {cost}");
        }
    }

    /// Streams of requests (think times on a coarse grid, so that many events tie).
    struct Streams {
        first: Vec<Pending>,
        left: Vec<u32>,
        n: u64,
    }
    impl Source for Streams {
        fn next(&mut self) -> anyhow::Result<Option<Pending>> {
            Ok(self.first.pop())
        }
        fn next_in_stream(&mut self, stream: u32, now: f64) -> anyhow::Result<Option<Pending>> {
            let left = &mut self.left[stream as usize];
            if *left == 0 {
                return Ok(None);
            }
            *left -= 1;
            self.n += 1;
            Ok(Some(Pending {
                when: When::Stream {
                    stream,
                    at: now + 0.25 * (self.n % 3) as f64,
                },
                req: req(self.n),
            }))
        }
    }

    /// Taking an event without queueing it happens only where the queues would have handed
    /// it out next, and so does the fast lane (requests served at once by a level, half of
    /// them here): runs with and without the shortcut complete the same requests at the
    /// same times in the same order, through the same number of events.
    #[test]
    fn the_shortcut_changes_nothing() {
        let run = |shortcut: bool, streams: u32, cost: f64| {
            let chain: Vec<Box<dyn Component>> = vec![
                Box::new(Cpu {
                    cost,
                    by_timer: false,
                    held: Default::default(),
                }),
                Box::new(PassThrough),
                Box::new(EvenHits { cost: cost / 4.0 }),
                Box::new(Cpu {
                    cost: cost / 2.0,
                    by_timer: true,
                    held: Default::default(),
                }),
                Box::new(ConstantDevice::new(0.5)),
            ];
            let mut sim = Simulator::new(chain);
            if !shortcut {
                sim = sim.without_shortcut();
            }
            let mut src = Streams {
                first: (0..streams)
                    .map(|s| Pending {
                        when: When::Stream {
                            stream: s,
                            at: 0.25 * (s % 2) as f64,
                        },
                        req: req(1000 + s as u64),
                    })
                    .collect(),
                left: vec![40; streams as usize],
                n: 0,
            };
            let mut out = Vec::new();
            let t = sim
                .run(&mut src, &mut |c| {
                    out.push((c.req.id, c.req.lba, c.rec.arrival, c.rec.completion))
                })
                .unwrap();
            (out, t.events, t.sim_end)
        };
        for streams in [1, 2, 5] {
            for cost in [0.0, 0.25, 0.5] {
                let with = run(true, streams, cost);
                assert_eq!(with.0.len(), 41 * streams as usize);
                assert_eq!(
                    with,
                    run(false, streams, cost),
                    "{streams} streams, cost {cost}"
                );
            }
        }
    }

    #[test]
    fn closed_loop_issues_after_completion_plus_think() {
        let mut sim = Simulator::new(vec![Box::new(ConstantDevice::new(1.0))]);
        let items = (0..3)
            .map(|i| Pending {
                when: When::AfterCompletion { think: 3.0 },
                req: req(i),
            })
            .collect();
        let mut out = Vec::new();
        sim.run(&mut VecSource::new(items), &mut |c| {
            out.push((c.rec.arrival, c.rec.completion))
        })
        .unwrap();
        // First: think from t=0; then 3 ms after each completion.
        assert_eq!(out, vec![(3.0, 4.0), (7.0, 8.0), (11.0, 12.0)]);
    }

    /// The HDD model (a drive cache, a seek and rotation timeline, its own scheduler), alone
    /// and under the Linux host stack (hash maps, write-back, the flusher's timer), replays a
    /// seeded workload the same way every time: the same requests complete at the same times,
    /// bit for bit, with the same outcomes and time splits. Another seed gives another run, so
    /// the comparison is of runs that could differ.
    #[test]
    fn same_input_same_output() {
        use crate::workload::{Dist, Generator};
        let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/hdd-7200.toml");
        let cfg = crate::config::Config::load(&config).unwrap();
        let run = |seed: u64, host: bool| {
            let dev = cfg.device(&config).unwrap();
            let mut spec = cfg.workload.clone().expect("the config's [workload]");
            spec.requests = 3000;
            spec.seed = seed;
            // Arrivals faster than the drive serves them: the queue and its scheduler matter.
            spec.interarrival = Some(Dist::Exponential { mean: 4.0 });
            let mut src = Generator::new(spec, dev.blocks).unwrap();
            let mut params = crate::host::HostParams::linux_defaults();
            params.page_cache.capacity_pages = 4096;
            params.page_cache.dirty.dirtyable_pages = 4096;
            let chain = if host {
                params.stack().on(dev.component).unwrap()
            } else {
                vec![dev.component]
            };
            let mut sim = Simulator::new(chain);
            let mut out = Vec::new();
            let totals = sim
                .run(&mut src, &mut |c| {
                    let r = &c.rec;
                    let times = [r.arrival, r.device_start, r.seek, r.rotation, r.transfer];
                    out.push((
                        c.req.lba,
                        c.req.sectors,
                        c.req.op.letter(),
                        times.map(f64::to_bits),
                        r.completion.to_bits(),
                        format!("{:?}", r.cache),
                    ));
                })
                .unwrap();
            let stats: Vec<_> = sim.components().iter().flat_map(|c| c.stats()).collect();
            (out, totals.events, format!("{stats:?}"))
        };
        for host in [false, true] {
            let first = run(7, host);
            assert_eq!(first.0.len(), 3000, "every request completes");
            let hits = first.0.iter().filter(|c| c.5 != "Miss").count();
            assert!(hits > 0, "the caches serve some requests");
            let again = run(7, host);
            for (i, (a, b)) in first.0.iter().zip(&again.0).enumerate() {
                assert_eq!(a, b, "host stack {host}: completion {i} differs");
            }
            assert_eq!(first, again, "host stack {host}");
            let other = run(8, host);
            assert_ne!(first.0, other.0, "host stack {host}: seed 8 replays seed 7");
        }
    }
}
