//! The client engine: each client thread runs its own edge-triggered epoll loop over a fixed
//! set of connection slots with non-blocking sockets. A slot carries one request at a time;
//! nothing is allocated per request in the hot path (the parser's header buffer and the
//! read buffer are reused; records go into a pre-reserved Vec when kept).
//!
//! Closed loop: every slot starts its next request as soon as its previous one ends (as ab
//! and wrk do); with -n the slots share one atomic counter so exactly n requests are made.
//! Open loop: thread k of T owns requests k, k+T, k+2T... of the global schedule
//! (request i is due at i/rate); a due request takes a free slot, or waits for one, and its
//! latency counts from its scheduled time, so waiting is not hidden (no coordinated omission).

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, OnceLock};
use std::time::Instant;

use hdrhistogram::Histogram;

use crate::response::{Progress, ResponseParser};
use crate::stats::{new_histogram, SynSchedule, Timeline};
use crate::{ErrorKind, RequestRecord};

/// How often in-flight requests are checked against their timeout.
const SCAN_US: u64 = 10_000;
/// Events taken from epoll per call.
const MAX_EVENTS: usize = 512;
/// Receive buffer per thread (the body is counted and dropped).
const READ_BUF: usize = 64 * 1024;

/// State shared by the client threads of one run.
pub(crate) struct Shared {
    pub t0: OnceLock<Instant>,
    pub barrier: Barrier,
    /// Requests claimed so far (closed loop with -n).
    pub claimed: AtomicU64,
    /// Requests ended so far, for the progress bar.
    pub ended: AtomicU64,
    pub failed: AtomicU64,
    /// Next connection id; 0 is kept for "no connection".
    pub next_conn: AtomicU64,
}

impl Shared {
    pub fn new(threads: usize) -> Self {
        Self {
            t0: OnceLock::new(),
            barrier: Barrier::new(threads),
            claimed: AtomicU64::new(0),
            ended: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            next_conn: AtomicU64::new(1),
        }
    }
}

/// What one client thread does.
pub(crate) struct Plan {
    pub index: usize,
    pub threads: usize,
    pub slots: usize,
    pub addr: SocketAddr,
    pub sources: Vec<std::net::IpAddr>,
    pub request: Vec<u8>,
    pub keepalive: bool,
    pub timeout_us: u64,
    pub requests: Option<u64>,
    pub deadline_us: Option<u64>,
    pub rate: Option<f64>,
    pub keep_records: bool,
    pub pin_cpu: Option<usize>,
    /// When connects complete after lost SYNs, on this host.
    pub syn: SynSchedule,
}

/// What one client thread measured.
pub(crate) struct Outcome {
    pub hist: Histogram<u64>,
    pub records: Vec<RequestRecord>,
    pub errors: [u64; ErrorKind::ALL.len()],
    pub requests: u64,
    pub ok: u64,
    pub bytes: u64,
    pub latency_sum_us: u64,
    pub syn_retries: u64,
    pub connects: u64,
    pub connect_sum_us: u64,
    pub lag_sum_us: u64,
    pub lag_n: u64,
    pub lag_max_us: u64,
    pub timeline: Timeline,
    pub cpu_s: f64,
    /// When this thread stopped, µs from the start.
    pub end_us: u64,
}

