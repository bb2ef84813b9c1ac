//! One tuple of a table's tuple-space search: the rules whose masks hold the tuple's mask,
//! in buckets by their values under it, found by an index of its own.
//!
//! Tuples are merged (TupleMerge, Daly and Torng 2017): a tuple holds the rules whose masks
//! have every bit of its own, and a rule finer than the tuple (a /28 in a tuple of /24s, a
//! TCP rule in a tuple that ignores the protocol) is checked whole on each candidate found.
//! What may be finer is only the addresses and the protocol ([`mergeable`]), so a candidate
//! carries those three masks inline and a lookup touches no rule.
//!
//! Must never: allocate or hash twice on a lookup; hold a bucket without its index slot.

use crate::fields::Fields;
use crate::rule::Pattern;
use crate::ruleset::Rank;

/// The rules a merged tuple's bucket holds at most (a rule of the tuple's own mask always
/// joins its bucket).
pub(crate) const MAX_BUCKET: usize = 16;

/// Index slots a tuple starts with; it doubles to keep at least [`SLOTS_A_BUCKET`] a
/// bucket.
const MIN_SLOTS: usize = 64;

/// Index slots kept for each bucket at least: a packet with no bucket in the tuple meets
/// an empty slot at once seven times in eight, which is most probes of a miss.
const SLOTS_A_BUCKET: usize = 8;

/// A tuple. Invariants: each bucket is non-empty, in rank order, and has exactly one slot
/// of `index` holding its position + 1, reached from [`slot_of`] its key by linear probing
/// through no empty slot; at most one slot in [`SLOTS_A_BUCKET`] is used, so a probe
/// always ends.
#[derive(Debug, Clone)]
pub(crate) struct Tuple {
    pub mask: Fields,
    /// At least the priority of each rule here (stale high after a remove, which only
    /// costs an early stop).
    pub best: u16,
    pub len: usize,
    /// Masked fields, and the rules with those values in rank order.
    buckets: Vec<(Fields, Vec<Candidate>)>,
    /// Open addressing over `buckets`: a bucket's position + 1, or 0 for an empty slot.
    /// Its hash is one multiply, and an empty slot ends a probe before any key is read,
    /// so a tuple without the packet's bucket costs one load.
    index: Box<[u32]>,
}

/// A masked key's home slot in an index of `slots` (a power of two): its words mixed by
/// rotations and one multiply, the top bits taken.
#[inline]
fn slot_of(k: &Fields, slots: usize) -> usize {
    let small = u64::from(k.in_port)
        | u64::from(k.vlan) << 16
        | u64::from(k.eth_type) << 32
        | u64::from(k.ip_proto) << 48
        | u64::from(k.tcp_flags) << 56;
    let w = (k.ip_src as u64)
        ^ ((k.ip_src >> 64) as u64).rotate_left(11)
        ^ (k.ip_dst as u64).rotate_left(23)
        ^ ((k.ip_dst >> 64) as u64).rotate_left(37)
        ^ k.eth_src.rotate_left(41)
        ^ k.eth_dst.rotate_left(53)
        ^ small.rotate_left(5);
    (w.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - slots.trailing_zeros())) as usize
}

impl Tuple {
    pub fn new(mask: Fields) -> Tuple {
        Tuple {
            mask,
            best: 0,
            len: 0,
            buckets: Vec::new(),
            index: vec![0; MIN_SLOTS].into_boxed_slice(),
        }
    }

    /// The slot holding the bucket of `key`, if there is one.
    #[inline(always)]
    fn probe(&self, key: &Fields) -> Option<usize> {
        let wrap = self.index.len() - 1;
        let mut slot = slot_of(key, self.index.len());
        loop {
            match self.index[slot] {
                0 => return None,
                at if self.buckets[at as usize - 1].0 == *key => return Some(slot),
                _ => slot = (slot + 1) & wrap,
            }
        }
    }

    /// The bucket of `key`, if there is one.
    #[inline(always)]
    pub fn bucket(&self, key: &Fields) -> Option<&[Candidate]> {
        let slot = self.probe(key)?;
        Some(&self.buckets[self.index[slot] as usize - 1].1)
    }

    /// Every bucket and its key.
    pub fn buckets(&self) -> impl Iterator<Item = (&Fields, &[Candidate])> {
        self.buckets.iter().map(|(k, b)| (k, b.as_slice()))
    }

