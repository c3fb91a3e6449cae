//! Plumbing shared by the four io_uring models (`uring-accept-sync`, `uring`, `uring-fixed`,
//! `uring-callback`): listening sockets, ring creation, the connection limit shared by the
//! worker threads, the scatter list for a response, the entries every model builds alike
//! (accept, its cancel, the stop's poll, a file read) and the counters. A connection's state
//! machine is [`crate::uring_conn`]'s; the event loop of the models that find a connection by
//! its key in `user_data` is [`crate::uring_worker`]'s.
//!
//! Nothing here decides how a model accepts, stores its connections or dispatches its
//! completions: that is what the models differ in, and each module keeps it in view.
//!
//! Deadlines (all four models): each ring keeps one periodic `IORING_OP_TIMEOUT` (a "tick",
//! [`tick_period`]); on each tick the worker looks at every open connection's deadline
//! (`iolab_http::Deadline`, updated at each completed receive, send and file read: the
//! request head's, counted from its first byte; a send's, from its last progress; the idle
//! one between requests) and `shutdown(2)`s the sockets past it. The shutdown makes the
//! connection's pending receive (or send) complete at once, so the connection leaves through
//! its ordinary close path and the timeout costs nothing on the I/O path (no linked timeout
//! per operation). A connection is therefore closed between its deadline and deadline +
//! tick; a timeout of zero means none for that phase.
//!
//! Shutdown (all four models): each ring keeps a `POLL_ADD` on the shutdown eventfd. When it
//! completes the worker cancels its accepts, shuts every open socket down, and keeps reaping
//! completions until no operation is in flight — only then are buffers freed and the ring
//! dropped, because the kernel may write into a buffer until the operation's completion.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use iolab_sys::cvt;

use crate::stats::ErrorKind;
use crate::{Ctx, Shutdown};

/// Submission queue size of each ring; the completion queue is four times as large so that
/// a burst of completions (one per connection) rarely overflows it (and when it does, the
/// kernel keeps the overflow: IORING_FEAT_NODROP).
pub const RING_ENTRIES: u32 = 1024;

/// Accepts kept in flight on each worker's listener by the models that accept on the ring,
/// as iocp2 kept `AcceptEx` calls posted.
pub const ACCEPTS_AHEAD: usize = 16;

/// Resolves `workers` (0 = one per core).
pub fn worker_count(workers: usize) -> usize {
    if workers > 0 {
        workers
    } else {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    }
}

/// A TCP socket bound to `addr`, not listening yet (see [`start_listening`]), with
/// SO_REUSEADDR (restart without waiting for TIME_WAIT, seed 000 annex E.1) and SO_REUSEPORT
/// when several rings each own a listener (the kernel then spreads connections over them).
pub fn bind(addr: SocketAddr, reuseport: bool, nonblocking: bool) -> io::Result<OwnedFd> {
    let domain = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    let mut ty = libc::SOCK_STREAM | libc::SOCK_CLOEXEC;
    if nonblocking {
        ty |= libc::SOCK_NONBLOCK;
    }
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = cvt(unsafe { libc::socket(domain, ty, 0) })?;
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    if reuseport {
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    }
    // Accepted sockets inherit TCP_NODELAY from the listener (no setsockopt per connection):
    // a response goes out in one sendmsg, Nagle would only delay the tail of pipelined answers.
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)?;
    let (storage, len) = iolab_sys::sockaddr::to_raw(&addr);
    // SAFETY: storage holds a valid sockaddr of `len` bytes for this address family.
    cvt(unsafe { libc::bind(fd, &storage as *const _ as *const libc::sockaddr, len) })
        .map_err(|e| io::Error::new(e.kind(), format!("cannot bind {addr}: {e}")))?;
    Ok(sock)
}

/// Starts taking connections on a bound socket, with the configured backlog.
///
/// The models bind in `run` (an address in use fails at once) but call this only once every
/// worker's ring is ready: the port then takes connections only when the server can serve
/// them, and all of a running server's descriptors exist by the time it does.
pub fn start_listening(sock: &OwnedFd, backlog: u32) -> io::Result<()> {
    let backlog = backlog.min(i32::MAX as u32) as i32;
    // SAFETY: listen(2) on our own socket.
    cvt(unsafe { libc::listen(sock.as_raw_fd(), backlog) }).map_err(|e| {
        let at = local_addr(sock.as_raw_fd())
            .map(|a| a.to_string())
            .unwrap_or_default();
        io::Error::new(e.kind(), format!("cannot listen on {at}: {e}"))
    })?;
    Ok(())
}

