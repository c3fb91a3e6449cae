//! iolab-tokio-server: the tokio peer the lab runs beside iolab's models.
//!
//! A tokio multi-thread runtime (`--workers`, 0 = one per core) serving a directory, with
//! two ways to speak HTTP (`--engine`):
//!
//! - `hyper` (default): hyper 1's HTTP/1.1 server (keep-alive, pipelining, its own request
//!   parser and response writer) — what a tokio user would deploy. Each request is answered
//!   by iolab's `Site` (same path resolution, same refusals, same shared file cache, same
//!   field values). A plain GET or HEAD (no body, no conditional or range field) goes through
//!   the structured entry point `iolab_http::direct`: hyper's parsed method and target in,
//!   status, fields and body `Bytes` out, straight into hyper's response — no request text
//!   built, no response text parsed, so the peer pays only tokio's and hyper's own cost.
//!   Any other request goes through an `iolab_http::Session` kept per connection (the
//!   request line and the fields it needs handed over as text, the answer read back), so
//!   that conditional and range requests follow the one implementation the models use.
//!   What differs from the models is what hyper decides alone: its answers to requests it
//!   cannot parse (400/431 with hyper's own bytes), its limits (hyper's header-count and
//!   buffer limits, not `iolab_http::Limits`), the framing fields it writes itself
//!   (`Date`, `Content-Length`, `Connection`: same values, hyper's order), and the status
//!   line of an answer to an HTTP/1.0 request ("HTTP/1.0 200 OK": hyper labels it with the
//!   request's version).
//! - `iolab`: tokio I/O with iolab HTTP — each connection drives an `iolab_http::Session`
//!   on a `tokio::net::TcpStream` (read → feed → writev pending → advance), exactly as the
//!   models do; every byte on the wire is the models'.
//!
//! SIGINT or SIGTERM stops accepting and exits 0 (connections in progress are dropped).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::{Bytes, BytesMut};
use clap::{Parser, ValueEnum};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use iolab_http::{direct, Session, Site};
use iolab_peer_common::session_io::{self, SessionIo};
use iolab_servers::spec::{TokioEngine, TokioSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

#[path = "../../peer-common/cli/basic_flags.rs"]
mod basic_flags;

/// Serve a directory over HTTP with tokio (the lab's tokio + hyper peer).

#[derive(Debug, Parser)]
#[command(name = "iolab-tokio-server", version)]
struct Args {
    #[command(flatten)]
    basics: basic_flags::BasicFlags,
    /// Which HTTP implementation answers: hyper's server, or iolab's Session on tokio sockets
    #[arg(long, value_enum, default_value_t = Engine::Hyper)]
    engine: Engine,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Engine {
    Hyper,
    Iolab,
}

impl From<Engine> for TokioEngine {
    fn from(e: Engine) -> Self {
        match e {
            Engine::Hyper => TokioEngine::Hyper,
            Engine::Iolab => TokioEngine::Iolab,
        }
    }
}

impl From<TokioEngine> for Engine {
    fn from(e: TokioEngine) -> Self {
        match e {
            TokioEngine::Hyper => Engine::Hyper,
            TokioEngine::Iolab => Engine::Iolab,
        }
    }
}

impl Args {
    /// What to serve, as the spec the lab launches this peer with; an idle timeout must be
    /// seconds >= 0.
    fn to_spec(&self) -> Result<TokioSpec> {
        Ok(TokioSpec {
            engine: self.engine.into(),
            ..TokioSpec::with(self.basics.to_basics()?)
        })
    }
}

fn main() {
    basic_flags::main_with("iolab-tokio-server", Args::to_spec, run);
}

fn run(spec: TokioSpec) -> Result<()> {
    let TokioSpec { peer, engine } = spec;
    let idle = iolab_peer_common::idle_deadline(peer.idle_timeout);
    let site = Site::new(&peer.root, iolab_http::Limits::default())
        .with_context(|| format!("cannot serve {}", peer.root.display()))?;
    let workers = if peer.workers > 0 {
        peer.workers
    } else {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    rt.block_on(async move {
        let listener = listen(peer.addr, peer.backlog)?;
        let addr = listener.local_addr()?;
        println!(
            "serving {} on {addr} with tokio ({workers} workers, {} engine)",
            peer.root.display(),
            engine.name()
        );
        tokio::select! {
            r = accept_loop(listener, site, engine.into(), idle) => r,
            r = stop_signal() => r,
        }
    })?;
    // Connections still open are dropped with the runtime, without waiting for them.
    rt.shutdown_timeout(Duration::from_millis(100));
    Ok(())
}

fn listen(addr: SocketAddr, backlog: u32) -> Result<TcpListener> {
    let sock = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .with_context(|| format!("socket for {addr}"))?;
    // Restart without waiting out TIME_WAIT, as every iolab model does.
    sock.set_reuseaddr(true)
        .with_context(|| format!("SO_REUSEADDR on {addr}"))?;
    sock.bind(addr)
        .with_context(|| format!("cannot bind {addr}"))?;
    sock.listen(backlog)
        .with_context(|| format!("cannot listen on {addr}"))
}

async fn stop_signal() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

async fn accept_loop(
    listener: TcpListener,
    site: Arc<Site>,
    engine: Engine,
    idle: Option<Duration>,
) -> Result<()> {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) if transient(&e) => continue,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                // Out of descriptors (EMFILE/ENFILE): the connection waits in the backlog.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(e) => return Err(e).context("accept failed"),
        };
        // Same as the models: responses leave in one write, Nagle would only add delay.
        let _ = stream.set_nodelay(true);
        let site = Arc::clone(&site);
        match engine {
            Engine::Iolab => tokio::spawn(serve_iolab(stream, site, idle)),
            Engine::Hyper => tokio::spawn(serve_hyper(stream, site, idle)),
        };
    }
}

fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// Awaits `f`, or gives up (None) after `idle` if there is one.
async fn within<T>(idle: Option<Duration>, f: impl std::future::Future<Output = T>) -> Option<T> {
    match idle {
        Some(d) => tokio::time::timeout(d, f).await.ok(),
        None => Some(f.await),
    }
}

// --- engine iolab: the models' loop on a tokio socket -------------------------------------------

async fn serve_iolab(stream: TcpStream, site: Arc<Site>, idle: Option<Duration>) {
    let mut io = TokioSessionIo {
        stream,
        buf: vec![0u8; 8 * 1024],
        idle,
    };
    session_io::drive(Session::new(site), &mut io).await;
}

/// A tokio socket for the session loop: reads into a buffer of its own, writes up to 8
/// chunks in one vectored write, every read and write within the idle deadline.
struct TokioSessionIo {
    stream: TcpStream,
    buf: Vec<u8>,
    idle: Option<Duration>,
}

impl SessionIo for TokioSessionIo {
    async fn read(&mut self) -> Option<&[u8]> {
        match within(self.idle, self.stream.read(&mut self.buf)).await {
            Some(Ok(n)) if n > 0 => Some(&self.buf[..n]),
            _ => None,
        }
    }

    async fn write(&mut self, pending: &VecDeque<Bytes>, _len: usize) -> Option<usize> {
        let mut slices = [IoSlice::new(&[]); 8];
        let mut k = 0;
        for chunk in pending.iter().take(slices.len()) {
            slices[k] = IoSlice::new(chunk);
            k += 1;
        }
        match within(self.idle, self.stream.write_vectored(&slices[..k])).await {
            Some(Ok(w)) if w > 0 => Some(w),
            _ => None,
        }
    }

    async fn close(&mut self) {
        let _ = self.stream.shutdown().await;
    }
}

// --- engine hyper: hyper's server, iolab's answers ----------------------------------------------

/// Per-connection state of the hyper engine: scratch for the direct path, and a session
/// for the requests that need the full one.
struct HyperConn {
    site: Arc<Site>,
    key: Vec<u8>,
    session: Option<Session>,
}

async fn serve_hyper(stream: TcpStream, site: Arc<Site>, idle: Option<Duration>) {
    let conn = Arc::new(Mutex::new(HyperConn {
        site,
        key: Vec::new(),
        session: None,
    }));
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let conn = Arc::clone(&conn);
        async move { Ok::<_, Infallible>(answer(&conn, &req)) }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.keep_alive(true)
        .title_case_headers(true)
        .timer(hyper_util::rt::TokioTimer::new());
    if let Some(d) = idle {
        http.header_read_timeout(d);
    }
    // Errors here are the client's doing (reset, malformed request answered by hyper).
    let _ = http.serve_connection(TokioIo::new(stream), service).await;
}

/// iolab's answer to one request hyper has parsed.
fn answer(conn: &Mutex<HyperConn>, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let mut conn = conn.lock().unwrap_or_else(|e| e.into_inner());
    let headers = req.headers();
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let parts = direct::Request {
        method: req.method().as_str().as_bytes(),
        target: target.as_bytes(),
        http10: req.version() == hyper::Version::HTTP_10,
        has_host: headers.contains_key(hyper::header::HOST),
        conditional_or_body: direct::SESSION_FIELDS
            .iter()
            .any(|f| headers.contains_key(*f)),
    };
    if parts.is_plain() {
        let keep_alive = direct::keep_alive(
            parts.http10,
            headers
                .get_all(hyper::header::CONNECTION)
                .iter()
                .map(|v| v.as_bytes()),
        );
        let HyperConn { site, key, .. } = &mut *conn;
        return from_direct(direct::answer(site, parts.target, key), keep_alive);
    }
    let HyperConn { site, session, .. } = &mut *conn;
    let session = session.get_or_insert_with(|| Session::new(Arc::clone(site)));
    answer_by_session(session, req)
}