    /// Places a rule's candidate in the bucket of `key`, made if it is not there, in rank
    /// order.
    pub fn add(&mut self, key: Fields, candidate: Candidate) {
        let at = match self.probe(&key) {
            Some(slot) => self.index[slot] as usize - 1,
            None => {
                if (self.buckets.len() + 1) * SLOTS_A_BUCKET > self.index.len() {
                    self.reindex(self.index.len() * 2);
                }
                let slot = self.free_slot(&key);
                self.buckets.push((key, Vec::new()));
                self.index[slot] = index_value(self.buckets.len() - 1);
                self.buckets.len() - 1
            }
        };
        let bucket = &mut self.buckets[at].1;
        let place = bucket.partition_point(|c| c.rank < candidate.rank);
        bucket.insert(place, candidate);
    }

    /// The first empty slot of the probe from `key`'s home, for a key not in the index.
    fn free_slot(&self, key: &Fields) -> usize {
        let wrap = self.index.len() - 1;
        let mut slot = slot_of(key, self.index.len());
        while self.index[slot] != 0 {
            slot = (slot + 1) & wrap;
        }
        slot
    }

    /// Takes the rule of `rank` out of the bucket of `key`, and the bucket once empty.
    pub fn take(&mut self, key: &Fields, rank: Rank) {
        let Some(slot) = self.probe(key) else {
            return;
        };
        let at = self.index[slot] as usize - 1;
        self.buckets[at].1.retain(|c| c.rank != rank);
        if !self.buckets[at].1.is_empty() {
            return;
        }
        self.unslot(slot);
        let last = self.buckets.len() - 1;
        if at != last {
            // The last bucket moves to `at`: its slot (every bucket has one) follows it.
            if let Some(moved) = self.probe(&self.buckets[last].0) {
                self.index[moved] = index_value(at);
            }
        }
        self.buckets.swap_remove(at);
    }

    /// Empties `hole`, moving back each later slot of its run that may stand there
    /// (backward-shift deletion), so that no probe meets an empty slot before its key.
    fn unslot(&mut self, mut hole: usize) {
        let wrap = self.index.len() - 1;
        let mut slot = (hole + 1) & wrap;
        while self.index[slot] != 0 {
            let key = &self.buckets[self.index[slot] as usize - 1].0;
            let home = slot_of(key, self.index.len());
            // It may move back unless its home lies after the hole, up to it.
            if slot.wrapping_sub(home) & wrap >= slot.wrapping_sub(hole) & wrap {
                self.index[hole] = self.index[slot];
                hole = slot;
            }
            slot = (slot + 1) & wrap;
        }
        self.index[hole] = 0;
    }

    /// Builds the index again with `slots` slots.
    fn reindex(&mut self, slots: usize) {
        self.index = vec![0; slots].into_boxed_slice();
        for at in 0..self.buckets.len() {
            let slot = self.free_slot(&self.buckets[at].0);
            self.index[slot] = index_value(at);
        }
    }

    /// The index's slots that hold a bucket (for tests).
    #[cfg(test)]
    pub fn slots(&self) -> (usize, usize) {
        let used = self.index.iter().filter(|&&s| s != 0).count();
        (used, self.index.len())
    }
}

/// A bucket's position as its index slot holds it. It fits: a tuple holds no more buckets
/// than rules, and rule ids are below 2^30 ([`crate::ruleset::MAX_RULE_ID`]).
fn index_value(at: usize) -> u32 {
    (at + 1) as u32
}

/// What a lookup checks on a rule of a bucket, kept inline so a search touches no rule.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub rank: Rank,
    tp_src: (u16, u16),
    tp_dst: (u16, u16),
    /// The rule's own masks and values of the fields where it may be finer than its
    /// tuple: the addresses and the protocol, as `(mask, value)`.
    ip_src: (u128, u128),
    ip_dst: (u128, u128),
    ip_proto: (u8, u8),
}

impl Candidate {
    pub fn of(rank: Rank, pattern: &Pattern) -> Candidate {
        let (m, v) = (&pattern.mask, &pattern.value);
        Candidate {
            rank,
            tp_src: pattern.tp_src,
            tp_dst: pattern.tp_dst,
            ip_src: (m.ip_src, v.ip_src),
            ip_dst: (m.ip_dst, v.ip_dst),
            ip_proto: (m.ip_proto, v.ip_proto),
        }
    }

    /// Whether the rule matches `f`, given that its tuple's bucket does.
    #[inline]
    pub fn matches(&self, f: &Fields) -> bool {
        (self.tp_src.0..=self.tp_src.1).contains(&f.tp_src)
            && (self.tp_dst.0..=self.tp_dst.1).contains(&f.tp_dst)
            && (f.ip_src & self.ip_src.0 == self.ip_src.1)
                & (f.ip_dst & self.ip_dst.0 == self.ip_dst.1)
                & (f.ip_proto & self.ip_proto.0 == self.ip_proto.1)
    }

