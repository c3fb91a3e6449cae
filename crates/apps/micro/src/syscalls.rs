//! `iolab micro syscalls` — which I/O call, and how it is issued (seed 000, annex E.2).
//!
//! One thread owns both ends of a loopback TCP pair and keeps a fixed number of messages in
//! flight (the "concurrency level" of the seed's program): W reads are outstanding on the
//! receiving end, and each completed read issues one write of the same size on the sending
//! end and one new read. An operation is one read or one write; the result is operations per
//! second and the ratio to the baseline (blocking read/write, W writes then W reads).
//!
//! Variants: read/write and recv/send system calls; io_uring with IORING_OP_READ/WRITE
//! ("plain"), IORING_OP_RECV/SEND, registered files (IOSQE_FIXED_FILE), registered buffers
//! (READ_FIXED/WRITE_FIXED), IOSQE_CQE_SKIP_SUCCESS on the writes (their result is not
//! needed unless they fail), all three combined, and "try the system call first"
//! (recv/send with MSG_DONTWAIT, submitting to the ring only on EAGAIN — the Linux analogue
//! of FILE_SKIP_COMPLETION_PORT_ON_SUCCESS).
//!
//! JSON fields: `"message_bytes"`, `"windows"` (ops in flight), `"run_ms"` and `"rounds"`
//! (each point is the best of `rounds` interleaved runs of `run_ms`), `"points"`:
//! `[{variant, window, ops, ops_per_s, wall_ops_per_s, ratio, ring_submissions, status}]`
//! (`ops_per_s` = operations per second of the thread's CPU time, user + system, so that
//! waiting for a CPU on a shared machine does not count; `wall_ops_per_s` per wall second;
//! `ratio` = ops/s over the baseline at the same window; `ring_submissions` = SQEs that went through the
//! ring, showing what "try first" saved), `"tables"`, `"figures"`.

use std::collections::VecDeque;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use io_uring::{opcode, squeue, types, IoUring};
use serde::Serialize;

use crate::table::{Cell, Figure, Num, Report, RoundedPoints, Table};

const MSG: usize = 256;

/// A connected loopback TCP pair: `tx` writes, `rx` reads.
pub struct Pair {
    pub tx: TcpStream,
    pub rx: TcpStream,
}

impl Pair {
    pub fn new() -> anyhow::Result<Pair> {
        let l = TcpListener::bind("127.0.0.1:0").context("binding a loopback listener")?;
        let tx = TcpStream::connect(l.local_addr()?).context("connecting over loopback")?;
        let (rx, _) = l.accept().context("accepting the loopback connection")?;
        tx.set_nodelay(true)?;
        rx.set_nodelay(true)?;
        Ok(Pair { tx, rx })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sync {
    ReadWrite,
    RecvSend,
}

/// Blocking system calls: W writes, then reads until the W messages are back.
fn run_sync(kind: Sync, window: usize, budget: Duration) -> anyhow::Result<u64> {
    let p = Pair::new()?;
    let (a, b) = (p.tx.as_raw_fd(), p.rx.as_raw_fd());
    let wbuf = [0x5au8; MSG];
    let mut rbuf = [0u8; MSG];
    let t0 = Instant::now();
    let mut ops = 0u64;
    while t0.elapsed() < budget {
        for _ in 0..window {
            let mut off = 0;
            while off < MSG {
                // SAFETY: the pointer and length stay within wbuf.
                let n = unsafe {
                    match kind {
                        Sync::ReadWrite => libc::write(a, wbuf[off..].as_ptr().cast(), MSG - off),
                        Sync::RecvSend => libc::send(a, wbuf[off..].as_ptr().cast(), MSG - off, 0),
                    }
                };
                off += iolab_sys::cvt(n).context("write")? as usize;
                ops += 1;
            }
        }
        let mut want = window * MSG;
        while want > 0 {
            let len = want.min(MSG);
            // SAFETY: the pointer and length stay within rbuf.
            let n = unsafe {
                match kind {
                    Sync::ReadWrite => libc::read(b, rbuf.as_mut_ptr().cast(), len),
                    Sync::RecvSend => libc::recv(b, rbuf.as_mut_ptr().cast(), len, 0),
                }
            };
            let n = iolab_sys::cvt(n).context("read")? as usize;
            anyhow::ensure!(n > 0, "unexpected EOF on the loopback pair");
            want -= n;
            ops += 1;
        }
    }
    Ok(ops)
}

/// How the io_uring variant issues its operations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct RingCfg {
    recv_send: bool,
    fixed_files: bool,
    fixed_bufs: bool,
    skip_success: bool,
    try_first: bool,
}

const READ: u64 = 1;
const WRITE: u64 = 0;
/// Result recorded for a write whose success completion is skipped.
const SKIPPED: i32 = i32::MIN;

struct RingRun {
    ring: IoUring,
    cfg: RingCfg,
    a: RawFd,
    b: RawFd,
    rbufs: Vec<u8>,
    wbufs: Vec<u8>,
    /// Completions obtained without the ring (try-first successes): (kind, slot, result).
    local: VecDeque<(u64, usize, i32)>,
    submissions: u64,
    in_ring: usize,
}

impl RingRun {
    fn new(cfg: RingCfg, window: usize, p: &Pair) -> anyhow::Result<RingRun> {
        let entries = (2 * window + 8).next_power_of_two() as u32;
        let ring = IoUring::builder()
            .build(entries)
            .context("creating an io_uring (is io_uring disabled? see kernel.io_uring_disabled)")?;
        let mut r = RingRun {
            ring,
            cfg,
            a: p.tx.as_raw_fd(),
            b: p.rx.as_raw_fd(),
            rbufs: vec![0u8; window * MSG],
            wbufs: vec![0x5au8; window * MSG],
            local: VecDeque::new(),
            submissions: 0,
            in_ring: 0,
        };
        if cfg.fixed_files {
            r.ring
                .submitter()
                .register_files(&[r.a, r.b])
                .context("IORING_REGISTER_FILES")?;
        }
        if cfg.fixed_bufs {
            let iov = [
                libc::iovec {
                    iov_base: r.rbufs.as_mut_ptr().cast(),
                    iov_len: r.rbufs.len(),
                },
                libc::iovec {
                    iov_base: r.wbufs.as_mut_ptr().cast(),
                    iov_len: r.wbufs.len(),
                },
            ];
            // SAFETY: both buffers are owned by `r` and are neither moved nor freed before the
            // ring (dropped first, as the first field) unregisters them.
            unsafe { r.ring.submitter().register_buffers(&iov) }
                .context("IORING_REGISTER_BUFFERS")?;
        }
        Ok(r)
    }

