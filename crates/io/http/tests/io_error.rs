//! A real I/O error becomes a 500 and the connection goes on. Alone in its own test binary
//! because it lowers the process's file-descriptor limit, which would break tests running
//! beside it.

mod common;

use common::*;

#[test]
fn open_failing_with_emfile_is_500_and_keeps_the_connection() {
    let f = Fixture::new();
    let mut s = f.session();
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `old` is a valid rlimit to write into.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) }, 0);
    // The lowest free descriptor (open returns the lowest): with the limit set to it, the
    // next open fails with EMFILE.
    let lowest = {
        use std::os::fd::AsRawFd;
        std::fs::File::open("/dev/null").unwrap().as_raw_fd()
    };
    let low = libc::rlimit {
        rlim_cur: lowest as libc::rlim_t,
        rlim_max: old.rlim_max,
    };
    // SAFETY: valid rlimit; lowering the soft limit only.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
    let (st, rs) = exchange(&mut s, b"GET /sub/data.json HTTP/1.1\r\nHost: t\r\n\r\n");
    // SAFETY: restores the limit read above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) }, 0);
    assert_eq!(st, vec![500]);
    assert_eq!(rs[0].body, b"500 Internal Server Error\n");
    assert!(!rs[0].closes() && !s.should_close());
    let (st, rs) = exchange(&mut s, b"GET /sub/data.json HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(st, vec![200]);
    assert_eq!(rs[0].body, b"{}");
}
