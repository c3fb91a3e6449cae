//! `iolab micro ctxswitch` — the cost of a context switch (seed 001, after B. Sigoure).
//!
//! Two threads, or two processes (fork + a futex word in a shared mapping), hand the CPU to
//! each other in a loop: each waits on a futex until it is its turn, then gives the turn to
//! the other and wakes it. As in the seed, the cost of a switch is the total time divided by
//! the number of context switches the kernel counted for the two participants (getrusage
//! `ru_nvcsw + ru_nivcsw`); the share of involuntary switches (preemptions, which would
//! mean something else ran in between) is printed next to each figure and should be small.
//! Each case runs unpinned, with both sides pinned to one CPU, and pinned to two CPUs; with
//! the normal policy and with SCHED_FIFO when permitted. A pipe ping-pong (1 byte each way)
//! is measured the same way. Second table: a plain system call (getppid), creating and
//! joining a thread, and the iolab-runtime task switch for scale.
//!
//! JSON fields: `"cases"`: one object per measured case (`mechanism` futex|pipe, `between`
//! thread|process, `placement` unpinned|same CPU|two CPUs, `policy` normal|FIFO,
//! `status` ok|not permitted|n/a, `ns_per_switch`, `ns_per_handoff` (wall / one-way
//! handoffs), `switches_per_handoff`, `involuntary_pct`, `round_trips`, `switches`,
//! `wall_ns`); `"syscall_ns"`, `"thread_create_join_ns"`, `"runtime_task_switch_ns"` (two
//! iolab-runtime tasks yielding in turn, ns per yield), `"runtime_channel_handoff_ns"` (two
//! tasks ping-ponging through runtime channels), `"runtime_status"` (ok with the driver, or
//! why it failed; the two figures are then null); `"tables"`, `"figures"`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use crate::osutil::{self, Usage};
use crate::table::{Cell, Figure, Num, Report, RoundedPoints, Table};

/// Fields shared by the two participants; lives in a MAP_SHARED mapping so that a forked
/// child sees the same words.
#[repr(C)]
struct Shared {
    /// Whose turn it is: 0 = ping, 1 = pong.
    turn: AtomicU32,
    /// Set by ping when the run is over.
    stop: AtomicU32,
    /// Pong's state: 0 = setting up, 1 = ready, 2 = setup refused (errno in `err`), 3 = done.
    ready: AtomicU32,
    err: AtomicU32,
    voluntary: AtomicU64,
    involuntary: AtomicU64,
}

/// An anonymous shared mapping holding one [`Shared`].
struct SharedMap {
    ptr: *mut Shared,
}

// SAFETY: the mapping is only accessed through atomics, and it stays mapped as long as the
// SharedMap lives, whichever thread holds it.
unsafe impl Send for SharedMap {}
// SAFETY: shared access only performs atomic operations on the mapping.
unsafe impl Sync for SharedMap {}

impl SharedMap {
    fn new() -> anyhow::Result<SharedMap> {
        // SAFETY: a fresh anonymous mapping; zero-filled pages are a valid `Shared` (all atomics).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                std::mem::size_of::<Shared>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap of the shared futex word");
        }
        Ok(SharedMap { ptr: p.cast() })
    }

    fn get(&self) -> &Shared {
        // SAFETY: ptr is a live mapping of size_of::<Shared>() until drop.
        unsafe { &*self.ptr }
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what new() mapped; no reference outlives self.
        unsafe { libc::munmap(self.ptr.cast(), std::mem::size_of::<Shared>()) };
    }
}

/// FUTEX_WAIT while `*word == expected`, with an optional timeout. Shared (not PRIVATE)
/// futexes, so the same code works across fork. Returns false on timeout.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> bool {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs() as _,
        tv_nsec: d.subsec_nanos() as _,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: word is a valid aligned u32 for the duration of the call; tsp is null or valid.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            tsp,
        )
    };
    !(rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT))
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: word is a valid aligned u32; FUTEX_WAKE reads nothing else.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1) };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mechanism {
    Futex,
    Pipe,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Between {
    Threads,
    Processes,
}

/// The scheduling policy of both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    Normal,
    Fifo,
}

impl Mechanism {
    fn name(self) -> &'static str {
        match self {
            Mechanism::Futex => "futex",
            Mechanism::Pipe => "pipe",
        }
    }
}

