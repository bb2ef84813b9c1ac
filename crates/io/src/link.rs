//! The link types a capture may be read in (pcap-linktype(7)), and the Ethernet header
//! that stands in for the others: programs and the flow stage read Ethernet frames, so a
//! reader hands them one, its header made from what the capture's own link header says.
//!
//! Owns the list of link types the readers take and the translation of their headers.
//! Must never change a byte after the link header: the network layer is what was captured.

use stateplane_runtime::SeenAt;
use stateplane_wire::ethernet::ethertype;

/// A Linux cooked header's packet type of a packet leaving the host (PACKET_OUTGOING).
const PACKET_OUTGOING: u8 = 4;

/// What a synthesized Ethernet header takes: destination, source, EtherType.
const ETHERNET_HEADER_LEN: usize = 14;

/// A link type the readers take: Ethernet as it is, the others through a synthesized
/// Ethernet header (destination 00:00:00:00:00:00; source the sender's link-layer address
/// where a Linux cooked header holds a 6-byte one, else zero; the EtherType of the
/// packet's network layer, 0 when the header names none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkType {
    /// 1: Ethernet II frames.
    Ethernet,
    /// 0: BSD loopback, a 4-byte address family in the byte order of the host that wrote it.
    Null,
    /// 108: OpenBSD loopback, the same family in network byte order.
    Loop,
    /// 101: IP without a link header, IPv4 or IPv6 by its version field.
    Raw,
    /// 228: IPv4 without a link header.
    Ipv4,
    /// 229: IPv6 without a link header.
    Ipv6,
    /// 113: Linux cooked capture (`tcpdump -i any` before libpcap 1.10), 16 bytes.
    LinuxSll,
    /// 276: Linux cooked capture v2 (`tcpdump -i any` since libpcap 1.10), 20 bytes.
    LinuxSll2,
}

/// The link types the readers take, by number, for messages and docs.
pub const READ_LINK_TYPES: &str = "Ethernet (1), Linux cooked SLL (113) and SLL2 (276), raw IP (101, 228, 229), BSD loopback (0, 108)";

/// Each link type the readers take, by its number in capture headers.
const NUMBERS: [(u32, LinkType); 8] = [
    (1, LinkType::Ethernet),
    (0, LinkType::Null),
    (108, LinkType::Loop),
    (101, LinkType::Raw),
    (228, LinkType::Ipv4),
    (229, LinkType::Ipv6),
    (113, LinkType::LinuxSll),
    (276, LinkType::LinuxSll2),
];

impl LinkType {
    /// The link type of a capture's `linktype` field (its FCS bits, the upper 16 of a
    /// pcap header's, already masked off), if the readers take it.
    pub fn of(linktype: u32) -> Option<LinkType> {
        NUMBERS
            .iter()
            .find(|(n, _)| *n == linktype)
            .map(|&(_, link)| link)
    }

    /// Its number in capture headers.
    pub fn number(self) -> u32 {
        NUMBERS
            .iter()
            .find(|(_, link)| *link == self)
            .map_or(1, |&(n, _)| n)
    }

    /// Writes `data`, a packet of this link type, as an Ethernet frame into `frame`
    /// (whatever it held is replaced). A packet cut short inside its link header becomes
    /// an empty frame, which the parser counts as truncated. An Ethernet frame is copied
    /// as it is (the readers lend it as it lies instead).
    pub fn write_ethernet(self, data: &[u8], frame: &mut Vec<u8>) {
        frame.clear();
        if self == LinkType::Ethernet {
            frame.extend_from_slice(data);
            return;
        }
        let Some((header_len, source, ethertype)) = self.header(data) else {
            return;
        };
        frame.reserve(ETHERNET_HEADER_LEN + data.len() - header_len);
        frame.extend_from_slice(&[0; 6]);
        frame.extend_from_slice(&source);
        frame.extend_from_slice(&ethertype.to_be_bytes());
        frame.extend_from_slice(&data[header_len..]);
    }

    /// Where the link header at the start of `data` says the packet was seen: a Linux
    /// cooked header's direction (SLL and SLL2) and interface (SLL2); nothing for the
    /// others, or for a header cut short.
    pub fn seen_at(self, data: &[u8]) -> SeenAt {
        let outgoing = |at: usize| data.get(at) == Some(&PACKET_OUTGOING);
        match self {
            // Packet type 2 bytes (its low byte is the type).
            LinkType::LinuxSll if data.len() >= 16 => SeenAt {
                interface: 0,
                outgoing: outgoing(1),
            },
            // Interface index at 4, packet type at 10.
            LinkType::LinuxSll2 if data.len() >= 20 => SeenAt {
                interface: data
                    .get(4..8)
                    .and_then(|b| b.first_chunk())
                    .map_or(0, |b| u32::from_be_bytes(*b)),
                outgoing: outgoing(10),
            },
            _ => SeenAt::default(),
        }
    }

