//! TCP segments (RFC 9293): header fields, flags, options walked with bounds checks.

use crate::checksum;
use crate::field::{be16, be32, set_be16, set_be32};
use crate::{Error, Result, need};

pub const MIN_HEADER_LEN: usize = 20;
pub const MAX_OPTIONS_LEN: usize = 40;

/// TCP flag bits as they sit in byte 13 of the header.
pub mod flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
    pub const URG: u8 = 0x20;
    pub const ECE: u8 = 0x40;
    pub const CWR: u8 = 0x80;
}

/// Option kinds (RFC 9293 3.2, RFC 7323, RFC 2018).
pub mod option {
    pub const END: u8 = 0;
    pub const NOP: u8 = 1;
    pub const MSS: u8 = 2;
    pub const WINDOW_SCALE: u8 = 3;
    pub const SACK_PERMITTED: u8 = 4;
    pub const TIMESTAMPS: u8 = 8;
}

/// A view of a TCP segment. After `check_len` the header, options included, is in the buffer.
#[derive(Debug, Clone)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        TcpPacket { buffer }
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
        if self.header_len() < MIN_HEADER_LEN {
            return Err(Error::Malformed);
        }
        if len < self.header_len() {
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
    pub fn seq(&self) -> u32 {
        be32(self.buffer.as_ref(), 4)
    }
    pub fn ack(&self) -> u32 {
        be32(self.buffer.as_ref(), 8)
    }
    /// Header length in bytes, from the data offset field.
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[12] >> 4) * 4
    }
    /// FIN, SYN, RST, PSH, ACK, URG, ECE and CWR as one byte (see [`flags`]).
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[13]
    }
    pub fn window(&self) -> u16 {
        be16(self.buffer.as_ref(), 14)
    }
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), 16)
    }
    pub fn urgent(&self) -> u16 {
        be16(self.buffer.as_ref(), 18)
    }
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[MIN_HEADER_LEN..self.header_len()]
    }
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
    /// Whether the checksum over this whole segment and the given pseudo-header sum holds.
    pub fn verify_checksum(&self, pseudo: u32) -> bool {
        checksum::finish(checksum::accumulate(pseudo, self.buffer.as_ref())) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
    pub fn set_src_port(&mut self, p: u16) {
        set_be16(self.buffer.as_mut(), 0, p);
    }
    pub fn set_dst_port(&mut self, p: u16) {
        set_be16(self.buffer.as_mut(), 2, p);
    }
    pub fn set_checksum(&mut self, c: u16) {
        set_be16(self.buffer.as_mut(), 16, c);
    }
    /// Sets the sequence number, the checksum updated for it.
    pub fn set_seq(&mut self, seq: u32) {
        self.set_be32_updating_checksum(4, seq);
    }
    /// Sets the acknowledgment number, the checksum updated for it.
    pub fn set_ack(&mut self, ack: u32) {
        self.set_be32_updating_checksum(8, ack);
    }
    fn set_be32_updating_checksum(&mut self, at: usize, value: u32) {
        let old = be32(self.buffer.as_ref(), at);
        let c = checksum::update32(self.checksum(), old, value);
        set_be32(self.buffer.as_mut(), at, value);
        self.set_checksum(c);
    }
    /// Computes the checksum over the whole buffer (header and payload) and the pseudo-header.
    pub fn fill_checksum(&mut self, pseudo: u32) {
        self.set_checksum(0);
        let c = checksum::finish(checksum::accumulate(pseudo, self.buffer.as_ref()));
        self.set_checksum(c);
    }
}

/// One TCP option: its kind and its data (without kind and length bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpOption<'a> {
    pub kind: u8,
    pub data: &'a [u8],
}

/// Iterates over TCP options; stops at End-of-List, and yields `Err(Malformed)` once (then
/// stops) where an option's length runs past the option space.
pub fn options(mut bytes: &[u8]) -> impl Iterator<Item = Result<TcpOption<'_>>> {
    std::iter::from_fn(move || {
        loop {
            let (&kind, rest) = bytes.split_first()?;
            match kind {
                option::END => return None,
                option::NOP => bytes = rest,
                _ => {
                    let len = match rest.first() {
                        Some(&l) if l >= 2 && usize::from(l) <= bytes.len() => usize::from(l),
                        _ => {
                            bytes = &[];
                            return Some(Err(Error::Malformed));
                        }
                    };
                    let option = TcpOption {
                        kind,
                        data: &bytes[2..len],
                    };
                    bytes = &bytes[len..];
                    return Some(Ok(option));
                }
            }
        }
    })
}

/// An owned TCP header; options are kept as opaque bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpRepr {
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    pub urgent: u16,
    options: [u8; MAX_OPTIONS_LEN],
    options_len: u8,
}

