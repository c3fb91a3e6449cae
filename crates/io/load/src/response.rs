//! Incremental HTTP/1.x response framing: just enough to know the status, where the
//! response ends (Content-Length, chunked, or end of stream) and whether the connection can
//! be reused. The body is counted, never stored.

use crate::ErrorKind;

/// Headers larger than this are treated as a malformed response.
const MAX_HEAD: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The response is not complete yet.
    NeedMore,
    /// The response ended after `consumed` bytes of the last input; the rest is surplus.
    Done {
        consumed: usize,
    },
    Failed(ErrorKind),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading the hex size; `digits` says whether one was seen, `ext` whether we are in
    /// a chunk extension (`;name=value`) that runs to the end of the line.
    Size {
        value: u64,
        digits: bool,
        ext: bool,
    },
    SizeLf {
        value: u64,
    },
    Data {
        remaining: u64,
    },
    DataCr,
    DataLf,
    /// After the last chunk: trailer lines until an empty line. `empty` says whether
    /// the current line has no characters yet.
    Trailer {
        empty: bool,
    },
    TrailerLf {
        empty: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    Length { remaining: u64 },
    Chunked(Chunk),
    UntilClose,
    Done,
}

/// Parses one response at a time; `reset` before the next one.
#[derive(Debug)]
pub struct ResponseParser {
    head: Vec<u8>,
    state: State,
    status: Option<u16>,
    close: bool,
    total: u64,
}

impl Default for ResponseParser {
    fn default() -> Self {
        Self::new()
    }
}

impl ResponseParser {
    pub fn new() -> Self {
        Self {
            head: Vec::with_capacity(512),
            state: State::Head,
            status: None,
            close: false,
            total: 0,
        }
    }

    /// Ready for the next response; keeps the header buffer's allocation.
    pub fn reset(&mut self) {
        self.head.clear();
        self.state = State::Head;
        self.status = None;
        self.close = false;
        self.total = 0;
    }

    /// The status code, once the head is parsed.
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// Whether the server said it will close the connection after this response.
    pub fn will_close(&self) -> bool {
        self.close
    }

    /// Whether no byte of the response arrived yet.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Feed received bytes.
    pub fn feed(&mut self, data: &[u8]) -> Progress {
        let mut pos = 0;
        if self.state == State::Head {
            // Look for the end of the head without copying when it fits in this read.
            let (body_start, from_head) = if self.head.is_empty() {
                match find_head_end(data, 0) {
                    Some(end) => (end, false),
                    None => {
                        self.head.extend_from_slice(data);
                        self.total += data.len() as u64;
                        return self.check_head_size();
                    }
                }
            } else {
                let old = self.head.len();
                self.head.extend_from_slice(data);
                match find_head_end(&self.head, old.saturating_sub(3)) {
                    Some(end) => (end - old, true),
                    None => {
                        self.total += data.len() as u64;
                        return self.check_head_size();
                    }
                }
            };
            let parsed = if from_head {
                let head = std::mem::take(&mut self.head);
                let end = body_start + (head.len() - data.len());
                let r = self.parse_head(&head[..end]);
                self.head = head;
                self.head.clear();
                r
            } else {
                self.parse_head(&data[..body_start])
            };
            if let Err(kind) = parsed {
                return Progress::Failed(kind);
            }
            pos = body_start;
            self.total += body_start as u64;
        }
        let rest = &data[pos..];
        match self.body(rest) {
            Ok(Some(used)) => {
                self.total += used as u64;
                Progress::Done {
                    consumed: pos + used,
                }
            }
            Ok(None) => {
                self.total += rest.len() as u64;
                Progress::NeedMore
            }
            Err(kind) => Progress::Failed(kind),
        }
    }

    /// The peer closed the stream. Ok when the response is delimited by the close.
    pub fn eof(&mut self) -> Result<(), ErrorKind> {
        match self.state {
            State::UntilClose | State::Done => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(ErrorKind::ShortResponse),
        }
    }

