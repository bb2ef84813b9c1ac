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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
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
