//! Fuzzes `Session::feed` over a real site on disk. Beyond "never panics", it checks:
//! - the answers do not depend on how the input is split across reads (statuses and bytes,
//!   the `Date` values masked);
//! - no response ever carries a byte of a file outside the root, although the root holds
//!   symlinks to it and the input may name it any way it likes;
//! - a FIFO inside the root never blocks (libFuzzer's timeout would report it);
//! - the pending queue's length is consistent and nothing is queued after `should_close`;
//! - backpressure holds: the bytes queued never exceed `max_queued` plus one response head
//!   and body chunk (the tight site has a 300-byte bound and streams files over 1 KiB, so
//!   `Range`, `If-*` and pipelining go through the streaming and resume paths);
//! - every 206 body is the slice its `Content-Range` names, byte for byte.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use iolab_http::{Limits, Session, Site};
use libfuzzer_sys::fuzz_target;

const SECRET: &[u8] = b"FUZZ-SECRET-0123456789";

struct Sites {
    tight: Arc<Site>,
    default: Arc<Site>,
}

/// Contents of `big.bin` in the fuzzed root: larger than a stream chunk, every byte value.
fn big() -> &'static [u8] {
    static BIG: OnceLock<Vec<u8>> = OnceLock::new();
    BIG.get_or_init(|| (0..70_000u32).map(|i| (i * 7 % 251) as u8).collect())
}

fn sites() -> &'static Sites {
    static SITES: OnceLock<Sites> = OnceLock::new();
    SITES.get_or_init(|| {
        let base: PathBuf =
            std::env::temp_dir().join(format!("iolab-http-fuzz-{}", std::process::id()));
        let www = base.join("www");
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(www.join("sub")).unwrap();
        std::fs::write(base.join("secret.txt"), SECRET).unwrap();
        std::fs::create_dir_all(base.join("out")).unwrap();
        std::fs::write(base.join("out/index.html"), SECRET).unwrap();
        std::fs::write(www.join("index.html"), b"<p>index</p>").unwrap();
        std::fs::write(www.join("a.txt"), b"aaa").unwrap();
        std::fs::write(www.join("sub/index.html"), b"sub").unwrap();
        std::fs::write(www.join("sub/b.json"), b"{}").unwrap();
        std::fs::write(www.join("big.bin"), big()).unwrap();
        std::os::unix::fs::symlink(base.join("secret.txt"), www.join("leak")).unwrap();
        std::os::unix::fs::symlink("../secret.txt", www.join("rel")).unwrap();
        std::os::unix::fs::symlink(base.join("out"), www.join("outdir")).unwrap();
        std::os::unix::fs::symlink("a.txt", www.join("alias")).unwrap();
        let fifo =
            std::ffi::CString::new(www.join("fifo").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: `fifo` is a valid NUL-terminated path.
        unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) };
        let tight = Limits {
            max_request_line: 64,
            max_header_bytes: 128,
            max_headers: 4,
            max_body: 40,
            max_queued: 300,
        };
        let streaming = iolab_http::CacheConfig {
            max_cached_file: 1024,
            ..iolab_http::CacheConfig::default()
        };
        Sites {
            tight: Site::with_cache(&www, tight, streaming).unwrap(),
            default: Site::new(&www, Limits::default()).unwrap(),
        }
    })
}