    /// The link header at the start of `data`: its length, the sender's MAC address to put
    /// in the Ethernet header, and the EtherType of what follows; `None` when `data` is
    /// shorter than the header (or is Ethernet, whose header stays).
    fn header(self, data: &[u8]) -> Option<(usize, [u8; 6], u16)> {
        let be16 = |at: usize| Some(u16::from_be_bytes(*data.get(at..)?.first_chunk()?));
        let no_source = [0; 6];
        Some(match self {
            LinkType::Ethernet => return None,
            LinkType::Null => {
                let family = u32::from_le_bytes(*data.first_chunk()?);
                // The writer's byte order: a family is a small number, so the order that
                // reads it as one is the writer's.
                let family = match family & 0xffff {
                    0 => family.swap_bytes(),
                    _ => family,
                };
                (4, no_source, ethertype_of_family(family))
            }
            LinkType::Loop => {
                let family = u32::from_be_bytes(*data.first_chunk()?);
                (4, no_source, ethertype_of_family(family))
            }
            LinkType::Raw => match data.first()? >> 4 {
                4 => (0, no_source, ethertype::IPV4),
                6 => (0, no_source, ethertype::IPV6),
                _ => (0, no_source, 0),
            },
            LinkType::Ipv4 => (0, no_source, ethertype::IPV4),
            LinkType::Ipv6 => (0, no_source, ethertype::IPV6),
            LinkType::LinuxSll => {
                // Packet type 2, ARPHRD type 2, address length 2, address 8, protocol 2.
                let address_len = be16(4)?;
                (16, sll_source(data.get(6..14)?, address_len), be16(14)?)
            }
            LinkType::LinuxSll2 => {
                // Protocol 2, reserved 2, interface index 4, ARPHRD type 2, packet type 1,
                // address length 1, address 8.
                let address_len = u16::from(*data.get(11)?);
                (20, sll_source(data.get(12..20)?, address_len), be16(0)?)
            }
        })
    }
}

/// The conventional name of a link type, for messages.
pub fn linktype_name(linktype: u32) -> &'static str {
    match linktype {
        0 => "NULL (BSD loopback)",
        1 => "ETHERNET",
        101 => "RAW (IP without a link header)",
        108 => "LOOP (OpenBSD loopback)",
        105 => "IEEE802_11 (Wi-Fi)",
        113 => "LINUX_SLL (Linux cooked capture, e.g. tcpdump -i any)",
        127 => "IEEE802_11_RADIOTAP",
        228 => "IPV4",
        229 => "IPV6",
        276 => "LINUX_SLL2 (Linux cooked capture v2, e.g. tcpdump -i any)",
        _ => "unknown",
    }
}

/// The source MAC address a cooked header's link-layer `address` (of `len` bytes) gives:
/// itself when it is a 6-byte (Ethernet) address, else zero.
fn sll_source(address: &[u8], len: u16) -> [u8; 6] {
    match (len, address.first_chunk()) {
        (6, Some(mac)) => *mac,
        _ => [0; 6],
    }
}

