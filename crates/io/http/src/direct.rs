//! A structured entry point for servers that parse HTTP themselves (the tokio + hyper peer):
//! a GET or HEAD already parsed into its parts is answered with a status, header fields as
//! (name, value) pairs and the body `Bytes`, with no request text built and no response
//! text parsed back. Path resolution, refusals, the file cache and the field values are
//! exactly [`crate::Session`]'s; what this entry point leaves to the caller is the framing
//! (`Content-Length`, `Connection`, `Date`), which the caller's HTTP implementation writes.
//!
//! Only requests whose answer depends on nothing but the target take this path
//! ([`Request::is_plain`]); a request with a body, conditional or range fields, another
//! method, or an HTTP/1.1 request without `Host` goes through a [`crate::Session`] so that
//! every rule has one implementation.

use bytes::Bytes;

use crate::response::error_body;
use crate::site::Lookup;
use crate::Site;

/// The parts of a request that decide a plain GET or HEAD.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a [u8],
    /// The request target as sent (origin form: path and query).
    pub target: &'a [u8],
    pub http10: bool,
    pub has_host: bool,
    /// Whether any field the answer could depend on besides the target is present:
    /// `Range`, `If-Range`, `If-Match`, `If-None-Match`, `If-Modified-Since`,
    /// `If-Unmodified-Since`, or a body (`Content-Length` > 0, `Transfer-Encoding`).
    pub conditional_or_body: bool,
}

/// Header names whose presence sends a request down the [`crate::Session`] path.
pub const SESSION_FIELDS: [&str; 8] = [
    "range",
    "if-range",
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "transfer-encoding",
    "content-length",
];

impl Request<'_> {
    /// True when [`answer`] gives the same answer a [`crate::Session`] would.
    pub fn is_plain(&self) -> bool {
        matches!(self.method, b"GET" | b"HEAD")
            && (self.http10 || self.has_host)
            && !self.conditional_or_body
    }
}

/// A structured answer: everything but the framing.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// Fields in the order a [`crate::Session`] writes them, after `Server` and `Date`
    /// (which the caller adds) and before `Content-Length` and `Connection` (framing).
    /// Names are lower case (field names are case-insensitive; an HTTP library can take
    /// them as static names as they are).
    pub fields: Vec<(&'static str, Bytes)>,
    /// The body of a GET (the caller sends none for a HEAD, but keeps its length).
    pub body: Bytes,
}

/// The `Date` value a [`crate::Session`] writes now (IMF-fixdate, formatted at most once a
/// second per thread).
pub fn date() -> Bytes {
    let mut v = Vec::with_capacity(29);
    crate::response::push_date(&mut v);
    Bytes::from(v)
}

/// Whether the connection stays open after the answer, as a [`crate::Session`] decides it
/// from the version and the `Connection` field values.
pub fn keep_alive<'a>(http10: bool, connection: impl IntoIterator<Item = &'a [u8]>) -> bool {
    let (mut close, mut keep) = (false, false);
    for value in connection {
        for token in value.split(|&b| b == b',') {
            let token = token.trim_ascii();
            close |= token.eq_ignore_ascii_case(b"close");
            keep |= token.eq_ignore_ascii_case(b"keep-alive");
        }
    }
    !close && (!http10 || keep)
}

/// `Name: value\r\n` → value, sharing the bytes; None if `line` is not that field.
fn field_value(line: &Bytes, name: &str) -> Option<Bytes> {
    let n = name.len();
    if line.len() < n + 4 || !line[..n].eq_ignore_ascii_case(name.as_bytes()) {
        return None;
    }
    let rest = &line[n..];
    if !rest.starts_with(b": ") || !rest.ends_with(b"\r\n") {
        return None;
    }
    Some(line.slice(n + 2..line.len() - 2))
}