impl Between {
    fn name(self) -> &'static str {
        match self {
            Between::Threads => "thread",
            Between::Processes => "process",
        }
    }

    /// The name of a figure's series.
    fn plural(self) -> &'static str {
        match self {
            Between::Threads => "threads",
            Between::Processes => "processes",
        }
    }
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::Normal => "normal",
            Policy::Fifo => "FIFO",
        }
    }
}

/// The three serialise as their names, as the table prints them.
macro_rules! serialize_by_name {
    ($($t:ty),*) => {$(
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }
    )*};
}
serialize_by_name!(Mechanism, Between, Policy);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    Unpinned,
    SameCpu(usize),
    TwoCpus(usize, usize),
}

impl Placement {
    fn label(self) -> &'static str {
        match self {
            Placement::Unpinned => "unpinned",
            Placement::SameCpu(_) => "same CPU",
            Placement::TwoCpus(..) => "two CPUs",
        }
    }
    fn cpus(self) -> (Option<usize>, Option<usize>) {
        match self {
            Placement::Unpinned => (None, None),
            Placement::SameCpu(c) => (Some(c), Some(c)),
            Placement::TwoCpus(a, b) => (Some(a), Some(b)),
        }
    }
}

/// The pipe pair for the pipe ping-pong (fds: ping→pong, pong→ping).
#[derive(Debug, Clone, Copy)]
struct Pipes {
    to_pong: [libc::c_int; 2],
    to_ping: [libc::c_int; 2],
}

impl Pipes {
    fn new() -> anyhow::Result<Pipes> {
        let mut a = [0; 2];
        let mut b = [0; 2];
        // SAFETY: pipe2 writes two fds into each array.
        unsafe {
            iolab_sys::cvt(libc::pipe2(a.as_mut_ptr(), libc::O_CLOEXEC)).context("pipe2")?;
            if let Err(e) = iolab_sys::cvt(libc::pipe2(b.as_mut_ptr(), libc::O_CLOEXEC)) {
                libc::close(a[0]);
                libc::close(a[1]);
                return Err(e).context("pipe2");
            }
        }
        Ok(Pipes {
            to_pong: a,
            to_ping: b,
        })
    }
    fn close(self) {
        for fd in self.to_pong.iter().chain(&self.to_ping) {
            // SAFETY: closing fds this struct created, once.
            unsafe { libc::close(*fd) };
        }
    }
}

fn write_byte(fd: libc::c_int, b: u8) -> bool {
    // SAFETY: one byte from a valid stack location.
    unsafe { libc::write(fd, (&b as *const u8).cast(), 1) == 1 }
}

fn read_byte(fd: libc::c_int) -> Option<u8> {
    let mut b = 0u8;
    // SAFETY: one byte into a valid stack location.
    let n = unsafe { libc::read(fd, (&mut b as *mut u8).cast(), 1) };
    (n == 1).then_some(b)
}

/// Applies pinning and policy to the calling thread; returns the errno on refusal.
/// Fork-safe: only system calls.
fn setup(cpu: Option<usize>, fifo: bool) -> Result<(), i32> {
    if let Some(c) = cpu {
        osutil::pin_to(c).map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))?;
    }
    if fifo {
        osutil::set_fifo().map_err(|e| e.raw_os_error().unwrap_or(libc::EPERM))?;
    }
    Ok(())
}

/// The pong side: announces readiness, answers every hand-off until ping stops, and stores
/// its own switch counts in the shared words. Fork-safe: atomics and system calls only, no
/// allocation, no locks.
fn pong(sh: &Shared, mech: Mechanism, pipes: Option<Pipes>, cpu: Option<usize>, fifo: bool) {
    if let Err(errno) = setup(cpu, fifo) {
        sh.err.store(errno as u32, Ordering::SeqCst);
        sh.ready.store(2, Ordering::SeqCst);
        futex_wake(&sh.ready);
        return;
    }
    let before = osutil::thread_usage();
    sh.ready.store(1, Ordering::SeqCst);
    futex_wake(&sh.ready);
    match (mech, pipes) {
        (Mechanism::Pipe, Some(p)) => {
            while let Some(1) = read_byte(p.to_pong[0]) {
                if !write_byte(p.to_ping[1], 1) {
                    break;
                }
            }
        }
        _ => loop {
            let t = sh.turn.load(Ordering::Acquire);
            if sh.stop.load(Ordering::Acquire) != 0 {
                break;
            }
            if t != 1 {
                // A bounded wait: ping always wakes us, the timeout only guards a lost peer.
                futex_wait(&sh.turn, t, Some(Duration::from_secs(5)));
                continue;
            }
            sh.turn.store(0, Ordering::Release);
            futex_wake(&sh.turn);
        },
    }
    let used = osutil::thread_usage().since(before);
    sh.voluntary.store(used.voluntary, Ordering::SeqCst);
    sh.involuntary.store(used.involuntary, Ordering::SeqCst);
    sh.ready.store(3, Ordering::SeqCst);
    futex_wake(&sh.ready);
}

