//! DP, the BE's direct payload sender (seed 004 §3.5.4): the store of payloads the BE kept
//! back (a job per payload, named by its payload id), and its control endpoint, a TCP
//! listener the FE role talks to.
//!
//! Control protocol (one command per line, several per connection):
//! - `FETCH <id>\r\n` → `OK <size>\r\n` and the payload's bytes, or `ERR <why>\r\n`. The
//!   relay mode: the FE writes the payload on the client connection itself. It exercises
//!   the whole header path and the store without any packet forging.
//! - `CHECK <id>\r\n` → `OK <size>\r\n` or `ERR`: the direct mode's first step, before the
//!   FE writes anything of the answer (so that it can still fall back).
//! - `SEND <id> <client ip:port> <fe ip:port> <seq> <ack> <window> [<client window>]\r\n`
//!   → `OK <size>\r\n`:
//!   DP sends the payload on the client's connection as the FE (the control connection's
//!   sender thread: GSO bursts on a packet socket, [`crate::gso`], or segments on a raw
//!   socket, [`crate::sender`]), starting at client-view sequence `seq`, carrying `ack` and
//!   the raw `window` field, within `client window` bytes (the FE's TCP_INFO; default
//!   [`INITIAL_WINDOW`]); then `ACK <ack> <window bytes>\r\n` lines (the FE's ack
//!   forwarder) feed its go-back-N. One transfer per control connection at a time.
//!
//! Limits: at most [`MAX_JOBS`] jobs and [`MAX_BYTES`] bytes held; a job not claimed within
//! [`JOB_TTL`] is dropped (the FE died or fell back). A BE whose store is full answers on the
//! normal path (no shortcut), so a slow or absent FE never makes the BE hold more.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use iolab_runtime::net::{TcpListener, TcpStream};

use crate::http1::{write_all, Conn};

pub const MAX_JOBS: usize = 4096;
pub const MAX_BYTES: u64 = 1 << 30;
pub const JOB_TTL: Duration = Duration::from_secs(30);

struct Job {
    body: Bytes,
    created: Instant,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    taken: u64,
    jobs: HashMap<u64, Job>,
    bytes: u64,
    /// Transfers DP sent through the GSO packet socket and through the raw socket.
    gso_sends: u64,
    raw_sends: u64,
}

/// The payloads held for the FE.
#[derive(Default)]
pub struct Store {
    inner: Mutex<Inner>,
}

impl Store {
    pub fn new() -> Arc<Store> {
        Arc::new(Store::default())
    }

    /// Keeps `body`; its payload id, or None when the store is full.
    pub fn insert(&self, body: Bytes) -> Option<u64> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let expired: Vec<u64> = g
            .jobs
            .iter()
            .filter(|(_, j)| now.duration_since(j.created) > JOB_TTL)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(j) = g.jobs.remove(&id) {
                g.bytes -= j.body.len() as u64;
            }
        }
        if g.jobs.len() >= MAX_JOBS || g.bytes + body.len() as u64 > MAX_BYTES {
            return None;
        }
        g.next_id += 1;
        let id = g.next_id;
        g.bytes += body.len() as u64;
        g.jobs.insert(id, Job { body, created: now });
        Some(id)
    }

    /// The size of payload `id`, if held.
    pub fn size(&self, id: u64) -> Option<u64> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.jobs.get(&id).map(|j| j.body.len() as u64)
    }

    /// Removes and returns the payload `id`.
    pub fn take(&self, id: u64) -> Option<Bytes> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let j = g.jobs.remove(&id)?;
        g.bytes -= j.body.len() as u64;
        g.taken += 1;
        Some(j.body)
    }

    /// Payloads kept so far (ids handed out) and payloads claimed by an FE.
    pub fn counts(&self) -> (u64, u64) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (g.next_id, g.taken)
    }

    /// Direct-mode transfers sent (through the GSO packet socket, through the raw socket).
    pub fn send_paths(&self) -> (u64, u64) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (g.gso_sends, g.raw_sends)
    }

    fn count_send(&self, gso: bool) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if gso {
            g.gso_sends += 1;
        } else {
            g.raw_sends += 1;
        }
    }

    /// (jobs, bytes) held now.
    pub fn usage(&self) -> (usize, u64) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (g.jobs.len(), g.bytes)
    }
}

