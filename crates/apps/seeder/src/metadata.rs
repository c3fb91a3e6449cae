//! BEP 9 metadata exchange (`ut_metadata` over the BEP 10 extension protocol) and BEP 9
//! magnet links: a client that has only the info hash fetches the torrent's info
//! dictionary from us in 16 KiB pieces, then checks its SHA-1 against the hash.
//!
//! Pure functions (fuzzed by the `ut_metadata` target): the raw info dictionary of a
//! `.torrent`, our extension handshake, a peer's handshake and requests, our replies.
//! Limits: an info dictionary of at most [`MAX_METADATA`] bytes is offered (larger ones are
//! not: a client would refuse them too); pieces are [`METADATA_PIECE`] bytes.

use lava_torrent::bencode::BencodeElem;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

/// A metadata piece (BEP 9).
pub const METADATA_PIECE: usize = 16 * 1024;
/// The largest info dictionary offered.
pub const MAX_METADATA: usize = 16 << 20;
/// Our extended message id for `ut_metadata` (told in our handshake).
pub const UT_METADATA_ID: u8 = 1;

/// The end (exclusive) of the bencoded value starting at `b[pos]`.
fn value_end(b: &[u8], pos: usize, depth: usize) -> Option<usize> {
    if depth > 64 {
        return None;
    }
    match *b.get(pos)? {
        b'i' => Some(pos + b[pos..].iter().position(|&c| c == b'e')? + 1),
        b'l' | b'd' => {
            let mut p = pos + 1;
            while *b.get(p)? != b'e' {
                p = value_end(b, p, depth + 1)?;
            }
            Some(p + 1)
        }
        b'0'..=b'9' => {
            let colon = pos + b[pos..].iter().position(|&c| c == b':')?;
            let len: usize = std::str::from_utf8(&b[pos..colon]).ok()?.parse().ok()?;
            let end = colon.checked_add(1)?.checked_add(len)?;
            (end <= b.len()).then_some(end)
        }
        _ => None,
    }
}

/// The raw bytes of the top-level `info` value of a `.torrent` (what the info hash is the
/// SHA-1 of), if it has one.
pub fn raw_info(torrent: &[u8]) -> Option<&[u8]> {
    if torrent.first() != Some(&b'd') {
        return None;
    }
    let mut p = 1;
    while *torrent.get(p)? != b'e' {
        let key_end = value_end(torrent, p, 0)?;
        let value = key_end;
        let end = value_end(torrent, value, 0)?;
        if &torrent[p..key_end] == b"4:info" {
            return Some(&torrent[value..end]);
        }
        p = end;
    }
    None
}

/// Our BEP 10 handshake payload: `ut_metadata` offered when `metadata_size > 0`.
pub fn our_handshake(reqq: usize, metadata_size: usize) -> Vec<u8> {
    let v = concat!("iolab-hekate ", env!("CARGO_PKG_VERSION"));
    if metadata_size == 0 {
        return format!("d1:mde4:reqqi{reqq}e1:v{}:{v}e", v.len()).into_bytes();
    }
    format!(
        "d1:md11:ut_metadatai{UT_METADATA_ID}ee13:metadata_sizei{metadata_size}e4:reqqi{reqq}e1:v{}:{v}e",
        v.len()
    )
    .into_bytes()
}

fn dict_get<'a>(d: &'a BencodeElem, key: &str) -> Option<&'a BencodeElem> {
    match d {
        BencodeElem::Dictionary(m) => m.get(key),
        BencodeElem::RawDictionary(m) => m.get(key.as_bytes()),
        _ => None,
    }
}

fn int(e: Option<&BencodeElem>) -> Option<i64> {
    match e {
        Some(BencodeElem::Integer(i)) => Some(*i),
        _ => None,
    }
}

/// A peer's BEP 10 handshake: `Err` if it is not a bencoded dictionary; else the id the
/// peer wants its `ut_metadata` messages sent with (`None`: it does not take them).
pub fn peer_handshake(payload: &[u8]) -> Result<Option<u8>, String> {
    let v = BencodeElem::from_bytes(payload)
        .map_err(|_| "extension handshake is not bencode".to_string())?;
    let [d @ (BencodeElem::Dictionary(_) | BencodeElem::RawDictionary(_))] = v.as_slice() else {
        return Err("extension handshake is not a bencoded dictionary".into());
    };
    let id = dict_get(d, "m")
        .and_then(|m| int(dict_get(m, "ut_metadata")))
        .filter(|&i| (1..=255).contains(&i))
        .map(|i| i as u8);
    Ok(id)
}

/// A `ut_metadata` message to us: `Some(piece)` for a request; `None` for what we ignore
/// (data, reject: we never ask); `Err` if it is not a bencoded dictionary with a
/// `msg_type`.
pub fn parse_message(payload: &[u8]) -> Result<Option<u32>, String> {
    // The dictionary may be followed by piece data: parse only the dictionary.
    let end = value_end(payload, 0, 0).ok_or("ut_metadata message is not bencode")?;
    let v = BencodeElem::from_bytes(&payload[..end])
        .map_err(|_| "ut_metadata message is not bencode".to_string())?;
    let d = v.first().ok_or("empty ut_metadata message")?;
    let kind = int(dict_get(d, "msg_type")).ok_or("ut_metadata message without msg_type")?;
    if kind != 0 {
        return Ok(None);
    }
    let piece = int(dict_get(d, "piece")).ok_or("ut_metadata request without piece")?;
    Ok(Some(piece.clamp(-1, u32::MAX as i64) as u32))
}