/// The EtherType of a BSD address family: AF_INET is 2 everywhere; AF_INET6 is 24
/// (NetBSD, OpenBSD), 28 (FreeBSD), 30 (macOS) or 10 (Linux); others are not IP (0).
fn ethertype_of_family(family: u32) -> u16 {
    match family {
        2 => ethertype::IPV4,
        10 | 24 | 28 | 30 => ethertype::IPV6,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IPV4: &[u8] = &[
        0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ];
    const IPV6_START: &[u8] = &[0x60, 0, 0, 0, 0, 0, 59, 64];

    fn ethernet(link: LinkType, data: &[u8]) -> Vec<u8> {
        let mut frame = vec![0xAA; 3];
        link.write_ethernet(data, &mut frame);
        frame
    }

    /// An Ethernet frame of `source`, `ethertype` and `payload`, to the zero address.
    fn expected(source: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0; 6];
        f.extend_from_slice(&source);
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn every_link_number_the_readers_name_is_taken_and_no_other() {
        for (number, link) in NUMBERS {
            assert_eq!(LinkType::of(number), Some(link));
            assert_eq!(link.number(), number);
            assert_ne!(linktype_name(number), "unknown");
            assert!(
                READ_LINK_TYPES.contains(&format!("{number})"))
                    || READ_LINK_TYPES.contains(&format!("{number},"))
                    || READ_LINK_TYPES.contains(&format!("({number} "))
            );
        }
        for refused in [105, 127, 9, 104, 12, 14, 2, 65535] {
            assert_eq!(LinkType::of(refused), None, "{refused}");
        }
    }

    #[test]
    fn raw_ip_gets_the_ethertype_of_its_version() {
        let mut v6 = IPV6_START.to_vec();
        v6.extend_from_slice(&[0; 32]);
        assert_eq!(
            ethernet(LinkType::Raw, IPV4),
            expected([0; 6], 0x0800, IPV4)
        );
        assert_eq!(ethernet(LinkType::Raw, &v6), expected([0; 6], 0x86dd, &v6));
        assert_eq!(
            ethernet(LinkType::Raw, &[0x55, 1]),
            expected([0; 6], 0, &[0x55, 1])
        );
        assert_eq!(
            ethernet(LinkType::Ipv4, IPV4),
            expected([0; 6], 0x0800, IPV4)
        );
        // The type says IPv6 whatever the version field holds: the parser judges it.
        assert_eq!(
            ethernet(LinkType::Ipv6, IPV4),
            expected([0; 6], 0x86dd, IPV4)
        );
        assert_eq!(ethernet(LinkType::Raw, &[]), Vec::<u8>::new());
    }

    #[test]
    fn loopback_families_read_in_either_byte_order() {
        for (family, ethertype) in [
            (2u32, 0x0800),
            (10, 0x86dd),
            (24, 0x86dd),
            (28, 0x86dd),
            (30, 0x86dd),
            (7, 0),
        ] {
            for header in [family.to_le_bytes(), family.to_be_bytes()] {
                let data = [&header[..], IPV4].concat();
                assert_eq!(
                    ethernet(LinkType::Null, &data),
                    expected([0; 6], ethertype, IPV4)
                );
            }
            let data = [&family.to_be_bytes()[..], IPV4].concat();
            assert_eq!(
                ethernet(LinkType::Loop, &data),
                expected([0; 6], ethertype, IPV4)
            );
        }
        // Little-endian 2 read as network order is no family the loopback type knows.
        let data = [&2u32.to_le_bytes()[..], IPV4].concat();
        assert_eq!(ethernet(LinkType::Loop, &data), expected([0; 6], 0, IPV4));
    }

    #[test]
    fn cooked_headers_give_their_protocol_and_a_six_byte_sender() {
        let mac = [2, 0, 0, 0, 0, 7];
        // SLL: outgoing (4), ARPHRD_ETHER (1), address length 6, address padded to 8, IPv4.
        let mut sll = vec![0, 4, 0, 1, 0, 6];
        sll.extend_from_slice(&mac);
        sll.extend_from_slice(&[0, 0, 0x08, 0x00]);
        sll.extend_from_slice(IPV4);
        assert_eq!(
            ethernet(LinkType::LinuxSll, &sll),
            expected(mac, 0x0800, IPV4)
        );
        // SLL2: IPv6, reserved, interface 3, ARPHRD_ETHER, incoming (0), length 6, address.
        let mut sll2 = vec![0x86, 0xdd, 0, 0, 0, 0, 0, 3, 0, 1, 0, 6];
        sll2.extend_from_slice(&mac);
        sll2.extend_from_slice(&[0, 0]);
        sll2.extend_from_slice(IPV6_START);
        assert_eq!(
            ethernet(LinkType::LinuxSll2, &sll2),
            expected(mac, 0x86dd, IPV6_START)
        );
        // Loopback has no address (length 0); a longer address than Ethernet's is no MAC.
        for len in [0u8, 8] {
            let mut other = sll2.clone();
            other[11] = len;
            assert_eq!(
                ethernet(LinkType::LinuxSll2, &other),
                expected([0; 6], 0x86dd, IPV6_START)
            );
        }
        // Where they say it was seen: SLL the direction, SLL2 the interface too.
        let seen = |interface, outgoing| SeenAt {
            interface,
            outgoing,
        };
        assert_eq!(LinkType::LinuxSll.seen_at(&sll), seen(0, true));
        assert_eq!(LinkType::LinuxSll2.seen_at(&sll2), seen(3, false));
        let (mut leaving, mut incoming) = (sll2.clone(), sll.clone());
        leaving[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        leaving[10] = 4;
        incoming[1] = 0;
        assert_eq!(LinkType::LinuxSll2.seen_at(&leaving), seen(u32::MAX, true));
        assert_eq!(LinkType::LinuxSll.seen_at(&incoming), seen(0, false));
        assert_eq!(LinkType::LinuxSll2.seen_at(&sll2[..19]), seen(0, false));
        assert_eq!(LinkType::LinuxSll.seen_at(&sll[..15]), seen(0, false));
        assert_eq!(LinkType::Ethernet.seen_at(&sll2), seen(0, false));
        // Cut inside the header: an empty frame, at every length short of the whole header.
        for cut in 0..16 {
            assert_eq!(
                ethernet(LinkType::LinuxSll, &sll[..cut]),
                Vec::<u8>::new(),
                "{cut}"
            );
        }
        for cut in 0..20 {
            assert_eq!(
                ethernet(LinkType::LinuxSll2, &sll2[..cut]),
                Vec::<u8>::new(),
                "{cut}"
            );
        }
        assert_eq!(
            ethernet(LinkType::LinuxSll, &sll[..16]),
            expected(mac, 0x0800, &[])
        );
    }
}
