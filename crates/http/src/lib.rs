//! HTTP/1.1 request parsing and static-file responses, shared by every iolab server model.
//!
//! CONTRACT (used by `iolab-servers` and `iolab-peers`; extend it, do not rename it):
//! a model reads bytes from a socket, gives them to [`Session::feed`], writes
//! [`Session::pending`] to the socket, calls [`Session::advance`] with the count written, and
//! closes the connection once [`Session::should_close`] is true and nothing is pending.
//! Every model therefore serves exactly the same bytes and counts exactly the same statuses.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

/// Explicit limits; every one is documented in the README and configurable.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Longest request line accepted; longer gets 414.
    pub max_request_line: usize,
    /// Largest header block (excluding the request line); larger gets 431.
    pub max_header_bytes: usize,
    /// Most header lines; more gets 431.
    pub max_headers: usize,
    /// Largest request body drained before answering; larger gets 413 and the connection closes.
    pub max_body: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_line: 8 * 1024,
            max_header_bytes: 16 * 1024,
            max_headers: 100,
            max_body: 64 * 1024,
        }
    }
}

/// The static site: a root directory (canonicalised) and a file cache shared by all
/// connections of a server.
pub struct Site {
    root: PathBuf,
    limits: Limits,
}

impl Site {
    /// Opens `root` (must be a directory). Errors are clear `io::Error`s naming the path.
    pub fn new(root: impl Into<PathBuf>, limits: Limits) -> std::io::Result<Arc<Site>> {
        let root = root.into();
        let _ = &limits;
        todo!("iolab-http: Site::new({})", root.display())
    }

    pub fn root(&self) -> &std::path::Path {
        &self.root
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }
}

/// Per-connection HTTP state: incremental parser plus the queue of response bytes to send.
pub struct Session {
    _site: Arc<Site>,
}

impl Session {
    pub fn new(site: Arc<Site>) -> Session {
        Session { _site: site }
    }

    /// Feeds bytes read from the socket (any split: partial requests, several pipelined
    /// requests). Each complete request is answered in order by appending its response to the
    /// pending queue; `on_response(status)` is called once per response queued.
    pub fn feed(&mut self, data: &[u8], on_response: impl FnMut(u16)) {
        let _ = (data, on_response);
        todo!("iolab-http: Session::feed")
    }

    /// Response bytes not yet written, in order, as cheap `Bytes` chunks (usable as iovecs).
    pub fn pending(&self) -> &std::collections::VecDeque<Bytes> {
        todo!("iolab-http: Session::pending")
    }

    /// True when some bytes are waiting to be written.
    pub fn has_pending(&self) -> bool {
        todo!("iolab-http: Session::has_pending")
    }

    /// Marks `n` bytes of `pending()` as written.
    pub fn advance(&mut self, n: usize) {
        let _ = n;
        todo!("iolab-http: Session::advance")
    }

    /// True once the connection must close after the pending bytes are flushed
    /// (HTTP/1.0 without keep-alive, `Connection: close`, or a fatal parse error).
    pub fn should_close(&self) -> bool {
        todo!("iolab-http: Session::should_close")
    }
}
