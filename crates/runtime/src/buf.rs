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
