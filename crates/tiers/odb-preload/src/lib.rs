//! `libiolab_odb.so`: ODB, on-demand buffers (seed 004, chapter 4), as an `LD_PRELOAD`
//! library for unmodified programs (nginx).
//!
//! Configuration (read once when the library loads, before nginx clears its environment):
//! - `IOLAB_ODB_DOMAIN`: comma-separated IPv4 addresses or CIDRs of the peers that run ODB.
//!   TCP connections to or from them carry ODB frames (see `iolab_odb::proto`); every other
//!   connection (the client) carries real bytes. Unset or empty: the library does nothing.
//! - `IOLAB_ODB_AGENT`: `ip:port` of the buffer agent this process stores into (the BE).
//!   Without it, this process sends its own bytes as R frames and forwards references only.
//! - `IOLAB_ODB_THRESHOLD`: smallest write sent as a reference (default 4096).
//! - `IOLAB_ODB_STATS_DIR`: where to write this process's counters (optional).
//!
//! Calls intercepted (what nginx 1.22 imports and uses on the body paths, found with strace
//! and `nm -D`): recv, recvfrom, read, readv, write, writev, send, sendto, sendfile64 on
//! sockets; accept, accept4, connect, close to follow connections; pread64, pwrite64,
//! pwritev64 so that file I/O never meets a protected page; malloc, free, realloc,
//! malloc_usable_size so that buffers of whole pages come page-aligned from the library's
//! pool and freed ones keep their protected pages for the next reference (`alloc`).

mod agentconn;
mod alloc;
mod regions;
mod stats;
mod sys;

use agentconn::{Conns, Store};
use iolab_odb::proto::{self, Header, ProtoError, Ref};
use libc::{c_int, c_void, iovec, size_t, ssize_t};
use regions::Registry;
use smallvec::SmallVec;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

// ---------------------------------------------------------------- configuration

struct Config {
    domain: Vec<(u32, u32)>,
    agent: Option<SocketAddrV4>,
    threshold: usize,
    stats_dir: Option<std::path::PathBuf>,
}

static CONFIG: OnceLock<Config> = OnceLock::new();
static ACTIVE: AtomicBool = AtomicBool::new(false);

fn parse_domain(s: &str) -> Vec<(u32, u32)> {
    s.split(',')
        .filter_map(|w| {
            let w = w.trim();
            let (ip, bits) = match w.split_once('/') {
                Some((ip, b)) => (ip, b.parse::<u32>().ok()?),
                None => (w, 32),
            };
            let ip: Ipv4Addr = ip.parse().ok()?;
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits.min(32))
            };
            Some((u32::from(ip) & mask, mask))
        })
        .collect()
}

