//! `iolab micro limits` — the limits that bite a server (seed 000, annexes E.1 and E.3).
//!
//! 1. `select` and FD_SETSIZE: an fd ≥ 1024 cannot be put in a glibc `fd_set` (our `FdSet`
//!    refuses it, as a select server must refuse the connection); the kernel's select itself
//!    takes a larger bitmap, which we show by waiting on fd ≥ 1024 with one.
//! 2. TIME_WAIT: connection-per-request load where the server closes first (as a web server
//!    does) leaves one TIME_WAIT socket per request on the server's port (counted from
//!    /proc/net/tcp); a restarted listener cannot bind that port without SO_REUSEADDR
//!    (EADDRINUSE), and on Linux can with it only if the old listener had it too. Rust's `TcpListener::bind` sets SO_REUSEADDR itself, so
//!    the test binds with raw sockets.
//! 3. Ephemeral ports: a client has `ip_local_port_range` ports per destination; measured on
//!    a narrowed range set per socket with IP_LOCAL_PORT_RANGE (Linux 6.3+; no sysctl is
//!    changed), connecting until EADDRNOTAVAIL. Then the same narrow range under
//!    connection-per-request load where the client closes first shows what tcp_tw_reuse does:
//!    with it, a port in TIME_WAIT is reused for a new connection once its last timestamp is
//!    at least 1 s old; without it, the range stays exhausted for the 60 s of TIME_WAIT.
//!
//! JSON fields: `"fd_setsize"`, `"select"` {highest_fd_in_fd_set, refused_fd,
//! kernel_select_on_high_fd}, `"time_wait"`: two runs [{requests, old_listener_reuseaddr,
//! time_wait_sockets, rebind_without_reuseaddr, rebind_with_reuseaddr}], `"ports"` {range, per_destination,
//! narrow_range, held_before_eaddrnotavail, tw_reuse, per_request_seconds,
//! per_request_ok, per_request_eaddrnotavail}, `"tables"`, `"figures"` (empty).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use iolab_sys::cvt;

use crate::osutil;
use crate::table::{Cell, Report, Table};

/// `IP_LOCAL_PORT_RANGE` from linux/in.h (not in the libc crate yet).
const IP_LOCAL_PORT_RANGE: libc::c_int = 51;

/// A glibc-compatible fd_set that refuses descriptors it cannot hold instead of writing out
/// of bounds (FD_SET with fd ≥ FD_SETSIZE is undefined behaviour in C).
pub struct FdSet(libc::fd_set);

impl Default for FdSet {
    fn default() -> Self {
        // SAFETY: fd_set is plain bits; FD_ZERO initialises it.
        unsafe {
            let mut s: libc::fd_set = std::mem::zeroed();
            libc::FD_ZERO(&mut s);
            FdSet(s)
        }
    }
}

impl FdSet {
    /// Adds `fd`; an error when it does not fit (fd < 0 or fd ≥ FD_SETSIZE).
    pub fn insert(&mut self, fd: RawFd) -> io::Result<()> {
        if fd < 0 || fd as usize >= libc::FD_SETSIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "fd {fd} does not fit in an fd_set (FD_SETSIZE = {})",
                    libc::FD_SETSIZE
                ),
            ));
        }
        // SAFETY: 0 <= fd < FD_SETSIZE, checked above.
        unsafe { libc::FD_SET(fd, &mut self.0) };
        Ok(())
    }

    pub fn contains(&self, fd: RawFd) -> bool {
        // SAFETY: bounds checked before FD_ISSET reads the bit.
        fd >= 0 && (fd as usize) < libc::FD_SETSIZE && unsafe { libc::FD_ISSET(fd, &self.0) }
    }

    pub fn as_mut_ptr(&mut self) -> *mut libc::fd_set {
        &mut self.0
    }
}

fn sockaddr(port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be(),
        },
        sin_zero: [0; 8],
    }
}

