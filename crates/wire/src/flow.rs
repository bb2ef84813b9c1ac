//! The flow key and the seeded flow hash.
//!
//! The hash decides which worker owns a flow and, later, which table bucket holds it, so
//! it is keyed with a per-process random seed: crafted traffic cannot aim at one worker or
//! one bucket without knowing the seed.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The key of a flow: the 5-tuple, the outer VLAN and the ingress port.
///
/// Addresses are stored in 16 bytes for both families; an IPv4 address fills the first 4
/// and leaves the rest zero. For ICMP, `src_port` holds the echo identifier (0 for other
/// types) and `dst_port` holds `type << 8 | code`, as flow exporters do. For frames that
/// are not IP (ARP, ...), `src`/`dst` hold the MAC addresses and `dst_port` the EtherType.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord, bytemuck::Zeroable)]
pub struct FlowKey {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub src_port: u16,
    pub dst_port: u16,
    /// Outer VLAN identifier, 0 when untagged.
    pub vlan: u16,
    pub in_port: u16,
    /// IP protocol (TCP 6, UDP 17, ...); 0 for non-IP frames.
    pub proto: u8,
    /// 4, 6, or 0 for non-IP frames.
    pub ip_version: u8,
}

impl FlowKey {
    /// All zero (usable in `const` contexts; the same as `default()`).
    pub const EMPTY: FlowKey = FlowKey {
        src: [0; 16],
        dst: [0; 16],
        src_port: 0,
        dst_port: 0,
        vlan: 0,
        in_port: 0,
        proto: 0,
        ip_version: 0,
    };

    pub fn v4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, src_port: u16, dst_port: u16) -> Self {
        let mut key = FlowKey {
            proto,
            src_port,
            dst_port,
            ip_version: 4,
            ..Default::default()
        };
        key.src[..4].copy_from_slice(&src.octets());
        key.dst[..4].copy_from_slice(&dst.octets());
        key
    }

    pub fn v6(src: Ipv6Addr, dst: Ipv6Addr, proto: u8, src_port: u16, dst_port: u16) -> Self {
        FlowKey {
            src: src.octets(),
            dst: dst.octets(),
            proto,
            src_port,
            dst_port,
            ip_version: 6,
            ..Default::default()
        }
    }

    fn addr(&self, bytes: &[u8; 16]) -> Option<IpAddr> {
        match self.ip_version {
            4 => Some(IpAddr::V4(Ipv4Addr::new(
                bytes[0], bytes[1], bytes[2], bytes[3],
            ))),
            6 => Some(IpAddr::V6(Ipv6Addr::from(*bytes))),
            _ => None,
        }
    }

    pub fn src_ip(&self) -> Option<IpAddr> {
        self.addr(&self.src)
    }

    pub fn dst_ip(&self) -> Option<IpAddr> {
        self.addr(&self.dst)
    }

    /// The key of the other direction of the same connection.
    pub fn reversed(&self) -> Self {
        FlowKey {
            src: self.dst,
            dst: self.src,
            src_port: self.dst_port,
            dst_port: self.src_port,
            ..*self
        }
    }

    /// The key as six words, for hashing (here and by tables keyed by flows).
    #[inline(always)]
    pub fn words(&self) -> [u64; 6] {
        let w = |b: &[u8; 16], i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        [
            w(&self.src, 0),
            w(&self.src, 8),
            w(&self.dst, 0),
            w(&self.dst, 8),
            u64::from(self.src_port)
                | u64::from(self.dst_port) << 16
                | u64::from(self.vlan) << 32
                | u64::from(self.in_port) << 48,
            u64::from(self.proto) | u64::from(self.ip_version) << 8,
        ]
    }

    /// Bytes in a key's wire form (for stores outside the switch).
    pub const BYTES: usize = 42;

    /// The key as bytes: addresses, then ports, VLAN, ingress port (big-endian), protocol
    /// and IP version; [`FlowKey::from_bytes`] reads it back.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut b = [0; Self::BYTES];
        b[..16].copy_from_slice(&self.src);
        b[16..32].copy_from_slice(&self.dst);
        for (i, v) in [self.src_port, self.dst_port, self.vlan, self.in_port]
            .into_iter()
            .enumerate()
        {
            b[32 + 2 * i..34 + 2 * i].copy_from_slice(&v.to_be_bytes());
        }
        b[40] = self.proto;
        b[41] = self.ip_version;
        b
    }

    /// A key from [`FlowKey::to_bytes`]'s form; `None` if `b` is not [`FlowKey::BYTES`] long.
    pub fn from_bytes(b: &[u8]) -> Option<FlowKey> {
        let b: &[u8; Self::BYTES] = b.try_into().ok()?;
        let mut key = FlowKey::EMPTY;
        key.src.copy_from_slice(&b[..16]);
        key.dst.copy_from_slice(&b[16..32]);
        let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        (key.src_port, key.dst_port) = (u16_at(32), u16_at(34));
        (key.vlan, key.in_port) = (u16_at(36), u16_at(38));
        (key.proto, key.ip_version) = (b[40], b[41]);
        Some(key)
    }
}