extern "C" fn init() {
    let domain = parse_domain(&std::env::var("IOLAB_ODB_DOMAIN").unwrap_or_default());
    if domain.is_empty() {
        return;
    }
    let cfg = Config {
        domain,
        agent: std::env::var("IOLAB_ODB_AGENT")
            .ok()
            .and_then(|a| a.parse().ok()),
        threshold: std::env::var("IOLAB_ODB_THRESHOLD")
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(4096)
            .max(1),
        stats_dir: std::env::var_os("IOLAB_ODB_STATS_DIR").map(Into::into),
    };
    let store = cfg.agent.map(Store::new);
    let _ = CONFIG.set(cfg);
    *STATE.lock().unwrap() = Some(State {
        store,
        fds: Vec::new(),
    });
    *REG.lock().unwrap() = Some(Reg {
        regions: Registry::new(),
        conns: Conns::new(),
    });
    regions::install();
    alloc::init();
    // SAFETY: registers a handler that only stores to an atomic (fork-safe).
    unsafe { libc::pthread_atfork(None, None, Some(sys::forget_pid)) };
    ACTIVE.store(true, Relaxed);
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// At exit (nginx workers exit on SIGTERM/SIGQUIT), the final counters.
extern "C" fn fini() {
    if let Some(dir) = CONFIG.get().and_then(|c| c.stats_dir.as_ref()) {
        stats::dump_now(dir);
    }
}

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;

fn in_domain(ip: Ipv4Addr) -> bool {
    let x = u32::from(ip);
    CONFIG
        .get()
        .is_some_and(|c| c.domain.iter().any(|&(net, mask)| x & mask == net))
}

// ---------------------------------------------------------------- state

#[derive(Clone, Copy, Debug)]
enum InFrame {
    None,
    Real(usize),
    Virt(Ref, usize),
}

#[derive(Clone, Copy, Debug)]
enum OutFrame {
    None,
    /// App bytes still to send raw for the R frame whose header went out.
    Real(usize),
    /// App bytes covered by a V frame already (partly) sent: the app will offer them again.
    Virt(usize),
}

struct FdState {
    /// The peer turned out not to speak ODB: plain bytes both ways from now on.
    raw: bool,
    /// A protocol error was seen: reads fail.
    broken: bool,
    framed_seen: bool,
    in_frame: InFrame,
    out_pending: Vec<u8>,
    out_frame: OutFrame,
    /// Bytes read from the kernel and not yet consumed: `rbuf[rpos..rlen]` (headers, short
    /// frames, and the first bytes of a header whose rest has not arrived — taken out of the
    /// kernel: left there, they would pin a socket buffer whose size the kernel charges to
    /// the receive window (a 3-byte remainder of a 64 KiB segment holds ~120 KiB), and with
    /// the window closed the rest of the header never comes: the 16 MiB stall).
    rbuf: Box<[u8; RBUF]>,
    rpos: usize,
    rlen: usize,
    /// Application bytes sent since a read last returned bytes (the start of a response,
    /// for a server): where the receiver's buffer pages begin (see `odb_sendfile`).
    out_since_in: usize,
}

impl FdState {
    fn new() -> FdState {
        FdState {
            raw: false,
            broken: false,
            framed_seen: false,
            in_frame: InFrame::None,
            out_pending: Vec::new(),
            out_frame: OutFrame::None,
            rbuf: Box::new([0; RBUF]),
            rpos: 0,
            rlen: 0,
            out_since_in: 0,
        }
    }
}

const MAX_FDS: usize = 1 << 16;

/// Per-connection state and the local agent. Its lock may be held while the library
/// allocates memory.
struct State {
    store: Option<Store>,
    fds: Vec<Option<Box<FdState>>>,
}

/// The registry of protected pages and the agent connections: what the SIGSEGV handler
/// needs. Invariant: this lock is never held while allocating, nor while touching
/// application memory that may be protected — so a fault (in the application, or in malloc
/// walking a freed buffer that still holds protected pages) never finds it held by its own
/// thread.
pub(crate) struct Reg {
    pub(crate) regions: Registry,
    pub(crate) conns: Conns,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
static REG: Mutex<Option<Reg>> = Mutex::new(None);
/// 1 for fds that are ODB-domain TCP connections (lock-free fast path for the others).
static DOMAIN_FD: [AtomicU8; MAX_FDS] = [const { AtomicU8::new(0) }; MAX_FDS];
/// Number of registered protected ranges (lock-free fast path when zero).
static REGION_COUNT: AtomicUsize = AtomicUsize::new(0);

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut g = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let st = g.as_mut().expect("odb state");
    f(st)
}

/// A short, allocation-free section on the registry (see `Reg`).
fn with_reg<R>(f: impl FnOnce(&mut Reg) -> R) -> R {
    let mut g = REG.lock().unwrap_or_else(|e| e.into_inner());
    let r = g.as_mut().expect("odb registry");
    let out = f(r);
    REGION_COUNT.store(r.regions.v.len(), Relaxed);
    out
}

/// For the SIGSEGV handler: the registry lock is never held by the faulting thread (see
/// `Reg`); another thread may hold it briefly, so spin on try_lock.
pub(crate) fn with_state_in_handler<R>(f: impl FnOnce(&mut Reg) -> R) -> Option<R> {
    for _ in 0..1_000_000 {
        match REG.try_lock() {
            Ok(mut g) => {
                let st = g.as_mut()?;
                let r = f(st);
                REGION_COUNT.store(st.regions.v.len(), Relaxed);
                return Some(r);
            }
            Err(std::sync::TryLockError::Poisoned(p)) => {
                let mut g = p.into_inner();
                let st = g.as_mut()?;
                return Some(f(st));
            }
            Err(std::sync::TryLockError::WouldBlock) => std::hint::spin_loop(),
        }
    }
    None
}

/// `free(p)` of a glibc block of `n` usable bytes: its protected pages are given up unfetched
/// and unprotected (regions are whole pages inside the buffers they were read into, so a
/// freed block holds whole regions or none of one).
pub(crate) fn forget_pages(p: usize, n: usize) {
    in_free(p, n, |st, a, b| {
        if st.regions.overlaps(a, b) {
            let before = st.regions.v.len();
            let _ = st.regions.take(a, b, false, &mut st.conns);
            stats::FREED_REGIONS.fetch_add((before - st.regions.v.len()) as u64, Relaxed);
        }
    });
}

/// `free` of the pool block [p, p+n): its live regions become dead, still protected (see
/// `alloc`).
pub(crate) fn kill_pages(p: usize, n: usize) {
    in_free(p, n, |st, a, b| st.regions.kill(a, b, &mut st.conns));
}

/// Runs `f` on the whole pages [a, b) of a freed block, under the registry lock. The lock is
/// never held while freeing (see `Reg`), so waiting for it cannot be waiting for ourselves;
/// bounded anyway (another thread holding it for long is a bug elsewhere): give up, and the
/// pages stay registered live, fetched if ever touched.
fn in_free(p: usize, n: usize, f: impl FnOnce(&mut Reg, usize, usize)) {
    use regions::{round_down, round_up};
    let (a, b) = (round_up(p), round_down(p + n));
    if a >= b || REGION_COUNT.load(Relaxed) == 0 {
        return;
    }
    for _ in 0..100_000 {
        match REG.try_lock() {
            Ok(mut g) => {
                if let Some(st) = g.as_mut() {
                    f(st, a, b);
                    REGION_COUNT.store(st.regions.v.len(), Relaxed);
                }
                return;
            }
            Err(std::sync::TryLockError::Poisoned(_)) => return,
            Err(std::sync::TryLockError::WouldBlock) => std::hint::spin_loop(),
        }
    }
}

/// `realloc(p)` of a block of `n` usable bytes: its protected pages are fetched (glibc copies
/// the block and frees it without our `free`).
pub(crate) fn fetch_pages(p: usize, n: usize) -> Result<(), c_int> {
    with_reg(|st| {
        if st.regions.overlaps(p, p + n) {
            st.regions.take(
                regions::round_up(p),
                regions::round_down(p + n),
                true,
                &mut st.conns,
            )
        } else {
            Ok(())
        }
    })
}

fn is_domain(fd: c_int) -> bool {
    ACTIVE.load(Relaxed)
        && (fd as usize) < MAX_FDS
        && fd >= 0
        && DOMAIN_FD[fd as usize].load(Relaxed) != 0
}

fn set_domain(fd: c_int, on: bool) {
    if fd < 0 || fd as usize >= MAX_FDS {
        return;
    }
    with_state(|st| {
        let i = fd as usize;
        if st.fds.len() <= i {
            st.fds.resize_with(i + 1, || None);
        }
        st.fds[i] = on.then(|| Box::new(FdState::new()));
    });
    DOMAIN_FD[fd as usize].store(on as u8, Relaxed);
    if on {
        stats::DOMAIN_CONNS.fetch_add(1, Relaxed);
    }
}

fn peer_in_domain(sa: *const libc::sockaddr, len: libc::socklen_t) -> bool {
    if sa.is_null() || (len as usize) < std::mem::size_of::<libc::sockaddr_in>() {
        return false;
    }
    // SAFETY: the caller passes a sockaddr of at least sizeof(sockaddr_in) bytes.
    unsafe {
        if (*sa).sa_family as c_int != libc::AF_INET {
            return false;
        }
        let sin = &*(sa as *const libc::sockaddr_in);
        in_domain(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
    }
}

fn fail(e: c_int) -> ssize_t {
    sys::set_errno(e);
    -1
}

fn done(r: Result<usize, c_int>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => fail(e),
    }
}

fn dump_stats() {
    if let Some(c) = CONFIG.get() {
        stats::maybe_dump(&c.stats_dir);
    }
}

// ---------------------------------------------------------------- iovec helpers

/// The iovecs covering bytes [skip, skip + k) of `iov`.
fn sub_iov(iov: &[iovec], mut skip: usize, mut k: usize, out: &mut Iovs) {
    out.clear();
    for v in iov {
        if k == 0 {
            break;
        }
        if skip >= v.iov_len {
            skip -= v.iov_len;
            continue;
        }
        let take = (v.iov_len - skip).min(k);
        out.push(iovec {
            // SAFETY: skip < iov_len (checked above), so the pointer stays inside the
            // application's iovec; nothing is dereferenced here.
            iov_base: unsafe { (v.iov_base as *mut u8).add(skip) }.cast(),
            iov_len: take,
        });
        k -= take;
        skip = 0;
    }
}

fn iov_total(iov: &[iovec]) -> usize {
    iov.iter().map(|v| v.iov_len).sum()
}

// ---------------------------------------------------------------- receiving

/// Places `r` (covering exactly the bytes of `pieces`) into application memory: partial pages
/// fetched now, whole pages protected and registered for fetch on fault (no `mprotect` when
/// they are the dead pages of the same buffer's last response, see `Registry::cover`).
fn place_virtual(st: &mut Reg, pieces: &[iovec], r: Ref) -> Result<(), c_int> {
    use regions::{round_down, round_up};
    let mut o = 0u64;
    for pc in pieces {
        let (s, e) = (pc.iov_base as usize, pc.iov_base as usize + pc.iov_len);
        let sub = r.slice(o, pc.iov_len as u32);
        let (ps, pe) = (round_up(s), round_down(e));
        if ps < pe {
            // the partial pages at the ends are written now: whatever protects them goes
            // first (their other bytes kept), then head and tail in one pipelined request
            let mut jobs: [(Ref, *mut u8); 2] = [(sub, std::ptr::null_mut()); 2];
            let mut n = 0;
            if ps > s {
                st.regions.prepare_overwrite(s, ps - s, &mut st.conns)?;
                jobs[n] = (sub.slice(0, (ps - s) as u32), s as *mut u8);
                n += 1;
            }
            if e > pe {
                st.regions.prepare_overwrite(pe, e - pe, &mut st.conns)?;
                jobs[n] = (sub.slice((pe - s) as u64, (e - pe) as u32), pe as *mut u8);
                n += 1;
            }
            st.conns.fetch_many(&jobs[..n])?;
            let middle = sub.slice((ps - s) as u64, (pe - ps) as u32);
            if st.regions.cover(ps, pe, middle, &mut st.conns) {
                stats::PROTECTED_BYTES.fetch_add((pe - ps) as u64, Relaxed);
            } else {
                st.conns.fetch(&middle, ps as *mut u8)?;
            }
        } else {
            // less than a whole page: fetch it all now
            st.regions.prepare_overwrite(s, e - s, &mut st.conns)?;
            st.conns.fetch(&sub, s as *mut u8)?;
        }
        o += pc.iov_len as u64;
    }
    stats::V_IN_BYTES.fetch_add(o, Relaxed);
    Ok(())
}

/// The iovecs covering bytes [at, at + k) of `iov` into `out`, made ready for the receive path
/// to write real bytes into: protected pages there are dropped (whole) or fetched (partial).
/// Only the part about to be written: the pages a reference lands on stay protected (see
/// `place_virtual`).
fn writable_part(iov: &[iovec], at: usize, k: usize, out: &mut Iovs) -> Result<(), c_int> {
    sub_iov(iov, at, k, out);
    if REGION_COUNT.load(Relaxed) == 0 {
        return Ok(());
    }
    with_reg(|r| {
        out.iter().try_for_each(|v| {
            r.regions
                .prepare_overwrite(v.iov_base as usize, v.iov_len, &mut r.conns)
        })
    })
    .map_err(|_| libc::EIO)
}

fn odb_recv(
    _st: &mut State,
    fs: &mut FdState,
    fd: c_int,
    iov: &[iovec],
    flags: c_int,
) -> Result<usize, c_int> {
    if fs.broken {
        return Err(libc::ECONNRESET);
    }
    let total = iov_total(iov);
    if total == 0 {
        return Ok(0);
    }
    let mut produced = 0usize;
    // The last read into the stream buffer came back short: the kernel queue was drained
    // then, and anything that arrived since has raised an epoll edge of its own (it joined
    // the ready list when it arrived; nginx, single-threaded, is inside this call and cannot
    // have collected it). So once the buffer is used up, a short return needs no further
    // read — which would come back EAGAIN.
    let mut seen_all = false;
    let mut scratch = Iovs::new();
    // Ends a call: with bytes, report them (the error, if any, comes back next time).
    macro_rules! finish {
        ($e:expr) => {
            return if produced > 0 { Ok(produced) } else { $e }
        };
    }
    // Invariant (edge-triggered epoll): a call returns less than asked only when the kernel
    // queue is drained and the stream buffer holds no byte the application could read (at
    // most part of a frame header, whose rest will raise a new edge). Bytes are read from
    // the kernel into the stream buffer (`FdState::rbuf`): one read brings the headers and
    // the small frames behind them, as nginx's own single `recv` does (a peek to see the
    // header, then a read, was two calls per frame). The data of a frame longer than the
    // buffer goes straight into the application's memory.
    loop {
        if produced == total {
            return Ok(produced);
        }
        let fl = if produced > 0 {
            flags | libc::MSG_DONTWAIT
        } else {
            flags
        };
        let buffered = fs.rlen - fs.rpos;
        if fs.raw {
            if buffered > 0 {
                let k = buffered.min(total - produced);
                if writable_part(iov, produced, k, &mut scratch).is_err() {
                    finish!(Err(libc::EIO));
                }
                copy_to_iov(iov, produced, &fs.rbuf[fs.rpos..fs.rpos + k]);
                fs.rpos += k;
                produced += k;
                continue;
            }
            if writable_part(iov, produced, total - produced, &mut scratch).is_err() {
                finish!(Err(libc::EIO));
            }
            match sys::recvmsg(fd, &scratch, fl) {
                Ok(n) => return Ok(produced + n),
                Err(e) => finish!(Err(e)),
            }
        }
        match fs.in_frame {
            InFrame::Virt(r, left) => {
                let k = left.min(total - produced);
                sub_iov(iov, produced, k, &mut scratch);
                let part = r.slice((r.len as usize - left) as u64, k as u32);
                if let Err(_e) = with_reg(|r| place_virtual(r, &scratch, part)) {
                    // The referenced bytes cannot be had (agent gone, buffer evicted, forged
                    // reference): fail the connection, never hand out wrong bytes.
                    fs.broken = true;
                    return Err(libc::ECONNRESET);
                }
                produced += k;
                let left = left - k;
                fs.in_frame = if left == 0 {
                    InFrame::None
                } else {
                    InFrame::Virt(r, left)
                };
            }
            InFrame::Real(left) if buffered > 0 => {
                let k = left.min(buffered).min(total - produced);
                if writable_part(iov, produced, k, &mut scratch).is_err() {
                    finish!(Err(libc::EIO));
                }
                copy_to_iov(iov, produced, &fs.rbuf[fs.rpos..fs.rpos + k]);
                fs.rpos += k;
                produced += k;
                took_real(fs, left, k);
            }
            // A frame's data longer than the buffer, or filling the application's: read it
            // straight into the application's memory.
            InFrame::Real(left) if left >= RBUF || left >= total - produced => {
                let k = left.min(total - produced);
                if writable_part(iov, produced, k, &mut scratch).is_err() {
                    finish!(Err(libc::EIO));
                }
                match sys::recvmsg(fd, &scratch, fl) {
                    Ok(0) => finish!(Ok(0)),
                    Ok(n) => {
                        produced += n;
                        took_real(fs, left, n);
                        if n < k {
                            return Ok(produced); // the socket is drained
                        }
                    }
                    Err(e) => finish!(Err(e)),
                }
            }
            InFrame::None if buffered > 0 => {
                match proto::parse_header(&fs.rbuf[fs.rpos..fs.rlen]) {
                    Ok(Some((h, hl))) => {
                        fs.framed_seen = true;
                        fs.rpos += hl;
                        fs.in_frame = match h {
                            Header::Real(l) => InFrame::Real(l as usize),
                            Header::Virtual(r) => InFrame::Virt(r, r.len as usize),
                        };
                    }
                    Ok(None) => {
                        // part of a header: keep it at the front and read the rest
                        fs.rbuf.copy_within(fs.rpos..fs.rlen, 0);
                        (fs.rlen, fs.rpos) = (buffered, 0);
                        if seen_all && produced > 0 {
                            return Ok(produced);
                        }
                        match read_stream(fs, fd, fl) {
                            Ok(0) => {
                                // the peer closed inside a header
                                fs.broken = true;
                                finish!(Err(libc::ECONNRESET));
                            }
                            Ok(n) => seen_all = n < RBUF - buffered,
                            Err(e) => finish!(Err(e)),
                        }
                    }
                    Err(ProtoError::NotFramed) if !fs.framed_seen => {
                        // a peer that does not speak ODB: these bytes and all later ones
                        // are the application's as they are
                        fs.raw = true;
                        stats::RAW_CONNS.fetch_add(1, Relaxed);
                    }
                    Err(_) => {
                        fs.broken = true;
                        stats::PROTO_ERRORS.fetch_add(1, Relaxed);
                        finish!(Err(libc::ECONNRESET));
                    }
                }
            }
            // Nothing buffered, at a frame boundary or inside a short R frame: read.
            InFrame::None | InFrame::Real(_) => {
                if seen_all && produced > 0 {
                    return Ok(produced);
                }
                (fs.rlen, fs.rpos) = (0, 0);
                match read_stream(fs, fd, fl) {
                    Ok(0) => {
                        if matches!(fs.in_frame, InFrame::Real(_)) {
                            fs.broken = true; // the peer closed inside a frame
                            finish!(Err(libc::ECONNRESET));
                        }
                        finish!(Ok(0))
                    }
                    Ok(n) => seen_all = n < RBUF,
                    Err(e) => finish!(Err(e)),
                }
            }
        }
    }
}

/// `n` bytes of the current R frame, of which `left` remained, went to the application.
fn took_real(fs: &mut FdState, left: usize, n: usize) {
    stats::R_IN_BYTES.fetch_add(n as u64, Relaxed);
    fs.in_frame = if left == n {
        InFrame::None
    } else {
        InFrame::Real(left - n)
    };
}

/// Size of a connection's stream buffer: two pages, so that an R frame filling a page (a
/// response's header and head bytes, see `odb_sendfile`), the V header behind it and the
/// tail frame (under a page) come in one read.
const RBUF: usize = 8192;

/// Reads from the kernel into the free end of the stream buffer; returns the bytes read.
/// (An application's MSG_WAITALL would wait for the buffer's size, not for its own: the
/// receive loop asks again instead.)
fn read_stream(fs: &mut FdState, fd: c_int, fl: c_int) -> Result<usize, c_int> {
    let free = RBUF - fs.rlen;
    let n = sys::recv(
        fd,
        fs.rbuf[fs.rlen..].as_mut_ptr(),
        free,
        fl & !libc::MSG_WAITALL,
    )?;
    fs.rlen += n;
    Ok(n)
}

/// Copies `src` into the application's iovecs starting `at` bytes into them.
fn copy_to_iov(iov: &[iovec], mut at: usize, mut src: &[u8]) {
    for v in iov {
        if src.is_empty() {
            return;
        }
        if at >= v.iov_len {
            at -= v.iov_len;
            continue;
        }
        let k = (v.iov_len - at).min(src.len());
        // SAFETY: the application's buffer: iov_base..iov_base+iov_len is writable memory it
        // handed to recv (prepare_overwrite made any protected page of it writable).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), (v.iov_base as *mut u8).add(at), k) };
        src = &src[k..];
        at = 0;
    }
}

// ---------------------------------------------------------------- sending

enum Seg {
    Real(usize, usize),
    Virt(Ref),
}

// The per-call lists of the send and receive paths live on the stack up to 8 entries (nginx
// passes one to three buffers): a heap list per call was four to eight allocations per send,
// each through the `malloc` this library interposes.
type Iovs = SmallVec<[iovec; 8]>;
type Segs = SmallVec<[Seg; 8]>;

/// Splits application memory into bytes we have (Real) and bytes still at an agent (Virt).
fn classify(pieces: &[iovec], segs: &mut Segs) {
    enum Found {
        Virt(regions::Region),
        Real(usize),
        Again,
    }
    for pc in pieces {
        let (mut a, e) = (pc.iov_base as usize, pc.iov_base as usize + pc.iov_len);
        while a < e {
            // one short registry section per step; the pushes (allocation) happen outside
            let found = with_reg(|r| {
                if let Some(i) = r.regions.find(a) {
                    // no stale-page check: see the invariants of `alloc`
                    let g = r.regions.v[i];
                    if g.dead {
                        // freed memory sent anyway: accessible again, its bytes as they are
                        let _ = r.regions.take(g.start, g.end, false, &mut r.conns);
                        return Found::Again;
                    }
                    return Found::Virt(g);
                }
                let next = r
                    .regions
                    .v
                    .iter()
                    .filter(|g| g.start > a && g.start < e)
                    .map(|g| g.start)
                    .min()
                    .unwrap_or(e);
                Found::Real(next)
            });
            match found {
                Found::Virt(g) => {
                    let end = e.min(g.end);
                    segs.push(Seg::Virt(g.r.slice((a - g.start) as u64, (end - a) as u32)));
                    a = end;
                }
                Found::Again => {}
                Found::Real(next) => {
                    match segs.last_mut() {
                        Some(Seg::Real(p, l)) if *p + *l == a => *l += next - a,
                        _ => segs.push(Seg::Real(a, next - a)),
                    }
                    a = next;
                }
            }
        }
    }
}

/// Our own bytes of at least the threshold go to the local agent and travel as references.
fn store_large(st: &mut State, segs: &mut [Seg]) {
    let th = CONFIG.get().map_or(usize::MAX, |c| c.threshold);
    let Some(store) = st.store.as_mut() else {
        return;
    };
    for s in segs.iter_mut() {
        if let Seg::Real(p, l) = *s {
            if l < th || l > proto::MAX_FRAME as usize {
                continue;
            }
            match store.alloc(l as u32) {
                Ok((dst, r)) => {
                    // SAFETY: p..p+l is real application memory (classify found no protected
                    // page in it); dst..dst+l was just reserved for us in the arena.
                    unsafe { std::ptr::copy_nonoverlapping(p as *const u8, dst, l) };
                    stats::STORED_BYTES.fetch_add(l as u64, Relaxed);
                    *s = Seg::Virt(r);
                }
                Err(_) => {
                    stats::STORE_FALLBACKS.fetch_add(1, Relaxed);
                }
            }
        }
    }
}

fn is_nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL has no memory arguments.
    let f = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    f >= 0 && f & libc::O_NONBLOCK != 0
}

