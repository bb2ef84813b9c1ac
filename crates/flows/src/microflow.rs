//! The microflow table: TurboFlow's first level, kept by each worker.
//!
//! A small direct-mapped table (sized to stay in the CPU cache) that adds each packet to
//! the features of its flow's slot. When a packet of another flow takes the slot, the old
//! entry leaves as a *microflow record*: the features of the flow's most recent packets,
//! which the aggregator adds to the flow's record. A packet with FIN or RST sends its
//! entry out at once (so the aggregator can end the flow), and a sweep sends out entries
//! that began more than `max_age` ago (so timeouts are seen within that much).
//!
//! It never allocates after creation (records go into the caller's buffer) and never
//! loses a packet: every packet added is in exactly one record that leaves, by eviction
//! or sweep (a sweep of every slot with no age limit empties the table).

use crate::compact_key::CompactKey;
use crate::flow_stats::{FlowStats, KeptStats, Observation, TCP_FIN, TCP_RST};

/// The features (`S` of them) of some consecutive packets of one flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Microflow<K, S = FlowStats> {
    pub key: K,
    pub stats: S,
}

#[derive(Clone, Copy)]
struct Slot<K, S> {
    key: K,
    /// `stats.packets() == 0`: the slot is empty.
    stats: S,
}

impl<K: Copy, S: KeptStats> Slot<K, S> {
    /// The entry as a record.
    fn record(&self) -> Microflow<K, S> {
        Microflow {
            key: self.key,
            stats: self.stats,
        }
    }

    /// Sends the entry out and empties the slot.
    fn send_out(&mut self, out: &mut Vec<Microflow<K, S>>) {
        out.push(self.record());
        self.stats = S::zeroed();
    }

    fn ended_by_tcp(&self) -> bool {
        self.stats.tcp_flags() & (TCP_FIN | TCP_RST) != 0
    }
}

/// A direct-mapped table of microflows, keeping `S` of their features.
pub struct MicroflowTable<K, S = FlowStats> {
    slots: Vec<Slot<K, S>>,
    mask: usize,
    /// Where the next sweep starts.
    cursor: usize,
}

/// A size that is not a power of two, or is zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError(pub String);

impl std::fmt::Display for SizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SizeError {}

/// Checks that `n` is a power of two of at least `min`; names `what` if not.
pub(crate) fn power_of_two(n: usize, min: usize, what: &str) -> Result<usize, SizeError> {
    if n < min || !n.is_power_of_two() {
        return Err(SizeError(format!(
            "{what} = {n}: must be a power of two of at least {min} (e.g. {})",
            n.max(min).next_power_of_two()
        )));
    }
    Ok(n)
}

impl<K: CompactKey, S: KeptStats> MicroflowTable<K, S> {
    /// A table of `slots` entries (a power of two).
    /// The bytes a table of `slots` slots allocates (as [`MicroflowTable::new`] sizes it).
    pub fn bytes_for(slots: usize) -> u64 {
        slots.max(1).next_power_of_two() as u64 * std::mem::size_of::<Slot<K, S>>() as u64
    }

    pub fn new(slots: usize) -> Result<Self, SizeError> {
        let slots = power_of_two(slots, 1, "microflow slots")?;
        Ok(MicroflowTable {
            slots: vec![
                Slot {
                    key: K::default(),
                    stats: S::zeroed(),
                };
                slots
            ],
            mask: slots - 1,
            cursor: 0,
        })
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Bytes held by the slots.
    pub fn memory_bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot<K, S>>()
    }

