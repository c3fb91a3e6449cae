//! What every thread-per-core peer must do on the wire, checked against one running binary:
//! files byte for byte (a 700 KB one across many writes), keep-alive and pipelining on one
//! connection, the models' 404 and refusal of escapes, the idle deadline, and a clean exit
//! on SIGTERM. Shared by the monoio and glommio peers (glommio's test includes this file),
//! so the two are held to one standard.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

pub use iolab_peer_common::testing::Peer;

/// Starts `bin` serving `root` on a free port with two threads, a 1 s idle timeout and
/// `extra` flags; returns once it has printed its start line.
pub fn start(bin: &str, root: &Path, extra: &[&str]) -> Peer {
    let mut args = vec![
        "--addr",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--idle-timeout",
        "1",
    ];
    args.extend_from_slice(extra);
    iolab_peer_common::testing::start(bin, root, &args)
}

/// One response read from `s`: status code and body (by Content-Length).
fn response(s: &mut BufReader<TcpStream>) -> (u16, Vec<u8>) {
    let mut status = String::new();
    s.read_line(&mut status).unwrap();
    let code = status
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status:?}"));
    let mut len = 0usize;
    loop {
        let mut field = String::new();
        s.read_line(&mut field).unwrap();
        if field == "\r\n" || field.is_empty() {
            break;
        }
        if let Some(v) = field.strip_prefix("Content-Length: ") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (code, body)
}

fn connect(addr: SocketAddr) -> BufReader<TcpStream> {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    BufReader::new(s)
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n")
}

/// Every check, on a site of a small file, a 700 KB file and a secret outside the root.
pub fn serves_like_the_models(bin: &str, extra: &[&str]) {
    let dir = iolab_sys::testing::tempdir("peer-http").unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let small = b"<html>peer</html>\n".to_vec();
    let big = iolab_sys::testing::random_bytes(700_000, 45);
    std::fs::write(root.join("small.html"), &small).unwrap();
    std::fs::write(root.join("big.bin"), &big).unwrap();
    std::fs::write(dir.path().join("secret.txt"), b"PEER-SECRET").unwrap();
    let mut peer = start(bin, &root, extra);

    // Keep-alive: three requests in turn on one connection, then two pipelined.
    let mut c = connect(peer.addr);
    for (path, want) in [
        ("/small.html", &small),
        ("/big.bin", &big),
        ("/small.html", &small),
    ] {
        c.get_mut().write_all(get(path).as_bytes()).unwrap();
        assert_eq!(response(&mut c), (200, want.clone()), "{bin}: GET {path}");
    }
    let two = get("/big.bin") + &get("/small.html");
    c.get_mut().write_all(two.as_bytes()).unwrap();
    assert_eq!(response(&mut c), (200, big.clone()), "{bin}: pipelined 1");
    assert_eq!(response(&mut c), (200, small.clone()), "{bin}: pipelined 2");

    // The models' refusals: a missing file, escapes from the root.
    for path in ["/nope.html", "/../secret.txt", "/%2e%2e/secret.txt"] {
        c.get_mut().write_all(get(path).as_bytes()).unwrap();
        let (code, body) = response(&mut c);
        assert!((400..500).contains(&code), "{bin}: {path} answered {code}");
        assert!(
            !body.windows(11).any(|w| w == b"PEER-SECRET"),
            "{bin}: {path}"
        );
    }
    assert_eq!(response_code(peer.addr, "/nope.html"), 404, "{bin}: 404");

    // curl, as a user would fetch (when installed): the same bytes.
    if let Some(curl) = iolab_sys::testing::find_tool("curl") {
        let url = format!("http://{}/big.bin", peer.addr);
        let out = Command::new(curl)
            .args(["-s", "--max-time", "20", &url])
            .output();
        assert_eq!(out.unwrap().stdout, big, "{bin}: curl");
    }

    // The idle deadline (1 s): a silent connection is closed by the server.
    let t0 = Instant::now();
    let mut idle = connect(peer.addr);
    let mut rest = Vec::new();
    let _ = idle.read_to_end(&mut rest);
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(8),
        "{bin}: idle connection closed after {waited:?}"
    );

    let status = iolab_sys::testing::stop_child(&mut peer.child);
    assert!(status.success(), "{bin}: exit after SIGTERM: {status}");
}

fn response_code(addr: SocketAddr, path: &str) -> u16 {
    let mut c = connect(addr);
    c.get_mut().write_all(get(path).as_bytes()).unwrap();
    response(&mut c).0
}
