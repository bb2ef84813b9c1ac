//! GTP-U version 1 (3GPP TS 29.281) for user data, and the GTPv2-C header
//! (3GPP TS 29.274) for the signaling that creates and updates per-user state.

use crate::field::{be16, be32, set_be16, set_be32};
use crate::{Error, Result, need};

/// UDP port of GTP-U.
pub const GTPU_PORT: u16 = 2152;
/// UDP port of GTP-C.
pub const GTPC_PORT: u16 = 2123;

pub const GTPU_MIN_HEADER_LEN: usize = 8;
/// GTP-U message type of a user-data packet (T-PDU).
pub const GTPU_T_PDU: u8 = 255;
/// GTP-U path management (TS 29.281 7.2): a peer asks whether the other end is alive.
pub const GTPU_ECHO_REQUEST: u8 = 1;
pub const GTPU_ECHO_RESPONSE: u8 = 2;
/// The Recovery element of a GTP-U Echo Response (type and value: the restart counter).
pub const GTPU_RECOVERY: u8 = 14;
/// TS 29.281 7.3.1: a T-PDU arrived whose TEID names no bearer.
pub const GTPU_ERROR_INDICATION: u8 = 26;
/// An Error Indication's elements: the TEID (type and value) and the sender's address
/// (type, 2-byte length, address).
pub const GTPU_TEID_DATA_I: u8 = 16;
pub const GTPU_PEER_ADDRESS: u8 = 133;

const FLAG_PT: u8 = 0x10;
const FLAG_E: u8 = 0x04;
const FLAG_S: u8 = 0x02;
const FLAG_PN: u8 = 0x01;
/// The walk over GTP-U extension headers gives up (`Malformed`) after this many.
pub const MAX_GTPU_EXTENSIONS: usize = 8;