/// Serves the control endpoint until `stop`.
pub async fn serve(
    listener: TcpListener,
    store: Arc<Store>,
    send: SendPath,
    stop: std::rc::Rc<crate::stop::Watch>,
) {
    loop {
        let stream = match stop.accept(&listener).await {
            Ok(Some((s, _))) => s,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!("dp accept: {e}");
                iolab_runtime::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let store = store.clone();
        iolab_runtime::spawn(async move {
            if let Err(e) = control(stream, store, send).await {
                tracing::debug!("dp control connection: {e}");
            }
        });
    }
}

async fn control(stream: TcpStream, store: Arc<Store>, send: SendPath) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let mut conn = Conn::new(stream);
    // The connection's sender thread, started with its first SEND.
    let mut sender: Option<std::sync::mpsc::Sender<Cmd>> = None;
    loop {
        let line = match conn.read_line(256).await {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        let text = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
        let mut words = text.split_ascii_whitespace();
        match (
            words.next(),
            words.next().and_then(|w| w.parse::<u64>().ok()),
        ) {
            (Some("CHECK"), Some(id)) => {
                let line = match store.size(id) {
                    Some(n) => format!("OK {n}\r\n"),
                    None => "ERR unknown payload\r\n".to_string(),
                };
                write_all(&conn.stream, line.into_bytes()).await?;
            }
            (Some("SEND"), Some(id)) => {
                if sender.is_none() {
                    match start_sender(send, store.clone()) {
                        Ok(tx) => sender = Some(tx),
                        Err(e) => tracing::warn!("dp: cannot start a sender thread: {e}"),
                    }
                }
                let reply = match (parse_send(&mut words), &sender) {
                    (None, _) => "ERR bad SEND\r\n".to_string(),
                    (_, None) => "ERR no sender\r\n".to_string(),
                    (Some((flow, wnd)), Some(tx)) => match store.take(id) {
                        Some(body) => {
                            let n = body.len();
                            if tx.send(Cmd::Send(flow, body, wnd)).is_ok() {
                                format!("OK {n}\r\n")
                            } else {
                                sender = None;
                                "ERR no sender\r\n".to_string()
                            }
                        }
                        None => "ERR unknown payload\r\n".to_string(),
                    },
                };
                write_all(&conn.stream, reply.into_bytes()).await?;
            }
            (Some("ACK"), Some(ack)) => {
                let win = words
                    .next()
                    .and_then(|w| w.parse::<usize>().ok())
                    .unwrap_or(0);
                if let Some(tx) = &sender {
                    if tx.send(Cmd::Ack(ack as u32, win)).is_err() {
                        sender = None; // the thread is gone
                    }
                }
            }
            (Some("FETCH"), Some(id)) => match store.take(id) {
                Some(body) => {
                    write_all(&conn.stream, format!("OK {}\r\n", body.len()).into_bytes()).await?;
                    write_all(&conn.stream, body.to_vec()).await?;
                }
                None => write_all(&conn.stream, b"ERR unknown payload\r\n".to_vec()).await?,
            },
            _ => {
                write_all(&conn.stream, b"ERR bad command\r\n".to_vec()).await?;
                return Ok(());
            }
        }
    }
}

/// SEND's fields; the last (the client's window in bytes, 0 = unknown) is optional.
fn parse_send<'a>(w: &mut impl Iterator<Item = &'a str>) -> Option<(crate::sender::Flow, usize)> {
    let client: std::net::SocketAddrV4 = w.next()?.parse().ok()?;
    let fe: std::net::SocketAddrV4 = w.next()?.parse().ok()?;
    let seq: u32 = w.next()?.parse().ok()?;
    let ack: u32 = w.next()?.parse().ok()?;
    let window: u16 = w.next()?.parse().ok()?;
    let client_window = match w.next() {
        None => 0,
        Some(x) => x.parse::<u32>().ok()? as usize,
    };
    Some((
        crate::sender::Flow {
            fe,
            client,
            seq,
            ack,
            window,
            mss: SEND_MSS,
        },
        client_window,
    ))
}

