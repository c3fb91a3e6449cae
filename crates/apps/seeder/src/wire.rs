//! The peer wire protocol: BEP 3 messages, BEP 6 Fast Extension, BEP 10 extension
//! messages. Parsing is pure (bytes in, messages out) so it can be fuzzed; every length is
//! checked against explicit limits before anything is allocated.

/// The 19-byte protocol string of the handshake.
pub const PROTOCOL: &[u8; 19] = b"BitTorrent protocol";
pub const HANDSHAKE_LEN: usize = 68;
/// Largest block a peer may request (BEP 3 practice; larger requests are rejected).
pub const MAX_BLOCK: u32 = 16 * 1024;
/// Largest extended (BEP 10) message we accept from a peer.
pub const MAX_EXTENDED: usize = 64 * 1024;

/// Reserved-bit for the Fast Extension (BEP 6): reserved[7] & 0x04.
pub const RESERVED_FAST: (usize, u8) = (7, 0x04);
/// Reserved-bit for the extension protocol (BEP 10): reserved[5] & 0x10.
pub const RESERVED_EXTENDED: (usize, u8) = (5, 0x10);
/// Reserved-bit for BitTorrent v2 (BEP 52): reserved[7] & 0x10, set by a peer that has the
/// torrent's v2 side (v2-only and hybrid torrents).
pub const RESERVED_V2: (usize, u8) = (7, 0x10);
/// The fields of a BEP 52 hash request, hashes or hash reject message (after the id): a
/// file's pieces root, then four 32-bit integers.
pub const HASH_FIELDS: u32 = 32 + 4 * 4;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    pub reserved: [u8; 8],
    pub info_hash: [u8; 20],
    pub peer_id: [u8; 20],
}

impl Handshake {
    pub fn fast(&self) -> bool {
        self.reserved[RESERVED_FAST.0] & RESERVED_FAST.1 != 0
    }
    pub fn extended(&self) -> bool {
        self.reserved[RESERVED_EXTENDED.0] & RESERVED_EXTENDED.1 != 0
    }

    pub fn encode(&self) -> [u8; HANDSHAKE_LEN] {
        let mut b = [0u8; HANDSHAKE_LEN];
        b[0] = 19;
        b[1..20].copy_from_slice(PROTOCOL);
        b[20..28].copy_from_slice(&self.reserved);
        b[28..48].copy_from_slice(&self.info_hash);
        b[48..68].copy_from_slice(&self.peer_id);
        b
    }

    /// Parses the 68 bytes of a handshake.
    pub fn parse(b: &[u8]) -> Result<Handshake, WireError> {
        if b.len() < HANDSHAKE_LEN {
            return Err(WireError::Truncated);
        }
        if b[0] != 19 || &b[1..20] != PROTOCOL {
            return Err(WireError::BadProtocol);
        }
        let mut h = Handshake {
            reserved: [0; 8],
            info_hash: [0; 20],
            peer_id: [0; 20],
        };
        h.reserved.copy_from_slice(&b[20..28]);
        h.info_hash.copy_from_slice(&b[28..48]);
        h.peer_id.copy_from_slice(&b[48..68]);
        Ok(h)
    }
}

/// Whether the first bytes of a connection that are not a BitTorrent handshake are an
/// MSE/PE opening (a 768-bit Diffie-Hellman public key, 96 bytes, then up to 512 bytes of
/// padding, sent in one write by every client that encrypts): at least 96 bytes, and not
/// text (an HTTP request or a line protocol sent to the wrong port). A heuristic for the
/// counters, until MSE is spoken.
pub fn looks_like_mse(first: &[u8]) -> bool {
    if first.len() < 96 || first.len() > 96 + 512 {
        return false;
    }
    let text = first[..96]
        .iter()
        .filter(|&&b| b == b'\t' || b == b'\n' || b == b'\r' || (0x20..0x7f).contains(&b))
        .count();
    text < 80
}

/// Whether the first 20 bytes of a connection are text (every byte printable): an HTTP
/// request or a line protocol at the wrong port, never a DH key (for a random key the odds
/// are (95/256)^20, about 2.5e-9).
pub fn looks_like_text(first: &[u8]) -> bool {
    first.len() >= 20
        && first[..20]
            .iter()
            .all(|&b| b == b'\t' || b == b'\n' || b == b'\r' || (0x20..0x7f).contains(&b))
}

