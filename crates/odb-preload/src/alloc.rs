//! `malloc` and `free`, interposed to make references land on whole pages.
//!
//! Why: a reference read into a buffer is protected page by page; the parts of the first and
//! last pages that the buffer shares with other memory (malloc's chunk header, neighbouring
//! objects) cannot be protected and are fetched at once. nginx's proxy buffers
//! (`proxy_buffers 32 64k`, `proxy_buffer_size 8k`) come from `malloc` 16 bytes past a page
//! boundary, so every 64 KiB buffer cost two partial-page fetches (~4 KiB each, a round trip
//! to the agent, forwarded again as real bytes): the IS moved ~10 KiB per 64 KiB response
//! (83.5% bypass) and blocked on the agent twice per buffer. Allocations of whole pages (at
//! least two) are now page-aligned (`__libc_memalign`): a buffer that starts empty takes a
//! reference on whole pages, and only the page holding the response header is fetched (the
//! seed's 93.75% at 64 KiB: all but one 4 KiB page).
//!
//! `free` drops the protected pages inside the freed block without fetching them (the
//! program has given the bytes up): otherwise glibc's own writes into the freed chunk (its
//! free-list links, a split for a later allocation) fault and fetch a page nobody reads.
//!
//! Invariants:
//! - nothing here allocates or takes a lock that is held while allocating (the registry lock
//!   is never held while allocating or freeing — see `Reg` in lib.rs — so `free` may take it);
//! - glibc's `free`, `realloc` and `malloc_usable_size` accept memalign'd blocks as any other
//!   (they are ordinary chunks), so only `malloc` aligns; `calloc` and `posix_memalign` are
//!   untouched;
//! - no protected page survives in memory the program has given back to glibc: `free` drops
//!   them, `realloc` fetches them first (glibc copies and frees inside, out of our sight).
//!   So glibc can never return a registered page to the kernel (trim, munmap) and hand it
//!   out again readable: the registry needs no "stale page" check (it made six
//!   process_vm_readv calls per 64 KiB response on the IS). Not covered (documented as a
//!   limit): a program that `munmap`s, or frees through glibc-internal paths
//!   (`reallocarray`), memory it read references into — nginx does neither;
//! - before the library is active (`ACTIVE` false), both are glibc's, unchanged.

use crate::regions::PAGE;
use libc::{c_void, size_t};
use std::sync::atomic::Ordering::Relaxed;

extern "C" {
    fn __libc_malloc(n: size_t) -> *mut c_void;
    fn __libc_memalign(align: size_t, n: size_t) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_realloc(p: *mut c_void, n: size_t) -> *mut c_void;
}

/// Blocks of whole pages from this size on are page-aligned (the 8 KiB header buffer and the
/// 64 KiB proxy buffers of the tiers' nginx).
const ALIGN_FROM: usize = 2 * PAGE;

fn wants_pages(n: usize) -> bool {
    n >= ALIGN_FROM && n % PAGE == 0 && crate::ACTIVE.load(Relaxed)
}

/// # Safety
/// libc's `malloc` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc(n: size_t) -> *mut c_void {
    if wants_pages(n) {
        crate::stats::ALIGNED_ALLOCS.fetch_add(1, Relaxed);
        // SAFETY: glibc's memalign with a power-of-two alignment; the block is freed by
        // glibc's free like any other.
        unsafe { __libc_memalign(PAGE, n) }
    } else {
        // SAFETY: glibc's malloc, same contract.
        unsafe { __libc_malloc(n) }
    }
}

/// # Safety
/// libc's `free` contract.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if !p.is_null() && crate::REGION_COUNT.load(Relaxed) != 0 {
        // SAFETY: p is a live block of glibc's malloc (free's contract).
        let n = unsafe { libc::malloc_usable_size(p) };
        if n >= PAGE {
            crate::forget_pages(p as usize, n);
        }
    }
    // SAFETY: free's contract, forwarded.
    unsafe { __libc_free(p) }
}

/// # Safety
/// libc's `realloc` contract.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, n: size_t) -> *mut c_void {
    if !p.is_null() && crate::REGION_COUNT.load(Relaxed) != 0 {
        // SAFETY: p is a live block of glibc's malloc (realloc's contract).
        let m = unsafe { libc::malloc_usable_size(p) };
        if m >= PAGE && crate::fetch_pages(p as usize, m).is_err() {
            // The bytes cannot be had: fail as realloc does (the old block stays valid).
            crate::sys::set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
    }
    // SAFETY: realloc's contract, forwarded.
    unsafe { __libc_realloc(p, n) }
}
