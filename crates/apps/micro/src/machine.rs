//! The machine a result was measured on: kernel, CPU, and the settings that decide the
//! figures (sysctls, limits). Recorded with every result, as the seeds' method asks; the
//! probe is iolab-sys's, shared with the lab.

pub use iolab_sys::host::{Machine, SYSCTLS};
