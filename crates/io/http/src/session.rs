//! The per-connection state machine: incremental request parsing, body draining, and the
//! ordered queue of response bytes. What a head says is parsed by [`crate::request`], the
//! target resolved by [`crate::target`], a file's answer decided by [`crate::conditional`].

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};

use crate::conditional::serve_file;
use crate::reply::{Payload, Reply};
use crate::request::{parse_chunk_size, parse_field, parse_head, strip_cr, Method, Request};
use crate::site::{read_at_blocking, Load, Lookup};
use crate::{Site, STREAM_CHUNK};

/// Longest chunk-size line (size plus extensions) of a chunked body; longer is a 400.
const MAX_CHUNK_LINE: usize = 4096;

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
    /// The connection ends with an error answer, likely with input left unread.
    error_close: bool,
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
            error_close: false,
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

    /// True once the connection ends with an error answer (400, 413, 414, 431, 505): the
    /// client may have sent more that will never be read, and closing with unread input
    /// sends a reset that can destroy the answer. The model then closes lingering: shut the
    /// sending side once the answer is flushed, read and discard for a bounded time, close.
    pub fn lingers(&self) -> bool {
        self.error_close
    }

    /// True when no request is partly received: closing the connection now loses nothing
    /// the client sent (useful to tell an idle keep-alive timeout from a slow client).
    pub fn is_between_requests(&self) -> bool {
        self.buf.is_empty() && matches!(self.body, Body::None) && self.held.is_none()
    }

    /// True while part of a request head has arrived and the rest has not (the head
    /// deadline runs, [`crate::Deadline`]).
    pub fn is_reading_head(&self) -> bool {
        !self.closing && !self.buf.is_empty() && matches!(self.body, Body::None)
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
        self.error_close = true;
        self.emit(Reply::text(status, &[], false), false, on_response);
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
        self.site.pay_request_cost();
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
            Method::Other => Reply::text(405, &[b"Allow: GET, HEAD\r\n"], req.keep_alive),
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
        let files = self.site.files();
        match crate::target::lookup(req.target, &mut self.key, |key| files.lookup_deferred(key)) {
            Lookup::File(file) => serve_file(file, &req.cond, keep_alive),
            Lookup::Redirect(location) => {
                let mut extra = Vec::with_capacity(location.len() + 12);
                extra.extend_from_slice(b"Location: ");
                extra.extend_from_slice(&location);
                extra.extend_from_slice(b"\r\n");
                Reply::text(301, &[&extra], keep_alive)
            }
            Lookup::Status(status) => Reply::text(status, &[], keep_alive),
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
