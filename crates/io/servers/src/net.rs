//! Socket plumbing shared by the readiness and thread models: listeners, the one way every
//! model moves bytes between a socket and an `iolab_http::Session`, and the registry that
//! lets a stop request reach connections blocked in `read(2)`.
//!
//! Keeping the HTTP dance (read → feed → write pending → advance → close) in one place is
//! what makes the models comparable: they differ only in how they wait.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iolab_http::{Deadline, Session, Timeouts};

use crate::stats::{ErrorKind, Stats};

pub use crate::{Buffers, MAX_IOV, READ_BUF};

/// A listening TCP socket with SO_REUSEADDR (restarts don't wait out TIME_WAIT, seed 000
/// annex E.1), optionally SO_REUSEPORT (several listeners on one port, one per loop).
pub fn listen(
    addr: SocketAddr,
    backlog: u32,
    reuse_port: bool,
    nonblocking: bool,
) -> io::Result<TcpListener> {
    let what = |e: io::Error, step: &str| io::Error::new(e.kind(), format!("{step} {addr}: {e}"));
    let sock = reuse_addr_socket(addr)?;
    if reuse_port {
        sock.set_reuse_port(true)
            .map_err(|e| what(e, "SO_REUSEPORT on"))?;
    }
    sock.bind(&addr.into()).map_err(|e| what(e, "bind"))?;
    sock.listen(backlog.min(i32::MAX as u32) as i32)
        .map_err(|e| what(e, "listen on"))?;
    sock.set_nonblocking(nonblocking)
        .map_err(|e| what(e, "O_NONBLOCK on"))?;
    Ok(sock.into())
}

/// Fails with [`io::ErrorKind::AddrInUse`] ("ADDR is already in use") when a socket already
/// listens on `addr`; port 0 (the kernel picks a free port) always passes.
///
/// SO_REUSEPORT lets the listeners of one user share a port silently: a second server started
/// on a port in use would join the first one's group and take part of its connections
/// instead of failing. A plain bind (SO_REUSEADDR, so that TIME_WAIT leftovers don't count,
/// but no SO_REUSEPORT) fails whenever anything listens there. The probe socket is closed at
/// once; every model that opens a reuseport group calls this first, and so does `iolab serve`
/// before its start line.
pub fn ensure_addr_free(addr: SocketAddr) -> io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let sock = reuse_addr_socket(addr)?;
    match sock.bind(&addr.into()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(io::Error::new(
            e.kind(),
            format!("{addr} is already in use (another server listens on it)"),
        )),
        Err(e) => Err(io::Error::new(e.kind(), format!("bind {addr}: {e}"))),
    }
}

/// A TCP socket for `addr`'s family with SO_REUSEADDR; an error names the step and `addr`.
fn reuse_addr_socket(addr: SocketAddr) -> io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let what = |e: io::Error, step: &str| io::Error::new(e.kind(), format!("{step} {addr}: {e}"));
    let sock = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.cloexec(),
        Some(Protocol::TCP),
    )
    .map_err(|e| what(e, "socket for"))?;
    sock.set_reuse_address(true)
        .map_err(|e| what(e, "SO_REUSEADDR on"))?;
    Ok(sock)
}

/// The `n` listeners of a model with one accept loop per worker: one plain listener when `n`
/// is 1, else `n` SO_REUSEPORT listeners on one address (the kernel spreads connections over
/// them), after [`ensure_addr_free`] so that they never join another server's group. All are
/// bound before the caller starts any loop, so errors come first; with port 0 the first
/// listener picks the port and the others reuse it.
pub fn listen_group(
    addr: SocketAddr,
    backlog: u32,
    n: usize,
    nonblocking: bool,
) -> io::Result<Vec<TcpListener>> {
    let n = n.max(1);
    let reuse_port = n > 1;
    if reuse_port {
        ensure_addr_free(addr)?;
    }
    let first = listen(addr, backlog, reuse_port, nonblocking)?;
    let addr = first.local_addr()?;
    let mut out = Vec::with_capacity(n);
    out.push(first);
    for _ in 1..n {
        out.push(listen(addr, backlog, true, nonblocking)?);
    }
    Ok(out)
}

