//! ICMP (RFC 792) and ICMPv6 (RFC 4443): both start with type, code, checksum and four
//! bytes whose meaning depends on the type, so one view serves both.

use crate::checksum;
use crate::field::{array, be16, set_be16};
use crate::{Error, Result, need};

pub const HEADER_LEN: usize = 8;

/// Types whose rest-of-header holds an identifier and a sequence number.
pub mod types {
    pub const V4_ECHO_REPLY: u8 = 0;
    pub const V4_DEST_UNREACHABLE: u8 = 3;
    pub const V4_ECHO_REQUEST: u8 = 8;
    pub const V4_TIME_EXCEEDED: u8 = 11;
    pub const V6_DEST_UNREACHABLE: u8 = 1;
    pub const V6_ECHO_REQUEST: u8 = 128;
    pub const V6_ECHO_REPLY: u8 = 129;
    pub const V6_NEIGHBOR_SOLICIT: u8 = 135;

    /// Whether `icmp_type` (of ICMPv4 if `v6` is false) is an echo request or reply.
    pub fn is_echo(v6: bool, icmp_type: u8) -> bool {
        if v6 {
            matches!(icmp_type, V6_ECHO_REQUEST | V6_ECHO_REPLY)
        } else {
            matches!(icmp_type, V4_ECHO_REQUEST | V4_ECHO_REPLY)
        }
    }
}

/// A view of an ICMP or ICMPv6 message.
#[derive(Debug, Clone)]
pub struct IcmpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> IcmpPacket<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        IcmpPacket { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn icmp_type(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    pub fn code(&self) -> u8 {
        self.buffer.as_ref()[1]
    }
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), 2)
    }
    /// Echo identifier (meaningful for echo request/reply only).
    pub fn echo_ident(&self) -> u16 {
        be16(self.buffer.as_ref(), 4)
    }
    /// Echo sequence number (meaningful for echo request/reply only).
    pub fn echo_seq(&self) -> u16 {
        be16(self.buffer.as_ref(), 6)
    }
    pub fn rest_of_header(&self) -> [u8; 4] {
        array(self.buffer.as_ref(), 4)
    }
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
    /// Checks the checksum; `pseudo` is 0 for ICMPv4 and the pseudo-header sum for ICMPv6.
    pub fn verify_checksum(&self, pseudo: u32) -> bool {
        checksum::finish(checksum::accumulate(pseudo, self.buffer.as_ref())) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IcmpPacket<T> {
    pub fn set_echo_ident(&mut self, id: u16) {
        set_be16(self.buffer.as_mut(), 4, id);
    }
    pub fn set_checksum(&mut self, c: u16) {
        set_be16(self.buffer.as_mut(), 2, c);
    }
    /// Fills the checksum over the whole message; `pseudo` as in `verify_checksum`.
    pub fn fill_checksum(&mut self, pseudo: u32) {
        self.set_checksum(0);
        let c = checksum::finish(checksum::accumulate(pseudo, self.buffer.as_ref()));
        self.set_checksum(c);
    }
}

/// An owned ICMP/ICMPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcmpRepr {
    pub icmp_type: u8,
    pub code: u8,
    pub rest_of_header: [u8; 4],
}

impl IcmpRepr {
    /// An echo request or reply header.
    pub fn echo(icmp_type: u8, ident: u16, seq: u16) -> Self {
        let mut rest = [0u8; 4];
        rest[..2].copy_from_slice(&ident.to_be_bytes());
        rest[2..].copy_from_slice(&seq.to_be_bytes());
        IcmpRepr {
            icmp_type,
            code: 0,
            rest_of_header: rest,
        }
    }

    pub fn parse<T: AsRef<[u8]>>(p: &IcmpPacket<T>) -> Result<Self> {
        p.check_len()?;
        Ok(IcmpRepr {
            icmp_type: p.icmp_type(),
            code: p.code(),
            rest_of_header: p.rest_of_header(),
        })
    }

    pub fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header with a zero checksum; fill it once the payload is in place.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        need(buf, HEADER_LEN)?;
        buf[0] = self.icmp_type;
        buf[1] = self.code;
        set_be16(buf, 2, 0);
        buf[4..8].copy_from_slice(&self.rest_of_header);
        Ok(())
    }
}

