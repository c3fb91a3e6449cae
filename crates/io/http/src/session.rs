//! The per-connection state machine: incremental request parsing, body draining, and the
//! ordered queue of response bytes.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};

use crate::response::{error_body, head};
use crate::site::{read_at_blocking, Body as FileBody, FileRef, Load, Lookup};
use crate::{Site, STREAM_CHUNK};

/// Longest chunk-size line (size plus extensions) of a chunked body; longer is a 400.
const MAX_CHUNK_LINE: usize = 4096;

const TEXT_PLAIN: &[u8] = b"Content-Type: text/plain; charset=utf-8\r\n";

/// Where the parser is between requests.
#[derive(Debug, Clone, Copy)]
enum Body {
    /// Expecting a request head.
    None,
    /// Discarding this many more bytes of a `Content-Length` body.
    Length(u64),
    /// Discarding a chunked body.
    Chunked(Chunk),
}

#[derive(Debug, Clone, Copy)]
enum Chunk {
    /// Expecting a chunk-size line; `total` data bytes seen so far.
    Size { total: u64 },
    /// Inside chunk data.
    Data { left: u64, total: u64 },
    /// Expecting the CRLF after chunk data.
    DataEnd { total: u64 },
    /// Expecting trailer fields or the final empty line.
    Trailer { bytes: usize, lines: usize },
}

enum Method {
    Get,
    Head,
    Other,
}

/// What the head of a request says, once it parsed.
struct Request<'a> {
    method: Method,
    target: &'a [u8],
    keep_alive: bool,
    content_length: Option<u64>,
    chunked: bool,
    http10: bool,
    /// The header fields the answer depends on (RFC 9110 §13 and §14), raw values.
    cond: Conditions<'a>,
}

/// Request header fields that select or condition the answer for a file.
#[derive(Default)]
struct Conditions<'a> {
    range: Option<&'a [u8]>,
    if_range: Option<&'a [u8]>,
    if_match: Option<&'a [u8]>,
    if_none_match: Option<&'a [u8]>,
    if_modified_since: Option<&'a [u8]>,
    if_unmodified_since: Option<&'a [u8]>,
}

/// The body of a response being built.
enum Payload {
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
struct Reply {
    status: u16,
    head: Bytes,
    payload: Payload,
}

/// A response built but held back until a chunked request body has been drained, because
/// the body may still turn the answer into a 400/413.
struct Held {
    reply: Reply,
    keep_alive: bool,
}

/// The rest of a streamed file body: it follows everything in `out`.
struct Stream {
    file: Arc<File>,
    offset: u64,
    left: u64,
    /// A cache miss read whole (one read of `left` bytes), then cached.
    fill: Option<Arc<Load>>,
}

impl Stream {
    /// Bytes the next read asks for: the whole rest of a cache miss, else one chunk.
    fn next_len(&self) -> usize {
        let chunk = if self.fill.is_some() {
            self.left
        } else {
            self.left.min(STREAM_CHUNK as u64)
        };
        usize::try_from(chunk).unwrap_or(usize::MAX)
    }
}

/// Who reads the bytes of a file that are not in memory: a cache miss (read whole, then
/// cached) and the [`STREAM_CHUNK`] chunks of a file too large to cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileReads {
    /// The session itself, on the caller's thread, with `pread` — blocking that thread
    /// ([`Session::new`]): the thread and readiness models.
    Blocking,
    /// The caller: the session says what it needs ([`Session::file_read`]) and stays paused
    /// until the bytes come back ([`Session::file_read_done`]): the models that read files
    /// through io_uring or a thread pool, so that a slow disk never stalls their loop.
    Caller,
}

/// A read of a file that a [`FileReads::Caller`] session waits for: `len` bytes at `offset`
/// of the descriptor [`FileRead::fd`], which stays open as long as this value lives (keep it
/// until the read completes).
pub struct FileRead {
    file: Arc<File>,
    offset: u64,
    len: usize,
    delay: Duration,
}

impl FileRead {
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The delay a test injects before this read ([`crate::Site::inject_read_delay`]);
    /// zero otherwise. A model reading through the ring applies it itself (a linked
    /// timeout); [`FileRead::read_blocking`] sleeps it.
    pub fn injected_delay(&self) -> Duration {
        self.delay
    }

    /// Performs the read on this thread (`pread` until `len` bytes or end of file), for a
    /// model that runs it on a thread pool. Fewer bytes than asked means end of file.
    pub fn read_blocking(&self) -> io::Result<Vec<u8>> {
        read_at_blocking(&self.file, self.offset, self.len, self.delay)
    }
}

/// Per-connection HTTP state: incremental parser plus the queue of response bytes to send.
pub struct Session {
    site: Arc<Site>,
    /// Unparsed input: the start of an incomplete request head or chunk line.
    buf: Vec<u8>,
    /// How far into the current head (from its first byte) the terminator search has gone.
    scan: usize,
    /// Offset of the LF ending the request line of the current head, once seen.
    line_end: Option<usize>,
    body: Body,
    held: Option<Held>,
    out: VecDeque<Bytes>,
    out_len: usize,
    /// A file body still on disk, sent after `out`; parsing pauses while it is there.
    stream: Option<Stream>,
    reads: FileReads,
    /// [`FileReads::Caller`]: a read was handed out by `file_read` and is not done.
    reading: bool,
    closing: bool,
    /// Scratch for the decoded request path, reused across requests.
    key: Vec<u8>,
}

