//! The FE's eBPF programs (bpf/disc.bpf.c, compiled by build.rs with clang) loaded with aya:
//! `disc_egress` shifts the FE's sequence numbers past the BE's bytes, `disc_ingress`
//! translates the client's ACKs back and records those for DP. A connection's state lives
//! in a slot of the array `disc_slots`, mapped into our memory ([`crate::slots`]); the
//! hash map `disc_index` gives the programs a [`ConnKey`]'s slot.
//!
//! Why C + clang + aya: the programs are C against the kernel's own uapi headers and
//! libbpf's `bpf_helpers.h`, compiled by Debian's clang (no nightly Rust, no bpf-linker);
//! aya loads the object in pure Rust (no libbpf C build in the workspace), does the map
//! relocations, and attaches TC programs (TCX links on this kernel). The one thing aya does
//! not offer, `BPF_PROG_TEST_RUN`, is a single `bpf(2)` call here ([`test_run`]).

use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use aya::maps::HashMap;
use aya::programs::{SchedClassifier, TcAttachType};
use aya::Ebpf;

/// The compiled object (empty when the crate was built without clang), 8-byte aligned as
/// the ELF parser requires.
pub const OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/disc.bpf.o"));

pub const EGRESS: &str = "disc_egress";
pub const INGRESS: &str = "disc_ingress";
pub const INDEX: &str = "disc_index";
pub const SLOTS: &str = "disc_slots";

/// TC verdicts.
pub const TC_ACT_OK: u32 = 0;
pub const TC_ACT_SHOT: u32 = 2;
pub const TC_ACT_REDIRECT: u32 = 7;

/// Whether the programs were compiled into this build.
pub fn available() -> bool {
    !OBJECT.is_empty()
}

/// A client connection as the FE sees it (all fields in network byte order in the map).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnKey {
    pub client_ip: u32,
    pub fe_ip: u32,
    pub client_port: u16,
    pub fe_port: u16,
}

impl ConnKey {
    pub fn new(client: Ipv4Addr, client_port: u16, fe: Ipv4Addr, fe_port: u16) -> ConnKey {
        ConnKey {
            client_ip: u32::from_ne_bytes(client.octets()),
            fe_ip: u32::from_ne_bytes(fe.octets()),
            client_port: client_port.to_be(),
            fe_port: fe_port.to_be(),
        }
    }
}

pub use crate::slots::ConnState;

impl ConnState {
    /// The client's window in bytes from client-view sequence number `from` to its right
    /// edge (0 when the edge is not past it, or no client ACK was seen yet).
    pub fn window_from(&self, from: u32) -> u32 {
        if self.cl_ack == 0 && self.cl_win == 0 {
            return 0;
        }
        let edge = self
            .cl_ack
            .wrapping_add(self.cl_win << (self.cl_wscale & 15));
        let room = edge.wrapping_sub(from) as i32;
        room.max(0) as u32
    }
}

/// The ACKs for DP also go to the ring [`ACKS`] (the FE's forwarder sends them on).
pub const NOTIFY_RING: u32 = 1;
/// The ACKs for DP are cloned, as the client sent them, to DP's link, addressed to
/// [`DP_ACK_MAC`] (DP's tap, [`crate::tap::AckTap`], takes them; DP's IP stack ignores
/// them). Needs DP on the FE's link (one hop).
pub const NOTIFY_CLONE: u32 = 2;
/// With [`NOTIFY_CLONE`]: only the ACK of the payload's last byte and duplicate ACKs are
/// cloned (DP sends the whole payload at once: the client's window holds it).
pub const NOTIFY_ENDS: u32 = 4;
/// With [`NOTIFY_CLONE`]: the clone goes to DP's own link address, for the BE's TCP stack
/// (DP sends from a socket continuing the FE's connection, `--dp-send repair`).
pub const NOTIFY_STACK: u32 = 8;
/// The link destination of the ACKs cloned to DP (locally administered, unicast).
pub const DP_ACK_MAC: [u8; 6] = [0x02, 0xd1, 0x5c, 0x00, 0xac, 0x4b];
/// The link destination of the FE's head segment cloned to DP as the start of a payload
/// ([`ConnState::start_id`]); the link source carries the payload id (4 bytes, network
/// order) and the client's window from the payload's start to its right edge, as a raw
/// (scaled) window field (2 bytes).
pub const DP_START_MAC: [u8; 6] = [0x02, 0xd1, 0x5c, 0x00, 0x5e, 0x0d];
/// As [`DP_START_MAC`], for a head segment `disc_egress` redirected to DP instead of
/// cloning it (a head of at most [`HEAD_RIDES_MAX`] bytes without FIN): DP sends the head's
/// bytes in front of the payload, and the client gets both in one segment.
pub const DP_HEAD_MAC: [u8; 6] = [0x02, 0xd1, 0x5c, 0x00, 0x4e, 0xad];
/// The longest head `disc_egress` redirects to DP (one segment, within the tap's snap).
pub const HEAD_RIDES_MAX: usize = 1400;

