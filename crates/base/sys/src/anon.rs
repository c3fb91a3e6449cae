//! Private anonymous memory, owned: one `mmap` and its `munmap`, for the crates that need
//! page-aligned memory the allocator does not give (AF_XDP's UMEM, huge-page buffers, the
//! fault-path measurements of the tiers).
//!
//! Invariant: an [`AnonMap`] owns one private anonymous mapping of `len` bytes at `ptr`,
//! made by `mmap` in [`AnonMap::new`] and unmapped only by its `Drop`. Nothing else maps or
//! unmaps that range; what callers do with the bytes (slices, kernel registrations) must
//! end before the map is dropped.

use std::io;
use std::ptr::NonNull;

pub struct AnonMap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by the value alone (see the invariant); moving it to another
// thread moves that ownership.
unsafe impl Send for AnonMap {}

impl AnonMap {
    /// `len` zeroed, readable and writable bytes, page aligned. With `populate`, the pages
    /// are faulted in now (`MAP_POPULATE`) rather than at first touch.
    pub fn new(len: usize, populate: bool) -> io::Result<AnonMap> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an anonymous mapping of 0 bytes",
            ));
        }
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if populate {
            flags |= libc::MAP_POPULATE;
        }
        // SAFETY: a new private anonymous mapping: no existing memory is touched; the
        // result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave 0"))?;
        Ok(AnonMap { ptr, len })
    }

    /// The first byte of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes mapped (as asked for; the kernel rounds the mapping up to whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping (the invariant), unmapped once, here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_zeroed_writable_pages_and_refuses_zero_bytes() {
        let m = AnonMap::new(3 * 4096 + 5, true).unwrap();
        assert_eq!(m.as_ptr() as usize % 4096, 0);
        // SAFETY: within the mapping's len bytes, owned by `m`, alive for the slice.
        let s = unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), m.len()) };
        assert!(s.iter().all(|&b| b == 0));
        s[m.len() - 1] = 7;
        assert_eq!(s[m.len() - 1], 7);
        assert!(AnonMap::new(0, false).is_err());
        // Unmapped on drop: the address range is free again (a new mapping of the same
        // size may be placed there; nothing to assert portably beyond no crash).
        drop(m);
    }
}