impl Session {
    /// A session that reads files itself, blocking ([`FileReads::Blocking`]).
    pub fn new(site: Arc<Site>) -> Session {
        Session::with_file_reads(site, FileReads::Blocking)
    }

    /// A session whose file reads are done by `reads`.
    pub fn with_file_reads(site: Arc<Site>, reads: FileReads) -> Session {
        Session {
            site,
            buf: Vec::new(),
            scan: 0,
            line_end: None,
            body: Body::None,
            held: None,
            out: VecDeque::new(),
            out_len: 0,
            stream: None,
            reads,
            reading: false,
            closing: false,
            key: Vec::new(),
        }
    }

    /// Feeds bytes read from the socket (any split: partial requests, several pipelined
    /// requests). Complete requests are answered in order by appending their responses to the
    /// pending queue; `on_response(status)` is called once per response queued.
    ///
    /// Backpressure: answering stops while the queued response bytes reach
    /// `Limits::max_queued` or a file is being streamed; the input not yet parsed stays in
    /// the session. A model must not read more while [`Session::has_pending`] is true, and
    /// must call [`Session::resume`] after [`Session::advance`], so that the held input is
    /// answered as the queue drains. The memory of a connection therefore stays bounded by
    /// one read, the header limits, `max_queued` and one [`STREAM_CHUNK`], whatever the
    /// client pipelines.
    ///
    /// Once [`Session::should_close`] is true, further input is ignored.
    pub fn feed(&mut self, data: &[u8], mut on_response: impl FnMut(u16)) {
        if self.closing {
            return;
        }
        if self.buf.is_empty() {
            // The common case: parse straight from the caller's buffer, copy only a tail.
            let used = self.process(data, &mut on_response);
            if !self.closing {
                self.buf.extend_from_slice(&data[used..]);
            }
        } else {
            let mut buf = std::mem::take(&mut self.buf);
            buf.extend_from_slice(data);
            let used = self.process(&buf, &mut on_response);
            if self.closing {
                buf.clear();
            } else {
                buf.drain(..used);
            }
            if buf.is_empty() && buf.capacity() > 64 * 1024 {
                buf = Vec::new();
            }
            self.buf = buf;
        }
    }

    /// Answers the input held back by backpressure, as far as the bound allows now. Cheap
    /// when nothing is held; call it after every [`Session::advance`].
    pub fn resume(&mut self, on_response: impl FnMut(u16)) {
        if !self.buf.is_empty() && !self.paused() {
            self.feed(&[], on_response);
        }
    }

    /// Response bytes ready to be written, in order, as cheap `Bytes` chunks (usable as
    /// iovecs). A file body not in memory appears here one read at a time: with
    /// [`FileReads::Blocking`], after `advance` the next chunk is read from disk (a blocking
    /// `pread` of at most [`STREAM_CHUNK`] bytes, or a whole cache miss, on the caller's
    /// thread); with [`FileReads::Caller`], once the caller has done [`Session::file_read`].
    pub fn pending(&self) -> &VecDeque<Bytes> {
        &self.out
    }

    /// True when some bytes are waiting to be written.
    pub fn has_pending(&self) -> bool {
        self.out_len > 0
    }

    /// Number of bytes in [`Session::pending`] (not counting the unread part of a streamed
    /// file, see [`Session::queued_len`]).
    pub fn pending_len(&self) -> usize {
        self.out_len
    }

    /// Every response byte still to be sent: `pending_len()` plus what a streamed file has
    /// left on disk.
    pub fn queued_len(&self) -> u64 {
        self.out_len as u64 + self.stream.as_ref().map_or(0, |s| s.left)
    }

