//! Longest-prefix-match tables for IPv4 and IPv6 forwarding, built for lookups.
//!
//! * IPv4: DIR-24-8. A 2^24-entry first level indexed by the address's top 24 bits answers
//!   every prefix up to /24 in one memory access; an entry covering a longer prefix points
//!   to a 256-entry second-level group indexed by the last byte (two accesses).
//! * IPv6: a multibit trie of stride 8: nodes of 256 entries, one level per address byte,
//!   so a /48 takes six accesses. Each entry holds a result or a child pointer; a new
//!   child inherits its parent entry's result, so no backtracking is ever needed.
//!
//! Each result entry holds the slot of the prefix that painted it (slot + 1; 0 is "no
//! route"), and each slot knows its prefix's length. So an insert paints only the entries
//! in its range whose prefix is shorter, and a remove repaints only the entries that hold
//! its own slot, with the next longest prefix covering them (found in a hash index of the
//! prefixes, at most one probe per shorter length). Both touch nothing outside the range.
//! A build inserts shortest first. Programs keep a table read-only on the data path and
//! publish an updated copy between bursts, so a lookup never waits for an update.
//! Second-level groups and trie nodes a removal leaves unused are kept (memory only).

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};

/// A prefix could not be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefixError {
    /// The length is beyond the address size.
    Length { len: u8, max: u8 },
    /// More second-level groups or nodes than the table was sized for.
    Full,
}

impl std::fmt::Display for PrefixError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PrefixError::Length { len, max } => {
                write!(f, "prefix length /{len} is longer than /{max}")
            }
            PrefixError::Full => write!(f, "the table is full"),
        }
    }
}

const EXTENDED: u32 = 1 << 31;

/// An address as a table keys its prefixes: the bits beyond a length can be cleared.
trait Addr: Copy + Eq + std::hash::Hash {
    const BITS: u8;
    fn masked(self, len: u8) -> Self;
}

impl Addr for u32 {
    const BITS: u8 = 32;
    fn masked(self, len: u8) -> u32 {
        self & mask32(len)
    }
}

impl Addr for u128 {
    const BITS: u8 = 128;
    fn masked(self, len: u8) -> u128 {
        if len == 0 {
            0
        } else {
            self & (u128::MAX << (128 - u32::from(len)))
        }
    }
}

/// The prefixes of a table: each one's value and length in a slot, and the slots by
/// prefix. A table entry that is not a pointer holds a slot + 1 (0: no route), so an entry
/// tells which prefix painted it, and how long that prefix is.
#[derive(Clone)]
struct Prefixes<A: Addr, V> {
    values: Vec<V>,
    lens: Vec<u8>,
    free: Vec<u32>,
    slots: HashMap<(A, u8), u32>,
}

impl<A: Addr, V: Copy> Prefixes<A, V> {
    fn new() -> Self {
        Prefixes {
            values: Vec::new(),
            lens: Vec::new(),
            free: Vec::new(),
            slots: HashMap::new(),
        }
    }

    fn check(len: u8) -> Result<(), PrefixError> {
        if len > A::BITS {
            return Err(PrefixError::Length { len, max: A::BITS });
        }
        Ok(())
    }

    /// For an insert: the masked address of a prefix not there yet, or `None` when it was
    /// there and has taken `value`.
    fn new_prefix(&mut self, a: A, len: u8, value: V) -> Result<Option<A>, PrefixError> {
        Self::check(len)?;
        let a = a.masked(len);
        match self.slots.get(&(a, len)) {
            Some(&slot) => {
                self.values[slot as usize] = value;
                Ok(None)
            }
            None => Ok(Some(a)),
        }
    }

    /// For a remove: forgets the prefix; its masked address, its entry, and the entry of
    /// the prefix its addresses fall back to. The slot is free for the next add (the
    /// caller repaints before any add).
    fn take(&mut self, a: A, len: u8) -> Option<(A, u32, u32)> {
        let a = a.masked(len);
        let slot = self.slots.remove(&(a, len))?;
        self.free.push(slot);
        Some((a, slot + 1, self.covering(a, len)))
    }