/// Result of one ping-pong run.
#[derive(Debug, Clone, Copy)]
struct Run {
    round_trips: u64,
    wall_ns: u64,
    usage: Usage,
}

#[derive(Debug)]
enum Outcome {
    Ok(Run),
    NotPermitted,
}

/// The ping side, run on its own thread: waits for pong, plays until `dur` elapsed.
fn ping(
    sh: &Shared,
    mech: Mechanism,
    pipes: Option<Pipes>,
    cpu: Option<usize>,
    fifo: bool,
    dur: Duration,
) -> anyhow::Result<Outcome> {
    let mine = setup(cpu, fifo);
    // Wait for pong's setup either way, so a refusal on our side still ends the run cleanly.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = sh.ready.load(Ordering::SeqCst);
        if r != 0 {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "peer did not start within 10 s");
        futex_wait(&sh.ready, 0, Some(Duration::from_millis(100)));
    }
    let pong_refused = sh.ready.load(Ordering::SeqCst) == 2;
    if mine.is_err() || pong_refused {
        stop_pong(sh, mech, pipes);
        let errno = mine.err().unwrap_or(sh.err.load(Ordering::SeqCst) as i32);
        if errno == libc::EPERM {
            return Ok(Outcome::NotPermitted);
        }
        anyhow::bail!(
            "setting CPU affinity/policy failed: {}",
            std::io::Error::from_raw_os_error(errno)
        );
    }
    let before = osutil::thread_usage();
    let t0 = Instant::now();
    let end = t0 + dur;
    let mut trips = 0u64;
    let stall = Duration::from_secs(5);
    loop {
        match (mech, pipes) {
            (Mechanism::Pipe, Some(p)) => {
                anyhow::ensure!(write_byte(p.to_pong[1], 1), "pipe write failed");
                anyhow::ensure!(read_byte(p.to_ping[0]) == Some(1), "pipe read failed");
            }
            _ => {
                sh.turn.store(1, Ordering::Release);
                futex_wake(&sh.turn);
                let waited = Instant::now();
                while sh.turn.load(Ordering::Acquire) != 0 {
                    futex_wait(&sh.turn, 1, Some(stall));
                    if waited.elapsed() >= stall {
                        stop_pong(sh, mech, pipes);
                        anyhow::bail!("peer stopped answering for 5 s");
                    }
                }
            }
        }
        trips += 1;
        if trips % 64 == 0 && Instant::now() >= end {
            break;
        }
    }
    let wall_ns = t0.elapsed().as_nanos() as u64;
    let mine = osutil::thread_usage().since(before);
    stop_pong(sh, mech, pipes);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sh.ready.load(Ordering::SeqCst) != 3 {
        anyhow::ensure!(Instant::now() < deadline, "peer did not report within 10 s");
        futex_wait(&sh.ready, 1, Some(Duration::from_millis(100)));
    }
    let theirs = Usage {
        voluntary: sh.voluntary.load(Ordering::SeqCst),
        involuntary: sh.involuntary.load(Ordering::SeqCst),
        cpu_ns: 0,
    };
    Ok(Outcome::Ok(Run {
        round_trips: trips,
        wall_ns,
        usage: mine.plus(theirs),
    }))
}

fn stop_pong(sh: &Shared, mech: Mechanism, pipes: Option<Pipes>) {
    sh.stop.store(1, Ordering::SeqCst);
    sh.turn.store(1, Ordering::SeqCst);
    futex_wake(&sh.turn);
    if let (Mechanism::Pipe, Some(p)) = (mech, pipes) {
        write_byte(p.to_pong[1], 0);
    }
}