/// hyper's response for a structured answer, fields in the models' order (hyper keeps
/// `Date`, `Content-Length` and `Connection` when they are given). A HEAD keeps its body
/// here: hyper sends none of it.
fn from_direct(a: direct::Answer, keep_alive: bool) -> Response<Full<Bytes>> {
    use hyper::header::{CONNECTION, CONTENT_LENGTH, DATE, SERVER};
    let len = a.body.len();
    let mut response = Response::new(Full::new(a.body));
    *response.status_mut() =
        StatusCode::from_u16(a.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = response.headers_mut();
    h.insert(SERVER, HeaderValue::from_static("iolab"));
    if let Ok(d) = HeaderValue::from_maybe_shared(direct::date()) {
        h.insert(DATE, d);
    }
    for (name, value) in a.fields {
        if let Ok(v) = HeaderValue::from_maybe_shared(value) {
            h.append(HeaderName::from_static(name), v);
        }
    }
    h.insert(CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(
        CONNECTION,
        HeaderValue::from_static(if keep_alive { "keep-alive" } else { "close" }),
    );
    response
}

/// The full path: the request handed to a Session as text, its answer read back.
fn answer_by_session(session: &mut Session, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let version = match req.version() {
        hyper::Version::HTTP_10 => "HTTP/1.0",
        _ => "HTTP/1.1",
    };
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut head = Vec::with_capacity(64 + target.len());
    head.extend_from_slice(req.method().as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(target.as_bytes());
    head.push(b' ');
    head.extend_from_slice(version.as_bytes());
    head.extend_from_slice(b"\r\n");
    // The fields the answer may depend on (hyper has framed and drained any body already).
    for name in ["host", "connection"]
        .into_iter()
        .chain(direct::SESSION_FIELDS.into_iter().take(6))
    {
        for v in req.headers().get_all(name) {
            head.extend_from_slice(name.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(v.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
    }
    head.extend_from_slice(b"\r\n");
    session.feed(&head, |_| {});
    // All of the response: a file too large for the cache arrives one chunk per `advance`.
    let mut chunks: Vec<Bytes> = Vec::new();
    while session.has_pending() {
        chunks.extend(session.pending().iter().cloned());
        let len = session.pending_len();
        session.advance(len);
    }
    let response = to_hyper(&chunks);
    response.unwrap_or_else(|| {
        let mut r = Response::new(Full::new(Bytes::from_static(
            b"500 Internal Server Error\n",
        )));
        *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        r
    })
}

/// Turns the response a session queued (a head chunk, then body chunks) into hyper's.
fn to_hyper(chunks: &[Bytes]) -> Option<Response<Full<Bytes>>> {
    let mut chunks = chunks.iter();
    let head = chunks.next()?;
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")?;
    let mut lines = head[..end]
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let status_line = lines.next()?;
    let code = status_line.split(|&b| b == b' ').nth(1)?;
    let status = StatusCode::from_bytes(code).ok()?;
    // The body: the rest of the head chunk, then the other chunks — usually exactly one
    // chunk, the cached file, passed on without a copy.
    let rest = head.slice(end + 4..);
    let others: Vec<&Bytes> = chunks.collect();
    let body = match (rest.is_empty(), others.as_slice()) {
        (true, []) => Bytes::new(),
        (true, [one]) => (*one).clone(),
        _ => {
            let mut all = BytesMut::from(&rest[..]);
            for c in others {
                all.extend_from_slice(c);
            }
            all.freeze()
        }
    };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    for line in lines {
        let colon = line.iter().position(|&b| b == b':')?;
        let name = HeaderName::from_bytes(&line[..colon]).ok()?;
        let value = HeaderValue::from_bytes(line[colon + 1..].trim_ascii()).ok()?;
        headers.append(name, value);
    }
    Some(response)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    fn to_spec(args: Vec<OsString>) -> Result<TokioSpec> {
        basic_flags::parse_spec(args, Args::to_spec)
    }

    /// The shared flags' contract (`check_command_line`), and this peer's own flag through
    /// the command line.
    #[test]
    fn a_spec_survives_the_command_line() {
        iolab_peer_common::testing::check_command_line(
            to_spec,
            TokioSpec::with,
            TokioSpec::to_args,
        );
        let spec = TokioSpec {
            engine: TokioEngine::Iolab,
            ..TokioSpec::new("/w".into(), "127.0.0.1:8099".parse().unwrap())
        };
        assert_eq!(to_spec(spec.to_args()).unwrap(), spec);
    }
}