    /// The length of the prefix that painted entry `e`, -1 for no route.
    fn len_of(&self, e: u32) -> i16 {
        match e.checked_sub(1) {
            Some(slot) => i16::from(self.lens[slot as usize]),
            None => -1,
        }
    }

    /// Takes a slot for a new prefix; its entry value.
    fn add(&mut self, a: A, len: u8, value: V) -> Result<u32, PrefixError> {
        let slot = match self.free.pop() {
            Some(s) => {
                self.values[s as usize] = value;
                self.lens[s as usize] = len;
                s
            }
            None => {
                let s = self.values.len() as u32;
                if s + 1 >= EXTENDED {
                    return Err(PrefixError::Full);
                }
                self.values.push(value);
                self.lens.push(len);
                s
            }
        };
        self.slots.insert((a, len), slot);
        Ok(slot + 1)
    }

    fn get(&self, a: A, len: u8) -> Option<&V> {
        let slot = self.slots.get(&(a.masked(len.min(A::BITS)), len))?;
        Some(&self.values[*slot as usize])
    }

    /// The bytes its vectors and index have allocated (a hash map's slot: key, value and
    /// one control byte).
    fn memory(&self) -> usize {
        self.values.capacity() * size_of::<V>()
            + self.lens.capacity()
            + self.free.capacity() * size_of::<u32>()
            + self.slots.capacity() * (size_of::<((A, u8), u32)>() + 1)
    }

    fn iter(&self) -> impl Iterator<Item = (A, u8, &V)> {
        self.slots
            .iter()
            .map(|(&(a, len), &slot)| (a, len, &self.values[slot as usize]))
    }

    /// The entry of the longest prefix strictly shorter than `len` that covers `a`.
    fn covering(&self, a: A, len: u8) -> u32 {
        (0..len)
            .rev()
            .find_map(|l| self.slots.get(&(a.masked(l), l)))
            .map_or(0, |&s| s + 1)
    }
}

/// IPv4 longest-prefix match (DIR-24-8) to values of type `V`.
pub struct Lpm4<V> {
    tbl24: Box<[u32]>,
    tbl8: Vec<u32>,
    prefixes: Prefixes<u32, V>,
}

impl<V: Copy> Lpm4<V> {
    /// An empty table (its first level, 64 MiB, is allocated here, on huge pages where the
    /// kernel gives them).
    pub fn new() -> Self {
        Lpm4 {
            tbl24: stateplane_mem::huge_vec(1 << 24, 0u32, true)
                .0
                .into_boxed_slice(),
            tbl8: Vec::new(),
            prefixes: Prefixes::new(),
        }
    }

    /// Builds the table from `(address, length, value)` prefixes; for duplicates the last
    /// one wins. Host bits beyond the length are ignored. Shortest first, so each insert
    /// paints its range once.
    pub fn build(prefixes: &[(Ipv4Addr, u8, V)]) -> Result<Self, PrefixError> {
        build_shortest_first(Lpm4::new(), prefixes, 32, Lpm4::insert)
    }

    /// Adds a prefix, or changes the value of one already there. Touches only the entries
    /// the prefix covers.
    pub fn insert(&mut self, addr: Ipv4Addr, len: u8, value: V) -> Result<(), PrefixError> {
        let Some(a) = self.prefixes.new_prefix(u32::from(addr), len, value)? else {
            return Ok(());
        };
        if len > 24 && self.tbl24[(a >> 8) as usize] & EXTENDED == 0 {
            let g = self.tbl8.len() / 256;
            if g >= (EXTENDED as usize) / 256 {
                return Err(PrefixError::Full);
            }
            let inherited = self.tbl24[(a >> 8) as usize];
            self.tbl8.extend(std::iter::repeat_n(inherited, 256));
            self.tbl24[(a >> 8) as usize] = EXTENDED | g as u32;
        }
        let entry = self.prefixes.add(a, len, value)?;
        let l = i16::from(len);
        let prefixes = &self.prefixes;
        paint4(&mut self.tbl24, &mut self.tbl8, a, len, &|old| {
            (prefixes.len_of(old) < l).then_some(entry)
        });
        Ok(())
    }

