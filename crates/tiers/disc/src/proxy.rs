//! FE and IS: one reverse proxy on iolab-runtime. Each client connection gets its own
//! upstream connection (kept alive across requests, reopened when the upstream closes it;
//! with several upstreams, round robin per client connection — the IS as a load balancer).
//! Requests are forwarded one at a time as they were received (pipelined requests wait in
//! the buffer), so the upstream's answer is the answer a direct fetch gets, byte for byte.
//!
//! DISC (seed 004 §3.4): the first tier removes any `X-Disc-Path` the client sent and writes
//! its own; the others update it ([`crate::proto`]). A response carrying `X-Disc` has no
//! body on this hop: a tier after the FE role relays the head alone; the tier named FE by
//! the BE removes the field and gets the payload from DP — in [`DiscMode::Relay`] by
//! fetching it over DP's control connection and writing it itself. If DP cannot be reached
//! or refuses, nothing of the answer has been written yet: the request is sent again with
//! this tier's bit cleared and answered on the normal path (the fallback).

use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use iolab_runtime::net::{TcpListener, TcpStream};
use iolab_runtime::Runtime;

use crate::http1::{parse_request, parse_response, relay_body, write_all, Conn, Framing};
use crate::proto::{Disc, PathInfo, DISC_FIELD, PATH_FIELD};
use crate::stop::Stop;

/// How a tier takes part in DISC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscMode {
    /// No DISC fields written or acted on (fields from upstream pass through).
    Off,
    /// Accept the bypass; as FE role fetch the payload from DP and write it ourselves.
    Relay,
    /// Accept the bypass; as FE role have DP send the payload on the client's connection
    /// (the FE's eBPF hooks on `hook_iface` keep one sequence space).
    Direct,
}

#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub upstreams: Vec<SocketAddr>,
    /// This tier holds the client's connection (it writes `X-Disc-Path`).
    pub first: bool,
    pub disc: DiscMode,
    /// The FE's client-side interface, for the eBPF hooks (direct mode, first tier).
    pub hook_iface: Option<String>,
    /// How long a payload sent by DP may make no progress before the FE closes the
    /// client's connection (direct mode; [`DIRECT_STALL`] by default).
    pub stall: std::time::Duration,
    /// The run's key of DP's control connections (the FE role; without it the FE takes
    /// the normal path).
    pub dp_key: Option<crate::control::ControlKey>,
    /// The deadlines of a client's connection: its heads and what is sent to it.
    pub timeouts: crate::deadline::ClientTimeouts,
}

/// The FE's hooks and, per registered connection, where the ACK forwarder's events land.
struct FeHooks {
    /// [`ProxyConfig::stall`].
    stall: std::time::Duration,
    hooks: RefCell<crate::bpf::Hooks>,
    slots: RefCell<std::collections::HashMap<crate::bpf::ConnKey, Rc<AckSlot>>>,
}

/// The latest ACK for DP on one connection (client view, raw window) and the Cond its
/// forwarder waits on.
struct AckSlot {
    latest: Cell<Option<(u32, u32)>>,
    cond: iolab_runtime::Cond,
    /// A payload DP sends with the ACKs cloned to it, not yet known to be acknowledged: the
    /// next epoch waits for it, the watchdog closes the connection if it stalls.
    inflight: Cell<Option<Inflight>>,
    /// The client connection's descriptor (the watchdog shuts it down; the slot goes before
    /// the descriptor could be reused, see `connection`).
    fd: std::os::fd::RawFd,
    /// The control connection of DP sending `inflight` (see [`DpConn::watch`]).
    dp_watch: RefCell<Option<DpWatch>>,
    /// The connection: (client, FE).
    flow: (std::net::SocketAddrV4, std::net::SocketAddrV4),
}

impl AckSlot {
    /// DP refused the payload in flight (it answers a SEND only to refuse it, then closes).
    fn dp_refused(&self) -> bool {
        self.dp_watch
            .borrow()
            .as_ref()
            .is_some_and(|(fd, _)| dp_refused(fd))
    }

    /// Sends DP the `SEND` line of the payload in flight, whose start signal may have been
    /// lost (DP ignores it for a payload it started). Never blocks: a line that does not
    /// fit is not sent (the stall check then has the last word).
    fn resend(&self, send: &SendLine) {
        use std::os::fd::AsRawFd;
        if let Some((fd, signer)) = self.dp_watch.borrow().as_ref() {
            crate::http1::send_now(fd.as_raw_fd(), &signer.line(&send.line(self.flow)));
        }
    }
}

/// What DP needs to send a payload as the FE (the `SEND` line's fields).
#[derive(Clone, Copy, Debug)]
struct SendLine {
    id: u64,
    /// Client-view sequence number of the payload's first byte.
    seq: u32,
    /// The FE's ACK and raw window fields, for DP's segments.
    fe_ack: u32,
    fe_win: u32,
    /// The client's window in bytes, and its window scale.
    wnd: u32,
    wscale: u8,
}

impl SendLine {
    /// The command (to be signed: [`crate::control::Signer::line`]).
    fn line(&self, (client, fe): (std::net::SocketAddrV4, std::net::SocketAddrV4)) -> String {
        format!(
            "SEND {} {client} {fe} {} {} {} {} {}",
            self.id, self.seq, self.fe_ack, self.fe_win, self.wnd, self.wscale
        )
    }
}

#[derive(Clone, Copy)]
struct Inflight {
    /// Client-view sequence number of the payload's first byte, and its size.
    seq: u32,
    size: u32,
    /// Bytes acknowledged when last seen, and when they last grew.
    acked: u32,
    since: std::time::Instant,
    /// Started by the hooks' start signal: the `SEND` line the watchdog sends if no byte
    /// is acknowledged within [`WATCH`] (the signal may have been lost), once.
    send: Option<SendLine>,
}