/// Sends what is left of a partly sent header. Ok(true): nothing pending any more.
fn flush_pending(fs: &mut FdState, fd: c_int, flags: c_int) -> Result<bool, c_int> {
    while !fs.out_pending.is_empty() {
        let v = [iovec {
            iov_base: fs.out_pending.as_ptr() as *mut c_void,
            iov_len: fs.out_pending.len(),
        }];
        match sys::sendmsg(fd, &v, flags) {
            Ok(n) => {
                fs.out_pending.drain(..n);
            }
            Err(libc::EAGAIN) if !is_nonblocking(fd) => {}
            Err(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
        if !fs.out_pending.is_empty() && is_nonblocking(fd) {
            return Ok(false);
        }
    }
    Ok(true)
}

fn odb_send(
    st: &mut State,
    fs: &mut FdState,
    fd: c_int,
    iov: &[iovec],
    flags: c_int,
) -> Result<usize, c_int> {
    let total = iov_total(iov);
    if fs.raw {
        return send_staged(iov, |v| sys::sendmsg(fd, v, flags));
    }
    if !flush_pending(fs, fd, flags)? {
        return Err(libc::EAGAIN);
    }
    let mut consumed = 0usize;
    let mut scratch = Iovs::new();
    match fs.out_frame {
        OutFrame::None => {}
        OutFrame::Real(left) => {
            let k = left.min(total);
            sub_iov(iov, 0, k, &mut scratch);
            let n = send_staged(&scratch, |v| sys::sendmsg(fd, v, flags))?;
            stats::R_OUT_BYTES.fetch_add(n as u64, Relaxed);
            fs.out_frame = if n == left {
                OutFrame::None
            } else {
                OutFrame::Real(left - n)
            };
            if n < k || n == total {
                return Ok(n);
            }
            consumed = n;
        }
        OutFrame::Virt(left) => {
            let k = left.min(total);
            fs.out_frame = if k == left {
                OutFrame::None
            } else {
                OutFrame::Virt(left - k)
            };
            if k == total {
                return Ok(k);
            }
            consumed = k;
        }
    }
    // Frame the rest.
    sub_iov(iov, consumed, total - consumed, &mut scratch);
    let mut segs = Segs::new();
    if REGION_COUNT.load(Relaxed) == 0 {
        segs.extend(
            scratch
                .iter()
                .map(|v| Seg::Real(v.iov_base as usize, v.iov_len)),
        );
    } else {
        classify(&scratch, &mut segs);
    }
    store_large(st, &mut segs);
    // Group: consecutive Real segments form one R frame.
    struct Frame {
        hdr: [u8; proto::V_HDR],
        hdr_len: usize,
        app_len: usize,
        real: bool,
        first_seg: usize,
        nsegs: usize,
    }
    let mut frames: SmallVec<[Frame; 4]> = SmallVec::new();
    for (i, s) in segs.iter().enumerate() {
        match s {
            Seg::Real(_, l) => match frames.last_mut() {
                Some(f) if f.real && f.app_len + l <= proto::MAX_FRAME as usize => {
                    f.app_len += l;
                    f.nsegs += 1;
                }
                _ => frames.push(Frame {
                    hdr: [0; proto::V_HDR],
                    hdr_len: proto::R_HDR,
                    app_len: *l,
                    real: true,
                    first_seg: i,
                    nsegs: 1,
                }),
            },
            Seg::Virt(r) => frames.push(Frame {
                hdr: r.encode(),
                hdr_len: proto::V_HDR,
                app_len: r.len as usize,
                real: false,
                first_seg: i,
                nsegs: 1,
            }),
        }
    }
    for f in frames.iter_mut().filter(|f| f.real) {
        f.hdr[..proto::R_HDR].copy_from_slice(&proto::encode_r(f.app_len as u32));
    }
    // Bound the iovec count (IOV_MAX): fewer frames now, a short write, the rest next call.
    let mut vecs = Iovs::new();
    let mut nframes = 0;
    for f in &frames {
        let need = 1 + if f.real { f.nsegs } else { 0 };
        if vecs.len() + need > 1024 {
            break;
        }
        vecs.push(iovec {
            iov_base: f.hdr.as_ptr() as *mut c_void,
            iov_len: f.hdr_len,
        });
        if f.real {
            for s in &segs[f.first_seg..f.first_seg + f.nsegs] {
                if let Seg::Real(p, l) = *s {
                    vecs.push(iovec {
                        iov_base: p as *mut c_void,
                        iov_len: l,
                    });
                }
            }
        }
        nframes += 1;
    }
    let n = match sys::sendmsg(fd, &vecs, flags) {
        Ok(n) => n,
        Err(e) => return if consumed > 0 { Ok(consumed) } else { Err(e) },
    };
    let mut n_left = n;
    for f in &frames[..nframes] {
        let wire = f.hdr_len + if f.real { f.app_len } else { 0 };
        if n_left >= wire {
            consumed += f.app_len;
            n_left -= wire;
            if f.real {
                stats::R_OUT_BYTES.fetch_add(f.app_len as u64, Relaxed);
            } else {
                stats::V_OUT_BYTES.fetch_add(f.app_len as u64, Relaxed);
                stats::V_OUT_FRAMES.fetch_add(1, Relaxed);
            }
            continue;
        }
        if n_left >= f.hdr_len {
            // R header out, part of its data: the app offers the rest again
            let sent = n_left - f.hdr_len;
            consumed += sent;
            stats::R_OUT_BYTES.fetch_add(sent as u64, Relaxed);
            fs.out_frame = OutFrame::Real(f.app_len - sent);
        } else if n_left > 0 {
            fs.out_pending.extend_from_slice(&f.hdr[n_left..f.hdr_len]);
            fs.out_frame = if f.real {
                OutFrame::Real(f.app_len)
            } else {
                OutFrame::Virt(f.app_len)
            };
            if !f.real {
                stats::V_OUT_BYTES.fetch_add(f.app_len as u64, Relaxed);
                stats::V_OUT_FRAMES.fetch_add(1, Relaxed);
            }
            if consumed == 0 && !is_nonblocking(fd) {
                flush_pending(fs, fd, flags)?;
                return odb_send(st, fs, fd, iov, flags);
            }
        }
        break;
    }
    if consumed == 0 {
        return Err(libc::EAGAIN);
    }
    Ok(consumed)
}

/// sendfile on a domain socket: a large range goes to the agent (read from the file straight
/// into the arena) and travels as a reference; a small one as an R frame.
fn odb_sendfile(
    st: &mut State,
    fs: &mut FdState,
    out: c_int,
    inp: c_int,
    off: *mut i64,
    count: usize,
) -> Result<usize, c_int> {
    if fs.raw {
        return sys::sendfile(out, inp, off, count);
    }
    if !flush_pending(fs, out, 0)? {
        return Err(libc::EAGAIN);
    }
    // the file position to use (and update)
    let pos = if off.is_null() {
        sys::lseek(inp, 0, libc::SEEK_CUR)? as i64
    } else {
        // SAFETY: the caller passes a valid off_t pointer (sendfile's contract).
        unsafe { *off }
    };
    let advance = |n: usize| -> Result<(), c_int> {
        if off.is_null() {
            sys::lseek(inp, pos + n as i64, libc::SEEK_SET)?;
        } else {
            // SAFETY: as above.
            unsafe { *off = pos + n as i64 };
        }
        Ok(())
    };
    match fs.out_frame {
        OutFrame::Real(left) => {
            let mut p = pos;
            let n = sys::sendfile(out, inp, &mut p, left.min(count))?;
            advance(n)?;
            stats::R_OUT_BYTES.fetch_add(n as u64, Relaxed);
            fs.out_frame = if n == left {
                OutFrame::None
            } else {
                OutFrame::Real(left - n)
            };
            return Ok(n);
        }
        OutFrame::Virt(left) => {
            let k = left.min(count);
            advance(k)?;
            fs.out_frame = if k == left {
                OutFrame::None
            } else {
                OutFrame::Virt(left - k)
            };
            return Ok(k);
        }
        OutFrame::None => {}
    }
    // Stream alignment: the receiver reads a response into a fresh page-aligned buffer
    // (nginx's header buffer, then its proxy buffers: see `alloc`) starting with the first
    // byte sent since the request came in. Real bytes up to the next page boundary of that
    // stream, then a reference of whole pages, then the tail (less than a page) as real
    // bytes: the reference lands on whole pages there and the receiver (the IS) fetches
    // nothing — it moves the page holding the response header as real bytes instead of
    // fetching its body part from the agent (a blocking round trip). Costs nothing when the
    // receiver's buffers are laid out otherwise: it then fetches partial pages as before.
    let th = CONFIG.get().map_or(usize::MAX, |c| c.threshold);
    use regions::{round_down, PAGE};
    let mis = fs.out_since_in % PAGE;
    let head = if mis != 0 && st.store.is_some() && count >= PAGE - mis + th {
        PAGE - mis
    } else {
        0
    };
    if let Some(n) = sendfile_whole(st, fs, out, inp, pos, count, head, th) {
        let n = n?;
        advance(n)?;
        return Ok(n);
    }
    let mut sent = 0usize;
    if head > 0 {
        let n = sendfile_r(fs, out, inp, pos, head)?;
        if n < head {
            advance(n)?;
            return Ok(n);
        }
        sent = n;
        stats::ALIGN_PADS.fetch_add(1, Relaxed);
    }
    let rest = count - sent;
    let vlen = if mis == 0 || head > 0 {
        round_down(rest.min(MAX_V))
    } else {
        rest.min(MAX_V)
    };
    // A reference pays only for the whole pages it leaves at the receiver: the partial
    // pages at its ends are fetched at once. Too short to pad to a page boundary, a 4 KiB
    // body behind a 257-byte header spans two partial pages and nothing else: sent by
    // reference, it cost the IS two fetches and bypassed nothing (`whole_pages_at`).
    let whole = whole_pages_at((fs.out_since_in + sent) % PAGE, vlen);
    if vlen >= th && whole >= th {
        match sendfile_v(st, fs, out, inp, pos + sent as i64, vlen) {
            Ok(Some(got)) => {
                sent += got;
                let tail = count - sent;
                if got == vlen && tail > 0 && tail < PAGE {
                    if let Ok(n) = sendfile_r(fs, out, inp, pos + sent as i64, tail) {
                        sent += n;
                    }
                }
                advance(sent)?;
                return Ok(sent);
            }
            Ok(None) => {}
            Err(e) => {
                if sent > 0 {
                    advance(sent)?;
                    return Ok(sent);
                }
                return Err(e);
            }
        }
    }
    match sendfile_r(fs, out, inp, pos + sent as i64, rest) {
        Ok(n) => {
            advance(sent + n)?;
            Ok(sent + n)
        }
        Err(_) if sent > 0 => {
            advance(sent)?;
            Ok(sent)
        }
        Err(e) => Err(e),
    }
}

/// Largest reference one `sendfile` call makes (a larger file goes as several).
const MAX_V: usize = 4 << 20;

/// Bytes of whole pages in a range of `len` bytes starting `at` bytes into a page.
fn whole_pages_at(at: usize, len: usize) -> usize {
    use regions::{round_down, round_up};
    round_down(at + len).saturating_sub(round_up(at))
}

/// The common case in one read and one send: real head bytes (up to the page boundary),
/// a reference of whole pages, and a tail of less than a page. `preadv` reads the head and
/// tail into the stack and the middle straight into the agent's arena; one `sendmsg`
/// carries the three frames (before: a send and a `sendfile` per R frame, a send for the
/// V header, and the receiver woke for the head before the store's round trip let the
/// rest go). None: not this case (the caller's general path).
/// Some(Ok(n)): n application bytes are accounted for (`out_frame`/`out_pending` say
/// what a short send still owes, as the general path does).
#[allow(clippy::too_many_arguments)]
fn sendfile_whole(
    st: &mut State,
    fs: &mut FdState,
    out: c_int,
    inp: c_int,
    pos: i64,
    count: usize,
    head: usize,
    th: usize,
) -> Option<Result<usize, c_int>> {
    use regions::{round_down, PAGE};
    if fs.out_since_in % PAGE != 0 && head == 0 {
        return None; // misaligned and too short to pad: the general path decides
    }
    let vlen = round_down(count - head);
    let tail = count - head - vlen;
    if vlen < th || vlen > MAX_V {
        return None;
    }
    let store = st.store.as_mut()?;
    // No room (or a file that changed under us, below): the bytes go as they are, here —
    // the general path would ask the agent for room a second time for the same response.
    let (dst, r) = match store.alloc(vlen as u32) {
        Ok(x) => x,
        Err(_) => {
            stats::STORE_FALLBACKS.fetch_add(1, Relaxed);
            return Some(sendfile_r(fs, out, inp, pos, count));
        }
    };
    let mut hb = [0u8; PAGE];
    let mut tb = [0u8; PAGE];
    let rd = [
        iovec {
            iov_base: hb.as_mut_ptr().cast(),
            iov_len: head,
        },
        iovec {
            iov_base: dst.cast(),
            iov_len: vlen,
        },
        iovec {
            iov_base: tb.as_mut_ptr().cast(),
            iov_len: tail,
        },
    ];
    // SAFETY (of the arena iovec): dst..dst+vlen is our reservation in the arena.
    match sys::preadv(inp, rd.as_ptr(), 3, pos, 0) {
        Ok(n) if n == count => {}
        // a file that changed under us: the reservation expires at the agent unused
        _ => {
            stats::STORE_WASTED.fetch_add(1, Relaxed);
            return Some(sendfile_r(fs, out, inp, pos, count));
        }
    }
    let rh = proto::encode_r(head as u32);
    let vh = r.slice(0, vlen as u32).encode();
    let th_ = proto::encode_r(tail as u32);
    let parts: [&[u8]; 5] = [
        if head > 0 { &rh } else { &[] },
        &hb[..head],
        &vh,
        if tail > 0 { &th_ } else { &[] },
        &tb[..tail],
    ];
    let mut iov = [iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 5];
    let mut k = 0;
    for p in parts.iter().filter(|p| !p.is_empty()) {
        iov[k] = iovec {
            iov_base: p.as_ptr() as *mut c_void,
            iov_len: p.len(),
        };
        k += 1;
    }
    let n = match sys::sendmsg(out, &iov[..k], 0) {
        Ok(n) => n,
        Err(e) => {
            stats::STORE_WASTED.fetch_add(1, Relaxed);
            return Some(Err(e));
        }
    };
    stats::STORED_BYTES.fetch_add(vlen as u64, Relaxed);
    if head > 0 {
        stats::ALIGN_PADS.fetch_add(1, Relaxed);
    }
    // What the n bytes sent cover, part by part: application bytes consumed, and what is
    // owed (the rest of a header goes first next time; the application offers its bytes
    // again from where the count stops).
    let mut left = n;
    let mut app = 0usize;
    let real = |fs: &mut FdState, hdr: &[u8], data: usize, left: &mut usize, app: &mut usize| {
        if *left < hdr.len() {
            fs.out_pending.extend_from_slice(&hdr[*left..]);
            fs.out_frame = OutFrame::Real(data);
            *left = 0;
            return false;
        }
        *left -= hdr.len();
        let d = (*left).min(data);
        *left -= d;
        *app += d;
        stats::R_OUT_BYTES.fetch_add(d as u64, Relaxed);
        fs.out_frame = if d == data {
            OutFrame::None
        } else {
            OutFrame::Real(data - d)
        };
        d == data
    };
    if head > 0 && !real(fs, &rh, head, &mut left, &mut app) {
        return Some(if app > 0 { Ok(app) } else { Err(libc::EAGAIN) });
    }
    if left < vh.len() {
        fs.out_pending.extend_from_slice(&vh[left..]);
        fs.out_frame = OutFrame::Virt(vlen);
        return Some(if app > 0 { Ok(app) } else { Err(libc::EAGAIN) });
    }
    left -= vh.len();
    app += vlen;
    stats::V_OUT_BYTES.fetch_add(vlen as u64, Relaxed);
    stats::V_OUT_FRAMES.fetch_add(1, Relaxed);
    fs.out_frame = OutFrame::None;
    if tail > 0 {
        real(fs, &th_, tail, &mut left, &mut app);
    }
    Some(Ok(app))
}

/// Sends `len` bytes of file `inp` from `pos` as a reference stored at the local agent.
/// Ok(None): no agent or no room (the caller sends them as real bytes). Ok(Some(n)): the
/// frame is out and stands for n bytes; Err(EAGAIN) with `out_frame` set when its header
/// went out only in part (the application offers those bytes again).
fn sendfile_v(
    st: &mut State,
    fs: &mut FdState,
    out: c_int,
    inp: c_int,
    pos: i64,
    len: usize,
) -> Result<Option<usize>, c_int> {
    let Some(store) = st.store.as_mut() else {
        return Ok(None);
    };
    let (dst, r) = match store.alloc(len as u32) {
        Ok(x) => x,
        Err(_) => {
            stats::STORE_FALLBACKS.fetch_add(1, Relaxed);
            return Ok(None);
        }
    };
    let mut got = 0;
    while got < len {
        match sys::pread(
            inp,
            // SAFETY: got < len and dst..dst+len is our reservation in the arena, so
            // dst+got stays inside it.
            unsafe { dst.add(got) }.cast(),
            len - got,
            pos + got as i64,
        ) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    if got == 0 {
        return Ok(None);
    }
    let r = r.slice(0, got as u32);
    let hdr = r.encode();
    stats::STORED_BYTES.fetch_add(got as u64, Relaxed);
    let v = [iovec {
        iov_base: hdr.as_ptr() as *mut c_void,
        iov_len: hdr.len(),
    }];
    let n = sys::sendmsg(out, &v, 0)?;
    stats::V_OUT_BYTES.fetch_add(got as u64, Relaxed);
    stats::V_OUT_FRAMES.fetch_add(1, Relaxed);
    if n == hdr.len() {
        return Ok(Some(got));
    }
    fs.out_pending.extend_from_slice(&hdr[n..]);
    fs.out_frame = OutFrame::Virt(got);
    Err(libc::EAGAIN)
}

/// Sends up to `count` bytes of file `inp` from `pos` as an R frame (sendfile for the data).
/// Returns the data bytes sent; a short send leaves `out_frame` saying what is owed.
fn sendfile_r(
    fs: &mut FdState,
    out: c_int,
    inp: c_int,
    pos: i64,
    count: usize,
) -> Result<usize, c_int> {
    let len = count.min(proto::MAX_FRAME as usize);
    let hdr = proto::encode_r(len as u32);
    let v = [iovec {
        iov_base: hdr.as_ptr() as *mut c_void,
        iov_len: hdr.len(),
    }];
    let n = sys::sendmsg(out, &v, 0)?;
    if n < hdr.len() {
        fs.out_pending.extend_from_slice(&hdr[n..]);
        fs.out_frame = OutFrame::Real(len);
        return Err(libc::EAGAIN);
    }
    let mut p = pos;
    match sys::sendfile(out, inp, &mut p, len) {
        Ok(n) => {
            stats::R_OUT_BYTES.fetch_add(n as u64, Relaxed);
            fs.out_frame = if n == len {
                OutFrame::None
            } else {
                OutFrame::Real(len - n)
            };
            Ok(n)
        }
        Err(e) => {
            // header sent, no data: the app will offer the same range again
            fs.out_frame = OutFrame::Real(len);
            Err(e)
        }
    }
}

// ---------------------------------------------------------------- dispatch

/// Runs `f` on the fd's state (taken out of the table meanwhile, so `f` can also use the
/// registry and the agent connections).
fn with_fd<R>(fd: c_int, f: impl FnOnce(&mut State, &mut FdState) -> R) -> Option<R> {
    with_state(|st| {
        let mut fs = st.fds.get_mut(fd as usize)?.take()?;
        let r = f(st, &mut fs);
        st.fds[fd as usize] = Some(fs);
        Some(r)
    })
}

fn domain_recv(fd: c_int, iov: &[iovec], flags: c_int) -> Option<ssize_t> {
    if flags & libc::MSG_PEEK != 0 {
        return None; // liveness checks only: answered by the kernel
    }
    let r = with_fd(fd, |st, fs| {
        let r = odb_recv(st, fs, fd, iov, flags);
        if matches!(r, Ok(n) if n > 0) {
            fs.out_since_in = 0;
        }
        trace::call("recv", fd, iov_total(iov), &r, fs);
        r
    })?;
    dump_stats();
    Some(done(r))
}

fn domain_send(fd: c_int, iov: &[iovec], flags: c_int) -> Option<ssize_t> {
    let r = with_fd(fd, |st, fs| {
        let r = odb_send(st, fs, fd, iov, flags);
        if let Ok(n) = r {
            fs.out_since_in += n;
        }
        trace::call("send", fd, iov_total(iov), &r, fs);
        r
    })?;
    dump_stats();
    Some(done(r))
}

/// `IOLAB_ODB_TRACE=DIR`: one line per intercepted call on a domain socket, in
/// `DIR/trace-<pid>.log` (for hunting lost bytes and wake-ups; costly, off by default).
mod trace {
    use super::*;
    static FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-2);

    fn fd() -> c_int {
        let f = FD.load(Relaxed);
        if f != -2 {
            return f;
        }
        let mut out = -1;
        if let Some(dir) = std::env::var_os("IOLAB_ODB_TRACE") {
            // SAFETY: getpid has no preconditions.
            let pid = unsafe { libc::getpid() };
            let p = std::path::Path::new(&dir).join(format!("trace-{pid}.log"));
            if let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) {
                // SAFETY: a NUL-terminated path; the fd is kept for the process's life.
                out = unsafe {
                    libc::open(
                        c.as_ptr(),
                        libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC,
                        0o666,
                    )
                };
            }
        }
        FD.store(out, Relaxed);
        out
    }

    pub(crate) fn line(s: &str) {
        let f = fd();
        if f >= 0 {
            // SAFETY: writes our own buffer to our own fd.
            unsafe { libc::write(f, s.as_ptr().cast(), s.len()) };
        }
    }

    pub(crate) fn call(op: &str, fd_: c_int, asked: usize, r: &Result<usize, c_int>, fs: &FdState) {
        if FD.load(Relaxed) == -1 {
            return;
        }
        line(&format!(
            "{op} fd={fd_} asked={asked} -> {r:?} in={:?} out={:?} pending={}\n",
            fs.in_frame,
            fs.out_frame,
            fs.out_pending.len()
        ));
    }
}

/// Before the kernel writes into application memory (any fd): protected pages there must go.
fn before_kernel_writes(p: *const c_void, len: usize) -> Result<(), c_int> {
    if REGION_COUNT.load(Relaxed) == 0 || !ACTIVE.load(Relaxed) {
        return Ok(());
    }
    with_reg(|st| st.regions.prepare_overwrite(p as usize, len, &mut st.conns))
        .map_err(|_| libc::EIO)
}

/// Before the kernel reads application memory for a non-domain destination: fetch.
fn before_kernel_reads(iov: &[iovec]) -> Result<(), c_int> {
    if REGION_COUNT.load(Relaxed) == 0 || !ACTIVE.load(Relaxed) {
        return Ok(());
    }
    with_reg(|st| {
        let before = stats::FETCH_BYTES.load(Relaxed);
        let ranges = iov.iter().map(|x| (x.iov_base as usize, x.iov_len));
        let r = st.regions.materialize(ranges, &mut st.conns);
        stats::MATERIALIZED.fetch_add(stats::FETCH_BYTES.load(Relaxed) - before, Relaxed);
        r
    })
    .map_err(|_| libc::EIO)
}

/// The staging buffer of `send_staged`, kept between calls (taken out while in use).
static STAGE: Mutex<Vec<u8>> = Mutex::new(Vec::new());
/// Above this many referenced bytes in one call, they are fetched in place instead.
const STAGE_MAX: usize = 4 << 20;

/// Hands application memory that may hold referenced pages to the kernel for a destination
/// outside the domain (the client, a file): `send` gets the iovecs to send, `iov` itself
/// when nothing in it is at an agent, else iovecs whose referenced parts point into a
/// staging buffer of the library's, filled from the agents in pipelined batches. The
/// application's pages stay protected and registered: fetching into them took an
/// `mprotect` to open them, and their buffer's next response another to protect them again
/// (the FE's four per response); left protected, they become dead when the buffer is freed
/// and the next response's reference lands on them for free (see `alloc`). A later send of
/// the same bytes (after a partial write) fetches them again.
fn send_staged(
    iov: &[iovec],
    send: impl FnOnce(&[iovec]) -> Result<usize, c_int>,
) -> Result<usize, c_int> {
    if REGION_COUNT.load(Relaxed) == 0 || !ACTIVE.load(Relaxed) {
        return send(iov);
    }
    let mut segs = Segs::new();
    classify(iov, &mut segs);
    let virt: usize = segs
        .iter()
        .map(|s| match s {
            Seg::Virt(r) => r.len as usize,
            Seg::Real(..) => 0,
        })
        .sum();
    if virt == 0 {
        return send(iov);
    }
    if virt > STAGE_MAX || segs.len() > 1024 {
        before_kernel_reads(iov)?;
        return send(iov);
    }
    let mut stage = std::mem::take(&mut *STAGE.lock().unwrap_or_else(|e| e.into_inner()));
    if stage.len() < virt {
        stage.resize(virt, 0);
    }
    let base = stage.as_mut_ptr();
    let mut out = Iovs::with_capacity(segs.len());
    let fetched = with_reg(|st| {
        let mut jobs = regions::Fetches::new();
        let mut res = Ok(());
        let mut at = 0;
        for s in &segs {
            match *s {
                Seg::Real(p, l) => out.push(iovec {
                    iov_base: p as *mut c_void,
                    iov_len: l,
                }),
                Seg::Virt(r) => {
                    // SAFETY: at + r.len <= virt <= stage.len(): inside the staging buffer.
                    let dst = unsafe { base.add(at) };
                    out.push(iovec {
                        iov_base: dst.cast(),
                        iov_len: r.len as usize,
                    });
                    res = res.and(jobs.push(r, dst, &mut st.conns));
                    at += r.len as usize;
                }
            }
        }
        res.and(jobs.flush(&mut st.conns))
    });
    let r = match fetched {
        Ok(()) => {
            stats::MATERIALIZED.fetch_add(virt as u64, Relaxed);
            send(&out)
        }
        Err(_) => Err(libc::EIO),
    };
    *STAGE.lock().unwrap_or_else(|e| e.into_inner()) = stage;
    r
}

fn iov_slice<'a>(iov: *const iovec, cnt: c_int) -> Option<&'a [iovec]> {
    if iov.is_null() || !(0..=1024).contains(&cnt) {
        return None;
    }
    // SAFETY: the caller passes cnt valid iovecs (readv/writev's contract); checked non-null.
    Some(unsafe { std::slice::from_raw_parts(iov, cnt as usize) })
}

// ---------------------------------------------------------------- exported symbols

/// The one receive path of `recv`, `recvfrom`, `read`, `readv`, `pread64`: a domain socket
/// (`odb`: the call may carry ODB frames) goes through ODB; otherwise protected pages in the
/// destination are dropped or fetched and `kernel` makes the call. With no ODB fd and no
/// protected page anywhere, this is two relaxed loads before the system call.
fn recv_path(
    fd: c_int,
    iov: &[iovec],
    flags: c_int,
    odb: bool,
    kernel: impl FnOnce() -> Result<usize, c_int>,
) -> ssize_t {
    if odb && is_domain(fd) {
        if let Some(r) = domain_recv(fd, iov, flags) {
            return r;
        }
    }
    for x in iov {
        if let Err(e) = before_kernel_writes(x.iov_base, x.iov_len) {
            return fail(e);
        }
    }
    done(kernel())
}

/// The one send path of `send`, `sendto`, `write`, `writev`, `pwrite64`, `pwritev64` (see
/// `recv_path`): referenced bytes in the source are fetched for the kernel (`send_staged`);
/// `kernel` gets `iov` itself (make the call as the application made it) or the iovecs to
/// send instead.
fn send_path(
    fd: c_int,
    iov: &[iovec],
    flags: c_int,
    odb: bool,
    kernel: impl FnOnce(&[iovec]) -> Result<usize, c_int>,
) -> ssize_t {
    if odb && is_domain(fd) {
        if let Some(r) = domain_send(fd, iov, flags) {
            return r;
        }
    }
    done(send_staged(iov, kernel))
}

/// One iovec for the single-buffer calls.
fn one(buf: *const c_void, len: size_t) -> [iovec; 1] {
    [iovec {
        iov_base: buf as *mut c_void,
        iov_len: len,
    }]
}

/// An application's iovec array; an invalid one (null, count out of range) is passed to
/// the kernel untouched, which reports the error.
fn iovs<'a>(iov: *const iovec, cnt: c_int) -> (&'a [iovec], bool) {
    match iov_slice(iov, cnt) {
        Some(v) => (v, true),
        None => (&[], false),
    }
}