    fn check_head_size(&self) -> Progress {
        if self.head.len() > MAX_HEAD {
            Progress::Failed(ErrorKind::Malformed)
        } else {
            Progress::NeedMore
        }
    }

    fn parse_head(&mut self, head: &[u8]) -> Result<(), ErrorKind> {
        if head.len() > MAX_HEAD {
            return Err(ErrorKind::Malformed);
        }
        let mut lines = head
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
        let status_line = lines.next().ok_or(ErrorKind::Malformed)?;
        // "HTTP/1.x NNN reason"
        if status_line.len() < 12
            || !status_line.starts_with(b"HTTP/1.")
            || !matches!(status_line[7], b'0' | b'1')
            || status_line[8] != b' '
            || !status_line[9..12].iter().all(u8::is_ascii_digit)
            || status_line.get(12).is_some_and(|&b| b != b' ')
        {
            return Err(ErrorKind::Malformed);
        }
        let http10 = status_line[7] == b'0';
        let status = status_line[9..12]
            .iter()
            .fold(0u16, |acc, d| acc * 10 + u16::from(d - b'0'));
        // RFC 9110 §15: values outside 100..599 are invalid; counting "002" as a status would
        // credit the server with answers it did not give.
        if !(100..=599).contains(&status) {
            return Err(ErrorKind::Malformed);
        }
        let mut length: Option<u64> = None;
        let mut chunked = false;
        let mut close = http10;
        for line in lines {
            if line.is_empty() {
                continue;
            }
            let colon = line
                .iter()
                .position(|&b| b == b':')
                .ok_or(ErrorKind::Malformed)?;
            let name = &line[..colon];
            let value = line[colon + 1..].trim_ascii();
            if name.eq_ignore_ascii_case(b"content-length") {
                let v = parse_decimal(value).ok_or(ErrorKind::Malformed)?;
                if length.is_some_and(|l| l != v) {
                    return Err(ErrorKind::Malformed);
                }
                length = Some(v);
            } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                chunked = value
                    .split(|&b| b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            } else if name.eq_ignore_ascii_case(b"connection") {
                for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    if token.eq_ignore_ascii_case(b"close") {
                        close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") && http10 {
                        close = false;
                    }
                }
            }
        }
        self.status = Some(status);
        self.close = close;
        self.state = if (100..200).contains(&status) || status == 204 || status == 304 {
            State::Done
        } else if chunked {
            State::Chunked(Chunk::Size {
                value: 0,
                digits: false,
                ext: false,
            })
        } else if let Some(n) = length {
            State::Length { remaining: n }
        } else {
            self.close = true;
            State::UntilClose
        };
        if (100..200).contains(&status) {
            // We never send Expect, and upgrades are not ours to follow.
            return Err(ErrorKind::Malformed);
        }
        Ok(())
    }

    /// Consume body bytes; Some(n) when the response ended after n bytes of `data`.
    fn body(&mut self, data: &[u8]) -> Result<Option<usize>, ErrorKind> {
        match self.state {
            State::Head => Ok(None),
            State::Done => Ok(Some(0)),
            State::UntilClose => Ok(None),
            State::Length { remaining } => {
                if (data.len() as u64) >= remaining {
                    self.state = State::Done;
                    Ok(Some(remaining as usize))
                } else {
                    self.state = State::Length {
                        remaining: remaining - data.len() as u64,
                    };
                    Ok(None)
                }
            }
            State::Chunked(mut chunk) => {
                let mut i = 0;
                while i < data.len() {
                    let b = data[i];
                    chunk = match chunk {
                        Chunk::Data { remaining } => {
                            let take = remaining.min((data.len() - i) as u64);
                            i += take as usize;
                            if take == remaining {
                                Chunk::DataCr
                            } else {
                                Chunk::Data {
                                    remaining: remaining - take,
                                }
                            }
                        }
                        Chunk::Size { value, digits, ext } => {
                            i += 1;
                            if ext {
                                match b {
                                    b'\r' => Chunk::SizeLf { value },
                                    b'\n' => end_of_size(value),
                                    _ => chunk,
                                }
                            } else if let Some(d) = (b as char).to_digit(16) {
                                let value = value
                                    .checked_mul(16)
                                    .and_then(|v| v.checked_add(u64::from(d)))
                                    .ok_or(ErrorKind::Malformed)?;
                                Chunk::Size {
                                    value,
                                    digits: true,
                                    ext: false,
                                }
                            } else if !digits {
                                return Err(ErrorKind::Malformed);
                            } else {
                                match b {
                                    b'\r' => Chunk::SizeLf { value },
                                    b'\n' => end_of_size(value),
                                    b';' | b' ' | b'\t' => Chunk::Size {
                                        value,
                                        digits,
                                        ext: true,
                                    },
                                    _ => return Err(ErrorKind::Malformed),
                                }
                            }
                        }
                        Chunk::SizeLf { value } => {
                            i += 1;
                            if b != b'\n' {
                                return Err(ErrorKind::Malformed);
                            }
                            end_of_size(value)
                        }
                        Chunk::DataCr => {
                            i += 1;
                            match b {
                                b'\r' => Chunk::DataLf,
                                b'\n' => Chunk::Size {
                                    value: 0,
                                    digits: false,
                                    ext: false,
                                },
                                _ => return Err(ErrorKind::Malformed),
                            }
                        }
                        Chunk::DataLf => {
                            i += 1;
                            if b != b'\n' {
                                return Err(ErrorKind::Malformed);
                            }
                            Chunk::Size {
                                value: 0,
                                digits: false,
                                ext: false,
                            }
                        }
                        Chunk::Trailer { empty } => {
                            i += 1;
                            match b {
                                b'\r' => Chunk::TrailerLf { empty },
                                b'\n' if empty => {
                                    self.state = State::Done;
                                    return Ok(Some(i));
                                }
                                b'\n' => Chunk::Trailer { empty: true },
                                _ => Chunk::Trailer { empty: false },
                            }
                        }
                        Chunk::TrailerLf { empty } => {
                            i += 1;
                            if b != b'\n' {
                                return Err(ErrorKind::Malformed);
                            }
                            if empty {
                                self.state = State::Done;
                                return Ok(Some(i));
                            }
                            Chunk::Trailer { empty: true }
                        }
                    };
                }
                self.state = State::Chunked(chunk);
                Ok(None)
            }
        }
    }
}

