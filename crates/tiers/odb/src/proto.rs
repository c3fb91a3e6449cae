//! The ODB wire format between tiers, and the agent RPC format.
//!
//! A connection inside the ODB domain carries *frames* in both directions:
//!
//! ```text
//! R frame: 0xD1 | len u32 LE | len bytes                                  (5-byte header)
//! V frame: 0xD2 | len u32 | agent_id u64 | ip [4] | port u16 | offset u64
//!               | buf_id u128 | crc32 u32 of the 43 bytes before          (47-byte header)
//! ```
//!
//! A V frame stands for `len` bytes of buffer `buf_id`, starting at `offset`, held by the
//! buffer agent `agent_id` listening at `ip:port`. `buf_id` is 128 random bits drawn by the
//! agent: knowing one reference does not let anyone name another buffer, and the agent checks
//! `offset + len` against the buffer's size. The crc only catches corruption; it is not a
//! secret. Both tags are bytes no HTTP/1 stream starts with, so a receiver can tell an
//! unframed peer from the first byte it gets.

use std::net::{Ipv4Addr, SocketAddrV4};

pub const TAG_R: u8 = 0xD1;
pub const TAG_V: u8 = 0xD2;
pub const R_HDR: usize = 5;
pub const V_HDR: usize = 47;
/// Largest frame a receiver accepts (either type): a bound on what a peer can make us expect.
pub const MAX_FRAME: u32 = 1 << 30;

/// A reference to bytes held by a buffer agent (the payload of a V frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ref {
    pub len: u32,
    pub agent_id: u64,
    pub agent: SocketAddrV4,
    pub offset: u64,
    pub buf_id: u128,
}

impl Ref {
    /// The reference to `len` bytes starting `skip` bytes into this one.
    pub fn slice(&self, skip: u64, len: u32) -> Ref {
        debug_assert!(skip + len as u64 <= self.len as u64);
        Ref {
            len,
            offset: self.offset + skip,
            ..*self
        }
    }

    pub fn encode(&self) -> [u8; V_HDR] {
        let mut b = [0u8; V_HDR];
        b[0] = TAG_V;
        b[1..5].copy_from_slice(&self.len.to_le_bytes());
        b[5..13].copy_from_slice(&self.agent_id.to_le_bytes());
        b[13..17].copy_from_slice(&self.agent.ip().octets());
        b[17..19].copy_from_slice(&self.agent.port().to_le_bytes());
        b[19..27].copy_from_slice(&self.offset.to_le_bytes());
        b[27..43].copy_from_slice(&self.buf_id.to_le_bytes());
        let crc = crc32fast::hash(&b[..43]);
        b[43..47].copy_from_slice(&crc.to_le_bytes());
        b
    }
}

pub fn encode_r(len: u32) -> [u8; R_HDR] {
    let mut b = [0u8; R_HDR];
    b[0] = TAG_R;
    b[1..5].copy_from_slice(&len.to_le_bytes());
    b
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    Real(u32),
    Virtual(Ref),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtoError {
    /// The first byte is no frame tag: the peer does not speak ODB (or the stream is corrupt).
    NotFramed,
    BadLength,
    BadChecksum,
}

impl std::fmt::Display for ProtoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProtoError::NotFramed => "not an ODB frame",
            ProtoError::BadLength => "ODB frame length out of range",
            ProtoError::BadChecksum => "ODB reference checksum mismatch",
        })
    }
}

/// Header size implied by a tag byte.
pub fn header_len(tag: u8) -> Result<usize, ProtoError> {
    match tag {
        TAG_R => Ok(R_HDR),
        TAG_V => Ok(V_HDR),
        _ => Err(ProtoError::NotFramed),
    }
}