/// Per-connection socket options every model applies after `accept`.
pub fn prepare(stream: &TcpStream, nonblocking: bool) -> io::Result<()> {
    // Responses go out in one writev; Nagle would only delay the tail of pipelined answers.
    stream.set_nodelay(true)?;
    stream.set_nonblocking(nonblocking)
}

/// Accept errors that concern only the connection being accepted (it was reset while in the
/// queue, ...) and not the listener: the loop just goes on.
pub fn transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNABORTED | libc::EINTR | libc::EPROTO | libc::EPERM | libc::ENETDOWN)
    ) || e.kind() == io::ErrorKind::Interrupted
}

/// Accepts every connection waiting in a non-blocking listener's queue (the readiness
/// models), counts each one accepted and hands it to `admit`. False after an accept error
/// that is not the connection's fault (EMFILE, ENFILE, ENOBUFS; counted): the rest stays in
/// the queue, and the loop stops watching the listener for [`ACCEPT_BACKOFF`].
pub fn accept_all(listener: &TcpListener, stats: &Stats, mut admit: impl FnMut(TcpStream)) -> bool {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stats.accepted();
                admit(stream);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(e) if transient_accept_error(&e) => continue,
            Err(e) => {
                stats.io_error(&e);
                return false;
            }
        }
    }
}

/// How long every model stops accepting after an accept error that is not the connection's
/// fault (EMFILE, ENFILE, ENOBUFS), as nginx's `accept_mutex_delay` (500 ms) does: the queue
/// stays readable, so retrying at once would spin (a 10 ms retry cost 9% of a core); the
/// pending connections wait in the backlog until descriptors free up, and accepting resumes
/// by itself.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);

/// The blocking accept of the thread models (`threads`, `thread-pool`): waits for the next
/// connection, counts it and registers it. An error like EMFILE means the process is at a
/// limit, not that the listener is broken: it is counted and retried after
/// [`ACCEPT_BACKOFF`] rather than spun on. A connection past `max_conns` is refused (closed at once, counted). `None` once
/// the server is stopping.
pub fn accept_registered(
    listener: &TcpListener,
    registry: &Registry,
    shutdown: &crate::Shutdown,
    stats: &Stats,
) -> Option<(TcpStream, usize)> {
    while !shutdown.is_triggered() {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(_) if shutdown.is_triggered() => return None,
            Err(e) if transient_accept_error(&e) => continue,
            Err(e) => {
                stats.io_error(&e);
                std::thread::sleep(ACCEPT_BACKOFF);
                continue;
            }
        };
        stats.accepted();
        match registry.add(&stream) {
            Ok(key) => return Some((stream, key)),
            Err(Refusal::Full) => stats.refused(),
            Err(Refusal::Closed) => return None,
        }
    }
    None
}

/// What the two thread models share: a blocking listener, the registry of the connections
/// they hold (for `max_conns` and the stop request) and the deadlines.
pub struct BlockingServer {
    listener: TcpListener,
    registry: Registry,
    timeouts: Timeouts,
}

impl BlockingServer {
    /// Listens on `ctx.config.addr` (one blocking listener).
    pub fn bind(ctx: &crate::Ctx) -> io::Result<BlockingServer> {
        let cfg = &ctx.config;
        Ok(BlockingServer {
            listener: listen(cfg.addr, cfg.backlog, false, false)?,
            registry: Registry::new(cfg.max_conns),
            timeouts: cfg.timeouts(),
        })
    }

    /// The next connection, counted accepted and registered ([`accept_registered`]); None
    /// once the server is stopping.
    pub fn accept(&self, ctx: &crate::Ctx) -> Option<(TcpStream, usize)> {
        accept_registered(&self.listener, &self.registry, &ctx.shutdown, &ctx.stats)
    }