/// Where the FE clones the ACKs for DP: its interface towards DP and that interface's
/// link address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DpLink {
    pub ifindex: u32,
    pub src_mac: [u8; 6],
    /// Clone only the ends ([`NOTIFY_ENDS`]).
    pub ends_only: bool,
    /// Clone to DP's own link address, for the BE's TCP stack ([`NOTIFY_STACK`]), not to
    /// [`DP_ACK_MAC`] for DP's tap.
    pub to_stack: Option<[u8; 6]>,
}

/// A connection's new epoch ([`Hooks::set_epoch_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch {
    /// The FE stack's sequence number where the payload goes.
    pub boundary: u32,
    /// The shift of the FE's bytes before `boundary` and from it on.
    pub off_lo: u32,
    pub off_hi: u32,
    /// The ACKs for DP are cloned to DP's link if given, else put in the ring.
    pub to_dp: Option<DpLink>,
    /// With `to_dp`: the payload id (not 0) DP starts when the FE's segment ending at
    /// `boundary` goes out ([`ConnState::start_id`]); 0: DP is started by a `SEND` line.
    pub start: u32,
}

/// An ACK for DP as `disc_ingress` puts it in the ring [`ACKS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckEvent {
    pub key: ConnKey,
    /// The client's cumulative ACK (client view) and its raw window field.
    pub ack: u32,
    pub win: u32,
}

impl AckEvent {
    /// Decodes a ring record (struct ack_event: the key, then ack and win); None if short.
    pub fn parse(b: &[u8]) -> Option<AckEvent> {
        let u32_at = |i: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?))
        };
        let u16_at = |i: usize| -> Option<u16> {
            Some(u16::from_ne_bytes(b.get(i..i + 2)?.try_into().ok()?))
        };
        Some(AckEvent {
            key: ConnKey {
                client_ip: u32_at(0)?,
                fe_ip: u32_at(4)?,
                client_port: u16_at(8)?,
                fe_port: u16_at(10)?,
            },
            ack: u32_at(12)?,
            win: u32_at(16)?,
        })
    }
}

/// The ring of ACKs for DP (BPF_MAP_TYPE_RINGBUF).
pub const ACKS: &str = "disc_acks";

// SAFETY: a repr(C) struct of plain integers with no padding (4+4+2+2 bytes), so every
// bit pattern is valid and it matches struct conn_key byte for byte.
unsafe impl aya::Pod for ConnKey {}

/// The loaded programs and their maps.
pub struct Hooks {
    ebpf: Ebpf,
    slots: crate::slots::SlotMap,
    /// The slot of each registered key (as in `disc_index`) and the slots free, oldest
    /// freed first: a slot is used again only after every other free one, so a program
    /// that found it just before its key was removed is long done.
    index: std::collections::HashMap<ConnKey, u32>,
    free: std::collections::VecDeque<u32>,
    /// Closed connections whose entries stay in the map for [`LINGER`] (oldest first), and
    /// when each key was last retired (a key registered again meanwhile is not here).
    closing: std::collections::VecDeque<(Instant, ConnKey)>,
    closing_since: std::collections::HashMap<ConnKey, Instant>,
}

/// How long a closed connection keeps its map entry. The FE's stack goes on sending on a
/// closed connection (its FIN, retransmitted until acknowledged; the ACK of the client's
/// FIN; TIME_WAIT's answers): those segments must still be shifted past DP's bytes and the
/// client's ACKs translated, or the client sees sequence numbers from another space (found
/// by the capture check: the FE's FIN retransmitted unshifted once the entry was removed at
/// close, so its FIN was never acknowledged in its own space). 60 s is Linux's
/// TIME_WAIT and default `tcp_fin_timeout`.
pub const LINGER: Duration = Duration::from_secs(60);
/// At most this many closed connections linger (the map holds 65,536): beyond, the oldest go.
pub const MAX_CLOSING: usize = 32768;

