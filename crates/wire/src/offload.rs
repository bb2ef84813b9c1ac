//! What a sending host's device would have done to a frame that reached the switch without
//! its device: finishing a transport checksum its stack left partial; and what the device
//! that sends a large segment on needs to cut it ([`ready_for_cutting`]).
//!
//! A host with checksum offload on (a veth's default) writes into a TCP or UDP header only
//! the sum of the pseudo-header and leaves the rest to its device. A veth hands such a
//! packet on as it is. AF_PACKET says so per frame (see [`crate::checksum::complete_partial`]);
//! AF_XDP does not, so [`finish_partial_checksum`] recognises the partial sum itself.
//! Never for a frame whose checksum is already right: such a frame is left as it is.

use crate::checksum::{accumulate, complete_partial, finish, pseudo_v4, pseudo_v6};
use crate::ethernet::{self, EthernetFrame, EthernetRepr};
use crate::ipv4::{Ipv4Packet, protocol};
use crate::ipv6::{self, Ipv6Packet};

/// Where the checksum field lies in a TCP and a UDP header.
const TCP_CHECKSUM: usize = 16;
const UDP_CHECKSUM: usize = 6;

/// Finishes the TCP or UDP checksum of `frame` if its field holds its pseudo-header's sum
/// and the checksum is wrong: what a host's stack leaves for its device. Returns whether it
/// finished one. IPv4 but for fragments, and IPv6 with TCP or UDP right after the fixed
/// header; anything else, or anything cut short, is left as it is.
pub fn finish_partial_checksum(frame: &mut [u8]) -> bool {
    let Some((l4_start, l4_end, pseudo, proto, _)) = transport(frame) else {
        return false;
    };
    let field = l4_start
        + match proto {
            protocol::TCP => TCP_CHECKSUM,
            _ => UDP_CHECKSUM,
        };
    let segment = &frame[l4_start..l4_end];
    if segment.len() < field - l4_start + 2 {
        return false;
    }
    let stored = u16::from_be_bytes([frame[field], frame[field + 1]]);
    // The stack's partial sum is the pseudo-header's, folded and not complemented; a
    // right checksum that happens to equal it is told apart by summing the whole.
    if stored != !finish(pseudo) || finish(accumulate(pseudo, segment)) == 0 {
        return false;
    }
    complete_partial(&mut frame[..l4_end], l4_start, field)
}

/// What a device needs to cut a large TCP segment into pieces and finish each one's
/// checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segmentation {
    pub ipv6: bool,
    /// Where the TCP header starts in the frame; its checksum field lies
    /// [`TCP_CHECKSUM_OFFSET`] bytes further.
    pub transport_start: usize,
    /// Where the payload starts: the headers each piece repeats.
    pub headers_len: usize,
    /// The TCP header has CWR set, which only the first piece may keep.
    pub cwr: bool,
}

/// Where the checksum field lies in a TCP header.
pub const TCP_CHECKSUM_OFFSET: usize = TCP_CHECKSUM;

/// Readies `frame`, a TCP segment over IP, for the device that sends it on to cut it into
/// pieces: writes its pseudo-header's sum into the checksum field (what a stack leaves for
/// such a device, whatever a program changed in the addresses or ports since) and says
/// where its headers lie. `None`, and nothing written, for anything else: not TCP over IP
/// (a program may have put the segment in a tunnel, whose pieces would lose the inner
/// headers), an IPv4 fragment, IPv6 with extension headers, or an IP length that is not
/// the frame's.
pub fn ready_for_cutting(frame: &mut [u8]) -> Option<Segmentation> {
    let (start, end, pseudo, proto, ipv6) = transport(frame)?;
    if end != frame.len() || proto != protocol::TCP {
        return None;
    }
    let data_offset = usize::from(*frame.get(start + 12)? >> 4) * 4;
    let headers_len = start + data_offset;
    if data_offset < 20 || headers_len > end {
        return None;
    }
    let field = start + TCP_CHECKSUM;
    frame[field..field + 2].copy_from_slice(&(!finish(pseudo)).to_be_bytes());
    Some(Segmentation {
        ipv6,
        transport_start: start,
        headers_len,
        cwr: frame[start + 13] & 0x80 != 0,
    })
}

