//! The ODB frames of one connection, without I/O: what the receive path does next with the
//! bytes it has read ([`FrameReader`], fed bytes and answering [`RecvAction`]s), how the send
//! path lays the application's bytes out as frames and what a short write leaves owed
//! ([`FrameWriter`], [`plan`]), and where `sendfile` puts its reference ([`aligned_head`],
//! [`whole_layout`], [`reference_len`]). The calls that read, write, fetch and count live in
//! `recv`, `send` and `sendfile`; this module decides, they perform.

use crate::pages::{round_down, round_up, PAGE};
use iolab_odb::proto::{self, Header, ProtoError, Ref};
use libc::{c_void, iovec};
use smallvec::SmallVec;

/// Size of a connection's stream buffer: two pages, so that an R frame filling a page (a
/// response's header and head bytes, see `odb_sendfile`), the V header behind it and the
/// tail frame (under a page) come in one read.
pub(crate) const RBUF: usize = 8192;

/// Most iovecs one call hands the kernel (IOV_MAX): a longer list goes out over several
/// calls.
pub(crate) const IOV_MAX: usize = 1024;

/// Largest reference one `sendfile` call makes (a larger file goes as several).
pub(crate) const MAX_V: usize = 4 << 20;

// The per-call lists of the send and receive paths live on the stack up to 8 entries (nginx
// passes one to three buffers): a heap list per call was four to eight allocations per send,
// each through the `malloc` this library interposes.
pub(crate) type Iovs = SmallVec<[iovec; 8]>;
pub(crate) type Segs = SmallVec<[Seg; 8]>;

// ---------------------------------------------------------------- receiving

/// The frame the next application bytes of a connection belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InFrame {
    None,
    /// Data bytes of an R frame still to come.
    Real(usize),
    /// The reference being placed and how many of its bytes are still to place.
    Virt(Ref, usize),
}

/// What the receive path does next; the caller performs it and reports back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecvAction {
    /// Copy the first `len` bytes of [`FrameReader::buffered`] to the application, then
    /// [`FrameReader::copied`]. `frame`: they are an R frame's data (else a plain peer's).
    Copy { len: usize, frame: bool },
    /// Place `len` bytes, those of `part`, in the application's memory, then
    /// [`FrameReader::placed`] (or [`FrameReader::fail`] when they cannot be had).
    Place { part: Ref, len: usize },
    /// Read up to `len` bytes from the kernel straight into the application's memory, then
    /// [`FrameReader::read_direct`]; a short read ends the call (the socket is drained).
    ReadDirect { len: usize, frame: bool },
    /// Read from the kernel into [`FrameReader::space`], then [`FrameReader::filled`].
    Fill,
    /// End the call with the bytes it produced: the kernel queue was drained by the last
    /// read and the buffer holds nothing the application can take.
    Return,
    /// The peer turned out not to speak ODB (plain bytes from now on): count it, ask again.
    Unframed,
    /// A malformed frame header: the connection is broken.
    ProtoError,
}

/// What a read into the stream buffer brought.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Filled {
    Data,
    /// The peer closed at a frame boundary.
    Eof,
    /// The peer closed inside a frame or its header: the connection is broken.
    Broken,
}

/// The receiving half of a connection's frame stream.
///
/// Invariant (edge-triggered epoll): a call returns less than asked only when the kernel
/// queue is drained and the stream buffer holds no byte the application could read (at most
/// part of a frame header, whose rest will raise a new edge). Bytes are read from the kernel
/// into the stream buffer: one read brings the headers and the small frames behind them, as
/// nginx's own single `recv` does (a peek to see the header, then a read, was two calls per
/// frame). The data of a frame longer than the buffer goes straight into the application's
/// memory.
pub(crate) struct FrameReader {
    /// The peer turned out not to speak ODB: plain bytes from now on.
    raw: bool,
    /// A protocol error was seen: reads fail.
    broken: bool,
    framed_seen: bool,
    frame: InFrame,
    /// Bytes read from the kernel and not yet consumed: `buf[pos..len]` (headers, short
    /// frames, and the first bytes of a header whose rest has not arrived — taken out of the
    /// kernel: left there, they would pin a socket buffer whose size the kernel charges to
    /// the receive window (a 3-byte remainder of a 64 KiB segment holds ~120 KiB), and with
    /// the window closed the rest of the header never comes: the 16 MiB stall).
    buf: Box<[u8; RBUF]>,
    pos: usize,
    len: usize,
    /// The last read into the stream buffer came back short: the kernel queue was drained
    /// then, and anything that arrived since has raised an epoll edge of its own (it joined
    /// the ready list when it arrived; nginx, single-threaded, is inside this call and cannot
    /// have collected it). So once the buffer is used up, a short return needs no further
    /// read — which would come back EAGAIN. Per call: see [`FrameReader::start_call`].
    seen_all: bool,
}