impl Inflight {
    /// Bytes of the payload acknowledged by the client's latest ACK for DP `last_ack`.
    fn acked_by(&self, last_ack: u32) -> u32 {
        acked_by(self.seq, self.size, last_ack)
    }
}

/// Bytes of a payload at client-view `seq` of `size` bytes that `last_ack` acknowledges.
fn acked_by(seq: u32, size: u32, last_ack: u32) -> u32 {
    let a = last_ack.wrapping_sub(seq);
    if a < 1 << 31 {
        a.min(size)
    } else {
        0
    }
}

/// The payload at `seq` of `size` bytes stalled: its epoch ends at the bytes the client has
/// ([`end_stalled_epoch`]), and the error that closes the connection.
fn stalled(reg: &Registered, seq: u32, size: u32) -> io::Error {
    let mut h = reg.hooks.hooks.borrow_mut();
    if let Ok(Some(st)) = h.get(&reg.key) {
        end_stalled_epoch(&mut h, reg.key, st, acked_by(seq, size, st.last_ack));
    }
    io::Error::new(io::ErrorKind::TimedOut, "the payload stalled")
}

/// Ends a stalled payload's epoch at the `acked` bytes the client has
/// ([`crate::bpf::Hooks::truncate_epoch`]): the FIN the connection's close sends must not
/// lie beyond the payload's hole, where the client would hold it and wait forever.
fn end_stalled_epoch(
    h: &mut crate::bpf::Hooks,
    key: crate::bpf::ConnKey,
    st: crate::bpf::ConnState,
    acked: u32,
) {
    if let Err(e) = h.truncate_epoch(key, st, acked) {
        tracing::warn!("DISC: cannot end the stalled payload's epoch: {e}");
    }
}

/// How often the watchdog looks at the payloads in flight.
const WATCH: std::time::Duration = std::time::Duration::from_secs(1);

/// Closes the client connections whose payload made no progress for
/// [`ProxyConfig::stall`] (DP died mid-payload: the client would wait for the rest
/// forever); forgets those done.
async fn watchdog(fe: std::rc::Weak<FeHooks>) {
    loop {
        iolab_runtime::sleep(WATCH).await;
        let Some(fe) = fe.upgrade() else { return };
        let slots: Vec<(crate::bpf::ConnKey, Rc<AckSlot>)> = fe
            .slots
            .borrow()
            .iter()
            .filter(|(_, s)| s.inflight.get().is_some())
            .map(|(k, s)| (*k, s.clone()))
            .collect();
        for (key, slot) in slots {
            let Some(mut inf) = slot.inflight.get() else {
                continue;
            };
            let Ok(Some(st)) = fe.hooks.borrow_mut().get(&key) else {
                continue;
            };
            let acked = inf.acked_by(st.last_ack);
            if acked == inf.size {
                slot.inflight.set(None);
                slot.dp_watch.take();
            } else if acked > inf.acked {
                (inf.acked, inf.since) = (acked, std::time::Instant::now());
                slot.inflight.set(Some(inf));
            } else if inf.since.elapsed() > fe.stall || slot.dp_refused() {
                tracing::warn!(
                    "DISC: a payload stalled at {acked} of {} bytes: closing",
                    inf.size
                );
                slot.inflight.set(None);
                end_stalled_epoch(&mut fe.hooks.borrow_mut(), key, st, acked);
                // SAFETY: shutdown(2) on the connection's descriptor, open while its slot is
                // registered (the slot is removed before the descriptor can be reused).
                unsafe { libc::shutdown(slot.fd, libc::SHUT_RDWR) };
            } else if let Some(send) = inf.send.filter(|_| acked == 0) {
                if inf.since.elapsed() >= WATCH {
                    tracing::info!(
                        "DISC: payload {} not started after {WATCH:?}: SEND",
                        send.id
                    );
                    slot.resend(&send);
                    inf.send = None;
                    slot.inflight.set(Some(inf));
                }
            }
        }
    }
}

type SharedHooks = Option<Rc<FeHooks>>;

/// Hands the ring's ACK events to their connections' forwarders: one task per FE, woken by
/// the ring's descriptor (the forwarders polled the map every 200 µs before: a third of
/// the FE's CPU at 64 KiB).
async fn read_acks(mut ring: aya::maps::RingBuf<aya::maps::MapData>, fe: Rc<FeHooks>) {
    use std::os::fd::AsRawFd;
    let fd = ring.as_raw_fd();
    loop {
        while let Some(item) = ring.next() {
            let Some(ev) = crate::bpf::AckEvent::parse(&item) else {
                continue;
            };
            if let Some(slot) = fe.slots.borrow().get(&ev.key) {
                slot.latest.set(Some((ev.ack, ev.win)));
                slot.cond.signal();
            }
        }
        if let Err(e) = iolab_runtime::wait_readable(fd).await {
            tracing::warn!("DISC ack ring: {e}; forwarders fall back to reading the map");
            return;
        }
    }
}

