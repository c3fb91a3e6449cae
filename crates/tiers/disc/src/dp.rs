//! DP, the BE's direct payload sender (seed 004 §3.5.4): the store of payloads the BE kept
//! back (a job per payload, named by its payload id), and its control endpoint, a TCP
//! listener the FE role talks to.
//!
//! Control protocol (one command per line, several per connection):
//! - `FETCH <id>\r\n` → `OK <size>\r\n` and the payload's bytes, or `ERR <why>\r\n`. The
//!   relay mode: the FE writes the payload on the client connection itself. It exercises
//!   the whole header path and the store without any packet forging.
//! - `HELLO [<client ip:port> <fe ip:port> <wscale> [<FE's end>]]\r\n` → `OK tap\r\n` (DP
//!   reads the client's ACKs from its tap, so the FE's hooks may clone them to it, and takes
//!   the FE's head segment cloned to it as the signal to start a payload), `OK tap repair\r\n`
//!   (`--dp-send repair` and the FE's end given, [`crate::repair::FeEnd::fields`]: DP sends
//!   from a socket of the BE's stack continuing the FE's connection, and the hooks clone the
//!   client's ACKs to DP's own link address, for that socket) or `OK\r\n`: once per
//!   control connection, before the FE writes the head of its first direct answer (a DP
//!   that cannot be reached or answers otherwise means the normal path). With the flow (the
//!   client connection the control connection serves, and the client's window scale),
//!   the tap's ACKs and starts for that flow go to this connection's sender.
//! - The start signal (tap, no line): the FE's hooks clone the segment that carries an
//!   answer's head to DP ([`crate::bpf::DP_START_MAC`]) with the payload id; DP sends that
//!   payload right behind the head, carrying the head's ACK and window fields. A payload it
//!   does not hold is refused as a SEND is (below).
//! - `CHECK <id>\r\n` → `OK <size>\r\n` or `ERR`: the payload leaves the store for this
//!   connection, to be sent by the next SEND (the FE's direct mode no longer asks: the BE
//!   put the payload in the store as it wrote the head, on this same loop).
//! - `SEND <id> <client ip:port> <fe ip:port> <seq> <ack> <window> [<client window>
//!   [<wscale>]]\r\n`, no answer when it starts (the FE has written the head and does not
//!   wait); a SEND that cannot start (payload unknown or expired, bad fields, no socket)
//!   is answered `ERR <why>\r\n` and ends the control connection: the FE sees the control
//!   connection readable or closed while its payload makes no progress and closes the
//!   client's connection.
//!   DP takes the payload from the store (or the one a CHECK set aside) and sends it on
//!   the client's connection as the FE (from the BE's loop: GSO bursts on a packet socket,
//!   [`crate::gso`], or segments on a raw socket, [`crate::sender`]), starting at client-view sequence `seq`, carrying `ack` and
//!   the raw `window` field, within `client window` bytes (the FE's TCP_INFO; default
//!   [`INITIAL_WINDOW`]); then `ACK <ack> <window bytes>\r\n` lines (the FE's ack
//!   forwarder) feed its go-back-N. One transfer per control connection at a time.
//!
//! Limits: at most [`MAX_JOBS`] jobs and [`MAX_BYTES`] bytes held; a job not claimed within
//! [`JOB_TTL`] is dropped (the FE died or fell back). A BE whose store is full answers on the
//! normal path (no shortcut), so a slow or absent FE never makes the BE hold more.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddrV4;
use std::rc::{Rc, Weak};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use iolab_runtime::net::{TcpListener, TcpStream};

use crate::http1::{write_all, Conn};
use crate::tap::{TapFrame, TapStart};

pub const MAX_JOBS: usize = 4096;
pub const MAX_BYTES: u64 = 1 << 30;
pub const JOB_TTL: Duration = Duration::from_secs(30);

struct Job {
    body: Bytes,
    created: Instant,
}