impl Outcome {
    fn new(records_cap: usize) -> Self {
        Self {
            hist: new_histogram(),
            records: Vec::with_capacity(records_cap),
            errors: [0; ErrorKind::ALL.len()],
            requests: 0,
            ok: 0,
            bytes: 0,
            latency_sum_us: 0,
            syn_retries: 0,
            connects: 0,
            connect_sum_us: 0,
            lag_sum_us: 0,
            lag_n: 0,
            lag_max_us: 0,
            timeline: Timeline::default(),
            cpu_s: 0.0,
            end_us: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    /// No request; no connection.
    Free,
    /// No request; an open keep-alive connection waits for the next one.
    Idle,
    Connecting,
    Sending,
    Receiving,
    /// The response is recorded; waiting for the server to close (as ab does), so the
    /// server, not the client, holds TIME_WAIT.
    Draining,
}

#[derive(Debug, Clone, Copy, Default)]
struct Req {
    scheduled_us: u64,
    start_us: u64,
    connected_us: Option<u64>,
    first_byte_us: Option<u64>,
    deadline_us: u64,
    bytes: u64,
}

struct Slot {
    /// When the slot last became free (closed loop: the next request's scheduled start).
    ready_us: Option<u64>,
    fd: RawFd,
    gen: u32,
    st: St,
    conn_id: u64,
    sent: usize,
    req: Req,
    parser: ResponseParser,
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Which error kind an errno from socket/bind/connect/send/recv is.
pub fn classify(errno: i32) -> ErrorKind {
    match errno {
        libc::ECONNREFUSED => ErrorKind::Refused,
        libc::ECONNRESET | libc::EPIPE | libc::ECONNABORTED => ErrorKind::Reset,
        libc::ETIMEDOUT => ErrorKind::Timeout,
        libc::EADDRNOTAVAIL | libc::EADDRINUSE => ErrorKind::PortExhaustion,
        libc::EMFILE | libc::ENFILE => ErrorKind::Emfile,
        _ => ErrorKind::Other,
    }
}

use iolab_sys::sockaddr::to_raw as sockaddr;

/// CPU time (user + system) of the calling thread, in seconds.
fn thread_cpu_s() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD with a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

use iolab_sys::pin_current_thread as pin_thread;

struct Worker<'a> {
    plan: Plan,
    shared: &'a Shared,
    t0: Instant,
    epfd: RawFd,
    slots: Vec<Slot>,
    /// Slots that can take a request: idle keep-alive connections at the front, free
    /// slots at the back.
    free: VecDeque<usize>,
    active: usize,
    /// Open loop: this thread's next request index.
    next_index: u64,
    buf: Vec<u8>,
    sa: (libc::sockaddr_storage, libc::socklen_t),
    sources: Vec<(libc::sockaddr_storage, libc::socklen_t)>,
    family: libc::c_int,
    use_pwait2: bool,
    out: Outcome,
    ended_unreported: u64,
    failed_unreported: u64,
}

/// Run one client thread to the end of its plan.
pub(crate) fn run_thread(plan: Plan, shared: &Shared) -> anyhow::Result<Outcome> {
    let setup = (|| -> anyhow::Result<RawFd> {
        if let Some(cpu) = plan.pin_cpu {
            pin_thread(cpu)
                .map_err(|e| anyhow::anyhow!("cannot pin the client to CPU {cpu}: {e}"))?;
        }
        // SAFETY: plain syscall; the fd is closed when the worker drops.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            anyhow::bail!("epoll_create1: {}", io::Error::last_os_error());
        }
        Ok(epfd)
    })();
    // Every thread reaches the barrier, even after a failed setup, so no one waits forever.
    shared.barrier.wait();
    let epfd = setup?;
    let t0 = *shared.t0.get_or_init(Instant::now);
    let cpu0 = thread_cpu_s();
    let records_cap = if plan.keep_records {
        plan.requests
            .map(|n| (n / plan.threads as u64 + 1).min(10_000_000) as usize)
            .unwrap_or(1024)
    } else {
        0
    };
    let sources = plan
        .sources
        .iter()
        .map(|ip| sockaddr(&SocketAddr::new(*ip, 0)))
        .collect();
    let family = if plan.addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let mut w = Worker {
        slots: (0..plan.slots)
            .map(|_| Slot {
                ready_us: None,
                fd: -1,
                gen: 0,
                st: St::Free,
                conn_id: 0,
                sent: 0,
                req: Req::default(),
                parser: ResponseParser::new(),
            })
            .collect(),
        free: (0..plan.slots).collect(),
        active: 0,
        next_index: plan.index as u64,
        buf: vec![0; READ_BUF],
        sa: sockaddr(&plan.addr),
        sources,
        family,
        use_pwait2: true,
        out: Outcome::new(records_cap),
        plan,
        shared,
        t0,
        epfd,
        ended_unreported: 0,
        failed_unreported: 0,
    };
    w.run();
    w.out.cpu_s = thread_cpu_s() - cpu0;
    let out = std::mem::replace(&mut w.out, Outcome::new(0));
    Ok(out)
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        for s in &mut self.slots {
            if s.fd >= 0 {
                // SAFETY: the slot owns this fd; it is closed once and forgotten.
                unsafe { libc::close(s.fd) };
                s.fd = -1;
            }
        }
        // SAFETY: we own the epoll fd.
        unsafe { libc::close(self.epfd) };
    }
}