/// Serves `listener` until `stop` on a single-loop runtime on the calling thread.
pub fn run(listener: std::net::TcpListener, cfg: ProxyConfig, stop: Arc<Stop>) -> io::Result<()> {
    if cfg.upstreams.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no upstream"));
    }
    let rt = Runtime::builder().workers(1).build()?;
    let cfg = Arc::new(cfg);
    let next = Arc::new(AtomicUsize::new(0));
    rt.block_on(async move {
        let watch = stop.watch();
        let listener = TcpListener::from_std(listener)?;
        let hooks: SharedHooks =
            match (&cfg.hook_iface, cfg.first && cfg.disc == DiscMode::Direct) {
                (Some(iface), true) => {
                    let mut h = crate::bpf::Hooks::load().map_err(io::Error::other)?;
                    h.attach(iface).map_err(io::Error::other)?;
                    let ring = h.take_acks().map_err(io::Error::other)?;
                    let fe = Rc::new(FeHooks {
                        stall: cfg.stall,
                        hooks: RefCell::new(h),
                        slots: Default::default(),
                    });
                    if let Some(ring) = ring {
                        iolab_runtime::spawn(read_acks(ring, fe.clone()));
                    }
                    iolab_runtime::spawn(watchdog(Rc::downgrade(&fe)));
                    Some(fe)
                }
                (None, true) => return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "direct mode on the first tier needs the client-side interface for the hooks",
                )),
                _ => None,
            };
        loop {
            let stream = match watch.accept(&listener).await {
                Ok(Some((s, _))) => s,
                Ok(None) => return Ok(()),
                Err(e) => {
                    tracing::warn!("proxy accept: {e}");
                    iolab_runtime::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let (cfg, hooks) = (cfg.clone(), hooks.clone());
            let up = cfg.upstreams[next.fetch_add(1, Ordering::Relaxed) % cfg.upstreams.len()];
            iolab_runtime::spawn(async move {
                if let Err(e) = connection(stream, up, &cfg, hooks).await {
                    tracing::debug!("proxy connection: {e}");
                }
            });
        }
    })
}

const BAD_REQUEST: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
const BAD_GATEWAY: &[u8] =
    b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

struct Upstream {
    addr: SocketAddr,
    conn: Option<Conn>,
    /// The connection has carried a request before (a failure may be a keep-alive race).
    reused: bool,
}

impl Upstream {
    async fn get(&mut self) -> io::Result<&mut Conn> {
        if self.conn.is_none() {
            let s = TcpStream::connect(self.addr).await?;
            let _ = s.set_nodelay(true);
            self.conn = Some(Conn::new(s));
            self.reused = false;
        }
        Ok(self.conn.as_mut().expect("just set"))
    }
}

/// The request head as this tier sends it on, and this tier's index in the path. `path` is
/// where the head's X-Disc-Path field is (from [`parse_request`]).
fn outgoing_head(
    head: &[u8],
    req: &crate::http1::RequestHead,
    cfg: &ProxyConfig,
    offer: bool,
) -> (Vec<u8>, Option<u32>) {
    let mut buf = [0u8; 96];
    let path = &req.path;
    if cfg.first {
        // A client's own DISC fields are never trusted, nor passed on (issue 43: its
        // X-Disc reached the BE verbatim).
        let (line, me) = match cfg.disc {
            DiscMode::Off => (None, None),
            _ => (Some(path_line(PathInfo::first(offer), &mut buf)), Some(0)),
        };
        if req.other_disc {
            return (crate::http1::strip_disc_fields(head, line), me);
        }
        return (path.replace(head, PATH_FIELD, line), me);
    }
    let incoming = path.value(head, PATH_FIELD).map(PathInfo::parse);
    match incoming {
        None => (head.to_vec(), None),
        Some(Err(_)) => (path.replace(head, PATH_FIELD, None), None),
        Some(Ok(p)) => {
            let me = p.nb_tier;
            match p.forward(offer && cfg.disc != DiscMode::Off) {
                Some(next) => (
                    path.replace(head, PATH_FIELD, Some(path_line(next, &mut buf))),
                    Some(me),
                ),
                None => (path.replace(head, PATH_FIELD, None), None),
            }
        }
    }
}

/// The X-Disc-Path line for `p`, formatted in `buf` (no allocation per request).
fn path_line(p: PathInfo, buf: &mut [u8; 96]) -> &[u8] {
    use std::io::Write;
    let mut c = std::io::Cursor::new(&mut buf[..]);
    let _ = write!(c, "{PATH_FIELD}: {}\r\n", p);
    let n = c.position() as usize;
    &buf[..n]
}

/// A client connection registered with the hooks; removed from their map when dropped.
struct Registered {
    hooks: Rc<FeHooks>,
    slot: Rc<AckSlot>,
    key: crate::bpf::ConnKey,
    /// The client's window scale (the shift of its window fields).
    wscale: u8,
    /// The FE's end of the connection, for a DP that continues it (`HELLO`).
    tcp: Option<crate::repair::FeEnd>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        // Not removed yet: the FE's stack still sends on a closed connection (Hooks::LINGER).
        self.hooks.hooks.borrow_mut().retire(self.key);
        self.hooks.slots.borrow_mut().remove(&self.key);
    }
}

fn register(stream: &TcpStream, hooks: &SharedHooks) -> io::Result<Option<Registered>> {
    let Some(h) = hooks else { return Ok(None) };
    let (SocketAddr::V4(client), SocketAddr::V4(fe)) = (stream.peer_addr()?, stream.local_addr()?)
    else {
        return Ok(None); // IPv6: no shortcut (the hooks are IPv4)
    };
    let key = crate::bpf::ConnKey::new(*client.ip(), client.port(), *fe.ip(), fe.port());
    // The client's window scale (fixed at the handshake).
    let wscale = match client_window(stream) {
        Ok((wscale, _)) => wscale,
        Err(e) => {
            tracing::warn!("DISC: TCP_INFO of {client}: {e}; no shortcut");
            return Ok(None);
        }
    };
    // (None: DP cannot continue the connection from a socket of its own; it builds segments)
    let tcp = crate::repair::FeEnd::read(stream)
        .map_err(|e| tracing::debug!("DISC: the FE's TCP state of {client}: {e}"))
        .ok();
    if let Err(e) = h.hooks.borrow_mut().register_with_wscale(key, wscale) {
        // No shortcut on this connection: its answers take the normal path.
        tracing::warn!("DISC hooks: cannot register {client}: {e}");
        return Ok(None);
    }
    use std::os::fd::AsRawFd;
    let slot = Rc::new(AckSlot {
        latest: Cell::new(None),
        cond: iolab_runtime::Cond::new(),
        inflight: Cell::new(None),
        fd: stream.as_raw_fd(),
        dp_watch: RefCell::new(None),
        flow: (client, fe),
    });
    h.slots.borrow_mut().insert(key, slot.clone());
    Ok(Some(Registered {
        hooks: h.clone(),
        slot,
        key,
        wscale,
        tcp,
    }))
}

