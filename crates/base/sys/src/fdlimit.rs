//! The open-files limit. Servers holding 10,000 connections, load generators opening as many,
//! and the lab (whose children inherit it) all need more than the usual soft limit of 1024.

use std::io;

// rlim_t is u64 on Linux (glibc and musl, every architecture), so limits are plain u64.

fn get() -> io::Result<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own and pass by pointer.
    crate::cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) })?;
    Ok(lim)
}

fn set(lim: &libc::rlimit) -> io::Result<()> {
    // SAFETY: setrlimit only reads the struct we pass by pointer.
    crate::cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, lim) })?;
    Ok(())
}

/// The soft and hard `RLIMIT_NOFILE` of this process.
pub fn nofile_limit() -> io::Result<(u64, u64)> {
    let lim = get()?;
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (no privilege needed).
/// Returns `(before, after)`: the soft limit found and the one now in force. Children started
/// afterwards inherit it.
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    let mut lim = get()?;
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        set(&lim)?;
    }
    Ok((before, lim.rlim_cur))
}

/// Raises the soft `RLIMIT_NOFILE` towards `want`: beyond the hard limit too when the process
/// may (CAP_SYS_RESOURCE), else up to the hard limit. Never lowers it. Returns the soft limit
/// in force (0 if it cannot even be read).
pub fn raise_nofile_to(want: u64) -> u64 {
    let Ok(lim) = get() else { return 0 };
    if lim.rlim_cur >= want {
        return lim.rlim_cur;
    }
    let beyond = libc::rlimit {
        rlim_cur: want,
        rlim_max: lim.rlim_max.max(want),
    };
    if set(&beyond).is_ok() {
        return want;
    }
    let capped = libc::rlimit {
        rlim_cur: want.min(lim.rlim_max),
        rlim_max: lim.rlim_max,
    };
    if set(&capped).is_ok() {
        return capped.rlim_cur;
    }
    lim.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raise_reaches_the_hard_limit_and_never_lowers() {
        let (soft, hard) = nofile_limit().unwrap();
        assert!(soft <= hard);
        let (before, after) = raise_nofile_limit().unwrap();
        assert_eq!(before, soft);
        assert_eq!(after, hard);
        assert_eq!(nofile_limit().unwrap().0, hard);
        // Asking for less than the limit in force keeps it.
        assert_eq!(raise_nofile_to(1), hard);
        assert_eq!(nofile_limit().unwrap().0, hard);
    }
}
