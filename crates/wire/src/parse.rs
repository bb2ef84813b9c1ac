//! The one-pass parser of the fast path: a frame in, its header offsets, flow key and flow
//! hash out, or the reason it is malformed. It reads each header once, validates lengths
//! (not checksums: a switch forwards, it does not terminate), and never allocates.

use crate::ethernet::{self, EthernetFrame, ethertype};
use crate::flow::{FlowHasher, FlowKey};
use crate::gtp::{GTPC_PORT, GTPU_PORT, GtpuPacket};
use crate::icmp::{self, IcmpPacket};
use crate::ipv4::{Ipv4Packet, protocol};
use crate::ipv6::{self, Ipv6Packet};
use crate::tcp::TcpPacket;
use crate::udp::{self, UdpPacket};
use crate::{Error, arp};
use std::fmt;

/// Why a frame was refused. One counter per reason; the names are stable (they appear in
/// summaries and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Malformed {
    /// Shorter than an Ethernet header.
    EthernetTruncated,
    /// A VLAN tag runs past the end of the frame.
    VlanTruncated,
    /// More than two stacked VLAN tags.
    VlanTooDeep,
    /// An ARP packet shorter than 28 bytes.
    ArpTruncated,
    /// IPv4 header, or the total length it declares, runs past the frame.
    Ipv4Truncated,
    /// IPv4 version, header length or total length field is impossible.
    Ipv4BadHeader,
    /// IPv6 header, or the payload length it declares, runs past the frame.
    Ipv6Truncated,
    /// IPv6 version field is not 6.
    Ipv6BadHeader,
    /// An IPv6 extension header runs past the payload.
    Ipv6ExtensionTruncated,
    /// More IPv6 extension headers than the parser walks.
    Ipv6TooManyExtensions,
    /// TCP header runs past the IP payload.
    TcpTruncated,
    /// TCP data offset below 5.
    TcpBadDataOffset,
    /// UDP header runs past the IP payload.
    UdpTruncated,
    /// UDP length field below 8 or beyond the IP payload.
    UdpBadLength,
    /// ICMP/ICMPv6 header runs past the IP payload.
    IcmpTruncated,
}

impl Malformed {
    pub const COUNT: usize = 15;
    pub const ALL: [Malformed; Self::COUNT] = [
        Malformed::EthernetTruncated,
        Malformed::VlanTruncated,
        Malformed::VlanTooDeep,
        Malformed::ArpTruncated,
        Malformed::Ipv4Truncated,
        Malformed::Ipv4BadHeader,
        Malformed::Ipv6Truncated,
        Malformed::Ipv6BadHeader,
        Malformed::Ipv6ExtensionTruncated,
        Malformed::Ipv6TooManyExtensions,
        Malformed::TcpTruncated,
        Malformed::TcpBadDataOffset,
        Malformed::UdpTruncated,
        Malformed::UdpBadLength,
        Malformed::IcmpTruncated,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    /// The stable snake_case name used in summaries and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Malformed::EthernetTruncated => "ethernet_truncated",
            Malformed::VlanTruncated => "vlan_truncated",
            Malformed::VlanTooDeep => "vlan_too_deep",
            Malformed::ArpTruncated => "arp_truncated",
            Malformed::Ipv4Truncated => "ipv4_truncated",
            Malformed::Ipv4BadHeader => "ipv4_bad_header",
            Malformed::Ipv6Truncated => "ipv6_truncated",
            Malformed::Ipv6BadHeader => "ipv6_bad_header",
            Malformed::Ipv6ExtensionTruncated => "ipv6_extension_truncated",
            Malformed::Ipv6TooManyExtensions => "ipv6_too_many_extensions",
            Malformed::TcpTruncated => "tcp_truncated",
            Malformed::TcpBadDataOffset => "tcp_bad_data_offset",
            Malformed::UdpTruncated => "udp_truncated",
            Malformed::UdpBadLength => "udp_bad_length",
            Malformed::IcmpTruncated => "icmp_truncated",
        }
    }
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::error::Error for Malformed {}

/// What the parser found, as bits.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug, Hash)]
pub struct ParseFlags(pub u16);

