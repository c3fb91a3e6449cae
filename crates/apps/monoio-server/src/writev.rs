//! The session's pending chunks as one owned `writev` buffer for monoio.
//!
//! monoio takes a write's buffers by value and keeps them until the kernel has finished
//! with them, even when the write's future is dropped (a timeout): so the iovecs must point
//! into memory the buffer itself owns. `Chunks` holds a reference-counted clone of each
//! chunk (`Bytes`: no copy of the bytes) and the iovec array describing them.

use std::collections::VecDeque;

use bytes::Bytes;
use monoio::buf::IoVecBuf;

/// Most chunks one `writev` carries (the models' default).
const MAX_IOV: usize = iolab_servers::MAX_IOV;

/// Up to [`MAX_IOV`] chunks and their iovecs, refilled for each write (its vectors keep
/// their allocation).
#[derive(Default)]
pub struct Chunks {
    chunks: Vec<Bytes>,
    iovecs: Vec<libc::iovec>,
}

impl Chunks {
    /// The first [`MAX_IOV`] chunks of `pending` (the session keeps its own copies until
    /// `advance`).
    pub fn fill(&mut self, pending: &VecDeque<Bytes>) {
        self.chunks.clear();
        self.iovecs.clear();
        for c in pending.iter().take(MAX_IOV) {
            self.chunks.push(c.clone());
        }
        for c in &self.chunks {
            self.iovecs.push(libc::iovec {
                iov_base: c.as_ptr() as *mut libc::c_void,
                iov_len: c.len(),
            });
        }
    }

    /// Total bytes described.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.iovecs.iter().map(|v| v.iov_len).sum()
    }
}

// SAFETY: every iovec points into a `Bytes` held in `self.chunks`; a `Bytes`' data lives on
// the heap (or in static memory) and does not move when `Chunks` moves, and neither vector
// is touched between `fill` and the end of the write that owns `self`, so the pointer and
// count stay valid and unchanged while the runtime owns the value. The kernel only reads
// through them (writev).
unsafe impl IoVecBuf for Chunks {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        self.iovecs.as_ptr()
    }

    fn read_iovec_len(&self) -> usize {
        self.iovecs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_describe_the_first_max_iov_pending_chunks() {
        let pending: VecDeque<Bytes> = (0..MAX_IOV + 3)
            .map(|i| Bytes::from(vec![i as u8; i + 1]))
            .collect();
        let mut c = Chunks::default();
        c.fill(&pending);
        assert_eq!(c.read_iovec_len(), MAX_IOV);
        assert_eq!(c.len(), (1..=MAX_IOV).sum::<usize>());
        // SAFETY: the test reads the iovecs `fill` just wrote, while `c` owns their data.
        let first = unsafe { std::slice::from_raw_parts(c.read_iovec_ptr(), 2) };
        assert_eq!(first[1].iov_len, 2);
        assert_eq!(first[1].iov_base as *const u8, pending[1].as_ptr());
        c.fill(&VecDeque::from([Bytes::from_static(b"x")]));
        assert_eq!((c.read_iovec_len(), c.len()), (1, 1));
    }
}
