//! `malloc`, `free`, `realloc` and `malloc_usable_size`, interposed to make references land
//! on whole pages, and on pages protected already.
//!
//! Why: a reference read into a buffer is protected page by page; the parts of the first and
//! last pages that the buffer shares with other memory (malloc's chunk header, neighbouring
//! objects) cannot be protected and are fetched at once. nginx's proxy buffers
//! (`proxy_buffers 32 64k`, `proxy_buffer_size 8k`) come from `malloc` 16 bytes past a page
//! boundary, so every 64 KiB buffer cost two partial-page fetches (~4 KiB each, a round trip
//! to the agent, forwarded again as real bytes): the IS moved ~10 KiB per 64 KiB response
//! (83.5% bypass) and blocked on the agent twice per buffer. Allocations of whole pages (at
//! least two) are now page-aligned (from the pool below; `__libc_memalign` when it is used
//! up): a buffer that starts empty takes a reference on whole pages, and only the page
//! holding the response header is fetched (the seed's 93.75% at 64 KiB: all but one 4 KiB
//! page).
//!
//! These blocks come from a pool of the library's own (`Pool`), not from glibc: one
//! reserved mapping cut into spans of 1 MiB, each span holding blocks of one size, free
//! blocks kept on a last-in first-out list per size whose links live outside the blocks.
//! `free` of a pool block leaves its protected pages protected, as dead regions (the bytes
//! are given up, nothing is fetched, nothing is unprotected), and the next `malloc` of that
//! size hands the same block out again: when the next response's reference lands on the
//! same pages — nginx lays out every response of one size alike in the same buffers —
//! `Registry::cover` finds them protected already, and the response costs no `mprotect`
//! at all (it cost two per buffer: protect on receipt, unprotect on free; each splits or
//! merges the mapping, and that address-space work was ~40% of the ODB IS's time). A dead
//! page the program or the kernel writes into is made accessible then, without a fetch
//! (the fault handler; the intercepted calls' `prepare_overwrite`).
//!
//! `free` of a glibc block drops the protected pages inside it without fetching them (the
//! program has given the bytes up): otherwise glibc's own writes into the freed chunk (its
//! free-list links, a split for a later allocation) fault and fetch a page nobody reads.
//!
//! Invariants:
//! - nothing here allocates or takes a lock that is held while allocating (the registry lock
//!   is never held while allocating or freeing — see `Reg` in lib.rs — so `free` may take it);
//! - a pointer inside the pool's mapping is a pool block (glibc never maps there): `free`,
//!   `realloc` and `malloc_usable_size` route it here and everything else to glibc, which
//!   accepts its own memalign'd blocks as any other; `calloc` and `posix_memalign` are
//!   untouched (glibc's);
//! - the pool never returns memory to the kernel (freed blocks wait for reuse): its size is
//!   the program's peak of such buffers; when its reservation is used up, `malloc` falls back
//!   to glibc's memalign;
//! - limit: a freed block may come back with dead protected pages; the program's own
//!   accesses (fault handler) and every call the library intercepts make them accessible,
//!   but a system call the library does not intercept (`recvmsg`, `getdents64`...) writing
//!   into one gets EFAULT. Only blocks that held references have dead pages, and they
//!   return only to allocations of their exact size; nginx's are its proxy buffers;
//! - no protected page survives in memory the program has given back to glibc: `free` drops
//!   them, `realloc` fetches them first (glibc copies and frees inside, out of our sight).
//!   So glibc can never return a registered page to the kernel (trim, munmap) and hand it
//!   out again readable (nor can the pool: it never unmaps): the registry needs no "stale
//!   page" check (it made six process_vm_readv calls per 64 KiB response on the IS). Not
//!   covered (documented as a limit): a program that `munmap`s, or frees through
//!   glibc-internal paths (`reallocarray`), memory it read references into — nginx does
//!   neither;
//! - before the library is active (`ACTIVE` false, the pool not reserved), all four are
//!   glibc's, unchanged.

use crate::regions::PAGE;
use libc::{c_void, size_t};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

