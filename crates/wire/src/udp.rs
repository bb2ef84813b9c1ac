//! UDP datagrams (RFC 768).

use crate::checksum;
use crate::field::{be16, set_be16};
use crate::{Error, Result, need};

pub const HEADER_LEN: usize = 8;

/// A view of a UDP datagram. After `check_len` the [`Self::datagram_len`] bytes of the
/// datagram are inside the buffer.
#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if self.datagram_len() < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if len < self.datagram_len() {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    pub fn src_port(&self) -> u16 {
        be16(self.buffer.as_ref(), 0)
    }
    pub fn dst_port(&self) -> u16 {
        be16(self.buffer.as_ref(), 2)
    }
    /// The length field: header plus payload.
    pub fn len(&self) -> u16 {
        be16(self.buffer.as_ref(), 4)
    }
    /// The datagram's length: the length field, or where that is 0 and the buffer holds
    /// more than 64 KiB (a jumbogram, RFC 2675; a tunnel's BIG TCP segment), the buffer's.
    pub fn datagram_len(&self) -> usize {
        let buffered = self.buffer.as_ref().len();
        match self.len() {
            0 if buffered > usize::from(u16::MAX) => buffered,
            len => usize::from(len),
        }
    }
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) <= HEADER_LEN
    }
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), 6)
    }
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.datagram_len()]
    }
    /// Whether the checksum holds; a zero checksum (none sent, IPv4 only) passes.
    pub fn verify_checksum(&self, pseudo: u32) -> bool {
        self.checksum() == 0
            || checksum::finish(checksum::accumulate(
                pseudo,
                &self.buffer.as_ref()[..self.datagram_len()],
            )) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    pub fn set_src_port(&mut self, p: u16) {
        set_be16(self.buffer.as_mut(), 0, p);
    }
    pub fn set_dst_port(&mut self, p: u16) {
        set_be16(self.buffer.as_mut(), 2, p);
    }
    pub fn set_checksum(&mut self, c: u16) {
        set_be16(self.buffer.as_mut(), 6, c);
    }
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
    /// Computes the checksum over the datagram and the pseudo-header (0 is sent as 0xffff).
    pub fn fill_checksum(&mut self, pseudo: u32) {
        self.set_checksum(0);
        let end = usize::from(self.len());
        let c = checksum::finish(checksum::accumulate(pseudo, &self.buffer.as_ref()[..end]));
        self.set_checksum(if c == 0 { 0xffff } else { c });
    }
}

/// An owned UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    pub src_port: u16,
    pub dst_port: u16,
    pub payload_len: u16,
}

impl UdpRepr {
    pub fn parse<T: AsRef<[u8]>>(p: &UdpPacket<T>) -> Result<Self> {
        p.check_len()?;
        Ok(UdpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            payload_len: p.len() - HEADER_LEN as u16,
        })
    }

    pub fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header with a zero checksum; fill it once the payload is in place.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        need(buf, HEADER_LEN)?;
        let len = self
            .payload_len
            .checked_add(HEADER_LEN as u16)
            .ok_or(Error::Malformed)?;
        set_be16(buf, 0, self.src_port);
        set_be16(buf, 2, self.dst_port);
        set_be16(buf, 4, len);
        set_be16(buf, 6, 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(sp in any::<u16>(), dp in any::<u16>(), payload_len in 0u16..1500) {
            let repr = UdpRepr { src_port: sp, dst_port: dp, payload_len };
            let mut buf = vec![0u8; HEADER_LEN + usize::from(payload_len)];
            repr.emit(&mut buf).unwrap();
            prop_assert_eq!(UdpRepr::parse(&UdpPacket::new_checked(&buf[..]).unwrap()).unwrap(), repr);
            for cut in 0..buf.len() {
                prop_assert!(UdpRepr::parse(&UdpPacket::new_unchecked(&buf[..cut])).is_err());
            }
        }
    }

    #[test]
    fn short_length_field_is_malformed() {
        let buf = [0, 1, 0, 2, 0, 7, 0, 0];
        assert_eq!(
            UdpPacket::new_checked(&buf[..]).err(),
            Some(Error::Malformed)
        );
    }
}
