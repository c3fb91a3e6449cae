//! Connections from this process to buffer agents: FETCH (any tier) and ALLOC (the tier that
//! runs an agent, e.g. the BE). Blocking sockets with timeouts, raw system calls only, no
//! allocation on the fetch path: the SIGSEGV handler fetches through here.
//!
//! Invariant: a connection whose request failed or timed out is closed at once (a late reply
//! would be read as the answer to the next request); the next use reconnects.

use crate::sys;
use iolab_odb::proto::*;
use libc::c_int;
use std::net::SocketAddrV4;

pub const MAX_AGENTS: usize = 16;

#[derive(Clone, Copy)]
pub struct Conn {
    pub addr: SocketAddrV4,
    fd: c_int,
    /// The pid that opened `fd` (a forked child must not share its parent's stream).
    pid: i32,
    pub agent_id: u64,
}

pub struct Conns {
    slots: [Option<Conn>; MAX_AGENTS],
}

pub fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(a.ip().octets()),
        },
        sin_zero: [0; 8],
    }
}

fn set_timeout(fd: c_int, ms: i64) {
    let tv = libc::timeval {
        tv_sec: ms / 1000,
        tv_usec: (ms % 1000) * 1000,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        let _ = sys::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
    }
}

/// Connects and says HELLO. Returns the fd and the HELLO reply (the arena path is read into
/// `path` if given, else skipped).
pub fn open(
    addr: SocketAddrV4,
    timeout_ms: i64,
    path: Option<&mut Vec<u8>>,
) -> Result<(c_int, Hello), c_int> {
    let fd = sys::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0)? as c_int;
    set_timeout(fd, timeout_ms);
    let one: c_int = 1;
    let _ = sys::setsockopt(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_NODELAY,
        (&one as *const c_int).cast(),
        4,
    );
    let sa = sockaddr(addr);
    let r = (|| {
        sys::connect(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as u32,
        )?;
        sys::send_all_blocking(fd, &[OP_HELLO])?;
        let mut h = [0u8; HELLO_REP_FIXED];
        sys::recv_exact(fd, h.as_mut_ptr(), h.len())?;
        let hello = parse_hello(&h).ok_or(libc::EPROTO)?;
        let mut p = [0u8; 512];
        let n = hello.path_len as usize;
        if n > p.len() {
            return Err(libc::EPROTO);
        }
        sys::recv_exact(fd, p.as_mut_ptr(), n)?;
        if let Some(path) = path {
            path.clear();
            path.extend_from_slice(&p[..n]);
        }
        Ok(hello)
    })();
    match r {
        Ok(h) => Ok((fd, h)),
        Err(e) => {
            let _ = sys::close(fd);
            Err(e)
        }
    }
}

impl Conns {
    pub const fn new() -> Conns {
        Conns {
            slots: [None; MAX_AGENTS],
        }
    }

    fn get(&mut self, addr: SocketAddrV4) -> Result<usize, c_int> {
        let pid = sys::pid();
        let mut free = None;
        for (i, s) in self.slots.iter_mut().enumerate() {
            match s {
                Some(c) if c.addr == addr && c.pid == pid => return Ok(i),
                Some(c) if c.addr == addr => {
                    // inherited across fork: not ours to use (the parent may still read it)
                    *s = None;
                    free.get_or_insert(i);
                }
                None => {
                    free.get_or_insert(i);
                }
                _ => {}
            }
        }
        let i = free.ok_or(libc::ENOBUFS)?;
        let (fd, hello) = open(addr, 2000, None)?;
        self.slots[i] = Some(Conn {
            addr,
            fd,
            pid,
            agent_id: hello.agent_id,
        });
        Ok(i)
    }

    fn drop_slot(&mut self, i: usize) {
        if let Some(c) = self.slots[i].take() {
            let _ = sys::close(c.fd);
        }
    }

