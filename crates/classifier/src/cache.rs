//! The microflow cache's structure: an exact-match cache of whole [`Fields`] keys in sets
//! of 1, 2 or 4 ways, a 32-bit signature per slot checked before the full key, and
//! tree pseudo-LRU replacement within a set. One per worker: nothing is shared, nothing is
//! locked.
//!
//! A signature match with a different key is a collision: counted, and a miss. The
//! signature's top bit is always set, so an empty slot (signature 0) never matches.

use crate::fields::Fields;

/// A cache's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub inserts: u64,
    /// Inserts that pushed a valid entry out.
    pub evictions: u64,
    /// Lookups that met a slot with their signature but another key.
    pub collisions: u64,
}

/// Why a cache could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSizeError(pub String);

impl std::fmt::Display for CacheSizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CacheSizeError {}

/// See the module documentation. `V` is what a hit returns (a reference into the Action
/// Table, in the pipeline).
#[derive(Clone)]
pub struct MicroflowCache<V: Copy> {
    ways: usize,
    set_mask: usize,
    seed: u64,
    slots: Vec<Slot<V>>,
    /// Per set: tree pseudo-LRU bits, each pointing to the less recently used side.
    lru: Vec<u8>,
    pub stats: CacheStats,
}

/// One way of a set: signature, value and key together, so that a hit reads two adjacent
/// cache lines (and a batch can warm them before it looks).
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Slot<V: Copy> {
    signature: u32,
    value: V,
    key: Fields,
}

impl<V: Copy + Default> MicroflowCache<V> {
    /// A cache of `entries` slots (a power of two, at least `ways`) in sets of `ways` (1,
    /// 2 or 4), hashing with `seed`.
    pub fn new(entries: usize, ways: usize, seed: u64) -> Result<Self, CacheSizeError> {
        Self::bytes_for(entries, ways)?;
        Ok(MicroflowCache {
            ways,
            set_mask: entries / ways - 1,
            seed,
            // Huge pages where the system gives them: a big cache on 4 KiB pages pays a
            // page walk on most probes.
            slots: stateplane_mem::huge_vec(entries, Slot::default(), true).0,
            lru: vec![0; entries / ways],
            stats: CacheStats::default(),
        })
    }

