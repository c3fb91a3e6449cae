//! Fuzzes every trace reader (also with the device's capacity and a chosen device), the
//! DiskSim parameter parser, the fio job reader (stonewall/wait_for, bssplit, rw offset
//! modifiers, loops, and fio/extra.rs's distributions, exitall, flow, verify, null engine
//! included) and `record`'s strace parser and file trace reader. Beyond "never panics", it
//! checks that what a reader accepts is within the documented limits (sizes, addresses,
//! times), and replays accepted requests through the HDD model (which must finish, with
//! completions after arrivals).
#![no_main]

use std::path::Path;

use iolab_disksim::engine::{Simulator, VecSource, When};
use iolab_disksim::trace::{read_all, Format, MAX_LBA, MAX_SECTORS, MAX_TIME_MS};
use libfuzzer_sys::fuzz_target;

const FORMATS: [Format; 6] = [Format::Validate, Format::Ascii, Format::Fio, Format::Blkparse, Format::Msr, Format::Iolab];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else { return };
    if sel % 16 == 15 {
        // `record`: strace's output (outside data) and the file trace text. Whatever the
        // strace parser accepts must write a file trace that reads back, lays out and
        // replays through the page cache.
        let text = String::from_utf8_lossy(rest);
        let (t, ..) = iolab_disksim::record::parse_strace(&text, vec![]).finish();
        let back = iolab_disksim::record::FileTrace::parse(&t.to_text())
            .expect("the parser's own output reads back");
        assert_eq!(back.events.len(), t.events.len());
        let parsed = iolab_disksim::record::FileTrace::parse(&text);
        for t in [Some(back), parsed.ok()].into_iter().flatten() {
            // Bounded work per input: a replay costs time in proportion to its pages and
            // to the flusher's periodic wake-ups over the simulated span.
            let bytes: u64 = t.events.iter().map(|e| e.bytes).sum();
            let span = t.events.last().map_or(0.0, |e| e.time_ms + e.dur_ms);
            if t.events.len() > 256 || bytes > 16 << 20 || span > 1e6 {
                continue;
            }
            let Ok(mut src) = iolab_disksim::record::FileTraceSource::new(&t, 1 << 40) else { continue };
            let mut host = iolab_disksim::host::HostParams::linux_defaults();
            host.page_cache.capacity_pages = 256;
            let sizes: Vec<(u32, u64)> =
                t.files.iter().enumerate().map(|(i, f)| (i as u32, f.extent)).collect();
            let chain = host
                .stack()
                .files(&sizes)
                .on(Box::new(iolab_disksim::engine::ConstantDevice::new(0.1)))
                .unwrap();
            let mut n = 0;
            Simulator::new(chain)
                .run(&mut src, &mut |c| {
                    assert!(c.rec.completion >= c.rec.arrival);
                    n += 1;
                })
                .unwrap();
            assert_eq!(n, t.events.len());
        }
        return;
    }
    if sel as usize % 8 == 7 {
        // fio job files: parse (strict and lenient); what is accepted must lay out and
        // simulate through the page cache without a panic, every request within its file.
        let Ok(text) = std::str::from_utf8(rest) else { return };
        let _ = iolab_disksim::fio::parse(text, false);
        let Ok(jf) = iolab_disksim::fio::parse(text, true) else { return };
        let Ok(mut src) = iolab_disksim::fio::FioSource::new(&jf, 0, 1 << 24) else { return };
        let files = src.files.clone();
        let mut host = iolab_disksim::host::HostParams::linux_defaults();
        host.page_cache.capacity_pages = 256;
        let Ok(chain) = host.stack().on(Box::new(iolab_disksim::engine::ConstantDevice::new(0.1)))
        else { return };
        let mut sim = Simulator::new(chain);
        let mut n = 0u64;
        let budget = 20_000u64;
        // Bounded: stop pulling after the budget (time_based jobs would run their runtime).
        struct Capped<'a>(&'a mut iolab_disksim::fio::FioSource, u64);
        impl iolab_disksim::engine::Source for Capped<'_> {
            fn next(&mut self) -> anyhow::Result<Option<iolab_disksim::engine::Pending>> {
                if self.1 == 0 { return Ok(None) }
                self.1 -= 1;
                self.0.next()
            }
            fn next_in_stream(&mut self, s: u32, now: f64) -> anyhow::Result<Option<iolab_disksim::engine::Pending>> {
                if self.1 == 0 { return Ok(None) }
                self.1 -= 1;
                self.0.next_in_stream(s, now)
            }
            fn still_wanted(&mut self, s: u32, now: f64) -> bool {
                self.0.still_wanted(s, now)
            }
        }
        sim.run_streams(&mut Capped(&mut src, budget), &mut |c, _| {
            let Some(f) = c.req.file else { return };
            let file = &files[f.file as usize];
            assert!(f.offset + c.req.bytes() <= file.bytes.div_ceil(512) * 512 + 4096);
            assert!(c.rec.completion >= c.rec.arrival);
            n += 1;
        })
        .unwrap();
        assert!(n <= budget);
        return;
    }
    if sel as usize % 8 == 6 {
        // DiskSim parameter syntax (no includes can resolve: the path is fictitious).
        if let Ok(text) = std::str::from_utf8(rest) {
            let _ = iolab_disksim::hdd::params::parse_str(text, Path::new("/nonexistent/fuzz.parv"));
            let _ = iolab_disksim::hdd::params::parse_seek_text(text, Path::new("fuzz.seek"));
        }
        return;
    }
    let fmt = FORMATS[sel as usize % 8];
    // The capacity and device checks: what a capped reader accepts lies within the device,
    // on the chosen device only.
    if sel >= 128 {
        let cap = 1u64 << (sel % 40);
        let mut s = iolab_disksim::trace::TraceSource::new(rest, fmt).with_capacity(cap);
        if sel % 2 == 1 {
            // Refused for a format without device numbers: nothing to replay.
            let Ok(filtered) = s.with_device(u32::from(sel % 3)) else { return };
            s = filtered;
        }
        let mut n = 0;
        while let Ok(Some(p)) = iolab_disksim::engine::Source::next(&mut s) {
            if matches!(p.req.op, iolab_disksim::request::Op::Read | iolab_disksim::request::Op::Write) {
                assert!(p.req.end() <= cap);
            }
            if let Some(d) = s.dev_filter {
                assert_eq!(p.req.dev, d);
            }
            n += 1;
            if n > 100_000 {
                break;
            }
        }
        return;
    }
    let Ok(reqs) = read_all(rest, fmt) else { return };
    for p in &reqs {
        let r = &p.req;
        assert!(u64::from(r.sectors) <= MAX_SECTORS);
        assert!(r.lba <= MAX_LBA);
        if let When::At(t) = p.when {
            assert!(t.is_finite() && (0.0..=MAX_TIME_MS).contains(&t));
        }
        if let When::AfterCompletion { think } = p.when {
            assert!(think.is_finite() && think >= 0.0);
        }
    }
    if reqs.len() <= 64 {
        let mut sim = Simulator::new(vec![Box::new(iolab_disksim::engine::ConstantDevice::new(0.5))]);
        let mut n = 0;
        sim.run(&mut VecSource::new(reqs.clone()), &mut |c| {
            assert!(c.rec.completion >= c.rec.arrival);
            n += 1;
        })
        .unwrap();
        assert_eq!(n, reqs.len());
    }
});
