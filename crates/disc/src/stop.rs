//! Stopping a tier from another thread: an eventfd the tier's loop waits on.

use std::cell::Cell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use iolab_runtime::Cond;

pub struct Stop {
    fd: OwnedFd,
    flag: AtomicBool,
}

impl Stop {
    pub fn new() -> std::io::Result<Arc<Stop>> {
        // SAFETY: eventfd(2) with constant flags; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Arc::new(Stop {
            // SAFETY: fd is a new descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            flag: AtomicBool::new(false),
        }))
    }

    pub fn trigger(&self) {
        self.flag.store(true, Ordering::SeqCst);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    pub fn is_triggered(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// On the current runtime loop: a flag and a condition broadcast once triggered.
    pub fn watch(self: &Arc<Self>) -> (Rc<Cell<bool>>, Cond) {
        let (flag, cond) = (Rc::new(Cell::new(false)), Cond::new());
        let (f, c, me) = (flag.clone(), cond.clone(), self.clone());
        iolab_runtime::spawn(async move {
            while !me.is_triggered() {
                if iolab_runtime::wait_readable(me.fd.as_raw_fd())
                    .await
                    .is_err()
                {
                    iolab_runtime::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
            f.set(true);
            c.broadcast();
        });
        (flag, cond)
    }
}
