//! HTTP/1.1 message framing for the proxy tiers: a buffered reader over an iolab-runtime
//! `TcpStream`, request and response heads (parsed with `httparse`), and bodies relayed by
//! their framing (`Content-Length`, chunked, or until close) without being interpreted.
//!
//! Limits: a head is at most [`MAX_HEAD`] bytes and [`MAX_FIELDS`] fields; a chunk-size line
//! at most 4 KiB. Beyond them the message is refused (400 / 502 by the caller).

use std::io;

use iolab_runtime::net::TcpStream;

/// Largest request or response head accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in a head.
pub const MAX_FIELDS: usize = 128;
/// Size of a connection's read buffer (and of what it grows by).
pub const READ: usize = 64 * 1024;
/// Free space below which the buffer is compacted (or grown) before a read.
const MIN_ROOM: usize = 4096;
/// Most bytes a relay waits for, beyond what one read brought, to send an answer in one
/// write ([`Conn::fill_tail`]; the buffer grows by at most [`READ`] for it).
pub const TAIL: usize = 16 * 1024;

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// A stream with the bytes read but not consumed yet.
///
/// One buffer per connection, allocated at the first read and kept: reads go into its free
/// tail and relayed bytes are sent from it, so a request costs no allocation of its size
/// (a fresh 64 KiB buffer per read made the allocator return and refault its pages: a third
/// of a tier's CPU at 1 KiB answers).
pub struct Conn {
    pub stream: TcpStream,
    buf: Vec<u8>,
    /// `buf[pos..end]` are the bytes read and not consumed.
    pos: usize,
    end: usize,
    /// A client connection's deadlines (its heads are timed by [`Conn::read_head`]).
    watch: Option<crate::deadline::ClientWatch>,
}

