//! `IOLAB_ODB_TRACE=DIR`: one line per intercepted call on a domain socket, in
//! `DIR/trace-<pid>.log` (for hunting lost bytes and wake-ups; costly, off by default).

use crate::FdState;
use libc::c_int;
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};

static FD: AtomicI32 = AtomicI32::new(-2);

fn fd() -> c_int {
    let f = FD.load(Relaxed);
    if f != -2 {
        return f;
    }
    let mut out = -1;
    if let Some(dir) = std::env::var_os("IOLAB_ODB_TRACE") {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let p = std::path::Path::new(&dir).join(format!("trace-{pid}.log"));
        if let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) {
            // SAFETY: a NUL-terminated path; the fd is kept for the process's life.
            out = unsafe {
                libc::open(
                    c.as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC,
                    0o666,
                )
            };
        }
    }
    FD.store(out, Relaxed);
    out
}

fn line(s: &str) {
    let f = fd();
    if f >= 0 {
        // SAFETY: writes our own buffer to our own fd.
        unsafe { libc::write(f, s.as_ptr().cast(), s.len()) };
    }
}

pub(crate) fn call(op: &str, fd_: c_int, asked: usize, r: &Result<usize, c_int>, fs: &FdState) {
    if FD.load(Relaxed) == -1 {
        return;
    }
    line(&format!(
        "{op} fd={fd_} asked={asked} -> {r:?} in={:?} out={:?} pending={}\n",
        fs.rx.frame(),
        fs.tx.frame(),
        fs.tx.pending().len()
    ));
}
