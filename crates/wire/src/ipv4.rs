//! IPv4 (RFC 791), options carried opaquely, fragments flagged.

use crate::checksum;
use crate::field::{array, be16, set_be16};
use crate::{Error, Result, need};
use std::net::Ipv4Addr;

pub const MIN_HEADER_LEN: usize = 20;
pub const MAX_OPTIONS_LEN: usize = 40;

/// IP protocol numbers Stateplane understands (shared with IPv6 next headers).
pub mod protocol {
    pub const HOP_BY_HOP: u8 = 0;
    pub const ICMP: u8 = 1;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const ROUTING: u8 = 43;
    pub const FRAGMENT: u8 = 44;
    pub const ESP: u8 = 50;
    pub const AH: u8 = 51;
    pub const ICMPV6: u8 = 58;
    pub const NO_NEXT: u8 = 59;
    pub const DEST_OPTS: u8 = 60;
    pub const MOBILITY: u8 = 135;
}

mod layout {
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const TOTAL_LEN: usize = 2;
    pub const IDENT: usize = 4;
    pub const FLAGS_FRAG: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
}

/// A view of an IPv4 packet. After `check_len`, the header and the [`Self::packet_len`]
/// bytes of the packet are inside the buffer; bytes past them (Ethernet padding) are
/// ignored.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < MIN_HEADER_LEN {
            return Err(Error::Truncated);
        }
        let header_len = self.header_len();
        let total_len = self.packet_len();
        if self.version() != 4 || header_len < MIN_HEADER_LEN || total_len < header_len {
            return Err(Error::Malformed);
        }
        if len < header_len || len < total_len {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[layout::VER_IHL] >> 4
    }
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[layout::VER_IHL] & 0x0f) * 4
    }
    /// The whole TOS byte: DSCP in the upper six bits, ECN in the lower two.
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[layout::TOS]
    }
    pub fn total_len(&self) -> u16 {
        be16(self.buffer.as_ref(), layout::TOTAL_LEN)
    }
    /// Whether the total length is 0 and the buffer holds more than 64 KiB: a segment too
    /// large for the field (Linux BIG TCP and GRO write 0 there), which runs to the
    /// buffer's end.
    pub fn length_from_buffer(&self) -> bool {
        self.total_len() == 0 && self.buffer.as_ref().len() > usize::from(u16::MAX)
    }
    /// The packet's length: its total length, or the buffer's where
    /// [`Self::length_from_buffer`].
    pub fn packet_len(&self) -> usize {
        match self.length_from_buffer() {
            true => self.buffer.as_ref().len(),
            false => usize::from(self.total_len()),
        }
    }
    pub fn ident(&self) -> u16 {
        be16(self.buffer.as_ref(), layout::IDENT)
    }
    pub fn dont_frag(&self) -> bool {
        self.buffer.as_ref()[layout::FLAGS_FRAG] & 0x40 != 0
    }
    pub fn more_frags(&self) -> bool {
        self.buffer.as_ref()[layout::FLAGS_FRAG] & 0x20 != 0
    }
    /// The fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (be16(self.buffer.as_ref(), layout::FLAGS_FRAG) & 0x1fff) << 3
    }
    /// Whether this packet is a fragment (first or later) of a larger datagram.
    pub fn is_fragment(&self) -> bool {
        self.more_frags() || self.frag_offset() != 0
    }
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[layout::TTL]
    }
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[layout::PROTOCOL]
    }
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), layout::CHECKSUM)
    }
    pub fn src(&self) -> Ipv4Addr {
        Ipv4Addr::from(array::<4>(self.buffer.as_ref(), layout::SRC))
    }
    pub fn dst(&self) -> Ipv4Addr {
        Ipv4Addr::from(array::<4>(self.buffer.as_ref(), layout::DST))
    }
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[MIN_HEADER_LEN..self.header_len()]
    }
    pub fn verify_checksum(&self) -> bool {
        checksum::checksum(&self.buffer.as_ref()[..self.header_len()]) == 0
    }
    /// The payload, up to `total_len` (Ethernet padding excluded).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..usize::from(self.total_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    pub fn set_src(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[layout::SRC..layout::SRC + 4].copy_from_slice(&a.octets());
    }
    pub fn set_dst(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[layout::DST..layout::DST + 4].copy_from_slice(&a.octets());
    }
    pub fn set_ttl(&mut self, ttl: u8) {
        self.buffer.as_mut()[layout::TTL] = ttl;
    }
    pub fn set_checksum(&mut self, c: u16) {
        set_be16(self.buffer.as_mut(), layout::CHECKSUM, c);
    }
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(&self.buffer.as_ref()[..self.header_len()]);
        self.set_checksum(c);
    }
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (start, end) = (self.header_len(), usize::from(self.total_len()));
        &mut self.buffer.as_mut()[start..end]
    }
}

/// IPv4 options, kept as opaque bytes (at most 40, a multiple of 4 once padded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Options {
    bytes: [u8; MAX_OPTIONS_LEN],
    len: u8,
}

impl Default for Ipv4Options {
    fn default() -> Self {
        Ipv4Options {
            bytes: [0; MAX_OPTIONS_LEN],
            len: 0,
        }
    }
}

