//! A payload DP holds: bytes in memory (a file the BE's cache holds), or a range of an
//! open file, read in bounded pieces as it is sent (issue 43 §2: the BE read every payload
//! whole, so one GET of a 768 MiB file took its RSS from 73 to 794 MB).

use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;

/// Bytes read from a file at once: what a transfer, a relay or a repaired socket holds of a
/// file payload.
pub const CHUNK: usize = 256 << 10;

#[derive(Debug, Clone)]
pub enum Payload {
    Memory(Bytes),
    /// `len` bytes of `file` from its start.
    File {
        file: Arc<std::fs::File>,
        len: u64,
    },
}

impl From<Bytes> for Payload {
    fn from(b: Bytes) -> Payload {
        Payload::Memory(b)
    }
}

impl From<iolab_http::direct::Source> for Payload {
    fn from(s: iolab_http::direct::Source) -> Payload {
        match s {
            iolab_http::direct::Source::Memory(b) => Payload::Memory(b),
            iolab_http::direct::Source::File { file, len } => Payload::File { file, len },
        }
    }
}

impl Payload {
    pub fn len(&self) -> usize {
        match self {
            Payload::Memory(b) => b.len(),
            Payload::File { len, .. } => *len as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The payload as a reader of bounded pieces.
    pub fn reader(self) -> Reader {
        Reader {
            payload: self,
            buf: Vec::new(),
            at: 0,
        }
    }
}

/// Reads a payload's bytes where they are asked for: a memory payload's slices, a file
/// payload's through one buffer of at least [`CHUNK`] bytes (refilled where a range falls
/// outside it, as a go-back-N resend does).
#[derive(Debug)]
pub struct Reader {
    payload: Payload,
    buf: Vec<u8>,
    /// Payload offset of `buf[0]`.
    at: usize,
}

impl Reader {
    pub fn len(&self) -> usize {
        self.payload.len()
    }

    pub fn is_empty(&self) -> bool {
        self.payload.is_empty()
    }

    /// The payload is in memory (any range of it costs nothing).
    pub fn is_memory(&self) -> bool {
        matches!(self.payload, Payload::Memory(_))
    }

    /// Bytes `[from, to)` of the payload (`to` at most its length).
    pub fn get(&mut self, from: usize, to: usize) -> io::Result<&[u8]> {
        let (file, len) = match &self.payload {
            Payload::Memory(b) => return Ok(&b[from..to]),
            Payload::File { file, len } => (file, *len as usize),
        };
        if from < self.at || to > self.at + self.buf.len() {
            let end = (from + CHUNK.max(to - from)).min(len);
            self.buf.resize(end - from, 0);
            file.read_exact_at(&mut self.buf, from as u64)?;
            self.at = from;
        }
        Ok(&self.buf[from - self.at..to - self.at])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_payload_is_read_in_bounded_pieces_where_asked() {
        let dir = iolab_sys::testing::tempdir("disc-payload").unwrap();
        let p = dir.path().join("f");
        let data = iolab_sys::testing::random_bytes(3 * CHUNK + 17, 5);
        std::fs::write(&p, &data).unwrap();
        let file = Arc::new(std::fs::File::open(&p).unwrap());
        let mut r = Payload::File {
            file,
            len: data.len() as u64,
        }
        .reader();
        for (a, b) in [
            (0, 10),
            (5, 1000),
            (CHUNK - 3, CHUNK + 3),
            (100, 200),
            (3 * CHUNK, 3 * CHUNK + 17),
        ] {
            assert_eq!(r.get(a, b).unwrap(), &data[a..b]);
            assert!(r.buf.len() <= CHUNK, "{}", r.buf.len());
        }
        let mut m = Payload::from(Bytes::from(data.clone())).reader();
        assert_eq!(m.get(7, 9).unwrap(), &data[7..9]);
    }
}