/// # Safety
/// libc's `recv` contract.
#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    let null = std::ptr::null_mut();
    recv_path(fd, &one(buf, len), flags, true, || {
        sys::recvfrom(fd, buf, len, flags, null, null.cast())
    })
}

/// # Safety
/// libc's `recvfrom` contract.
#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut libc::sockaddr,
    alen: *mut libc::socklen_t,
) -> ssize_t {
    recv_path(fd, &one(buf, len), flags, addr.is_null(), || {
        sys::recvfrom(fd, buf, len, flags, addr, alen)
    })
}

/// # Safety
/// libc's `read` contract.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    recv_path(fd, &one(buf, len), 0, true, || sys::read(fd, buf, len))
}

/// # Safety
/// libc's `readv` contract.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    let (v, ok) = iovs(iov, cnt);
    recv_path(fd, v, 0, ok, || sys::readv(fd, iov, cnt))
}

/// # Safety
/// libc's `write` contract.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    let o = one(buf, len);
    send_path(fd, &o, 0, true, |v| {
        if std::ptr::eq(v, &o[..]) {
            sys::write(fd, buf, len)
        } else {
            sys::writev(fd, v.as_ptr(), v.len() as c_int)
        }
    })
}

/// # Safety
/// libc's `writev` contract.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    let (v, ok) = iovs(iov, cnt);
    send_path(fd, v, 0, ok, |w| {
        if std::ptr::eq(w, v) {
            sys::writev(fd, iov, cnt)
        } else {
            sys::writev(fd, w.as_ptr(), w.len() as c_int)
        }
    })
}