/// The TCP or UDP segment of `frame`: its start and end, its pseudo-header's sum, its
/// protocol, and whether it is over IPv6.
fn transport(frame: &[u8]) -> Option<(usize, usize, u32, u8, bool)> {
    let eth = EthernetRepr::parse(&EthernetFrame::new_checked(frame).ok()?).ok()?;
    let l3 = eth.header_len();
    match eth.ethertype {
        ethernet::ethertype::IPV4 => {
            let ip = Ipv4Packet::new_checked(&frame[l3..]).ok()?;
            let proto = ip.protocol();
            if ip.is_fragment() || !matches!(proto, protocol::TCP | protocol::UDP) {
                return None;
            }
            let (start, end) = (l3 + ip.header_len(), l3 + usize::from(ip.total_len()));
            let len = u16::try_from(end.checked_sub(start)?).ok()?;
            Some((
                start,
                end,
                pseudo_v4(ip.src(), ip.dst(), proto, len),
                proto,
                false,
            ))
        }
        ethernet::ethertype::IPV6 => {
            let ip = Ipv6Packet::new_checked(&frame[l3..]).ok()?;
            let proto = ip.next_header();
            if !matches!(proto, protocol::TCP | protocol::UDP) {
                return None;
            }
            let len = ip.payload_len();
            let start = l3 + ipv6::HEADER_LEN;
            let pseudo = pseudo_v6(ip.src(), ip.dst(), proto, u32::from(len));
            Some((start, start + usize::from(len), pseudo, proto, true))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// An Ethernet frame of IPv4 or IPv6 carrying `segment` as `proto`, the frame padded
    /// past the packet's end as short Ethernet frames are.
    fn frame(v6: bool, proto: u8, segment: &[u8], padding: usize) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        if v6 {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
            f.extend_from_slice(&(segment.len() as u16).to_be_bytes());
            f.extend_from_slice(&[proto, 64]);
            f.extend_from_slice(&Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1).octets());
            f.extend_from_slice(&Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2).octets());
        } else {
            f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
            f.extend_from_slice(&(20 + segment.len() as u16).to_be_bytes());
            f.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2]);
        }
        f.extend_from_slice(segment);
        f.extend(std::iter::repeat_n(0, padding));
        f
    }

    fn pseudo(v6: bool, proto: u8, len: usize) -> u32 {
        if v6 {
            let (s, d) = (
                Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1),
                Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2),
            );
            pseudo_v6(s, d, proto, len as u32)
        } else {
            let (s, d) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
            pseudo_v4(s, d, proto, len as u16)
        }
    }

    /// A TCP or UDP segment with its checksum field written by `field(pseudo, segment)`.
    fn segment(proto: u8, field: impl Fn(u32, &[u8]) -> u16, v6: bool) -> Vec<u8> {
        let mut s = if proto == protocol::TCP {
            let mut s = vec![0u8; 20];
            s[12] = 0x50;
            s
        } else {
            vec![0x30, 0x39, 0x00, 0x35, 0, 0, 0, 0]
        };
        s.extend_from_slice(b"some payload, odd length");
        if proto == protocol::UDP {
            let len = (s.len() as u16).to_be_bytes();
            s[4..6].copy_from_slice(&len);
        }
        let at = if proto == protocol::TCP { 16 } else { 6 };
        let value = field(pseudo(v6, proto, s.len()), &s);
        s[at..at + 2].copy_from_slice(&value.to_be_bytes());
        s
    }

    #[test]
    fn a_partial_sum_is_finished_to_the_full_checksum_on_ipv4_and_ipv6() {
        for v6 in [false, true] {
            for proto in [protocol::TCP, protocol::UDP] {
                let full = segment(proto, |p, s| finish(accumulate(p, s)), v6);
                let partial = segment(proto, |p, _| !finish(p), v6);
                let mut f = frame(v6, proto, &partial, 6);
                assert!(finish_partial_checksum(&mut f), "v6 {v6} proto {proto}");
                assert_eq!(f, frame(v6, proto, &full, 6), "v6 {v6} proto {proto}");
                // Finished, it is right, and left alone the second time.
                assert!(!finish_partial_checksum(&mut f));
            }
        }
    }

    #[test]
    fn right_wrong_and_unrelated_checksums_are_left_alone() {
        let full = segment(protocol::TCP, |p, s| finish(accumulate(p, s)), false);
        let wrong = segment(protocol::TCP, |_, _| 0x1234, false);
        for s in [&full, &wrong] {
            let mut f = frame(false, protocol::TCP, s, 0);
            let before = f.clone();
            assert!(!finish_partial_checksum(&mut f));
            assert_eq!(f, before);
        }
        // Not TCP or UDP, a fragment, cut short, not IP: nothing to do, nothing read past.
        let partial = segment(protocol::UDP, |p, _| !finish(p), false);
        let mut other = frame(false, protocol::ICMP, &partial, 0);
        assert!(!finish_partial_checksum(&mut other));
        let mut fragment = frame(false, protocol::UDP, &partial, 0);
        fragment[20] = 0x20; // more fragments
        assert!(!finish_partial_checksum(&mut fragment));
        let whole = frame(false, protocol::UDP, &partial, 0);
        for cut in 0..whole.len() {
            let mut f = whole[..cut].to_vec();
            assert!(!finish_partial_checksum(&mut f), "cut at {cut}");
        }
        let mut arp = whole.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(!finish_partial_checksum(&mut arp));
    }

    #[test]
    fn a_tcp_segment_readied_for_cutting_holds_its_pseudo_header_sum_and_says_where_its_headers_end()
     {
        for v6 in [false, true] {
            let full = segment(protocol::TCP, |p, s| finish(accumulate(p, s)), v6);
            let mut f = frame(v6, protocol::TCP, &full, 0);
            let ready = ready_for_cutting(&mut f).expect("a TCP segment");
            let start = if v6 { 14 + 40 } else { 14 + 20 };
            assert_eq!(
                ready,
                Segmentation {
                    ipv6: v6,
                    transport_start: start,
                    headers_len: start + 20,
                    cwr: false,
                }
            );
            let partial = segment(protocol::TCP, |p, _| !finish(p), v6);
            assert_eq!(f, frame(v6, protocol::TCP, &partial, 0), "v6 {v6}");
            // What the cutting device finishes is the full checksum again.
            assert!(complete_partial(&mut f, start, start + TCP_CHECKSUM_OFFSET));
            assert_eq!(f, frame(v6, protocol::TCP, &full, 0), "v6 {v6}");
        }
    }

    #[test]
    fn a_segment_readied_after_its_address_changed_sums_the_new_address() {
        let full = segment(protocol::TCP, |p, s| finish(accumulate(p, s)), false);
        let mut f = frame(false, protocol::TCP, &full, 0);
        // A NAT rewrote the source; the partial sum must be the new pseudo-header's.
        f[14 + 12..14 + 16].copy_from_slice(&[198, 19, 7, 7]);
        assert!(ready_for_cutting(&mut f).is_some());
        let sum = pseudo_v4(
            std::net::Ipv4Addr::new(198, 19, 7, 7),
            std::net::Ipv4Addr::new(198, 18, 0, 2),
            protocol::TCP,
            full.len() as u16,
        );
        assert_eq!(f[14 + 20 + 16..14 + 20 + 18], (!finish(sum)).to_be_bytes());
    }

    #[test]
    fn cwr_and_options_are_read_from_the_tcp_header() {
        let mut s = segment(protocol::TCP, |_, _| 0, false);
        s[12] = 0x80; // 32 bytes of header: 12 of options
        s[13] = 0x80 | 0x10; // CWR, ACK
        let mut f = frame(false, protocol::TCP, &s, 0);
        let ready = ready_for_cutting(&mut f).expect("a TCP segment");
        assert_eq!((ready.headers_len, ready.cwr), (14 + 20 + 32, true));
    }

    #[test]
    fn what_cannot_be_cut_as_tcp_is_refused_and_left_alone() {
        let tcp = segment(protocol::TCP, |_, _| 0x1234, false);
        let udp = segment(protocol::UDP, |_, _| 0x1234, false);
        let mut refused = vec![
            frame(false, protocol::UDP, &udp, 0), // a tunnel's outer header is UDP
            frame(false, protocol::ICMP, &tcp, 0),
            frame(false, protocol::TCP, &tcp, 4), // bytes past the IP length
        ];
        let mut fragment = frame(false, protocol::TCP, &tcp, 0);
        fragment[20] = 0x20;
        refused.push(fragment);
        let mut header_past_the_end = frame(false, protocol::TCP, &tcp, 0);
        header_past_the_end[14 + 20 + 12] = 0xf0; // 60 bytes of TCP header in 44
        refused.push(header_past_the_end);
        let mut short_header = frame(false, protocol::TCP, &tcp, 0);
        short_header[14 + 20 + 12] = 0x40;
        refused.push(short_header);
        let whole = frame(false, protocol::TCP, &tcp, 0);
        refused.extend((0..whole.len()).map(|cut| whole[..cut].to_vec()));
        for mut f in refused {
            let before = f.clone();
            assert_eq!(ready_for_cutting(&mut f), None, "{before:?}");
            assert_eq!(f, before);
        }
    }
}