/// A view of a GTP-U header. After `check_len`, the mandatory header, the optional fields,
/// every extension header and the `length` bytes the header declares are in the buffer.
#[derive(Debug, Clone)]
pub struct GtpuPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> GtpuPacket<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        GtpuPacket { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < GTPU_MIN_HEADER_LEN {
            return Err(Error::Truncated);
        }
        if self.version() != 1 || self.flags() & FLAG_PT == 0 {
            return Err(Error::Malformed);
        }
        if b.len() < GTPU_MIN_HEADER_LEN + usize::from(self.length()) {
            return Err(Error::Truncated);
        }
        let header_len = self.walk_header()?;
        if header_len > GTPU_MIN_HEADER_LEN + usize::from(self.length()) {
            return Err(Error::Malformed);
        }
        Ok(())
    }

    /// Walks the optional fields and extension headers; returns the whole header length.
    fn walk_header(&self) -> Result<usize> {
        let b = self.buffer.as_ref();
        if self.flags() & (FLAG_E | FLAG_S | FLAG_PN) == 0 {
            return Ok(GTPU_MIN_HEADER_LEN);
        }
        if b.len() < GTPU_MIN_HEADER_LEN + 4 {
            return Err(Error::Truncated);
        }
        let mut at = GTPU_MIN_HEADER_LEN + 4;
        if self.flags() & FLAG_E == 0 {
            return Ok(at);
        }
        let mut next = b[at - 1];
        let mut count = 0;
        while next != 0 {
            if count == MAX_GTPU_EXTENSIONS {
                return Err(Error::Malformed);
            }
            let units = usize::from(*b.get(at).ok_or(Error::Truncated)?);
            if units == 0 {
                return Err(Error::Malformed);
            }
            let end = at + units * 4;
            if b.len() < end {
                return Err(Error::Truncated);
            }
            next = b[end - 1];
            at = end;
            count += 1;
        }
        Ok(at)
    }

    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    pub fn version(&self) -> u8 {
        self.flags() >> 5
    }
    pub fn message_type(&self) -> u8 {
        self.buffer.as_ref()[1]
    }
    /// Length of everything after the 8-byte mandatory header.
    pub fn length(&self) -> u16 {
        be16(self.buffer.as_ref(), 2)
    }
    pub fn teid(&self) -> u32 {
        be32(self.buffer.as_ref(), 4)
    }
    pub fn sequence(&self) -> Option<u16> {
        (self.flags() & FLAG_S != 0).then(|| be16(self.buffer.as_ref(), 8))
    }
    /// The header length, optional fields and extension headers included.
    pub fn header_len(&self) -> usize {
        self.walk_header().unwrap_or(GTPU_MIN_HEADER_LEN)
    }
    /// The payload: for a T-PDU, the user's IP packet.
    pub fn payload(&self) -> &[u8] {
        let end = GTPU_MIN_HEADER_LEN + usize::from(self.length());
        &self.buffer.as_ref()[self.header_len().min(end)..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> GtpuPacket<T> {
    pub fn set_teid(&mut self, teid: u32) {
        set_be32(self.buffer.as_mut(), 4, teid);
    }
}

/// An owned GTP-U header (without extension headers when emitted; skipped when parsed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GtpuRepr {
    pub message_type: u8,
    pub teid: u32,
    pub sequence: Option<u16>,
    pub payload_len: u16,
}

impl GtpuRepr {
    pub fn parse<T: AsRef<[u8]>>(p: &GtpuPacket<T>) -> Result<Self> {
        p.check_len()?;
        Ok(GtpuRepr {
            message_type: p.message_type(),
            teid: p.teid(),
            sequence: p.sequence(),
            payload_len: p.payload().len() as u16,
        })
    }

    pub fn header_len(&self) -> usize {
        if self.sequence.is_some() {
            GTPU_MIN_HEADER_LEN + 4
        } else {
            GTPU_MIN_HEADER_LEN
        }
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let header_len = self.header_len();
        need(buf, header_len)?;
        let length = (header_len - GTPU_MIN_HEADER_LEN) as u16 + self.payload_len;
        buf[0] = (1 << 5) | FLAG_PT | if self.sequence.is_some() { FLAG_S } else { 0 };
        buf[1] = self.message_type;
        set_be16(buf, 2, length);
        set_be32(buf, 4, self.teid);
        if let Some(seq) = self.sequence {
            set_be16(buf, 8, seq);
            buf[10] = 0;
            buf[11] = 0;
        }
        Ok(())
    }
}

/// GTPv2-C message types the generator and the gateway program use.
pub mod gtpv2_type {
    /// Path management: a peer asks whether the other end is alive (no TEID in the header).
    pub const ECHO_REQUEST: u8 = 1;
    pub const ECHO_RESPONSE: u8 = 2;
    pub const CREATE_SESSION_REQUEST: u8 = 32;
    pub const CREATE_SESSION_RESPONSE: u8 = 33;
    pub const MODIFY_BEARER_REQUEST: u8 = 34;
    pub const MODIFY_BEARER_RESPONSE: u8 = 35;
    pub const DELETE_SESSION_REQUEST: u8 = 36;
    pub const DELETE_SESSION_RESPONSE: u8 = 37;
}

/// GTPv2-C information element types the generator and the gateway program use.
pub mod gtpv2_ie {
    /// The subscriber's identity, TBCD digits ([`super::imsi_value`]).
    pub const IMSI: u8 = 1;
    /// A response's outcome: a cause value ([`super::gtpv2_cause`]) and flags.
    pub const CAUSE: u8 = 2;
    /// An Echo Response's restart counter: one byte.
    pub const RECOVERY: u8 = 3;
    /// EPS bearer id: 4 bits.
    pub const EBI: u8 = 73;
    /// PDN address allocation: the PDN type ([`super::pdn_type`]), then the addresses: an
    /// IPv4 address; an IPv6 prefix length and prefix; both (the IPv6 ones first).
    pub const PAA: u8 = 79;
    /// The PDN type a Create Session Request asks for ([`super::pdn_type`]), low 3 bits.
    pub const PDN_TYPE: u8 = 99;
    /// Fully qualified TEID ([`super::Fteid`]): flags (V4 0x80, V6 0x40, interface type),
    /// TEID, IPv4 address, IPv6 address.
    pub const F_TEID: u8 = 87;
    /// A bearer's information elements, grouped.
    pub const BEARER_CONTEXT: u8 = 93;
}

/// GTPv2-C cause values (3GPP TS 29.274, 8.4).
pub mod gtpv2_cause {
    pub const REQUEST_ACCEPTED: u8 = 16;
    /// Accepted, with another PDN type than asked for (IPv4 for IPv4v6: no IPv6 here).
    pub const NEW_PDN_TYPE_NETWORK_PREFERENCE: u8 = 18;
    /// The TEID in the request's header names no session.
    pub const CONTEXT_NOT_FOUND: u8 = 64;
    /// An element the request must carry is there but cannot be read.
    pub const MANDATORY_IE_INCORRECT: u8 = 69;
    /// An element the request must carry is missing.
    pub const MANDATORY_IE_MISSING: u8 = 70;
    pub const NO_RESOURCES_AVAILABLE: u8 = 73;
    /// The PDN type asked for (IPv6) is not served here.
    pub const PREFERRED_PDN_TYPE_NOT_SUPPORTED: u8 = 83;
    /// The pool has no address left to give.
    pub const ALL_DYNAMIC_ADDRESSES_OCCUPIED: u8 = 84;
}

/// PDN types (TS 29.274 8.34): which address families a session carries.
pub mod pdn_type {
    pub const IPV4: u8 = 1;
    pub const IPV6: u8 = 2;
    pub const IPV4V6: u8 = 3;
}

/// F-TEID interface types (3GPP TS 29.274, 8.22): the gateway's own ends.
pub mod fteid_interface {
    /// S1-U eNodeB GTP-U: where downlink goes.
    pub const S1U_ENODEB: u8 = 0;
    /// S1-U SGW GTP-U: where uplink goes.
    pub const S1U_SGW: u8 = 1;
    /// S11/S4 SGW GTP-C: where the MME's signaling goes.
    pub const S11_SGW: u8 = 11;
    /// S11 MME GTP-C: the TEID the gateway's signaling to the MME carries.
    pub const S11_MME: u8 = 10;
}

/// A fully qualified TEID (3GPP TS 29.274, 8.22): a tunnel end's interface type, TEID and
/// address (IPv4, IPv6 or both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fteid {
    pub interface: u8,
    pub teid: u32,
    pub v4: Option<[u8; 4]>,
    pub v6: Option<[u8; 16]>,
}

