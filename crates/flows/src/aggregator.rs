//! The aggregator: TurboFlow's second level, stitching microflow records into flow records.
//!
//! A flat linear-probing table (records stored in the slots, no pointers; a miss's next
//! candidates are in the same cache lines), keyed by compact keys, looked up in batches
//! whose home slots are prefetched first. Flows leave on RST at once; a flow closed by
//! FIN stays until it has been quiet for the FIN timeout, so that the final ACK of the
//! close joins it instead of starting a record of its own. Flows also leave on the inactive
//! and active timeouts (found, as closed flows are, by a sweep that covers the table a
//! bounded number of slots at a time), when the table is full (a closed flow of a sample
//! if it has one, else its least recently active flow, counted), and at `flush`.
//!
//! The memory budget is fixed at creation and allocated then, but only as address space:
//! the table uses a prefix of it that doubles, in place, when it is 7/8 full, so a run
//! touches (and the kernel zeroes, and the process keeps resident) memory for the flows it
//! has, not for the budget. Zeroing the whole budget up front was a quarter of a run over a
//! 5-million-packet file. Removal shifts the following entries back (no tombstones). It
//! never reads a clock: time comes in with the records and with `sweep`.

use crate::compact_key::{CompactKey, hash_key};
use crate::flow_stats::{FlowStats, KeptStats, TCP_FIN, TCP_RST};
use crate::microflow::{Microflow, SizeError, power_of_two};
use crate::record::{EndReason, FlowRecord};

/// How far TCP has ended a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcpEnd {
    Open,
    /// Closed by FIN (one direction's, or both for a biflow): what follows within the FIN
    /// timeout still belongs to it.
    Closed,
    /// Reset: nothing follows.
    Reset,
}

impl TcpEnd {
    fn from_flags(reset: bool, closed: bool) -> TcpEnd {
        match (reset, closed) {
            (true, _) => TcpEnd::Reset,
            (false, true) => TcpEnd::Closed,
            (false, false) => TcpEnd::Open,
        }
    }
}

/// What the table keeps per flow: one direction, or both (biflows).
pub trait FlowValue: Copy + Send + bytemuck::Zeroable + 'static {
    /// Whether records are keyed by connection (both directions in one record).
    const BIFLOW: bool;
    /// What the flow's microflow records carry and the table keeps of each direction.
    type Kept: KeptStats;
    fn start(stats: &Self::Kept, reversed: bool) -> Self;
    fn merge(&mut self, stats: &Self::Kept, reversed: bool);
    fn first_ns(&self) -> u64;
    fn last_ns(&self) -> u64;
    /// Whether TCP has ended the flow, and how.
    fn tcp_end(&self) -> TcpEnd;
    /// The record, given the table's key for it.
    fn record<K: CompactKey>(&self, key: &K, end: EndReason) -> FlowRecord;
}

/// One direction (a uniflow record, as NetFlow and IPFIX exporters make by default),
/// keeping `S` of its features.
#[derive(Clone, Copy, Debug, bytemuck::Zeroable)]
pub struct Uniflow<S = FlowStats>(S);

impl<S: KeptStats> FlowValue for Uniflow<S> {
    const BIFLOW: bool = false;
    type Kept = S;
    #[inline]
    fn start(stats: &S, _: bool) -> Self {
        Uniflow(*stats)
    }
    #[inline]
    fn merge(&mut self, stats: &S, _: bool) {
        self.0.merge(stats)
    }
    fn first_ns(&self) -> u64 {
        self.0.first_ns()
    }
    fn last_ns(&self) -> u64 {
        self.0.last_ns()
    }
    #[inline]
    fn tcp_end(&self) -> TcpEnd {
        let flags = self.0.tcp_flags();
        TcpEnd::from_flags(flags & TCP_RST != 0, flags & TCP_FIN != 0)
    }
    fn record<K: CompactKey>(&self, key: &K, end: EndReason) -> FlowRecord {
        FlowRecord {
            key: key.unpack(),
            forward: self.0.stats(),
            reverse: None,
            end,
        }
    }
}

/// Both directions of a connection, by the canonical key's direction (index 0) and the
/// other, keeping `S` of their features; a direction that sent nothing has 0 packets.
#[derive(Clone, Copy, Debug, bytemuck::Zeroable)]
pub struct Biflow<S = FlowStats>([S; 2]);

impl<S: KeptStats> Biflow<S> {
    fn side(&self, i: usize) -> Option<&S> {
        (self.0[i].packets() != 0).then_some(&self.0[i])
    }
}

