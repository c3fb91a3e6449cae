//! uTP on the runtime: one UDP socket (on the TCP listener's port, as clients expect),
//! datagrams routed to connections by (address, connection id), each connection driven by
//! a bridge task that carries its bytes to and from a peer session.
//!
//! The session is the TCP one, unchanged: it runs on one end of a Unix stream socket pair
//! and the bridge holds the other. So the TCP path keeps every byte of its performance (no
//! stream trait, no boxing per I/O), the session's readiness waits, gathered sends and the
//! choker's send-queue measure (SIOCOUTQ: bytes the bridge has not taken because the uTP
//! window is full) work as they are, and a uTP peer costs two extra copies per byte and two
//! descriptors. A socket pair is made at the first SYN from an address; a SYN flood is held
//! to [`UtpLimits::max_half_open`] connections that have not yet sent data, each closed at
//! the handshake deadline, and every connection counts toward `--max-peers`. The session's
//! torrent is found from its handshake, as over TCP ([`Host`]).
//!
//! Packets for no known connection are dropped, not answered with a RESET: an answer per
//! datagram would let anyone aim our replies at a forged address.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use iolab_runtime::net::{TcpStream, UdpSocket};
use iolab_runtime::{sleep, spawn, timeout, wait_readable_or_cancel, Cond};

use super::{inc, Host};
use crate::utp::conn::{Close, Conn, Deadlines, State};
use crate::utp::packet::{self, Kind};

/// Limits of the uTP side.
#[derive(Debug, Clone, Copy)]
pub struct UtpLimits {
    /// Connections that sent a SYN and no data yet, at most (more SYNs are dropped).
    pub max_half_open: usize,
    pub deadlines: Deadlines,
}

impl Default for UtpLimits {
    fn default() -> Self {
        UtpLimits {
            max_half_open: 64,
            deadlines: Deadlines::default(),
        }
    }
}

/// Largest datagram read: a full packet with room to spare (longer ones are cut and then
/// fail to parse as what they claim, or carry a shorter payload: harmless).
const DATAGRAM: usize = 2048;
/// Bytes moved between the connection and the socket pair per call.
const CHUNK: usize = 64 * 1024;
/// How soon the bridge tries again to hand received bytes to a session that is not reading.
const DELIVERY_RETRY: Duration = Duration::from_millis(20);

/// One connection as the multiplexer and its bridge share it.
struct Link {
    conn: RefCell<Conn>,
    addr: SocketAddr,
    /// Set when a packet arrived since the bridge last looked (a `Cond` signal finds no
    /// waiter while the bridge is sending).
    dirty: Cell<bool>,
    wake: Cond,
    half_open: Cell<bool>,
}

impl Link {
    fn poke(&self) {
        self.dirty.set(true);
        self.wake.signal();
    }
}

struct Mux {
    socket: UdpSocket,
    links: RefCell<HashMap<(SocketAddr, u16), Rc<Link>>>,
    half_open: Cell<usize>,
    lim: UtpLimits,
}

impl Mux {
    fn leave_half_open(&self, link: &Link) {
        if link.half_open.replace(false) {
            self.half_open.set(self.half_open.get() - 1);
        }
    }
}