/// The listening sockets of a model with one ring per worker, bound but not listening yet:
/// `n` sockets on the same address with SO_REUSEPORT (no SO_REUSEPORT when `n` is 1). When the
/// configured port is 0, the first bind picks the port and the others reuse it.
pub fn bound_sockets(ctx: &Ctx, n: usize, nonblocking: bool) -> io::Result<Vec<OwnedFd>> {
    let mut addr = ctx.config.addr;
    if n > 1 {
        // SO_REUSEPORT alone would join another server's listeners on this port.
        crate::net::ensure_addr_free(addr)?;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let l = bind(addr, n > 1, nonblocking)?;
        if addr.port() == 0 {
            addr = local_addr(l.as_raw_fd())?;
        }
        out.push(l);
    }
    Ok(out)
}

/// The address a socket is bound to.
pub use iolab_sys::sockaddr::local_addr;

fn setsockopt_int(fd: RawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: value is a live i32 and its size is passed.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &value as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// A ring for one worker thread.
pub fn ring() -> io::Result<IoUring> {
    ring_with_entries(RING_ENTRIES)
}

/// A ring for a thread other than its creator (no single-issuer setup), with `entries`
/// submission entries.
pub fn shared_ring(entries: u32) -> io::Result<IoUring> {
    IoUring::builder()
        .setup_cqsize(entries * 4)
        .build(entries)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot create an io_uring: {e}")))
}

/// A ring with `entries` submission entries and four times as many completion entries, to
/// be used only by the thread that creates it.
///
/// Worker rings are submitted to by one thread only, the one that creates them, and are
/// reaped only when that thread waits: IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN let the
/// kernel run completion work in that thread's `io_uring_enter` instead of interrupting it
/// (kernel 6.1+; without them, a plain ring).
pub fn ring_with_entries(entries: u32) -> io::Result<IoUring> {
    let tuned = IoUring::builder()
        .setup_cqsize(entries * 4)
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries);
    tuned.or_else(|_| shared_ring(entries))
}

/// Queues `entry`, first submitting what is queued when the submission queue is full.
pub fn push(ring: &mut IoUring, entry: &squeue::Entry) -> io::Result<()> {
    loop {
        // SAFETY: every caller keeps the memory the entry points to (buffers, iovecs,
        // msghdr, timespec) alive and unmoved until the entry's completion is reaped; each
        // call site states how.
        if unsafe { ring.submission().push(entry) }.is_ok() {
            return Ok(());
        }
        submit(ring)?;
    }
}

/// An accept on `listener` (the caller sets the `user_data`). No peer address is asked for
/// (null pointers): nothing to keep alive.
pub fn accept_entry(listener: RawFd) -> squeue::Entry {
    opcode::Accept::new(
        types::Fd(listener),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    )
    .flags(libc::SOCK_CLOEXEC)
    .build()
}

/// The cancel of every accept in flight on `listener`, at shutdown.
pub fn cancel_accepts_entry(listener: RawFd) -> squeue::Entry {
    let cancel = types::CancelBuilder::fd(types::Fd(listener)).all();
    opcode::AsyncCancel2::new(cancel).build()
}

/// The POLL_ADD that completes when the server's stop is requested.
pub fn stop_entry(shutdown: &Shutdown) -> squeue::Entry {
    opcode::PollAdd::new(types::Fd(shutdown.fd()), libc::POLLIN as u32).build()
}

