//! HTTP conformance beyond parsing: `Host` (RFC 9112 §3.2), validators and conditional
//! requests (RFC 9110 §8.8, §13), byte ranges (RFC 9110 §14), and the bounded work per
//! connection: backpressure on pipelined requests and files streamed in bounded chunks.

mod common;

use std::sync::Arc;

use common::*;
use iolab_http::{CacheConfig, Limits, Session, Site, STREAM_CHUNK};

const BIG_LEN: usize = 700 * 1024;

fn big() -> Vec<u8> {
    (0..BIG_LEN as u32).map(|i| (i * 7 % 251) as u8).collect()
}

/// The fixture's site, or the same root with a cache that never holds big.bin (so that it is
/// streamed from disk).
fn sites(f: &Fixture) -> [Arc<Site>; 2] {
    let streaming = Site::with_cache(
        f.www(),
        Limits::default(),
        CacheConfig {
            max_cached_file: 64 * 1024,
            ..CacheConfig::default()
        },
    )
    .unwrap();
    [f.site.clone(), streaming]
}

fn one(site: &Arc<Site>, request: &str) -> Response {
    let mut s = Session::new(site.clone());
    let (_, mut r) = exchange(&mut s, request.as_bytes());
    assert_eq!(r.len(), 1, "one response to {request:?}");
    r.remove(0)
}

fn get_with(site: &Arc<Site>, path: &str, fields: &str) -> Response {
    one(
        site,
        &format!("GET {path} HTTP/1.1\r\nHost: t\r\n{fields}\r\n"),
    )
}

