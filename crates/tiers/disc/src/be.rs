//! The BE: a static file server on iolab-runtime whose answers are iolab-http's
//! ([`iolab_http::Session`]: the same bytes as every iolab server model), plus beHook: a plain
//! GET that offers the shortcut (`X-Disc-Path` with every tier accepting) for a 200 payload
//! of at least the threshold is answered with a head carrying `X-Disc` and no body; the
//! payload goes to DP's store.
//!
//! Requests are taken one at a time from the connection's input, so pipelined requests are
//! answered in order whichever path each takes. A request with a chunked body, or one whose
//! head does not parse, hands the rest of the connection to the Session (which answers or
//! refuses it exactly as the other models do).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use iolab_http::{Session, Site};
use iolab_runtime::net::{TcpListener, TcpStream};
use iolab_runtime::Runtime;

use crate::dp::Store;
use crate::http1::{find_head_end, parse_request, write_all, Conn, Framing, MAX_HEAD};
use crate::proto::{Disc, PathInfo, Policy, DISC_FIELD, PATH_FIELD};
use crate::stop::Stop;

/// The BE's DISC side: where DP is reached and the policy. None: a plain static server.
#[derive(Clone)]
pub struct BeDisc {
    pub store: Arc<Store>,
    /// What `last` says (the DP control endpoint as the FE reaches it).
    pub advertise: SocketAddr,
    pub policy: Policy,
    /// How DP sends.
    pub send: crate::dp::SendPath,
    /// DP reads the client's ACKs from its tap (the FE's hooks clone them to it); false:
    /// the FE forwards them as control lines.
    pub ack_tap: bool,
    /// Who may use DP's control endpoint ([`crate::dp::Access`]).
    pub access: Arc<crate::dp::Access>,
    /// The addresses of the BE's upstream tiers: the only ones whose `X-Disc-Path` it
    /// honours. With DISC on, a connection from any other address is closed unread
    /// (counted: [`crate::control::Refusal::Upstream`]): in the direct topology the
    /// client's namespace is wired to the BE's (DP's link), and Linux takes packets for a
    /// local address on any interface, so a client routing via that link reached the BE.
    pub upstreams: Vec<std::net::IpAddr>,
}

/// Serves `listener` (and DP's control endpoint on `dp_listener`, when DISC is on) until
/// `stop`. Runs a single-loop runtime on the calling thread.
pub fn run(
    listener: std::net::TcpListener,
    dp_listener: Option<std::net::TcpListener>,
    site: Arc<Site>,
    disc: Option<BeDisc>,
    timeouts: crate::deadline::ClientTimeouts,
    stop: Arc<Stop>,
) -> io::Result<()> {
    let rt = Runtime::builder().workers(1).build()?;
    rt.block_on(async move {
        let watch = std::rc::Rc::new(stop.watch());
        let listener = TcpListener::from_std(listener)?;
        if let (Some(l), Some(d)) = (dp_listener, &disc) {
            let l = TcpListener::from_std(l)?;
            let flows = if d.ack_tap {
                crate::dp::start_tap()
            } else {
                None
            };
            iolab_runtime::spawn(crate::dp::serve(
                l,
                d.store.clone(),
                d.send,
                flows,
                d.access.clone(),
                watch.clone(),
            ));
        }
        loop {
            let stream = match watch.accept(&listener).await {
                Ok(Some((s, peer))) => match &disc {
                    Some(d) if !d.upstreams.contains(&peer.ip()) => {
                        tracing::warn!("be: connection from {peer} refused: not an upstream tier");
                        d.store.refuse(crate::control::Refusal::Upstream);
                        continue;
                    }
                    _ => s,
                },
                Ok(None) => return Ok(()),
                Err(e) => {
                    tracing::warn!("be accept: {e}");
                    iolab_runtime::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let (site, disc) = (site.clone(), disc.clone());
            iolab_runtime::spawn(async move {
                if let Err(e) = connection(stream, site, disc, timeouts).await {
                    tracing::debug!("be connection: {e}");
                }
            });
        }
    })
}

async fn connection(
    stream: TcpStream,
    site: Arc<Site>,
    disc: Option<BeDisc>,
    timeouts: crate::deadline::ClientTimeouts,
) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let mut conn = Conn::client(stream, timeouts);
    let mut session = Session::new(site.clone());
    let mut key = Vec::new();
    loop {
        conn.head_pending();
        let Some(h) = find_head_end(conn.buffered(), 0) else {
            if conn.buffered().len() > MAX_HEAD {
                return session_rest(conn, session).await;
            }
            if conn.fill().await? == 0 {
                return Ok(());
            }
            continue;
        };
        conn.head_done();
        if let Some(d) = &disc {
            if let Some((head, keep)) = shortcut(&conn.buffered()[..h], &site, d, &mut key) {
                conn.consume(h);
                write_all(&conn.stream, head).await?;
                if !keep {
                    return Ok(());
                }
                continue;
            }
        }
        let len = match parse_request(&conn.buffered()[..h]) {
            Ok(r) => match r.framing {
                Framing::None => h,
                Framing::Length(n) if n <= site.limits().max_body as u64 => h + n as usize,
                _ => return session_rest(conn, session).await,
            },
            Err(_) => return session_rest(conn, session).await,
        };
        while conn.buffered().len() < len {
            if conn.fill().await? == 0 {
                return Ok(());
            }
        }
        session.feed(&conn.buffered()[..len], |_| {});
        conn.consume(len);
        flush(&conn.stream, &mut session).await?;
        if session.should_close() {
            return Ok(());
        }
    }
}

/// Writes everything the session has queued (streamed files included), each time all its
/// pieces in one `sendmsg` (a head and its body: one call, no copy).
async fn flush(stream: &TcpStream, session: &mut Session) -> io::Result<()> {
    while session.has_pending() {
        let pieces: Vec<bytes::Bytes> = session.pending().iter().cloned().collect();
        let (r, _) = stream.writev(pieces).await;
        match r? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => session.advance(n),
        }
        session.resume(|_| {});
    }
    Ok(())
}

