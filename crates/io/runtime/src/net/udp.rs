//! UDP on the runtime: one socket, datagrams received and sent with owned buffers
//! (IORING_OP_RECVMSG / IORING_OP_SENDMSG; recvmsg/sendmsg after readiness on epoll).
//!
//! RECVMSG/SENDMSG rather than readiness plus a syscall: the address travels in the same
//! operation as the datagram (a `msghdr` whose `msg_name` is a field of the boxed operation),
//! so a receive costs one ring round trip, as a TCP read does. The operation owns the buffer,
//! the address storage, the iovec and the msghdr: every pointer in the SQE points into the
//! operation record, which the runtime keeps until the kernel's completion (a dropped or
//! cancelled receive gives nothing back, and nothing is freed early).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use io_uring::{opcode, squeue, types};
use iolab_sys::cvt;
use socket2::{Domain, Protocol, Socket, Type};

use crate::buf::{IoBuf, IoBufMut};
use crate::cond::Cond;
use crate::op::{submit_inner, Interest, Operation};

/// The parts of one datagram's `msghdr`: address storage, one iovec, the header itself.
struct MsgParts {
    addr: libc::sockaddr_storage,
    iov: libc::iovec,
    msg: libc::msghdr,
}

impl MsgParts {
    fn new(addr: libc::sockaddr_storage, addr_len: libc::socklen_t) -> MsgParts {
        // SAFETY: iovec and msghdr are plain data; all-zero bytes are valid (empty) values.
        let (iov, mut msg): (libc::iovec, libc::msghdr) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        msg.msg_namelen = addr_len;
        MsgParts { addr, iov, msg }
    }

    /// Points the header at this record's address and iovec, the iovec at `ptr..ptr+len`.
    /// Called where the record stays put (inside the boxed operation) right before use.
    fn fill(&mut self, ptr: *mut u8, len: usize) {
        self.iov.iov_base = ptr as *mut libc::c_void;
        self.iov.iov_len = len;
        self.msg.msg_name = &mut self.addr as *mut _ as *mut libc::c_void;
        self.msg.msg_iov = &mut self.iov;
        self.msg.msg_iovlen = 1;
        self.msg.msg_control = std::ptr::null_mut();
        self.msg.msg_controllen = 0;
        self.msg.msg_flags = 0;
    }
}

struct RecvFromOp<B> {
    fd: RawFd,
    buf: B,
    parts: MsgParts,
}

impl<B: IoBufMut> RecvFromOp<B> {
    fn fill(&mut self) {
        self.parts.msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
        let len = self.buf.len();
        self.parts.fill(self.buf.stable_mut_ptr(), len);
    }
}

// SAFETY: the SQE points at `parts.msg`, whose name and iovec point into `parts` and into
// the buffer (which IoBufMut keeps in place); all are owned by the boxed operation.
unsafe impl<B: IoBufMut> Operation for RecvFromOp<B> {
    fn prepare(&mut self) -> squeue::Entry {
        self.fill();
        opcode::RecvMsg::new(types::Fd(self.fd), &mut self.parts.msg).build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        self.fill();
        // SAFETY: msg describes this record's address storage and a live buffer.
        cvt(unsafe { libc::recvmsg(self.fd, &mut self.parts.msg, 0) }).map(|n| n as usize)
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        Some((self.fd, Interest::Readable))
    }
}

struct SendToOp<B> {
    fd: RawFd,
    buf: B,
    parts: MsgParts,
}

impl<B: IoBuf> SendToOp<B> {
    fn fill(&mut self) {
        let len = self.buf.len();
        // The kernel only reads through the iovec of a send.
        self.parts.fill(self.buf.stable_ptr() as *mut u8, len);
    }

    fn send_now(&mut self, flags: libc::c_int) -> io::Result<usize> {
        self.fill();
        // SAFETY: msg describes this record's address and a live, initialised buffer.
        cvt(unsafe { libc::sendmsg(self.fd, &self.parts.msg, flags) }).map(|n| n as usize)
    }
}

