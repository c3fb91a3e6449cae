//! The exported calls (what `LD_PRELOAD` puts in front of libc's): each hands a domain
//! socket to ODB (`recv`, `send`, `sendfile`) and, for every other descriptor, makes the
//! application's memory safe for the kernel (protected pages opened before it writes,
//! referenced bytes fetched before it reads) around the raw system call.

use crate::{
    done, dump_stats, fail, frames, is_domain, peer_in_domain, recv, send, sendfile, set_domain,
    sys, trace, with_fd, ACTIVE,
};
use libc::{c_int, c_void, iovec, size_t, ssize_t};
use std::sync::atomic::Ordering::Relaxed;

fn domain_recv(fd: c_int, iov: &[iovec], flags: c_int) -> Option<ssize_t> {
    if flags & libc::MSG_PEEK != 0 {
        return None; // liveness checks only: answered by the kernel
    }
    let r = with_fd(fd, |_, fs| {
        let r = recv::odb_recv(fs, fd, iov, flags);
        if matches!(r, Ok(n) if n > 0) {
            fs.out_since_in = 0;
        }
        trace::call("recv", fd, recv::iov_total(iov), &r, fs);
        r
    })?;
    dump_stats();
    Some(done(r))
}

fn domain_send(fd: c_int, iov: &[iovec], flags: c_int) -> Option<ssize_t> {
    let r = with_fd(fd, |st, fs| {
        let r = send::odb_send(st, fs, fd, iov, flags);
        if let Ok(n) = r {
            fs.out_since_in += n;
        }
        trace::call("send", fd, recv::iov_total(iov), &r, fs);
        r
    })?;
    dump_stats();
    Some(done(r))
}

fn iov_slice<'a>(iov: *const iovec, cnt: c_int) -> Option<&'a [iovec]> {
    if iov.is_null() || !(0..=frames::IOV_MAX as c_int).contains(&cnt) {
        return None;
    }
    // SAFETY: the caller passes cnt valid iovecs (readv/writev's contract); checked non-null.
    Some(unsafe { std::slice::from_raw_parts(iov, cnt as usize) })
}

// ---------------------------------------------------------------- exported symbols

/// The one receive path of `recv`, `recvfrom`, `read`, `readv`, `pread64`: a domain socket
/// (`odb`: the call may carry ODB frames) goes through ODB; otherwise protected pages in the
/// destination are dropped or fetched and `kernel` makes the call. With no ODB fd and no
/// protected page anywhere, this is two relaxed loads before the system call.
fn recv_path(
    fd: c_int,
    iov: &[iovec],
    flags: c_int,
    odb: bool,
    kernel: impl FnOnce() -> Result<usize, c_int>,
) -> ssize_t {
    if odb && is_domain(fd) {
        if let Some(r) = domain_recv(fd, iov, flags) {
            return r;
        }
    }
    for x in iov {
        if let Err(e) = send::before_kernel_writes(x.iov_base, x.iov_len) {
            return fail(e);
        }
    }
    done(kernel())
}

/// The one send path of `send`, `sendto`, `write`, `writev`, `pwrite64`, `pwritev64` (see
/// `recv_path`): referenced bytes in the source are fetched for the kernel (`send_staged`);
/// `kernel` gets `iov` itself (make the call as the application made it) or the iovecs to
/// send instead.
fn send_path(
    fd: c_int,
    iov: &[iovec],
    flags: c_int,
    odb: bool,
    kernel: impl FnOnce(&[iovec]) -> Result<usize, c_int>,
) -> ssize_t {
    if odb && is_domain(fd) {
        if let Some(r) = domain_send(fd, iov, flags) {
            return r;
        }
    }
    done(send::send_staged(iov, kernel))
}

/// One iovec for the single-buffer calls.
fn one(buf: *const c_void, len: size_t) -> [iovec; 1] {
    [iovec {
        iov_base: buf as *mut c_void,
        iov_len: len,
    }]
}