impl TcpRepr {
    pub fn new(src_port: u16, dst_port: u16, seq: u32, ack: u32, flags: u8, window: u16) -> Self {
        TcpRepr {
            src_port,
            dst_port,
            seq,
            ack,
            flags,
            window,
            urgent: 0,
            options: [0; MAX_OPTIONS_LEN],
            options_len: 0,
        }
    }

    /// Sets the options, zero-padded to a multiple of 4; `Malformed` past 40 bytes.
    pub fn with_options(mut self, raw: &[u8]) -> Result<Self> {
        if raw.len() > MAX_OPTIONS_LEN {
            return Err(Error::Malformed);
        }
        self.options = [0; MAX_OPTIONS_LEN];
        self.options[..raw.len()].copy_from_slice(raw);
        self.options_len = raw.len().next_multiple_of(4) as u8;
        Ok(self)
    }

    pub fn options(&self) -> &[u8] {
        &self.options[..usize::from(self.options_len)]
    }

    pub fn parse<T: AsRef<[u8]>>(p: &TcpPacket<T>) -> Result<Self> {
        p.check_len()?;
        let mut repr = TcpRepr::new(
            p.src_port(),
            p.dst_port(),
            p.seq(),
            p.ack(),
            p.flags(),
            p.window(),
        );
        repr.urgent = p.urgent();
        repr.with_options(p.options())
    }

    pub fn header_len(&self) -> usize {
        MIN_HEADER_LEN + usize::from(self.options_len)
    }

    /// Writes the header with a zero checksum; fill it with [`TcpPacket::fill_checksum`] once
    /// the payload is in place.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let header_len = self.header_len();
        need(buf, header_len)?;
        set_be16(buf, 0, self.src_port);
        set_be16(buf, 2, self.dst_port);
        set_be32(buf, 4, self.seq);
        set_be32(buf, 8, self.ack);
        buf[12] = ((header_len / 4) as u8) << 4;
        buf[13] = self.flags;
        set_be16(buf, 14, self.window);
        set_be16(buf, 16, 0);
        set_be16(buf, 18, self.urgent);
        buf[MIN_HEADER_LEN..header_len].copy_from_slice(self.options());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(sp in any::<u16>(), dp in any::<u16>(), seq in any::<u32>(), ack in any::<u32>(), fl in any::<u8>(),
                      win in any::<u16>(), urg in any::<u16>(), words in proptest::collection::vec(any::<[u8; 4]>(), 0..=10)) {
            let mut repr = TcpRepr::new(sp, dp, seq, ack, fl, win).with_options(&words.concat()).unwrap();
            repr.urgent = urg;
            let mut buf = vec![0u8; repr.header_len()];
            repr.emit(&mut buf).unwrap();
            prop_assert_eq!(TcpRepr::parse(&TcpPacket::new_checked(&buf[..]).unwrap()).unwrap(), repr);
            for cut in 0..buf.len() {
                prop_assert!(TcpRepr::parse(&TcpPacket::new_unchecked(&buf[..cut])).is_err());
            }
        }

        #[test]
        fn option_walk_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            prop_assert!(options(&bytes).count() <= bytes.len());
        }
    }

    #[test]
    fn options_are_walked_and_bad_lengths_stop() {
        let mss_sack_ts = [2, 4, 0x05, 0xb4, 1, 1, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0];
        let kinds: Vec<u8> = options(&mss_sack_ts).map(|o| o.unwrap().kind).collect();
        assert_eq!(kinds, [2, 4, 8]);
        let bad = [2, 9, 0, 0];
        assert_eq!(options(&bad).collect::<Vec<_>>(), [Err(Error::Malformed)]);
        let zero_len = [3, 0, 1, 1];
        assert_eq!(
            options(&zero_len).collect::<Vec<_>>(),
            [Err(Error::Malformed)]
        );
    }

    #[test]
    fn checksum_verifies() {
        use std::net::Ipv4Addr;
        let repr = TcpRepr::new(1234, 80, 1, 0, flags::SYN, 65535);
        let mut buf = vec![0u8; repr.header_len() + 5];
        repr.emit(&mut buf).unwrap();
        buf[20..].copy_from_slice(b"hello");
        let pseudo = checksum::pseudo_v4(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 2),
            6,
            buf.len() as u16,
        );
        let mut p = TcpPacket::new_checked(&mut buf[..]).unwrap();
        p.fill_checksum(pseudo);
        assert!(p.verify_checksum(pseudo));
        assert!(!p.verify_checksum(pseudo + 1));
        // Sequence and acknowledgment numbers set keep it whole, wrapping included.
        for (seq, ack) in [(u32::MAX, 7), (0x8000_0000, u32::MAX), (12, 0)] {
            p.set_seq(seq);
            p.set_ack(ack);
            assert_eq!((p.seq(), p.ack()), (seq, ack));
            assert!(p.verify_checksum(pseudo), "seq {seq} ack {ack}");
        }
    }
}
