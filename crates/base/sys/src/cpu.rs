//! CPU affinity: the lab, the load generator, the runtime and the microbenchmarks pin server
//! and client to different cores so they do not measure each other's scheduling.

use std::io;

/// Pins the calling thread to CPU `cpu`.
///
/// Async-signal-safe (no allocation, no lock; an out-of-range `cpu` is `EINVAL` as a raw OS
/// error), so it may also be called in a `Command::pre_exec` closure to pin a child before it
/// runs its program.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: all-zero bytes are a valid (empty) cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: cpu < CPU_SETSIZE (checked above), so CPU_SET writes inside the set.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; the kernel reads size_of::<cpu_set_t>() bytes from
    // the set we own.
    crate::cvt(unsafe {
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    })?;
    Ok(())
}

/// CPU time (user + system) consumed by the calling thread, in ns. Unlike wall time it does
/// not grow while the thread waits for a CPU, which matters on a shared machine.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass; CLOCK_THREAD_CPUTIME_ID
    // always exists on Linux, so the call cannot fail and leave it unwritten.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The CPUs the calling thread may run on, ascending.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: all-zero bytes are a valid (empty) cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes at most size_of::<cpu_set_t>() bytes into the set we own.
    crate::cvt(unsafe {
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set)
    })?;
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: c < CPU_SETSIZE, so CPU_ISSET reads inside the set.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Parses a CPU list as taskset and the kernel write it: `0-3,8,10-11` (sorted, each CPU
/// once). The error says which part is wrong.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let cpu = |x: &str| {
            x.parse::<usize>()
                .map_err(|e| format!("CPU list {s:?}: {part:?} is not a CPU or a range: {e}"))
        };
        let (a, b) = (cpu(a)?, cpu(b)?);
        if a > b || b >= libc::CPU_SETSIZE as usize {
            return Err(format!("CPU list {s:?}: bad range {part:?}"));
        }
        v.extend(a..=b);
    }
    v.sort_unstable();
    v.dedup();
    if v.is_empty() {
        return Err(format!("CPU list {s:?} is empty"));
    }
    Ok(v)
}

/// One CPU's time counters from `/proc/stat`, in clock ticks (USER_HZ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    /// Time the hypervisor ran something else while this virtual CPU wanted to run.
    pub steal: u64,
    /// All states together (user, nice, system, idle, iowait, irq, softirq, steal).
    pub total: u64,
}

impl CpuTimes {
    /// CPU `cpu`'s counters now (None: all CPUs together); None where `/proc/stat` has no
    /// such line.
    pub fn read(cpu: Option<usize>) -> Option<CpuTimes> {
        CpuTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?, cpu)
    }

    /// CPU `cpu`'s counters (None: all CPUs together) in a `/proc/stat` text.
    pub fn parse(stat: &str, cpu: Option<usize>) -> Option<CpuTimes> {
        let name = match cpu {
            Some(c) => format!("cpu{c}"),
            None => "cpu".to_string(),
        };
        let line = stat
            .lines()
            .find(|l| l.split_ascii_whitespace().next() == Some(name.as_str()))?;
        let f: Vec<u64> = line
            .split_ascii_whitespace()
            .skip(1)
            .take(8)
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        // Kernels before 2.6.11 have no steal field.
        let steal = f.get(7).copied().unwrap_or(0);
        Some(CpuTimes {
            steal,
            total: f.iter().sum(),
        })
    }

    /// The share of the time since `earlier` that the hypervisor took, in percent; None
    /// when no tick passed.
    pub fn steal_pct_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total).filter(|&t| t > 0)?;
        Some(100.0 * self.steal.saturating_sub(earlier.steal) as f64 / total as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,8").unwrap(), vec![0, 1, 2, 3, 8]);
        assert_eq!(parse_cpu_list("1, 1,0").unwrap(), vec![0, 1]);
        for bad in ["", "a", "3-1", "1-x", "99999"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn steal_is_read_from_proc_stat() {
        let a =
            "cpu  1 2 3 4 5 6 7 8 0 0\ncpu0 10 0 10 70 0 0 0 10 0 0\ncpu1 1 1 1 1 1 1 1 1 0 0\n";
        let b = "cpu0 20 0 20 130 0 0 0 30 0 0\ncpu10 0 0 0 0 0 0 0 0 0 0\n";
        let (t0, t1) = (
            CpuTimes::parse(a, Some(0)).unwrap(),
            CpuTimes::parse(b, Some(0)).unwrap(),
        );
        assert_eq!(
            t0,
            CpuTimes {
                steal: 10,
                total: 100
            }
        );
        assert_eq!(t1.steal_pct_since(&t0), Some(20.0));
        assert_eq!(t0.steal_pct_since(&t0), None);
        assert_eq!(CpuTimes::parse(a, Some(1)).unwrap().total, 8);
        assert_eq!(
            CpuTimes::parse(a, None),
            Some(CpuTimes {
                steal: 8,
                total: 36
            })
        );
        assert_eq!(CpuTimes::parse(b, Some(1)), None, "cpu10 is not cpu1");
        assert_eq!(CpuTimes::parse(b, None), None);
        let short = "cpu0 1 2 3\n";
        assert_eq!(
            CpuTimes::parse(short, Some(0)),
            Some(CpuTimes { steal: 0, total: 6 })
        );
        assert_eq!(CpuTimes::parse("cpu0 1 x 3\n", Some(0)), None);
        let now = CpuTimes::read(Some(0)).expect("this machine's /proc/stat has cpu0");
        assert!(now.total > 0 && now.steal <= now.total);
    }

    #[test]
    fn pin_takes_effect_and_bad_cpus_are_refused() {
        std::thread::spawn(|| {
            let cpus = allowed_cpus().unwrap();
            let last = *cpus.last().unwrap();
            pin_current_thread(last).unwrap();
            assert_eq!(allowed_cpus().unwrap(), vec![last]);
            let e = pin_current_thread(libc::CPU_SETSIZE as usize).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        })
        .join()
        .unwrap();
    }
}