impl Conn {
    pub fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            buf: Vec::new(),
            pos: 0,
            end: 0,
            watch: None,
        }
    }

    /// A client's connection, accepted now, under `timeouts` ([`crate::deadline`]).
    pub fn client(stream: TcpStream, timeouts: crate::deadline::ClientTimeouts) -> Conn {
        let watch = crate::deadline::watch(&stream, timeouts);
        Conn {
            watch: Some(watch),
            ..Conn::new(stream)
        }
    }

    /// A head is being read: its clock runs from now if it has bytes and was not running.
    pub fn head_pending(&self) {
        if let Some(w) = &self.watch {
            if !self.buffered().is_empty() {
                w.head_started(std::time::Instant::now());
            }
        }
    }

    /// The head being read is complete (or no longer timed as one).
    pub fn head_done(&self) {
        if let Some(w) = &self.watch {
            w.head_done();
        }
    }

    /// Why the deadline watcher closed this connection, if it did.
    pub fn expired(&self) -> Option<crate::deadline::Expiry> {
        self.watch.as_ref().and_then(|w| w.expired())
    }

    /// Bytes buffered and not consumed.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..self.end]
    }

    pub fn consume(&mut self, n: usize) {
        self.pos += n;
        debug_assert!(self.pos <= self.end);
        if self.pos == self.end {
            self.pos = 0;
            self.end = 0;
        }
    }

    /// Reads once more; Ok(0) at end of stream.
    pub async fn fill(&mut self) -> io::Result<usize> {
        if self.buf.len() - self.end < MIN_ROOM {
            // Move what is left to the front; grow only when a head being read is longer
            // than the buffer (bounded by MAX_HEAD in read_head).
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
            if self.buf.len() - self.end < MIN_ROOM {
                self.buf.resize(self.end + READ, 0);
            }
        }
        let len = self.buf.len();
        let tail = iolab_runtime::Slice::new(std::mem::take(&mut self.buf), self.end, len);
        let (r, tail) = self.stream.read(tail).await;
        self.buf = tail.into_inner();
        let n = r?;
        self.end += n;
        Ok(n)
    }

    /// Sends the first `n` buffered bytes on `to` (straight from the buffer) and consumes
    /// them.
    pub async fn send_buffered(&mut self, to: &TcpStream, n: usize) -> io::Result<()> {
        assert!(n <= self.end - self.pos, "sending more than is buffered");
        if n == 0 {
            return Ok(());
        }
        let part = iolab_runtime::Slice::new(std::mem::take(&mut self.buf), self.pos, self.pos + n);
        let (r, part) = to.write_all(part).await;
        self.buf = part.into_inner();
        r?;
        self.consume(n);
        Ok(())
    }

    /// Sends `head` and then the first `n` buffered bytes in one `writev` (a proxied answer's
    /// head and the start of its body: one segment train, not a small head segment and then
    /// the body), and consumes them.
    pub async fn send_with_head(
        &mut self,
        to: &TcpStream,
        mut head: Vec<u8>,
        n: usize,
    ) -> io::Result<()> {
        assert!(n <= self.end - self.pos, "sending more than is buffered");
        if n == 0 || head.is_empty() {
            write_all(to, head).await?;
            return self.send_buffered(to, n).await;
        }
        let hl = head.len();
        let body = iolab_runtime::Slice::new(std::mem::take(&mut self.buf), self.pos, self.pos + n);
        let (r, mut parts) = to
            .writev(vec![iolab_runtime::Slice::new(head, 0, hl), body])
            .await;
        self.buf = parts.pop().expect("two parts").into_inner();
        head = parts.pop().expect("two parts").into_inner();
        let sent = match r? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            k => k,
        };
        // A short write: the rest of the head, then the rest of the body.
        if sent < hl {
            write_all(to, head.split_off(sent)).await?;
        }
        let body_sent = sent.saturating_sub(hl);
        self.consume(body_sent);
        self.send_buffered(to, n - body_sent).await
    }

    /// Reads until `n` bytes are buffered when that is at most [`TAIL`] more than are (the
    /// last bytes of an answer that did not fit one read, already on their way): the
    /// answer then leaves in one write rather than a full buffer and a short tail.
    pub async fn fill_tail(&mut self, n: u64) -> io::Result<()> {
        while (self.buffered().len() as u64) < n && n - self.buffered().len() as u64 <= TAIL as u64
        {
            if self.fill().await? == 0 {
                break; // the caller's relay reports the early end
            }
        }
        Ok(())
    }

    /// Waits for a complete head (through the empty line); returns its length, or None if
    /// the stream ended cleanly before any byte of it.
    pub async fn read_head(&mut self) -> io::Result<Option<usize>> {
        let mut scanned = 0;
        loop {
            self.head_pending();
            let b = self.buffered();
            if let Some(i) = find_head_end(b, scanned) {
                self.head_done();
                return Ok(Some(i));
            }
            scanned = b.len().saturating_sub(3);
            if b.len() > MAX_HEAD {
                return Err(bad("head larger than 64 KiB"));
            }
            if self.fill().await? == 0 {
                return if self.buffered().is_empty() {
                    Ok(None)
                } else {
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "stream ended inside a head",
                    ))
                };
            }
        }
    }

    /// Reads one CRLF-terminated line (returned with its CRLF) of at most `max` bytes.
    pub async fn read_line(&mut self, max: usize) -> io::Result<Vec<u8>> {
        loop {
            let b = self.buffered();
            if let Some(i) = b.windows(2).position(|w| w == b"\r\n") {
                let line = b[..i + 2].to_vec();
                self.consume(i + 2);
                return Ok(line);
            }
            if b.len() > max {
                return Err(bad("line too long"));
            }
            if self.fill().await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "stream ended inside a line",
                ));
            }
        }
    }
}

/// End of the head (index after "\r\n\r\n") in `b`, searching from `from`.
pub fn find_head_end(b: &[u8], from: usize) -> Option<usize> {
    // Line by line: a head has a few short lines (memmem builds a searcher per call, which
    // cost more than the search).
    let hay = b.get(from..)?;
    memchr::memchr_iter(b'\n', hay)
        .find(|&i| i >= 3 && &hay[i - 3..=i] == b"\r\n\r\n")
        .map(|i| from + i + 1)
}

/// Writes `line` on the socket `fd` now, without blocking or SIGPIPE, from code that does
/// not own the connection (a watchdog, the tap's task): a line that does not fit is not
/// sent, and the caller's own checks (a stall, a closed connection) have the last word.
pub fn send_now(fd: std::os::fd::RawFd, line: &str) {
    // SAFETY: send(2) only reads `line`, alive for the call; the callers pass a descriptor
    // they know to be open.
    unsafe {
        libc::send(
            fd,
            line.as_ptr().cast(),
            line.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
}

/// Writes all of `data`.
pub async fn write_all(stream: &TcpStream, data: Vec<u8>) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    stream.write_all(data).await.0
}

/// How a body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
    /// Until the sender closes (responses only).
    Close,
}