/// Our BEP 20 peer id: `-IL0100-` and 12 random bytes.
pub fn make_peer_id() -> [u8; 20] {
    let mut id = [0u8; 20];
    id[..8].copy_from_slice(b"-IL0100-");
    for b in &mut id[8..] {
        *b = b"0123456789abcdefghijklmnopqrstuvwxyz"[rand::random_range(0..36)];
    }
    id
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    KeepAlive,
    Choke,
    Unchoke,
    Interested,
    NotInterested,
    Have(u32),
    Bitfield(&'a [u8]),
    Request {
        index: u32,
        begin: u32,
        length: u32,
    },
    Piece {
        index: u32,
        begin: u32,
        data: &'a [u8],
    },
    Cancel {
        index: u32,
        begin: u32,
        length: u32,
    },
    Port(u16),
    // BEP 6
    Suggest(u32),
    HaveAll,
    HaveNone,
    Reject {
        index: u32,
        begin: u32,
        length: u32,
    },
    AllowedFast(u32),
    // BEP 10
    Extended {
        id: u8,
        payload: &'a [u8],
    },
    // BEP 52
    HashRequest(HashReq),
    /// The hashes answering `req`: 32 bytes each, a whole number of them (checked).
    Hashes {
        req: HashReq,
        hashes: &'a [u8],
    },
    HashReject(HashReq),
}

/// What a BEP 52 hash request names: `length` hashes of the layer `base` (0: the 16 KiB
/// blocks) of the file whose merkle root is `root`, from `index`, with the uncle hashes of
/// `proof_layers` layers above them. The hashes and hash reject messages repeat it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashReq {
    pub root: [u8; 32],
    pub base: u32,
    pub index: u32,
    pub length: u32,
    pub proof_layers: u32,
}

impl HashReq {
    /// The fields from the first [`HASH_FIELDS`] bytes of `p` (at least that many).
    fn parse(p: &[u8]) -> HashReq {
        let mut root = [0u8; 32];
        root.copy_from_slice(&p[..32]);
        HashReq {
            root,
            base: be32(&p[32..]),
            index: be32(&p[36..]),
            length: be32(&p[40..]),
            proof_layers: be32(&p[44..]),
        }
    }

    /// The header of message `id` with `extra` bytes after the fields, then the fields.
    fn encode(&self, id: u8, extra: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(&(1 + HASH_FIELDS + extra as u32).to_be_bytes());
        out.push(id);
        out.extend_from_slice(&self.root);
        for v in [self.base, self.index, self.length, self.proof_layers] {
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
}

/// Appends a hashes message answering `req` with `hashes` to `out`.
pub fn encode_hashes(req: &HashReq, hashes: &[[u8; 32]], out: &mut Vec<u8>) {
    req.encode(22, hashes.len() * 32, out);
    for h in hashes {
        out.extend_from_slice(h);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    Truncated,
    BadProtocol,
    /// A length prefix beyond the cap for its message.
    TooLong(u32),
    /// A known message id with the wrong payload length.
    BadLength {
        id: u8,
        len: u32,
    },
    UnknownId(u8),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Truncated => write!(f, "truncated message"),
            WireError::BadProtocol => write!(f, "not a BitTorrent handshake"),
            WireError::TooLong(n) => write!(f, "message of {n} bytes exceeds the limit"),
            WireError::BadLength { id, len } => {
                write!(f, "message id {id} with a payload of {len} bytes")
            }
            WireError::UnknownId(id) => write!(f, "unknown message id {id}"),
        }
    }
}

impl std::error::Error for WireError {}

/// Limits on what a peer may send: the longest message given the torrent's bitfield.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_message: u32,
}