    /// Issues one operation: tried directly first in try-first mode, else queued as an SQE.
    fn issue(&mut self, kind: u64, slot: usize) -> anyhow::Result<()> {
        let off = slot * MSG;
        if self.cfg.try_first {
            // SAFETY: pointer and length stay within the slot's buffer.
            let n = unsafe {
                if kind == READ {
                    libc::recv(
                        self.b,
                        self.rbufs[off..].as_mut_ptr().cast(),
                        MSG,
                        libc::MSG_DONTWAIT,
                    )
                } else {
                    libc::send(
                        self.a,
                        self.wbufs[off..].as_ptr().cast(),
                        MSG,
                        libc::MSG_DONTWAIT,
                    )
                }
            };
            if n >= 0 {
                self.local.push_back((kind, slot, n as i32));
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EAGAIN) {
                return Err(e).context("direct recv/send");
            }
        }
        let c = self.cfg;
        let fd = if kind == READ { self.b } else { self.a };
        let fixed_idx = if kind == READ { 1 } else { 0 };
        let rptr = self.rbufs[off..].as_mut_ptr();
        let wptr = self.wbufs[off..].as_ptr();
        macro_rules! target {
            ($op:ident, $($arg:expr),*) => {
                if c.fixed_files {
                    opcode::$op::new(types::Fixed(fixed_idx), $($arg),*).build()
                } else {
                    opcode::$op::new(types::Fd(fd), $($arg),*).build()
                }
            };
        }
        let mut e = match (kind == READ, c.fixed_bufs, c.recv_send || c.try_first) {
            (true, true, _) => target!(ReadFixed, rptr, MSG as u32, 0),
            (false, true, _) => target!(WriteFixed, wptr, MSG as u32, 1),
            (true, false, true) => target!(Recv, rptr, MSG as u32),
            (false, false, true) => target!(Send, wptr, MSG as u32),
            (true, false, false) => target!(Read, rptr, MSG as u32),
            (false, false, false) => target!(Write, wptr, MSG as u32),
        };
        e = e.user_data((slot as u64) << 1 | kind);
        if kind == WRITE && c.skip_success {
            e = e.flags(squeue::Flags::SKIP_SUCCESS);
            // Counted as completed now: a CQE appears only if it fails.
            self.local.push_back((WRITE, slot, SKIPPED));
        } else {
            self.in_ring += 1;
        }
        // SAFETY: the buffers live in `self` (not moved while the ring is alive); the fds
        // belong to the Pair, which outlives this run.
        if unsafe { self.ring.submission().push(&e) }.is_err() {
            self.ring.submit().context("io_uring_enter (flush)")?;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(&e) }
                .map_err(|_| anyhow::anyhow!("submission queue full"))?;
        }
        self.submissions += 1;
        Ok(())
    }

