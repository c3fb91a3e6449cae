//! `iolab tiers faults`: the two ways ODB can fill a page on first touch, measured in this
//! process. SIGSEGV: the page is `mprotect`ed PROT_NONE; the handler makes it
//! PROT_READ|PROT_WRITE and copies the bytes in (what `libiolab_odb.so` does). userfaultfd:
//! the page is missing (zapped with MADV_DONTNEED) in a range registered in MISSING mode with
//! `UFFD_FEATURE_SIGBUS`; the fault raises SIGBUS in the faulting thread and the handler
//! installs the page with UFFDIO_COPY (no handler thread: nginx workers are single-threaded).
//! The bytes come from local memory in both, so the figures are the fault path's own cost
//! (an agent fetch adds the same round trip to both). Also reported: whether userfaultfd is
//! allowed to the user nginx workers run as (`vm.unprivileged_userfaultfd`).

use iolab_sys::AnonMap;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

const PAGE: usize = 4096;

// <linux/userfaultfd.h>
#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}
#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}
const UFFD_API: u64 = 0xAA;
const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const UFFDIO_UNREGISTER: libc::c_ulong = 0x8010_aa01;
const UFFDIO_COPY: libc::c_ulong = 0xc028_aa03;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_FEATURE_SIGBUS: u64 = 1 << 7;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;

/// Where the handlers copy from (the "agent"), the uffd, the start of the measured range.
static SRC: AtomicUsize = AtomicUsize::new(0);
static BASE: AtomicUsize = AtomicUsize::new(0);
static UFFD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_segv(_: i32, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: SA_SIGINFO handler: the kernel passes a valid siginfo.
    let addr = unsafe { (*info).si_addr() } as usize & !(PAGE - 1);
    let off = addr - BASE.load(Relaxed);
    // SAFETY: addr is a page of our measured mapping (the only PROT_NONE pages of this
    // run); making it writable and filling it from the source mapping of the same size.
    unsafe {
        libc::mprotect(addr as *mut _, PAGE, libc::PROT_READ | libc::PROT_WRITE);
        std::ptr::copy_nonoverlapping(
            (SRC.load(Relaxed) + off) as *const u8,
            addr as *mut u8,
            PAGE,
        );
    }
}

extern "C" fn on_sigbus(_: i32, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: SA_SIGINFO handler: the kernel passes a valid siginfo.
    let addr = unsafe { (*info).si_addr() } as usize & !(PAGE - 1);
    let off = addr - BASE.load(Relaxed);
    let mut c = UffdioCopy {
        dst: addr as u64,
        src: (SRC.load(Relaxed) + off) as u64,
        len: PAGE as u64,
        mode: 0,
        copy: 0,
    };
    // SAFETY: UFFDIO_COPY with a struct that lives for the call; the kernel checks ranges.
    unsafe { libc::ioctl(UFFD.load(Relaxed), UFFDIO_COPY, &mut c) };
}

fn install(sig: i32, h: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void)) {
    // SAFETY: a fully initialised sigaction for a handler of the SA_SIGINFO shape.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = h as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

fn restore(sig: i32) {
    // SAFETY: back to the default disposition.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
}

/// Touches one byte per page; returns the sum (so the reads are not optimised away).
fn touch(p: *mut u8, pages: usize) -> u64 {
    let mut s = 0u64;
    for i in 0..pages {
        // SAFETY: inside the measured mapping; a fault is handled by the installed handler.
        s += unsafe { std::ptr::read_volatile(p.add(i * PAGE)) } as u64;
    }
    s
}

/// The userfaultfd syscall for this process, with `flags`: Ok(fd) or the errno text.
fn open_uffd(flags: libc::c_int) -> Result<i32, String> {
    // SAFETY: a plain system call.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | flags) } as i32;
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("userfaultfd(): {e}"));
    }
    Ok(fd)
}

