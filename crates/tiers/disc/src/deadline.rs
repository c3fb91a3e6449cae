//! The deadlines of a client connection of our tiers (BE, FE, IS), as the iolab server
//! models have them (`iolab_http::Deadline`) and nginx's `client_header_timeout` and
//! `send_timeout`:
//! - a whole request head must arrive within [`ClientTimeouts::header`] of its first byte
//!   (of the connection's start, for the first request): bytes trickling in do not push it
//!   back;
//! - bytes written to the client must make progress: once the client has acknowledged
//!   nothing new for [`ClientTimeouts::send`] while bytes wait for it, the connection ends.
//!
//! A tier's connection code is many awaits over several write paths (relayed bodies, heads,
//! DP's answers), so the deadline is kept beside it rather than in each call: a watcher
//! task per connection ([`watch`]) looks every [`tick`] at the head's clock (set by the
//! connection's head reading, [`ClientWatch::head_started`] / [`ClientWatch::head_done`])
//! and at the socket's own progress (`TCP_INFO`'s `tcpi_bytes_acked` and the send queue,
//! `SIOCOUTQ`), and on expiry shuts the socket down (`shutdown(2)`): the connection's
//! pending read or write then fails and its task ends as on any error. The watcher ends
//! when the connection drops its [`ClientWatch`], before the descriptor is closed (the
//! runtime is single-threaded: no await between the check and the shutdown).
//!
//! Not covered: the time a connection waits between requests (keep-alive) and the time the
//! tier waits for its upstream, which are not the client's doing.

use std::cell::Cell;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// nginx's `client_header_timeout` and `send_timeout` default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The limits; `Duration::ZERO` means none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientTimeouts {
    /// A whole request head, from its first byte (the connection's start for the first).
    pub header: Duration,
    /// Bytes waiting for the client with none acknowledged meanwhile.
    pub send: Duration,
}

impl Default for ClientTimeouts {
    fn default() -> Self {
        ClientTimeouts {
            header: DEFAULT_TIMEOUT,
            send: DEFAULT_TIMEOUT,
        }
    }
}

/// How often the watcher looks: 1/32 of the shortest limit (a close comes at most ~3% late),
/// between 5 ms and 1 s. None when no limit is set.
pub fn tick(t: ClientTimeouts) -> Option<Duration> {
    let shortest = [t.header, t.send]
        .into_iter()
        .filter(|d| !d.is_zero())
        .min()?;
    Some((shortest / 32).clamp(Duration::from_millis(5), Duration::from_secs(1)))
}

/// Why a connection was closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    Header = 0,
    Send = 1,
}

/// Connections this process closed at each deadline, by [`Expiry`].
static EXPIRED: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// How many client connections this process (every tier in it) closed at deadline `why`.
pub fn expired_count(why: Expiry) -> u64 {
    EXPIRED[why as usize].load(Ordering::Relaxed)
}

#[derive(Debug)]
struct State {
    fd: RawFd,
    /// The connection still owns `fd`.
    alive: Cell<bool>,
    /// When the head being read started; None while no head is being read.
    head_since: Cell<Option<Instant>>,
    expired: Cell<Option<Expiry>>,
}

/// A connection's end of its watcher (see the module's documentation). Dropping it stops
/// the watcher.
#[derive(Debug)]
pub struct ClientWatch {
    state: Rc<State>,
}

impl ClientWatch {
    /// A head has started arriving at `at` (a no-op while one is being read already).
    pub fn head_started(&self, at: Instant) {
        if self.state.head_since.get().is_none() {
            self.state.head_since.set(Some(at));
        }
    }

    /// The head is complete (or the connection is between requests).
    pub fn head_done(&self) {
        self.state.head_since.set(None);
    }

    /// Why the watcher closed the connection, if it did.
    pub fn expired(&self) -> Option<Expiry> {
        self.state.expired.get()
    }
}

impl Drop for ClientWatch {
    fn drop(&mut self) {
        self.state.alive.set(false);
    }
}