    /// Serves a connection until it ends ([`serve_blocking`]), then closes it.
    pub fn serve(&self, ctx: &crate::Ctx, mut stream: TcpStream, key: usize) {
        let lingers = serve_blocking(
            &mut stream,
            &ctx.site,
            &ctx.stats,
            self.timeouts,
            ctx.config.buffers,
        );
        if lingers {
            if let Some(dup) = crate::linger::dup(stream.as_raw_fd()) {
                crate::linger::linger(dup);
            }
        }
        self.close(&ctx.stats, stream, key);
    }

    /// Closes a connection and counts it closed, unregistered first so that the stop
    /// request never shuts down a reused descriptor number.
    pub fn close(&self, stats: &Stats, stream: TcpStream, key: usize) {
        self.registry.remove(key);
        drop(stream);
        stats.conn_closed();
    }

    /// Forgets a registered connection that was never served (its socket is closed by the
    /// caller, or already).
    pub fn unregister(&self, key: usize) {
        self.registry.remove(key);
    }

    /// Waits for the stop request, then shuts the listener down (waking the threads blocked
    /// in `accept`) and every registered connection (waking those blocked in `read`).
    pub fn stop_when_asked(&self, shutdown: &crate::Shutdown) {
        wait_for_shutdown(shutdown);
        shutdown_fd(self.listener.as_raw_fd());
        self.registry.close_all();
    }
}

/// `shutdown(2)` of both directions; wakes a thread blocked in `accept`/`read`/`write` on it.
pub fn shutdown_fd(fd: RawFd) {
    // SAFETY: shutdown on a descriptor the caller keeps open; errors (ENOTCONN) don't matter.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// Blocks until the server's stop is requested (its eventfd becomes readable).
pub fn wait_for_shutdown(shutdown: &crate::Shutdown) {
    let mut pfd = libc::pollfd {
        fd: shutdown.fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    while !shutdown.is_triggered() {
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 1000) };
    }
}

/// Writes as much of the session's pending response bytes as the socket takes with one
/// `writev(2)`, marks them written, and answers the pipelined requests the session held
/// back while its queue was full. Returns the count (0 if nothing was pending).
pub fn write_pending(
    stream: &mut TcpStream,
    session: &mut Session,
    stats: &Stats,
    max_iov: usize,
) -> io::Result<usize> {
    let n = writev(stream, session.pending(), max_iov)?;
    if n > 0 {
        session.advance(n);
        session.resume(|status| stats.response(status));
    }
    Ok(n)
}