impl ParseFlags {
    pub const VLAN: u16 = 1 << 0;
    pub const QINQ: u16 = 1 << 1;
    pub const ARP: u16 = 1 << 2;
    pub const IPV4: u16 = 1 << 3;
    pub const IPV6: u16 = 1 << 4;
    pub const TCP: u16 = 1 << 5;
    pub const UDP: u16 = 1 << 6;
    pub const ICMP: u16 = 1 << 7;
    /// Any fragment, first or later.
    pub const FRAGMENT: u16 = 1 << 8;
    /// A fragment other than the first: it carries no transport header.
    pub const LATER_FRAGMENT: u16 = 1 << 9;
    pub const IPV4_OPTIONS: u16 = 1 << 10;
    pub const IPV6_EXTENSIONS: u16 = 1 << 11;
    pub const GTPU: u16 = 1 << 12;
    pub const GTPC: u16 = 1 << 13;
    /// The IP header gives no length (0: a segment above 64 KiB, a jumbogram): the IP
    /// packet runs to the frame's end, and `ip_len` is 0 ([`Parsed::ip_bytes`]).
    pub const IP_LEN_FROM_FRAME: u16 = 1 << 14;

    #[inline(always)]
    pub fn has(self, bit: u16) -> bool {
        self.0 & bit != 0
    }
}

/// The parse of one frame. Offsets are from the start of the frame; an offset of 0 means the
/// header is absent (no header but Ethernet can start at 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub key: FlowKey,
    /// `FlowHasher::hash_connection` of the connection's key: the same for both
    /// directions of a connection, whatever port they arrive on, and for an ICMP error
    /// about it (workers are chosen by it).
    pub hash: u64,
    pub flags: ParseFlags,
    /// The payload EtherType, after any VLAN tags.
    pub ethertype: u16,
    /// Tag control information of the outer and inner VLAN tags (0 if absent).
    pub vlan_tci: [u16; 2],
    pub l3_offset: u16,
    pub l4_offset: u16,
    /// Where the transport payload starts (after TCP options, the UDP header, ...).
    pub payload_offset: u16,
    /// IPv4 total length, or IPv6 payload length plus 40: the bytes flow exporters count
    /// (0 with [`ParseFlags::IP_LEN_FROM_FRAME`]: see [`Parsed::ip_bytes`]).
    pub ip_len: u16,
    /// IPv4 TOS or IPv6 traffic class.
    pub tos: u8,
    /// IPv4 TTL or IPv6 hop limit.
    pub ttl: u8,
    pub tcp_flags: u8,
    /// Offset of the GTP header (GTP-U or GTP-C), 0 if none.
    pub gtp_offset: u16,
    /// GTP-U tunnel endpoint identifier.
    pub teid: u32,
}

impl Parsed {
    /// The IP packet's length on the wire: `ip_len`, or for a packet whose header gives
    /// none, what follows its IP header's start in the frame of `orig_len` bytes on the
    /// wire.
    #[inline]
    pub fn ip_bytes(&self, orig_len: u32) -> u32 {
        match self.flags.has(ParseFlags::IP_LEN_FROM_FRAME) {
            true => orig_len.saturating_sub(u32::from(self.l3_offset)),
            false => u32::from(self.ip_len),
        }
    }

    /// All zero: no headers found, the key of nothing (usable in `const` contexts).
    pub const EMPTY: Parsed = Parsed {
        key: FlowKey::EMPTY,
        hash: 0,
        flags: ParseFlags(0),
        ethertype: 0,
        vlan_tci: [0; 2],
        l3_offset: 0,
        l4_offset: 0,
        payload_offset: 0,
        ip_len: 0,
        tos: 0,
        ttl: 0,
        tcp_flags: 0,
        gtp_offset: 0,
        teid: 0,
    };
}

/// Parses `frame`, received on `in_port`, hashing its key with `hasher`.
#[inline]
pub fn parse(frame: &[u8], in_port: u16, hasher: &FlowHasher) -> Result<Parsed, Malformed> {
    let mut p = Parsed::EMPTY;
    parse_in_place(frame, in_port, hasher, &mut p)?;
    Ok(p)
}

/// [`parse`] into a `Parsed` the caller already has (a burst's descriptor), so the result
/// is written once where it is used. On error `out` holds a partial parse: ignore it.
/// Always inlined: left to the compiler, the call stayed out of line once the ICMP
/// errors' branch came in, and cost `bench --programs forward` 40 instructions a packet
/// (callgrind).
#[inline(always)]
pub fn parse_in_place(
    frame: &[u8],
    in_port: u16,
    hasher: &FlowHasher,
    out: &mut Parsed,
) -> Result<(), Malformed> {
    *out = Parsed::EMPTY;
    out.key.in_port = in_port;
    parse_into(frame, out)?;
    out.hash = hasher.hash_connection(&out.key);
    if out.flags.has(ParseFlags::ICMP) {
        hash_as_quoted_connection(frame, hasher, out);
    }
    Ok(())
}

