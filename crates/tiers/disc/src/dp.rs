//! DP, the BE's direct payload sender (seed 004 §3.5.4): the store of payloads the BE kept
//! back (a job per payload, named by its payload id), and its control endpoint, a TCP
//! listener the FE role talks to.
//!
//! Access (issue 43): DP closes unread a connection from an address not in
//! [`Access::peers`] (the FE tiers it was told of), greets the others with a nonce and
//! takes only lines authenticated under the run's key ([`crate::control`]: counter, MAC,
//! command); a refused line is answered `ERR <why>` and ends the connection. Every refusal
//! is counted by reason ([`Store::refusals`]).
//!
//! Control protocol (one command per line, several per connection; shown without the
//! counter and MAC in front of each):
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
//!   A SEND (or start signal) must be for the flow the connection's HELLO named, start
//!   at or after the end of the last payload DP sent on it and less than
//!   [`MAX_SEQ_ADVANCE`] past it; DP sends at most [`MAX_CLIENT_WINDOW`] before an ACK.
//!
//! Limits: the store's ([`crate::store`]: at most [`MAX_JOBS`] jobs and [`MAX_BYTES`] bytes,
//! a job not claimed within [`JOB_TTL`] dropped); control lines of at most [`MAX_LINE`]
//! bytes.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddrV4};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::payload::Payload;
use iolab_runtime::net::{TcpListener, TcpStream};

use crate::control::{Command, ControlKey, Refusal, Verifier};
use crate::http1::{write_all, Conn};
pub use crate::store::{Fault, Store, JOB_TTL, MAX_BYTES, MAX_JOBS};
use crate::tap::{TapFrame, TapStart};

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

/// Who may talk to DP: the run's key and the addresses of the FE tiers.
#[derive(Clone, Debug)]
pub struct Access {
    pub key: ControlKey,
    /// Source addresses of the FE tiers' control connections; any other is refused.
    pub peers: Vec<IpAddr>,
}

/// Serves the control endpoint until `stop`.
pub async fn serve(
    listener: TcpListener,
    store: Arc<Store>,
    send: SendPath,
    flows: Option<Flows>,
    access: Arc<Access>,
    stop: std::rc::Rc<crate::stop::Watch>,
) {
    loop {
        let stream = match stop.accept(&listener).await {
            Ok(Some((s, peer))) if access.peers.contains(&peer.ip()) => s,
            Ok(Some((_, peer))) => {
                // Closed unread: not one of the FE tiers DP was told of.
                tracing::warn!("dp: control connection from {peer} refused");
                store.refuse(Refusal::Peer);
                continue;
            }
            Ok(None) => return,
            Err(e) => {
                tracing::warn!("dp accept: {e}");
                iolab_runtime::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let (store, flows, key) = (store.clone(), flows.clone(), access.key.clone());
        iolab_runtime::spawn(async move {
            if let Err(e) = control(stream, store, send, flows, key).await {
                tracing::debug!("dp control connection: {e}");
            }
        });
    }
}

/// The longest control line DP reads (a SEND with every field is about 150 bytes).
pub const MAX_LINE: usize = 256;

async fn control(
    stream: TcpStream,
    store: Arc<Store>,
    send: SendPath,
    flows: Option<Flows>,
    key: ControlKey,
) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let mut conn = Conn::new(stream);
    let nonce = u64::from_ne_bytes(crate::control::random_bytes()?);
    write_all(&conn.stream, crate::control::greeting(nonce).into_bytes()).await?;
    // DP's answers are signed as the FE's commands are, in the other direction.
    let answers = Rc::new(crate::control::Signer::answers(key.clone(), nonce));
    let mut verifier = Verifier::new(key, nonce);
    // The payload of the last CHECK, held for the SEND that follows it.
    let mut prepared: Option<(u64, Payload)> = None;
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
        hello: None,
        next_seq: None,
        wscale: 0,
        started: 0,
        control: conn.stream.as_raw_fd(),
        answers: answers.clone(),
        id: NEXT_SENDER.with(|n| {
            n.set(n.get() + 1);
            n.get()
        }),
    }));
    loop {
        let line = match conn.read_line(MAX_LINE).await {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        let text = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
        let command = verifier
            .check(&text)
            .and_then(crate::control::parse_command);
        let command = match command {
            Ok(c) => c,
            Err(why) => {
                tracing::warn!("dp: control line refused ({})", why.name());
                store.refuse(why);
                return refuse(&conn, &answers, why).await;
            }
        };
        match command {
            Command::Check(id) => {
                let body = match store.take(id) {
                    Ok(b) => b,
                    Err(why) => return refuse(&conn, &answers, why).await,
                };
                // `tap`: the FE may clone the client's ACKs to this DP.
                let line = match tap {
                    true => format!("OK {} tap", body.len()),
                    false => format!("OK {}", body.len()),
                };
                prepared = Some((id, body));
                write_all(&conn.stream, answers.line(&line).into_bytes()).await?;
            }
            Command::Hello(hello) => {
                let mut repair = false;
                if let Some(h) = hello {
                    Sender::serve_flow(&sender, h.flow, h.wscale);
                    // The stack needs the client's ACKs cloned to it: DP on the FE's link.
                    if send == SendPath::Repair && tap {
                        repair = h.fe_end.is_some();
                        sender.borrow_mut().fe_end = h.fe_end;
                    }
                }
                let line = match (tap, repair) {
                    (true, true) => "OK tap repair",
                    (true, false) => "OK tap",
                    _ => "OK",
                };
                write_all(&conn.stream, answers.line(line).into_bytes()).await?;
            }
            Command::Send(f) => {
                // No answer: the FE has written the head and goes on at once. A SEND that
                // cannot start says why and ends the control connection (the FE then closes
                // the client's).
                if f.id == sender.borrow().started {
                    continue; // started by the FE's start signal (this is the FE's resend)
                }
                let allowed = sender.borrow().may_send(&f.flow);
                if let Err(why) = allowed {
                    tracing::warn!("dp: SEND `{text}` refused ({})", why.name());
                    store.refuse(why);
                    return refuse(&conn, &answers, why).await;
                }
                let body = match prepared.take() {
                    Some((p, body)) if p == f.id => Ok(body),
                    _ => store.take(f.id),
                };
                let body = match body {
                    Ok(_) if store.fault() == Fault::RefuseSends => {
                        return refuse(&conn, &answers, Refusal::UnknownPayload).await
                    }
                    Ok(b) => b,
                    Err(why) => {
                        tracing::warn!("dp: SEND of payload {}: {}", f.id, why.name());
                        return refuse(&conn, &answers, why).await;
                    }
                };
                if store.fault() == Fault::HoldSends {
                    continue; // a DP that died after accepting the payload (tests)
                }
                let started = Sender::start(
                    &sender,
                    f.id,
                    f.flow,
                    (Vec::new(), body),
                    f.client_window,
                    f.wscale,
                );
                if let Err(e) = started {
                    tracing::warn!("dp: cannot send to {}: {e}", f.flow.client);
                    write_all(&conn.stream, answers.line("ERR cannot send").into_bytes()).await?;
                    return Ok(());
                }
                store.count_start(false);
            }
            Command::Ack { ack, window } => {
                store.count_ack(false);
                sender.borrow_mut().on_ack(ack, window);
            }
            Command::Fetch(id) => match store.take(id) {
                Ok(body) => {
                    let ok = answers.line(&format!("OK {}", body.len()));
                    write_all(&conn.stream, ok.into_bytes()).await?;
                    relay_payload(&conn.stream, body).await?;
                }
                Err(why) => return refuse(&conn, &answers, why).await,
            },
        }
    }
}