impl Hooks {
    /// Loads both programs (the verifier runs here). Needs CAP_BPF.
    pub fn load() -> anyhow::Result<Hooks> {
        if !available() {
            bail!(
                "iolab-disc was built without its eBPF programs (install clang and \
                 libbpf-dev: scripts/install-deps, then rebuild)"
            );
        }
        let mut ebpf = Ebpf::load(OBJECT).context("loading disc.bpf.o")?;
        for name in [EGRESS, INGRESS] {
            let p: &mut SchedClassifier = ebpf
                .program_mut(name)
                .with_context(|| format!("no program {name} in the object"))?
                .try_into()?;
            p.load()
                .with_context(|| format!("the kernel refused {name}"))?;
        }
        let slots = {
            let m = match ebpf.map(SLOTS) {
                Some(aya::maps::Map::Array(m)) => m,
                _ => bail!("no array {SLOTS} in the object"),
            };
            let info = m.info()?;
            if info.value_size() as usize != crate::slots::SLOT_SIZE {
                bail!(
                    "{SLOTS}: values of {} bytes, expected {} (bpf/disc.bpf.c and src/slots.rs differ)",
                    info.value_size(),
                    crate::slots::SLOT_SIZE
                );
            }
            crate::slots::SlotMap::map(m.fd().as_fd(), info.max_entries())
                .with_context(|| format!("mapping {SLOTS}"))?
        };
        let free = (0..slots.slots()).collect();
        Ok(Hooks {
            ebpf,
            slots,
            index: Default::default(),
            free,
            closing: Default::default(),
            closing_since: Default::default(),
        })
    }