/// Parses a frame header from the start of `b`. `Ok(None)`: more bytes are needed.
/// Never panics, whatever `b` holds.
pub fn parse_header(b: &[u8]) -> Result<Option<(Header, usize)>, ProtoError> {
    let Some(&tag) = b.first() else {
        return Ok(None);
    };
    let need = header_len(tag)?;
    if b.len() < need {
        return Ok(None);
    }
    let len = u32::from_le_bytes(b[1..5].try_into().unwrap());
    if len == 0 || len > MAX_FRAME {
        return Err(ProtoError::BadLength);
    }
    if tag == TAG_R {
        return Ok(Some((Header::Real(len), R_HDR)));
    }
    let crc = u32::from_le_bytes(b[43..47].try_into().unwrap());
    if crc32fast::hash(&b[..43]) != crc {
        return Err(ProtoError::BadChecksum);
    }
    let ip = Ipv4Addr::new(b[13], b[14], b[15], b[16]);
    let port = u16::from_le_bytes(b[17..19].try_into().unwrap());
    let r = Ref {
        len,
        agent_id: u64::from_le_bytes(b[5..13].try_into().unwrap()),
        agent: SocketAddrV4::new(ip, port),
        offset: u64::from_le_bytes(b[19..27].try_into().unwrap()),
        buf_id: u128::from_le_bytes(b[27..43].try_into().unwrap()),
    };
    if r.offset.checked_add(len as u64).is_none() {
        return Err(ProtoError::BadLength);
    }
    Ok(Some((Header::Virtual(r), V_HDR)))
}

// ---- agent RPC (TCP, little-endian), one request then one reply, in order ----
//
// HELLO  : op=1                              -> status u8, agent_id u64, ip [4], port u16,
//                                               arena_size u64, path_len u16, path bytes
// ALLOC  : op=2, len u32                     -> status u8, arena_off u64, buf_id u128
// FETCH  : op=3, buf_id u128, off u64, len u32 -> status u8, then len bytes if status == OK
// STATS  : op=4                              -> json_len u32, json bytes
// LEASE  : op=5, size u32, release_no u32, release_used u32
//                                            -> status u8, arena_off u64, lease_no u32,
//                                               key [16], valid_ms u32
//
// A LEASE gives a sender `size` bytes of arena to cut buffers from itself, with no round trip
// per buffer: the id of a buffer cut from lease `no` at `off` (bytes into the lease) for
// `len` bytes is `lease_buf_id(no, off, len, key)` — the numbers and a 64-bit SipHash of them
// under the lease's random key, which only the agent and that sender know. Knowing one
// reference does not let anyone name another buffer. The sender uses a lease for at most
// `valid_ms` (a quarter of the agent's buffer lifetime, so every buffer cut from it keeps
// three quarters of its lifetime), and releases it with its next LEASE, saying how many
// bytes it used (`release_no` u32::MAX: none).

pub const OP_HELLO: u8 = 1;
pub const OP_ALLOC: u8 = 2;
pub const OP_FETCH: u8 = 3;
pub const OP_STATS: u8 = 4;
pub const OP_LEASE: u8 = 5;
/// Registers a file the local sender serves, so that its ranges travel as references the
/// agent answers with `sendfile` (no copy into the arena): see [`file_request`].
pub const OP_FILE: u8 = 6;

pub const ST_OK: u8 = 0;
/// No room: every byte of the arena belongs to a live buffer (sender falls back to copying).
pub const ST_FULL: u8 = 1;
/// The agent is draining before exit and takes no new buffers.
pub const ST_DRAINING: u8 = 2;
/// Unknown buffer id (never existed, forged, or evicted) or range out of bounds.
pub const ST_UNKNOWN: u8 = 3;
pub const ST_BAD_REQUEST: u8 = 4;
/// The buffer was evicted after every byte of it had been fetched: its payload was
/// delivered. (A receiver faulting on memory it forwarded long ago learns it may drop it.)
pub const ST_DELIVERED: u8 = 5;

pub const FETCH_REQ: usize = 1 + 16 + 8 + 4;
pub const ALLOC_REQ: usize = 1 + 4;
pub const ALLOC_REP: usize = 1 + 8 + 16;
pub const HELLO_REP_FIXED: usize = 1 + 8 + 4 + 2 + 8 + 2;
/// The arena file holds `arena_size` bytes of buffers, then this header: its first byte is
/// 1 once the agent drains (senders then cut no more buffers from their leases).
pub const ARENA_HEADER: u64 = 4096;
pub const LEASE_REQ: usize = 1 + 4 + 4 + 4;
pub const LEASE_REP: usize = 1 + 8 + 4 + 16 + 4;
/// Largest lease, and so largest buffer cut from one (24-bit offsets and lengths in the id).
pub const MAX_LEASE: u32 = (1 << 24) - 1;
/// Lease numbers are 14 bits in a buffer id (bit 126 is clear in a lease id, set in a
/// file range's).
pub const LEASE_NOS: u32 = 1 << 14;
/// No lease to release (`release_no`).
pub const NO_LEASE: u32 = u32::MAX;