impl fmt::Debug for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.src_ip(), self.dst_ip()) {
            (Some(s), Some(d)) => write!(
                f,
                "{s} {} -> {d} {} proto {} vlan {} port {}",
                self.src_port, self.dst_port, self.proto, self.vlan, self.in_port
            ),
            _ => write!(
                f,
                "non-IP ethertype {:#06x} vlan {} port {}",
                self.dst_port, self.vlan, self.in_port
            ),
        }
    }
}

/// A keyed hash over flow keys: a folded 64x64->128 multiply per pair of words, as in
/// foldhash and wyhash, seeded per process.
#[derive(Clone, Copy, Debug)]
pub struct FlowHasher {
    seed: [u64; 4],
}

#[inline(always)]
fn folded_multiply(a: u64, b: u64) -> u64 {
    let full = u128::from(a) * u128::from(b);
    (full as u64) ^ ((full >> 64) as u64)
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seed drawn from the operating system's randomness (through std's `RandomState`,
/// which is seeded from it): for a run's hashes, so that crafted traffic cannot aim at one
/// bucket; a run that needs the seed twice (the flow hash and the flow tables') draws it
/// once.
pub fn random_seed() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5354_4154_4550_4c41);
    h.finish()
}

impl FlowHasher {
    /// A hasher with a [`random_seed`].
    pub fn random() -> Self {
        Self::with_seed(random_seed())
    }

    /// A hasher with a fixed seed, for reproducible tests and traces.
    pub fn with_seed(seed: u64) -> Self {
        let mut s = seed;
        FlowHasher {
            seed: [
                splitmix64(&mut s),
                splitmix64(&mut s),
                splitmix64(&mut s),
                splitmix64(&mut s),
            ],
        }
    }

    /// The hash of `key` (direction matters).
    #[inline]
    pub fn hash(&self, key: &FlowKey) -> u64 {
        let w = key.words();
        let s = self.seed;
        let a = folded_multiply(w[0] ^ s[0], w[1] ^ s[1]);
        let b = folded_multiply(w[2] ^ s[2], w[3] ^ s[3]);
        let c = folded_multiply(w[4] ^ s[1], w[5] ^ s[2]);
        folded_multiply(a ^ c.rotate_left(23), b ^ s[0])
    }

    /// The hash of the connection `key` belongs to: the same for both directions and
    /// whichever port they arrive on (the port is left out). Workers are chosen by it, so
    /// both directions of a connection meet in one worker's state.
    ///
    /// Each endpoint (address and port) is mixed on its own and the two are added, which
    /// is symmetric without comparing or copying the key (it runs for every packet). For
    /// ICMP both endpoints take the echo identifier, so a request and its reply agree.
    #[inline]
    pub fn hash_connection(&self, key: &FlowKey) -> u64 {
        let w = key.words();
        let s = self.seed;
        let icmp = matches!(key.proto, 1 | 58) && key.ip_version != 0;
        let dst_port = if icmp { key.src_port } else { key.dst_port };
        let a = folded_multiply(w[0] ^ s[0], w[1] ^ s[1] ^ u64::from(key.src_port));
        let b = folded_multiply(w[2] ^ s[0], w[3] ^ s[1] ^ u64::from(dst_port));
        let rest =
            u64::from(key.vlan) | u64::from(key.proto) << 16 | u64::from(key.ip_version) << 24;
        folded_multiply(a.wrapping_add(b) ^ s[2], rest ^ s[3])
    }

