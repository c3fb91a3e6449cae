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
//!
//! Layout: `frames` decides (the frame logic of a connection, without I/O: what the receive
//! path does next with the bytes it read, how a send is framed and what a short write owes);
//! `recv`, `send` and `sendfile` perform it; `exports` holds the interposed calls; this file
//! the configuration and the per-process state they share; `regions` and `alloc` the
//! protected pages and the page-aligned pool; `agentconn` the agent round trips; `sys` the
//! raw system calls.

mod agentconn;
mod alloc;
mod exports;
mod frames;
mod pages;
mod recv;
#[cfg(test)]
mod recv_peer;
mod regions;
mod send;
mod sendfile;
mod stats;
mod sys;
mod trace;

use agentconn::{Conns, Store};
use frames::{FrameReader, FrameWriter};
use libc::{c_int, ssize_t};
use regions::Registry;
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

/// A domain connection: its two frame streams, and where the receiver's buffer pages begin.
struct FdState {
    rx: FrameReader,
    tx: FrameWriter,
    /// Application bytes sent since a read last returned bytes (the start of a response,
    /// for a server): where the receiver's buffer pages begin (see `odb_sendfile`).
    out_since_in: usize,
}

impl FdState {
    fn new() -> FdState {
        FdState {
            rx: FrameReader::new(),
            tx: FrameWriter::new(),
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