impl<S: KeptStats> FlowValue for Biflow<S> {
    const BIFLOW: bool = true;
    type Kept = S;
    #[inline]
    fn start(stats: &S, reversed: bool) -> Self {
        let mut b = Biflow([S::zeroed(); 2]);
        b.0[usize::from(reversed)] = *stats;
        b
    }
    #[inline]
    fn merge(&mut self, stats: &S, reversed: bool) {
        let side = &mut self.0[usize::from(reversed)];
        if side.packets() == 0 {
            *side = *stats;
        } else {
            side.merge(stats);
        }
    }
    fn first_ns(&self) -> u64 {
        (0..2)
            .filter_map(|i| self.side(i))
            .map(S::first_ns)
            .min()
            .unwrap_or(0)
    }
    fn last_ns(&self) -> u64 {
        (0..2)
            .filter_map(|i| self.side(i))
            .map(S::last_ns)
            .max()
            .unwrap_or(0)
    }
    /// RST from either side, or FIN from both.
    #[inline]
    fn tcp_end(&self) -> TcpEnd {
        let flags = |i: usize| self.side(i).map_or(0, S::tcp_flags);
        TcpEnd::from_flags(
            (flags(0) | flags(1)) & TCP_RST != 0,
            flags(0) & flags(1) & TCP_FIN != 0,
        )
    }
    /// The forward direction is the one whose first packet came first: the side that
    /// opened the connection, as far as the capture saw it.
    fn record<K: CompactKey>(&self, key: &K, end: EndReason) -> FlowRecord {
        let forward_is_0 = match (self.side(0), self.side(1)) {
            (Some(a), Some(b)) => a.first_ns() <= b.first_ns(),
            (a, _) => a.is_some(),
        };
        let (f, r, key) = if forward_is_0 {
            (0, 1, *key)
        } else {
            (1, 0, key.reversed())
        };
        FlowRecord {
            key: key.unpack(),
            forward: self.0[f].stats(),
            reverse: self.side(r).map(S::stats),
            end,
        }
    }
}

/// All zero bytes is an empty slot: the budget's memory is usable as it comes from the
/// kernel.
#[derive(Clone, Copy, bytemuck::Zeroable)]
struct Slot<K, V> {
    /// The key's hash; 0 marks an empty slot (`hash_key` is never 0).
    hash: u64,
    key: K,
    value: V,
}

/// When flows time out, in the clock of the records (ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// A flow with no packet for this long is exported (softflowd, nfpcapd: 15 s).
    pub inactive_ns: u64,
    /// A flow open this long is exported and starts over (mature exporters: 30 min).
    pub active_ns: u64,
    /// A flow closed by FIN is exported once it has been quiet this long (softflowd's
    /// `tcp.fin`): the final ACK of a close, one round trip after the last FIN, joins it.
    /// 0 exports it at the FIN, and the final ACK starts a record of its own.
    pub fin_ns: u64,
}

impl Timeouts {
    /// What mature exporters use: 15 s inactive (softflowd, nfpcapd), 30 min active, and
    /// a 2 s FIN timeout, a round trip longer than any but a satellite link's.
    pub const DEFAULT: Timeouts = Timeouts {
        inactive_ns: 15 * 1_000_000_000,
        active_ns: 1800 * 1_000_000_000,
        fin_ns: 2 * 1_000_000_000,
    };
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts::DEFAULT
    }
}

/// What the aggregator has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AggregatorCounters {
    pub records_in: u64,
    pub flows_created: u64,
    /// Flows exported to make room in a full table.
    pub evicted_full: u64,
    pub exported: u64,
}

/// Whether a flow TCP has ended leaves now (an RST, or a FIN with no FIN timeout) rather
/// than at a sweep.
#[inline]
fn leaves_now(end: TcpEnd, timeouts: &Timeouts) -> bool {
    end == TcpEnd::Reset || (end == TcpEnd::Closed && timeouts.fin_ns == 0)
}

/// Flows looked up together: their home slots are prefetched before any is touched.
const BATCH: usize = 32;
/// Flows looked at to choose one to evict from a full table.
const EVICTION_SAMPLE: usize = 64;

/// Slots the table starts with (fewer if the budget is smaller): 4,096 IPv4 slots are
/// 352 KiB.
const FIRST_SLOTS: usize = 4096;

