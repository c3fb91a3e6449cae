//! Thin wrappers over the Linux calls the microbenchmarks need (affinity, scheduling policy,
//! rusage, /proc, accepting and resetting sockets). Each returns an `io::Result` so a refusal
//! (EPERM, EINVAL) is reported, not hidden; the libc results go through iolab-sys's `cvt`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use iolab_sys::cvt;

/// CPUs this process may run on, ascending (CPU 0 alone if the kernel will not say).
pub fn allowed_cpus() -> Vec<usize> {
    iolab_sys::cpu::allowed_cpus().unwrap_or_else(|_| vec![0])
}

/// Pins the calling thread to `cpu` (`iolab_sys::cpu`, shared by every crate).
pub use iolab_sys::pin_current_thread as pin_to;

/// Puts the calling thread under SCHED_FIFO at priority 1 (the lowest real-time priority).
pub fn set_fifo() -> io::Result<()> {
    let p = libc::sched_param { sched_priority: 1 };
    // SAFETY: the param struct is valid for the call; pid 0 = the calling thread.
    cvt(unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) }).map(drop)
}

/// Context switches and CPU time of a thread or process, from getrusage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub voluntary: u64,
    pub involuntary: u64,
    pub cpu_ns: u64,
}

impl Usage {
    pub fn from_rusage(r: &libc::rusage) -> Usage {
        let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
        Usage {
            voluntary: r.ru_nvcsw as u64,
            involuntary: r.ru_nivcsw as u64,
            cpu_ns: tv(r.ru_utime) + tv(r.ru_stime),
        }
    }

    pub fn since(self, earlier: Usage) -> Usage {
        Usage {
            voluntary: self.voluntary.saturating_sub(earlier.voluntary),
            involuntary: self.involuntary.saturating_sub(earlier.involuntary),
            cpu_ns: self.cpu_ns.saturating_sub(earlier.cpu_ns),
        }
    }

    pub fn plus(self, o: Usage) -> Usage {
        Usage {
            voluntary: self.voluntary + o.voluntary,
            involuntary: self.involuntary + o.involuntary,
            cpu_ns: self.cpu_ns + o.cpu_ns,
        }
    }

    pub fn switches(self) -> u64 {
        self.voluntary + self.involuntary
    }
}

fn rusage(who: libc::c_int) -> Usage {
    // SAFETY: getrusage writes into the zeroed struct we pass; it cannot fail for these `who`.
    unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut r);
        Usage::from_rusage(&r)
    }
}

pub use iolab_sys::cpu::thread_cpu_ns;

/// Usage of the calling thread.
pub fn thread_usage() -> Usage {
    rusage(libc::RUSAGE_THREAD)
}

/// Usage of the whole process.
pub fn process_usage() -> Usage {
    rusage(libc::RUSAGE_SELF)
}

/// Resident set size of this process in KiB (VmRSS), 0 if unreadable.
pub fn rss_kib() -> u64 {
    status_field("VmRSS:")
}

/// Peak resident set size of this process in KiB (VmHWM), 0 if unreadable.
pub fn hwm_kib() -> u64 {
    status_field("VmHWM:")
}

fn status_field(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Raises the soft RLIMIT_NOFILE towards `want` (`iolab_sys::fdlimit`).
pub use iolab_sys::fdlimit::raise_nofile_to as raise_nofile;

/// The thread id of the caller.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Accepts one connection on the listener `l` (close-on-exec).
pub fn accept(l: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: accept4 on our listener; the new fd is owned by the result.
    let fd = cvt(unsafe {
        libc::accept4(
            l,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    })?;
    // SAFETY: fresh fd from accept4.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes `close` of `fd` send a reset: no TIME_WAIT left behind.
pub fn set_linger_rst(fd: &OwnedFd) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: l is a valid linger struct for the call.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_arithmetic() {
        let a = Usage {
            voluntary: 10,
            involuntary: 2,
            cpu_ns: 100,
        };
        let b = Usage {
            voluntary: 4,
            involuntary: 1,
            cpu_ns: 40,
        };
        assert_eq!(
            a.since(b),
            Usage {
                voluntary: 6,
                involuntary: 1,
                cpu_ns: 60
            }
        );
        assert_eq!(b.since(a), Usage::default());
        assert_eq!(a.plus(b).switches(), 17);
    }

    #[test]
    fn affinity_and_proc() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        let cpu = cpus[0];
        std::thread::spawn(move || pin_to(cpu))
            .join()
            .unwrap()
            .unwrap();
        assert!(pin_to(usize::MAX).is_err());
        assert!(rss_kib() > 0);
        assert!(hwm_kib() >= rss_kib());
        assert!(gettid() > 0);
        let c0 = thread_cpu_ns();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(thread_cpu_ns() > c0, "{x}");
    }
}
