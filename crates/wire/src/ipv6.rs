//! IPv6 (RFC 8200): the fixed header, and the walk over extension headers to the transport.

use crate::field::{array, be16, be32, set_be16, set_be32};
use crate::ipv4::protocol;
use crate::{Error, Result, need};
use std::net::Ipv6Addr;

pub const HEADER_LEN: usize = 40;
/// The walk gives up (`Malformed`) after this many extension headers: no legitimate packet
/// carries more, and an unbounded walk is a cost an attacker could choose.
pub const MAX_EXT_HEADERS: usize = 8;

mod layout {
    pub const VER_TC_FLOW: usize = 0;
    pub const PAYLOAD_LEN: usize = 4;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: usize = 8;
    pub const DST: usize = 24;
}

/// A view of an IPv6 packet. After `check_len` the fixed header and the payload it declares
/// are inside the buffer: `payload_len` bytes, or where that is 0 and more than 64 KiB
/// follow the header (a jumbogram, RFC 2675, or a Linux BIG TCP segment), all of them.
#[derive(Debug, Clone)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        Ipv6Packet { buffer }
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
        if self.version() != 6 {
            return Err(Error::Malformed);
        }
        if len < HEADER_LEN + self.payload_len_in_buffer() {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[layout::VER_TC_FLOW] >> 4
    }
    pub fn traffic_class(&self) -> u8 {
        ((be16(self.buffer.as_ref(), layout::VER_TC_FLOW) >> 4) & 0xff) as u8
    }
    pub fn flow_label(&self) -> u32 {
        be32(self.buffer.as_ref(), layout::VER_TC_FLOW) & 0x000f_ffff
    }
    pub fn payload_len(&self) -> u16 {
        be16(self.buffer.as_ref(), layout::PAYLOAD_LEN)
    }
    /// Whether the payload length is 0 and more than 64 KiB follow the header: a jumbogram
    /// or a BIG TCP segment, whose payload runs to the buffer's end (a jumbogram's length
    /// option is not read: the capture says how long it is).
    pub fn length_from_buffer(&self) -> bool {
        let len = self.buffer.as_ref().len();
        self.payload_len() == 0 && len > HEADER_LEN + usize::from(u16::MAX)
    }
    /// The payload's length: `payload_len`, or the buffer's after the header where
    /// [`Self::length_from_buffer`].
    fn payload_len_in_buffer(&self) -> usize {
        match self.length_from_buffer() {
            true => self.buffer.as_ref().len() - HEADER_LEN,
            false => usize::from(self.payload_len()),
        }
    }
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[layout::NEXT_HEADER]
    }
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[layout::HOP_LIMIT]
    }
    pub fn src(&self) -> Ipv6Addr {
        Ipv6Addr::from(array::<16>(self.buffer.as_ref(), layout::SRC))
    }
    pub fn dst(&self) -> Ipv6Addr {
        Ipv6Addr::from(array::<16>(self.buffer.as_ref(), layout::DST))
    }
    /// The payload (extension headers included), up to `payload_len`.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + self.payload_len_in_buffer()]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    pub fn set_src(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[layout::SRC..layout::SRC + 16].copy_from_slice(&a.octets());
    }
    pub fn set_dst(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[layout::DST..layout::DST + 16].copy_from_slice(&a.octets());
    }
    pub fn set_hop_limit(&mut self, h: u8) {
        self.buffer.as_mut()[layout::HOP_LIMIT] = h;
    }
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// An owned fixed IPv6 header. `payload_len` counts extension headers too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Repr {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub next_header: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub payload_len: u16,
}

impl Ipv6Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv6Packet<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Ipv6Repr {
            src: p.src(),
            dst: p.dst(),
            next_header: p.next_header(),
            hop_limit: p.hop_limit(),
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
            payload_len: p.payload_len(),
        })
    }

    pub fn header_len(&self) -> usize {
        HEADER_LEN
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        need(buf, HEADER_LEN)?;
        let word =
            (6u32 << 28) | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0x000f_ffff);
        set_be32(buf, layout::VER_TC_FLOW, word);
        set_be16(buf, layout::PAYLOAD_LEN, self.payload_len);
        buf[layout::NEXT_HEADER] = self.next_header;
        buf[layout::HOP_LIMIT] = self.hop_limit;
        buf[layout::SRC..layout::SRC + 16].copy_from_slice(&self.src.octets());
        buf[layout::DST..layout::DST + 16].copy_from_slice(&self.dst.octets());
        Ok(())
    }
}

/// Where the extension-header walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtWalk {
    /// The upper-layer protocol (TCP, UDP, ICMPv6, ...), or ESP / NO_NEXT where the walk
    /// cannot go further.
    pub protocol: u8,
    /// Offset of the upper-layer header from the start of the IPv6 payload.
    pub offset: usize,
    /// How many extension headers were walked.
    pub count: usize,
    /// Fragment header, if any: (offset in bytes, more fragments).
    pub fragment: Option<(u16, bool)>,
}