    /// Runs for `budget` with `window` messages in flight; returns completed operations.
    fn run(&mut self, window: usize, budget: Duration) -> anyhow::Result<u64> {
        for slot in 0..window {
            self.issue(WRITE, slot)?;
            self.issue(READ, slot)?;
        }
        let t0 = Instant::now();
        let mut ops = 0u64;
        let mut written = 0u64;
        let mut read = 0u64;
        let mut stopping = false;
        let mut last_progress = Instant::now();
        loop {
            if !stopping && t0.elapsed() >= budget {
                stopping = true;
            }
            if stopping && read >= written {
                break;
            }
            if self.local.is_empty() {
                let ts = types::Timespec::new().sec(1);
                let args = types::SubmitArgs::new().timespec(&ts);
                match self.ring.submitter().submit_with_args(1, &args) {
                    Ok(_) => {}
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::ETIME)) => {}
                    Err(e) => return Err(e).context("io_uring_enter"),
                }
                let mut cq = self.ring.completion();
                for cqe in &mut cq {
                    last_progress = Instant::now();
                    let ud = cqe.user_data();
                    self.local
                        .push_back((ud & 1, (ud >> 1) as usize, cqe.result()));
                    self.in_ring -= usize::from(!(ud & 1 == WRITE && self.cfg.skip_success));
                }
            }
            while let Some((kind, slot, res)) = self.local.pop_front() {
                ops += 1;
                if ops % 64 == 0 {
                    // Try-first can keep completing at once without ever emptying `local`.
                    last_progress = Instant::now();
                    stopping |= t0.elapsed() >= budget;
                }
                if kind == WRITE {
                    if res == SKIPPED {
                        written += MSG as u64;
                        continue;
                    }
                    anyhow::ensure!(
                        res >= 0,
                        "write failed: {}",
                        io::Error::from_raw_os_error(-res)
                    );
                    written += res as u64;
                    continue;
                }
                anyhow::ensure!(
                    res >= 0,
                    "read failed: {}",
                    io::Error::from_raw_os_error(-res)
                );
                anyhow::ensure!(res > 0, "unexpected EOF on the loopback pair");
                read += res as u64;
                if !stopping {
                    self.issue(WRITE, slot)?;
                }
                if !stopping || read < written {
                    self.issue(READ, slot)?;
                }
            }
            anyhow::ensure!(
                last_progress.elapsed() < Duration::from_secs(5),
                "no progress for 5 s"
            );
        }
        Ok(ops)
    }

    /// Ends the run: EOF on the sending end completes the reads still posted, and waiting for
    /// them ensures the kernel no longer references our buffers when they are freed.
    fn finish(&mut self, p: &Pair) {
        let _ = p.tx.shutdown(std::net::Shutdown::Write);
        tracing::debug!("finish: {} in ring", self.in_ring);
        let t0 = Instant::now();
        while self.in_ring > 0 && t0.elapsed() < Duration::from_secs(2) {
            let _ = self.ring.submit_and_wait(1);
            let skip = self.cfg.skip_success;
            let n = self
                .ring
                .completion()
                .filter(|c| !(c.user_data() & 1 == WRITE && skip))
                .count();
            self.in_ring = self.in_ring.saturating_sub(n);
        }
    }
}

fn run_ring(cfg: RingCfg, window: usize, budget: Duration) -> anyhow::Result<(u64, u64)> {
    let p = Pair::new()?;
    let mut r = RingRun::new(cfg, window, &p)?;
    let ops = r.run(window, budget);
    r.finish(&p);
    Ok((ops?, r.submissions))
}

/// (operations, ring submissions, operations per CPU-second, per wall second), or why the
/// point failed.
type PointResult = Result<(u64, u64, f64, f64), String>;

#[derive(Debug, Clone, Copy)]
enum Variant {
    Sync(Sync),
    Ring(RingCfg),
}

