//! Many torrents in one process: a [`Host`] holds them (each a [`Seeder`], with its own
//! swarm, choker, dialler, announces and counters), accepts on every listener (one TCP
//! socket per `--listen` address, one UDP socket beside each under `--utp`) and routes each
//! peer to its torrent: a plaintext peer by the info hash of its handshake, an MSE peer by
//! step 3's `HASH("req2", SKEY) xor HASH("req3", S)` (undone with req3 and looked up in a
//! map from each torrent's req2 hash, [`Skeys`]); the handshake under MSE must then name
//! the same torrent. An info hash of none of our torrents is closed and counted
//! (`peers_wrong_torrent`). Torrents are found by every hash of
//! [`crate::metainfo::Meta::info_hashes`]: a v2-only torrent by its truncated SHA-256, a
//! hybrid by its v1 hash and its truncated v2 hash (a v2 client, from a `btmh` magnet
//! link, names it so); the session answers with the hash the peer used.
//!
//! Limits: [`Config::max_peers`] bounds the connections of the whole process (all torrents,
//! accepted, dialled and uTP); [`Config::max_torrents`] the torrents; `max_dialled`, the
//! choker's slots and the dialler's address book ([`crate::dial::MAX_ADDRESSES`]) are per
//! torrent. The router holds two 20-byte keys per info hash (two for a hybrid).
//!
//! Dual stack: an IPv6 listener is made IPV6_V6ONLY, so that `0.0.0.0:P` and `[::]:P`
//! can both be bound (without it, Linux's default `[::]` takes IPv4 too and the second
//! bind fails).

use std::collections::HashMap;
use std::io;
use std::mem::size_of;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use iolab_runtime::net::{TcpListener, TcpStream, UdpSocket};
use iolab_runtime::{sleep, spawn};

use super::{count_end, inc, is_transient_accept, log_end, Config, Process, Seeder};
use crate::metainfo::Meta;
use crate::mse::Skeys;

/// Which torrent an info hash names: by the hash itself (plaintext handshakes) and by its
/// req2 hash (MSE).
#[derive(Debug, Default)]
pub struct Router {
    by_hash: HashMap<[u8; 20], usize>,
    skeys: Arc<Skeys>,
}

impl Router {
    /// Adds torrent `index` under `info_hash`; false (and nothing added) if the hash is
    /// taken.
    pub fn insert(&mut self, index: usize, info_hash: [u8; 20]) -> bool {
        if self.by_hash.contains_key(&info_hash) {
            return false;
        }
        self.by_hash.insert(info_hash, index);
        Arc::make_mut(&mut self.skeys).insert(index, info_hash);
        true
    }

    /// The torrent a plaintext handshake's info hash names.
    pub fn route(&self, info_hash: &[u8; 20]) -> Option<usize> {
        self.by_hash.get(info_hash).copied()
    }

    /// The map MSE responders look step 3 up in (shared, not copied, per connection).
    pub fn skeys(&self) -> Arc<Skeys> {
        self.skeys.clone()
    }

    /// Info hashes routed (a hybrid has two).
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

/// The torrents of one process and what they share.
pub struct Host {
    pub cfg: Config,
    /// The torrents, in the order they were added (their index is the router's).
    pub torrents: Vec<Rc<Seeder>>,
    pub process: Arc<Process>,
    router: Router,
}

impl Host {
    pub fn new(cfg: Config) -> Host {
        Host {
            cfg,
            torrents: Vec::new(),
            process: Arc::new(Process::default()),
            router: Router::default(),
        }
    }

    /// Adds a torrent (its data files opened). Refused: a torrent whose info hash is
    /// already seeded, one past [`Config::max_torrents`], data that cannot be opened.
    pub fn add(&mut self, meta: Arc<Meta>) -> anyhow::Result<Rc<Seeder>> {
        if self.torrents.len() >= self.cfg.max_torrents {
            bail!(
                "{}: more than {} torrents in one process",
                meta.name,
                self.cfg.max_torrents
            );
        }
        let hashes = meta.info_hashes();
        if let Some(i) = hashes.iter().find_map(|h| self.router.route(h)) {
            bail!(
                "{}: the same info hash as {}, already seeded",
                meta.name,
                self.torrents[i].meta.name
            );
        }
        let s = Seeder::new(meta.clone(), self.cfg.clone(), self.process.clone())
            .with_context(|| format!("{}: opening the data files", meta.name))?;
        for h in hashes {
            self.router.insert(self.torrents.len(), h);
        }
        self.torrents.push(s.clone());
        Ok(s)
    }