/// What the proxy needs of a request head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// (GET and HEAD without an allocation.)
    pub method: std::borrow::Cow<'static, str>,
    pub http10: bool,
    pub framing: Framing,
    /// The client wants the connection kept after the answer.
    pub keep_alive: bool,
    /// Where its `X-Disc-Path` field is.
    pub path: Field,
    /// It has other fields named `X-Disc...` (the FE strips them: [`strip_disc_fields`]).
    pub other_disc: bool,
}

/// Where a field of a parsed head is, so that a tier can read or replace it without
/// scanning the head again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    Absent,
    /// The only field of its name: its whole line (name through the line's LF) and its
    /// value (without surrounding blanks), as ranges of the head.
    One {
        line: std::ops::Range<usize>,
        value: std::ops::Range<usize>,
    },
    /// Several fields of that name (or one the parser's slices did not place): callers
    /// take the general path ([`field`], [`rewrite_head`]).
    Several,
}

impl Field {
    /// The field named `name` among `headers`, parsed from `head`.
    fn locate(head: &[u8], headers: &[httparse::Header<'_>], name: &str) -> Field {
        let mut found = Field::Absent;
        for h in headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)) {
            if found != Field::Absent {
                return Field::Several;
            }
            found = Field::place(head, h).unwrap_or(Field::Several);
        }
        found
    }

    fn place(head: &[u8], h: &httparse::Header<'_>) -> Option<Field> {
        // The parser's slices point into `head`; checked rather than assumed.
        let offset = |p: *const u8| (p as usize).checked_sub(head.as_ptr() as usize);
        let start = offset(h.name.as_ptr())?;
        let v0 = offset(h.value.as_ptr())?;
        let v1 = v0.checked_add(h.value.len()).filter(|&e| e <= head.len())?;
        let end = v1 + memchr::memchr(b'\n', &head[v1..])? + 1;
        let blank = |b: &u8| *b == b' ' || *b == b'\t';
        let value = &head[v0..v1];
        let lead = value.iter().take_while(|b| blank(b)).count();
        let trail = value[lead..].iter().rev().take_while(|b| blank(b)).count();
        (start < v0).then_some(Field::One {
            line: start..end,
            value: v0 + lead..v1 - trail,
        })
    }

    /// The field's value in `head` (the head it was located in); None when absent, and
    /// the first one's (as [`field`] finds it) when there are several.
    pub fn value<'h>(&self, head: &'h [u8], name: &str) -> Option<&'h [u8]> {
        match self {
            Field::Absent => None,
            Field::One { value, .. } => head.get(value.clone()),
            Field::Several => field(head, name),
        }
    }

    /// `head` without its fields named `name` (this one), and `extra` (a line ending in
    /// CRLF) added before the empty line: the bytes [`rewrite_head`] makes, with two copies
    /// instead of a scan of every line.
    pub fn replace(&self, head: &[u8], name: &str, extra: Option<&[u8]>) -> Vec<u8> {
        let extra = extra.unwrap_or_default();
        let end = head.len() - 2; // the final empty line's CRLF
        let mut out = Vec::with_capacity(head.len() + extra.len());
        match self {
            Field::Absent => out.extend_from_slice(&head[..end]),
            Field::One { line, .. } => {
                out.extend_from_slice(&head[..line.start]);
                out.extend_from_slice(&head[line.end..end]);
            }
            Field::Several => {
                let extra: Vec<String> = std::str::from_utf8(extra)
                    .map(|e| vec![e.to_string()])
                    .unwrap_or_default();
                return rewrite_head(head, name, &extra);
            }
        }
        out.extend_from_slice(extra);
        out.extend_from_slice(b"\r\n");
        out
    }
}

/// Room for [`MAX_FIELDS`] parsed fields, left uninitialised (initialising 128 of them cost
/// a tier as much as parsing a head).
pub(crate) fn field_slots<'b>() -> [std::mem::MaybeUninit<httparse::Header<'b>>; MAX_FIELDS] {
    [std::mem::MaybeUninit::uninit(); MAX_FIELDS]
}