/// The Session alone for the rest of the connection.
async fn session_rest(mut conn: Conn, mut session: Session) -> io::Result<()> {
    // The Session answers (a refusal, or a chunked body's request): no longer a head's time.
    conn.head_done();
    loop {
        let data = conn.buffered().to_vec();
        conn.consume(data.len());
        session.feed(&data, |_| {});
        flush(&conn.stream, &mut session).await?;
        if session.should_close() || conn.fill().await? == 0 {
            return Ok(());
        }
    }
}

/// beHook: the head of a shortcut answer to request `head` (and whether the connection is
/// kept), or None for the normal path.
fn shortcut(head: &[u8], site: &Site, d: &BeDisc, key: &mut Vec<u8>) -> Option<(Vec<u8>, bool)> {
    let path = PathInfo::parse(crate::http1::field(head, PATH_FIELD)?).ok()?;
    if !path.all_accept() {
        return None;
    }
    let mut slots = crate::http1::field_slots();
    let mut req = httparse::Request::new(&mut []);
    if !matches!(
        req.parse_with_uninit_headers(head, &mut slots),
        Ok(httparse::Status::Complete(n)) if n == head.len()
    ) {
        return None;
    }
    let http10 = req.version == Some(0);
    let has = |n: &str| req.headers.iter().any(|h| h.name.eq_ignore_ascii_case(n));
    let request = iolab_http::direct::Request {
        method: req.method?.as_bytes(),
        target: req.path?.as_bytes(),
        http10,
        has_host: req
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("host"))
            .count()
            == 1,
        conditional_or_body: iolab_http::direct::SESSION_FIELDS.iter().any(|f| has(f)),
    };
    if request.method != b"GET" || !request.is_plain() {
        return None;
    }
    // Nothing of the file is read here: a payload is the open file (or the cache's bytes),
    // and one the store has no room for takes the normal path (which streams it).
    let answer = iolab_http::direct::answer_source(site, request.target, key);
    let size = answer.body.len();
    if answer.status != 200 || !d.policy.shortcut(Some(path), size) || !d.store.has_room(size) {
        return None;
    }
    let keep = iolab_http::direct::keep_alive(
        http10,
        req.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("connection"))
            .map(|h| h.value),
    );
    let id = d.store.insert(crate::payload::Payload::from(answer.body))?;
    let disc = Disc {
        id,
        size,
        last: d.advertise,
        fe: path.fe_tier()?,
    };
    // The head a Session writes for this file, plus X-Disc.
    let mut out = Vec::with_capacity(320);
    out.extend_from_slice(b"HTTP/1.1 200 OK\r\nServer: iolab\r\nDate: ");
    out.extend_from_slice(&iolab_http::direct::date());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &answer.fields {
        let name = match *name {
            "content-type" => "Content-Type",
            "last-modified" => "Last-Modified",
            "etag" => "ETag",
            "accept-ranges" => "Accept-Ranges",
            other => other,
        };
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    use std::io::Write;
    let _ = write!(out, "Content-Length: {size}\r\n");
    out.extend_from_slice(if keep {
        b"Connection: keep-alive\r\n"
    } else {
        b"Connection: close\r\n"
    });
    let _ = write!(out, "{DISC_FIELD}: {}\r\n\r\n", disc);
    Some((out, keep))
}