    /// Removes a prefix; the addresses it covered fall back to the next longest prefix
    /// covering them. Whether it was there.
    pub fn remove(&mut self, addr: Ipv4Addr, len: u8) -> bool {
        let Some((a, entry, fallback)) = self.prefixes.take(u32::from(addr), len) else {
            return false;
        };
        paint4(&mut self.tbl24, &mut self.tbl8, a, len, &|old| {
            (old == entry).then_some(fallback)
        });
        true
    }

    /// The value of the longest prefix containing `addr`.
    #[inline]
    pub fn lookup(&self, addr: u32) -> Option<&V> {
        let mut e = self.tbl24[(addr >> 8) as usize];
        if e & EXTENDED != 0 {
            e = self.tbl8[((e & !EXTENDED) as usize) * 256 + (addr & 0xff) as usize];
        }
        e.checked_sub(1).map(|i| &self.prefixes.values[i as usize])
    }

    /// How many prefixes the table holds.
    pub fn len(&self) -> usize {
        self.prefixes.slots.len()
    }

    /// The value of exactly this prefix, if the table has it.
    pub fn get(&self, addr: Ipv4Addr, len: u8) -> Option<&V> {
        self.prefixes.get(u32::from(addr), len)
    }

    /// Every prefix (in no particular order) with its value.
    pub fn iter(&self) -> impl Iterator<Item = (Ipv4Addr, u8, &V)> {
        self.prefixes
            .iter()
            .map(|(a, len, v)| (Ipv4Addr::from(a), len, v))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the table has allocated: its lookup levels, values and prefix index.
    pub fn memory(&self) -> usize {
        self.tbl24.len() * 4 + self.tbl8.capacity() * 4 + self.prefixes.memory()
    }
}

impl<V: Copy> Default for Lpm4<V> {
    fn default() -> Self {
        Self::new()
    }
}

/// A copy with its first level on huge pages again (a derived clone would not ask).
impl<V: Copy> Clone for Lpm4<V> {
    fn clone(&self) -> Self {
        let mut tbl24 = stateplane_mem::huge_vec(self.tbl24.len(), 0u32, true).0;
        tbl24.copy_from_slice(&self.tbl24);
        Lpm4 {
            tbl24: tbl24.into_boxed_slice(),
            tbl8: self.tbl8.clone(),
            prefixes: self.prefixes.clone(),
        }
    }
}

/// Rewrites, as `paint` says, each result `a/len` covers (second-level groups included).
fn paint4(
    tbl24: &mut [u32],
    tbl8: &mut [u32],
    a: u32,
    len: u8,
    paint: &dyn Fn(u32) -> Option<u32>,
) {
    let one = |e: &mut u32| {
        if let Some(new) = paint(*e) {
            *e = new;
        }
    };
    if len <= 24 {
        let first = (a >> 8) as usize;
        for e in &mut tbl24[first..first + (1usize << (24 - len))] {
            if *e & EXTENDED != 0 {
                let g = (*e & !EXTENDED) as usize * 256;
                tbl8[g..g + 256].iter_mut().for_each(one);
            } else {
                one(e);
            }
        }
    } else if let e = tbl24[(a >> 8) as usize]
        && e & EXTENDED != 0
    {
        let first = (e & !EXTENDED) as usize * 256 + (a & 0xff) as usize;
        tbl8[first..first + (1usize << (32 - len))]
            .iter_mut()
            .for_each(one);
    }
}

fn mask32(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    }
}