/// Whether `icmp_type` (of ICMPv6 if `v6`) is an error, which quotes the packet it is
/// about: destination unreachable, time exceeded, parameter problem; ICMPv6 also packet
/// too big.
pub fn is_error(v6: bool, icmp_type: u8) -> bool {
    if v6 {
        (types::V6_DEST_UNREACHABLE..=4).contains(&icmp_type)
    } else {
        matches!(
            icmp_type,
            types::V4_DEST_UNREACHABLE | types::V4_TIME_EXCEEDED | 12
        )
    }
}

/// Whether flow key `key` is an ICMP or ICMPv6 error's (the parser keeps the type in the
/// high byte of `dst_port`).
pub fn is_error_key(key: &crate::FlowKey) -> bool {
    let v6 = match (key.proto, key.ip_version) {
        (1, 4) => false,
        (58, 6) => true,
        _ => return false,
    };
    is_error(v6, (key.dst_port >> 8) as u8)
}

/// The packet the ICMP error `error` (parsed from `frame`) quotes, as [`quoted`] reads
/// it, its key on the error's VLAN: the connection a switch matches it against.
pub fn quoted_by(frame: &[u8], error: &crate::parse::Parsed) -> Result<Quoted> {
    let quote = frame
        .get(usize::from(error.payload_offset)..)
        .unwrap_or_default();
    let mut q = quoted(quote, error.key.ip_version == 6)?;
    q.key.vlan = error.key.vlan;
    Ok(q)
}

/// The packet an ICMP error quotes: its flow key as it was sent, and where in the error's
/// payload its transport header starts (its IP header starts the payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quoted {
    pub key: crate::FlowKey,
    pub l4_at: usize,
}

