//! Session behaviour over a real temporary site: statuses, framing, keep-alive, pipelining.

mod common;

use common::*;
use iolab_http::Limits;

#[test]
fn get_small_file_has_all_headers() {
    let f = Fixture::new();
    let r = get(&f, "GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, SMALL);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(r.header("content-length"), Some(&*SMALL.len().to_string()));
    assert_eq!(r.header("connection"), Some("keep-alive"));
}

#[test]
fn get_large_file_identical() {
    let f = Fixture::new();
    let r = get(&f, "GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, std::fs::read(f.www().join("big.bin")).unwrap());
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
}

#[test]
fn head_has_same_headers_and_no_body() {
    let f = Fixture::new();
    let g = get(&f, "GET /sub/data.json HTTP/1.1\r\nHost: t\r\n\r\n");
    let mut s = f.session();
    s.feed(b"HEAD /sub/data.json HTTP/1.1\r\nHost: t\r\n\r\n", |_| {});
    let raw = drain(&mut s);
    let text = String::from_utf8(raw).unwrap();
    assert!(
        text.ends_with("\r\n\r\n"),
        "no body after a HEAD head: {text:?}"
    );
    let h = &parse_responses(text.as_bytes(), &[true])[0];
    assert_eq!(h.status, 200);
    assert!(h.body.is_empty());
    for name in ["content-type", "content-length", "connection", "server"] {
        assert_eq!(h.header(name), g.header(name), "{name}");
    }
    assert_eq!(h.header("content-length"), Some("2"));
    // HEAD of an error: headers only as well.
    let mut s = f.session();
    s.feed(b"HEAD /missing HTTP/1.1\r\nHost: t\r\n\r\n", |_| {});
    let raw = drain(&mut s);
    assert!(raw.ends_with(b"\r\n\r\n"));
    let r = &parse_responses(&raw, &[true])[0];
    assert_eq!(r.status, 404);
    assert_eq!(r.header("content-length"), Some("14"));
}

#[test]
fn directory_index_and_redirect() {
    let f = Fixture::new();
    let r = get(&f, "GET / HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!((r.status, &r.body[..]), (200, SMALL));
    let r = get(&f, "GET /sub/ HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!((r.status, &r.body[..]), (200, &b"sub index"[..]));
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let r = get(&f, "GET /sub?x=1 HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("/sub/?x=1"));
    assert!(!r.closes());
    // A directory without index.html is not listed.
    assert_eq!(
        get(&f, "GET /empty/ HTTP/1.1\r\nHost: t\r\n\r\n").status,
        404
    );
    // A file named as a directory does not exist.
    assert_eq!(
        get(&f, "GET /index.html/ HTTP/1.1\r\nHost: t\r\n\r\n").status,
        404
    );
}

#[test]
fn percent_decoding_and_query() {
    let f = Fixture::new();
    let r = get(&f, "GET /a%20b.txt?download=1 HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!((r.status, &r.body[..]), (200, &b"space"[..]));
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    let r = get(&f, "GET /%69ndex.%68tml HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 200);
    for bad in ["/a%2", "/a%zzb", "/%", "/%%41"] {
        let mut s = f.session();
        let (st, rs) = exchange(
            &mut s,
            format!("GET {bad} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes(),
        );
        assert_eq!(st, vec![400], "{bad}");
        assert!(rs[0].closes() && s.should_close());
    }
    let r = get(
        &f,
        "GET http://example.com/sub/data.json HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!((r.status, &r.body[..]), (200, &b"{}"[..]));
}

#[test]
fn status_404_405_keep_the_connection() {
    let f = Fixture::new();
    let r = get(&f, "GET /nope.html HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(r.status, 404);
    assert_eq!(r.body, b"404 Not Found\n");
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert!(!r.closes());
    for m in ["POST", "PUT", "DELETE", "OPTIONS", "BREW"] {
        let r = get(&f, &format!("{m} /index.html HTTP/1.1\r\nHost: t\r\n\r\n"));
        assert_eq!(r.status, 405, "{m}");
        assert_eq!(r.header("allow"), Some("GET, HEAD"));
        assert!(!r.closes());
    }
}

#[test]
fn malformed_requests_get_400_and_close() {
    let f = Fixture::new();
    for req in [
        "GARBAGE\r\n\r\n",
        "GET /\r\n\r\n",
        "GET  / HTTP/1.1\r\nHost: t\r\n\r\n",
        "GET / HTTP/1.1 extra\r\n\r\n",
        "GET / http/1.1\r\n\r\n",
        "GET / HTTP/1\r\n\r\n",
        "G(T / HTTP/1.1\r\nHost: t\r\n\r\n",
        "GET * HTTP/1.1\r\nHost: t\r\n\r\n",
        "GET relative HTTP/1.1\r\nHost: t\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: t\r\nNo colon\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: t\r\nBad Name: v\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: t\r\nName : v\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: t\r\n: v\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: t\r\nA: b\r\n folded\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: t\r\nA: b\x01c\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: t\r\nA: b\rc\r\n\r\n",
        "GET /\x7f HTTP/1.1\r\nHost: t\r\n\r\n",
        "GET /é HTTP/1.1\r\nHost: t\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        "GET / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
        "GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ] {
        let mut s = f.session();
        let (st, rs) = exchange(&mut s, req.as_bytes());
        assert_eq!(st, vec![400], "{req:?}");
        assert!(rs[0].closes(), "{req:?}");
        assert_eq!(rs[0].body, b"400 Bad Request\n");
        assert!(s.should_close(), "{req:?}");
        // Further input is ignored: the session answered once.
        let mut more = Vec::new();
        s.feed(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n", |st| more.push(st));
        assert!(more.is_empty() && !s.has_pending());
    }
}

#[test]
fn unsupported_version_505() {
    let f = Fixture::new();
    for v in ["HTTP/2.0", "HTTP/0.9", "HTTP/1.2", "HTTP/3.0"] {
        let mut s = f.session();
        let (st, rs) = exchange(&mut s, format!("GET / {v}\r\n\r\n").as_bytes());
        assert_eq!(st, vec![505], "{v}");
        assert!(rs[0].closes() && s.should_close());
    }
}

#[test]
fn request_line_limit_414() {
    let f = Fixture::new();
    let max = Limits::default().max_request_line;
    // Exactly at the limit: accepted (and 404, the file does not exist).
    let target = format!("/{}", "a".repeat(max - "GET  HTTP/1.1".len() - 1));
    let line = format!("GET {target} HTTP/1.1");
    assert_eq!(line.len(), max);
    assert_eq!(get(&f, &format!("{line}\r\nHost: t\r\n\r\n")).status, 404);
    // One byte over: 414, whether the line is complete or still arriving.
    let long = format!("GET /{}a HTTP/1.1", "a".repeat(max));
    let mut s = f.session();
    let (st, rs) = exchange(&mut s, format!("{long}\r\n\r\n").as_bytes());
    assert_eq!(st, vec![414]);
    assert!(rs[0].closes() && s.should_close());
    let mut s = f.session();
    let (st, _) = exchange(&mut s, &long.as_bytes()[..max + 10]);
    assert_eq!(st, vec![414], "refused before the line ends");
}

#[test]
fn header_limits_431() {
    let f = Fixture::new();
    let limits = Limits::default();
    // 20 KiB header, as in the server suite.
    let big = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "x".repeat(20 * 1024)
    );
    let mut s = f.session();
    let (st, rs) = exchange(&mut s, big.as_bytes());
    assert_eq!(st, vec![431]);
    assert!(rs[0].closes() && s.should_close());
    // Refused while still arriving, without waiting for the end of the head.
    let mut s = f.session();
    let (st, _) = exchange(&mut s, &big.as_bytes()[..18 * 1024]);
    assert_eq!(st, vec![431]);
    // Exactly max_headers lines: fine. One more: 431.
    let lines = |n: usize| {
        let mut r = String::from("GET / HTTP/1.1\r\nHost: t\r\n");
        for i in 1..n {
            r.push_str(&format!("X-{i}: v\r\n"));
        }
        r.push_str("\r\n");
        r
    };
    assert_eq!(get(&f, &lines(limits.max_headers)).status, 200);
    assert_eq!(get(&f, &lines(limits.max_headers + 1)).status, 431);
    // Exactly max_header_bytes of header block: fine.
    let value_len = limits.max_header_bytes - "X: \r\n".len() - "Host: t\r\n".len();
    let exact = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nX: {}\r\n\r\n",
        "v".repeat(value_len)
    );
    assert_eq!(get(&f, &exact).status, 200);
    let over = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nX: {}\r\n\r\n",
        "v".repeat(value_len + 1)
    );
    assert_eq!(get(&f, &over).status, 431);
}

#[test]
fn limits_are_configurable() {
    let f = Fixture::with_limits(Limits {
        max_request_line: 32,
        max_header_bytes: 64,
        max_headers: 2,
        max_body: 4,
        ..Limits::default()
    });
    assert_eq!(get(&f, "GET / HTTP/1.1\r\nHost: t\r\n\r\n").status, 200);
    assert_eq!(
        get(
            &f,
            &format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "a".repeat(40))
        )
        .status,
        414
    );
    assert_eq!(
        get(
            &f,
            "GET / HTTP/1.1\r\nHost: t\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n"
        )
        .status,
        431
    );
    let long = format!("GET / HTTP/1.1\r\nHost: t\r\nA: {}\r\n\r\n", "x".repeat(70));
    assert_eq!(get(&f, &long).status, 431);
    assert_eq!(
        get(
            &f,
            "GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\nabcd"
        )
        .status,
        200
    );
    assert_eq!(
        get(
            &f,
            "GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nabcde"
        )
        .status,
        413
    );
}

#[test]
fn content_length_body_is_drained() {
    let f = Fixture::new();
    let mut s = f.session();
    let (st, rs) = exchange(
        &mut s,
        b"GET /index.html HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nGET /x HTTGET /sub/ HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(st, vec![200, 200]);
    assert_eq!(rs[1].body, b"sub index");
    // A body over max_body: 413 without reading it, then close.
    let mut s = f.session();
    let req = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        Limits::default().max_body + 1
    );
    let (st, rs) = exchange(&mut s, req.as_bytes());
    assert_eq!(st, vec![413]);
    assert!(rs[0].closes() && s.should_close());
    let (st, _) = exchange(
        &mut f.session(),
        b"GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999999999999999999\r\n\r\n",
    );
    assert_eq!(st, vec![413]);
    // A 405 for a POST with a body, and the connection goes on after the body.
    let mut s = f.session();
    let (st, _) = exchange(
        &mut s,
        b"POST /form HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\na=1&bGET / HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(st, vec![405, 200]);
    assert!(!s.should_close());
}

#[test]
fn chunked_body_is_drained() {
    let f = Fixture::new();
    let mut s = f.session();
    let req = b"GET /sub/ HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n\
                4\r\nwiki\r\n5;ext=1\r\npedia\r\n0\r\nTrailer: x\r\n\r\n\
                GET /index.html HTTP/1.1\r\nHost: t\r\n\r\n";
    let (st, rs) = exchange(&mut s, req);
    assert_eq!(st, vec![200, 200]);
    assert_eq!(rs[0].body, b"sub index");
    assert_eq!(rs[1].body, SMALL);
    // Byte at a time gives the same answers.
    let mut s = f.session();
    let mut st = Vec::new();
    for b in req.iter() {
        s.feed(std::slice::from_ref(b), |x| st.push(x));
    }
    assert_eq!(st, vec![200, 200]);
    // Malformed chunk framing: 400 and close.
    for bad in [
        "zz\r\n",
        "4\r\nwikiXX",
        "4 junk\r\nwiki\r\n0\r\n\r\n",
        "0\r\nbad trailer\r\n\r\n",
    ] {
        let mut s = f.session();
        let req = format!("GET / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n{bad}");
        let (st, rs) = exchange(&mut s, req.as_bytes());
        assert_eq!(st, vec![400], "{bad:?}");
        assert!(rs[0].closes());
    }
    // Too much chunked data: 413 and close, no 200 before it.
    let mut s = f.session();
    let max = Limits::default().max_body;
    let req = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{}\r\n",
        max + 1,
        "a".repeat(max + 1)
    );
    let (st, _) = exchange(&mut s, req.as_bytes());
    assert_eq!(st, vec![413]);
    assert!(s.should_close());
}

#[test]
fn keep_alive_rules() {
    let f = Fixture::new();
    let cases: &[(&str, bool)] = &[
        ("GET / HTTP/1.1\r\nHost: t\r\n\r\n", false),
        (
            "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            true,
        ),
        (
            "GET / HTTP/1.1\r\nHost: t\r\nConnection: Keep-Alive, CLOSE\r\n\r\n",
            true,
        ),
        (
            "GET / HTTP/1.1\r\nHost: t\r\nConnection: keep-alive\r\n\r\n",
            false,
        ),
        (
            "GET / HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\n\r\n",
            false,
        ),
        ("GET / HTTP/1.0\r\n\r\n", true),
        ("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", false),
        ("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", false),
        ("GET /missing HTTP/1.0\r\n\r\n", true),
        ("HEAD / HTTP/1.0\r\n\r\n", true),
    ];
    for &(req, closes) in cases {
        let mut s = f.session();
        let (_, rs) = exchange(&mut s, req.as_bytes());
        assert_eq!(rs[0].closes(), closes, "{req:?}");
        assert_eq!(s.should_close(), closes, "{req:?}");
    }
    // Requests after a closing one are not answered.
    let mut s = f.session();
    let (st, _) = exchange(
        &mut s,
        b"GET / HTTP/1.0\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(st, vec![200]);
}

#[test]
fn hundred_requests_on_one_session() {
    let f = Fixture::new();
    let mut s = f.session();
    for i in 0..100 {
        let (st, rs) = exchange(&mut s, b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(st, vec![200], "request {i}");
        assert_eq!(rs[0].body, SMALL);
        assert!(!s.should_close());
    }
}

#[test]
fn pipelined_answered_in_order() {
    let f = Fixture::new();
    let mut s = f.session();
    let req = b"GET /sub/data.json HTTP/1.1\r\nHost: t\r\n\r\nGET /nope HTTP/1.1\r\nHost: t\r\n\r\n\
                HEAD /index.html HTTP/1.1\r\nHost: t\r\n\r\nGET /a%20b.txt HTTP/1.1\r\nHost: t\r\n\r\n\
                DELETE / HTTP/1.1\r\nHost: t\r\n\r\nGET /index.html HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    let (st, rs) = exchange(&mut s, req);
    assert_eq!(st, vec![200, 404, 200, 200, 405, 200]);
    assert_eq!(rs[0].body, b"{}");
    assert!(rs[2].body.is_empty());
    assert_eq!(rs[3].body, b"space");
    assert_eq!(rs[5].body, SMALL);
    assert!(rs[5].closes() && s.should_close());
}

#[test]
fn byte_at_a_time_and_every_split() {
    let f = Fixture::new();
    let req: &[u8] =
        b"\r\nGET /sub/data.json HTTP/1.1\r\nHost: x\r\n\r\nGET /index.html HTTP/1.1\r\nHost: t\r\n\r\n\
                       HEAD /a%20b.txt HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    let (whole, whole_rs) = exchange(&mut f.session(), req);
    assert_eq!(whole, vec![200, 200, 200]);
    let mut s = f.session();
    let mut st = Vec::new();
    for b in req {
        assert!(!s.should_close());
        s.feed(std::slice::from_ref(b), |x| st.push(x));
    }
    assert_eq!(st, whole);
    let out = drain(&mut s);
    let rs = parse_responses(&out, &[false, false, true]);
    for (a, b) in rs.iter().zip(&whole_rs) {
        assert_eq!(a.body, b.body);
        assert_eq!(a.headers.len(), b.headers.len());
    }
    for cut in 0..req.len() {
        for cut2 in [cut, (cut + 7).min(req.len())] {
            let mut s = f.session();
            let mut st = Vec::new();
            s.feed(&req[..cut], |x| st.push(x));
            s.feed(&req[cut..cut2], |x| st.push(x));
            s.feed(&req[cut2..], |x| st.push(x));
            assert_eq!(st, whole, "cut at {cut}/{cut2}");
        }
    }
}

#[test]
fn bare_lf_is_accepted() {
    let f = Fixture::new();
    let mut s = f.session();
    let (st, rs) = exchange(
        &mut s,
        b"GET /sub/data.json HTTP/1.1\nHost: x\n\nGET / HTTP/1.1\nHost: t\nConnection: close\n\n",
    );
    assert_eq!(st, vec![200, 200]);
    assert_eq!(rs[0].body, b"{}");
    assert!(s.should_close());
}

#[test]
fn leading_empty_lines_are_ignored() {
    let f = Fixture::new();
    let mut s = f.session();
    s.feed(b"\r", |_| panic!("nothing to answer yet"));
    let (st, _) = exchange(&mut s, b"\n\r\n\nGET / HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(st, vec![200]);
}

#[test]
fn response_does_not_wait_for_a_content_length_body() {
    let f = Fixture::new();
    let mut s = f.session();
    let mut st = Vec::new();
    s.feed(
        b"GET /sub/data.json HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
        |x| st.push(x),
    );
    assert_eq!(st, vec![200]);
    assert!(s.has_pending());
    assert!(!s.is_between_requests());
    s.feed(b"hel", |x| st.push(x));
    s.feed(b"lo", |x| st.push(x));
    assert!(s.is_between_requests());
    s.feed(b"GET /index.html HTTP/1.1\r\nHost: t\r\n\r\n", |x| {
        st.push(x)
    });
    assert_eq!(st, vec![200, 200]);
}

#[test]
fn session_and_site_cross_threads() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<iolab_http::Session>();
    send_sync::<iolab_http::Site>();
    // And concurrent sessions on one site agree.
    let f = Fixture::new();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..50 {
                    let r = get(&f, "GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n");
                    assert_eq!((r.status, r.body.len()), (200, 700 * 1024));
                }
            });
        }
    });
}

#[test]
fn advance_handles_partial_and_excess_counts() {
    let f = Fixture::new();
    let mut s = f.session();
    s.feed(b"GET /index.html HTTP/1.1\r\nHost: t\r\n\r\n", |_| {});
    let total = s.pending_len();
    assert!(total > SMALL.len());
    let all: Vec<u8> = s.pending().iter().flat_map(|b| b.iter().copied()).collect();
    s.advance(3);
    assert_eq!(s.pending_len(), total - 3);
    assert_eq!(&s.pending()[0][..], &all[3..3 + s.pending()[0].len()]);
    s.advance(usize::MAX);
    assert!(!s.has_pending());
    s.advance(10);
    assert!(s.is_between_requests());
}

/// The test hook behind `IOLAB_TEST_CPU_PER_REQUEST_US` (a deliberately slower build for
/// `lab --compare`'s test): each request costs the thread that answers it that much CPU
/// more, and nothing when it is off.
#[test]
fn an_injected_request_cost_is_paid_per_request() {
    let f = Fixture::new();
    let cpu = |s: &mut iolab_http::Session, n: usize| {
        let t0 = iolab_sys::cpu::thread_cpu_ns();
        for _ in 0..n {
            s.feed(b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n", |_| {});
            drain(s);
        }
        iolab_sys::cpu::thread_cpu_ns() - t0
    };
    let mut s = f.session();
    let plain = cpu(&mut s, 5);
    f.site
        .inject_request_cost(std::time::Duration::from_millis(4));
    let costly = cpu(&mut s, 5);
    assert!(costly >= 20_000_000, "5 requests at 4 ms each: {costly} ns");
    assert!(plain < 20_000_000, "no cost injected: {plain} ns");
}
