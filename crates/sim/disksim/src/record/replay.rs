//! Replaying a file trace through the host stack, streamed: the trace is read twice (once to
//! check every line and learn each file's extent and each process's first call, once while
//! the simulation runs), so memory is O(files + processes + calls read ahead), not O(calls).
//!
//! Read ahead: each process is a closed-loop stream, so the simulation asks for a process's
//! next call when its previous one completed; calls of other processes met on the way are
//! queued for them. The queues hold what the recorded interleaving puts ahead of the
//! slowest process (nothing for one process; for several, their drift apart in simulated
//! time, at ~100 bytes a call).

use std::collections::{HashMap, VecDeque};
use std::io::BufRead;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::{Event, EventOp, FileTrace, LineParser, TraceFile};
use crate::engine::{Pending, Source, When};
use crate::request::{FileRef, Flags, Op, Request, SECTOR};

/// What the first reading of a file trace found.
#[derive(Clone, Debug, Default)]
pub struct FileTraceSummary {
    pub files: Vec<TraceFile>,
    pub strace_overhead_ms: f64,
    pub calls: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
}

/// A call as the simulator issues it: its stream, the request, recorded start and end (ms).
type Call = (Request, f64, f64);

/// Replays a file trace through a host stack: each process is a closed-loop stream; files are
/// laid out one after the other from sector 0, each at a 1 MiB boundary.
pub struct FileTraceSource<R: BufRead> {
    reader: R,
    line: String,
    lineno: usize,
    parser: LineParser,
    summary: FileTraceSummary,
    base: Vec<u64>,
    stream_of: HashMap<u32, usize>,
    /// Each process's first call (handed out by `next`), then None.
    firsts: Vec<Option<Call>>,
    /// Whether the second reading met the process's first call yet (it skips it).
    first_met: Vec<bool>,
    ahead: Vec<VecDeque<Call>>,
    prev_end: Vec<f64>,
    initial: usize,
    eof: bool,
}

impl FileTraceSource<std::io::Cursor<std::rc::Rc<[u8]>>> {
    /// A trace held in memory (`record`'s own, the tests'): its text, read by both passes.
    pub fn new(t: &FileTrace, capacity_blocks: u64) -> Result<Self> {
        let text: std::rc::Rc<[u8]> = t.to_text().into_bytes().into();
        let cursor = || std::io::Cursor::new(text.clone());
        FileTraceSource::read(cursor(), cursor(), capacity_blocks)
    }
}

impl FileTraceSource<std::io::BufReader<std::fs::File>> {
    /// A trace file, streamed.
    pub fn open(path: &Path, capacity_blocks: u64) -> Result<Self> {
        let open = || -> Result<_> {
            let f =
                std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
            Ok(std::io::BufReader::with_capacity(1 << 16, f))
        };
        FileTraceSource::read(open()?, open()?, capacity_blocks)
            .with_context(|| format!("{}", path.display()))
    }
}

fn next_line<R: BufRead>(r: &mut R, buf: &mut String, n: &mut usize) -> Result<bool> {
    buf.clear();
    let got = r
        .read_line(buf)
        .with_context(|| format!("line {}: not readable text", *n + 1))?;
    *n += 1;
    Ok(got > 0)
}