/// The flow table of one worker for one address family.
pub struct Aggregator<K, V> {
    /// The whole budget; slots from `mask + 1` on are empty and untouched.
    slots: Vec<Slot<K, V>>,
    /// The slots in use, less one (a power of two, less one).
    mask: usize,
    len: usize,
    /// The table doubles when a new flow would make `len` exceed this (7/8 of the slots in
    /// use), or never once it uses the whole budget.
    grow_at: usize,
    max_len: usize,
    seed: u64,
    /// The sweep's next slot.
    cursor: usize,
    /// The next slot a flush exports from. Invariant: 0 unless a flush has begun and not
    /// ended, and no flow is added while one has (a flush ends the run).
    flush_at: usize,
    /// Where the next eviction's sample starts: just past the last one's, so that each
    /// sample is fresh and no run of slots is walked again and again.
    evict_cursor: usize,
    /// Slots walked by evictions (to check that an eviction costs O(1) amortised).
    evict_walked: u64,
    timeouts: Timeouts,
    prefetch: bool,
    pub counters: AggregatorCounters,
}

impl<K: CompactKey, V: FlowValue> Aggregator<K, V> {
    /// A table that holds up to `max_flows` flows (in a power of two of slots at most 7/8
    /// full), hashing with `seed`.
    pub fn new(max_flows: usize, timeouts: Timeouts, seed: u64) -> Result<Self, SizeError> {
        Self::starting_with(FIRST_SLOTS, max_flows, timeouts, seed)
    }

    fn starting_with(
        first_slots: usize,
        max_flows: usize,
        timeouts: Timeouts,
        seed: u64,
    ) -> Result<Self, SizeError> {
        if max_flows == 0 {
            return Err(SizeError(
                "max_flows = 0: the flow table must hold at least one flow".into(),
            ));
        }
        let slots = power_of_two((max_flows * 8).div_ceil(7).next_power_of_two(), 2, "slots")?;
        let (slots_vec, _) = stateplane_mem::lazy_zeroed_vec(slots, true);
        let in_use = slots.min(first_slots.next_power_of_two());
        Ok(Aggregator {
            slots: slots_vec,
            mask: in_use - 1,
            len: 0,
            grow_at: Self::growth_threshold(in_use, slots),
            max_len: max_flows,
            seed,
            cursor: 0,
            flush_at: 0,
            evict_cursor: 0,
            evict_walked: 0,
            timeouts,
            prefetch: true,
            counters: AggregatorCounters::default(),
        })
    }

    /// Turns the batch prefetch off (to measure what it brings).
    pub fn without_prefetch(mut self) -> Self {
        self.prefetch = false;
        self
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.max_len
    }

    /// The memory the table uses now (it grows up to [`Aggregator::budget_bytes`]).
    pub fn memory_bytes(&self) -> usize {
        (self.mask + 1) * size_of::<Slot<K, V>>()
    }

    /// The memory a table for `max_flows` flows may grow to, before it is made (what
    /// [`Aggregator::budget_bytes`] says of it once made).
    pub fn budget_for(max_flows: usize) -> u64 {
        let slots = (max_flows.max(1) * 8)
            .div_ceil(7)
            .next_power_of_two()
            .max(2);
        slots as u64 * size_of::<Slot<K, V>>() as u64
    }

    /// The memory the table may grow to.
    pub fn budget_bytes(&self) -> usize {
        self.slots.len() * size_of::<Slot<K, V>>()
    }

    /// Grows the table now, so that it holds `flows` flows (up to its budget) without
    /// growing again: for a caller that knows its load, and to measure the table apart
    /// from its growth. Memory is still touched only as flows arrive.
    pub fn reserve(&mut self, flows: usize) {
        while self.grow_at < flows.min(self.max_len) {
            let in_use = self.mask;
            self.grow();
            if self.mask == in_use {
                break; // cannot happen (the table is never full); no endless loop if it did
            }
        }
    }

    fn growth_threshold(in_use: usize, budget: usize) -> usize {
        if in_use < budget {
            in_use / 8 * 7
        } else {
            usize::MAX
        }
    }

