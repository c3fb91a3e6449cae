//! uTP packets (BEP 29) as a pure codec: the 20-byte header, the chain of extensions
//! (selective ACK read and written, others skipped), the payload. Every length is checked
//! before use: a datagram from anywhere either parses or is an error.

use std::fmt;

/// Payload bytes of a full DATA packet: a 20-byte header, a selective ACK and this fit in a
/// 1,500-byte link under IPv6 and UDP headers.
pub const MSS: usize = 1400;

/// Header bytes before extensions and payload.
pub const HEADER_LEN: usize = 20;
/// The only version there is.
pub const VERSION: u8 = 1;
/// Extension type of a selective ACK.
const EXT_SACK: u8 = 1;
/// Bitmask bytes of the selective ACKs we send (32 packets past the hole).
pub const SACK_BYTES: usize = 4;

/// The packet types, numbered as on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Data = 0,
    Fin = 1,
    State = 2,
    Reset = 3,
    Syn = 4,
}

impl Kind {
    fn from_wire(n: u8) -> Option<Kind> {
        Some(match n {
            0 => Kind::Data,
            1 => Kind::Fin,
            2 => Kind::State,
            3 => Kind::Reset,
            4 => Kind::Syn,
            _ => return None,
        })
    }
}

/// One packet, borrowing its selective ACK bitmask and payload from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    pub kind: Kind,
    pub conn_id: u16,
    /// The sender's clock when it sent this, in microseconds (wrapping).
    pub timestamp_us: u32,
    /// The sender's last measured one-way delay of our packets to it (wrapping).
    pub timestamp_diff_us: u32,
    /// Bytes the sender can still take in (its receive window).
    pub wnd_size: u32,
    pub seq_nr: u16,
    pub ack_nr: u16,
    /// The selective ACK bitmask: bit i of byte j (least significant first) says packet
    /// `ack_nr + 2 + 8j + i` arrived.
    pub sack: Option<&'a [u8]>,
    pub payload: &'a [u8],
}

/// Why a datagram is not a uTP packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PacketError {
    Short(usize),
    Version(u8),
    Kind(u8),
    /// An extension runs past the datagram's end.
    Extension,
}

impl fmt::Display for PacketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PacketError::Short(n) => write!(f, "{n} bytes is shorter than a uTP header"),
            PacketError::Version(v) => write!(f, "uTP version {v}"),
            PacketError::Kind(k) => write!(f, "uTP packet type {k}"),
            PacketError::Extension => write!(f, "uTP extension past the end"),
        }
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Parses one datagram.
pub fn parse(d: &[u8]) -> Result<Packet<'_>, PacketError> {
    if d.len() < HEADER_LEN {
        return Err(PacketError::Short(d.len()));
    }
    let version = d[0] & 0x0F;
    if version != VERSION {
        return Err(PacketError::Version(version));
    }
    let kind = Kind::from_wire(d[0] >> 4).ok_or(PacketError::Kind(d[0] >> 4))?;
    let mut next = d[1];
    let mut at = HEADER_LEN;
    let mut sack = None;
    // Each extension: [next type, length, bytes]; the chain is bounded by the datagram.
    while next != 0 {
        if at + 2 > d.len() {
            return Err(PacketError::Extension);
        }
        let (kind, len) = (next, d[at + 1] as usize);
        next = d[at];
        let body = d.get(at + 2..at + 2 + len).ok_or(PacketError::Extension)?;
        // BEP 29 asks for a multiple of 4 bytes, but libtorrent 2.0 sends bitmasks of any
        // length (1 to 32 bytes seen): the bits mean the same whatever the length, and an
        // ACK dropped for it stalls the sender. An empty one says nothing.
        if kind == EXT_SACK && len > 0 {
            sack = Some(body);
        }
        at += 2 + len;
    }
    Ok(Packet {
        kind,
        conn_id: be16(d, 2),
        timestamp_us: be32(d, 4),
        timestamp_diff_us: be32(d, 8),
        wnd_size: be32(d, 12),
        seq_nr: be16(d, 16),
        ack_nr: be16(d, 18),
        sack,
        payload: &d[at..],
    })
}

