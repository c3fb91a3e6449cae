//! How a connection becomes a handshaken peer: accepted (a plaintext handshake, or MSE then
//! the handshake under it, as `--encryption` allows; the [`Host`] routes it to its torrent by
//! the handshake's info hash, or by MSE's req2 hash), or dialled (MSE offered first under
//! `prefer` and `require`, plaintext once more if a `prefer` peer closes on our key). Every
//! step runs against one deadline, the handshake timeout; which addresses are dialled is
//! [`crate::dial`]'s.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use iolab_runtime::net::TcpStream;
use iolab_runtime::{spawn, timeout, wait_readable_or_cancel, Cond};

use crate::dial::Outcome;
use crate::link::{self, recv_into, ExchangeFailure};
use crate::mse::{self, Exchange as _, Policy, Rc4Pair};
use crate::seed::{inc, Counters, End, Host, Seeder};
use crate::wire::{self, Handshake};

/// A handshaken connection: the stream, the peer's handshake, the input after it, and the
/// stream's RC4 if MSE chose it.
pub(crate) type Opened = (Handshake, Vec<u8>, Option<Rc4Pair>);

/// An accepted connection's opening: the torrent it is for (an index into the host's),
/// whether it came under MSE, and the handshake.
pub(crate) struct Accepted {
    pub torrent: usize,
    pub mse: bool,
    pub opened: Opened,
}

impl Host {
    /// Reads an accepted peer's opening: a plaintext handshake, or an MSE exchange then the
    /// handshake under it, as `--encryption` allows, and finds its torrent. Counted in the
    /// process's counters.
    pub(crate) async fn accept_handshake(
        &self,
        stream: &TcpStream,
        deadline: Instant,
    ) -> Result<Accepted, End> {
        let mut inbuf: Vec<u8> = Vec::new();
        let mut rc4 = None;
        // The torrent MSE's req2 named, if the peer opened with MSE.
        let mut by_mse = None;
        // Whether the first 20 bytes were looked at (plaintext, MSE or garbage).
        let mut opened = false;
        while inbuf.len() < wire::HANDSHAKE_LEN {
            read_some(stream, &mut inbuf, &mut rc4, deadline).await?;
            if !opened && inbuf.len() >= 20 {
                opened = true;
                let policy = self.cfg.encryption;
                if is_handshake_start(&inbuf) {
                    if policy == Policy::Require {
                        return Err(End::PlaintextRefused);
                    }
                } else if wire::looks_like_text(&inbuf) {
                    return Err(End::Garbage("not a BitTorrent handshake".into()));
                } else if policy == Policy::Off {
                    if wire::looks_like_mse(&inbuf) {
                        return Err(End::MseOpening);
                    }
                    return Err(End::Garbage("not a BitTorrent handshake".into()));
                } else {
                    inc(&self.process.counters.mse_openings);
                    let first = std::mem::take(&mut inbuf);
                    let est = self.accept_mse(stream, first, deadline).await?;
                    inbuf = est.payload;
                    rc4 = est.rc4;
                    by_mse = Some(est.torrent);
                }
            }
            if opened && inbuf.len() >= 20 && !is_handshake_start(&inbuf) {
                return Err(End::Garbage("not a BitTorrent handshake".into()));
            }
        }
        let hs = Handshake::parse(&inbuf)?;
        inbuf.drain(..wire::HANDSHAKE_LEN);
        let torrent = self.route(&hs.info_hash).ok_or(End::WrongTorrent)?;
        if by_mse.is_some_and(|t| t != torrent) {
            // The handshake under MSE names another torrent than its SKEY did.
            return Err(End::WrongTorrent);
        }
        Ok(Accepted {
            torrent,
            mse: by_mse.is_some(),
            opened: (hs, inbuf, rc4),
        })
    }

    /// The responder's side of MSE over `stream`, `first` being the bytes received so far:
    /// the torrent is the one whose req2 hash step 3 carries ([`mse::Skeys`]).
    async fn accept_mse(
        &self,
        stream: &TcpStream,
        first: Vec<u8>,
        deadline: Instant,
    ) -> Result<mse::Established, End> {
        let mut r = mse::Responder::with_skeys(self.cfg.encryption, self.skeys());
        let res = link::exchange(stream, first, deadline, |d| r.feed(d)).await;
        mse_result(&self.process.counters, res)
    }
}

/// Counts an MSE exchange's outcome in `c`, and turns a failure into the peer's end.
fn mse_result(
    c: &Counters,
    res: Result<mse::Established, ExchangeFailure>,
) -> Result<mse::Established, End> {
    match res {
        Ok(est) => {
            inc(&c.mse_established);
            if est.rc4.is_some() {
                inc(&c.mse_rc4);
            }
            Ok(est)
        }
        Err(ExchangeFailure::Mse(mse::MseError::UnknownTorrent)) => Err(End::WrongTorrent),
        Err(f) => {
            inc(&c.mse_failures);
            Err(match f {
                ExchangeFailure::Timeout => End::HandshakeTimeout,
                ExchangeFailure::Io(e) => End::Io(e),
                other => End::MseFailed(format!("{other:?}")),
            })
        }
    }
}