fn framing_fields(headers: &[httparse::Header<'_>]) -> io::Result<(Option<u64>, bool)> {
    let mut length: Option<u64> = None;
    let mut chunked = false;
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| bad("bad Content-Length"))?;
            if length.is_some_and(|l| l != v) {
                return Err(bad("conflicting Content-Length"));
            }
            length = Some(v);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let last = h.value.rsplit(|&b| b == b',').next().unwrap_or(b"");
            if last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                chunked = true;
            } else {
                return Err(bad("unsupported Transfer-Encoding"));
            }
        }
    }
    if chunked && length.is_some() {
        return Err(bad("both Content-Length and Transfer-Encoding"));
    }
    Ok((length, chunked))
}

fn connection_keep_alive(http10: bool, headers: &[httparse::Header<'_>]) -> bool {
    iolab_http::direct::keep_alive(
        http10,
        headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("connection"))
            .map(|h| h.value),
    )
}

/// Parses a complete request head: `head` is all of it, through its empty line.
pub fn parse_request(head: &[u8]) -> io::Result<RequestHead> {
    let mut slots = field_slots();
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(head, &mut slots) {
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        // The parser saw the head end earlier (a bare LF line ends it too): the bytes after
        // that would reach the next tier as a head of their own (request smuggling).
        Ok(httparse::Status::Complete(_)) => return Err(bad("request head ends twice")),
        Ok(httparse::Status::Partial) => return Err(bad("incomplete request head")),
        Err(e) => return Err(bad(format!("request head: {e}"))),
    }
    let http10 = req.version == Some(0);
    let (length, chunked) = framing_fields(req.headers)?;
    Ok(RequestHead {
        method: match req.method.unwrap_or("") {
            "GET" => "GET".into(),
            "HEAD" => "HEAD".into(),
            other => other.to_string().into(),
        },
        http10,
        framing: if chunked {
            Framing::Chunked
        } else {
            match length {
                Some(0) | None => Framing::None,
                Some(n) => Framing::Length(n),
            }
        },
        keep_alive: connection_keep_alive(http10, req.headers),
        path: Field::locate(head, req.headers, crate::proto::PATH_FIELD),
        other_disc: req.headers.iter().any(|h| {
            is_disc_name(h.name.as_bytes())
                && !h.name.eq_ignore_ascii_case(crate::proto::PATH_FIELD)
        }),
    })
}

/// A field name of DISC's (`X-Disc`, `X-Disc-Path`, and any other `X-Disc...`).
fn is_disc_name(name: &[u8]) -> bool {
    name.len() >= 6 && name[..6].eq_ignore_ascii_case(b"x-disc")
}

/// `head` without any field named `X-Disc...` and with `extra` (a line ending in CRLF)
/// before the empty line: the first tier's rewrite of a client's head that carries DISC
/// fields of its own (none of them reaches the tiers behind it).
pub fn strip_disc_fields(head: &[u8], extra: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len() + 64);
    let body = &head[..head.len() - 2]; // drop the final empty line's CRLF
    for (i, line) in body.split_inclusive(|&b| b == b'\n').enumerate() {
        let name = line
            .iter()
            .position(|&b| b == b':')
            .map(|colon| line[..colon].trim_ascii());
        if i > 0 && name.is_some_and(is_disc_name) {
            continue;
        }
        out.extend_from_slice(line);
    }
    out.extend_from_slice(extra.unwrap_or_default());
    out.extend_from_slice(b"\r\n");
    out
}

/// What the proxy needs of a response head.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    pub status: u16,
    pub framing: Framing,
    /// The sender keeps the connection after this response.
    pub keep_alive: bool,
    /// Where its `X-Disc` field is.
    pub disc: Field,
}

/// Parses a complete response head to a request of method `method`.
pub fn parse_response(head: &[u8], method: &str) -> io::Result<ResponseHead> {
    let mut slots = field_slots();
    let mut res = httparse::Response::new(&mut []);
    match httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut res, head, &mut slots)
    {
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        Ok(httparse::Status::Complete(_)) => return Err(bad("response head ends twice")),
        Ok(httparse::Status::Partial) => return Err(bad("incomplete response head")),
        Err(e) => return Err(bad(format!("response head: {e}"))),
    }
    let status = res.code.unwrap_or(0);
    // Three digits, the first of them the class (RFC 9110 §15): httparse takes "000" too,
    // which would reach the client as an answer no client knows (found by the fuzzer).
    if !(100..=999).contains(&status) {
        return Err(bad(format!("response head: status {status:03}")));
    }
    let http10 = res.version == Some(0);
    let (length, chunked) = framing_fields(res.headers)?;
    let disc = Field::locate(head, res.headers, crate::proto::DISC_FIELD);
    let no_body = method == "HEAD" || (100..200).contains(&status) || matches!(status, 204 | 304);
    let framing = if no_body {
        Framing::None
    } else if chunked {
        Framing::Chunked
    } else {
        match length {
            Some(0) => Framing::None,
            Some(n) => Framing::Length(n),
            None => Framing::Close,
        }
    };
    Ok(ResponseHead {
        status,
        framing,
        keep_alive: connection_keep_alive(http10, res.headers) && framing != Framing::Close,
        disc,
    })
}

