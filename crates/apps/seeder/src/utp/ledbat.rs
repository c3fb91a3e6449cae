//! LEDBAT congestion control as BEP 29 defines it: the window grows while the one-way delay
//! of our packets stays under a target above the lowest delay seen (the base delay), and
//! shrinks past it, so uTP yields to TCP and to interactive traffic on the same link. Loss
//! halves the window, a timeout drops it to one packet. Pure arithmetic, time passed in.

use std::time::{Duration, Instant};

/// The queueing delay LEDBAT aims at (BEP 29's CCONTROL_TARGET).
pub const CCONTROL_TARGET_US: i64 = 100_000;
/// Window growth per round trip when the delay is far under target (BEP 29's
/// MAX_CWND_INCREASE_PACKETS_PER_RTT, counted in bytes as the reference implementation
/// does: 3,000 bytes, about two full packets).
pub const MAX_CWND_INCREASE_BYTES_PER_RTT: f64 = 3000.0;
/// The window never falls below this (bytes): one full packet can always be in flight.
pub const MIN_CWND: usize = super::packet::MSS;
/// Nor grows past this (bytes): bounds what one connection holds unacknowledged.
pub const MAX_CWND: usize = 1 << 20;
/// The base delay is the lowest delay over this long (BEP 29: two minutes), kept as the
/// minimum of each of the last `BASE_SLOTS` intervals so that an old minimum ages out.
const BASE_HISTORY: Duration = Duration::from_secs(120);
const BASE_SLOTS: usize = 2;

#[derive(Debug, Clone)]
pub struct Ledbat {
    /// The congestion window, bytes (fractional growth kept).
    cwnd: f64,
    /// Minimum delay of each interval (the newest last), and when the newest began.
    base: [u32; BASE_SLOTS],
    slot_started: Option<Instant>,
    /// The latest delay sample, microseconds.
    current: u32,
}

impl Ledbat {
    pub fn new(initial: usize) -> Ledbat {
        Ledbat {
            cwnd: initial.clamp(MIN_CWND, MAX_CWND) as f64,
            base: [u32::MAX; BASE_SLOTS],
            slot_started: None,
            current: 0,
        }
    }

    pub fn cwnd(&self) -> usize {
        self.cwnd as usize
    }

    /// The lowest delay over the base history (`u32::MAX` before any sample).
    pub fn base_delay(&self) -> u32 {
        *self.base.iter().min().unwrap_or(&u32::MAX)
    }

    /// Our packets' queueing delay: the latest sample above the base delay, microseconds.
    pub fn queuing_delay(&self) -> u32 {
        self.current.saturating_sub(self.base_delay())
    }

    /// A delay sample: the peer's `timestamp_difference_microseconds`, how long our packet
    /// took to reach it by its clock minus ours (so only differences between samples mean
    /// anything; 0 means the peer had none to give).
    pub fn delay_sample(&mut self, delay_us: u32, now: Instant) {
        if delay_us == 0 {
            return;
        }
        let slot_len = BASE_HISTORY / BASE_SLOTS as u32;
        match self.slot_started {
            Some(t) if now.saturating_duration_since(t) < slot_len => {}
            Some(_) => {
                self.base.rotate_left(1);
                self.base[BASE_SLOTS - 1] = u32::MAX;
                self.slot_started = Some(now);
            }
            None => self.slot_started = Some(now),
        }
        let newest = &mut self.base[BASE_SLOTS - 1];
        *newest = (*newest).min(delay_us);
        self.current = delay_us;
    }

    /// `bytes_acked` newly acknowledged: BEP 29's update,
    /// `cwnd += MAX_CWND_INCREASE * off_target/target * bytes_acked/cwnd`.
    /// `window_limited`: whether the sender had a full window out; a sender that is not
    /// using its window does not grow it (else the window means nothing when it is used).
    pub fn on_ack(&mut self, bytes_acked: usize, window_limited: bool) {
        if bytes_acked == 0 {
            return;
        }
        let off_target = CCONTROL_TARGET_US - self.queuing_delay() as i64;
        let delay_factor = off_target as f64 / CCONTROL_TARGET_US as f64;
        let window_factor = bytes_acked as f64 / self.cwnd.max(bytes_acked as f64);
        let gain = MAX_CWND_INCREASE_BYTES_PER_RTT * delay_factor * window_factor;
        if gain > 0.0 && !window_limited {
            return;
        }
        self.cwnd = (self.cwnd + gain).clamp(MIN_CWND as f64, MAX_CWND as f64);
    }

    /// A packet was lost (three later packets acknowledged past it): halve.
    pub fn on_loss(&mut self) {
        self.cwnd = (self.cwnd / 2.0).max(MIN_CWND as f64);
    }

    /// The retransmission timer fired: one packet.
    pub fn on_timeout(&mut self) {
        self.cwnd = MIN_CWND as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_under_target_and_shrinks_over_it() {
        let t0 = Instant::now();
        let mut l = Ledbat::new(10 * MIN_CWND);
        let start = l.cwnd();
        // Base 5 ms, now 5 ms: no queueing; a full window acked grows it by the gain.
        l.delay_sample(5_000, t0);
        l.on_ack(start, true);
        assert_eq!(l.cwnd(), start + 3000);
        // Not window-limited: no growth.
        l.on_ack(start, false);
        assert_eq!(l.cwnd(), start + 3000);
        // 150 ms of queueing (50 ms over target): shrinks by half the gain per window.
        l.delay_sample(155_000, t0 + Duration::from_secs(1));
        assert_eq!(l.queuing_delay(), 150_000);
        let before = l.cwnd();
        l.on_ack(before, false);
        assert_eq!(
            l.cwnd(),
            before - 1500,
            "shrinking does not need a full window"
        );
        // Exactly on target: unchanged.
        l.delay_sample(105_000, t0 + Duration::from_secs(2));
        let before = l.cwnd();
        l.on_ack(before, true);
        assert_eq!(l.cwnd(), before);
    }

    #[test]
    fn loss_halves_timeout_resets_and_bounds_hold() {
        let mut l = Ledbat::new(40 * MIN_CWND);
        l.on_loss();
        assert_eq!(l.cwnd(), 20 * MIN_CWND);
        l.on_timeout();
        assert_eq!(l.cwnd(), MIN_CWND);
        l.on_loss();
        assert_eq!(l.cwnd(), MIN_CWND, "never under one packet");
        let mut big = Ledbat::new(usize::MAX);
        assert_eq!(big.cwnd(), MAX_CWND);
        big.on_ack(MAX_CWND, true);
        assert_eq!(big.cwnd(), MAX_CWND, "never over the cap");
    }

    #[test]
    fn an_old_base_delay_ages_out() {
        let t0 = Instant::now();
        let mut l = Ledbat::new(MIN_CWND);
        l.delay_sample(1_000, t0);
        l.delay_sample(50_000, t0 + Duration::from_secs(61));
        assert_eq!(l.base_delay(), 1_000, "still within two minutes");
        l.delay_sample(50_000, t0 + Duration::from_secs(122));
        assert_eq!(
            l.base_delay(),
            50_000,
            "the 1 ms minimum is over two minutes old"
        );
        assert_eq!(l.queuing_delay(), 0);
    }
}
