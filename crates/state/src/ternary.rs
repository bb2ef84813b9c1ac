//! Ternary tables for 5-tuple ACLs: prioritized rules with address prefixes, protocol
//! wildcards and port ranges, classified by tuple-space search.
//!
//! Rules are grouped by their *tuple*: (source prefix length, destination prefix length,
//! protocol exact or wildcard). Within a tuple every rule's masked addresses and protocol
//! form an exact key, so one hash lookup per tuple finds the rules that can match; port
//! ranges (not prefixes) are checked on those few candidates, kept in priority order. Tuples
//! are visited highest-priority first and the search stops as soon as no remaining tuple can
//! beat the match found, so a packet usually touches a handful of tuples even with
//! thousands of rules. (Measured against a linear scan in `stateplane bench-tables`.)
//!
//! Tables are built whole from the rule list and published by swap, like LPM tables.

use crate::table_key::TableKey;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// One ACL rule over IPv4 5-tuples. Higher `priority` wins; ties go to the earlier rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule<V> {
    pub src: u32,
    pub src_len: u8,
    pub dst: u32,
    pub dst_len: u8,
    /// `None`: any protocol.
    pub proto: Option<u8>,
    /// Inclusive ranges; `(0, 65535)` is any port.
    pub src_ports: (u16, u16),
    pub dst_ports: (u16, u16),
    pub priority: u32,
    pub action: V,
}

/// The fields a packet is classified on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Packet5 {
    pub src: u32,
    pub dst: u32,
    pub proto: u8,
    pub src_port: u16,
    pub dst_port: u16,
}

fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len.min(32)))
    }
}

impl<V> Rule<V> {
    /// Whether the rule matches the packet (the reference semantics).
    pub fn matches(&self, p: &Packet5) -> bool {
        p.src & mask(self.src_len) == self.src & mask(self.src_len)
            && p.dst & mask(self.dst_len) == self.dst & mask(self.dst_len)
            && self.proto.is_none_or(|x| x == p.proto)
            && (self.src_ports.0..=self.src_ports.1).contains(&p.src_port)
            && (self.dst_ports.0..=self.dst_ports.1).contains(&p.dst_port)
    }
}

/// A fast hasher for the tuple keys (the same folded multiply as table keys).
#[derive(Default)]
struct FoldHasher(u64);

impl Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = x.hash_with(self.0);
    }
}

type TupleMap = HashMap<u64, Vec<u32>, BuildHasherDefault<FoldHasher>>;

struct Tuple {
    src_len: u8,
    dst_len: u8,
    any_proto: bool,
    /// The highest priority among its rules (for pruning).
    best: u32,
    /// Masked (src, dst, proto) -> rule indices, highest priority first.
    rules: TupleMap,
}

fn tuple_key(src: u32, dst: u32, proto: u8) -> u64 {
    (u64::from(src) << 32 | u64::from(dst)) ^ (u64::from(proto) << 56).rotate_left(7)
}

/// A ternary table: see the module documentation.
pub struct Ternary<V> {
    rules: Vec<Rule<V>>,
    /// Highest `best` first.
    tuples: Vec<Tuple>,
}

