//! iolab-tokio-server, both engines, with curl and raw sockets: the files come back byte for
//! byte, the response head is the models' (`iolab_http`) one, and SIGTERM stops it cleanly.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use iolab_peer_common::testing::Peer as Server;

const BIN: &str = env!("CARGO_BIN_EXE_iolab-tokio-server");

struct Root {
    dir: PathBuf,
    small: Vec<u8>,
    big: Vec<u8>,
}

impl Root {
    fn new(tag: &str) -> Root {
        let dir = std::env::temp_dir().join(format!("iolab-peer-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("root/sub")).unwrap();
        let small = b"<html><body>peer small file</body></html>\n".to_vec();
        // 700 KB of bytes with no repeating pattern a truncation could hide in.
        let mut x: u32 = 0x1234_5678;
        let big: Vec<u8> = (0..700_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 24) as u8
            })
            .collect();
        std::fs::write(dir.join("root/small.html"), &small).unwrap();
        std::fs::write(dir.join("root/big.bin"), &big).unwrap();
        std::fs::write(dir.join("root/sub/index.html"), b"sub index\n").unwrap();
        std::fs::write(dir.join("secret.txt"), b"PEER-SECRET\n").unwrap();
        Root { dir, small, big }
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(root: &Root, engine: &str) -> Server {
    let args = [
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--engine",
        engine,
    ];
    iolab_peer_common::testing::start(BIN, &root.dir.join("root"), &args)
}

trait PeerRequests {
    fn url(&self, path: &str) -> String;
    fn raw(&self, request: &[u8]) -> Vec<u8>;
}

impl PeerRequests for Server {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Sends `request` on a new connection and returns everything until the server closes.
    fn raw(&self, request: &[u8]) -> Vec<u8> {
        let mut s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        out
    }
}

fn curl(args: &[&str]) -> Vec<u8> {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "20"])
        .args(args)
        .output()
        .expect("run curl (scripts/install-deps installs it)");
    assert!(
        out.status.success(),
        "curl {args:?} failed: {:?}",
        out.status
    );
    out.stdout
}

/// The head of a response with its Date, Last-Modified and ETag values blanked (they depend
/// on the clock and the file's mtime).
fn head_without_date(response: &[u8]) -> String {
    let end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("no end of head")
        + 4;
    let head = String::from_utf8(response[..end].to_vec()).unwrap();
    head.split("\r\n")
        .map(|l| {
            if l.starts_with("Date: ") {
                "Date: -"
            } else if l.starts_with("Last-Modified: ") {
                "Last-Modified: -"
            } else if l.to_ascii_lowercase().starts_with("etag: ") {
                // hyper writes it title-cased, "Etag".
                "ETag: -"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\r\n")
}

fn check_engine(engine: &str) {
    if iolab_sys::testing::require_tool("curl", "curl").is_none() {
        return;
    }
    let root = Root::new(engine);
    let mut srv = start(&root, engine);

    assert_eq!(
        curl(&[&srv.url("/small.html")]),
        root.small,
        "{engine}: small file"
    );
    assert_eq!(
        curl(&[&srv.url("/big.bin")]),
        root.big,
        "{engine}: 700 KB file"
    );
    assert_eq!(
        curl(&[&srv.url("/sub/")]),
        b"sub index\n",
        "{engine}: directory index"
    );

    // Keep-alive: curl fetches both files on one connection.
    let both = curl(&[&srv.url("/small.html"), &srv.url("/big.bin")]);
    assert_eq!(
        both.len(),
        root.small.len() + root.big.len(),
        "{engine}: two on one connection"
    );

    // The exact head the models send (iolab_http), Date aside.
    let got = srv.raw(b"GET /small.html HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    assert_eq!(
        head_without_date(&got),
        format!(
            "HTTP/1.1 200 OK\r\nServer: iolab\r\nDate: -\r\nContent-Type: text/html; charset=utf-8\r\n\
             Last-Modified: -\r\nETag: -\r\nAccept-Ranges: bytes\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            root.small.len()
        ),
        "{engine}: response head"
    );
    assert!(got.ends_with(&root.small));

    // HEAD: the same headers, no body.
    let head = srv.raw(b"HEAD /big.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let text = String::from_utf8_lossy(&head);
    assert!(
        text.contains("Content-Length: 700000\r\n"),
        "{engine}: HEAD: {text}"
    );
    assert!(
        text.ends_with("\r\n\r\n"),
        "{engine}: HEAD has a body: {text}"
    );

    // Refusals come from iolab_http::Site: a missing file and an escape from the root.
    let missing = srv.raw(b"GET /nope.html HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    assert!(
        missing.starts_with(b"HTTP/1.1 404 "),
        "{engine}: missing file"
    );
    for escape in [
        "/../secret.txt",
        "/%2e%2e/secret.txt",
        "/%2E%2E%2Fsecret.txt",
    ] {
        let req = format!("GET {escape} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        let got = srv.raw(req.as_bytes());
        assert!(
            got.starts_with(b"HTTP/1.1 4"),
            "{engine}: {escape} not refused"
        );
        assert!(
            !got.windows(11).any(|w| w == b"PEER-SECRET"),
            "{engine}: {escape} leaked"
        );
    }

    // HTTP/1.0: answered, then closed (read_to_end returns). hyper labels its answer to a
    // 1.0 request "HTTP/1.0" (its rule, documented); iolab_http says "HTTP/1.1".
    let old = srv.raw(b"GET /small.html HTTP/1.0\r\n\r\n");
    let status_line: &[u8] = if engine == "hyper" {
        b"HTTP/1.0 200 OK\r\n"
    } else {
        b"HTTP/1.1 200 OK\r\n"
    };
    assert!(
        old.starts_with(status_line),
        "{engine}: 1.0: {}",
        String::from_utf8_lossy(&old[..40.min(old.len())])
    );
    assert!(old.ends_with(&root.small), "{engine}: 1.0 body");

    // SIGTERM: exits 0, promptly.
    let st = Command::new("kill")
        .args(["-TERM", &srv.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = srv.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "{engine}: still running 10 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{engine}: exit status {status}");
}

#[test]
fn hyper_engine_serves_the_same_bytes() {
    check_engine("hyper");
}

#[test]
fn iolab_engine_serves_the_same_bytes() {
    check_engine("iolab");
}

#[test]
fn missing_root_is_a_clear_error() {
    let out = Command::new(BIN)
        .args([
            "--root",
            "/nonexistent/iolab-peer-root",
            "--addr",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/iolab-peer-root"), "{err}");
}