#[test]
fn http11_without_host_is_400_and_closes() {
    let f = Fixture::new();
    let r = get(&f, "GET /index.html HTTP/1.1\r\n\r\n");
    assert_eq!(r.status, 400);
    assert!(r.closes());
    // Two Host fields: 400 too, in either version.
    let r = get(&f, "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
    assert_eq!(r.status, 400);
    let r = get(&f, "GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n");
    assert_eq!(r.status, 400);
    // HTTP/1.0 has no Host requirement; an empty Host is allowed (RFC 9112 §3.2).
    assert_eq!(get(&f, "GET /index.html HTTP/1.0\r\n\r\n").status, 200);
    assert_eq!(get(&f, "GET / HTTP/1.1\r\nhost:\r\n\r\n").status, 200);
    assert_eq!(get(&f, "GET / HTTP/1.1\r\nHOST: x\r\n\r\n").status, 200);
}

#[test]
fn files_carry_validators_and_accept_ranges() {
    let f = Fixture::new();
    for site in sites(&f) {
        let r = get_with(&site, "/big.bin", "");
        assert_eq!(r.status, 200);
        assert_eq!(r.body, big());
        assert_eq!(r.header("accept-ranges"), Some("bytes"));
        let meta = std::fs::metadata(f.www().join("big.bin")).unwrap();
        let mtime = meta.modified().unwrap();
        let secs = mtime
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert_eq!(
            r.header("last-modified"),
            Some(httpdate::fmt_http_date(mtime).as_str())
        );
        assert_eq!(
            r.header("etag"),
            Some(format!("\"{secs:x}-{:x}\"", meta.len()).as_str())
        );
    }
    // Error responses have neither.
    let r = get(&f, "GET /missing HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 404);
    assert!(r.header("etag").is_none() && r.header("last-modified").is_none());
}

#[test]
fn single_ranges_are_206_with_content_range() {
    let f = Fixture::new();
    let big = big();
    let len = BIG_LEN as u64;
    for site in sites(&f) {
        for (spec, first, last) in [
            ("bytes=0-99", 0, 99),
            ("bytes=-100", len - 100, len - 1),
            ("bytes=100-", 100, len - 1),
            ("bytes=0-0", 0, 0),
            (&format!("bytes={}-", len - 1), len - 1, len - 1),
            ("bytes=0-99999999", 0, len - 1),
            ("bytes=-99999999", 0, len - 1),
            ("bytes = 5 - 9", 5, 9),
            ("BYTES=5-9", 5, 9),
            // A chunk boundary of a streamed body, crossed.
            (
                &format!("bytes={}-{}", STREAM_CHUNK - 3, STREAM_CHUNK + 2),
                STREAM_CHUNK as u64 - 3,
                STREAM_CHUNK as u64 + 2,
            ),
        ] {
            let r = get_with(&site, "/big.bin", &format!("Range: {spec}\r\n"));
            assert_eq!(r.status, 206, "{spec}");
            assert_eq!(
                r.header("content-range"),
                Some(format!("bytes {first}-{last}/{len}").as_str()),
                "{spec}"
            );
            assert_eq!(r.header("accept-ranges"), Some("bytes"));
            assert_eq!(r.body, &big[first as usize..=last as usize], "{spec}");
        }
    }
}

#[test]
fn unsatisfiable_and_invalid_ranges_are_416() {
    let f = Fixture::new();
    for site in sites(&f) {
        for spec in [
            format!("bytes={BIG_LEN}-"),
            format!("bytes={}-{}", BIG_LEN + 5, BIG_LEN + 10),
            "bytes=-0".into(),
            "bytes=5-2".into(),
            "bytes=abc".into(),
            "bytes=".into(),
            "bytes=1-2-3".into(),
            "bytes=99999999999999999999-".into(),
            "0-99".into(),
        ] {
            let r = get_with(&site, "/big.bin", &format!("Range: {spec}\r\n"));
            assert_eq!(r.status, 416, "{spec}");
            assert_eq!(
                r.header("content-range"),
                Some(format!("bytes */{BIG_LEN}").as_str()),
                "{spec}"
            );
            assert!(!r.closes(), "a 416 keeps the connection");
        }
    }
    // An empty file has no satisfiable range but a suffix (`a_suffix_range_on_an_empty_file_is_200`).
    std::fs::write(f.www().join("zero.txt"), b"").unwrap();
    for spec in ["bytes=0-5", "bytes=0-"] {
        let r = get_with(&f.site, "/zero.txt", &format!("Range: {spec}\r\n"));
        assert_eq!(r.status, 416, "{spec}");
        assert_eq!(r.header("content-range"), Some("bytes */0"));
    }
}

#[test]
fn ignored_ranges_answer_the_whole_file() {
    let f = Fixture::new();
    for site in sites(&f) {
        // Several ranges (documented: 200 whole), another unit.
        for fields in [
            "Range: bytes=0-0,5-9\r\n",
            "Range: items=0-5\r\n",
            "Range: bytes=0-1, 3-4\r\n",
        ] {
            let r = get_with(&site, "/big.bin", fields);
            assert_eq!(r.status, 200, "{fields}");
            assert_eq!(r.body.len(), BIG_LEN);
            assert!(r.header("content-range").is_none());
        }
        // HEAD gets the head the GET would have, 206 included (as nginx answers).
        let mut s = Session::new(site.clone());
        let (st, rs) = exchange(
            &mut s,
            b"HEAD /big.bin HTTP/1.1\r\nHost: t\r\nRange: bytes=0-9\r\n\r\n",
        );
        assert_eq!(st, vec![206]);
        assert_eq!(rs[0].header("content-length"), Some("10"));
    }
}

#[test]
fn conditional_get_answers_304() {
    let f = Fixture::new();
    for site in sites(&f) {
        let r = get_with(&site, "/big.bin", "");
        let etag = r.header("etag").unwrap().to_string();
        let lm = r.header("last-modified").unwrap().to_string();
        let not_modified = |fields: String| {
            let r = get_with(&site, "/big.bin", &fields);
            assert_eq!(r.status, 304, "{fields}");
            assert!(r.body.is_empty());
            assert!(r.header("content-length").is_none(), "{fields}");
            assert_eq!(r.header("etag"), Some(etag.as_str()));
            assert_eq!(r.header("last-modified"), Some(lm.as_str()));
            assert!(!r.closes());
        };
        let modified = |fields: String| {
            let r = get_with(&site, "/big.bin", &fields);
            assert_eq!(r.status, 200, "{fields}");
            assert_eq!(r.body.len(), BIG_LEN);
        };
        not_modified(format!("If-None-Match: {etag}\r\n"));
        not_modified(format!("If-None-Match: \"x\", {etag}\r\n"));
        not_modified(format!("If-None-Match: W/{etag}\r\n"));
        not_modified("If-None-Match: *\r\n".into());
        not_modified(format!("If-Modified-Since: {lm}\r\n"));
        not_modified("If-Modified-Since: Tue, 01 Jan 2999 00:00:00 GMT\r\n".into());
        // Conditionals come before the range.
        not_modified(format!("If-None-Match: {etag}\r\nRange: bytes=0-9\r\n"));
        modified("If-None-Match: \"other\"\r\n".into());
        modified("If-Modified-Since: Mon, 01 Jan 2001 00:00:00 GMT\r\n".into());
        modified("If-Modified-Since: not a date\r\n".into());
        // If-None-Match takes precedence: a match-less list wins over a matching date.
        modified(format!(
            "If-None-Match: \"other\"\r\nIf-Modified-Since: {lm}\r\n"
        ));
        // HEAD gets the same 304.
        let mut s = Session::new(site.clone());
        let (st, _) = exchange(
            &mut s,
            format!("HEAD /big.bin HTTP/1.1\r\nHost: t\r\nIf-None-Match: {etag}\r\n\r\n")
                .as_bytes(),
        );
        assert_eq!(st, vec![304]);
    }
}

#[test]
fn preconditions_fail_with_412() {
    let f = Fixture::new();
    let site = &f.site;
    let r = get_with(site, "/big.bin", "");
    let etag = r.header("etag").unwrap().to_string();
    let lm = r.header("last-modified").unwrap().to_string();
    for fields in [
        "If-Match: \"nope\"\r\n".to_string(),
        format!("If-Match: W/{etag}\r\n"),
        "If-Unmodified-Since: Mon, 01 Jan 2001 00:00:00 GMT\r\n".into(),
    ] {
        assert_eq!(get_with(site, "/big.bin", &fields).status, 412, "{fields}");
    }
    for fields in [
        format!("If-Match: {etag}\r\n"),
        "If-Match: *\r\n".into(),
        format!("If-Unmodified-Since: {lm}\r\n"),
        "If-Unmodified-Since: garbage\r\n".into(),
    ] {
        assert_eq!(get_with(site, "/big.bin", &fields).status, 200, "{fields}");
    }
}

#[test]
fn if_range_applies_the_range_only_when_the_validator_matches() {
    let f = Fixture::new();
    for site in sites(&f) {
        let r = get_with(&site, "/big.bin", "");
        let etag = r.header("etag").unwrap().to_string();
        let lm = r.header("last-modified").unwrap().to_string();
        for (if_range, status) in [
            (etag.clone(), 206),
            (lm.clone(), 206),
            ("\"other\"".into(), 200),
            (format!("W/{etag}"), 200),
            ("Mon, 01 Jan 2001 00:00:00 GMT".into(), 200),
        ] {
            let r = get_with(
                &site,
                "/big.bin",
                &format!("Range: bytes=0-9\r\nIf-Range: {if_range}\r\n"),
            );
            assert_eq!(r.status, status, "If-Range: {if_range}");
        }
    }
}

#[test]
fn a_changed_file_gets_new_validators() {
    let f = Fixture::new();
    let r = get(&f, "GET /index.html HTTP/1.1\r\nHost: t\r\n\r\n");
    let etag = r.header("etag").unwrap().to_string();
    std::fs::write(f.www().join("index.html"), b"a longer, different body\n").unwrap();
    let r = get_with(
        &f.site,
        "/index.html",
        &format!("If-None-Match: {etag}\r\n"),
    );
    assert_eq!(r.status, 200, "the old ETag no longer matches");
    assert_ne!(r.header("etag"), Some(etag.as_str()));
}

/// 3000 pipelined requests in one read: the session answers at most about `max_queued`
/// bytes' worth, keeps the rest of the input, and answers it as the queue drains — every
/// response, in order.
#[test]
fn pipelined_requests_wait_while_the_queue_is_full() {
    let f = Fixture::new();
    let limits = Limits::default();
    let mut s = f.session();
    let one = "GET /index.html HTTP/1.1\r\nHost: t\r\n\r\n";
    let input = one.repeat(3000);
    let mut statuses = Vec::new();
    s.feed(input.as_bytes(), |st| statuses.push(st));
    let first_batch = statuses.len();
    assert!(first_batch > 0 && first_batch < 3000, "{first_batch}");
    assert!(
        s.pending_len() < limits.max_queued + 1024,
        "{} bytes queued",
        s.pending_len()
    );
    let out = drain_all(&mut s, &mut statuses);
    assert_eq!(statuses, vec![200; 3000]);
    let rs = parse_responses(&out, &[]);
    assert_eq!(rs.len(), 3000);
    assert!(rs.iter().all(|r| r.body == SMALL));
}

/// A file too large for the cache is never held whole: at most about two chunks are queued,
/// however many pipelined requests name it, and the bytes sent are the file's.
#[test]
fn large_files_stream_in_bounded_chunks() {
    let f = Fixture::new();
    let [_, streaming] = sites(&f);
    let mut s = Session::new(streaming);
    let input = "GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n".repeat(50);
    let mut statuses = Vec::new();
    s.feed(input.as_bytes(), |st| statuses.push(st));
    assert_eq!(statuses, vec![200], "one streamed response at a time");
    let mut out = Vec::new();
    let mut most = 0;
    while let Some(front) = s.pending().front() {
        most = most.max(s.pending_len());
        let n = front.len().min(10_000);
        out.extend_from_slice(&front[..n]);
        s.advance(n);
        s.resume(|st| statuses.push(st));
    }
    assert!(
        most <= 2 * STREAM_CHUNK + 1024,
        "{most} bytes queued at once"
    );
    assert_eq!(statuses, vec![200; 50]);
    let rs = parse_responses(&out, &[]);
    let big = big();
    assert!(rs.iter().all(|r| r.body == big));
    assert!(!s.should_close());
}

/// A streamed file that shrinks under the response cannot honour its Content-Length: the
/// connection closes after what could be sent.
#[test]
fn a_streamed_file_that_shrinks_closes_the_connection() {
    let f = Fixture::new();
    let [_, streaming] = sites(&f);
    let mut s = Session::new(streaming);
    s.feed(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n", |_| {});
    std::fs::OpenOptions::new()
        .write(true)
        .open(f.www().join("big.bin"))
        .unwrap()
        .set_len(100_000)
        .unwrap();
    let out = drain(&mut s);
    assert!(s.should_close());
    assert!(out.len() < BIG_LEN, "{}", out.len());
}

/// RFC 9110 §14.1.1: on an empty file a suffix range `-N` (N > 0) is the one satisfiable
/// form, but no Content-Range names zero bytes: the whole empty file, 200, as nginx answers.
/// `-0` and `0-` stay 416 (nothing is satisfiable from position 0 of nothing).
#[test]
fn a_suffix_range_on_an_empty_file_is_200() {
    let f = Fixture::new();
    std::fs::write(f.www().join("empty.txt"), b"").unwrap();
    let r = get_with(&f.site, "/empty.txt", "Range: bytes=-5\r\n");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("0"));
    assert_eq!(
        get_with(&f.site, "/empty.txt", "Range: bytes=-0\r\n").status,
        416
    );
    assert_eq!(
        get_with(&f.site, "/empty.txt", "Range: bytes=0-\r\n").status,
        416
    );
}

/// `OPTIONS *` (RFC 9110 §7.1: the asterisk-form, valid for OPTIONS only) is a method this
/// server does not implement: 405 with `Allow`, like any other; `*` with GET is a 400.
#[test]
fn options_asterisk_is_405_and_get_asterisk_400() {
    let f = Fixture::new();
    let r = get(&f, "OPTIONS * HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    assert_eq!(get(&f, "GET * HTTP/1.1\r\nHost: t\r\n\r\n").status, 400);
}
