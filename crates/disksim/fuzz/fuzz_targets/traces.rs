//! Fuzzes every trace reader and the DiskSim parameter parser. Beyond "never panics", it
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
    if sel as usize % 7 == 6 {
        // DiskSim parameter syntax (no includes can resolve: the path is fictitious).
        if let Ok(text) = std::str::from_utf8(rest) {
            let _ = iolab_disksim::hdd::params::parse_str(text, Path::new("/nonexistent/fuzz.parv"));
            let _ = iolab_disksim::hdd::params::parse_seek_text(text, Path::new("fuzz.seek"));
        }
        return;
    }
    let fmt = FORMATS[sel as usize % 7];
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
