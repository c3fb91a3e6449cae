//! The machine a result was measured on: kernel, CPU, and the settings that decide the
//! figures (sysctls, limits). Recorded with every result, as the seeds' method asks; the
//! probe is iolab-sys's, shared with the lab.

pub use iolab_sys::host::{Machine, SYSCTLS};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_kernel_and_cpus() {
        let m = Machine::collect();
        assert!(!m.kernel.is_empty());
        assert!(m.cpus >= 1);
        assert!(m.nofile_soft > 0);
        assert!(m.sysctls.contains_key("net.core.somaxconn"));
    }
}
