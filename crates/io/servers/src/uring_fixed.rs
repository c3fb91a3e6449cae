//! `uring-fixed` — seed 000's **iocp3** on io_uring.
//!
//! iocp3 was iocp2 (accepts posted ahead, one event loop around the completion port) with the
//! client environments allocated once, at start, in a fixed number — the number of
//! connections the server can hold — instead of on demand. Here, as in [`crate::uring`]:
//! one ring and one listener per worker, [`ACCEPTS_AHEAD`](common::ACCEPTS_AHEAD) accepts
//! kept posted, the same explicit `Step` per connection, `user_data` = (slot, operation):
//! the same worker ([`crate::uring_worker`]). The difference is its store, [`FixedSlots`]:
//!
//! - each worker allocates at start a fixed array of `--slots` `Slot`s
//!   ([`slots_per_worker`]) and one arena holding every slot's receive buffer; a free list
//!   of slot numbers (allocated at start too) gives a slot to an accepted socket and takes it
//!   back when its close completes. The default is the worker's share of `max_conns` plus
//!   25% (SO_REUSEPORT spreads connections over workers by hash, not by load), within
//!   [`MIN_SLOTS`]..[`MAX_DEFAULT_SLOTS`]: every worker used to hold the whole `max_conns`,
//!   10,000 slots × 16 KiB = 177 MiB pinned per worker. A connection that finds its worker's
//!   slots full, or the server-wide gate closed, is closed at once and counted as refused;
//! - the arena is registered with the ring (`IORING_REGISTER_BUFFERS`, one buffer) and read
//!   into with `IORING_OP_READ_FIXED`, so the kernel does not map the buffer on each receive.
//!   Registration pins the arena in memory (slots × `read_buf` per worker, said on the
//!   start line: [`start_note`]); above [`MAX_REGISTERED`], or if registration fails
//!   (memory-lock limit), the worker says so once and uses plain `IORING_OP_RECV` into the
//!   same arena.
//!   Sockets are not registered as fixed files.
//!
//! Nothing is allocated on the request path of a cached file by this module: the completion
//! batch vector is allocated once, the slot's iovecs and msghdr are in the slot, and the
//! response bytes are the session's shared `Bytes`. File bytes (a cache miss, the chunks of a
//! large file) are read with `IORING_OP_READ` into a buffer allocated for that read, as in
//! [`crate::uring`]. The `iolab_http::Session` of a slot is created when a
//! connection opens (its own allocations are per connection, not per request).
//!
//! Idle timeout and shutdown: see [`crate::uring_common`].

use std::io;

use io_uring::{opcode, squeue, types, IoUring};

use crate::uring_common::{self as common, Gate, StartLine};
use crate::uring_conn::IoMemory;
use crate::uring_worker::{Conn, Source, Store, Worker};
use crate::{Buffers, Ctx};

/// Largest receive arena registered (pinned) per worker.
pub const MAX_REGISTERED: usize = 256 << 20;
/// Fewest slots per worker by default (unless `max_conns` is lower).
pub const MIN_SLOTS: usize = 256;
/// Most slots per worker by default (`--slots` may ask for more): 64 MiB at 16 KiB each.
pub const MAX_DEFAULT_SLOTS: usize = 4096;

/// Slots per worker: `--slots`, or the worker's share of `max_conns` plus 25%, within
/// [`MIN_SLOTS`]..[`MAX_DEFAULT_SLOTS`] and never more than `max_conns`.
pub fn slots_per_worker(config: &crate::Config) -> usize {
    if config.slots > 0 {
        return config.slots;
    }
    let workers = common::worker_count(config.workers);
    let share = config.max_conns.div_ceil(workers);
    (share + share / 4)
        .clamp(MIN_SLOTS, MAX_DEFAULT_SLOTS)
        .min(config.max_conns)
        .max(1)
}

/// The start line's "(N workers)" for this model: workers, slots, and the memory the
/// receive arenas take (pinned when registered).
pub fn start_note(config: &crate::Config) -> String {
    let workers = common::worker_count(config.workers);
    let slots = slots_per_worker(config);
    let arena = slots.saturating_mul(config.buffers.read_buf);
    let how = if arena > MAX_REGISTERED {
        "not pinned: above the registration bound"
    } else {
        "registered and pinned"
    };
    format!(
        "{workers} workers, {slots} slots each: {:.1} MiB of receive buffers, {how}",
        (arena.saturating_mul(workers)) as f64 / (1 << 20) as f64
    )
}

pub fn run(ctx: &Ctx) -> io::Result<()> {
    let n = common::worker_count(ctx.config.workers);
    let sockets = common::bound_sockets(ctx, n, false)?;
    let gate = Gate::new(ctx.config.max_conns);
    let slots = slots_per_worker(&ctx.config);
    let start = StartLine::new(n);
    common::run_workers(ctx, sockets, "uring-fixed", |_, sock| {
        let worker = common::ring().and_then(|ring| {
            let store = FixedSlots::new(&ring, slots, ctx.config.buffers)?;
            Ok(Worker::new(ctx, &gate, Source::Listener(sock), ring, store))
        });
        start.arrive_and_wait(&ctx.shutdown);
        worker?.serve()
    })
}

/// One pre-allocated client environment. Its receive buffer is `read_buf` bytes of the
/// worker's arena at offset `index * read_buf` (`Buffers::read_buf`).
struct Slot {
    /// The connection it holds; None while the slot is in the free list.
    conn: Option<Conn>,
    mem: IoMemory,
}