extern "C" {
    fn __libc_malloc(n: size_t) -> *mut c_void;
    fn __libc_memalign(align: size_t, n: size_t) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_realloc(p: *mut c_void, n: size_t) -> *mut c_void;
}

/// Blocks of whole pages from this size on are page-aligned (the 8 KiB header buffer and the
/// 64 KiB proxy buffers of the tiers' nginx).
const ALIGN_FROM: usize = 2 * PAGE;

/// The pool's reservation (address space; memory is committed as blocks are first used).
const POOL_BYTES: usize = 1 << 30;
/// A span holds blocks of one size; the largest pool block is one span.
const SPAN: usize = 1 << 20;
const SPANS: usize = POOL_BYTES / SPAN;
const MAX_PAGES: usize = SPAN / PAGE;
const POOL_PAGES: usize = POOL_BYTES / PAGE;

/// The pool's bookkeeping, all outside the blocks (a free block may be protected). Page
/// numbers are stored plus one, so that zero means none.
struct Pool {
    /// Start of the reservation; 0 before `init` or when it failed.
    base: usize,
    spans_used: usize,
    /// Block size in pages of each span in use.
    span_pages: [u16; SPANS],
    /// First free block of each size (page number + 1).
    free: [u32; MAX_PAGES + 1],
    /// The span being cut for each size: next page and end page.
    cut: [(u32, u32); MAX_PAGES + 1],
    /// For a free block (by its first page): the next free block of its size (page + 1).
    next: [u32; POOL_PAGES],
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    base: 0,
    spans_used: 0,
    span_pages: [0; SPANS],
    free: [0; MAX_PAGES + 1],
    cut: [(0, 0); MAX_PAGES + 1],
    next: [0; POOL_PAGES],
});
/// `Pool::base`, readable without the lock (set once, before the library is active).
static POOL_BASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// glibc's `malloc_usable_size` (which this library's own hides; glibc exports no
/// `__libc_` alias for it), found at `init`.
static GLIBC_USABLE_SIZE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn glibc_usable_size(p: *mut c_void) -> size_t {
    let f = GLIBC_USABLE_SIZE.load(Relaxed);
    if f == 0 || p.is_null() {
        return 0;
    }
    // SAFETY: f is glibc's malloc_usable_size (dlsym RTLD_NEXT at init), called on a glibc
    // block or null as its contract asks.
    unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void) -> size_t>(f)(p) }
}

/// Reserves the pool (from the library constructor, before it is active). Without it every
/// aligned block comes from glibc.
pub fn init() {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds glibc's definition.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) };
    GLIBC_USABLE_SIZE.store(f as usize, Relaxed);
    if f.is_null() {
        // without it glibc blocks could not be measured on free: no pool either way
        return;
    }
    let p = crate::sys::mmap_raw(
        std::ptr::null_mut(),
        POOL_BYTES,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        -1,
        0,
    );
    if let Ok(p) = p {
        pool().base = p;
        POOL_BASE.store(p, Relaxed);
    }
}

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The pool block `p` points into, if any: (its start, its size).
fn pool_block(p: usize) -> Option<(usize, usize)> {
    let base = POOL_BASE.load(Relaxed);
    if base == 0 || p < base || p >= base + POOL_BYTES {
        return None;
    }
    let pages = pool().span_pages[(p - base) / SPAN] as usize;
    if pages == 0 {
        return None; // a span never cut: not a block we handed out
    }
    let span = base + (p - base) / SPAN * SPAN;
    let start = span + (p - span) / (pages * PAGE) * (pages * PAGE);
    Some((start, pages * PAGE))
}

impl Pool {
    fn alloc(&mut self, pages: usize) -> Option<usize> {
        if self.base == 0 || pages > MAX_PAGES {
            return None;
        }
        let head = self.free[pages];
        if head != 0 {
            let page = head as usize - 1;
            self.free[pages] = self.next[page];
            return Some(self.base + page * PAGE);
        }
        let (mut at, mut end) = self.cut[pages];
        if at + pages as u32 > end {
            if self.spans_used == SPANS {
                return None;
            }
            self.span_pages[self.spans_used] = pages as u16;
            at = (self.spans_used * MAX_PAGES) as u32;
            end = at + MAX_PAGES as u32;
            self.spans_used += 1;
        }
        self.cut[pages] = (at + pages as u32, end);
        Some(self.base + at as usize * PAGE)
    }