    /// The bytes a cache of `entries` in sets of `ways` takes, or why it cannot be made
    /// (what [`MicroflowCache::new`] checks), so that a run can claim them first.
    pub fn bytes_for(entries: usize, ways: usize) -> Result<u64, CacheSizeError> {
        if ![1, 2, 4].contains(&ways) {
            return Err(CacheSizeError(format!(
                "{ways} ways: a set has 1, 2 or 4 ways"
            )));
        }
        if !entries.is_power_of_two() || entries < ways || entries > 1 << 28 {
            return Err(CacheSizeError(format!(
                "{entries} entries: give a power of two from {ways} to 268435456"
            )));
        }
        Ok((entries * std::mem::size_of::<Slot<V>>() + entries / ways) as u64)
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Starts loading `hash`'s set into the CPU cache, so that the lookup that follows
    /// finds it there: done for a whole burst before its lookups, the memory reads of
    /// different packets overlap instead of stalling one packet at a time.
    #[inline]
    pub fn warm(&self, hash: u64) {
        let (set, _) = self.place(hash);
        let first = set * self.ways;
        for slot in &self.slots[first..first + self.ways] {
            // A slot is two lines: signature and key's first half, then the rest.
            stateplane_mem::prefetch_whole(slot);
        }
    }

    pub fn ways(&self) -> usize {
        self.ways
    }

    /// The hash a lookup and an insert of `key` take (computed once per packet).
    #[inline]
    pub fn hash(&self, key: &Fields) -> u64 {
        key.words()
            .into_iter()
            .fold(self.seed ^ 0x9e37_79b9_7f4a_7c15, crate::fields::fold)
    }

    #[inline]
    fn place(&self, hash: u64) -> (usize, u32) {
        let set = (hash as usize) & self.set_mask;
        (set, (hash >> 32) as u32 | 1 << 31)
    }

    /// The value cached for `key` (whose hash is `hash`), counting a hit or a miss.
    #[inline]
    pub fn lookup(&mut self, hash: u64, key: &Fields) -> Option<V> {
        let (set, sig) = self.place(hash);
        let first = set * self.ways;
        for way in 0..self.ways {
            let slot = &self.slots[first + way];
            if slot.signature != sig {
                continue;
            }
            if slot.key == *key {
                let value = slot.value;
                self.touch(set, way);
                self.stats.hits += 1;
                return Some(value);
            }
            self.stats.collisions += 1;
        }
        self.stats.misses += 1;
        None
    }

    /// Caches `value` for `key`: in place of the key's old entry, else in an empty way,
    /// else over the set's least recently used way.
    pub fn insert(&mut self, hash: u64, key: &Fields, value: V) {
        let (set, sig) = self.place(hash);
        let first = set * self.ways;
        let slots = first..first + self.ways;
        let way = slots
            .clone()
            .position(|i| self.slots[i].signature == sig && self.slots[i].key == *key)
            .or_else(|| slots.clone().position(|i| self.slots[i].signature == 0))
            .unwrap_or_else(|| {
                self.stats.evictions += 1;
                self.victim(set)
            });
        self.slots[first + way] = Slot {
            signature: sig,
            value,
            key: *key,
        };
        self.touch(set, way);
        self.stats.inserts += 1;
    }

    /// Whether `key` is cached (counts nothing, touches nothing).
    pub fn contains(&self, hash: u64, key: &Fields) -> bool {
        let (set, sig) = self.place(hash);
        let first = set * self.ways;
        (first..first + self.ways)
            .any(|i| self.slots[i].signature == sig && self.slots[i].key == *key)
    }

    /// Forgets `key`; whether it was cached.
    pub fn remove(&mut self, hash: u64, key: &Fields) -> bool {
        let (set, sig) = self.place(hash);
        let first = set * self.ways;
        for slot in &mut self.slots[first..first + self.ways] {
            if slot.signature == sig && slot.key == *key {
                slot.signature = 0;
                return true;
            }
        }
        false
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        for slot in &mut self.slots {
            slot.signature = 0;
        }
    }

    /// Marks `way` of `set` most recently used: every bit on its path points away from it.
    #[inline]
    fn touch(&mut self, set: usize, way: usize) {
        let bits = &mut self.lru[set];
        match self.ways {
            2 => *bits = (1 - way) as u8,
            4 => {
                // Bit 0: the root (0: the left pair is less recent); bit 1: within the left
                // pair; bit 2: within the right pair.
                if way < 2 {
                    *bits = (*bits & !0b011) | 0b001 | (((1 - way) as u8) << 1);
                } else {
                    *bits = (*bits & !0b101) | (((3 - way) as u8) << 2);
                }
            }
            _ => {}
        }
    }

    /// The way the set's bits point to.
    fn victim(&self, set: usize) -> usize {
        let bits = self.lru[set];
        match self.ways {
            2 => usize::from(bits & 1),
            4 if bits & 1 == 0 => usize::from(bits >> 1 & 1),
            4 => 2 + usize::from(bits >> 2 & 1),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn key(n: u16) -> Fields {
        Fields {
            tp_dst: n,
            eth_type: 0x0800,
            ..Fields::default()
        }
    }

    #[test]
    fn a_signature_match_with_another_key_is_a_counted_miss() {
        let mut c: MicroflowCache<u32> = MicroflowCache::new(8, 2, 1).unwrap();
        // The same hash for two keys: same set, same signature.
        let h = 0xdead_beef_0000_0003;
        c.insert(h, &key(1), 10);
        c.insert(h, &key(2), 20);
        assert_eq!(c.lookup(h, &key(1)), Some(10));
        assert_eq!(c.lookup(h, &key(2)), Some(20));
        assert_eq!(c.lookup(h, &key(3)), None);
        assert_eq!(
            c.stats.collisions,
            1 + 2,
            "key 2's lookup passed key 1; key 3 met both"
        );
    }

    #[test]
    fn a_direct_mapped_cache_replaces_on_conflict() {
        let mut c: MicroflowCache<u32> = MicroflowCache::new(4, 1, 1).unwrap();
        let (h1, h2) = (0x1111_0000_0000_0001, 0x2222_0000_0000_0001);
        c.insert(h1, &key(1), 1);
        c.insert(h2, &key(2), 2);
        assert_eq!(c.lookup(h1, &key(1)), None);
        assert_eq!(c.lookup(h2, &key(2)), Some(2));
        assert_eq!(c.stats.evictions, 1);
    }

    #[test]
    fn four_ways_evict_the_pseudo_least_recently_used() {
        let mut c: MicroflowCache<u32> = MicroflowCache::new(4, 4, 1).unwrap();
        let h = |n: u64| n << 32; // one set, distinct signatures
        for n in 0..4u16 {
            c.insert(h(u64::from(n)), &key(n), u32::from(n));
        }
        // Used in the order 0 1 2 3; touching 0 and 2 leaves way 1 the least recent of the
        // left pair and the left pair the least recent side.
        c.lookup(h(0), &key(0));
        c.lookup(h(2), &key(2));
        c.insert(h(9), &key(9), 9);
        assert_eq!(c.lookup(h(1), &key(1)), None, "way 1 went");
        for n in [0u16, 2, 3, 9] {
            assert!(c.lookup(h(u64::from(n)), &key(n)).is_some(), "{n} stays");
        }
        // Two ways: the one not used last goes.
        let mut c2: MicroflowCache<u32> = MicroflowCache::new(2, 2, 1).unwrap();
        c2.insert(h(1), &key(1), 1);
        c2.insert(h(2), &key(2), 2);
        c2.lookup(h(1), &key(1));
        c2.insert(h(3), &key(3), 3);
        assert_eq!(c2.lookup(h(2), &key(2)), None);
        assert_eq!(c2.lookup(h(1), &key(1)), Some(1));
    }

    #[test]
    fn warming_a_set_changes_nothing() {
        for ways in [1, 2, 4] {
            let mut c: MicroflowCache<u32> = MicroflowCache::new(16, ways, 3).unwrap();
            let k = key(7);
            let h = c.hash(&k);
            c.warm(h);
            assert_eq!(c.lookup(h, &k), None);
            c.insert(h, &k, 9);
            for n in 0..64 {
                c.warm(c.hash(&key(n)));
            }
            assert_eq!(c.lookup(h, &k), Some(9));
        }
    }

    #[test]
    fn sizes_that_cannot_work_are_refused() {
        assert!(MicroflowCache::<u32>::new(8, 3, 1).is_err());
        assert!(MicroflowCache::<u32>::new(12, 2, 1).is_err());
        assert!(MicroflowCache::<u32>::new(2, 4, 1).is_err());
    }

    proptest! {
        /// Against a map: a hit always returns the value last inserted for that key, and a
        /// key just inserted is found; misses are allowed (that is a cache).
        #[test]
        fn never_a_wrong_hit(
            ops in proptest::collection::vec((0u16..64, any::<bool>(), any::<u32>()), 1..400),
            ways in prop::sample::select(vec![1usize, 2, 4]),
        ) {
            let mut c: MicroflowCache<u32> = MicroflowCache::new(16, ways, 7).unwrap();
            let mut model: HashMap<u16, u32> = HashMap::new();
            for (k, insert, v) in ops {
                let f = key(k);
                let h = c.hash(&f);
                if insert {
                    c.insert(h, &f, v);
                    model.insert(k, v);
                    prop_assert_eq!(c.lookup(h, &f), Some(v));
                } else if let Some(got) = c.lookup(h, &f) {
                    prop_assert_eq!(Some(&got), model.get(&k));
                }
            }
        }
    }
}
