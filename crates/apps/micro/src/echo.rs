//! `iolab micro echo` — an echo server in each I/O model under growing client counts
//! (seed 003: the five Winsock models; here their Linux analogues).
//!
//! Models: `threads` (one blocking thread per connection, as the seed's blocking model),
//! `select` (FD_SETSIZE bound: a connection whose fd is ≥ 1024 is refused), `poll`, `epoll`
//! (level-triggered), `io_uring` (accept, recv and send completions) and `iolab-runtime`
//! (one task per connection on one runtime loop: threaded-style code on lightweight tasks),
//! and the same task-per-connection server on the runtimes users would pick instead
//! (`tokio`, `monoio`, `glommio`: [`crate::echo_peers`]). Each server runs in this process, pinned to the
//! first CPU; one client thread pinned to the second CPU holds N connections (10 … 10,000),
//! each continuously sending a message (100 B or 1 KB) and waiting for its echo (one message
//! in flight per connection). Per point: connections held (those that got echoes; a model
//! that cannot hold N stops there and larger N are skipped), messages per second, round trip
//! p50/p99, server CPU (the server threads' run time from /proc/self/task/TID/schedstat over
//! the measured window), messages per CPU-second of the server (messages / that run time) and the growth of the process's RSS (VmRSS) while the server runs.
//! Client sockets are moved to fds ≥ 1024 so that the select server gets the low ones.
//!
//! JSON fields: `"clients"`, `"sizes"`, `"window_ms"`, `"nofile"` (the fd limit in force),
//! `"points"`: `[{model, clients, bytes, held, msgs_per_s, msgs_per_cpu_s, p50_us, p99_us,
//! server_cpu_pct, rss_growth_kib, refused, status}]`, `"max_held"`: {model: most connections held},
//! `"runtime_status"` (the runtime's driver), `"tables"`, `"figures"`.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use iolab_sys::cvt;

use crate::osutil;
use crate::table::{Cell, Figure, Num, Report, Table};

pub(crate) const BUF: usize = 2048;
/// Client sockets are duplicated to fds at or above this, leaving the low ones to servers.
const CLIENT_FD_BASE: RawFd = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    Threads,
    Select,
    Poll,
    Epoll,
    Uring,
    Runtime,
    Tokio,
    Monoio,
    Glommio,
}

/// Every model, in the order of the table.
pub const MODELS: [Model; 9] = [
    Model::Threads,
    Model::Select,
    Model::Poll,
    Model::Epoll,
    Model::Uring,
    Model::Runtime,
    Model::Tokio,
    Model::Monoio,
    Model::Glommio,
];

impl Model {
    pub fn name(self) -> &'static str {
        match self {
            Model::Threads => "threads",
            Model::Select => "select",
            Model::Poll => "poll",
            Model::Epoll => "epoll",
            Model::Uring => "io_uring",
            Model::Runtime => "iolab-runtime",
            Model::Tokio => "tokio",
            Model::Monoio => "monoio",
            Model::Glommio => "glommio",
        }
    }
}

/// Shared between a server and the harness.
#[derive(Default)]
pub(crate) struct Ctl {
    stop: AtomicBool,
    tids: Mutex<Vec<i32>>,
    pub(crate) refused: AtomicU64,
}

impl Ctl {
    fn register(&self) {
        self.tids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(osutil::gettid());
    }
    /// Sum of the run time (ns) of the registered server threads.
    fn cpu_ns(&self) -> u64 {
        let tids = self.tids.lock().unwrap_or_else(|e| e.into_inner()).clone();
        tids.iter()
            .filter_map(|t| std::fs::read_to_string(format!("/proc/self/task/{t}/schedstat")).ok())
            .filter_map(|s| {
                s.split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .sum()
    }
    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

fn read_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for buf.len() bytes.
    cvt(unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) }).map(|n| n as usize)
}