#[derive(Default)]
struct Inner {
    /// The last payload id handed out (ids run 1..=u32::MAX and wrap: the FE's start signal
    /// carries 32 bits; a job lives at most [`JOB_TTL`]).
    last_id: u32,
    kept: u64,
    taken: u64,
    jobs: HashMap<u64, Job>,
    bytes: u64,
    /// Transfers DP sent through the GSO packet socket and through the raw socket.
    sends: [u64; 2],
    /// Transfers DP sent from a socket continuing the FE's connection.
    repaired: u64,
    /// Transfers DP sent through its AF_XDP socket.
    xdp: u64,
    /// Client ACKs DP received from its tap, and as the FE's control lines.
    acks: [u64; 2],
    /// Transfers started by the FE's start signal (from the tap), and by SEND lines.
    starts: [u64; 2],
}

/// The payloads held for the FE.
#[derive(Default)]
pub struct Store {
    inner: Mutex<Inner>,
    /// Tests: a [`Fault`] DP shows its FEs.
    fault: std::sync::atomic::AtomicU8,
}

/// Faults tests make DP show ([`Store::set_fault`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    None = 0,
    /// DP accepts SENDs and sends nothing (a DP that dies mid-payload).
    HoldSends = 1,
    /// DP refuses every SEND as a payload it does not hold (one that expired, or a BE that
    /// restarted at the same address).
    RefuseSends = 2,
    /// DP never sees the FE's start signals (as if the tap's socket had dropped them).
    LoseSignals = 3,
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
        g.last_id = g.last_id.checked_add(1).unwrap_or(1);
        g.kept += 1;
        let id = u64::from(g.last_id);
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
        (g.kept, g.taken)
    }

    /// Direct-mode transfers sent (through the GSO packet socket, through the raw socket).
    pub fn send_paths(&self) -> (u64, u64) {
        self.pair(|g| g.sends)
    }

    /// Transfers sent from a TCP socket continuing the FE's connection (`--dp-send repair`).
    pub fn repaired_sends(&self) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .repaired
    }

    /// Transfers sent through the AF_XDP socket (`--dp-send xdp`).
    pub fn xdp_sends(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).xdp
    }

    /// Client ACKs DP received (from its tap, as the FE's control lines).
    pub fn ack_sources(&self) -> (u64, u64) {
        self.pair(|g| g.acks)
    }

    /// Transfers started (by the FE's start signal from the tap, by SEND lines).
    pub fn start_sources(&self) -> (u64, u64) {
        self.pair(|g| g.starts)
    }

    fn count_send(&self, gso: bool) {
        self.bump(|g| &mut g.sends[usize::from(!gso)]);
    }

    fn count_ack(&self, tap: bool) {
        self.bump(|g| &mut g.acks[usize::from(!tap)]);
    }

    fn count_start(&self, signal: bool) {
        self.bump(|g| &mut g.starts[usize::from(!signal)]);
    }

    fn pair(&self, of: impl FnOnce(&Inner) -> [u64; 2]) -> (u64, u64) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let [a, b] = of(&g);
        (a, b)
    }

    fn bump(&self, counter: impl FnOnce(&mut Inner) -> &mut u64) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        *counter(&mut g) += 1;
    }

    /// Tests: the fault DP shows from now on.
    pub fn set_fault(&self, f: Fault) {
        self.fault
            .store(f as u8, std::sync::atomic::Ordering::Relaxed);
    }

    fn fault(&self) -> Fault {
        match self.fault.load(std::sync::atomic::Ordering::Relaxed) {
            1 => Fault::HoldSends,
            2 => Fault::RefuseSends,
            3 => Fault::LoseSignals,
            _ => Fault::None,
        }
    }

    /// (jobs, bytes) held now.
    pub fn usage(&self) -> (usize, u64) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (g.jobs.len(), g.bytes)
    }
}

/// The flows DP serves, by (client, FE): where the tap hands the client's ACKs and the
/// FE's start signals. Each entry carries its sender's [`Sender::id`].
pub type Flows = Rc<RefCell<HashMap<(SocketAddrV4, SocketAddrV4), (u64, Weak<RefCell<Sender>>)>>>;