/// # Safety
/// libc's `send` contract.
#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    let o = one(buf, len);
    send_path(fd, &o, flags, true, |v| {
        if std::ptr::eq(v, &o[..]) {
            sys::sendto(fd, buf, len, flags, std::ptr::null(), 0)
        } else {
            sys::sendmsg(fd, v, flags)
        }
    })
}

/// # Safety
/// libc's `sendto` contract.
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const libc::sockaddr,
    alen: libc::socklen_t,
) -> ssize_t {
    let o = one(buf, len);
    send_path(fd, &o, flags, addr.is_null(), |v| {
        if std::ptr::eq(v, &o[..]) {
            sys::sendto(fd, buf, len, flags, addr, alen)
        } else {
            sys::sendmsg_to(fd, v, flags, addr, alen)
        }
    })
}

/// # Safety
/// libc's `sendfile64` contract.
#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    inp: c_int,
    off: *mut i64,
    count: size_t,
) -> ssize_t {
    if is_domain(out) {
        if let Some(r) = with_fd(out, |st, fs| {
            let r = odb_sendfile(st, fs, out, inp, off, count);
            if let Ok(n) = r {
                fs.out_since_in += n;
            }
            trace::call("sendfile", out, count, &r, fs);
            r
        }) {
            dump_stats();
            return done(r);
        }
    }
    done(sys::sendfile(out, inp, off, count))
}