impl FrameReader {
    pub(crate) fn new() -> FrameReader {
        FrameReader {
            raw: false,
            broken: false,
            framed_seen: false,
            frame: InFrame::None,
            buf: Box::new([0; RBUF]),
            pos: 0,
            len: 0,
            seen_all: false,
        }
    }

    pub(crate) fn raw(&self) -> bool {
        self.raw
    }

    pub(crate) fn broken(&self) -> bool {
        self.broken
    }

    pub(crate) fn frame(&self) -> InFrame {
        self.frame
    }

    /// A new receive call begins (nothing read in it yet).
    pub(crate) fn start_call(&mut self) {
        self.seen_all = false;
    }

    /// The next step of a call that has produced `produced` bytes and wants `want` more
    /// (`want > 0`).
    pub(crate) fn next(&mut self, want: usize, produced: usize) -> RecvAction {
        loop {
            let buffered = self.len - self.pos;
            if self.raw {
                return if buffered > 0 {
                    RecvAction::Copy {
                        len: buffered.min(want),
                        frame: false,
                    }
                } else {
                    RecvAction::ReadDirect {
                        len: want,
                        frame: false,
                    }
                };
            }
            return match self.frame {
                InFrame::Virt(r, left) => {
                    let len = left.min(want);
                    RecvAction::Place {
                        part: r.slice((r.len as usize - left) as u64, len as u32),
                        len,
                    }
                }
                InFrame::Real(left) if buffered > 0 => RecvAction::Copy {
                    len: left.min(buffered).min(want),
                    frame: true,
                },
                // A frame's data longer than the buffer, or filling the application's: read
                // it straight into the application's memory.
                InFrame::Real(left) if left >= RBUF || left >= want => RecvAction::ReadDirect {
                    len: left.min(want),
                    frame: true,
                },
                InFrame::None if buffered > 0 => {
                    match proto::parse_header(&self.buf[self.pos..self.len]) {
                        Ok(Some((h, hl))) => {
                            self.framed_seen = true;
                            self.pos += hl;
                            self.frame = match h {
                                Header::Real(l) => InFrame::Real(l as usize),
                                Header::Virtual(r) => InFrame::Virt(r, r.len as usize),
                            };
                            continue;
                        }
                        Ok(None) => {
                            // part of a header: keep it at the front and read the rest
                            self.buf.copy_within(self.pos..self.len, 0);
                            (self.len, self.pos) = (buffered, 0);
                            self.read_or_return(produced)
                        }
                        Err(ProtoError::NotFramed) if !self.framed_seen => {
                            // a peer that does not speak ODB: these bytes and all later ones
                            // are the application's as they are
                            self.raw = true;
                            RecvAction::Unframed
                        }
                        Err(_) => {
                            self.broken = true;
                            RecvAction::ProtoError
                        }
                    }
                }
                // Nothing buffered, at a frame boundary or inside a short R frame: read.
                InFrame::None | InFrame::Real(_) => {
                    let action = self.read_or_return(produced);
                    if action == RecvAction::Fill {
                        (self.len, self.pos) = (0, 0);
                    }
                    action
                }
            };
        }
    }

    fn read_or_return(&self, produced: usize) -> RecvAction {
        if self.seen_all && produced > 0 {
            RecvAction::Return
        } else {
            RecvAction::Fill
        }
    }