fn tcp_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket() returns a new fd we take ownership of.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd is a fresh, owned descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn setsockopt_int(
    fd: &OwnedFd,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: v is a valid c_int for the duration of the call.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// `bind` and `connect` take the same arguments.
type AddrCall =
    unsafe extern "C" fn(libc::c_int, *const libc::sockaddr, libc::socklen_t) -> libc::c_int;

/// `call` (`libc::bind` or `libc::connect`) of `fd` with 127.0.0.1:`port`.
fn loopback_call(fd: &OwnedFd, port: u16, call: AddrCall) -> io::Result<()> {
    let a = sockaddr(port);
    // SAFETY: a is a valid sockaddr_in of the stated length.
    cvt(unsafe {
        call(
            fd.as_raw_fd(),
            (&a as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    })
    .map(drop)
}

fn bind(fd: &OwnedFd, port: u16) -> io::Result<()> {
    loopback_call(fd, port, libc::bind)
}

fn connect(fd: &OwnedFd, port: u16) -> io::Result<()> {
    loopback_call(fd, port, libc::connect)
}

/// A listener on 127.0.0.1:`port` (0 = any), with or without SO_REUSEADDR.
fn listener(port: u16, reuseaddr: bool) -> io::Result<(OwnedFd, u16)> {
    let fd = tcp_socket()?;
    if reuseaddr {
        setsockopt_int(&fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    }
    bind(&fd, port)?;
    // SAFETY: listen on our own socket.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 512) })?;
    let port = local_port(&fd)?;
    Ok((fd, port))
}

fn read_some(fd: &OwnedFd) -> io::Result<usize> {
    let mut b = [0u8; 16];
    // SAFETY: reads into a valid stack buffer.
    cvt(unsafe { libc::read(fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) }).map(|n| n as usize)
}

fn write_byte(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: writes one byte from a valid location.
    cvt(unsafe { libc::write(fd.as_raw_fd(), b"x".as_ptr().cast(), 1) }).map(drop)
}

/// (local port, remote port) of the IPv4 TCP sockets in `state` (the hex code of
/// /proc/net/tcp: 06 = TIME_WAIT).
pub fn tcp_entries(state: &str) -> Vec<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let port = |a: &str| {
        a.split(':')
            .nth(1)
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.get(3) != Some(&state) {
                return None;
            }
            Some((port(f.get(1)?)?, port(f.get(2)?)?))
        })
        .collect()
}

fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EADDRINUSE) => "EADDRINUSE".into(),
        Some(libc::EADDRNOTAVAIL) => "EADDRNOTAVAIL".into(),
        _ => e.to_string(),
    }
}

/// The select experiment: (highest fd that fits, refused fd, kernel select on a high fd).
fn select_experiment() -> anyhow::Result<(i32, i32, String)> {
    let mut set = FdSet::default();
    let highest = (libc::FD_SETSIZE - 1) as i32;
    set.insert(highest).context("fd 1023 must fit")?;
    anyhow::ensure!(set.contains(highest), "FD_SET/FD_ISSET disagree");
    let mut sv = [0; 2];
    // SAFETY: socketpair writes two fds into sv.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    })
    .context("socketpair")?;
    // SAFETY: both fds are fresh and owned from here.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
    // F_DUPFD gives the lowest free fd ≥ 1500: a descriptor a busy server would reach.
    // SAFETY: duplicates our own fd.
    let high = match cvt(unsafe { libc::fcntl(b.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 1500) }) {
        Ok(fd) => fd,
        Err(e) => {
            return Ok((
                highest,
                -1,
                format!("could not get an fd ≥ 1500 ({e}; ulimit -n too low?)"),
            ));
        }
    };
    // SAFETY: fresh fd from fcntl.
    let high_fd = unsafe { OwnedFd::from_raw_fd(high) };
    let refused = set.insert(high).is_err();
    anyhow::ensure!(refused, "FdSet accepted fd {high}");
    write_byte(&a)?;
    // The kernel sizes the bitmap from nfds: give it 2048 bits.
    let mut bits = [0u64; 32];
    bits[high as usize / 64] |= 1 << (high as usize % 64);
    let mut tv = libc::timeval {
        tv_sec: 1,
        tv_usec: 0,
    };
    // SAFETY: bits covers nfds = high + 1 ≤ 2048 bits; the kernel reads/writes that many.
    let n = unsafe {
        libc::select(
            high + 1,
            bits.as_mut_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut tv,
        )
    };
    let ready = n == 1 && bits[high as usize / 64] & (1 << (high as usize % 64)) != 0;
    drop(high_fd);
    Ok((
        highest,
        high,
        if ready {
            format!(
                "ready (select(nfds={}) with a 2048-bit bitmap reported fd {high})",
                high + 1
            )
        } else {
            format!("not reported (select returned {n})")
        },
    ))
}