    /// Doubles the slots in use, in place: every entry is taken out and put back under the
    /// new mask, in an order that keeps each entry findable.
    ///
    /// The scan starts just after an empty slot, so it meets every cluster from its first
    /// entry. An entry whose new home is its old one lands at or before the slot it left,
    /// passing only slots already placed, which stay filled; one whose home moved to the new
    /// half lands there, among placed entries only. The one case that could pass unplaced
    /// entries, a probe running off the end of the table and wrapping to the start, is put
    /// back after the scan, when every slot is placed.
    #[cold]
    fn grow(&mut self) {
        let old = self.mask + 1;
        // The table is at most 7/8 full, so an empty slot exists.
        let Some(empty) = (0..old).find(|&i| self.slots[i].hash == 0) else {
            return;
        };
        let new = old * 2;
        self.mask = new - 1;
        self.grow_at = Self::growth_threshold(new, self.slots.len());
        let mut wrapped = Vec::new();
        for step in 1..=old {
            let from = (empty + step) & (old - 1);
            let entry = self.slots[from];
            if entry.hash == 0 {
                continue;
            }
            self.slots[from].hash = 0;
            let mut i = entry.hash as usize & self.mask;
            loop {
                if self.slots[i].hash == 0 {
                    self.slots[i] = entry;
                    break;
                }
                i += 1;
                if i == new {
                    wrapped.push(entry);
                    break;
                }
            }
        }
        for entry in wrapped {
            let i = self.empty_slot_from(entry.hash);
            self.slots[i] = entry;
        }
    }

    /// The first empty slot in probe order from `hash`'s home.
    #[inline]
    fn empty_slot_from(&self, hash: u64) -> usize {
        let mut i = hash as usize & self.mask;
        while self.slots[i].hash != 0 {
            i = (i + 1) & self.mask;
        }
        i
    }

    /// Adds microflow records to their flows; pushes the flows they end to `out`.
    pub fn ingest(&mut self, records: &[Microflow<K, V::Kept>], out: &mut Vec<FlowRecord>) {
        let mut keys = [(K::default(), false, 0u64); BATCH];
        for batch in records.chunks(BATCH) {
            for (k, m) in keys.iter_mut().zip(batch) {
                let (key, reversed) = if V::BIFLOW {
                    m.key.canonical()
                } else {
                    (m.key, false)
                };
                let hash = hash_key(&key, self.seed);
                if self.prefetch {
                    stateplane_mem::prefetch_whole(&self.slots[hash as usize & self.mask]);
                }
                *k = (key, reversed, hash);
            }
            for (&(key, reversed, hash), m) in keys.iter().zip(batch) {
                self.add(key, reversed, hash, &m.stats, out);
            }
        }
    }

    #[inline]
    fn add(
        &mut self,
        key: K,
        reversed: bool,
        hash: u64,
        stats: &V::Kept,
        out: &mut Vec<FlowRecord>,
    ) {
        self.counters.records_in += 1;
        let mut i = hash as usize & self.mask;
        loop {
            let slot = &mut self.slots[i];
            if slot.hash == 0 {
                break;
            }
            if slot.hash == hash && slot.key == key {
                slot.value.merge(stats, reversed);
                if leaves_now(slot.value.tcp_end(), &self.timeouts) {
                    self.export(i, EndReason::EndOfFlow, out);
                }
                return;
            }
            i = (i + 1) & self.mask;
        }
        // A new flow.
        if self.len >= self.grow_at {
            self.grow();
            i = self.empty_slot_from(hash);
        }
        if self.len == self.max_len {
            self.evict_one(out);
            i = self.empty_slot_from(hash);
        }
        self.counters.flows_created += 1;
        self.len += 1;
        self.slots[i] = Slot {
            hash,
            key,
            value: V::start(stats, reversed),
        };
        if leaves_now(self.slots[i].value.tcp_end(), &self.timeouts) {
            self.export(i, EndReason::EndOfFlow, out);
        }
    }

    /// Exports a flow of a sample: the next [`EVICTION_SAMPLE`] flows in slot order from
    /// where the previous sample ended (slots are in hash order, so a sample is a random
    /// one). A flow TCP has closed goes first (it has ended: only a late ACK would still
    /// join it), as an end of flow; else the least recently active, as lack of resources.
    /// The table is at least 7/16 full when it evicts (full,
    /// in at most twice the slots it needs), so a sample walks about 150 slots at most: an
    /// eviction costs O(1), however many came before it.
    #[cold]
    fn evict_one(&mut self, out: &mut Vec<FlowRecord>) {
        let mut best: Option<(u64, usize)> = None;
        let mut seen = 0;
        let mut i = self.evict_cursor & self.mask;
        for _ in 0..=self.mask {
            self.evict_walked += 1;
            if self.slots[i].hash != 0 {
                if self.slots[i].value.tcp_end() == TcpEnd::Closed {
                    // Slot i holds the entry shifted back into it next.
                    self.evict_cursor = i;
                    self.counters.evicted_full += 1;
                    self.export(i, EndReason::EndOfFlow, out);
                    return;
                }
                let last = self.slots[i].value.last_ns();
                if best.is_none_or(|(b, _)| last < b) {
                    best = Some((last, i));
                }
                seen += 1;
                if seen == EVICTION_SAMPLE {
                    break;
                }
            }
            i = (i + 1) & self.mask;
        }
        self.evict_cursor = (i + 1) & self.mask;
        if let Some((_, i)) = best {
            self.counters.evicted_full += 1;
            self.export(i, EndReason::LackOfResources, out);
        }
    }