impl Fteid {
    /// Reads an F-TEID element's data; `Malformed` if shorter than its flags say.
    pub fn parse(data: &[u8]) -> Result<Fteid> {
        let flags = *data.first().ok_or(Error::Truncated)?;
        let teid = data.get(1..5).ok_or(Error::Truncated)?;
        let mut at = 5;
        let mut take = |n: usize| {
            let bytes = data.get(at..at + n).ok_or(Error::Malformed);
            at += n;
            bytes
        };
        let v4 = match flags & 0x80 != 0 {
            true => Some(<[u8; 4]>::try_from(take(4)?).map_err(|_| Error::Malformed)?),
            false => None,
        };
        let v6 = match flags & 0x40 != 0 {
            true => Some(<[u8; 16]>::try_from(take(16)?).map_err(|_| Error::Malformed)?),
            false => None,
        };
        Ok(Fteid {
            interface: flags & 0x3f,
            teid: u32::from_be_bytes([teid[0], teid[1], teid[2], teid[3]]),
            v4,
            v6,
        })
    }

    /// Writes the element's data at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let len = 5 + self.v4.map_or(0, |_| 4) + self.v6.map_or(0, |_| 16);
        need(buf, len)?;
        buf[0] = (self.interface & 0x3f)
            | if self.v4.is_some() { 0x80 } else { 0 }
            | if self.v6.is_some() { 0x40 } else { 0 };
        set_be32(buf, 1, self.teid);
        let mut at = 5;
        if let Some(a) = self.v4 {
            buf[at..at + 4].copy_from_slice(&a);
            at += 4;
        }
        if let Some(a) = self.v6 {
            buf[at..at + 16].copy_from_slice(&a);
        }
        Ok(len)
    }
}

/// The most digits an IMSI has.
pub const IMSI_DIGITS: usize = 15;

/// An IMSI element's TBCD digits (two a byte, the first in the low nibble; an odd count
/// ends in the filler 0xf) as the number they spell: 001010000000007 is 1010000000007.
/// `None` if a nibble other than a last filler is not a digit, or there are none or more
/// than 15.
pub fn imsi_value(data: &[u8]) -> Option<u64> {
    let nibbles = data.iter().flat_map(|b| [b & 0x0f, b >> 4]);
    let count = data.len() * 2 - usize::from(data.last().is_some_and(|b| b >> 4 == 0xf));
    if count == 0 || count > IMSI_DIGITS {
        return None;
    }
    nibbles
        .take(count)
        .try_fold(0u64, |v, d| (d <= 9).then(|| v * 10 + u64::from(d)))
}

/// The TBCD digits of the 15-digit IMSI `value` (below 10^15; leading zeros written).
pub fn imsi_tbcd(value: u64) -> [u8; 8] {
    let mut digits = [0xfu8; 16];
    let mut v = value;
    for d in digits[..IMSI_DIGITS].iter_mut().rev() {
        *d = (v % 10) as u8;
        v /= 10;
    }
    std::array::from_fn(|i| digits[2 * i] | (digits[2 * i + 1] << 4))
}

