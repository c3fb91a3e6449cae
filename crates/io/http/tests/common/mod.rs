//! Helpers shared by the integration tests: a real temporary site and a strict response
//! reader.

#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use iolab_http::{CacheConfig, Limits, Session, Site};

pub const SMALL: &[u8] = b"<h1>hello</h1>\n";
pub const SECRET: &[u8] = b"TOP-SECRET-OUTSIDE-THE-ROOT";

/// A temporary directory holding `www/` (the root) and `secret.txt` beside it.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub site: Arc<Site>,
}

impl Fixture {
    pub fn new() -> Fixture {
        Fixture::with_limits(Limits::default())
    }

    pub fn with_limits(limits: Limits) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let www = dir.path().join("www");
        std::fs::create_dir(&www).unwrap();
        std::fs::write(www.join("index.html"), SMALL).unwrap();
        std::fs::write(www.join("a b.txt"), b"space").unwrap();
        std::fs::create_dir(www.join("sub")).unwrap();
        std::fs::write(www.join("sub/index.html"), b"sub index").unwrap();
        std::fs::write(www.join("sub/data.json"), b"{}").unwrap();
        std::fs::create_dir(www.join("empty")).unwrap();
        std::fs::write(dir.path().join("secret.txt"), SECRET).unwrap();
        let big: Vec<u8> = (0..700 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(www.join("big.bin"), &big).unwrap();
        // Revalidate on every hit, so that tests changing files see the change at once.
        let cache = CacheConfig {
            revalidate_after: std::time::Duration::ZERO,
            ..CacheConfig::default()
        };
        let site = Site::with_cache(&www, limits, cache).unwrap();
        Fixture { dir, site }
    }

    pub fn www(&self) -> std::path::PathBuf {
        self.dir.path().join("www")
    }

    pub fn outside(&self) -> &Path {
        self.dir.path()
    }

    pub fn session(&self) -> Session {
        Session::new(self.site.clone())
    }
}

/// Everything pending, drained through `advance` in small uneven steps, like a socket
/// accepting partial writes.
pub fn drain(s: &mut Session) -> Vec<u8> {
    drain_all(s, &mut Vec::new())
}

/// As [`drain`], resuming the requests held back by backpressure as the queue empties (their
/// statuses are appended to `statuses`), as a server model does.
pub fn drain_all(s: &mut Session, statuses: &mut Vec<u16>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut step = 1;
    while let Some(front) = s.pending().front() {
        let n = step.min(front.len());
        out.extend_from_slice(&front[..n]);
        s.advance(n);
        s.resume(|st| statuses.push(st));
        step = step % 100_000 * 3 + 1;
    }
    assert!(!s.has_pending());
    assert_eq!(s.pending_len(), 0);
    out
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        let mut found = self
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name));
        let first = found.next().map(|(_, v)| v.as_str());
        assert!(found.next().is_none(), "duplicate header {name}");
        first
    }

    pub fn closes(&self) -> bool {
        match self.header("connection") {
            Some("close") => true,
            Some("keep-alive") => false,
            other => panic!("bad Connection header {other:?}"),
        }
    }
}

/// Parses a sequence of responses; `heads[i]` says whether response i answers a HEAD.
pub fn parse_responses(mut bytes: &[u8], heads: &[bool]) -> Vec<Response> {
    let mut out = Vec::new();
    let mut i = 0;
    while !bytes.is_empty() {
        let end = bytes
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("response head terminated by CRLFCRLF")
            + 4;
        let head = std::str::from_utf8(&bytes[..end - 4]).expect("ASCII head");
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap();
        let mut parts = status_line.splitn(3, ' ');
        assert_eq!(parts.next(), Some("HTTP/1.1"), "{status_line}");
        let status: u16 = parts.next().unwrap().parse().unwrap();
        assert!(parts.next().is_some_and(|r| !r.is_empty()));
        let headers: Vec<(String, String)> = lines
            .map(|l| {
                let (n, v) = l.split_once(": ").expect("header line");
                (n.to_string(), v.to_string())
            })
            .collect();
        let mut r = Response {
            status,
            headers,
            body: Vec::new(),
        };
        assert_eq!(r.header("server"), Some("iolab"));
        let date = r.header("date").expect("Date header");
        httpdate::parse_http_date(date).expect("IMF-fixdate");
        r.closes();
        // A 304 describes a body it does not carry: no Content-Length, no body.
        let len: usize = match r.header("content-length") {
            Some(v) => v.parse().unwrap(),
            None if status == 304 => 0,
            None => panic!("no Content-Length in a {status}"),
        };
        bytes = &bytes[end..];
        let head_only = heads.get(i).copied().unwrap_or(false);
        if !head_only {
            r.body = bytes[..len].to_vec();
            bytes = &bytes[len..];
        }
        out.push(r);
        i += 1;
    }
    out
}

/// Feeds `input` in one call; returns the statuses reported and the responses.
pub fn exchange(s: &mut Session, input: &[u8]) -> (Vec<u16>, Vec<Response>) {
    let mut statuses = Vec::new();
    s.feed(input, |st| statuses.push(st));
    let out = drain_all(s, &mut statuses);
    let heads = count_heads(input, statuses.len());
    let responses = parse_responses(&out, &heads);
    assert_eq!(
        responses.iter().map(|r| r.status).collect::<Vec<_>>(),
        statuses,
        "on_response must report each queued response once, in order"
    );
    (statuses, responses)
}

/// One request, fresh session.
pub fn get(f: &Fixture, request: &str) -> Response {
    let mut s = f.session();
    let (_, mut r) = exchange(&mut s, request.as_bytes());
    assert_eq!(r.len(), 1, "exactly one response to {request:?}");
    r.remove(0)
}

/// Which of the requests in `input` are HEAD requests (by request-line prefix).
fn count_heads(input: &[u8], n: usize) -> Vec<bool> {
    let text = String::from_utf8_lossy(input);
    let mut heads = Vec::new();
    for line in text.split('\n') {
        let line = line.trim_start_matches('\r');
        if line.starts_with("HEAD ") {
            heads.push(true);
        } else if line.starts_with("GET ") || line.contains(" HTTP/") || line.starts_with("POST ") {
            heads.push(false);
        }
    }
    heads.resize(heads.len().max(n), false);
    heads
}