    /// The torrent `info_hash` names.
    pub(crate) fn route(&self, info_hash: &[u8; 20]) -> Option<usize> {
        self.router.route(info_hash)
    }

    pub(crate) fn skeys(&self) -> Arc<Skeys> {
        self.router.skeys()
    }

    /// Starts every torrent's choker, tells each dialler our addresses `locals` (never
    /// dialled), and under `--utp` a UDP socket at each of them.
    pub fn start(self: &Rc<Self>, locals: &[SocketAddr]) {
        for s in &self.torrents {
            for &a in locals {
                s.dialer.borrow_mut().set_own(a);
            }
            s.start_choker();
        }
        if self.cfg.utp {
            for &a in locals {
                self.start_utp(a);
            }
        }
    }

    /// uTP on UDP at a TCP listener's address and port; a port taken over UDP is said and
    /// the seeder goes on over TCP alone there.
    fn start_utp(self: &Rc<Self>, addr: SocketAddr) {
        match bind_udp(addr) {
            Ok(socket) => {
                let me = self.clone();
                spawn(async move {
                    if let Err(e) = me.serve_utp(socket).await {
                        tracing::warn!("seed: uTP on {addr} stopped: {e}");
                    }
                });
            }
            Err(e) => tracing::warn!("seed: no uTP on {addr}: {e}"),
        }
    }

    /// Accepts peers on `listener` forever (run it inside the runtime, one task per
    /// listener, after [`Host::start`]).
    pub async fn serve(self: Rc<Self>, listener: TcpListener) -> io::Result<()> {
        let mut acceptor = listener.accept_many(16);
        loop {
            let (stream, addr) = match acceptor.next().await {
                Ok(x) => x,
                Err(e) if is_transient_accept(&e) => {
                    // EMFILE and friends: back off briefly rather than spin.
                    sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let c = &self.process.counters;
            if self.process.full(self.cfg.max_peers) {
                inc(&c.peers_refused_full);
                drop(stream);
                continue;
            }
            inc(&c.peers_accepted);
            self.process.connections.fetch_add(1, Ordering::Relaxed);
            let me = self.clone();
            spawn(async move {
                let _ = stream.set_nodelay(true);
                me.clone().peer(&stream, addr, false).await;
                me.process.connections.fetch_sub(1, Ordering::Relaxed);
            });
        }
    }

    /// An accepted peer (over TCP, or uTP through its socket pair): its opening and
    /// handshake within the handshake timeout, routed to its torrent, then that torrent's
    /// session; counted where it ended (the process before routing, the torrent after).
    pub(crate) async fn peer(self: Rc<Self>, stream: &TcpStream, addr: SocketAddr, utp: bool) {
        let deadline = Instant::now() + self.cfg.handshake_timeout;
        let a = match self.accept_handshake(stream, deadline).await {
            Ok(a) => a,
            Err(end) => {
                log_end(addr, &end);
                return count_end(&self.process.counters, end);
            }
        };
        let Some(s) = self.torrents.get(a.torrent).cloned() else {
            return;
        };
        let c = &s.counters;
        inc(&c.peers_handshaken);
        if utp {
            inc(&c.utp_handshaken);
        }
        if a.mse {
            inc(&c.mse_handshaken);
        }
        c.peers_now.fetch_add(1, Ordering::Relaxed);
        let (hs, inbuf, rc4) = a.opened;
        let end = s.session(stream, addr, hs, inbuf, rc4, true).await;
        c.peers_now.fetch_sub(1, Ordering::Relaxed);
        s.count_end(addr, end);
    }
}

/// A socket of type `ty` bound to `addr`: SO_REUSEADDR for TCP, IPV6_V6ONLY for IPv6 (so
/// that an IPv4 and an IPv6 listener can share a port). Errors keep their kind.
fn bound_socket(addr: SocketAddr, ty: libc::c_int) -> io::Result<OwnedFd> {
    let domain = if addr.is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    // SAFETY: plain socket(2); the descriptor is owned at once.
    let fd = unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let on = |level, name| {
        let one: libc::c_int = 1;
        // SAFETY: `one` lives across the call; its size is given.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                level,
                name,
                &one as *const libc::c_int as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    if ty == libc::SOCK_STREAM {
        on(libc::SOL_SOCKET, libc::SO_REUSEADDR)?;
    }
    if addr.is_ipv6() {
        on(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY)?;
    }
    let r = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: `sin` is a valid sockaddr_in of the size given.
            unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    &sin as *const libc::sockaddr_in as *const libc::sockaddr,
                    size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            }
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: `sin6` is a valid sockaddr_in6 of the size given.
            unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    &sin6 as *const libc::sockaddr_in6 as *const libc::sockaddr,
                    size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                )
            }
        }
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("binding {addr}: {e}")));
    }
    Ok(fd)
}