/// Gives an ICMP error the hash of the connection it quotes, so that it reaches the
/// worker holding that connection's state (a firewall checks it there, a NAT translates
/// it there); it keeps its own key. Out of line: every other packet skips it on one flag.
#[cold]
#[inline(never)]
fn hash_as_quoted_connection(frame: &[u8], hasher: &FlowHasher, p: &mut Parsed) {
    if !icmp::is_error_key(&p.key) {
        return;
    }
    if let Ok(q) = icmp::quoted_by(frame, p) {
        p.hash = hasher.hash_connection(&q.key);
    }
}

fn parse_into(frame: &[u8], p: &mut Parsed) -> Result<(), Malformed> {
    let eth = EthernetFrame::new_checked(frame).map_err(|_| Malformed::EthernetTruncated)?;
    let mut ethertype = eth.ethertype();
    let mut at = ethernet::HEADER_LEN;
    let mut tags = 0;
    while ethertype::is_vlan_tpid(ethertype) {
        if tags == ethernet::MAX_VLAN_TAGS {
            return Err(Malformed::VlanTooDeep);
        }
        if frame.len() < at + ethernet::TAG_LEN {
            return Err(Malformed::VlanTruncated);
        }
        let tci = u16::from_be_bytes([frame[at], frame[at + 1]]);
        p.vlan_tci[tags] = tci;
        ethertype = u16::from_be_bytes([frame[at + 2], frame[at + 3]]);
        at += ethernet::TAG_LEN;
        tags += 1;
    }
    if tags > 0 {
        p.flags.0 |= ParseFlags::VLAN;
        p.key.vlan = p.vlan_tci[0] & 0x0fff;
    }
    if tags > 1 {
        p.flags.0 |= ParseFlags::QINQ;
    }
    p.ethertype = ethertype;
    p.l3_offset = at as u16;
    let l3 = &frame[at..];
    match ethertype {
        ethertype::IPV4 => parse_ipv4(l3, at, p),
        ethertype::IPV6 => parse_ipv6(l3, at, p),
        _ => {
            if ethertype == ethertype::ARP {
                if l3.len() < arp::PACKET_LEN {
                    return Err(Malformed::ArpTruncated);
                }
                p.flags.0 |= ParseFlags::ARP;
            }
            p.key.src[..6].copy_from_slice(&eth.src().0);
            p.key.dst[..6].copy_from_slice(&eth.dst().0);
            p.key.dst_port = ethertype;
            Ok(())
        }
    }
}

fn parse_ipv4(l3: &[u8], base: usize, p: &mut Parsed) -> Result<(), Malformed> {
    let ip = Ipv4Packet::new_checked(l3).map_err(|e| match e {
        Error::Truncated => Malformed::Ipv4Truncated,
        _ => Malformed::Ipv4BadHeader,
    })?;
    p.flags.0 |= ParseFlags::IPV4;
    p.key.ip_version = 4;
    p.key.src[..4].copy_from_slice(&l3[12..16]);
    p.key.dst[..4].copy_from_slice(&l3[16..20]);
    p.key.proto = ip.protocol();
    p.ip_len = ip.total_len();
    if ip.length_from_buffer() {
        p.flags.0 |= ParseFlags::IP_LEN_FROM_FRAME;
    }
    p.tos = ip.tos();
    p.ttl = ip.ttl();
    let header_len = ip.header_len();
    if header_len > crate::ipv4::MIN_HEADER_LEN {
        p.flags.0 |= ParseFlags::IPV4_OPTIONS;
    }
    let mut fragmented = false;
    if ip.is_fragment() {
        p.flags.0 |= ParseFlags::FRAGMENT;
        fragmented = true;
        if ip.frag_offset() != 0 {
            p.flags.0 |= ParseFlags::LATER_FRAGMENT;
            return Ok(());
        }
    }
    let l4 = &l3[header_len..ip.packet_len()];
    parse_transport(l4, base + header_len, false, fragmented, p)
}

