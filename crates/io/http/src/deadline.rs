//! The deadline of a connection, decided from its session's state: the one place every
//! model asks "when must this connection be closed, and why".
//!
//! A connection is always in one phase, and each phase has its own limit (zero = none):
//! - [`Phase::Head`]: a request head has started (or the connection is new and nothing has
//!   been answered yet) and is not complete. The whole head must arrive within
//!   [`Timeouts::header`] of its first byte (of the connection's start, for the first
//!   request) — bytes trickling in do not push it back (nginx's `client_header_timeout`);
//! - [`Phase::Send`]: response bytes wait for the socket. A send that makes no progress for
//!   [`Timeouts::send`] ends the connection (nginx's `send_timeout`); each write that moves
//!   bytes starts the count again;
//! - [`Phase::Idle`]: a keep-alive connection between requests, and [`Phase::Body`]: a
//!   request body being drained. Both end after [`Timeouts::idle`] without a byte.
//!
//! Sans-I/O like the session: the model calls [`Deadline::update`] after each read it fed
//! (and each write that moved bytes, and each file read handed back) with the time, and
//! asks [`Deadline::at`] / [`Deadline::expired`] whenever it looks at its timers. The result
//! is kept, so a model's timer can read it without the session at hand.

use std::time::{Duration, Instant};

use crate::Session;

/// nginx's `client_header_timeout`, `send_timeout` and `keepalive_timeout`-like default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The limits of each phase; `Duration::ZERO` means no limit for that phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// A whole request head, from its first byte (the connection's start for the first).
    pub header: Duration,
    /// Without a byte between requests (keep-alive), or while a request body is drained.
    pub idle: Duration,
    /// A pending response making no progress.
    pub send: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header: DEFAULT_TIMEOUT,
            idle: DEFAULT_TIMEOUT,
            send: DEFAULT_TIMEOUT,
        }
    }
}

impl Timeouts {
    /// The shortest limit set (None when none is): what a model's periodic timer must be
    /// fine enough for.
    pub fn shortest(&self) -> Option<Duration> {
        [self.header, self.idle, self.send]
            .into_iter()
            .filter(|d| !d.is_zero())
            .min()
    }
}

/// What a connection is waiting for, and so which limit applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Head,
    Idle,
    Body,
    Send,
}

/// One connection's deadline (see the module's documentation).
#[derive(Debug, Clone)]
pub struct Deadline {
    timeouts: Timeouts,
    /// When the request head now arriving started; Some from the connection's start until
    /// its first request is complete.
    head_since: Option<Instant>,
    /// The phase and when it expires, as of the last update.
    next: (Phase, Option<Instant>),
}

impl Deadline {
    /// A connection accepted at `now`: its first request head is due by `now + header`.
    pub fn new(timeouts: Timeouts, now: Instant) -> Deadline {
        let mut d = Deadline {
            timeouts,
            head_since: Some(now),
            next: (Phase::Head, None),
        };
        d.next = d.compute(Phase::Head, now);
        d
    }

    /// After bytes moved (a read fed to `session`, a write that advanced it, a file read
    /// handed back) at `now`: decides the phase and its deadline again.
    pub fn update(&mut self, session: &Session, now: Instant) {
        let phase = if session.has_pending() {
            // A head trickling in behind a long response is timed from when it can be read.
            self.head_since = None;
            Phase::Send
        } else if session.is_reading_head() {
            self.head_since.get_or_insert(now);
            Phase::Head
        } else if !session.is_between_requests() {
            self.head_since = None;
            Phase::Body
        } else if self.head_since.is_some() {
            // Nothing answered yet: the first head is due from the connection's start.
            Phase::Head
        } else {
            Phase::Idle
        };
        self.next = self.compute(phase, now);
    }