    /// A program's descriptor (for [`test_run`]).
    pub fn prog_fd(&self, name: &str) -> anyhow::Result<BorrowedFd<'_>> {
        let p: &SchedClassifier = self
            .ebpf
            .program(name)
            .with_context(|| format!("no program {name}"))?
            .try_into()?;
        Ok(p.fd()?.as_fd())
    }

    /// Attaches egress and ingress to `iface` in the calling thread's network namespace
    /// (TCX on kernels ≥ 6.6; the attachments end when `self` is dropped).
    pub fn attach(&mut self, iface: &str) -> anyhow::Result<()> {
        // Only needed for netlink attachment (older kernels); TCX needs no qdisc.
        let _ = aya::programs::tc::qdisc_add_clsact(iface);
        for (name, at) in [
            (EGRESS, TcAttachType::Egress),
            (INGRESS, TcAttachType::Ingress),
        ] {
            let p: &mut SchedClassifier = self
                .ebpf
                .program_mut(name)
                .with_context(|| format!("no program {name}"))?
                .try_into()?;
            p.attach(iface, at)
                .with_context(|| format!("attaching {name} to {iface}"))?;
        }
        Ok(())
    }

    fn index_map(&mut self) -> anyhow::Result<HashMap<&mut aya::maps::MapData, ConnKey, u32>> {
        Ok(HashMap::try_from(
            self.ebpf.map_mut(INDEX).context("no map disc_index")?,
        )?)
    }

    /// Writes a connection's whole state (registration: all zero), giving it a slot if it
    /// has none.
    pub fn set(&mut self, key: ConnKey, state: ConnState) -> anyhow::Result<()> {
        let slot = match self.index.get(&key) {
            Some(&i) => i,
            None => {
                let i = self
                    .free
                    .pop_front()
                    .context("all connection slots in use")?;
                self.slots.write_all(i, &state);
                if let Err(e) = self.index_map()?.insert(key, i, 0) {
                    self.free.push_front(i);
                    return Err(e.into());
                }
                self.index.insert(key, i);
                return Ok(());
            }
        };
        self.slots.write_all(slot, &state);
        Ok(())
    }

    /// Registers a new client connection (no epoch yet).
    pub fn register(&mut self, key: ConnKey) -> anyhow::Result<()> {
        self.register_with_wscale(key, 0)
    }

    /// Registers a new client connection whose client scales its window fields by
    /// `wscale` ([`ConnState::cl_wscale`]).
    pub fn register_with_wscale(&mut self, key: ConnKey, wscale: u8) -> anyhow::Result<()> {
        self.closing_since.remove(&key);
        self.reap(Instant::now());
        self.set(
            key,
            ConnState {
                cl_wscale: u32::from(wscale),
                ..ConnState::default()
            },
        )
    }

    /// The connection was closed by the FE: its entry goes after [`LINGER`].
    pub fn retire(&mut self, key: ConnKey) {
        let now = Instant::now();
        self.closing_since.insert(key, now);
        self.closing.push_back((now, key));
        self.reap(now);
    }

    /// Removes the entries of connections retired [`LINGER`] before `now` (and the oldest
    /// beyond [`MAX_CLOSING`]), unless registered again since.
    pub fn reap(&mut self, now: Instant) {
        while let Some(&(t, k)) = self.closing.front() {
            if now.saturating_duration_since(t) < LINGER && self.closing.len() <= MAX_CLOSING {
                break;
            }
            self.closing.pop_front();
            if self.closing_since.get(&k) == Some(&t) {
                self.closing_since.remove(&k);
                let _ = self.remove(&k);
            }
        }
    }

    /// Sets a registered connection's epoch, keeping what the programs recorded of the FE,
    /// and starts DP's ACK record at the new payload's first byte.
    ///
    /// The stall of pipelined requests in direct mode (issue 15, found with a capture):
    /// `last_ack` used to keep its old value, 0 on a connection's first payload. The ACK
    /// forwarder compares ACKs modulo 2^32, and when the payload's first sequence number was
    /// 2^31 or more away from 0 (half of all initial sequence numbers) a `last_ack` of 0
    /// read before the client's first ACK arrived looked like progress *past* every real
    /// ACK: the forwarder sent DP `ACK 0`, then ignored every real ACK as old, DP resent its
    /// first window every RTO while the client acked the same bytes, and after 30 s the FE
    /// gave up with the connection's bytes short (the client waited for its 60 s timeout).
    /// A race (the forwarder's first read before the first ACK) times a coin toss: about one
    /// run in three. Now `last_ack` starts at the payload's start, and the forwarder also
    /// takes only ACKs inside the payload ([`dp_progress`]).
    pub fn set_epoch(
        &mut self,
        key: ConnKey,
        boundary: u32,
        off_lo: u32,
        off_hi: u32,
    ) -> anyhow::Result<()> {
        let s = self.get(&key)?.context("connection not registered")?;
        self.set_epoch_of(
            key,
            s,
            Epoch {
                boundary,
                off_lo,
                off_hi,
                to_dp: None,
                start: 0,
            },
        )
    }

    /// [`Hooks::set_epoch`] from the connection's state `s` just read (one map access
    /// less), with where the ACKs for DP go and DP's start signal ([`Epoch`]).
    pub fn set_epoch_of(&mut self, key: ConnKey, mut s: ConnState, e: Epoch) -> anyhow::Result<()> {
        let Epoch {
            boundary,
            off_lo,
            off_hi,
            to_dp,
            start,
        } = e;
        s.boundary = boundary;
        s.off_lo = off_lo;
        s.off_hi = off_hi;
        s.last_ack = boundary.wrapping_add(off_lo);
        s.last_win = 0;
        s.start_id = if to_dp.is_some() { start } else { 0 };
        (s.notify, s.dp_ifindex, s.dp_src_mac, s.dp_dst_mac) = match (off_hi != off_lo, to_dp) {
            (false, _) => (0, 0, [0; 6], [0; 6]),
            (true, None) => (NOTIFY_RING, 0, [0; 6], [0; 6]),
            (true, Some(l)) => (
                NOTIFY_CLONE
                    | if l.ends_only { NOTIFY_ENDS } else { 0 }
                    | if l.to_stack.is_some() {
                        NOTIFY_STACK
                    } else {
                        0
                    },
                l.ifindex,
                l.src_mac,
                l.to_stack.unwrap_or_default(),
            ),
        };
        self.put_epoch(key, &s)
    }

    /// Puts the epoch fields of `s` in force for a registered connection.
    fn put_epoch(&mut self, key: ConnKey, s: &ConnState) -> anyhow::Result<()> {
        let i = *self.index.get(&key).context("connection not registered")?;
        self.slots.write_epoch(i, s);
        Ok(())
    }

    /// Ends a payload DP will not finish at the `acked` bytes the client has (state `s`
    /// just read): the FE's later bytes (its FIN) then follow them in the client's sequence
    /// space instead of lying beyond a hole the client would wait to fill forever.
    pub fn truncate_epoch(
        &mut self,
        key: ConnKey,
        mut s: ConnState,
        acked: u32,
    ) -> anyhow::Result<()> {
        s.off_hi = s.off_lo.wrapping_add(acked);
        s.notify = 0;
        s.start_id = 0;
        self.put_epoch(key, &s)
    }

    /// The ring of ACKs for DP ([`AckEvent`]s), to be read by one task; None after the
    /// first call.
    pub fn take_acks(&mut self) -> anyhow::Result<Option<aya::maps::RingBuf<aya::maps::MapData>>> {
        match self.ebpf.take_map(ACKS) {
            Some(m) => Ok(Some(aya::maps::RingBuf::try_from(m)?)),
            None => Ok(None),
        }
    }

    /// A connection's state, if registered.
    pub fn get(&mut self, key: &ConnKey) -> anyhow::Result<Option<ConnState>> {
        Ok(self.index.get(key).map(|&i| self.slots.read(i)))
    }

    /// Forgets a connection: the programs no longer find it, its slot is free.
    pub fn remove(&mut self, key: &ConnKey) -> anyhow::Result<()> {
        let Some(&i) = self.index.get(key) else {
            return Ok(());
        };
        match self.index_map()?.remove(key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
            // Still in the kernel's index: the slot stays taken.
            Err(e) => return Err(e.into()),
        }
        self.index.remove(key);
        self.free.push_back(i);
        Ok(())
    }
}

