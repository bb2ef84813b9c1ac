//! Builds whole frames from a few fields, with lengths and checksums right, using the
//! representations of `stateplane-wire` (so generator and parser agree on every format).

use stateplane_wire::checksum;
use stateplane_wire::ethernet::{EthernetRepr, MacAddr, VlanTag, ethertype};
use stateplane_wire::icmp::{IcmpPacket, IcmpRepr};
use stateplane_wire::ipv4::{Ipv4Options, Ipv4Repr, protocol};
use stateplane_wire::ipv6::Ipv6Repr;
use stateplane_wire::tcp::{TcpPacket, TcpRepr};
use stateplane_wire::udp::{UdpPacket, UdpRepr};
use std::net::IpAddr;

/// The transport header of a frame to build.
#[derive(Clone, Copy, Debug)]
pub enum L4 {
    Tcp {
        src_port: u16,
        dst_port: u16,
        seq: u32,
        ack: u32,
        flags: u8,
    },
    /// A TCP header given whole: its window and options as well.
    TcpSegment(TcpRepr),
    Udp {
        src_port: u16,
        dst_port: u16,
    },
    IcmpEcho {
        request: bool,
        ident: u16,
        seq: u16,
    },
}

impl L4 {
    fn header_len(&self) -> usize {
        match self {
            L4::Tcp { .. } => 20,
            L4::TcpSegment(repr) => repr.header_len(),
            L4::Udp { .. } | L4::IcmpEcho { .. } => 8,
        }
    }
}

/// The window of the TCP segments built from [`L4::Tcp`] (no window scaling).
pub const TCP_WINDOW: u16 = 64_240;

/// The link and network layers of a frame to build.
#[derive(Clone, Copy, Debug)]
pub struct Hosts {
    pub src_mac: MacAddr,
    pub dst_mac: MacAddr,
    /// VLAN id, 0 for untagged.
    pub vlan: u16,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub ttl: u8,
}

/// Bytes of headers (Ethernet, VLAN, IP, transport) before the payload.
pub fn header_len(hosts: &Hosts, l4: &L4) -> usize {
    14 + if hosts.vlan != 0 { 4 } else { 0 } + ip_header_len(hosts) + l4.header_len()
}

fn ip_header_len(hosts: &Hosts) -> usize {
    if hosts.src.is_ipv4() { 20 } else { 40 }
}

/// Writes an IP packet (header, transport header, `payload`) into `out`; returns its length.
/// `out` must hold `ip_header_len + l4 header + payload.len()` bytes.
pub fn emit_ip(out: &mut [u8], hosts: &Hosts, l4: &L4, payload: &[u8]) -> usize {
    let ip_len = ip_header_len(hosts);
    let l4_len = l4.header_len() + payload.len();
    let total = ip_len + l4_len;
    let proto = match (l4, hosts.src.is_ipv4()) {
        (L4::Tcp { .. } | L4::TcpSegment(_), _) => protocol::TCP,
        (L4::Udp { .. }, _) => protocol::UDP,
        (L4::IcmpEcho { .. }, true) => protocol::ICMP,
        (L4::IcmpEcho { .. }, false) => protocol::ICMPV6,
    };
    let pseudo = match (hosts.src, hosts.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            let repr = Ipv4Repr {
                src,
                dst,
                protocol: proto,
                ttl: hosts.ttl,
                tos: 0,
                ident: 0,
                dont_frag: true,
                more_frags: false,
                frag_offset: 0,
                options: Ipv4Options::default(),
                payload_len: l4_len as u16,
            };
            let _ = repr.emit(out);
            checksum::pseudo_v4(src, dst, proto, l4_len as u16)
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            let repr = Ipv6Repr {
                src,
                dst,
                next_header: proto,
                hop_limit: hosts.ttl,
                traffic_class: 0,
                flow_label: 0,
                payload_len: l4_len as u16,
            };
            let _ = repr.emit(out);
            checksum::pseudo_v6(src, dst, proto, l4_len as u32)
        }
        _ => 0, // mixed families cannot be built; the callers never ask
    };
    let seg = &mut out[ip_len..total];
    let header = l4.header_len();
    seg[header..].copy_from_slice(payload);
    match *l4 {
        L4::Tcp {
            src_port,
            dst_port,
            seq,
            ack,
            flags,
        } => {
            let _ = TcpRepr::new(src_port, dst_port, seq, ack, flags, TCP_WINDOW).emit(seg);
            TcpPacket::new_unchecked(seg).fill_checksum(pseudo);
        }
        L4::TcpSegment(repr) => {
            let _ = repr.emit(seg);
            TcpPacket::new_unchecked(seg).fill_checksum(pseudo);
        }
        L4::Udp { src_port, dst_port } => {
            let _ = UdpRepr {
                src_port,
                dst_port,
                payload_len: payload.len() as u16,
            }
            .emit(seg);
            UdpPacket::new_unchecked(seg).fill_checksum(pseudo);
        }
        L4::IcmpEcho {
            request,
            ident,
            seq,
        } => {
            let v6 = hosts.src.is_ipv6();
            let t = match (v6, request) {
                (false, true) => 8,
                (false, false) => 0,
                (true, true) => 128,
                (true, false) => 129,
            };
            let _ = IcmpRepr::echo(t, ident, seq).emit(seg);
            IcmpPacket::new_unchecked(seg).fill_checksum(if v6 { pseudo } else { 0 });
        }
    }
    total
}

