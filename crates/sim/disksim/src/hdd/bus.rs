//! How a read's data crosses the interface while the media brings it into the buffer: the
//! reconnection at the high-water mark, and what the drive does when the bus catches up with
//! the media (keeps the bus, or disconnects and reconnects at the water mark again).
//!
//! The rules are DiskSim 4.0's, as its code (not its manual) applies them in
//! `disksim_diskctlr.c`:
//! - a read that misses disconnects at once (`disk_read_arrive`); one the cache holds in part
//!   sends that part at once ("Immed transfer partial hit").
//! - the drive reconnects when the buffer holds `watermark` sectors past the last one sent,
//!   or all the rest of the request (`disk_request_needs_bus`, checked on every sector read
//!   by `disk_buffer_request_complete`, and when a disconnection completes by
//!   `disk_disconnect`); the watermark is `max(1, ⌊min(segment, request) × high water
//!   mark⌋)` with "Set watermark by reqsize", else `⌈segment × high water mark⌉`
//!   (`disk_select_bus_request`).
//! - every reconnection costs "First reselect overhead" plus "Data preparation overhead"
//!   (`disk_check_bus`).
//! - once connected, each burst sends all the sectors buffered at its start, one every
//!   bus-sector time, and the next burst follows at once (`disk_buffer_transfer_size`,
//!   `disk_reconnection_or_transfer_complete`): with the bus slower than the media the bus
//!   runs without a break from the first sector on, overlapping the media transfer.
//! - when the buffer holds nothing more to send, a drive with "Hold bus entire read xfer"
//!   waits on the bus for the next sector; one without it disconnects ("Read disconnect
//!   afterread/afterwrite") and reconnects at the water mark (`disk_buffer_transfer_size`).
//!
//! A write's data goes into its segment as fast as the bus brings it while there is room:
//! each burst is the room left, `segment − (sent − written)` sectors
//! (`disk_buffer_transfer_size`). A write larger than its segment fills it and then, with
//! "Hold bus entire write xfer", keeps the bus and sends each sector as the media frees its
//! place; without it the drive disconnects ("Write disconnect overhead") and reconnects
//! (reselect and data preparation) once no more than the low water mark is left to write,
//! `max(1, ⌊min(segment, request) × low water mark⌋)` sectors with "Set watermark by
//! reqsize" (`disk_request_needs_bus`, `disk_buffer_request_complete`).

use super::{Chunk, HddSpec};

/// A read's interface: the disk's parameters, overheads already scaled.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReadBus {
    /// Bus time per sector (ms).
    pub per_sector: f64,
    /// Sectors buffered past those sent before the drive reconnects (at least 1).
    pub watermark: u64,
    /// The drive keeps the bus when the buffer runs dry.
    pub hold: bool,
    /// A reconnection's cost: reselection and data preparation (ms).
    pub reconnect: f64,
    /// A disconnection's cost (ms).
    pub disconnect: f64,
}

/// The bus at the start of the media transfer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum BusState {
    /// Connected, free from this time on (a cached prefix sent).
    Connected(f64),
    /// Disconnected; it may reconnect from this time on.
    Disconnected(f64),
}

/// The time sector `k` (0-based, counted from chunk `c`'s sector `o`) is in the buffer.
fn ready_at(chunks: &[Chunk], mut c: usize, mut o: u32, mut k: u64) -> f64 {
    while c < chunks.len() {
        let left = u64::from(chunks[c].n.saturating_sub(o));
        if k < left {
            let ch = &chunks[c];
            return ch.t0 + (f64::from(o) + k as f64 + 1.0) * ch.ms;
        }
        k -= left;
        c += 1;
        o = 0;
    }
    // Past the last chunk: the last sector read.
    chunks
        .iter()
        .rev()
        .find(|ch| ch.n > 0)
        .map_or(f64::NEG_INFINITY, |ch| ch.t0 + f64::from(ch.n) * ch.ms)
}