impl Worker<'_> {
    fn now(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    fn open_loop(&self) -> bool {
        self.plan.rate.is_some()
    }

    fn run(&mut self) {
        // SAFETY: epoll_event is plain data.
        let mut events: Vec<libc::epoll_event> = vec![unsafe { std::mem::zeroed() }; MAX_EVENTS];
        let mut last_scan = 0;
        loop {
            let now = self.now();
            if self.plan.deadline_us.is_some_and(|d| now >= d) {
                break;
            }
            if self.open_loop() {
                self.start_due(now);
            } else {
                self.start_closed();
            }
            self.report_progress();
            if self.finished() {
                break;
            }
            let now = self.now();
            let mut wait_us = SCAN_US.saturating_sub(now.saturating_sub(last_scan));
            if !self.open_loop() && !self.free.is_empty() {
                // A start failed at once (refused, EMFILE...): retry after polling.
                wait_us = 0;
            }
            if self.open_loop() && !self.free.is_empty() {
                if let Some(next) = self.next_sched() {
                    wait_us = wait_us.min(next.saturating_sub(now));
                }
            }
            if let Some(d) = self.plan.deadline_us {
                wait_us = wait_us.min(d.saturating_sub(now));
            }
            let n = self.wait(&mut events, wait_us);
            for ev in &events[..n] {
                let data = ev.u64;
                let (slot, gen) = ((data & 0xffff_ffff) as usize, (data >> 32) as u32);
                if slot < self.slots.len() && self.slots[slot].gen == gen {
                    // A fresh clock per event (vDSO, tens of ns): times are taken when this
                    // response is handled, as ab and wrk do.
                    let now = self.now();
                    self.handle(slot, ev.events, now);
                }
            }
            let now = self.now();
            if now.saturating_sub(last_scan) >= SCAN_US {
                self.scan_timeouts(now);
                last_scan = now;
            }
        }
        let now = self.now();
        self.finish(now);
        self.report_progress();
        self.out.end_us = match self.plan.deadline_us {
            Some(d) => now.min(d),
            None => now,
        };
    }

    fn report_progress(&mut self) {
        if self.ended_unreported > 0 {
            self.shared
                .ended
                .fetch_add(self.ended_unreported, Ordering::Relaxed);
            self.ended_unreported = 0;
        }
        if self.failed_unreported > 0 {
            self.shared
                .failed
                .fetch_add(self.failed_unreported, Ordering::Relaxed);
            self.failed_unreported = 0;
        }
    }

    fn wait(&mut self, events: &mut [libc::epoll_event], wait_us: u64) -> usize {
        let n = if self.use_pwait2 {
            let ts = libc::timespec {
                tv_sec: (wait_us / 1_000_000) as libc::time_t,
                tv_nsec: ((wait_us % 1_000_000) * 1000) as libc::c_long,
            };
            // SAFETY: events points to events.len() writable entries; ts lives across the call.
            let n = unsafe {
                libc::epoll_pwait2(
                    self.epfd,
                    events.as_mut_ptr(),
                    events.len() as libc::c_int,
                    &ts,
                    std::ptr::null(),
                )
            };
            if n < 0 && errno() == libc::ENOSYS {
                self.use_pwait2 = false;
                return 0;
            }
            n
        } else {
            // Millisecond timeouts, rounded up so we never spin before a due time.
            let ms = wait_us.div_ceil(1000).min(i32::MAX as u64) as libc::c_int;
            // SAFETY: as above.
            unsafe {
                libc::epoll_wait(
                    self.epfd,
                    events.as_mut_ptr(),
                    events.len() as libc::c_int,
                    ms,
                )
            }
        };
        if n < 0 {
            0 // EINTR: loop again
        } else {
            n as usize
        }
    }

    fn finished(&self) -> bool {
        if self.open_loop() {
            self.active == 0 && self.next_sched().is_none()
        } else {
            self.active == 0 && self.free.is_empty()
        }
    }

    /// Open loop: when this thread's next request is due, µs from the start.
    fn next_sched(&self) -> Option<u64> {
        let rate = self.plan.rate?;
        let i = self.next_index;
        if self.plan.requests.is_some_and(|n| i >= n) {
            return None;
        }
        let sched = (i as f64 * 1e6 / rate) as u64;
        if self.plan.deadline_us.is_some_and(|d| sched >= d) {
            return None;
        }
        Some(sched)
    }

    fn start_due(&mut self, mut now: u64) {
        while let Some(sched) = self.next_sched() {
            if sched > now {
                break;
            }
            let Some(s) = self.free.pop_front() else {
                break; // every connection is busy: the request waits, and its wait counts
            };
            self.next_index += self.plan.threads as u64;
            self.start(s, sched, now);
            now = self.now();
        }
    }

    fn start_closed(&mut self) {
        for _ in 0..self.free.len() {
            let Some(s) = self.free.pop_front() else {
                break;
            };
            self.start_closed_slot(s);
        }
    }

    /// Closed loop: slot `s` (out of the free list) takes the next request, or retires.
    fn start_closed_slot(&mut self, s: usize) {
        let claimed = match self.plan.requests {
            Some(n) => self.shared.claimed.fetch_add(1, Ordering::Relaxed) < n,
            None => true,
        };
        if !claimed {
            // No requests left: this slot retires.
            self.close_conn(s);
            self.slots[s].st = St::Free;
            return;
        }
        // A closed-loop client sends its next request the moment the previous one ends:
        // that is its scheduled start. The client's own delay in getting to it shows as lag
        // and counts in the latency (so rps x mean latency = concurrency, Little's law), as
        // with ab, which starts the next request from the handler of the last one.
        let now = self.now();
        let sched = self.slots[s].ready_us.unwrap_or(now).min(now);
        self.start(s, sched, now);
    }

    fn start(&mut self, s: usize, scheduled_us: u64, now: u64) {
        self.active += 1;
        let lag = now - scheduled_us;
        self.out.lag_sum_us += lag;
        self.out.lag_n += 1;
        self.out.lag_max_us = self.out.lag_max_us.max(lag);
        let slot = &mut self.slots[s];
        slot.req = Req {
            scheduled_us,
            start_us: now,
            connected_us: None,
            first_byte_us: None,
            deadline_us: now + self.plan.timeout_us,
            bytes: 0,
        };
        slot.parser.reset();
        slot.sent = 0;
        if slot.fd >= 0 {
            // Reused keep-alive connection: connected from the start.
            slot.req.connected_us = Some(now);
            slot.st = St::Sending;
            self.send(s, now);
        } else {
            self.connect(s, now);
        }
    }

    fn connect(&mut self, s: usize, now: u64) {
        // SAFETY: plain syscall.
        let fd = unsafe {
            libc::socket(
                self.family,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            let e = errno();
            self.slots[s].conn_id = 0;
            self.fail(s, classify(e), now);
            return;
        }
        let conn_id = self.shared.next_conn.fetch_add(1, Ordering::Relaxed);
        {
            let slot = &mut self.slots[s];
            slot.fd = fd;
            slot.conn_id = conn_id;
            slot.gen = slot.gen.wrapping_add(1);
        }
        let one: libc::c_int = 1;
        let optlen = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        if !self.sources.is_empty() {
            let (src, len) = &self.sources[(conn_id as usize) % self.sources.len()];
            // Let connect() pick the port, so each (source, destination) pair has its own
            // ephemeral range instead of bind() reserving a port across all destinations.
            // SAFETY: valid fd, option value and length.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::IPPROTO_IP,
                    libc::IP_BIND_ADDRESS_NO_PORT,
                    &one as *const _ as *const libc::c_void,
                    optlen,
                )
            };
            // SAFETY: src is a valid sockaddr of `len` bytes.
            if unsafe { libc::bind(fd, src as *const _ as *const libc::sockaddr, *len) } != 0 {
                let e = errno();
                self.fail(s, classify(e), now);
                return;
            }
        }
        if self.plan.keepalive {
            // Requests go out as soon as written (wrk does the same).
            // SAFETY: valid fd, option value and length.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_NODELAY,
                    &one as *const _ as *const libc::c_void,
                    optlen,
                )
            };
        }
        let (sa, salen) = &self.sa;
        // SAFETY: sa is a valid sockaddr of salen bytes.
        let r = unsafe { libc::connect(fd, sa as *const _ as *const libc::sockaddr, *salen) };
        let pending = if r == 0 {
            false
        } else {
            let e = errno();
            if e != libc::EINPROGRESS {
                self.fail(s, classify(e), now);
                return;
            }
            true
        };
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
            u64: (s as u64) | (u64::from(self.slots[s].gen) << 32),
        };
        // SAFETY: valid epoll fd, socket fd and event.
        if unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            let e = errno();
            self.fail(s, classify(e), now);
            return;
        }
        if pending {
            // On loopback the handshake has usually completed by the time connect()
            // returns (the SYN-ACK is processed when connect releases the socket), so try
            // to send at once and save a trip through epoll; EAGAIN means still
            // connecting, and the EPOLLOUT edge of the connection will resume us.
            self.slots[s].st = St::Connecting;
            self.send(s, now);
        } else {
            self.connected(s, now);
        }
    }

    fn connected(&mut self, s: usize, now: u64) {
        self.note_connected(s);
        self.slots[s].st = St::Sending;
        self.send(s, now);
    }

    fn note_connected(&mut self, s: usize) {
        let now = self.now();
        let slot = &mut self.slots[s];
        slot.req.connected_us = Some(now);
        slot.st = St::Sending;
        let took = now - slot.req.start_us;
        self.out.connects += 1;
        self.out.connect_sum_us += took;
        if self.plan.syn.retransmits(took) > 0 {
            self.out.syn_retries += 1;
        }
    }

    fn send(&mut self, s: usize, now: u64) {
        loop {
            let slot = &mut self.slots[s];
            let rest = &self.plan.request[slot.sent..];
            // SAFETY: rest is a valid readable buffer of rest.len() bytes.
            let n = unsafe {
                libc::send(
                    slot.fd,
                    rest.as_ptr() as *const libc::c_void,
                    rest.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n >= 0 {
                if slot.st == St::Connecting {
                    self.note_connected(s);
                }
                let slot = &mut self.slots[s];
                slot.sent += n as usize;
                if slot.sent == self.plan.request.len() {
                    slot.st = St::Receiving;
                    return;
                }
                continue;
            }
            match errno() {
                libc::EAGAIN => {
                    if slot.st != St::Connecting {
                        slot.st = St::Sending;
                    }
                    return;
                }
                libc::EINTR => continue,
                e => {
                    self.fail(s, classify(e), now);
                    return;
                }
            }
        }
    }

    fn handle(&mut self, s: usize, ev: u32, now: u64) {
        let err = ev & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
        match self.slots[s].st {
            St::Free => {}
            St::Idle => {
                // The server closed an idle keep-alive connection (or sent something
                // unasked): drop it; the next request on this slot connects afresh.
                self.close_conn(s);
            }
            St::Connecting => {
                if err {
                    let mut e: libc::c_int = 0;
                    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                    // SAFETY: valid fd and out-pointers.
                    unsafe {
                        libc::getsockopt(
                            self.slots[s].fd,
                            libc::SOL_SOCKET,
                            libc::SO_ERROR,
                            &mut e as *mut _ as *mut libc::c_void,
                            &mut len,
                        )
                    };
                    let kind = if e == 0 {
                        ErrorKind::Other
                    } else {
                        classify(e)
                    };
                    self.fail(s, kind, now);
                } else if ev & libc::EPOLLOUT as u32 != 0 {
                    self.connected(s, now);
                }
            }
            St::Sending => {
                if err || ev & libc::EPOLLOUT as u32 != 0 {
                    self.send(s, now);
                }
            }
            St::Receiving | St::Draining => self.receive(s, now),
        }
    }

    fn receive(&mut self, s: usize, now: u64) {
        loop {
            let fd = self.slots[s].fd;
            // SAFETY: buf is a writable buffer of buf.len() bytes.
            let n = unsafe {
                libc::recv(
                    fd,
                    self.buf.as_mut_ptr() as *mut libc::c_void,
                    self.buf.len(),
                    0,
                )
            };
            if n > 0 {
                let n = n as usize;
                let slot = &mut self.slots[s];
                if slot.st == St::Draining {
                    continue; // bytes after the response: ignored, we only wait for the close
                }
                slot.req.first_byte_us.get_or_insert(now);
                match slot.parser.feed(&self.buf[..n]) {
                    Progress::NeedMore => slot.req.bytes += n as u64,
                    Progress::Done { consumed } => {
                        slot.req.bytes += consumed as u64;
                        self.complete(s, now, consumed < n);
                        if self.slots[s].st != St::Draining {
                            return;
                        }
                    }
                    Progress::Failed(kind) => {
                        slot.req.bytes += n as u64;
                        self.fail(s, kind, now);
                        return;
                    }
                }
            } else if n == 0 {
                if self.slots[s].st == St::Draining {
                    self.release(s, false, true);
                    return;
                }
                match self.slots[s].parser.eof() {
                    Ok(()) => {
                        self.complete(s, now, true);
                        if self.slots[s].st == St::Draining {
                            self.release(s, false, true);
                        }
                    }
                    Err(kind) => self.fail(s, kind, now),
                }
                return;
            } else {
                match errno() {
                    libc::EAGAIN => return,
                    libc::EINTR => continue,
                    e => {
                        if self.slots[s].st == St::Draining {
                            self.release(s, false, true);
                        } else {
                            self.fail(s, classify(e), now);
                        }
                        return;
                    }
                }
            }
        }
    }

    /// A whole response arrived: record it, then reuse, drain or close the connection.
    fn complete(&mut self, s: usize, now: u64, surplus: bool) {
        let status = self.slots[s].parser.status();
        let error = match status {
            Some(200..=299) => None,
            _ => Some(ErrorKind::Non2xx),
        };
        self.record(s, now, error);
        let slot = &mut self.slots[s];
        if self.plan.keepalive && !slot.parser.will_close() && !surplus {
            self.release(s, true, true);
        } else if slot.parser.will_close() {
            slot.st = St::Draining;
            slot.req.deadline_us = now + self.plan.timeout_us;
        } else {
            self.release(s, false, true);
        }
    }

    /// The request is over: the slot is free for the next one, keeping its connection or
    /// not. With `restart` (after a response, never after an immediate failure, so this
    /// cannot recurse without bound) the next request starts right here, as ab does,
    /// rather than after the rest of this batch of events.
    fn release(&mut self, s: usize, keep_conn: bool, restart: bool) {
        let now = self.now();
        self.slots[s].ready_us = Some(now);
        self.active -= 1;
        if keep_conn {
            self.slots[s].st = St::Idle;
        } else {
            self.close_conn(s);
            self.slots[s].st = St::Free;
        }
        if restart && !self.open_loop() && self.plan.deadline_us.is_none_or(|d| now < d) {
            self.start_closed_slot(s);
            return;
        }
        if keep_conn {
            self.free.push_front(s);
        } else {
            self.free.push_back(s);
        }
        if restart && self.open_loop() {
            self.start_due(now);
        }
    }

    fn fail(&mut self, s: usize, kind: ErrorKind, now: u64) {
        self.record(s, now, Some(kind));
        self.release(s, false, false);
    }

    fn close_conn(&mut self, s: usize) {
        let slot = &mut self.slots[s];
        if slot.fd >= 0 {
            // SAFETY: the slot owns the fd; closing also removes it from the epoll set.
            unsafe { libc::close(slot.fd) };
            slot.fd = -1;
            slot.gen = slot.gen.wrapping_add(1);
        }
    }

    fn record(&mut self, s: usize, end_us: u64, error: Option<ErrorKind>) {
        let slot = &self.slots[s];
        let r = slot.req;
        let rec = RequestRecord {
            scheduled_us: r.scheduled_us,
            start_us: r.start_us,
            connected_us: r.connected_us,
            first_byte_us: r.first_byte_us,
            end_us,
            status: slot.parser.status(),
            bytes: r.bytes,
            error,
            conn_id: slot.conn_id,
        };
        self.push_record(rec);
    }

    fn push_record(&mut self, rec: RequestRecord) {
        let out = &mut self.out;
        out.requests += 1;
        out.bytes += rec.bytes;
        self.ended_unreported += 1;
        match rec.error {
            None => {
                let latency = rec.latency_us();
                out.ok += 1;
                out.latency_sum_us += latency;
                out.hist.saturating_record(latency.max(1));
                out.timeline.add(rec.end_us, Some(latency), false);
            }
            Some(kind) => {
                out.errors[kind as usize] += 1;
                out.timeline.add(rec.end_us, None, true);
                self.failed_unreported += 1;
            }
        }
        if self.plan.keep_records {
            out.records.push(rec);
        }
    }

    fn scan_timeouts(&mut self, now: u64) {
        for s in 0..self.slots.len() {
            let slot = &self.slots[s];
            if now < slot.req.deadline_us {
                continue;
            }
            match slot.st {
                St::Connecting | St::Sending | St::Receiving => {
                    self.fail(s, ErrorKind::Timeout, now)
                }
                St::Draining => self.release(s, false, false),
                St::Free | St::Idle => {}
            }
        }
    }

    /// The run is over: whatever is still in flight, or due and never started, is
    /// recorded as unfinished.
    fn finish(&mut self, now: u64) {
        for s in 0..self.slots.len() {
            match self.slots[s].st {
                St::Connecting | St::Sending | St::Receiving => {
                    self.fail(s, ErrorKind::Unfinished, now)
                }
                St::Draining => self.release(s, false, false),
                St::Free | St::Idle => self.close_conn(s),
            }
        }
        if self.open_loop() {
            if self.plan.keep_records {
                while let Some(sched) = self.next_sched() {
                    if sched > now {
                        break;
                    }
                    self.next_index += self.plan.threads as u64;
                    self.push_record(RequestRecord {
                        scheduled_us: sched,
                        start_us: now,
                        connected_us: None,
                        first_byte_us: None,
                        end_us: now,
                        status: None,
                        bytes: 0,
                        error: Some(ErrorKind::Unfinished),
                        conn_id: 0,
                    });
                }
            } else if let (Some(rate), Some(_)) = (self.plan.rate, self.next_sched()) {
                // Counted, not looped over: a stalled server at a huge rate leaves many.
                let due_total = (now as f64 * rate / 1e6).floor() as u64 + 1;
                let due_total = match self.plan.requests {
                    Some(n) => due_total.min(n),
                    None => due_total,
                };
                // Only requests due before the deadline (i / rate < d) belong to the run.
                let due_total = match self.plan.deadline_us {
                    Some(d) => due_total.min((d as f64 * rate / 1e6).ceil() as u64),
                    None => due_total,
                };
                let t = self.plan.threads as u64;
                let mine = if due_total > self.next_index {
                    (due_total - self.next_index).div_ceil(t)
                } else {
                    0
                };
                self.next_index += mine * t;
                self.out.requests += mine;
                self.out.errors[ErrorKind::Unfinished as usize] += mine;
                self.out.timeline.add_n(now, mine);
                self.ended_unreported += mine;
                self.failed_unreported += mine;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_classification() {
        assert_eq!(classify(libc::ECONNREFUSED), ErrorKind::Refused);
        assert_eq!(classify(libc::ECONNRESET), ErrorKind::Reset);
        assert_eq!(classify(libc::EPIPE), ErrorKind::Reset);
        assert_eq!(classify(libc::ETIMEDOUT), ErrorKind::Timeout);
        assert_eq!(classify(libc::EADDRNOTAVAIL), ErrorKind::PortExhaustion);
        assert_eq!(classify(libc::EMFILE), ErrorKind::Emfile);
        assert_eq!(classify(libc::ENFILE), ErrorKind::Emfile);
        assert_eq!(classify(libc::EHOSTUNREACH), ErrorKind::Other);
    }

    #[test]
    fn sockaddr_layout() {
        let (ss, len) = sockaddr(&"127.0.0.1:8080".parse().unwrap());
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in>());
        // SAFETY: sockaddr() wrote a sockaddr_in into the storage.
        let sin = unsafe { &*(&ss as *const _ as *const libc::sockaddr_in) };
        assert_eq!(sin.sin_family, libc::AF_INET as libc::sa_family_t);
        assert_eq!(u16::from_be(sin.sin_port), 8080);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [127, 0, 0, 1]);
        let (ss, len) = sockaddr(&"[::1]:443".parse().unwrap());
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in6>());
        // SAFETY: as above, a sockaddr_in6.
        let sin6 = unsafe { &*(&ss as *const _ as *const libc::sockaddr_in6) };
        assert_eq!(u16::from_be(sin6.sin6_port), 443);
        assert_eq!(sin6.sin6_addr.s6_addr[15], 1);
    }
}