/// An application's iovec array; an invalid one (null, count out of range) is passed to
/// the kernel untouched, which reports the error.
fn iovs<'a>(iov: *const iovec, cnt: c_int) -> (&'a [iovec], bool) {
    match iov_slice(iov, cnt) {
        Some(v) => (v, true),
        None => (&[], false),
    }
}

/// # Safety
/// libc's `recv` contract.
#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    let null = std::ptr::null_mut();
    recv_path(fd, &one(buf, len), flags, true, || {
        sys::recvfrom(fd, buf, len, flags, null, null.cast())
    })
}

/// # Safety
/// libc's `recvfrom` contract.
#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut libc::sockaddr,
    alen: *mut libc::socklen_t,
) -> ssize_t {
    recv_path(fd, &one(buf, len), flags, addr.is_null(), || {
        sys::recvfrom(fd, buf, len, flags, addr, alen)
    })
}

/// # Safety
/// libc's `read` contract.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    recv_path(fd, &one(buf, len), 0, true, || sys::read(fd, buf, len))
}

/// # Safety
/// libc's `readv` contract.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    let (v, ok) = iovs(iov, cnt);
    recv_path(fd, v, 0, ok, || sys::readv(fd, iov, cnt))
}

/// # Safety
/// libc's `write` contract.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    let o = one(buf, len);
    send_path(fd, &o, 0, true, |v| {
        if std::ptr::eq(v, &o[..]) {
            sys::write(fd, buf, len)
        } else {
            sys::writev(fd, v.as_ptr(), v.len() as c_int)
        }
    })
}

/// # Safety
/// libc's `writev` contract.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    let (v, ok) = iovs(iov, cnt);
    send_path(fd, v, 0, ok, |w| {
        if std::ptr::eq(w, v) {
            sys::writev(fd, iov, cnt)
        } else {
            sys::writev(fd, w.as_ptr(), w.len() as c_int)
        }
    })
}

/// # Safety
/// libc's `send` contract.
#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    let o = one(buf, len);
    send_path(fd, &o, flags, true, |v| {
        if std::ptr::eq(v, &o[..]) {
            sys::sendto(fd, buf, len, flags, std::ptr::null(), 0)
        } else {
            sys::sendmsg(fd, v, flags)
        }
    })
}

/// # Safety
/// libc's `sendto` contract.
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const libc::sockaddr,
    alen: libc::socklen_t,
) -> ssize_t {
    let o = one(buf, len);
    send_path(fd, &o, flags, addr.is_null(), |v| {
        if std::ptr::eq(v, &o[..]) {
            sys::sendto(fd, buf, len, flags, addr, alen)
        } else {
            sys::sendmsg_to(fd, v, flags, addr, alen)
        }
    })
}

/// # Safety
/// libc's `sendfile64` contract.
#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    inp: c_int,
    off: *mut i64,
    count: size_t,
) -> ssize_t {
    if is_domain(out) {
        if let Some(r) = with_fd(out, |st, fs| {
            let r = sendfile::odb_sendfile(st, fs, out, inp, off, count);
            if let Ok(n) = r {
                fs.out_since_in += n;
            }
            trace::call("sendfile", out, count, &r, fs);
            r
        }) {
            dump_stats();
            return done(r);
        }
    }
    done(sys::sendfile(out, inp, off, count))
}

/// # Safety
/// libc's `sendfile` contract (64-bit off_t on x86_64).
#[no_mangle]
pub unsafe extern "C" fn sendfile(out: c_int, inp: c_int, off: *mut i64, count: size_t) -> ssize_t {
    // SAFETY: same contract.
    unsafe { sendfile64(out, inp, off, count) }
}

/// # Safety
/// libc's `connect` contract.
#[no_mangle]
pub unsafe extern "C" fn connect(
    fd: c_int,
    addr: *const libc::sockaddr,
    alen: libc::socklen_t,
) -> c_int {
    if ACTIVE.load(Relaxed) {
        set_domain(fd, peer_in_domain(addr, alen));
    }
    match sys::connect(fd, addr, alen) {
        Ok(_) => 0,
        Err(e) => fail(e) as c_int,
    }
}

