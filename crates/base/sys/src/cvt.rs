//! The one conversion of a libc return value into `io::Result`, and [`syscall!`](crate::syscall)
//! on top of it.
//!
//! The kernel interface reports failure as a negative return value (`-1`, the error in
//! `errno`); every plumbing call goes through [`cvt`] so that the check and the `errno` read
//! are written once. Calls that are the subject of a crate (a server's accept loop, a
//! runtime driver, a packet path) may still write their check inline where that is clearer.

use std::io;

/// A signed integer a libc function returns, negative on failure (`c_int`, `ssize_t`,
/// `off_t`, `pid_t`, ...).
pub trait SyscallReturn: Copy {
    /// True when the value reports a failure (it is negative).
    fn is_failure(self) -> bool;
}

macro_rules! impl_syscall_return {
    ($($t:ty),*) => {$(
        impl SyscallReturn for $t {
            fn is_failure(self) -> bool {
                self < 0
            }
        }
    )*};
}
impl_syscall_return!(i8, i16, i32, i64, isize);

/// `Ok(rc)` for a non-negative libc return value, else the `errno` of this thread as an
/// `io::Error`. Call it right after the libc function: anything in between may change `errno`.
///
/// ```
/// // SAFETY: getpid has no preconditions.
/// let pid = iolab_sys::cvt(unsafe { libc::getpid() }).unwrap();
/// assert!(pid > 0);
/// // A byte count: `cvt(unsafe { libc::read(fd, buf, len) })? as usize`.
/// ```
pub fn cvt<T: SyscallReturn>(rc: T) -> io::Result<T> {
    if rc.is_failure() {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// `syscall!(close(fd))` is `cvt(unsafe { libc::close(fd) })`: the libc call, its failure
/// check and `errno`, in one expression of type `io::Result<_>`.
///
/// The `unsafe` is inside the macro, where clippy's `undocumented_unsafe_blocks` cannot see
/// it: write the `// SAFETY:` comment on the line above each `syscall!`, as for an `unsafe`
/// block (the project's rule is the same).
///
/// ```
/// // SAFETY: getppid has no preconditions.
/// let parent = iolab_sys::syscall!(getppid()).unwrap();
/// assert!(parent > 0);
/// ```
#[macro_export]
macro_rules! syscall {
    ($fn:ident ( $($arg:expr),* $(,)? )) => {
        {
            // The arguments are evaluated inside the unsafe block: the caller's SAFETY
            // comment covers the whole call, as for `cvt(unsafe { libc::f(args) })`.
            #[allow(
                unused_unsafe,
                clippy::undocumented_unsafe_blocks,
                clippy::macro_metavars_in_unsafe
            )]
            let rc = unsafe { $crate::libc::$fn($($arg),*) };
            $crate::cvt(rc)
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_is_the_errno_and_the_rest_passes_through() {
        assert_eq!(cvt(0i32).unwrap(), 0);
        assert_eq!(cvt(7isize).unwrap(), 7);
        assert_eq!(cvt(i64::MAX).unwrap(), i64::MAX);
        // SAFETY: close(-1) touches no descriptor; it fails with EBADF.
        let e = crate::syscall!(close(-1)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
        // SAFETY: dup of stdin returns a new descriptor we close at once.
        let fd = crate::syscall!(dup(0)).unwrap();
        // SAFETY: fd is ours, from dup above.
        crate::syscall!(close(fd)).unwrap();
    }
}
