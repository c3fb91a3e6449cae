//! I/O drivers: io_uring (completion) and epoll (readiness), behind one API.

use std::fmt;
use std::io;
use std::sync::OnceLock;
use std::time::Duration;

pub(crate) mod epoll;
pub(crate) mod uring;

/// Which I/O engine a runtime uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Driver {
    /// Completion-based: operations are submitted to an io_uring and complete later.
    Uring,
    /// Readiness-based fallback: epoll says when a descriptor is ready, then the syscall runs.
    Epoll,
}

impl Driver {
    pub fn name(self) -> &'static str {
        match self {
            Driver::Uring => "io_uring",
            Driver::Epoll => "epoll",
        }
    }
}

impl fmt::Display for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

static CHOICE: OnceLock<Result<Driver, String>> = OnceLock::new();

/// The process-wide driver: `IOLAB_DRIVER=uring|epoll` forces one; otherwise io_uring when a
/// ring can be created and has every opcode the runtime uses, else epoll (ENOSYS, EPERM,
/// `kernel.io_uring_disabled`, old kernel). Decided once, logged once to stderr.
pub fn driver() -> io::Result<Driver> {
    choose()
}

pub(crate) fn choose() -> io::Result<Driver> {
    CHOICE
        .get_or_init(|| {
            let forced = std::env::var("IOLAB_DRIVER").unwrap_or_default();
            let (choice, why) = match forced.trim().to_ascii_lowercase().as_str() {
                "" | "auto" => match uring::probe() {
                    Ok(()) => (Ok(Driver::Uring), "available".to_string()),
                    Err(e) => (Ok(Driver::Epoll), format!("io_uring unavailable: {e}")),
                },
                "uring" | "io_uring" | "io-uring" => match uring::probe() {
                    Ok(()) => (Ok(Driver::Uring), "forced by IOLAB_DRIVER".to_string()),
                    Err(e) => (
                        Err(format!(
                            "IOLAB_DRIVER={forced} but io_uring is unavailable: {e}"
                        )),
                        String::new(),
                    ),
                },
                "epoll" => (Ok(Driver::Epoll), "forced by IOLAB_DRIVER".to_string()),
                other => (
                    Err(format!(
                        "IOLAB_DRIVER={other:?} is not a driver; use uring or epoll"
                    )),
                    String::new(),
                ),
            };
            match &choice {
                Ok(d) => tracing::info!("iolab-runtime: driver {d} ({why})"),
                Err(e) => tracing::error!("iolab-runtime: {e}"),
            }
            choice
        })
        .clone()
        .map_err(io::Error::other)
}

/// Names one operation record (or readiness waiter) of one loop's driver. The loop id is
/// unique in the process (never reused, even after a runtime is dropped) and the generation
/// unique within the loop, so a key used on another loop, or after its record was freed and
/// the slot reused, is detected ([`KeyError`]) instead of reaching another operation's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpKey {
    pub(crate) loop_id: u64,
    pub(crate) index: usize,
    pub(crate) gen: u64,
}

/// Misuse of an operation or timer key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// Polled on a loop other than the one that started it (another runtime or worker).
    OtherLoop,
    /// Its record was already freed (and the slot perhaps reused).
    Stale,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyError::OtherLoop => {
                "an I/O operation or timer was polled on another loop than the one it started \
                 on (it belongs to its first loop: do not move a started future to another \
                 runtime or worker)"
            }
            KeyError::Stale => "an operation key was used after its record was freed",
        })
    }
}

/// Work the driver found during a turn that runs user code: wakers to wake and completed
/// operations whose futures were dropped (their `orphaned` callback, then their drop). The
/// core runs it after releasing its borrow of the driver, so that code may use the runtime.
#[derive(Default)]
pub(crate) struct Deferred {
    pub(crate) wakers: Vec<std::task::Waker>,
    pub(crate) orphans: Vec<(Box<dyn uring::OpData>, i32)>,
}

impl Deferred {
    pub(crate) fn is_empty(&self) -> bool {
        self.wakers.is_empty() && self.orphans.is_empty()
    }

    /// Wakes, calls the orphan callbacks and drops their data; leaves the vectors empty
    /// (capacity kept for reuse).
    pub(crate) fn run(&mut self) {
        for w in self.wakers.drain(..) {
            w.wake();
        }
        for (mut data, res) in self.orphans.drain(..) {
            data.orphaned(res);
        }
    }
}

/// The driver of the loop the caller runs on. Panics outside a runtime.
pub fn current_driver() -> Driver {
    crate::rt::with_core(|c| c.driver.borrow().kind())
}

// One driver per loop, never moved in a hot path: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum IoDriver {
    Uring(uring::Uring),
    Epoll(epoll::Epoll),
}

impl IoDriver {
    pub(crate) fn new(
        kind: Driver,
        efd: i32,
        loop_id: u64,
        simulate_eagain: bool,
    ) -> io::Result<IoDriver> {
        Ok(match kind {
            Driver::Uring => IoDriver::Uring(uring::Uring::new(efd, loop_id, simulate_eagain)?),
            Driver::Epoll => IoDriver::Epoll(epoll::Epoll::new(efd, loop_id)?),
        })
    }

    pub(crate) fn kind(&self) -> Driver {
        match self {
            IoDriver::Uring(_) => Driver::Uring,
            IoDriver::Epoll(_) => Driver::Epoll,
        }
    }

    /// Submits what is queued and collects completions / readiness, waiting at most
    /// `timeout` (None: until something happens).
    pub(crate) fn turn(&mut self, timeout: Option<Duration>) {
        match self {
            IoDriver::Uring(u) => u.turn(timeout),
            IoDriver::Epoll(e) => e.turn(timeout),
        }
    }

    /// Moves the user code found so far (wakers, orphan callbacks) into `into`, which the
    /// caller runs once it has released the driver.
    pub(crate) fn take_deferred(&mut self, into: &mut Deferred) {
        let mine = match self {
            IoDriver::Uring(u) => &mut u.deferred,
            IoDriver::Epoll(e) => &mut e.deferred,
        };
        if !mine.is_empty() {
            std::mem::swap(mine, into);
        }
    }

    pub(crate) fn live_ops(&self) -> usize {
        match self {
            IoDriver::Uring(u) => u.live_ops(),
            IoDriver::Epoll(e) => e.live_ops(),
        }
    }

    /// Lets the kernel finish with every operation whose future is gone (io_uring; on epoll
    /// nothing is in the kernel) and returns the records left: still live, or given up on
    /// and leaked by the driver. 0 when every operation was freed.
    pub(crate) fn shutdown(&mut self) -> usize {
        match self {
            IoDriver::Uring(u) => u.shutdown(),
            IoDriver::Epoll(e) => e.live_ops(),
        }
    }
}
