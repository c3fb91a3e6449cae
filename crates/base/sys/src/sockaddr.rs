//! `std::net::SocketAddr` to and from the kernel's `sockaddr_storage`, for the places that call
//! `connect`, `accept`, `bind` or `getsockname` themselves (raw syscalls, io_uring).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// The kernel's form of `addr`, and the length to pass with it.
pub fn to_raw(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero bytes are a valid (unspecified) value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than sockaddr_in and aligned for every
            // sockaddr type (that is its purpose); the borrow of `storage` is exclusive.
            let sin = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// The address the kernel wrote into `storage` (`len` bytes of it), or `None` for a family
/// other than IPv4/IPv6 or a length too short for its family.
pub fn from_raw(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    match storage.ss_family as libc::c_int {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family and the length say the storage holds a sockaddr_in, and
            // sockaddr_storage is aligned for every sockaddr type.
            let a = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// The address the socket `fd` is bound to (`getsockname(2)`).
pub fn local_addr(fd: std::os::fd::RawFd) -> std::io::Result<SocketAddr> {
    // SAFETY: all-zero bytes are a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: storage and len describe a writable buffer large enough for any address; the
    // kernel writes at most len bytes and stores the real length in len.
    crate::cvt(unsafe {
        libc::getsockname(fd, &mut storage as *mut _ as *mut libc::sockaddr, &mut len)
    })?;
    from_raw(&storage, len).ok_or_else(|| {
        std::io::Error::other(format!(
            "getsockname: unexpected address family {}",
            storage.ss_family
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_matches_the_kernel_layout() {
        for s in ["127.0.0.1:8080", "10.1.2.3:1", "[::1]:443", "[fe80::1%2]:9"] {
            let a: SocketAddr = s.parse().unwrap();
            let (st, len) = to_raw(&a);
            assert_eq!(from_raw(&st, len), Some(a), "{s}");
            assert_eq!(from_raw(&st, len - 1), None, "{s}: short length");
        }
        let (st, len) = to_raw(&"127.0.0.1:8080".parse().unwrap());
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in>());
        // SAFETY: to_raw wrote a sockaddr_in into the storage.
        let sin = unsafe { &*(&st as *const _ as *const libc::sockaddr_in) };
        assert_eq!(sin.sin_port, 8080u16.to_be());
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [127, 0, 0, 1]);
        // SAFETY: all-zero bytes are a valid sockaddr_storage (family AF_UNSPEC).
        let zero: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        assert_eq!(from_raw(&zero, 128), None);
    }

    /// The kernel agrees: bind to port 0, read the address back with getsockname.
    #[test]
    fn reads_what_the_kernel_writes() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        use std::os::fd::AsRawFd as _;
        assert_eq!(local_addr(l.as_raw_fd()).unwrap(), l.local_addr().unwrap());
        let l6 = match std::net::TcpListener::bind("[::1]:0") {
            Ok(l) => l,
            Err(_) => return, // no IPv6 loopback on this machine
        };
        assert_eq!(
            local_addr(l6.as_raw_fd()).unwrap(),
            l6.local_addr().unwrap()
        );
        assert!(local_addr(-1).is_err());
    }
}
