//! One LRU list of the page cache (kernel `lruvec` lists): entries in the order they joined
//! the list, each at a position that does not change while it stays there.
//!
//! Every operation the page cache makes per page is O(1) (amortised): joining at the young
//! end, leaving from anywhere (by position), marking an entry reclaimable or not, and
//! finding the oldest entry and the oldest *reclaimable* one. Two ordered trees (the list by
//! position, and the reclaimable positions) did the same at O(log n) each, and took two
//! thirds of the simulator's time on a streaming read through a small cache.
//!
//! Invariants:
//! * `slots[i]` holds the entry at position `base + i`; `base` is a multiple of 64, so bit
//!   `i % 64` of `marks[i / 64]` is slot `i`'s reclaimable mark, and `live[i / 64]` counts
//!   the word's entries.
//! * A mark is set only on an occupied slot.
//! * Every word of `marks` before `first_marked` is zero.
//! * The young end is `base + slots.len()`: positions only grow, so an entry that joined
//!   later sits at a larger position (the list's order), until [`LruList::compact`]
//!   renumbers the entries (in the same order) and says so.

use std::collections::VecDeque;

const WORD: usize = 64;

#[derive(Debug)]
pub(crate) struct LruList<K> {
    base: u64,
    slots: VecDeque<Option<K>>,
    marks: VecDeque<u64>,
    live: VecDeque<u8>,
    len: usize,
    first_marked: usize,
}

impl<K: Copy> Default for LruList<K> {
    fn default() -> Self {
        LruList {
            base: 0,
            slots: VecDeque::new(),
            marks: VecDeque::new(),
            live: VecDeque::new(),
            len: 0,
            first_marked: 0,
        }
    }
}