fn variants() -> Vec<(&'static str, Variant)> {
    let d = RingCfg::default();
    vec![
        ("read/write (baseline)", Variant::Sync(Sync::ReadWrite)),
        ("recv/send", Variant::Sync(Sync::RecvSend)),
        ("io_uring READ/WRITE", Variant::Ring(d)),
        (
            "io_uring RECV/SEND",
            Variant::Ring(RingCfg {
                recv_send: true,
                ..d
            }),
        ),
        (
            "io_uring + registered files",
            Variant::Ring(RingCfg {
                fixed_files: true,
                ..d
            }),
        ),
        (
            "io_uring + registered buffers (READ/WRITE_FIXED)",
            Variant::Ring(RingCfg {
                fixed_bufs: true,
                ..d
            }),
        ),
        (
            "io_uring + CQE_SKIP_SUCCESS on writes",
            Variant::Ring(RingCfg {
                skip_success: true,
                ..d
            }),
        ),
        (
            "io_uring + files + buffers + skip",
            Variant::Ring(RingCfg {
                fixed_files: true,
                fixed_bufs: true,
                skip_success: true,
                ..d
            }),
        ),
        (
            "try syscall first, ring on EAGAIN",
            Variant::Ring(RingCfg {
                try_first: true,
                ..d
            }),
        ),
    ]
}

/// One (variant, window) point: a row of `"points"`.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    variant: &'static str,
    /// Operations in flight.
    window: usize,
    ops: u64,
    /// Operations per CPU-second of the thread.
    ops_per_s: Option<Num>,
    wall_ops_per_s: Option<Num>,
    /// ops_per_s / the read/write baseline's at the same window.
    ratio: Option<Num>,
    ring_submissions: u64,
    /// ok, or why the point failed.
    status: String,
}

impl Point {
    fn new(variant: &'static str, window: usize, r: &PointResult, baseline: f64) -> Point {
        match r {
            Ok((ops, subs, rate, wall_rate)) => Point {
                variant,
                window,
                ops: *ops,
                ops_per_s: Some(Num(*rate)),
                wall_ops_per_s: Some(Num(*wall_rate)),
                ratio: Some(Num(rate / baseline)),
                ring_submissions: *subs,
                status: "ok".into(),
            },
            Err(e) => Point {
                variant,
                window,
                ops: 0,
                ops_per_s: None,
                wall_ops_per_s: None,
                ratio: None,
                ring_submissions: 0,
                status: e.clone(),
            },
        }
    }

    /// The table's two cells: ops/s and ratio, or why there are none.
    fn cells(&self) -> [Cell; 2] {
        match (self.ops_per_s, self.ratio) {
            (Some(rate), Some(ratio)) => [rate.into(), ratio.into()],
            _ => [format!("failed: {}", self.status).into(), Cell::Empty],
        }
    }
}

/// The JSON fields of `iolab micro syscalls` (besides machine, tables and figures).
#[derive(Debug, Clone, Serialize)]
pub struct Fields {
    message_bytes: usize,
    windows: Vec<usize>,
    run_ms: u64,
    rounds: usize,
    points: Vec<Point>,
}

