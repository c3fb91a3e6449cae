//! Small helpers that several iolab crates need, in one place rather than copied:
//!
//! - [`anon`]: an owned private anonymous memory mapping;
//! - [`fdlimit`]: raise the open-files limit (`RLIMIT_NOFILE`);
//! - [`cpu`]: pin the calling thread (or a child between fork and exec) to one CPU;
//! - [`sockaddr`]: `std::net::SocketAddr` to and from the kernel's `sockaddr_storage`;
//! - [`percentile`]: nearest-rank percentiles and medians of samples;
//! - [`testing`]: the test policy for external tools (nginx, wrk, curl, chromium): skip
//!   with one clear line outside CI, fail under `CI=true`.
//!
//! It depends on `libc` only, so every crate (the runtime included) can use it.

pub mod anon;
pub mod cpu;
pub mod fdlimit;
pub mod percentile;
pub mod sockaddr;
pub mod testing;

pub use anon::AnonMap;
pub use cpu::pin_current_thread;
pub use fdlimit::raise_nofile_limit;
