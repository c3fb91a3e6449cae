//! Response heads: status lines, content types, the cached `Date`, and the small text bodies
//! of error responses.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

/// Reason phrase of every status this crate produces.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        301 => "Moved Permanently",
        304 => "Not Modified",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        416 => "Range Not Satisfiable",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// `Content-Type` for a file name, from its extension (case-insensitive).
pub fn content_type(path: &[u8]) -> &'static str {
    let name = match path.iter().rposition(|&b| b == b'/') {
        Some(i) => &path[i + 1..],
        None => path,
    };
    let ext = match name.iter().rposition(|&b| b == b'.') {
        Some(i) if i > 0 => &name[i + 1..],
        _ => return "application/octet-stream",
    };
    let mut lower = [0u8; 8];
    if ext.len() > lower.len() {
        return "application/octet-stream";
    }
    for (d, s) in lower.iter_mut().zip(ext) {
        *d = s.to_ascii_lowercase();
    }
    match &lower[..ext.len()] {
        b"html" | b"htm" => "text/html; charset=utf-8",
        b"css" => "text/css; charset=utf-8",
        b"js" | b"mjs" => "text/javascript; charset=utf-8",
        b"json" => "application/json",
        b"txt" => "text/plain; charset=utf-8",
        b"png" => "image/png",
        b"jpg" | b"jpeg" => "image/jpeg",
        b"gif" => "image/gif",
        b"svg" => "image/svg+xml",
        b"ico" => "image/x-icon",
        b"pdf" => "application/pdf",
        b"wasm" => "application/wasm",
        _ => "application/octet-stream",
    }
}

/// Appends the decimal form of `n` without going through `fmt`.
pub fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

const DATE_LEN: usize = 29; // "Sun, 06 Nov 1994 08:49:37 GMT"

thread_local! {
    // Formatting a date costs far more than a response head; one format per second per thread
    // is enough because the header has one-second resolution.
    static DATE: RefCell<(u64, [u8; DATE_LEN])> = const { RefCell::new((u64::MAX, [0; DATE_LEN])) };
}

/// Appends the current `Date` value in IMF-fixdate form, formatted at most once per second.
pub fn push_date(out: &mut Vec<u8>) {
    let now = SystemTime::now();
    let secs = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    DATE.with(|cell| {
        let mut cached = cell.borrow_mut();
        if cached.0 != secs {
            let text = httpdate::fmt_http_date(UNIX_EPOCH + std::time::Duration::from_secs(secs));
            let bytes = text.as_bytes();
            if bytes.len() == DATE_LEN {
                cached.1.copy_from_slice(bytes);
                cached.0 = secs;
            } else {
                // Only years past 9999 format differently; write them uncached.
                out.extend_from_slice(bytes);
                return;
            }
        }
        out.extend_from_slice(&cached.1);
    });
}