/// Runs one case and returns its outcome.
fn measure(
    mech: Mechanism,
    between: Between,
    place: Placement,
    fifo: bool,
    dur: Duration,
) -> anyhow::Result<Outcome> {
    let map = SharedMap::new()?;
    let pipes = match mech {
        Mechanism::Pipe => Some(Pipes::new()?),
        Mechanism::Futex => None,
    };
    let (cpu_ping, cpu_pong) = place.cpus();
    let result = std::thread::scope(|s| -> anyhow::Result<Outcome> {
        match between {
            Between::Threads => {
                let sh = map.get();
                let pong_t = s.spawn(move || pong(sh, mech, pipes, cpu_pong, fifo));
                let ping_t = s.spawn(move || ping(sh, mech, pipes, cpu_ping, fifo, dur));
                let r = ping_t
                    .join()
                    .map_err(|_| anyhow::anyhow!("ping thread panicked"))?;
                pong_t
                    .join()
                    .map_err(|_| anyhow::anyhow!("pong thread panicked"))?;
                r
            }
            Between::Processes => {
                // SAFETY: the child runs only `pong` (atomics and raw system calls: fork-safe
                // in a multithreaded parent) and leaves with _exit, never returning into Rust.
                let pid = unsafe { libc::fork() };
                if pid < 0 {
                    return Err(std::io::Error::last_os_error()).context("fork");
                }
                if pid == 0 {
                    pong(map.get(), mech, pipes, cpu_pong, fifo);
                    // SAFETY: terminate the child without running the parent's destructors.
                    unsafe { libc::_exit(0) };
                }
                let sh = map.get();
                let r = s
                    .spawn(move || ping(sh, mech, pipes, cpu_ping, fifo, dur))
                    .join();
                if !matches!(r, Ok(Ok(_))) {
                    // SAFETY: pid is our own child; killing it ends a peer that may be stuck.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                let mut status = 0;
                // SAFETY: reaps our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                r.map_err(|_| anyhow::anyhow!("ping thread panicked"))?
            }
        }
    });
    if let Some(p) = pipes {
        p.close();
    }
    result
}

/// One measured case: a row of `"cases"`.
#[derive(Debug, Clone, Serialize)]
struct Case {
    mechanism: Mechanism,
    between: Between,
    placement: &'static str,
    policy: Policy,
    /// ok, not permitted, or n/a: why.
    status: String,
    ns_per_switch: Option<Num>,
    /// Wall time / one-way hand-offs.
    ns_per_handoff: Option<Num>,
    switches_per_handoff: Option<Num>,
    involuntary_pct: Option<Num>,
    round_trips: Option<u64>,
    switches: Option<u64>,
    involuntary: Option<u64>,
    wall_ns: Option<u64>,
}

impl Case {
    fn new(
        mechanism: Mechanism,
        between: Between,
        placement: &'static str,
        policy: Policy,
        status: &str,
        run: Option<Run>,
    ) -> Case {
        let per_handoff = |x: u64, r: Run| Num(x as f64 / (2 * r.round_trips.max(1)) as f64);
        Case {
            mechanism,
            between,
            placement,
            policy,
            status: status.to_string(),
            ns_per_switch: run.and_then(|r| {
                let switches = r.usage.switches();
                (switches > 0).then(|| Num(r.wall_ns as f64 / switches as f64))
            }),
            ns_per_handoff: run.map(|r| per_handoff(r.wall_ns, r)),
            switches_per_handoff: run.map(|r| per_handoff(r.usage.switches(), r)),
            involuntary_pct: run.map(|r| {
                Num(crate::stats::share_pct(
                    r.usage.involuntary,
                    r.usage.switches(),
                ))
            }),
            round_trips: run.map(|r| r.round_trips),
            switches: run.map(|r| r.usage.switches()),
            involuntary: run.map(|r| r.usage.involuntary),
            wall_ns: run.map(|r| r.wall_ns),
        }
    }

    /// The table's figure: ns per switch, or why there is none.
    fn cell(&self) -> Cell {
        match self.ns_per_switch {
            Some(ns) => ns.into(),
            None => self.status.as_str().into(),
        }
    }
}

/// ns per call of a plain system call (getppid through `syscall(2)`, so libc cannot cache it).
fn syscall_ns(n: u64) -> f64 {
    let t0 = Instant::now();
    for _ in 0..n {
        // SAFETY: getppid takes no arguments and cannot fail.
        std::hint::black_box(unsafe { libc::syscall(libc::SYS_getppid) });
    }
    t0.elapsed().as_nanos() as f64 / n as f64
}

/// ns per `std::thread::spawn` + `join` of an empty thread.
fn thread_create_join_ns(n: u64) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    for _ in 0..n {
        std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(|| std::hint::black_box(0))
            .context("spawning a thread")?
            .join()
            .map_err(|_| anyhow::anyhow!("empty thread panicked"))?;
    }
    Ok(t0.elapsed().as_nanos() as f64 / n as f64)
}