    /// Exports the flow in slot `i` and removes it, shifting back the entries after it
    /// that would no longer be found (backward-shift deletion).
    fn export(&mut self, i: usize, end: EndReason, out: &mut Vec<FlowRecord>) {
        let slot = &self.slots[i];
        out.push(slot.value.record(&slot.key, end));
        self.counters.exported += 1;
        self.len -= 1;
        let mut hole = i;
        let mut j = (i + 1) & self.mask;
        while self.slots[j].hash != 0 {
            let home = self.slots[j].hash as usize & self.mask;
            // Entry j may move to the hole unless its home lies cyclically in (hole, j].
            if (j.wrapping_sub(home) & self.mask) >= (j.wrapping_sub(hole) & self.mask) {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
            j = (j + 1) & self.mask;
        }
        self.slots[hole].hash = 0;
    }

    /// Looks at the next `visit` slots and exports the flows that have timed out by
    /// `now_ns`.
    pub fn sweep(&mut self, now_ns: u64, visit: usize, out: &mut Vec<FlowRecord>) {
        for _ in 0..visit.min(self.mask + 1) {
            let i = self.cursor;
            if self.slots[i].hash != 0 {
                let v = &self.slots[i].value;
                let quiet_ns = now_ns.saturating_sub(v.last_ns());
                let end = if v.tcp_end() == TcpEnd::Closed && quiet_ns >= self.timeouts.fin_ns {
                    Some(EndReason::EndOfFlow)
                } else if quiet_ns >= self.timeouts.inactive_ns {
                    Some(EndReason::Idle)
                } else if now_ns.saturating_sub(v.first_ns()) >= self.timeouts.active_ns {
                    Some(EndReason::Active)
                } else {
                    None
                };
                if let Some(end) = end {
                    // The entry shifted into slot i is looked at on the next step.
                    self.export(i, end, out);
                    continue;
                }
            }
            self.cursor = (self.cursor + 1) & self.mask;
        }
    }

    /// Slots to sweep so that the whole table is covered about once per `period_ns` of
    /// record time, given `elapsed_ns` since the last sweep.
    pub fn sweep_share(&self, elapsed_ns: u64, period_ns: u64) -> usize {
        let in_use = self.mask as u128 + 1;
        let share = (in_use * u128::from(elapsed_ns)).div_ceil(u128::from(period_ns.max(1)));
        share.min(in_use) as usize
    }

    /// Exports every flow (the end of a run), those TCP closed as ended, the others as
    /// forced out, until `out` holds `room` records: whether the table is empty. Each call
    /// goes on where the last one stopped, so that a million flows need not wait in one
    /// vector.
    pub fn flush(&mut self, out: &mut Vec<FlowRecord>, room: usize) -> bool {
        while self.len > 0 && self.flush_at <= self.mask {
            if out.len() >= room {
                return false;
            }
            let slot = &mut self.slots[self.flush_at];
            if slot.hash != 0 {
                let end = match slot.value.tcp_end() {
                    TcpEnd::Open => EndReason::Forced,
                    TcpEnd::Closed | TcpEnd::Reset => EndReason::EndOfFlow,
                };
                out.push(slot.value.record(&slot.key, end));
                slot.hash = 0;
                self.counters.exported += 1;
                self.len -= 1;
            }
            self.flush_at += 1;
        }
        self.flush_at = 0;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact_key::V4Key;
    use crate::flow_stats::{Observation, TCP_SYN};
    use std::collections::HashMap;

    /// Flows leave at their FIN, as they did before the FIN timeout.
    const AT_FIN: Timeouts = Timeouts {
        fin_ns: 0,
        ..Timeouts::DEFAULT
    };

    fn part(ts_ns: u64, packets: u64, flags: u8) -> FlowStats {
        let o = Observation {
            ts_ns,
            ip_len: 100,
            tcp_flags: flags,
            ..Observation::default()
        };
        let mut s = FlowStats::start(&o);
        for _ in 1..packets {
            s.add(&Observation { tcp_flags: 0, ..o });
        }
        s
    }

    /// Random records against a plain map: every packet is in exactly one exported record,
    /// whatever the table size (evictions when full included), and whatever the pieces the
    /// flush at the end hands over (each no longer than asked).
    #[test]
    fn every_packet_is_exported_once() {
        for (max_flows, piece) in [(1, usize::MAX), (7, 1), (100, 3), (10_000, 1_000)] {
            let mut agg =
                Aggregator::<V4Key, Uniflow>::new(max_flows, Timeouts::default(), 3).unwrap();
            let mut want: HashMap<V4Key, u64> = HashMap::new();
            let mut out = Vec::new();
            let mut x = 12345u64;
            let mut records = Vec::new();
            for t in 0..20_000u64 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = V4Key([x >> 54, 0]);
                let stats = part(
                    t,
                    1 + (x >> 60),
                    if x.is_multiple_of(97) { TCP_FIN } else { 0 },
                );
                *want.entry(key).or_default() += stats.packets;
                records.push(Microflow { key, stats });
            }
            agg.ingest(&records, &mut out);
            assert!(agg.len() <= max_flows);
            let held = agg.len();
            let mut pieces = 0;
            loop {
                let before = out.len();
                let done = agg.flush(&mut out, before.saturating_add(piece));
                assert!(out.len() - before <= piece);
                pieces += 1;
                if done {
                    break;
                }
                assert_eq!(out.len() - before, piece, "a flush stops only when full");
            }
            assert_eq!(pieces, held.div_ceil(piece).max(1), "{held} flows");
            assert_eq!(agg.len(), 0);
            let before = out.len();
            assert!(agg.flush(&mut out, usize::MAX), "an empty table is flushed");
            assert_eq!(out.len(), before);
            let mut got: HashMap<V4Key, u64> = HashMap::new();
            for r in &out {
                *got.entry(V4Key::pack(&r.key).unwrap()).or_default() += r.forward.packets;
            }
            assert_eq!(got, want, "max_flows {max_flows}");
            if max_flows < 1024 {
                assert!(agg.counters.evicted_full > 0);
            }
        }
    }

    /// A flood of new flows into a full table (the synflood repro: 200,000 packets, 80% of
    /// them new flows, against 65,536 flows): every eviction walks a bounded number of
    /// slots, however many evictions came before it. A sample that started from a fixed
    /// place walked further at each eviction, as the slots after that place emptied.
    #[test]
    fn an_eviction_walks_a_bounded_number_of_slots_however_many_came_before() {
        let max_flows = 65_536;
        let mut agg = Aggregator::<V4Key, Uniflow>::new(max_flows, Timeouts::default(), 5).unwrap();
        let mut out = Vec::new();
        let mut x = 99u64;
        let records: Vec<Microflow<V4Key>> = (0..400_000u64)
            .map(|t| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                Microflow {
                    key: V4Key([x >> 16, t]),
                    stats: part(t, 1, 0),
                }
            })
            .collect();
        agg.ingest(&records, &mut out);
        let evictions = agg.counters.evicted_full;
        assert_eq!(evictions, 400_000 - max_flows as u64);
        let per_eviction = agg.evict_walked as f64 / evictions as f64;
        // At least 7/16 full: 64 flows lie within about 146 slots.
        assert!(
            per_eviction < 160.0,
            "{per_eviction:.1} slots walked per eviction"
        );
    }