    /// Marks `n` bytes of `pending()` as written. `n` larger than [`Session::pending_len`]
    /// is treated as everything. Reads the next chunk of a streamed file when the queue runs
    /// low.
    pub fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.out.front_mut() else {
                break;
            };
            if n < front.len() {
                front.advance(n);
                self.out_len -= n;
                break;
            }
            n -= front.len();
            self.out_len -= front.len();
            self.out.pop_front();
        }
        self.refill();
    }

    /// True while new requests must wait: too much queued, or a file streaming.
    fn paused(&self) -> bool {
        self.stream.is_some() || self.out_len >= self.site.limits().max_queued
    }

    /// Keeps at least one chunk of a streamed file in `out` while the file has bytes left
    /// ([`FileReads::Blocking`]; a `Caller` session waits for [`Session::file_read`]).
    fn refill(&mut self) {
        if self.reads == FileReads::Caller {
            return;
        }
        let delay = self.site.files().read_delay();
        while self.out_len < STREAM_CHUNK {
            let Some(stream) = &self.stream else {
                return;
            };
            let data = read_at_blocking(&stream.file, stream.offset, stream.next_len(), delay)
                .unwrap_or_default();
            self.take_read(data);
        }
    }

    /// The file read this session needs now, if any ([`FileReads::Caller`] only): at most
    /// one at a time, and only while less than a [`STREAM_CHUNK`] is pending. The session
    /// stays paused (answers nothing more) until [`Session::file_read_done`]. Call it before
    /// looking at [`Session::pending`]: the bytes it brings usually go out in the same send.
    pub fn file_read(&mut self) -> Option<FileRead> {
        if self.reads != FileReads::Caller || self.reading || self.out_len >= STREAM_CHUNK {
            return None;
        }
        let stream = self.stream.as_ref()?;
        self.reading = true;
        Some(FileRead {
            file: Arc::clone(&stream.file),
            offset: stream.offset,
            len: stream.next_len(),
            delay: self.site.files().read_delay(),
        })
    }

    /// The outcome of the read [`Session::file_read`] handed out: its bytes (fewer than asked
    /// is fine; none, or an error, ends the connection after what is queued). Then answers
    /// what the read held back, as [`Session::resume`] does.
    pub fn file_read_done(&mut self, result: io::Result<Vec<u8>>, on_response: impl FnMut(u16)) {
        if !std::mem::take(&mut self.reading) {
            return;
        }
        self.take_read(result.unwrap_or_default());
        self.resume(on_response);
    }

    /// Queues bytes read at the stream's offset. No bytes (end of file before the announced
    /// length, or a read error) ends the connection after what was queued: the head
    /// announced a length that can no longer be honoured. A cache miss read whole is cached.
    fn take_read(&mut self, mut data: Vec<u8>) {
        let Some(stream) = &mut self.stream else {
            return;
        };
        let want = stream.next_len();
        data.truncate(want);
        if data.is_empty() {
            self.stream = None;
            self.closing = true;
            self.buf.clear();
            return;
        }
        let got = data.len();
        let chunk = Bytes::from(data);
        stream.offset += got as u64;
        stream.left -= got as u64;
        // A partial read of a miss is not cached: the rest is streamed in chunks.
        if let Some(load) = stream.fill.take() {
            if got == want {
                self.site.files().finish_load(&load, chunk.clone());
            }
        }
        if stream.left == 0 {
            self.stream = None;
        }
        self.push(chunk);
    }

    /// True once the connection must close after the pending bytes are flushed
    /// (HTTP/1.0 without keep-alive, `Connection: close`, or a fatal parse error).
    pub fn should_close(&self) -> bool {
        self.closing
    }

    /// True when no request is partly received: closing the connection now loses nothing
    /// the client sent (useful to tell an idle keep-alive timeout from a slow client).
    pub fn is_between_requests(&self) -> bool {
        self.buf.is_empty() && matches!(self.body, Body::None) && self.held.is_none()
    }

    fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.out_len += chunk.len();
            self.out.push_back(chunk);
        }
    }

    /// Queues an error response that ends the connection.
    fn fatal(&mut self, status: u16, on_response: &mut impl FnMut(u16)) {
        self.held = None;
        let body = error_body(status);
        let h = head(status, &[TEXT_PLAIN], Some(body.len() as u64), false);
        self.push(h);
        self.push(body);
        self.closing = true;
        on_response(status);
    }

    /// Parses as much of `input` as possible; returns how many bytes were consumed.
    fn process(&mut self, input: &[u8], on_response: &mut impl FnMut(u16)) -> usize {
        let mut pos = 0;
        while !self.closing && !self.paused() {
            let rest = &input[pos..];
            let used = match self.body {
                Body::None => self.step_head(rest, on_response),
                Body::Length(left) => {
                    let n = left.min(rest.len() as u64);
                    self.body = if n == left {
                        Body::None
                    } else {
                        Body::Length(left - n)
                    };
                    // n <= rest.len(), so it fits in usize.
                    Some(n as usize)
                }
                Body::Chunked(state) => self.step_chunk(state, rest, on_response),
            };
            match used {
                Some(0) | None => break,
                Some(n) => pos += n,
            }
        }
        if self.closing {
            input.len()
        } else {
            pos
        }
    }

    /// Consumes one request head (or leading empty lines) if complete; `None` when more
    /// input is needed.
    fn step_head(&mut self, rest: &[u8], on_response: &mut impl FnMut(u16)) -> Option<usize> {
        // RFC 9112 §2.2: ignore empty lines before a request line.
        if self.scan == 0 {
            let mut skip = 0;
            loop {
                match rest[skip..] {
                    [b'\n', ..] => skip += 1,
                    [b'\r', b'\n', ..] => skip += 2,
                    _ => break,
                }
            }
            if skip > 0 {
                return Some(skip);
            }
            if rest == b"\r" {
                return None;
            }
        }
        if rest.is_empty() {
            return None;
        }
        let limits = self.site.limits();
        let (max_line, max_header_bytes) = (limits.max_request_line, limits.max_header_bytes);
        let mut i = self.scan;
        let end = loop {
            let Some(off) = memchr::memchr(b'\n', &rest[i..]) else {
                self.scan = rest.len();
                break None;
            };
            let nl = i + off;
            if self.line_end.is_none() {
                let len = if nl > 0 && rest[nl - 1] == b'\r' {
                    nl - 1
                } else {
                    nl
                };
                if len > max_line {
                    self.fatal(414, on_response);
                    return None;
                }
                self.line_end = Some(nl);
            }
            match rest.get(nl + 1) {
                Some(b'\n') => break Some(nl + 2),
                Some(b'\r') => match rest.get(nl + 2) {
                    Some(b'\n') => break Some(nl + 3),
                    Some(_) => i = nl + 1,
                    None => {
                        self.scan = nl;
                        break None;
                    }
                },
                Some(_) => i = nl + 1,
                None => {
                    self.scan = nl;
                    break None;
                }
            }
        };
        let Some(end) = end else {
            // Incomplete: refuse as soon as the limits are certainly exceeded, so that a
            // client cannot make us buffer without bound.
            match self.line_end {
                None if rest.len() > max_line + 1 => self.fatal(414, on_response),
                Some(le) if rest.len() - (le + 1) > max_header_bytes + 2 => {
                    self.fatal(431, on_response)
                }
                _ => {}
            }
            return None;
        };
        let line_end = self.line_end.unwrap_or(0);
        self.scan = 0;
        self.line_end = None;
        // The header block runs from after the request line to the start of the empty line.
        let empty_line_start = if rest[end - 2] == b'\r' {
            end - 2
        } else {
            end - 1
        };
        let header_bytes = empty_line_start.saturating_sub(line_end + 1);
        if header_bytes > max_header_bytes {
            self.fatal(431, on_response);
            return None;
        }
        match parse_head(&rest[..empty_line_start], line_end, self.site.limits()) {
            Ok(req) => self.answer(req, on_response),
            Err(status) => self.fatal(status, on_response),
        }
        Some(end)
    }

    /// Frames the body of a parsed request and queues (or holds) its response.
    fn answer(&mut self, req: Request<'_>, on_response: &mut impl FnMut(u16)) {
        let max_body = self.site.limits().max_body as u64;
        if req.chunked {
            if req.content_length.is_some() || req.http10 {
                // Both framings at once is a smuggling attempt; HTTP/1.0 has no chunked.
                self.fatal(400, on_response);
                return;
            }
        } else if let Some(len) = req.content_length {
            if len > max_body {
                self.fatal(413, on_response);
                return;
            }
        }
        let reply = match req.method {
            Method::Other => {
                let body = error_body(405);
                let h = head(
                    405,
                    &[TEXT_PLAIN, b"Allow: GET, HEAD\r\n"],
                    Some(body.len() as u64),
                    req.keep_alive,
                );
                Reply {
                    status: 405,
                    head: h,
                    payload: Payload::Memory(body),
                }
            }
            Method::Get | Method::Head => {
                let mut reply = self.serve(&req);
                if reply.status == 400 {
                    // An unusable target is a malformed request like any other.
                    self.fatal(400, on_response);
                    return;
                }
                if matches!(req.method, Method::Head) {
                    reply.payload = Payload::None;
                }
                reply
            }
        };
        if req.chunked {
            self.held = Some(Held {
                reply,
                keep_alive: req.keep_alive,
            });
            self.body = Body::Chunked(Chunk::Size { total: 0 });
            return;
        }
        if let Some(len) = req.content_length.filter(|&l| l > 0) {
            // The answer cannot change any more, so it goes out before the body is drained
            // (a client waiting on `Expect: 100-continue` gets it at once).
            self.body = Body::Length(len);
        }
        self.emit(reply, req.keep_alive, on_response);
    }

    fn emit(&mut self, reply: Reply, keep_alive: bool, on_response: &mut impl FnMut(u16)) {
        self.push(reply.head);
        match reply.payload {
            Payload::None => {}
            Payload::Memory(b) => self.push(b),
            Payload::Disk {
                file,
                offset,
                len,
                fill,
            } => {
                if len > 0 {
                    self.stream = Some(Stream {
                        file,
                        offset,
                        left: len,
                        fill,
                    });
                    self.refill();
                }
            }
        }
        if !keep_alive {
            self.closing = true;
        }
        on_response(reply.status);
    }

    /// Maps a GET or HEAD request to its response.
    fn serve(&mut self, req: &Request<'_>) -> Reply {
        let keep_alive = req.keep_alive;
        let lookup = match normalise_target(req.target, &mut self.key) {
            Ok(query) => match self.site.files().lookup_deferred(&self.key) {
                Lookup::Redirect(mut location) => {
                    if let Some(q) = query {
                        location.push(b'?');
                        location.extend_from_slice(q);
                    }
                    Lookup::Redirect(location)
                }
                other => other,
            },
            Err(status) => Lookup::Status(status),
        };
        let text = |status: u16, fields: &[&[u8]]| {
            let body = error_body(status);
            let mut all: Vec<&[u8]> = vec![TEXT_PLAIN];
            all.extend_from_slice(fields);
            Reply {
                status,
                head: head(status, &all, Some(body.len() as u64), keep_alive),
                payload: Payload::Memory(body),
            }
        };
        match lookup {
            Lookup::File(file) => serve_file(file, &req.cond, keep_alive, &text),
            Lookup::Redirect(location) => {
                let mut extra = Vec::with_capacity(location.len() + 12);
                extra.extend_from_slice(b"Location: ");
                extra.extend_from_slice(&location);
                extra.extend_from_slice(b"\r\n");
                text(301, &[&extra])
            }
            Lookup::Status(status) => text(status, &[]),
        }
    }

    /// One step of draining a chunked body.
    fn step_chunk(
        &mut self,
        state: Chunk,
        rest: &[u8],
        on_response: &mut impl FnMut(u16),
    ) -> Option<usize> {
        let limits = self.site.limits();
        let (max_body, max_header_bytes, max_headers) = (
            limits.max_body as u64,
            limits.max_header_bytes,
            limits.max_headers,
        );
        match state {
            Chunk::Size { total } => {
                let Some(nl) = memchr::memchr(b'\n', rest) else {
                    if rest.len() > MAX_CHUNK_LINE {
                        self.fatal(400, on_response);
                    }
                    return None;
                };
                if nl > MAX_CHUNK_LINE {
                    self.fatal(400, on_response);
                    return None;
                }
                let line = strip_cr(&rest[..nl]);
                match parse_chunk_size(line) {
                    Err(status) => self.fatal(status, on_response),
                    Ok(size) => match total.checked_add(size).filter(|&t| t <= max_body) {
                        None => self.fatal(413, on_response),
                        Some(total) => {
                            self.body = Body::Chunked(if size == 0 {
                                Chunk::Trailer { bytes: 0, lines: 0 }
                            } else {
                                Chunk::Data { left: size, total }
                            });
                        }
                    },
                }
                Some(nl + 1)
            }
            Chunk::Data { left, total } => {
                let n = left.min(rest.len() as u64);
                self.body = Body::Chunked(if n == left {
                    Chunk::DataEnd { total }
                } else {
                    Chunk::Data {
                        left: left - n,
                        total,
                    }
                });
                Some(n as usize)
            }
            Chunk::DataEnd { total } => {
                let used = match rest {
                    [b'\n', ..] => 1,
                    [b'\r', b'\n', ..] => 2,
                    [] | [b'\r'] => return None,
                    _ => {
                        self.fatal(400, on_response);
                        return None;
                    }
                };
                self.body = Body::Chunked(Chunk::Size { total });
                Some(used)
            }
            Chunk::Trailer { bytes, lines } => {
                let Some(nl) = memchr::memchr(b'\n', rest) else {
                    if bytes + rest.len() > max_header_bytes + 2 {
                        self.fatal(431, on_response);
                    }
                    return None;
                };
                let line = strip_cr(&rest[..nl]);
                if line.is_empty() {
                    self.body = Body::None;
                    if let Some(held) = self.held.take() {
                        self.emit(held.reply, held.keep_alive, on_response);
                    }
                    return Some(nl + 1);
                }
                let (bytes, lines) = (bytes + nl + 1, lines + 1);
                if bytes > max_header_bytes || lines > max_headers {
                    self.fatal(431, on_response);
                    return None;
                }
                if parse_field(line).is_err() {
                    self.fatal(400, on_response);
                    return None;
                }
                self.body = Body::Chunked(Chunk::Trailer { bytes, lines });
                Some(nl + 1)
            }
        }
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Splits a header line into name and trimmed value; 400 on any syntax error.
fn parse_field(line: &[u8]) -> Result<(&[u8], &[u8]), u16> {
    let colon = memchr::memchr(b':', line).ok_or(400u16)?;
    let name = &line[..colon];
    // No whitespace before the colon (RFC 9112 §5.1), which also rejects obs-fold lines.
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        return Err(400);
    }
    let value = line[colon + 1..].trim_ascii();
    if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(400);
    }
    Ok((name, value))
}

