//! What `calibrate` writes: the measured-device config the simulator reads, and the table
//! it prints.

use super::{fitted_points, CalPoint, Calibration};

/// The measured-device config (TOML) `run --config` reads.
pub fn config_toml(c: &Calibration) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "# Written by `iolab disksim calibrate{}` ({:.0} s) on {} ({}).\n",
        if c.quick { " --quick" } else { "" },
        c.seconds,
        c.host.disk.as_deref().unwrap_or("unknown device"),
        c.fio
    ));
    s.push_str(&format!(
        "# seek profile: {}\n# write cache: {}\n",
        c.seek_verdict, c.write_cache.verdict
    ));
    s.push_str("# host settings (the simulator reads these from the machine it runs on; recorded here for reference):\n");
    for k in [
        "scheduler",
        "rotational",
        "read_ahead_kb",
        "max_sectors_kb",
        "nr_requests",
        "write_cache",
        "fua",
    ] {
        if let Some(v) = c.host.queue.get(k) {
            s.push_str(&format!("#   queue/{k} = {v}\n"));
        }
    }
    for (k, v) in &c.host.vm {
        s.push_str(&format!("#   vm.{k} = {v}\n"));
    }
    if let Some(m) = c.host.mem_total_bytes {
        s.push_str(&format!("#   MemTotal = {m} bytes\n"));
    }
    let qd = c.points.iter().map(|p| p.qd).max().unwrap_or(1);
    let gib = c.host.device_bytes.map(|b| (b >> 30).max(1)).unwrap_or(64);
    let flush = c.write_cache.flush_us();
    let datasync_flush = c.write_cache.datasync_flush_us();
    s.push_str(&format!(
        "\n# latency_us: a robust affine fit in size of the measured means per op, pattern and queue\n# depth (Theil-Sen; the raw means are in the --json output and the printed table).\n[device]\nkind = \"measured\"\n\n[measured]\nqueue_depth = {qd}\ncapacity_gib = {gib}\n# a cache flush: a 4 KiB write followed by fsync, less the plain write (µs)\nflush_us = {flush:.1}\n# fdatasync's and O_DSYNC's flush (no journal commit): an O_DSYNC write less the plain one (µs)\ndatasync_flush_us = {datasync_flush:.1}\npoints = [\n"
    ));
    let point = |p: &CalPoint| {
        format!(
            "  {{ op = \"{}\", pattern = \"{}\", size_kib = {}, qd = {}, latency_us = {:.1} }},\n",
            p.op, p.pattern, p.size_kib, p.qd, p.mean_us
        )
    };
    for p in &fitted_points(&c.points) {
        s.push_str(&point(p));
    }
    s.push_str("]\n");
    if !c.large_folio_points.is_empty() {
        s.push_str("# reads into the page cache's large folios: O_DIRECT into huge pages (the same fit)\nlarge_folio_points = [\n");
        for p in &fitted_points(&c.large_folio_points) {
            s.push_str(&point(p));
        }
        s.push_str("]\n");
    }
    let h = &c.host_cpu;
    let toml = |t: &[[f64; 2]]| format!("[{}]", join_table(t, |k, us| format!("[{k}, {us:.2}]")));
    s.push('\n');
    for (comment, key, value) in [
        (
            "buffered reads served by the page cache: [KiB, mean µs]\n[host_cpu]",
            "cached_read_us",
            toml(&h.cached_read_us),
        ),
        (
            "buffered writes into new page-cache pages: [KiB, mean µs]",
            "cached_write_us",
            toml(&h.cached_write_us),
        ),
        (
            "buffered 32 KiB reads by the cached set they go over: [MiB, mean µs]",
            "cached_set_us",
            toml(&h.cached_set_us),
        ),
        (
            "fio's own time between a completion and its next request (µs)",
            "app_gap_us",
            format!("{:.2}", h.app_gap_us),
        ),
        (
            "a read's cost per new 4 KiB folio it brings into the cache (µs)",
            "miss_folio_us",
            format!("{:.2}", h.miss_folio_us),
        ),
        (
            "what reclaiming room for it adds when the cache is full (µs)",
            "reclaim_folio_us",
            format!("{:.2}", h.reclaim_folio_us),
        ),
        (
            "POSIX_FADV_DONTNEED's cost per dirty page it sends to write-back (µs)",
            "dontneed_dirty_page_us",
            format!("{:.3}", h.dontneed_dirty_page_us),
        ),
    ] {
        s.push_str(&format!("# {comment}\n{key} = {value}\n"));
    }
    s
}

