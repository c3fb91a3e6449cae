//! DISC-PROT for HTTP/1.1 (seed 004 §3.4): two header fields.
//!
//! **Request, `X-Disc-Path: nb=<NB_TIER>;bypass=<BYPASSED_TIERS hex>`.** The first tier
//! (the one holding the client's connection) removes any such field the client sent and
//! writes `nb=1`, bit 0 set if it accepts to be bypassed for the payload of the answer. Every
//! following proxy increments `nb` and sets bit `nb` (its own index) if it accepts. The last
//! server (the BE) therefore receives `nb` = the number of tiers before it, and bit `i` says
//! whether tier `i` accepts. This is the seed's NB_TIER / BYPASSED_TIERS generalisation: a
//! chain of any length (up to 64 tiers, the bitmap's width), each tier deciding per request.
//!
//! **Response, `X-Disc: id=<payload id>;size=<bytes>;last=<ip:port>;fe=<tier>`.** Set by the
//! BE when it keeps the payload (the shortcut). The head keeps the real `Content-Length` (the
//! client must see it), but no body follows on any hop that carries this field. `last` is the
//! BE's DP endpoint, `fe` the index of the tier that plays the FE role (it asks DP for the
//! payload; every tier after it only relays the head). The FE role removes the field before
//! the head goes further up.
//!
//! **Policy** ([`Policy`]): a payload takes the shortcut only if it is at least `threshold`
//! bytes (default 16 KiB, the seed's crossover) and every tier on the path accepts
//! (`fe == 0`); anything else is answered on the normal path. A tier that cannot get the
//! payload from DP before writing the first payload byte re-asks with its bit cleared (the
//! fallback, in [`crate::proxy`]).

use std::fmt;
use std::net::SocketAddr;

/// Request field carrying NB_TIER and BYPASSED_TIERS.
pub const PATH_FIELD: &str = "X-Disc-Path";
/// Response field of a shortcut payload.
pub const DISC_FIELD: &str = "X-Disc";
/// Smallest payload taking the shortcut by default (seed 004: the gain starts around 16 KiB).
pub const DEFAULT_THRESHOLD: u64 = 16 * 1024;
/// Most tiers a path can have (the bitmap's width).
pub const MAX_TIERS: u32 = 64;
/// Longest field value accepted; longer is a protocol error.
pub const MAX_VALUE: usize = 200;

/// Malformed DISC field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoError(pub String);

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DISC header: {}", self.0)
    }
}

impl std::error::Error for ProtoError {}

fn err<T>(s: impl Into<String>) -> Result<T, ProtoError> {
    Err(ProtoError(s.into()))
}

/// Calls `f` with each `k=v` pair of a field value `k=v;k=v` (ASCII, bounded), in order.
fn each_pair<'v>(
    value: &'v [u8],
    mut f: impl FnMut(&'v str, &'v str) -> Result<(), ProtoError>,
) -> Result<(), ProtoError> {
    if value.len() > MAX_VALUE {
        return err(format!("value longer than {MAX_VALUE} bytes"));
    }
    let s = std::str::from_utf8(value).or_else(|_| err("not ASCII"))?;
    for part in s.split(';') {
        let part = part.trim_ascii();
        if part.is_empty() {
            continue;
        }
        let Some((k, v)) = part.split_once('=') else {
            return err(format!("`{part}` is not key=value"));
        };
        f(k.trim_ascii(), v.trim_ascii())?;
    }
    Ok(())
}

fn mask(n: u32) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// NB_TIER and BYPASSED_TIERS as a request carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathInfo {
    /// Tiers before the receiver (the receiver's own index).
    pub nb_tier: u32,
    /// Bit i: tier i accepts to be bypassed for this request's payload.
    pub bypassed: u64,
}

impl PathInfo {
    /// What the first tier sends.
    pub fn first(accept: bool) -> PathInfo {
        PathInfo {
            nb_tier: 1,
            bypassed: u64::from(accept),
        }
    }

