//! Stopping a tier from another thread: an eventfd the tier's loop waits on.

use std::cell::Cell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use iolab_runtime::net::{TcpListener, TcpStream};
use iolab_runtime::{Cancelled, Cond};

pub struct Stop {
    fd: OwnedFd,
    flag: AtomicBool,
}

impl Stop {
    pub fn new() -> std::io::Result<Arc<Stop>> {
        // SAFETY: eventfd(2) with constant flags; the result is checked before use.
        let fd =
            iolab_sys::cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
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
    pub fn watch(self: &Arc<Self>) -> Watch {
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
        Watch { flag, cond }
    }
}

/// A tier loop's view of its [`Stop`].
pub struct Watch {
    flag: Rc<Cell<bool>>,
    cond: Cond,
}

impl Watch {
    pub fn stopped(&self) -> bool {
        self.flag.get()
    }

    /// The condition broadcast when the stop fires (to cancel other waits).
    pub fn cond(&self) -> &Cond {
        &self.cond
    }

    /// The next connection on `l`, or None once stopped. The flag is checked before every
    /// wait because a [`Cond`] broadcast is not remembered: a stop that fired while the
    /// loop was between two accepts (handling the last connection) was lost, and the FE
    /// waited for connections forever (seen in CI, where the tier threads of a chain are
    /// joined after the stop). Errors other than the stop are returned.
    pub async fn accept(
        &self,
        l: &TcpListener,
    ) -> std::io::Result<Option<(TcpStream, std::net::SocketAddr)>> {
        if self.stopped() {
            return Ok(None);
        }
        match l.accept_or_cancel(&self.cond).await {
            Ok(c) => Ok(Some(c)),
            Err(e) if Cancelled::is(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The race, made deterministic: the stop fires and its broadcast happens while the
    /// loop waits on nothing (here: before its first accept). An accept_or_cancel on the
    /// condition alone would wait forever; `Watch::accept` returns at once.
    #[test]
    fn a_stop_that_fired_between_two_accepts_is_not_lost() {
        let rt = iolab_runtime::Runtime::builder()
            .workers(1)
            .build()
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stop = Stop::new().unwrap();
        let r = rt.block_on(async move {
            let l = TcpListener::from_std(listener).unwrap();
            let w = stop.watch();
            stop.trigger();
            // Let the watch task see the trigger and broadcast to no one.
            while !w.stopped() {
                iolab_runtime::sleep(std::time::Duration::from_millis(1)).await;
            }
            assert_eq!(w.cond().waiters(), 0, "the broadcast reached no waiter");
            let t0 = std::time::Instant::now();
            let got = iolab_runtime::timeout(std::time::Duration::from_secs(5), w.accept(&l))
                .await
                .expect("returned before the timeout");
            (got.unwrap().is_none(), t0.elapsed())
        });
        assert!(r.0, "stopped: no connection");
        assert!(r.1 < std::time::Duration::from_secs(1), "{:?}", r.1);
    }
}
