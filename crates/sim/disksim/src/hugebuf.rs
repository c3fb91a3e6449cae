//! Buffers in transparent huge pages, for `calibrate`'s O_DIRECT reads into memory of few
//! segments (as the page cache's large folios are): the only unsafe code of the crate.
//!
//! Invariant: a [`HugeBuffer`] owns one private anonymous mapping ([`AnonMap`], unmapped
//! when the buffer is dropped) and hands out slices of `len` bytes from `base`, which is
//! 2 MiB aligned inside it, so the slices never leave the mapping and no two live buffers
//! share memory.

use std::io;

use iolab_sys::AnonMap;

/// A PMD huge page on x86-64 and arm64 with 4 KiB pages.
pub const HUGE_PAGE: usize = 2 << 20;

pub struct HugeBuffer {
    /// Held for its `Drop`: `base` points into it.
    _map: AnonMap,
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by the buffer alone (see the module's invariant), `base`
// points into it; moving the buffer to another thread moves that ownership.
unsafe impl Send for HugeBuffer {}

impl HugeBuffer {
    /// `len` bytes (rounded up to whole huge pages), asked for as huge pages
    /// (`MADV_HUGEPAGE`) and touched, so the kernel has placed them before any I/O.
    /// Whether it could is for [`anon_huge_bytes`] to tell.
    pub fn new(len: usize) -> io::Result<HugeBuffer> {
        let len = len.div_ceil(HUGE_PAGE).max(1) * HUGE_PAGE;
        let map = AnonMap::new(len + HUGE_PAGE, false)?;
        let skip = (HUGE_PAGE - map.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
        // SAFETY: skip < HUGE_PAGE, so base..base+len lies inside the len + HUGE_PAGE mapping.
        let base = unsafe { map.as_ptr().add(skip) };
        let mut b = HugeBuffer {
            _map: map,
            base,
            len,
        };
        // SAFETY: advice on our own mapping's range.
        if unsafe { libc::madvise(base.cast(), len, libc::MADV_HUGEPAGE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let s = b.slice_mut(0, len);
        for i in (0..len).step_by(4096) {
            s[i] = 1;
        }
        Ok(b)
    }

    /// `n` bytes from `at` (both within the buffer, else a panic: a caller's bug).
    pub fn slice_mut(&mut self, at: usize, n: usize) -> &mut [u8] {
        assert!(at.checked_add(n).is_some_and(|e| e <= self.len));
        // SAFETY: in bounds of our mapping (asserted), borrowed mutably from the one owner.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(at), n) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// This process's anonymous memory in huge pages (`AnonHugePages` of
/// `/proc/self/smaps_rollup`), bytes; None where the kernel does not say.
pub fn anon_huge_bytes() -> Option<u64> {
    let t = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = t.lines().find(|l| l.starts_with("AnonHugePages:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_aligned_writable_and_whole_huge_pages() {
        let mut b = HugeBuffer::new(3 << 20).unwrap();
        assert_eq!(b.len(), 4 << 20);
        let s = b.slice_mut(4096, 8192);
        assert_eq!(s.as_ptr() as usize % 4096, 0);
        s.fill(7);
        let len = b.len();
        assert!(b
            .slice_mut(0, len)
            .iter()
            .skip(4096)
            .take(8192)
            .all(|&x| x == 7));
    }

    #[test]
    #[should_panic]
    fn a_slice_past_the_end_is_refused() {
        let mut b = HugeBuffer::new(1).unwrap();
        b.slice_mut(HUGE_PAGE - 1, 2);
    }
}