    /// Starts loading the slot of a flow whose hash is `hash` into the cache, for a burst
    /// that looks up every packet's slot before it touches any.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        stateplane_mem::prefetch_whole(&self.slots[hash as usize & self.mask]);
    }

    /// Sends out flow `key`'s entry (whose hash is `hash`), if the table holds one.
    #[inline]
    pub fn take(&mut self, key: K, hash: u64, out: &mut Vec<Microflow<K, S>>) {
        let slot = &mut self.slots[hash as usize & self.mask];
        if slot.stats.packets() != 0 && slot.key == key {
            slot.send_out(out);
        }
    }

    /// Adds a packet of flow `key` (whose hash is `hash`); pushes the record of whatever
    /// it evicts to `out`, and its own flow's record if the packet ends the flow (FIN or
    /// RST). Returns whether it evicted another flow.
    #[inline]
    pub fn observe(
        &mut self,
        key: K,
        hash: u64,
        o: &Observation,
        out: &mut Vec<Microflow<K, S>>,
    ) -> bool {
        let slot = &mut self.slots[hash as usize & self.mask];
        let mut evicted = false;
        if slot.stats.packets() != 0 && slot.key == key {
            slot.stats.add(o);
        } else {
            if slot.stats.packets() != 0 {
                out.push(slot.record());
                evicted = true;
            }
            slot.key = key;
            slot.stats = S::start(o);
        }
        if slot.ended_by_tcp() {
            slot.send_out(out);
        }
        evicted
    }

    /// Looks at the next `visit` slots and sends out the entries that began at or before
    /// `now_ns - max_age_ns`.
    pub fn sweep(
        &mut self,
        now_ns: u64,
        max_age_ns: u64,
        visit: usize,
        out: &mut Vec<Microflow<K, S>>,
    ) {
        let oldest = now_ns.saturating_sub(max_age_ns);
        for _ in 0..visit.min(self.slots.len()) {
            let slot = &mut self.slots[self.cursor];
            if slot.stats.packets() != 0 && slot.stats.first_ns() <= oldest {
                slot.send_out(out);
            }
            self.cursor = (self.cursor + 1) & self.mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact_key::{V4Key, hash_key};
    use crate::flow_stats::{TCP_FIN, TCP_SYN};

    fn obs(ts_ns: u64, flags: u8) -> Observation {
        Observation {
            ts_ns,
            ip_len: 100,
            tcp_flags: flags,
            ..Observation::default()
        }
    }

    #[test]
    fn collisions_evict_and_fin_sends_out_at_once() {
        let mut t = MicroflowTable::<V4Key>::new(1).unwrap();
        let (a, b) = (V4Key([1, 2]), V4Key([3, 4]));
        let mut out = Vec::new();
        assert!(!t.observe(a, 7, &obs(1, TCP_SYN), &mut out));
        assert!(!t.observe(a, 7, &obs(2, 0), &mut out));
        assert!(
            t.observe(b, 9, &obs(3, 0), &mut out),
            "one slot: b evicts a"
        );
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].key, out[0].stats.packets), (a, 2));
        t.observe(b, 9, &obs(4, TCP_FIN), &mut out);
        assert_eq!((out[1].key, out[1].stats.packets), (b, 2));
        t.sweep(u64::MAX, 0, t.slots(), &mut out);
        assert_eq!(out.len(), 2, "the FIN emptied the slot");
    }

    /// TurboFlow's Equation 1: with `a` active flows in `T` slots, a packet evicts with
    /// probability 1-(1-1/T)^a. The model holds when the active flows' packets interleave
    /// (here: each flow sends once per round, in a fixed order), so that another flow in a
    /// packet's slot has always taken it since that flow's last packet; it counts the other
    /// a-1 flows, which for hundreds of flows is the paper's a.
    #[test]
    fn eviction_rate_matches_the_papers_equation_1() {
        let slots = 4096;
        for active in [512usize, 2048, 4096, 8192, 20480] {
            let mut t = MicroflowTable::<V4Key>::new(slots).unwrap();
            let mut out = Vec::new();
            let keys: Vec<V4Key> = (0..active as u64).map(|i| V4Key([i, 7])).collect();
            let (mut packets, mut evictions) = (0u64, 0u64);
            for round in 0..6 {
                for k in &keys {
                    let evicted = t.observe(*k, hash_key(k, 11), &obs(round, 0), &mut out);
                    // The first round fills the table: count from the second on.
                    if round > 0 {
                        packets += 1;
                        evictions += u64::from(evicted);
                    }
                }
                out.clear();
            }
            let measured = evictions as f64 / packets as f64;
            let model = 1.0 - (1.0 - 1.0 / slots as f64).powi(active as i32 - 1);
            assert!(
                (measured - model).abs() < 0.02,
                "a = {active}, T = {slots}: measured {measured:.3}, Equation 1 gives {model:.3}"
            );
        }
    }

    #[test]
    fn sweep_sends_out_old_entries_only() {
        let mut t = MicroflowTable::<V4Key>::new(64).unwrap();
        let mut out = Vec::new();
        for i in 0..32u64 {
            let k = V4Key([i, 0]);
            t.observe(k, hash_key(&k, 5), &obs(i * 100, 0), &mut out);
        }
        let before = out.len();
        t.sweep(3_000, 1_500, 64, &mut out);
        let swept: Vec<_> = out[before..].iter().map(|m| m.stats.first_ns).collect();
        assert!(!swept.is_empty() && swept.iter().all(|&f| f <= 1_500));
        let mut rest = Vec::new();
        t.sweep(u64::MAX, 0, t.slots(), &mut rest);
        assert!(rest.iter().all(|m| m.stats.first_ns > 1_500));
        assert_eq!(
            out.len() + rest.len(),
            32,
            "every packet leaves exactly once"
        );
        assert!(MicroflowTable::<V4Key>::new(100).is_err());
    }
}
