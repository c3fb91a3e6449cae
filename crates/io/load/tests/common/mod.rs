//! A tiny HTTP test server on a free loopback port, one thread per connection, whose
//! behaviour each test picks: answer normally, answer late, answer wrong, or not at all.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// 200 with a Content-Length body; keeps the connection unless asked to close.
    Ok,
    /// As Ok, but the body is sent chunked.
    Chunked,
    /// 404 with a body.
    NotFound,
    /// Promises 100 bytes, sends 10, closes.
    Short,
    /// Sends a line that is not HTTP.
    Garbage,
    /// Reads the request and resets the connection (SO_LINGER 0).
    Reset,
    /// Reads the request and never answers.
    Silent,
    /// As Ok, after this many milliseconds.
    Slow(u64),
}

pub const BODY: &[u8] = b"<html>iolab test page</html>\n";

pub struct TestServer {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
    pub requests: Arc<AtomicUsize>,
    pub max_concurrent: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl TestServer {
    pub fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        Self::serve(listener, mode, Duration::ZERO)
    }

    /// A server whose listen backlog is 1 and that accepts nothing for `delay`: further
    /// SYNs are dropped meanwhile, and the clients' kernels retransmit them after 1 s.
    pub fn start_tiny_backlog(mode: Mode, delay: Duration) -> Self {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket calls on a fd we own; on success it moves into the listener.
        let listener = unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0);
            let mut sin: libc::sockaddr_in = std::mem::zeroed();
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            assert_eq!(
                libc::bind(fd, &sin as *const _ as *const libc::sockaddr, len),
                0
            );
            assert_eq!(libc::listen(fd, 1), 0);
            TcpListener::from_raw_fd(fd)
        };
        Self::serve(listener, mode, delay)
    }

    pub fn from_listener(listener: TcpListener, mode: Mode) -> Self {
        Self::serve(listener, mode, Duration::ZERO)
    }

    fn serve(listener: TcpListener, mode: Mode, accept_delay: Duration) -> Self {
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let max_concurrent = Arc::new(AtomicUsize::new(0));
        let current = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c2, r2, m2, s2) = (
            connections.clone(),
            requests.clone(),
            max_concurrent.clone(),
            stop.clone(),
        );
        std::thread::spawn(move || {
            std::thread::sleep(accept_delay);
            for stream in listener.incoming() {
                if s2.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                c2.fetch_add(1, Ordering::Relaxed);
                let (r, cur, m) = (r2.clone(), current.clone(), m2.clone());
                std::thread::spawn(move || serve(stream, mode, &r, &cur, &m));
            }
        });
        Self {
            addr,
            connections,
            requests,
            max_concurrent,
            stop,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // Wake the accept loop so its thread ends.
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<bool> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            buf.drain(..end + 4);
            return Some(head.contains("connection: close"));
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn serve(
    mut stream: TcpStream,
    mode: Mode,
    requests: &AtomicUsize,
    current: &AtomicUsize,
    max: &AtomicUsize,
) {
    let mut buf = Vec::new();
    while let Some(close) = read_request(&mut stream, &mut buf) {
        requests.fetch_add(1, Ordering::Relaxed);
        let now = current.fetch_add(1, Ordering::SeqCst) + 1;
        max.fetch_max(now, Ordering::SeqCst);
        let conn = if close { "close" } else { "keep-alive" };
        let keep = !close;
        let ok = match mode {
            Mode::Ok | Mode::Slow(_) => {
                if let Mode::Slow(ms) = mode {
                    std::thread::sleep(Duration::from_millis(ms));
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: {conn}\r\n\r\n",
                    BODY.len()
                );
                stream.write_all(head.as_bytes()).is_ok() && stream.write_all(BODY).is_ok()
            }
            Mode::Chunked => {
                let mut r = format!(
                    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: {conn}\r\n\r\n"
                )
                .into_bytes();
                for part in BODY.chunks(7) {
                    r.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                    r.extend_from_slice(part);
                    r.extend_from_slice(b"\r\n");
                }
                r.extend_from_slice(b"0\r\n\r\n");
                stream.write_all(&r).is_ok()
            }
            Mode::NotFound => stream
                .write_all(
                    format!("HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: {conn}\r\n\r\nnot found")
                        .as_bytes(),
                )
                .is_ok(),
            Mode::Short => {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789");
                false
            }
            Mode::Garbage => {
                let _ = stream.write_all(b"SSH-2.0-OpenSSH\r\n\r\n");
                false
            }
            Mode::Reset => {
                let linger = libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                };
                use std::os::fd::AsRawFd;
                // SAFETY: valid socket fd and option struct.
                unsafe {
                    libc::setsockopt(
                        stream.as_raw_fd(),
                        libc::SOL_SOCKET,
                        libc::SO_LINGER,
                        &linger as *const _ as *const libc::c_void,
                        std::mem::size_of::<libc::linger>() as libc::socklen_t,
                    )
                };
                false
            }
            Mode::Silent => {
                // Hold the connection open without answering until the client goes away.
                let mut b = [0u8; 64];
                while matches!(stream.read(&mut b), Ok(n) if n > 0) {}
                false
            }
        };
        current.fetch_sub(1, Ordering::SeqCst);
        if !ok || !keep {
            break;
        }
    }
    // Dropping the stream closes it (server-side close, as a web server does).
}