    /// Every entry is reachable from its home slot without passing an empty one.
    fn assert_findable<K: CompactKey, V: FlowValue>(agg: &Aggregator<K, V>) {
        for (i, slot) in agg.slots.iter().enumerate() {
            if slot.hash == 0 {
                continue;
            }
            assert!(i <= agg.mask, "an entry outside the slots in use");
            let mut j = slot.hash as usize & agg.mask;
            while j != i {
                assert_ne!(agg.slots[j].hash, 0, "slot {i} is cut off from its home");
                j = (j + 1) & agg.mask;
            }
        }
    }

    /// Doubling from two slots, many times over, with many hash seeds: tables this small
    /// have clusters running off the end at almost every doubling, the case the scan must
    /// put back last.
    #[test]
    fn each_doubling_leaves_every_entry_findable() {
        for seed in 0..1000u64 {
            let mut agg =
                Aggregator::<V4Key, Uniflow>::starting_with(2, 5_000, Timeouts::default(), seed)
                    .unwrap();
            let mut out = Vec::new();
            for i in 0..2_000u64 {
                let key = V4Key([i, seed]);
                let before = agg.mask;
                agg.ingest(
                    &[Microflow {
                        key,
                        stats: part(i, 1, 0),
                    }],
                    &mut out,
                );
                if agg.mask != before {
                    assert_findable(&agg);
                }
            }
            assert_findable(&agg);
            assert_eq!((agg.len(), agg.counters.flows_created), (2_000, 2_000));
        }
    }