/// Starts the watcher of the client connection `stream` (accepted now: its first head is
/// timed from now), on the current runtime.
pub fn watch(stream: &impl AsRawFd, timeouts: ClientTimeouts) -> ClientWatch {
    let state = Rc::new(State {
        fd: stream.as_raw_fd(),
        alive: Cell::new(true),
        head_since: Cell::new(Some(Instant::now())),
        expired: Cell::new(None),
    });
    if let Some(every) = tick(timeouts) {
        let s = state.clone();
        iolab_runtime::spawn(async move {
            let mut send = SendProgress::default();
            loop {
                iolab_runtime::sleep(every).await;
                if !s.alive.get() {
                    return;
                }
                let now = Instant::now();
                let why = head_expired(s.head_since.get(), timeouts.header, now)
                    .then_some(Expiry::Header)
                    .or_else(|| {
                        let (acked, queued) = progress(s.fd)?;
                        send.stalled(acked, queued, timeouts.send, now)
                            .then_some(Expiry::Send)
                    });
                if let Some(why) = why {
                    s.expired.set(Some(why));
                    // Counted before the close: whoever sees the connection end sees it
                    // counted (counted after, a loaded machine let the deadlines test read
                    // the count between the two).
                    EXPIRED[why as usize].fetch_add(1, Ordering::Relaxed);
                    // SAFETY: `alive` was checked with no await since: the connection still
                    // owns the descriptor. shutdown only changes the socket's state.
                    unsafe { libc::shutdown(s.fd, libc::SHUT_RDWR) };
                    tracing::debug!("client connection closed: {why:?} deadline");
                    return;
                }
            }
        });
    }
    ClientWatch { state }
}

fn head_expired(since: Option<Instant>, limit: Duration, now: Instant) -> bool {
    !limit.is_zero() && since.is_some_and(|t| now.duration_since(t) >= limit)
}

/// The client's progress as last seen: bytes it had acknowledged, and since when that
/// count has not changed while bytes waited for it.
#[derive(Debug, Default)]
struct SendProgress {
    acked: u64,
    waiting_since: Option<Instant>,
}

impl SendProgress {
    /// One look: `acked` bytes acknowledged so far, `queued` waiting. True when bytes have
    /// waited with no acknowledgement for `limit`.
    fn stalled(&mut self, acked: u64, queued: u32, limit: Duration, now: Instant) -> bool {
        if queued == 0 || acked != self.acked {
            self.acked = acked;
            self.waiting_since = (queued > 0).then_some(now);
            return false;
        }
        let since = *self.waiting_since.get_or_insert(now);
        !limit.is_zero() && now.duration_since(since) >= limit
    }
}

/// Offset of `tcpi_bytes_acked` (u64, Linux 4.1) in `struct tcp_info`.
const TCPI_BYTES_ACKED: usize = 120;

/// SIOCOUTQ (linux/sockios.h): bytes in the send queue not yet acknowledged.
const SIOCOUTQ: libc::c_ulong = 0x5411;

/// (bytes the peer has acknowledged, bytes in the send queue) of socket `fd`; None when
/// either cannot be read.
fn progress(fd: RawFd) -> Option<(u64, u32)> {
    let mut buf = [0u8; 256];
    let len = crate::sockopt::get_bytes(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut buf).ok()?;
    let acked = u64::from_ne_bytes(
        buf.get(TCPI_BYTES_ACKED..TCPI_BYTES_ACKED + 8)
            .filter(|_| len >= TCPI_BYTES_ACKED + 8)?
            .try_into()
            .ok()?,
    );
    let mut queued: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int into `queued`, alive for the call.
    let r = unsafe { libc::ioctl(fd, SIOCOUTQ, &mut queued) };
    (r == 0).then_some((acked, queued.max(0) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_is_timed_from_its_first_byte() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        assert!(!head_expired(None, s, t0 + 5 * s), "no head being read");
        assert!(!head_expired(Some(t0), s, t0 + s / 2));
        assert!(head_expired(Some(t0), s, t0 + s));
        assert!(
            !head_expired(Some(t0), Duration::ZERO, t0 + 5 * s),
            "no limit"
        );
    }

    #[test]
    fn a_send_stalls_only_when_bytes_wait_without_acknowledgement() {
        let t0 = Instant::now();
        let s = Duration::from_secs(2);
        let mut p = SendProgress::default();
        assert!(!p.stalled(0, 0, s, t0), "nothing queued");
        assert!(!p.stalled(100, 500, s, t0), "progress");
        assert!(!p.stalled(100, 500, s, t0 + s / 2));
        assert!(!p.stalled(200, 500, s, t0 + s + s / 4), "progress again");
        assert!(!p.stalled(200, 500, s, t0 + 2 * s));
        assert!(p.stalled(200, 500, s, t0 + 2 * s + s / 4 + s));
        let mut q = SendProgress::default();
        assert!(!q.stalled(100, 0, s, t0), "all acknowledged");
        assert!(!q.stalled(100, 0, s, t0 + 10 * s), "idle is not a stall");
        assert_eq!(
            tick(ClientTimeouts::default()),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            tick(ClientTimeouts {
                header: Duration::ZERO,
                send: Duration::ZERO
            }),
            None
        );
    }
}