impl Packet<'_> {
    /// Appends the packet as a datagram to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(((self.kind as u8) << 4) | VERSION);
        out.push(if self.sack.is_some() { EXT_SACK } else { 0 });
        out.extend_from_slice(&self.conn_id.to_be_bytes());
        out.extend_from_slice(&self.timestamp_us.to_be_bytes());
        out.extend_from_slice(&self.timestamp_diff_us.to_be_bytes());
        out.extend_from_slice(&self.wnd_size.to_be_bytes());
        out.extend_from_slice(&self.seq_nr.to_be_bytes());
        out.extend_from_slice(&self.ack_nr.to_be_bytes());
        if let Some(mask) = self.sack {
            out.push(0);
            out.push(mask.len().min(255) as u8);
            out.extend_from_slice(&mask[..mask.len().min(255)]);
        }
        out.extend_from_slice(self.payload);
    }

    /// The sequence numbers the selective ACK says arrived.
    pub fn sacked(&self) -> impl Iterator<Item = u16> + '_ {
        let mask = self.sack.unwrap_or(&[]);
        let base = self.ack_nr.wrapping_add(2);
        (0..mask.len() * 8)
            .filter(move |i| mask[i / 8] & (1 << (i % 8)) != 0)
            .map(move |i| base.wrapping_add(i as u16))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(sack: Option<&[u8]>, payload: &'static [u8]) -> Vec<u8> {
        let mut out = Vec::new();
        Packet {
            kind: Kind::Data,
            conn_id: 0xBEEF,
            timestamp_us: 1_000_001,
            timestamp_diff_us: 42,
            wnd_size: 1 << 20,
            seq_nr: 65535,
            ack_nr: 7,
            sack,
            payload,
        }
        .encode(&mut out);
        out
    }

    #[test]
    fn header_fields_sit_where_bep_29_puts_them() {
        let d = sample(None, b"hi");
        assert_eq!(d.len(), HEADER_LEN + 2);
        assert_eq!(
            d[0], 0x01,
            "type 0 (data) in the high nibble, version 1 in the low"
        );
        assert_eq!(d[1], 0, "no extension");
        assert_eq!(&d[2..4], &[0xBE, 0xEF]);
        assert_eq!(&d[16..20], &[0xFF, 0xFF, 0, 7]);
        let p = parse(&d).unwrap();
        assert_eq!(
            (p.kind, p.conn_id, p.seq_nr, p.ack_nr),
            (Kind::Data, 0xBEEF, 65535, 7)
        );
        assert_eq!(
            (p.timestamp_us, p.timestamp_diff_us, p.wnd_size),
            (1_000_001, 42, 1 << 20)
        );
        assert_eq!(p.payload, b"hi");
    }

    #[test]
    fn selective_ack_round_trips_and_names_its_packets() {
        let d = sample(Some(&[0b0000_0101, 0, 0, 0x80]), b"x");
        assert_eq!(d[1], 1, "the first extension is a selective ACK");
        let p = parse(&d).unwrap();
        assert_eq!(p.payload, b"x");
        // ack_nr 7: bit 0 is packet 9, bit 2 packet 11, bit 31 packet 40.
        assert_eq!(p.sacked().collect::<Vec<_>>(), vec![9, 11, 40]);
    }

    #[test]
    fn unknown_extensions_are_skipped() {
        let mut d = sample(None, b"");
        d[1] = 2; // extension bits (8 bytes), then a selective ACK
        d.extend_from_slice(&[1, 8, 0, 0, 0, 0, 0, 0, 0, 0]);
        d.extend_from_slice(&[0, 4, 1, 0, 0, 0]);
        d.extend_from_slice(b"data");
        let p = parse(&d).unwrap();
        assert_eq!(p.sack, Some(&[1u8, 0, 0, 0][..]));
        assert_eq!(p.payload, b"data");
    }

    #[test]
    fn malformed_datagrams_are_errors() {
        assert_eq!(parse(&[0x01; 19]), Err(PacketError::Short(19)));
        let mut d = sample(None, b"");
        d[0] = 0x02;
        assert_eq!(parse(&d), Err(PacketError::Version(2)));
        d[0] = 0x51;
        assert_eq!(parse(&d), Err(PacketError::Kind(5)));
        let mut d = sample(None, b"");
        d[1] = 1;
        assert_eq!(
            parse(&d),
            Err(PacketError::Extension),
            "header ends where the extension should be"
        );
        d.extend_from_slice(&[0, 9, 1, 2]);
        assert_eq!(
            parse(&d),
            Err(PacketError::Extension),
            "length past the end"
        );
    }

    /// A STATE as libtorrent 2.0.8 sends it (header bytes from a capture against our
    /// seeder): a selective ACK of 3 bytes, which BEP 29's "multiple of 4" would refuse.
    /// Refusing it dropped the ACK, and the download stalled until libtorrent timed out.
    #[test]
    fn selective_acks_of_any_length_are_read() {
        let mut d = hex("2101b7de97e7d8ac97e4beaa000fa3086fab22ce");
        d.extend_from_slice(&[0, 3, 0b1000_0001, 0, 0b0000_0010]);
        let p = parse(&d).unwrap();
        assert_eq!((p.kind, p.ack_nr), (Kind::State, 0x22ce));
        let base = 0x22ceu16 + 2;
        assert_eq!(
            p.sacked().collect::<Vec<_>>(),
            vec![base, base + 7, base + 17]
        );
        // an empty bitmask: an ACK without selective part
        let mut d = sample(None, b"");
        d[1] = 1;
        d.extend_from_slice(&[0, 0]);
        assert_eq!(parse(&d).unwrap().sack, None);
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }
}