impl Limits {
    pub fn for_pieces(npieces: u32) -> Limits {
        let bitfield = npieces.div_ceil(8) + 1;
        Limits {
            max_message: bitfield.max(13 + MAX_BLOCK).max(MAX_EXTENDED as u32 + 2),
        }
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Parses one message from the front of `buf`: `Ok(Some((msg, consumed)))`, `Ok(None)` if
/// more bytes are needed, or an error (the peer is to be dropped).
pub fn parse(buf: &[u8], limits: Limits) -> Result<Option<(Message<'_>, usize)>, WireError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = be32(buf);
    if len > limits.max_message {
        return Err(WireError::TooLong(len));
    }
    if len == 0 {
        return Ok(Some((Message::KeepAlive, 4)));
    }
    let total = 4 + len as usize;
    if buf.len() < total {
        return Ok(None);
    }
    let id = buf[4];
    let p = &buf[5..total];
    let plen = len - 1;
    let want = |n: u32| {
        if plen == n {
            Ok(())
        } else {
            Err(WireError::BadLength { id, len: plen })
        }
    };
    let triple = |p: &[u8]| (be32(p), be32(&p[4..]), be32(&p[8..]));
    let msg = match id {
        0 => want(0).map(|_| Message::Choke)?,
        1 => want(0).map(|_| Message::Unchoke)?,
        2 => want(0).map(|_| Message::Interested)?,
        3 => want(0).map(|_| Message::NotInterested)?,
        4 => want(4).map(|_| Message::Have(be32(p)))?,
        5 => Message::Bitfield(p),
        6 => {
            want(12)?;
            let (index, begin, length) = triple(p);
            Message::Request {
                index,
                begin,
                length,
            }
        }
        7 => {
            if plen < 8 {
                return Err(WireError::BadLength { id, len: plen });
            }
            Message::Piece {
                index: be32(p),
                begin: be32(&p[4..]),
                data: &p[8..],
            }
        }
        8 => {
            want(12)?;
            let (index, begin, length) = triple(p);
            Message::Cancel {
                index,
                begin,
                length,
            }
        }
        9 => want(2).map(|_| Message::Port(u16::from_be_bytes([p[0], p[1]])))?,
        0x0D => want(4).map(|_| Message::Suggest(be32(p)))?,
        0x0E => want(0).map(|_| Message::HaveAll)?,
        0x0F => want(0).map(|_| Message::HaveNone)?,
        0x10 => {
            want(12)?;
            let (index, begin, length) = triple(p);
            Message::Reject {
                index,
                begin,
                length,
            }
        }
        0x11 => want(4).map(|_| Message::AllowedFast(be32(p)))?,
        20 => {
            if plen < 1 {
                return Err(WireError::BadLength { id, len: plen });
            }
            Message::Extended {
                id: p[0],
                payload: &p[1..],
            }
        }
        21 => want(HASH_FIELDS).map(|_| Message::HashRequest(HashReq::parse(p)))?,
        22 => {
            if plen < HASH_FIELDS || (plen - HASH_FIELDS) % 32 != 0 {
                return Err(WireError::BadLength { id, len: plen });
            }
            Message::Hashes {
                req: HashReq::parse(p),
                hashes: &p[HASH_FIELDS as usize..],
            }
        }
        23 => want(HASH_FIELDS).map(|_| Message::HashReject(HashReq::parse(p)))?,
        other => return Err(WireError::UnknownId(other)),
    };
    Ok(Some((msg, total)))
}

/// Appends the encoding of a message without payload data to `out`.
pub fn encode(msg: &Message<'_>, out: &mut Vec<u8>) {
    fn hdr(out: &mut Vec<u8>, len: u32, id: u8) {
        out.extend_from_slice(&len.to_be_bytes());
        out.push(id);
    }
    fn triple(out: &mut Vec<u8>, id: u8, a: u32, b: u32, c: u32) {
        hdr(out, 13, id);
        out.extend_from_slice(&a.to_be_bytes());
        out.extend_from_slice(&b.to_be_bytes());
        out.extend_from_slice(&c.to_be_bytes());
    }
    match *msg {
        Message::KeepAlive => out.extend_from_slice(&[0, 0, 0, 0]),
        Message::Choke => hdr(out, 1, 0),
        Message::Unchoke => hdr(out, 1, 1),
        Message::Interested => hdr(out, 1, 2),
        Message::NotInterested => hdr(out, 1, 3),
        Message::Have(i) => {
            hdr(out, 5, 4);
            out.extend_from_slice(&i.to_be_bytes());
        }
        Message::Bitfield(b) => {
            hdr(out, 1 + b.len() as u32, 5);
            out.extend_from_slice(b);
        }
        Message::Request {
            index,
            begin,
            length,
        } => triple(out, 6, index, begin, length),
        Message::Piece { index, begin, data } => {
            hdr(out, 9 + data.len() as u32, 7);
            out.extend_from_slice(&index.to_be_bytes());
            out.extend_from_slice(&begin.to_be_bytes());
            out.extend_from_slice(data);
        }
        Message::Cancel {
            index,
            begin,
            length,
        } => triple(out, 8, index, begin, length),
        Message::Port(p) => {
            hdr(out, 3, 9);
            out.extend_from_slice(&p.to_be_bytes());
        }
        Message::Suggest(i) => {
            hdr(out, 5, 0x0D);
            out.extend_from_slice(&i.to_be_bytes());
        }
        Message::HaveAll => hdr(out, 1, 0x0E),
        Message::HaveNone => hdr(out, 1, 0x0F),
        Message::Reject {
            index,
            begin,
            length,
        } => triple(out, 0x10, index, begin, length),
        Message::AllowedFast(i) => {
            hdr(out, 5, 0x11);
            out.extend_from_slice(&i.to_be_bytes());
        }
        Message::Extended { id, payload } => {
            hdr(out, 2 + payload.len() as u32, 20);
            out.push(id);
            out.extend_from_slice(payload);
        }
        Message::HashRequest(r) => r.encode(21, 0, out),
        Message::Hashes { req, hashes } => {
            req.encode(22, hashes.len(), out);
            out.extend_from_slice(hashes);
        }
        Message::HashReject(r) => r.encode(23, 0, out),
    }
}

/// The header of a piece message carrying `len` bytes (13 bytes; the data follows).
pub fn piece_header(index: u32, begin: u32, len: u32) -> [u8; 13] {
    let mut h = [0u8; 13];
    h[..4].copy_from_slice(&(9 + len).to_be_bytes());
    h[4] = 7;
    h[5..9].copy_from_slice(&index.to_be_bytes());
    h[9..13].copy_from_slice(&begin.to_be_bytes());
    h
}

/// BEP 6's canonical allowed-fast set: `k` piece indices derived from the peer's IPv4
/// address (its /24) and the info hash, so every implementation computes the same set.
pub fn allowed_fast_set(
    ip: std::net::Ipv4Addr,
    info_hash: &[u8; 20],
    npieces: u32,
    k: usize,
) -> Vec<u32> {
    use sha1::{Digest, Sha1};
    let k = k.min(npieces as usize);
    let mut out: Vec<u32> = Vec::with_capacity(k);
    if k == 0 {
        return out;
    }
    let masked = u32::from(ip) & 0xFFFF_FF00;
    let mut x: Vec<u8> = masked.to_be_bytes().to_vec();
    x.extend_from_slice(info_hash);
    while out.len() < k {
        x = Sha1::digest(&x).to_vec();
        for i in 0..5 {
            if out.len() >= k {
                break;
            }
            let y = be32(&x[i * 4..]);
            let index = y % npieces;
            if !out.contains(&index) {
                out.push(index);
            }
        }
    }
    out
}

/// Validates a request against the torrent: index in range, block inside the piece,
/// length 1..=16 KiB.
pub fn check_request(
    index: u32,
    begin: u32,
    length: u32,
    npieces: u32,
    piece_len: impl Fn(u32) -> u64,
) -> bool {
    if index >= npieces || length == 0 || length > MAX_BLOCK {
        return false;
    }
    (begin as u64) + (length as u64) <= piece_len(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_mse_opening_is_told_from_text() {
        let key: Vec<u8> = (0..96u32).map(|i| (i * 151 % 251) as u8 ^ 0x80).collect();
        assert!(looks_like_mse(&key));
        assert!(looks_like_mse(&[key.clone(), vec![7; 512]].concat()));
        assert!(!looks_like_mse(&key[..95]), "shorter than a DH key");
        assert!(
            !looks_like_mse(&[key, vec![7; 513]].concat()),
            "longer than key and padding"
        );
        let http = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(100));
        assert!(!looks_like_mse(http.as_bytes()));
    }

    #[test]
    fn round_trip_every_message() {
        let msgs = [
            Message::KeepAlive,
            Message::Choke,
            Message::Unchoke,
            Message::Interested,
            Message::NotInterested,
            Message::Have(7),
            Message::Bitfield(&[0xff, 0x80]),
            Message::Request {
                index: 1,
                begin: 16384,
                length: 16384,
            },
            Message::Piece {
                index: 2,
                begin: 0,
                data: b"abc",
            },
            Message::Cancel {
                index: 1,
                begin: 0,
                length: 10,
            },
            Message::Port(6881),
            Message::Suggest(3),
            Message::HaveAll,
            Message::HaveNone,
            Message::Reject {
                index: 1,
                begin: 2,
                length: 3,
            },
            Message::AllowedFast(9),
            Message::Extended {
                id: 0,
                payload: b"de",
            },
            Message::HashRequest(HR),
            Message::Hashes {
                req: HR,
                hashes: &[9; 64],
            },
            Message::Hashes {
                req: HR,
                hashes: &[],
            },
            Message::HashReject(HR),
        ];
        let lim = Limits::for_pieces(100);
        for m in msgs {
            let mut b = Vec::new();
            encode(&m, &mut b);
            let (back, n) = parse(&b, lim).unwrap().unwrap();
            assert_eq!(back, m);
            assert_eq!(n, b.len());
            // Every strict prefix asks for more bytes.
            for cut in 0..b.len() {
                assert_eq!(parse(&b[..cut], lim).unwrap(), None, "{m:?} cut at {cut}");
            }
        }
    }

    const HR: HashReq = HashReq {
        root: [7; 32],
        base: 2,
        index: 512,
        length: 512,
        proof_layers: 0x0102_0304,
    };

    #[test]
    fn bep52_messages_have_their_fields_in_order_and_bad_lengths_are_refused() {
        let mut b = Vec::new();
        encode(&Message::HashRequest(HR), &mut b);
        // <len 49><21><root><base><index><length><proof layers>, all big-endian.
        let mut want = vec![0, 0, 0, 49, 21];
        want.extend_from_slice(&[7; 32]);
        want.extend_from_slice(&[0, 0, 0, 2, 0, 0, 2, 0, 0, 0, 2, 0, 1, 2, 3, 4]);
        assert_eq!(b, want);
        let mut h = Vec::new();
        encode_hashes(&HR, &[[1; 32], [2; 32]], &mut h);
        assert_eq!(&h[..4], &(49u32 + 64).to_be_bytes());
        assert_eq!(h[4], 22);
        assert_eq!(&h[5..53], &want[5..]);
        assert_eq!(&h[53..85], &[1; 32]);
        let lim = Limits::for_pieces(100);
        for id in [21u8, 22, 23] {
            // One byte short of the fields, and (but for hashes) one more.
            for plen in [HASH_FIELDS - 1, HASH_FIELDS + 1] {
                let mut m = (plen + 1).to_be_bytes().to_vec();
                m.push(id);
                m.resize(5 + plen as usize, 0);
                assert_eq!(
                    parse(&m, lim),
                    Err(WireError::BadLength { id, len: plen }),
                    "id {id}, {plen} bytes"
                );
            }
        }
        // Hashes: a length that is not a whole number of hashes.
        let mut m = (1 + HASH_FIELDS + 33).to_be_bytes().to_vec();
        m.push(22);
        m.resize(5 + 48 + 33, 0);
        assert!(matches!(
            parse(&m, lim),
            Err(WireError::BadLength { id: 22, .. })
        ));
    }

    #[test]
    fn limits_and_bad_lengths() {
        let lim = Limits::for_pieces(100);
        let big = (lim.max_message + 1).to_be_bytes();
        assert_eq!(
            parse(&big, lim),
            Err(WireError::TooLong(lim.max_message + 1))
        );
        // A "have" with 3 bytes of payload.
        assert!(matches!(
            parse(&[0, 0, 0, 4, 4, 0, 0, 0], lim),
            Err(WireError::BadLength { id: 4, len: 3 })
        ));
        assert_eq!(parse(&[0, 0, 0, 1, 99], lim), Err(WireError::UnknownId(99)));
        assert!(!check_request(0, 0, 16385, 10, |_| 65536));
        assert!(!check_request(10, 0, 16, 10, |_| 65536));
        assert!(!check_request(9, 65536 - 8, 16, 10, |_| 65536));
        assert!(check_request(9, 65536 - 16, 16, 10, |_| 65536));
        assert!(!check_request(0, u32::MAX, 16384, 10, |_| 65536));
    }

    #[test]
    fn allowed_fast_matches_bep6_example() {
        // BEP 6: 80.4.4.200, info hash of 20 bytes 0xaa, 1313 pieces, k = 7.
        let set = allowed_fast_set([80, 4, 4, 200].into(), &[0xaa; 20], 1313, 7);
        assert_eq!(set, vec![1059, 431, 808, 1217, 287, 376, 1188]);
        let set9 = allowed_fast_set([80, 4, 4, 200].into(), &[0xaa; 20], 1313, 9);
        assert_eq!(set9, vec![1059, 431, 808, 1217, 287, 376, 1188, 353, 508]);
    }

    #[test]
    fn handshake_round_trip() {
        let h = Handshake {
            reserved: [0, 0, 0, 0, 0, 0x10, 0, 0x04],
            info_hash: [1; 20],
            peer_id: make_peer_id(),
        };
        let b = h.encode();
        let back = Handshake::parse(&b).unwrap();
        assert_eq!(back, h);
        assert!(back.fast() && back.extended());
        assert_eq!(&back.peer_id[..8], b"-IL0100-");
        let mut bad = b;
        bad[3] = b'x';
        assert_eq!(Handshake::parse(&bad), Err(WireError::BadProtocol));
    }
}
