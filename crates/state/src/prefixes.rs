//! Generated routing tables with the prefix-length mix of the Internet's tables, for tests
//! and benchmarks (deterministic from a seed).
//!
//! IPv4: about 60% /24, then /22, /23, /21, /20, /16 and /19 and a tail down to /8, in the
//! proportions of a current full table; prefixes are drawn inside a few hundred covering
//! blocks so that they nest as real allocations do. IPv6: about 45% /48, then /32, /44,
//! /40, /36, /29 and others between /16 and /64, inside 2000::/3.

use std::net::{Ipv4Addr, Ipv6Addr};

/// A small, seedable generator (SplitMix64); tables do not need more.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A length drawn from `(length, weight)` pairs.
    fn pick(&mut self, weights: &[(u8, u32)]) -> u8 {
        let total: u32 = weights.iter().map(|w| w.1).sum();
        let mut x = (self.next() % u64::from(total)) as u32;
        for &(len, w) in weights {
            if x < w {
                return len;
            }
            x -= w;
        }
        weights[0].0
    }
}

/// Per-mille shares of IPv4 prefix lengths in a full table.
const V4_LENGTHS: &[(u8, u32)] = &[
    (24, 600),
    (22, 110),
    (23, 100),
    (21, 45),
    (20, 40),
    (19, 25),
    (16, 20),
    (18, 15),
    (17, 10),
    (15, 5),
    (14, 5),
    (13, 5),
    (12, 5),
    (11, 4),
    (10, 3),
    (9, 2),
    (8, 1),
    (25, 3),
    (26, 1),
    (28, 1),
];

const V6_LENGTHS: &[(u8, u32)] = &[
    (48, 450),
    (32, 150),
    (44, 110),
    (40, 80),
    (36, 50),
    (29, 40),
    (46, 30),
    (47, 20),
    (33, 15),
    (34, 15),
    (35, 10),
    (28, 10),
    (30, 10),
    (56, 5),
    (64, 5),
];

/// `n` IPv4 prefixes with values 0..n (value i is the i-th prefix).
pub fn ipv4(n: usize, seed: u64) -> Vec<(Ipv4Addr, u8, u32)> {
    let mut r = Mix(seed);
    let blocks: Vec<u32> = (0..(n / 500).max(16))
        .map(|_| (r.next() as u32) & 0xff00_0000 | (r.next() as u32 & 0x00f0_0000))
        .map(|b| b.clamp(0x0100_0000, 0xdfff_ffff))
        .collect();
    (0..n)
        .map(|i| {
            let len = r.pick(V4_LENGTHS);
            let block = blocks[(r.next() % blocks.len() as u64) as usize];
            let a = block | (r.next() as u32 & 0x000f_ffff);
            let mask = if len == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(len))
            };
            (Ipv4Addr::from(a & mask), len, i as u32)
        })
        .collect()
}

/// `n` IPv6 prefixes with values 0..n.
pub fn ipv6(n: usize, seed: u64) -> Vec<(Ipv6Addr, u8, u32)> {
    let mut r = Mix(seed ^ 0x6666);
    let blocks: Vec<u128> = (0..(n / 200).max(16))
        .map(|_| (0x2000u128 << 112) | (u128::from(r.next() & 0x1fff_ffff) << 96))
        .collect();
    (0..n)
        .map(|i| {
            let len = r.pick(V6_LENGTHS);
            let block = blocks[(r.next() % blocks.len() as u64) as usize];
            let a = block | (u128::from(r.next()) << 32) & !(u128::MAX << 96);
            let mask = u128::MAX << (128 - u32::from(len));
            (Ipv6Addr::from(a & mask), len, i as u32)
        })
        .collect()
}
