//! Owned buffers: the kernel reads or writes them while an operation is in flight, so an
//! operation takes its buffer by value and gives it back with the result.

/// A buffer the kernel may read from: bytes `[0, len)` are sent.
///
/// # Safety
/// `stable_ptr` must point to `len` initialised bytes that stay valid and unmoved while the
/// value is alive and not mutated (moving the value itself must not move the bytes).
pub unsafe trait IoBuf: 'static {
    fn stable_ptr(&self) -> *const u8;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A buffer the kernel may write into: a read fills bytes `[0, len)` (for a `Vec`, its
/// current length: `vec![0; 4096]` reads up to 4096 bytes; the length is not changed).
///
/// # Safety
/// As [`IoBuf`], and `stable_mut_ptr` must be valid for writes of `len` bytes.
pub unsafe trait IoBufMut: IoBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8;
}

// SAFETY: a Vec's heap buffer does not move when the Vec value moves.
unsafe impl IoBuf for Vec<u8> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

// SAFETY: as above; writes stay within the initialised length.
unsafe impl IoBufMut for Vec<u8> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
}

// SAFETY: a boxed slice's heap buffer does not move when the Box moves.
unsafe impl IoBuf for Box<[u8]> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

// SAFETY: as above.
unsafe impl IoBufMut for Box<[u8]> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
}

// SAFETY: static data never moves and is never freed.
unsafe impl IoBuf for &'static [u8] {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

// SAFETY: static data never moves and is never freed.
unsafe impl IoBuf for &'static str {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn len(&self) -> usize {
        str::len(self)
    }
}

// SAFETY: a String's heap buffer does not move when the String moves.
unsafe impl IoBuf for String {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn len(&self) -> usize {
        String::len(self)
    }
}

// SAFETY: the Arc's allocation does not move and is not freed while we hold a reference.
unsafe impl IoBuf for std::sync::Arc<[u8]> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

// SAFETY: a `Bytes` points to heap or static memory that does not move when the handle
// moves and stays alive while the handle does (the response chunks of iolab-http).
unsafe impl IoBuf for bytes::Bytes {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn len(&self) -> usize {
        bytes::Bytes::len(self)
    }
}

/// A range of an owned buffer, itself an owned buffer: lets an operation read into the free
/// tail of a buffer, or send part of it, without copying or giving up the rest. Get the
/// buffer back with [`Slice::into_inner`].
pub struct Slice<B> {
    buf: B,
    begin: usize,
    end: usize,
}

impl<B: IoBuf> Slice<B> {
    /// Bytes `[begin, end)` of `buf`.
    ///
    /// # Panics
    /// If the range is not within `buf`'s length (a bug of the caller, as slice indexing).
    pub fn new(buf: B, begin: usize, end: usize) -> Slice<B> {
        assert!(
            begin <= end && end <= buf.len(),
            "slice {begin}..{end} of a buffer of {}",
            buf.len()
        );
        Slice { buf, begin, end }
    }

    pub fn into_inner(self) -> B {
        self.buf
    }
}

// SAFETY: the range lies within the inner buffer's length (checked in `new`, and the inner
// buffer cannot be reached to shrink it while the Slice owns it), whose bytes are stable.
unsafe impl<B: IoBuf> IoBuf for Slice<B> {
    fn stable_ptr(&self) -> *const u8 {
        // In bounds: begin <= len.
        self.buf.stable_ptr().wrapping_add(self.begin)
    }
    fn len(&self) -> usize {
        self.end - self.begin
    }
}

// SAFETY: as above; writes of `len` bytes stay within the inner buffer's range.
unsafe impl<B: IoBufMut> IoBufMut for Slice<B> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.buf.stable_mut_ptr().wrapping_add(self.begin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_covers_its_range_and_gives_the_buffer_back() {
        let v: Vec<u8> = (0..10).collect();
        let base = v.as_ptr();
        let mut s = Slice::new(v, 3, 7);
        assert_eq!(s.len(), 4);
        assert_eq!(s.stable_ptr(), base.wrapping_add(3));
        // SAFETY: the pointer is valid for len() bytes (the slice's contract).
        unsafe { *s.stable_mut_ptr() = 99 };
        let v = s.into_inner();
        assert_eq!(&v[..5], &[0, 1, 2, 99, 4]);
        assert_eq!(Slice::new(v, 10, 10).len(), 0);
    }

    #[test]
    #[should_panic(expected = "slice 4..11")]
    fn a_slice_past_the_buffer_is_refused() {
        let _ = Slice::new(vec![0u8; 10], 4, 11);
    }
}
