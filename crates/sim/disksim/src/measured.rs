//! Measured-device model: response times looked up in a table measured on the real device
//! (by operation, access pattern, request size and queue depth), for devices no mechanical
//! model fits — a virtual disk, a RAID controller, a cloud volume. `iolab disksim calibrate`
//! (issue 12) writes these tables; they can also be written by hand from fio runs.
//!
//! A request's latency is the table's mean latency for its operation and pattern (sequential
//! when it starts where the previous request of the same kind ended), interpolated linearly
//! in size (a latency is a fixed cost plus a transfer that grows with the bytes: halfway in
//! log2(size), as 512 KiB is between 256 KiB and 1 MiB, overstated it by up to a quarter) and
//! in queue depth (the number of requests in the device when it arrives,
//! itself included). Up to `queue_depth` requests are served at once; the table's latency at
//! a queue depth already holds the device's internal queueing, so no further queueing is
//! added below that depth.
//!
//! A second, optional table (`large_folio_points`) serves the page cache's reads into large
//! folios ([`Flags::LARGE_FOLIOS`]): a virtual disk can cost per memory segment of a request
//! (this VM's `vda`: 512 KiB O_DIRECT reads at 1.1 GB/s from 4 KiB pages, 2.3 GB/s from a
//! huge page), and an O_DIRECT table measured from ordinary buffers would make read-ahead
//! into 2 MiB folios half as fast as it is. `calibrate` measures it with huge-page buffers.

use std::collections::VecDeque;

use anyhow::{bail, Result};
use serde::Deserialize;

use crate::engine::{Component, Ctx};
use crate::request::{Completion, Flags, Op, Record, Request};

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    Random,
    Sequential,
}

/// One measured point.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Point {
    /// "read" or "write".
    pub op: String,
    pub pattern: Pattern,
    /// Request size (KiB).
    pub size_kib: f64,
    /// Queue depth the point was measured at.
    pub qd: u32,
    /// Mean completion latency (µs).
    pub latency_us: f64,
}

/// `[measured]` section of a config.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MeasuredSpec {
    /// Requests served at once.
    pub queue_depth: usize,
    /// Capacity (GiB).
    pub capacity_gib: u64,
    pub points: Vec<Point>,
    /// A cache flush (`fsync`, `O_DSYNC` without FUA), µs: what `calibrate` measures as a
    /// write followed by `fsync` less the plain write. 0 (the default): flushes are free, as
    /// behind a write-through or battery-backed cache.
    #[serde(default)]
    pub flush_us: f64,
    /// The flush an `fdatasync` or an `O_DSYNC` write pays (a flush request with
    /// [`Flags::DATASYNC`]), µs: what `calibrate` measures as an `O_DSYNC` write less the
    /// plain one. It is cheaper than `flush_us` on a journalling file system: `fsync` after
    /// a write also commits the journal (the inode's new mtime), `fdatasync` of an overwrite
    /// only flushes the device's cache. Absent: `flush_us`.
    #[serde(default)]
    pub datasync_flush_us: Option<f64>,
    /// Points measured with buffers of few memory segments (huge pages), for reads into the
    /// page cache's large folios; empty: those use `points` too.
    #[serde(default)]
    pub large_folio_points: Vec<Point>,
}

type Key = (bool, Pattern); // (is_read, pattern)

/// One size's row: log2 of the size in KiB, the size in KiB (`exp2` of the former, kept so
/// a lookup does not compute it again), and (queue depth, µs) ascending.
type Row = (f64, f64, Vec<(f64, f64)>);

/// Latency tables, one per (operation, pattern), each with its sizes ascending; looked up for
/// every request the device starts, so a fixed array rather than a map.
struct Tables([Vec<Row>; 4]);

/// The slot of a key in [`Tables`].
fn slot((read, pattern): Key) -> usize {
    usize::from(!read) * 2 + usize::from(pattern == Pattern::Sequential)
}