    /// The bytes read and not yet consumed.
    pub(crate) fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..self.len]
    }

    /// The free end of the stream buffer, for [`RecvAction::Fill`].
    pub(crate) fn space(&mut self) -> &mut [u8] {
        &mut self.buf[self.len..]
    }

    /// `n` bytes were read into [`FrameReader::space`].
    pub(crate) fn filled(&mut self, n: usize) -> Filled {
        let free = RBUF - self.len;
        if n == 0 {
            // what is buffered now can only be part of a header
            if self.len > self.pos || matches!(self.frame, InFrame::Real(_)) {
                self.broken = true;
                return Filled::Broken;
            }
            return Filled::Eof;
        }
        self.len += n;
        self.seen_all = n < free;
        Filled::Data
    }

    /// The application took the first `len` buffered bytes ([`RecvAction::Copy`]).
    pub(crate) fn copied(&mut self, len: usize, frame: bool) {
        self.pos += len;
        if frame {
            self.took_real(len);
        }
    }

    /// `n` bytes of an R frame's data were read straight into the application's memory.
    pub(crate) fn read_direct(&mut self, n: usize) {
        self.took_real(n);
    }

    fn took_real(&mut self, n: usize) {
        if let InFrame::Real(left) = self.frame {
            self.frame = if left == n {
                InFrame::None
            } else {
                InFrame::Real(left - n)
            };
        }
    }

    /// `len` bytes of the reference were placed ([`RecvAction::Place`]).
    pub(crate) fn placed(&mut self, len: usize) {
        if let InFrame::Virt(r, left) = self.frame {
            self.frame = if left == len {
                InFrame::None
            } else {
                InFrame::Virt(r, left - len)
            };
        }
    }

    /// The connection failed (a reference that cannot be had): reads fail from now on.
    pub(crate) fn fail(&mut self) {
        self.broken = true;
    }

    /// What FIONREAD reports for a connection whose kernel queue holds `kernel` bytes.
    /// nginx (1.17.5+, `ngx_readv_chain` and `ngx_unix_recv`) asks FIONREAD after a read
    /// that filled its buffer, then subtracts every read from that count; when the count
    /// goes negative it concludes that bytes arrived after the FIONREAD, clears `ready` and
    /// waits for the epoll edge of those bytes. That reasoning holds for plain bytes, not
    /// for references: the 47-byte V header of a 2 MiB reference that arrives after the
    /// FIONREAD is taken out of the kernel by the library, and nginx then reads megabytes
    /// past its count, clears `ready`, and waits — with the rest of that reference held
    /// here and nothing in the kernel to raise an edge (the 16 MiB stall; see the test
    /// `a_reference_arriving_after_fionread_is_still_read`).
    ///
    /// So the answer is an over-count whenever the application can read anything: nginx
    /// then reads until a read comes back short, and the library returns short only when
    /// the kernel queue is drained (the invariant above), so the next byte that arrives
    /// raises an edge. Zero only when the library holds nothing and the kernel queue is
    /// empty. Also cheaper than walking the queued frame headers on every call.
    pub(crate) fn readable(&self, kernel: usize) -> usize {
        let buffered = self.buffered();
        if self.raw {
            return kernel + buffered.len();
        }
        // Readable: a reference being placed, R data buffered, a complete header buffered,
        // or anything in the kernel. Part of a header alone is not.
        let readable = match self.frame {
            InFrame::Virt(_, left) => left > 0,
            InFrame::Real(_) => !buffered.is_empty(),
            InFrame::None => matches!(proto::parse_header(buffered), Ok(Some(_)) | Err(_)),
        };
        if readable || kernel > 0 {
            i32::MAX as usize
        } else {
            0
        }
    }
}

// ---------------------------------------------------------------- sending

/// What the application's next bytes on a connection owe to a frame already (partly) sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OutFrame {
    None,
    /// App bytes still to send raw for the R frame whose header went out.
    Real(usize),
    /// App bytes covered by a V frame already (partly) sent: the app will offer them again.
    Virt(usize),
}

/// A piece of application memory to send: bytes we have (at an address, of a length) or
/// bytes still at an agent.
pub(crate) enum Seg {
    Real(usize, usize),
    Virt(Ref),
}

/// One frame of a send: its header, the application bytes it stands for, and (R frames)
/// the segments that carry those bytes.
pub(crate) struct Frame {
    hdr: [u8; proto::V_HDR],
    hdr_len: usize,
    app_len: usize,
    real: bool,
    first_seg: usize,
    nsegs: usize,
}

pub(crate) type Frames = SmallVec<[Frame; 4]>;

/// Groups the segments into frames: consecutive Real segments form one R frame (up to the
/// largest frame), each reference a V frame.
pub(crate) fn plan(segs: &[Seg]) -> Frames {
    let mut frames = Frames::new();
    for (i, s) in segs.iter().enumerate() {
        match s {
            Seg::Real(_, l) => match frames.last_mut() {
                Some(f) if f.real && f.app_len + l <= proto::MAX_FRAME as usize => {
                    f.app_len += l;
                    f.nsegs += 1;
                }
                _ => frames.push(Frame {
                    hdr: [0; proto::V_HDR],
                    hdr_len: proto::R_HDR,
                    app_len: *l,
                    real: true,
                    first_seg: i,
                    nsegs: 1,
                }),
            },
            Seg::Virt(r) => frames.push(Frame {
                hdr: r.encode(),
                hdr_len: proto::V_HDR,
                app_len: r.len as usize,
                real: false,
                first_seg: i,
                nsegs: 1,
            }),
        }
    }
    for f in frames.iter_mut().filter(|f| f.real) {
        f.hdr[..proto::R_HDR].copy_from_slice(&proto::encode_r(f.app_len as u32));
    }
    frames
}

/// The iovecs of the first frames of `frames` (headers, and the R frames' data), as many as
/// fit in [`IOV_MAX`]: fewer frames now, a short write, the rest next call. Returns how many
/// frames they hold. The header iovecs point into `frames`.
pub(crate) fn gather(frames: &[Frame], segs: &[Seg], vecs: &mut Iovs) -> usize {
    let mut nframes = 0;
    for f in frames {
        let need = 1 + if f.real { f.nsegs } else { 0 };
        if vecs.len() + need > IOV_MAX {
            break;
        }
        vecs.push(iovec {
            iov_base: f.hdr.as_ptr() as *mut c_void,
            iov_len: f.hdr_len,
        });
        if f.real {
            for s in &segs[f.first_seg..f.first_seg + f.nsegs] {
                if let Seg::Real(p, l) = *s {
                    vecs.push(iovec {
                        iov_base: p as *mut c_void,
                        iov_len: l,
                    });
                }
            }
        }
        nframes += 1;
    }
    nframes
}