impl Slot {
    /// The connection of a slot that an operation was submitted for: every operation
    /// completes before the close, which frees the slot last.
    fn conn(&mut self) -> (&mut Conn, &mut IoMemory) {
        let Slot { conn, mem } = self;
        (conn.as_mut().expect("an operation on a free slot"), mem)
    }
}

/// A worker's connections in a fixed array allocated at start, with their receive buffers
/// in one arena registered with the ring.
pub(crate) struct FixedSlots {
    /// Never grows nor moves after start: the kernel holds pointers into it (msghdr, iovecs).
    slots: Box<[Slot]>,
    /// Numbers of the free slots; capacity for all of them, allocated at start.
    free: Vec<u32>,
    /// Every slot's receive buffer, back to back; never moves.
    arena: Box<[u8]>,
    /// The arena is registered with the ring as fixed buffer 0.
    registered: bool,
    /// Bytes of each slot's receive buffer.
    read_buf: usize,
}

impl FixedSlots {
    /// `n` slots, their arena registered with `ring` when it is not too large to pin.
    fn new(ring: &IoUring, n: usize, buffers: Buffers) -> io::Result<FixedSlots> {
        let read_buf = buffers.read_buf;
        let slots: Box<[Slot]> = (0..n)
            .map(|_| Slot {
                conn: None,
                mem: IoMemory::new(buffers.max_iov),
            })
            .collect();
        let len = n
            .checked_mul(read_buf)
            .ok_or_else(|| io::Error::other("too many slots"))?;
        let mut arena = vec![0u8; len].into_boxed_slice();
        let iov = libc::iovec {
            iov_base: arena.as_mut_ptr() as *mut libc::c_void,
            iov_len: arena.len(),
        };
        let registered = if len > MAX_REGISTERED {
            tracing::warn!(
                "uring-fixed: {} MiB of receive buffers is too much to pin; using plain receives",
                len >> 20
            );
            false
        } else {
            // SAFETY: the arena outlives the ring's use of it: it is a field of the store,
            // which the worker drops after the ring (and after the event loop has reaped
            // every operation, or never: `leak`); the boxed slice never moves.
            match unsafe { ring.submitter().register_buffers(&[iov]) } {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(
                        "uring-fixed: receive buffers not registered ({e}); using plain receives"
                    );
                    false
                }
            }
        };
        Ok(FixedSlots {
            slots,
            free: (0..n as u32).rev().collect(),
            arena,
            registered,
            read_buf,
        })
    }
}

impl Store for FixedSlots {
    fn has_room(&self) -> bool {
        !self.free.is_empty()
    }

    fn insert(&mut self, conn: Conn) -> usize {
        let slot = self.free.pop().expect("has_room checked first") as usize;
        self.slots[slot].conn = Some(conn);
        slot
    }

    fn get(&mut self, slot: usize) -> (&mut Conn, &mut IoMemory) {
        self.slots[slot].conn()
    }

    /// A receive into the slot's part of the arena: `IORING_OP_READ_FIXED` when the arena is
    /// registered.
    fn receive(&mut self, slot: usize) -> (&mut Conn, squeue::Entry) {
        let rb = self.read_buf;
        let buf = self.arena[slot * rb..(slot + 1) * rb].as_mut_ptr();
        let c = self.slots[slot].conn().0;
        let fd = types::Fd(c.socket.fd);
        // The arena is owned by the store and outlives every operation (see `new`).
        let e = if self.registered {
            opcode::ReadFixed::new(fd, buf, rb as u32, 0).build()
        } else {
            opcode::Recv::new(fd, buf, rb as u32).build()
        };
        (c, e)
    }

    fn received(&mut self, slot: usize) -> (&mut Conn, &[u8]) {
        let at = slot * self.read_buf;
        let buf = &self.arena[at..at + self.read_buf];
        (self.slots[slot].conn().0, buf)
    }

    fn remove(&mut self, slot: usize) -> Conn {
        let conn = self.slots[slot]
            .conn
            .take()
            .expect("a close on a free slot");
        self.free.push(slot as u32);
        conn
    }

    fn for_each(&mut self, mut f: impl FnMut(&mut Conn)) {
        for c in self.slots.iter_mut().filter_map(|s| s.conn.as_mut()) {
            f(c);
        }
    }

    fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.arena));
        std::mem::forget(std::mem::take(&mut self.slots));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_max_conns_within_bounds() {
        let c = |max_conns, workers, slots| crate::Config {
            max_conns,
            workers,
            slots,
            ..crate::Config::default()
        };
        assert_eq!(slots_per_worker(&c(10_000, 2, 0)), MAX_DEFAULT_SLOTS);
        assert_eq!(slots_per_worker(&c(2_000, 2, 0)), 1250);
        assert_eq!(
            slots_per_worker(&c(100, 4, 0)),
            100,
            "never above max_conns"
        );
        assert_eq!(slots_per_worker(&c(1_000, 8, 0)), MIN_SLOTS);
        assert_eq!(slots_per_worker(&c(10_000, 2, 9)), 9, "--slots wins");
        let note = start_note(&c(10_000, 2, 0));
        assert!(
            note.starts_with("2 workers, 4096 slots each: 128.0 MiB"),
            "{note}"
        );
    }
}

#[cfg(test)]
mod serve_tests {
    crate::testing::serve_tests!(super::run);
}