/// Whether `nh` is an extension header the walk steps over.
pub fn is_extension(nh: u8) -> bool {
    matches!(
        nh,
        protocol::HOP_BY_HOP
            | protocol::ROUTING
            | protocol::FRAGMENT
            | protocol::DEST_OPTS
            | protocol::AH
            | protocol::MOBILITY
    )
}

/// Walks the extension headers of `payload` (an IPv6 payload) starting from `next_header`.
pub fn walk_extensions(mut next_header: u8, payload: &[u8]) -> Result<ExtWalk> {
    let mut offset = 0;
    let mut count = 0;
    let mut fragment = None;
    while is_extension(next_header) {
        if count == MAX_EXT_HEADERS {
            return Err(Error::Malformed);
        }
        if payload.len() < offset + 8 {
            return Err(Error::Truncated);
        }
        let len = match next_header {
            protocol::FRAGMENT => {
                let word = be16(payload, offset + 2);
                fragment = Some((word & 0xfff8, word & 1 != 0));
                8
            }
            // AH counts its length in 4-byte units, minus 2 (RFC 4302).
            protocol::AH => (usize::from(payload[offset + 1]) + 2) * 4,
            _ => (usize::from(payload[offset + 1]) + 1) * 8,
        };
        if payload.len() < offset + len {
            return Err(Error::Truncated);
        }
        next_header = payload[offset];
        offset += len;
        count += 1;
    }
    Ok(ExtWalk {
        protocol: next_header,
        offset,
        count,
        fragment,
    })
}

/// Emits a generic extension header (hop-by-hop, routing, destination options) holding
/// `data`, which must make the header a multiple of 8 bytes: `data.len() % 8 == 6`.
pub fn emit_generic_extension(buf: &mut [u8], next_header: u8, data: &[u8]) -> Result<usize> {
    let len = data.len() + 2;
    if !len.is_multiple_of(8) || len > 2048 {
        return Err(Error::Malformed);
    }
    need(buf, len)?;
    buf[0] = next_header;
    buf[1] = (len / 8 - 1) as u8;
    buf[2..len].copy_from_slice(data);
    Ok(len)
}

/// Emits a fragment header (8 bytes). `offset` is in bytes and a multiple of 8.
pub fn emit_fragment_header(
    buf: &mut [u8],
    next_header: u8,
    offset: u16,
    more: bool,
    ident: u32,
) -> Result<usize> {
    need(buf, 8)?;
    buf[0] = next_header;
    buf[1] = 0;
    set_be16(buf, 2, (offset & 0xfff8) | u16::from(more));
    set_be32(buf, 4, ident);
    Ok(8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    prop_compose! {
        fn arb_repr()(src in any::<[u8; 16]>(), dst in any::<[u8; 16]>(), next_header in any::<u8>(), hop_limit in any::<u8>(),
                      traffic_class in any::<u8>(), flow_label in 0u32..(1 << 20), payload_len in 0u16..1400) -> Ipv6Repr {
            Ipv6Repr { src: src.into(), dst: dst.into(), next_header, hop_limit, traffic_class, flow_label, payload_len }
        }
    }

    proptest! {
        #[test]
        fn round_trip(repr in arb_repr()) {
            let mut buf = vec![0u8; HEADER_LEN + usize::from(repr.payload_len)];
            repr.emit(&mut buf).unwrap();
            prop_assert_eq!(Ipv6Repr::parse(&Ipv6Packet::new_checked(&buf[..]).unwrap()).unwrap(), repr);
            for cut in 0..buf.len() {
                prop_assert!(Ipv6Repr::parse(&Ipv6Packet::new_unchecked(&buf[..cut])).is_err());
            }
        }

        #[test]
        fn walk_never_panics(nh in any::<u8>(), bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = walk_extensions(nh, &bytes);
        }
    }

    #[test]
    fn walks_chain_to_transport() {
        let mut buf = [0u8; 64];
        let mut at =
            emit_generic_extension(&mut buf, protocol::FRAGMENT, &[1, 4, 0, 0, 0, 0]).unwrap();
        at += emit_fragment_header(&mut buf[at..], protocol::DEST_OPTS, 0, true, 7).unwrap();
        at += emit_generic_extension(&mut buf[at..], protocol::TCP, &[0; 14]).unwrap();
        let walk = walk_extensions(protocol::HOP_BY_HOP, &buf).unwrap();
        assert_eq!(
            walk,
            ExtWalk {
                protocol: protocol::TCP,
                offset: at,
                count: 3,
                fragment: Some((0, true))
            }
        );
        for cut in 0..at {
            assert!(walk_extensions(protocol::HOP_BY_HOP, &buf[..cut]).is_err());
        }
    }

    #[test]
    fn endless_chain_is_malformed() {
        let buf = [0u8; 8 * (MAX_EXT_HEADERS + 2)]; // hop-by-hop pointing to hop-by-hop, ...
        assert_eq!(
            walk_extensions(protocol::HOP_BY_HOP, &buf),
            Err(Error::Malformed)
        );
    }
}
