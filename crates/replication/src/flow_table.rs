//! The replica's flows by key, each at a place that names it until the table grows or
//! loses a flow: a worker that looked a flow up when its packet was admitted finds it
//! again after the program by that place and one key compared, where a lookup hashes the
//! key and probes for it (the replica's second lookup of a packet).
//!
//! Must never: answer a place with another key's flow.

use hashbrown::HashTable;
use std::hash::{BuildHasher, Hash};

pub(crate) struct FlowTable<K, F> {
    table: HashTable<(K, F)>,
    hasher: foldhash::quality::RandomState,
}

impl<K, F> Default for FlowTable<K, F> {
    fn default() -> Self {
        FlowTable {
            table: HashTable::new(),
            hasher: foldhash::quality::RandomState::default(),
        }
    }
}

impl<K: Hash + Eq, F> FlowTable<K, F> {
    fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn get(&self, key: &K) -> Option<&F> {
        let found = self.table.find(self.hash(key), |(k, _)| k == key);
        found.map(|(_, flow)| flow)
    }

    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut F> {
        let hash = self.hash(key);
        let found = self.table.find_mut(hash, |(k, _)| k == key);
        found.map(|(_, flow)| flow)
    }

    /// `key`'s flow, made by `make` if there is none, and its place.
    pub(crate) fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> F) -> (&mut F, u32) {
        let hash = self.hasher.hash_one(&key);
        let hasher = &self.hasher;
        // Found without the insertion's bookkeeping (a flow's every packet but its first).
        let entry = match self.table.find_entry(hash, |(k, _)| *k == key) {
            Ok(entry) => entry,
            Err(absent) => (absent.into_table())
                .insert_unique(hash, (key, make()), |(k, _)| hasher.hash_one(k)),
        };
        // A table of more than 2^32 flows is past any park limit; such a place is never
        // found again ([`FlowTable::get_mut_at`] looks the key up).
        let place = u32::try_from(entry.bucket_index()).unwrap_or(u32::MAX);
        (&mut entry.into_mut().1, place)
    }

    /// `key`'s flow, looked for first at `place` (as [`FlowTable::get_or_insert_with`]
    /// gave it): any place is safe, one gone stale costs a lookup.
    pub(crate) fn get_mut_at(&mut self, place: u32, key: &K) -> Option<&mut F> {
        let table = match self.table.get_bucket_entry(place as usize) {
            Ok(entry) if entry.get().0 == *key => return Some(&mut entry.into_mut().1),
            Ok(entry) => entry.into_table(),
            Err(absent) => absent.into_table(),
        };
        let found = table.find_mut(self.hasher.hash_one(key), |(k, _)| k == key);
        found.map(|(_, flow)| flow)
    }

    pub(crate) fn remove(&mut self, key: &K) -> Option<F> {
        let hash = self.hash(key);
        let entry = self.table.find_entry(hash, |(k, _)| k == key).ok()?;
        Some(entry.remove().0.1)
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &F> {
        self.table.iter().map(|(_, flow)| flow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A place answers its key's flow, or looks the key up: never another key's flow,
    /// whatever the place (stale after the table grew or lost flows, another's, empty,
    /// out of range).
    #[test]
    fn a_place_finds_its_flow_or_looks_it_up() {
        let mut table: FlowTable<u32, u32> = FlowTable::default();
        let mut places = vec![u32::MAX; 500];
        let mut rng = 9u64;
        for round in 0..20_000u32 {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let key = (rng >> 33) as u32 % 500;
            if rng >> 62 == 0 {
                table.remove(&key);
            } else {
                let (flow, place) = table.get_or_insert_with(key, || key * 10);
                assert_eq!(*flow, key * 10);
                places[key as usize] = place;
            }
            let probe = (rng >> 13) as u32 % 500;
            let place = match round % 3 {
                0 => places[probe as usize],
                1 => (rng >> 20) as u32 % 1_200,
                _ => u32::MAX,
            };
            let want = table.get(&probe).copied();
            assert_eq!(
                table.get_mut_at(place, &probe).copied(),
                want,
                "{probe} at {place}"
            );
        }
        assert!(table.len() > 100);
        assert_eq!(table.values().count(), table.len());
    }
}
