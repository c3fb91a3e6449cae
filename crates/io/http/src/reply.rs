//! A response as the session builds it before queueing: status, head and where the body is.

use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;

use crate::response::{error_body, head};
use crate::site::Load;

const TEXT_PLAIN: &[u8] = b"Content-Type: text/plain; charset=utf-8\r\n";

/// The body of a response being built.
pub(crate) enum Payload {
    None,
    Memory(Bytes),
    /// `len` bytes of `file` from `offset`, read in chunks as they are sent; `fill`: the
    /// whole of a cache miss, read in one piece and then cached.
    Disk {
        file: Arc<File>,
        offset: u64,
        len: u64,
        fill: Option<Arc<Load>>,
    },
}

/// A complete response: status, head and body.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) head: Bytes,
    pub(crate) payload: Payload,
}

impl Reply {
    /// An error or redirect: `fields` (each line ending in CRLF) after the `text/plain`
    /// content type, and the one-line body of `status`.
    pub(crate) fn text(status: u16, fields: &[&[u8]], keep_alive: bool) -> Reply {
        let body = error_body(status);
        let mut all: Vec<&[u8]> = vec![TEXT_PLAIN];
        all.extend_from_slice(fields);
        Reply {
            status,
            head: head(status, &all, Some(body.len() as u64), keep_alive),
            payload: Payload::Memory(body),
        }
    }
}