impl<R: BufRead> FileTraceSource<R> {
    /// `first` is read through now (every line checked), `second` while the simulation
    /// runs; both must be the same text. `capacity_blocks`: the device's sectors; the files
    /// must fit.
    pub fn read(mut first: R, second: R, capacity_blocks: u64) -> Result<Self> {
        let mut p = LineParser::default();
        let (mut buf, mut n) = (String::new(), 0);
        let mut stream_of = HashMap::new();
        let mut first_events: Vec<Event> = Vec::new();
        let (mut calls, mut read_bytes, mut written_bytes) = (0u64, 0u64, 0u64);
        while next_line(&mut first, &mut buf, &mut n)? {
            let Some(e) = p.line(n, &buf)? else { continue };
            calls += 1;
            match e.op {
                EventOp::Read => read_bytes += e.bytes,
                EventOp::Write => written_bytes += e.bytes,
                _ => {}
            }
            if let std::collections::hash_map::Entry::Vacant(v) = stream_of.entry(e.pid) {
                v.insert(first_events.len());
                first_events.push(e);
            }
        }
        let base = layout(&p.files, capacity_blocks)?;
        let firsts = first_events
            .iter()
            .map(|e| call_of(e, &base).map(Some))
            .collect::<Result<Vec<_>>>()?;
        let k = firsts.len();
        Ok(FileTraceSource {
            reader: second,
            line: buf,
            lineno: 0,
            parser: LineParser::default(),
            summary: FileTraceSummary {
                files: p.files,
                strace_overhead_ms: p.overhead_ms,
                calls,
                read_bytes,
                written_bytes,
            },
            base,
            stream_of,
            firsts,
            first_met: vec![false; k],
            ahead: vec![VecDeque::new(); k],
            prev_end: vec![0.0; k],
            initial: 0,
            eof: false,
        })
    }

    pub fn summary(&self) -> &FileTraceSummary {
        &self.summary
    }

    /// The next call of stream `s` from the trace, queueing the other streams' calls read
    /// on the way.
    fn pull(&mut self, s: usize) -> Result<Option<Call>> {
        loop {
            if let Some(c) = self.ahead[s].pop_front() {
                return Ok(Some(c));
            }
            if self.eof {
                return Ok(None);
            }
            if !next_line(&mut self.reader, &mut self.line, &mut self.lineno)? {
                self.eof = true;
                continue;
            }
            let Some(e) = self.parser.line(self.lineno, &self.line)? else {
                continue;
            };
            let Some(&t) = self.stream_of.get(&e.pid) else {
                bail!(
                    "line {}: the trace changed while it was replayed",
                    self.lineno
                );
            };
            if !std::mem::replace(&mut self.first_met[t], true) {
                continue; // handed out by `next` already
            }
            let c = call_of(&e, &self.base)?;
            self.ahead[t].push_back(c);
        }
    }

    fn pending(s: usize, (req, _, _): Call, at: f64) -> Pending {
        Pending {
            when: When::Stream {
                stream: s as u32,
                at,
            },
            req,
        }
    }
}

/// Each file's first sector: one after the other, each at a 1 MiB boundary.
fn layout(files: &[TraceFile], capacity_blocks: u64) -> Result<Vec<u64>> {
    let mut base = Vec::with_capacity(files.len());
    let mut next = 0u64;
    for f in files {
        base.push(next);
        let secs = f.extent.div_ceil(SECTOR).div_ceil(2048).max(1) * 2048;
        next = next.saturating_add(secs);
    }
    if next > capacity_blocks {
        bail!(
            "the trace's files need {} MiB, the device holds {} MiB",
            next / 2048,
            capacity_blocks / 2048
        );
    }
    Ok(base)
}

fn call_of(e: &Event, base: &[u64]) -> Result<Call> {
    let b = *base
        .get(e.file as usize)
        .with_context(|| format!("event on undeclared file {}", e.file))?;
    let (op, sectors, flags) = match e.op {
        EventOp::Read | EventOp::Write => {
            let secs = ((e.offset % SECTOR) + e.bytes).div_ceil(SECTOR).max(1);
            let op = if e.op == EventOp::Read {
                Op::Read
            } else {
                Op::Write
            };
            (op, secs, e.flags)
        }
        EventOp::Fsync => (Op::Flush, 0, Flags::default()),
        EventOp::Fdatasync => (Op::Flush, 0, Flags::DATASYNC),
        EventOp::Fadvise(a) => (Op::Advise(a), e.bytes.div_ceil(SECTOR), Flags::default()),
    };
    let offset = if op == Op::Flush { 0 } else { e.offset };
    let req = Request {
        id: 0,
        arrival: 0.0,
        dev: 0,
        lba: b + offset / SECTOR,
        sectors: u32::try_from(sectors).unwrap_or(u32::MAX),
        op,
        flags,
        file: Some(FileRef {
            file: e.file,
            offset: offset - offset % SECTOR,
        }),
        prio: crate::request::IoPrio::NONE,
    };
    Ok((req, e.time_ms, e.time_ms + e.dur_ms))
}