/// What one send did: application bytes it accounts for, and the counters' share.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Sent {
    pub(crate) app: usize,
    pub(crate) r_bytes: usize,
    pub(crate) v_bytes: usize,
    pub(crate) v_frames: usize,
    /// A frame header went out in part (its rest is pending).
    pub(crate) header_cut: bool,
}

/// Where the application's call starts relative to the frame the last call left unfinished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resume {
    /// Nothing owed: frame the call's bytes.
    Fresh,
    /// The first `len` bytes are an R frame's data whose header went out: send them raw,
    /// then [`FrameWriter::sent_real`].
    Real(usize),
    /// The first `len` bytes are covered by a V frame already sent (done: nothing to send).
    Covered(usize),
}

/// The sending half of a connection's frame stream: the rest of a header a short write cut,
/// and what the application's next bytes owe to the frame under way.
pub(crate) struct FrameWriter {
    pending: Vec<u8>,
    frame: OutFrame,
}

impl FrameWriter {
    pub(crate) fn new() -> FrameWriter {
        FrameWriter {
            pending: Vec::new(),
            frame: OutFrame::None,
        }
    }

    pub(crate) fn frame(&self) -> OutFrame {
        self.frame
    }

    /// The rest of a header, to go out before anything else.
    pub(crate) fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// `n` bytes of [`FrameWriter::pending`] went out.
    pub(crate) fn pending_sent(&mut self, n: usize) {
        self.pending.drain(..n);
    }

    /// A call offering `total` bytes begins (nothing pending).
    pub(crate) fn resume(&mut self, total: usize) -> Resume {
        match self.frame {
            OutFrame::None => Resume::Fresh,
            OutFrame::Real(left) => Resume::Real(left.min(total)),
            OutFrame::Virt(left) => {
                let k = left.min(total);
                self.frame = if k == left {
                    OutFrame::None
                } else {
                    OutFrame::Virt(left - k)
                };
                Resume::Covered(k)
            }
        }
    }

    /// `n` data bytes of the R frame under way went out.
    pub(crate) fn sent_real(&mut self, n: usize) {
        if let OutFrame::Real(left) = self.frame {
            self.frame = if n == left {
                OutFrame::None
            } else {
                OutFrame::Real(left - n)
            };
        }
    }

    /// A frame standing for `owed` went out up to byte `sent` of its header `hdr`: the rest
    /// of the header is pending.
    pub(crate) fn header_cut(&mut self, hdr: &[u8], sent: usize, owed: OutFrame) {
        self.pending.extend_from_slice(&hdr[sent..]);
        self.frame = owed;
    }

    /// An R frame of `len` data bytes whose header is out: its data follows.
    pub(crate) fn real_frame_started(&mut self, len: usize) {
        self.frame = OutFrame::Real(len);
    }

    /// `n` bytes of the first frames of `frames` went out (nothing owed before): what they
    /// account for; a frame cut short is owed (its data by the application's next offer,
    /// the rest of its header pending).
    pub(crate) fn account(&mut self, frames: &[Frame], n: usize) -> Sent {
        let mut s = Sent::default();
        let mut left = n;
        for f in frames {
            let wire = f.hdr_len + if f.real { f.app_len } else { 0 };
            if left >= wire {
                s.app += f.app_len;
                left -= wire;
                if f.real {
                    s.r_bytes += f.app_len;
                } else {
                    s.v_bytes += f.app_len;
                    s.v_frames += 1;
                }
                continue;
            }
            if left >= f.hdr_len {
                // R header out, part of its data: the app offers the rest again
                let sent = left - f.hdr_len;
                s.app += sent;
                s.r_bytes += sent;
                self.frame = OutFrame::Real(f.app_len - sent);
            } else if left > 0 {
                let owed = if f.real {
                    OutFrame::Real(f.app_len)
                } else {
                    s.v_bytes += f.app_len;
                    s.v_frames += 1;
                    OutFrame::Virt(f.app_len)
                };
                self.header_cut(&f.hdr[..f.hdr_len], left, owed);
                s.header_cut = true;
            }
            break;
        }
        s
    }

    /// `n` bytes of one send of [R `rh` + `head` bytes] [V `vh` for `vlen`] [R `th` + `tail`
    /// bytes] went out (`head`, `tail` 0: no such frame): what they account for. The first
    /// frame not wholly out is owed, even with none of it sent; the ones after it are not.
    pub(crate) fn account_whole(
        &mut self,
        (rh, head): (&[u8], usize),
        (vh, vlen): (&[u8], usize),
        (th, tail): (&[u8], usize),
        n: usize,
    ) -> Sent {
        let mut s = Sent::default();
        let mut left = n;
        if head > 0 && !self.account_real(rh, head, &mut left, &mut s) {
            return s;
        }
        if left < vh.len() {
            self.header_cut(vh, left, OutFrame::Virt(vlen));
            return s;
        }
        left -= vh.len();
        s.app += vlen;
        s.v_bytes += vlen;
        s.v_frames += 1;
        self.frame = OutFrame::None;
        if tail > 0 {
            self.account_real(th, tail, &mut left, &mut s);
        }
        s
    }