/// IPv6 longest-prefix match (stride-8 multibit trie) to values of type `V`.
#[derive(Clone)]
pub struct Lpm6<V> {
    /// Nodes of 256 entries each; node 0 is the root.
    nodes: Vec<u32>,
    prefixes: Prefixes<u128, V>,
}

impl<V: Copy> Lpm6<V> {
    pub fn new() -> Self {
        Lpm6 {
            nodes: vec![0u32; 256],
            prefixes: Prefixes::new(),
        }
    }

    /// As [`Lpm4::build`].
    pub fn build(prefixes: &[(Ipv6Addr, u8, V)]) -> Result<Self, PrefixError> {
        build_shortest_first(Lpm6::new(), prefixes, 128, Lpm6::insert)
    }

    /// As [`Lpm4::insert`].
    pub fn insert(&mut self, addr: Ipv6Addr, len: u8, value: V) -> Result<(), PrefixError> {
        let Some(a) = self.prefixes.new_prefix(u128::from(addr), len, value)? else {
            return Ok(());
        };
        let node = self.node_of(a, len, true)?;
        let entry = self.prefixes.add(a, len, value)?;
        let l = i16::from(len);
        let (nodes, prefixes) = (&mut self.nodes, &self.prefixes);
        paint_range(nodes, node, a, len, &|old| {
            (prefixes.len_of(old) < l).then_some(entry)
        });
        Ok(())
    }

    /// As [`Lpm4::remove`].
    pub fn remove(&mut self, addr: Ipv6Addr, len: u8) -> bool {
        let Some((a, entry, fallback)) = self.prefixes.take(u128::from(addr), len) else {
            return false;
        };
        if let Ok(node) = self.node_of(a, len, false) {
            paint_range(&mut self.nodes, node, a, len, &|old| {
                (old == entry).then_some(fallback)
            });
        }
        true
    }

    /// The node holding the last byte of `a/len`, made on the way (children inherit their
    /// parent entry's result) when `make`; `Full` when it cannot be.
    fn node_of(&mut self, a: u128, len: u8, make: bool) -> Result<usize, PrefixError> {
        let bytes = a.to_be_bytes();
        let mut node = 0usize;
        for &b in &bytes[..last_byte(len)] {
            let at = node * 256 + usize::from(b);
            let e = self.nodes[at];
            node = if e & EXTENDED != 0 {
                (e & !EXTENDED) as usize
            } else if make {
                let child = self.nodes.len() / 256;
                if child >= (EXTENDED as usize) / 256 {
                    return Err(PrefixError::Full);
                }
                self.nodes.extend(std::iter::repeat_n(e, 256));
                self.nodes[at] = EXTENDED | child as u32;
                child
            } else {
                return Err(PrefixError::Full);
            };
        }
        Ok(node)
    }

    #[inline]
    pub fn lookup(&self, addr: &Ipv6Addr) -> Option<&V> {
        let bytes = addr.octets();
        let mut node = 0usize;
        for &b in &bytes {
            let e = self.nodes[node * 256 + usize::from(b)];
            if e & EXTENDED == 0 {
                return e.checked_sub(1).map(|i| &self.prefixes.values[i as usize]);
            }
            node = (e & !EXTENDED) as usize;
        }
        None
    }

    pub fn len(&self) -> usize {
        self.prefixes.slots.len()
    }

    pub fn get(&self, addr: Ipv6Addr, len: u8) -> Option<&V> {
        self.prefixes.get(u128::from(addr), len)
    }

