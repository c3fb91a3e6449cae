//! The connections' slots of the array map `disc_slots` (struct conn_slot in
//! bpf/disc.bpf.c), mapped into the FE's memory (BPF_F_MMAPABLE): the FE reads what the
//! hooks recorded and writes each answer's epoch with plain stores, where a hash map took
//! a lookup and an update, two bpf(2) calls per answer (8% of the FE's CPU at 64 KiB).
//!
//! Invariants (shared with the C side):
//! - Every field is a 4-byte word read and written whole (atomics here, aligned word
//!   accesses in the programs): the kernel and the programs change the slot while we hold
//!   a reference to it, so nothing here is a plain Rust reference to a non-atomic value.
//! - An epoch is written into the copy *not* in force, `ep[cur ^ 1]`, then put in force by
//!   storing `cur` (Release: the epoch's words are visible before it). Programs read `cur`
//!   once per packet and use that copy only, so they never mix two epochs. A copy is
//!   written again two epochs later, at least one payload's round trip, far longer than a
//!   program's run (microseconds, in softirq).
//! - Programs write, in the copy in force, `last_ack`, `last_win` and clear `notify` and
//!   `start_id`; and the words after `cur`, except `cl_wscale`. User space writes those
//!   only when it (re)initialises a slot no program uses yet.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// A connection's state as [`crate::bpf::Hooks::get`] reads it from its slot: the epoch in force (see
/// bpf/disc.bpf.c) and the programs' records.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnState {
    /// The FE stack's sequence number where the BE's payload was inserted.
    pub boundary: u32,
    /// Shift of the FE's bytes before `boundary`.
    pub off_lo: u32,
    /// Shift from `boundary` on: off_lo + the payload's length.
    pub off_hi: u32,
    /// Latest client ACK at or past the payload's start (client view), for DP.
    pub last_ack: u32,
    /// Its raw window field.
    pub last_win: u32,
    pub acks: u32,
    pub dp_acks: u32,
    /// Pure ACKs inside the payload range, kept from the FE's stack.
    pub dropped: u32,
    /// FE segments whose sequence number was shifted.
    pub shifted: u32,
    /// Highest sequence number + length the FE's stack sent (its own view).
    pub fe_nxt: u32,
    /// The FE's latest ACK: the client's next byte.
    pub fe_ack: u32,
    /// The FE's latest raw window field.
    pub fe_win: u32,
    /// FE segments seen.
    pub fe_seen: u32,
    /// Client ACKs whose SACK option `disc_ingress` made NOPs (the connection had a shift
    /// and the option had no block left in the FE's view, or could not be rewritten).
    pub sack_stripped: u32,
    /// Client ACKs whose SACK blocks `disc_ingress` translated to the FE's view.
    pub sack_translated: u32,
    /// Where the ACKs for DP also go ([`crate::bpf::NOTIFY_RING`], [`crate::bpf::NOTIFY_CLONE`]): set with an
    /// epoch, cleared by `disc_ingress` at the ACK of the payload's last byte.
    pub notify: u32,
    /// With [`crate::bpf::NOTIFY_CLONE`]: the FE's interface towards DP and its link address.
    pub dp_ifindex: u32,
    pub dp_src_mac: [u8; 6],
    pub _pad: [u8; 2],
    /// The client's latest raw window field (any ACK; `disc_ingress`).
    pub cl_win: u32,
    /// The payload DP starts when the FE's segment ending at `boundary` (the answer's head)
    /// goes out: `disc_egress` clones that segment to DP's link, addressed to
    /// [`crate::bpf::DP_START_MAC`], and clears this (0: none).
    pub start_id: u32,
    /// The ACK that carried `cl_win` (client view): the client's window ends at
    /// `cl_ack + (cl_win << cl_wscale)`.
    pub cl_ack: u32,
    /// The client's window scale (set at registration).
    pub cl_wscale: u32,
    /// With [`crate::bpf::NOTIFY_STACK`]: DP's own link address (the clone is for the BE's TCP stack).
    pub dp_dst_mac: [u8; 6],
}

/// struct epoch.
#[repr(C)]
struct RawEpoch {
    boundary: AtomicU32,
    off_lo: AtomicU32,
    off_hi: AtomicU32,
    last_ack: AtomicU32,
    last_win: AtomicU32,
    notify: AtomicU32,
    dp_ifindex: AtomicU32,
    /// dp_src_mac[6] and two bytes of padding, as two words in memory order.
    dp_src_mac: [AtomicU32; 2],
    start_id: AtomicU32,
    /// dp_dst_mac[6] and two bytes of padding, as two words in memory order.
    dp_dst_mac: [AtomicU32; 2],
}

/// struct conn_slot.
#[repr(C)]
struct RawSlot {
    ep: [RawEpoch; 2],
    cur: AtomicU32,
    acks: AtomicU32,
    dp_acks: AtomicU32,
    dropped: AtomicU32,
    shifted: AtomicU32,
    fe_nxt: AtomicU32,
    fe_ack: AtomicU32,
    fe_win: AtomicU32,
    fe_seen: AtomicU32,
    sack_stripped: AtomicU32,
    cl_win: AtomicU32,
    cl_ack: AtomicU32,
    cl_wscale: AtomicU32,
    sack_translated: AtomicU32,
}

/// The size of struct conn_slot (checked against the map's value size at load).
pub const SLOT_SIZE: usize = 152;
const _: () = assert!(std::mem::size_of::<RawSlot>() == SLOT_SIZE);
const _: () = assert!(std::mem::size_of::<RawEpoch>() == 48);

