//! Counters of the runtime: one documented enum, plain counts on the fast path, published
//! once per burst to atomics that the progress display and the metrics endpoint read.

use crate::program::DropReason;
use stateplane_wire::Malformed;
use std::sync::atomic::{AtomicU64, Ordering};

/// Every scalar counter a worker keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Packets and bytes (captured length) received by the worker.
    RxPackets,
    RxBytes,
    /// Packets and bytes the program forwarded to a port.
    TxPackets,
    TxBytes,
    /// Packets handed to the control plane.
    ToControl,
    /// Packets dropped, all reasons together (by reason: `Stats::drops`).
    Dropped,
    /// Packets that failed to parse (by reason: `Stats::malformed`); also counted in `Dropped`.
    Malformed,
    /// Bursts processed.
    Bursts,
}

impl Counter {
    pub const COUNT: usize = 8;
    pub const ALL: [Counter; Self::COUNT] = [
        Counter::RxPackets,
        Counter::RxBytes,
        Counter::TxPackets,
        Counter::TxBytes,
        Counter::ToControl,
        Counter::Dropped,
        Counter::Malformed,
        Counter::Bursts,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Counter::RxPackets => "rx_packets",
            Counter::RxBytes => "rx_bytes",
            Counter::TxPackets => "tx_packets",
            Counter::TxBytes => "tx_bytes",
            Counter::ToControl => "to_control",
            Counter::Dropped => "dropped",
            Counter::Malformed => "malformed",
            Counter::Bursts => "bursts",
        }
    }

    /// What the counter counts, in a line (a metric's help).
    pub fn help(self) -> &'static str {
        match self {
            Counter::RxPackets => "Packets received by the workers",
            Counter::RxBytes => "Bytes (as captured) received by the workers",
            Counter::TxPackets => "Packets the program forwarded to a port",
            Counter::TxBytes => "Bytes the program forwarded to a port",
            Counter::ToControl => "Packets handed to the control plane",
            Counter::Dropped => "Packets dropped, all reasons together",
            Counter::Malformed => "Packets that failed to parse (also counted as dropped)",
            Counter::Bursts => "Bursts processed",
        }
    }
}

/// A worker's counts. Plain integers: only the owning worker writes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stats {
    pub counters: [u64; Counter::COUNT],
    pub drops: [u64; DropReason::COUNT],
    pub malformed: [u64; Malformed::COUNT],
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            counters: [0; Counter::COUNT],
            drops: [0; DropReason::COUNT],
            malformed: [0; Malformed::COUNT],
        }
    }
}

impl Stats {
    #[inline(always)]
    pub fn add(&mut self, c: Counter, n: u64) {
        self.counters[c as usize] += n;
    }

    /// Takes back `n` of what was added to `c` (no further than 0).
    pub fn take(&mut self, c: Counter, n: u64) {
        let counter = &mut self.counters[c as usize];
        *counter = counter.saturating_sub(n);
    }

    pub fn get(&self, c: Counter) -> u64 {
        self.counters[c as usize]
    }

    /// Adds `other` into `self` (for totals over workers).
    pub fn merge(&mut self, other: &Stats) {
        let sum = |a: &mut [u64], b: &[u64]| a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
        sum(&mut self.counters, &other.counters);
        sum(&mut self.drops, &other.drops);
        sum(&mut self.malformed, &other.malformed);
    }

    /// Drop reasons with a non-zero count, named.
    pub fn drops_by_reason(&self, program_reasons: &[&'static str]) -> Vec<(&'static str, u64)> {
        self.drops_named(program_reasons, false)
    }

    /// Every reason the runtime and the program name, with its count, 0 included (and any
    /// other code that counted): what a metrics family lists from the first scrape, so that
    /// a rate over it starts from 0 rather than from a series that appears.
    pub fn drops_by_every_reason(
        &self,
        program_reasons: &[&'static str],
    ) -> Vec<(&'static str, u64)> {
        self.drops_named(program_reasons, true)
    }

    fn drops_named(
        &self,
        program_reasons: &[&'static str],
        every: bool,
    ) -> Vec<(&'static str, u64)> {
        (0..DropReason::COUNT)
            .map(|i| DropReason(i as u8))
            .filter(|&r| self.drops[r.0 as usize] > 0 || (every && r.is_named(program_reasons)))
            .map(|r| (r.name(program_reasons), self.drops[r.0 as usize]))
            .collect()
    }

    /// Malformed reasons with a non-zero count, named.
    pub fn malformed_by_reason(&self) -> Vec<(&'static str, u64)> {
        (self.malformed_by_every_reason().into_iter())
            .filter(|&(_, n)| n > 0)
            .collect()
    }

    /// Every malformed reason with its count, 0 included.
    pub fn malformed_by_every_reason(&self) -> Vec<(&'static str, u64)> {
        (Malformed::ALL.iter())
            .map(|m| (m.name(), self.malformed[m.index()]))
            .collect()
    }
}

/// A worker's counters as atomics, written by that worker once per burst (relaxed stores of
/// its own running totals: no read-modify-write, no contention) and read by anyone.
pub struct SharedStats {
    counters: [AtomicU64; Counter::COUNT],
    drops: [AtomicU64; DropReason::COUNT],
    malformed: [AtomicU64; Malformed::COUNT],
}

impl Default for SharedStats {
    fn default() -> Self {
        SharedStats {
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
            drops: std::array::from_fn(|_| AtomicU64::new(0)),
            malformed: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl SharedStats {
    pub fn publish(&self, s: &Stats) {
        let store = |a: &[AtomicU64], v: &[u64]| {
            a.iter()
                .zip(v)
                .for_each(|(a, v)| a.store(*v, Ordering::Relaxed))
        };
        store(&self.counters, &s.counters);
        store(&self.drops, &s.drops);
        store(&self.malformed, &s.malformed);
    }

    pub fn snapshot(&self) -> Stats {
        let load = |a: &[AtomicU64], v: &mut [u64]| {
            a.iter()
                .zip(v)
                .for_each(|(a, v)| *v = a.load(Ordering::Relaxed))
        };
        let mut s = Stats::default();
        load(&self.counters, &mut s.counters);
        load(&self.drops, &mut s.drops);
        load(&self.malformed, &mut s.malformed);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The metrics list every reason the runtime and the program name, at 0 until they
    /// count, and any unnamed code that counted; the summary lists only what counted.
    #[test]
    fn every_named_reason_is_listed_and_only_counted_ones_are_summed_up() {
        let mut stats = Stats::default();
        stats.drops[DropReason::program(1).0 as usize] = 3;
        stats.drops[DropReason::program(40).0 as usize] = 2;
        let program = ["blocked", "rate_limited"];
        let every = stats.drops_by_every_reason(&program);
        assert_eq!(every.len(), 8 + 2 + 1, "{every:?}");
        assert_eq!(every[0], ("no_verdict", 0));
        assert!(every.contains(&("blocked", 0)));
        assert!(every.contains(&("rate_limited", 3)));
        assert!(every.contains(&("program_unnamed", 2)));
        assert_eq!(
            stats.drops_by_reason(&program),
            vec![("rate_limited", 3), ("program_unnamed", 2)]
        );
        assert_eq!(stats.malformed_by_every_reason().len(), Malformed::COUNT);
        assert!(stats.malformed_by_reason().is_empty());
    }
}