/// Builds a whole frame into `buf` (cleared first): Ethernet, optional VLAN tag, IP,
/// transport, `payload`.
pub fn emit_frame(buf: &mut Vec<u8>, hosts: &Hosts, l4: &L4, payload: &[u8]) {
    let tag = (hosts.vlan != 0).then_some(VlanTag {
        tpid: ethertype::VLAN,
        pcp: 0,
        dei: false,
        vid: hosts.vlan,
    });
    let eth = EthernetRepr {
        dst: hosts.dst_mac,
        src: hosts.src_mac,
        tags: [tag, None],
        ethertype: if hosts.src.is_ipv4() {
            ethertype::IPV4
        } else {
            ethertype::IPV6
        },
    };
    let l2 = eth.header_len();
    buf.clear();
    buf.resize(
        l2 + ip_header_len(hosts) + l4.header_len() + payload.len(),
        0,
    );
    let _ = eth.emit(buf);
    emit_ip(&mut buf[l2..], hosts, l4, payload);
}

/// An ICMP (ICMPv6 for IPv6 hosts) error: its type and code, and the 16 bits its header
/// ends with (the next hop's MTU of "fragmentation needed" and "packet too big", else 0).
#[derive(Clone, Copy, Debug)]
pub struct IcmpError {
    pub icmp_type: u8,
    pub code: u8,
    pub mtu: u16,
}

/// Builds into `buf` (cleared first) a frame carrying `error` about `quoted`, the first
/// bytes of the IP packet it reports (its IP header and at least 8 bytes more, as RFC 792
/// asks; Linux quotes up to 576 bytes), with its checksum right.
pub fn emit_icmp_error(buf: &mut Vec<u8>, hosts: &Hosts, error: IcmpError, quoted: &[u8]) {
    // An echo request's header is an error's shape: type, code, checksum, and 32 bits
    // whose low 16 are the echo's sequence number and the error's MTU.
    let shape = L4::IcmpEcho {
        request: true,
        ident: 0,
        seq: error.mtu,
    };
    emit_frame(buf, hosts, &shape, quoted);
    let at = header_len(hosts, &shape) - shape.header_len();
    buf[at] = error.icmp_type;
    buf[at + 1] = error.code;
    let len = buf.len() - at;
    let pseudo = match (hosts.src, hosts.dst) {
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            checksum::pseudo_v6(src, dst, protocol::ICMPV6, len as u32)
        }
        _ => 0,
    };
    IcmpPacket::new_unchecked(&mut buf[at..]).fill_checksum(pseudo);
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateplane_wire::{FlowHasher, ParseFlags, parse};

    #[test]
    fn frames_parse_back_with_valid_checksums() {
        let h = FlowHasher::with_seed(1);
        for (src, dst) in [("198.18.0.1", "198.19.0.1"), ("2001:2::1", "2001:2:0:1::1")] {
            let hosts = Hosts {
                src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
                dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
                vlan: 5,
                src: src.parse().unwrap(),
                dst: dst.parse().unwrap(),
                ttl: 64,
            };
            for l4 in [
                L4::Tcp {
                    src_port: 1,
                    dst_port: 2,
                    seq: 3,
                    ack: 4,
                    flags: 0x12,
                },
                L4::Udp {
                    src_port: 5,
                    dst_port: 6,
                },
                L4::IcmpEcho {
                    request: true,
                    ident: 9,
                    seq: 1,
                },
            ] {
                let mut buf = Vec::new();
                emit_frame(&mut buf, &hosts, &l4, &[0xab; 33]);
                assert_eq!(buf.len(), header_len(&hosts, &l4) + 33);
                let p = parse(&buf, 0, &h).unwrap();
                assert!(p.flags.has(ParseFlags::VLAN));
                assert_eq!(p.key.vlan, 5);
                let l4_bytes = &buf[usize::from(p.l4_offset)..];
                let pseudo = match (hosts.src, hosts.dst) {
                    (IpAddr::V4(s), IpAddr::V4(d)) => {
                        checksum::pseudo_v4(s, d, p.key.proto, l4_bytes.len() as u16)
                    }
                    (IpAddr::V6(s), IpAddr::V6(d)) => {
                        checksum::pseudo_v6(s, d, p.key.proto, l4_bytes.len() as u32)
                    }
                    _ => unreachable!(),
                };
                let pseudo = if p.key.proto == protocol::ICMP {
                    0
                } else {
                    pseudo
                };
                assert_eq!(
                    checksum::finish(checksum::accumulate(pseudo, l4_bytes)),
                    0,
                    "{l4:?} over {src}"
                );
            }
        }
    }
}