/// Opens DP's ACK tap ([`crate::tap`]) in the calling thread's namespace and starts the
/// task that hands its ACKs to the flows' senders; None (the FE then forwards ACKs as
/// control lines) if the socket cannot be opened.
pub fn start_tap() -> Option<Flows> {
    let tap = match crate::tap::AckTap::open() {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!("dp: no ACK tap ({e}): the FE forwards the ACKs");
            return None;
        }
    };
    let flows: Flows = Default::default();
    let f = flows.clone();
    iolab_runtime::spawn(async move {
        let r = tap
            .run(|a| {
                let flow = match &a {
                    TapFrame::Ack(a) => (a.client, a.fe),
                    TapFrame::Start(s) => (s.client, s.fe),
                };
                // Out of the map before the call: starting a transfer registers its flow.
                let sender = f.borrow().get(&flow).and_then(|(_, w)| w.upgrade());
                let Some(sender) = sender else { return };
                match a {
                    TapFrame::Ack(a) => {
                        let mut s = sender.borrow_mut();
                        let win = crate::sender::window_bytes(u32::from(a.window), s.wscale);
                        s.store.count_ack(true);
                        s.on_ack(a.ack, win);
                    }
                    TapFrame::Start(st) => Sender::on_start(&sender, st),
                }
            })
            .await;
        if let Err(e) = r {
            tracing::warn!("dp: the ACK tap failed: {e}");
        }
    });
    Some(flows)
}

/// Serves the control endpoint until `stop`.
pub async fn serve(
    listener: TcpListener,
    store: Arc<Store>,
    send: SendPath,
    flows: Option<Flows>,
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
        let (store, flows) = (store.clone(), flows.clone());
        iolab_runtime::spawn(async move {
            if let Err(e) = control(stream, store, send, flows).await {
                tracing::debug!("dp control connection: {e}");
            }
        });
    }
}