impl Tables {
    fn build(name: &str, points: &[Point]) -> Result<Tables> {
        let mut m: [Vec<Row>; 4] = Default::default();
        for (i, p) in points.iter().enumerate() {
            let read = match p.op.as_str() {
                "read" => true,
                "write" => false,
                o => bail!("measured.{name}[{i}]: op must be \"read\" or \"write\", not \"{o}\""),
            };
            if !(p.size_kib.is_finite() && p.size_kib > 0.0 && p.size_kib <= 1e7) {
                bail!("measured.{name}[{i}]: size_kib must be within (0, 1e7]");
            }
            if p.qd == 0 || p.qd > 65536 {
                bail!("measured.{name}[{i}]: qd must be within 1..=65536");
            }
            if !(p.latency_us.is_finite() && p.latency_us > 0.0 && p.latency_us < 1e9) {
                bail!("measured.{name}[{i}]: latency_us must be > 0 and finite");
            }
            let rows = &mut m[slot((read, p.pattern))];
            let ls = p.size_kib.log2();
            let row = match rows.iter_mut().position(|(s, _, _)| (*s - ls).abs() < 1e-9) {
                Some(j) => &mut rows[j].2,
                None => {
                    rows.push((ls, ls.exp2(), Vec::new()));
                    &mut rows.last_mut().unwrap().2
                }
            };
            if row.iter().any(|&(q, _)| q == f64::from(p.qd)) {
                bail!("measured.{name}[{i}]: a second point for the same op, pattern, size and qd");
            }
            row.push((f64::from(p.qd), p.latency_us));
        }
        for rows in m.iter_mut() {
            rows.sort_by(|a, b| a.0.total_cmp(&b.0));
            for (_, _, r) in rows.iter_mut() {
                r.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
        }
        if m.iter().all(Vec::is_empty) {
            bail!("measured.{name} is empty");
        }
        Ok(Tables(m))
    }

    /// Latency (µs) for a key, size (KiB) and queue depth.
    fn lookup(&self, key: Key, size_kib: f64, qd: f64) -> f64 {
        // A missing table falls back to the same operation's other pattern, then to the
        // other operation's (same pattern first).
        let other = |p: Pattern| {
            if p == Pattern::Random {
                Pattern::Sequential
            } else {
                Pattern::Random
            }
        };
        let rows = [
            key,
            (key.0, other(key.1)),
            (!key.0, key.1),
            (!key.0, other(key.1)),
        ]
        .into_iter()
        .map(|k| &self.0[slot(k)])
        .find(|r| !r.is_empty())
        .expect("tables are never empty");
        let at_qd = |r: &[(f64, f64)]| interp(r, qd);
        let ls = size_kib.max(1e-3).log2();
        let i = rows.partition_point(|(s, _, _)| *s < ls);
        if i == 0 {
            return at_qd(&rows[0].2);
        }
        if i >= rows.len() {
            // Beyond the largest size: scale with size from the two largest (transfer-bound).
            let (s1, _, r1) = &rows[rows.len() - 1];
            if rows.len() == 1 {
                return at_qd(r1) * (ls - s1).exp2();
            }
            let (_, k0, r0) = &rows[rows.len() - 2];
            let (_, k1, _) = &rows[rows.len() - 1];
            let (a, b) = (at_qd(r0), at_qd(r1));
            let per = (b - a) / (k1 - k0);
            return b + per.max(0.0) * (ls.exp2() - k1);
        }
        let (_, k0, r0) = &rows[i - 1];
        let (_, k1, r1) = &rows[i];
        let f = (ls.exp2() - k0) / (k1 - k0);
        at_qd(r0) + f * (at_qd(r1) - at_qd(r0))
    }
}

/// Linear interpolation in a sorted (x, y) list, clamped at the ends.
fn interp(r: &[(f64, f64)], x: f64) -> f64 {
    let i = r.partition_point(|(q, _)| *q < x);
    if i == 0 {
        return r[0].1;
    }
    if i >= r.len() {
        return r[r.len() - 1].1;
    }
    let (x0, y0) = r[i - 1];
    let (x1, y1) = r[i];
    y0 + (x - x0) / (x1 - x0) * (y1 - y0)
}

pub struct MeasuredDevice {
    spec: MeasuredSpec,
    tables: Tables,
    large_folios: Option<Tables>,
    in_service: usize,
    queue: VecDeque<Request>,
    active: crate::Map<u64, (Request, Record)>,
    last_end: [Option<u64>; 2],
}

impl MeasuredDevice {
    pub fn new(spec: MeasuredSpec) -> Result<MeasuredDevice> {
        if spec.queue_depth == 0 || spec.queue_depth > 65536 {
            bail!("measured.queue_depth must be within 1..=65536");
        }
        if spec.capacity_gib == 0 || spec.capacity_gib > 1 << 20 {
            bail!("measured.capacity_gib must be within 1..=1048576");
        }
        for (name, us) in [
            ("flush_us", Some(spec.flush_us)),
            ("datasync_flush_us", spec.datasync_flush_us),
        ] {
            if us.is_some_and(|us| !(us.is_finite() && (0.0..1e7).contains(&us))) {
                bail!("measured.{name} must be within 0..1e7 (µs)");
            }
        }
        let tables = Tables::build("points", &spec.points)?;
        let large_folios = if spec.large_folio_points.is_empty() {
            None
        } else {
            Some(Tables::build(
                "large_folio_points",
                &spec.large_folio_points,
            )?)
        };
        Ok(MeasuredDevice {
            spec,
            tables,
            large_folios,
            in_service: 0,
            queue: VecDeque::new(),
            active: crate::Map::default(),
            last_end: [None, None],
        })
    }
    pub fn blocks(&self) -> u64 {
        self.spec.capacity_gib << 21
    }
    fn start(&mut self, req: Request, ctx: &mut Ctx) {
        let now = ctx.now();
        self.in_service += 1;
        let read = req.op == Op::Read;
        let slot = usize::from(read);
        let pattern = if self.last_end[slot] == Some(req.lba) {
            Pattern::Sequential
        } else {
            Pattern::Random
        };
        self.last_end[slot] = Some(req.end());
        let lat_ms = if req.op == Op::Flush {
            let us = match self.spec.datasync_flush_us {
                Some(us) if req.flags.contains(Flags::DATASYNC) => us,
                _ => self.spec.flush_us,
            };
            us / 1000.0
        } else if matches!(req.op, Op::Advise(_)) {
            0.0
        } else {
            let tables = match &self.large_folios {
                Some(t) if req.flags.contains(Flags::LARGE_FOLIOS) => t,
                _ => &self.tables,
            };
            tables.lookup(
                (read, pattern),
                req.bytes() as f64 / 1024.0,
                self.in_service as f64,
            ) / 1000.0
        };
        let rec = Record {
            arrival: req.arrival,
            device_start: now,
            queue_wait: now - req.arrival,
            transfer: lat_ms,
            completion: now + lat_ms,
            ..Default::default()
        };
        ctx.wake_at(now + lat_ms, req.id);
        self.active.insert(req.id, (req, rec));
    }
}

impl Component for MeasuredDevice {
    fn name(&self) -> &str {
        "measured"
    }
    fn submit(&mut self, req: Request, ctx: &mut Ctx) {
        if self.in_service < self.spec.queue_depth {
            self.start(req, ctx);
        } else {
            self.queue.push_back(req);
        }
    }
    fn wake(&mut self, token: u64, ctx: &mut Ctx) {
        if let Some((req, mut rec)) = self.active.remove(&token) {
            self.in_service -= 1;
            rec.completion = ctx.now();
            ctx.up(Completion { req, rec });
        }
        if self.in_service < self.spec.queue_depth {
            if let Some(n) = self.queue.pop_front() {
                self.start(n, ctx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(op: &str, pattern: Pattern, size_kib: f64, qd: u32, latency_us: f64) -> Point {
        Point {
            op: op.into(),
            pattern,
            size_kib,
            qd,
            latency_us,
        }
    }

    /// A missing table falls back in a fixed order (same operation's other pattern, then the
    /// other operation's same pattern): it used to take whichever table a randomly seeded
    /// map listed first, so the same calibration could simulate differently from run to run.
    #[test]
    fn a_missing_table_falls_back_in_a_fixed_order() {
        let w = |pattern, us| p("write", pattern, 4.0, 1, us);
        let t = tables(&[
            w(Pattern::Random, 100.0),
            w(Pattern::Sequential, 200.0),
            p("read", Pattern::Sequential, 4.0, 1, 300.0),
        ]);
        assert_eq!(t.lookup((true, Pattern::Random), 4.0, 1.0), 300.0);
        let only_writes = tables(&[w(Pattern::Random, 100.0), w(Pattern::Sequential, 200.0)]);
        assert_eq!(only_writes.lookup((true, Pattern::Random), 4.0, 1.0), 100.0);
        assert_eq!(
            only_writes.lookup((true, Pattern::Sequential), 4.0, 1.0),
            200.0
        );
    }

    fn tables(points: &[Point]) -> Tables {
        Tables::build("points", points).unwrap()
    }

    #[test]
    fn interpolates_in_size_and_queue_depth() {
        let t = tables(&[
            p("read", Pattern::Random, 4.0, 1, 100.0),
            p("read", Pattern::Random, 4.0, 4, 200.0),
            p("read", Pattern::Random, 16.0, 1, 300.0),
            p("read", Pattern::Random, 16.0, 4, 500.0),
        ]);
        let k = (true, Pattern::Random);
        assert_eq!(t.lookup(k, 4.0, 1.0), 100.0);
        // 8 KiB is a third of the way from 4 to 16 KiB (not halfway, as in log2); qd 1.
        assert!((t.lookup(k, 8.0, 1.0) - (100.0 + 200.0 / 3.0)).abs() < 1e-9);
        // qd 2.5 is halfway between 1 and 4.
        assert!((t.lookup(k, 4.0, 2.5) - 150.0).abs() < 1e-9);
        // Clamped below the smallest size and above the largest qd.
        assert_eq!(t.lookup(k, 1.0, 64.0), 200.0);
        // A write with no write table falls back to what exists.
        assert!(t.lookup((false, Pattern::Sequential), 4.0, 1.0) > 0.0);
    }

    #[test]
    fn a_flush_costs_the_measured_flush_time() {
        let spec = |flush_us: f64| MeasuredSpec {
            queue_depth: 1,
            capacity_gib: 1,
            points: vec![p("write", Pattern::Random, 4.0, 1, 100.0)],
            flush_us,
            datasync_flush_us: None,
            large_folio_points: vec![],
        };
        let reqs = [(0.0, 0, 8, Op::Write), (1.0, 0, 0, Op::Flush)];
        let out =
            crate::testdev::run_at(Box::new(MeasuredDevice::new(spec(250.0)).unwrap()), &reqs);
        assert!((out[0].response() - 0.100).abs() < 1e-9);
        assert!(
            (out[1].response() - 0.250).abs() < 1e-9,
            "{}",
            out[1].response()
        );
        let out = crate::testdev::run_at(Box::new(MeasuredDevice::new(spec(0.0)).unwrap()), &reqs);
        assert_eq!(out[1].response(), 0.0);
        assert!(MeasuredDevice::new(spec(-1.0)).is_err());
        assert!(MeasuredDevice::new(spec(f64::NAN)).is_err());
    }

    /// The response time (ms) of one request of `sectors` with `flags`, alone on a measured
    /// device of `spec`.
    fn response_of_one(spec: MeasuredSpec, op: Op, flags: Flags, sectors: u32) -> f64 {
        let mut items = vec![crate::testdev::pending_at(0.0, op, 0, sectors)];
        items[0].req.flags = flags;
        let mut sim =
            crate::engine::Simulator::new(vec![Box::new(MeasuredDevice::new(spec).unwrap())]);
        let mut out = vec![];
        sim.run(&mut crate::engine::VecSource::new(items), &mut |c| {
            out.push(c.response())
        })
        .unwrap();
        out[0]
    }

    /// fdatasync's flush (DATASYNC) costs `datasync_flush_us` where it is set, fsync's
    /// `flush_us`; without the field both cost `flush_us`.
    #[test]
    fn a_datasync_flush_costs_its_own_time() {
        let spec = |datasync: Option<f64>| MeasuredSpec {
            queue_depth: 1,
            capacity_gib: 1,
            points: vec![p("write", Pattern::Random, 4.0, 1, 100.0)],
            flush_us: 250.0,
            datasync_flush_us: datasync,
            large_folio_points: vec![],
        };
        let flush = |spec, flags| response_of_one(spec, Op::Flush, flags, 0);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(flush(spec(Some(40.0)), Flags::DATASYNC), 0.040));
        assert!(close(flush(spec(Some(40.0)), Flags::SYNC), 0.250));
        assert!(close(flush(spec(None), Flags::DATASYNC), 0.250));
        assert!(MeasuredDevice::new(spec(Some(-1.0))).is_err());
        assert!(MeasuredDevice::new(spec(Some(f64::INFINITY))).is_err());
    }

    /// Reads into large folios use their own table when there is one, the ordinary one
    /// otherwise; everything else uses the ordinary one.
    #[test]
    fn large_folio_reads_use_their_table() {
        let spec = |large: Vec<Point>| MeasuredSpec {
            queue_depth: 1,
            capacity_gib: 1,
            points: vec![
                p("read", Pattern::Random, 512.0, 1, 450.0),
                p("write", Pattern::Random, 512.0, 1, 300.0),
            ],
            flush_us: 0.0,
            datasync_flush_us: None,
            large_folio_points: large,
        };
        let run = |spec, op, flags| (response_of_one(spec, op, flags, 1024) * 1000.0).round();
        let large = vec![p("read", Pattern::Random, 512.0, 1, 230.0)];
        assert_eq!(
            run(spec(large.clone()), Op::Read, Flags::LARGE_FOLIOS),
            230.0
        );
        assert_eq!(run(spec(large.clone()), Op::Read, Flags::default()), 450.0);
        assert_eq!(run(spec(vec![]), Op::Read, Flags::LARGE_FOLIOS), 450.0);
        assert!(
            MeasuredDevice::new(spec(vec![p("read", Pattern::Random, 1.0, 0, 1.0)]))
                .is_err_and(|e| e.to_string().contains("large_folio_points[0]"))
        );
    }

    #[test]
    fn bad_tables_are_refused() {
        assert!(Tables::build("points", &[]).is_err());
        assert!(Tables::build("points", &[p("erase", Pattern::Random, 4.0, 1, 1.0)]).is_err());
        assert!(Tables::build("points", &[p("read", Pattern::Random, 4.0, 0, 1.0)]).is_err());
        assert!(Tables::build(
            "points",
            &[
                p("read", Pattern::Random, 4.0, 1, 1.0),
                p("read", Pattern::Random, 4.0, 1, 2.0)
            ]
        )
        .is_err());
    }
}
