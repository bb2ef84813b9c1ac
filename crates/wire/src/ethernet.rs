//! Ethernet II frames and 802.1Q / 802.1ad (QinQ) VLAN tags.

use crate::field::{array, be16, set_be16};
use crate::{Error, Result, need};
use std::fmt;
use std::str::FromStr;

/// EtherType values Stateplane understands.
pub mod ethertype {
    pub const IPV4: u16 = 0x0800;
    pub const ARP: u16 = 0x0806;
    pub const VLAN: u16 = 0x8100;
    pub const IPV6: u16 = 0x86dd;
    pub const QINQ: u16 = 0x88a8;

    /// Whether `t` is a tag protocol identifier (a VLAN tag follows, not a payload).
    pub fn is_vlan_tpid(t: u16) -> bool {
        t == VLAN || t == QINQ
    }
}

/// A 48-bit MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }

    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// The address as the low 48 bits of a `u64`, for compact table keys.
    pub fn to_u64(&self) -> u64 {
        let mut b = [0u8; 8];
        b[2..].copy_from_slice(&self.0);
        u64::from_be_bytes(b)
    }

    /// The address in the low 48 bits of `v` (the inverse of [`MacAddr::to_u64`]).
    pub fn from_u64(v: u64) -> MacAddr {
        let b = v.to_be_bytes();
        MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]])
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The error of parsing a MAC address from text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadMacAddr(pub String);

impl fmt::Display for BadMacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "'{}' is not a MAC address: write six hex bytes separated by ':', like 02:00:00:00:00:01",
            self.0
        )
    }
}

impl std::error::Error for BadMacAddr {}

impl FromStr for MacAddr {
    type Err = BadMacAddr;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for byte in &mut out {
            let part = parts.next().ok_or_else(|| BadMacAddr(s.to_owned()))?;
            if part.len() != 2 {
                return Err(BadMacAddr(s.to_owned()));
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| BadMacAddr(s.to_owned()))?;
        }
        if parts.next().is_some() {
            return Err(BadMacAddr(s.to_owned()));
        }
        Ok(MacAddr(out))
    }
}

mod layout {
    pub const DST: usize = 0;
    pub const SRC: usize = 6;
    pub const ETHERTYPE: usize = 12;
    pub const HEADER_LEN: usize = 14;
    pub const TAG_LEN: usize = 4;
}
pub use layout::{HEADER_LEN, TAG_LEN};

/// A view of an Ethernet II frame: destination, source, EtherType (or the first tag's TPID).
#[derive(Debug, Clone)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        let frame = Self::new_unchecked(buffer);
        frame.check_len()?;
        Ok(frame)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn dst(&self) -> MacAddr {
        MacAddr(array(self.buffer.as_ref(), layout::DST))
    }

    pub fn src(&self) -> MacAddr {
        MacAddr(array(self.buffer.as_ref(), layout::SRC))
    }

    /// The EtherType field: the payload's type, or a TPID when a VLAN tag follows.
    pub fn ethertype(&self) -> u16 {
        be16(self.buffer.as_ref(), layout::ETHERTYPE)
    }

    /// Everything after the 14-byte header (tags included).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    pub fn set_dst(&mut self, mac: MacAddr) {
        self.buffer.as_mut()[layout::DST..layout::DST + 6].copy_from_slice(&mac.0);
    }

    pub fn set_src(&mut self, mac: MacAddr) {
        self.buffer.as_mut()[layout::SRC..layout::SRC + 6].copy_from_slice(&mac.0);
    }

    pub fn set_ethertype(&mut self, t: u16) {
        set_be16(self.buffer.as_mut(), layout::ETHERTYPE, t);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// One VLAN tag: the TPID that announced it and the fields of its TCI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VlanTag {
    /// 0x8100 (802.1Q) or 0x88a8 (802.1ad service tag).
    pub tpid: u16,
    /// Priority code point, 3 bits.
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier, 12 bits.
    pub vid: u16,
}

impl VlanTag {
    pub fn from_tci(tpid: u16, tci: u16) -> Self {
        VlanTag {
            tpid,
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        }
    }

    pub fn tci(&self) -> u16 {
        (u16::from(self.pcp & 7) << 13) | (u16::from(self.dei) << 12) | (self.vid & 0x0fff)
    }
}

/// The most VLAN tags a frame may carry (QinQ).
pub const MAX_VLAN_TAGS: usize = 2;