impl<V: Copy> Ternary<V> {
    pub fn build(rules: &[Rule<V>]) -> Self {
        let mut tuples: Vec<Tuple> = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            let (sl, dl, any) = (r.src_len.min(32), r.dst_len.min(32), r.proto.is_none());
            let t = match tuples
                .iter()
                .position(|t| (t.src_len, t.dst_len, t.any_proto) == (sl, dl, any))
            {
                Some(t) => t,
                None => {
                    tuples.push(Tuple {
                        src_len: sl,
                        dst_len: dl,
                        any_proto: any,
                        best: 0,
                        rules: TupleMap::default(),
                    });
                    tuples.len() - 1
                }
            };
            let t = &mut tuples[t];
            t.best = t.best.max(r.priority);
            let key = tuple_key(r.src & mask(sl), r.dst & mask(dl), r.proto.unwrap_or(0));
            t.rules.entry(key).or_default().push(i as u32);
        }
        for t in &mut tuples {
            for list in t.rules.values_mut() {
                // Highest priority first; the earlier rule first among equals.
                list.sort_by_key(|&i| (std::cmp::Reverse(rules[i as usize].priority), i));
            }
        }
        tuples.sort_by_key(|t| std::cmp::Reverse(t.best));
        Ternary {
            rules: rules.to_vec(),
            tuples,
        }
    }

    /// What a table of `rules` rules takes, measured by the allocator
    /// (`tests/ternary_memory.rs`) and rounded up: 320 bytes a rule (its copy and its
    /// tuple's map entry; as much as a tuple of its own with its map, at most 2,178
    /// tuples), 4 KiB more.
    pub fn bytes_for(rules: usize) -> u64 {
        4096 + 320 * rules as u64
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// How many tuples the rules fall into.
    pub fn tuples(&self) -> usize {
        self.tuples.len()
    }

    /// The matching rule with the highest priority (the earliest among equals).
    pub fn classify(&self, p: &Packet5) -> Option<&Rule<V>> {
        let mut best: Option<u32> = None;
        for t in &self.tuples {
            if let Some(b) = best {
                let bp = self.rules[b as usize].priority;
                if t.best < bp {
                    break; // no rule in this or any later tuple can win
                }
            }
            let proto = if t.any_proto { 0 } else { p.proto };
            let key = tuple_key(p.src & mask(t.src_len), p.dst & mask(t.dst_len), proto);
            let Some(list) = t.rules.get(&key) else {
                continue;
            };
            for &i in list {
                let r = &self.rules[i as usize];
                if let Some(b) = best {
                    let br = &self.rules[b as usize];
                    if (r.priority, std::cmp::Reverse(i)) <= (br.priority, std::cmp::Reverse(b)) {
                        break; // sorted: nothing later in this list beats the best
                    }
                }
                if (r.src_ports.0..=r.src_ports.1).contains(&p.src_port)
                    && (r.dst_ports.0..=r.dst_ports.1).contains(&p.dst_port)
                {
                    best = Some(i);
                    break;
                }
            }
        }
        best.map(|i| &self.rules[i as usize])
    }

    /// The reference: every rule in turn (for tests and as the benchmark's baseline).
    pub fn classify_linear(&self, p: &Packet5) -> Option<&Rule<V>> {
        let mut best: Option<&Rule<V>> = None;
        for r in &self.rules {
            if r.matches(p) && best.is_none_or(|b| r.priority > b.priority) {
                best = Some(r);
            }
        }
        best
    }
}