fn after_accept(fd: c_int) {
    if fd < 0 || !ACTIVE.load(Relaxed) {
        return;
    }
    // SAFETY: a zeroed sockaddr_in is valid; getpeername fills at most its size.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let ok = sys::getpeername(fd, (&mut sa as *mut libc::sockaddr_in).cast(), &mut len).is_ok();
    set_domain(
        fd,
        ok && peer_in_domain((&sa as *const libc::sockaddr_in).cast(), len),
    );
}

/// # Safety
/// libc's `accept4` contract.
#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut libc::sockaddr,
    alen: *mut libc::socklen_t,
    flags: c_int,
) -> c_int {
    match sys::accept4(fd, addr, alen, flags) {
        Ok(n) => {
            after_accept(n as c_int);
            n as c_int
        }
        Err(e) => fail(e) as c_int,
    }
}

/// # Safety
/// libc's `accept` contract.
#[no_mangle]
pub unsafe extern "C" fn accept(
    fd: c_int,
    addr: *mut libc::sockaddr,
    alen: *mut libc::socklen_t,
) -> c_int {
    // SAFETY: same contract.
    unsafe { accept4(fd, addr, alen, 0) }
}

/// # Safety
/// libc's `close` contract.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if is_domain(fd) {
        set_domain(fd, false);
    }
    match sys::close(fd) {
        Ok(_) => 0,
        Err(e) => fail(e) as c_int,
    }
}

/// # Safety
/// libc's `ioctl` contract. Only FIONREAD on domain sockets is changed: it reports the bytes
/// the application can read (virtual ones included), not the bytes of frames in the kernel —
/// nginx reads an upstream only while this is non-zero.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: libc::c_ulong, arg: *mut c_void) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { libc::syscall(libc::SYS_ioctl, fd, req, arg) } as c_int;
    if r == 0 && req == libc::FIONREAD && !arg.is_null() && is_domain(fd) {
        // SAFETY: FIONREAD's argument is an int the kernel just wrote.
        let kernel = unsafe { *(arg as *mut c_int) }.max(0) as usize;
        let app = with_fd(fd, |_, fs| {
            let app = fs.rx.readable(kernel);
            trace::call("fionread", fd, kernel, &Ok(app), fs);
            app
        })
        .unwrap_or(kernel);
        // SAFETY: as above.
        unsafe { *(arg as *mut c_int) = app.min(i32::MAX as usize) as c_int };
        return r;
    }
    r
}

/// # Safety
/// libc's `pread64` contract.
#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, len: size_t, off: i64) -> ssize_t {
    recv_path(fd, &one(buf, len), 0, false, || {
        sys::pread(fd, buf, len, off)
    })
}

/// # Safety
/// libc's `pwrite64` contract.
#[no_mangle]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, len: size_t, off: i64) -> ssize_t {
    let o = one(buf, len);
    send_path(fd, &o, 0, false, |v| {
        if std::ptr::eq(v, &o[..]) {
            sys::pwrite(fd, buf, len, off)
        } else {
            sys::pwritev(fd, v.as_ptr(), v.len() as c_int, off as libc::c_long, 0)
        }
    })
}

/// # Safety
/// libc's `pwritev64` contract.
#[no_mangle]
pub unsafe extern "C" fn pwritev64(fd: c_int, iov: *const iovec, cnt: c_int, off: i64) -> ssize_t {
    let (v, _) = iovs(iov, cnt);
    send_path(fd, v, 0, false, |w| {
        if std::ptr::eq(w, v) {
            sys::pwritev(fd, iov, cnt, off as libc::c_long, 0)
        } else {
            sys::pwritev(fd, w.as_ptr(), w.len() as c_int, off as libc::c_long, 0)
        }
    })
}