    pub fn iter(&self) -> impl Iterator<Item = (Ipv6Addr, u8, &V)> {
        self.prefixes
            .iter()
            .map(|(a, len, v)| (Ipv6Addr::from(a), len, v))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the table has allocated: its nodes, values and prefix index.
    pub fn memory(&self) -> usize {
        self.nodes.capacity() * 4 + self.prefixes.memory()
    }
}

impl<V: Copy> Default for Lpm6<V> {
    fn default() -> Self {
        Self::new()
    }
}

/// Builds a table by inserting `prefixes` shortest first (so each insert paints its range
/// once); lengths are checked against `max` before anything is inserted.
fn build_shortest_first<T, P: Copy, V: Copy>(
    mut table: T,
    prefixes: &[(P, u8, V)],
    max: u8,
    insert: impl Fn(&mut T, P, u8, V) -> Result<(), PrefixError>,
) -> Result<T, PrefixError> {
    if let Some(&(_, len, _)) = prefixes.iter().find(|p| p.1 > max) {
        return Err(PrefixError::Length { len, max });
    }
    let mut order: Vec<usize> = (0..prefixes.len()).collect();
    order.sort_by_key(|&i| prefixes[i].1);
    for i in order {
        let (addr, len, value) = prefixes[i];
        insert(&mut table, addr, len, value)?;
    }
    Ok(table)
}

/// The index of the address byte that holds a prefix's last bit (0 for /0).
fn last_byte(len: u8) -> usize {
    usize::from(len.saturating_sub(1) / 8)
}

/// Rewrites, as `paint` says, every result `a/len` covers in `node`, down through the
/// children there.
fn paint_range(
    nodes: &mut [u32],
    node: usize,
    a: u128,
    len: u8,
    paint: &dyn Fn(u32) -> Option<u32>,
) {
    let d = last_byte(len);
    let bits = len - 8 * d as u8; // 0 to 8 bits of the prefix in byte d
    let keep = if bits == 0 { 0 } else { 0xffu8 << (8 - bits) };
    let first = node * 256 + usize::from(a.to_be_bytes()[d] & keep);
    for at in first..first + (1usize << (8 - bits)) {
        paint_subtree(nodes, at, paint);
    }
}

fn paint_subtree(nodes: &mut [u32], at: usize, paint: &dyn Fn(u32) -> Option<u32>) {
    let e = nodes[at];
    if e & EXTENDED != 0 {
        let child = (e & !EXTENDED) as usize * 256;
        for i in child..child + 256 {
            paint_subtree(nodes, i, paint);
        }
    } else if let Some(new) = paint(e) {
        nodes[at] = new;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefixes;
    use proptest::prelude::*;

    /// The reference: the longest matching prefix by a linear scan (last wins on ties).
    fn linear4(prefixes: &[(Ipv4Addr, u8, u32)], addr: u32) -> Option<u32> {
        let mut best: Option<(u8, usize)> = None;
        for (i, &(p, len, _)) in prefixes.iter().enumerate() {
            if addr & mask32(len) == u32::from(p) & mask32(len)
                && best.is_none_or(|(l, j)| len > l || (len == l && i > j))
            {
                best = Some((len, i));
            }
        }
        best.map(|(_, i)| prefixes[i].2)
    }

    fn linear6(prefixes: &[(Ipv6Addr, u8, u32)], addr: &Ipv6Addr) -> Option<u32> {
        let mask = |len: u8| {
            if len == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(len))
            }
        };
        let a = u128::from(*addr);
        let mut best: Option<(u8, usize)> = None;
        for (i, &(p, len, _)) in prefixes.iter().enumerate() {
            if a & mask(len) == u128::from(p) & mask(len)
                && best.is_none_or(|(l, j)| len > l || (len == l && i > j))
            {
                best = Some((len, i));
            }
        }
        best.map(|(_, i)| prefixes[i].2)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Random prefix sets (nested and overlapping, all lengths) against a linear scan,
        /// at addresses near the prefixes' edges and at random.
        #[test]
        fn ipv4_matches_a_linear_scan(
            raw in proptest::collection::vec((any::<u32>(), 0u8..=32), 1..60),
            probes in proptest::collection::vec(any::<u32>(), 50),
        ) {
            // Cluster addresses under a few /8s so that prefixes nest.
            let prefixes: Vec<(Ipv4Addr, u8, u32)> = raw
                .iter()
                .enumerate()
                .map(|(i, &(a, len))| (Ipv4Addr::from((a & 0x03ff_ffff) | 0xc600_0000), len, i as u32))
                .collect();
            let t = Lpm4::build(&prefixes).unwrap();
            let mut addrs: Vec<u32> = probes.iter().map(|p| (p & 0x03ff_ffff) | 0xc600_0000).collect();
            for &(p, len, _) in &prefixes {
                let base = u32::from(p) & mask32(len);
                addrs.push(base);
                addrs.push(base | !mask32(len));
                addrs.push(base.wrapping_sub(1));
            }
            for a in addrs {
                prop_assert_eq!(t.lookup(a).copied(), linear4(&prefixes, a), "address {}", Ipv4Addr::from(a));
            }
        }

        #[test]
        fn ipv6_matches_a_linear_scan(
            raw in proptest::collection::vec((any::<u64>(), 0u8..=128), 1..40),
            probes in proptest::collection::vec(any::<u64>(), 50),
        ) {
            let addr = |x: u64| Ipv6Addr::from((0x2001_0002u128 << 96) | (u128::from(x) << 32) | u128::from(x >> 40));
            let prefixes: Vec<(Ipv6Addr, u8, u32)> = raw
                .iter()
                .enumerate()
                .map(|(i, &(a, len))| (addr(a & 0xffff_f0ff_ffff_ffff), len, i as u32))
                .collect();
            let t = Lpm6::build(&prefixes).unwrap();
            let mut addrs: Vec<Ipv6Addr> = probes.iter().map(|&p| addr(p)).collect();
            for &(p, len, _) in &prefixes {
                let m = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) };
                let base = u128::from(p) & m;
                addrs.push(Ipv6Addr::from(base));
                addrs.push(Ipv6Addr::from(base | !m));
                addrs.push(Ipv6Addr::from(base.wrapping_sub(1)));
            }
            for a in addrs {
                prop_assert_eq!(t.lookup(&a).copied(), linear6(&prefixes, &a), "address {}", a);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Random inserts, value changes and removals, one at a time, against a linear scan
        /// of the prefixes present after each step.
        #[test]
        fn ipv4_updates_match_a_rebuilt_reference(
            steps in proptest::collection::vec((any::<u32>(), 0u8..=32, any::<bool>()), 1..80),
            probes in proptest::collection::vec(any::<u32>(), 30),
        ) {
            let mut t = Lpm4::new();
            let mut present: Vec<(Ipv4Addr, u8, u32)> = Vec::new();
            for (i, &(raw, len, add)) in steps.iter().enumerate() {
                let p = Ipv4Addr::from(((raw & 0x00ff_ffff) | 0xc600_0000) & mask32(len));
                let at = present.iter().position(|&(q, l, _)| q == p && l == len);
                if add {
                    t.insert(p, len, i as u32).unwrap();
                    match at {
                        Some(j) => present[j].2 = i as u32,
                        None => present.push((p, len, i as u32)),
                    }
                } else if let Some(j) = at {
                    prop_assert!(t.remove(p, len));
                    present.remove(j);
                } else {
                    prop_assert!(!t.remove(p, len));
                }
                prop_assert_eq!(t.len(), present.len());
                let mut addrs: Vec<u32> = probes.iter().map(|a| (a & 0x00ff_ffff) | 0xc600_0000).collect();
                addrs.extend([u32::from(p), u32::from(p) | !mask32(len), u32::from(p).wrapping_sub(1)]);
                for a in addrs {
                    prop_assert_eq!(t.lookup(a).copied(), linear4(&present, a), "step {} address {}", i, Ipv4Addr::from(a));
                }
            }
        }

        #[test]
        fn ipv6_updates_match_a_rebuilt_reference(
            steps in proptest::collection::vec((any::<u64>(), 0u8..=128, any::<bool>()), 1..60),
            probes in proptest::collection::vec(any::<u64>(), 30),
        ) {
            let addr = |x: u64| (0x2001_0002u128 << 96) | (u128::from(x) << 32) | u128::from(x >> 40);
            let mut t = Lpm6::new();
            let mut present: Vec<(Ipv6Addr, u8, u32)> = Vec::new();
            for (i, &(raw, len, add)) in steps.iter().enumerate() {
                let p = Ipv6Addr::from(addr(raw & 0xffff_f0ff_ffff_ffff).masked(len));
                let at = present.iter().position(|&(q, l, _)| q == p && l == len);
                if add {
                    t.insert(p, len, i as u32).unwrap();
                    match at {
                        Some(j) => present[j].2 = i as u32,
                        None => present.push((p, len, i as u32)),
                    }
                } else if let Some(j) = at {
                    prop_assert!(t.remove(p, len));
                    present.remove(j);
                } else {
                    prop_assert!(!t.remove(p, len));
                }
                let mut addrs: Vec<Ipv6Addr> = probes.iter().map(|&x| Ipv6Addr::from(addr(x))).collect();
                addrs.extend([p, Ipv6Addr::from(u128::from(p).wrapping_sub(1))]);
                for a in addrs {
                    prop_assert_eq!(t.lookup(&a).copied(), linear6(&present, &a), "step {} address {}", i, a);
                }
            }
        }
    }

