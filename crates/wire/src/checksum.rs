//! The Internet checksum (RFC 1071) and its incremental update (RFC 1624).

use std::net::{Ipv4Addr, Ipv6Addr};

/// Adds `data` to a running ones'-complement sum (not yet folded).
pub fn accumulate(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum = sum.wrapping_add(u32::from(u16::from_be_bytes([c[0], c[1]])));
        // Fold early so that payloads of any length cannot overflow the accumulator.
        sum = (sum & 0xffff) + (sum >> 16);
    }
    if let [last] = chunks.remainder() {
        sum = sum.wrapping_add(u32::from(*last) << 8);
    }
    sum
}

/// Folds a running sum to 16 bits and complements it: the value to store in a header.
pub fn finish(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The checksum of `data` alone (IPv4 header, ICMPv4).
pub fn checksum(data: &[u8]) -> u16 {
    finish(accumulate(0, data))
}

/// Finishes a checksum that a sender's stack left for its device to finish (Linux's
/// CHECKSUM_PARTIAL, which a veth hands on as it is): the field at `field` holds the
/// pseudo-header's sum, and the device sums the bytes from `start` to the end, field
/// included, and stores the complement. A result of 0 is stored as 0xffff, which is the
/// same sum and is never UDP's "no checksum". `false`, and nothing written, if the field
/// does not lie after `start` inside `frame`.
pub fn complete_partial(frame: &mut [u8], start: usize, field: usize) -> bool {
    if start > field || field.checked_add(2).is_none_or(|end| end > frame.len()) {
        return false;
    }
    let sum = match finish(accumulate(0, &frame[start..])) {
        0 => 0xffff,
        sum => sum,
    };
    frame[field..field + 2].copy_from_slice(&sum.to_be_bytes());
    true
}

/// The pseudo-header sum of TCP/UDP over IPv4 (RFC 793).
pub fn pseudo_v4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, len: u16) -> u32 {
    let mut sum = accumulate(0, &src.octets());
    sum = accumulate(sum, &dst.octets());
    sum + u32::from(proto) + u32::from(len)
}

/// The pseudo-header sum of TCP/UDP/ICMPv6 over IPv6 (RFC 8200 section 8.1).
pub fn pseudo_v6(src: Ipv6Addr, dst: Ipv6Addr, proto: u8, len: u32) -> u32 {
    let mut sum = accumulate(0, &src.octets());
    sum = accumulate(sum, &dst.octets());
    sum + (len >> 16) + (len & 0xffff) + u32::from(proto)
}

/// Updates a stored checksum after a 16-bit field changed from `old` to `new` (RFC 1624 eq. 3),
/// without touching the rest of the data: what a NAT does on every translated packet.
pub fn update16(stored: u16, old: u16, new: u16) -> u16 {
    let sum = u32::from(!stored) + u32::from(!old) + u32::from(new);
    finish(sum)
}

/// [`update16`] for a 32-bit field (an IPv4 address).
pub fn update32(stored: u16, old: u32, new: u32) -> u16 {
    let c = update16(stored, (old >> 16) as u16, (new >> 16) as u16);
    update16(c, old as u16, new as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A partial checksum finished is the one computed over the whole segment: a UDP
    /// datagram whose field holds its pseudo-header's sum, as a sender's stack leaves it.
    #[test]
    fn a_partial_checksum_finished_is_the_full_one() {
        let (src, dst) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        let mut segment = vec![0x30, 0x39, 0x00, 0x35, 0x00, 0x0b, 0, 0, 1, 2, 3];
        let pseudo = pseudo_v4(src, dst, 17, segment.len() as u16);
        let full = finish(accumulate(pseudo, &segment));
        // The stack's partial: the pseudo-header's folded sum, not complemented.
        let partial = !finish(pseudo);
        segment[6..8].copy_from_slice(&partial.to_be_bytes());
        let mut frame = [vec![0xee; 34], segment].concat();
        assert!(complete_partial(&mut frame, 34, 40));
        assert_eq!(u16::from_be_bytes([frame[40], frame[41]]), full);
        let last = frame.len() - 1;
        assert!(
            !complete_partial(&mut frame, 34, last),
            "field past the end"
        );
        assert!(
            !complete_partial(&mut frame, 40, 34),
            "field before the start"
        );
        assert!(!complete_partial(&mut frame, 0, usize::MAX), "no overflow");
    }

    #[test]
    fn rfc1071_example() {
        // The example of RFC 1071 section 3: the sum is 0xddf2, so the checksum is !0xddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(checksum(&data), !0xddf2);
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(
            checksum(&[0x12, 0x34, 0x56]),
            checksum(&[0x12, 0x34, 0x56, 0x00])
        );
    }

    #[test]
    fn incremental_update_matches_recompute() {
        let mut data = vec![
            0x45, 0x00, 0x00, 0x54, 0x12, 0x34, 0x40, 0x00, 0x40, 0x01, 0, 0,
        ];
        data.extend_from_slice(&[198, 18, 0, 1, 198, 18, 0, 2]);
        let before = checksum(&data);
        let old = u32::from_be_bytes([198, 18, 0, 1]);
        let new = u32::from_be_bytes([198, 19, 7, 9]);
        data[12..16].copy_from_slice(&new.to_be_bytes());
        assert_eq!(update32(before, old, new), checksum(&data));
    }
}