    /// The part of `left` wire bytes that an R frame (`hdr` and `data` bytes) took; true
    /// when all of it went out.
    fn account_real(&mut self, hdr: &[u8], data: usize, left: &mut usize, s: &mut Sent) -> bool {
        if *left < hdr.len() {
            self.header_cut(hdr, *left, OutFrame::Real(data));
            *left = 0;
            return false;
        }
        *left -= hdr.len();
        let d = (*left).min(data);
        *left -= d;
        s.app += d;
        s.r_bytes += d;
        self.frame = if d == data {
            OutFrame::None
        } else {
            OutFrame::Real(data - d)
        };
        d == data
    }
}

// ---------------------------------------------------------------- sendfile's layout

/// Real bytes to send before a reference so that it lands on whole pages at the receiver
/// (0: none). The receiver reads a response into a fresh page-aligned buffer (nginx's header
/// buffer, then its proxy buffers: see `alloc`) starting with the first byte sent since the
/// request came in (`since_in` bytes ago): real bytes up to the next page boundary of that
/// stream, then a reference of whole pages, then the tail (less than a page) as real bytes,
/// and the receiver (the IS) fetches nothing — it moves the page holding the response
/// header as real bytes instead of fetching its body part from the agent (a blocking round
/// trip). Costs nothing when the receiver's buffers are laid out otherwise: it then fetches
/// partial pages as before. Only with an agent to store into and `count` long enough for a
/// reference of at least `threshold` behind the padding.
pub(crate) fn aligned_head(since_in: usize, count: usize, threshold: usize, store: bool) -> usize {
    let mis = since_in % PAGE;
    if mis != 0 && store && count >= PAGE - mis + threshold {
        PAGE - mis
    } else {
        0
    }
}

/// The one-send layout of `count` bytes behind `head` real ones: (reference length, tail
/// length), or None when it does not apply (misaligned and too short to pad, or a
/// reference shorter than `threshold` or longer than [`MAX_V`]).
pub(crate) fn whole_layout(
    since_in: usize,
    count: usize,
    head: usize,
    threshold: usize,
) -> Option<(usize, usize)> {
    if since_in % PAGE != 0 && head == 0 {
        return None; // misaligned and too short to pad: the general path decides
    }
    let vlen = round_down(count - head);
    if vlen < threshold || vlen > MAX_V {
        return None;
    }
    Some((vlen, count - head - vlen))
}

/// The general path's reference: its length for `rest` bytes once `sent` went out of a call
/// whose stream started `since_in` bytes after the request (`head`: the padding sent), or
/// None when it would not pay. A reference pays only for the whole pages it leaves at the
/// receiver: the partial pages at its ends are fetched at once. Too short to pad to a page
/// boundary, a 4 KiB body behind a 257-byte header spans two partial pages and nothing
/// else: sent by reference, it cost the IS two fetches and bypassed nothing.
pub(crate) fn reference_len(
    since_in: usize,
    sent: usize,
    rest: usize,
    head: usize,
    threshold: usize,
) -> Option<usize> {
    let vlen = if since_in % PAGE == 0 || head > 0 {
        round_down(rest.min(MAX_V))
    } else {
        rest.min(MAX_V)
    };
    let whole = whole_pages_at((since_in + sent) % PAGE, vlen);
    (vlen >= threshold && whole >= threshold).then_some(vlen)
}