fn end_of_size(value: u64) -> Chunk {
    if value == 0 {
        Chunk::Trailer { empty: true }
    } else {
        Chunk::Data { remaining: value }
    }
}

/// Index just past "\r\n\r\n" (or "\n\n"), searching from `from`.
fn find_head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < buf.len() {
        if buf[i] == b'\n' {
            if i >= 1 && buf[i - 1] == b'\n' {
                return Some(i + 1);
            }
            if i >= 2 && buf[i - 1] == b'\r' && buf[i - 2] == b'\n' {
                return Some(i + 1);
            }
        }
        i += 1;
    }
    None
}

fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(p: &mut ResponseParser, parts: &[&[u8]]) -> Progress {
        let mut last = Progress::NeedMore;
        for part in parts {
            last = p.feed(part);
            if last != Progress::NeedMore {
                break;
            }
        }
        last
    }

    #[test]
    fn content_length_in_one_read() {
        let mut p = ResponseParser::new();
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(p.feed(r), Progress::Done { consumed: r.len() });
        assert_eq!(p.status(), Some(200));
        assert!(!p.will_close());
    }

    #[test]
    fn content_length_split_everywhere() {
        let r: &[u8] =
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabcEXTRA";
        for cut1 in 1..r.len() - 6 {
            for cut2 in cut1 + 1..r.len() {
                let mut p = ResponseParser::new();
                let got = feed_all(&mut p, &[&r[..cut1], &r[cut1..cut2], &r[cut2..]]);
                match got {
                    Progress::Done { .. } => {}
                    other => panic!("cut {cut1}/{cut2}: {other:?}"),
                }
                assert_eq!(p.status(), Some(404));
                assert!(p.will_close());
            }
        }
        // Surplus bytes are reported as not consumed.
        let mut p = ResponseParser::new();
        assert_eq!(
            p.feed(r),
            Progress::Done {
                consumed: r.len() - 5
            }
        );
    }

    #[test]
    fn chunked_with_extension_and_trailer() {
        let r: &[u8] =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n";
        for cut in 1..r.len() {
            let mut p = ResponseParser::new();
            let got = feed_all(&mut p, &[&r[..cut], &r[cut..]]);
            assert!(matches!(got, Progress::Done { .. }), "cut {cut}: {got:?}");
        }
        let mut p = ResponseParser::new();
        assert_eq!(p.feed(r), Progress::Done { consumed: r.len() });
        assert_eq!(p.eof(), Ok(()));
    }

    #[test]
    fn chunked_bad_size_is_malformed() {
        let mut p = ResponseParser::new();
        let r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        assert_eq!(p.feed(r), Progress::Failed(ErrorKind::Malformed));
    }

    #[test]
    fn until_close_and_short() {
        let mut p = ResponseParser::new();
        assert_eq!(p.feed(b"HTTP/1.0 200 OK\r\n\r\nbody"), Progress::NeedMore);
        assert!(p.will_close());
        assert_eq!(p.eof(), Ok(()));

        let mut p = ResponseParser::new();
        assert_eq!(
            p.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"),
            Progress::NeedMore
        );
        assert_eq!(p.eof(), Err(ErrorKind::ShortResponse));

        let mut p = ResponseParser::new();
        assert!(p.is_empty());
        assert_eq!(p.eof(), Err(ErrorKind::ShortResponse));
    }

    #[test]
    fn garbage_is_malformed() {
        for r in [
            &b"HELLO\r\n\r\n"[..],
            b"HTTP/1.1 2x0 OK\r\n\r\n",
            b"HTTP/2.0 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"HTTP/1.1 101 Switching\r\n\r\n",
            // not status codes (RFC 9110 §15): found by the fuzz target
            b"HTTP/1.1 002 OK\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 600 OK\r\nContent-Length: 0\r\n\r\n",
        ] {
            let mut p = ResponseParser::new();
            assert_eq!(
                p.feed(r),
                Progress::Failed(ErrorKind::Malformed),
                "{}",
                String::from_utf8_lossy(r)
            );
        }
    }

    #[test]
    fn oversized_head_is_malformed() {
        let mut p = ResponseParser::new();
        let mut last = Progress::NeedMore;
        let filler = vec![b'a'; 4096];
        for _ in 0..20 {
            last = p.feed(&filler);
            if last != Progress::NeedMore {
                break;
            }
        }
        assert_eq!(last, Progress::Failed(ErrorKind::Malformed));
    }

    #[test]
    fn no_body_statuses_and_reset() {
        let mut p = ResponseParser::new();
        let r = b"HTTP/1.1 304 Not Modified\r\nContent-Length: 100\r\n\r\n";
        assert_eq!(p.feed(r), Progress::Done { consumed: r.len() });
        p.reset();
        let r = b"HTTP/1.1 204 No Content\r\n\r\n";
        assert_eq!(p.feed(r), Progress::Done { consumed: r.len() });
        assert_eq!(p.status(), Some(204));
    }

    #[test]
    fn http10_keepalive_header() {
        let mut p = ResponseParser::new();
        let r = b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(p.feed(r), Progress::Done { consumed: r.len() });
        assert!(!p.will_close());
    }
}