impl<R: BufRead> Source for FileTraceSource<R> {
    fn next(&mut self) -> Result<Option<Pending>> {
        // Each process's first call at its recorded start.
        while self.initial < self.firsts.len() {
            let s = self.initial;
            self.initial += 1;
            if let Some(c) = self.firsts[s].take() {
                self.prev_end[s] = c.2;
                let at = c.1;
                return Ok(Some(Self::pending(s, c, at)));
            }
        }
        Ok(None)
    }
    fn next_in_stream(&mut self, stream: u32, now: f64) -> Result<Option<Pending>> {
        let s = stream as usize;
        if s >= self.ahead.len() {
            return Ok(None);
        }
        let Some(c) = self.pull(s)? else {
            return Ok(None);
        };
        // The recorded gap between the end of the previous call and this one's start.
        let gap = (c.1 - self.prev_end[s] - self.summary.strace_overhead_ms).max(0.0);
        self.prev_end[s] = c.2;
        Ok(Some(Self::pending(s, c, now + gap)))
    }
    fn len_hint(&self) -> Option<u64> {
        Some(self.summary.calls)
    }
}

/// What a replay gives: simulated span from the first call to the last completion (s), the
/// simulation's wall time (s), and the host stack's counters.
pub struct Replay {
    pub sim_s: f64,
    pub wall_s: f64,
    pub host_stats: Vec<(String, f64)>,
}

/// Replays `t` on the device of the config file `config` under this machine's host stack
/// (the settings of the device holding the first traced file's directory, else of the
/// current directory; Linux's defaults if they cannot be read).
pub fn replay(t: &FileTrace, config: &Path) -> Result<Replay> {
    replay_with(config, |blocks| FileTraceSource::new(t, blocks)).map(|(r, _)| r)
}

/// [`replay`] of a trace file, streamed; also what the file holds.
pub fn replay_file(path: &Path, config: &Path) -> Result<(Replay, FileTraceSummary)> {
    replay_with(config, |blocks| FileTraceSource::open(path, blocks))
}