    /// The same hash for both directions of a connection: the endpoints are put in a
    /// canonical order first. For ICMP the type/code field is left out, so that an echo
    /// request and its reply agree.
    #[inline]
    pub fn hash_symmetric(&self, key: &FlowKey) -> u64 {
        let mut k = *key;
        if matches!(k.proto, 1 | 58) && k.ip_version != 0 {
            k.dst_port = k.src_port;
        }
        if (k.src, k.src_port) > (k.dst, k.dst_port) {
            k = k.reversed();
        }
        self.hash(&k)
    }
}

/// Maps a hash to one of `n` shards (Lemire's multiply-shift range reduction on the upper
/// 32 bits, so that tables indexing with the lower bits stay independent of the shard).
#[inline(always)]
pub fn shard_of(hash: u64, n: usize) -> usize {
    (((hash >> 32) * n as u64) >> 32) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_goes_to_bytes_and_back_field_for_field() {
        let mut k = FlowKey::v6(Ipv6Addr::LOCALHOST, Ipv6Addr::UNSPECIFIED, 17, 65535, 1);
        (k.vlan, k.in_port) = (4095, 0xfffe);
        for key in [
            k,
            FlowKey::EMPTY,
            FlowKey::v4(Ipv4Addr::BROADCAST, Ipv4Addr::LOCALHOST, 6, 1, 2),
        ] {
            assert_eq!(FlowKey::from_bytes(&key.to_bytes()), Some(key));
        }
        assert_eq!(FlowKey::from_bytes(&[0; 41]), None);
        assert_eq!(FlowKey::from_bytes(&[0; 43]), None);
    }
    use proptest::prelude::*;

    fn key(a: u32, b: u32, sp: u16, dp: u16) -> FlowKey {
        FlowKey::v4(a.into(), b.into(), 6, sp, dp)
    }

    proptest! {
        #[test]
        fn symmetric_hash_agrees_both_ways(a in any::<u32>(), b in any::<u32>(), sp in any::<u16>(), dp in any::<u16>()) {
            let h = FlowHasher::with_seed(7);
            let k = key(a, b, sp, dp);
            prop_assert_eq!(h.hash_symmetric(&k), h.hash_symmetric(&k.reversed()));
            let mut r = k.reversed();
            r.in_port = 3;
            prop_assert_eq!(h.hash_connection(&k), h.hash_connection(&r));
        }

        #[test]
        fn shard_in_range(hash in any::<u64>(), n in 1usize..64) {
            prop_assert!(shard_of(hash, n) < n);
        }
    }

    #[test]
    fn seeds_change_the_hash_and_fields_matter() {
        let k = key(1, 2, 3, 4);
        assert_ne!(
            FlowHasher::with_seed(1).hash(&k),
            FlowHasher::with_seed(2).hash(&k)
        );
        let h = FlowHasher::with_seed(1);
        assert_ne!(h.hash(&k), h.hash(&k.reversed()));
        let mut other_port = k;
        other_port.in_port = 1;
        assert_ne!(h.hash(&k), h.hash(&other_port));
        assert_ne!(FlowHasher::random().hash(&k), FlowHasher::random().hash(&k));
    }

    #[test]
    fn icmp_echo_pair_hashes_together() {
        let h = FlowHasher::with_seed(3);
        let request = FlowKey::v4(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 2),
            1,
            77,
            8 << 8,
        );
        let mut reply = FlowKey::v4(
            Ipv4Addr::new(198, 18, 0, 2),
            Ipv4Addr::new(198, 18, 0, 1),
            1,
            77,
            0,
        );
        assert_eq!(h.hash_symmetric(&request), h.hash_symmetric(&reply));
        let (mut a, mut b) = (request, reply);
        a.in_port = 1;
        b.in_port = 2;
        assert_eq!(h.hash_connection(&a), h.hash_connection(&b));
        reply.src_port = 78;
        assert_ne!(h.hash_symmetric(&request), h.hash_symmetric(&reply));
    }

    #[test]
    fn shards_are_balanced() {
        let h = FlowHasher::with_seed(9);
        let mut counts = [0u32; 4];
        for i in 0..40_000u32 {
            counts[shard_of(h.hash(&key(i, 99, 1000, 80)), 4)] += 1;
        }
        for c in counts {
            assert!(
                (9_000..11_000).contains(&c),
                "unbalanced shards: {counts:?}"
            );
        }
    }
}