impl Ipv4Options {
    /// Options from raw bytes, zero-padded to a multiple of 4. `Malformed` past 40 bytes.
    pub fn new(raw: &[u8]) -> Result<Self> {
        if raw.len() > MAX_OPTIONS_LEN {
            return Err(Error::Malformed);
        }
        let mut bytes = [0u8; MAX_OPTIONS_LEN];
        bytes[..raw.len()].copy_from_slice(raw);
        Ok(Ipv4Options {
            bytes,
            len: raw.len().next_multiple_of(4) as u8,
        })
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// An owned IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: u8,
    pub ttl: u8,
    pub tos: u8,
    pub ident: u16,
    pub dont_frag: bool,
    pub more_frags: bool,
    /// In bytes; a multiple of 8.
    pub frag_offset: u16,
    pub options: Ipv4Options,
    pub payload_len: u16,
}

impl Ipv4Repr {
    /// Parses and validates the header, its checksum included.
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv4Packet<T>) -> Result<Self> {
        p.check_len()?;
        if !p.verify_checksum() {
            return Err(Error::Malformed);
        }
        Ok(Ipv4Repr {
            src: p.src(),
            dst: p.dst(),
            protocol: p.protocol(),
            ttl: p.ttl(),
            tos: p.tos(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            more_frags: p.more_frags(),
            frag_offset: p.frag_offset(),
            options: Ipv4Options::new(p.options())?,
            payload_len: p.total_len() - p.header_len() as u16,
        })
    }

    pub fn header_len(&self) -> usize {
        MIN_HEADER_LEN + self.options.as_bytes().len()
    }

    pub fn total_len(&self) -> usize {
        self.header_len() + usize::from(self.payload_len)
    }

    /// Writes the header, checksum filled, at the start of `buf`; the payload is the caller's.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let header_len = self.header_len();
        need(buf, header_len)?;
        let total_len = u16::try_from(self.total_len()).map_err(|_| Error::Malformed)?;
        buf[layout::VER_IHL] = 0x40 | (header_len / 4) as u8;
        buf[layout::TOS] = self.tos;
        set_be16(buf, layout::TOTAL_LEN, total_len);
        set_be16(buf, layout::IDENT, self.ident);
        let flags = (u16::from(self.dont_frag) << 14) | (u16::from(self.more_frags) << 13);
        set_be16(
            buf,
            layout::FLAGS_FRAG,
            flags | ((self.frag_offset >> 3) & 0x1fff),
        );
        buf[layout::TTL] = self.ttl;
        buf[layout::PROTOCOL] = self.protocol;
        set_be16(buf, layout::CHECKSUM, 0);
        buf[layout::SRC..layout::SRC + 4].copy_from_slice(&self.src.octets());
        buf[layout::DST..layout::DST + 4].copy_from_slice(&self.dst.octets());
        buf[MIN_HEADER_LEN..header_len].copy_from_slice(self.options.as_bytes());
        let c = checksum::checksum(&buf[..header_len]);
        set_be16(buf, layout::CHECKSUM, c);
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    prop_compose! {
        pub fn arb_repr()(src in any::<u32>(), dst in any::<u32>(), protocol in any::<u8>(), ttl in any::<u8>(),
                          tos in any::<u8>(), ident in any::<u16>(), dont_frag in any::<bool>(), more_frags in any::<bool>(),
                          frag in 0u16..8192, opt_words in proptest::collection::vec(any::<[u8; 4]>(), 0..=10),
                          payload_len in 0u16..1400) -> Ipv4Repr {
            let raw: Vec<u8> = opt_words.concat();
            Ipv4Repr { src: src.into(), dst: dst.into(), protocol, ttl, tos, ident, dont_frag, more_frags,
                       frag_offset: frag << 3, options: Ipv4Options::new(&raw).unwrap(), payload_len }
        }
    }

    proptest! {
        #[test]
        fn round_trip(repr in arb_repr()) {
            let mut buf = vec![0u8; repr.total_len()];
            repr.emit(&mut buf).unwrap();
            let view = Ipv4Packet::new_checked(&buf[..]).unwrap();
            prop_assert_eq!(Ipv4Repr::parse(&view).unwrap(), repr);
            prop_assert_eq!(view.payload().len(), usize::from(repr.payload_len));
            for cut in 0..buf.len() {
                prop_assert!(Ipv4Repr::parse(&Ipv4Packet::new_unchecked(&buf[..cut])).is_err());
            }
        }
    }

    #[test]
    fn bad_fields_are_malformed() {
        let repr = Ipv4Repr {
            src: Ipv4Addr::new(198, 18, 0, 1),
            dst: Ipv4Addr::new(198, 18, 0, 2),
            protocol: 17,
            ttl: 64,
            tos: 0,
            ident: 1,
            dont_frag: false,
            more_frags: false,
            frag_offset: 0,
            options: Ipv4Options::default(),
            payload_len: 8,
        };
        let mut buf = vec![0u8; repr.total_len()];
        repr.emit(&mut buf).unwrap();
        let mut bad_version = buf.clone();
        bad_version[0] = 0x65;
        assert_eq!(
            Ipv4Packet::new_checked(&bad_version[..]).err(),
            Some(Error::Malformed)
        );
        let mut bad_ihl = buf.clone();
        bad_ihl[0] = 0x44;
        assert_eq!(
            Ipv4Packet::new_checked(&bad_ihl[..]).err(),
            Some(Error::Malformed)
        );
        let mut bad_sum = buf.clone();
        bad_sum[8] ^= 1;
        assert_eq!(
            Ipv4Repr::parse(&Ipv4Packet::new_checked(&bad_sum[..]).unwrap()),
            Err(Error::Malformed)
        );
        // Ethernet padding after total_len is not part of the payload.
        buf.extend_from_slice(&[0; 10]);
        assert_eq!(
            Ipv4Packet::new_checked(&buf[..]).unwrap().payload().len(),
            8
        );
    }
}