/// Parses a complete request head (without its final empty line). `line_end` is the offset
/// of the LF ending the request line.
fn parse_head<'a>(
    head: &'a [u8],
    line_end: usize,
    limits: &crate::Limits,
) -> Result<Request<'a>, u16> {
    let request_line = strip_cr(&head[..line_end]);
    let fields = head.get(line_end + 1..).unwrap_or(&[]);
    if fields.iter().filter(|&&b| b == b'\n').count() > limits.max_headers {
        return Err(431);
    }
    let mut parts = request_line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(400);
    };
    if method.is_empty() || !method.iter().all(|&b| is_tchar(b)) {
        return Err(400);
    }
    if target.is_empty() || !target.iter().all(|&b| (0x21..0x7f).contains(&b)) {
        return Err(400);
    }
    let http10 = match version {
        b"HTTP/1.1" => false,
        b"HTTP/1.0" => true,
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            return Err(505)
        }
        _ => return Err(400),
    };
    let method = match method {
        b"GET" => Method::Get,
        b"HEAD" => Method::Head,
        _ => Method::Other,
    };
    let (mut close, mut keep_alive) = (false, false);
    let mut content_length = None;
    let mut chunked = false;
    let mut hosts = 0usize;
    let mut cond = Conditions::default();
    for line in fields.split(|&b| b == b'\n') {
        let line = strip_cr(line);
        if line.is_empty() {
            // Only the split's tail after the last LF can be empty: an empty line inside the
            // block would have ended it.
            continue;
        }
        if line.contains(&b'\r') {
            return Err(400);
        }
        let (name, value) = parse_field(line)?;
        if name.eq_ignore_ascii_case(b"connection") {
            for token in value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case(b"content-length") {
            let len = parse_content_length(value)?;
            if content_length.is_some_and(|old| old != len) {
                return Err(400);
            }
            content_length = Some(len);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // Only a final `chunked` coding frames a request body (RFC 9112 §6.3).
            let last = value
                .rsplit(|&b| b == b',')
                .next()
                .unwrap_or(b"")
                .trim_ascii();
            if !last.eq_ignore_ascii_case(b"chunked") {
                return Err(400);
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case(b"host") {
            hosts += 1;
        } else if let Some(slot) = cond.slot(name) {
            // A repeated field is a list split over lines (RFC 9110 §5.3); these are rare
            // enough that a repeat is treated as if the first were absent.
            *slot = Some(value);
        }
    }
    if request_line.contains(&b'\r') {
        return Err(400);
    }
    // RFC 9112 §3.2: a 1.1 request without Host, or any request with several, is a 400.
    if hosts > 1 || (hosts == 0 && !http10) {
        return Err(400);
    }
    let keep_alive = !close && (!http10 || keep_alive);
    Ok(Request {
        method,
        target,
        keep_alive,
        content_length,
        chunked,
        http10,
        cond,
    })
}

impl<'a> Conditions<'a> {
    fn slot(&mut self, name: &[u8]) -> Option<&mut Option<&'a [u8]>> {
        let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
        if is(b"range") {
            Some(&mut self.range)
        } else if is(b"if-range") {
            Some(&mut self.if_range)
        } else if is(b"if-match") {
            Some(&mut self.if_match)
        } else if is(b"if-none-match") {
            Some(&mut self.if_none_match)
        } else if is(b"if-modified-since") {
            Some(&mut self.if_modified_since)
        } else if is(b"if-unmodified-since") {
            Some(&mut self.if_unmodified_since)
        } else {
            None
        }
    }
}

/// The answer for a regular file (GET or HEAD): preconditions in the order of RFC 9110
/// §13.2.2, then the range. RFC 9110 defines ranges for GET only, but a HEAD gets the head
/// the GET would have (§9.3.2), a 206 included, as nginx does. `text` builds the small text
/// responses (412, 416).
fn serve_file(
    file: FileRef,
    cond: &Conditions<'_>,
    keep_alive: bool,
    text: &dyn Fn(u16, &[&[u8]]) -> Reply,
) -> Reply {
    let mtime = file.mtime;
    // 1, 2: If-Match, else If-Unmodified-Since.
    if let Some(v) = cond.if_match {
        if !etag_list_matches(v, &file.etag, true) {
            return text(412, &[]);
        }
    } else if let Some(since) = cond.if_unmodified_since.and_then(parse_date) {
        if mtime.is_none_or(|m| m > since) {
            return text(412, &[]);
        }
    }
    // 3, 4: If-None-Match, else If-Modified-Since (an invalid date is ignored).
    let not_modified = match (cond.if_none_match, cond.if_modified_since) {
        (Some(v), _) => etag_list_matches(v, &file.etag, false),
        (None, Some(d)) => match (parse_date(d), mtime) {
            (Some(since), Some(m)) => m <= since,
            _ => false,
        },
        (None, None) => false,
    };
    if not_modified {
        return Reply {
            status: 304,
            head: head(304, &[&file.validators], None, keep_alive),
            payload: Payload::None,
        };
    }
    let len = file.len;
    let range = match cond.range {
        Some(r) if if_range_holds(cond.if_range, &file) => parse_range(r, len),
        _ => RangeSpec::Whole,
    };
    let body = |offset: u64, n: u64| match &file.body {
        FileBody::Memory(b) => Payload::Memory(b.slice(offset as usize..(offset + n) as usize)),
        FileBody::Disk(f) => Payload::Disk {
            file: f.clone(),
            offset,
            len: n,
            fill: None,
        },
        // A miss: cached only when read whole.
        FileBody::Load(load) => Payload::Disk {
            file: Arc::clone(&load.file),
            offset,
            len: n,
            fill: (offset == 0 && n == len).then(|| Arc::clone(load)),
        },
    };
    const ACCEPT_RANGES: &[u8] = b"Accept-Ranges: bytes\r\n";
    match range {
        RangeSpec::Whole => Reply {
            status: 200,
            head: head(
                200,
                &[&file.content_type, &file.validators, ACCEPT_RANGES],
                Some(len),
                keep_alive,
            ),
            payload: body(0, len),
        },
        RangeSpec::Part(first, last) => {
            let mut cr = Vec::with_capacity(64);
            cr.extend_from_slice(b"Content-Range: bytes ");
            crate::response::push_decimal(&mut cr, first);
            cr.push(b'-');
            crate::response::push_decimal(&mut cr, last);
            cr.push(b'/');
            crate::response::push_decimal(&mut cr, len);
            cr.extend_from_slice(b"\r\n");
            let n = last - first + 1;
            Reply {
                status: 206,
                head: head(
                    206,
                    &[&file.content_type, &file.validators, ACCEPT_RANGES, &cr],
                    Some(n),
                    keep_alive,
                ),
                payload: body(first, n),
            }
        }
        RangeSpec::Unsatisfiable => {
            let mut cr = Vec::with_capacity(48);
            cr.extend_from_slice(b"Content-Range: bytes */");
            crate::response::push_decimal(&mut cr, len);
            cr.extend_from_slice(b"\r\n");
            text(416, &[ACCEPT_RANGES, &cr])
        }
    }
}

/// What a `Range` header asks of a representation of `len` bytes.
#[derive(Debug, PartialEq, Eq)]
enum RangeSpec {
    /// No usable range: answer 200 with everything (another unit, or several ranges).
    Whole,
    /// One satisfiable range, first and last byte positions (inclusive, within the file).
    Part(u64, u64),
    /// 416.
    Unsatisfiable,
}

/// Parses a `Range` value (RFC 9110 §14.1.2) against a length. Several ranges are answered
/// whole (200), as RFC 9110 allows a server to; a syntactically invalid `bytes` range is a
/// 416, as nginx answers it; a unit other than `bytes` is ignored (200).
fn parse_range(value: &[u8], len: u64) -> RangeSpec {
    let Some(eq) = memchr::memchr(b'=', value) else {
        return RangeSpec::Unsatisfiable;
    };
    if !value[..eq].trim_ascii().eq_ignore_ascii_case(b"bytes") {
        return RangeSpec::Whole;
    }
    let set = &value[eq + 1..];
    let mut specs = set
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|s| !s.is_empty());
    let (Some(spec), rest) = (specs.next(), specs.next()) else {
        return RangeSpec::Unsatisfiable;
    };
    if rest.is_some() {
        return RangeSpec::Whole;
    }
    let Some(dash) = memchr::memchr(b'-', spec) else {
        return RangeSpec::Unsatisfiable;
    };
    let (a, b) = (spec[..dash].trim_ascii(), spec[dash + 1..].trim_ascii());
    let number = |d: &[u8]| -> Option<u64> {
        if d.is_empty() || d.len() > 19 || !d.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(d).ok()?.parse().ok()
    };
    if a.is_empty() {
        // Suffix: the last N bytes.
        return match number(b) {
            Some(n) if n > 0 && len > 0 => RangeSpec::Part(len - n.min(len), len - 1),
            _ => RangeSpec::Unsatisfiable,
        };
    }
    let Some(first) = number(a) else {
        return RangeSpec::Unsatisfiable;
    };
    let last = if b.is_empty() {
        u64::MAX
    } else {
        match number(b) {
            Some(l) if l >= first => l,
            _ => return RangeSpec::Unsatisfiable,
        }
    };
    if first >= len {
        return RangeSpec::Unsatisfiable;
    }
    RangeSpec::Part(first, last.min(len - 1))
}