/// Feeds `data` in pieces of the given sizes (cycled), writing out pending bytes in uneven
/// steps after each piece. Returns the statuses and all bytes written.
fn run(site: &Arc<Site>, data: &[u8], sizes: &[usize]) -> (Vec<u16>, Vec<u8>, bool) {
    let mut s = Session::new(site.clone());
    let mut statuses = Vec::new();
    let mut out = Vec::new();
    let mut rest = data;
    let mut i = 0;
    let mut step = 1usize;
    while !rest.is_empty() {
        let n = sizes[i % sizes.len()].clamp(1, rest.len());
        i += 1;
        let was_closing = s.should_close();
        let before = statuses.len();
        s.feed(&rest[..n], |st| statuses.push(st));
        if was_closing {
            assert_eq!(statuses.len(), before, "answered after should_close");
        }
        rest = &rest[n..];
        let limit = site.limits().max_queued + 1024 + 2 * iolab_http::STREAM_CHUNK;
        loop {
            let total: usize = s.pending().iter().map(|b| b.len()).sum();
            assert_eq!(total, s.pending_len());
            assert_eq!(s.has_pending(), total > 0);
            assert!(total <= limit, "{total} bytes queued");
            let Some(front) = s.pending().front() else {
                break;
            };
            let k = step.min(front.len());
            out.extend_from_slice(&front[..k]);
            s.advance(k);
            s.resume(|st| statuses.push(st));
            step = step.wrapping_mul(5).wrapping_add(3) % 4096 + 1;
        }
    }
    (statuses, out, s.should_close())
}

/// Replaces every `Date` value by zeros: the clock may tick between two runs.
fn mask_dates(mut out: Vec<u8>) -> Vec<u8> {
    const KEY: &[u8] = b"\r\nDate: ";
    let mut i = 0;
    while let Some(p) = memfind(&out[i..], KEY) {
        let start = i + p + KEY.len();
        let end = (start + 29).min(out.len());
        out[start..end].fill(0);
        i = end;
    }
    out
}

/// Every `206` whose head names big.bin's length carries exactly the bytes of big.bin its
/// `Content-Range` names. (Other files are too small to tell apart; a body cut by a closing
/// connection ends the output.) A `206` answering `HEAD` has no body: the next response's
/// status line follows its head (big.bin never holds "HT": its bytes step by 7).
fn check_partial_bodies(out: &[u8]) {
    let mut i = 0;
    while let Some(p) = memfind(&out[i..], b"HTTP/1.1 206 ") {
        let start = i + p;
        let Some(h) = memfind(&out[start..], b"\r\n\r\n") else {
            return;
        };
        let head = &out[start..start + h];
        let body_at = start + h + 4;
        i = body_at;
        let text = String::from_utf8_lossy(head);
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
        };
        let Some(range) = field("Content-Range: bytes ") else {
            panic!("206 without Content-Range: {text}");
        };
        let (span, total) = range.split_once('/').expect("A-B/LEN");
        let (a, b) = span.split_once('-').expect("A-B");
        let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
        let len: usize = field("Content-Length:").unwrap().parse().unwrap();
        assert_eq!(len, b - a + 1, "{text}");
        if out[body_at..].starts_with(b"HTTP/1.1 ") {
            continue; // a HEAD's answer
        }
        if total == big().len().to_string() && out.len() >= body_at + len {
            assert!(
                out[body_at..body_at + len] == big()[a..=b],
                "206 body differs"
            );
        }
    }
}

fn memfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fuzz_target!(|input: &[u8]| {
    let Some((&ctl, data)) = input.split_first() else {
        return;
    };
    let sites = sites();
    let site = if ctl & 1 == 0 {
        &sites.tight
    } else {
        &sites.default
    };
    let (st_whole, out_whole, close_whole) = run(site, data, &[usize::MAX]);
    assert!(
        memfind(&out_whole, SECRET).is_none(),
        "a file outside the root leaked"
    );
    if !out_whole.is_empty() {
        assert!(out_whole.starts_with(b"HTTP/1.1 "));
    }
    check_partial_bodies(&out_whole);
    let a = 1 + usize::from((ctl >> 1) & 15);
    let b = 1 + usize::from(ctl >> 5) * 3;
    let (st_split, out_split, close_split) = run(site, data, &[a, 1, b]);
    assert_eq!(st_whole, st_split, "statuses depend on the split");
    assert_eq!(close_whole, close_split);
    assert_eq!(mask_dates(out_whole), mask_dates(out_split));
});
