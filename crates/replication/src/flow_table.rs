//! The replica's flows by key, each at a place that names it until the table grows or
//! loses a flow: a worker that looked a flow up when its packet was admitted finds it
//! again after the program by that place and one key compared, where a lookup hashes the
//! key and probes for it (the replica's second lookup of a packet).
//!
//! Beside them, a direct-mapped cache of flows marked steady: each with a time before
//! which nothing about its packets' admission can change but through the table, so that
//! a packet of such a flow is admitted with one probe and one key compared (the common
//! case of established flows), without the table's lookup.
//!
//! A flow's steady mark may also be told to the program ([`FlowTable::tell_program`]),
//! which then processes the flow's packets with nothing asked of the replica: every mark
//! made and taken away is reported, for every flow (the cache forgets marks, the
//! program's table does not).
//!
//! Must never: answer a place with another key's flow; keep a flow's steady mark past
//! any change to it (every access that could change a flow takes its mark away, but
//! [`FlowTable::get_mut_at`], whose caller restates it), in the cache or in the program.

use hashbrown::HashTable;
use std::hash::{BuildHasher, Hash};

#[cfg_attr(test, derive(Clone))]
pub(crate) struct FlowTable<K, F> {
    table: HashTable<(K, F)>,
    hasher: foldhash::quality::RandomState,
    /// The steady marks, at their key's hash (one a slot: a flow whose slot another takes
    /// is looked up in the table again).
    steady: Box<[Option<Steady<K>>]>,
    /// While the program is told of steady marks: the flows it holds marked.
    program: Option<ProgramMarks<K>>,
}

/// The flows marked steady in the program, and the marks made and taken away that it has
/// not been told of yet (in order: the last of a flow's stands).
#[derive(Clone)]
struct ProgramMarks<K> {
    marked: hashbrown::HashSet<K, foldhash::quality::RandomState>,
    untold: Vec<(K, Option<u64>)>,
}

/// A flow's steady mark: until `until_ns`, its place and the note the replica keeps with
/// it.
#[derive(Clone, Copy)]
struct Steady<K> {
    key: K,
    until_ns: u64,
    place: u32,
    note: u32,
}

/// Steady marks a table keeps (a power of two).
pub(crate) const STEADY_SLOTS: usize = 8192;

impl<K, F> FlowTable<K, F> {
    /// The bytes a table's steady marks take.
    pub(crate) const STEADY_BYTES: usize = STEADY_SLOTS * std::mem::size_of::<Option<Steady<K>>>();
}

impl<K: Copy, F> Default for FlowTable<K, F> {
    fn default() -> Self {
        FlowTable {
            table: HashTable::new(),
            hasher: foldhash::quality::RandomState::default(),
            steady: vec![None; STEADY_SLOTS].into_boxed_slice(),
            program: None,
        }
    }
}

impl<K: Hash + Eq + Copy, F> FlowTable<K, F> {
    fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    fn steady_slot(hash: u64) -> usize {
        hash as usize & (STEADY_SLOTS - 1)
    }

    /// Takes `key`'s steady mark away (if it has one) before its flow may change.
    fn unsteady(&mut self, hash: u64, key: &K) {
        let slot = &mut self.steady[Self::steady_slot(hash)];
        if slot.is_some_and(|s| s.key == *key) {
            *slot = None;
        }
        self.tell_unmarked(key);
    }

    /// Reports every steady mark made and taken away from now on
    /// ([`FlowTable::take_told`]); the program holds none now.
    pub(crate) fn tell_program(&mut self) {
        self.program = Some(ProgramMarks {
            marked: hashbrown::HashSet::with_hasher(self.hasher),
            untold: Vec::new(),
        });
    }

    /// The marks made (the flow's key and until when) and taken away (`None`) since the
    /// last call, in order, for the program.
    pub(crate) fn take_told(&mut self, out: &mut Vec<(K, Option<u64>)>) {
        if let Some(p) = &mut self.program {
            out.append(&mut p.untold);
        }
    }

    /// Tells the program `key` is steady until `until_ns` (the flow says so), its cache
    /// mark left as it is.
    pub(crate) fn tell_marked(&mut self, key: K, until_ns: u64) {
        if let Some(p) = &mut self.program {
            p.marked.insert(key);
            p.untold.push((key, Some(until_ns)));
        }
    }

    fn tell_unmarked(&mut self, key: &K) {
        if let Some(p) = &mut self.program
            && !p.marked.is_empty()
            && p.marked.remove(key)
        {
            p.untold.push((*key, None));
        }
    }

    /// `key`'s place and note if it is marked steady at `now_ns`.
    #[inline]
    pub(crate) fn steady(&self, key: &K, now_ns: u64) -> Option<(u32, u32)> {
        match &self.steady[Self::steady_slot(self.hash(key))] {
            Some(s) if s.key == *key && now_ns < s.until_ns => Some((s.place, s.note)),
            _ => None,
        }
    }