/// `If-Range` (RFC 9110 §13.1.5): the range applies only if the validator matches — an
/// entity tag compared strongly, or a date equal to `Last-Modified`. Absent: it applies.
fn if_range_holds(value: Option<&[u8]>, file: &FileRef) -> bool {
    let Some(v) = value else {
        return true;
    };
    if v.starts_with(b"\"") || v.starts_with(b"W/") {
        return v == &file.etag[..];
    }
    matches!((parse_date(v), file.mtime), (Some(d), Some(m)) if d == m)
}

/// True when a comma-separated list of entity tags (or `*`) matches `etag`. Weak comparison
/// ignores a `W/` prefix; strong comparison never matches a weak tag.
fn etag_list_matches(list: &[u8], etag: &[u8], strong: bool) -> bool {
    if list.trim_ascii() == b"*" {
        return true;
    }
    list.split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .any(|tag| match tag.strip_prefix(b"W/") {
            Some(weak) => !strong && weak == etag,
            None => tag == etag,
        })
}

/// An HTTP-date (any of the three forms of RFC 9110 §5.6.7) in seconds since the epoch.
fn parse_date(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?;
    let t = httpdate::parse_http_date(text.trim()).ok()?;
    t.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

fn parse_content_length(value: &[u8]) -> Result<u64, u16> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return Err(400);
    }
    let mut n: u64 = 0;
    for &d in value {
        // Too large to be accepted anyway.
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(d - b'0')))
            .ok_or(413u16)?;
    }
    Ok(n)
}

