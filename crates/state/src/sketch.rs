//! A count-min sketch on registers: `depth` rows of `width` counters, each row indexed by
//! its own hash of the key; the estimate is the smallest of the key's counters. It never
//! underestimates, and overestimates by more than `e * N / width` (N: total count) with
//! probability at most `e^-depth`.

use crate::register::Register;
use crate::table_key::TableKey;

#[derive(Debug, Clone)]
pub struct CountMin {
    rows: Register<u32>,
    width: usize,
    depth: usize,
    seeds: Vec<u64>,
}

impl CountMin {
    /// `width` is rounded up to a power of two; `seed` keys the row hashes.
    /// The bytes a sketch of `depth` rows of `width` counters allocates (the width rounded
    /// up to a power of two, as [`CountMin::new`] does).
    pub fn bytes_for(depth: usize, width: usize) -> u64 {
        let cells = depth.max(1) as u64 * width.max(1).next_power_of_two() as u64;
        cells * std::mem::size_of::<u32>() as u64
    }

    pub fn new(depth: usize, width: usize, seed: u64) -> Self {
        let width = width.max(1).next_power_of_two();
        let depth = depth.max(1);
        CountMin {
            rows: Register::new(depth * width),
            width,
            depth,
            seeds: (0..depth as u64)
                .map(|r| seed ^ (r + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect(),
        }
    }

    /// Tracks every change of a counter as state `state` (`Register::track`); counter
    /// `row * width + column` is the location `first + row * width + column`.
    pub fn track(&mut self, state: u16, first: u32) {
        self.rows.track(state, first);
    }

    /// The counters, row after row (what the control plane reads and the sync sends).
    pub fn counters(&self) -> &Register<u32> {
        &self.rows
    }

    /// The counters to write (a control-plane or top-down write; tracked like the data
    /// plane's own changes).
    pub fn counters_mut(&mut self) -> &mut Register<u32> {
        &mut self.rows
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn depth(&self) -> usize {
        self.depth
    }

    #[inline]
    fn cell(&self, row: usize, key: &impl TableKey) -> usize {
        cell_in(self.width, row, self.seeds[row], key)
    }

    /// Adds `n` to `key`'s count (saturating); returns the new estimate.
    #[inline]
    pub fn add(&mut self, key: &impl TableKey, n: u32) -> u32 {
        let mut estimate = u32::MAX;
        let (width, seeds) = (self.width, &self.seeds);
        let cells = (seeds.iter().enumerate()).map(|(row, &seed)| cell_in(width, row, seed, key));
        self.rows.update_each(cells, |c| {
            *c = c.saturating_add(n);
            estimate = estimate.min(*c);
        });
        estimate
    }

    /// The counter `key` maps to in each row, as indexes into [`CountMin::counters`]: what
    /// a copy of the counters elsewhere (a sync collector's) needs to estimate `key`.
    pub fn cells_of(&self, key: &impl TableKey) -> Vec<usize> {
        (0..self.depth).map(|row| self.cell(row, key)).collect()
    }

    pub fn estimate(&self, key: &impl TableKey) -> u32 {
        (0..self.depth)
            .map(|row| self.rows.read(self.cell(row, key)).unwrap_or(0))
            .min()
            .unwrap_or(0)
    }

    /// Starts a new interval.
    pub fn clear(&mut self) {
        self.rows.clear();
    }

    /// Whether `other` has the same rows of the same width, hashed alike: whether a key's
    /// counters are in the same cells in both.
    pub fn hashed_alike(&self, other: &CountMin) -> bool {
        (self.width, self.depth, &self.seeds) == (other.width, other.depth, &other.seeds)
    }

    /// Takes `old`'s counts (a reload), when its counts mean the same here: the same rows
    /// of the same width, hashed alike. Each counter taken is written as the data plane
    /// writes one (a synced copy sees it change). Returns the counters taken (0: none, the
    /// shapes differ).
    pub fn adopt(&mut self, old: &CountMin) -> u64 {
        if !self.hashed_alike(old) {
            return 0;
        }
        for (i, &count) in old.rows.as_slice().iter().enumerate() {
            if self.rows.as_slice()[i] != count {
                let _ = self.rows.write(i, count);
            }
        }
        old.rows.len() as u64
    }
}

/// Row `row`'s counter for `key`, hashed with the row's `seed`, in rows of `width` (a power
/// of two).
#[inline]
fn cell_in(width: usize, row: usize, seed: u64, key: &impl TableKey) -> usize {
    row * width + (key.hash_with(seed) as usize & (width - 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_sketch_takes_the_counts_of_one_hashed_alike_only() {
        let mut old = CountMin::new(4, 256, 9);
        for k in 0..500u64 {
            old.add(&k, 1 + (k % 7) as u32);
        }
        let mut new = CountMin::new(4, 256, 9);
        assert_eq!(new.adopt(&old), 4 * 256);
        assert!((0..500u64).all(|k| new.estimate(&k) == old.estimate(&k)));
        for other in [
            CountMin::new(4, 512, 9),
            CountMin::new(3, 256, 9),
            CountMin::new(4, 256, 8),
        ] {
            let mut other = other;
            assert_eq!(other.adopt(&old), 0);
            assert_eq!(other.estimate(&3u64), 0);
        }
    }

    #[test]
    fn bytes_for_is_what_a_sketch_allocates() {
        for (depth, width) in [(1, 1), (4, 1000), (8, 1 << 16)] {
            let sketch = CountMin::new(depth, width, 5);
            let allocated = sketch.rows.len() * size_of::<u32>();
            assert_eq!(CountMin::bytes_for(depth, width), allocated as u64);
        }
    }

    #[test]
    fn a_copy_of_the_counters_estimates_as_the_sketch_does() {
        let mut s = CountMin::new(3, 64, 9);
        for k in 0..500u64 {
            s.add(&k, (k % 7) as u32 + 1);
        }
        let copy = s.counters().as_slice().to_vec();
        for k in 0..600u64 {
            let cells = s.cells_of(&k);
            assert_eq!(cells.len(), 3);
            let from_copy = cells.iter().map(|&c| copy[c]).min();
            assert_eq!(from_copy, Some(s.estimate(&k)), "key {k}");
        }
    }

    /// A skewed stream: estimates are never below the truth, and keys over the error bound
    /// are within the sketch's failure probability.
    #[test]
    fn never_underestimates_and_keeps_its_error_bound() {
        let (depth, width) = (4, 1024);
        let mut s = CountMin::new(depth, width, 7);
        let mut truth: HashMap<u64, u32> = HashMap::new();
        let mut x = 1u64;
        let mut total = 0u64;
        for _ in 0..200_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Zipf-ish: small keys are much more frequent.
            let key = (x >> 33) % ((x >> 20) % 5000 + 1);
            s.add(&key, 1);
            *truth.entry(key).or_default() += 1;
            total += 1;
        }
        let bound = (std::f64::consts::E * total as f64 / width as f64) as u32;
        let mut over = 0;
        for (k, &t) in &truth {
            let e = s.estimate(k);
            assert!(e >= t, "key {k}: estimate {e} below {t}");
            if e - t > bound {
                over += 1;
            }
        }
        let allowed = (truth.len() as f64 * (-(depth as f64)).exp() * 3.0).ceil() as usize;
        assert!(
            over <= allowed,
            "{over} of {} keys over the bound (allowed {allowed})",
            truth.len()
        );
        s.clear();
        assert_eq!(s.estimate(&0u64), 0);
    }
}