    fn release(&mut self, start: usize, pages: usize) {
        let page = (start - self.base) / PAGE;
        self.next[page] = self.free[pages];
        self.free[pages] = page as u32 + 1;
    }
}

fn wants_pages(n: usize) -> bool {
    n >= ALIGN_FROM && n % PAGE == 0 && crate::ACTIVE.load(Relaxed)
}

/// # Safety
/// libc's `malloc` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc(n: size_t) -> *mut c_void {
    if wants_pages(n) {
        crate::stats::ALIGNED_ALLOCS.fetch_add(1, Relaxed);
        if let Some(p) = pool().alloc(n / PAGE) {
            crate::stats::POOL_ALLOCS.fetch_add(1, Relaxed);
            return p as *mut c_void;
        }
        crate::stats::POOL_FALLBACKS.fetch_add(1, Relaxed);
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
    if let Some((start, n)) = pool_block(p as usize) {
        crate::kill_pages(start, n);
        pool().release(start, n / PAGE);
        return;
    }
    if !p.is_null() && crate::REGION_COUNT.load(Relaxed) != 0 {
        // p is a live block of glibc's malloc (free's contract)
        let n = glibc_usable_size(p);
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
    if let Some((start, m)) = pool_block(p as usize) {
        // the old bytes, readable (fetched or revived), are copied into a new block
        if crate::fetch_pages(start, m).is_err() {
            crate::sys::set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
        // SAFETY: malloc's contract (ours).
        let q = unsafe { malloc(n) };
        if !q.is_null() {
            // SAFETY: p..p+min(m, n) is the old block, readable now; q is a new block of n.
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, m.min(n)) };
            // SAFETY: p is a pool block (free's contract).
            unsafe { free(p) };
        }
        return q;
    }
    if !p.is_null() && crate::REGION_COUNT.load(Relaxed) != 0 {
        // p is a live block of glibc's malloc (realloc's contract)
        let m = glibc_usable_size(p);
        if m >= PAGE && crate::fetch_pages(p as usize, m).is_err() {
            // The bytes cannot be had: fail as realloc does (the old block stays valid).
            crate::sys::set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
    }
    // SAFETY: realloc's contract, forwarded.
    unsafe { __libc_realloc(p, n) }
}

/// # Safety
/// libc's `malloc_usable_size` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    if let Some((start, n)) = pool_block(p as usize) {
        return start + n - p as usize;
    }
    glibc_usable_size(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_found_by_address_and_nothing_else_is() {
        init();
        let base = POOL_BASE.load(Relaxed);
        assert_ne!(base, 0, "the pool is reserved");
        // blocks cut from the pool (the library is not active here: malloc would be glibc's)
        let (a, b) = {
            let mut p = pool();
            (p.alloc(16).unwrap(), p.alloc(16).unwrap())
        };
        assert_eq!(b, a + 16 * PAGE, "cut one after the other from one span");
        assert_eq!(pool_block(a), Some((a, 16 * PAGE)));
        assert_eq!(pool_block(b + 100), Some((b, 16 * PAGE)));
        // SAFETY: b is a pool block; the pointer is only compared, never dereferenced.
        let usable = unsafe { malloc_usable_size((b + 100) as *mut c_void) };
        assert_eq!(usable, 16 * PAGE - 100);
        // freed and handed out again, last in first out
        pool().release(a, 16);
        pool().release(b, 16);
        assert_eq!(pool().alloc(16), Some(b));
        assert_eq!(pool().alloc(16), Some(a));
        // inside the reservation but in a span never cut, or outside it: not a block
        assert_eq!(pool_block(base + (SPANS - 1) * SPAN + 5), None);
        assert_eq!(pool_block(base + POOL_BYTES), None);
        assert_eq!(pool_block(base - PAGE), None);
    }
}
