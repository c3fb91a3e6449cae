//! A fio run's memory is O(requests in flight), not O(requests): its own test binary, so no
//! other test's allocations share the process while it measures.

use iolab_disksim::engine::{ConstantDevice, Simulator};
use iolab_disksim::fio;

/// The process's peak resident set (VmHWM), KiB.
fn peak_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// 4 M null-engine reads (a second of simulated fio): the peak RSS grows by well under the
/// 32 MB that keeping each latency (8 B) took before.
#[test]
fn a_long_job_keeps_no_per_request_state() {
    let jf = fio::parse(
        "[n]\nioengine=null\nrw=randread\nnorandommap\nsize=16g\nio_size=16g\n",
        false,
    )
    .unwrap();
    let mut src = fio::FioSource::new(&jf, 0, 1 << 36).unwrap();
    let mut stats = fio::JobStats::new(&src);
    let before = peak_kib();
    let mut sim = Simulator::new(vec![Box::new(ConstantDevice::new(0.01))]);
    let t = sim
        .run_streams(&mut src, &mut |c, s| stats.add(c, s))
        .unwrap();
    let r = stats.results();
    let grown = peak_kib().saturating_sub(before);
    assert_eq!(t.requests, 4 << 20);
    assert_eq!(r[0].read.ios, 4 << 20);
    assert!(
        grown < 8 << 10,
        "peak RSS grew {grown} KiB over 4 M requests"
    );
}