/// Writes a complete response head: status line, `Server`, `Date`, then `fields` (each line
/// already terminated by CRLF), `Content-Length` (none for a 304, which describes a body it
/// does not carry), `Connection`, and the blank line.
pub fn head(status: u16, fields: &[&[u8]], content_length: Option<u64>, keep_alive: bool) -> Bytes {
    let extra: usize = fields.iter().map(|f| f.len()).sum();
    let mut out = Vec::with_capacity(160 + extra);
    out.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(&mut out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\nServer: iolab\r\nDate: ");
    push_date(&mut out);
    out.extend_from_slice(b"\r\n");
    for f in fields {
        out.extend_from_slice(f);
    }
    if let Some(len) = content_length {
        out.extend_from_slice(b"Content-Length: ");
        push_decimal(&mut out, len);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(if keep_alive {
        b"Connection: keep-alive\r\n\r\n"
    } else {
        b"Connection: close\r\n\r\n"
    });
    Bytes::from(out)
}

/// The small `text/plain` body of an error (or redirect) response: "404 Not Found\n".
pub fn error_body(status: u16) -> Bytes {
    Bytes::from_static(match status {
        301 => b"301 Moved Permanently\n",
        400 => b"400 Bad Request\n",
        403 => b"403 Forbidden\n",
        404 => b"404 Not Found\n",
        405 => b"405 Method Not Allowed\n",
        412 => b"412 Precondition Failed\n",
        413 => b"413 Content Too Large\n",
        414 => b"414 URI Too Long\n",
        416 => b"416 Range Not Satisfiable\n",
        431 => b"431 Request Header Fields Too Large\n",
        500 => b"500 Internal Server Error\n",
        505 => b"505 HTTP Version Not Supported\n",
        _ => b"error\n",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_by_extension() {
        assert_eq!(content_type(b"a/index.HTML"), "text/html; charset=utf-8");
        assert_eq!(content_type(b"x.css"), "text/css; charset=utf-8");
        assert_eq!(content_type(b"x.js"), "text/javascript; charset=utf-8");
        assert_eq!(content_type(b"x.json"), "application/json");
        assert_eq!(content_type(b"x.txt"), "text/plain; charset=utf-8");
        assert_eq!(content_type(b"x.png"), "image/png");
        assert_eq!(content_type(b"x.jpg"), "image/jpeg");
        assert_eq!(content_type(b"x.jpeg"), "image/jpeg");
        assert_eq!(content_type(b"x.gif"), "image/gif");
        assert_eq!(content_type(b"x.svg"), "image/svg+xml");
        assert_eq!(content_type(b"x.ico"), "image/x-icon");
        assert_eq!(content_type(b"x.pdf"), "application/pdf");
        assert_eq!(content_type(b"x.wasm"), "application/wasm");
        assert_eq!(content_type(b"x.bin"), "application/octet-stream");
        assert_eq!(content_type(b"noext"), "application/octet-stream");
        assert_eq!(content_type(b".hidden"), "application/octet-stream");
        assert_eq!(content_type(b"dir.html/file"), "application/octet-stream");
        assert_eq!(
            content_type(b"x.verylongextension"),
            "application/octet-stream"
        );
    }

    #[test]
    fn decimal() {
        for n in [0u64, 7, 10, 12345, u64::MAX] {
            let mut v = Vec::new();
            push_decimal(&mut v, n);
            assert_eq!(v, n.to_string().as_bytes());
        }
    }

    #[test]
    fn date_is_imf_fixdate_and_parses() {
        let mut v = Vec::new();
        push_date(&mut v);
        let s = std::str::from_utf8(&v).unwrap();
        assert_eq!(s.len(), DATE_LEN);
        assert!(s.ends_with(" GMT"), "{s}");
        let parsed = httpdate::parse_http_date(s).unwrap();
        let age = SystemTime::now().duration_since(parsed).unwrap();
        assert!(age.as_secs() < 5, "{s}");
    }

    #[test]
    fn head_layout() {
        let h = head(404, &[b"Content-Type: text/plain\r\n"], Some(14), false);
        let s = std::str::from_utf8(&h).unwrap();
        assert!(s.starts_with("HTTP/1.1 404 Not Found\r\nServer: iolab\r\nDate: "));
        assert!(s.ends_with(
            "\r\nContent-Type: text/plain\r\nContent-Length: 14\r\nConnection: close\r\n\r\n"
        ));
        let h = head(304, &[b"ETag: \"1-2\"\r\n"], None, true);
        let s = std::str::from_utf8(&h).unwrap();
        assert!(s.starts_with("HTTP/1.1 304 Not Modified\r\n"), "{s}");
        assert!(s.ends_with("\r\nETag: \"1-2\"\r\nConnection: keep-alive\r\n\r\n"));
        assert!(!s.contains("Content-Length"), "{s}");
        for status in [301, 400, 403, 404, 405, 412, 413, 414, 416, 431, 500, 505] {
            let expected = format!("{status} {}\n", reason(status));
            assert_eq!(&error_body(status)[..], expected.as_bytes());
        }
    }
}