    /// The table grows in place from its first slots to tens of thousands of flows, and
    /// every flow stays findable through each doubling (and removals between them): a
    /// flow's later records join it rather than start another.
    #[test]
    fn growing_keeps_every_flow_findable() {
        for seed in 0..6u64 {
            let mut agg = Aggregator::<V4Key, Uniflow>::new(100_000, AT_FIN, seed).unwrap();
            assert_eq!(
                agg.memory_bytes(),
                FIRST_SLOTS * size_of::<Slot<V4Key, Uniflow>>()
            );
            let keys: Vec<V4Key> = (0..60_000u64)
                .map(|i| V4Key([i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed, i]))
                .collect();
            let mut out = Vec::new();
            for pass in 0..3u64 {
                let records: Vec<_> = (keys.iter().enumerate())
                    .map(|(i, &key)| {
                        // The second pass ends one flow in ten; the third starts it again.
                        let flags = if pass == 1 && i % 10 == 0 { TCP_FIN } else { 0 };
                        Microflow {
                            key,
                            stats: part(pass, 1, flags),
                        }
                    })
                    .collect();
                agg.ingest(&records, &mut out);
                assert_eq!(agg.len(), 60_000 - if pass == 1 { 6_000 } else { 0 });
                assert_findable(&agg);
            }
            assert_eq!(agg.counters.flows_created, 66_000, "seed {seed}");
            assert!(agg.memory_bytes() > 60_000 * size_of::<Slot<V4Key, Uniflow>>());
            let mut reserved =
                Aggregator::<V4Key, Uniflow>::new(100_000, Timeouts::default(), seed).unwrap();
            reserved.reserve(60_000);
            assert_eq!(
                reserved.memory_bytes(),
                agg.memory_bytes(),
                "reserved as grown"
            );
            reserved.reserve(usize::MAX);
            assert_eq!(reserved.memory_bytes(), reserved.budget_bytes());
            assert!(agg.memory_bytes() <= agg.budget_bytes());
            assert!(agg.flush(&mut out, usize::MAX));
            let mut packets: HashMap<V4Key, u64> = HashMap::new();
            for r in &out {
                *packets.entry(V4Key::pack(&r.key).unwrap()).or_default() += r.forward.packets;
            }
            assert_eq!(packets.len(), 60_000);
            assert!(packets.values().all(|&p| p == 3));
        }
    }