/// Writes a payload on `stream`: a memory payload at once, a file's in pieces of
/// [`crate::payload::CHUNK`] (what a relay holds of it at a time).
async fn relay_payload(stream: &TcpStream, body: Payload) -> io::Result<()> {
    let file = match body {
        Payload::Memory(b) => return stream.write_all(b).await.0,
        file => file,
    };
    let len = file.len();
    let mut r = file.reader();
    let mut at = 0;
    while at < len {
        let end = (at + crate::payload::CHUNK).min(len);
        let piece = r.get(at, end)?.to_vec();
        write_all(stream, piece).await?;
        at = end;
    }
    Ok(())
}

/// Answers a refused line and ends the control connection (the refusal is counted).
async fn refuse(conn: &Conn, answers: &crate::control::Signer, why: Refusal) -> io::Result<()> {
    let line = answers.line(&format!("ERR {}", why.name()));
    write_all(&conn.stream, line.into_bytes()).await
}

/// How far past the end of the last payload sent on a connection the next may start (its
/// sequence window; a quarter of the sequence space: the FE's own bytes between two
/// payloads, normal-path answers, must stay under 1 GiB or its next payload is refused).
pub const MAX_SEQ_ADVANCE: u32 = 1 << 30;
/// The largest client window DP sends into before an ACK (a larger one from SEND is cut
/// to this): what one line can make DP put on the wire.
pub const MAX_CLIENT_WINDOW: usize = 16 << 20;