/// What the ACK forwarder tells DP, if anything: the client's latest ACK recorded by
/// `disc_ingress` (`state`), for a payload at client-view sequence `seq` of `size` bytes, of
/// which the forwarder last reported `reported` bytes acknowledged with window field
/// `reported_win`. Only an ACK inside the payload, `seq < ack <= seq + size`, counts
/// (anything else is stale: an earlier epoch's or the map's initial 0, see
/// [`Hooks::set_epoch`]); it is reported when it acknowledges more, or the same with another
/// window (a window update after a zero window). Returns (bytes acknowledged, raw window).
pub fn dp_progress(
    state: &ConnState,
    seq: u32,
    size: u32,
    reported: u32,
    reported_win: u32,
) -> Option<(u32, u32)> {
    let acked = state.last_ack.wrapping_sub(seq);
    if acked == 0 || acked > size {
        return None;
    }
    if acked > reported || (acked == reported && state.last_win != reported_win) {
        return Some((acked, state.last_win));
    }
    None
}

pub const LOSSY: &str = "disc_lossy";

/// The netem substitute for tests (this kernel has no sch_netem): `disc_lossy` attached at
/// TC ingress and egress drops each IPv4 TCP packet with a given probability, drawn in
/// the kernel with `bpf_get_prandom_u32`.
pub struct Lossy {
    ebpf: Ebpf,
}

impl Lossy {
    /// Loads the program with a drop probability of `percent` %.
    pub fn load(percent: f64) -> anyhow::Result<Lossy> {
        if !available() {
            bail!("iolab-disc was built without its eBPF programs");
        }
        if !(0.0..=100.0).contains(&percent) {
            bail!("loss must be 0..=100 %, not {percent}");
        }
        let mut ebpf = Ebpf::load(OBJECT).context("loading disc.bpf.o")?;
        let p: &mut SchedClassifier = ebpf
            .program_mut(LOSSY)
            .context("no program disc_lossy")?
            .try_into()?;
        p.load().context("the kernel refused disc_lossy")?;
        let threshold = ((percent / 100.0) * 4_294_967_295.0) as u32;
        let mut m: aya::maps::Array<_, u32> =
            aya::maps::Array::try_from(ebpf.map_mut("disc_loss").context("no map disc_loss")?)?;
        m.set(0, threshold, 0)?;
        Ok(Lossy { ebpf })
    }

    /// Attaches to both directions of `iface` (the calling thread's namespace).
    pub fn attach(&mut self, iface: &str) -> anyhow::Result<()> {
        let _ = aya::programs::tc::qdisc_add_clsact(iface);
        let p: &mut SchedClassifier = self
            .ebpf
            .program_mut(LOSSY)
            .context("no program disc_lossy")?
            .try_into()?;
        for at in [TcAttachType::Egress, TcAttachType::Ingress] {
            p.attach(iface, at)
                .with_context(|| format!("attaching disc_lossy to {iface}"))?;
        }
        Ok(())
    }

