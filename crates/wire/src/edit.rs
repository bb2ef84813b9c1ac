//! In-place edits of a parsed frame that keep it valid: the rewrites a switch's actions make
//! (addresses, ports, TTL, VLAN tags), with the IPv4 header checksum and the transport
//! checksum updated incrementally (RFC 1624) rather than recomputed.
//!
//! Every edit takes the frame and its [`Parsed`] (offsets as the parser found them), checks
//! that the header it changes is there and inside the frame, and refuses otherwise: an edit
//! never panics and never half-applies.

use crate::checksum;
use crate::parse::{ParseFlags, Parsed};

/// Why an edit was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditError {
    /// The packet has no IP header to change.
    NotIp,
    /// The packet has no TCP or UDP header (another protocol, or a later fragment).
    NoPorts,
    /// The packet is not an ICMP or ICMPv6 echo request or reply.
    NotEcho,
    /// An address of the other IP family (4 bytes for IPv6 or 16 for IPv4).
    WrongFamily,
    /// Decrementing would take the TTL (hop limit) to zero.
    TtlExpired,
    /// The header ends past the captured bytes.
    Truncated,
    /// The packet is not an ICMPv4 error quoting a whole IPv4 header and the first 8
    /// bytes of TCP, UDP or an ICMP echo.
    NoQuote,
}

/// Which of a header's two addresses or ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Src,
    Dst,
}

