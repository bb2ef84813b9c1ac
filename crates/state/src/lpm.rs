//! Longest-prefix-match tables for IPv4 and IPv6 forwarding, built for lookups.
//!
//! * IPv4: DIR-24-8. A 2^24-entry first level indexed by the address's top 24 bits answers
//!   every prefix up to /24 in one memory access; an entry covering a longer prefix points
//!   to a 256-entry second-level group indexed by the last byte (two accesses).
//! * IPv6: a multibit trie of stride 8: nodes of 256 entries, one level per address byte,
//!   so a /48 takes six accesses. Each entry holds a result or a child pointer; a new
//!   child inherits its parent entry's result, so no backtracking is ever needed.
//!
//! Both are built from the whole prefix list at once, shortest prefixes first, so a longer
//! prefix always overwrites a shorter one it lies in. Updates build a new table off the
//! data path and publish it between bursts (as an `Arc` swap), so a lookup never waits
//! for an update. Results are indices into a next-hop array; entry value 0 is "no route".

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

/// IPv4 longest-prefix match (DIR-24-8) to values of type `V`.
pub struct Lpm4<V> {
    tbl24: Box<[u32]>,
    tbl8: Vec<u32>,
    values: Vec<V>,
}

impl<V: Copy> Lpm4<V> {
    /// Builds the table from `(address, length, value)` prefixes; for duplicates the last
    /// one wins. Host bits beyond the length are ignored.
    pub fn build(prefixes: &[(Ipv4Addr, u8, V)]) -> Result<Self, PrefixError> {
        let mut order: Vec<usize> = (0..prefixes.len()).collect();
        for &(_, len, _) in prefixes {
            if len > 32 {
                return Err(PrefixError::Length { len, max: 32 });
            }
        }
        order.sort_by_key(|&i| prefixes[i].1);
        let mut t = Lpm4 {
            tbl24: stateplane_mem::huge_vec(1 << 24, 0u32, true)
                .0
                .into_boxed_slice(),
            tbl8: Vec::new(),
            values: Vec::with_capacity(prefixes.len()),
        };
        for i in order {
            let (addr, len, value) = prefixes[i];
            t.values.push(value);
            let entry = t.values.len() as u32; // index + 1
            if entry >= EXTENDED {
                return Err(PrefixError::Full);
            }
            let a = u32::from(addr) & mask32(len);
            if len <= 24 {
                let first = (a >> 8) as usize;
                let count = 1usize << (24 - len);
                t.tbl24[first..first + count].fill(entry);
            } else {
                let slot = (a >> 8) as usize;
                let group = match t.tbl24[slot] {
                    e if e & EXTENDED != 0 => (e & !EXTENDED) as usize,
                    inherited => {
                        let g = t.tbl8.len() / 256;
                        if g >= (EXTENDED as usize) / 256 {
                            return Err(PrefixError::Full);
                        }
                        t.tbl8.extend(std::iter::repeat_n(inherited, 256));
                        t.tbl24[slot] = EXTENDED | g as u32;
                        g
                    }
                };
                let first = group * 256 + (a & 0xff) as usize;
                t.tbl8[first..first + (1usize << (32 - len))].fill(entry);
            }
        }
        Ok(t)
    }

    /// The value of the longest prefix containing `addr`.
    #[inline]
    pub fn lookup(&self, addr: u32) -> Option<&V> {
        let mut e = self.tbl24[(addr >> 8) as usize];
        if e & EXTENDED != 0 {
            e = self.tbl8[((e & !EXTENDED) as usize) * 256 + (addr & 0xff) as usize];
        }
        e.checked_sub(1).map(|i| &self.values[i as usize])
    }

    /// Bytes the table uses.
    pub fn memory(&self) -> usize {
        self.tbl24.len() * 4 + self.tbl8.len() * 4 + self.values.len() * size_of::<V>()
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
pub struct Lpm6<V> {
    /// Nodes of 256 entries each; node 0 is the root.
    nodes: Vec<u32>,
    values: Vec<V>,
}

impl<V: Copy> Lpm6<V> {
    pub fn build(prefixes: &[(Ipv6Addr, u8, V)]) -> Result<Self, PrefixError> {
        for &(_, len, _) in prefixes {
            if len > 128 {
                return Err(PrefixError::Length { len, max: 128 });
            }
        }
        let mut order: Vec<usize> = (0..prefixes.len()).collect();
        order.sort_by_key(|&i| prefixes[i].1);
        let mut t = Lpm6 {
            nodes: vec![0u32; 256],
            values: Vec::with_capacity(prefixes.len()),
        };
        for i in order {
            let (addr, len, value) = prefixes[i];
            t.values.push(value);
            let entry = t.values.len() as u32;
            if entry >= EXTENDED {
                return Err(PrefixError::Full);
            }
            let bytes = addr.octets();
            let mut node = 0usize;
            // Whole bytes of the prefix walk down, making children as needed; the last,
            // partial byte (or a whole one ending exactly at the length) is a range.
            let full = usize::from(len / 8);
            let rest = len % 8;
            let (walk, last) = if rest == 0 && full > 0 {
                (full - 1, full - 1)
            } else {
                (full, full)
            };
            for &b in &bytes[..walk] {
                let at = node * 256 + usize::from(b);
                let e = t.nodes[at];
                node = if e & EXTENDED != 0 {
                    (e & !EXTENDED) as usize
                } else {
                    let child = t.nodes.len() / 256;
                    if child >= (EXTENDED as usize) / 256 {
                        return Err(PrefixError::Full);
                    }
                    t.nodes.extend(std::iter::repeat_n(e, 256));
                    t.nodes[at] = EXTENDED | child as u32;
                    child
                };
            }
            let span_bits = if rest == 0 { 8 } else { u32::from(rest) };
            if len == 0 {
                t.nodes[..256].fill(entry);
                continue;
            }
            let b = bytes[last];
            let keep = if span_bits == 8 {
                0xff
            } else {
                0xffu8 << (8 - span_bits)
            };
            let first = node * 256 + usize::from(b & keep);
            let count = 1usize << (8 - span_bits);
            for e in &mut t.nodes[first..first + count] {
                // Shortest first: an entry here is never yet a child (a child would need a
                // longer prefix, added later), so a plain overwrite is right.
                *e = entry;
            }
        }
        Ok(t)
    }

    #[inline]
    pub fn lookup(&self, addr: &Ipv6Addr) -> Option<&V> {
        let bytes = addr.octets();
        let mut node = 0usize;
        for &b in &bytes {
            let e = self.nodes[node * 256 + usize::from(b)];
            if e & EXTENDED == 0 {
                return e.checked_sub(1).map(|i| &self.values[i as usize]);
            }
            node = (e & !EXTENDED) as usize;
        }
        None
    }

    pub fn memory(&self) -> usize {
        self.nodes.len() * 4 + self.values.len() * size_of::<V>()
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