pub fn run(opts: &crate::Opts) -> anyhow::Result<Report<Fields>> {
    let machine = crate::machine::Machine::collect();
    let (budget, windows, rounds): (Duration, Vec<usize>, usize) = if opts.quick {
        (Duration::from_millis(120), vec![1, 16], 3)
    } else {
        (Duration::from_millis(400), vec![1, 4, 16, 64], 5)
    };
    let vs = variants();
    let mut points = Vec::new();
    let mut fig = Figure::new(
        "I/O call variants on a loopback TCP pair (seed 000 Figure 6)",
        "operations in flight",
        "operations per CPU-second",
    );
    fig.log_x = true;
    let mut cols: Vec<String> = vec!["variant".into()];
    for w in &windows {
        cols.push(format!("ops/s, {w} in flight"));
        cols.push(format!("ratio, {w}"));
    }
    let col_refs: Vec<&str> = cols.iter().map(String::as_str).collect();
    let mut table = Table::new(
        format!("System call paths: {MSG}-byte messages, operations per CPU-second of the thread"),
        &col_refs,
    );
    // Rounds interleave the variants so that each sees the same background load; a point
    // keeps its best round (the shared machine only ever slows a run down).
    let mut best: Vec<Vec<PointResult>> =
        vec![vec![Err("not run".into()); windows.len()]; vs.len()];
    for _round in 0..rounds {
        for (vi, (name, v)) in vs.iter().enumerate() {
            for (wi, &w) in windows.iter().enumerate() {
                let t0 = Instant::now();
                let c0 = crate::osutil::thread_cpu_ns();
                let r = match v {
                    Variant::Sync(k) => run_sync(*k, w, budget).map(|o| (o, 0)),
                    Variant::Ring(c) => run_ring(*c, w, budget),
                };
                let secs = t0.elapsed().as_secs_f64();
                let cpu_secs = (crate::osutil::thread_cpu_ns() - c0).max(1) as f64 / 1e9;
                tracing::debug!("syscalls: {name} window {w}: {r:?} in {secs:.3} s");
                let slot = &mut best[vi][wi];
                match r {
                    Ok((ops, subs)) => {
                        let rate = ops as f64 / cpu_secs;
                        if !matches!(slot, Ok((_, _, b, _)) if *b >= rate) {
                            *slot = Ok((ops, subs, rate, ops as f64 / secs));
                        }
                    }
                    Err(e) => {
                        if slot.is_err() {
                            *slot = Err(format!("{e:#}"));
                        }
                    }
                }
            }
        }
    }
    let baseline: Vec<f64> = best[0]
        .iter()
        .map(|r| r.as_ref().map_or(f64::NAN, |r| r.2))
        .collect();
    for ((name, _), results) in vs.iter().zip(&best) {
        let mut row = vec![Cell::from(*name)];
        for ((&w, r), &base) in windows.iter().zip(results).zip(&baseline) {
            if let Ok((_, _, rate, _)) = r {
                fig.point_rounded(name, w as f64, *rate);
            }
            let point = Point::new(name, w, r, base);
            row.extend(point.cells());
            points.push(point);
        }
        table.row(row);
    }
    let table = table.with_note(format!(
        "ops/s = operations per second of the thread's CPU time (user + system, which includes the loopback TCP work done in the system calls), \
         so that waiting for a CPU on the shared machine does not count; wall-clock rates are in points[].wall_ops_per_s. \
         One thread drives both ends of a loopback TCP pair; an operation is one read or one write; each point is the best of {rounds} interleaved rounds of {} ms. \
         Sync variants write W messages then read them back; ring variants keep W reads posted and write one message per completed read. \
         ratio = ops/s / (read/write ops/s at the same window). Registered files skip the fd lookup/refcount per op; registered buffers skip \
         pinning the user pages; CQE_SKIP_SUCCESS drops the write completions; 'try first' does the I/O in the calling thread when it can \
         complete at once and pays the ring only on EAGAIN (points[].ring_submissions shows how often).",
        budget.as_millis()
    ));
    table.print();
    Ok(Report {
        machine,
        fields: Fields {
            message_bytes: MSG,
            windows,
            run_ms: budget.as_millis() as u64,
            rounds,
            points,
        },
        tables: vec![table],
        figures: vec![fig],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_keep_their_keys_failed_or_not() {
        let failed = Point::new("recv/send", 4, &Err("refused".into()), 100.0);
        assert_eq!(
            serde_json::to_value(&failed).unwrap(),
            serde_json::json!({"variant": "recv/send", "window": 4, "ops": 0, "ops_per_s": null,
                "wall_ops_per_s": null, "ratio": null, "ring_submissions": 0, "status": "refused"})
        );
        assert_eq!(
            failed.cells(),
            [Cell::Text("failed: refused".into()), Cell::Empty]
        );
        let ok = Point::new("recv/send", 4, &Ok((10, 2, 250.0, 200.0)), 100.0);
        assert_eq!(
            serde_json::to_value(&ok).unwrap(),
            serde_json::json!({"variant": "recv/send", "window": 4, "ops": 10, "ops_per_s": 250.0,
                "wall_ops_per_s": 200.0, "ratio": 2.5, "ring_submissions": 2, "status": "ok"})
        );
    }

    #[test]
    fn every_variant_moves_data() {
        for (name, v) in variants() {
            let r = match v {
                Variant::Sync(k) => run_sync(k, 4, Duration::from_millis(20)).map(|o| (o, 0)),
                Variant::Ring(c) => run_ring(c, 4, Duration::from_millis(20)),
            };
            match r {
                Ok((ops, _)) => assert!(ops >= 8, "{name}: {ops} ops"),
                Err(e)
                    if matches!(v, Variant::Ring(_))
                        && format!("{e:#}").contains("creating an io_uring") =>
                {
                    eprintln!("io_uring unavailable, skipping {name}")
                }
                Err(e) => panic!("{name}: {e:#}"),
            }
        }
    }
}