fn parse_chunk_size(line: &[u8]) -> Result<u64, u16> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(400);
    }
    let ext = line[digits..].trim_ascii_start();
    if !ext.is_empty() && ext[0] != b';' {
        return Err(400);
    }
    if ext.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(400);
    }
    let mut n: u64 = 0;
    for &d in &line[..digits] {
        let v = (d as char).to_digit(16).unwrap_or(0);
        n = n
            .checked_mul(16)
            .and_then(|n| n.checked_add(u64::from(v)))
            .ok_or(413u16)?;
    }
    Ok(n)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Turns a request target into the cache key: `/` followed by the percent-decoded segments
/// joined by `/`, plus a trailing `/` when the path ends with one. Returns the query string.
///
/// 400 for a target that is not origin-form or absolute-form, or for an invalid escape; 404
/// for anything that would step outside the root or cannot be a file name: a `..` segment
/// (raw or encoded), an encoded `/`, a NUL byte.
pub(crate) fn normalise_target<'a>(
    target: &'a [u8],
    key: &mut Vec<u8>,
) -> Result<Option<&'a [u8]>, u16> {
    let path_and_query = if target.first() == Some(&b'/') {
        target
    } else {
        // absolute-form (RFC 9112 §3.2.2): drop scheme and authority.
        let lower_starts =
            |p: &[u8]| target.len() >= p.len() && target[..p.len()].eq_ignore_ascii_case(p);
        let after = if lower_starts(b"http://") {
            &target[7..]
        } else if lower_starts(b"https://") {
            &target[8..]
        } else {
            return Err(400);
        };
        match after.iter().position(|&b| matches!(b, b'/' | b'?' | b'#')) {
            Some(i) if after[i] == b'/' => &after[i..],
            Some(i) => &after[i..], // "http://host?q": empty path, treated as "/"
            None => b"/",
        }
    };
    let (path, query) = match path_and_query.iter().position(|&b| b == b'?' || b == b'#') {
        Some(i) if path_and_query[i] == b'?' => {
            let q = &path_and_query[i + 1..];
            let q = match q.iter().position(|&b| b == b'#') {
                Some(j) => &q[..j],
                None => q,
            };
            (&path_and_query[..i], Some(q))
        }
        Some(i) => (&path_and_query[..i], None),
        None => (path_and_query, None),
    };
    key.clear();
    key.push(b'/');
    for raw in path.split(|&b| b == b'/') {
        if raw.is_empty() {
            continue;
        }
        let start = key.len();
        let mut i = 0;
        while i < raw.len() {
            let b = raw[i];
            if b == b'%' {
                let hi = raw.get(i + 1).copied().and_then(hex_value).ok_or(400u16)?;
                let lo = raw.get(i + 2).copied().and_then(hex_value).ok_or(400u16)?;
                key.push(hi << 4 | lo);
                i += 3;
            } else {
                key.push(b);
                i += 1;
            }
        }
        let seg = &key[start..];
        if seg.contains(&b'/') || seg.contains(&0) || seg == b".." {
            return Err(404);
        }
        if seg == b"." {
            key.truncate(start);
            continue;
        }
        key.push(b'/');
    }
    let trailing = path.ends_with(b"/") || path.is_empty();
    if !trailing && key.len() > 1 {
        key.pop();
    }
    Ok(query)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(target: &str) -> Result<String, u16> {
        let mut key = Vec::new();
        normalise_target(target.as_bytes(), &mut key)?;
        Ok(String::from_utf8_lossy(&key).into_owned())
    }

    #[test]
    fn targets_normalise() {
        assert_eq!(key_of("/").unwrap(), "/");
        assert_eq!(key_of("/a/b.txt").unwrap(), "/a/b.txt");
        assert_eq!(key_of("/a/").unwrap(), "/a/");
        assert_eq!(key_of("//a//b").unwrap(), "/a/b");
        assert_eq!(key_of("/./a/./b").unwrap(), "/a/b");
        assert_eq!(key_of("/a/.").unwrap(), "/a");
        assert_eq!(key_of("/a%20b?x=1#f").unwrap(), "/a b");
        assert_eq!(key_of("/a?x/../..").unwrap(), "/a");
        assert_eq!(key_of("http://host/x/y?q").unwrap(), "/x/y");
        assert_eq!(key_of("HTTP://host").unwrap(), "/");
        assert_eq!(key_of("http://host?q").unwrap(), "/");
        assert_eq!(key_of("/%41%62").unwrap(), "/Ab");
    }

    #[test]
    fn targets_refused() {
        for t in [
            "/../x",
            "/a/../../x",
            "/%2e%2e/x",
            "/%2E%2E/x",
            "/.%2e/x",
            "/a%2Fb",
            "/a%2fb",
            "/%2E%2E%2Fetc%2Fpasswd",
            "/a%00b",
            "/..",
            "http://h/../x",
        ] {
            assert_eq!(key_of(t), Err(404), "{t}");
        }
        for t in ["*", "a/b", "", "/%", "/%4", "/%zz", "/%4g", "ftp://x/y"] {
            assert_eq!(key_of(t), Err(400), "{t}");
        }
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(parse_chunk_size(b"1a"), Ok(26));
        assert_eq!(parse_chunk_size(b"0"), Ok(0));
        assert_eq!(parse_chunk_size(b"A;name=value"), Ok(10));
        assert_eq!(parse_chunk_size(b"5 ; ext"), Ok(5));
        assert_eq!(parse_chunk_size(b""), Err(400));
        assert_eq!(parse_chunk_size(b"x"), Err(400));
        assert_eq!(parse_chunk_size(b"5 x"), Err(400));
        assert_eq!(parse_chunk_size(b"fffffffffffffffff"), Err(413));
    }

    #[test]
    fn content_lengths() {
        assert_eq!(parse_content_length(b"0"), Ok(0));
        assert_eq!(parse_content_length(b"123"), Ok(123));
        assert_eq!(parse_content_length(b"+1"), Err(400));
        assert_eq!(parse_content_length(b"1,1"), Err(400));
        assert_eq!(parse_content_length(b""), Err(400));
        assert_eq!(parse_content_length(b"99999999999999999999999"), Err(413));
    }
}