fn parse_ipv6(l3: &[u8], base: usize, p: &mut Parsed) -> Result<(), Malformed> {
    let ip = Ipv6Packet::new_checked(l3).map_err(|e| match e {
        Error::Truncated => Malformed::Ipv6Truncated,
        _ => Malformed::Ipv6BadHeader,
    })?;
    p.flags.0 |= ParseFlags::IPV6;
    p.key.ip_version = 6;
    p.key.src.copy_from_slice(&l3[8..24]);
    p.key.dst.copy_from_slice(&l3[24..40]);
    p.ip_len = match ip.length_from_buffer() {
        true => {
            p.flags.0 |= ParseFlags::IP_LEN_FROM_FRAME;
            0
        }
        false => ip.payload_len().saturating_add(ipv6::HEADER_LEN as u16),
    };
    p.tos = ip.traffic_class();
    p.ttl = ip.hop_limit();
    let payload = ip.payload();
    let walk = ipv6::walk_extensions(ip.next_header(), payload).map_err(|e| match e {
        Error::Truncated => Malformed::Ipv6ExtensionTruncated,
        _ => Malformed::Ipv6TooManyExtensions,
    })?;
    p.key.proto = walk.protocol;
    if walk.count > 0 {
        p.flags.0 |= ParseFlags::IPV6_EXTENSIONS;
    }
    let mut fragmented = false;
    if let Some((offset, _more)) = walk.fragment {
        p.flags.0 |= ParseFlags::FRAGMENT;
        fragmented = true;
        if offset != 0 {
            p.flags.0 |= ParseFlags::LATER_FRAGMENT;
            return Ok(());
        }
    }
    let l4_base = base + ipv6::HEADER_LEN + walk.offset;
    parse_transport(&payload[walk.offset..], l4_base, true, fragmented, p)
}

/// Parses the transport header in `l4` (the IP payload after extension headers), which
/// starts `base` bytes into the frame.
fn parse_transport(
    l4: &[u8],
    base: usize,
    v6: bool,
    fragmented: bool,
    p: &mut Parsed,
) -> Result<(), Malformed> {
    match p.key.proto {
        protocol::TCP => {
            let tcp = TcpPacket::new_checked(l4).map_err(|e| match e {
                Error::Truncated => Malformed::TcpTruncated,
                _ => Malformed::TcpBadDataOffset,
            })?;
            p.flags.0 |= ParseFlags::TCP;
            p.key.src_port = tcp.src_port();
            p.key.dst_port = tcp.dst_port();
            p.tcp_flags = tcp.flags();
            p.l4_offset = base as u16;
            p.payload_offset = (base + tcp.header_len()) as u16;
        }
        protocol::UDP => {
            if l4.len() < udp::HEADER_LEN {
                return Err(Malformed::UdpTruncated);
            }
            // The length field of a first fragment covers the whole datagram, not this packet.
            let udp = if fragmented {
                UdpPacket::new_unchecked(l4)
            } else {
                UdpPacket::new_checked(l4).map_err(|_| Malformed::UdpBadLength)?
            };
            p.flags.0 |= ParseFlags::UDP;
            p.key.src_port = udp.src_port();
            p.key.dst_port = udp.dst_port();
            p.l4_offset = base as u16;
            p.payload_offset = (base + udp::HEADER_LEN) as u16;
            if !fragmented {
                parse_gtp(udp.payload(), base + udp::HEADER_LEN, p);
            }
        }
        protocol::ICMP | protocol::ICMPV6 if (p.key.proto == protocol::ICMPV6) == v6 => {
            let icmp = IcmpPacket::new_checked(l4).map_err(|_| Malformed::IcmpTruncated)?;
            p.flags.0 |= ParseFlags::ICMP;
            let t = icmp.icmp_type();
            p.key.src_port = if icmp::types::is_echo(v6, t) {
                icmp.echo_ident()
            } else {
                0
            };
            p.key.dst_port = u16::from(t) << 8 | u16::from(icmp.code());
            p.l4_offset = base as u16;
            p.payload_offset = (base + icmp::HEADER_LEN) as u16;
        }
        _ => {}
    }
    Ok(())
}