pub const GTPV2_HEADER_LEN_NO_TEID: usize = 8;
pub const GTPV2_HEADER_LEN: usize = 12;

/// An owned GTPv2-C header. `payload_len` covers the information elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gtpv2Repr {
    pub message_type: u8,
    pub teid: Option<u32>,
    /// 24 bits.
    pub sequence: u32,
    pub payload_len: u16,
}

impl Gtpv2Repr {
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < GTPV2_HEADER_LEN_NO_TEID {
            return Err(Error::Truncated);
        }
        if b[0] >> 5 != 2 {
            return Err(Error::Malformed);
        }
        let has_teid = b[0] & 0x08 != 0;
        let header_len = if has_teid {
            GTPV2_HEADER_LEN
        } else {
            GTPV2_HEADER_LEN_NO_TEID
        };
        let length = usize::from(be16(b, 2));
        if length + 4 < header_len {
            return Err(Error::Malformed);
        }
        if b.len() < length + 4 {
            return Err(Error::Truncated);
        }
        let (teid, seq_at) = if has_teid {
            (Some(be32(b, 4)), 8)
        } else {
            (None, 4)
        };
        Ok(Gtpv2Repr {
            message_type: b[1],
            teid,
            sequence: be32(b, seq_at) >> 8,
            payload_len: (length + 4 - header_len) as u16,
        })
    }

    pub fn header_len(&self) -> usize {
        if self.teid.is_some() {
            GTPV2_HEADER_LEN
        } else {
            GTPV2_HEADER_LEN_NO_TEID
        }
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let header_len = self.header_len();
        need(buf, header_len)?;
        buf[0] = (2 << 5) | if self.teid.is_some() { 0x08 } else { 0 };
        buf[1] = self.message_type;
        set_be16(buf, 2, (header_len - 4) as u16 + self.payload_len);
        let seq_at = match self.teid {
            Some(teid) => {
                set_be32(buf, 4, teid);
                8
            }
            None => 4,
        };
        set_be32(buf, seq_at, (self.sequence & 0x00ff_ffff) << 8);
        Ok(())
    }
}

/// One GTPv2-C information element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gtpv2Ie<'a> {
    pub ie_type: u8,
    pub instance: u8,
    pub data: &'a [u8],
}

/// Iterates over the information elements of a GTPv2-C payload; yields `Err(Truncated)` once
/// (then stops) when an element runs past the end.
pub fn gtpv2_ies(mut bytes: &[u8]) -> impl Iterator<Item = Result<Gtpv2Ie<'_>>> {
    std::iter::from_fn(move || {
        if bytes.is_empty() {
            return None;
        }
        if bytes.len() < 4 || bytes.len() < 4 + usize::from(be16(bytes, 1)) {
            bytes = &[];
            return Some(Err(Error::Truncated));
        }
        let len = usize::from(be16(bytes, 1));
        let ie = Gtpv2Ie {
            ie_type: bytes[0],
            instance: bytes[3] & 0x0f,
            data: &bytes[4..4 + len],
        };
        bytes = &bytes[4 + len..];
        Some(Ok(ie))
    })
}

