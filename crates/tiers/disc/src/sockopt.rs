//! Socket options read and set as plain bytes (`getsockopt(2)`, `setsockopt(2)`), and the
//! `sockaddr_in` the raw calls take.
//!
//! Invariant: only [`Plain`] values cross: integers, arrays and slices of them and repr(C)
//! structs of them without padding or pointers, so the kernel reads initialised bytes and
//! nothing behind them, and any bytes it writes back are a valid value. Options whose value
//! points elsewhere (`SO_ATTACH_FILTER`'s program) are set at their call site.

use std::io;
use std::os::fd::RawFd;

/// Types whose bytes are all initialised and any bytes are a valid value of, with no
/// pointers in them.
///
/// # Safety
/// Implement only for such types.
pub unsafe trait Plain {}

// SAFETY: an integer: every byte initialised, every bit pattern a value, no pointer.
unsafe impl Plain for u32 {}
// SAFETY: as u32.
unsafe impl Plain for i32 {}
// SAFETY: Plain elements laid out with no padding between them (size is a multiple of
// alignment).
unsafe impl<T: Plain, const N: usize> Plain for [T; N] {}
// SAFETY: as arrays.
unsafe impl<T: Plain> Plain for [T] {}

/// The `sockaddr_in` of an IPv4 address and port (both in network byte order).
pub fn sockaddr_in(a: std::net::SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Sets option `name` at `level` to the bytes of `v`.
pub fn set<T: Plain + ?Sized>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: &T,
) -> io::Result<()> {
    // SAFETY: setsockopt reads size_of_val(v) initialised bytes from `v` (Plain), alive for
    // the call.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (v as *const T).cast(),
            std::mem::size_of_val(v) as libc::socklen_t,
        )
    };
    iolab_sys::cvt(r).map(drop)
}

/// Offset of `tcpi_snd_wnd` (Linux 5.19) in `struct tcp_info`, past the fields libc's struct
/// has (include/uapi/linux/tcp.h: after tcpi_rcv_ooopack; it was once read at 236,
/// tcpi_rehash, always 0 — DP then assumed a 64 KiB window and sent a 64 KiB answer in
/// three bursts, one more wait for an ACK).
pub const TCPI_SND_WND: usize = 228;

/// The u32 at byte `at` of a struct read as bytes by [`get_bytes`], whose first `len` bytes
/// the kernel wrote; None for a field past them (an older kernel's shorter struct).
pub fn u32_at(buf: &[u8], len: usize, at: usize) -> Option<u32> {
    let field = buf.get(at..(at + 4).min(len))?;
    Some(u32::from_ne_bytes(field.try_into().ok()?))
}

/// Reads option `name` at `level` into `buf` (a struct read as bytes: older kernels return
/// shorter ones); returns the length the kernel wrote.
pub fn get_bytes(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    buf: &mut [u8],
) -> io::Result<usize> {
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `buf` and the length into `len`,
    // both alive for the call.
    let r = unsafe { libc::getsockopt(fd, level, name, buf.as_mut_ptr().cast(), &mut len) };
    iolab_sys::cvt(r)?;
    Ok(len as usize)
}

/// Reads option `name` at `level` as a `T`.
pub fn get<T: Plain + Default>(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<T> {
    let mut v = T::default();
    // SAFETY: T is Plain (any bytes are a valid value), so its storage may be written as
    // bytes; the slice covers exactly `v`, alive and not otherwise borrowed.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut((&mut v as *mut T).cast::<u8>(), std::mem::size_of::<T>())
    };
    get_bytes(fd, level, name, bytes)?;
    Ok(v)
}