fn replay_with<R: BufRead>(
    config: &Path,
    source: impl FnOnce(u64) -> Result<FileTraceSource<R>>,
) -> Result<(Replay, FileTraceSummary)> {
    let cfg = crate::config::Config::load(config)?;
    let dev = cfg.device(config)?;
    let mut src = source(dev.blocks)?;
    let files = &src.summary().files;
    let here = files
        .first()
        .and_then(|f| {
            Path::new(&f.path)
                .parent()
                .map(|p| p.to_string_lossy().to_string())
        })
        .filter(|p| Path::new(p).exists())
        .unwrap_or_else(|| ".".into());
    let host = crate::host::HostParams::from_system(&here)
        .unwrap_or_else(|_| crate::host::HostParams::linux_defaults());
    let sizes: Vec<(u32, u64)> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (i as u32, f.extent))
        .collect();
    let chain = host
        .stack()
        .cpu(cfg.host_cpu.as_ref())
        .files(&sizes)
        .on(dev.component)?;
    let mut sim = crate::engine::Simulator::new(chain);
    let (mut first, mut last) = (f64::MAX, 0.0f64);
    let t0 = Instant::now();
    sim.run(&mut src, &mut |c| {
        first = first.min(c.rec.arrival);
        last = last.max(c.rec.completion);
    })?;
    let span = if first <= last { last - first } else { 0.0 };
    let comps = sim.components();
    let host_stats = comps[..comps.len().saturating_sub(1)]
        .iter()
        .flat_map(|c| c.stats())
        .collect();
    let replay = Replay {
        sim_s: span / 1000.0,
        wall_s: t0.elapsed().as_secs_f64(),
        host_stats,
    };
    Ok((replay, src.summary))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{ConstantDevice, Simulator};

    fn completions(src: &mut dyn Source) -> Vec<(f64, f64, u64)> {
        let mut sim = Simulator::new(vec![Box::new(ConstantDevice::new(2.0))]);
        let mut done = Vec::new();
        sim.run(src, &mut |c| {
            done.push((c.rec.arrival, c.rec.completion, c.req.lba))
        })
        .unwrap();
        done.sort_by(|a, b| a.0.total_cmp(&b.0));
        done
    }

    #[test]
    fn replay_is_closed_loop_per_process_with_the_recorded_gaps() {
        // One process: reads at 0 (0.1 ms), 1.0 (gap 0.9 − overhead 0.1 = 0.8).
        let text =
            "file 0 8192 /f\noverhead 0.1\n0 0.1 7 0 R 0 4096 -\n1.0 0.1 7 0 R 4096 4096 -\n";
        let t = FileTrace::parse(text).unwrap();
        let done = completions(&mut FileTraceSource::new(&t, 1 << 20).unwrap());
        assert_eq!(done.len(), 2);
        // The device takes 2 ms: the second call starts 0.8 ms after the first completed.
        assert!((done[0].1 - 2.0).abs() < 1e-9, "{done:?}");
        assert!((done[1].0 - 2.8).abs() < 1e-9, "{done:?}");
        // Files that do not fit the device: one clear error.
        let big = FileTrace::parse("file 0 1073741824 /big\n").unwrap();
        assert!(FileTraceSource::new(&big, 2048).is_err());
    }

    /// Two processes whose calls interleave, streamed from a file: each keeps its own
    /// closed loop and order, the one read ahead of the other is queued for it, and the
    /// result is the in-memory replay's.
    #[test]
    fn a_streamed_trace_replays_as_the_whole_one() {
        let mut text = String::from("file 0 1048576 /f\nfile 1 1048576 /g\noverhead 0\n");
        for i in 0..50u64 {
            let (pid, file) = if i % 3 == 0 { (9, 1) } else { (7, 0) };
            text += &format!("{}.0 0.5 {pid} {file} W {} 4096 -\n", i, i * 4096);
        }
        let path = std::env::temp_dir().join(format!("iolab-ftrace-{}", std::process::id()));
        std::fs::write(&path, &text).unwrap();
        let whole = completions(
            &mut FileTraceSource::new(&FileTrace::parse(&text).unwrap(), 1 << 22).unwrap(),
        );
        let mut src = FileTraceSource::open(&path, 1 << 22).unwrap();
        assert_eq!(src.summary().calls, 50);
        assert_eq!(src.summary().written_bytes, 50 * 4096);
        let streamed = completions(&mut src);
        assert_eq!(streamed.len(), 50);
        assert_eq!(streamed, whole);
        // pid 7's calls land in file 0 (sector 0 on), pid 9's in file 1 (from 2048), each
        // stream in its recorded order
        let of = |lo: u64, hi: u64| -> Vec<u64> {
            streamed
                .iter()
                .map(|c| c.2)
                .filter(|l| (lo..hi).contains(l))
                .collect()
        };
        let (a, b) = (of(0, 2048), of(2048, 4096));
        assert_eq!((a.len(), b.len()), (33, 17));
        assert!(a.windows(2).all(|w| w[0] < w[1]) && b.windows(2).all(|w| w[0] < w[1]));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_bad_line_is_named_before_anything_is_simulated() {
        let path = std::env::temp_dir().join(format!("iolab-ftrace-bad-{}", std::process::id()));
        std::fs::write(&path, "file 0 10 /x\n0 0 1 0 R 0 10 -\n1 0 1 0 X 0 10 -\n").unwrap();
        let e = format!("{:#}", FileTraceSource::open(&path, 1 << 20).err().unwrap());
        assert!(e.contains("line 3") && e.contains("unknown OP"), "{e}");
        std::fs::write(&path, b"file 0 10 /x\n\xff\xfe\n").unwrap();
        let e = format!("{:#}", FileTraceSource::open(&path, 1 << 20).err().unwrap());
        assert!(
            e.contains("line 2") && e.contains("not readable text"),
            "{e}"
        );
        std::fs::remove_file(&path).unwrap();
    }
}