impl Host {
    /// Receives uTP datagrams forever on `socket`: new connections from SYNs, packets to
    /// their connections.
    pub(crate) async fn serve_utp(self: Rc<Self>, socket: UdpSocket) -> io::Result<()> {
        let mux = Rc::new(Mux {
            socket,
            links: RefCell::new(HashMap::new()),
            half_open: Cell::new(0),
            lim: self.cfg.utp_limits,
        });
        let mut buf = vec![0u8; DATAGRAM];
        loop {
            let (r, back) = mux.socket.recv_from(buf).await;
            buf = back;
            let (n, from) = match r {
                Ok(x) => x,
                // ICMP errors of earlier sends (ECONNREFUSED) and the like: nothing lost.
                Err(e) if e.kind() != io::ErrorKind::Unsupported => {
                    tracing::debug!("utp: receive: {e}");
                    sleep(Duration::from_millis(1)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.on_datagram(&mux, &buf[..n], from);
        }
    }

    fn on_datagram(self: &Rc<Self>, mux: &Rc<Mux>, d: &[u8], from: SocketAddr) {
        let c = &self.process.counters;
        let p = match packet::parse(d) {
            Ok(p) => p,
            Err(_) => return inc(&c.utp_garbage),
        };
        // A SYN carries the id the initiator receives on; we receive on the next one.
        let id = match p.kind {
            Kind::Syn => p.conn_id.wrapping_add(1),
            _ => p.conn_id,
        };
        let now = Instant::now();
        if let Some(link) = mux.links.borrow().get(&(from, id)) {
            link.conn.borrow_mut().on_packet(&p, now);
            link.poke();
            return;
        }
        if p.kind != Kind::Syn {
            return inc(&c.utp_unknown);
        }
        if self.process.full(self.cfg.max_peers) {
            return inc(&c.peers_refused_full);
        }
        if mux.half_open.get() >= mux.lim.max_half_open {
            return inc(&c.utp_refused);
        }
        let (ours, theirs) = match UnixStream::pair() {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!("utp: socket pair: {e}");
                return inc(&c.utp_refused);
            }
        };
        let session_end = ours
            .set_nonblocking(true)
            .and_then(|()| session_stream(theirs));
        let Ok(session_end) = session_end else {
            return inc(&c.utp_refused);
        };
        let conn = Conn::accept(&p, rand::random(), now, mux.lim.deadlines);
        let link = Rc::new(Link {
            conn: RefCell::new(conn),
            addr: from,
            dirty: Cell::new(true),
            wake: Cond::new(),
            half_open: Cell::new(true),
        });
        mux.half_open.set(mux.half_open.get() + 1);
        mux.links.borrow_mut().insert((from, id), link.clone());
        inc(&c.utp_accepted);
        self.process.connections.fetch_add(1, Ordering::Relaxed);
        let me = self.clone();
        spawn(async move {
            me.clone().peer(&session_end, from, true).await;
            drop(session_end);
            me.process.connections.fetch_sub(1, Ordering::Relaxed);
        });
        let (me, mux) = (self.clone(), mux.clone());
        spawn(async move {
            let why = bridge(&mux, &link, ours).await;
            mux.leave_half_open(&link);
            mux.links.borrow_mut().remove(&(from, id));
            me.count_utp_close(why);
        });
    }

    fn count_utp_close(&self, why: Close) {
        let c = &self.process.counters;
        match why {
            Close::Done => {}
            Close::Reset => inc(&c.utp_resets),
            Close::Timeout | Close::Idle => inc(&c.utp_timeouts),
        }
    }
}

/// The session's end of the pair as the runtime's stream type: the session only uses
/// what every stream socket has (readiness, recv, send, sendmsg, SIOCOUTQ).
fn session_stream(s: UnixStream) -> io::Result<TcpStream> {
    s.set_nonblocking(true)?;
    let fd: OwnedFd = s.into();
    TcpStream::from_std(std::net::TcpStream::from(fd))
}

thread_local! {
    /// The loop's buffer between the socket pair and a connection: an idle bridge holds none.
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0u8; CHUNK]);
}

/// Moves what the session wrote into the connection, as far as its send buffer allows;
/// `true` when the session closed its side (the connection then sends its FIN).
fn take_from_session(pair: &mut UnixStream, c: &mut Conn) -> bool {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        while c.writable() > 0 {
            let n = c.writable().min(s.len());
            match pair.read(&mut s[..n]) {
                Ok(n) if n > 0 => {
                    c.write(&s[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // End of stream, or the session's end is gone.
                _ => {
                    c.close();
                    return true;
                }
            }
        }
        false
    })
}

/// Drives one connection until it closes: received bytes to the session, the session's
/// bytes into the connection as its window allows, datagrams out, timers.
async fn bridge(mux: &Mux, link: &Link, mut pair: UnixStream) -> Close {
    let (mut local_eof, mut eof_told) = (false, false);
    let mut out = Vec::with_capacity(DATAGRAM);
    loop {
        link.dirty.set(false);
        let now = Instant::now();
        let undelivered = {
            let mut c = link.conn.borrow_mut();
            c.on_tick(now);
            while !c.received().is_empty() {
                match pair.write(c.received()) {
                    Ok(n) => c.consume(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        // The session is gone: nothing more to deliver.
                        let n = c.received().len();
                        c.consume(n);
                    }
                }
            }
            if c.eof() && c.received().is_empty() && !eof_told {
                eof_told = true;
                let _ = pair.shutdown(std::net::Shutdown::Write);
            }
            if !local_eof {
                local_eof = take_from_session(&mut pair, &mut c);
            }
            if c.state() == State::Connected {
                mux.leave_half_open(link);
            }
            !c.received().is_empty()
        };
        while {
            out.clear();
            link.conn
                .borrow_mut()
                .poll_transmit(Instant::now(), &mut out)
        } {
            let (_, back) = mux.socket.send_to(out, link.addr).await;
            out = back;
        }
        let (deadline, wait_input) = {
            let c = link.conn.borrow();
            if let Some(why) = c.closed() {
                return why;
            }
            let retry = if undelivered {
                now + DELIVERY_RETRY
            } else {
                c.next_deadline()
            };
            (c.next_deadline().min(retry), !local_eof && c.writable() > 0)
        };
        if link.dirty.get() {
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if wait_input {
            let _ = timeout(left, wait_readable_or_cancel(pair.as_raw_fd(), &link.wake)).await;
        } else {
            let _ = timeout(left, link.wake.wait()).await;
        }
    }
}
