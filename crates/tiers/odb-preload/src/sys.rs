//! Raw system calls. The library exports `recv`, `write`, ... itself, so calling the libc
//! functions of the same names from inside it would call back into it; every kernel call the
//! library makes goes through here instead (also async-signal-safe: no locks, no allocation).

use libc::{c_int, c_long, c_void, iovec, msghdr};

pub fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(e: c_int) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e }
}

fn ret(r: c_long) -> Result<usize, c_int> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

pub fn recvmsg(fd: c_int, iov: &[iovec], flags: c_int) -> Result<usize, c_int> {
    // SAFETY: msghdr points at `iov`, alive for the call; the iovecs describe memory the
    // caller may write (the application's own buffers or ours).
    unsafe {
        let mut m: msghdr = std::mem::zeroed();
        m.msg_iov = iov.as_ptr() as *mut iovec;
        m.msg_iovlen = iov.len();
        ret(libc::syscall(
            libc::SYS_recvmsg,
            fd,
            &mut m as *mut msghdr,
            flags,
        ))
    }
}

pub fn sendmsg(fd: c_int, iov: &[iovec], flags: c_int) -> Result<usize, c_int> {
    sendmsg_to(fd, iov, flags, std::ptr::null(), 0)
}

/// `sendmsg`, to an address when `addr` is not null (`sendto`'s, for a call whose bytes
/// were staged).
pub fn sendmsg_to(
    fd: c_int,
    iov: &[iovec],
    flags: c_int,
    addr: *const libc::sockaddr,
    alen: libc::socklen_t,
) -> Result<usize, c_int> {
    // SAFETY: msghdr points at `iov`, alive for the call (the kernel only reads the iovecs),
    // and at the caller's address or none (the kernel checks it).
    unsafe {
        let mut m: msghdr = std::mem::zeroed();
        m.msg_name = addr as *mut c_void;
        m.msg_namelen = alen;
        m.msg_iov = iov.as_ptr() as *mut iovec;
        m.msg_iovlen = iov.len();
        ret(libc::syscall(
            libc::SYS_sendmsg,
            fd,
            &m as *const msghdr,
            flags,
        ))
    }
}

pub fn recv(fd: c_int, buf: *mut u8, len: usize, flags: c_int) -> Result<usize, c_int> {
    recvmsg(
        fd,
        &[iovec {
            iov_base: buf.cast(),
            iov_len: len,
        }],
        flags,
    )
}