/// `head` with every field named `name` removed and `extra` lines (each ending in CRLF)
/// added before the empty line.
pub fn rewrite_head(head: &[u8], name: &str, extra: &[String]) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len() + 64);
    let body = &head[..head.len() - 2]; // drop the final empty line's CRLF
    let mut first = true;
    for line in body.split_inclusive(|&b| b == b'\n') {
        if !first {
            if let Some(colon) = line.iter().position(|&b| b == b':') {
                if line[..colon]
                    .trim_ascii()
                    .eq_ignore_ascii_case(name.as_bytes())
                {
                    continue;
                }
            }
        }
        first = false;
        out.extend_from_slice(line);
    }
    for e in extra {
        out.extend_from_slice(e.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The value of the first field `name` of a head.
pub fn field<'h>(head: &'h [u8], name: &str) -> Option<&'h [u8]> {
    for line in head.split(|&b| b == b'\n').skip(1) {
        if let Some(colon) = line.iter().position(|&b| b == b':') {
            if line[..colon]
                .trim_ascii()
                .eq_ignore_ascii_case(name.as_bytes())
            {
                return Some(line[colon + 1..].trim_ascii());
            }
        }
    }
    None
}

/// Relays a body framed by `framing` from `from` to `to` (bytes as they are, chunk framing
/// included). With `to` None the body is read and dropped.
pub async fn relay_body(
    from: &mut Conn,
    to: Option<&TcpStream>,
    framing: Framing,
) -> io::Result<()> {
    match framing {
        Framing::None => Ok(()),
        Framing::Length(n) => relay_exact(from, to, n).await,
        Framing::Close => loop {
            let n = from.buffered().len();
            match to {
                Some(to) => from.send_buffered(to, n).await?,
                None => from.consume(n),
            }
            if from.fill().await? == 0 {
                return Ok(());
            }
        },
        Framing::Chunked => loop {
            let line = from.read_line(4096).await?;
            let size_text = line[..line.len() - 2]
                .split(|&b| b == b';')
                .next()
                .unwrap_or(b"");
            let size = std::str::from_utf8(size_text)
                .ok()
                .and_then(|s| u64::from_str_radix(s.trim(), 16).ok())
                .ok_or_else(|| bad("bad chunk size"))?;
            if let Some(to) = to {
                write_all(to, line).await?;
            }
            if size == 0 {
                // trailers, then the empty line
                loop {
                    let l = from.read_line(MAX_HEAD).await?;
                    let end = l == b"\r\n";
                    if let Some(to) = to {
                        write_all(to, l).await?;
                    }
                    if end {
                        return Ok(());
                    }
                }
            }
            relay_exact(from, to, size).await?;
            let crlf = from.read_line(2).await?;
            if crlf != b"\r\n" {
                return Err(bad("chunk not followed by CRLF"));
            }
            if let Some(to) = to {
                write_all(to, crlf).await?;
            }
        },
    }
}

