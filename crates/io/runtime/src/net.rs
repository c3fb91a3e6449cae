//! TCP on the runtime: listeners with several accepts in flight (seed 000's pre-posted
//! AcceptEx), and streams with owned-buffer reads and writes; UDP sockets in [`UdpSocket`].
//!
//! Sockets are always non-blocking: the epoll driver needs it, and io_uring handles it
//! (network opcodes poll internally; an -EAGAIN that still comes back is retried after a
//! POLL_ADD).

use std::future::Future;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::Poll;

use io_uring::{opcode, squeue, types};
use iolab_sys::cvt;
use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};

use crate::buf::{IoBuf, IoBufMut};
use crate::cond::Cond;
use crate::op::{submit_inner, Interest, Operation};

mod udp;
pub use udp::UdpSocket;

/// `AsRawFd` and `AsFd` of a socket type through its `fd: OwnedFd` field.
macro_rules! fd_of_field {
    ($t:ty) => {
        impl AsRawFd for $t {
            fn as_raw_fd(&self) -> RawFd {
                self.fd.as_raw_fd()
            }
        }

        impl AsFd for $t {
            fn as_fd(&self) -> BorrowedFd<'_> {
                self.fd.as_fd()
            }
        }
    };
}

// ---------------------------------------------------------------- operations

struct AcceptOp {
    fd: RawFd,
    addr: libc::sockaddr_storage,
    len: libc::socklen_t,
}

