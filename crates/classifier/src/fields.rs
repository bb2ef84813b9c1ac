//! The header fields rules match on, taken from a parsed packet once.

use stateplane_wire::{MacAddr, Parsed};

/// A packet's matchable fields. IP addresses are 128-bit: IPv6 as is, IPv4 as the
/// IPv4-mapped address `::ffff:a.b.c.d`, so one field serves both families (an IPv4 prefix
/// /n is the mapped prefix /96+n). Absent headers leave their fields 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
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

/// An IPv4 address as a [`Fields`] address.
pub fn mapped(v4: u32) -> u128 {
    0xffff_u128 << 32 | u128::from(v4)
}

impl Fields {
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