/// A TCP listener on `addr` with an accept queue of `backlog` (capped by
/// `net.core.somaxconn`); IPv6 only on an IPv6 address.
pub fn bind_tcp(addr: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let fd = bound_socket(addr, libc::SOCK_STREAM)?;
    let backlog = backlog.min(i32::MAX as u32) as libc::c_int;
    // SAFETY: listen(2) on a bound socket we own.
    if unsafe { libc::listen(fd.as_raw_fd(), backlog) } < 0 {
        return Err(io::Error::last_os_error());
    }
    TcpListener::from_std(std::net::TcpListener::from(fd))
}

/// A UDP socket on `addr` (uTP beside a TCP listener); IPv6 only on an IPv6 address.
pub fn bind_udp(addr: SocketAddr) -> io::Result<UdpSocket> {
    let fd = bound_socket(addr, libc::SOCK_DGRAM)?;
    UdpSocket::from_std(std::net::UdpSocket::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mse::{Exchange as _, Initiator, MseError, Policy, Responder, CRYPTO_RC4};

    /// MSE step 3 of an initiator for `ih` against a responder of the router's map.
    fn mse_route(r: &Router, ih: [u8; 20]) -> Result<usize, MseError> {
        let mut resp = Responder::with_skeys(Policy::Prefer, r.skeys());
        let (mut init, open) = Initiator::new(ih, CRYPTO_RC4, vec![0; 68]);
        let p2 = resp.feed(&open)?;
        let p3 = init.feed(&p2.send)?;
        let done = resp.feed(&p3.send)?.done;
        Ok(done.map_or(usize::MAX, |d| d.torrent))
    }

    #[test]
    fn two_torrents_are_routed_plain_and_by_mse_and_others_refused() {
        let (a, b) = ([0x11u8; 20], [0x22u8; 20]);
        let mut r = Router::default();
        assert!(r.insert(0, a));
        assert!(r.insert(1, b));
        assert!(!r.insert(2, a), "a hash seeded twice is refused");
        assert_eq!(r.len(), 2);
        assert_eq!(r.route(&a), Some(0));
        assert_eq!(r.route(&b), Some(1));
        assert_eq!(r.route(&[0x33; 20]), None, "unknown: refused");
        assert_eq!(mse_route(&r, a), Ok(0));
        assert_eq!(mse_route(&r, b), Ok(1));
        assert_eq!(mse_route(&r, [0x33; 20]), Err(MseError::UnknownTorrent));
    }

    #[test]
    fn an_ipv4_and_an_ipv6_listener_share_a_port() {
        let v4 = bind_tcp("127.0.0.1:0".parse().unwrap(), 16).unwrap();
        let port = v4.local_addr().unwrap().port();
        let Ok(v6) = bind_tcp(SocketAddr::from(([0u16; 8], port)), 16) else {
            // A host without IPv6 (a container with IPv4 only): nothing to check.
            eprintln!("SKIPPED: no IPv6 here");
            return;
        };
        assert_eq!(v6.local_addr().unwrap().port(), port);
        let again = bind_tcp(SocketAddr::from(([0u16; 8], port)), 16);
        assert_eq!(
            again.map(|_| ()).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        let u4 = bind_udp(SocketAddr::from(([0, 0, 0, 0], port))).unwrap();
        let u6 = bind_udp(SocketAddr::from(([0u16; 8], port))).unwrap();
        assert_eq!(
            u4.local_addr().unwrap().port(),
            u6.local_addr().unwrap().port()
        );
    }
}