/// The iolab-runtime task switch, for scale: on one loop, two tasks that `yield_now` in turn
/// (ns per yield = one task switch), and two tasks that ping-pong a value through two
/// capacity-1 `iolab_runtime::sync::mpsc` channels (ns per hand-off). Returns
/// (ns per yield, ns per channel hand-off, driver name).
fn runtime_task_switch(quick: bool) -> anyhow::Result<(f64, f64, String)> {
    use iolab_runtime::sync::mpsc;
    use iolab_runtime::{spawn, yield_now, Runtime};
    let n: u64 = if quick { 100_000 } else { 1_000_000 };
    let rt = Runtime::new().context("starting an iolab-runtime loop")?;
    let driver = format!("{:?}", rt.driver());
    let (yield_ns, chan_ns) = rt.block_on(async move {
        let t0 = Instant::now();
        let a = spawn(async move {
            for _ in 0..n {
                yield_now().await;
            }
        });
        let b = spawn(async move {
            for _ in 0..n {
                yield_now().await;
            }
        });
        a.await.map_err(|e| anyhow::anyhow!("yield task: {e:?}"))?;
        b.await.map_err(|e| anyhow::anyhow!("yield task: {e:?}"))?;
        let yield_ns = t0.elapsed().as_nanos() as f64 / (2 * n) as f64;

        let (tx1, mut rx1) = mpsc::channel::<u64>(1);
        let (tx2, mut rx2) = mpsc::channel::<u64>(1);
        let t0 = Instant::now();
        let ping = spawn(async move {
            for i in 0..n {
                if tx1.send(i).await.is_err() || rx2.recv().await != Some(i) {
                    return false;
                }
            }
            true
        });
        let pong = spawn(async move {
            while let Some(v) = rx1.recv().await {
                if tx2.send(v).await.is_err() {
                    break;
                }
            }
        });
        let ok = ping
            .await
            .map_err(|e| anyhow::anyhow!("ping task: {e:?}"))?;
        pong.await
            .map_err(|e| anyhow::anyhow!("pong task: {e:?}"))?;
        anyhow::ensure!(ok, "channel ping-pong lost a value");
        let chan_ns = t0.elapsed().as_nanos() as f64 / (2 * n) as f64;
        Ok::<_, anyhow::Error>((yield_ns, chan_ns))
    })?;
    Ok((yield_ns, chan_ns, driver))
}

/// The JSON fields of `iolab micro ctxswitch` (besides machine, tables and figures).
#[derive(Debug, Clone, Serialize)]
pub struct Fields {
    cpus: Vec<usize>,
    run_ms: u64,
    cases: Vec<Case>,
    syscall_ns: Num,
    thread_create_join_ns: Num,
    runtime_task_switch_ns: Option<Num>,
    runtime_channel_handoff_ns: Option<Num>,
    runtime_status: String,
}

/// Every (mechanism, between, placement, policy) case, in the order of the table's rows
/// (normal then FIFO for each placement).
/// `dur` per case under the normal policy, `fifo_dur` under SCHED_FIFO.
fn measure_cases(cpus: &[usize], dur: Duration, fifo_dur: Duration) -> anyhow::Result<Vec<Case>> {
    let placements: Vec<(&'static str, Option<Placement>)> = vec![
        ("unpinned", Some(Placement::Unpinned)),
        ("same CPU", Some(Placement::SameCpu(cpus[0]))),
        (
            "two CPUs",
            cpus.get(1).map(|&c| Placement::TwoCpus(cpus[0], c)),
        ),
    ];
    let mut cases = Vec::new();
    for mech in [Mechanism::Futex, Mechanism::Pipe] {
        for between in [Between::Threads, Between::Processes] {
            for &(label, place) in &placements {
                for policy in [Policy::Normal, Policy::Fifo] {
                    let fifo = policy == Policy::Fifo;
                    let (status, run) = match place {
                        None => ("n/a: only one CPU allowed", None),
                        Some(p) => {
                            debug_assert_eq!(p.label(), label);
                            let d = if fifo { fifo_dur } else { dur };
                            match measure(mech, between, p, fifo, d)? {
                                Outcome::Ok(r) => ("ok", Some(r)),
                                Outcome::NotPermitted => ("not permitted", None),
                            }
                        }
                    };
                    cases.push(Case::new(mech, between, label, policy, status, run));
                }
            }
        }
    }
    Ok(cases)
}