/// A (KiB, µs) table's entries as `item` formats them, comma-separated.
fn join_table(t: &[[f64; 2]], item: impl Fn(f64, f64) -> String) -> String {
    t.iter()
        .map(|[k, us]| item(*k, *us))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The table `calibrate` prints.
pub fn table(c: &Calibration) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "target {} ({} MiB, {}), {:.0} s\n",
        c.target,
        c.file_bytes >> 20,
        c.host.disk.as_deref().unwrap_or("?"),
        c.seconds
    ));
    let qds: Vec<u32> = {
        let mut v: Vec<u32> = c.points.iter().map(|p| p.qd).collect();
        v.sort();
        v.dedup();
        v
    };
    s.push_str(&format!("{:<6} {:<10} {:>8}", "op", "pattern", "size KiB"));
    for q in &qds {
        s.push_str(&format!(" {:>17}", format!("QD{q} µs | MB/s")));
    }
    s.push('\n');
    let mut keys: Vec<(String, String, u64)> = c
        .points
        .iter()
        .map(|p| (p.op.clone(), p.pattern.clone(), p.size_kib))
        .collect();
    keys.dedup();
    for (op, pat, kib) in keys {
        s.push_str(&format!("{op:<6} {pat:<10} {kib:>8}"));
        for q in &qds {
            match c
                .points
                .iter()
                .find(|p| p.op == op && p.pattern == pat && p.size_kib == kib && p.qd == *q)
            {
                Some(p) => s.push_str(&format!(" {:>9.0} | {:>5.0}", p.mean_us, p.mb_s)),
                None => s.push_str(&format!(" {:>17}", "-")),
            }
        }
        s.push('\n');
    }
    match (&c.large_folio_note, c.large_folio_points.is_empty()) {
        (Some(why), _) => s.push_str(&format!(
            "reads into huge pages (large folios): not measured: {why}\n"
        )),
        (None, true) => {}
        (None, false) => {
            s.push_str("reads into huge pages (large folios), µs | MB/s:");
            for p in &c.large_folio_points {
                s.push_str(&format!(
                    "\n  {:<10} {:>5} KiB QD{:<3} {:>7.0} | {:>5.0}",
                    p.pattern, p.size_kib, p.qd, p.mean_us, p.mb_s
                ));
            }
            s.push('\n');
        }
    }
    s.push_str("seek (4 KiB reads, QD1): ");
    s.push_str(
        &c.seek
            .iter()
            .map(|p| format!("{} KiB {:.0} µs", p.distance_kib, p.mean_us))
            .collect::<Vec<_>>()
            .join(", "),
    );
    s.push_str(&format!("\n  {}\n", c.seek_verdict));
    s.push_str(&format!(
        "write cache: {} (queue/write_cache = {}, fua = {})\n",
        c.write_cache.verdict,
        c.write_cache.volatile_cache.as_deref().unwrap_or("?"),
        c.write_cache.fua.as_deref().unwrap_or("?")
    ));
    let text = |t: &[[f64; 2]]| join_table(t, |k, us| format!("{k} KiB {us:.1}"));
    s.push_str(&format!(
        "buffered read from the page cache (µs by size): {}\nbuffered write into new pages (µs by size): {}; fio's time between I/Os {:.1} µs\nbuffered read of an uncached page, beyond O_DIRECT and the copy: {:.2} µs a 4 KiB folio, {:.2} more to reclaim room in a full memory cgroup; POSIX_FADV_DONTNEED {:.3} µs a dirty page\n",
        text(&c.host_cpu.cached_read_us),
        text(&c.host_cpu.cached_write_us),
        c.host_cpu.app_gap_us,
        c.host_cpu.miss_folio_us,
        c.host_cpu.reclaim_folio_us,
        c.host_cpu.dontneed_dirty_page_us
    ));
    if !c.host_cpu.cached_set_us.is_empty() {
        s.push_str(&format!(
            "buffered 32 KiB read by the cached set it goes over (µs): {}\n",
            join_table(&c.host_cpu.cached_set_us, |m, us| format!(
                "{m} MiB {us:.1}"
            ))
        ));
    }
    let q = |k: &str| c.host.queue.get(k).map(String::as_str).unwrap_or("?");
    s.push_str(&format!(
        "settings: scheduler {}, rotational {}, read_ahead_kb {}, max_sectors_kb {}, nr_requests {}; ",
        q("scheduler"),
        q("rotational"),
        q("read_ahead_kb"),
        q("max_sectors_kb"),
        q("nr_requests")
    ));
    s.push_str(
        &c.host
            .vm
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    s.push_str(&format!(
        "; MemTotal {} MiB{}\n",
        c.host.mem_total_bytes.unwrap_or(0) >> 20,
        c.host
            .cgroup_limit_bytes
            .map(|l| format!(", cgroup limit {} MiB", l >> 20))
            .unwrap_or_default()
    ));
    s
}