    /// The rule's pattern, in a tuple of `mask` and the bucket of `key`.
    pub fn pattern(&self, mask: &Fields, key: &Fields) -> Pattern {
        Pattern {
            value: Fields {
                ip_src: self.ip_src.1,
                ip_dst: self.ip_dst.1,
                ip_proto: self.ip_proto.1,
                ..*key
            },
            mask: Fields {
                ip_src: self.ip_src.0,
                ip_dst: self.ip_dst.0,
                ip_proto: self.ip_proto.0,
                ..*mask
            },
            tp_src: self.tp_src,
            tp_dst: self.tp_dst,
        }
    }
}

/// Whether every bit of `inner` is in `outer`.
pub(crate) fn within(inner: &Fields, outer: &Fields) -> bool {
    inner.masked(outer) == inner.masked(inner)
}

/// The length of an address mask that is a prefix.
fn prefix_len(mask: u128) -> Option<u32> {
    let len = mask.leading_ones();
    (mask == u128::MAX.checked_shl(128 - len).unwrap_or(0)).then_some(len)
}

/// Whether a tuple of `mask` may hold a rule of `rule` (a mask with every bit of it):
/// the same bits but for address prefixes shorter within their octet, and a protocol it
/// ignores. [`Candidate`] relies on these being the only fields that differ.
pub(crate) fn mergeable(mask: &Fields, rule: &Fields) -> bool {
    let close = |t: u128, r: u128| match (prefix_len(t), prefix_len(r)) {
        (Some(t), Some(r)) => t == r || (t % 8 == 0 && r - t < 8),
        _ => t == r,
    };
    let (t, r) = (mask, rule);
    (
        t.in_port,
        t.eth_src,
        t.eth_dst,
        t.vlan,
        t.eth_type,
        t.tcp_flags,
    ) == (
        r.in_port,
        r.eth_src,
        r.eth_dst,
        r.vlan,
        r.eth_type,
        r.tcp_flags,
    ) && (t.ip_proto == r.ip_proto || t.ip_proto == 0)
        && close(t.ip_src, r.ip_src)
        && close(t.ip_dst, r.ip_dst)
}

/// The mask of a new tuple for a rule of `mask`: its address prefixes cut to whole
/// octets and its protocol left out, so that later rules of nearby masks join it (it
/// differs from the rule's in [`mergeable`]'s fields only).
pub(crate) fn relaxed(mask: &Fields) -> Fields {
    let octets = |m: u128| match prefix_len(m) {
        Some(len) => u128::MAX.checked_shl(128 - len / 8 * 8).unwrap_or(0),
        None => m,
    };
    Fields {
        ip_src: octets(mask.ip_src),
        ip_dst: octets(mask.ip_dst),
        ip_proto: 0,
        ..*mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Reverse;

    fn key(dst: u128) -> Fields {
        Fields {
            ip_dst: dst,
            ..Fields::default()
        }
    }

    fn candidate(n: u64) -> Candidate {
        let rank = Rank {
            priority: Reverse(1),
            seq: n,
            id: crate::ruleset::RuleId(n as u32),
        };
        Candidate::of(rank, &Pattern::ANY)
    }

    /// Keys that collide (homes at the last two slots, so their run wraps to the first)
    /// are found after any two of them are taken, in either order: a taken bucket's run
    /// closes up behind it, and the bucket moved into its place keeps its slot.
    #[test]
    fn colliding_keys_are_found_after_any_of_them_go() {
        let mask = key(u128::MAX);
        let homes = [MIN_SLOTS - 2, MIN_SLOTS - 1];
        let keys: Vec<Fields> = (0u128..)
            .map(key)
            .filter(|k| homes.contains(&slot_of(k, MIN_SLOTS)))
            .take(MIN_SLOTS / SLOTS_A_BUCKET)
            .collect();
        for first in 0..keys.len() {
            for second in 0..keys.len() {
                let mut t = Tuple::new(mask);
                for (n, k) in keys.iter().enumerate() {
                    t.add(*k, candidate(n as u64));
                }
                assert_eq!(t.slots(), (keys.len(), MIN_SLOTS), "no growth yet");
                for gone in [first, second] {
                    t.take(&keys[gone], candidate(gone as u64).rank);
                }
                for (n, k) in keys.iter().enumerate() {
                    let found = t.bucket(k).map(|b| u64::from(b[0].rank.id.0));
                    let want = (n != first && n != second).then_some(n as u64);
                    assert_eq!(found, want, "key {n} after {first} and {second} went");
                }
            }
        }
    }
}
