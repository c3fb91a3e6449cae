//! A set of page indices kept as 64-page words, in index order: the page cache's per-file
//! dirty set. A buffered write dirties runs of consecutive pages and write-back takes them
//! back in runs, so a word usually answers for a whole run where a `BTreeSet<u64>` searched
//! its tree once per page (a fifth of a buffered write's simulation).

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};

#[derive(Debug, Default, Clone)]
pub struct PageSet {
    /// Word number (index / 64) → bit `index % 64` set for each member; no empty words.
    words: BTreeMap<u64, u64>,
    len: u64,
}

impl PageSet {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[cfg(test)]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Adds `index`; true if it was not there.
    #[cfg(test)]
    pub fn insert(&mut self, index: u64) -> bool {
        let w = self.words.entry(index / 64).or_insert(0);
        let bit = 1u64 << (index % 64);
        let new = *w & bit == 0;
        *w |= bit;
        self.len += u64::from(new);
        new
    }

    /// Adds every index of `[lo, hi)`: one lookup per 64-page word.
    pub fn insert_range(&mut self, lo: u64, hi: u64) {
        self.update_range(lo, hi, |w, m| *w | m);
    }

    /// Removes every index of `[lo, hi)`.
    pub fn remove_range(&mut self, lo: u64, hi: u64) {
        self.update_range(lo, hi, |w, m| *w & !m);
    }

    fn update_range(&mut self, lo: u64, hi: u64, f: impl Fn(&u64, u64) -> u64) {
        let mut i = lo;
        while i < hi {
            let n = i / 64;
            let end = hi.min((n + 1) * 64);
            let width = end - i;
            let mask = if width == 64 {
                u64::MAX
            } else {
                ((1u64 << width) - 1) << (i % 64)
            };
            let old = self.words.get(&n).copied().unwrap_or(0);
            let new = f(&old, mask);
            if new != old {
                self.len = self.len + u64::from(new.count_ones()) - u64::from(old.count_ones());
                if new == 0 {
                    self.words.remove(&n);
                } else {
                    self.words.insert(n, new);
                }
            }
            i = end;
        }
    }

    /// Removes `index`; true if it was there.
    #[cfg(test)]
    pub fn remove(&mut self, index: u64) -> bool {
        let Some(w) = self.words.get_mut(&(index / 64)) else {
            return false;
        };
        let bit = 1u64 << (index % 64);
        if *w & bit == 0 {
            return false;
        }
        *w &= !bit;
        if *w == 0 {
            self.words.remove(&(index / 64));
        }
        self.len -= 1;
        true
    }

    #[cfg(test)]
    pub fn contains(&self, index: u64) -> bool {
        self.words
            .get(&(index / 64))
            .is_some_and(|w| w & (1u64 << (index % 64)) != 0)
    }

    /// The members within `range`, in increasing order.
    pub fn range(&self, range: impl RangeBounds<u64>) -> impl Iterator<Item = u64> + '_ {
        let lo = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        // exclusive upper end; u64::MAX itself is no page index anyone uses
        let hi = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => u64::MAX,
        };
        let words = if lo < hi {
            Some(self.words.range(lo / 64..=(hi - 1) / 64))
        } else {
            None
        };
        words.into_iter().flatten().flat_map(move |(&n, &w)| {
            let base = n * 64;
            let mut bits = w;
            // keep only the bits inside [lo, hi)
            if base < lo {
                bits &= u64::MAX << (lo - base);
            }
            if hi - base < 64 {
                bits &= (1u64 << (hi - base)) - 1;
            }
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                Some(base + u64::from(b))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Against `BTreeSet` on a pseudo-random sequence of inserts, removes and range queries
    /// (word edges, empty and reversed ranges included).
    #[test]
    fn behaves_as_a_btreeset() {
        let mut s = PageSet::default();
        let mut r = BTreeSet::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let i = next() % 700;
            match next() % 4 {
                0 | 1 => assert_eq!(s.insert(i), r.insert(i)),
                2 => assert_eq!(s.remove(i), r.remove(&i)),
                3 if next() % 4 == 0 => {
                    let (a, b) = (next() % 720, next() % 720);
                    if next() % 2 == 0 {
                        s.insert_range(a, b);
                        r.extend(a..b);
                    } else {
                        s.remove_range(a, b);
                        r.retain(|x| !(a..b).contains(x));
                    }
                }
                _ => {
                    let (a, b) = (next() % 720, next() % 720);
                    let got: Vec<u64> = s.range(a..b).collect();
                    let want: Vec<u64> = if a < b {
                        r.range(a..b).copied().collect()
                    } else {
                        Vec::new()
                    };
                    assert_eq!(got, want, "range {a}..{b}");
                    let got: Vec<u64> = s.range(..a).take(5).collect();
                    let want: Vec<u64> = r.range(..a).take(5).copied().collect();
                    assert_eq!(got, want);
                    let got: Vec<u64> = s.range(a..).collect();
                    let want: Vec<u64> = r.range(a..).copied().collect();
                    assert_eq!(got, want);
                }
            }
            assert_eq!(s.len(), r.len() as u64);
            assert_eq!(s.is_empty(), r.is_empty());
            assert_eq!(s.contains(i), r.contains(&i));
        }
        assert!(s.range(5..5).next().is_none());
        s.insert(u64::MAX - 1);
        assert_eq!(s.range(u64::MAX - 1..).collect::<Vec<_>>(), [u64::MAX - 1]);
    }
}