    /// What a tier that received `self` sends on (its own bit set if it accepts); None when
    /// the path would exceed [`MAX_TIERS`] (the tier then sends no field: no shortcut).
    pub fn forward(self, accept: bool) -> Option<PathInfo> {
        if self.nb_tier >= MAX_TIERS {
            return None;
        }
        Some(PathInfo {
            nb_tier: self.nb_tier + 1,
            bypassed: self.bypassed | (u64::from(accept) << self.nb_tier),
        })
    }

    /// Every tier before the receiver accepts.
    pub fn all_accept(&self) -> bool {
        self.nb_tier > 0 && self.bypassed & mask(self.nb_tier) == mask(self.nb_tier)
    }

    /// Seen from the last server: the tier that would play the FE role, i.e. the lowest
    /// index of the run of accepting tiers that ends just before the receiver (seed 004
    /// §3.4.3: the payload bypasses exactly that run). None if the previous tier refuses.
    pub fn fe_tier(&self) -> Option<u32> {
        if self.nb_tier == 0 {
            return None;
        }
        let mut i = self.nb_tier;
        while i > 0 && self.bypassed & (1u64 << (i - 1)) != 0 {
            i -= 1;
        }
        (i < self.nb_tier).then_some(i)
    }

    pub fn parse(value: &[u8]) -> Result<PathInfo, ProtoError> {
        let (mut nb, mut bits) = (None, None);
        each_pair(value, |k, v| {
            match k {
                "nb" => nb = Some(v.parse::<u32>().or_else(|_| err("nb is not a number"))?),
                "bypass" => {
                    bits = Some(u64::from_str_radix(v, 16).or_else(|_| err("bypass is not hex"))?)
                }
                _ => {} // unknown keys: ignored (later versions may add some)
            }
            Ok(())
        })?;
        let (Some(nb_tier), Some(bypassed)) = (nb, bits) else {
            return err("nb and bypass are required");
        };
        if nb_tier == 0 || nb_tier > MAX_TIERS {
            return err(format!("nb must be 1..={MAX_TIERS}"));
        }
        if bypassed & !mask(nb_tier) != 0 {
            return err("bypass has bits beyond nb");
        }
        Ok(PathInfo { nb_tier, bypassed })
    }
}

/// The field's value (what [`PathInfo::parse`] reads), for `write!` without a `String`.
impl fmt::Display for PathInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nb={};bypass={:x}", self.nb_tier, self.bypassed)
    }
}

/// A shortcut payload as the response head announces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disc {
    pub id: u64,
    pub size: u64,
    /// The BE's DP endpoint.
    pub last: SocketAddr,
    /// Index of the tier playing the FE role.
    pub fe: u32,
}

impl Disc {
    pub fn parse(value: &[u8]) -> Result<Disc, ProtoError> {
        let (mut id, mut size, mut last, mut fe) = (None, None, None, None);
        each_pair(value, |k, v| {
            match k {
                "id" => id = Some(v.parse::<u64>().or_else(|_| err("id is not a number"))?),
                "size" => size = Some(v.parse::<u64>().or_else(|_| err("size is not a number"))?),
                "last" => {
                    last = Some(
                        v.parse::<SocketAddr>()
                            .or_else(|_| err("last is not ip:port"))?,
                    )
                }
                "fe" => fe = Some(v.parse::<u32>().or_else(|_| err("fe is not a number"))?),
                _ => {}
            }
            Ok(())
        })?;
        match (id, size, last, fe) {
            (Some(id), Some(size), Some(last), Some(fe)) if fe < MAX_TIERS => {
                Ok(Disc { id, size, last, fe })
            }
            (Some(_), Some(_), Some(_), Some(_)) => err("fe out of range"),
            _ => err("id, size, last and fe are required"),
        }
    }
}

/// The field's value (what [`Disc::parse`] reads), for `write!` without a `String`.
impl fmt::Display for Disc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "id={};size={};last={};fe={}",
            self.id, self.size, self.last, self.fe
        )
    }
}

/// The BE's decision rule.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Smallest payload shortcut.
    pub threshold: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            threshold: DEFAULT_THRESHOLD,
        }
    }
}