/// One TIME_WAIT run: a row of `"time_wait"`.
#[derive(Debug, Clone, Serialize)]
struct TimeWait {
    requests: usize,
    /// Whether the first listener (whose accepted sockets end in TIME_WAIT) set SO_REUSEADDR.
    old_listener_reuseaddr: bool,
    time_wait_sockets: usize,
    /// How a new listener's bind on the port went: "bound" or "fails: ERRNO".
    rebind_without_reuseaddr: String,
    rebind_with_reuseaddr: String,
}

fn local_port(fd: &OwnedFd) -> io::Result<u16> {
    let mut a = sockaddr(0);
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a and len are valid out-parameters of the right size.
    cvt(unsafe {
        libc::getsockname(
            fd.as_raw_fd(),
            (&mut a as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    })?;
    Ok(u16::from_be(a.sin_port))
}

fn time_wait_experiment(requests: usize, first_reuse: bool) -> anyhow::Result<TimeWait> {
    let (l, port) = listener(0, first_reuse).context("listener")?;
    let mut clients = std::collections::HashSet::new();
    for i in 0..requests {
        let c = tcp_socket()?;
        connect(&c, port).with_context(|| format!("request {i}: connect"))?;
        clients.insert(local_port(&c)?);
        write_byte(&c)?;
        let s = osutil::accept(l.as_raw_fd())?;
        read_some(&s)?;
        // Server closes first, as an HTTP/1.0 server does: its side goes to TIME_WAIT.
        drop(s);
        read_some(&c)?;
        drop(c);
    }
    drop(l);
    // Let the last FIN/ACK exchanges finish.
    std::thread::sleep(Duration::from_millis(50));
    let tw = tcp_entries("06")
        .into_iter()
        .filter(|&(local, remote)| local == port && clients.contains(&remote))
        .count();
    let outcome = |r: io::Result<(OwnedFd, u16)>| match r {
        Ok(_) => "bound".to_string(),
        Err(e) => format!("fails: {}", errno_name(&e)),
    };
    Ok(TimeWait {
        requests,
        old_listener_reuseaddr: first_reuse,
        time_wait_sockets: tw,
        rebind_without_reuseaddr: outcome(listener(port, false)),
        rebind_with_reuseaddr: outcome(listener(port, true)),
    })
}

/// Sets a per-socket ephemeral range; false when the kernel does not know the option.
fn narrow(fd: &OwnedFd, lo: u16, hi: u16) -> bool {
    let v = (lo as u32) | ((hi as u32) << 16);
    // SAFETY: v is a valid u32 for the call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_IP,
            IP_LOCAL_PORT_RANGE,
            (&v as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    rc == 0
}

struct Ports {
    range: (u16, u16),
    narrow: (u16, u16),
    held: Result<usize, String>,
    per_request: Result<(usize, usize), String>,
    per_request_secs: f64,
}

fn ports_experiment(width: u16, per_request_for: Duration) -> anyhow::Result<Ports> {
    let range = iolab_sys::host::sysctl("net.ipv4.ip_local_port_range")
        .and_then(|s| {
            let v: Vec<u16> = s
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (v.len() == 2).then(|| (v[0], v[1]))
        })
        .unwrap_or((32768, 60999));
    // The top of the system range; the per-socket range must lie inside it.
    let hi = range.1;
    let lo = hi.saturating_sub(width - 1).max(range.0);
    let (l, port) = listener(0, true).context("listener")?;

    // A: hold connections open until the narrowed range runs out.
    let mut held = Vec::new();
    let mut held_result = Ok(0);
    for _ in 0..(width as usize + 8) {
        let c = tcp_socket()?;
        if !narrow(&c, lo, hi) {
            held_result = Err("IP_LOCAL_PORT_RANGE not supported by this kernel".to_string());
            break;
        }
        match connect(&c, port) {
            Ok(()) => {
                osutil::set_linger_rst(&c);
                held.push(c);
                held_result = Ok(held.len());
            }
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => break,
            Err(e) => {
                held_result = Err(format!("connect: {e}"));
                break;
            }
        }
    }
    // Accept and reset everything: RST leaves no TIME_WAIT behind.
    // SAFETY: make the listener non-blocking to drain its accept queue.
    unsafe { libc::fcntl(l.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    while let Ok(s) = osutil::accept(l.as_raw_fd()) {
        osutil::set_linger_rst(&s);
    }
    drop(held);

    // B: connection per request, client closes first (its ports go to TIME_WAIT).
    let mut ok = 0;
    let mut refused = 0;
    let t0 = Instant::now();
    let mut per_request = Ok((0, 0));
    if held_result.is_ok() {
        while t0.elapsed() < per_request_for {
            let c = tcp_socket()?;
            narrow(&c, lo, hi);
            match connect(&c, port) {
                Ok(()) => {
                    ok += 1;
                    // The listener is non-blocking: on loopback the handshake is done when
                    // connect returns, so the connection is normally queued already.
                    if let Ok(s) = osutil::accept(l.as_raw_fd()) {
                        drop(c); // client closes first → client port in TIME_WAIT
                        std::thread::sleep(Duration::from_millis(1));
                        drop(s);
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
                    refused += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    per_request = Err(format!("connect: {e}"));
                    break;
                }
            }
        }
        if per_request.is_ok() {
            per_request = Ok((ok, refused));
        }
    } else {
        per_request = Err("skipped (no per-socket range)".into());
    }
    Ok(Ports {
        range,
        narrow: (lo, hi),
        held: held_result,
        per_request,
        per_request_secs: t0.elapsed().as_secs_f64(),
    })
}

/// `"select"`: what an fd_set holds and what the kernel's select does past it.
#[derive(Debug, Clone, Serialize)]
struct Select {
    highest_fd_in_fd_set: i32,
    /// -1 when no fd ≥ 1500 could be had.
    refused_fd: i32,
    kernel_select_on_high_fd: String,
}

/// `"ports"`: the ephemeral port range and what a narrowed one holds.
#[derive(Debug, Clone, Serialize)]
struct PortsFields {
    range: (u16, u16),
    per_destination: u32,
    narrow_range: (u16, u16),
    held_before_eaddrnotavail: Option<usize>,
    tw_reuse: String,
    per_request_seconds: f64,
    per_request_ok: Option<usize>,
    per_request_eaddrnotavail: Option<usize>,
}

impl PortsFields {
    fn new(p: &Ports, tw_reuse: String) -> PortsFields {
        PortsFields {
            range: p.range,
            per_destination: p.range.1 as u32 - p.range.0 as u32 + 1,
            narrow_range: p.narrow,
            held_before_eaddrnotavail: p.held.as_ref().ok().copied(),
            tw_reuse,
            per_request_seconds: crate::stats::round_sig(p.per_request_secs, 3),
            per_request_ok: p.per_request.as_ref().ok().map(|r| r.0),
            per_request_eaddrnotavail: p.per_request.as_ref().ok().map(|r| r.1),
        }
    }
}

/// The JSON fields of `iolab micro limits` (besides machine, tables and figures).
#[derive(Debug, Clone, Serialize)]
pub struct Fields {
    fd_setsize: usize,
    select: Select,
    time_wait: [TimeWait; 2],
    ports: PortsFields,
}

/// A row of the table: the limit, what was measured, why it is so.
fn limit_row(
    t: &mut Table,
    limit: impl Into<Cell>,
    measured: impl Into<Cell>,
    why: impl Into<Cell>,
) {
    t.row(vec![limit.into(), measured.into(), why.into()]);
}

fn table(f: &Fields, ports: &Ports, width: u16) -> Table {
    let mut t = Table::new(
        "Limits (seed 000 annexes E.1, E.3)",
        &["limit", "measured", "explanation"],
    );
    let (highest, refused_fd) = (f.select.highest_fd_in_fd_set, f.select.refused_fd);
    limit_row(
        &mut t,
        "select: highest fd an fd_set holds",
        highest,
        format!(
            "FD_SETSIZE = {}: fds 0..{} only, stdin/stdout/stderr and the listener included; a select server must refuse (close) any connection whose fd is higher",
            libc::FD_SETSIZE,
            highest
        ),
    );
    limit_row(
        &mut t,
        "select: put fd ≥ 1024 in an fd_set",
        if refused_fd >= 0 { format!("fd {refused_fd} refused") } else { "not tried".into() },
        format!(
            "FD_SET past the bitmap is undefined behaviour in C (glibc's fortify aborts). The limit is the user-space type, not the kernel: kernel select on fd {refused_fd}: {}",
            f.select.kernel_select_on_high_fd
        ),
    );
    let tw = &f.time_wait[0];
    limit_row(
        &mut t,
        format!("TIME_WAIT after {} requests, server closes first", tw.requests),
        tw.time_wait_sockets,
        "one TIME_WAIT socket per request on the server's port (from /proc/net/tcp, state 06, matched to our clients' ports); they last 60 s (TCP_TIMEWAIT_LEN, not tcp_fin_timeout)",
    );
    for x in &f.time_wait {
        let first = if x.old_listener_reuseaddr {
            "with"
        } else {
            "without"
        };
        limit_row(
            &mut t,
            format!("restart without SO_REUSEADDR (old listener {first})"),
            &x.rebind_without_reuseaddr,
            "bind refuses a port that TIME_WAIT sockets still hold (the seed's E.1 situation)",
        );
        limit_row(
            &mut t,
            format!("restart with SO_REUSEADDR (old listener {first})"),
            &x.rebind_with_reuseaddr,
            if x.old_listener_reuseaddr {
                "both the old sockets and the new one set SO_REUSEADDR: Linux lets the listener bind over the TIME_WAIT sockets (Rust's TcpListener::bind sets it)"
            } else {
                "Linux requires SO_REUSEADDR on both sides: TIME_WAIT sockets inherit the flag from the listener that accepted them, so setting it only on the new listener is not enough"
            },
        );
    }
    limit_row(
        &mut t,
        "ephemeral ports per destination",
        f.ports.per_destination,
        format!(
            "ip_local_port_range = {} {}: a client can hold at most this many connections to one (address, port) from one source address",
            ports.range.0, ports.range.1
        ),
    );
    limit_row(
        &mut t,
        format!("connections held through a {width}-port range"),
        match &ports.held {
            Ok(n) => Cell::from(*n),
            Err(e) => Cell::from(e),
        },
        format!(
            "measured on ports {}..{} set per socket with IP_LOCAL_PORT_RANGE (no sysctl changed): connect fails with EADDRNOTAVAIL once they are all used",
            ports.narrow.0, ports.narrow.1
        ),
    );
    limit_row(
        &mut t,
        format!(
            "connection per request, client closes first, {width} ports, {:.1} s",
            ports.per_request_secs
        ),
        match &ports.per_request {
            Ok((ok, no)) => Cell::from(format!("{ok} connected, {no} EADDRNOTAVAIL")),
            Err(e) => Cell::from(e),
        },
        format!(
            "tcp_tw_reuse = {} (0 off, 1 on, 2 loopback only): with reuse, a port in TIME_WAIT serves a new connection once its last timestamp is ≥ 1 s old, so about {width} connections per second get through; without it the range stays exhausted for 60 s",
            f.ports.tw_reuse
        ),
    );
    t
}

pub fn run(opts: &crate::Opts) -> anyhow::Result<Report<Fields>> {
    let machine = crate::machine::Machine::collect();
    let requests = if opts.quick { 200 } else { 2000 };
    let per_request_for = Duration::from_millis(if opts.quick { 2200 } else { 4500 });
    let width: u16 = 32;

    let (highest, refused_fd, kernel_select) = select_experiment()?;
    let tw = time_wait_experiment(requests, false)?;
    let tw2 = time_wait_experiment(requests, true)?;
    let ports = ports_experiment(width, per_request_for)?;
    let tw_reuse = iolab_sys::host::sysctl("net.ipv4.tcp_tw_reuse").unwrap_or_else(|| "?".into());
    let fields = Fields {
        fd_setsize: libc::FD_SETSIZE,
        select: Select {
            highest_fd_in_fd_set: highest,
            refused_fd,
            kernel_select_on_high_fd: kernel_select,
        },
        time_wait: [tw, tw2],
        ports: PortsFields::new(&ports, tw_reuse),
    };
    let t = table(&fields, &ports, width);
    t.print();
    Ok(Report {
        machine,
        fields,
        tables: vec![t],
        figures: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_set_refuses_what_it_cannot_hold() {
        let mut s = FdSet::default();
        assert!(s.insert(0).is_ok());
        assert!(s.insert(1023).is_ok());
        assert!(s.contains(1023));
        assert!(!s.contains(5));
        assert!(s.insert(1024).is_err());
        assert!(s.insert(-1).is_err());
        assert!(!s.contains(4096));
    }

    #[test]
    fn server_close_leaves_time_wait_and_blocks_plain_rebind() {
        let tw = time_wait_experiment(5, false).unwrap();
        assert_eq!(tw.time_wait_sockets, 5, "TIME_WAIT sockets");
        assert_eq!(tw.rebind_without_reuseaddr, "fails: EADDRINUSE");
        assert_eq!(tw.rebind_with_reuseaddr, "fails: EADDRINUSE");
        let tw = time_wait_experiment(5, true).unwrap();
        assert_eq!(tw.time_wait_sockets, 5, "TIME_WAIT sockets");
        assert_eq!(tw.rebind_with_reuseaddr, "bound");
    }
}