/// ClassBench-like ACL rule sets (deterministic from a seed): address prefixes mostly /32,
/// /24 and /16 or wildcards, drawn inside a few hundred blocks so rules overlap; ports
/// wildcard, well-known exact, or ranges (1024-65535, 0-1023, arbitrary); protocols TCP,
/// UDP, ICMP or any. Priorities fall with the rule's position, as in an ACL read top down.
pub fn acl_rules(n: usize, seed: u64) -> Vec<Rule<u32>> {
    let mut s = seed ^ 0xac1;
    let mut next = move || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let blocks: Vec<u32> = (0..(n / 20).max(8))
        .map(|_| 0xc612_0000 | (next() as u32 & 0x0001_ff00))
        .collect();
    let prefix = |next: &mut dyn FnMut() -> u64| -> (u32, u8) {
        let len = match next() % 100 {
            0..=34 => 32,
            35..=54 => 24,
            55..=69 => 16,
            70..=79 => 28,
            80..=84 => 20,
            _ => 0,
        };
        let base = blocks[(next() % blocks.len() as u64) as usize] | (next() as u32 & 0xff);
        (base & mask(len), len)
    };
    const WELL_KNOWN: [u16; 8] = [80, 443, 53, 22, 25, 123, 8080, 3306];
    let ports = |next: &mut dyn FnMut() -> u64| -> (u16, u16) {
        match next() % 100 {
            0..=49 => (0, 65535),
            50..=79 => {
                let p = WELL_KNOWN[(next() % 8) as usize];
                (p, p)
            }
            80..=89 => (1024, 65535),
            90..=94 => (0, 1023),
            _ => {
                let a = (next() % 60_000) as u16;
                (a, a + (next() % 5000) as u16)
            }
        }
    };
    (0..n)
        .map(|i| {
            let (src, src_len) = prefix(&mut next);
            let (dst, dst_len) = prefix(&mut next);
            let proto = match next() % 100 {
                0..=59 => Some(6),
                60..=84 => Some(17),
                85..=89 => Some(1),
                _ => None,
            };
            Rule {
                src,
                src_len,
                dst,
                dst_len,
                proto,
                src_ports: if next() % 4 == 0 {
                    ports(&mut next)
                } else {
                    (0, 65535)
                },
                dst_ports: ports(&mut next),
                priority: (n - i) as u32,
                action: i as u32,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rule_strategy() -> impl Strategy<Value = Rule<u32>> {
        (
            (any::<u32>(), 0u8..=32, any::<u32>(), 0u8..=32),
            prop_oneof![Just(None), Just(Some(6u8)), Just(Some(17u8))],
            (0u16..100, 0u16..100, 0u16..100, 0u16..100),
            0u32..20,
        )
            .prop_map(|((s, sl, d, dl), proto, (a, b, c, e), pri)| Rule {
                // Few distinct addresses, so that rules overlap and nest.
                src: 0xc612_0000 | (s & 0x0303),
                src_len: sl,
                dst: 0xc613_0000 | (d & 0x0303),
                dst_len: dl,
                proto,
                src_ports: (a.min(b), a.max(b)),
                dst_ports: (c.min(e), c.max(e)),
                priority: pri,
                action: 0,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Tuple-space search agrees with a linear priority scan on random overlapping rule
        /// sets (priorities tie often) and packets at and around the rules' edges.
        #[test]
        fn agrees_with_a_linear_priority_scan(
            mut rules in proptest::collection::vec(rule_strategy(), 1..80),
            probes in proptest::collection::vec((any::<u32>(), any::<u32>(), 0u16..100, 0u16..100, prop_oneof![Just(6u8), Just(17u8), Just(1u8)]), 60),
        ) {
            for (i, r) in rules.iter_mut().enumerate() {
                r.action = i as u32;
            }
            let t = Ternary::build(&rules);
            let mut packets: Vec<Packet5> = probes
                .iter()
                .map(|&(s, d, sp, dp, proto)| Packet5 {
                    src: 0xc612_0000 | (s & 0x0303),
                    dst: 0xc613_0000 | (d & 0x0303),
                    proto,
                    src_port: sp,
                    dst_port: dp,
                })
                .collect();
            for r in &rules {
                for (sp, dp) in [(r.src_ports.0, r.dst_ports.0), (r.src_ports.1, r.dst_ports.1), (r.src_ports.1.saturating_add(1), r.dst_ports.0)] {
                    packets.push(Packet5 { src: r.src, dst: r.dst, proto: r.proto.unwrap_or(6), src_port: sp, dst_port: dp });
                }
            }
            for p in &packets {
                let fast = t.classify(p).map(|r| r.action);
                // Linear scan with ties going to the earlier rule, as `classify` promises.
                let mut want: Option<&Rule<u32>> = None;
                for r in &rules {
                    if r.matches(p) && want.is_none_or(|b| r.priority > b.priority) {
                        want = Some(r);
                    }
                }
                prop_assert_eq!(fast, want.map(|r| r.action), "packet {:?}", p);
            }
        }
    }

    #[test]
    fn generated_acls_group_into_few_tuples() {
        let rules = acl_rules(10_000, 1);
        let t = Ternary::build(&rules);
        assert!(t.tuples() < 100, "{} tuples", t.tuples());
        let p = Packet5 {
            src: rules[5].src,
            dst: rules[5].dst,
            proto: rules[5].proto.unwrap_or(6),
            src_port: rules[5].src_ports.0,
            dst_port: rules[5].dst_ports.0,
        };
        let got = t.classify(&p).map(|r| r.action);
        assert_eq!(got, t.classify_linear(&p).map(|r| r.action));
        assert!(
            got.is_some_and(|a| a <= 5),
            "rule 5 or a higher one matches"
        );
    }
}