/// Flags GTP on its well-known ports. A payload on the GTP-U port that is not valid GTP-U
/// is plain UDP, not a malformed packet: any application may use port 2152, and a
/// gateway program checks the flag before it trusts the tunnel header.
fn parse_gtp(udp_payload: &[u8], base: usize, p: &mut Parsed) {
    if p.key.dst_port == GTPU_PORT {
        if let Ok(gtp) = GtpuPacket::new_checked(udp_payload) {
            p.flags.0 |= ParseFlags::GTPU;
            p.gtp_offset = base as u16;
            p.teid = gtp.teid();
        }
    } else if p.key.dst_port == GTPC_PORT || p.key.src_port == GTPC_PORT {
        p.flags.0 |= ParseFlags::GTPC;
        p.gtp_offset = base as u16;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ethernet::{EthernetRepr, MacAddr, VlanTag};
    use crate::gtp::{GTPU_T_PDU, GtpuRepr};
    use crate::icmp::IcmpRepr;
    use crate::ipv4::{Ipv4Options, Ipv4Repr};
    use crate::ipv6::Ipv6Repr;
    use crate::tcp::{TcpRepr, flags};
    use crate::udp::UdpRepr;
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn eth(ethertype: u16, tags: usize) -> EthernetRepr {
        let tag = |vid| {
            Some(VlanTag {
                tpid: ethertype::VLAN,
                pcp: 0,
                dei: false,
                vid,
            })
        };
        let tags = match tags {
            0 => [None, None],
            1 => [tag(10), None],
            _ => [tag(10), tag(20)],
        };
        EthernetRepr {
            dst: MacAddr([2, 0, 0, 0, 0, 2]),
            src: MacAddr([2, 0, 0, 0, 0, 1]),
            tags,
            ethertype,
        }
    }

    fn v4(proto: u8, payload_len: usize, options: usize) -> Ipv4Repr {
        Ipv4Repr {
            src: Ipv4Addr::new(198, 18, 0, 1),
            dst: Ipv4Addr::new(198, 19, 0, 2),
            protocol: proto,
            ttl: 64,
            tos: 0x28,
            ident: 1,
            dont_frag: true,
            more_frags: false,
            frag_offset: 0,
            options: Ipv4Options::new(&vec![1u8; options]).unwrap(),
            payload_len: payload_len as u16,
        }
    }

    /// Builds a frame: Ethernet (with `tags` VLAN tags), then IPv4 or IPv6, then `l4`.
    fn frame(v6: bool, tags: usize, proto: u8, l4: &[u8], options: usize) -> Vec<u8> {
        let e = eth(if v6 { ethertype::IPV6 } else { ethertype::IPV4 }, tags);
        let mut buf = vec![0u8; e.header_len()];
        e.emit(&mut buf).unwrap();
        let mut ip = vec![0u8; 60];
        let n = if v6 {
            let r = Ipv6Repr {
                src: Ipv6Addr::new(0x2001, 0x2, 0, 0, 0, 0, 0, 1),
                dst: Ipv6Addr::new(0x2001, 0x2, 0, 1, 0, 0, 0, 2),
                next_header: proto,
                hop_limit: 9,
                traffic_class: 0,
                flow_label: 5,
                payload_len: l4.len() as u16,
            };
            r.emit(&mut ip).unwrap();
            r.header_len()
        } else {
            let r = v4(proto, l4.len(), options);
            r.emit(&mut ip).unwrap();
            r.header_len()
        };
        buf.extend_from_slice(&ip[..n]);
        buf.extend_from_slice(l4);
        buf
    }

    /// An ICMP error (of ICMPv6 if `v6`) about the packet `original` (a frame) carried:
    /// its IP header and first 8 bytes of transport, quoted; the error travels the other
    /// way, which a fixed-address builder cannot show and a hash does not depend on.
    fn error_about(original: &[u8], v6: bool, tags: usize) -> Vec<u8> {
        let ip = &original[14 + 4 * tags..];
        let ip_header = if v6 {
            40
        } else {
            usize::from(ip[0] & 0x0f) * 4
        };
        let (t, proto) = if v6 {
            (2, protocol::ICMPV6)
        } else {
            (3, protocol::ICMP)
        };
        let mut icmp = vec![t, 4, 0, 0, 0, 0, 0x05, 0xdc];
        icmp.extend_from_slice(&ip[..ip_header + 8]);
        frame(v6, tags, proto, &icmp, 0)
    }

    /// An ICMP error goes to the worker of the connection it is about: its hash is that
    /// connection's, whichever way the connection's packets go; its key stays its own.
    #[test]
    fn an_icmp_error_hashes_as_the_connection_it_quotes() {
        let h = FlowHasher::with_seed(9);
        for (v6, tags, proto, l4) in [
            (false, 0, protocol::TCP, tcp(1000, 80, flags::SYN)),
            (false, 1, protocol::UDP, udp(53, 5353, b"abcd")),
            (true, 0, protocol::TCP, tcp(1, 2, flags::ACK)),
            (true, 0, protocol::UDP, udp(3, 4, b"xyz")),
        ] {
            let original = frame(v6, tags, proto, &l4, 0);
            let sent = parse(&original, 0, &h).unwrap();
            let error = parse(&error_about(&original, v6, tags), 1, &h).unwrap();
            assert_eq!(error.hash, sent.hash, "{proto} v6 {v6}");
            assert_eq!(error.key.proto, if v6 { 58 } else { 1 });
            assert_ne!(h.hash_connection(&error.key), sent.hash);
        }
        // A quote that cannot be read leaves the error its own hash.
        let original = frame(false, 0, protocol::TCP, &tcp(1000, 80, flags::SYN), 0);
        let mut error = error_about(&original, false, 0);
        error.truncate(error.len() - 1);
        let fix = error.len() - 14;
        error[16..18].copy_from_slice(&(fix as u16).to_be_bytes());
        let p = parse(&error, 0, &h).unwrap();
        assert_eq!(p.hash, h.hash_connection(&p.key));
    }

    fn tcp(sp: u16, dp: u16, fl: u8) -> Vec<u8> {
        let r = TcpRepr::new(sp, dp, 1, 2, fl, 100)
            .with_options(&[2, 4, 5, 0xb4])
            .unwrap();
        let mut b = vec![0u8; r.header_len() + 10];
        r.emit(&mut b).unwrap();
        b
    }

    fn udp(sp: u16, dp: u16, payload: &[u8]) -> Vec<u8> {
        let r = UdpRepr {
            src_port: sp,
            dst_port: dp,
            payload_len: payload.len() as u16,
        };
        let mut b = vec![0u8; 8];
        r.emit(&mut b).unwrap();
        b.extend_from_slice(payload);
        b
    }

    fn gtpu(teid: u32, inner: &[u8]) -> Vec<u8> {
        let r = GtpuRepr {
            message_type: GTPU_T_PDU,
            teid,
            sequence: Some(3),
            payload_len: inner.len() as u16,
        };
        let mut b = vec![0u8; r.header_len()];
        r.emit(&mut b).unwrap();
        b.extend_from_slice(inner);
        b
    }

    /// Every kind of frame the tests below cut at every offset.
    fn corpus() -> Vec<Vec<u8>> {
        let mut icmp = vec![0u8; 12];
        IcmpRepr::echo(8, 0x77, 1).emit(&mut icmp).unwrap();
        let mut icmp6 = vec![0u8; 12];
        IcmpRepr::echo(128, 0x78, 1).emit(&mut icmp6).unwrap();
        let inner = frame(false, 0, protocol::UDP, &udp(1, 2, &[0; 4]), 0)[14..].to_vec();
        let mut arp = vec![0u8; 18 + 28];
        eth(ethertype::ARP, 1).emit(&mut arp).unwrap();
        vec![
            frame(false, 0, protocol::TCP, &tcp(1000, 80, flags::SYN), 0),
            frame(false, 1, protocol::TCP, &tcp(1000, 80, flags::ACK), 8),
            frame(false, 2, protocol::UDP, &udp(53, 5353, b"abcd"), 0),
            frame(true, 0, protocol::TCP, &tcp(1, 2, flags::FIN), 0),
            frame(true, 1, protocol::UDP, &udp(3, 4, b"xyz"), 0),
            frame(false, 0, protocol::ICMP, &icmp, 0),
            frame(true, 0, protocol::ICMPV6, &icmp6, 0),
            frame(
                false,
                0,
                protocol::UDP,
                &udp(2152, GTPU_PORT, &gtpu(0xabcd, &inner)),
                0,
            ),
            arp,
        ]
    }

    #[test]
    fn fields_offsets_and_keys() {
        let h = FlowHasher::with_seed(1);
        let f = frame(
            false,
            1,
            protocol::TCP,
            &tcp(1000, 80, flags::SYN | flags::ACK),
            4,
        );
        let p = parse(&f, 3, &h).unwrap();
        assert!(
            p.flags.has(ParseFlags::IPV4)
                && p.flags.has(ParseFlags::TCP)
                && p.flags.has(ParseFlags::VLAN)
        );
        assert!(p.flags.has(ParseFlags::IPV4_OPTIONS));
        assert_eq!(
            (p.l3_offset, p.l4_offset, p.payload_offset),
            (18, 18 + 24, 18 + 24 + 24)
        );
        assert_eq!(
            p.key,
            FlowKey {
                vlan: 10,
                in_port: 3,
                ..FlowKey::v4(
                    Ipv4Addr::new(198, 18, 0, 1),
                    Ipv4Addr::new(198, 19, 0, 2),
                    6,
                    1000,
                    80
                )
            }
        );
        assert_eq!(p.tcp_flags, flags::SYN | flags::ACK);
        assert_eq!((p.tos, p.ttl, p.ip_len), (0x28, 64, 24 + 34));
        assert_eq!(p.hash, h.hash_connection(&p.key));

        let corpus = corpus();
        let g = parse(&corpus[7], 0, &h).unwrap();
        assert!(g.flags.has(ParseFlags::GTPU));
        assert_eq!((g.teid, g.gtp_offset), (0xabcd, 14 + 20 + 8));
        let icmp = parse(&corpus[5], 0, &h).unwrap();
        assert_eq!((icmp.key.src_port, icmp.key.dst_port), (0x77, 8 << 8));
        let icmp6 = parse(&corpus[6], 0, &h).unwrap();
        assert!(icmp6.flags.has(ParseFlags::ICMP));
        assert_eq!(icmp6.key.src_port, 0x78);
        let arp = parse(&corpus[8], 0, &h).unwrap();
        assert!(arp.flags.has(ParseFlags::ARP));
        assert_eq!(arp.key.dst_port, ethertype::ARP);
    }

    /// A TCP segment above 64 KiB, as a host with GRO or BIG TCP captures it: its IP length
    /// field is 0 (IPv6: with or without a hop-by-hop header, as a jumbogram has), and the
    /// packet runs to the frame's end. Below 64 KiB a length of 0 stays what it was.
    #[test]
    fn a_segment_above_64_kib_takes_its_length_from_the_frame() {
        let h = FlowHasher::with_seed(1);
        let payload = vec![0x61; 80_000];
        let segment = [tcp(1000, 80, flags::ACK), payload.clone()].concat();
        for (v6, hop_by_hop) in [(false, false), (true, false), (true, true)] {
            let l4 = match hop_by_hop {
                // Next header TCP, length 0 (8 bytes), jumbo payload option, 4-byte length.
                true => [&[protocol::TCP, 0, 0xC2, 4, 0, 1, 0x38, 0x80][..], &segment].concat(),
                false => segment.clone(),
            };
            let proto = if hop_by_hop {
                protocol::HOP_BY_HOP
            } else {
                protocol::TCP
            };
            let mut f = frame(v6, 0, proto, &l4, 0);
            // The length field: IPv4's total length at 2, IPv6's payload length at 4.
            let at = 14 + if v6 { 4 } else { 2 };
            f[at..at + 2].copy_from_slice(&[0, 0]);
            let p = parse(&f, 0, &h).unwrap();
            assert!(
                p.flags.has(ParseFlags::IP_LEN_FROM_FRAME),
                "{v6} {hop_by_hop}"
            );
            assert!(p.flags.has(ParseFlags::TCP));
            assert_eq!(
                (p.key.src_port, p.key.dst_port, p.tcp_flags),
                (1000, 80, flags::ACK)
            );
            assert_eq!(p.ip_len, 0);
            assert_eq!(p.ip_bytes(f.len() as u32), f.len() as u32 - 14);
            // The helper's segment carries 10 bytes of payload of its own.
            assert_eq!(usize::from(p.payload_offset), f.len() - payload.len() - 10);
            // A capture that cut it short still counts what was on the wire.
            assert_eq!(p.ip_bytes(200_000), 200_000 - 14);
            // 64 KiB or less: IPv4's 0 is impossible, IPv6's an empty payload, which has no
            // room for the header it names.
            let (small, why) = match (v6, hop_by_hop) {
                (false, _) => (&f[..14 + 65_535], Malformed::Ipv4BadHeader),
                (true, false) => (&f[..14 + 40 + 65_535], Malformed::TcpTruncated),
                (true, true) => (&f[..14 + 40 + 65_535], Malformed::Ipv6ExtensionTruncated),
            };
            assert_eq!(parse(small, 0, &h), Err(why));
        }
        // A UDP datagram in it (a tunnel's) has no room for its length either.
        let datagram = [udp(4789, 4789, &payload)].concat();
        let mut f = frame(false, 0, protocol::UDP, &datagram, 0);
        f[16..18].copy_from_slice(&[0, 0]);
        f[38..40].copy_from_slice(&[0, 0]);
        let p = parse(&f, 0, &h).unwrap();
        assert!(p.flags.has(ParseFlags::UDP) && p.flags.has(ParseFlags::IP_LEN_FROM_FRAME));
        assert_eq!((p.key.dst_port, p.ip_bytes(f.len() as u32)), (4789, 80_028));
        // A length that is not 0 is the length, whatever the frame holds after it.
        let f = frame(false, 0, protocol::TCP, &segment[..1000], 0);
        let padded = [f.clone(), vec![0; 70_000]].concat();
        let p = parse(&padded, 0, &h).unwrap();
        assert_eq!((p.ip_len, p.ip_bytes(padded.len() as u32)), (1020, 1020));
    }

    #[test]
    fn truncation_at_every_offset_is_an_error() {
        let h = FlowHasher::with_seed(1);
        for f in corpus() {
            assert!(parse(&f, 0, &h).is_ok(), "{:?}", parse(&f, 0, &h));
            for cut in 0..f.len() {
                assert!(
                    parse(&f[..cut], 0, &h).is_err(),
                    "a frame cut to {cut} of {} bytes parsed",
                    f.len()
                );
            }
        }
    }

    #[test]
    fn reasons_are_specific() {
        let h = FlowHasher::with_seed(1);
        let f = frame(false, 0, protocol::TCP, &tcp(1, 2, 0), 0);
        assert_eq!(parse(&f[..10], 0, &h), Err(Malformed::EthernetTruncated));
        assert_eq!(parse(&f[..20], 0, &h), Err(Malformed::Ipv4Truncated));
        assert_eq!(parse(&f[..40], 0, &h), Err(Malformed::Ipv4Truncated));
        let mut bad = f.clone();
        bad[14 + 20 + 12] = 0x40; // data offset 4
        assert_eq!(parse(&bad, 0, &h), Err(Malformed::TcpBadDataOffset));
        let mut bad = f.clone();
        bad[14] = 0x55; // version 5
        assert_eq!(parse(&bad, 0, &h), Err(Malformed::Ipv4BadHeader));
        let mut u = frame(false, 0, protocol::UDP, &udp(1, 2, b"abcd"), 0);
        u[14 + 20 + 5] = 99; // UDP length beyond the IP payload
        assert_eq!(parse(&u, 0, &h), Err(Malformed::UdpBadLength));
        let not_gtp = frame(
            false,
            0,
            protocol::UDP,
            &udp(5, GTPU_PORT, b"not gtp at all"),
            0,
        );
        let p = parse(&not_gtp, 0, &h).unwrap();
        assert!(p.flags.has(ParseFlags::UDP) && !p.flags.has(ParseFlags::GTPU));
    }

    #[test]
    fn fragments_are_flagged_and_later_ones_have_no_ports() {
        let h = FlowHasher::with_seed(1);
        let mut first = frame(false, 0, protocol::UDP, &udp(5, 6, &[0; 16]), 0);
        first[14 + 6] |= 0x20; // more fragments
        first[14 + 20 + 5] = 200; // the UDP length covers the whole datagram
        let p = parse(&first, 0, &h).unwrap();
        assert!(p.flags.has(ParseFlags::FRAGMENT) && !p.flags.has(ParseFlags::LATER_FRAGMENT));
        assert_eq!((p.key.src_port, p.key.dst_port), (5, 6));
        let mut later = first.clone();
        later[14 + 7] = 3; // offset 24 bytes
        let p = parse(&later, 0, &h).unwrap();
        assert!(p.flags.has(ParseFlags::LATER_FRAGMENT));
        assert_eq!((p.key.src_port, p.key.dst_port, p.l4_offset), (0, 0, 0));
    }

    #[test]
    fn ipv6_extension_headers_reach_the_transport() {
        let h = FlowHasher::with_seed(1);
        let mut l4 = vec![0u8; 8];
        ipv6::emit_generic_extension(&mut l4, protocol::TCP, &[1, 4, 0, 0, 0, 0]).unwrap();
        l4.extend_from_slice(&tcp(7, 8, flags::SYN));
        let f = frame(true, 0, protocol::HOP_BY_HOP, &l4, 0);
        let p = parse(&f, 0, &h).unwrap();
        assert!(p.flags.has(ParseFlags::IPV6_EXTENSIONS) && p.flags.has(ParseFlags::TCP));
        assert_eq!(
            (p.key.proto, p.key.src_port, p.l4_offset),
            (protocol::TCP, 7, 14 + 40 + 8)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse(&bytes, 0, &FlowHasher::with_seed(1));
        }

        #[test]
        fn mutated_frames_never_panic(pick in 0usize..9, flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
            let mut f = corpus()[pick].clone();
            for (at, v) in flips {
                let n = f.len();
                f[at % n] = v;
            }
            let _ = parse(&f, 0, &FlowHasher::with_seed(1));
        }
    }
}