impl ReadBus {
    /// The interface of a read of `n` sectors on `spec`'s disk, the previous request a read
    /// (`last_read`) or a write.
    pub fn of(spec: &HddSpec, n: u64, last_read: bool) -> ReadBus {
        let (o, cache, scale) = (&spec.overheads, &spec.cache, spec.overhead_scale);
        let disconnect = if last_read {
            o.read_disconnect_after_read
        } else {
            o.read_disconnect_after_write
        };
        ReadBus {
            per_sector: spec.bus_read_ms,
            watermark: Self::watermark(
                cache.read_watermark,
                cache.segment_sectors,
                n,
                cache.watermark_by_request,
            ),
            hold: cache.hold_bus_read,
            reconnect: (o.reselect + o.data_prep) * scale,
            disconnect: disconnect * scale,
        }
    }

    /// The DiskSim water mark (sectors) of a request of `sectors` through a
    /// `segment`-sector segment: `by_request` is "Set watermark by reqsize", `mark` the
    /// "High (read) water mark" or "Low (write) water mark".
    pub fn watermark(mark: f64, segment: u64, sectors: u64, by_request: bool) -> u64 {
        let w = if by_request {
            (segment.min(sectors) as f64 * mark).floor()
        } else {
            // DiskSim: (int)(segment × mark + 0.9999999999).
            (segment as f64 * mark + 0.999_999_999_9).floor()
        };
        (w.max(1.0) as u64).min(sectors.max(1))
    }

    /// When the last of the sectors `chunks` bring into the buffer (sector `i` of a chunk
    /// buffered at `t0 + (i + 1) * ms`) is on the host, the bus as `start` says.
    pub fn done(&self, chunks: &[Chunk], start: BusState) -> f64 {
        let total: u64 = chunks.iter().map(|c| u64::from(c.n)).sum();
        let bt = self.per_sector;
        let mut state = start;
        let mut sent = 0u64;
        let (mut c, mut o) = (0usize, 0u32);
        while sent < total {
            let ch = chunks[c];
            if o >= ch.n {
                c += 1;
                o = 0;
                continue;
            }
            let ready = ch.t0 + f64::from(o + 1) * ch.ms;
            match state {
                BusState::Disconnected(t) => {
                    let want = self.watermark.min(total - sent);
                    let r = ready_at(chunks, c, o, want - 1);
                    state = BusState::Connected(t.max(r) + self.reconnect);
                }
                BusState::Connected(t) if ready > t && !self.hold => {
                    state = BusState::Disconnected(t + self.disconnect);
                }
                BusState::Connected(t) if self.hold || bt >= ch.ms => {
                    // The rest of the chunk streams: sector k goes at the earliest when it
                    // is buffered and the one before it has gone; with sectors evenly spaced
                    // the last finishes at the latest of these three.
                    let m = f64::from(ch.n - o);
                    let last = ch.t0 + f64::from(ch.n) * ch.ms;
                    let end = (t + m * bt).max(ready + m * bt).max(last + bt);
                    state = BusState::Connected(end);
                    sent += u64::from(ch.n - o);
                    c += 1;
                    o = 0;
                }
                BusState::Connected(t) => {
                    // A bus faster than the media, and a drive that lets it go: one sector,
                    // then the buffer is empty again.
                    state = BusState::Connected(t.max(ready) + bt);
                    sent += 1;
                    o += 1;
                }
            }
        }
        match state {
            BusState::Connected(t) | BusState::Disconnected(t) => t,
        }
    }
}

/// A write's interface: the disk's parameters, overheads already scaled.
#[derive(Clone, Copy, Debug)]
pub(super) struct WriteBus {
    /// Bus time per sector (ms).
    pub per_sector: f64,
    /// Room in the write's segment (sectors, at least 1).
    pub segment: u64,
    /// Sectors left to write when a disconnected drive reconnects (at least 1).
    pub watermark: u64,
    /// The drive keeps the bus while the segment is full.
    pub hold: bool,
    /// A reconnection's cost (ms).
    pub reconnect: f64,
    /// A disconnection's cost (ms).
    pub disconnect: f64,
}

/// How many of the sectors `chunks` write are on the media at `t`.
fn written_by(chunks: &[Chunk], t: f64) -> u64 {
    let mut done = 0u64;
    for ch in chunks {
        let end = ch.t0 + f64::from(ch.n) * ch.ms;
        if end <= t {
            done += u64::from(ch.n);
            continue;
        }
        if ch.ms > 0.0 && t > ch.t0 {
            done += (((t - ch.t0) / ch.ms).floor() as u64).min(u64::from(ch.n));
        }
        break;
    }
    done
}