pub fn send_all_blocking(fd: c_int, mut b: &[u8]) -> Result<(), c_int> {
    while !b.is_empty() {
        match sendmsg(
            fd,
            &[iovec {
                iov_base: b.as_ptr() as *mut c_void,
                iov_len: b.len(),
            }],
            libc::MSG_NOSIGNAL,
        ) {
            Ok(n) => b = &b[n..],
            Err(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads exactly `len` bytes into `dst` (blocking fd).
/// A fetch reply: the status byte and, for ST_OK, `len` bytes into `dst`, with one
/// recvmsg in the common case (status and data arrive together). Returns the status; for
/// any other status nothing after it is read (the agent sends nothing more for a failed
/// request on that connection).
pub fn recv_status_and(fd: c_int, ok: u8, dst: *mut u8, len: usize) -> Result<u8, c_int> {
    let mut st = 0u8;
    let n = loop {
        let v = [
            iovec {
                iov_base: (&mut st as *mut u8).cast(),
                iov_len: 1,
            },
            iovec {
                iov_base: dst.cast(),
                iov_len: len,
            },
        ];
        match recvmsg(fd, &v, 0) {
            Ok(0) => return Err(libc::ECONNRESET),
            Ok(n) => break n,
            Err(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
    };
    if st != ok {
        return Ok(st);
    }
    let got = n - 1;
    if got < len {
        // SAFETY: got < len: dst+got..dst+len is the rest of the caller's writable range.
        recv_exact(fd, unsafe { dst.add(got) }, len - got)?;
    }
    Ok(st)
}

/// This process's pid, without a system call after the first: the library's fork handler
/// (`forget_pid`, registered with pthread_atfork) clears it in a child.
pub fn pid() -> i32 {
    let p = PID.load(std::sync::atomic::Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: getpid has no preconditions.
    let p = unsafe { libc::getpid() };
    PID.store(p, std::sync::atomic::Ordering::Relaxed);
    p
}

static PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The fork handler (in the child): the cached pid is the parent's.
pub extern "C" fn forget_pid() {
    PID.store(0, std::sync::atomic::Ordering::Relaxed);
}

/// Reads exactly `len` bytes from a blocking socket. MSG_WAITALL lets the kernel gather a
/// reply that arrives in several segments in one call (a 60 KiB fetch took up to ten
/// `recv`s, each a sleep and a wake); a timeout or a signal ends it short and we go on.
pub fn recv_exact(fd: c_int, dst: *mut u8, len: usize) -> Result<(), c_int> {
    let mut got = 0;
    while got < len {
        // SAFETY: dst..dst+len is writable memory owned by the caller.
        match recv(fd, unsafe { dst.add(got) }, len - got, libc::MSG_WAITALL) {
            Ok(0) => return Err(libc::ECONNRESET),
            Ok(n) => got += n,
            Err(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

macro_rules! raw {
    ($name:ident ( $($a:ident : $t:ty),* ) = $nr:expr) => {
        pub fn $name($($a: $t),*) -> Result<usize, c_int> {
            // SAFETY: a plain system call with the caller's arguments; the kernel checks
            // every pointer (EFAULT), nothing here dereferences them.
            ret(unsafe { libc::syscall($nr, $($a),*) })
        }
    };
}

raw!(read(fd: c_int, buf: *mut c_void, n: usize) = libc::SYS_read);
raw!(write(fd: c_int, buf: *const c_void, n: usize) = libc::SYS_write);
raw!(readv(fd: c_int, iov: *const iovec, cnt: c_int) = libc::SYS_readv);
raw!(writev(fd: c_int, iov: *const iovec, cnt: c_int) = libc::SYS_writev);
raw!(pread(fd: c_int, buf: *mut c_void, n: usize, off: i64) = libc::SYS_pread64);
// preadv's offset is passed as two longs (low, high); on x86-64 the high half is ignored.
raw!(preadv(fd: c_int, iov: *const iovec, cnt: c_int, off: i64, off_hi: i64) = libc::SYS_preadv);
raw!(pwrite(fd: c_int, buf: *const c_void, n: usize, off: i64) = libc::SYS_pwrite64);
raw!(pwritev(fd: c_int, iov: *const iovec, cnt: c_int, lo: c_long, hi: c_long) = libc::SYS_pwritev);
raw!(recvfrom(fd: c_int, buf: *mut c_void, n: usize, fl: c_int, a: *mut libc::sockaddr, al: *mut libc::socklen_t) = libc::SYS_recvfrom);
raw!(sendto(fd: c_int, buf: *const c_void, n: usize, fl: c_int, a: *const libc::sockaddr, al: libc::socklen_t) = libc::SYS_sendto);
raw!(sendfile(out: c_int, inp: c_int, off: *mut i64, n: usize) = libc::SYS_sendfile);
raw!(connect(fd: c_int, a: *const libc::sockaddr, al: libc::socklen_t) = libc::SYS_connect);
raw!(accept4(fd: c_int, a: *mut libc::sockaddr, al: *mut libc::socklen_t, fl: c_int) = libc::SYS_accept4);
raw!(close(fd: c_int) = libc::SYS_close);
raw!(socket(d: c_int, t: c_int, p: c_int) = libc::SYS_socket);
raw!(mprotect_raw(a: *mut c_void, n: usize, p: c_int) = libc::SYS_mprotect);

/// `mprotect`, counted (the address-space work it causes was most of the IS's cost).
pub fn mprotect(a: *mut c_void, n: usize, p: c_int) -> Result<usize, c_int> {
    crate::stats::MPROTECTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    mprotect_raw(a, n, p)
}
raw!(mmap_raw(a: *mut c_void, n: usize, p: c_int, f: c_int, fd: c_int, off: i64) = libc::SYS_mmap);
raw!(getpeername(fd: c_int, a: *mut libc::sockaddr, al: *mut libc::socklen_t) = libc::SYS_getpeername);
raw!(setsockopt(fd: c_int, l: c_int, o: c_int, v: *const c_void, vl: libc::socklen_t) = libc::SYS_setsockopt);
raw!(fstat(fd: c_int, st: *mut libc::stat) = libc::SYS_fstat);
raw!(readlink(path: *const libc::c_char, buf: *mut libc::c_char, n: usize) = libc::SYS_readlink);
raw!(lseek(fd: c_int, off: i64, wh: c_int) = libc::SYS_lseek);

pub fn stderr(msg: &str) {
    let _ = write(2, msg.as_ptr().cast(), msg.len());
}