/// The map's values, mapped shared and writable.
pub struct SlotMap {
    base: NonNull<RawSlot>,
    bytes: usize,
    slots: u32,
}

// SAFETY: the mapping is plain shared memory reached only through atomics (see the
// module's invariants); it stays valid until `drop`, whichever thread owns the SlotMap.
unsafe impl Send for SlotMap {}

const R: Ordering = Ordering::Relaxed;

impl SlotMap {
    /// Maps `fd`: an array map with BPF_F_MMAPABLE of `slots` values of [`SLOT_SIZE`]
    /// bytes (the kernel lays them out back to back, each rounded up to 8 bytes: 152 is).
    pub fn map(fd: BorrowedFd<'_>, slots: u32) -> io::Result<SlotMap> {
        let page = 4096;
        let bytes = (SLOT_SIZE * slots as usize).div_ceil(page) * page;
        // SAFETY: a new shared mapping of the map's memory (the kernel checks the length
        // against the map and the flags against BPF_F_MMAPABLE); nothing else is mapped
        // at the address the kernel chooses.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SlotMap {
            base: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap gave 0"))?,
            bytes,
            slots,
        })
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    fn slot(&self, i: u32) -> &RawSlot {
        assert!(i < self.slots, "slot {i} of {}", self.slots);
        // SAFETY: i is within the mapping (checked above), which lives as long as self; a
        // RawSlot is all atomics, valid for any bytes and for concurrent writers.
        unsafe { &*self.base.as_ptr().add(i as usize) }
    }

    /// A connection's state: the epoch in force and what the programs recorded.
    pub fn read(&self, i: u32) -> ConnState {
        let s = self.slot(i);
        let e = &s.ep[(s.cur.load(Ordering::Acquire) & 1) as usize];
        let mac = |w: &[AtomicU32; 2]| -> [u8; 6] {
            let mut m = [0u8; 8];
            m[..4].copy_from_slice(&w[0].load(R).to_ne_bytes());
            m[4..].copy_from_slice(&w[1].load(R).to_ne_bytes());
            m[..6].try_into().expect("six bytes")
        };
        ConnState {
            boundary: e.boundary.load(R),
            off_lo: e.off_lo.load(R),
            off_hi: e.off_hi.load(R),
            last_ack: e.last_ack.load(R),
            last_win: e.last_win.load(R),
            acks: s.acks.load(R),
            dp_acks: s.dp_acks.load(R),
            dropped: s.dropped.load(R),
            shifted: s.shifted.load(R),
            fe_nxt: s.fe_nxt.load(R),
            fe_ack: s.fe_ack.load(R),
            fe_win: s.fe_win.load(R),
            fe_seen: s.fe_seen.load(R),
            sack_stripped: s.sack_stripped.load(R),
            sack_translated: s.sack_translated.load(R),
            notify: e.notify.load(R),
            dp_ifindex: e.dp_ifindex.load(R),
            dp_src_mac: mac(&e.dp_src_mac),
            dp_dst_mac: mac(&e.dp_dst_mac),
            _pad: [0; 2],
            cl_win: s.cl_win.load(R),
            start_id: e.start_id.load(R),
            cl_ack: s.cl_ack.load(R),
            cl_wscale: s.cl_wscale.load(R),
        }
    }

    /// Puts `st`'s epoch fields in force (the copy not in force, then `cur`).
    pub fn write_epoch(&self, i: u32, st: &ConnState) {
        let s = self.slot(i);
        let next = (s.cur.load(R) & 1) ^ 1;
        let e = &s.ep[next as usize];
        e.boundary.store(st.boundary, R);
        e.off_lo.store(st.off_lo, R);
        e.off_hi.store(st.off_hi, R);
        e.last_ack.store(st.last_ack, R);
        e.last_win.store(st.last_win, R);
        e.notify.store(st.notify, R);
        e.dp_ifindex.store(st.dp_ifindex, R);
        let put = |w: &[AtomicU32; 2], v: &[u8; 6]| {
            let mut m = [0u8; 8];
            m[..6].copy_from_slice(v);
            w[0].store(u32::from_ne_bytes(m[..4].try_into().expect("4")), R);
            w[1].store(u32::from_ne_bytes(m[4..].try_into().expect("4")), R);
        };
        put(&e.dp_src_mac, &st.dp_src_mac);
        put(&e.dp_dst_mac, &st.dp_dst_mac);
        e.start_id.store(st.start_id, R);
        s.cur.store(next, Ordering::Release);
    }

    /// Writes a whole state, the programs' fields too: only for a slot no program uses
    /// yet (registration) or in tests.
    pub fn write_all(&self, i: u32, st: &ConnState) {
        let s = self.slot(i);
        for (w, v) in [
            (&s.acks, st.acks),
            (&s.dp_acks, st.dp_acks),
            (&s.dropped, st.dropped),
            (&s.shifted, st.shifted),
            (&s.fe_nxt, st.fe_nxt),
            (&s.fe_ack, st.fe_ack),
            (&s.fe_win, st.fe_win),
            (&s.fe_seen, st.fe_seen),
            (&s.sack_stripped, st.sack_stripped),
            (&s.sack_translated, st.sack_translated),
            (&s.cl_win, st.cl_win),
            (&s.cl_ack, st.cl_ack),
            (&s.cl_wscale, st.cl_wscale),
        ] {
            w.store(v, R);
        }
        self.write_epoch(i, st);
    }
}

impl Drop for SlotMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of `bytes` bytes; no reference into it
        // outlives self (`slot` borrows self).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes) };
    }
}