fn write_all_fd(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: buf is valid for buf.len() bytes; MSG_NOSIGNAL avoids SIGPIPE.
        match cvt(unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) }) {
            Ok(n) => buf = &buf[n as usize..],
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                std::thread::yield_now()
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl flag update on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

/// Waits up to `ms` for the listener to be readable (so loops can check `stop`).
fn poll_one(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

fn serve_threads(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    let lfd = l.as_raw_fd();
    set_nonblocking(lfd);
    let mut handles = Vec::new();
    while !ctl.stopped() {
        if !poll_one(lfd, 50) {
            continue;
        }
        while let Ok(c) = osutil::accept(lfd) {
            let ctl2 = ctl.clone();
            let spawned = std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    ctl2.register();
                    let mut buf = [0u8; BUF];
                    let fd = c.as_raw_fd();
                    while let Ok(n @ 1..) = read_fd(fd, &mut buf) {
                        if write_all_fd(fd, &buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            match spawned {
                Ok(h) => handles.push(h),
                // The seed's blocking model fails here first (ERROR_NOT_ENOUGH_MEMORY).
                Err(_) => {
                    ctl.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

fn serve_select(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    let lfd = l.as_raw_fd();
    set_nonblocking(lfd);
    let mut conns: Vec<OwnedFd> = Vec::new();
    let mut buf = [0u8; BUF];
    while !ctl.stopped() {
        let mut set = crate::limits::FdSet::default();
        set.insert(lfd)?;
        let mut maxfd = lfd;
        for c in &conns {
            set.insert(c.as_raw_fd())?;
            maxfd = maxfd.max(c.as_raw_fd());
        }
        let mut tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 50_000,
        };
        // SAFETY: every fd in the set is < FD_SETSIZE (FdSet refuses others).
        let n = unsafe {
            libc::select(
                maxfd + 1,
                set.as_mut_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut tv,
            )
        };
        if n <= 0 {
            continue;
        }
        let mut i = 0;
        while i < conns.len() {
            let fd = conns[i].as_raw_fd();
            if set.contains(fd) {
                match read_fd(fd, &mut buf) {
                    Ok(n @ 1..) if write_all_fd(fd, &buf[..n]).is_ok() => {}
                    _ => {
                        conns.swap_remove(i);
                        continue;
                    }
                }
            }
            i += 1;
        }
        if set.contains(lfd) {
            while let Ok(c) = osutil::accept(lfd) {
                if (c.as_raw_fd() as usize) < libc::FD_SETSIZE {
                    conns.push(c);
                } else {
                    // Cannot be watched by select: refuse it (closing the socket).
                    ctl.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    Ok(())
}

fn serve_poll(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    let lfd = l.as_raw_fd();
    set_nonblocking(lfd);
    let mut fds = vec![libc::pollfd {
        fd: lfd,
        events: libc::POLLIN,
        revents: 0,
    }];
    let mut owned: Vec<Option<OwnedFd>> = vec![None];
    let mut buf = [0u8; BUF];
    while !ctl.stopped() {
        // SAFETY: fds is a valid array of fds.len() pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
        if n <= 0 {
            continue;
        }
        let mut i = 1;
        while i < fds.len() {
            if fds[i].revents != 0 {
                let fd = fds[i].fd;
                match read_fd(fd, &mut buf) {
                    Ok(n @ 1..) if write_all_fd(fd, &buf[..n]).is_ok() => {}
                    _ => {
                        fds.swap_remove(i);
                        owned.swap_remove(i);
                        continue;
                    }
                }
            }
            i += 1;
        }
        if fds[0].revents != 0 {
            while let Ok(c) = osutil::accept(lfd) {
                fds.push(libc::pollfd {
                    fd: c.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                owned.push(Some(c));
            }
        }
    }
    Ok(())
}

/// Watches `fd` for input; its events carry `key`.
fn epoll_add(ep: RawFd, fd: RawFd, key: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: key,
    };
    // SAFETY: valid epoll fd and event struct.
    cvt(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) }).map(drop)
}

fn new_epoll() -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1 returns a new fd we own.
    let ep = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(ep) })
}

fn serve_epoll(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    let lfd = l.as_raw_fd();
    set_nonblocking(lfd);
    let ep = new_epoll().context("epoll_create1")?;
    epoll_add(ep.as_raw_fd(), lfd, lfd as u64)?;
    let mut conns: HashMap<RawFd, OwnedFd> = HashMap::new();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
    let mut buf = [0u8; BUF];
    while !ctl.stopped() {
        // SAFETY: events has room for events.len() entries.
        let n = unsafe {
            libc::epoll_wait(ep.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, 50)
        };
        for ev in events.iter().take(n.max(0) as usize) {
            let fd = ev.u64 as RawFd;
            if fd == lfd {
                while let Ok(c) = osutil::accept(lfd) {
                    if epoll_add(ep.as_raw_fd(), c.as_raw_fd(), c.as_raw_fd() as u64).is_ok() {
                        conns.insert(c.as_raw_fd(), c);
                    }
                }
                continue;
            }
            match read_fd(fd, &mut buf) {
                Ok(n @ 1..) if write_all_fd(fd, &buf[..n]).is_ok() => {}
                // Closing the fd removes it from the epoll set.
                _ => drop(conns.remove(&fd)),
            }
        }
    }
    Ok(())
}

fn serve_uring(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    use io_uring::{opcode, types, IoUring};
    const ACCEPT: u64 = u64::MAX;
    let lfd = l.as_raw_fd();
    // Buffers are declared before the ring so that the ring is dropped (and its operations
    // cancelled) before they are freed; in-flight operations are also drained below.
    let mut bufs: HashMap<RawFd, (OwnedFd, Box<[u8; BUF]>)> = HashMap::new();
    let mut ring = IoUring::builder()
        .setup_cqsize(32768)
        .setup_clamp()
        .build(4096)
        .context("io_uring setup")?;
    let mut in_flight = 0usize;
    let push = |ring: &mut IoUring, e: io_uring::squeue::Entry| -> anyhow::Result<()> {
        // SAFETY: every SQE points into a buffer owned by `bufs`, kept until its completion.
        while unsafe { ring.submission().push(&e) }.is_err() {
            ring.submit().context("io_uring_enter")?;
        }
        Ok(())
    };
    let accept = || {
        opcode::Accept::new(types::Fd(lfd), std::ptr::null_mut(), std::ptr::null_mut())
            .build()
            .user_data(ACCEPT)
    };
    push(&mut ring, accept())?;
    in_flight += 1;
    let ts = types::Timespec::new().nsec(50_000_000);
    while !ctl.stopped() {
        let args = types::SubmitArgs::new().timespec(&ts);
        match ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) => {}
            Err(e) => return Err(e).context("io_uring_enter"),
        }
        let cqes: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (ud, res) in cqes {
            in_flight -= 1;
            if ud == ACCEPT {
                if res >= 0 {
                    // SAFETY: res is a new connection fd from the accept completion.
                    let c = unsafe { OwnedFd::from_raw_fd(res) };
                    let mut b = Box::new([0u8; BUF]);
                    let e = opcode::Recv::new(types::Fd(res), b.as_mut_ptr(), BUF as u32)
                        .build()
                        .user_data(res as u64);
                    bufs.insert(res, (c, b));
                    push(&mut ring, e)?;
                    in_flight += 1;
                }
                push(&mut ring, accept())?;
                in_flight += 1;
                continue;
            }
            // user_data: fd in the low 32 bits, bit 32 set for a send completion.
            let fd = (ud & 0xffff_ffff) as RawFd;
            let is_send = ud >> 32 == 1;
            if res <= 0 {
                bufs.remove(&fd);
                continue;
            }
            let Some((_, b)) = bufs.get_mut(&fd) else {
                continue;
            };
            let e = if is_send {
                opcode::Recv::new(types::Fd(fd), b.as_mut_ptr(), BUF as u32)
                    .build()
                    .user_data(fd as u64)
            } else {
                // Echo what was received; a short send is rare on loopback and ends the
                // connection rather than being resumed.
                opcode::Send::new(types::Fd(fd), b.as_ptr(), res as u32)
                    .flags(libc::MSG_WAITALL)
                    .build()
                    .user_data(1 << 32 | fd as u64)
            };
            push(&mut ring, e)?;
            in_flight += 1;
        }
    }
    // Cancel what is still posted and wait for it, so no buffer is freed under the kernel.
    let _ = push(
        &mut ring,
        opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(u64::MAX - 1),
    );
    let t0 = Instant::now();
    while in_flight > 0 && t0.elapsed() < Duration::from_secs(2) {
        let args = types::SubmitArgs::new().timespec(&ts);
        let _ = ring.submitter().submit_with_args(1, &args);
        for c in ring.completion() {
            if c.user_data() != u64::MAX - 1 {
                in_flight = in_flight.saturating_sub(1);
            }
        }
    }
    drop(ring);
    drop(bufs);
    Ok(())
}

/// One task per connection on one iolab-runtime loop (io_uring driver, or epoll fallback):
/// the threads model's code, on lightweight tasks.
fn serve_runtime(l: TcpListener, ctl: Arc<Ctl>) -> anyhow::Result<()> {
    use iolab_runtime::{net, sleep, spawn, timeout, Runtime};
    let rt = Runtime::new().context("starting an iolab-runtime loop")?;
    rt.block_on(async move {
        let listener = net::TcpListener::from_std(l).context("runtime listener")?;
        while !ctl.stopped() {
            // The timeout lets the loop notice `stop`; dropping the accept cancels it.
            match timeout(Duration::from_millis(50), listener.accept()).await {
                Err(_) => {}
                Ok(Err(_)) => {
                    // Out of fds or memory: the connection is lost, as in the seed.
                    ctl.refused.fetch_add(1, Ordering::Relaxed);
                    sleep(Duration::from_millis(10)).await;
                }
                Ok(Ok((stream, _))) => {
                    spawn(async move {
                        let mut buf = vec![0u8; BUF];
                        loop {
                            let (r, b) = stream.read(buf).await;
                            buf = b;
                            let n = match r {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            buf.truncate(n);
                            let (r, b) = stream.write_all(buf).await;
                            buf = b;
                            if r.is_err() {
                                break;
                            }
                            buf.resize(BUF, 0);
                        }
                    });
                }
            }
        }
        Ok(())
    })
}

/// A running server: its address and controls.
struct Server {
    addr: SocketAddr,
    ctl: Arc<Ctl>,
    join: std::thread::JoinHandle<anyhow::Result<()>>,
}

fn start(model: Model, cpu: usize) -> anyhow::Result<Server> {
    // std's bind sets SO_REUSEADDR; the backlog is raised with a second listen() below.
    let l = TcpListener::bind("127.0.0.1:0").context("binding the echo server")?;
    // SAFETY: listen on our own socket (re-listen only updates the backlog).
    unsafe { libc::listen(l.as_raw_fd(), 4096) };
    let addr = l.local_addr()?;
    let ctl = Arc::new(Ctl::default());
    let c2 = ctl.clone();
    let join = std::thread::Builder::new()
        .name(format!("echo-{}", model.name()))
        .spawn(move || {
            let _ = osutil::pin_to(cpu);
            c2.register();
            match model {
                Model::Threads => serve_threads(l, c2),
                Model::Select => serve_select(l, c2),
                Model::Poll => serve_poll(l, c2),
                Model::Epoll => serve_epoll(l, c2),
                Model::Uring => serve_uring(l, c2),
                Model::Runtime => serve_runtime(l, c2),
                Model::Tokio => crate::echo_peers::serve_tokio(l, c2),
                Model::Monoio => crate::echo_peers::serve_monoio(l, c2),
                Model::Glommio => crate::echo_peers::serve_glommio(l, c2),
            }
        })?;
    Ok(Server { addr, ctl, join })
}

struct Conn {
    fd: OwnedFd,
    sent_at: Instant,
    got: usize,
    echoes: u64,
    alive: bool,
}

fn connect_client(addr: SocketAddr) -> io::Result<OwnedFd> {
    let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
    s.set_nodelay(true)?;
    let fd = s.into_raw_fd();
    // SAFETY: duplicates our own fd to the lowest free fd ≥ CLIENT_FD_BASE.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, CLIENT_FD_BASE) };
    let keep = if high >= 0 {
        // SAFETY: fd is ours and replaced by `high`.
        unsafe { libc::close(fd) };
        high
    } else {
        fd
    };
    set_nonblocking(keep);
    // SAFETY: keep is an fd we own from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(keep) })
}

#[derive(Debug, Clone, Default)]
struct PointResult {
    held: usize,
    msgs_per_s: f64,
    /// Messages per second of server run time (msgs_per_s / (cpu_pct / 100)).
    msgs_per_cpu_s: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_pct: f64,
    rss_growth_kib: i64,
    refused: u64,
    status: String,
}

/// Sends a message on `c`; marks it dead on error.
fn send_msg(c: &mut Conn, msg: &[u8]) {
    c.sent_at = Instant::now();
    c.got = 0;
    if write_all_fd(c.fd.as_raw_fd(), msg).is_err() {
        c.alive = false;
    }
}

/// The client side of a point: connections on one epoll set (an event's key is the
/// connection's index), each keeping one `size`-byte message in flight.
struct Clients {
    ep: OwnedFd,
    conns: Vec<Conn>,
    msg: Vec<u8>,
    events: Vec<libc::epoll_event>,
    scratch: Vec<u8>,
}

impl Clients {
    /// Opens up to `n` connections to `addr` and sends each its first message; the status
    /// says where connecting stopped, if it did (empty otherwise).
    fn connect(addr: SocketAddr, n: usize, size: usize) -> anyhow::Result<(Clients, String)> {
        let mut c = Clients {
            ep: new_epoll().context("epoll_create1")?,
            conns: Vec::with_capacity(n),
            msg: vec![0x42u8; size],
            events: vec![libc::epoll_event { events: 0, u64: 0 }; 1024],
            scratch: vec![0u8; BUF.max(size)],
        };
        let mut status = String::new();
        for _ in 0..n {
            match connect_client(addr) {
                Ok(fd) => {
                    epoll_add(c.ep.as_raw_fd(), fd.as_raw_fd(), c.conns.len() as u64)?;
                    c.conns.push(Conn {
                        fd,
                        sent_at: Instant::now(),
                        got: 0,
                        echoes: 0,
                        alive: true,
                    });
                }
                Err(e) => {
                    status = format!("connect {} failed: {e}", c.conns.len() + 1);
                    break;
                }
            }
        }
        for conn in c.conns.iter_mut() {
            send_msg(conn, &c.msg);
        }
        Ok((c, status))
    }

    /// Reads echoes and sends the next messages until `until`, or, when `warm`, until every
    /// live connection has had its first echo; the round trips go to `rtts`. Returns the
    /// echoes received.
    fn drive(&mut self, until: Instant, mut rtts: Option<&mut Vec<u64>>, warm: bool) -> u64 {
        let size = self.msg.len();
        let mut echoes = 0u64;
        let mut pending = self
            .conns
            .iter()
            .filter(|c| c.alive && c.echoes == 0)
            .count();
        while Instant::now() < until && !(warm && pending == 0) {
            // SAFETY: events has room for events.len() entries.
            let n = unsafe {
                libc::epoll_wait(
                    self.ep.as_raw_fd(),
                    self.events.as_mut_ptr(),
                    self.events.len() as i32,
                    10,
                )
            };
            for ev in self.events.iter().take(n.max(0) as usize) {
                let c = &mut self.conns[ev.u64 as usize];
                if !c.alive {
                    continue;
                }
                match read_fd(c.fd.as_raw_fd(), &mut self.scratch[..size - c.got]) {
                    Ok(0) => c.alive = false,
                    Ok(k) => {
                        c.got += k;
                        if c.got == size {
                            if c.echoes == 0 {
                                pending = pending.saturating_sub(1);
                            }
                            c.echoes += 1;
                            echoes += 1;
                            if let Some(v) = rtts.as_deref_mut() {
                                v.push(c.sent_at.elapsed().as_nanos() as u64);
                            }
                            send_msg(c, &self.msg);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => c.alive = false,
                }
                if !c.alive {
                    pending = pending.saturating_sub(1);
                    // SAFETY: removing our own fd from our epoll set.
                    unsafe {
                        libc::epoll_ctl(
                            self.ep.as_raw_fd(),
                            libc::EPOLL_CTL_DEL,
                            c.fd.as_raw_fd(),
                            std::ptr::null_mut(),
                        )
                    };
                }
            }
        }
        echoes
    }

    /// Connections still echoing.
    fn held(&self) -> usize {
        self.conns
            .iter()
            .filter(|c| c.alive && c.echoes > 0)
            .count()
    }

    /// Closes every connection with a reset rather than a FIN: no TIME_WAIT left behind by
    /// thousands of connections.
    fn reset(self) {
        for c in &self.conns {
            osutil::set_linger_rst(&c.fd);
        }
    }
}

fn run_point(
    model: Model,
    clients: usize,
    size: usize,
    window: Duration,
    warm_max: Duration,
    cpus: (usize, usize),
) -> anyhow::Result<PointResult> {
    let rss0 = osutil::rss_kib() as i64;
    let server = start(model, cpus.0)?;
    let ctl = server.ctl.clone();
    let addr = server.addr;
    let client = std::thread::Builder::new()
        .name("echo-client".into())
        .spawn(move || -> anyhow::Result<PointResult> {
            let _ = osutil::pin_to(cpus.1);
            let (mut c, status) = Clients::connect(addr, clients, size)?;
            let mut r = PointResult {
                status,
                ..Default::default()
            };
            // Warm-up: until every live connection has had one echo (or warm_max).
            c.drive(Instant::now() + warm_max, None, true);
            let mut rtts: Vec<u64> = Vec::new();
            let cpu0 = ctl.cpu_ns();
            let t0 = Instant::now();
            let echoes = c.drive(t0 + window, Some(&mut rtts), false);
            let secs = t0.elapsed().as_secs_f64();
            let cpu1 = ctl.cpu_ns();
            r.rss_growth_kib = osutil::rss_kib() as i64 - rss0;
            r.held = c.held();
            r.msgs_per_s = echoes as f64 / secs;
            let cpu_ns = cpu1.saturating_sub(cpu0);
            r.cpu_pct = 100.0 * cpu_ns as f64 / (secs * 1e9);
            if cpu_ns > 0 {
                r.msgs_per_cpu_s = echoes as f64 / (cpu_ns as f64 / 1e9);
            }
            if let Some(s) = crate::stats::Summary::of(&mut rtts) {
                r.p50_us = s.p50 as f64 / 1000.0;
                r.p99_us = s.p99 as f64 / 1000.0;
            }
            c.reset();
            Ok(r)
        })?;
    let res = client
        .join()
        .map_err(|_| anyhow::anyhow!("echo client panicked"));
    server.ctl.stop.store(true, Ordering::SeqCst);
    let served = server
        .join
        .join()
        .map_err(|_| anyhow::anyhow!("echo server panicked"))?;
    let mut r = res??;
    served.with_context(|| format!("{} server", model.name()))?;
    r.refused = server.ctl.refused.load(Ordering::Relaxed);
    if r.status.is_empty() {
        r.status = if r.held < clients {
            format!("held {} of {clients}", r.held)
        } else {
            "ok".into()
        };
    }
    Ok(r)
}

/// Which driver the iolab-runtime model runs on.
fn runtime_status() -> String {
    match iolab_runtime::driver() {
        Ok(d) => format!("ok ({d:?} driver, one loop)"),
        Err(e) => format!("unavailable: {e}"),
    }
}

/// One (model, clients, message size) point: a row of `"points"` and of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    model: &'static str,
    /// Connections attempted.
    clients: usize,
    bytes: usize,
    /// Connections still echoing at the end; null when the point was skipped.
    held: Option<usize>,
    /// Absent when the point was skipped.
    #[serde(flatten)]
    measured: Option<Measured>,
    status: String,
}

/// What a point that ran measured.
#[derive(Debug, Clone, Serialize)]
struct Measured {
    msgs_per_s: Num,
    msgs_per_cpu_s: Num,
    p50_us: Num,
    p99_us: Num,
    server_cpu_pct: Num,
    rss_growth_kib: i64,
    refused: u64,
}

impl Point {
    fn skipped(model: Model, clients: usize, bytes: usize, status: String) -> Point {
        Point {
            model: model.name(),
            clients,
            bytes,
            held: None,
            measured: None,
            status,
        }
    }

    fn measured(model: Model, clients: usize, bytes: usize, r: PointResult) -> Point {
        Point {
            model: model.name(),
            clients,
            bytes,
            held: Some(r.held),
            measured: Some(Measured {
                msgs_per_s: Num(r.msgs_per_s),
                msgs_per_cpu_s: Num(r.msgs_per_cpu_s),
                p50_us: Num(r.p50_us),
                p99_us: Num(r.p99_us),
                server_cpu_pct: Num(r.cpu_pct),
                rss_growth_kib: r.rss_growth_kib,
                refused: r.refused,
            }),
            status: r.status,
        }
    }

    /// The table's row (RSS growth in MiB).
    fn cells(&self) -> Vec<Cell> {
        let m = self.measured.as_ref();
        vec![
            self.model.into(),
            self.clients.into(),
            self.bytes.into(),
            self.held.into(),
            m.map(|m| m.msgs_per_s).into(),
            m.map(|m| m.msgs_per_cpu_s).into(),
            m.map(|m| m.p50_us).into(),
            m.map(|m| m.p99_us).into(),
            m.map(|m| m.server_cpu_pct).into(),
            m.map(|m| Num(m.rss_growth_kib as f64 / 1024.0)).into(),
            self.status.as_str().into(),
        ]
    }
}

/// The JSON fields of `iolab micro echo` (besides machine, tables and figures).
#[derive(Debug, Clone, Serialize)]
pub struct Fields {
    clients: Vec<usize>,
    sizes: Vec<usize>,
    window_ms: u64,
    /// The fd limit in force.
    nofile: u64,
    points: Vec<Point>,
    /// Most connections each model held.
    max_held: BTreeMap<&'static str, u64>,
    runtime_status: String,
}

/// What a run measures: client counts, message sizes, the measured window per point and
/// the bound on its warm-up.
struct Plan {
    clients: Vec<usize>,
    sizes: Vec<usize>,
    window: Duration,
    warm: Duration,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                clients: vec![10, 1000],
                sizes: vec![100],
                window: Duration::from_millis(500),
                warm: Duration::from_secs(3),
            }
        } else {
            Plan {
                clients: vec![10, 100, 1000, 10_000],
                sizes: vec![100, 1024],
                window: Duration::from_millis(1500),
                warm: Duration::from_secs(8),
            }
        }
    }
}

/// The two figures of one message size: throughput and p99 against clients.
struct SizeFigures {
    throughput: Figure,
    p99: Figure,
}

impl SizeFigures {
    fn new(size: usize) -> SizeFigures {
        let mut throughput = Figure::new(
            format!("Echo throughput, {size}-byte messages"),
            "clients",
            "messages per second",
        );
        throughput.log_x = true;
        let mut p99 = Figure::new(
            format!("Echo round trip p99, {size}-byte messages"),
            "clients",
            "p99 round trip (µs)",
        );
        p99.log_x = true;
        p99.log_y = true;
        SizeFigures { throughput, p99 }
    }
}

/// Every client count of the plan for `model` with `size`-byte messages; the counts past
/// one the model could not hold are skipped.
fn run_model(
    model: Model,
    size: usize,
    plan: &Plan,
    nofile: u64,
    pair: (usize, usize),
    figs: &mut SizeFigures,
) -> Vec<Point> {
    let mut points = Vec::new();
    let mut failed_at: Option<usize> = None;
    for &asked in &plan.clients {
        if let Some(prev) = failed_at {
            let status = format!("skipped: could not hold {prev}");
            points.push(Point::skipped(model, asked, size, status));
            continue;
        }
        // Client and server ends both live in this process: 2 fds per connection.
        // Past the fd limit, run the largest count that fits and say so.
        let fit = (nofile.saturating_sub(256) / 2) as usize;
        let n = asked.min(fit);
        let mut r = run_point(model, n, size, plan.window, plan.warm, pair).unwrap_or_else(|e| {
            PointResult {
                status: format!("failed: {e:#}"),
                ..Default::default()
            }
        });
        tracing::debug!("echo {} {n} {size}: {r:?}", model.name());
        if n < asked && r.status == "ok" {
            r.status =
                format!("ok; {n} clients, not {asked}: ulimit -n {nofile} (2 fds per connection)");
        }
        if r.held < n {
            failed_at = Some(asked);
        }
        if r.held > 0 {
            figs.throughput.point(model.name(), n as f64, r.msgs_per_s);
            figs.p99.point(model.name(), n as f64, r.p99_us);
        }
        points.push(Point::measured(model, n, size, r));
    }
    points
}

pub fn run(opts: &crate::Opts) -> anyhow::Result<Report<Fields>> {
    let machine = crate::machine::Machine::collect();
    let nofile = osutil::raise_nofile(65536);
    let cpus = osutil::allowed_cpus();
    let pair = (cpus[0], *cpus.get(1).unwrap_or(&cpus[0]));
    let plan = Plan::new(opts.quick);
    let mut points = Vec::new();
    let mut figures: Vec<Figure> = Vec::new();
    for &size in &plan.sizes {
        let mut figs = SizeFigures::new(size);
        for model in MODELS {
            points.extend(run_model(model, size, &plan, nofile, pair, &mut figs));
        }
        figures.push(figs.throughput);
        figures.push(figs.p99);
    }
    let mut max_held: BTreeMap<&'static str, u64> = BTreeMap::new();
    for p in &points {
        if let Some(held) = p.held {
            let most = max_held.entry(p.model).or_insert(0);
            *most = (*most).max(held as u64);
        }
    }
    let rt = runtime_status();
    let mut table = Table::new(
        "Echo server by I/O model (seed 003)",
        &[
            "model",
            "clients",
            "bytes",
            "held",
            "msgs/s",
            "msgs per CPU-s",
            "p50 µs",
            "p99 µs",
            "server CPU %",
            "RSS growth MiB",
            "status",
        ],
    );
    for p in &points {
        table.row(p.cells());
    }
    let table = table.with_note(format!(
        "Server pinned to CPU {}, one client thread pinned to CPU {}; each connection keeps one message in flight; {} ms measured after a warm-up in which every connection gets one echo. \
         clients = connections attempted (capped so that 2 per connection fit under ulimit -n); held = connections still echoing at the end (select refuses fds ≥ FD_SETSIZE = 1024; a model that cannot hold N is not tried with more). \
         iolab-runtime: {rt}. server CPU % = run time of the server's threads (schedstat) / window; msgs per CPU-s = messages / that run time; tokio: current-thread runtime; monoio: io_uring driver, 32768-entry ring; glommio: LocalExecutor defaults; RSS growth = VmRSS of the process during the point minus before (includes the client's small per-connection state, the same for every model). ulimit -n in force: {nofile}.",
        pair.0, pair.1, plan.window.as_millis()
    ));
    table.print();
    Ok(Report {
        machine,
        fields: Fields {
            window_ms: plan.window.as_millis() as u64,
            clients: plan.clients,
            sizes: plan.sizes,
            nofile,
            points,
            max_held,
            runtime_status: rt,
        },
        tables: vec![table],
        figures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(p: &Point) -> Vec<String> {
        let v = serde_json::to_value(p).unwrap();
        v.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn a_skipped_point_has_no_figures_and_a_null_held() {
        let p = Point::skipped(
            Model::Select,
            1000,
            100,
            "skipped: could not hold 100".into(),
        );
        assert_eq!(keys(&p), ["bytes", "clients", "held", "model", "status"]);
        let v = serde_json::to_value(&p).unwrap();
        assert!(v["held"].is_null());
        assert_eq!(v["model"], "select");
        let cells = p.cells();
        assert_eq!(cells.len(), 11);
        assert_eq!(cells[3..10], vec![Cell::Empty; 7]);
        let failed = PointResult {
            status: "failed: x".into(),
            ..Default::default()
        };
        let p = Point::measured(Model::Uring, 10, 100, failed);
        assert_eq!(
            keys(&p),
            [
                "bytes",
                "clients",
                "held",
                "model",
                "msgs_per_cpu_s",
                "msgs_per_s",
                "p50_us",
                "p99_us",
                "refused",
                "rss_growth_kib",
                "server_cpu_pct",
                "status"
            ]
        );
        assert_eq!(serde_json::to_value(&p).unwrap()["held"], 0);
    }

    #[test]
    fn every_model_echoes() {
        let cpus = osutil::allowed_cpus();
        let pair = (cpus[0], *cpus.get(1).unwrap_or(&cpus[0]));
        for model in MODELS {
            let r = run_point(
                model,
                4,
                100,
                Duration::from_millis(100),
                Duration::from_secs(5),
                pair,
            );
            match r {
                Ok(r) => {
                    assert_eq!(r.held, 4, "{}: {r:?}", model.name());
                    assert!(
                        r.msgs_per_s > 0.0 && r.p99_us > 0.0 && r.msgs_per_cpu_s > r.msgs_per_s,
                        "{}: {r:?}",
                        model.name()
                    );
                }
                Err(e) if model == Model::Uring && format!("{e:#}").contains("io_uring setup") => {}
                Err(e) => panic!("{}: {e:#}", model.name()),
            }
        }
    }
}