async fn connection(
    stream: TcpStream,
    up_addr: SocketAddr,
    cfg: &ProxyConfig,
    hooks: SharedHooks,
) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    // `reg` before `client`: dropped after it, with no await between, so the watchdog never
    // sees a slot whose descriptor was closed (and maybe reused).
    let reg = register(&stream, &hooks)?;
    let mut client = Conn::client(stream, cfg.timeouts);
    let mut up = Upstream {
        addr: up_addr,
        conn: None,
        reused: false,
    };
    // DP control connection (FE role, relay and direct modes), kept per client connection.
    let mut dp: Option<DpConn> = None;
    // Where the hooks clone the client's ACKs for DP (direct mode), per DP address.
    let mut dp_link: LinkCache = None;
    // The last answer on this connection was a direct one: nothing written since its head
    // (see fe_direct's `after_direct`).
    let mut after_direct = false;
    let key = cfg.dp_key.as_ref();
    loop {
        let was_direct = std::mem::take(&mut after_direct);
        let Some(h) = (match client.read_head().await {
            Ok(h) => h,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                let _ = write_all(&client.stream, BAD_REQUEST.to_vec()).await;
                return Ok(());
            }
            Err(e) => return Err(e),
        }) else {
            return Ok(());
        };
        let head = client.buffered()[..h].to_vec();
        client.consume(h);
        let req = match parse_request(&head) {
            Ok(r) if r.framing != Framing::Chunked => r,
            _ => {
                let _ = write_all(&client.stream, BAD_REQUEST.to_vec()).await;
                return Ok(());
            }
        };
        let idempotent = matches!(&*req.method, "GET" | "HEAD");
        let mut offer = cfg.disc != DiscMode::Off && idempotent;
        let mut attempts = 0;
        // Loops again only to resend: a stale keep-alive upstream, or the DISC fallback.
        let keep = loop {
            attempts += 1;
            let (out, me) = outgoing_head(&head, &req, cfg, offer);
            let reused = up.reused && up.conn.is_some();
            let sent = send_request(&mut up, &mut client, out, req.framing).await;
            let res = match sent {
                Ok(()) => read_response_head(&mut up, &req.method).await,
                Err(e) => Err(e),
            };
            let (rhead, res) = match res {
                Ok(x) => x,
                Err(e) => {
                    up.conn = None;
                    if reused && idempotent && attempts < 3 {
                        continue;
                    }
                    let _ = write_all(&client.stream, BAD_GATEWAY.to_vec()).await;
                    return Err(e);
                }
            };
            up.reused = true;
            let disc = match res.disc.value(&rhead, DISC_FIELD).map(Disc::parse) {
                None => None,
                Some(Ok(d)) if me.is_some_and(|m| m >= d.fe) => Some(d),
                Some(_) => {
                    // A shortcut this tier never offered, or a malformed field.
                    up.conn = None;
                    let _ = write_all(&client.stream, BAD_GATEWAY.to_vec()).await;
                    return Ok(());
                }
            };
            let Some(d) = disc else {
                let upc = up.conn.as_mut().expect("connected");
                let framing = match send_head(upc, &client.stream, rhead, res.framing).await {
                    Ok(f) => f,
                    Err(e) => {
                        up.conn = None;
                        return Err(e);
                    }
                };
                if let Err(e) = relay_body(upc, Some(&client.stream), framing).await {
                    up.conn = None;
                    return Err(e);
                }
                if !res.keep_alive {
                    up.conn = None;
                }
                break res.keep_alive;
            };
            if !res.keep_alive {
                up.conn = None;
            }
            if me != Some(d.fe) {
                // IS role: the head alone goes on.
                write_all(&client.stream, rhead).await?;
                break res.keep_alive;
            }
            // FE role.
            let out_head = res.disc.replace(&rhead, DISC_FIELD, None);
            // Direct mode: DP answers HELLO and sends on the client's connection; else DP
            // hands the payload over (relay). Either refused: the normal path.
            let shortcut = match (cfg.disc, &reg) {
                (DiscMode::Direct, Some(reg)) => fe_hello(&mut dp, d.last, key, reg)
                    .await
                    .and_then(|kind| direct_link(kind, &mut dp_link, d.last))
                    .map(|link| Shortcut::Direct(reg, link)),
                _ => fe_relay(&mut dp, d, key).await.map(|()| Shortcut::Relay),
            };
            match shortcut {
                Err(e) => {
                    tracing::info!("DISC fallback (DP {}: {e}): normal path", d.last);
                    dp = None;
                    offer = false;
                    continue;
                }
                Ok(Shortcut::Direct(reg, link)) => {
                    let c = dp.as_mut().expect("connected");
                    let closing = !res.keep_alive || !req.keep_alive;
                    let after = Answer {
                        closing,
                        after_direct: was_direct,
                    };
                    fe_direct(reg, &client.stream, c, d, out_head, link, after).await?;
                    after_direct = true;
                    break res.keep_alive;
                }
                Ok(Shortcut::Relay) => {
                    let c = &mut dp.as_mut().expect("connected").conn;
                    let left =
                        send_head(c, &client.stream, out_head, Framing::Length(d.size)).await?;
                    relay_body(c, Some(&client.stream), left).await?;
                    break res.keep_alive;
                }
            }
        };
        if !keep || !req.keep_alive {
            return Ok(());
        }
    }
}