/// Payload bytes per segment DP sends (an Ethernet MTU less IP and TCP headers, rounded
/// down for the options DP does not write).
pub const SEND_MSS: usize = 1400;
/// The client's window DP assumes until its first ACK when the FE could not tell it.
pub const INITIAL_WINDOW: usize = 65535;
/// A transfer without any progress for this long is abandoned (the FE closes the
/// connection on its side).
pub const STALL: Duration = Duration::from_secs(30);

/// How DP puts segments on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SendPath {
    /// A packet socket with GSO: one send per up to 64 KiB ([`crate::gso`]); the raw
    /// socket while the client's next hop is not resolved.
    #[default]
    Gso,
    /// A raw IPv4 socket: one `sendto` per segment ([`crate::sender::RawSocket`]).
    Raw,
}

/// Either sender, chosen per transfer.
enum Wire {
    Gso(crate::gso::GsoSocket),
    Raw(crate::sender::RawSocket),
}

impl Wire {
    fn name(&self) -> &'static str {
        match self {
            Wire::Gso(_) => "gso",
            Wire::Raw(_) => "raw",
        }
    }
}

impl crate::sender::Emit for Wire {
    fn burst(&self, mss: usize) -> usize {
        match self {
            Wire::Gso(g) => g.burst(mss),
            Wire::Raw(r) => r.burst(mss),
        }
    }
    fn emit(
        &mut self,
        flow: &crate::sender::Flow,
        seq: u32,
        data: &[u8],
        flags: u8,
    ) -> io::Result<()> {
        match self {
            Wire::Gso(g) => g.emit(flow, seq, data, flags),
            Wire::Raw(r) => r.emit(flow, seq, data, flags),
        }
    }
}

fn open_sender(send: SendPath, client: std::net::Ipv4Addr) -> io::Result<Wire> {
    if send == SendPath::Gso {
        match crate::gso::Neighbour::resolve(client) {
            Ok(Some(n)) => match crate::gso::GsoSocket::new(n) {
                Ok(g) => return Ok(Wire::Gso(g)),
                Err(e) => {
                    tracing::warn!("dp: no packet socket ({e}); sending through a raw socket")
                }
            },
            Ok(None) => tracing::debug!("dp: next hop to {client} not resolved yet: raw socket"),
            Err(e) => tracing::warn!("dp: reading the route to {client}: {e}; raw socket"),
        }
    }
    Ok(Wire::Raw(crate::sender::RawSocket::new()?))
}

/// What a control connection tells its sender thread.
enum Cmd {
    /// A payload, and the client's window in bytes when the FE knows it (else 0).
    Send(crate::sender::Flow, Bytes, usize),
    /// A client ACK and its window in bytes (the FE's ack forwarder).
    Ack(u32, usize),
}