/// Relays exactly `n` bytes.
pub async fn relay_exact(from: &mut Conn, to: Option<&TcpStream>, mut n: u64) -> io::Result<()> {
    while n > 0 {
        if from.buffered().is_empty() && from.fill().await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "stream ended inside a body",
            ));
        }
        from.fill_tail(n).await?;
        let take = (from.buffered().len() as u64).min(n) as usize;
        match to {
            Some(to) => from.send_buffered(to, take).await?,
            None => from.consume(take),
        }
        n -= take as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_framed() {
        let r = parse_request(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(r.framing, Framing::None);
        assert!(r.keep_alive);
        let r = parse_request(b"POST /a HTTP/1.0\r\nContent-Length: 5\r\n\r\n").unwrap();
        assert_eq!(r.framing, Framing::Length(5));
        assert!(!r.keep_alive);
        assert!(
            parse_request(b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
                .is_err()
        );
        assert!(parse_request(b"GET / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n").is_err());
        let s = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", "HEAD").unwrap();
        assert_eq!(s.framing, Framing::None);
        let s = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET",
        )
        .unwrap();
        assert_eq!(s.framing, Framing::Chunked);
        let s = parse_response(b"HTTP/1.1 200 OK\r\n\r\n", "GET").unwrap();
        assert_eq!(s.framing, Framing::Close);
        assert!(!s.keep_alive);
        let s = parse_response(
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
            "GET",
        )
        .unwrap();
        assert_eq!(s.framing, Framing::None);
        let s = parse_response(
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nX-Disc: id=1\r\n\r\n",
            "GET",
        )
        .unwrap();
        assert_eq!(
            s.disc,
            Field::One {
                line: 36..50,
                value: 44..48
            }
        );
    }

    /// A status below 100 is no HTTP status (found by the fuzzer: "HTTP/1.1 000 OK" was
    /// relayed to the client as it came); the proxy answers 502 instead.
    #[test]
    fn a_status_below_100_is_a_bad_response() {
        for head in [
            &b"HTTP/1.1 000 OK\r\nContent-Length: 0\r\n\r\n"[..],
            b"HTTP/1.1 099 OK\r\n\r\n",
        ] {
            let e = parse_response(head, "GET").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        }
        assert_eq!(
            parse_response(b"HTTP/1.1 100 Continue\r\n\r\n", "GET")
                .unwrap()
                .status,
            100
        );
    }

    #[test]
    fn fields_are_replaced() {
        let h = b"GET / HTTP/1.1\r\nHost: a\r\nx-disc-path: nb=9;bypass=1\r\nAccept: */*\r\n\r\n";
        let out = rewrite_head(h, "X-Disc-Path", &["X-Disc-Path: nb=1;bypass=1\r\n".into()]);
        assert_eq!(
            out,
            b"GET / HTTP/1.1\r\nHost: a\r\nAccept: */*\r\nX-Disc-Path: nb=1;bypass=1\r\n\r\n"
        );
        assert_eq!(field(&out, "x-disc-path"), Some(&b"nb=1;bypass=1"[..]));
        assert_eq!(field(&out, "host"), Some(&b"a"[..]));
        assert_eq!(field(&out, "none"), None);
        assert_eq!(find_head_end(&out, 0), Some(out.len()));
    }

    /// The head's end is found from any point before it, and only there: not in a bare LF
    /// pair, not across the start of the search.
    #[test]
    fn the_heads_end_is_its_first_empty_line() {
        let b = b"GET / HTTP/1.1\r\nA: b\r\n\r\nrest\r\n\r\n";
        assert_eq!(find_head_end(b, 0), Some(24));
        assert_eq!(find_head_end(b, 20), Some(24));
        assert_eq!(find_head_end(b, 21), Some(b.len()));
        assert_eq!(find_head_end(b"a\n\n\r\n", 0), None);
        assert_eq!(find_head_end(b"\r\n\r\n", 0), Some(4));
        assert_eq!(find_head_end(b"\r\n\r", 0), None);
        assert_eq!(find_head_end(b"ab", 5), None);
    }

    /// A head the parser sees end before its last empty line (a bare LF ends a line, so
    /// "\r\n\n" ends a head) is refused: the proxy forwards a head through the "\r\n\r\n"
    /// it waited for, and the lines after the parser's end would reach the next tier
    /// unchecked (a client's own X-Disc-Path, or a second request smuggled in the first).
    #[test]
    fn a_head_that_ends_twice_is_refused() {
        let e = parse_request(b"GET / HTTP/1.1\r\nHost: x\r\n\nX-Disc-Path: nb=1;bypass=1\r\n\r\n")
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        let e = parse_response(
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\nX-Disc: id=1\r\n\r\n",
            "GET",
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(parse_request(b"GET / HTTP/1.1\nHost: x\r\n\r\n").is_ok());
    }

    /// A field located by the parser is read and replaced as the general scan does, byte
    /// for byte: absent, alone (first, last, blanks around its value, lower case), several,
    /// and on lines ending in a bare LF.
    #[test]
    fn located_fields_are_replaced_as_the_scan_replaces_them() {
        let heads: [&[u8]; 7] = [
            b"GET / HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n",
            b"GET / HTTP/1.1\r\nX-Disc-Path: nb=1;bypass=1\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nx-disc-path:   nb=2;bypass=3 \t\r\n\r\n",
            b"GET / HTTP/1.1\r\nX-Disc-Path: nb=1;bypass=0\r\nHost: a\r\nX-DISC-PATH: x\r\n\r\n",
            b"GET / HTTP/1.1\nHost: a\nX-Disc-Path: nb=1;bypass=1\nAccept: b\r\n\r\n",
            b"GET / HTTP/1.1\r\nX-Disc-Path:\r\n\r\n",
            b"GET / HTTP/1.1\r\nX-Disc-Pathx: 1\r\nX-Disc-Pat: 2\r\n\r\n",
        ];
        let name = crate::proto::PATH_FIELD;
        let line = "X-Disc-Path: nb=2;bypass=1\r\n";
        for head in heads {
            let r = parse_request(head).unwrap();
            let shown = String::from_utf8_lossy(head);
            assert_eq!(r.path.value(head, name), field(head, name), "{shown}");
            assert_eq!(
                r.path.replace(head, name, None),
                rewrite_head(head, name, &[]),
                "{shown}"
            );
            assert_eq!(
                r.path.replace(head, name, Some(line.as_bytes())),
                rewrite_head(head, name, &[line.to_string()]),
                "{shown}"
            );
        }
        let r = parse_request(heads[3]).unwrap();
        assert_eq!(r.path, Field::Several);
        let r = parse_request(heads[2]).unwrap();
        assert_eq!(r.path.value(heads[2], name), Some(&b"nb=2;bypass=3"[..]));
        assert_eq!(parse_request(heads[0]).unwrap().path, Field::Absent);
    }

    /// The last bytes of a body that did not fit one read are waited for (they are on their
    /// way) and the body leaves in one write: the client sees no byte of it before the
    /// upstream has sent the tail. (Relayed at once, the first 64 KiB arrived 200 ms
    /// before the tail was even sent, and the tail went alone in a second write.)
    #[test]
    fn a_short_tail_is_waited_for_and_the_body_leaves_in_one_write() {
        use std::io::{Read, Write};
        use std::time::{Duration, Instant};
        let up_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let cl_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (up_addr, cl_addr) = (up_l.local_addr().unwrap(), cl_l.local_addr().unwrap());
        let t0 = Instant::now();
        let tail = 100;
        let upstream = std::thread::spawn(move || {
            let (mut s, _) = up_l.accept().unwrap();
            s.write_all(&vec![1u8; READ]).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            let tail_sent = t0.elapsed();
            s.write_all(&vec![2u8; tail]).unwrap();
            tail_sent
        });
        let client = std::thread::spawn(move || {
            let (mut s, _) = cl_l.accept().unwrap();
            let mut got = vec![0u8; READ + tail];
            s.read_exact(&mut got[..1]).unwrap();
            let first = t0.elapsed();
            s.read_exact(&mut got[1..]).unwrap();
            (first, got)
        });
        let rt = iolab_runtime::Runtime::builder()
            .workers(1)
            .build()
            .unwrap();
        rt.block_on(async move {
            let up = TcpStream::connect(up_addr).await.unwrap();
            let cl = TcpStream::connect(cl_addr).await.unwrap();
            // The relay starts once the upstream's first write is all in its receive queue:
            // on a loaded machine a first read could otherwise get part of it, leave more
            // than TAIL to come, and rightly send at once.
            let queued = || {
                let mut n: libc::c_int = 0;
                // SAFETY: FIONREAD writes one c_int through the pointer, on a descriptor
                // `up` owns for the whole call.
                let rc = unsafe {
                    libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&up), libc::FIONREAD, &mut n)
                };
                assert_eq!(rc, 0, "FIONREAD: {}", std::io::Error::last_os_error());
                n as usize
            };
            let deadline = Instant::now() + Duration::from_secs(20);
            while queued() < READ {
                assert!(
                    Instant::now() < deadline,
                    "the upstream's 64 KiB never queued"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut conn = Conn::new(up);
            relay_exact(&mut conn, Some(&cl), (READ + tail) as u64)
                .await
                .unwrap();
        });
        let tail_sent = upstream.join().unwrap();
        let (first, got) = client.join().unwrap();
        assert!(
            first >= tail_sent,
            "the body's first byte reached the client at {first:?}, before the upstream sent \
             its tail at {tail_sent:?}"
        );
        assert!(got[..READ].iter().all(|&b| b == 1) && got[READ..].iter().all(|&b| b == 2));
    }
}
