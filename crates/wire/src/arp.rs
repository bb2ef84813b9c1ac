//! ARP over Ethernet for IPv4 (RFC 826). Other hardware or protocol types are `Malformed`
//! here: Stateplane only ever switches Ethernet/IPv4 ARP.

use crate::ethernet::{MacAddr, ethertype};
use crate::field::{array, be16, set_be16};
use crate::{Error, Result, need};
use std::net::Ipv4Addr;

pub const PACKET_LEN: usize = 28;
const HTYPE_ETHERNET: u16 = 1;

/// ARP operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArpOp {
    Request,
    Reply,
    Other(u16),
}

impl From<u16> for ArpOp {
    fn from(v: u16) -> Self {
        match v {
            1 => ArpOp::Request,
            2 => ArpOp::Reply,
            o => ArpOp::Other(o),
        }
    }
}

impl From<ArpOp> for u16 {
    fn from(op: ArpOp) -> u16 {
        match op {
            ArpOp::Request => 1,
            ArpOp::Reply => 2,
            ArpOp::Other(o) => o,
        }
    }
}

/// A view of an Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        ArpPacket { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < PACKET_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn hardware_type(&self) -> u16 {
        be16(self.buffer.as_ref(), 0)
    }
    pub fn protocol_type(&self) -> u16 {
        be16(self.buffer.as_ref(), 2)
    }
    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[4]
    }
    pub fn protocol_len(&self) -> u8 {
        self.buffer.as_ref()[5]
    }
    pub fn operation(&self) -> ArpOp {
        be16(self.buffer.as_ref(), 6).into()
    }
    pub fn sender_mac(&self) -> MacAddr {
        MacAddr(array(self.buffer.as_ref(), 8))
    }
    pub fn sender_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(array::<4>(self.buffer.as_ref(), 14))
    }
    pub fn target_mac(&self) -> MacAddr {
        MacAddr(array(self.buffer.as_ref(), 18))
    }
    pub fn target_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(array::<4>(self.buffer.as_ref(), 24))
    }
}

/// An owned Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRepr {
    pub op: ArpOp,
    pub sender_mac: MacAddr,
    pub sender_ip: Ipv4Addr,
    pub target_mac: MacAddr,
    pub target_ip: Ipv4Addr,
}

impl ArpRepr {
    pub fn parse<T: AsRef<[u8]>>(p: &ArpPacket<T>) -> Result<Self> {
        p.check_len()?;
        if p.hardware_type() != HTYPE_ETHERNET
            || p.protocol_type() != ethertype::IPV4
            || p.hardware_len() != 6
            || p.protocol_len() != 4
        {
            return Err(Error::Malformed);
        }
        Ok(ArpRepr {
            op: p.operation(),
            sender_mac: p.sender_mac(),
            sender_ip: p.sender_ip(),
            target_mac: p.target_mac(),
            target_ip: p.target_ip(),
        })
    }

    pub fn buffer_len(&self) -> usize {
        PACKET_LEN
    }

    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        need(buf, PACKET_LEN)?;
        set_be16(buf, 0, HTYPE_ETHERNET);
        set_be16(buf, 2, ethertype::IPV4);
        buf[4] = 6;
        buf[5] = 4;
        set_be16(buf, 6, self.op.into());
        buf[8..14].copy_from_slice(&self.sender_mac.0);
        buf[14..18].copy_from_slice(&self.sender_ip.octets());
        buf[18..24].copy_from_slice(&self.target_mac.0);
        buf[24..28].copy_from_slice(&self.target_ip.octets());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(op in any::<u16>(), sm in any::<[u8; 6]>(), si in any::<u32>(), tm in any::<[u8; 6]>(), ti in any::<u32>()) {
            let repr = ArpRepr { op: op.into(), sender_mac: MacAddr(sm), sender_ip: si.into(), target_mac: MacAddr(tm), target_ip: ti.into() };
            let mut buf = [0u8; PACKET_LEN];
            repr.emit(&mut buf).unwrap();
            prop_assert_eq!(ArpRepr::parse(&ArpPacket::new_checked(&buf[..]).unwrap()).unwrap(), repr);
            for cut in 0..PACKET_LEN {
                prop_assert!(ArpRepr::parse(&ArpPacket::new_unchecked(&buf[..cut])).is_err());
            }
        }
    }

    #[test]
    fn non_ethernet_ipv4_is_malformed() {
        let mut buf = [0u8; PACKET_LEN];
        ArpRepr {
            op: ArpOp::Request,
            sender_mac: MacAddr::default(),
            sender_ip: Ipv4Addr::UNSPECIFIED,
            target_mac: MacAddr::default(),
            target_ip: Ipv4Addr::UNSPECIFIED,
        }
        .emit(&mut buf)
        .unwrap();
        buf[1] = 6; // IEEE 802 hardware type
        assert_eq!(
            ArpRepr::parse(&ArpPacket::new_checked(&buf[..]).unwrap()),
            Err(Error::Malformed)
        );
    }
}