/// Reads the packet quoted in `payload`, an ICMP error's payload (after its 8-byte
/// header): an IP header of the error's own family and the first 8 bytes of what it
/// carried (RFC 792 and 4443 quote at least that). The key has ports for TCP and UDP, and
/// an echo's identifier and type as the parser gives them; other protocols' ports are 0.
/// A quote too short, of the other family, of a fragment past the first or behind IPv6
/// extension headers is refused: no connection could be told from it.
pub fn quoted(payload: &[u8], v6: bool) -> Result<Quoted> {
    use crate::ipv4::protocol;
    let first = *payload.first().ok_or(Error::Truncated)?;
    let at_least = |n: usize| match payload.len() >= n {
        true => Ok(()),
        false => Err(Error::Truncated),
    };
    let (mut key, l4_at) = if v6 {
        at_least(40 + 8)?;
        if first >> 4 != 6 {
            return Err(Error::Malformed);
        }
        let (src, dst): ([u8; 16], [u8; 16]) = (array(payload, 8), array(payload, 24));
        let key = crate::FlowKey::v6(src.into(), dst.into(), payload[6], 0, 0);
        (key, 40)
    } else {
        let ihl = usize::from(first & 0x0f) * 4;
        if first >> 4 != 4 || ihl < 20 {
            return Err(Error::Malformed);
        }
        at_least(ihl + 8)?;
        if be16(payload, 6) & 0x1fff != 0 {
            return Err(Error::Malformed);
        }
        let (src, dst): ([u8; 4], [u8; 4]) = (array(payload, 12), array(payload, 16));
        (
            crate::FlowKey::v4(src.into(), dst.into(), payload[9], 0, 0),
            ihl,
        )
    };
    let l4 = &payload[l4_at..];
    match key.proto {
        protocol::TCP | protocol::UDP => {
            key.src_port = be16(l4, 0);
            key.dst_port = be16(l4, 2);
        }
        protocol::ICMP | protocol::ICMPV6 if (key.proto == protocol::ICMPV6) == v6 => {
            let t = l4[0];
            if types::is_echo(v6, t) {
                key.src_port = be16(l4, 4);
            }
            key.dst_port = u16::from(t) << 8 | u16::from(l4[1]);
        }
        protocol::HOP_BY_HOP | protocol::ROUTING | protocol::FRAGMENT | protocol::DEST_OPTS
            if v6 =>
        {
            return Err(Error::Malformed);
        }
        _ => {}
    }
    Ok(Quoted { key, l4_at })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An IPv4 header of `proto` from 198.18.0.1 to 198.19.0.2 (fragment offset
    /// `frag`), then `l4`.
    fn ipv4(proto: u8, frag: u16, l4: &[u8]) -> Vec<u8> {
        let mut b = vec![0x45, 0, 0, 0, 0, 0];
        b.extend_from_slice(&frag.to_be_bytes());
        b.extend_from_slice(&[64, proto, 0, 0, 198, 18, 0, 1, 198, 19, 0, 2]);
        b.extend_from_slice(l4);
        b
    }

    #[test]
    fn a_quoted_packet_gives_its_key_as_it_was_sent() {
        let ports = [0x04, 0x00, 0x00, 0x50, 1, 2, 3, 4]; // 1024 -> 80, a sequence number
        let q = quoted(&ipv4(6, 0x4000, &ports), false).unwrap();
        let want = crate::FlowKey::v4([198, 18, 0, 1].into(), [198, 19, 0, 2].into(), 6, 1024, 80);
        assert_eq!((q.key, q.l4_at), (want, 20));
        // An echo request: its identifier and type, as the parser keys it.
        let echo = [types::V4_ECHO_REQUEST, 0, 0, 0, 0x12, 0x34, 0, 1];
        let q = quoted(&ipv4(1, 0, &echo), false).unwrap();
        assert_eq!((q.key.src_port, q.key.dst_port), (0x1234, 0x0800));
        // IPv6, UDP.
        let mut v6 = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        v6.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8].repeat(8));
        v6.extend_from_slice(&[0, 53, 0x13, 0x89, 0, 8, 0, 0]);
        let q = quoted(&v6, true).unwrap();
        assert_eq!(
            (
                q.key.ip_version,
                q.key.proto,
                q.key.src_port,
                q.key.dst_port
            ),
            (6, 17, 53, 5001)
        );
        assert_eq!(q.l4_at, 40);
        // Refused: short of 8 bytes of transport, the other family, a later fragment,
        // an IPv6 extension header, a bad header length.
        assert_eq!(
            quoted(&ipv4(6, 0, &ports[..7]), false),
            Err(Error::Truncated)
        );
        assert_eq!(quoted(&ipv4(6, 0, &ports), true), Err(Error::Truncated));
        assert_eq!(quoted(&v6, false), Err(Error::Malformed));
        assert_eq!(
            quoted(&ipv4(6, 0x0010, &ports), false),
            Err(Error::Malformed)
        );
        v6[6] = 44;
        assert_eq!(quoted(&v6, true), Err(Error::Malformed));
        let mut short_ihl = ipv4(6, 0, &ports);
        short_ihl[0] = 0x44;
        assert_eq!(quoted(&short_ihl, false), Err(Error::Malformed));
        assert_eq!(quoted(&[], false), Err(Error::Truncated));
    }

    proptest! {
        /// Any bytes are a quote or an error, never a panic.
        #[test]
        fn any_quote_is_read_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..80), v6 in any::<bool>()) {
            if let Ok(q) = quoted(&bytes, v6) {
                prop_assert!(q.l4_at + 8 <= bytes.len());
            }
        }

        #[test]
        fn round_trip(t in any::<u8>(), c in any::<u8>(), rest in any::<[u8; 4]>()) {
            let repr = IcmpRepr { icmp_type: t, code: c, rest_of_header: rest };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut buf).unwrap();
            prop_assert_eq!(IcmpRepr::parse(&IcmpPacket::new_checked(&buf[..]).unwrap()).unwrap(), repr);
            for cut in 0..HEADER_LEN {
                prop_assert!(IcmpRepr::parse(&IcmpPacket::new_unchecked(&buf[..cut])).is_err());
            }
        }
    }

    #[test]
    fn echo_fields_and_checksum() {
        let mut buf = [0u8; HEADER_LEN + 4];
        IcmpRepr::echo(types::V4_ECHO_REQUEST, 0x1234, 7)
            .emit(&mut buf)
            .unwrap();
        let mut p = IcmpPacket::new_checked(&mut buf[..]).unwrap();
        p.fill_checksum(0);
        assert!(p.verify_checksum(0));
        assert_eq!((p.echo_ident(), p.echo_seq()), (0x1234, 7));
        assert!(types::is_echo(false, p.icmp_type()));
    }
}