    /// Marks `key`, at `place`, steady until `until_ns`, with `note` (in place of the
    /// mark its slot had, whose flow is then found by a lookup).
    pub(crate) fn mark_steady(&mut self, key: K, place: u32, until_ns: u64, note: u32) {
        self.restate_steady(key, place, Some((until_ns, note)));
    }

    /// What [`FlowTable::get_mut_at`]'s caller must say of the flow it changed: steady
    /// until a time, with a note (`None`: not steady), so that its mark is made, kept or
    /// taken away.
    pub(crate) fn restate_steady(&mut self, key: K, place: u32, steady: Option<(u64, u32)>) {
        match steady {
            Some((until_ns, _)) => {
                if let Some(p) = &mut self.program {
                    p.marked.insert(key);
                    p.untold.push((key, Some(until_ns)));
                }
            }
            None => self.tell_unmarked(&key),
        }
        let slot = &mut self.steady[Self::steady_slot(self.hash(&key))];
        match (slot, steady) {
            (Some(s), Some((until_ns, note))) if s.key == key => {
                (s.until_ns, s.place, s.note) = (until_ns, place, note);
            }
            (slot, Some((until_ns, note))) => {
                *slot = Some(Steady {
                    key,
                    until_ns,
                    place,
                    note,
                });
            }
            (slot, None) => {
                if slot.is_some_and(|s| s.key == key) {
                    *slot = None;
                }
            }
        }
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
        self.unsteady(hash, key);
        let (_, flow) = self.table.find_mut(hash, |(k, _)| k == key)?;
        Some(flow)
    }

    /// `key`'s flow, made by `make` if there is none, and its place.
    pub(crate) fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> F) -> (&mut F, u32) {
        let hash = self.hash(&key);
        self.unsteady(hash, &key);
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

    /// `key`'s flow and its place, looked for first at `place` (as
    /// [`FlowTable::get_or_insert_with`] gave it): any place is safe, one gone stale costs
    /// a lookup. The flow's steady mark stays: the caller says what it is now with
    /// [`FlowTable::restate_steady`].
    pub(crate) fn get_mut_at(&mut self, place: u32, key: &K) -> Option<(&mut F, u32)> {
        let table = match self.table.get_bucket_entry(place as usize) {
            Ok(entry) if entry.get().0 == *key => return Some((&mut entry.into_mut().1, place)),
            Ok(entry) => entry.into_table(),
            Err(absent) => absent.into_table(),
        };
        let entry = table
            .find_entry(self.hasher.hash_one(key), |(k, _)| k == key)
            .ok()?;
        let place = u32::try_from(entry.bucket_index()).unwrap_or(u32::MAX);
        Some((&mut entry.into_mut().1, place))
    }

    pub(crate) fn remove(&mut self, key: &K) -> Option<F> {
        let hash = self.hash(key);
        self.unsteady(hash, key);
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
                table.get_mut_at(place, &probe).map(|(flow, _)| *flow),
                want,
                "{probe} at {place}"
            );
        }
        assert!(table.len() > 100);
        assert_eq!(table.values().count(), table.len());
    }

    /// A steady mark answers its key only, only before its time; every access that may
    /// change its flow takes it away but `get_mut_at` (whose caller restates it); a key
    /// whose slot another's mark takes is no longer steady.
    #[test]
    fn a_steady_mark_answers_its_key_until_its_time_and_goes_with_any_change() {
        let mut table: FlowTable<u32, u32> = FlowTable::default();
        for key in 0..3 {
            table.get_or_insert_with(key, || key);
        }
        table.mark_steady(1, 5, 100, 9);
        assert_eq!(table.steady(&1, 99), Some((5, 9)));
        assert_eq!(table.steady(&1, 100), None, "past its time");
        assert_eq!(table.steady(&2, 0), None, "another key");
        table.restate_steady(1, 6, Some((200, 8)));
        assert_eq!(table.steady(&1, 150), Some((6, 8)), "restated");
        let takers: [fn(&mut FlowTable<u32, u32>); 4] = [
            |t| {
                t.get_mut(&1);
            },
            |t| {
                t.get_or_insert_with(1, || 1);
            },
            |t| t.restate_steady(1, 0, None),
            |t| {
                t.remove(&1);
            },
        ];
        for (i, take) in takers.iter().enumerate() {
            table.get_or_insert_with(1, || 1);
            table.mark_steady(1, 5, 100, 9);
            assert!(table.get_mut_at(5, &1).is_some());
            assert_eq!(table.steady(&1, 0), Some((5, 9)), "get_mut_at leaves it");
            take(&mut table);
            assert_eq!(table.steady(&1, 0), None, "taker {i}");
        }
        let slot_of =
            |t: &FlowTable<u32, u32>, k: u32| FlowTable::<u32, u32>::steady_slot(t.hash(&k));
        let rival = (3..1_000_000).find(|&k| slot_of(&table, k) == slot_of(&table, 2));
        let rival = rival.expect("a key of the same slot");
        table.mark_steady(2, 1, 100, 0);
        table.mark_steady(rival, 2, 100, 0);
        assert_eq!(table.steady(&2, 0), None, "its slot taken");
        assert_eq!(table.steady(&rival, 0), Some((2, 0)));
    }
}