    #[test]
    fn timeouts_and_tcp_end_flows() {
        let t = Timeouts {
            inactive_ns: 100,
            active_ns: 1_000,
            fin_ns: 0,
        };
        let mut agg = Aggregator::<V4Key, Uniflow>::new(64, t, 1).unwrap();
        let mut out = Vec::new();
        let (a, b, c) = (V4Key([1, 1]), V4Key([2, 2]), V4Key([3, 3]));
        agg.ingest(
            &[
                Microflow {
                    key: a,
                    stats: part(0, 2, TCP_SYN),
                },
                Microflow {
                    key: b,
                    stats: part(50, 1, 0),
                },
                Microflow {
                    key: c,
                    stats: part(0, 1, 0),
                },
                Microflow {
                    key: a,
                    stats: part(60, 1, TCP_FIN),
                },
            ],
            &mut out,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].end, out[0].forward.packets),
            (EndReason::EndOfFlow, 3)
        );
        agg.ingest(
            &[Microflow {
                key: c,
                stats: part(990, 1, 0),
            }],
            &mut out,
        );
        agg.sweep(160, 128, &mut out);
        assert_eq!(out.len(), 2, "b idle since 50");
        assert_eq!(out[1].end, EndReason::Idle);
        agg.sweep(1_000, 128, &mut out);
        assert_eq!(
            out[2].end,
            EndReason::Active,
            "c open since 0, active recently"
        );
        assert!(agg.is_empty());
    }

    #[test]
    fn a_closed_flow_waits_the_fin_timeout_for_its_final_ack() {
        let t = Timeouts {
            fin_ns: 100,
            ..Timeouts::DEFAULT
        };
        let mut agg = Aggregator::<V4Key, Uniflow>::new(64, t, 1).unwrap();
        let mut out = Vec::new();
        let (a, b, c) = (V4Key([1, 1]), V4Key([2, 2]), V4Key([3, 3]));
        let record = |key, ts, packets, flags| Microflow {
            key,
            stats: part(ts, packets, flags),
        };
        agg.ingest(
            &[
                record(a, 0, 3, TCP_SYN),
                record(a, 10, 1, TCP_FIN),
                record(b, 0, 2, 0),
                record(b, 10, 1, TCP_RST),
                record(c, 0, 1, TCP_FIN),
            ],
            &mut out,
        );
        assert_eq!(out.len(), 1, "a reset leaves at once, a FIN waits");
        assert_eq!(
            (out[0].forward.packets, out[0].end),
            (3, EndReason::EndOfFlow)
        );
        // a's final ACK joins it; the sweep before a's timeout leaves it (c has been quiet
        // long enough and goes).
        agg.ingest(&[record(a, 60, 1, 0)], &mut out);
        agg.sweep(159, 1024, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(V4Key::pack(&out[1].key), Some(c));
        agg.sweep(160, 1024, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(V4Key::pack(&out[2].key), Some(a));
        assert_eq!(
            (out[2].forward.packets, out[2].end),
            (5, EndReason::EndOfFlow),
            "SYN, FIN and the final ACK in one record, ended by TCP"
        );
        // What comes after the timeout is a flow of its own.
        agg.ingest(&[record(a, 400, 1, 0)], &mut out);
        assert_eq!(agg.len(), 1);
        assert!(agg.flush(&mut out, usize::MAX));
        assert_eq!((out[3].forward.packets, out[3].end), (1, EndReason::Forced));
    }

    #[test]
    fn a_full_table_makes_room_with_a_closed_flow_first() {
        let t = Timeouts {
            fin_ns: 1_000,
            ..Timeouts::DEFAULT
        };
        let mut agg = Aggregator::<V4Key, Uniflow>::new(4, t, 1).unwrap();
        let mut out = Vec::new();
        let records: Vec<_> = (0..4u64)
            .map(|i| Microflow {
                key: V4Key([i, i]),
                // Flow 3 is the most recently active, but closed.
                stats: part(i, 1, if i == 3 { TCP_FIN } else { 0 }),
            })
            .collect();
        agg.ingest(&records, &mut out);
        assert!(out.is_empty());
        agg.ingest(
            &[Microflow {
                key: V4Key([9, 9]),
                stats: part(10, 1, 0),
            }],
            &mut out,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(V4Key::pack(&out[0].key), Some(V4Key([3, 3])));
        assert_eq!(out[0].end, EndReason::EndOfFlow);
        assert_eq!(agg.counters.evicted_full, 1);
        // With no closed flow, the least recently active goes.
        agg.ingest(
            &[Microflow {
                key: V4Key([8, 8]),
                stats: part(11, 1, 0),
            }],
            &mut out,
        );
        assert_eq!(V4Key::pack(&out[1].key), Some(V4Key([0, 0])));
        assert_eq!(out[1].end, EndReason::LackOfResources);
    }

    #[test]
    fn biflows_take_the_opener_as_forward() {
        let mut agg = Aggregator::<V4Key, Biflow>::new(16, AT_FIN, 1).unwrap();
        let client = V4Key::pack(&stateplane_wire::FlowKey::v4(
            [198, 18, 9, 9].into(),
            [198, 18, 0, 1].into(),
            6,
            50000,
            80,
        ))
        .unwrap();
        let mut out = Vec::new();
        // The server's packets arrive first at the aggregator, but were sent later.
        agg.ingest(
            &[
                Microflow {
                    key: client.reversed(),
                    stats: part(20, 3, TCP_FIN),
                },
                Microflow {
                    key: client,
                    stats: part(10, 4, TCP_SYN),
                },
            ],
            &mut out,
        );
        assert!(out.is_empty(), "one FIN is not the end of a biflow");
        agg.ingest(
            &[Microflow {
                key: client,
                stats: part(40, 1, TCP_FIN),
            }],
            &mut out,
        );
        assert_eq!(out.len(), 1);
        let r = out[0];
        assert_eq!(V4Key::pack(&r.key), Some(client));
        assert_eq!(r.forward.packets, 5);
        assert_eq!(r.reverse.map(|s| s.packets), Some(3));
    }
}
