//! Who is unchoked: the swarm's per-peer state and the choker's two passes.
//!
//! The choker must not be starved by peers that say interested and stop reading (issue 47:
//! 200 such peers kept a good peer choked for ever). What a peer *takes* is measured, not
//! what we handed to the kernel: the bytes written to its socket minus those still in the
//! socket's send queue (`SIOCOUTQ`: not yet acknowledged by the peer's TCP). Data sitting in
//! our buffers is not progress.
//!
//! - The **snub pass** ([`Swarm::snub_pass`], every [`SNUB_TICK`]): a peer that has data
//!   waiting for it (or is unchoked and interested) and has taken nothing for
//!   `snub_after` is *snubbed*: choked, its slot given at once to the best candidate, and
//!   ranked after every other peer until it takes data again. One that has taken nothing
//!   for `send_timeout` while data waits is *stalled*: its task is told to drop it (the
//!   send-progress deadline).
//! - The **rechoke round** ([`Swarm::rechoke`], every `choke_interval`): the interested
//!   peers that are not snubbed, ranked by what they took over the last [`RATE_ROUNDS`]
//!   rounds (ties: peers never unchoked first, then at random), get `slots - 1` regular
//!   slots; one optimistic slot rotates every third round to a peer never unchoked before
//!   (once all have been tried, to any choked peer).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use iolab_runtime::Cond;
use slab::Slab;

/// Period of the snub pass.
pub const SNUB_TICK: Duration = Duration::from_secs(1);
/// Rounds over which a peer's rate is measured (30 s at the default 10 s round).
pub const RATE_ROUNDS: usize = 3;

/// The choker's view of one connected peer.
pub(crate) struct PeerSlot {
    /// The peer's socket (for `SIOCOUTQ`); the slot is removed before the socket closes.
    pub fd: RawFd,
    pub interested: bool,
    pub choked: bool,
    pub optimistic: bool,
    /// Unchoked at least once (the optimistic slot goes first to peers never tried).
    pub tried: bool,
    /// Took nothing for `snub_after` while it had data waiting or a slot.
    pub snubbed: bool,
    /// Took nothing for `send_timeout` while data waited: its task drops it.
    pub stalled: bool,
    /// Bytes written to the socket.
    pub written: u64,
    /// Bytes the peer took (written minus the send queue), as last measured.
    pub taken: u64,
    /// `taken` at each of the last [`RATE_ROUNDS`] rounds (a ring indexed by round).
    pub taken_at_round: [u64; RATE_ROUNDS],
    /// When `taken` last grew (or the peer last had nothing asked of it, or was unchoked).
    pub last_take: Instant,
    pub wake: Cond,
}

impl PeerSlot {
    pub fn new(fd: RawFd, wake: Cond) -> PeerSlot {
        PeerSlot {
            fd,
            interested: false,
            choked: true,
            optimistic: false,
            tried: false,
            snubbed: false,
            stalled: false,
            written: 0,
            taken: 0,
            taken_at_round: [0; RATE_ROUNDS],
            last_take: Instant::now(),
            wake,
        }
    }
}

/// The choker's settings (from the seeder's config).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChokeLimits {
    /// Upload slots; 0: every interested peer is unchoked (no snub-choking either).
    pub slots: usize,
    pub snub_after: Duration,
    pub send_timeout: Duration,
}

/// What a snub pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SnubOutcome {
    pub snubbed: u64,
    pub stalled: u64,
}

pub(crate) struct Swarm {
    pub peers: Slab<PeerSlot>,
    pub unchoked: usize,
    /// Rechoke rounds so far.
    pub round: u64,
}

impl Swarm {
    pub fn new() -> Swarm {
        Swarm {
            peers: Slab::new(),
            unchoked: 0,
            round: 0,
        }
    }