/// Runs both methods `rounds` times over `pages` pages; per-page medians in ns.
pub fn measure(pages: usize, rounds: usize) -> anyhow::Result<Value> {
    let len = pages * PAGE;
    // Both unmapped when this returns, whichever way.
    let src_map = AnonMap::new(len, false)?;
    let src = src_map.as_ptr();
    // SAFETY: src is our mapping of len bytes.
    unsafe { std::ptr::write_bytes(src, 0x5a, len) };
    SRC.store(src as usize, Relaxed);
    let dst_map = AnonMap::new(len, false)?;
    let dst = dst_map.as_ptr();
    BASE.store(dst as usize, Relaxed);
    let per_page = |t: std::time::Duration| t.as_nanos() as f64 / pages as f64;

    // SIGSEGV + mprotect
    install(libc::SIGSEGV, on_segv);
    let (mut seg_fault, mut seg_prot) = (Vec::new(), Vec::new());
    let mut seg_ok = true;
    for _ in 0..rounds {
        let t0 = Instant::now();
        // SAFETY: our mapping; PROT_NONE as the receiver does for a referenced body.
        unsafe { libc::mprotect(dst.cast(), len, libc::PROT_NONE) };
        seg_prot.push(per_page(t0.elapsed()));
        let t0 = Instant::now();
        let s = touch(dst, pages);
        seg_fault.push(per_page(t0.elapsed()));
        if s != 0x5a * pages as u64 {
            seg_ok = false;
            break;
        }
    }
    restore(libc::SIGSEGV);
    anyhow::ensure!(seg_ok, "SIGSEGV path: wrong bytes");

    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("unreadable: {e}"));
    let mut uffd_json = json!({"vm.unprivileged_userfaultfd": sysctl});
    // user-mode-only is what an unprivileged nginx worker may open when the sysctl is 0
    let opened = open_uffd(UFFD_USER_MODE_ONLY).map(|fd| (fd, "UFFD_USER_MODE_ONLY"));
    uffd_json["without_user_mode_only_here"] = json!(match open_uffd(0) {
        Ok(fd) => {
            // SAFETY: our fd.
            unsafe { libc::close(fd) };
            "allowed".to_string()
        }
        Err(e) => e,
    });
    match opened {
        Err(e) => uffd_json["error"] = json!(e),
        Ok((fd, how)) => {
            UFFD.store(fd, Relaxed);
            let mut api = UffdioApi {
                api: UFFD_API,
                features: UFFD_FEATURE_SIGBUS,
                ioctls: 0,
            };
            // SAFETY: UFFDIO_API on our fd with a live struct.
            if unsafe { libc::ioctl(fd, UFFDIO_API, &mut api) } != 0 {
                uffd_json["error"] = json!(format!(
                    "UFFDIO_API (SIGBUS feature): {}",
                    std::io::Error::last_os_error()
                ));
            } else {
                install(libc::SIGBUS, on_sigbus);
                let (mut uf_fault, mut uf_prep) = (Vec::new(), Vec::new());
                let mut err = None;
                for _ in 0..rounds {
                    let t0 = Instant::now();
                    // the receiver's preparation: drop the pages, register the range
                    let mut reg = UffdioRegister {
                        range: UffdioRange {
                            start: dst as u64,
                            len: len as u64,
                        },
                        mode: UFFDIO_REGISTER_MODE_MISSING,
                        ioctls: 0,
                    };
                    // SAFETY: our mapping and fd; structs live for the calls.
                    let ok = unsafe {
                        libc::madvise(dst.cast(), len, libc::MADV_DONTNEED) == 0
                            && libc::ioctl(fd, UFFDIO_REGISTER, &mut reg) == 0
                    };
                    if !ok {
                        err = Some(format!("register: {}", std::io::Error::last_os_error()));
                        break;
                    }
                    uf_prep.push(per_page(t0.elapsed()));
                    let t0 = Instant::now();
                    let s = touch(dst, pages);
                    uf_fault.push(per_page(t0.elapsed()));
                    let range = UffdioRange {
                        start: dst as u64,
                        len: len as u64,
                    };
                    // SAFETY: as above.
                    unsafe { libc::ioctl(fd, UFFDIO_UNREGISTER, &range) };
                    if s != 0x5a * pages as u64 {
                        err = Some("userfaultfd path: wrong bytes".into());
                        break;
                    }
                }
                restore(libc::SIGBUS);
                uffd_json["opened_with"] = json!(how);
                uffd_json["prepare_ns_per_page"] =
                    json!(iolab_sys::percentile::median(&uf_prep).unwrap_or(f64::NAN));
                uffd_json["fault_ns_per_page"] =
                    json!(iolab_sys::percentile::median(&uf_fault).unwrap_or(f64::NAN));
                if let Some(e) = err {
                    uffd_json["error"] = json!(e);
                }
            }
            // SAFETY: our fd.
            unsafe { libc::close(fd) };
        }
    }
    Ok(json!({
        "pages": pages,
        "rounds": rounds,
        "sigsegv": {"prepare_ns_per_page": iolab_sys::percentile::median(&seg_prot).unwrap_or(f64::NAN), "fault_ns_per_page": iolab_sys::percentile::median(&seg_fault).unwrap_or(f64::NAN)},
        "userfaultfd": uffd_json,
        "machine": crate::report::Host::probe(),
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_fault_paths_deliver_the_right_bytes() {
        let v = super::measure(64, 3).unwrap();
        assert!(v["sigsegv"]["fault_ns_per_page"].as_f64().unwrap() > 0.0);
        // userfaultfd may be refused here (a container, an old kernel): then it says why
        let u = &v["userfaultfd"];
        assert!(
            u["fault_ns_per_page"].as_f64().is_some_and(|x| x > 0.0) || u["error"].is_string(),
            "{u}"
        );
    }
}