/// One `sendmsg(2)` of the first `max_iov` pending chunks that never blocks (MSG_DONTWAIT,
/// whether the socket is blocking or not): the thread models wait for room themselves with
/// a deadline ([`wait_writable`]), so that a send is timed from its last progress.
fn writev(stream: &mut TcpStream, pending: &VecDeque<Bytes>, max_iov: usize) -> io::Result<usize> {
    // On the stack up to the default count (the thread models run on small stacks).
    let mut small: [IoSlice<'_>; MAX_IOV] = [IoSlice::new(&[]); MAX_IOV];
    let mut large = Vec::new();
    let iov: &mut [IoSlice<'_>] = if max_iov <= MAX_IOV {
        &mut small[..max_iov.max(1)]
    } else {
        large.resize(max_iov, IoSlice::new(&[]));
        &mut large
    };
    let mut k = 0;
    for chunk in pending.iter().filter(|c| !c.is_empty()).take(iov.len()) {
        iov[k] = IoSlice::new(chunk);
        k += 1;
    }
    if k == 0 {
        return Ok(0);
    }
    // SAFETY: an all-zero msghdr is valid (no address, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is ABI-compatible with iovec on Unix (std guarantees it); sendmsg only reads.
    msg.msg_iov = iov.as_mut_ptr().cast::<libc::iovec>();
    msg.msg_iovlen = k;
    // SAFETY: msg points to `k` live iovecs whose bytes outlive the call.
    let n = unsafe {
        libc::sendmsg(
            stream.as_raw_fd(),
            &msg,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Waits until `fd` can take bytes (or has an error to report) for at most `limit` (None:
/// without limit); false when the limit passed first.
pub fn wait_writable(fd: RawFd, limit: Option<Duration>) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    let now = Instant::now();
    let ms = timeout_ms(limit.map(|l| now + l), now);
    loop {
        // SAFETY: one valid pollfd.
        match unsafe { libc::poll(&mut pfd, 1, ms) } {
            0 => return Ok(false),
            n if n > 0 => return Ok(true),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// Serves one connection with blocking I/O until it closes (the thread models).
///
/// The deadlines ([`Deadline`]): a write never blocks ([`writev`]); when the socket is full
/// the thread waits for room with `poll(2)` until the send deadline (counted from the last
/// write that moved bytes). Before each read SO_RCVTIMEO is set to the time left until the
/// phase's deadline (a head's, counted from its first byte, or the idle one), so a read that
/// waits past it fails. Either ends the connection, counted as a timeout. A stop request reaches this loop as `shutdown(2)` of the socket (see
/// [`Registry`]), which makes the blocked read return 0.
///
/// True when the connection ends with an error answer, flushed: close it lingering
/// ([`crate::linger`]).
pub fn serve_blocking(
    stream: &mut TcpStream,
    site: &std::sync::Arc<iolab_http::Site>,
    stats: &Stats,
    timeouts: Timeouts,
    buffers: Buffers,
) -> bool {
    let mut session = Session::new(site.clone());
    serve_session(stream, &mut session, stats, timeouts, buffers);
    session.lingers() && !session.has_pending()
}

fn serve_session(
    stream: &mut TcpStream,
    session: &mut Session,
    stats: &Stats,
    timeouts: Timeouts,
    buffers: Buffers,
) {
    let mut deadline = Deadline::new(timeouts, Instant::now());
    // On the heap: the thread models run on small stacks.
    let mut buf = vec![0u8; buffers.read_buf];
    loop {
        while session.has_pending() {
            match write_pending(stream, session, stats, buffers.max_iov) {
                Ok(_) => deadline.update(session, Instant::now()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    match wait_writable(stream.as_raw_fd(), deadline.left(Instant::now())) {
                        Ok(true) => {}
                        Ok(false) => return stats.error(ErrorKind::Timeout),
                        Err(e) => return stats.io_error(&e),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return stats.io_error(&e),
            }
        }
        if session.should_close() {
            return;
        }
        let wait = match deadline.left(Instant::now()) {
            // SO_RCVTIMEO cannot be zero (zero is "forever"): below a millisecond is over.
            Some(left) if left < Duration::from_millis(1) => {
                return stats.error(ErrorKind::Timeout)
            }
            left => left,
        };
        if stream.set_read_timeout(wait).is_err() {
            return stats.error(ErrorKind::Io);
        }
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                session.feed(&buf[..n], |status| stats.response(status));
                deadline.update(session, Instant::now());
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return stats.io_error(&e),
        }
    }
}

/// The connections a blocking model holds, so that a stop request can `shutdown(2)` them
/// (waking threads blocked in `read`) and so that `max_conns` is enforced in one place.
pub struct Registry {
    inner: Mutex<RegistryInner>,
    max: usize,
}

struct RegistryInner {
    closed: bool,
    fds: slab::Slab<RawFd>,
}

/// Why [`Registry::add`] refused a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `max_conns` connections are held already.
    Full,
    /// The server is stopping.
    Closed,
}

impl Registry {
    pub fn new(max_conns: usize) -> Registry {
        Registry {
            inner: Mutex::new(RegistryInner {
                closed: false,
                fds: slab::Slab::new(),
            }),
            max: max_conns,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RegistryInner> {
        // A panicking connection thread cannot leave the slab inconsistent (each operation
        // is one call), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a connection; the returned key must be given to [`Registry::remove`]
    /// BEFORE the socket is closed (so that `close_all` never touches a reused descriptor).
    pub fn add(&self, stream: &TcpStream) -> Result<usize, Refusal> {
        let mut g = self.lock();
        if g.closed {
            return Err(Refusal::Closed);
        }
        if g.fds.len() >= self.max {
            return Err(Refusal::Full);
        }
        Ok(g.fds.insert(stream.as_raw_fd()))
    }

    pub fn remove(&self, key: usize) {
        self.lock().fds.try_remove(key);
    }

    pub fn len(&self) -> usize {
        self.lock().fds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Refuses new registrations and shuts down every registered socket.
    pub fn close_all(&self) {
        let mut g = self.lock();
        g.closed = true;
        for (_, &fd) in g.fds.iter() {
            shutdown_fd(fd);
        }
    }
}

/// What a non-blocking connection waits for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Read,
    Write,
    /// Done (peer closed, error, or `should_close` with everything flushed): close it.
    Close,
}

/// One non-blocking connection of a readiness model (select, poll, epoll).
pub struct Conn {
    pub stream: TcpStream,
    session: Session,
    /// When it must be closed, updated each time bytes move.
    deadline: Deadline,
    max_iov: usize,
}

/// A connection ended by an error answer, flushed, closes lingering ([`crate::linger`]):
/// its socket lives on in a duplicate the lingering thread drains.
impl Drop for Conn {
    fn drop(&mut self) {
        if self.session.lingers() && !self.session.has_pending() {
            if let Some(dup) = crate::linger::dup(self.stream.as_raw_fd()) {
                crate::linger::linger(dup);
            }
        }
    }
}

impl Conn {
    /// A connection whose sends hand at most `max_iov` chunks to one `writev`.
    pub fn new(stream: TcpStream, ctx: &crate::Ctx) -> Conn {
        Conn {
            stream,
            session: Session::new(ctx.site.clone()),
            deadline: Deadline::new(ctx.config.timeouts(), Instant::now()),
            max_iov: ctx.config.buffers.max_iov,
        }
    }

    /// A connection a single-threaded readiness loop (select, poll) has just admitted: set
    /// up (non-blocking, no Nagle), counted open and served as far as it goes at once. With
    /// what it waits for next; None when it could not be set up (counted as an I/O error,
    /// never open) or is already over (counted closed).
    pub fn start(ctx: &crate::Ctx, stream: TcpStream, buf: &mut [u8]) -> Option<(Conn, Want)> {
        let stats = &*ctx.stats;
        if prepare(&stream, true).is_err() {
            stats.error(ErrorKind::Io);
            return None;
        }
        stats.conn_opened();
        let mut conn = Conn::new(stream, ctx);
        match conn.progress(buf, stats) {
            Want::Close => {
                stats.conn_closed();
                None
            }
            want => Some((conn, want)),
        }
    }

    pub fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// This connection's part of one turn of a select or poll loop: `progress` when the
    /// loop saw it ready, `Close` when it is past its deadline (counted as a timeout), None
    /// when neither.
    pub fn turn(
        &mut self,
        ready: bool,
        now: Instant,
        buf: &mut [u8],
        stats: &Stats,
    ) -> Option<Want> {
        if ready {
            // POLLERR/POLLHUP too: the read or write inside `progress` reports it.
            Some(self.progress(buf, stats))
        } else if self.deadline().is_some_and(|d| d <= now) {
            stats.error(ErrorKind::Timeout);
            Some(Want::Close)
        } else {
            None
        }
    }

    /// Does all the I/O possible now without blocking: flushes pending bytes, then reads and
    /// answers until the socket would block. Both directions are driven until EAGAIN, so it
    /// is correct for edge-triggered notification as well as level-triggered.
    pub fn progress(&mut self, buf: &mut [u8], stats: &Stats) -> Want {
        loop {
            while self.session.has_pending() {
                match write_pending(&mut self.stream, &mut self.session, stats, self.max_iov) {
                    Ok(_) => self.deadline.update(&self.session, Instant::now()),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Want::Write,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        stats.io_error(&e);
                        return Want::Close;
                    }
                }
            }
            if self.session.should_close() {
                return Want::Close;
            }
            match self.stream.read(buf) {
                Ok(0) => return Want::Close,
                Ok(n) => {
                    self.session
                        .feed(&buf[..n], |status| stats.response(status));
                    self.deadline.update(&self.session, Instant::now());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Want::Read,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    stats.io_error(&e);
                    return Want::Close;
                }
            }
        }
    }

    /// When this connection times out (None: not in its present phase).
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline.at()
    }
}

/// Milliseconds until `deadline` for poll/epoll_wait (rounded up, at least 0; -1 = forever).
pub fn timeout_ms(deadline: Option<Instant>, now: Instant) -> i32 {
    match deadline {
        None => -1,
        Some(d) => {
            let left = d.saturating_duration_since(now);
            (left.as_micros().div_ceil(1000)).min(i32::MAX as u128) as i32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_enforces_max_and_close() {
        let l = listen("127.0.0.1:0".parse().unwrap(), 16, false, false).unwrap();
        let addr = l.local_addr().unwrap();
        let (c1, c2, c3) = (
            TcpStream::connect(addr).unwrap(),
            TcpStream::connect(addr).unwrap(),
            TcpStream::connect(addr).unwrap(),
        );
        let mut s1 = l.accept().unwrap().0;
        let s2 = l.accept().unwrap().0;
        let s3 = l.accept().unwrap().0;
        let reg = Registry::new(2);
        let k1 = reg.add(&s1).unwrap();
        let k2 = reg.add(&s2).unwrap();
        assert_eq!(reg.add(&s3), Err(Refusal::Full));
        reg.remove(k2);
        assert_eq!(reg.len(), 1);
        // close_all shuts the registered socket down: a blocked read would now see EOF.
        reg.close_all();
        assert_eq!(s1.read(&mut [0u8; 8]).unwrap(), 0);
        assert_eq!(reg.add(&s3), Err(Refusal::Closed));
        reg.remove(k1);
        assert!(reg.is_empty());
        drop((c1, c2, c3));
    }

    #[test]
    fn timeouts_round_up() {
        let now = Instant::now();
        assert_eq!(timeout_ms(None, now), -1);
        assert_eq!(timeout_ms(Some(now), now), 0);
        assert_eq!(timeout_ms(Some(now + Duration::from_micros(1)), now), 1);
        assert_eq!(
            timeout_ms(Some(now + Duration::from_millis(1500)), now),
            1500
        );
        assert_eq!(timeout_ms(Some(now - Duration::from_secs(1)), now), 0);
    }

    #[test]
    fn listeners_share_a_port_with_reuseport() {
        let a = listen("127.0.0.1:0".parse().unwrap(), 16, true, true).unwrap();
        let addr = a.local_addr().unwrap();
        let b = listen(addr, 16, true, true).unwrap();
        assert_eq!(b.local_addr().unwrap(), addr);
        // Without SO_REUSEPORT the port is taken, and the error names the address.
        let e = listen(addr, 16, false, false).unwrap_err();
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }

    #[test]
    fn a_listening_port_is_not_free_even_to_reuseport() {
        // Another server's reuseport listener: a reuseport bind alone would join it.
        let other = listen("127.0.0.1:0".parse().unwrap(), 16, true, false).unwrap();
        let addr = other.local_addr().unwrap();
        let e = ensure_addr_free(addr).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        assert!(
            e.to_string().contains(&format!("{addr} is already in use")),
            "{e}"
        );
        let e = listen_group(addr, 16, 2, true).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        // A single listener is not reuseport, so it fails on its own bind.
        let e = listen_group(addr, 16, 1, true).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        drop(other);
        // Once closed, the same port is free again, and port 0 always is.
        ensure_addr_free(addr).unwrap();
        ensure_addr_free("127.0.0.1:0".parse().unwrap()).unwrap();
    }

    #[test]
    fn a_group_shares_one_port_chosen_by_the_first() {
        let group = listen_group("127.0.0.1:0".parse().unwrap(), 16, 3, true).unwrap();
        assert_eq!(group.len(), 3);
        let addr = group[0].local_addr().unwrap();
        assert_ne!(addr.port(), 0);
        for l in &group {
            assert_eq!(l.local_addr().unwrap(), addr);
        }
        TcpStream::connect(addr).unwrap();
    }
}