/// The full breakdown: one row per (mechanism, between, placement), normal and FIFO side by side.
fn cases_table(cases: &[Case], cpus: &[usize], machine: &crate::machine::Machine) -> Table {
    let mut table = Table::new(
        "Context switch: ns per switch (wall time / switches counted by the kernel for both sides)",
        &[
            "mechanism",
            "between",
            "placement",
            "normal ns",
            "FIFO ns",
            "invol. % normal",
            "invol. % FIFO",
            "switches/handoff",
        ],
    );
    for pair in cases.chunks(2) {
        let (n, f) = (&pair[0], &pair[1]);
        table.row(vec![
            n.mechanism.name().into(),
            n.between.name().into(),
            n.placement.into(),
            n.cell(),
            f.cell(),
            n.involuntary_pct.into(),
            f.involuntary_pct.into(),
            n.switches_per_handoff.into(),
        ]);
    }
    table.with_note(format!(
        "Method of seed 001: two {{threads|processes}} hand the CPU to each other through a futex word (or a pipe); \
         ns/switch = total time / (voluntary + involuntary switches from getrusage of both sides). \
         'invol. %' is the share of involuntary switches (preemptions). On one CPU the woken side usually preempts the waker before it reaches its own wait \
         (wake-up preemption): the kernel counts that switch as involuntary although it is still a switch between the two participants; \
         preemption by other tasks shows where the FIFO and two-CPU rows have involuntary switches. \
         switches/handoff near 1 means every hand-off put one side to sleep; on two CPUs each side also switches to idle. \
         FIFO = SCHED_FIFO priority 1 on both sides (bypasses the CFS pick). CPUs used: {cpus:?}. {}",
        machine.summary()
    ))
}

/// The seed's own layout (its slide "nos mesures"): futex, pinned = both on one CPU.
fn seed_table(cases: &[Case], machine: &crate::machine::Machine) -> Table {
    let find = |between: Between, place: &str, policy: Policy| -> Cell {
        cases
            .iter()
            .find(|c| {
                c.mechanism == Mechanism::Futex
                    && c.between == between
                    && c.placement == place
                    && c.policy == policy
            })
            .map_or(Cell::Empty, Case::cell)
    };
    let mut seed = Table::new(
        "Context switch, seed 001 layout (futex ping-pong, ns per switch)",
        &[
            "platform",
            "process switch + CPU pinning",
            "thread switch + CPU pinning",
            "thread switch SCHED_FIFO + CPU pinning",
            "process switch",
            "thread switch",
        ],
    );
    seed.row(vec![
        format!("{} CPUs, kernel {}", machine.cpus, machine.kernel).into(),
        find(Between::Processes, "same CPU", Policy::Normal),
        find(Between::Threads, "same CPU", Policy::Normal),
        find(Between::Threads, "same CPU", Policy::Fifo),
        find(Between::Processes, "unpinned", Policy::Normal),
        find(Between::Threads, "unpinned", Policy::Normal),
    ]);
    seed.with_note(
        "The seed measured (2016, kernel 4.4): ~620-990 ns pinned, ~280-350 ns with SCHED_FIFO, 680-11,000 ns unpinned; \
         'CPU pinning' = both sides on one CPU. Full breakdown in the next table.",
    )
}

fn related_table(f: &Fields) -> Table {
    let rt_status = &f.runtime_status;
    let mut other = Table::new("Related costs", &["operation", "ns", "note"]);
    other.row(vec![
        "plain system call (getppid)".into(),
        f.syscall_ns.into(),
        "syscall(SYS_getppid), mean over the loop".into(),
    ]);
    other.row(vec![
        "thread create + join".into(),
        f.thread_create_join_ns.into(),
        "std::thread::Builder (64 KiB stack) spawn + join".into(),
    ]);
    other.row(vec![
        "iolab-runtime task switch (two tasks, yield_now)".into(),
        f.runtime_task_switch_ns.into(),
        format!(
            "ns per yield on one loop: a switch between tasks, no kernel involved; {rt_status}"
        )
        .into(),
    ]);
    other.row(vec![
        "iolab-runtime channel hand-off (two tasks)".into(),
        f.runtime_channel_handoff_ns.into(),
        format!("ping-pong through two capacity-1 iolab_runtime::sync::mpsc channels, ns per hand-off; {rt_status}").into(),
    ]);
    other
}

