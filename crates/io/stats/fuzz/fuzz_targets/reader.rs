//! `iolab stats FILE` on any file: a stats file left by another version, truncated, or not
//! one at all must give an error or a snapshot, never a panic or a read past the mapping.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // TMPDIR is private to the fuzz run (scripts/fuzz-lib)
    let path = std::env::temp_dir().join(format!("stats-{}", std::process::id()));
    std::fs::write(&path, data).expect("write the input");
    if let Ok(r) = iolab_stats::StatsReader::open(&path) {
        let s = r.snapshot();
        let _ = (r.pid(), r.started_ns(), s.total_errors());
    }
    let _ = std::fs::remove_file(&path);
});