/// # Safety
/// libc's `sendfile` contract (64-bit off_t on x86_64).
#[no_mangle]
pub unsafe extern "C" fn sendfile(out: c_int, inp: c_int, off: *mut i64, count: size_t) -> ssize_t {
    // SAFETY: same contract.
    unsafe { sendfile64(out, inp, off, count) }
}

/// # Safety
/// libc's `connect` contract.
#[no_mangle]
pub unsafe extern "C" fn connect(
    fd: c_int,
    addr: *const libc::sockaddr,
    alen: libc::socklen_t,
) -> c_int {
    if ACTIVE.load(Relaxed) {
        set_domain(fd, peer_in_domain(addr, alen));
    }
    match sys::connect(fd, addr, alen) {
        Ok(_) => 0,
        Err(e) => fail(e) as c_int,
    }
}

fn after_accept(fd: c_int) {
    if fd < 0 || !ACTIVE.load(Relaxed) {
        return;
    }
    // SAFETY: a zeroed sockaddr_in is valid; getpeername fills at most its size.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let ok = sys::getpeername(fd, (&mut sa as *mut libc::sockaddr_in).cast(), &mut len).is_ok();
    set_domain(
        fd,
        ok && peer_in_domain((&sa as *const libc::sockaddr_in).cast(), len),
    );
}