/// An owned Ethernet header with up to two VLAN tags, outermost first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    pub dst: MacAddr,
    pub src: MacAddr,
    pub tags: [Option<VlanTag>; MAX_VLAN_TAGS],
    /// The payload's EtherType, after the tags.
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Parses the header and its tags. A third stacked tag is `Malformed`.
    pub fn parse<T: AsRef<[u8]>>(frame: &EthernetFrame<T>) -> Result<Self> {
        frame.check_len()?;
        let bytes = frame.buffer.as_ref();
        let mut tags = [None; MAX_VLAN_TAGS];
        let mut ethertype = frame.ethertype();
        let mut at = layout::ETHERTYPE + 2;
        for slot in tags.iter_mut() {
            if !ethertype::is_vlan_tpid(ethertype) {
                break;
            }
            if bytes.len() < at + TAG_LEN {
                return Err(Error::Truncated);
            }
            *slot = Some(VlanTag::from_tci(ethertype, be16(bytes, at)));
            ethertype = be16(bytes, at + 2);
            at += TAG_LEN;
        }
        if ethertype::is_vlan_tpid(ethertype) {
            return Err(Error::Malformed);
        }
        Ok(EthernetRepr {
            dst: frame.dst(),
            src: frame.src(),
            tags,
            ethertype,
        })
    }

    pub fn tag_count(&self) -> usize {
        self.tags.iter().flatten().count()
    }

    pub fn header_len(&self) -> usize {
        HEADER_LEN + TAG_LEN * self.tag_count()
    }

    /// Writes the header (and tags) at the start of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        need(buf, self.header_len())?;
        buf[layout::DST..layout::DST + 6].copy_from_slice(&self.dst.0);
        buf[layout::SRC..layout::SRC + 6].copy_from_slice(&self.src.0);
        let mut at = layout::ETHERTYPE;
        for tag in self.tags.iter().flatten() {
            set_be16(buf, at, tag.tpid);
            set_be16(buf, at + 2, tag.tci());
            at += TAG_LEN;
        }
        set_be16(buf, at, self.ethertype);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_tag() -> impl Strategy<Value = VlanTag> {
        (
            prop_oneof![Just(ethertype::VLAN), Just(ethertype::QINQ)],
            0u8..8,
            any::<bool>(),
            0u16..4096,
        )
            .prop_map(|(tpid, pcp, dei, vid)| VlanTag {
                tpid,
                pcp,
                dei,
                vid,
            })
    }

    prop_compose! {
        fn arb_repr()(dst in any::<[u8; 6]>(), src in any::<[u8; 6]>(),
                      outer in proptest::option::of(arb_tag()), inner in arb_tag(), two in any::<bool>(),
                      ethertype in prop_oneof![Just(ethertype::IPV4), Just(ethertype::IPV6), Just(ethertype::ARP), 0x0600u16..0x8000])
                      -> EthernetRepr {
            let tags = match outer { Some(o) if two => [Some(o), Some(inner)], o => [o, None] };
            EthernetRepr { dst: MacAddr(dst), src: MacAddr(src), tags, ethertype }
        }
    }

    proptest! {
        #[test]
        fn round_trip(repr in arb_repr()) {
            let mut buf = vec![0u8; repr.header_len()];
            repr.emit(&mut buf).unwrap();
            let parsed = EthernetRepr::parse(&EthernetFrame::new_checked(&buf[..]).unwrap()).unwrap();
            prop_assert_eq!(parsed, repr);
            for cut in 0..buf.len() {
                let frame = EthernetFrame::new_unchecked(&buf[..cut]);
                prop_assert!(EthernetRepr::parse(&frame).is_err());
            }
        }
    }

    #[test]
    fn third_tag_is_malformed() {
        let mut buf = [0u8; 14 + 12];
        for at in [12, 16, 20] {
            buf[at..at + 2].copy_from_slice(&ethertype::VLAN.to_be_bytes());
        }
        let frame = EthernetFrame::new_checked(&buf[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&frame), Err(Error::Malformed));
    }

    #[test]
    fn mac_text_round_trip_and_errors() {
        let mac: MacAddr = "02:00:5e:10:00:ff".parse().unwrap();
        assert_eq!(mac.to_string(), "02:00:5e:10:00:ff");
        assert!("02:00:5e:10:00".parse::<MacAddr>().is_err());
        assert!("02:00:5e:10:00:ff:01".parse::<MacAddr>().is_err());
        assert!("zz:00:5e:10:00:ff".parse::<MacAddr>().is_err());
        assert!(MacAddr::BROADCAST.is_multicast());
    }
}