fn placement_figure(cases: &[Case]) -> Figure {
    let mut fig = Figure::new(
        "Context switch cost by placement (futex ping-pong, normal policy)",
        "placement (0 = unpinned, 1 = same CPU, 2 = two CPUs)",
        "ns per switch",
    );
    for c in cases
        .iter()
        .filter(|c| c.mechanism == Mechanism::Futex && c.policy == Policy::Normal)
    {
        let x = match c.placement {
            "unpinned" => 0.0,
            "same CPU" => 1.0,
            _ => 2.0,
        };
        if let Some(ns) = c.ns_per_switch {
            fig.point_rounded(c.between.plural(), x, ns.0);
        }
    }
    fig
}

pub fn run(opts: &crate::Opts) -> anyhow::Result<Report<Fields>> {
    let machine = crate::machine::Machine::collect();
    let dur = Duration::from_millis(if opts.quick { 200 } else { 1500 });
    let fifo_dur = Duration::from_millis(if opts.quick { 150 } else { 750 });
    let cpus = osutil::allowed_cpus();
    let cases = measure_cases(&cpus, dur, fifo_dur)?;
    let sys_ns = syscall_ns(if opts.quick { 200_000 } else { 2_000_000 });
    let thread_ns = thread_create_join_ns(if opts.quick { 300 } else { 3000 })?;
    let (rt_ns, rt_chan_ns, rt_status) = match runtime_task_switch(opts.quick) {
        Ok((y, c, d)) => (Some(Num(y)), Some(Num(c)), format!("ok ({d} driver)")),
        Err(e) => (None, None, format!("failed: {e:#}")),
    };
    let table = cases_table(&cases, &cpus, &machine);
    let seed = seed_table(&cases, &machine);
    let figure = placement_figure(&cases);
    let fields = Fields {
        run_ms: dur.as_millis() as u64,
        cpus,
        cases,
        syscall_ns: Num(sys_ns),
        thread_create_join_ns: Num(thread_ns),
        runtime_task_switch_ns: rt_ns,
        runtime_channel_handoff_ns: rt_chan_ns,
        runtime_status: rt_status,
    };
    let other = related_table(&fields);
    seed.print();
    table.print();
    other.print();
    Ok(Report {
        machine,
        fields,
        tables: vec![seed, table, other],
        figures: vec![figure],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_without_a_run_keeps_every_key() {
        let c = Case::new(
            Mechanism::Pipe,
            Between::Processes,
            "same CPU",
            Policy::Fifo,
            "not permitted",
            None,
        );
        let v = serde_json::to_value(&c).unwrap();
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 13, "{v}");
        assert_eq!(
            (&v["mechanism"], &v["between"], &v["policy"]),
            (&"pipe".into(), &"process".into(), &"FIFO".into())
        );
        assert!(o
            .iter()
            .filter(
                |(k, _)| !["mechanism", "between", "placement", "policy", "status"]
                    .contains(&k.as_str())
            )
            .all(|(_, x)| x.is_null()));
        assert_eq!(c.cell(), Cell::Text("not permitted".into()));
        let run = Run {
            round_trips: 100,
            wall_ns: 40_000,
            usage: Usage {
                voluntary: 150,
                involuntary: 50,
                cpu_ns: 0,
            },
        };
        let c = Case::new(
            Mechanism::Futex,
            Between::Threads,
            "unpinned",
            Policy::Normal,
            "ok",
            Some(run),
        );
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["ns_per_switch"], 200.0);
        assert_eq!(v["ns_per_handoff"], 200.0);
        assert_eq!(v["switches_per_handoff"], 1.0);
        assert_eq!(v["involuntary_pct"], 25.0);
        assert_eq!(
            (&v["switches"], &v["involuntary"]),
            (&200.into(), &50.into())
        );
        assert_eq!(c.cell(), Cell::Num(200.0));
    }
}