/// How the FE has the payload of an answer DP holds reach its client.
enum Shortcut<'a> {
    /// DP sends it on the client's connection (the FE's registration there, DP's link).
    Direct(&'a Registered, Option<crate::bpf::DpLink>),
    /// DP hands it to the FE, which writes it.
    Relay,
}

/// Writes an answer's head with as much of its body as `from` holds (after waiting for a
/// short tail: [`Conn::fill_tail`]) in one write, as nginx's writev of a head and its first
/// buffer; the framing of what is left to relay.
async fn send_head(
    from: &mut Conn,
    to: &TcpStream,
    head: Vec<u8>,
    framing: Framing,
) -> io::Result<Framing> {
    let Framing::Length(n) = framing else {
        write_all(to, head).await?;
        return Ok(framing);
    };
    from.fill_tail(n).await?;
    let take = (from.buffered().len() as u64).min(n);
    from.send_with_head(to, head, take as usize).await?;
    Ok(match n - take {
        0 => Framing::None,
        left => Framing::Length(left),
    })
}

/// Writes the request head and relays its body.
async fn send_request(
    up: &mut Upstream,
    client: &mut Conn,
    head: Vec<u8>,
    framing: Framing,
) -> io::Result<()> {
    let c = up.get().await?;
    write_all(&c.stream, head).await?;
    relay_body(client, Some(&c.stream), framing).await
}

async fn read_response_head(
    up: &mut Upstream,
    method: &str,
) -> io::Result<(Vec<u8>, crate::http1::ResponseHead)> {
    let c = up.conn.as_mut().expect("connected");
    let Some(h) = c.read_head().await? else {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "upstream closed before answering",
        ));
    };
    let head = c.buffered()[..h].to_vec();
    c.consume(h);
    let res = parse_response(&head, method)?;
    Ok((head, res))
}

/// The FE's control connection to one DP, kept per client connection.
struct DpConn {
    at: SocketAddr,
    conn: Conn,
    /// Direct mode: what DP answered HELLO.
    kind: Option<DpKind>,
    /// Signs the lines sent on it.
    signer: Rc<crate::control::Signer>,
    /// Checks DP's answers on it.
    answers: crate::control::Verifier,
    /// Direct mode: a second descriptor of the connection, for the watchdog, which must see
    /// that DP refused a payload (written why and closed) without owning the connection.
    watch: Option<DpWatch>,
}

/// A second descriptor of a control connection and its signer (the watchdog's resend).
type DpWatch = (Rc<std::os::fd::OwnedFd>, Rc<crate::control::Signer>);

/// How long DP may take to greet a new control connection.
const DP_GREETING: std::time::Duration = std::time::Duration::from_secs(2);

async fn dp_conn<'a>(
    dp: &'a mut Option<DpConn>,
    at: SocketAddr,
    key: Option<&crate::control::ControlKey>,
) -> io::Result<&'a mut DpConn> {
    if dp.as_ref().is_some_and(|c| c.at != at) {
        *dp = None;
    }
    if dp.is_none() {
        let key = key.ok_or_else(|| io::Error::other("no DP key (--dp-key-file)"))?;
        let s = TcpStream::connect(at).await?;
        let _ = s.set_nodelay(true);
        let mut conn = Conn::new(s);
        let (signer, answers) = crate::dp::greeted(&mut conn, key, DP_GREETING).await?;
        *dp = Some(DpConn {
            at,
            conn,
            kind: None,
            signer: Rc::new(signer),
            answers,
            watch: None,
        });
    }
    Ok(dp.as_mut().expect("connected"))
}

/// Whether the control connection `fd` has anything to read or is closed: DP writes on it
/// during a direct transfer only to refuse a SEND, and then closes it.
fn dp_refused(fd: &std::os::fd::OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    let mut b = 0u8;
    // SAFETY: recv(MSG_PEEK) of at most one byte into `b`, alive for the call.
    let r = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            (&mut b as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    r >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock
}

/// Sends `command` signed and reads DP's answer (refused unless DP signed it).
async fn dp_line(c: &mut DpConn, command: &str) -> io::Result<String> {
    write_all(&c.conn.stream, c.signer.line(command).into_bytes()).await?;
    let l = c.conn.read_line(crate::dp::MAX_LINE).await?;
    let line = String::from_utf8_lossy(&l[..l.len() - 2]).into_owned();
    crate::control::check_answer(&mut c.answers, &line)
}

/// Direct mode, before anything of the answer is written: DP at `at` can be reached (HELLO
/// once per control connection, naming the client connection it serves; the BE put the
/// payload in DP's store as it wrote the head, on the same loop, so the payload is not
/// asked for). With the FE's TCP state in HELLO, DP may continue the connection from a
/// socket of its own.
async fn fe_hello(
    dp: &mut Option<DpConn>,
    at: SocketAddr,
    key: Option<&crate::control::ControlKey>,
    reg: &Registered,
) -> io::Result<DpKind> {
    let c = dp_conn(dp, at, key).await?;
    if let Some(kind) = c.kind {
        return Ok(kind);
    }
    let (client, fe) = reg.slot.flow;
    let tcp = reg.tcp.map(|t| format!(" {}", t.fields()));
    let hello = format!(
        "HELLO {client} {fe} {}{}",
        reg.wscale,
        tcp.unwrap_or_default()
    );
    let answer = dp_line(c, &hello).await?;
    let kind = match answer.as_str() {
        "OK" => DpKind::Lines,
        "OK tap" => DpKind::Tap,
        "OK tap repair" => DpKind::Stack,
        _ => return Err(io::Error::other(format!("DP answered `{answer}`"))),
    };
    use std::os::fd::AsFd;
    c.watch = Some((
        Rc::new(c.conn.stream.as_fd().try_clone_to_owned()?),
        c.signer.clone(),
    ));
    c.kind = Some(kind);
    Ok(kind)
}

/// How DP takes a payload's start and the client's ACKs (its answer to HELLO).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DpKind {
    /// As control lines: `SEND`, then `ACK` lines from the FE's forwarder.
    Lines,
    /// From its tap: the hooks clone the head's segment and the ACKs to it.
    Tap,
    /// The start from its tap, the ACKs by its TCP stack: DP sends from a socket continuing
    /// the FE's connection (`TCP_REPAIR`), and the hooks clone every ACK for it to DP's own
    /// link address.
    Stack,
}