// SAFETY: as RecvFromOp: every pointer of the SQE is into the boxed operation or its buffer.
unsafe impl<B: IoBuf> Operation for SendToOp<B> {
    fn prepare(&mut self) -> squeue::Entry {
        self.fill();
        opcode::SendMsg::new(types::Fd(self.fd), &self.parts.msg)
            .flags(libc::MSG_NOSIGNAL as u32)
            .build()
    }

    fn attempt(&mut self) -> io::Result<usize> {
        self.send_now(libc::MSG_NOSIGNAL)
    }

    fn readiness(&self) -> Option<(RawFd, Interest)> {
        Some((self.fd, Interest::Writable))
    }

    /// A datagram send nearly always finds room in the socket buffer: done inline.
    fn attempt_inline(&mut self) -> Option<io::Result<usize>> {
        Some(self.send_now(libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT))
    }
}

/// A UDP socket. Methods take `&self`: one task may receive while others send (share it
/// with `Rc`).
#[derive(Debug)]
pub struct UdpSocket {
    fd: OwnedFd,
    local: SocketAddr,
}

impl UdpSocket {
    /// Binds a non-blocking socket to `addr` (port 0 picks a free port). Needs no runtime.
    pub fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
        let s = Socket::new(
            Domain::for_address(addr),
            Type::DGRAM.nonblocking().cloexec(),
            Some(Protocol::UDP),
        )?;
        s.bind(&addr.into())
            .map_err(|e| io::Error::new(e.kind(), format!("binding UDP {addr}: {e}")))?;
        let local = s.local_addr()?.as_socket().unwrap_or(addr);
        Ok(UdpSocket {
            fd: s.into(),
            local,
        })
    }

    /// Takes over a std socket (made non-blocking).
    pub fn from_std(s: std::net::UdpSocket) -> io::Result<UdpSocket> {
        s.set_nonblocking(true)?;
        let local = s.local_addr()?;
        Ok(UdpSocket {
            fd: s.into(),
            local,
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// Receives one datagram into `buf[..buf.len()]` (a longer one is truncated); returns
    /// its length and sender, and the buffer.
    pub async fn recv_from<B: IoBufMut>(&self, buf: B) -> (io::Result<(usize, SocketAddr)>, B) {
        self.recv_from_inner(buf, None).await
    }

    /// [`recv_from`](UdpSocket::recv_from) that ends with a [`crate::Cancelled`] error when
    /// `cancel` is signalled; the buffer comes back once the kernel is done with it.
    pub async fn recv_from_or_cancel<B: IoBufMut>(
        &self,
        buf: B,
        cancel: &Cond,
    ) -> (io::Result<(usize, SocketAddr)>, B) {
        self.recv_from_inner(buf, Some(cancel)).await
    }

    async fn recv_from_inner<B: IoBufMut>(
        &self,
        buf: B,
        cancel: Option<&Cond>,
    ) -> (io::Result<(usize, SocketAddr)>, B) {
        let op = RecvFromOp {
            fd: self.fd.as_raw_fd(),
            buf,
            // SAFETY: sockaddr_storage is plain data; all-zero bytes are a valid value.
            parts: MsgParts::new(unsafe { std::mem::zeroed() }, 0),
        };
        let (r, op) = submit_inner(op, cancel).await;
        let r = r.and_then(|n| {
            let from = iolab_sys::sockaddr::from_raw(&op.parts.addr, op.parts.msg.msg_namelen)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "sender is not IP"))?;
            Ok((n, from))
        });
        (r, op.buf)
    }

    /// Sends `buf` as one datagram to `to`; returns the bytes sent and the buffer.
    pub async fn send_to<B: IoBuf>(&self, buf: B, to: SocketAddr) -> (io::Result<usize>, B) {
        let (addr, len) = iolab_sys::sockaddr::to_raw(&to);
        let op = SendToOp {
            fd: self.fd.as_raw_fd(),
            buf,
            parts: MsgParts::new(addr, len),
        };
        let (r, op) = submit_inner(op, None).await;
        (r, op.buf)
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;
    use std::time::Duration;

    use super::UdpSocket;
    use crate::{live_ops, sleep, spawn, Cancelled, Cond, Driver, Runtime};

    fn drivers() -> Vec<Runtime> {
        let mut rts = vec![Runtime::builder().driver(Driver::Epoll).build().unwrap()];
        if let Ok(rt) = Runtime::builder().driver(Driver::Uring).build() {
            rts.push(rt);
        }
        // The -EAGAIN retry path of the ring (poll, then issue) as older kernels take it.
        if let Ok(rt) = Runtime::builder()
            .driver(Driver::Uring)
            .simulate_eagain(true)
            .build()
        {
            rts.push(rt);
        }
        rts
    }

    fn localhost() -> std::net::SocketAddr {
        "127.0.0.1:0".parse().unwrap()
    }

    #[test]
    fn datagrams_carry_their_sender_both_ways() {
        for rt in drivers() {
            rt.block_on(async {
                let a = UdpSocket::bind(localhost()).unwrap();
                let b = Rc::new(UdpSocket::bind(localhost()).unwrap());
                let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
                // A receive waiting before the datagram is sent.
                let b2 = b.clone();
                let rx = spawn(async move { b2.recv_from(vec![0u8; 64]).await });
                sleep(Duration::from_millis(2)).await;
                let (r, _) = a.send_to(b"ping".to_vec(), b_addr).await;
                assert_eq!(r.unwrap(), 4);
                let (r, buf) = rx.await.unwrap();
                let (n, from) = r.unwrap();
                assert_eq!((&buf[..n], from), (&b"ping"[..], a_addr));
                // And back, the datagram already queued when the receive starts.
                let (r, _) = b.send_to(b"pong!".to_vec(), from).await;
                assert_eq!(r.unwrap(), 5);
                let (r, buf) = a.recv_from(vec![0u8; 64]).await;
                let (n, from) = r.unwrap();
                assert_eq!((&buf[..n], from), (&b"pong!"[..], b_addr));
                // A datagram longer than the buffer is cut to it.
                let (r, _) = a.send_to(vec![9u8; 100], b_addr).await;
                assert_eq!(r.unwrap(), 100);
                let (r, buf) = b.recv_from(vec![0u8; 10]).await;
                assert_eq!(r.unwrap().0, 10);
                assert_eq!(buf, vec![9u8; 10]);
                assert_eq!(live_ops(), 0);
            });
        }
    }

    #[test]
    fn cancelled_receive_gives_back_its_buffer() {
        for rt in drivers() {
            rt.block_on(async {
                let s = Rc::new(UdpSocket::bind(localhost()).unwrap());
                let cancel = Cond::new();
                let (s2, c2) = (s.clone(), cancel.clone());
                let rx = spawn(async move { s2.recv_from_or_cancel(vec![7u8; 32], &c2).await });
                sleep(Duration::from_millis(5)).await;
                cancel.broadcast();
                let (r, buf) = rx.await.unwrap();
                let e = r.unwrap_err();
                assert!(Cancelled::is(&e), "got {e}");
                assert_eq!(buf, vec![7u8; 32]);
                // A dropped receive (a timeout) leaves nothing in flight either.
                let t = crate::timeout(Duration::from_millis(5), s.recv_from(vec![0u8; 8])).await;
                assert!(t.is_err());
                sleep(Duration::from_millis(5)).await;
                assert_eq!(live_ops(), 0);
                // The socket still works afterwards.
                let own = s.local_addr().unwrap();
                s.send_to(b"x".to_vec(), own).await.0.unwrap();
                let (r, buf) = s.recv_from(vec![0u8; 8]).await;
                assert_eq!(&buf[..r.unwrap().0], b"x");
            });
        }
    }
}