// SAFETY: the SQE points at `addr` and `len`, fields of the boxed operation.
unsafe impl Operation for AcceptOp {
    fn prepare(&mut self) -> squeue::Entry {
        self.len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        opcode::Accept::new(
            types::Fd(self.fd),
            &mut self.addr as *mut _ as *mut libc::sockaddr,
            &mut self.len,
        )
        .flags(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
        .build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        self.len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: addr/len are valid for writes of the sizes given.
        let r = unsafe {
            libc::accept4(
                self.fd,
                &mut self.addr as *mut _ as *mut libc::sockaddr,
                &mut self.len,
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        cvt(r).map(|fd| fd as usize)
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        Some((self.fd, Interest::Readable))
    }

    fn orphaned(&mut self, result: io::Result<usize>) {
        if let Ok(fd) = result {
            // SAFETY: the kernel just gave us this descriptor and nobody else knows it.
            drop(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
    }
}

struct ConnectOp {
    fd: RawFd,
    addr: SockAddr,
    started: bool,
}

// SAFETY: the SQE points at `addr`, a field of the boxed operation.
unsafe impl Operation for ConnectOp {
    fn prepare(&mut self) -> squeue::Entry {
        opcode::Connect::new(
            types::Fd(self.fd),
            self.addr.as_ptr() as *const libc::sockaddr,
            self.addr.len(),
        )
        .build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        if self.started {
            // Writable after EINPROGRESS: the outcome is in SO_ERROR.
            let s = SockRef::from(&*self);
            return match s.take_error()? {
                Some(e) => Err(e),
                None => Ok(0),
            };
        }
        self.started = true;
        // SAFETY: addr points to a valid sockaddr of the given length.
        let r = unsafe {
            libc::connect(
                self.fd,
                self.addr.as_ptr() as *const libc::sockaddr,
                self.addr.len(),
            )
        };
        match cvt(r) {
            Ok(_) => Ok(0),
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
                Err(io::ErrorKind::WouldBlock.into())
            }
            Err(e) => Err(e),
        }
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        Some((self.fd, Interest::Writable))
    }
}

impl AsFd for ConnectOp {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the socket outlives the operation (owned by the connect future's caller).
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }
}

struct RecvOp<B> {
    fd: RawFd,
    buf: B,
}

// SAFETY: the SQE points into the buffer, which IoBufMut guarantees stays put.
unsafe impl<B: IoBufMut> Operation for RecvOp<B> {
    fn prepare(&mut self) -> squeue::Entry {
        let len = self.buf.len().min(u32::MAX as usize) as u32;
        opcode::Recv::new(types::Fd(self.fd), self.buf.stable_mut_ptr(), len).build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        let len = self.buf.len();
        // SAFETY: the buffer is valid for writes of `len` bytes.
        cvt(unsafe { libc::recv(self.fd, self.buf.stable_mut_ptr() as *mut _, len, 0) })
            .map(|n| n as usize)
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        Some((self.fd, Interest::Readable))
    }
}

struct SendOp<B> {
    fd: RawFd,
    buf: B,
    pos: usize,
}

impl<B: IoBuf> SendOp<B> {
    /// send(2) of what is left, at once, with `flags`.
    fn send_now(&mut self, flags: libc::c_int) -> io::Result<usize> {
        let len = self.buf.len() - self.pos;
        // SAFETY: the range [pos, len) of the buffer is initialised and valid for reads.
        let r = unsafe {
            libc::send(
                self.fd,
                self.buf.stable_ptr().add(self.pos) as *const _,
                len,
                flags,
            )
        };
        cvt(r).map(|n| n as usize)
    }
}

// SAFETY: the SQE points into the buffer, which IoBuf guarantees stays put.
unsafe impl<B: IoBuf> Operation for SendOp<B> {
    fn prepare(&mut self) -> squeue::Entry {
        let len = (self.buf.len() - self.pos).min(u32::MAX as usize) as u32;
        // SAFETY: pos <= len, so the pointer stays inside the buffer.
        let ptr = unsafe { self.buf.stable_ptr().add(self.pos) };
        opcode::Send::new(types::Fd(self.fd), ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        self.send_now(libc::MSG_NOSIGNAL)
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        Some((self.fd, Interest::Writable))
    }

    fn attempt_inline(&mut self) -> Option<io::Result<usize>> {
        Some(self.send_now(libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT))
    }
}

struct SendvOp<B> {
    fd: RawFd,
    bufs: Vec<B>,
    iov: Vec<libc::iovec>,
    msg: libc::msghdr,
}

impl<B: IoBuf> SendvOp<B> {
    fn new(fd: RawFd, bufs: Vec<B>) -> Self {
        let iov = bufs
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.stable_ptr() as *mut _,
                iov_len: b.len(),
            })
            .collect::<Vec<_>>();
        // SAFETY: msghdr is plain data; all-zero is a valid (empty) value.
        let msg: libc::msghdr = unsafe { std::mem::zeroed() };
        SendvOp { fd, bufs, iov, msg }
    }

    fn fill_msg(&mut self) {
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = self.iov.len().min(libc::UIO_MAXIOV as usize) as _;
    }
}

// SAFETY: the SQE points at `msg`, whose iov array (`iov`, a Vec that is never resized) points
// into the buffers; all are owned by the boxed operation.
unsafe impl<B: IoBuf> Operation for SendvOp<B> {
    fn prepare(&mut self) -> squeue::Entry {
        self.fill_msg();
        opcode::SendMsg::new(types::Fd(self.fd), &self.msg)
            .flags(libc::MSG_NOSIGNAL as u32)
            .build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        self.fill_msg();
        // SAFETY: msg describes valid iovecs into live buffers.
        cvt(unsafe { libc::sendmsg(self.fd, &self.msg, libc::MSG_NOSIGNAL) }).map(|n| n as usize)
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        Some((self.fd, Interest::Writable))
    }

    fn attempt_inline(&mut self) -> Option<io::Result<usize>> {
        self.fill_msg();
        let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
        // SAFETY: msg describes valid iovecs into live buffers.
        Some(cvt(unsafe { libc::sendmsg(self.fd, &self.msg, flags) }).map(|n| n as usize))
    }
}

struct ShutdownOp {
    fd: RawFd,
    how: i32,
}

// SAFETY: no pointer in the SQE.
unsafe impl Operation for ShutdownOp {
    fn prepare(&mut self) -> squeue::Entry {
        opcode::Shutdown::new(types::Fd(self.fd), self.how).build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        // SAFETY: plain syscall on a descriptor we were given.
        cvt(unsafe { libc::shutdown(self.fd, self.how) }).map(|_| 0)
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        None
    }
}

pub(crate) struct CloseOp {
    pub(crate) fd: RawFd,
}

// SAFETY: no pointer in the SQE.
unsafe impl Operation for CloseOp {
    fn prepare(&mut self) -> squeue::Entry {
        opcode::Close::new(types::Fd(self.fd)).build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        // SAFETY: the caller gave up ownership of fd to this operation.
        cvt(unsafe { libc::close(self.fd) }).map(|_| 0)
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        None
    }
}

fn shutdown_how(how: Shutdown) -> i32 {
    match how {
        Shutdown::Read => libc::SHUT_RD,
        Shutdown::Write => libc::SHUT_WR,
        Shutdown::Both => libc::SHUT_RDWR,
    }
}

// ---------------------------------------------------------------- listener

/// Options for [`TcpListener`]: backlog, SO_REUSEADDR, SO_REUSEPORT.
#[derive(Debug, Clone)]
pub struct ListenerBuilder {
    addr: SocketAddr,
    backlog: u32,
    reuse_addr: bool,
    reuse_port: bool,
}

impl ListenerBuilder {
    /// Length of the accept queue passed to listen(2) (capped by `net.core.somaxconn`).
    pub fn backlog(mut self, n: u32) -> Self {
        self.backlog = n;
        self
    }

    /// SO_REUSEADDR (default on): rebind while old connections sit in TIME_WAIT.
    pub fn reuse_addr(mut self, on: bool) -> Self {
        self.reuse_addr = on;
        self
    }

    /// SO_REUSEPORT (default off): several listeners on one port, the kernel spreading
    /// connections among them (one per loop).
    pub fn reuse_port(mut self, on: bool) -> Self {
        self.reuse_port = on;
        self
    }

    /// Creates, configures, binds and listens. Needs no runtime.
    pub fn bind(self) -> io::Result<TcpListener> {
        let s = Socket::new(
            Domain::for_address(self.addr),
            Type::STREAM.nonblocking().cloexec(),
            Some(Protocol::TCP),
        )?;
        s.set_reuse_address(self.reuse_addr)?;
        if self.reuse_port {
            s.set_reuse_port(true)?;
        }
        s.bind(&self.addr.into())
            .map_err(|e| io::Error::new(e.kind(), format!("binding {}: {e}", self.addr)))?;
        s.listen(self.backlog.min(i32::MAX as u32) as i32)?;
        let local = s.local_addr()?.as_socket().unwrap_or(self.addr);
        Ok(TcpListener {
            fd: s.into(),
            local,
        })
    }
}

/// A listening TCP socket.
#[derive(Debug)]
pub struct TcpListener {
    fd: OwnedFd,
    local: SocketAddr,
}

impl TcpListener {
    /// Binds with SO_REUSEADDR and a backlog of 1024.
    pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
        TcpListener::builder(addr).bind()
    }

    pub fn builder(addr: SocketAddr) -> ListenerBuilder {
        ListenerBuilder {
            addr,
            backlog: 1024,
            reuse_addr: true,
            reuse_port: false,
        }
    }

    /// Takes over a std listener (made non-blocking).
    pub fn from_std(l: std::net::TcpListener) -> io::Result<TcpListener> {
        l.set_nonblocking(true)?;
        let local = l.local_addr()?;
        Ok(TcpListener {
            fd: l.into(),
            local,
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// Accepts one connection (IORING_OP_ACCEPT; accept4 on epoll). Several tasks may accept
    /// on one listener at once: each has its own accept in flight.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        accept_fd(self.fd.as_raw_fd(), None).await
    }

    /// [`accept`](TcpListener::accept) that ends with a [`crate::Cancelled`] error when
    /// `cancel` is signalled.
    pub async fn accept_or_cancel(&self, cancel: &Cond) -> io::Result<(TcpStream, SocketAddr)> {
        accept_fd(self.fd.as_raw_fd(), Some(cancel)).await
    }

    /// Keeps `n` accepts in flight at all times (seed 000's pre-posted AcceptEx): a
    /// connection finds an accept already waiting for it.
    pub fn accept_many(&self, n: usize) -> Acceptor<'_> {
        Acceptor {
            listener: self,
            pending: Vec::new(),
            n: n.max(1),
        }
    }
}

async fn accept_fd(fd: RawFd, cancel: Option<&Cond>) -> io::Result<(TcpStream, SocketAddr)> {
    let op = AcceptOp {
        fd,
        // SAFETY: sockaddr_storage is plain data; all-zero bytes are a valid value.
        addr: unsafe { std::mem::zeroed() },
        len: 0,
    };
    let (r, op) = submit_inner(op, cancel).await;
    let nfd = r? as RawFd;
    let stream = TcpStream {
        // SAFETY: the accept completed successfully (`r?` above), so `nfd` is a new
        // descriptor that nothing else owns.
        fd: unsafe { OwnedFd::from_raw_fd(nfd) },
    };
    let peer = match iolab_sys::sockaddr::from_raw(&op.addr, op.len) {
        Some(a) => a,
        None => stream.peer_addr()?,
    };
    Ok((stream, peer))
}

fd_of_field!(TcpListener);

type AcceptFuture<'a> = Pin<Box<dyn Future<Output = io::Result<(TcpStream, SocketAddr)>> + 'a>>;

/// Several accepts in flight on one listener; see [`TcpListener::accept_many`]. Dropping it
/// cancels the accepts (a connection accepted at that very moment is closed).
pub struct Acceptor<'a> {
    listener: &'a TcpListener,
    pending: Vec<AcceptFuture<'a>>,
    n: usize,
}

impl<'a> Acceptor<'a> {
    /// The next accepted connection.
    pub async fn next(&mut self) -> io::Result<(TcpStream, SocketAddr)> {
        std::future::poll_fn(|cx| {
            while self.pending.len() < self.n {
                let fd = self.listener.fd.as_raw_fd();
                self.pending.push(Box::pin(accept_fd(fd, None)));
            }
            for i in 0..self.pending.len() {
                if let Poll::Ready(r) = self.pending[i].as_mut().poll(cx) {
                    drop(self.pending.swap_remove(i));
                    return Poll::Ready(r);
                }
            }
            Poll::Pending
        })
        .await
    }
}

// ---------------------------------------------------------------- stream

/// A TCP connection. Methods take `&self`, so one task may read while another writes (share
/// it with `Rc`).
#[derive(Debug)]
pub struct TcpStream {
    fd: OwnedFd,
}

impl TcpStream {
    /// Connects (IORING_OP_CONNECT; non-blocking connect + writable wait on epoll).
    pub async fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
        let s = Socket::new(
            Domain::for_address(addr),
            Type::STREAM.nonblocking().cloexec(),
            Some(Protocol::TCP),
        )?;
        let fd: OwnedFd = s.into();
        let op = ConnectOp {
            fd: fd.as_raw_fd(),
            addr: addr.into(),
            started: false,
        };
        let (r, _) = submit_inner(op, None).await;
        r.map_err(|e| io::Error::new(e.kind(), format!("connecting to {addr}: {e}")))?;
        Ok(TcpStream { fd })
    }

    /// Takes over a std stream (made non-blocking).
    pub fn from_std(s: std::net::TcpStream) -> io::Result<TcpStream> {
        s.set_nonblocking(true)?;
        Ok(TcpStream { fd: s.into() })
    }

    /// Reads into `buf[..buf.len()]`; returns how many bytes (0 = end of stream) and the buffer.
    pub async fn read<B: IoBufMut>(&self, buf: B) -> (io::Result<usize>, B) {
        let (r, op) = submit_inner(
            RecvOp {
                fd: self.fd.as_raw_fd(),
                buf,
            },
            None,
        )
        .await;
        (r, op.buf)
    }

    /// Same as [`read`](TcpStream::read).
    pub async fn recv<B: IoBufMut>(&self, buf: B) -> (io::Result<usize>, B) {
        self.read(buf).await
    }

    /// [`read`](TcpStream::read) that ends with a [`crate::Cancelled`] error when `cancel` is
    /// signalled; the buffer comes back once the kernel is done with it.
    pub async fn read_or_cancel<B: IoBufMut>(
        &self,
        buf: B,
        cancel: &Cond,
    ) -> (io::Result<usize>, B) {
        let (r, op) = submit_inner(
            RecvOp {
                fd: self.fd.as_raw_fd(),
                buf,
            },
            Some(cancel),
        )
        .await;
        (r, op.buf)
    }

    /// Writes some of `buf` (one send); returns how many bytes and the buffer.
    pub async fn write<B: IoBuf>(&self, buf: B) -> (io::Result<usize>, B) {
        let (r, op) = submit_inner(
            SendOp {
                fd: self.fd.as_raw_fd(),
                buf,
                pos: 0,
            },
            None,
        )
        .await;
        (r, op.buf)
    }

    /// Same as [`write`](TcpStream::write).
    pub async fn send<B: IoBuf>(&self, buf: B) -> (io::Result<usize>, B) {
        self.write(buf).await
    }

    /// [`write`](TcpStream::write) that ends with a [`crate::Cancelled`] error when `cancel`
    /// is signalled.
    pub async fn write_or_cancel<B: IoBuf>(&self, buf: B, cancel: &Cond) -> (io::Result<usize>, B) {
        let (r, op) = submit_inner(
            SendOp {
                fd: self.fd.as_raw_fd(),
                buf,
                pos: 0,
            },
            Some(cancel),
        )
        .await;
        (r, op.buf)
    }

    /// Writes all of `buf`.
    pub async fn write_all<B: IoBuf>(&self, buf: B) -> (io::Result<()>, B) {
        self.write_all_inner(buf, None).await
    }

    /// [`write_all`](TcpStream::write_all) that ends with a [`crate::Cancelled`] error when
    /// `cancel` is signalled (part of the buffer may have been sent).
    pub async fn write_all_or_cancel<B: IoBuf>(
        &self,
        buf: B,
        cancel: &Cond,
    ) -> (io::Result<()>, B) {
        self.write_all_inner(buf, Some(cancel)).await
    }

    async fn write_all_inner<B: IoBuf>(
        &self,
        buf: B,
        cancel: Option<&Cond>,
    ) -> (io::Result<()>, B) {
        let mut op = SendOp {
            fd: self.fd.as_raw_fd(),
            buf,
            pos: 0,
        };
        while op.pos < op.buf.len() {
            let (r, back) = submit_inner(op, cancel).await;
            op = back;
            match r {
                Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), op.buf),
                Ok(n) => op.pos += n,
                Err(e) => return (Err(e), op.buf),
            }
        }
        (Ok(()), op.buf)
    }

    /// Gathers `bufs` in one sendmsg; returns how many bytes were sent (maybe not all) and
    /// the buffers.
    pub async fn writev<B: IoBuf>(&self, bufs: Vec<B>) -> (io::Result<usize>, Vec<B>) {
        let (r, op) = submit_inner(SendvOp::new(self.fd.as_raw_fd(), bufs), None).await;
        (r, op.bufs)
    }

    /// Shuts down one or both directions.
    pub async fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        submit_inner(
            ShutdownOp {
                fd: self.fd.as_raw_fd(),
                how: shutdown_how(how),
            },
            None,
        )
        .await
        .0
        .map(|_| ())
    }

    /// Closes the socket through the driver (IORING_OP_CLOSE). Dropping also closes it,
    /// synchronously.
    pub async fn close(self) -> io::Result<()> {
        let fd = self.fd.into_raw_fd();
        submit_inner(CloseOp { fd }, None).await.0.map(|_| ())
    }

    /// TCP_NODELAY: send small segments at once instead of waiting (Nagle).
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        SockRef::from(self).set_tcp_nodelay(on)
    }

    pub fn nodelay(&self) -> io::Result<bool> {
        SockRef::from(self).tcp_nodelay()
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        SockRef::from(self)
            .peer_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "peer address is not IP"))
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        SockRef::from(self)
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "local address is not IP"))
    }
}

fd_of_field!(TcpStream);

impl IntoRawFd for TcpStream {
    fn into_raw_fd(self) -> RawFd {
        self.fd.into_raw_fd()
    }
}

impl From<TcpStream> for OwnedFd {
    fn from(s: TcpStream) -> OwnedFd {
        s.fd
    }
}
