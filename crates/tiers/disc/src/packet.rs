//! Ethernet + IPv4 + TCP frames: built with correct checksums (DP's segments, the eBPF
//! tests' crafted packets) and read back.

use std::net::Ipv4Addr;

pub const ETH_HLEN: usize = 14;
pub const IP_HLEN: usize = 20;
pub const TCP_HLEN: usize = 20;
/// Offset of the TCP header in a frame without IP options.
pub const TCP_OFF: usize = ETH_HLEN + IP_HLEN;

pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const PSH: u8 = 0x08;
pub const ACK: u8 = 0x10;

/// One TCP segment's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    /// The raw 16-bit window field (already scaled down by the sender's shift).
    pub window: u16,
}

fn sum16(data: &[u8], mut acc: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// The TCP checksum of `tcp` (header + payload) between `src` and `dst`.
pub fn tcp_checksum(src: Ipv4Addr, dst: Ipv4Addr, tcp: &[u8]) -> u16 {
    fold(sum16(tcp, pseudo_sum(src, dst, tcp.len())))
}

/// Ethernet + IPv4 + TCP headers without options.
pub const HDRS_LEN: usize = TCP_OFF + TCP_HLEN;

/// The headers of a segment (or a GSO burst) of `payload_len` bytes whose TCP checksum the
/// kernel finishes (CHECKSUM_PARTIAL): the checksum field holds the pseudo-header's folded
/// sum, not complemented, as the kernel's own offloaded segments carry it; segmentation
/// adjusts it per segment. [`frame`] starts from these and completes the checksum.
pub fn headers_offloaded(s: &Segment, payload_len: usize) -> [u8; HDRS_LEN] {
    let total = IP_HLEN + TCP_HLEN + payload_len;
    let mut h = [0u8; HDRS_LEN];
    h[0..6].copy_from_slice(&s.dst_mac);
    h[6..12].copy_from_slice(&s.src_mac);
    h[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    // IPv4: no options, DF, TTL 64.
    let ip = &mut h[ETH_HLEN..TCP_OFF];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&s.src.octets());
    ip[16..20].copy_from_slice(&s.dst.octets());
    let c = fold(sum16(ip, 0));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let tcp = &mut h[TCP_OFF..];
    tcp[0..2].copy_from_slice(&s.sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&s.dport.to_be_bytes());
    tcp[4..8].copy_from_slice(&s.seq.to_be_bytes());
    tcp[8..12].copy_from_slice(&s.ack.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = s.flags;
    tcp[14..16].copy_from_slice(&s.window.to_be_bytes());
    let partial = !fold(pseudo_sum(s.src, s.dst, TCP_HLEN + payload_len));
    tcp[16..18].copy_from_slice(&partial.to_be_bytes());
    h
}

fn pseudo_sum(src: Ipv4Addr, dst: Ipv4Addr, tcp_len: usize) -> u32 {
    let mut pseudo = [0u8; 12];
    pseudo[..4].copy_from_slice(&src.octets());
    pseudo[4..8].copy_from_slice(&dst.octets());
    pseudo[9] = 6;
    pseudo[10..12].copy_from_slice(&(tcp_len as u16).to_be_bytes());
    sum16(&pseudo, 0)
}

/// A complete frame carrying `payload`, both checksums computed.
pub fn frame(s: &Segment, payload: &[u8]) -> Vec<u8> {
    let mut h = headers_offloaded(s, payload.len());
    h[TCP_OFF + 16..TCP_OFF + 18].fill(0);
    let sum = sum16(
        payload,
        sum16(
            &h[TCP_OFF..],
            pseudo_sum(s.src, s.dst, TCP_HLEN + payload.len()),
        ),
    );
    h[TCP_OFF + 16..TCP_OFF + 18].copy_from_slice(&fold(sum).to_be_bytes());
    let mut f = Vec::with_capacity(HDRS_LEN + payload.len());
    f.extend_from_slice(&h);
    f.extend_from_slice(payload);
    f
}

/// A complete frame whose TCP header carries `options` (a multiple of 4 bytes, at most 40),
/// both checksums computed.
pub fn frame_with_options(s: &Segment, options: &[u8], payload: &[u8]) -> Vec<u8> {
    assert!(
        options.len() % 4 == 0 && options.len() <= 40,
        "TCP options: 4-byte words, <= 40"
    );
    let mut body = options.to_vec();
    body.extend_from_slice(payload);
    let mut f = frame(s, &body);
    // Longer header, same bytes: data offset up, checksum again.
    f[TCP_OFF + 12] = ((TCP_HLEN + options.len()) as u8 / 4) << 4;
    f[TCP_OFF + 16..TCP_OFF + 18].fill(0);
    let c = tcp_checksum(s.src, s.dst, &f[TCP_OFF..]);
    f[TCP_OFF + 16..TCP_OFF + 18].copy_from_slice(&c.to_be_bytes());
    f
}

/// Reads back a frame built by [`frame`] (or any IPv4 TCP frame without IP options): the
/// segment, the payload, and whether both checksums are right.
pub fn parse(f: &[u8]) -> Option<(Segment, &[u8], bool)> {
    if f.len() < TCP_OFF + TCP_HLEN || f[12..14] != [0x08, 0x00] || f[14] != 0x45 || f[23] != 6 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    if total < IP_HLEN + TCP_HLEN || ETH_HLEN + total > f.len() {
        return None;
    }
    let ip = &f[ETH_HLEN..ETH_HLEN + IP_HLEN];
    let tcp = &f[TCP_OFF..ETH_HLEN + total];
    let doff = usize::from(tcp[12] >> 4) * 4;
    if doff < TCP_HLEN || doff > tcp.len() {
        return None;
    }
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let ok = fold(sum16(ip, 0)) == 0 && tcp_checksum(src, dst, tcp) == 0;
    let mut src_mac = [0u8; 6];
    let mut dst_mac = [0u8; 6];
    dst_mac.copy_from_slice(&f[0..6]);
    src_mac.copy_from_slice(&f[6..12]);
    let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    Some((
        Segment {
            src_mac,
            dst_mac,
            src,
            dst,
            sport: u16::from_be_bytes([tcp[0], tcp[1]]),
            dport: u16::from_be_bytes([tcp[2], tcp[3]]),
            seq: be32(&tcp[4..8]),
            ack: be32(&tcp[8..12]),
            flags: tcp[13],
            window: u16::from_be_bytes([tcp[14], tcp[15]]),
        },
        &tcp[doff..],
        ok,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment from 10.1.2.3:8080 to `dst`:40000.
    fn segment(dst: Ipv4Addr, seq: u32, ack: u32, flags: u8, window: u16) -> Segment {
        Segment {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src: Ipv4Addr::new(10, 1, 2, 3),
            dst,
            sport: 8080,
            dport: 40000,
            seq,
            ack,
            flags,
            window,
        }
    }

    #[test]
    fn frames_round_trip_with_valid_checksums() {
        let s = segment(
            Ipv4Addr::new(10, 1, 2, 4),
            0xfffffff0,
            12345,
            ACK | PSH,
            501,
        );
        for payload in [&b""[..], b"x", b"hello, world"] {
            let f = frame(&s, payload);
            let (back, p, ok) = parse(&f).unwrap();
            assert!(ok);
            assert_eq!(back, s);
            assert_eq!(p, payload);
            let mut bad = f.clone();
            *bad.last_mut().unwrap() ^= 1;
            if !payload.is_empty() {
                assert!(!parse(&bad).unwrap().2, "a flipped bit breaks the checksum");
            }
        }
    }

    /// What a device does with CHECKSUM_PARTIAL (sum from csum_start to the end, store the
    /// complement at csum_offset) must give the checksum [`frame`] computes itself.
    #[test]
    fn an_offloaded_checksum_finishes_to_the_full_one() {
        let s = segment(
            Ipv4Addr::new(192, 168, 200, 4),
            0x89abcdef,
            0x01234567,
            ACK,
            65535,
        );
        for len in [0usize, 1, 2, 1399, 1400, 64_400] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 131 + 7) as u8).collect();
            let full = frame(&s, &payload);
            let h = headers_offloaded(&s, len);
            assert_eq!(h[..TCP_OFF + 16], full[..TCP_OFF + 16], "same headers");
            let mut device = h.to_vec();
            device.extend_from_slice(&payload);
            let c = fold(sum16(&device[TCP_OFF..], 0));
            device[TCP_OFF + 16..TCP_OFF + 18].copy_from_slice(&c.to_be_bytes());
            assert_eq!(device, full, "{len} bytes");
            assert!(parse(&device).unwrap().2);
        }
    }
}
