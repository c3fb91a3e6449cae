//! The readiness check by a request: a server is ready when it serves the lab's two files
//! byte for byte (a `--target` command after its start, a `--url` server before each).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::results::FileKind;

/// Longest response the readiness check reads (the big file is 700 KB).
const MAX_RESPONSE: usize = 4 << 20;

/// A server already running, named by `--url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlTarget {
    /// As the user wrote it.
    pub url: String,
    pub addr: SocketAddr,
    /// The Host header: the URL's authority.
    pub host: String,
    /// The path the lab's files are under ("" for the root, else "/a/b").
    pub prefix: String,
}

impl UrlTarget {
    /// `http://IP[:PORT][/PREFIX]` (no query); the lab fetches PREFIX/small.html and
    /// PREFIX/big.bin.
    pub fn parse(url: &str) -> anyhow::Result<UrlTarget> {
        let t = iolab_load::parse_url(url)?;
        if t.path.contains('?') {
            bail!("{url:?}: no query string: the lab appends /small.html and /big.bin to the path");
        }
        Ok(UrlTarget {
            url: url.to_string(),
            addr: t.addr,
            host: t.host,
            prefix: t.path.trim_end_matches('/').to_string(),
        })
    }

    /// The paths the server must serve.
    pub fn paths(&self) -> [String; 2] {
        FileKind::ALL.map(|f| format!("{}{}", self.prefix, f.path()))
    }
}

/// One HTTP/1.1 GET with `Connection: close`, read to the end: (status, body). Every step
/// is bounded by `deadline`.
pub fn get(
    addr: SocketAddr,
    host: &str,
    path: &str,
    deadline: Instant,
) -> anyhow::Result<(u16, Vec<u8>)> {
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let mut s = TcpStream::connect_timeout(&addr, left())?;
    s.set_write_timeout(Some(left()))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: iolab-lab\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        s.set_read_timeout(Some(left()))?;
        let n = s
            .read(&mut chunk)
            .with_context(|| format!("reading the answer to GET {path}"))?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_RESPONSE {
            bail!("GET {path}: answer longer than {MAX_RESPONSE} bytes");
        }
        if let Some(len) = complete_length(&buf) {
            buf.truncate(len);
            break;
        }
    }
    parse_response(&buf).with_context(|| format!("GET {path}"))
}

/// The header end and the Content-Length of a response head, when both are there.
fn head_and_length(buf: &[u8]) -> Option<(usize, Option<usize>)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..end]);
    let len = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())?
    });
    Some((end, len))
}

/// The whole response's length once it has all arrived (by Content-Length).
fn complete_length(buf: &[u8]) -> Option<usize> {
    let (end, len) = head_and_length(buf)?;
    let total = end + len?;
    (buf.len() >= total).then_some(total)
}

fn parse_response(buf: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
    let Some((end, len)) = head_and_length(buf) else {
        bail!(
            "no complete HTTP response head ({} bytes received)",
            buf.len()
        );
    };
    let status_line = String::from_utf8_lossy(&buf[..end]);
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|_| status_line.starts_with("HTTP/1."))
        .with_context(|| {
            format!(
                "not an HTTP/1.x status line: {:?}",
                status_line.lines().next().unwrap_or("")
            )
        })?;
    let body = buf[end..].to_vec();
    if let Some(len) = len {
        if body.len() < len {
            bail!("body cut short: {} of {len} bytes", body.len());
        }
    }
    Ok((status, body))
}

/// Why a check failed: the server is not there (yet), or it answered wrongly.
#[derive(Debug)]
pub enum SiteError {
    /// No answer: refused, reset, timed out. Worth retrying while a server starts.
    Unreachable(anyhow::Error),
    /// An answer that is not the lab's file: retrying will not help.
    Wrong(String),
}

impl std::fmt::Display for SiteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SiteError::Unreachable(e) => write!(f, "no answer: {e:#}"),
            SiteError::Wrong(s) => f.write_str(s),
        }
    }
}

