//! Small helpers that several iolab crates need, in one place rather than copied:
//!
//! - [`anon`]: an owned private anonymous memory mapping;
//! - [`fdlimit`]: raise the open-files limit (`RLIMIT_NOFILE`);
//! - [`cpu`]: pin the calling thread (or a child between fork and exec) to one CPU;
//! - [`sockaddr`]: `std::net::SocketAddr` to and from the kernel's `sockaddr_storage`;
//! - [`percentile`]: the one nearest-rank percentile and the one median of samples;
//! - [`cvt`](mod@cvt) and [`syscall!`]: a libc return value to `io::Result`;
//! - [`process`]: is-root, signals, terminate a child or a process group, die with the
//!   parent, enter a network namespace before exec;
//! - [`host`]: the host probe (kernel, CPU, memory, cgroup limits, sysctls, block devices) and
//!   [`host::Machine`], the record of it results carry;
//! - [`units`]: sizes (`256K`, `0x1000`) and durations (`500ms`, `2m`);
//! - [`zram`]: a zram block device with ext4 mounted on it, removed when dropped;
//! - [`testing`]: the test policy for external tools (nginx, wrk, curl, chromium): skip
//!   with one clear line outside CI, fail under `CI=true`; and what tests need (a free port,
//!   a scratch directory, reproducible bytes).
//!
//! It depends on `libc` only (and `serde`, with the feature of that name, for
//! [`host::Machine`]), so every crate (the runtime included) can use it.

pub mod anon;
pub mod cpu;
pub mod cvt;
pub mod fdlimit;
pub mod host;
pub mod percentile;
pub mod process;
pub mod sockaddr;
pub mod testing;
pub mod units;
pub mod zram;

pub use cvt::cvt;
/// For [`syscall!`]: the macro names `libc` through this crate, so a caller need not.
#[doc(hidden)]
pub use libc;

pub use anon::AnonMap;
pub use cpu::pin_current_thread;
pub use fdlimit::raise_nofile_limit;
