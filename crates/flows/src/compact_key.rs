//! Compact flow keys: what the microflow table and the aggregator compare on every packet.
//!
//! A flow is the 5-tuple and the outer VLAN (the ingress port is a feature, not part of
//! the key, as in nfpcapd and softflowd). IPv4 keys are two 64-bit words, so two keys
//! compare in two instructions (TurboFlow's 128-bit keys); IPv6 keys are five.

use stateplane_wire::FlowKey;

/// A flow key packed into words. `Default` is the all-zero key, which no table treats as
/// special (slots say whether they are used).
pub trait CompactKey:
    Copy + Eq + Default + std::fmt::Debug + Send + bytemuck::Zeroable + 'static
{
    /// The key of `key`, or `None` if `key` is not of this family.
    fn pack(key: &FlowKey) -> Option<Self>;
    fn unpack(&self) -> FlowKey;
    /// The same connection seen from the other side.
    fn reversed(&self) -> Self;
    /// The words hashed by the tables.
    fn words(&self) -> &[u64];
    /// The smaller (by words) of the key and its reverse, and whether that is the reverse:
    /// both directions of a connection have the same canonical key.
    #[inline]
    fn canonical(&self) -> (Self, bool) {
        let r = self.reversed();
        if r.words() < self.words() {
            (r, true)
        } else {
            (*self, false)
        }
    }
}

/// `proto`, ports and VLAN in one word (the VLAN id has 12 bits).
fn tail(k: &FlowKey) -> u64 {
    u64::from(k.src_port) << 48
        | u64::from(k.dst_port) << 32
        | u64::from(k.proto) << 16
        | u64::from(k.vlan & 0x0fff)
}

fn untail(w: u64, k: &mut FlowKey) {
    k.src_port = (w >> 48) as u16;
    k.dst_port = (w >> 32) as u16;
    k.proto = (w >> 16) as u8;
    k.vlan = (w & 0x0fff) as u16;
}

/// The tail of the other direction: ports swapped; for an ICMP echo (whose key holds the
/// identifier in `src_port` and `type << 8 | code` in `dst_port`), the same identifier and
/// the answering type (request 8 and reply 0; ICMPv6 128 and 129), so that a request and
/// its reply are one connection. Other ICMP messages have no other direction: their
/// reverse is themselves, addresses swapped.
fn swap_tail(w: u64) -> u64 {
    let (s, d) = ((w >> 48) & 0xffff, (w >> 32) & 0xffff);
    let proto = (w >> 16) & 0xff;
    if proto == 1 || proto == 58 {
        let answer = match (proto, d >> 8) {
            (1, 8) => 0,
            (1, 0) => 8,
            (58, 128) => 129,
            (58, 129) => 128,
            _ => return w,
        };
        return (w & !(0xffff << 32)) | (answer << 8 | (d & 0xff)) << 32;
    }
    (w & 0xffff_ffff) | d << 48 | s << 32
}

/// An IPv4 flow: addresses in the first word, ports, protocol and VLAN in the second.
#[derive(Clone, Copy, Eq, Default, Debug, bytemuck::Zeroable)]
pub struct V4Key(pub [u64; 2]);

/// Equality of a key of words, compared word by word in registers (the derived comparison
/// of a word array calls `memcmp`, which was 2% of a flow export run), and the hash of its
/// words to go with it (for maps in tests and tools).
macro_rules! compare_words {
    ($key:ty) => {
        impl PartialEq for $key {
            #[inline(always)]
            fn eq(&self, other: &Self) -> bool {
                (self.0.iter().zip(&other.0)).fold(0, |diff, (x, y)| diff | (x ^ y)) == 0
            }
        }

        impl std::hash::Hash for $key {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.0.hash(state);
            }
        }
    };
}

compare_words!(V4Key);

impl CompactKey for V4Key {
    #[inline]
    fn pack(k: &FlowKey) -> Option<Self> {
        if k.ip_version != 4 {
            return None;
        }
        let a = |b: &[u8; 16]| u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        Some(V4Key([a(&k.src) << 32 | a(&k.dst), tail(k)]))
    }

    fn unpack(&self) -> FlowKey {
        let mut k = FlowKey {
            ip_version: 4,
            ..FlowKey::EMPTY
        };
        k.src[..4].copy_from_slice(&((self.0[0] >> 32) as u32).to_be_bytes());
        k.dst[..4].copy_from_slice(&(self.0[0] as u32).to_be_bytes());
        untail(self.0[1], &mut k);
        k
    }

    fn reversed(&self) -> Self {
        V4Key([self.0[0].rotate_left(32), swap_tail(self.0[1])])
    }

    #[inline]
    fn words(&self) -> &[u64] {
        &self.0
    }
}

/// An IPv6 flow: source and destination in two words each, then ports, protocol and VLAN.
#[derive(Clone, Copy, Eq, Default, Debug, bytemuck::Zeroable)]
pub struct V6Key(pub [u64; 5]);