/// DP's address and, when DP is one hop away, the FE's link to it and DP's link address.
type LinkCache = Option<(SocketAddr, Option<(crate::bpf::DpLink, [u8; 6])>)>;

/// Where the hooks send the client's ACKs for DP of `kind` at `dp` (None: to the ring, for
/// the FE's forwarder). Err: a DP that takes them in its TCP stack but is not one hop away
/// (the normal path then).
fn direct_link(
    kind: DpKind,
    cache: &mut LinkCache,
    dp: SocketAddr,
) -> io::Result<Option<crate::bpf::DpLink>> {
    Ok(match kind {
        DpKind::Lines => None,
        DpKind::Tap => link_to(cache, dp).map(|(l, _)| l),
        DpKind::Stack => match link_to(cache, dp) {
            Some((l, mac)) => Some(crate::bpf::DpLink {
                to_stack: Some(mac),
                ..l
            }),
            None => {
                return Err(io::Error::other(
                    "DP sends from its TCP stack but is not one hop away",
                ))
            }
        },
    })
}

/// The FE's interface towards DP at `dp` and its link address, and DP's own link address,
/// when DP is one hop away (resolved once per DP address; None: the FE forwards the ACKs
/// itself).
fn link_to(cache: &mut LinkCache, dp: SocketAddr) -> Option<(crate::bpf::DpLink, [u8; 6])> {
    if let Some((at, link)) = cache {
        if *at == dp {
            return *link;
        }
    }
    let link = match dp {
        SocketAddr::V4(a) => match crate::gso::Neighbour::resolve(*a.ip()) {
            // One hop: the next hop is DP itself (not a router).
            Ok(Some(n)) if n.on_link => Some((
                crate::bpf::DpLink {
                    ifindex: n.ifindex as u32,
                    src_mac: n.src_mac,
                    ends_only: false,
                    to_stack: None,
                },
                n.dst_mac,
            )),
            _ => None,
        },
        SocketAddr::V6(_) => None,
    };
    *cache = Some((dp, link));
    link
}

/// SIOCOUTQNSD (linux/sockios.h): bytes in the send queue not yet sent.
const SIOCOUTQNSD: libc::c_ulong = 0x894B;

/// Bytes written on `s` that its stack has not sent yet (SIOCOUTQNSD). Once 0, every byte
/// went through the TC egress hook (which runs in the transmit path, before any qdisc), so
/// the map's `fe_nxt` is the FE's next sequence number.
fn unsent(s: &TcpStream) -> io::Result<i32> {
    queue_bytes(s, SIOCOUTQNSD)
}

/// SIOCOUTQ (linux/sockios.h, = TIOCOUTQ): bytes in the send queue not yet acknowledged.
const SIOCOUTQ: libc::c_ulong = 0x5411;

/// Bytes written on `s` that the client has not acknowledged (SIOCOUTQ).
fn unacked(s: &TcpStream) -> io::Result<u32> {
    Ok(queue_bytes(s, SIOCOUTQ)?.max(0) as u32)
}

/// A send-queue ioctl of `s` (SIOCOUTQ, SIOCOUTQNSD): one int.
fn queue_bytes(s: &TcpStream, request: libc::c_ulong) -> io::Result<i32> {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: both requests write one int into `n`, alive for the call.
    if unsafe { libc::ioctl(s.as_raw_fd(), request, &mut n) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n)
}

/// What the FE's stack knows of the client's receive window (TCP_INFO): the client's
/// window scale (the shift its window fields take) and its last window in bytes (0 when
/// the kernel does not report it: `tcpi_snd_wnd` came with Linux 5.19).
fn client_window(s: &impl std::os::fd::AsRawFd) -> io::Result<(u8, u32)> {
    // struct tcp_info: tcpi_snd_wscale is the low nibble of byte 6, then tcpi_snd_wnd; read
    // as bytes so that older kernels (shorter structs) are told apart by the returned length.
    let mut buf = [0u8; 512];
    let len =
        crate::sockopt::get_bytes(s.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, &mut buf)?;
    if len < 8 {
        return Err(io::Error::other("TCP_INFO too short"));
    }
    let wnd = crate::sockopt::u32_at(&buf, len, crate::sockopt::TCPI_SND_WND).unwrap_or(0);
    Ok((buf[6] & 0x0f, wnd))
}

/// Waits until the FE's stack has sent everything written on `client` (through the egress
/// hook, which runs in the transmit path before any qdisc).
async fn wait_sent(client: &TcpStream, reg: &Registered, t0: std::time::Instant) -> io::Result<()> {
    while unsent(client)? > 0 {
        if t0.elapsed() > reg.hooks.stall {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "bytes not sent"));
        }
        iolab_runtime::sleep(ACK_POLL).await;
    }
    Ok(())
}

/// What [`fe_direct`] knows of the connection around this answer.
#[derive(Debug, Clone, Copy)]
struct Answer {
    /// The FE closes the connection after this answer.
    closing: bool,
    /// The connection's previous answer was a direct one and nothing was written since its
    /// head.
    after_direct: bool,
}

/// How long the FE waits for any progress of the shortcut before closing the connection
/// (the default of [`ProxyConfig::stall`]).
pub const DIRECT_STALL: std::time::Duration = std::time::Duration::from_secs(30);
/// How often the FE checks whether its stack has sent the head (and whether the previous
/// payload is acknowledged).
const ACK_POLL: std::time::Duration = std::time::Duration::from_micros(200);
/// How often an ack forwarder reads the map itself, should the ring have lost events.
const MAP_CHECK: std::time::Duration = std::time::Duration::from_millis(10);