/// Our answer to a request for `piece` of `info`: the piece (`msg_type` 1) or a reject
/// (`msg_type` 2) when it is out of range.
pub fn answer(info: &[u8], piece: u32) -> Vec<u8> {
    let start = piece as usize * METADATA_PIECE;
    if info.is_empty() || start >= info.len() {
        return format!("d8:msg_typei2e5:piecei{piece}ee").into_bytes();
    }
    let end = (start + METADATA_PIECE).min(info.len());
    let mut out = format!(
        "d8:msg_typei1e5:piecei{piece}e10:total_sizei{}ee",
        info.len()
    )
    .into_bytes();
    out.extend_from_slice(&info[start..end]);
    out
}

/// The BEP 9 magnet link of a torrent: `xt=urn:btih:` (hex), `dn`, one `tr` per tracker.
pub fn magnet(info_hash_hex: &str, name: &str, trackers: &[String]) -> String {
    magnet_of(&format!("btih:{info_hash_hex}"), name, trackers)
}

/// The magnet link of a v2-only torrent (BEP 52): `xt=urn:btmh:` and the multihash of its
/// SHA-256 info hash (`12` SHA-256, `20` 32 bytes, then the hash in hex).
pub fn magnet_v2(sha256_hex: &str, name: &str, trackers: &[String]) -> String {
    magnet_of(&format!("btmh:1220{sha256_hex}"), name, trackers)
}

/// The magnet link of a hybrid torrent (BEP 52): both `xt`s, v1's first, so a v1 client and
/// a v2 client each find the hash they use.
pub fn magnet_hybrid(
    info_hash_hex: &str,
    sha256_hex: &str,
    name: &str,
    trackers: &[String],
) -> String {
    magnet_of(
        &format!("btih:{info_hash_hex}&xt=urn:btmh:1220{sha256_hex}"),
        name,
        trackers,
    )
}

fn magnet_of(urn: &str, name: &str, trackers: &[String]) -> String {
    let mut m = format!(
        "magnet:?xt=urn:{urn}&dn={}",
        utf8_percent_encode(name, NON_ALPHANUMERIC)
    );
    for t in trackers {
        m.push_str("&tr=");
        m.push_str(&utf8_percent_encode(t, NON_ALPHANUMERIC).to_string());
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_info_is_the_info_value() {
        let t = b"d8:announce3:url4:infod4:name1:x6:lengthi3ee1:zi1ee";
        assert_eq!(raw_info(t), Some(&b"d4:name1:x6:lengthi3ee"[..]));
        assert_eq!(raw_info(b"d4:infod"), None, "truncated");
        assert_eq!(raw_info(b"d3:fooi1ee"), None);
        assert_eq!(raw_info(b"d9999999999999999999:x"), None);
        assert_eq!(raw_info(&[b'l'; 100_000]), None, "bounded depth");
    }

    #[test]
    fn requests_answers_and_rejects() {
        let info = vec![7u8; METADATA_PIECE + 10];
        assert_eq!(parse_message(b"d8:msg_typei0e5:piecei1ee"), Ok(Some(1)));
        assert_eq!(
            parse_message(b"d8:msg_typei1e5:piecei0e10:total_sizei3eexyz"),
            Ok(None)
        );
        assert!(parse_message(b"i5e").is_err());
        assert!(parse_message(b"junk").is_err());
        let a = answer(&info, 1);
        let head = b"d8:msg_typei1e5:piecei1e10:total_sizei16394ee";
        assert_eq!(&a[..head.len()], head);
        assert_eq!(a.len() - head.len(), 10, "the last piece is short");
        assert_eq!(answer(&info, 2), b"d8:msg_typei2e5:piecei2ee".to_vec());
        assert_eq!(
            answer(&info, u32::MAX),
            b"d8:msg_typei2e5:piecei4294967295ee".to_vec()
        );
        assert_eq!(peer_handshake(b"d1:md11:ut_metadatai3eee"), Ok(Some(3)));
        assert_eq!(peer_handshake(b"d1:md11:ut_metadatai0eee"), Ok(None));
        assert!(peer_handshake(b"li1ee").is_err());
    }

    #[test]
    fn magnet_links() {
        assert_eq!(
            magnet("ab", "a b", &["udp://t:1".into()]),
            "magnet:?xt=urn:btih:ab&dn=a%20b&tr=udp%3A%2F%2Ft%3A1"
        );
        assert_eq!(
            magnet_v2(&"cd".repeat(32), "x", &[]),
            format!("magnet:?xt=urn:btmh:1220{}&dn=x", "cd".repeat(32))
        );
        assert_eq!(
            magnet_hybrid("ab", &"cd".repeat(32), "x", &[]),
            format!(
                "magnet:?xt=urn:btih:ab&xt=urn:btmh:1220{}&dn=x",
                "cd".repeat(32)
            )
        );
    }
}