/// An id's top two bits say what it names: a buffer cut from a lease (`LEASE_TAG`), a range
/// of a registered file (`FILE_TAG`); ALLOC's random ids have the top bit clear.
const LEASE_TAG: u128 = 0b10;
const FILE_TAG: u128 = 0b11;
const TAG_SHIFT: u32 = 126;

pub fn lease_request(size: u32, release_no: u32, release_used: u32) -> [u8; LEASE_REQ] {
    let mut b = [0u8; LEASE_REQ];
    b[0] = OP_LEASE;
    b[1..5].copy_from_slice(&size.to_le_bytes());
    b[5..9].copy_from_slice(&release_no.to_le_bytes());
    b[9..13].copy_from_slice(&release_used.to_le_bytes());
    b
}

fn lease_mac(no: u32, off: u32, len: u32, key: &[u8; 16]) -> u64 {
    use std::hash::Hasher;
    let mut h = siphasher::sip::SipHasher24::new_with_key(key);
    h.write_u32(no);
    h.write_u32(off);
    h.write_u32(len);
    h.finish()
}

/// The id of the buffer of `len` bytes at `off` in lease `no` (all checked by the caller:
/// `no < LEASE_NOS`, `off, len <= MAX_LEASE`).
pub fn lease_buf_id(no: u32, off: u32, len: u32, key: &[u8; 16]) -> u128 {
    debug_assert!(no < LEASE_NOS && off <= MAX_LEASE && len <= MAX_LEASE);
    LEASE_TAG << TAG_SHIFT
        | (no as u128) << 112
        | (off as u128) << 88
        | (len as u128) << 64
        | lease_mac(no, off, len, key) as u128
}

/// The (lease, offset, length) a lease buffer id names, if it is one; the MAC is checked
/// with [`lease_id_valid`] once the lease's key is known.
pub fn lease_id_parts(id: u128) -> Option<(u32, u32, u32)> {
    (id >> TAG_SHIFT == LEASE_TAG).then_some((
        (id >> 112) as u32 & (LEASE_NOS - 1),
        (id >> 88) as u32 & MAX_LEASE,
        (id >> 64) as u32 & MAX_LEASE,
    ))
}

/// Whether `id` is the genuine id of its (lease, offset, length) under `key`.
pub fn lease_id_valid(id: u128, key: &[u8; 16]) -> bool {
    lease_id_parts(id).is_some_and(|(no, off, len)| lease_buf_id(no, off, len, key) == id)
}

/// What names one version of a file: the sender's `fstat` of it, checked by the agent
/// against its own when it opens the path (a file replaced or changed is another file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileIdent {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
}

/// FILE request: op | dev u64 | ino u64 | size u64 | mtime_ns i64 | path_len u16 | path.
pub const FILE_REQ_FIXED: usize = 1 + 8 * 4 + 2;
/// Longest path in a FILE request (PATH_MAX).
pub const MAX_FILE_PATH: usize = 4096;
/// FILE reply: status | file_no u32 | key [16].
pub const FILE_REP: usize = 1 + 4 + 16;
/// File numbers are 12 bits in a file range's id: at most this many files registered.
pub const FILE_NOS: u32 = 1 << 12;
/// A file range's start is 40 bits in its id (files up to 1 TiB are served by reference).
pub const MAX_FILE_START: u64 = (1 << 40) - 1;
const FILE_MAC_BITS: u32 = 50;

/// Writes a FILE request into `out` (at least `FILE_REQ_FIXED + path.len()` bytes); returns
/// its length, or None when the path is longer than [`MAX_FILE_PATH`] or `out` too short.
pub fn file_request(ident: &FileIdent, path: &[u8], out: &mut [u8]) -> Option<usize> {
    let n = FILE_REQ_FIXED + path.len();
    if path.len() > MAX_FILE_PATH || out.len() < n {
        return None;
    }
    out[0] = OP_FILE;
    out[1..9].copy_from_slice(&ident.dev.to_le_bytes());
    out[9..17].copy_from_slice(&ident.ino.to_le_bytes());
    out[17..25].copy_from_slice(&ident.size.to_le_bytes());
    out[25..33].copy_from_slice(&ident.mtime_ns.to_le_bytes());
    out[33..35].copy_from_slice(&(path.len() as u16).to_le_bytes());
    out[35..n].copy_from_slice(path);
    Some(n)
}