    /// Fetches several references of one agent with one request write (pipelined): each
    /// reply is read straight into its destination. Any failure drops the connection (the
    /// stream may hold replies we did not read) and fails the whole batch.
    pub fn fetch_many(&mut self, jobs: &[(Ref, *mut u8)]) -> Result<(), c_int> {
        match jobs {
            [] => return Ok(()),
            [(r, d)] => return self.fetch(r, *d),
            _ => {}
        }
        let agent = jobs[0].0.agent;
        if jobs
            .iter()
            .any(|(r, _)| r.agent != agent || r.agent_id != jobs[0].0.agent_id)
            || jobs.len() > 8
        {
            for (r, d) in jobs {
                self.fetch(r, *d)?;
            }
            return Ok(());
        }
        let mut last = libc::EIO;
        // one retry on a fresh connection, as `fetch` does: the cached one may have been
        // closed by the agent (replies half read into the destinations are simply read again)
        for _ in 0..2 {
            let i = self.get(agent)?;
            let c = self.slots[i].unwrap();
            if c.agent_id != jobs[0].0.agent_id {
                // not this agent: the one-by-one path reconnects and decides
                for (r, d) in jobs {
                    self.fetch(r, *d)?;
                }
                return Ok(());
            }
            let res = (|| {
                let mut req = [0u8; FETCH_REQ * 8];
                for (k, (r, _)) in jobs.iter().enumerate() {
                    req[k * FETCH_REQ..(k + 1) * FETCH_REQ]
                        .copy_from_slice(&fetch_request(r.buf_id, r.offset, r.len));
                }
                sys::send_all_blocking(c.fd, &req[..jobs.len() * FETCH_REQ])?;
                for (r, d) in jobs {
                    match sys::recv_status_and(c.fd, ST_OK, *d, r.len as usize)? {
                        ST_OK => {}
                        ST_DELIVERED => return Err(libc::EALREADY),
                        _ => return Err(libc::ESTALE),
                    }
                }
                Ok(())
            })();
            match res {
                Ok(()) => {
                    crate::stats::FETCHES
                        .fetch_add(jobs.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    crate::stats::FETCH_BYTES.fetch_add(
                        jobs.iter().map(|(r, _)| r.len as u64).sum(),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    return Ok(());
                }
                Err(e) => {
                    // the stream may hold replies we did not read: never reuse it
                    self.drop_slot(i);
                    crate::stats::FETCH_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if matches!(e, libc::ESTALE | libc::EALREADY) {
                        return Err(e);
                    }
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// Fetches `r` into `dst` (which must be writable for `r.len` bytes).
    pub fn fetch(&mut self, r: &Ref, dst: *mut u8) -> Result<(), c_int> {
        let mut last = libc::EIO;
        // one retry on a fresh connection: the cached one may have been closed by the agent
        for _ in 0..2 {
            let i = self.get(r.agent)?;
            let c = self.slots[i].unwrap();
            if c.agent_id != r.agent_id {
                // a connection to an earlier (or later) agent at this address: try a fresh
                // one; if that is still another agent, the buffer is gone
                self.drop_slot(i);
                last = libc::ESTALE;
                continue;
            }
            let res = (|| {
                sys::send_all_blocking(c.fd, &fetch_request(r.buf_id, r.offset, r.len))?;
                match sys::recv_status_and(c.fd, ST_OK, dst, r.len as usize)? {
                    ST_OK => Ok(()),
                    ST_DELIVERED => Err(libc::EALREADY),
                    _ => Err(libc::ESTALE),
                }
            })();
            match res {
                Ok(()) => {
                    crate::stats::FETCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    crate::stats::FETCH_BYTES
                        .fetch_add(r.len as u64, std::sync::atomic::Ordering::Relaxed);
                    return Ok(());
                }
                Err(e @ (libc::ESTALE | libc::EALREADY)) => {
                    crate::stats::FETCH_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Err(e);
                }
                Err(e) => {
                    self.drop_slot(i);
                    last = e;
                }
            }
        }
        crate::stats::FETCH_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Err(last)
    }
}

/// Arena space the agent leased to this process (see `proto`'s LEASE): buffers are cut
/// from it here, no round trip each.
#[derive(Clone, Copy)]
struct Lease {
    no: u32,
    key: [u8; 16],
    /// Arena offset of the lease.
    base: u64,
    size: u32,
    used: u32,
    /// No buffer is cut from it from this instant on (ms since boot).
    until_ms: u64,
}

/// Size of a lease: ~16 responses of 64 KiB per round trip to the agent, and an unused tail
/// of at most this much per process (released at the next lease).
const LEASE_BYTES: u32 = 1 << 20;

/// The local agent this process stores into (sender side): connection + mapped arena.
pub struct Store {
    pub addr: SocketAddrV4,
    fd: c_int,
    pid: i32,
    pub hello: Option<Hello>,
    arena: *mut u8,
    arena_size: u64,
    /// After a failure, no attempt before this instant (ms since boot): a down agent costs
    /// one failed connect per second, not one per write.
    retry_after_ms: u64,
    lease: Option<Lease>,
    /// Files registered at the agent (FILE), most recent ones; refused ones too, so that a
    /// file the agent will not serve costs one round trip, not one per response.
    files: [Option<FileSlot>; FILE_SLOTS],
    next_file: usize,
}

/// A file as the agent knows it: its number and key, or None when it refused it (outside
/// its `--files` roots, or changed): its ranges are then copied into the arena.
#[derive(Clone, Copy)]
struct FileSlot {
    ident: FileIdent,
    served: Option<(u32, [u8; 16])>,
}

/// Files remembered per process (nginx opens a file per request: the cache is what makes a
/// registration once per file, not once per response).
const FILE_SLOTS: usize = 64;

/// The identity of a regular file (`fstat`), or None.
fn file_ident(fd: c_int) -> Option<FileIdent> {
    // SAFETY: stat is plain old data; all-zero is a valid value, overwritten by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    sys::fstat(fd, &mut st).ok()?;
    (st.st_mode & libc::S_IFMT == libc::S_IFREG).then_some(FileIdent {
        dev: st.st_dev,
        ino: st.st_ino,
        size: st.st_size as u64,
        mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
    })
}

// SAFETY: the arena pointer is only used under the library's global lock.
unsafe impl Send for Store {}

fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

impl Store {
    pub fn new(addr: SocketAddrV4) -> Store {
        Store {
            addr,
            fd: -1,
            pid: 0,
            hello: None,
            arena: std::ptr::null_mut(),
            arena_size: 0,
            retry_after_ms: 0,
            lease: None,
            files: [None; FILE_SLOTS],
            next_file: 0,
        }
    }

    fn reset(&mut self, backoff: bool) {
        if self.fd >= 0 && self.pid == unsafe_getpid() {
            let _ = sys::close(self.fd);
        }
        if !self.arena.is_null() {
            // SAFETY: the mapping made in `connect`, of arena_size bytes and the header.
            unsafe { libc::munmap(self.arena.cast(), (self.arena_size + ARENA_HEADER) as usize) };
        }
        self.fd = -1;
        self.hello = None;
        self.arena = std::ptr::null_mut();
        self.lease = None;
        self.files = [None; FILE_SLOTS];
        if backoff {
            self.retry_after_ms = now_ms() + 1000;
        }
    }

    fn connect(&mut self) -> Result<(), c_int> {
        if self.fd >= 0 && self.pid == unsafe_getpid() {
            return Ok(());
        }
        if self.fd >= 0 {
            // inherited from the parent: forget it without closing the parent's stream
            // (and its lease: the parent cuts buffers from it)
            self.fd = -1;
            self.arena = std::ptr::null_mut();
            self.lease = None;
        }
        if now_ms() < self.retry_after_ms {
            return Err(libc::EAGAIN);
        }
        let mut path = Vec::new();
        let (fd, hello) = open(self.addr, 200, Some(&mut path))
            .inspect_err(|_| self.retry_after_ms = now_ms() + 1000)?;
        self.fd = fd;
        self.pid = unsafe_getpid();
        path.push(0);
        // SAFETY: path is NUL-terminated; we open the agent's arena file and map it shared
        // for its advertised size (the agent sized it before answering HELLO).
        let arena = unsafe {
            let afd = libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC);
            if afd < 0 {
                self.reset(true);
                return Err(libc::EIO);
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                (hello.arena_size + ARENA_HEADER) as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                afd,
                0,
            );
            let _ = sys::close(afd);
            p
        };
        if arena == libc::MAP_FAILED {
            self.reset(true);
            return Err(libc::EIO);
        }
        self.arena = arena.cast();
        self.arena_size = hello.arena_size;
        self.hello = Some(hello);
        Ok(())
    }

    /// Reserves `len` bytes; returns (arena pointer, reference). The caller fills the bytes
    /// before sending the reference anywhere. Cut from this process's lease; a new lease
    /// (one round trip, releasing the old one) when it is used up or too old.
    pub fn alloc(&mut self, len: u32) -> Result<(*mut u8, Ref), c_int> {
        self.connect()?;
        if len == 0 || len > MAX_LEASE {
            return Err(libc::ENOSPC);
        }
        if self.draining() {
            // the agent stops: release the lease (so its drain need not wait for it) and copy
            if self.lease.is_some() {
                let _ = self.new_lease(0, now_ms());
            }
            return Err(libc::ENOSPC);
        }
        let now = now_ms();
        let fits = |l: &Lease| l.size - l.used >= len && now < l.until_ms;
        if !self.lease.as_ref().is_some_and(fits) {
            self.new_lease(len.max(LEASE_BYTES), now)?;
            if !self.lease.as_ref().is_some_and(fits) {
                return Err(libc::ENOSPC); // larger than the arena
            }
        }
        let h = self.hello.unwrap();
        let l = self.lease.as_mut().expect("a lease");
        let off = l.used;
        // 64-byte steps: each buffer starts on its own cache line
        l.used = (off + len).next_multiple_of(64).min(l.size);
        let id = lease_buf_id(l.no, off, len, &l.key);
        // SAFETY: base + off + len <= base + size, inside the arena (checked in new_lease).
        let p = unsafe { self.arena.add((l.base + off as u64) as usize) };
        Ok((
            p,
            Ref {
                len,
                agent_id: h.agent_id,
                agent: h.addr,
                offset: 0,
                buf_id: id,
            },
        ))
    }

    /// A reference to `len` bytes of the file open as `fd` from `start`, which the agent
    /// will answer with `sendfile` (FILE: one round trip the first time this process sends
    /// the file, none after). Err: not a regular file, beyond what an id can name, or a
    /// file the agent does not serve: the caller copies the bytes into the arena instead.
    pub fn file_ref(&mut self, fd: c_int, start: u64, len: u32) -> Result<Ref, c_int> {
        self.connect()?;
        if len == 0 || len > MAX_LEASE || start > MAX_FILE_START || self.draining() {
            return Err(libc::ENOSPC);
        }
        let ident = file_ident(fd).ok_or(libc::EINVAL)?;
        if start + len as u64 > ident.size {
            return Err(libc::EINVAL);
        }
        let known = self
            .files
            .iter()
            .flatten()
            .find(|f| f.ident == ident)
            .copied();
        let slot = match known {
            Some(s) => s,
            None => self.register_file(fd, ident)?,
        };
        let (no, key) = slot.served.ok_or(libc::ENOENT)?;
        let h = self.hello.expect("connected");
        Ok(Ref {
            len,
            agent_id: h.agent_id,
            agent: h.addr,
            offset: 0,
            buf_id: file_buf_id(no, start, len, &key),
        })
    }

    /// FILE for the file open as `fd` (its path read from /proc: nginx has closed nothing
    /// yet, the call is under way); the answer is remembered either way.
    fn register_file(&mut self, fd: c_int, ident: FileIdent) -> Result<FileSlot, c_int> {
        let link = format!("/proc/self/fd/{fd}\0");
        let mut path = [0u8; MAX_FILE_PATH];
        let n = sys::readlink(link.as_ptr().cast(), path.as_mut_ptr().cast(), path.len())?;
        let mut req = [0u8; FILE_REQ_FIXED + MAX_FILE_PATH];
        let m = file_request(&ident, &path[..n.min(path.len())], &mut req)
            .filter(|_| n < path.len())
            .ok_or(libc::ENAMETOOLONG)?;
        let res = (|| -> Result<[u8; FILE_REP], c_int> {
            sys::send_all_blocking(self.fd, &req[..m])?;
            let mut b = [0u8; FILE_REP];
            sys::recv_exact(self.fd, b.as_mut_ptr(), b.len())?;
            Ok(b)
        })();
        let b = res.inspect_err(|_| self.reset(true))?;
        let served = (b[0] == ST_OK).then(|| {
            let no = u32::from_le_bytes(b[1..5].try_into().unwrap());
            (no % FILE_NOS, b[5..21].try_into().unwrap())
        });
        let slot = FileSlot { ident, served };
        self.files[self.next_file] = Some(slot);
        self.next_file = (self.next_file + 1) % FILE_SLOTS;
        Ok(slot)
    }

    /// Whether the agent drains (the arena header's flag).
    fn draining(&self) -> bool {
        // SAFETY: the header's first byte, inside our mapping of the arena and its header,
        // written by the agent atomically.
        let flag = unsafe {
            std::sync::atomic::AtomicU8::from_ptr(self.arena.add(self.arena_size as usize))
        };
        flag.load(std::sync::atomic::Ordering::Relaxed) != 0
    }

    /// Asks for a lease of `size` bytes (0: none, a release only), releasing the current one.
    fn new_lease(&mut self, size: u32, now: u64) -> Result<(), c_int> {
        let size = size
            .min(MAX_LEASE)
            .min(self.arena_size.min(u32::MAX as u64) as u32);
        let (rel_no, rel_used) = self.lease.map_or((NO_LEASE, 0), |l| (l.no, l.used));
        self.lease = None;
        let res = (|| {
            sys::send_all_blocking(self.fd, &lease_request(size, rel_no, rel_used))?;
            let mut b = [0u8; LEASE_REP];
            sys::recv_exact(self.fd, b.as_mut_ptr(), b.len())?;
            Ok(b)
        })();
        let b = match res {
            Ok(b) => b,
            Err(e) => {
                self.reset(true);
                return Err(e);
            }
        };
        if b[0] != ST_OK {
            return Err(libc::ENOSPC); // full or draining: copy this one
        }
        let base = u64::from_le_bytes(b[1..9].try_into().unwrap());
        let no = u32::from_le_bytes(b[9..13].try_into().unwrap());
        let valid_ms = u32::from_le_bytes(b[29..33].try_into().unwrap());
        if base + size as u64 > self.arena_size || no >= LEASE_NOS {
            self.reset(true);
            return Err(libc::EPROTO);
        }
        self.lease = Some(Lease {
            no,
            key: b[13..29].try_into().unwrap(),
            base,
            size,
            used: 0,
            // `now` was taken before asking: the agent's clock for the lease started later
            until_ms: now + valid_ms as u64,
        });
        Ok(())
    }
}

fn unsafe_getpid() -> i32 {
    sys::pid()
}