impl<K: Copy> LruList<K> {
    /// Entries on the list.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn index(&self, pos: u64) -> Option<usize> {
        let i = usize::try_from(pos.checked_sub(self.base)?).ok()?;
        (i < self.slots.len()).then_some(i)
    }

    /// Adds `k` at the young end; returns its position.
    pub(crate) fn push(&mut self, k: K, reclaimable: bool) -> u64 {
        let i = self.slots.len();
        if i % WORD == 0 {
            self.marks.push_back(0);
            self.live.push_back(0);
        }
        self.slots.push_back(Some(k));
        self.live[i / WORD] += 1;
        self.len += 1;
        if reclaimable {
            self.mark(i, true);
        }
        self.base + i as u64
    }

    fn mark(&mut self, i: usize, on: bool) {
        let (w, bit) = (i / WORD, 1u64 << (i % WORD));
        if on {
            self.marks[w] |= bit;
            self.first_marked = self.first_marked.min(w);
        } else {
            self.marks[w] &= !bit;
        }
    }

    /// Takes the entry at `pos` off the list.
    pub(crate) fn remove(&mut self, pos: u64) -> Option<K> {
        let i = self.index(pos)?;
        let k = self.slots[i].take()?;
        self.mark(i, false);
        self.live[i / WORD] -= 1;
        self.len -= 1;
        if i < WORD {
            self.trim();
        }
        Some(k)
    }

    /// Drops the old end's words that hold no entry (never the word the young end is in).
    fn trim(&mut self) {
        while self.slots.len() > WORD && self.live.front() == Some(&0) {
            self.slots.drain(..WORD);
            self.marks.pop_front();
            self.live.pop_front();
            self.base += WORD as u64;
            self.first_marked = self.first_marked.saturating_sub(1);
        }
    }

    /// Marks the entry at `pos` reclaimable or not (a position outside the list: nothing
    /// happens). `pos` must hold an entry, as a cached page's own position always does: the
    /// slot is not read to check it outside debug builds (that read was the cache miss of a
    /// third of a write-back's time; the mark and the slot lie far apart in memory).
    pub(crate) fn set_reclaimable(&mut self, pos: u64, on: bool) {
        if let Some(i) = self.index(pos) {
            debug_assert!(self.slots[i].is_some(), "a mark on an empty slot");
            self.mark(i, on);
        }
    }

    /// The entry at `pos`.
    #[cfg(test)]
    pub(crate) fn get(&self, pos: u64) -> Option<K> {
        self.slots[self.index(pos)?]
    }

    /// The oldest entry.
    pub(crate) fn oldest(&self) -> Option<(u64, K)> {
        self.iter().next()
    }

    /// The oldest entry marked reclaimable.
    pub(crate) fn oldest_reclaimable(&mut self) -> Option<(u64, K)> {
        while self.first_marked < self.marks.len() && self.marks[self.first_marked] == 0 {
            self.first_marked += 1;
        }
        let w = self.first_marked;
        let word = *self.marks.get(w)?;
        let i = w * WORD + word.trailing_zeros() as usize;
        Some((self.base + i as u64, self.slots[i]?))
    }

    /// Entries from the oldest, with their positions.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, K)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, k)| Some((self.base + i as u64, (*k)?)))
    }

    /// Positions of the entries marked reclaimable, from the oldest.
    #[cfg(test)]
    pub(crate) fn reclaimable_positions(&self) -> impl Iterator<Item = u64> + '_ {
        self.marks.iter().enumerate().flat_map(move |(w, &word)| {
            (0..WORD)
                .filter(move |b| word & (1u64 << b) != 0)
                .map(move |b| self.base + (w * WORD + b) as u64)
        })
    }

    /// When fewer than a quarter of the slots hold an entry (entries that left from the
    /// middle leave holes), renumbers the entries from the old end, in order, calling
    /// `moved(entry, new position)` for each: the list's memory stays proportional to its
    /// entries, not to the entries it ever had.
    pub(crate) fn compact(&mut self, mut moved: impl FnMut(K, u64)) {
        if self.slots.len() <= 4 * WORD || self.slots.len() <= 4 * self.len {
            return;
        }
        let entries: Vec<(K, bool)> = (0..self.slots.len())
            .filter_map(|i| {
                let k = self.slots[i]?;
                Some((k, self.marks[i / WORD] & (1u64 << (i % WORD)) != 0))
            })
            .collect();
        self.slots.clear();
        self.marks.clear();
        self.live.clear();
        self.len = 0;
        self.first_marked = 0;
        for (k, reclaimable) in entries {
            let pos = self.push(k, reclaimable);
            moved(k, pos);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The list against two ordered maps doing the same, over a long pseudo-random mix of
    /// pushes, removals, marks and compactions (positions renumbered by compaction are
    /// followed through `moved`).
    #[test]
    fn behaves_as_an_ordered_map_of_positions() {
        let mut list = LruList::<u32>::default();
        // entry -> (position, reclaimable)
        let mut model: BTreeMap<u32, (u64, bool)> = BTreeMap::new();
        let mut next = 0u32;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for step in 0..50_000 {
            let keys: Vec<u32> = model.keys().copied().collect();
            match rnd(10) {
                0..=3 => {
                    let on = rnd(2) == 0;
                    let pos = list.push(next, on);
                    model.insert(next, (pos, on));
                    next += 1;
                }
                4..=7 if !keys.is_empty() => {
                    // Mostly from the old end, as eviction does.
                    let k = if rnd(3) == 0 {
                        keys[rnd(keys.len() as u64) as usize]
                    } else {
                        *model.iter().min_by_key(|(_, v)| v.0).unwrap().0
                    };
                    let (pos, _) = model.remove(&k).unwrap();
                    assert_eq!(list.remove(pos), Some(k));
                    assert_eq!(list.remove(pos), None);
                }
                8 if !keys.is_empty() => {
                    let k = keys[rnd(keys.len() as u64) as usize];
                    let on = rnd(2) == 0;
                    let e = model.get_mut(&k).unwrap();
                    e.1 = on;
                    list.set_reclaimable(e.0, on);
                }
                _ => list.compact(|k, pos| model.get_mut(&k).unwrap().0 = pos),
            }
            assert_eq!(list.len(), model.len());
            let mut by_pos: Vec<(u64, u32, bool)> =
                model.iter().map(|(&k, &(p, r))| (p, k, r)).collect();
            by_pos.sort();
            assert_eq!(list.oldest(), by_pos.first().map(|&(p, k, _)| (p, k)));
            let want = by_pos.iter().find(|e| e.2).map(|&(p, k, _)| (p, k));
            assert_eq!(list.oldest_reclaimable(), want, "step {step}");
            if step % 100 == 0 {
                let got: Vec<(u64, u32)> = list.iter().collect();
                let all: Vec<(u64, u32)> = by_pos.iter().map(|&(p, k, _)| (p, k)).collect();
                assert_eq!(got, all);
                let marked: Vec<u64> = list.reclaimable_positions().collect();
                let want: Vec<u64> = by_pos.iter().filter(|e| e.2).map(|e| e.0).collect();
                assert_eq!(marked, want);
                for &(p, k, _) in &by_pos {
                    assert_eq!(list.get(p), Some(k));
                }
            }
        }
        // The slots stay proportional to the entries (holes compacted away).
        list.compact(|k, pos| model.get_mut(&k).unwrap().0 = pos);
        assert!(list.slots.len() <= (4 * list.len()).max(4 * WORD) + WORD);
    }

    #[test]
    fn the_oldest_reclaimable_skips_entries_reclaim_may_not_take() {
        let mut list = LruList::<char>::default();
        let a = list.push('a', false);
        let b = list.push('b', true);
        let c = list.push('c', true);
        assert_eq!(list.oldest(), Some((a, 'a')));
        assert_eq!(list.oldest_reclaimable(), Some((b, 'b')));
        list.set_reclaimable(b, false);
        assert_eq!(list.oldest_reclaimable(), Some((c, 'c')));
        list.set_reclaimable(a, true);
        assert_eq!(list.oldest_reclaimable(), Some((a, 'a')));
        assert_eq!(list.remove(a), Some('a'));
        assert_eq!(list.oldest(), Some((b, 'b')));
        assert_eq!(list.oldest_reclaimable(), Some((c, 'c')));
    }
}