fn word(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Where the transport checksum sits, if the transport's checksum covers the pseudo
/// header (and is in use: a zero UDP checksum over IPv4 means none).
fn pseudo_checksum_at(frame: &[u8], parsed: &Parsed) -> Option<usize> {
    let f = parsed.flags;
    if f.has(ParseFlags::LATER_FRAGMENT) {
        return None;
    }
    let l4 = usize::from(parsed.l4_offset);
    let at = if f.has(ParseFlags::TCP) {
        l4 + 16
    } else if f.has(ParseFlags::UDP) {
        l4 + 6
    } else if f.has(ParseFlags::ICMP) && f.has(ParseFlags::IPV6) {
        l4 + 2
    } else {
        return None;
    };
    let in_use = at + 2 <= frame.len()
        && !(f.has(ParseFlags::UDP) && f.has(ParseFlags::IPV4) && word(frame, at) == 0);
    in_use.then_some(at)
}

/// Rewrites the bytes at `at` to `new`, 16-bit word by word, updating the checksums at
/// `sums` for each word.
fn rewrite_words(frame: &mut [u8], at: usize, new: &[u8], sums: &[usize]) {
    for (i, pair) in new.chunks_exact(2).enumerate() {
        let p = at + 2 * i;
        let (old, new) = (word(frame, p), u16::from_be_bytes([pair[0], pair[1]]));
        for &s in sums {
            let c = checksum::update16(word(frame, s), old, new);
            frame[s..s + 2].copy_from_slice(&c.to_be_bytes());
        }
        frame[p..p + 2].copy_from_slice(pair);
    }
}

/// Sets the source or destination IP address: 4 bytes for IPv4, 16 for IPv6.
pub fn set_ip_addr(
    frame: &mut [u8],
    parsed: &Parsed,
    side: Side,
    new: &[u8],
) -> Result<(), EditError> {
    let l3 = usize::from(parsed.l3_offset);
    let f = parsed.flags;
    let (at, len, header_sum) = if f.has(ParseFlags::IPV4) {
        let at = l3 + if side == Side::Src { 12 } else { 16 };
        (at, 4, Some(l3 + 10))
    } else if f.has(ParseFlags::IPV6) {
        (l3 + if side == Side::Src { 8 } else { 24 }, 16, None)
    } else {
        return Err(EditError::NotIp);
    };
    if new.len() != len {
        return Err(EditError::WrongFamily);
    }
    if at + len > frame.len() {
        return Err(EditError::Truncated);
    }
    let l4_sum = pseudo_checksum_at(frame, parsed);
    let mut sums: [usize; 2] = [0; 2];
    let mut n = 0;
    for s in [header_sum, l4_sum].into_iter().flatten() {
        sums[n] = s;
        n += 1;
    }
    rewrite_words(frame, at, new, &sums[..n]);
    fix_zero_udp(frame, parsed, l4_sum);
    Ok(())
}

/// Sets the TCP or UDP source or destination port.
pub fn set_port(frame: &mut [u8], parsed: &Parsed, side: Side, port: u16) -> Result<(), EditError> {
    let f = parsed.flags;
    if !(f.has(ParseFlags::TCP) || f.has(ParseFlags::UDP)) || f.has(ParseFlags::LATER_FRAGMENT) {
        return Err(EditError::NoPorts);
    }
    let at = usize::from(parsed.l4_offset) + if side == Side::Src { 0 } else { 2 };
    if at + 2 > frame.len() {
        return Err(EditError::Truncated);
    }
    let sum = pseudo_checksum_at(frame, parsed);
    rewrite_words(frame, at, &port.to_be_bytes(), sum.as_slice());
    fix_zero_udp(frame, parsed, sum);
    Ok(())
}

/// Sets the identifier of an ICMP or ICMPv6 echo request or reply: what a NAT translates
/// where TCP and UDP have a port. The identifier is outside the ICMPv6 pseudo header, so
/// one checksum update serves both families.
pub fn set_echo_id(frame: &mut [u8], parsed: &Parsed, id: u16) -> Result<(), EditError> {
    let f = parsed.flags;
    if !f.has(ParseFlags::ICMP) || f.has(ParseFlags::LATER_FRAGMENT) {
        return Err(EditError::NotEcho);
    }
    let l4 = usize::from(parsed.l4_offset);
    if l4 + crate::icmp::HEADER_LEN > frame.len() {
        return Err(EditError::Truncated);
    }
    if !crate::icmp::types::is_echo(f.has(ParseFlags::IPV6), frame[l4]) {
        return Err(EditError::NotEcho);
    }
    rewrite_words(frame, l4 + 4, &id.to_be_bytes(), &[l4 + 2]);
    Ok(())
}

/// Rewrites one endpoint of the packet an ICMPv4 error quotes (`parsed` is the error's):
/// its address and its TCP or UDP port (an echo: its identifier, whichever `side`), as a
/// NAT translates an error about a connection it translates (RFC 5508 section 4.2,
/// RFC 5382 REQ-9). The quoted IP header's checksum, the quoted transport checksum where
/// the quote holds it (a TCP quote of 8 bytes does not; Linux's NAT leaves it so too)
/// and the error's own checksum, which covers all of them, are updated incrementally, so
/// a wrong checksum stays wrong. The error's own addresses are [`set_ip_addr`]'s.
pub fn set_quoted_endpoint(
    frame: &mut [u8],
    parsed: &Parsed,
    side: Side,
    addr: [u8; 4],
    port: u16,
) -> Result<(), EditError> {
    use crate::icmp;
    use crate::ipv4::protocol;
    let f = parsed.flags;
    let l4 = usize::from(parsed.l4_offset);
    let is_error = f.has(ParseFlags::ICMP)
        && f.has(ParseFlags::IPV4)
        && !f.has(ParseFlags::LATER_FRAGMENT)
        && frame.get(l4).is_some_and(|&t| icmp::is_error(false, t));
    if !is_error {
        return Err(EditError::NoQuote);
    }
    let ip = l4 + icmp::HEADER_LEN;
    // The error ends where its IP packet does: bytes past it (a trailer) are no quote.
    let end = (usize::from(parsed.l3_offset) + usize::from(parsed.ip_len)).min(frame.len());
    let quote = frame.get(ip..end).ok_or(EditError::NoQuote)?;
    let quoted = icmp::quoted(quote, false).map_err(|_| EditError::NoQuote)?;
    let inner = ip + quoted.l4_at;
    let from_src = |src: usize, dst: usize| if side == Side::Src { src } else { dst };
    // Where the port (or identifier) is, and the checksums that cover it and the address.
    let (port_at, transport_sum) = match quoted.key.proto {
        protocol::TCP => (
            inner + from_src(0, 2),
            (inner + 18 <= end).then_some(inner + 16),
        ),
        protocol::UDP => (
            inner + from_src(0, 2),
            (word(frame, inner + 6) != 0).then_some(inner + 6),
        ),
        protocol::ICMP if icmp::types::is_echo(false, frame[inner]) => (inner + 4, None),
        _ => return Err(EditError::NoQuote),
    };
    let error_sum = l4 + 2;
    let header_sum = ip + 10;
    let addr_at = ip + from_src(12, 16);
    let mut sums = [0; 2];
    let n = [Some(header_sum), transport_sum]
        .into_iter()
        .flatten()
        .fold(0, |n, at| {
            sums[n] = at;
            n + 1
        });
    covered(
        frame,
        error_sum,
        &[addr_at, addr_at + 2],
        &sums[..n],
        |frame| {
            rewrite_words(frame, addr_at, &addr, &sums[..n]);
        },
    );
    let echo_sum = inner + 2;
    let port_sums: &[usize] = match (quoted.key.proto, transport_sum) {
        (protocol::ICMP, _) => &[echo_sum],
        (_, Some(at)) => &[at],
        (_, None) => &[],
    };
    covered(frame, error_sum, &[port_at], port_sums, |frame| {
        rewrite_words(frame, port_at, &port.to_be_bytes(), port_sums);
    });
    if quoted.key.proto == protocol::UDP
        && let Some(at) = transport_sum
        && word(frame, at) == 0
    {
        // RFC 768: a UDP checksum in use is never sent as zero.
        covered(frame, error_sum, &[at], &[], |frame| {
            frame[at..at + 2].copy_from_slice(&[0xff, 0xff]);
        });
    }
    Ok(())
}

/// Makes `edit`, which changes the words at `changed` and the checksums at `sums`, all of
/// them inside what the checksum at `outer` covers, and updates `outer` for each.
fn covered(
    frame: &mut [u8],
    outer: usize,
    changed: &[usize],
    sums: &[usize],
    edit: impl FnOnce(&mut [u8]),
) {
    let mut before = [0u16; 4];
    let words = || changed.iter().chain(sums);
    for (b, &at) in before.iter_mut().zip(words()) {
        *b = word(frame, at);
    }
    edit(frame);
    for (&old, &at) in before.iter().zip(words()) {
        let c = checksum::update16(word(frame, outer), old, word(frame, at));
        frame[outer..outer + 2].copy_from_slice(&c.to_be_bytes());
    }
}

/// A UDP checksum in use that an update brought to zero is sent as all ones (RFC 768:
/// zero means no checksum).
fn fix_zero_udp(frame: &mut [u8], parsed: &Parsed, l4_sum: Option<usize>) {
    if let Some(at) = l4_sum
        && parsed.flags.has(ParseFlags::UDP)
        && word(frame, at) == 0
    {
        frame[at..at + 2].copy_from_slice(&[0xff, 0xff]);
    }
}

/// Decrements the IPv4 TTL (updating the header checksum) or the IPv6 hop limit; refused,
/// changing nothing, when it would reach zero.
pub fn dec_ttl(frame: &mut [u8], parsed: &Parsed) -> Result<(), EditError> {
    let l3 = usize::from(parsed.l3_offset);
    let f = parsed.flags;
    let at = if f.has(ParseFlags::IPV4) {
        l3 + 8
    } else if f.has(ParseFlags::IPV6) {
        l3 + 7
    } else {
        return Err(EditError::NotIp);
    };
    if l3 + 12 > frame.len() {
        return Err(EditError::Truncated);
    }
    if frame[at] <= 1 {
        return Err(EditError::TtlExpired);
    }
    if f.has(ParseFlags::IPV4) {
        // TTL is the high byte of the 16-bit word at offset 8; the checksum is at 10.
        let old = word(frame, l3 + 8);
        let new = old - 0x0100;
        let c = checksum::update16(word(frame, l3 + 10), old, new);
        frame[l3 + 8] = (new >> 8) as u8;
        frame[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
    } else {
        frame[at] -= 1;
    }
    Ok(())
}

/// The 802.1Q tag protocol identifier.
pub const TPID_8021Q: u16 = 0x8100;

/// Sets the VLAN id of the outer tag, keeping its priority bits.
pub fn set_vlan_id(frame: &mut [u8], id: u16) -> Result<(), EditError> {
    if frame.len() < 18 {
        return Err(EditError::Truncated);
    }
    let tci = word(frame, 14) & 0xf000 | id & 0x0fff;
    frame[14..16].copy_from_slice(&tci.to_be_bytes());
    Ok(())
}

/// Adds an outer 802.1Q tag with VLAN id `id` to a frame whose first 4 bytes are free room
/// (the Ethernet header starts at 4): the addresses move to the front and the tag goes
/// between them and the old EtherType.
pub fn insert_vlan_tag(frame: &mut [u8], id: u16) -> Result<(), EditError> {
    if frame.len() < 4 + 14 {
        return Err(EditError::Truncated);
    }
    frame.copy_within(4..16, 0);
    frame[12..14].copy_from_slice(&TPID_8021Q.to_be_bytes());
    frame[14..16].copy_from_slice(&(id & 0x0fff).to_be_bytes());
    Ok(())
}

/// Removes the outer VLAN tag: the addresses move 4 bytes on, and the frame's first 4
/// bytes are left for the caller to drop.
pub fn remove_vlan_tag(frame: &mut [u8]) -> Result<(), EditError> {
    if frame.len() < 18 {
        return Err(EditError::Truncated);
    }
    frame.copy_within(0..12, 4);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::FlowHasher;

    /// A TCP/IPv4 or UDP/IPv6 frame built by hand, with correct checksums.
    fn frame(v6: bool, udp: bool) -> Vec<u8> {
        let payload = b"stateplane";
        let l4_len = if udp { 8 } else { 20 } + payload.len();
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&if v6 { 0x86ddu16 } else { 0x0800 }.to_be_bytes());
        let (src, dst): (Vec<u8>, Vec<u8>) = if v6 {
            (
                std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)
                    .octets()
                    .to_vec(),
                std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2)
                    .octets()
                    .to_vec(),
            )
        } else {
            (vec![198, 18, 0, 1], vec![198, 19, 0, 2])
        };
        let proto = if udp { 17 } else { 6 };
        if v6 {
            let mut h = vec![0x60, 0, 0, 0];
            h.extend((l4_len as u16).to_be_bytes());
            h.extend([proto, 64]);
            h.extend(&src);
            h.extend(&dst);
            f.extend(h);
        } else {
            let mut h = vec![0x45, 0];
            h.extend(((20 + l4_len) as u16).to_be_bytes());
            h.extend([0, 0, 0x40, 0, 64, proto, 0, 0]);
            h.extend(&src);
            h.extend(&dst);
            let c = checksum::checksum(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            f.extend(h);
        }
        let mut l4 = vec![0x30, 0x39, 0x00, 0x50];
        if udp {
            l4.extend((l4_len as u16).to_be_bytes());
            l4.extend([0, 0]);
        } else {
            l4.extend([0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        }
        l4.extend(payload);
        let sum_at = if udp { 6 } else { 16 };
        let c = transport_sum(&src, &dst, proto, &l4);
        l4[sum_at..sum_at + 2].copy_from_slice(&c.to_be_bytes());
        f.extend(l4);
        f
    }

    fn transport_sum(src: &[u8], dst: &[u8], proto: u8, l4: &[u8]) -> u16 {
        let mut sum = checksum::accumulate(0, src);
        sum = checksum::accumulate(sum, dst);
        sum += l4.len() as u32 + u32::from(proto);
        checksum::finish(checksum::accumulate(sum, l4))
    }

    /// Whether the frame's checksums verify, computed from scratch.
    fn valid(f: &[u8]) -> bool {
        let p = crate::parse(f, 0, &FlowHasher::with_seed(1)).unwrap();
        let (l3, l4) = (usize::from(p.l3_offset), usize::from(p.l4_offset));
        let v6 = p.flags.has(ParseFlags::IPV6);
        let (src, dst) = if v6 {
            (&f[l3 + 8..l3 + 24], &f[l3 + 24..l3 + 40])
        } else {
            if checksum::checksum(&f[l3..l3 + 20]) != 0 {
                return false;
            }
            (&f[l3 + 12..l3 + 16], &f[l3 + 16..l3 + 20])
        };
        let mut sum = checksum::accumulate(0, src);
        sum = checksum::accumulate(sum, dst);
        sum += (f.len() - l4) as u32 + u32::from(p.key.proto);
        checksum::finish(checksum::accumulate(sum, &f[l4..])) == 0
    }

    fn parsed(f: &[u8]) -> Parsed {
        crate::parse(f, 0, &FlowHasher::with_seed(1)).unwrap()
    }

    #[test]
    fn address_port_and_ttl_edits_keep_every_checksum_valid() {
        for (v6, udp) in [(false, false), (false, true), (true, false), (true, true)] {
            let mut f = frame(v6, udp);
            assert!(valid(&f), "the hand-built frame is valid ({v6}, {udp})");
            let p = parsed(&f);
            let addr: Vec<u8> = if v6 {
                vec![0x20; 16]
            } else {
                vec![198, 19, 7, 7]
            };
            set_ip_addr(&mut f, &p, Side::Dst, &addr).unwrap();
            set_ip_addr(&mut f, &p, Side::Src, &addr).unwrap();
            set_port(&mut f, &p, Side::Src, 40_000).unwrap();
            set_port(&mut f, &p, Side::Dst, 443).unwrap();
            dec_ttl(&mut f, &p).unwrap();
            assert!(valid(&f), "checksums after the edits ({v6}, {udp})");
            let q = parsed(&f);
            assert_eq!((q.key.src_port, q.key.dst_port, q.ttl), (40_000, 443, 63));
            assert_eq!(&q.key.dst[..addr.len()], &addr[..]);
            let wrong = if v6 { vec![1u8; 4] } else { vec![1u8; 16] };
            assert_eq!(
                set_ip_addr(&mut f, &p, Side::Dst, &wrong),
                Err(EditError::WrongFamily)
            );
        }
    }

    /// An ICMPv4 message of `icmp_type` (identifier 42, sequence 1, 8 bytes of data) from
    /// 198.18.0.1 to `dst`, its checksums right.
    fn icmp_frame(icmp_type: u8, dst: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let mut ip = vec![0x45, 0, 0, 36, 0, 0, 0x40, 0, 64, 1, 0, 0, 198, 18, 0, 1];
        ip.extend(dst);
        let c = checksum::checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend(ip);
        let mut icmp = vec![icmp_type, 0, 0, 0, 0x00, 0x2a, 0, 1];
        icmp.extend(b"pingping");
        let c = checksum::checksum(&icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        f.extend(icmp);
        f
    }

    #[test]
    fn echo_identifiers_are_rewritten_with_a_valid_checksum_and_others_refused() {
        for (icmp_type, id) in [(8u8, 0x1234u16), (0, 0xffff), (3, 7)] {
            let mut f = icmp_frame(icmp_type, [198, 18, 0, 2]);
            let p = parsed(&f);
            if icmp_type == 3 {
                assert_eq!(set_echo_id(&mut f, &p, id), Err(EditError::NotEcho));
                continue;
            }
            set_echo_id(&mut f, &p, id).unwrap();
            assert_eq!(
                checksum::checksum(&f[34..]),
                0,
                "ICMP checksum after the edit"
            );
            assert_eq!(parsed(&f).key.src_port, id);
        }
        let mut tcp = frame(false, false);
        let p = parsed(&tcp);
        assert_eq!(set_echo_id(&mut tcp, &p, 1), Err(EditError::NotEcho));
    }

    /// An ICMPv4 error (type 3 code 4) from 198.19.0.9 about `original`, quoting
    /// `quote` bytes of it past its IP header, every checksum right.
    fn icmp_error(original: &[u8], quote: usize) -> Vec<u8> {
        let quoted = &original[14..(34 + quote).min(original.len())];
        let mut f = original[..14].to_vec();
        let mut ip = vec![0x45, 0];
        ip.extend(((20 + 8 + quoted.len()) as u16).to_be_bytes());
        ip.extend([0, 0, 0, 0, 64, 1, 0, 0, 198, 19, 0, 9]);
        ip.extend(&original[26..30]);
        let c = checksum::checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend(ip);
        let mut icmp = vec![3, 4, 0, 0, 0, 0, 0x05, 0x00];
        icmp.extend(quoted);
        let c = checksum::checksum(&icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        f.extend(icmp);
        f
    }

    /// A NAT's rewrite of an error's quote leaves the quote as the quoted packet would be
    /// after the same rewrite (so the quoted IP checksum, and the transport checksum when
    /// the quote holds it, are right; a UDP checksum of zero stays zero), and the error's
    /// own checksum right, whether the quote is whole or 8 bytes.
    #[test]
    fn a_quoted_endpoint_is_rewritten_under_every_checksum_that_covers_it() {
        let mut zero_udp = frame(false, true);
        zero_udp[40..42].copy_from_slice(&[0, 0]);
        let echo = icmp_frame(8, [198, 19, 0, 2]);
        let originals = [frame(false, false), frame(false, true), zero_udp, echo];
        let (a, b) = ([198, 18, 7, 1], [198, 18, 7, 2]);
        for (i, original) in originals.iter().enumerate() {
            // The quoted packet as the same rewrite leaves it.
            let mut expected = original.clone();
            let p = parsed(&expected);
            // An echo has one identifier, which either side's rewrite sets.
            let dst_port = if p.key.proto == 1 { 4000 } else { 4001 };
            set_ip_addr(&mut expected, &p, Side::Src, &a).unwrap();
            set_ip_addr(&mut expected, &p, Side::Dst, &b).unwrap();
            if p.key.proto == 1 {
                set_echo_id(&mut expected, &p, 4000).unwrap();
            } else {
                set_port(&mut expected, &p, Side::Src, 4000).unwrap();
                set_port(&mut expected, &p, Side::Dst, dst_port).unwrap();
            }
            for quote in [8, 1000] {
                let mut error = icmp_error(original, quote);
                // A trailer past the IP packet, which no edit touches.
                error.extend([0xab; 24]);
                let p = parsed(&error);
                set_quoted_endpoint(&mut error, &p, Side::Src, a, 4000).unwrap();
                set_quoted_endpoint(&mut error, &p, Side::Dst, b, dst_port).unwrap();
                let case = format!("case {i}, quote {quote}");
                let (error, trailer) = error.split_at(error.len() - 24);
                assert_eq!(trailer, [0xab; 24], "{case}");
                assert_eq!(error[42..], expected[14..error.len() - 28], "{case}");
                assert_eq!(checksum::checksum(&error[34..]), 0, "{case}: the error's");
            }
        }
        // Refused, changing nothing: no error, a quote short of 8 bytes, a quote of GRE.
        let refused = |mut f: Vec<u8>| {
            let (before, p) = (f.clone(), parsed(&f));
            let r = set_quoted_endpoint(&mut f, &p, Side::Src, a, 1);
            assert_eq!(f, before);
            r
        };
        assert_eq!(refused(frame(false, false)), Err(EditError::NoQuote));
        assert_eq!(
            refused(icmp_error(&frame(false, true), 7)),
            Err(EditError::NoQuote)
        );
        let mut gre = frame(false, true);
        gre[23] = 47;
        assert_eq!(refused(icmp_error(&gre, 8)), Err(EditError::NoQuote));
    }

    #[test]
    fn ttl_one_is_refused_unchanged_and_short_frames_are_refused() {
        let mut f = frame(false, false);
        let l3 = 14;
        f[l3 + 8] = 1;
        let p = parsed(&f);
        let before = f.clone();
        assert_eq!(dec_ttl(&mut f, &p), Err(EditError::TtlExpired));
        assert_eq!(f, before);
        let mut short = f[..30].to_vec();
        assert_eq!(
            set_port(&mut short, &p, Side::Dst, 1),
            Err(EditError::Truncated)
        );
        assert_eq!(set_vlan_id(&mut [0u8; 10], 5), Err(EditError::Truncated));
    }

    #[test]
    fn a_tag_pushed_then_popped_gives_the_frame_back() {
        let original = frame(false, true);
        let mut room = vec![0u8; 4];
        room.extend(&original);
        insert_vlan_tag(&mut room, 42).unwrap();
        let p = parsed(&room);
        assert_eq!((p.key.vlan, p.ethertype), (42, 0x0800));
        assert!(valid(&room));
        set_vlan_id(&mut room, 7).unwrap();
        assert_eq!(parsed(&room).key.vlan, 7);
        remove_vlan_tag(&mut room).unwrap();
        assert_eq!(&room[4..], &original[..]);
    }
}