fn text(status: u16, extra: Vec<(&'static str, Bytes)>) -> Answer {
    let mut fields = vec![(
        "content-type",
        Bytes::from_static(b"text/plain; charset=utf-8"),
    )];
    fields.extend(extra);
    Answer {
        status,
        fields,
        body: error_body(status),
    }
}

/// Where the body of an [`AnswerSource`] is.
#[derive(Debug, Clone)]
pub enum Source {
    /// In memory: the cache's bytes, or an error's text.
    Memory(Bytes),
    /// A file not in the cache, opened and checked, not read: the caller sends it in
    /// bounded pieces (its length is the answer's `Content-Length`).
    File {
        file: std::sync::Arc<std::fs::File>,
        len: u64,
    },
}

impl Source {
    pub fn len(&self) -> u64 {
        match self {
            Source::Memory(b) => b.len() as u64,
            Source::File { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// [`Answer`] with the body where it is: nothing of a file outside the cache is read.
#[derive(Debug, Clone)]
pub struct AnswerSource {
    pub status: u16,
    pub fields: Vec<(&'static str, Bytes)>,
    pub body: Source,
}

/// Answers a plain GET or HEAD of `target` ([`Request::is_plain`]). `key` is scratch
/// space for the decoded path, reusable across calls. A file outside the cache is read
/// whole: [`answer_source`] leaves it unread.
pub fn answer(site: &Site, target: &[u8], key: &mut Vec<u8>) -> Answer {
    let a = answer_source(site, target, key);
    let body = match a.body {
        Source::Memory(b) => b,
        Source::File { file, len } => match read_whole(&file, len) {
            Ok(b) => b,
            Err(_) => return text(500, Vec::new()),
        },
    };
    Answer {
        status: a.status,
        fields: a.fields,
        body,
    }
}

/// [`answer`] without reading a file that is not in the cache (a server that sends
/// bodies from files in bounded pieces: the DISC BE's payloads).
pub fn answer_source(site: &Site, target: &[u8], key: &mut Vec<u8>) -> AnswerSource {
    let sourced = |a: Answer| AnswerSource {
        status: a.status,
        fields: a.fields,
        body: Source::Memory(a.body),
    };
    match crate::target::lookup(target, key, |key| site.files().lookup(key)) {
        Lookup::File(file) => {
            let content_type = field_value(&file.fields.content_type, "Content-Type")
                .unwrap_or_else(|| Bytes::from_static(b"application/octet-stream"));
            let mut fields = vec![("content-type", content_type)];
            let mut at = 0;
            for name in ["Last-Modified", "ETag"] {
                let rest = file.fields.validators.slice(at..);
                if let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
                    let line = rest.slice(..end + 2);
                    if let Some(v) = field_value(&line, name) {
                        fields.push((
                            if name == "ETag" {
                                "etag"
                            } else {
                                "last-modified"
                            },
                            v,
                        ));
                        at += end + 2;
                    }
                }
            }
            fields.push(("accept-ranges", Bytes::from_static(b"bytes")));
            let body = match file.body {
                crate::site::Body::Memory(b) => Source::Memory(b),
                // A file too large for the cache: left to the caller to send in pieces.
                crate::site::Body::Disk(f) => Source::File {
                    file: f,
                    len: file.len,
                },
                // A cache miss: opened, not read (and not cached by this entry point).
                crate::site::Body::Load(load) => Source::File {
                    file: load.file.clone(),
                    len: file.len,
                },
            };
            AnswerSource {
                status: 200,
                fields,
                body,
            }
        }
        Lookup::Redirect(location) => sourced(text(301, vec![("location", Bytes::from(location))])),
        Lookup::Status(status) => sourced(text(status, Vec::new())),
    }
}

fn read_whole(file: &std::fs::File, len: u64) -> std::io::Result<Bytes> {
    use std::os::unix::fs::FileExt;
    let mut data = vec![0u8; usize::try_from(len).map_err(std::io::Error::other)?];
    file.read_exact_at(&mut data, 0)?;
    Ok(Bytes::from(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_values_are_sliced_not_parsed() {
        let line = Bytes::from_static(b"Content-Type: text/html; charset=utf-8\r\n");
        assert_eq!(
            &field_value(&line, "Content-Type").unwrap()[..],
            b"text/html; charset=utf-8"
        );
        assert!(field_value(&line, "ETag").is_none());
        assert!(field_value(&Bytes::from_static(b"Content-Type\r\n"), "Content-Type").is_none());
    }

    #[test]
    fn plain_requests_only() {
        let r = Request {
            method: b"GET",
            target: b"/",
            http10: false,
            has_host: true,
            conditional_or_body: false,
        };
        assert!(r.is_plain());
        assert!(!Request {
            has_host: false,
            ..r
        }
        .is_plain());
        assert!(Request {
            has_host: false,
            http10: true,
            ..r
        }
        .is_plain());
        assert!(!Request {
            method: b"POST",
            ..r
        }
        .is_plain());
        assert!(!Request {
            conditional_or_body: true,
            ..r
        }
        .is_plain());
    }

    /// The structured answer is the Session's: same status, field values and body.
    #[test]
    fn answers_match_the_session() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("small.html"), b"<p>hi</p>\n").unwrap();
        std::fs::write(dir.join("sub/index.html"), b"sub\n").unwrap();
        let site = crate::Site::new(dir, crate::Limits::default()).unwrap();
        let mut key = Vec::new();
        for target in [
            "/small.html",
            "/sub/",
            "/sub",
            "/sub?x=1",
            "/nope",
            "/../x",
            "/a%00b",
        ] {
            let a = answer(&site, target.as_bytes(), &mut key);
            let mut session = crate::Session::new(site.clone());
            let req = format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n");
            session.feed(req.as_bytes(), |_| {});
            let wire: Vec<u8> = session.pending().iter().flat_map(|c| c.to_vec()).collect();
            let text = String::from_utf8_lossy(&wire).to_string();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(
                head.starts_with(&format!("HTTP/1.1 {} ", a.status)),
                "{target}: {head}"
            );
            assert_eq!(body.as_bytes(), &a.body[..], "{target}");
            for (name, value) in &a.fields {
                let line = format!("{}: {}", name, String::from_utf8_lossy(value));
                assert!(
                    head.to_ascii_lowercase()
                        .contains(&line.to_ascii_lowercase()),
                    "{target}: {line:?} not in {head}"
                );
            }
        }
    }

    #[test]
    fn keep_alive_as_the_session_decides() {
        assert!(keep_alive(false, []));
        assert!(!keep_alive(false, [&b"close"[..]]));
        assert!(!keep_alive(false, [&b"Keep-Alive, Close"[..]]));
        assert!(!keep_alive(true, []));
        assert!(keep_alive(true, [&b"keep-alive"[..]]));
        assert_eq!(date().len(), 29);
    }
}