compare_words!(V6Key);

impl CompactKey for V6Key {
    #[inline]
    fn pack(k: &FlowKey) -> Option<Self> {
        if k.ip_version != 6 {
            return None;
        }
        let hi = |b: &[u8; 16]| (u128::from_be_bytes(*b) >> 64) as u64;
        let lo = |b: &[u8; 16]| u128::from_be_bytes(*b) as u64;
        Some(V6Key([
            hi(&k.src),
            lo(&k.src),
            hi(&k.dst),
            lo(&k.dst),
            tail(k),
        ]))
    }

    fn unpack(&self) -> FlowKey {
        let mut k = FlowKey {
            ip_version: 6,
            ..FlowKey::EMPTY
        };
        let addr = |hi: u64, lo: u64| (u128::from(hi) << 64 | u128::from(lo)).to_be_bytes();
        k.src = addr(self.0[0], self.0[1]);
        k.dst = addr(self.0[2], self.0[3]);
        untail(self.0[4], &mut k);
        k
    }

    fn reversed(&self) -> Self {
        let w = self.0;
        V6Key([w[2], w[3], w[0], w[1], swap_tail(w[4])])
    }

    #[inline]
    fn words(&self) -> &[u64] {
        &self.0
    }
}

/// The tables' hash of a key: seeded, one folded multiply per word (as foldhash), never 0
/// (the aggregator marks empty slots with 0).
#[inline]
pub fn hash_key<K: CompactKey>(key: &K, seed: u64) -> u64 {
    let mut h = seed;
    for &w in key.words() {
        let p = u128::from(h ^ w).wrapping_mul(0xa076_1d64_78bd_642f);
        h = (p as u64) ^ ((p >> 64) as u64);
    }
    // The top bit, not the bottom one: tables index with the low bits.
    h | 1 << 63
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// An ICMP echo request and its reply are one connection: the reply's key is the
    /// request's reversed (same identifier, the answering type), both ways, in both
    /// families; a message that is not an echo pairs with nothing.
    #[test]
    fn an_echo_request_and_its_reply_reverse_into_each_other() {
        let icmp = |proto: u8, src: u8, dst: u8, ty: u16| {
            let mut k = FlowKey::v4(
                Ipv4Addr::new(198, 18, 0, src),
                Ipv4Addr::new(198, 18, 0, dst),
                proto,
                0x1234,
                ty << 8,
            );
            if proto == 58 {
                k = FlowKey::v6(
                    format!("2001:2::{src}").parse::<Ipv6Addr>().unwrap(),
                    format!("2001:2::{dst}").parse::<Ipv6Addr>().unwrap(),
                    proto,
                    0x1234,
                    ty << 8,
                );
            }
            k
        };
        let (req, rep) = (icmp(1, 1, 2, 8), icmp(1, 2, 1, 0));
        let (req, rep) = (V4Key::pack(&req).unwrap(), V4Key::pack(&rep).unwrap());
        assert_eq!(req.reversed(), rep);
        assert_eq!(rep.reversed(), req);
        assert_eq!(req.canonical().0, rep.canonical().0);
        let (req6, rep6) = (icmp(58, 1, 2, 128), icmp(58, 2, 1, 129));
        let (req6, rep6) = (V6Key::pack(&req6).unwrap(), V6Key::pack(&rep6).unwrap());
        assert_eq!(req6.reversed(), rep6);
        assert_eq!(rep6.reversed(), req6);
        // Destination unreachable (3): its reverse is itself from the other side.
        let unreachable = V4Key::pack(&icmp(1, 1, 2, 3)).unwrap();
        assert_eq!(unreachable.reversed().unpack().dst_port, 3 << 8);
        assert_eq!(unreachable.reversed().reversed(), unreachable);
    }

    #[test]
    fn keys_round_trip_and_reverse() {
        let mut k4 = FlowKey::v4(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 1, 2),
            6,
            40000,
            80,
        );
        k4.vlan = 42;
        let p = V4Key::pack(&k4).unwrap();
        assert_eq!(p.unpack(), k4);
        let mut back = k4.reversed();
        back.in_port = 0;
        assert_eq!(p.reversed().unpack(), back);
        assert_eq!(p.canonical().0, p.reversed().canonical().0);
        assert_ne!(p.canonical().1, p.reversed().canonical().1);
        assert_eq!(V6Key::pack(&k4), None);

        let k6 = FlowKey::v6(
            "2001:db8::1".parse::<Ipv6Addr>().unwrap(),
            "2001:db8::2".parse::<Ipv6Addr>().unwrap(),
            17,
            5353,
            53,
        );
        let p6 = V6Key::pack(&k6).unwrap();
        assert_eq!(p6.unpack(), k6);
        assert_eq!(p6.reversed().reversed(), p6);
        assert_eq!(p6.canonical().0, p6.reversed().canonical().0);
    }
}