impl WriteBus {
    /// The interface of a write of `n` sectors on `spec`'s disk. A drive with an extra
    /// write disconnect pays its own reconnection and disconnection ("Other reselect
    /// overhead", "Extradisc 2nd disconnect overhead": `disk_check_bus`,
    /// `disk_reconnection_or_transfer_complete`).
    pub fn of(spec: &HddSpec, n: u64) -> WriteBus {
        let (o, cache, scale) = (&spec.overheads, &spec.cache, spec.overhead_scale);
        let (reselect, disconnect) = if o.extra_write_disconnect.is_some() {
            (o.reselect_other, o.extradisc_write_disconnect)
        } else {
            (o.reselect, o.write_disconnect)
        };
        WriteBus {
            per_sector: spec.bus_write_ms,
            segment: cache.segment_sectors,
            watermark: ReadBus::watermark(
                cache.write_watermark,
                cache.segment_sectors,
                n,
                cache.watermark_by_request,
            ),
            hold: cache.hold_bus_write,
            reconnect: (reselect + o.data_prep) * scale,
            disconnect: disconnect * scale,
        }
    }

    /// When the bus has brought all `n` sectors of a write whose first burst starts at
    /// `start`, the media writing them as `chunks` say (sector `i` of a chunk on the media
    /// at `t0 + (i + 1) * ms`). The media's own timing is taken as the bus leaves it: the
    /// room a write frees comes back long before the media needs the sectors sent into it,
    /// unless reconnecting takes longer than writing the water mark's sectors.
    pub fn done(&self, chunks: &[Chunk], start: f64, n: u64) -> f64 {
        let bt = self.per_sector;
        let room = self.segment.max(1);
        let mut sent = n.min(room);
        let mut t = start + sent as f64 * bt;
        while sent < n {
            if self.hold {
                // Sector `sent` takes the place of sector `sent - room` once that is written.
                let free = ready_at(chunks, 0, 0, sent - room);
                t = t.max(free) + bt;
                sent += 1;
                continue;
            }
            let space = room.saturating_sub(sent - written_by(chunks, t).min(sent));
            if space > 0 {
                let burst = space.min(n - sent);
                t += burst as f64 * bt;
                sent += burst;
                continue;
            }
            // Full: disconnect, and reconnect once at most `watermark` sectors wait.
            let w = self.watermark.clamp(1, room);
            let low = if sent > w {
                ready_at(chunks, 0, 0, sent - w - 1)
            } else {
                f64::NEG_INFINITY
            };
            let back = (t + self.disconnect).max(low) + self.reconnect;
            let space = room.saturating_sub(sent - written_by(chunks, back).min(sent));
            let burst = space.max(1).min(n - sent);
            t = back + burst as f64 * bt;
            sent += burst;
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(n: u32, t0: f64, ms: f64) -> Chunk {
        Chunk {
            n,
            t0,
            ms,
            cyl: 0,
            head: 0,
        }
    }

    fn bus(per_sector: f64, watermark: u64, hold: bool) -> ReadBus {
        ReadBus {
            per_sector,
            watermark,
            hold,
            reconnect: 0.0,
            disconnect: 0.0,
        }
    }

    #[test]
    fn a_slow_bus_overlaps_the_media_from_the_first_sector() {
        // 40 sectors at 0.04 ms each from t = 1; the bus 0.1 ms a sector, reconnecting at
        // the first: it starts at 1.04 and runs 40 × 0.1 ms, whether or not the drive holds
        // the bus (it never runs dry).
        let media = [chunk(40, 1.0, 0.04)];
        for hold in [false, true] {
            let t = bus(0.1, 1, hold).done(&media, BusState::Disconnected(0.0));
            assert!((t - (1.04 + 4.0)).abs() < 1e-9, "hold {hold}: {t}");
        }
        // Sending once all of it is buffered (the rule this replaces) would end at 5.6.
    }

    #[test]
    fn the_water_mark_delays_the_reconnection_and_a_reselect_costs() {
        let media = [chunk(40, 1.0, 0.04)];
        let mut b = bus(0.1, 30, true);
        b.reconnect = 0.2;
        // Reconnects when 30 sectors are in (2.2), + 0.2, then 40 sectors on the bus.
        let t = b.done(&media, BusState::Disconnected(0.0));
        assert!((t - (2.2 + 0.2 + 4.0)).abs() < 1e-9, "{t}");
    }

    #[test]
    fn a_drive_that_does_not_hold_the_bus_reconnects_after_a_gap_in_the_media() {
        // Two tracks: 5 sectors, a 3 ms switch, 5 more; a fast bus (0.01 ms) catches up
        // within each sector. Holding the bus: the last sector goes at its read + 0.01.
        let media = [chunk(5, 0.0, 0.1), chunk(5, 3.5, 0.1)];
        let hold = bus(0.01, 1, true).done(&media, BusState::Disconnected(0.0));
        assert!((hold - (4.0 + 0.01)).abs() < 1e-9, "{hold}");
        // Not holding it, each sector costs a disconnection and a reconnection.
        let mut free = bus(0.01, 1, false);
        free.reconnect = 0.05;
        free.disconnect = 0.02;
        let t = free.done(&media, BusState::Disconnected(0.0));
        assert!((t - (4.0 + 0.05 + 0.01)).abs() < 1e-9, "{t}");
        // With a water mark of 5 it reconnects once per track.
        free.watermark = 5;
        let t = free.done(&media, BusState::Disconnected(0.0));
        assert!((t - (4.0 + 0.05 + 5.0 * 0.01)).abs() < 1e-9, "{t}");
    }

    #[test]
    fn a_cached_prefix_keeps_the_bus_connected_until_the_buffer_runs_dry() {
        // Connected until 2.0 (the cached part sent); the media's sectors are ready from
        // 1.1 on, so the bus goes on without reconnecting.
        let media = [chunk(10, 1.0, 0.1)];
        let mut b = bus(0.2, 1, false);
        b.reconnect = 0.5;
        let t = b.done(&media, BusState::Connected(2.0));
        assert!((t - (2.0 + 10.0 * 0.2)).abs() < 1e-9, "{t}");
    }

    #[test]
    fn a_write_larger_than_its_segment_waits_for_the_media_to_free_room() {
        // 100 sectors through a 40-sector segment; the bus 1/64 ms a sector from t = 0,
        // the media one every 0.125 ms from t = 1.
        let media = [chunk(100, 1.0, 0.125)];
        let mut b = WriteBus {
            per_sector: 0.015625,
            segment: 40,
            watermark: 1,
            hold: true,
            reconnect: 0.0,
            disconnect: 0.0,
        };
        // Within its segment a write goes at the bus's pace.
        assert_eq!(b.done(&media, 0.0, 40), 0.625);
        // Holding the bus: the last sector goes once sector 59 is written (1 + 7.5).
        assert_eq!(b.done(&media, 0.0, 100), 8.5 + 0.015625);
        // Not holding it, with a water mark of 10 sectors: full at 0.625; 10 left to write
        // at 4.75, back at 5.0 (32 written): 32 more by 5.5, and the 4 written meanwhile by
        // 5.5625; full until 9.25 (10 left), back at 9.5: the last 24 by 9.875.
        b.hold = false;
        b.watermark = 10;
        b.reconnect = 0.25;
        assert_eq!(b.done(&media, 0.0, 100), 9.875);
    }

    #[test]
    fn watermarks_are_taken_as_disksim_computes_them() {
        // By request size: ⌊min(segment, request) × mark⌋, at least 1.
        assert_eq!(ReadBus::watermark(0.75, 256, 8, true), 6);
        assert_eq!(ReadBus::watermark(0.75, 256, 1, true), 1);
        assert_eq!(ReadBus::watermark(0.0, 256, 64, true), 1);
        assert_eq!(ReadBus::watermark(0.75, 16, 64, true), 12);
        // By segment: ⌈segment × mark⌉, no more than the request.
        assert_eq!(ReadBus::watermark(0.1, 256, 64, false), 26);
        assert_eq!(ReadBus::watermark(0.1, 256, 8, false), 8);
    }
}
