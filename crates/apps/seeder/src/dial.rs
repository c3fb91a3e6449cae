//! Which tracker peers to dial, and when (as aria2c and libtorrent seeders do: a client
//! that cannot reach us, behind NAT or stuck on uTP as Transmission 3.00 is, is reached
//! by us). Pure bookkeeping; the connections are [`crate::opening`]'s.
//!
//! Limits ([`DialLimits`]): at most `max_dialled` dialled connections held at once, of which
//! at most `max_connecting` still connecting or handshaking; an address that failed waits
//! `backoff` × 2^(failures − 1) (capped at `backoff_max`) before it is tried again, one whose
//! session ended waits `backoff`; at most [`MAX_ADDRESSES`] addresses remembered (more are
//! ignored until old ones expire); our own address is never dialled, nor an address that
//! answered with our own peer id.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Addresses remembered at most (each a few dozen bytes).
pub const MAX_ADDRESSES: usize = 10_000;

/// The dialling budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DialLimits {
    /// Dialled connections held at once (0: never dial).
    pub max_dialled: usize,
    /// Of those, connecting or handshaking at once.
    pub max_connecting: usize,
    /// Wait after a failure (doubled per further failure) or after a session ended.
    pub backoff: Duration,
    pub backoff_max: Duration,
}

impl Default for DialLimits {
    fn default() -> Self {
        DialLimits {
            max_dialled: 50,
            max_connecting: 8,
            backoff: Duration::from_secs(30),
            backoff_max: Duration::from_secs(30 * 60),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    Connecting,
    Connected,
    /// It answered with our own peer id: never again.
    Ourselves,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    state: State,
    failures: u32,
    next_try: Instant,
    /// Last time a tracker listed it (forgotten after an hour without).
    seen: Instant,
}

/// How a dial ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Connect, MSE or handshake failed.
    Failed,
    /// A session ran and ended.
    SessionEnded,
    /// The peer is us (our peer id came back) or already connected to us.
    Ourselves,
}

/// The addresses we know of and the dials under way.
#[derive(Debug)]
pub struct Dialer {
    limits: DialLimits,
    /// Our listen addresses (one per listener): never dialled.
    own: Vec<SocketAddr>,
    entries: HashMap<SocketAddr, Entry>,
    connecting: usize,
    connected: usize,
}

impl Dialer {
    pub fn new(limits: DialLimits) -> Dialer {
        Dialer {
            limits,
            own: Vec::new(),
            entries: HashMap::new(),
            connecting: 0,
            connected: 0,
        }
    }

    /// One of our listen addresses (never dialled).
    pub fn set_own(&mut self, addr: SocketAddr) {
        if !self.own.contains(&addr) {
            self.own.push(addr);
        }
    }

    /// Dialled connections held now (connecting or handshaken).
    pub fn held(&self) -> usize {
        self.connecting + self.connected
    }

    /// Takes note of a tracker's `peers` and returns those to dial now (each marked as
    /// connecting: report it with [`Dialer::connected`] / [`Dialer::ended`]).
    pub fn pick(&mut self, peers: &[SocketAddr], now: Instant) -> Vec<SocketAddr> {
        let hour = Duration::from_secs(3600);
        self.entries
            .retain(|_, e| e.state != State::Idle || now.duration_since(e.seen) < hour);
        let mut out = Vec::new();
        for &addr in peers {
            if self.own.contains(&addr) || addr.port() == 0 || addr.ip().is_unspecified() {
                continue;
            }
            if !self.entries.contains_key(&addr) && self.entries.len() >= MAX_ADDRESSES {
                continue;
            }
            let e = self.entries.entry(addr).or_insert(Entry {
                state: State::Idle,
                failures: 0,
                next_try: now,
                seen: now,
            });
            e.seen = now;
            let room = self.connecting + self.connected < self.limits.max_dialled
                && self.connecting < self.limits.max_connecting;
            if e.state == State::Idle && e.next_try <= now && room {
                e.state = State::Connecting;
                self.connecting += 1;
                out.push(addr);
            }
        }
        out
    }

    /// `addr`'s handshake is done.
    pub fn connected(&mut self, addr: SocketAddr) {
        if let Some(e) = self.entries.get_mut(&addr) {
            if e.state == State::Connecting {
                e.state = State::Connected;
                self.connecting -= 1;
                self.connected += 1;
            }
        }
    }

    /// `addr`'s dial or session ended.
    pub fn ended(&mut self, addr: SocketAddr, outcome: Outcome, now: Instant) {
        let Some(e) = self.entries.get_mut(&addr) else {
            return;
        };
        match e.state {
            State::Connecting => self.connecting -= 1,
            State::Connected => self.connected -= 1,
            State::Idle | State::Ourselves => return,
        }
        match outcome {
            Outcome::Ourselves => e.state = State::Ourselves,
            Outcome::SessionEnded => {
                e.state = State::Idle;
                e.failures = 0;
                e.next_try = now + self.limits.backoff;
            }
            Outcome::Failed => {
                e.state = State::Idle;
                e.failures = e.failures.saturating_add(1);
                let wait = self.limits.backoff * 2u32.pow(e.failures.min(16) - 1);
                e.next_try = now + wait.min(self.limits.backoff_max);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_budget_and_our_own_address_hold() {
        let mut d = Dialer::new(DialLimits {
            max_dialled: 3,
            max_connecting: 2,
            ..DialLimits::default()
        });
        d.set_own(a("10.0.0.1:6881"));
        d.set_own(a("[fd00::1]:6881"));
        let now = Instant::now();
        let peers = [
            a("10.0.0.1:6881"),
            a("[fd00::1]:6881"),
            a("10.0.0.2:1"),
            a("10.0.0.3:1"),
            a("10.0.0.4:1"),
            a("0.0.0.0:5"),
        ];
        assert_eq!(d.pick(&peers, now), vec![a("10.0.0.2:1"), a("10.0.0.3:1")]);
        assert!(d.pick(&peers, now).is_empty(), "2 connecting at most");
        d.connected(a("10.0.0.2:1"));
        assert_eq!(d.pick(&peers, now), vec![a("10.0.0.4:1")]);
        d.connected(a("10.0.0.3:1"));
        d.connected(a("10.0.0.4:1"));
        assert_eq!(d.held(), 3);
        assert!(d.pick(&peers, now).is_empty(), "3 dialled at most");
    }

    #[test]
    fn failures_back_off_and_ourselves_is_never_redialled() {
        let mut d = Dialer::new(DialLimits::default());
        let (p, q) = (a("10.0.0.2:1"), a("10.0.0.3:1"));
        let t0 = Instant::now();
        assert_eq!(d.pick(&[p, q], t0), vec![p, q]);
        d.ended(p, Outcome::Failed, t0);
        d.ended(q, Outcome::Ourselves, t0);
        assert!(d.pick(&[p, q], t0 + Duration::from_secs(29)).is_empty());
        let t1 = t0 + Duration::from_secs(30);
        assert_eq!(d.pick(&[p, q], t1), vec![p]);
        d.ended(p, Outcome::Failed, t1);
        assert!(
            d.pick(&[p], t1 + Duration::from_secs(59)).is_empty(),
            "doubled"
        );
        assert_eq!(d.pick(&[p], t1 + Duration::from_secs(60)), vec![p]);
        assert!(d.pick(&[q], t1 + Duration::from_secs(7200)).is_empty());
        assert_eq!(d.held(), 1);
    }
}