/// # Safety
/// libc's `accept4` contract.
#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut libc::sockaddr,
    alen: *mut libc::socklen_t,
    flags: c_int,
) -> c_int {
    match sys::accept4(fd, addr, alen, flags) {
        Ok(n) => {
            after_accept(n as c_int);
            n as c_int
        }
        Err(e) => fail(e) as c_int,
    }
}

/// # Safety
/// libc's `accept` contract.
#[no_mangle]
pub unsafe extern "C" fn accept(
    fd: c_int,
    addr: *mut libc::sockaddr,
    alen: *mut libc::socklen_t,
) -> c_int {
    // SAFETY: same contract.
    unsafe { accept4(fd, addr, alen, 0) }
}

/// # Safety
/// libc's `close` contract.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if is_domain(fd) {
        set_domain(fd, false);
    }
    match sys::close(fd) {
        Ok(_) => 0,
        Err(e) => fail(e) as c_int,
    }
}

/// What FIONREAD reports on a domain socket. nginx (1.17.5+, `ngx_readv_chain` and
/// `ngx_unix_recv`) asks FIONREAD after a read that filled its buffer, then subtracts every
/// read from that count; when the count goes negative it concludes that bytes arrived after
/// the FIONREAD, clears `ready` and waits for the epoll edge of those bytes. That reasoning
/// holds for plain bytes, not for references: the 47-byte V header of a 2 MiB reference
/// that arrives after the FIONREAD is taken out of the kernel by the library, and nginx
/// then reads megabytes past its count, clears `ready`, and waits — with the rest of that
/// reference held here and nothing in the kernel to raise an edge (the 16 MiB stall; see
/// the test `a_reference_arriving_after_fionread_is_still_read`).
///
/// So the answer is an over-count whenever the application can read anything: nginx then
/// reads until a read comes back short, and the library returns short only when the kernel
/// queue is drained (the invariant of `odb_recv`), so the next byte that arrives raises an
/// edge. Zero only when the library holds nothing and the kernel queue is empty. Also
/// cheaper than walking the queued frame headers on every call.
fn readable_app_bytes(fs: &FdState, kernel: usize) -> usize {
    if fs.raw {
        return kernel + (fs.rlen - fs.rpos);
    }
    // Readable: a reference being placed, R data buffered, a complete header buffered, or
    // anything in the kernel. Part of a header alone is not.
    let buffered = &fs.rbuf[fs.rpos..fs.rlen];
    let readable = match fs.in_frame {
        InFrame::Virt(_, left) => left > 0,
        InFrame::Real(_) => !buffered.is_empty(),
        InFrame::None => matches!(proto::parse_header(buffered), Ok(Some(_)) | Err(_)),
    };
    if readable || kernel > 0 {
        i32::MAX as usize
    } else {
        0
    }
}