    fn compute(&self, phase: Phase, now: Instant) -> (Phase, Option<Instant>) {
        let t = &self.timeouts;
        let (from, limit) = match phase {
            Phase::Head => (self.head_since.unwrap_or(now), t.header),
            Phase::Send => (now, t.send),
            Phase::Idle | Phase::Body => (now, t.idle),
        };
        (phase, (!limit.is_zero()).then(|| from + limit))
    }

    /// When the connection must be closed (None: never in this phase).
    pub fn at(&self) -> Option<Instant> {
        self.next.1
    }

    /// The phase the deadline is for.
    pub fn phase(&self) -> Phase {
        self.next.0
    }

    /// The phase whose deadline has passed at `now`, if it has.
    pub fn expired(&self, now: Instant) -> Option<Phase> {
        self.next.1.filter(|&at| at <= now).map(|_| self.next.0)
    }

    /// Time left until the deadline at `now` (zero once passed; None: no deadline).
    pub fn left(&self, now: Instant) -> Option<Duration> {
        self.next.1.map(|at| at.saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limits, Site};

    fn site() -> (tempfile::TempDir, std::sync::Arc<Site>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), b"hello").unwrap();
        let site = Site::new(dir.path(), Limits::default()).unwrap();
        (dir, site)
    }

    const S: Duration = Duration::from_secs(1);

    fn timeouts() -> Timeouts {
        Timeouts {
            header: 3 * S,
            idle: 10 * S,
            send: 5 * S,
        }
    }

    #[test]
    fn a_trickling_head_is_due_from_the_connection_start() {
        let (_dir, site) = site();
        let mut s = Session::new(site);
        let t0 = Instant::now();
        let mut d = Deadline::new(timeouts(), t0);
        assert_eq!((d.phase(), d.at()), (Phase::Head, Some(t0 + 3 * S)));
        // One byte a second: the deadline does not move.
        for (i, b) in b"GET /a.txt HT".iter().enumerate() {
            s.feed(&[*b], |_| {});
            d.update(&s, t0 + (i as u32) * S);
            assert_eq!((d.phase(), d.at()), (Phase::Head, Some(t0 + 3 * S)));
        }
        assert_eq!(d.expired(t0 + 3 * S), Some(Phase::Head));
        assert_eq!(d.expired(t0 + 2 * S), None);
    }

    #[test]
    fn phases_follow_the_session() {
        let (_dir, site) = site();
        let mut s = Session::new(site);
        let t0 = Instant::now();
        let mut d = Deadline::new(timeouts(), t0);
        s.feed(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n", |_| {});
        d.update(&s, t0 + S);
        assert_eq!((d.phase(), d.at()), (Phase::Send, Some(t0 + 6 * S)));
        s.advance(s.pending_len());
        d.update(&s, t0 + 2 * S);
        assert_eq!((d.phase(), d.at()), (Phase::Idle, Some(t0 + 12 * S)));
        // The next head counts from its own first byte.
        s.feed(b"GET /a", |_| {});
        d.update(&s, t0 + 7 * S);
        assert_eq!((d.phase(), d.at()), (Phase::Head, Some(t0 + 10 * S)));
        s.feed(
            b".txt HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nab",
            |_| {},
        );
        d.update(&s, t0 + 8 * S);
        assert_eq!(d.phase(), Phase::Send);
        s.advance(s.pending_len());
        d.update(&s, t0 + 9 * S);
        assert_eq!((d.phase(), d.at()), (Phase::Body, Some(t0 + 19 * S)));
    }

    #[test]
    fn zero_is_no_limit() {
        let (_dir, site) = site();
        let s = Session::new(site);
        let t0 = Instant::now();
        let none = Timeouts {
            header: Duration::ZERO,
            idle: Duration::ZERO,
            send: Duration::ZERO,
        };
        let mut d = Deadline::new(none, t0);
        d.update(&s, t0);
        assert_eq!(d.at(), None);
        assert_eq!(d.expired(t0 + 1000 * S), None);
        assert_eq!(none.shortest(), None);
        assert_eq!(timeouts().shortest(), Some(3 * S));
    }
}