/// A synchronous `accept4` on `listener` (no peer address, close-on-exec): the accept of the
/// models that take sockets outside the ring (`uring-accept-sync`'s accept thread,
/// `uring-callback --accept sync`).
pub fn accept(listener: RawFd) -> io::Result<RawFd> {
    // SAFETY: accept4 on the caller's listener, no peer address asked for.
    cvt(unsafe {
        libc::accept4(
            listener,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    })
}

/// `user_data` of an entry that must never complete visibly (the linked delay of
/// [`file_read_entries`]); every model treats a completion carrying it as an error.
pub const NO_COMPLETION: u64 = 0;

/// The entries that read `job` into `buf`: one `IORING_OP_READ` on the file's descriptor at
/// its offset. The file reads of every io_uring model go through the ring, so a slow disk
/// holds up the one connection waiting for it, not the loop.
///
/// When a test injects a read delay (`iolab_http::Site::inject_read_delay`), the read is
/// linked after an `IORING_OP_TIMEOUT` of that length, which counts as success
/// (`ETIME_SUCCESS`) and posts no completion (`CQE_SKIP_SUCCESS`): the disk looks slow to
/// the ring exactly as the blocking path's sleep makes it look slow to a thread. `delay`
/// must stay in place until the entries are submitted (the kernel copies it then).
///
/// `buf` must stay alive and unmoved until the read's completion is reaped (moving the `Vec`
/// does not move its bytes); `job` keeps the descriptor open and must be kept as long.
pub fn file_read_entries(
    job: &iolab_http::FileRead,
    buf: &mut [u8],
    delay: &mut types::Timespec,
) -> FileReadEntries {
    let read = opcode::Read::new(
        types::Fd(job.fd()),
        buf.as_mut_ptr(),
        u32::try_from(buf.len()).unwrap_or(u32::MAX),
    )
    .offset(job.offset())
    .build();
    let injected = job.injected_delay();
    let wait = (!injected.is_zero()).then(|| {
        *delay = injected.into();
        opcode::Timeout::new(delay)
            .flags(types::TimeoutFlags::ETIME_SUCCESS)
            .build()
            .flags(squeue::Flags::IO_LINK | squeue::Flags::SKIP_SUCCESS)
            .user_data(NO_COMPLETION)
    });
    FileReadEntries { wait, read }
}

/// See [`file_read_entries`].
pub struct FileReadEntries {
    wait: Option<squeue::Entry>,
    read: squeue::Entry,
}

impl FileReadEntries {
    /// Queues the entries; the read completes with `user_data` (the delay never completes
    /// visibly).
    pub fn push(self, ring: &mut IoUring, user_data: u64) -> io::Result<()> {
        if let Some(wait) = &self.wait {
            // A link ends with the submission batch: make room for both entries first.
            let room = {
                let sq = ring.submission();
                sq.capacity() - sq.len()
            };
            if room < 2 {
                submit(ring)?;
            }
            push(ring, wait)?;
        }
        push(ring, &self.read.user_data(user_data))
    }
}

/// Submits what is queued without waiting.
pub fn submit(ring: &mut IoUring) -> io::Result<()> {
    loop {
        match ring.submit() {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            // The completion queue is full: the caller reaps completions and retries.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Submits what is queued and waits until at least one completion is there.
pub fn submit_and_wait(ring: &mut IoUring) -> io::Result<()> {
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                if !ring.completion().is_empty() {
                    return Ok(());
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Moves every completion out of the ring into `out` (cleared first; reused so that the loop
/// does not allocate once it has grown to the largest batch).
pub fn drain(ring: &mut IoUring, out: &mut Vec<cqueue::Entry>) {
    out.clear();
    out.extend(ring.completion());
}

/// The period of the deadline tick: a thirty-second of the shortest timeout (a 2 s head
/// deadline is kept within 63 ms, well inside ±10%), between 10 ms and 1 s (1 s when there is no timeout: the
/// tick then only re-posts accepts after an error).
pub fn tick_period(timeouts: iolab_http::Timeouts) -> Duration {
    match timeouts.shortest() {
        None => Duration::from_secs(1),
        Some(t) => (t / 32).clamp(Duration::from_millis(10), Duration::from_secs(1)),
    }
}

/// `max_conns` for the whole server, shared by its worker threads.
pub struct Gate {
    open: AtomicUsize,
    max: usize,
}

impl Gate {
    pub fn new(max: usize) -> Gate {
        Gate {
            open: AtomicUsize::new(0),
            max,
        }
    }

    /// Takes a place for a new connection; false when the server already holds `max`.
    pub fn enter(&self) -> bool {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                if n < self.max {
                    Some(n + 1)
                } else {
                    None
                }
            })
            .is_ok()
    }

    pub fn leave(&self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Fills `iov` with the first pending response chunks (at most `iov.len()`); returns how
/// many.
pub fn fill_iovecs(session: &iolab_http::Session, iov: &mut [libc::iovec]) -> usize {
    let mut n = 0;
    let max = iov.len();
    for chunk in session.pending().iter().filter(|c| !c.is_empty()).take(max) {
        iov[n] = libc::iovec {
            iov_base: chunk.as_ptr() as *mut libc::c_void,
            iov_len: chunk.len(),
        };
        n += 1;
    }
    n
}

/// An all-zero msghdr (no name, no control data) to be pointed at an iovec array.
pub fn empty_msghdr() -> libc::msghdr {
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    unsafe { std::mem::zeroed() }
}

/// A zeroed array of `n` iovecs (`Buffers::max_iov`), on the heap: it does not move when
/// the connection that owns it does.
pub fn empty_iovecs(n: usize) -> Box<[libc::iovec]> {
    vec![
        libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        n
    ]
    .into_boxed_slice()
}

/// Flags for every send: no SIGPIPE when the peer has gone (the error comes back as EPIPE).
pub const SEND_FLAGS: u32 = libc::MSG_NOSIGNAL as u32;

/// Shuts a socket down both ways so that its pending operations complete at once.
pub fn shutdown_socket(fd: RawFd) {
    // SAFETY: shutdown(2) on a descriptor this worker owns; failure (already shut) is harmless.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// Closes a descriptor this worker owns and that no operation in flight refers to.
pub fn close_fd(fd: RawFd) {
    // SAFETY: the caller owns fd and forgets it after this call.
    unsafe { libc::close(fd) };
}

/// An accept posted on the ring completed with `res`: the socket, or None after an error,
/// counted unless it is the cancel at shutdown. The failed accept is re-posted at the next
/// tick rather than at once, which would spin while the condition (EMFILE...) lasts.
pub fn accepted(res: i32, stats: &crate::Stats) -> Option<RawFd> {
    if res >= 0 {
        return Some(res);
    }
    if res != -libc::ECANCELED {
        stats.error(error_kind(res));
    }
    None
}

/// When a ring may post accepts again after an accept failed for want of descriptors or
/// memory (not the connection's fault): [`crate::net::ACCEPT_BACKOFF`] later, checked at
/// the tick, so that a lasting EMFILE is not retried in a loop.
#[derive(Debug, Default)]
pub struct AcceptPause(Option<Instant>);

impl AcceptPause {
    /// An accept completed with `res` at `now`: a failure other than the cancel at shutdown
    /// pauses accepting.
    pub fn after(&mut self, res: i32, now: Instant) {
        if res < 0 && res != -libc::ECANCELED && res != -libc::ECONNABORTED {
            self.0 = Some(now + crate::net::ACCEPT_BACKOFF);
        }
    }

    /// True when accepts may be posted at `now`.
    pub fn allows(&mut self, now: Instant) -> bool {
        self.0 = self.0.filter(|&t| t > now);
        self.0.is_none()
    }
}

/// Why a connection ended badly, from a negative completion result.
pub fn error_kind(res: i32) -> ErrorKind {
    ErrorKind::of_io(&io::Error::from_raw_os_error(-res))
}

/// Runs `body(i, item)` for each item on its own named thread and waits for all of them.
/// When one fails, the shutdown is triggered so that the others stop too, and the first error
/// is returned.
pub fn run_workers<T, F>(ctx: &Ctx, items: Vec<T>, name: &str, body: F) -> io::Result<()>
where
    T: Send,
    F: Fn(usize, T) -> io::Result<()> + Sync,
{
    let body = &body;
    std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(items.len());
        let mut first = Ok(());
        for (i, item) in items.into_iter().enumerate() {
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn_scoped(s, move || {
                    let r = body(i, item);
                    if r.is_err() {
                        ctx.shutdown.trigger();
                    }
                    r
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // The threads already started stop on the shutdown and are joined below.
                    ctx.shutdown.trigger();
                    first = Err(io::Error::new(
                        e.kind(),
                        format!("cannot start a worker thread: {e}"),
                    ));
                    break;
                }
            }
        }
        for h in handles {
            let r = h.join().unwrap_or_else(|_| {
                ctx.shutdown.trigger();
                Err(io::Error::other("a worker thread panicked"))
            });
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
}

/// Lets worker threads start listening only once all of them are ready (rings created,
/// buffers registered), or once a stop is requested (a worker failed to start).
pub struct StartLine {
    left: Mutex<usize>,
    all_ready: Condvar,
}

impl StartLine {
    pub fn new(workers: usize) -> StartLine {
        StartLine {
            left: Mutex::new(workers),
            all_ready: Condvar::new(),
        }
    }

    /// Counts this worker ready (whether or not it succeeded) and waits for the others.
    pub fn arrive_and_wait(&self, shutdown: &Shutdown) {
        let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
        *left = left.saturating_sub(1);
        if *left == 0 {
            self.all_ready.notify_all();
            return;
        }
        while *left > 0 && !shutdown.is_triggered() {
            // A worker thread that could not even start never arrives: the stop it triggers
            // is seen within this period.
            left = self
                .all_ready
                .wait_timeout(left, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_admits_up_to_max_and_frees_places() {
        let g = Gate::new(2);
        assert!(g.enter());
        assert!(g.enter());
        assert!(!g.enter(), "a third connection beyond max_conns = 2");
        g.leave();
        assert!(g.enter(), "a place freed by a close is taken again");
        assert!(!g.enter());
    }

    #[test]
    fn tick_is_a_thirty_second_of_the_shortest_timeout_within_bounds() {
        let t = |header, idle, send| iolab_http::Timeouts {
            header: Duration::from_millis(header),
            idle: Duration::from_millis(idle),
            send: Duration::from_millis(send),
        };
        assert_eq!(
            tick_period(t(60_000, 60_000, 60_000)),
            Duration::from_secs(1)
        );
        assert_eq!(tick_period(t(3200, 60_000, 0)), Duration::from_millis(100));
        assert_eq!(tick_period(t(0, 1, 60_000)), Duration::from_millis(10));
        assert_eq!(tick_period(t(0, 0, 0)), Duration::from_secs(1));
    }

    #[test]
    fn a_send_takes_at_most_max_iov_chunks() {
        let dir = std::env::temp_dir().join(format!("iolab-iov-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a"), b"abc").unwrap();
        let site = iolab_http::Site::new(&dir, iolab_http::Limits::default()).unwrap();
        let mut session = iolab_http::Session::new(site);
        session.feed(&b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n".repeat(10), |_| {});
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            session.pending().len() >= 20,
            "a head and a body per response"
        );
        for max in [1, 3, 64] {
            let mut iov = empty_iovecs(max);
            let n = fill_iovecs(&session, &mut iov);
            assert_eq!(n, max.min(session.pending().len()));
        }
    }

    #[test]
    fn error_kinds_of_completion_results() {
        assert_eq!(error_kind(-libc::ECONNRESET), ErrorKind::Reset);
        assert_eq!(error_kind(-libc::EPIPE), ErrorKind::Reset);
        assert_eq!(error_kind(-libc::EBADF), ErrorKind::Io);
    }

    #[test]
    fn sockets_share_a_port_and_take_connections_only_once_listening() {
        let a = bind("127.0.0.1:0".parse().unwrap(), true, false).unwrap();
        let addr = local_addr(a.as_raw_fd()).unwrap();
        assert_ne!(addr.port(), 0);
        let b = bind(addr, true, false).unwrap();
        assert_eq!(local_addr(b.as_raw_fd()).unwrap(), addr);
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "bound but not listening must refuse"
        );
        start_listening(&a, 16).unwrap();
        start_listening(&b, 16).unwrap();
        std::net::TcpStream::connect(addr).unwrap();
    }

    #[test]
    fn several_listeners_do_not_join_another_servers_port() {
        // Another server (same user) with SO_REUSEPORT listeners on the port.
        let other = bind("127.0.0.1:0".parse().unwrap(), true, false).unwrap();
        start_listening(&other, 16).unwrap();
        let addr = local_addr(other.as_raw_fd()).unwrap();
        let config = crate::Config {
            root: std::env::temp_dir(),
            addr,
            workers: 2,
            ..crate::Config::default()
        };
        let ctx = Ctx::new(config, crate::Stats::private()).unwrap();
        let e = bound_sockets(&ctx, 2, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
    }

    #[test]
    fn an_address_in_use_is_a_clear_error() {
        let a = bind("127.0.0.1:0".parse().unwrap(), false, false).unwrap();
        start_listening(&a, 16).unwrap();
        let addr = local_addr(a.as_raw_fd()).unwrap();
        let e = bind(addr, false, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }

    #[test]
    fn start_line_releases_everyone_once_all_arrive_or_on_stop() {
        let shutdown = Shutdown::new().unwrap();
        let line = StartLine::new(3);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| line.arrive_and_wait(&shutdown));
            }
        });
        // One worker never arrives: the stop request releases the others.
        let line = StartLine::new(2);
        std::thread::scope(|s| {
            let h = s.spawn(|| line.arrive_and_wait(&shutdown));
            std::thread::sleep(Duration::from_millis(100));
            assert!(!h.is_finished(), "released before the others arrived");
            shutdown.trigger();
            h.join().unwrap();
        });
    }
}
