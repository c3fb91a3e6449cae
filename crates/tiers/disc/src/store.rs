//! DP's store of the payloads the BE kept back (a job per payload, named by its payload id)
//! and DP's counters.
//!
//! Ids are random 64-bit numbers (issue 43: they were sequential, so any reachable party
//! could fetch the next one), their low 32 bits nonzero and distinct among the jobs held:
//! the FE's start signal carries those 32 bits ([`Store::take_signalled`]). A job is handed
//! out once ([`Store::take`] removes it) and not after [`JOB_TTL`].
//!
//! Limits: at most [`MAX_JOBS`] jobs and [`MAX_BYTES`] bytes held (a BE whose store is full
//! answers on the normal path, so a slow or absent FE never makes the BE hold more).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::control::Refusal;
use crate::payload::Payload;

pub const MAX_JOBS: usize = 4096;
pub const MAX_BYTES: u64 = 1 << 30;
/// A job not claimed within this is dropped (the FE died or fell back) and refused.
pub const JOB_TTL: Duration = Duration::from_secs(30);

struct Job {
    body: Payload,
    created: Instant,
}

#[derive(Default)]
pub(crate) struct Inner {
    kept: u64,
    taken: u64,
    jobs: HashMap<u64, Job>,
    /// Low 32 bits of each held id → the id (the start signal's lookup).
    signals: HashMap<u32, u64>,
    bytes: u64,
    /// Transfers DP sent through the GSO packet socket and through the raw socket.
    pub(crate) sends: [u64; 2],
    /// Transfers DP sent from a socket continuing the FE's connection.
    pub(crate) repaired: u64,
    /// Transfers DP sent through its AF_XDP socket.
    pub(crate) xdp: u64,
    /// Client ACKs DP received from its tap, and as the FE's control lines.
    acks: [u64; 2],
    /// Transfers started by the FE's start signal (from the tap), and by SEND lines.
    starts: [u64; 2],
    /// Refusals by reason ([`Refusal::index`]).
    refused: [u64; Refusal::ALL.len()],
}

/// The payloads held for the FE.
pub struct Store {
    inner: Mutex<Inner>,
    ttl: Duration,
    max_bytes: u64,
    /// Tests: a [`Fault`] DP shows its FEs.
    fault: AtomicU8,
}

/// Faults tests make DP show ([`Store::set_fault`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    None = 0,
    /// DP accepts SENDs and sends nothing (a DP that dies mid-payload).
    HoldSends = 1,
    /// DP refuses every SEND as a payload it does not hold (one that expired, or a BE that
    /// restarted at the same address).
    RefuseSends = 2,
    /// DP never sees the FE's start signals (as if the tap's socket had dropped them).
    LoseSignals = 3,
}

impl Store {
    pub fn new() -> Arc<Store> {
        Store::with_limits(JOB_TTL, MAX_BYTES)
    }