/// Checks that the server at `addr` serves the lab's two files of `www` under `prefix`,
/// byte for byte.
pub fn check_site(
    addr: SocketAddr,
    host: &str,
    prefix: &str,
    www: &Path,
    deadline: Instant,
) -> Result<(), SiteError> {
    for file in FileKind::ALL {
        let want = std::fs::read(www.join(file.path().trim_start_matches('/')))
            .map_err(|e| SiteError::Wrong(format!("reading the lab's {file} file: {e}")))?;
        let path = format!("{prefix}{}", file.path());
        let (status, body) = get(addr, host, &path, deadline).map_err(SiteError::Unreachable)?;
        if status != 200 {
            return Err(SiteError::Wrong(format!(
                "GET {path} on {addr} answered {status}, not 200"
            )));
        }
        if body != want {
            return Err(SiteError::Wrong(format!(
                "GET {path} on {addr} answered {} bytes that are not the lab's {} ({} bytes)",
                body.len(),
                file.path().trim_start_matches('/'),
                want.len()
            )));
        }
    }
    Ok(())
}

/// The readiness check of a started command: `check_site` until it passes, answers
/// wrongly, or `limit` runs out; `exited` says whether the command is gone (then no
/// point in waiting).
pub fn wait_serving(
    addr: SocketAddr,
    www: &Path,
    limit: Duration,
    mut exited: impl FnMut() -> Option<String>,
) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let host = addr.to_string();
    loop {
        if let Some(status) = exited() {
            bail!("exited at start ({status})");
        }
        let attempt = (Instant::now() + Duration::from_secs(2)).min(t0 + limit);
        match check_site(addr, &host, "", www, attempt) {
            Ok(()) => return Ok(()),
            Err(SiteError::Wrong(why)) => {
                bail!("answers, but not with the lab's files: {why} (it must serve {{root}})")
            }
            Err(SiteError::Unreachable(e)) if t0.elapsed() >= limit => bail!(
                "did not serve GET /small.html on {addr} within {:.0} s (last try: {e:#})",
                limit.as_secs_f64()
            ),
            Err(SiteError::Unreachable(_)) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Checks a `--url` server before a start: what it must serve is in the error.
pub fn check_url(u: &UrlTarget, www: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    check_site(u.addr, &u.host, &u.prefix, www, deadline).map_err(|e| {
        anyhow::anyhow!(
            "{} does not serve the lab's files ({e}): it must answer {} with the bytes of {}/small.html and {}/big.bin (the same every run: serve that directory, or copy it)",
            u.url,
            u.paths().join(" and "),
            www.display(),
            www.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_framed_by_length() {
        let r = b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabcdef";
        assert_eq!(complete_length(r), Some(r.len() - 3));
        assert_eq!(
            parse_response(&r[..r.len() - 3]).unwrap(),
            (200, b"abc".to_vec())
        );
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab").is_err());
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        // Without a length: to the end of the stream.
        assert_eq!(
            parse_response(b"HTTP/1.1 404 Not Found\r\n\r\nno").unwrap(),
            (404, b"no".to_vec())
        );
    }

    /// A server that answers with something else is told apart from one not there yet.
    #[test]
    fn the_site_check_wants_the_labs_bytes() {
        let dir = iolab_sys::testing::tempdir("lab-byo-site").unwrap();
        let www = dir.path().join("www");
        crate::site::write_site(&www).unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            // The whole request head first: answering and closing before it is all read
            // would make the client's write fail (EPIPE) instead of its check.
            let mut head = Vec::new();
            let mut b = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut b) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&b[..n]),
                }
            }
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        let e = check_site(addr, "h", "", &www, deadline).unwrap_err();
        srv.join().unwrap();
        assert!(
            matches!(&e, SiteError::Wrong(w) if w.contains("5 bytes that are not the lab's small.html")),
            "{e}"
        );
        // Nobody listening: unreachable, retried until the limit.
        let e = wait_serving(addr, &www, Duration::from_millis(300), || None).unwrap_err();
        assert!(format!("{e:#}").contains("within"), "{e:#}");
        let u = UrlTarget::parse(&format!("http://{addr}/x")).unwrap();
        let e = format!("{:#}", check_url(&u, &www).unwrap_err());
        assert!(e.contains("/x/small.html and /x/big.bin"), "{e}");
    }
}