impl Seeder {
    /// Dials those of a tracker's `peers` the dialler allows now, each in a task of its own.
    pub fn dial_peers(self: &Rc<Self>, peers: &[SocketAddr]) {
        if self.process.full(self.cfg.max_peers) {
            return;
        }
        let picked = self.dialer.borrow_mut().pick(peers, Instant::now());
        for addr in picked {
            inc(&self.counters.peers_dialled);
            let me = self.clone();
            spawn(async move {
                let outcome = me.clone().dial(addr).await;
                me.dialer.borrow_mut().ended(addr, outcome, Instant::now());
            });
        }
    }

    /// One dialled peer: the handshake (MSE as the policy says), then its session.
    async fn dial(self: Rc<Self>, addr: SocketAddr) -> Outcome {
        let timeout = self.cfg.handshake_timeout;
        let policy = self.cfg.encryption;
        let mut res = self
            .dial_handshake(addr, policy, Instant::now() + timeout)
            .await;
        if policy == Policy::Prefer && matches!(res, Err(End::MseFailed(_)) | Err(End::Closed)) {
            // A peer that does not speak MSE closes on our key: plaintext once more.
            res = self
                .dial_handshake(addr, Policy::Off, Instant::now() + timeout)
                .await;
        }
        let (stream, (hs, inbuf, rc4)) = match res {
            Ok(x) => x,
            Err(End::Ourselves) => return Outcome::Ourselves,
            Err(end) => {
                inc(&self.counters.dial_failures);
                self.log_end(addr, &end);
                return Outcome::Failed;
            }
        };
        inc(&self.counters.peers_dialled_handshaken);
        self.dialer.borrow_mut().connected(addr);
        let held = &self.process.connections;
        held.fetch_add(1, Ordering::Relaxed);
        self.counters.peers_now.fetch_add(1, Ordering::Relaxed);
        let end = self.session(&stream, addr, hs, inbuf, rc4, false).await;
        self.counters.peers_now.fetch_sub(1, Ordering::Relaxed);
        held.fetch_sub(1, Ordering::Relaxed);
        self.count_end(addr, end);
        Outcome::SessionEnded
    }

    /// Connects to `addr` and handshakes under `policy` (MSE unless `Off`), by `deadline`.
    async fn dial_handshake(
        &self,
        addr: SocketAddr,
        policy: Policy,
        deadline: Instant,
    ) -> Result<(TcpStream, Opened), End> {
        let left = deadline.saturating_duration_since(Instant::now());
        let stream = match timeout(left, TcpStream::connect(addr)).await {
            Err(_) => return Err(End::HandshakeTimeout),
            Ok(Err(e)) => return Err(End::Io(e)),
            Ok(Ok(s)) => s,
        };
        let _ = stream.set_nodelay(true);
        let ours = self.our_handshake(self.meta.info_hash).to_vec();
        let (first, mut inbuf, mut rc4) = if policy == Policy::Off {
            (ours, Vec::new(), None)
        } else {
            let ih = self.meta.info_hash;
            let (mut init, opening) = mse::Initiator::new(ih, policy.provide(), ours);
            write_by(&stream, opening, deadline).await?;
            let res = link::exchange(&stream, Vec::new(), deadline, |d| init.feed(d)).await;
            let est = mse_result(&self.counters, res)?;
            (Vec::new(), est.payload, est.rc4)
        };
        if !first.is_empty() {
            write_by(&stream, first, deadline).await?;
        }
        while inbuf.len() < wire::HANDSHAKE_LEN {
            read_some(&stream, &mut inbuf, &mut rc4, deadline).await?;
            if inbuf.len() >= 20 && !is_handshake_start(&inbuf) {
                return Err(End::Garbage("not a BitTorrent handshake".into()));
            }
        }
        let hs = Handshake::parse(&inbuf)?;
        inbuf.drain(..wire::HANDSHAKE_LEN);
        if hs.info_hash != self.meta.info_hash {
            return Err(End::WrongTorrent);
        }
        if hs.peer_id == self.peer_id || self.is_connected(&hs.peer_id) {
            return Err(End::Ourselves);
        }
        Ok((stream, (hs, inbuf, rc4)))
    }
}

/// Whether `b` starts as a plaintext BitTorrent handshake (19, "BitTorrent protocol").
fn is_handshake_start(b: &[u8]) -> bool {
    b.len() >= 20 && b[0] == 19 && &b[1..20] == wire::PROTOCOL
}

/// Waits (until `deadline`) for input and appends what arrived to `inbuf`.
async fn read_some(
    stream: &TcpStream,
    inbuf: &mut Vec<u8>,
    rc4: &mut Option<Rc4Pair>,
    deadline: Instant,
) -> Result<(), End> {
    let never = Cond::new();
    let left = deadline.saturating_duration_since(Instant::now());
    match timeout(left, wait_readable_or_cancel(stream.as_raw_fd(), &never)).await {
        Err(_) => return Err(End::HandshakeTimeout),
        Ok(Err(e)) => return Err(End::Io(e)),
        Ok(Ok(())) => {}
    }
    match recv_into(stream, inbuf, rc4) {
        Ok(0) => Err(End::Closed),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
        Err(e) => Err(End::Io(e)),
    }
}

/// Writes all of `buf` by `deadline`.
async fn write_by(stream: &TcpStream, buf: Vec<u8>, deadline: Instant) -> Result<(), End> {
    let left = deadline.saturating_duration_since(Instant::now());
    match timeout(left, stream.write_all(buf)).await {
        Err(_) => Err(End::HandshakeTimeout),
        Ok((Err(e), _)) => Err(End::Io(e)),
        Ok((Ok(()), _)) => Ok(()),
    }
}