async fn control(
    stream: TcpStream,
    store: Arc<Store>,
    send: SendPath,
    flows: Option<Flows>,
) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let mut conn = Conn::new(stream);
    // The payload of the last CHECK, held for the SEND that follows it.
    let mut prepared: Option<(u64, Bytes)> = None;
    // The connection's sender, opened with its first SEND; shared with its timer task.
    let tap = flows.is_some();
    use std::os::fd::AsRawFd;
    let sender = Rc::new(RefCell::new(Sender {
        send,
        store: store.clone(),
        wire: None,
        transfer: None,
        fe_end: None,
        stack: None,
        timer: false,
        flows,
        flow: None,
        wscale: 0,
        started: 0,
        control: conn.stream.as_raw_fd(),
        id: NEXT_SENDER.with(|n| {
            n.set(n.get() + 1);
            n.get()
        }),
    }));
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
                prepared = store.take(id).map(|body| (id, body));
                let line = match &prepared {
                    // `tap`: the FE may clone the client's ACKs to this DP.
                    Some((_, body)) if tap => format!("OK {} tap\r\n", body.len()),
                    Some((_, body)) => format!("OK {}\r\n", body.len()),
                    None => "ERR unknown payload\r\n".to_string(),
                };
                write_all(&conn.stream, line.into_bytes()).await?;
            }
            (Some("HELLO"), None) => {
                let mut rest = text.split_ascii_whitespace().skip(1);
                let mut repair = false;
                if let (Some(client), Some(fe), Some(wscale)) = (
                    rest.next().and_then(|w| w.parse::<SocketAddrV4>().ok()),
                    rest.next().and_then(|w| w.parse::<SocketAddrV4>().ok()),
                    rest.next()
                        .and_then(|w| w.parse::<u8>().ok())
                        .filter(|s| *s <= 14),
                ) {
                    Sender::serve_flow(&sender, (client, fe), wscale);
                    // The stack needs the client's ACKs cloned to it: DP on the FE's link.
                    if send == SendPath::Repair && tap {
                        let end = crate::repair::FeEnd::parse(&mut rest);
                        repair = end.is_some();
                        sender.borrow_mut().fe_end = end;
                    }
                }
                let line: &[u8] = match (tap, repair) {
                    (true, true) => b"OK tap repair\r\n",
                    (true, false) => b"OK tap\r\n",
                    _ => b"OK\r\n",
                };
                write_all(&conn.stream, line.to_vec()).await?;
            }
            (Some("SEND"), Some(id)) => {
                // No answer: the FE has written the head and goes on at once. A SEND that
                // cannot start says why and ends the control connection (the FE then closes
                // the client's).
                if id == sender.borrow().started {
                    continue; // started by the FE's start signal (this is the FE's resend)
                }
                let body = match prepared.take() {
                    Some((p, body)) if p == id => Some(body),
                    _ => store.take(id),
                }
                .filter(|_| store.fault() != Fault::RefuseSends);
                let Some((flow, wnd, wscale)) = parse_send(&mut words) else {
                    tracing::warn!("dp: bad SEND `{text}`");
                    return refuse(&conn, "bad SEND").await;
                };
                let Some(body) = body else {
                    tracing::warn!("dp: SEND of payload {id}, not held");
                    return refuse(&conn, "unknown payload").await;
                };
                if store.fault() == Fault::HoldSends {
                    continue; // a DP that died after accepting the payload (tests)
                }
                if let Err(e) = Sender::start(&sender, id, flow, (Vec::new(), body), wnd, wscale) {
                    tracing::warn!("dp: cannot send to {}: {e}", flow.client);
                    return refuse(&conn, "cannot send").await;
                }
                store.count_start(false);
            }
            (Some("ACK"), Some(ack)) => {
                let win = words
                    .next()
                    .and_then(|w| w.parse::<usize>().ok())
                    .unwrap_or(0);
                store.count_ack(false);
                sender.borrow_mut().on_ack(ack as u32, win);
            }
            (Some("FETCH"), Some(id)) => match store.take(id) {
                Some(body) => {
                    write_all(&conn.stream, format!("OK {}\r\n", body.len()).into_bytes()).await?;
                    let (r, _) = conn.stream.write_all(body).await;
                    r?;
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

/// Answers a SEND that cannot start and ends the control connection.
async fn refuse(conn: &Conn, why: &str) -> io::Result<()> {
    write_all(&conn.stream, format!("ERR {why}\r\n").into_bytes()).await
}

/// SEND's fields; the last two (the client's window in bytes, 0 = unknown; its window
/// scale, for the ACKs the tap reads) are optional.
fn parse_send<'a>(
    w: &mut impl Iterator<Item = &'a str>,
) -> Option<(crate::sender::Flow, usize, u8)> {
    let client: SocketAddrV4 = w.next()?.parse().ok()?;
    let fe: SocketAddrV4 = w.next()?.parse().ok()?;
    let seq: u32 = w.next()?.parse().ok()?;
    let ack: u32 = w.next()?.parse().ok()?;
    let window: u16 = w.next()?.parse().ok()?;
    let client_window = match w.next() {
        None => 0,
        Some(x) => x.parse::<u32>().ok()? as usize,
    };
    let wscale = match w.next() {
        None => 0,
        Some(x) => x.parse::<u8>().ok().filter(|s| *s <= 14)?,
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
        wscale,
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SendPath {
    /// A packet socket with GSO: one send per up to 64 KiB ([`crate::gso`]); the raw
    /// socket while the client's next hop is not resolved.
    #[default]
    Gso,
    /// A raw IPv4 socket: one `sendto` per segment ([`crate::sender::RawSocket`]).
    Raw,
    /// A TCP socket of the BE's stack continuing the FE's connection (`TCP_REPAIR`,
    /// [`crate::repair`]): the kernel segments, paces by its congestion window, takes the
    /// client's ACKs (cloned to it by the FE's hooks) and SACK blocks, and retransmits;
    /// closed silently once the client has everything. Needs DP one hop from the FE with
    /// its tap (the ACK clone), the FE's address local in DP's namespace (the clones are
    /// addressed to it; the testbed puts it on `lo`) and the route to the client; without
    /// the tap, or for an FE that does not describe its end in HELLO, DP sends as `gso`.
    Repair,
    /// An AF_XDP socket in copy mode on DP's link ([`crate::xdp`]): segments written into
    /// frames shared with the kernel, one `sendto` per 32; the raw socket while the client's
    /// next hop is not resolved, or where AF_XDP is refused.
    Xdp,
}

/// The sender of a transfer, chosen per transfer.
enum Wire {
    Gso(crate::gso::GsoSocket),
    Raw(crate::sender::RawSocket),
    Xdp(crate::xdp::XdpLink),
}

impl Wire {
    fn name(&self) -> &'static str {
        match self {
            Wire::Gso(_) => "gso",
            Wire::Raw(_) => "raw",
            Wire::Xdp(_) => "xdp",
        }
    }
}

impl crate::sender::Emit for Wire {
    fn burst(&self, mss: usize) -> usize {
        match self {
            Wire::Gso(g) => g.burst(mss),
            Wire::Raw(r) => r.burst(mss),
            Wire::Xdp(x) => x.burst(mss),
        }
    }
    fn packet(&self, mss: usize) -> usize {
        match self {
            Wire::Gso(g) => g.packet(mss),
            Wire::Raw(r) => r.packet(mss),
            Wire::Xdp(x) => x.packet(mss),
        }
    }
    fn emit(
        &mut self,
        flow: &crate::sender::Flow,
        seq: u32,
        data: crate::sender::Pieces<'_>,
        flags: u8,
    ) -> io::Result<()> {
        match self {
            Wire::Gso(g) => g.emit(flow, seq, data, flags),
            Wire::Raw(r) => r.emit(flow, seq, data, flags),
            Wire::Xdp(x) => x.emit(flow, seq, data, flags),
        }
    }
}

fn open_sender(send: SendPath, client: std::net::Ipv4Addr) -> io::Result<Wire> {
    if send != SendPath::Raw {
        match crate::gso::Neighbour::resolve(client) {
            Ok(Some(n)) if send == SendPath::Xdp => match crate::xdp::XdpLink::open(n) {
                Ok(x) => return Ok(Wire::Xdp(x)),
                Err(e) => {
                    tracing::warn!("dp: no AF_XDP socket ({e}); sending through a raw socket")
                }
            },
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

/// The sender of one control connection, on the BE's own loop: its transfers go out one
/// after the other, each `SEND` pumping what the client's window allows at once and each
/// forwarded `ACK` the rest, from the loop's thread (a sender thread per connection cost a
/// futex wake and two context switches per message: three quarters of the BE's loop time
/// at 64 KiB). The socket is kept between transfers; sends never block the loop
/// (`MSG_DONTWAIT`: a full socket buffer leaves the rest to the next ACK or tick).
pub struct Sender {
    send: SendPath,
    store: Arc<Store>,
    /// The socket and the client it was opened for.
    wire: Option<(std::net::Ipv4Addr, Wire)>,
    /// The transfer in progress (at most one), and when it last progressed.
    transfer: Option<(crate::sender::Transfer, Instant)>,
    /// A timer task is running for this sender.
    timer: bool,
    /// The tap's registry (None: ACKs come as control lines).
    flows: Option<Flows>,
    /// The flow this sender has in `flows` (HELLO's, or its last transfer's).
    flow: Option<(SocketAddrV4, SocketAddrV4)>,
    /// The client's window scale (the tap's ACKs carry raw window fields).
    wscale: u8,
    /// The id of the last payload started (a SEND for it is the FE's resend: ignored).
    started: u64,
    /// The FE's end of the connection (HELLO), with `--dp-send repair`.
    fe_end: Option<crate::repair::FeEnd>,
    /// The socket continuing the FE's connection for the last payload, with `--dp-send
    /// repair`: kept until the client has acknowledged everything, or the next payload.
    stack: Option<StackSend>,
    /// The control connection's descriptor (open while the sender lives: both belong to
    /// the control connection's task), to refuse a start signal from the tap.
    control: std::os::fd::RawFd,
    /// Tells this sender's entries in `flows` from others'.
    id: u64,
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.close_stack();
        self.unregister();
    }
}

/// `TCP_RTO_MAX_MS` (include/uapi/linux/tcp.h, Linux 6.15).
const TCP_RTO_MAX_MS: libc::c_int = 44;

/// A payload sent from a socket continuing the FE's connection.
struct StackSend {
    sock: std::net::TcpStream,
    /// The head (redirected to DP) and the payload, and how much of both is written.
    head: Vec<u8>,
    body: Bytes,
    written: usize,
    /// The bytes not acknowledged at the last tick, and when they last went down (or more
    /// was written).
    unacked: u32,
    since: Instant,
}

impl StackSend {
    /// Writes what the socket takes now (never blocking); Ok(true) once all is written.
    fn pump(&mut self) -> io::Result<bool> {
        let total = self.head.len() + self.body.len();
        while self.written < total {
            let (h, b) = match self.written.checked_sub(self.head.len()) {
                None => (&self.head[self.written..], &self.body[..]),
                Some(o) => (&[][..], &self.body[o..]),
            };
            let iov = [
                libc::iovec {
                    iov_base: h.as_ptr() as *mut libc::c_void,
                    iov_len: h.len(),
                },
                libc::iovec {
                    iov_base: b.as_ptr() as *mut libc::c_void,
                    iov_len: b.len(),
                },
            ];
            // SAFETY: a zeroed msghdr is valid; it points at the two iovecs, which point at
            // `h` and `b`, all alive and unchanged for the call.
            let n = unsafe {
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
                msg.msg_iovlen = 2;
                use std::os::fd::AsRawFd;
                libc::sendmsg(
                    self.sock.as_raw_fd(),
                    &msg,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(false),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            self.written += n as usize;
            self.since = Instant::now();
        }
        Ok(true)
    }
}

thread_local! {
    static NEXT_SENDER: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How often a transfer's retransmission timer is checked.
const TICK: Duration = Duration::from_millis(10);

impl Sender {
    /// The tap's ACKs and start signals for `flow` come to this sender (HELLO).
    fn serve_flow(this: &Rc<RefCell<Sender>>, flow: (SocketAddrV4, SocketAddrV4), wscale: u8) {
        let mut s = this.borrow_mut();
        s.wscale = wscale;
        s.register(this, flow);
    }

    fn register(&mut self, this: &Rc<RefCell<Sender>>, flow: (SocketAddrV4, SocketAddrV4)) {
        let Some(f) = self.flows.clone() else { return };
        if self.flow != Some(flow) {
            self.unregister();
        }
        self.flow = Some(flow);
        f.borrow_mut().insert(flow, (self.id, Rc::downgrade(this)));
    }

    /// The FE's start signal for payload `st.id` (its head went out).
    fn on_start(this: &Rc<RefCell<Sender>>, st: TapStart) {
        let (store, started) = {
            let s = this.borrow();
            (s.store.clone(), s.started)
        };
        let id = u64::from(st.id);
        if id == started || store.fault() == Fault::LoseSignals {
            return; // started already (by the FE's resent SEND), or a test's lost signal
        }
        let body = store
            .take(id)
            .filter(|_| store.fault() != Fault::RefuseSends);
        let started = body.and_then(|body| {
            if store.fault() == Fault::HoldSends {
                return Some(());
            }
            // A head redirected to DP goes in front of the payload: the transfer starts at
            // its first byte, and the client's window counts from there.
            let head = st.head.len() as u32;
            let flow = crate::sender::Flow {
                fe: st.fe,
                client: st.client,
                seq: st.seq.wrapping_sub(head),
                ack: st.ack,
                window: st.window,
                mss: SEND_MSS,
            };
            let wscale = this.borrow().wscale;
            let wnd = crate::sender::window_bytes(u32::from(st.client_window), wscale);
            let wnd = if wnd > 0 { wnd + head as usize } else { 0 };
            match Sender::start(this, id, flow, (st.head, body), wnd, wscale) {
                Ok(()) => {
                    store.count_start(true);
                    Some(())
                }
                Err(e) => {
                    tracing::warn!("dp: cannot send to {}: {e}", st.client);
                    None
                }
            }
        });
        if started.is_none() {
            tracing::warn!("dp: start signal for payload {id}, not sent");
            this.borrow().refuse_now("payload not sent");
        }
    }

    /// Refuses a start signal as a refused SEND is: says why on the control connection and
    /// shuts it down (its task then ends; the FE closes the client's connection).
    fn refuse_now(&self, why: &str) {
        // The control connection's descriptor is open while this sender lives (see
        // `control`).
        crate::http1::send_now(self.control, &format!("ERR {why}\r\n"));
        // SAFETY: shutdown(2) on that descriptor.
        unsafe { libc::shutdown(self.control, libc::SHUT_RDWR) };
    }

    fn start(
        this: &Rc<RefCell<Sender>>,
        id: u64,
        flow: crate::sender::Flow,
        (head, body): (Vec<u8>, Bytes),
        wnd: usize,
        wscale: u8,
    ) -> io::Result<()> {
        let mut s = this.borrow_mut();
        s.wscale = wscale;
        s.started = id;
        if let (SendPath::Repair, Some(end)) = (s.send, s.fe_end) {
            let window = if wnd > 0 { wnd } else { INITIAL_WINDOW };
            s.start_stack(&flow, end, (head, body), window)?;
            s.store.bump(|g| &mut g.repaired);
            s.register(this, (flow.client, flow.fe));
            s.start_timer(this);
            return Ok(());
        }
        if s.transfer.as_ref().is_some_and(|(t, _)| !t.done()) {
            tracing::warn!("dp: a new payload before the last was acknowledged");
        }
        let client = *flow.client.ip();
        // A raw socket chosen while the next hop was unresolved is retried.
        let reuse = s.wire.as_ref().is_some_and(|(ip, w)| {
            *ip == client && (s.send == SendPath::Raw || !matches!(w, Wire::Raw(_)))
        });
        if !reuse {
            s.wire = Some((client, open_sender(s.send, client)?));
        }
        let Sender {
            wire,
            store,
            transfer,
            ..
        } = &mut *s;
        let (_, out) = wire.as_mut().expect("just opened");
        match &*out {
            Wire::Xdp(_) => store.bump(|g| &mut g.xdp),
            w => store.count_send(matches!(w, Wire::Gso(_))),
        }
        let window = if wnd > 0 { wnd } else { INITIAL_WINDOW };
        tracing::debug!(
            "dp: {} bytes to {} in a window of {window}",
            body.len(),
            flow.client
        );
        let mut t = crate::sender::Transfer::with_prefix(flow, head, body, window);
        t.pump(out)?;
        *transfer = Some((t, Instant::now()));
        s.register(this, (flow.client, flow.fe));
        s.start_timer(this);
        Ok(())
    }

    /// Runs the retransmission timer task for this sender, unless it runs already.
    fn start_timer(&mut self, this: &Rc<RefCell<Sender>>) {
        if !self.timer {
            self.timer = true;
            let weak = Rc::downgrade(this);
            iolab_runtime::spawn(async move { Sender::tick(weak).await });
        }
    }

    /// Sends `head` and `body` from a new socket continuing the FE's connection at
    /// `flow.seq`, in the client's window of `wnd` bytes from there. The previous payload's
    /// socket (acknowledged: the FE starts a payload once the last one is) is closed first:
    /// the new one takes the same four-tuple.
    fn start_stack(
        &mut self,
        flow: &crate::sender::Flow,
        end: crate::repair::FeEnd,
        (head, body): (Vec<u8>, Bytes),
        wnd: usize,
    ) -> io::Result<()> {
        self.close_stack();
        let wnd = u32::try_from(wnd).unwrap_or(u32::MAX >> 2);
        let state = crate::repair::TcpState {
            local: flow.fe,
            peer: flow.client,
            snd_seq: flow.seq,
            rcv_seq: flow.ack,
            mss: end.mss,
            wscale: end.rcv_wscale.map(|ours| (self.wscale, ours)),
            sack: end.sack,
            // (no timestamps: crate::repair::FeEnd says why)
            timestamp: None,
            window: crate::repair::RepairWindow {
                snd_wl1: flow.ack,
                snd_wnd: wnd,
                max_window: wnd,
                rcv_wnd: u32::from(flow.window) << end.rcv_wscale.unwrap_or(0),
                rcv_wup: flow.ack,
            },
        };
        let sock = crate::repair::restore(&state)?;
        sock.set_nodelay(true)?;
        {
            use std::os::fd::AsRawFd;
            // The retransmission timer capped at 1 s (TCP_RTO_MAX_MS, Linux 6.15; the
            // least it takes), as DP's go-back-N caps its own at 3.2 s: a new socket has no
            // round trip measured (its first timeout is 1 s) and doubles it on every lost
            // retransmission; under the 20% loss test a payload sat past the FE's 30 s
            // without progress (a whole 64 KiB burst is one packet on the veth).
            if let Err(e) =
                crate::sockopt::set(sock.as_raw_fd(), libc::IPPROTO_TCP, TCP_RTO_MAX_MS, &1000)
            {
                tracing::debug!("dp: TCP_RTO_MAX_MS: {e} (kernel before 6.15)");
            }
        }
        let total = head.len() + body.len();
        {
            use std::os::fd::AsRawFd;
            // Room for the whole payload where it fits in 32 MiB: written in one call.
            let buf = total.clamp(64 << 10, 32 << 20) as libc::c_int;
            let _ = crate::sockopt::set(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUFFORCE,
                &buf,
            );
        }
        tracing::debug!("dp: {total} bytes to {} from the BE's stack", flow.client);
        let mut st = StackSend {
            sock,
            head,
            body,
            written: 0,
            unacked: u32::MAX,
            since: Instant::now(),
        };
        st.pump()?;
        self.stack = Some(st);
        Ok(())
    }

    /// The stack's payload at a tick: the rest written, and the socket closed (silently)
    /// once the client has acknowledged everything, or after [`STALL`] without progress.
    fn tick_stack(&mut self) {
        let Some(st) = self.stack.as_mut() else {
            return;
        };
        let done = match st.pump() {
            Ok(all) => all,
            Err(e) => {
                tracing::warn!("dp: sending from the BE's stack: {e}");
                self.close_stack();
                return;
            }
        };
        match crate::repair::unacknowledged(&st.sock) {
            Ok(0) if done => {
                tracing::debug!("dp: payload acknowledged, socket closed");
                self.close_stack();
            }
            Ok(n) if n < st.unacked => {
                st.unacked = n;
                st.since = Instant::now();
            }
            Ok(_) if st.since.elapsed() > STALL => {
                tracing::warn!(
                    "dp: payload from the BE's stack: no progress ({})",
                    crate::repair::stall_summary(&st.sock)
                );
                self.close_stack();
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("dp: SIOCOUTQ: {e}");
                self.close_stack();
            }
        }
    }

    fn close_stack(&mut self) {
        if let Some(st) = self.stack.take() {
            crate::repair::close_silently(st.sock);
        }
    }

    fn on_ack(&mut self, ack: u32, win: usize) {
        let (Some((t, progress)), Some((_, out))) = (self.transfer.as_mut(), self.wire.as_mut())
        else {
            return; // late, for a finished transfer
        };
        let before = t.acked();
        if let Err(e) = t.on_ack(ack, win, out) {
            tracing::warn!("dp transfer to {}: {e}", t.flow.client);
            self.transfer = None;
            return;
        }
        if t.acked() != before {
            *progress = Instant::now();
        }
        if t.done() {
            self.finish();
        }
    }

    /// The tap no longer hands this sender anything for its flow.
    fn unregister(&mut self) {
        if let (Some(f), Some(key)) = (&self.flows, self.flow.take()) {
            let mut f = f.borrow_mut();
            // Only our own entry (another connection may send on the flow now).
            if f.get(&key).is_some_and(|(id, _)| *id == self.id) {
                f.remove(&key);
            }
        }
    }

    fn finish(&mut self) {
        if let Some((t, _)) = self.transfer.take() {
            tracing::debug!(
                "dp: sent in {} segments by {} {} sends, {} go-back-N rounds, {} pauses on a full socket",
                t.segments,
                t.emits,
                self.wire.as_ref().map_or("no", |(_, w)| w.name()),
                t.retransmits,
                t.blocked
            );
        }
    }

    /// The retransmission timer, while a transfer is in progress; ends with the
    /// connection (the sender dropped) or when no transfer is left.
    async fn tick(this: std::rc::Weak<RefCell<Sender>>) {
        loop {
            iolab_runtime::sleep(TICK).await;
            let Some(rc) = this.upgrade() else { return };
            let mut s = rc.borrow_mut();
            let s = &mut *s;
            s.tick_stack();
            let (Some((t, progress)), Some((_, out))) = (s.transfer.as_mut(), s.wire.as_mut())
            else {
                s.timer = s.stack.is_some();
                if !s.timer {
                    return;
                }
                continue;
            };
            if progress.elapsed() > STALL {
                tracing::warn!("dp transfer to {}: no progress", t.flow.client);
                s.transfer = None;
                continue;
            }
            if let Err(e) = t.on_tick(Instant::now(), out) {
                tracing::warn!("dp transfer to {}: {e}", t.flow.client);
                s.transfer = None;
            }
        }
    }
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