/// Direct mode, the answer's `head` not written yet: once everything the FE wrote before
/// has gone through its egress hook (`fe_nxt` in the map is then the FE's next byte) and
/// the previous payload is acknowledged, the payload gets the `size` sequence numbers after
/// the head (the hooks' new epoch), the head is written and DP sends the payload as the FE.
/// With `link` (DP on the FE's link, with a tap) the hooks clone the head's segment to DP
/// as its start signal and the client's ACKs for the payload too, and this returns once
/// the head is written (the next epoch or the watchdog checks the payload's end); without,
/// a `SEND` line starts DP and the client's ACKs are forwarded to DP until the last byte
/// is acknowledged. The FE's later bytes are shifted past the payload.
async fn fe_direct(
    reg: &Registered,
    client: &TcpStream,
    dp: &mut DpConn,
    d: Disc,
    head: Vec<u8>,
    link: Option<crate::bpf::DpLink>,
    Answer {
        closing,
        after_direct,
    }: Answer,
) -> io::Result<()> {
    let t0 = std::time::Instant::now();
    let get = || conn_state(reg);
    // Everything written before must have gone through the egress hook (then the slot's
    // `fe_nxt` is the FE's next byte). After a direct answer with nothing written since,
    // it has once its payload is acknowledged, below: the client acknowledged bytes behind
    // the head, so the head left the FE's stack (through the hook, which sent it to DP or
    // let it go) and nothing followed it. Otherwise ask the stack (SIOCOUTQNSD: 3% of the
    // FE's CPU per answer).
    if !after_direct {
        wait_sent(client, reg, t0).await?;
    }
    let mut st = previous_acknowledged(reg, get()?).await?;
    let size = u32::try_from(d.size).map_err(|_| io::Error::other("payload over 4 GiB"))?;
    // The hooks have seen nothing the FE sent since the connection was registered (this is
    // its first answer): its next sequence number is known only once the head has gone
    // through them. Then the head goes first and a SEND line starts DP.
    let first = st.fe_seen == 0;
    let head_len = head.len() as u32;
    let mut head = Some(head);
    // The client's window from the payload's first byte to the window's right edge, in
    // bytes (not the window field alone: it counts from the ACK that carried it, before
    // the head, and a burst that crossed the right edge lost its last segment).
    let mut room = None;
    if first {
        write_all(client, head.take().expect("not written")).await?;
        wait_sent(client, reg, t0).await?;
        st = get()?;
        // The head has gone: what the FE's stack knows of the client's window, less what
        // the client has not acknowledged.
        let (_, wnd) = client_window(client)?;
        room = Some(wnd.saturating_sub(unacked(client)?));
    }
    let boundary = match first {
        true => st.fe_nxt,
        false => st.fe_nxt.wrapping_add(head_len),
    };
    let (off_lo, wscale) = (st.off_hi, reg.wscale);
    let off_hi = off_lo.wrapping_add(size);
    let wnd = room.unwrap_or_else(|| st.window_from(boundary.wrapping_add(off_lo)));
    // DP sends it all at once when the client's window holds it: then only the ACK of its
    // last byte (and duplicates, on a loss) need reach DP.
    // (Not for DP's TCP stack: its congestion window starts small, and every ACK opens it.)
    let link = link.map(|l| crate::bpf::DpLink {
        ends_only: l.to_stack.is_none() && u64::from(wnd) >= d.size,
        ..l
    });
    // The start signal carries the id's low 32 bits, never 0 (crate::store).
    let start = match first || link.is_none() {
        true => 0,
        false => d.id as u32,
    };
    reg.slot.latest.set(None);
    reg.hooks
        .hooks
        .borrow_mut()
        .set_epoch_of(
            reg.key,
            st,
            crate::bpf::Epoch {
                boundary,
                off_lo,
                off_hi,
                to_dp: link,
                start,
            },
        )
        .map_err(io::Error::other)?;
    let seq = boundary.wrapping_add(off_lo);
    *reg.slot.dp_watch.borrow_mut() = dp.watch.clone();
    if let Some(head) = head {
        // From here on the head goes out: a failure closes the connection.
        write_all(client, head).await?;
        if closing {
            // The FIN must not ride on the head's segment (shifted as the head, it would
            // come before the payload): the close waits until the head has gone.
            wait_sent(client, reg, t0).await?;
        }
    }
    let send = SendLine {
        id: d.id,
        seq,
        fe_ack: st.fe_ack,
        fe_win: st.fe_win,
        wnd,
        wscale,
    };
    let signer = dp.signer.clone();
    let c = &mut dp.conn;
    if start == 0 {
        let line = signer.line(&send.line(reg.slot.flow));
        write_all(&c.stream, line.into_bytes()).await?;
    }
    if link.is_some() {
        // The hooks start DP (or the line did) and clone the client's ACKs to it: nothing
        // to forward. The next epoch (or the watchdog) checks that the payload arrived.
        reg.slot.inflight.set(Some(Inflight {
            seq,
            size,
            acked: 0,
            since: std::time::Instant::now(),
            send: (start != 0).then_some(send),
        }));
        return Ok(());
    }
    forward_acks(reg, (c, &signer), seq, size, wscale).await
}

/// The connection's state in the hooks' map.
fn conn_state(reg: &Registered) -> io::Result<crate::bpf::ConnState> {
    reg.hooks
        .hooks
        .borrow_mut()
        .get(&reg.key)
        .map_err(io::Error::other)?
        .ok_or_else(|| io::Error::other("connection not registered"))
}