/// The identity and path length of a FILE request's fixed part (after the op byte).
pub fn parse_file_request(b: &[u8; FILE_REQ_FIXED - 1]) -> (FileIdent, usize) {
    let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let ident = FileIdent {
        dev: word(0),
        ino: word(8),
        size: word(16),
        mtime_ns: word(24) as i64,
    };
    (ident, u16::from_le_bytes([b[32], b[33]]) as usize)
}

fn file_mac(no: u32, start: u64, len: u32, key: &[u8; 16]) -> u64 {
    use std::hash::Hasher;
    let mut h = siphasher::sip::SipHasher24::new_with_key(key);
    h.write_u32(no);
    h.write_u64(start);
    h.write_u32(len);
    h.finish() & ((1 << FILE_MAC_BITS) - 1)
}

/// The id of `len` bytes from `start` of registered file `no` (checked by the caller:
/// `no < FILE_NOS`, `start <= MAX_FILE_START`, `len <= MAX_LEASE`). A 50-bit MAC under the
/// file's key: a holder of one range cannot name another.
pub fn file_buf_id(no: u32, start: u64, len: u32, key: &[u8; 16]) -> u128 {
    debug_assert!(no < FILE_NOS && start <= MAX_FILE_START && len <= MAX_LEASE);
    FILE_TAG << TAG_SHIFT
        | (no as u128) << 114
        | (start as u128) << 74
        | (len as u128) << 50
        | file_mac(no, start, len, key) as u128
}

/// The (file, start, length) a file range id names, if it is one.
pub fn file_id_parts(id: u128) -> Option<(u32, u64, u32)> {
    (id >> TAG_SHIFT == FILE_TAG).then_some((
        (id >> 114) as u32 & (FILE_NOS - 1),
        (id >> 74) as u64 & MAX_FILE_START,
        (id >> 50) as u32 & MAX_LEASE,
    ))
}

/// Whether `id` is the genuine id of its file range under `key`.
pub fn file_id_valid(id: u128, key: &[u8; 16]) -> bool {
    file_id_parts(id).is_some_and(|(no, s, len)| file_buf_id(no, s, len, key) == id)
}

pub fn fetch_request(buf_id: u128, off: u64, len: u32) -> [u8; FETCH_REQ] {
    let mut b = [0u8; FETCH_REQ];
    b[0] = OP_FETCH;
    b[1..17].copy_from_slice(&buf_id.to_le_bytes());
    b[17..25].copy_from_slice(&off.to_le_bytes());
    b[25..29].copy_from_slice(&len.to_le_bytes());
    b
}

pub fn alloc_request(len: u32) -> [u8; ALLOC_REQ] {
    let mut b = [0u8; ALLOC_REQ];
    b[0] = OP_ALLOC;
    b[1..5].copy_from_slice(&len.to_le_bytes());
    b
}

/// The fixed part of a HELLO reply.
#[derive(Clone, Copy, Debug)]
pub struct Hello {
    pub agent_id: u64,
    pub addr: SocketAddrV4,
    pub arena_size: u64,
    pub path_len: u16,
}

