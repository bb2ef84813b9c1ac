//! The header fields rules match on, taken from a parsed packet once.

use stateplane_wire::{MacAddr, Parsed};

/// A packet's matchable fields. IP addresses are 128-bit: IPv6 as is, IPv4 as the
/// IPv4-mapped address `::ffff:a.b.c.d`, so one field serves both families (an IPv4 prefix
/// /n is the mapped prefix /96+n). Absent headers leave their fields 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fields {
    pub in_port: u16,
    /// MAC addresses in the low 48 bits.
    pub eth_src: u64,
    pub eth_dst: u64,
    /// The outer VLAN id; 0 when untagged.
    pub vlan: u16,
    /// The payload EtherType, after VLAN tags.
    pub eth_type: u16,
    pub ip_src: u128,
    pub ip_dst: u128,
    pub ip_proto: u8,
    /// Transport ports, or ICMP type and code as the flow key carries them.
    pub tp_src: u16,
    pub tp_dst: u16,
    pub tcp_flags: u8,
}

/// Six words, every bit of the fields in them but the addresses' upper halves (folded
/// into one, which are the same for IPv4 and few for IPv6): a tuple's bucket lookup is
/// mostly this hash, and the derived one wrote thirteen.
impl std::hash::Hash for Fields {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        h.write_u64(
            u64::from(self.in_port)
                | u64::from(self.vlan) << 16
                | u64::from(self.eth_type) << 32
                | u64::from(self.ip_proto) << 48
                | u64::from(self.tcp_flags) << 56,
        );
        h.write_u64(self.eth_src | u64::from(self.tp_src) << 48);
        h.write_u64(self.eth_dst | u64::from(self.tp_dst) << 48);
        h.write_u64(self.ip_src as u64);
        h.write_u64(self.ip_dst as u64);
        h.write_u64((self.ip_src >> 64) as u64 ^ ((self.ip_dst >> 64) as u64).rotate_left(32));
    }
}

/// An IPv4 address as a [`Fields`] address.
pub fn mapped(v4: u32) -> u128 {
    0xffff_u128 << 32 | u128::from(v4)
}

/// One step of the folded-multiply hash (as foldhash and wyhash): `h` and a word mixed by a
/// 64x64->128 multiply whose halves are folded together. Cache hashes and the tables'
/// bucket hashes are both made of it.
#[inline]
pub(crate) fn fold(h: u64, w: u64) -> u64 {
    let p = u128::from(h ^ w).wrapping_mul(0xa076_1d64_78bd_642f);
    (p as u64) ^ ((p >> 64) as u64)
}

impl Fields {
    /// Every field under `mask`'s bits; ports (which rules match by range) zero.
    #[inline]
    pub fn masked(&self, mask: &Fields) -> Fields {
        let (f, m) = (self, mask);
        Fields {
            in_port: f.in_port & m.in_port,
            eth_src: f.eth_src & m.eth_src,
            eth_dst: f.eth_dst & m.eth_dst,
            vlan: f.vlan & m.vlan,
            eth_type: f.eth_type & m.eth_type,
            ip_src: f.ip_src & m.ip_src,
            ip_dst: f.ip_dst & m.ip_dst,
            ip_proto: f.ip_proto & m.ip_proto,
            tcp_flags: f.tcp_flags & m.tcp_flags,
            tp_src: 0,
            tp_dst: 0,
        }
    }

    /// Every field under `mask`'s bits, ports included.
    #[inline]
    pub fn and(&self, mask: &Fields) -> Fields {
        let (f, m) = (self, mask);
        Fields {
            tp_src: f.tp_src & m.tp_src,
            tp_dst: f.tp_dst & m.tp_dst,
            ..f.masked(m)
        }
    }

    /// The bits set, ports left out: how specific a mask is.
    pub fn bits(&self) -> u32 {
        self.in_port.count_ones()
            + self.eth_src.count_ones()
            + self.eth_dst.count_ones()
            + self.vlan.count_ones()
            + self.eth_type.count_ones()
            + self.ip_src.count_ones()
            + self.ip_dst.count_ones()
            + self.ip_proto.count_ones()
            + self.tcp_flags.count_ones()
    }

    /// The bits set in either, field by field.
    pub fn union(&self, other: &Fields) -> Fields {
        let (a, b) = (self, other);
        Fields {
            in_port: a.in_port | b.in_port,
            eth_src: a.eth_src | b.eth_src,
            eth_dst: a.eth_dst | b.eth_dst,
            vlan: a.vlan | b.vlan,
            eth_type: a.eth_type | b.eth_type,
            ip_src: a.ip_src | b.ip_src,
            ip_dst: a.ip_dst | b.ip_dst,
            ip_proto: a.ip_proto | b.ip_proto,
            tp_src: a.tp_src | b.tp_src,
            tp_dst: a.tp_dst | b.tp_dst,
            tcp_flags: a.tcp_flags | b.tcp_flags,
        }
    }

    /// The key as seven 64-bit words, every bit of every field once: what the cache hashes.
    #[inline]
    pub fn words(&self) -> [u64; 7] {
        [
            u64::from(self.in_port) << 48 | self.eth_src,
            u64::from(self.vlan) << 48 | self.eth_dst,
            self.ip_src as u64,
            (self.ip_src >> 64) as u64,
            self.ip_dst as u64,
            (self.ip_dst >> 64) as u64,
            u64::from(self.eth_type) << 48
                | u64::from(self.ip_proto) << 40
                | u64::from(self.tcp_flags) << 32
                | u64::from(self.tp_src) << 16
                | u64::from(self.tp_dst),
        ]
    }

    /// The fields of a parsed frame that arrived on `in_port` (`frame` starts with its
    /// Ethernet header; the parser has checked it is there).
    pub fn of(parsed: &Parsed, frame: &[u8], in_port: u16) -> Fields {
        let mac = |at: usize| {
            frame.get(at..at + 6).map_or(0, |b| {
                MacAddr([b[0], b[1], b[2], b[3], b[4], b[5]]).to_u64()
            })
        };
        let k = &parsed.key;
        let ip = |b: &[u8; 16]| match k.ip_version {
            4 => mapped(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            6 => u128::from_be_bytes(*b),
            _ => 0,
        };
        Fields {
            in_port,
            eth_dst: mac(0),
            eth_src: mac(6),
            vlan: k.vlan,
            eth_type: parsed.ethertype,
            ip_src: ip(&k.src),
            ip_dst: ip(&k.dst),
            ip_proto: k.proto,
            tp_src: k.src_port,
            tp_dst: k.dst_port,
            tcp_flags: parsed.tcp_flags,
        }
    }
}