    /// The one place a peer's choke state changes: keeps `unchoked` and the `unchoked_now`
    /// counter in step, and wakes the peer's task so that it tells the peer.
    pub fn set_choked(&mut self, key: usize, choked: bool, unchoked_now: &AtomicU64) {
        let p = &mut self.peers[key];
        if p.choked == choked {
            return;
        }
        p.choked = choked;
        p.wake.broadcast();
        if choked {
            p.optimistic = false;
            self.unchoked -= 1;
            unchoked_now.fetch_sub(1, Ordering::Relaxed);
        } else {
            // A fresh chance: the snub clock starts at the unchoke.
            p.tried = true;
            p.last_take = Instant::now();
            self.unchoked += 1;
            unchoked_now.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A peer became (not) interested: unchoked at once when a slot is free (and it is not
    /// snubbed), choked when it loses interest.
    pub fn set_interested(&mut self, key: usize, on: bool, slots: usize, unchoked_now: &AtomicU64) {
        if self.peers[key].interested == on {
            return;
        }
        self.peers[key].interested = on;
        if !on {
            self.set_choked(key, true, unchoked_now);
        } else if slots == 0 || (self.unchoked < slots && !self.peers[key].snubbed) {
            self.set_choked(key, false, unchoked_now);
        }
    }

    /// Measures what each peer took (`outq(fd)`: the bytes in its socket's send queue),
    /// snubs and chokes those that take nothing, marks the stalled ones (and wakes their
    /// tasks to drop them), then fills the freed slots.
    pub fn snub_pass(
        &mut self,
        now: Instant,
        lim: ChokeLimits,
        outq: impl Fn(RawFd) -> u64,
        unchoked_now: &AtomicU64,
    ) -> SnubOutcome {
        let mut out = SnubOutcome::default();
        let mut to_choke = Vec::new();
        for (k, p) in self.peers.iter_mut() {
            let queued = outq(p.fd);
            let taken = p.written.saturating_sub(queued).max(p.taken);
            if taken > p.taken {
                p.taken = taken;
                p.last_take = now;
                p.snubbed = false;
            }
            let waiting = queued > 0;
            if !waiting && (p.choked || !p.interested) {
                // Nothing asked of it: not taking nothing is no fault.
                p.last_take = now;
                continue;
            }
            let idle = now.saturating_duration_since(p.last_take);
            if idle >= lim.snub_after && !p.snubbed {
                p.snubbed = true;
                out.snubbed += 1;
            }
            if p.snubbed && !p.choked && lim.slots > 0 {
                to_choke.push(k);
            }
            if waiting && idle >= lim.send_timeout && !p.stalled {
                p.stalled = true;
                p.wake.broadcast();
                out.stalled += 1;
            }
        }
        for k in to_choke {
            self.set_choked(k, true, unchoked_now);
        }
        if lim.slots > 0 {
            self.fill_free_slots(lim.slots, unchoked_now);
        }
        out
    }

    /// The interested peers that may have a slot, best first: not snubbed, by what they
    /// took over the rate window, those never unchoked first, then at random.
    fn ranked(&self) -> Vec<usize> {
        let ring = (self.round + 1) as usize % RATE_ROUNDS;
        let mut ranked: Vec<(u64, bool, u32, usize)> = self
            .peers
            .iter()
            .filter(|(_, p)| p.interested && !p.snubbed && !p.stalled)
            .map(|(k, p)| {
                let start = p.taken_at_round[ring];
                (p.taken - start.min(p.taken), p.tried, rand::random(), k)
            })
            .collect();
        ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        ranked.into_iter().map(|x| x.3).collect()
    }

    /// Unchokes the best choked candidates while slots are free.
    fn fill_free_slots(&mut self, slots: usize, unchoked_now: &AtomicU64) {
        if self.unchoked >= slots {
            return;
        }
        for k in self.ranked() {
            if self.unchoked >= slots {
                break;
            }
            if self.peers[k].choked {
                self.set_choked(k, false, unchoked_now);
            }
        }
    }

    /// One rechoke round: regular slots by rate, the optimistic slot kept or moved (every
    /// third round, or when its peer lost interest or was snubbed), and the rate window
    /// moved on.
    pub fn rechoke(&mut self, slots: usize, unchoked_now: &AtomicU64) {
        let ranked = self.ranked();
        self.round += 1;
        let round = self.round;
        for (_, p) in self.peers.iter_mut() {
            p.taken_at_round[round as usize % RATE_ROUNDS] = p.taken;
        }
        let regular = slots.saturating_sub(1).max(1);
        let unchoke: Vec<usize> = ranked.iter().take(regular).copied().collect();
        let mut optimistic = self
            .peers
            .iter()
            .find(|(_, p)| p.optimistic)
            .map(|(k, _)| k)
            .filter(|&k| {
                let p = &self.peers[k];
                p.interested && !p.snubbed && !p.stalled && !unchoke.contains(&k)
            });
        if slots > 1 && (round % 3 == 0 || optimistic.is_none()) {
            optimistic = self.optimistic_pick(&unchoke);
        }
        let keys: Vec<usize> = self.peers.iter().map(|(k, _)| k).collect();
        for k in keys {
            let want = unchoke.contains(&k) || Some(k) == optimistic;
            self.set_choked(k, !want, unchoked_now);
            self.peers[k].optimistic = want && Some(k) == optimistic;
        }
    }

    /// The next optimistic peer: an interested peer outside `regular`, preferring those
    /// never unchoked, then those not snubbed, then any.
    fn optimistic_pick(&self, regular: &[usize]) -> Option<usize> {
        let pool = |f: &dyn Fn(&PeerSlot) -> bool| -> Vec<usize> {
            self.peers
                .iter()
                .filter(|(k, p)| p.interested && !p.stalled && !regular.contains(k) && f(p))
                .map(|(k, _)| k)
                .collect()
        };
        let tiers = [
            pool(&|p| !p.tried && !p.snubbed),
            pool(&|p| !p.snubbed),
            pool(&|_| true),
        ];
        let t = tiers.into_iter().find(|t| !t.is_empty())?;
        Some(t[rand::random_range(0..t.len())])
    }
}

/// The bytes in `fd`'s send queue not yet acknowledged by the peer (`SIOCOUTQ`); 0 if the
/// socket cannot say.
pub(crate) fn send_queue(fd: RawFd) -> u64 {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (= TIOCOUTQ) writes one int through the pointer, which points at
    // `n`, live for the call; a closed or foreign fd makes the call fail, not write.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ as _, &mut n as *mut libc::c_int) };
    if r < 0 || n < 0 {
        0
    } else {
        n as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIM: ChokeLimits = ChokeLimits {
        slots: 2,
        snub_after: Duration::from_secs(5),
        send_timeout: Duration::from_secs(20),
    };

    fn swarm_of(n: usize) -> (Swarm, AtomicU64) {
        let mut sw = Swarm::new();
        for i in 0..n {
            sw.peers.insert(PeerSlot::new(i as RawFd, Cond::new()));
        }
        (sw, AtomicU64::new(0))
    }

    #[test]
    fn set_choked_keeps_the_unchoked_count_in_step() {
        let (mut sw, counter) = swarm_of(2);
        sw.set_choked(0, false, &counter);
        sw.set_choked(0, false, &counter); // no change: counted once
        sw.set_choked(1, false, &counter);
        assert_eq!((sw.unchoked, counter.load(Ordering::Relaxed)), (2, 2));
        sw.peers[1].optimistic = true;
        sw.set_choked(1, true, &counter);
        assert!(
            !sw.peers[1].optimistic,
            "a choked peer holds no optimistic slot"
        );
        sw.set_choked(1, true, &counter);
        assert_eq!((sw.unchoked, counter.load(Ordering::Relaxed)), (1, 1));
    }

    /// Two unchoked peers whose data stays in their send queues are snubbed and choked
    /// after `snub_after`, their slots go to the waiting peer at once, and after
    /// `send_timeout` they are marked stalled (to be dropped).
    #[test]
    fn peers_that_take_nothing_are_snubbed_then_stalled() {
        let (mut sw, c) = swarm_of(3);
        for k in 0..3 {
            sw.set_interested(k, true, LIM.slots, &c);
        }
        assert!(!sw.peers[0].choked && !sw.peers[1].choked && sw.peers[2].choked);
        // Peers 0 and 1 were handed 1 MB each, all of it still queued.
        sw.peers[0].written = 1 << 20;
        sw.peers[1].written = 1 << 20;
        let stuck = |fd: RawFd| if fd < 2 { 1 << 20 } else { 0 };
        let t0 = Instant::now();
        assert_eq!(
            sw.snub_pass(t0 + Duration::from_secs(1), LIM, stuck, &c),
            SnubOutcome::default()
        );
        let o = sw.snub_pass(t0 + Duration::from_secs(6), LIM, stuck, &c);
        assert_eq!(
            o,
            SnubOutcome {
                snubbed: 2,
                stalled: 0
            }
        );
        assert!(
            sw.peers[0].choked && sw.peers[1].choked,
            "snubbed peers are choked"
        );
        assert!(
            !sw.peers[2].choked,
            "the waiting peer gets a freed slot at once"
        );
        // 21 s: peers 0 and 1 are stalled; peer 2, unchoked at 6 s and interested, took
        // nothing since: snubbed too (but not stalled: nothing waits for it).
        let o = sw.snub_pass(t0 + Duration::from_secs(21), LIM, stuck, &c);
        assert_eq!(
            o,
            SnubOutcome {
                snubbed: 1,
                stalled: 2
            }
        );
        assert!(sw.peers[0].stalled && sw.peers[1].stalled && !sw.peers[2].stalled);
        assert_eq!(sw.unchoked, 0);
    }

    #[test]
    fn a_peer_that_takes_data_is_not_snubbed_and_wins_the_round() {
        let (mut sw, c) = swarm_of(4);
        for k in 0..4 {
            sw.set_interested(k, true, LIM.slots, &c);
        }
        // Peer 3 took 1 MB (allowed-fast pieces, say); the others nothing.
        sw.peers[3].written = 1 << 20;
        let t0 = Instant::now();
        sw.snub_pass(t0 + Duration::from_secs(1), LIM, |_| 0, &c);
        assert!(!sw.peers[3].snubbed);
        sw.rechoke(LIM.slots, &c);
        assert!(
            !sw.peers[3].choked,
            "the peer that took most has a regular slot"
        );
        assert_eq!(sw.unchoked, 2);
        let opt: Vec<usize> = sw
            .peers
            .iter()
            .filter(|(_, p)| p.optimistic)
            .map(|(k, _)| k)
            .collect();
        assert_eq!(opt.len(), 1);
        assert_ne!(opt[0], 3);
    }

    /// The optimistic slot goes to peers never unchoked before it returns to any.
    #[test]
    fn the_optimistic_slot_rotates_through_untried_peers() {
        let (mut sw, c) = swarm_of(6);
        for k in 0..6 {
            sw.peers[k].interested = true;
        }
        let mut seen = std::collections::HashSet::new();
        // Peer 0 keeps taking data: it keeps the one regular slot. The optimistic slot is
        // taken in round 1 and moves in rounds 3, 6, 9, 12: five peers in five picks.
        for _ in 1..=12 {
            sw.peers[0].taken += 1000;
            sw.rechoke(LIM.slots, &c);
            assert!(!sw.peers[0].choked, "the best uploader keeps its slot");
            for (k, p) in sw.peers.iter() {
                if p.optimistic {
                    seen.insert(k);
                }
            }
        }
        assert_eq!(seen.len(), 5, "every other peer was tried once: {seen:?}");
    }

    #[test]
    fn send_queue_of_a_non_socket_is_zero() {
        assert_eq!(send_queue(-1), 0);
    }
}