pub fn parse_hello(b: &[u8; HELLO_REP_FIXED]) -> Option<Hello> {
    if b[0] != ST_OK {
        return None;
    }
    Some(Hello {
        agent_id: u64::from_le_bytes(b[1..9].try_into().unwrap()),
        addr: SocketAddrV4::new(
            Ipv4Addr::new(b[9], b[10], b[11], b[12]),
            u16::from_le_bytes([b[13], b[14]]),
        ),
        arena_size: u64::from_le_bytes(b[15..23].try_into().unwrap()),
        path_len: u16::from_le_bytes([b[23], b[24]]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Ref {
        Ref {
            len: 65536,
            agent_id: 7,
            agent: "10.1.2.3:4567".parse().unwrap(),
            offset: 12,
            buf_id: 0x1234_5678_9abc_def0_1122_3344_5566_7788,
        }
    }

    #[test]
    fn v_roundtrip_and_every_prefix_needs_more() {
        let r = sample();
        let b = r.encode();
        assert_eq!(parse_header(&b), Ok(Some((Header::Virtual(r), V_HDR))));
        for n in 0..V_HDR {
            assert_eq!(parse_header(&b[..n]), Ok(None), "prefix {n}");
        }
    }

    #[test]
    fn r_roundtrip() {
        assert_eq!(
            parse_header(&encode_r(3)),
            Ok(Some((Header::Real(3), R_HDR)))
        );
        assert_eq!(parse_header(&encode_r(0)), Err(ProtoError::BadLength));
    }

    #[test]
    fn forged_or_flipped_bits_are_refused() {
        let b = sample().encode();
        for i in 1..V_HDR {
            for bit in 0..8 {
                let mut c = b;
                c[i] ^= 1 << bit;
                assert!(parse_header(&c).is_err(), "byte {i} bit {bit} accepted");
            }
        }
        assert_eq!(
            parse_header(b"GET / HTTP/1.1\r\n"),
            Err(ProtoError::NotFramed)
        );
    }

    #[test]
    fn lease_ids_name_one_buffer_and_cannot_be_forged() {
        let key = [7u8; 16];
        let id = lease_buf_id(12, 4096, 61440, &key);
        assert_eq!(lease_id_parts(id), Some((12, 4096, 61440)));
        assert!(lease_id_valid(id, &key));
        assert!(!lease_id_valid(id, &[8u8; 16]), "another lease's key");
        for bit in 0..128 {
            assert!(!lease_id_valid(id ^ (1 << bit), &key), "bit {bit} flipped");
        }
        // another buffer of the same lease needs its own MAC
        let other = (id & !((MAX_LEASE as u128) << 88)) | (8192u128 << 88);
        assert!(!lease_id_valid(other, &key));
        assert_eq!(lease_id_parts(0x1234), None, "ALLOC ids have the bit clear");
    }

    #[test]
    fn file_range_ids_name_one_range_and_are_not_lease_ids() {
        let key = [9u8; 16];
        let id = file_buf_id(4095, MAX_FILE_START, MAX_LEASE, &key);
        assert_eq!(file_id_parts(id), Some((4095, MAX_FILE_START, MAX_LEASE)));
        let id = file_buf_id(3, 1 << 33, 65536, &key);
        assert_eq!(file_id_parts(id), Some((3, 1 << 33, 65536)));
        assert!(file_id_valid(id, &key));
        assert!(!file_id_valid(id, &[1u8; 16]), "another file's key");
        for bit in 0..126 {
            assert!(!file_id_valid(id ^ (1 << bit), &key), "bit {bit} flipped");
        }
        assert_eq!(lease_id_parts(id), None, "a file range is no lease buffer");
        let lease = lease_buf_id(LEASE_NOS - 1, 0, 1, &key);
        assert_eq!(
            file_id_parts(lease),
            None,
            "a lease buffer is no file range"
        );
        assert_eq!(lease_id_parts(lease), Some((LEASE_NOS - 1, 0, 1)));
    }

    #[test]
    fn a_file_request_carries_its_identity_and_path() {
        let ident = FileIdent {
            dev: 2049,
            ino: 1 << 40,
            size: 65536,
            mtime_ns: -5,
        };
        let mut out = [0u8; FILE_REQ_FIXED + 10];
        let n = file_request(&ident, b"/srv/a.bin", &mut out).unwrap();
        assert_eq!(n, out.len());
        assert_eq!(out[0], OP_FILE);
        let fixed: &[u8; FILE_REQ_FIXED - 1] = out[1..FILE_REQ_FIXED].try_into().unwrap();
        assert_eq!(parse_file_request(fixed), (ident, 10));
        assert_eq!(&out[FILE_REQ_FIXED..], b"/srv/a.bin");
        assert_eq!(
            file_request(&ident, b"/srv/a.bin!", &mut out),
            None,
            "too short"
        );
        let long = vec![b'a'; MAX_FILE_PATH + 1];
        assert_eq!(
            file_request(&ident, &long, &mut [0u8; 8192]),
            None,
            "too long"
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for _ in 0..20000 {
            let mut b = [0u8; V_HDR + 3];
            for v in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *v = x as u8;
            }
            b[0] = if x & 1 == 0 { TAG_R } else { TAG_V };
            let n = (x >> 8) as usize % b.len();
            let _ = parse_header(&b[..n]);
        }
    }
}