/// Appends an information element at the start of `buf`; returns its length.
pub fn emit_gtpv2_ie(buf: &mut [u8], ie_type: u8, instance: u8, data: &[u8]) -> Result<usize> {
    let len = 4 + data.len();
    need(buf, len)?;
    buf[0] = ie_type;
    set_be16(
        buf,
        1,
        u16::try_from(data.len()).map_err(|_| Error::Malformed)?,
    );
    buf[3] = instance & 0x0f;
    buf[4..len].copy_from_slice(data);
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn imsis_round_trip(value in 0u64..1_000_000_000_000_000) {
            prop_assert_eq!(imsi_value(&imsi_tbcd(value)), Some(value));
        }

        #[test]
        fn fteids_round_trip(interface in 0u8..64, teid in any::<u32>(), v4 in proptest::option::of(any::<[u8; 4]>()), v6 in proptest::option::of(any::<[u8; 16]>())) {
            let f = Fteid { interface, teid, v4, v6 };
            let mut buf = [0u8; 25];
            let len = f.emit(&mut buf).unwrap();
            prop_assert_eq!(Fteid::parse(&buf[..len]), Ok(f));
            if len > 5 {
                prop_assert_eq!(Fteid::parse(&buf[..len - 1]), Err(Error::Malformed));
            }
        }

        #[test]
        fn gtpu_round_trip(mt in any::<u8>(), teid in any::<u32>(), seq in proptest::option::of(any::<u16>()), pl in 0u16..1400) {
            let repr = GtpuRepr { message_type: mt, teid, sequence: seq, payload_len: pl };
            let mut buf = vec![0u8; repr.header_len() + usize::from(pl)];
            repr.emit(&mut buf).unwrap();
            prop_assert_eq!(GtpuRepr::parse(&GtpuPacket::new_checked(&buf[..]).unwrap()).unwrap(), repr);
            for cut in 0..buf.len() {
                prop_assert!(GtpuRepr::parse(&GtpuPacket::new_unchecked(&buf[..cut])).is_err());
            }
        }

        #[test]
        fn gtpv2_round_trip(mt in any::<u8>(), teid in proptest::option::of(any::<u32>()), seq in 0u32..(1 << 24), pl in 0u16..200) {
            let repr = Gtpv2Repr { message_type: mt, teid, sequence: seq, payload_len: pl };
            let mut buf = vec![0u8; repr.header_len() + usize::from(pl)];
            repr.emit(&mut buf).unwrap();
            prop_assert_eq!(Gtpv2Repr::parse(&buf).unwrap(), repr);
            for cut in 0..buf.len() {
                prop_assert!(Gtpv2Repr::parse(&buf[..cut]).is_err());
            }
        }

        #[test]
        fn gtpu_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(p) = GtpuPacket::new_checked(&bytes[..]) {
                let _ = p.payload();
            }
        }
    }

    #[test]
    fn gtpu_extension_headers_are_skipped() {
        // Flags: version 1, PT, E. One PDU session container (1 unit of 4 bytes), then none.
        let mut buf = vec![
            0x34, GTPU_T_PDU, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0x85, 1, 0x10, 0x05, 0x00,
        ];
        buf.extend_from_slice(&[0x45; 6]);
        let length = (buf.len() - GTPU_MIN_HEADER_LEN) as u16;
        buf[2..4].copy_from_slice(&length.to_be_bytes());
        let p = GtpuPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(p.header_len(), 16);
        assert_eq!(p.payload(), &[0x45; 6]);
        assert_eq!(p.teid(), 9);
        buf[12] = 0; // an extension of zero length is not allowed
        assert_eq!(
            GtpuPacket::new_checked(&buf[..]).err(),
            Some(Error::Malformed)
        );
    }

    #[test]
    fn gtpv2_ies_walk() {
        let mut buf = [0u8; 32];
        let mut at = emit_gtpv2_ie(&mut buf, gtpv2_ie::IMSI, 0, &[0x21, 0x43, 0x65]).unwrap();
        at += emit_gtpv2_ie(
            &mut buf[at..],
            gtpv2_ie::F_TEID,
            1,
            &[0x80, 0, 0, 0, 7, 198, 18, 0, 1],
        )
        .unwrap();
        let ies: Vec<_> = gtpv2_ies(&buf[..at]).map(|i| i.unwrap()).collect();
        assert_eq!(ies.len(), 2);
        assert_eq!(
            (ies[1].ie_type, ies[1].instance, ies[1].data.len()),
            (gtpv2_ie::F_TEID, 1, 9)
        );
        assert_eq!(
            gtpv2_ies(&buf[..at - 1]).last(),
            Some(Err(Error::Truncated))
        );
    }

    #[test]
    fn imsis_are_read_digit_by_digit() {
        // 001 01 0123456789, as an MME writes it: the first digit in the low nibble.
        let tbcd = [0x00, 0xf1, 0x10, 0x10, 0x32, 0x54, 0x76, 0x98];
        assert_eq!(
            imsi_value(&tbcd),
            None,
            "16 nibbles with no filler: too many"
        );
        let fifteen = [0x00, 0x01, 0x01, 0x21, 0x43, 0x65, 0x87, 0xf9];
        assert_eq!(imsi_value(&fifteen), Some(1_010_123_456_789));
        assert_eq!(imsi_tbcd(1_010_123_456_789), fifteen);
        assert_eq!(imsi_value(&[0x21, 0xf3]), Some(123), "three digits");
        assert_eq!(imsi_value(&[0x2a]), None, "a nibble that is no digit");
        assert_eq!(imsi_value(&[0xf1, 0x32]), None, "a filler before the end");
        assert_eq!(imsi_value(&[]), None);
    }
}