/// One epoch at a time: the previous payload (pipelined requests), if any, must be
/// acknowledged. Returns the connection's state (`st`, or a later one) once it is.
async fn previous_acknowledged(
    reg: &Registered,
    mut st: crate::bpf::ConnState,
) -> io::Result<crate::bpf::ConnState> {
    if let Some(prev) = reg.slot.inflight.get() {
        let t0 = std::time::Instant::now();
        while prev.acked_by(st.last_ack) != prev.size {
            if t0.elapsed() > reg.hooks.stall || reg.slot.dp_refused() {
                return Err(stalled(reg, prev.seq, prev.size));
            }
            iolab_runtime::sleep(ACK_POLL).await;
            st = conn_state(reg)?;
        }
        reg.slot.inflight.set(None);
    }
    Ok(st)
}

/// The ACK forwarder of a payload DP sends without a tap (`seq`, `size`: its first byte and
/// length in the client's view), until its last byte is acknowledged: woken by read_acks,
/// and every MAP_CHECK reading the map itself (a full ring loses events). Only ACKs inside
/// this payload count (crate::bpf::dp_progress: a stale `last_ack` compared modulo 2^32 was
/// the pipelined stall, see Hooks::set_epoch).
async fn forward_acks(
    reg: &Registered,
    (c, signer): (&Conn, &crate::control::Signer),
    seq: u32,
    size: u32,
    wscale: u8,
) -> io::Result<()> {
    let get = || conn_state(reg);
    let (mut acked, mut win, mut progress) = (0u32, 0u32, std::time::Instant::now());
    while acked != size {
        let step = reg.slot.latest.take().and_then(|(last_ack, last_win)| {
            let s = crate::bpf::ConnState {
                last_ack,
                last_win,
                ..Default::default()
            };
            crate::bpf::dp_progress(&s, seq, size, acked, win)
        });
        if let Some((a, w)) = step {
            (acked, win) = (a, w);
            progress = std::time::Instant::now();
            let ack = format!(
                "ACK {} {}",
                seq.wrapping_add(a),
                crate::sender::window_bytes(w, wscale)
            );
            write_all(&c.stream, signer.line(&ack).into_bytes()).await?;
            continue;
        }
        if progress.elapsed() > reg.hooks.stall {
            return Err(stalled(reg, seq, size));
        }
        if iolab_runtime::timeout(MAP_CHECK, reg.slot.cond.wait())
            .await
            .is_err()
        {
            if reg.slot.dp_refused() {
                return Err(stalled(reg, seq, size));
            }
            let s = get()?;
            if crate::bpf::dp_progress(&s, seq, size, acked, win).is_some() {
                reg.slot.latest.set(Some((s.last_ack, s.last_win)));
            }
        }
    }
    Ok(())
}

/// FE role in relay mode: DP at `d.last` has answered OK for payload `d.id` (its bytes
/// follow on the DP connection). Errors come before any payload byte.
async fn fe_relay(
    dp: &mut Option<DpConn>,
    d: Disc,
    key: Option<&crate::control::ControlKey>,
) -> io::Result<()> {
    let c = dp_conn(dp, d.last, key).await?;
    let size = crate::dp::fetch(&mut c.conn, (&c.signer, &mut c.answers), d.id).await?;
    if size != d.size {
        return Err(io::Error::other(format!(
            "DP holds {size} bytes, the head announced {}",
            d.size
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 43: a client's `X-Disc` (and any `X-Disc...`) reached the BE verbatim.
    #[test]
    fn the_first_tier_strips_the_client_s_disc_fields() {
        let head = b"GET /f HTTP/1.1\r\nHost: a\r\nX-Disc: id=1;size=9;last=10.0.0.1:1;fe=0\r\n\
            x-disc-path: nb=5;bypass=ff\r\nX-DISC-Other: 1\r\nAccept: */*\r\n\r\n";
        for disc in [DiscMode::Off, DiscMode::Relay, DiscMode::Direct] {
            let cfg = ProxyConfig {
                upstreams: vec!["127.0.0.1:1".parse().unwrap()],
                first: true,
                disc,
                hook_iface: None,
                stall: DIRECT_STALL,
                dp_key: None,
                timeouts: Default::default(),
            };
            let req = parse_request(head).unwrap();
            let (out, me) = outgoing_head(head, &req, &cfg, true);
            let text = String::from_utf8(out).unwrap().to_ascii_lowercase();
            let disc_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("x-disc")).collect();
            let want: &[&str] = match disc {
                DiscMode::Off => &[],
                _ => &["x-disc-path: nb=1;bypass=1"],
            };
            assert_eq!(disc_lines, want, "{disc:?}: {text}");
            assert!(text.starts_with("get /f http/1.1\r\nhost: a\r\n"), "{text}");
            assert!(text.contains("\r\naccept: */*\r\n"), "{text}");
            assert!(text.ends_with("\r\n\r\n"), "{text}");
            assert_eq!(me, (disc != DiscMode::Off).then_some(0));
        }
    }

    /// The client's window as the FE reads it: a peer with Linux's default buffers
    /// advertises more than 64 KiB once it has read some data, and its window scale.
    #[test]
    fn the_clients_window_is_read_from_tcp_info() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut fe, _) = l.accept().unwrap();
        // Some traffic: the peer's window opens as its buffer autotunes.
        let chunk = vec![7u8; 256 * 1024];
        let mut got = vec![0u8; chunk.len()];
        for _ in 0..4 {
            fe.write_all(&chunk).unwrap();
            peer.read_exact(&mut got).unwrap();
        }
        peer.write_all(b"x").unwrap(); // an ACK with the peer's current window
        let mut one = [0u8; 1];
        fe.read_exact(&mut one).unwrap();
        let (wscale, wnd) = client_window(&fe).unwrap();
        assert!(wscale > 0, "window scaling is on by default");
        assert!(wnd > 64 * 1024, "window {wnd} bytes");
    }
}