impl Policy {
    /// Whether a payload of `size` bytes for a request that carried `path` takes the
    /// shortcut: big enough, and every tier on the path accepts.
    pub fn shortcut(&self, path: Option<PathInfo>, size: u64) -> bool {
        size >= self.threshold && path.is_some_and(|p| p.all_accept())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_built_hop_by_hop() {
        // First accepts, Inter1 refuses, Inter2 accepts: the seed's Figure 3.6.
        let p = PathInfo::first(true);
        let p = p.forward(false).unwrap();
        let p = p.forward(true).unwrap();
        assert_eq!(p.nb_tier, 3);
        assert_eq!(p.bypassed, 0b101);
        assert!(!p.all_accept());
        // Last bypasses Inter2 only: Inter2 plays FE.
        assert_eq!(p.fe_tier(), Some(2));
        assert_eq!(PathInfo::parse(p.to_string().as_bytes()).unwrap(), p);

        let all = PathInfo::first(true).forward(true).unwrap();
        assert!(all.all_accept());
        assert_eq!(all.fe_tier(), Some(0));
        let refused = PathInfo::first(true).forward(true).unwrap().forward(false);
        assert_eq!(refused.unwrap().fe_tier(), None);
        assert_eq!(PathInfo::first(false).fe_tier(), None);
    }

    #[test]
    fn sixty_four_tiers_and_no_more() {
        let mut p = PathInfo::first(true);
        for _ in 1..64 {
            p = p.forward(true).unwrap();
        }
        assert_eq!(p.nb_tier, 64);
        assert!(p.all_accept());
        assert_eq!(p.fe_tier(), Some(0));
        assert_eq!(PathInfo::parse(p.to_string().as_bytes()).unwrap(), p);
        assert!(p.forward(true).is_none());
    }

    #[test]
    fn malformed_values_are_errors() {
        for bad in [
            &b""[..],
            b"nb=1",
            b"nb=0;bypass=0",
            b"nb=65;bypass=1",
            b"nb=1;bypass=2",
            b"nb=x;bypass=1",
            b"nb=1;bypass=zz",
            b"garbage",
            b"nb=1;bypass=1\xff",
        ] {
            assert!(PathInfo::parse(bad).is_err(), "{:?}", bad);
        }
        assert!(PathInfo::parse(&[b'a'; 300]).is_err());
        for bad in [
            &b"id=1;size=2;last=1.2.3.4:5"[..],
            b"id=1;size=2;last=nowhere;fe=0",
            b"id=1;size=-2;last=1.2.3.4:5;fe=0",
            b"id=1;size=2;last=1.2.3.4:5;fe=64",
        ] {
            assert!(Disc::parse(bad).is_err(), "{:?}", bad);
        }
        let d = Disc {
            id: 7,
            size: 1 << 40,
            last: "10.0.0.1:9".parse().unwrap(),
            fe: 0,
        };
        assert_eq!(Disc::parse(d.to_string().as_bytes()).unwrap(), d);
    }

    #[test]
    fn random_bytes_never_panic() {
        use rand::Rng;
        let mut rng = rand::rng();
        let alphabet = b"nbypasidzelft=;:.0123456789abcdefx \xff";
        for _ in 0..200_000 {
            let n = rng.random_range(0..40);
            let v: Vec<u8> = (0..n)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            if let Ok(p) = PathInfo::parse(&v) {
                assert!(p.nb_tier >= 1 && p.nb_tier <= MAX_TIERS);
                assert_eq!(PathInfo::parse(p.to_string().as_bytes()).unwrap(), p);
            }
            let _ = Disc::parse(&v);
        }
    }

    #[test]
    fn the_policy_needs_size_and_every_tier() {
        let pol = Policy::default();
        let all = Some(PathInfo::first(true).forward(true).unwrap());
        assert!(pol.shortcut(all, 16 * 1024));
        assert!(!pol.shortcut(all, 16 * 1024 - 1));
        assert!(!pol.shortcut(None, 1 << 20));
        let one_refuses = Some(PathInfo::first(false).forward(true).unwrap());
        assert!(!pol.shortcut(one_refuses, 1 << 20));
    }
}