    /// Removing a prefix inside a /24 that has longer prefixes keeps them, and the addresses
    /// it covered fall back to the covering /16.
    #[test]
    fn a_removed_prefix_falls_back_to_the_one_covering_it() {
        let a = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        let mut t = Lpm4::new();
        t.insert(a("198.18.0.0"), 16, 1).unwrap();
        t.insert(a("198.18.5.0"), 24, 2).unwrap();
        t.insert(a("198.18.5.128"), 25, 3).unwrap();
        fn t_lookup(t: &Lpm4<u32>, s: &str) -> Option<u32> {
            t.lookup(u32::from(s.parse::<Ipv4Addr>().unwrap())).copied()
        }
        assert_eq!(t_lookup(&t, "198.18.5.1"), Some(2));
        assert_eq!(t_lookup(&t, "198.18.5.200"), Some(3));
        assert!(t.remove(a("198.18.5.0"), 24));
        assert_eq!(t_lookup(&t, "198.18.5.1"), Some(1));
        assert_eq!(t_lookup(&t, "198.18.5.200"), Some(3));
        assert!(t.remove(a("198.18.0.0"), 16));
        assert_eq!(t_lookup(&t, "198.18.5.1"), None);
        assert!(!t.remove(a("198.18.0.0"), 16));
    }

    #[test]
    fn lengths_beyond_the_address_are_refused() {
        assert_eq!(
            Lpm4::build(&[(Ipv4Addr::new(1, 2, 3, 4), 33, 0)]).err(),
            Some(PrefixError::Length { len: 33, max: 32 })
        );
        assert!(Lpm6::build(&[(Ipv6Addr::LOCALHOST, 129, 0)]).is_err());
    }

    /// An Internet-sized table from the generator: every generated prefix's own first
    /// address finds a value, and lookups agree with the linear scan on a sample.
    #[test]
    fn internet_sized_tables_build_and_agree_with_the_scan_on_a_sample() {
        let v4 = prefixes::ipv4(20_000, 3);
        let t4 = Lpm4::build(&v4).unwrap();
        let v6 = prefixes::ipv6(8_000, 3);
        let t6 = Lpm6::build(&v6).unwrap();
        for (i, &(p, _, _)) in v4.iter().enumerate().step_by(97) {
            let a = u32::from(p) | (i as u32 & 0xff);
            assert_eq!(t4.lookup(a).copied(), linear4(&v4, a));
        }
        for &(p, _, _) in v6.iter().step_by(53) {
            assert_eq!(t6.lookup(&p).copied(), linear6(&v6, &p));
        }
    }
}