/// # Safety
/// libc's `ioctl` contract. Only FIONREAD on domain sockets is changed: it reports the bytes
/// the application can read (virtual ones included), not the bytes of frames in the kernel —
/// nginx reads an upstream only while this is non-zero.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: libc::c_ulong, arg: *mut c_void) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { libc::syscall(libc::SYS_ioctl, fd, req, arg) } as c_int;
    if r == 0 && req == libc::FIONREAD && !arg.is_null() && is_domain(fd) {
        // SAFETY: FIONREAD's argument is an int the kernel just wrote.
        let kernel = unsafe { *(arg as *mut c_int) }.max(0) as usize;
        let app = with_fd(fd, |_, fs| {
            let app = readable_app_bytes(fs, kernel);
            trace::call("fionread", fd, kernel, &Ok(app), fs);
            app
        })
        .unwrap_or(kernel);
        // SAFETY: as above.
        unsafe { *(arg as *mut c_int) = app.min(i32::MAX as usize) as c_int };
        return r;
    }
    r
}

/// # Safety
/// libc's `pread64` contract.
#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, len: size_t, off: i64) -> ssize_t {
    recv_path(fd, &one(buf, len), 0, false, || {
        sys::pread(fd, buf, len, off)
    })
}

/// # Safety
/// libc's `pwrite64` contract.
#[no_mangle]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, len: size_t, off: i64) -> ssize_t {
    let o = one(buf, len);
    send_path(fd, &o, 0, false, |v| {
        if std::ptr::eq(v, &o[..]) {
            sys::pwrite(fd, buf, len, off)
        } else {
            sys::pwritev(fd, v.as_ptr(), v.len() as c_int, off as libc::c_long, 0)
        }
    })
}

/// # Safety
/// libc's `pwritev64` contract.
#[no_mangle]
pub unsafe extern "C" fn pwritev64(fd: c_int, iov: *const iovec, cnt: c_int, off: i64) -> ssize_t {
    let (v, _) = iovs(iov, cnt);
    send_path(fd, v, 0, false, |w| {
        if std::ptr::eq(w, v) {
            sys::pwritev(fd, iov, cnt, off as libc::c_long, 0)
        } else {
            sys::pwritev(fd, w.as_ptr(), w.len() as c_int, off as libc::c_long, 0)
        }
    })
}