/// The sender thread of one control connection (it inherits the calling thread's network
/// namespace). It lives as long as the connection, sends its transfers one after the
/// other, and keeps its socket between them: per transfer it costs a channel message, not
/// a thread, a socket and a route lookup.
fn start_sender(send: SendPath, store: Arc<Store>) -> io::Result<std::sync::mpsc::Sender<Cmd>> {
    let (tx, rx) = std::sync::mpsc::channel::<Cmd>();
    std::thread::Builder::new()
        .name("disc-dp".into())
        .spawn(move || {
            // The socket and the client it was opened for.
            let mut wire: Option<(std::net::Ipv4Addr, Wire)> = None;
            let mut next = None;
            loop {
                let (flow, body, wnd) = match next.take() {
                    Some(job) => job,
                    None => match rx.recv() {
                        Ok(Cmd::Send(f, b, w)) => (f, b, w),
                        Ok(Cmd::Ack(..)) => continue, // late, for a finished transfer
                        Err(_) => return,             // the control connection ended
                    },
                };
                let client = *flow.client.ip();
                // A raw socket chosen while the next hop was unresolved is retried.
                let reuse = wire.as_ref().is_some_and(|(ip, w)| {
                    *ip == client && (send == SendPath::Raw || matches!(w, Wire::Gso(_)))
                });
                if !reuse {
                    match open_sender(send, client) {
                        Ok(w) => wire = Some((client, w)),
                        Err(e) => {
                            tracing::warn!("dp: no socket to send to {client}: {e}");
                            continue;
                        }
                    }
                }
                let Some((_, out)) = wire.as_mut() else {
                    continue;
                };
                store.count_send(matches!(out, Wire::Gso(_)));
                match transfer(flow, body, wnd, out, &rx) {
                    Ok((t, after)) => {
                        tracing::debug!(
                            "dp: sent in {} segments by {} {} sends, {} go-back-N rounds",
                            t.segments,
                            t.emits,
                            out.name(),
                            t.retransmits
                        );
                        next = after;
                    }
                    Err(e) => tracing::warn!("dp transfer to {}: {e}", flow.client),
                }
            }
        })?;
    Ok(tx)
}

/// A payload to send: its flow, its bytes, the client's window in bytes (0: unknown).
type Pending = (crate::sender::Flow, Bytes, usize);

/// Sends one payload until the client has acknowledged it all; returns it with the next
/// job if one came in first (the FE gave this one up).
fn transfer(
    flow: crate::sender::Flow,
    body: Bytes,
    wnd: usize,
    out: &mut Wire,
    rx: &std::sync::mpsc::Receiver<Cmd>,
) -> io::Result<(crate::sender::Transfer, Option<Pending>)> {
    let window = if wnd > 0 { wnd } else { INITIAL_WINDOW };
    let mut t = crate::sender::Transfer::new(flow, body, window);
    t.pump(out)?;
    let mut progress = (Instant::now(), 0);
    while !t.done() {
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(Cmd::Ack(ack, win)) => t.on_ack(ack, win, out)?,
            Ok(Cmd::Send(f, b, w)) => {
                tracing::warn!("dp: a new payload before the last was acknowledged");
                return Ok((t, Some((f, b, w))));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => t.on_tick(Instant::now(), out)?,
            Err(_) => break, // the FE's control connection ended
        }
        if t.acked() != progress.1 {
            progress = (Instant::now(), t.acked());
        } else if progress.0.elapsed() > STALL {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no progress"));
        }
    }
    Ok((t, None))
}

/// The FE side: asks DP at the other end of `conn` for payload `id`; Ok(size) once DP has
/// answered OK (the payload's bytes follow on `conn`), Err before any payload byte.
pub async fn fetch(conn: &mut Conn, id: u64) -> io::Result<u64> {
    write_all(&conn.stream, format!("FETCH {id}\r\n").into_bytes()).await?;
    let line = conn.read_line(256).await?;
    let text = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
    match text.strip_prefix("OK ").and_then(|n| n.parse::<u64>().ok()) {
        Some(n) => Ok(n),
        None => Err(io::Error::other(format!("DP answered `{text}`"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_is_bounded_and_ids_are_single_use() {
        let s = Store::new();
        let a = s.insert(Bytes::from_static(b"abc")).unwrap();
        let b = s.insert(Bytes::from_static(b"de")).unwrap();
        assert_ne!(a, b);
        assert_eq!(s.usage(), (2, 5));
        assert_eq!(&s.take(a).unwrap()[..], b"abc");
        assert!(s.take(a).is_none());
        assert_eq!(s.usage(), (1, 2));
        for _ in 1..MAX_JOBS {
            assert!(s.insert(Bytes::new()).is_some());
        }
        assert!(s.insert(Bytes::new()).is_none(), "MAX_JOBS is a bound");
    }
}