    /// A store whose jobs expire after `ttl` and which holds at most `max_bytes`.
    pub fn with_limits(ttl: Duration, max_bytes: u64) -> Arc<Store> {
        Arc::new(Store {
            inner: Mutex::default(),
            ttl,
            max_bytes,
            fault: AtomicU8::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most bytes held at once.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Whether a payload of `len` bytes would be kept now (the BE asks before reading).
    pub fn has_room(&self, len: u64) -> bool {
        let mut g = self.lock();
        self.expire(&mut g);
        g.jobs.len() < MAX_JOBS && g.bytes + len <= self.max_bytes
    }

    fn expire(&self, g: &mut Inner) {
        let now = Instant::now();
        let ttl = self.ttl;
        let expired: Vec<u64> = g
            .jobs
            .iter()
            .filter(|(_, j)| now.duration_since(j.created) > ttl)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            Store::remove(g, id);
        }
    }

    fn remove(g: &mut Inner, id: u64) -> Option<Job> {
        let j = g.jobs.remove(&id)?;
        g.signals.remove(&(id as u32));
        g.bytes -= j.body.len() as u64;
        Some(j)
    }

    /// Keeps `body`; its payload id, or None when the store is full.
    pub fn insert(&self, body: impl Into<Payload>) -> Option<u64> {
        let body = body.into();
        let mut g = self.lock();
        self.expire(&mut g);
        if g.jobs.len() >= MAX_JOBS || g.bytes + body.len() as u64 > self.max_bytes {
            return None;
        }
        let id = loop {
            let id = u64::from_ne_bytes(crate::control::random_bytes().ok()?);
            if id as u32 != 0 && !g.signals.contains_key(&(id as u32)) {
                break id;
            }
        };
        g.kept += 1;
        g.bytes += body.len() as u64;
        g.signals.insert(id as u32, id);
        g.jobs.insert(
            id,
            Job {
                body,
                created: Instant::now(),
            },
        );
        Some(id)
    }

    /// Removes and returns the payload `id`, unless unknown or expired (refusals counted).
    pub fn take(&self, id: u64) -> Result<Payload, Refusal> {
        let mut g = self.lock();
        let r = match Store::remove(&mut g, id) {
            None => Err(Refusal::UnknownPayload),
            Some(j) if j.created.elapsed() > self.ttl => Err(Refusal::Expired),
            Some(j) => {
                g.taken += 1;
                Ok(j.body)
            }
        };
        if let Err(why) = r {
            g.refused[why.index()] += 1;
        }
        r
    }

    /// [`Store::take`] of the payload whose id's low 32 bits are `low` (the start signal's).
    pub fn take_signalled(&self, low: u32) -> Result<(u64, Payload), Refusal> {
        let id = self.lock().signals.get(&low).copied();
        match id {
            Some(id) => self.take(id).map(|b| (id, b)),
            None => {
                self.refuse(Refusal::UnknownPayload);
                Err(Refusal::UnknownPayload)
            }
        }
    }

    /// Counts a refusal.
    pub fn refuse(&self, why: Refusal) {
        self.lock().refused[why.index()] += 1;
    }

    /// Refusals so far for `why`.
    pub fn refused(&self, why: Refusal) -> u64 {
        self.lock().refused[why.index()]
    }

    /// Every refusal counter, by name.
    pub fn refusals(&self) -> Vec<(&'static str, u64)> {
        let g = self.lock();
        Refusal::ALL
            .iter()
            .map(|r| (r.name(), g.refused[r.index()]))
            .collect()
    }

    /// Payloads kept so far (ids handed out) and payloads claimed by an FE.
    pub fn counts(&self) -> (u64, u64) {
        let g = self.lock();
        (g.kept, g.taken)
    }

    /// Direct-mode transfers sent (through the GSO packet socket, through the raw socket).
    pub fn send_paths(&self) -> (u64, u64) {
        self.pair(|g| g.sends)
    }

    /// Transfers sent from a TCP socket continuing the FE's connection (`--dp-send repair`).
    pub fn repaired_sends(&self) -> u64 {
        self.lock().repaired
    }

    /// Transfers sent through the AF_XDP socket (`--dp-send xdp`).
    pub fn xdp_sends(&self) -> u64 {
        self.lock().xdp
    }

    /// Client ACKs DP received (from its tap, as the FE's control lines).
    pub fn ack_sources(&self) -> (u64, u64) {
        self.pair(|g| g.acks)
    }

    /// Transfers started (by the FE's start signal from the tap, by SEND lines).
    pub fn start_sources(&self) -> (u64, u64) {
        self.pair(|g| g.starts)
    }

    pub(crate) fn count_send(&self, gso: bool) {
        self.bump(|g| &mut g.sends[usize::from(!gso)]);
    }

    pub(crate) fn count_ack(&self, tap: bool) {
        self.bump(|g| &mut g.acks[usize::from(!tap)]);
    }

    pub(crate) fn count_start(&self, signal: bool) {
        self.bump(|g| &mut g.starts[usize::from(!signal)]);
    }

    fn pair(&self, of: impl FnOnce(&Inner) -> [u64; 2]) -> (u64, u64) {
        let g = self.lock();
        let [a, b] = of(&g);
        (a, b)
    }

    pub(crate) fn bump(&self, counter: impl FnOnce(&mut Inner) -> &mut u64) {
        let mut g = self.lock();
        *counter(&mut g) += 1;
    }

    /// Tests: the fault DP shows from now on.
    pub fn set_fault(&self, f: Fault) {
        self.fault.store(f as u8, Ordering::Relaxed);
    }

    pub(crate) fn fault(&self) -> Fault {
        match self.fault.load(Ordering::Relaxed) {
            1 => Fault::HoldSends,
            2 => Fault::RefuseSends,
            3 => Fault::LoseSignals,
            _ => Fault::None,
        }
    }

    /// (jobs, bytes) held now.
    pub fn usage(&self) -> (usize, u64) {
        let g = self.lock();
        (g.jobs.len(), g.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn the_store_is_bounded_and_ids_are_single_use() {
        let s = Store::new();
        let a = s.insert(Bytes::from_static(b"abc")).unwrap();
        let b = s.insert(Bytes::from_static(b"de")).unwrap();
        assert_ne!(a, b);
        assert_eq!(s.usage(), (2, 5));
        assert_eq!(s.take(a).unwrap().reader().get(0, 3).unwrap(), b"abc");
        assert_eq!(s.take(a).unwrap_err(), Refusal::UnknownPayload);
        assert_eq!(s.usage(), (1, 2));
        for _ in 1..MAX_JOBS {
            assert!(s.insert(Bytes::new()).is_some());
        }
        assert!(s.insert(Bytes::new()).is_none(), "MAX_JOBS is a bound");
        assert_eq!(s.refused(Refusal::UnknownPayload), 1);
    }

    /// Issue 43: ids were 1, 2, 3...: the next payload's id was known to anyone.
    #[test]
    fn ids_are_not_sequential_and_the_signal_finds_them() {
        let s = Store::new();
        let ids: Vec<u64> = (0..64).map(|_| s.insert(Bytes::new()).unwrap()).collect();
        let near = ids
            .windows(2)
            .filter(|w| w[1].abs_diff(w[0]) < 1 << 32)
            .count();
        assert_eq!(near, 0, "ids {ids:?}");
        assert!(ids.iter().all(|&id| id as u32 != 0));
        let (id, _) = s.take_signalled(ids[5] as u32).unwrap();
        assert_eq!(id, ids[5]);
        assert_eq!(
            s.take_signalled(ids[5] as u32).unwrap_err(),
            Refusal::UnknownPayload
        );
    }

    #[test]
    fn a_payload_expires() {
        let s = Store::with_limits(Duration::from_millis(20), MAX_BYTES);
        let a = s.insert(Bytes::from_static(b"abc")).unwrap();
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(s.take(a).unwrap_err(), Refusal::Expired);
        assert_eq!(s.refused(Refusal::Expired), 1);
        assert_eq!(s.usage(), (0, 0));
    }
}