    /// (TCP packets seen, dropped).
    pub fn counts(&self) -> anyhow::Result<(u32, u32)> {
        let m: aya::maps::Array<_, u32> =
            aya::maps::Array::try_from(self.ebpf.map("disc_loss").context("no map disc_loss")?)?;
        Ok((m.get(&1, 0)?, m.get(&2, 0)?))
    }
}

/// The result of one `BPF_PROG_TEST_RUN`.
#[derive(Debug)]
pub struct TestRun {
    pub retval: u32,
    /// The packet as the program left it.
    pub data: Vec<u8>,
    /// Mean run time per repetition, in ns (the kernel's measure).
    pub duration_ns: u32,
}

/// `union bpf_attr`'s `test` member (include/uapi/linux/bpf.h), the fields up to
/// `batch_size`.
#[repr(C)]
#[derive(Default)]
struct TestAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// Runs program `fd` `repeat` times on a copy of `packet` (an Ethernet frame) in the
/// kernel, without any network: what the program returns and the packet it leaves.
pub fn test_run(fd: BorrowedFd<'_>, packet: &[u8], repeat: u32) -> anyhow::Result<TestRun> {
    let mut out = vec![0u8; packet.len() + 256];
    let mut attr = TestAttr {
        prog_fd: fd.as_raw_fd() as u32,
        data_size_in: packet.len() as u32,
        data_size_out: out.len() as u32,
        data_in: packet.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat,
        ..TestAttr::default()
    };
    // SAFETY: bpf(BPF_PROG_TEST_RUN) reads `packet` (data_size_in bytes) and writes at most
    // data_size_out bytes into `out`, both alive for the call; `attr` is a valid, zeroed
    // prefix of union bpf_attr whose size we pass.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut attr as *mut TestAttr,
            std::mem::size_of::<TestAttr>() as u32,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context("BPF_PROG_TEST_RUN");
    }
    out.truncate(attr.data_size_out as usize);
    Ok(TestRun {
        retval: attr.retval,
        data: out,
        duration_ns: attr.duration,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acked_at(last_ack: u32, last_win: u32) -> ConnState {
        ConnState {
            last_ack,
            last_win,
            ..ConnState::default()
        }
    }

    /// The pipelined stall's regression test: a payload starting at 2^31 or more, and the
    /// map's `last_ack` still 0 (no client ACK yet): nothing to forward. With the old modulo
    /// comparison this was taken as progress and every later real ACK looked old.
    #[test]
    fn a_stale_ack_is_never_progress() {
        let seq = 3_675_287_051u32;
        assert_eq!(dp_progress(&acked_at(0, 0), seq, 65536, 0, 0), None);
        // An earlier payload's last ACK (at or before this one's start).
        assert_eq!(dp_progress(&acked_at(seq, 500), seq, 65536, 0, 0), None);
        assert_eq!(
            dp_progress(&acked_at(seq - 10, 500), seq, 65536, 0, 0),
            None
        );
        // Past the payload's end: not this payload's (cannot be DP's progress).
        assert_eq!(
            dp_progress(&acked_at(seq + 65537, 9), seq, 65536, 0, 0),
            None
        );
    }

    #[test]
    fn acks_inside_the_payload_are_forwarded_once_and_window_updates_too() {
        let seq = u32::MAX - 100; // the payload wraps around 2^32
        let s = acked_at(seq.wrapping_add(1400), 300);
        assert_eq!(dp_progress(&s, seq, 65536, 0, 0), Some((1400, 300)));
        assert_eq!(dp_progress(&s, seq, 65536, 1400, 300), None, "already told");
        assert_eq!(
            dp_progress(&acked_at(seq.wrapping_add(1400), 0), seq, 65536, 1400, 300),
            Some((1400, 0)),
            "same ACK, window closed: DP must know"
        );
        let end = acked_at(seq.wrapping_add(65536), 1);
        assert_eq!(dp_progress(&end, seq, 65536, 1400, 300), Some((65536, 1)));
        // An older ACK arriving late is not a step back.
        assert_eq!(dp_progress(&s, seq, 65536, 65536, 1), None);
    }
}