/// Bytes of whole pages in a range of `len` bytes starting `at` bytes into a page.
fn whole_pages_at(at: usize, len: usize) -> usize {
    round_down(at + len).saturating_sub(round_up(at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recv_peer::{End, Peer};
    use std::net::{Ipv4Addr, SocketAddrV4};

    fn reference(len: u32, offset: u64) -> Ref {
        Ref {
            len,
            agent_id: 9,
            agent: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 7000),
            offset,
            buf_id: 0xfeed,
        }
    }

    fn r_frame(data: &[u8]) -> Vec<u8> {
        let mut v = proto::encode_r(data.len() as u32).to_vec();
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn r_frames_cut_anywhere_arrive_exactly() {
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut stream = Vec::new();
        let mut at = 0;
        for len in [1, 3, 4096, 5, 9000, 6895] {
            stream.extend(r_frame(&data[at..at + len]));
            at += len;
        }
        assert_eq!(at, data.len());
        for cut in [1, 2, 4, 5, 6, 47, 1000, 8192, 30_000] {
            let chunks: Vec<&[u8]> = stream.chunks(cut).collect();
            let mut peer = Peer::new(&chunks);
            let mut rx = FrameReader::new();
            for want in [1, 7, 100, 4096, 65536].into_iter().cycle() {
                match peer.recv(&mut rx, want) {
                    End::Bytes(_) => {}
                    End::WouldBlock => break,
                    e => panic!("cut {cut}: {e:?}"),
                }
            }
            assert!(peer.app == data, "cut {cut}: bytes differ");
            assert_eq!(rx.frame(), InFrame::None);
        }
    }

    /// A short return comes only with the kernel queue drained: after a read that filled
    /// less than the buffer, used-up bytes end the call instead of another read.
    #[test]
    fn a_call_returns_short_only_when_the_queue_was_drained() {
        let stream = [r_frame(b"abc"), r_frame(b"defg")].concat();
        // the second chunk arrives after the first read (and raises an edge of its own)
        let later = r_frame(b"later");
        let mut peer = Peer::new(&[&stream, &later]);
        let mut rx = FrameReader::new();
        assert_eq!(peer.recv(&mut rx, 100), End::Bytes(7));
        assert_eq!(peer.kernel.len(), 1, "no read after the short one");
        assert_eq!(peer.app, b"abcdefg");
        assert_eq!(peer.recv(&mut rx, 100), End::Bytes(5));
        // a header cut in two: the first part is kept, the call reads again for the rest
        let stream = r_frame(b"hello");
        let mut peer = Peer::new(&[&stream[..2], &stream[2..]]);
        let mut rx = FrameReader::new();
        assert_eq!(peer.recv(&mut rx, 100), End::Bytes(5));
        assert_eq!(peer.app, b"hello");
    }

    #[test]
    fn a_reference_is_placed_in_pieces_of_the_callers_size() {
        let r = reference(10_000, 4096);
        let stream = [r_frame(b"head"), r.encode().to_vec(), r_frame(b"tail")].concat();
        let mut peer = Peer::new(&[&stream]);
        let mut rx = FrameReader::new();
        assert_eq!(peer.recv(&mut rx, 4), End::Bytes(4));
        assert_eq!(peer.recv(&mut rx, 6000), End::Bytes(6000));
        assert_eq!(rx.frame(), InFrame::Virt(r, 4000));
        assert_eq!(peer.recv(&mut rx, 65536), End::Bytes(4004));
        assert_eq!(peer.placed, [r.slice(0, 6000), r.slice(6000, 4000)]);
        assert_eq!(&peer.app[..4], b"head");
        assert_eq!(&peer.app[peer.app.len() - 4..], b"tail");
    }

    #[test]
    fn a_long_r_frame_goes_straight_to_the_application() {
        let data = vec![5u8; RBUF * 3];
        let stream = r_frame(&data);
        let mut rx = FrameReader::new();
        let mut peer = Peer::new(&[&stream]);
        // the header and the start of the data come through the buffer ...
        assert_eq!(peer.recv(&mut rx, RBUF * 3), End::Bytes(RBUF * 3));
        assert!(peer.app == data);
        // ... and an R frame longer than the buffer, once its header is consumed, is read
        // in place (ReadDirect), not through the buffer
        let mut rx = FrameReader::new();
        let mut peer = Peer::new(&[&stream[..proto::R_HDR], &stream[proto::R_HDR..]]);
        assert_eq!(rx.next(10, 0), RecvAction::Fill);
        let head = peer.read(RBUF).unwrap();
        rx.space()[..head.len()].copy_from_slice(&head);
        assert_eq!(rx.filled(head.len()), Filled::Data);
        assert_eq!(
            rx.next(RBUF * 3, 0),
            RecvAction::ReadDirect {
                len: RBUF * 3,
                frame: true
            }
        );
    }

    #[test]
    fn a_peer_that_does_not_frame_is_plain_from_its_first_byte() {
        let mut peer = Peer::new(&[b"GET / HTTP/1.1\r\n", b"\r\n"]);
        let mut rx = FrameReader::new();
        assert_eq!(peer.recv(&mut rx, 5), End::Bytes(5));
        assert!(rx.raw());
        // the rest of the buffer, then a read straight into the application's memory
        assert_eq!(peer.recv(&mut rx, 100), End::Bytes(13));
        assert_eq!(peer.recv(&mut rx, 100), End::WouldBlock);
        assert_eq!(peer.app, b"GET / HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn bad_frames_break_the_connection_after_the_good_bytes() {
        let zero_len = [0xD1, 0, 0, 0, 0, 1, 2];
        let mut corrupt = reference(100, 0).encode();
        corrupt[20] ^= 1;
        for bad in [&zero_len[..], &corrupt[..], b"plain after frames"] {
            let stream = [r_frame(b"good"), bad.to_vec()].concat();
            let mut peer = Peer::new(&[&stream]);
            let mut rx = FrameReader::new();
            assert_eq!(peer.recv(&mut rx, 100), End::Bytes(4), "{bad:?}");
            assert_eq!(peer.recv(&mut rx, 100), End::Reset, "{bad:?}");
            assert!(rx.broken());
            assert_eq!(peer.recv(&mut rx, 100), End::Reset, "stays broken");
            assert_eq!(peer.app, b"good");
        }
    }

    #[test]
    fn the_peer_closing_inside_a_frame_is_a_reset_and_between_frames_an_eof() {
        let stream = r_frame(b"abcdef");
        for (cut, end) in [(2, End::Reset), (8, End::Reset), (stream.len(), End::Eof)] {
            let mut peer = Peer::new(&[&stream[..cut]]);
            peer.kernel.push_back(None);
            let mut rx = FrameReader::new();
            let mut ends = Vec::new();
            for _ in 0..3 {
                ends.push(peer.recv(&mut rx, 100));
            }
            assert_eq!(
                ends.iter().find(|e| !matches!(e, End::Bytes(_))),
                Some(&end),
                "{cut}"
            );
        }
    }

    #[test]
    fn fionread_over_counts_whenever_anything_is_readable() {
        let mut rx = FrameReader::new();
        assert_eq!(rx.readable(0), 0);
        assert_eq!(rx.readable(1), i32::MAX as usize);
        // part of a header alone is not readable
        let stream = r_frame(b"xy");
        let mut peer = Peer::new(&[&stream[..3]]);
        assert_eq!(peer.recv(&mut rx, 10), End::WouldBlock);
        assert_eq!(rx.readable(0), 0);
        let mut peer = Peer::new(&[&stream[3..]]);
        assert_eq!(rx.next(10, 0), RecvAction::Fill);
        let b = peer.read(RBUF).unwrap();
        let free = rx.space();
        free[..b.len()].copy_from_slice(&b);
        rx.filled(b.len());
        assert_eq!(rx.readable(0), i32::MAX as usize, "a whole header buffered");
        let mut raw = FrameReader::new();
        Peer::new(&[b"plain"]).recv(&mut raw, 2);
        assert_eq!(raw.readable(10), 13, "a plain peer: the exact count");
    }

    fn segs_of(list: &[(usize, usize)], refs: &[Ref]) -> Segs {
        let mut s: Segs = list.iter().map(|&(p, l)| Seg::Real(p, l)).collect();
        s.extend(refs.iter().map(|&r| Seg::Virt(r)));
        s
    }

    #[test]
    fn real_segments_share_an_r_frame_and_each_reference_is_a_v_frame() {
        let r = reference(8192, 0);
        let mut segs = segs_of(&[(0x1000, 10), (0x2000, 20)], &[r]);
        segs.push(Seg::Real(0x3000, 5));
        let frames = plan(&segs);
        assert_eq!(frames.len(), 3);
        assert_eq!(
            (frames[0].real, frames[0].app_len, frames[0].nsegs),
            (true, 30, 2)
        );
        assert_eq!(
            proto::parse_header(&frames[0].hdr[..frames[0].hdr_len]),
            Ok(Some((Header::Real(30), proto::R_HDR)))
        );
        assert_eq!(
            proto::parse_header(&frames[1].hdr),
            Ok(Some((Header::Virtual(r), proto::V_HDR)))
        );
        let mut vecs = Iovs::new();
        assert_eq!(gather(&frames, &segs, &mut vecs), 3);
        let lens: Vec<usize> = vecs.iter().map(|v| v.iov_len).collect();
        assert_eq!(lens, [proto::R_HDR, 10, 20, proto::V_HDR, proto::R_HDR, 5]);
        assert_eq!(vecs[1].iov_base as usize, 0x1000);
    }

    #[test]
    fn gathering_stops_at_iov_max() {
        let segs: Segs = (0..IOV_MAX)
            .map(|i| Seg::Virt(reference(4096, i as u64 * 4096)))
            .collect();
        let frames = plan(&segs);
        let mut vecs = Iovs::new();
        assert_eq!(gather(&frames, &segs, &mut vecs), IOV_MAX);
        let segs: Segs = (0..IOV_MAX)
            .map(|i| {
                if i % 2 == 0 {
                    Seg::Real(i * 8, 8)
                } else {
                    Seg::Virt(reference(4096, 0))
                }
            })
            .collect();
        let frames = plan(&segs);
        vecs.clear();
        let n = gather(&frames, &segs, &mut vecs);
        assert!(
            vecs.len() <= IOV_MAX && n < frames.len(),
            "{n} frames, {} iovecs",
            vecs.len()
        );
    }

    #[test]
    fn a_short_write_owes_the_rest_of_the_frame_it_cut() {
        let r = reference(8192, 0);
        let segs = [Seg::Real(0x1000, 100), Seg::Virt(r), Seg::Real(0x9000, 50)];
        let frames = plan(&segs);
        let wire = proto::R_HDR + 100 + proto::V_HDR + proto::R_HDR + 50;
        let mut w = FrameWriter::new();
        let all = w.account(&frames, wire);
        assert_eq!(
            (all.app, all.r_bytes, all.v_bytes, all.v_frames),
            (8342, 150, 8192, 1)
        );
        assert_eq!((w.frame(), w.pending()), (OutFrame::None, &[][..]));
        // cut inside the first frame's data: its rest is owed as R data
        let mut w = FrameWriter::new();
        let s = w.account(&frames, proto::R_HDR + 40);
        assert_eq!((s.app, s.header_cut), (40, false));
        assert_eq!(w.frame(), OutFrame::Real(60));
        // cut inside the V header: the reference is owed, counted as sent, its header's
        // rest pending
        let mut w = FrameWriter::new();
        let s = w.account(&frames, proto::R_HDR + 100 + 10);
        assert_eq!((s.app, s.v_frames, s.header_cut), (100, 1, true));
        assert_eq!(w.frame(), OutFrame::Virt(8192));
        assert_eq!(w.pending(), &r.encode()[10..]);
        // the application offers the referenced bytes again: covered, nothing to send
        w.pending_sent(proto::V_HDR - 10);
        assert_eq!(w.resume(5000), Resume::Covered(5000));
        assert_eq!(w.resume(9000), Resume::Covered(3192));
        assert_eq!(w.resume(9000), Resume::Fresh);
        // nothing at all went out: nothing owed
        let mut w = FrameWriter::new();
        assert_eq!(w.account(&frames, 0), Sent::default());
        assert_eq!(w.frame(), OutFrame::None);
    }

    #[test]
    fn r_data_owed_is_sent_raw_until_the_frame_is_complete() {
        let mut w = FrameWriter::new();
        w.real_frame_started(100);
        assert_eq!(w.resume(30), Resume::Real(30));
        w.sent_real(30);
        assert_eq!(w.resume(500), Resume::Real(70));
        w.sent_real(70);
        assert_eq!(w.resume(500), Resume::Fresh);
    }

    #[test]
    fn the_one_send_layout_owes_the_first_frame_it_did_not_finish() {
        let (rh, vh, th) = (
            proto::encode_r(100),
            reference(8192, 0).encode(),
            proto::encode_r(7),
        );
        let parts = |w: &mut FrameWriter, n| w.account_whole((&rh, 100), (&vh, 8192), (&th, 7), n);
        let wire = 5 + 100 + 47 + 5 + 7;
        let mut w = FrameWriter::new();
        let s = parts(&mut w, wire);
        assert_eq!((s.app, s.r_bytes, s.v_frames), (8299, 107, 1));
        assert_eq!(w.frame(), OutFrame::None);
        // all but the tail frame: its header is owed even though none of it went out
        let mut w = FrameWriter::new();
        let s = parts(&mut w, 5 + 100 + 47);
        assert_eq!(
            (s.app, w.frame(), w.pending()),
            (8292, OutFrame::Real(7), &th[..])
        );
        // inside the head's data: the head is owed, the reference not
        let mut w = FrameWriter::new();
        let s = parts(&mut w, 5 + 60);
        assert_eq!((s.app, s.v_frames, w.frame()), (60, 0, OutFrame::Real(40)));
        // nothing: the head's header is owed
        let mut w = FrameWriter::new();
        let s = parts(&mut w, 0);
        assert_eq!(
            (s.app, w.frame(), w.pending()),
            (0, OutFrame::Real(100), &rh[..])
        );
        // no head frame, the V header cut
        let mut w = FrameWriter::new();
        let s = w.account_whole((&[], 0), (&vh, 8192), (&[], 0), 20);
        assert_eq!((s.app, s.v_frames, w.frame()), (0, 0, OutFrame::Virt(8192)));
        assert_eq!(w.pending(), &vh[20..]);
    }

    /// A 64 KiB body behind a 257-byte response header: real bytes to the page boundary, a
    /// reference of whole pages, the tail as real bytes.
    #[test]
    fn sendfile_pads_to_the_receivers_page_boundary() {
        let (header, body, th) = (257, 65536, 4096);
        let head = aligned_head(header, body, th, true);
        assert_eq!(head, PAGE - 257);
        let (vlen, tail) = whole_layout(header, body, head, th).unwrap();
        assert_eq!(vlen % PAGE, 0);
        assert_eq!((head + vlen + tail, tail), (body, 257));
        assert_eq!(
            aligned_head(header, body, th, false),
            0,
            "no agent: no padding"
        );
        assert_eq!(aligned_head(0, body, th, true), 0, "aligned already");
        assert_eq!(whole_layout(0, body, 0, th), Some((65536, 0)));
        assert_eq!(
            whole_layout(header, body, 0, th),
            None,
            "misaligned, not padded"
        );
        assert_eq!(
            whole_layout(0, MAX_V + PAGE, 0, th),
            None,
            "longer than one reference"
        );
    }

    #[test]
    fn a_reference_is_made_only_where_it_leaves_whole_pages() {
        // 4 KiB behind a 257-byte header: two partial pages, no whole one
        assert_eq!(reference_len(257, 0, 4096, 0, 4096), None);
        assert_eq!(reference_len(0, 0, 8192 + 100, 0, 4096), Some(8192));
        assert_eq!(reference_len(257, 0, 3 * 4096, 0, 4096), Some(3 * 4096));
        assert_eq!(reference_len(0, 0, 2 * MAX_V, 0, 4096), Some(MAX_V));
        assert_eq!(whole_pages_at(100, 3 * PAGE), 2 * PAGE);
        assert_eq!(whole_pages_at(0, PAGE - 1), 0);
    }
}