pub use crate::sender::SEND_MSS;
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
    /// The flow the connection's HELLO named: the only one its payloads may go to.
    hello: Option<(SocketAddrV4, SocketAddrV4)>,
    /// Client-view sequence number after the last payload sent (the window's left edge).
    next_seq: Option<u32>,
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
    /// Signs DP's answers on that connection.
    answers: Rc<crate::control::Signer>,
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
    body: crate::payload::Reader,
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
            // At most a chunk of a file payload at a time (a memory payload's rest).
            let (from, h) = match self.written.checked_sub(self.head.len()) {
                None => (0, &self.head[self.written..]),
                Some(o) => (o, &[][..]),
            };
            let n = self.body.len();
            let to = match &self.body {
                r if r.is_memory() => n,
                _ => (from + crate::payload::CHUNK).min(n),
            };
            let b = self.body.get(from, to)?;
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
        if s.hello != Some(flow) {
            s.next_seq = None;
        }
        s.hello = Some(flow);
        s.register(this, flow);
    }

    /// Whether this connection may send a payload on `flow` from `flow.seq`: the flow its
    /// HELLO named, within its sequence window.
    fn may_send(&self, flow: &crate::sender::Flow) -> Result<(), Refusal> {
        if self.hello != Some((flow.client, flow.fe)) {
            return Err(Refusal::OtherFlow);
        }
        match self.next_seq {
            Some(left) if flow.seq.wrapping_sub(left) >= MAX_SEQ_ADVANCE => Err(Refusal::Window),
            _ => Ok(()),
        }
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
        // The signal carries the id's low 32 bits ([`crate::store`]).
        if (started != 0 && started as u32 == st.id) || store.fault() == Fault::LoseSignals {
            return; // started already (by the FE's resent SEND), or a test's lost signal
        }
        // A head redirected to DP goes in front of the payload: the transfer starts at its
        // first byte, and the client's window counts from there.
        let head = st.head.len() as u32;
        let flow = crate::sender::Flow {
            fe: st.fe,
            client: st.client,
            seq: st.seq.wrapping_sub(head),
            ack: st.ack,
            window: st.window,
            mss: SEND_MSS,
        };
        let allowed = this.borrow().may_send(&flow);
        let taken = allowed.and_then(|()| match store.take_signalled(st.id) {
            Ok(_) if store.fault() == Fault::RefuseSends => Err(Refusal::UnknownPayload),
            r => r,
        });
        let (id, body) = match taken {
            Ok(x) => x,
            Err(why) => {
                if why == Refusal::OtherFlow || why == Refusal::Window {
                    store.refuse(why);
                }
                tracing::warn!("dp: start signal for payload {:#x}: {}", st.id, why.name());
                this.borrow().refuse_now(why.name());
                return;
            }
        };
        if store.fault() == Fault::HoldSends {
            return;
        }
        let wscale = this.borrow().wscale;
        let wnd = crate::sender::window_bytes(u32::from(st.client_window), wscale);
        let wnd = if wnd > 0 { wnd + head as usize } else { 0 };
        match Sender::start(this, id, flow, (st.head, body), wnd, wscale) {
            Ok(()) => store.count_start(true),
            Err(e) => {
                tracing::warn!("dp: cannot send to {}: {e}", st.client);
                this.borrow().refuse_now("payload not sent");
            }
        }
    }

    /// Refuses a start signal as a refused SEND is: says why on the control connection and
    /// shuts it down (its task then ends; the FE closes the client's connection).
    fn refuse_now(&self, why: &str) {
        // The control connection's descriptor is open while this sender lives (see
        // `control`).
        crate::http1::send_now(self.control, &self.answers.line(&format!("ERR {why}")));
        // SAFETY: shutdown(2) on that descriptor.
        unsafe { libc::shutdown(self.control, libc::SHUT_RDWR) };
    }

    fn start(
        this: &Rc<RefCell<Sender>>,
        id: u64,
        flow: crate::sender::Flow,
        (head, body): (Vec<u8>, Payload),
        wnd: usize,
        wscale: u8,
    ) -> io::Result<()> {
        let mut s = this.borrow_mut();
        s.wscale = wscale;
        s.started = id;
        let wnd = wnd.min(MAX_CLIENT_WINDOW);
        let len = (head.len() + body.len()) as u32;
        s.next_seq = Some(flow.seq.wrapping_add(len));
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
        (head, body): (Vec<u8>, Payload),
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
            body: body.reader(),
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

/// The FE side: asks DP at the other end of `conn` (lines signed by `signer`) for payload
/// `id`; Ok(size) once DP has answered OK (the payload's bytes follow on `conn`), Err
/// before any payload byte.
pub async fn fetch(
    conn: &mut Conn,
    (signer, answers): (&crate::control::Signer, &mut Verifier),
    id: u64,
) -> io::Result<u64> {
    write_all(
        &conn.stream,
        signer.line(&format!("FETCH {id}")).into_bytes(),
    )
    .await?;
    let line = conn.read_line(MAX_LINE).await?;
    let line = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
    let text = crate::control::check_answer(answers, &line)?;
    match text.strip_prefix("OK ").and_then(|n| n.parse::<u64>().ok()) {
        Some(n) => Ok(n),
        None => Err(io::Error::other(format!("DP answered `{text}`"))),
    }
}

/// The FE side of a new control connection: DP's greeting read (within `deadline`), the
/// signer of the lines to send on it under `key` and the verifier of DP's answers.
pub async fn greeted(
    conn: &mut Conn,
    key: &ControlKey,
    deadline: Duration,
) -> io::Result<(crate::control::Signer, Verifier)> {
    let line = iolab_runtime::timeout(deadline, conn.read_line(MAX_LINE))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "DP did not greet"))??;
    let text = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
    let nonce = crate::control::parse_greeting(&text)
        .ok_or_else(|| io::Error::other(format!("DP greeted `{text}`")))?;
    Ok((
        crate::control::Signer::new(key.clone(), nonce),
        Verifier::answers(key.clone(), nonce),
    ))
}
