//! The syntax of a request head (RFC 9112 §2-§6): the request line, header fields, the
//! fields the answer depends on, and the numbers that frame a body.

pub(crate) enum Method {
    Get,
    Head,
    Other,
}

/// What the head of a request says, once it parsed.
pub(crate) struct Request<'a> {
    pub(crate) method: Method,
    pub(crate) target: &'a [u8],
    pub(crate) keep_alive: bool,
    pub(crate) content_length: Option<u64>,
    pub(crate) chunked: bool,
    pub(crate) http10: bool,
    /// The header fields the answer depends on (RFC 9110 §13 and §14), raw values.
    pub(crate) cond: Conditions<'a>,
}

/// Request header fields that select or condition the answer for a file.
#[derive(Default)]
pub(crate) struct Conditions<'a> {
    pub(crate) range: Option<&'a [u8]>,
    pub(crate) if_range: Option<&'a [u8]>,
    pub(crate) if_match: Option<&'a [u8]>,
    pub(crate) if_none_match: Option<&'a [u8]>,
    pub(crate) if_modified_since: Option<&'a [u8]>,
    pub(crate) if_unmodified_since: Option<&'a [u8]>,
}

pub(crate) fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Splits a header line into name and trimmed value; 400 on any syntax error.
pub(crate) fn parse_field(line: &[u8]) -> Result<(&[u8], &[u8]), u16> {
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
pub(crate) fn parse_head<'a>(
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

pub(crate) fn parse_chunk_size(line: &[u8]) -> Result<u64, u16> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
