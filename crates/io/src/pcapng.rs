//! pcapng files (draft-ietf-opsawg-pcapng): sections, interfaces with their own link type
//! and timestamp resolution, and the packet blocks (enhanced, simple, obsolete). Other
//! blocks are skipped. Interfaces that are not Ethernet are refused when described.

use crate::capture::{CaptureError, Endian, LINKTYPE_ETHERNET, MAX_RECORD_LEN, Record, read_full};
use std::io::{self, Read, Write};

const SHB: u32 = 0x0a0d_0d0a;
const IDB: u32 = 1;
const OBSOLETE_PB: u32 = 2;
const SPB: u32 = 3;
const EPB: u32 = 6;
const BYTE_ORDER_MAGIC: u32 = 0x1a2b_3c4d;
const OPT_END: u16 = 0;
const OPT_IF_TSRESOL: u16 = 9;
const OPT_IF_TSOFFSET: u16 = 14;
/// Blocks larger than this are corrupt (the largest packet block is far smaller).
const MAX_BLOCK_LEN: u32 = MAX_RECORD_LEN + 4096;

pub fn is_magic(magic: [u8; 4]) -> bool {
    u32::from_le_bytes(magic) == SHB
}

#[derive(Clone, Copy)]
struct Interface {
    /// Timestamp units per second.
    units_per_sec: u64,
    /// Seconds added to every timestamp.
    offset_secs: i64,
    snaplen: u32,
}

pub struct PcapngReader<R: Read> {
    r: R,
    endian: Endian,
    interfaces: Vec<Interface>,
    block: Vec<u8>,
    at_byte: u64,
    /// Simple packet blocks carry no timestamp: they get the last one seen.
    last_ts_ns: u64,
    /// (start, len, orig_len, ts) of the packet found in `block`.
    found: (usize, usize, u32, u64),
}

impl<R: Read> PcapngReader<R> {
    /// Continues after the caller has read the section header block's type (the magic).
    pub fn after_magic(r: R, magic: [u8; 4]) -> Result<Self, CaptureError> {
        if !is_magic(magic) {
            return Err(CaptureError::NotACapture {
                magic: u32::from_be_bytes(magic),
            });
        }
        let mut reader = PcapngReader {
            r,
            endian: Endian::Little,
            interfaces: Vec::new(),
            block: Vec::new(),
            at_byte: 0,
            last_ts_ns: 0,
            found: (0, 0, 0, 0),
        };
        reader.read_section_header()?;
        Ok(reader)
    }

    fn corrupt(&self, what: &'static str) -> CaptureError {
        CaptureError::Corrupt {
            at_byte: self.at_byte,
            what,
        }
    }

    /// Reads the rest of a section header block (its type already consumed) and starts a
    /// new section: byte order from its magic, no interfaces yet.
    fn read_section_header(&mut self) -> Result<(), CaptureError> {
        let mut len_bytes = [0u8; 4];
        if read_full(&mut self.r, &mut len_bytes)? < 4 {
            return Err(CaptureError::Truncated {
                at_byte: self.at_byte,
            });
        }
        self.restart_section(len_bytes)
    }

    /// Reads the next block into `self.block` (body only); returns its type, or None at EOF.
    fn read_block(&mut self) -> Result<Option<u32>, CaptureError> {
        let mut head = [0u8; 8];
        let got = read_full(&mut self.r, &mut head)?;
        if got == 0 {
            return Ok(None);
        }
        if got < 8 {
            return Err(CaptureError::Truncated {
                at_byte: self.at_byte,
            });
        }
        let block_type = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        if block_type == SHB {
            // The section header's byte order is only known from inside it.
            self.restart_section([head[4], head[5], head[6], head[7]])?;
            return Ok(Some(SHB));
        }
        let block_type = self.endian.u32(&head, 0);
        let total = self.endian.u32(&head, 4);
        if !(12..=MAX_BLOCK_LEN).contains(&total) || !total.is_multiple_of(4) {
            return Err(self.corrupt("block with an impossible length"));
        }
        self.block.resize(total as usize - 8, 0);
        if read_full(&mut self.r, &mut self.block)? < self.block.len() {
            return Err(CaptureError::Truncated {
                at_byte: self.at_byte,
            });
        }
        let trailer = self.endian.u32(&self.block, self.block.len() - 4);
        if trailer != total {
            return Err(self.corrupt("block whose trailing length differs from its leading length"));
        }
        self.block.truncate(total as usize - 12);
        self.at_byte += u64::from(total);
        Ok(Some(block_type))
    }

    /// A new section begins inside the stream; `len_bytes` are its (still unordered) length.
    fn restart_section(&mut self, len_bytes: [u8; 4]) -> Result<(), CaptureError> {
        let mut magic = [0u8; 4];
        if read_full(&mut self.r, &mut magic)? < 4 {
            return Err(CaptureError::Truncated {
                at_byte: self.at_byte,
            });
        }
        self.endian = Endian::of(magic, BYTE_ORDER_MAGIC)
            .ok_or_else(|| self.corrupt("section header with an unknown byte-order magic"))?;
        let total = self.endian.u32(&len_bytes, 0);
        if !(28..=MAX_BLOCK_LEN).contains(&total) || !total.is_multiple_of(4) {
            return Err(self.corrupt("section header block with an impossible length"));
        }
        let mut rest = vec![0u8; total as usize - 12];
        if read_full(&mut self.r, &mut rest)? < rest.len() {
            return Err(CaptureError::Truncated {
                at_byte: self.at_byte,
            });
        }
        self.at_byte += u64::from(total);
        self.interfaces.clear();
        Ok(())
    }

    fn add_interface(&mut self) -> Result<(), CaptureError> {
        let b = &self.block;
        if b.len() < 8 {
            return Err(self.corrupt("interface description block too short"));
        }
        let linktype = u32::from(self.endian.u16(b, 0));
        if linktype != LINKTYPE_ETHERNET {
            return Err(CaptureError::UnsupportedLinkType { linktype });
        }
        let mut iface = Interface {
            units_per_sec: 1_000_000,
            offset_secs: 0,
            snaplen: self.endian.u32(b, 4),
        };
        let mut at = 8;
        while at + 4 <= b.len() {
            let code = self.endian.u16(b, at);
            let len = usize::from(self.endian.u16(b, at + 2));
            let value = b
                .get(at + 4..at + 4 + len)
                .ok_or_else(|| self.corrupt("option runs past its block"))?;
            match code {
                OPT_END => break,
                OPT_IF_TSRESOL if len == 1 => {
                    let v = value[0];
                    let exp = u32::from(v & 0x7f);
                    iface.units_per_sec = if v & 0x80 == 0 {
                        10u64.checked_pow(exp)
                    } else {
                        2u64.checked_pow(exp)
                    }
                    .ok_or_else(|| self.corrupt("if_tsresol beyond 64 bits"))?;
                }
                OPT_IF_TSOFFSET if len == 8 => iface.offset_secs = self.endian.i64(value, 0),
                _ => {}
            }
            at += 4 + len.next_multiple_of(4);
        }
        self.interfaces.push(iface);
        Ok(())
    }

    fn timestamp(&self, iface: &Interface, raw: u64) -> u64 {
        let ns = u128::from(raw) * 1_000_000_000 / u128::from(iface.units_per_sec.max(1));
        (ns as i128 + i128::from(iface.offset_secs) * 1_000_000_000).clamp(0, i128::from(u64::MAX))
            as u64
    }

    fn interface(&self, id: u32) -> Result<Interface, CaptureError> {
        self.interfaces
            .get(id as usize)
            .copied()
            .ok_or_else(|| self.corrupt("packet on an interface that was never described"))
    }

    /// Finds a packet in an enhanced or obsolete packet block body.
    fn timed_packet(&mut self, id: u32, ts_at: usize, len_at: usize) -> Result<(), CaptureError> {
        let b = &self.block;
        if b.len() < len_at + 8 {
            return Err(self.corrupt("packet block too short"));
        }
        let iface = self.interface(id)?;
        let raw =
            (u64::from(self.endian.u32(b, ts_at)) << 32) | u64::from(self.endian.u32(b, ts_at + 4));
        let caplen = self.endian.u32(b, len_at) as usize;
        let orig_len = self.endian.u32(b, len_at + 4);
        let start = len_at + 8;
        if b.len() < start + caplen {
            return Err(self.corrupt("packet data runs past its block"));
        }
        let ts = self.timestamp(&iface, raw);
        self.last_ts_ns = ts;
        self.found = (start, caplen, orig_len.max(caplen as u32), ts);
        Ok(())
    }

    /// Bytes of the file consumed so far.
    pub fn bytes_read(&self) -> u64 {
        self.at_byte
    }

    pub fn next_record(&mut self) -> Result<Option<Record<'_>>, CaptureError> {
        loop {
            let Some(block_type) = self.read_block()? else {
                return Ok(None);
            };
            match block_type {
                IDB => self.add_interface()?,
                EPB => {
                    let id = self.endian.u32(&self.block, 0);
                    self.timed_packet(id, 4, 12)?;
                    break;
                }
                OBSOLETE_PB => {
                    let id = u32::from(self.endian.u16(&self.block, 0));
                    self.timed_packet(id, 4, 12)?;
                    break;
                }
                SPB => {
                    let iface = self.interface(0)?;
                    if self.block.len() < 4 {
                        return Err(self.corrupt("simple packet block too short"));
                    }
                    let orig_len = self.endian.u32(&self.block, 0);
                    let snap = if iface.snaplen == 0 {
                        u32::MAX
                    } else {
                        iface.snaplen
                    };
                    let caplen = (orig_len.min(snap) as usize).min(self.block.len() - 4);
                    self.found = (4, caplen, orig_len, self.last_ts_ns);
                    break;
                }
                _ => {} // SHB handled in read_block; statistics, name resolution, custom: skipped
            }
        }
        let (start, len, orig_len, ts_ns) = self.found;
        Ok(Some(Record {
            ts_ns,
            data: &self.block[start..start + len],
            orig_len,
        }))
    }
}

/// Writes one section with one Ethernet interface at nanosecond resolution.
pub struct PcapngWriter<W: Write> {
    w: W,
}

impl<W: Write> PcapngWriter<W> {
    pub fn new(mut w: W) -> io::Result<Self> {
        // Section header: type, length 28, byte-order magic, version 1.0, section length -1.
        let mut shb = Vec::with_capacity(28);
        shb.extend_from_slice(&SHB.to_le_bytes());
        shb.extend_from_slice(&28u32.to_le_bytes());
        shb.extend_from_slice(&BYTE_ORDER_MAGIC.to_le_bytes());
        shb.extend_from_slice(&1u16.to_le_bytes());
        shb.extend_from_slice(&0u16.to_le_bytes());
        shb.extend_from_slice(&(-1i64).to_le_bytes());
        shb.extend_from_slice(&28u32.to_le_bytes());
        w.write_all(&shb)?;
        // Interface: Ethernet, snaplen, if_tsresol = 9 (nanoseconds), end of options.
        let mut idb = Vec::with_capacity(32);
        idb.extend_from_slice(&IDB.to_le_bytes());
        idb.extend_from_slice(&32u32.to_le_bytes());
        idb.extend_from_slice(&(LINKTYPE_ETHERNET as u16).to_le_bytes());
        idb.extend_from_slice(&0u16.to_le_bytes());
        idb.extend_from_slice(&crate::pcap::SNAPLEN.to_le_bytes());
        idb.extend_from_slice(&OPT_IF_TSRESOL.to_le_bytes());
        idb.extend_from_slice(&1u16.to_le_bytes());
        idb.extend_from_slice(&[9, 0, 0, 0]);
        idb.extend_from_slice(&[0, 0, 0, 0]);
        idb.extend_from_slice(&32u32.to_le_bytes());
        w.write_all(&idb)?;
        Ok(PcapngWriter { w })
    }

    pub fn write(&mut self, ts_ns: u64, data: &[u8], orig_len: u32) -> io::Result<()> {
        let padded = data.len().next_multiple_of(4);
        let total = (32 + padded) as u32;
        let mut h = [0u8; 28];
        h[0..4].copy_from_slice(&EPB.to_le_bytes());
        h[4..8].copy_from_slice(&total.to_le_bytes());
        h[8..12].copy_from_slice(&0u32.to_le_bytes());
        h[12..16].copy_from_slice(&((ts_ns >> 32) as u32).to_le_bytes());
        h[16..20].copy_from_slice(&(ts_ns as u32).to_le_bytes());
        h[20..24].copy_from_slice(&(data.len() as u32).to_le_bytes());
        h[24..28].copy_from_slice(&orig_len.max(data.len() as u32).to_le_bytes());
        self.w.write_all(&h)?;
        self.w.write_all(data)?;
        self.w.write_all(&[0u8; 3][..padded - data.len()])?;
        self.w.write_all(&total.to_le_bytes())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }

    pub fn into_inner(self) -> W {
        self.w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read(bytes: &[u8]) -> Result<Vec<(u64, Vec<u8>, u32)>, CaptureError> {
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&bytes[..4]);
        let mut r = PcapngReader::after_magic(&bytes[4..], magic)?;
        let mut out = Vec::new();
        while let Some(rec) = r.next_record()? {
            out.push((rec.ts_ns, rec.data.to_vec(), rec.orig_len));
        }
        Ok(out)
    }

    #[test]
    fn round_trip_nanoseconds() {
        let mut w = PcapngWriter::new(Vec::new()).unwrap();
        let pkts = [
            (1_700_000_000_123_456_789u64, vec![1u8; 61]),
            (1_700_000_000_123_456_790, vec![2u8; 64]),
        ];
        for (ts, d) in &pkts {
            w.write(*ts, d, d.len() as u32 + 4).unwrap();
        }
        let got = read(&w.into_inner()).unwrap();
        assert_eq!(got.len(), 2);
        for ((ts, d, orig), (wts, wd)) in got.iter().zip(&pkts) {
            assert_eq!((ts, d, *orig), (wts, wd, wd.len() as u32 + 4));
        }
    }

    #[test]
    fn non_ethernet_interface_is_refused() {
        let mut bytes = PcapngWriter::new(Vec::new()).unwrap().into_inner();
        bytes[28 + 8] = 113; // the IDB's link type
        let err = read(&bytes).err().unwrap();
        assert!(err.to_string().contains("113 (LINUX_SLL"), "{err}");
    }

    #[test]
    fn a_second_section_restarts_interfaces() {
        let mut one = PcapngWriter::new(Vec::new()).unwrap();
        one.write(5, &[1; 20], 20).unwrap();
        let mut bytes = one.into_inner();
        let mut two = PcapngWriter::new(Vec::new()).unwrap();
        two.write(7, &[2; 20], 20).unwrap();
        bytes.extend_from_slice(&two.into_inner());
        let got = read(&bytes).unwrap();
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [5, 7]);
    }

    #[test]
    fn cut_files_never_panic() {
        let mut w = PcapngWriter::new(Vec::new()).unwrap();
        for i in 0..3u8 {
            w.write(u64::from(i), &[i; 30], 30).unwrap();
        }
        let bytes = w.into_inner();
        for cut in 4..bytes.len() {
            if let Ok(got) = read(&bytes[..cut]) {
                assert!(got.len() < 3);
            }
        }
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let mut framed = PcapngWriter::new(Vec::new()).unwrap().into_inner();
            framed.extend_from_slice(&bytes);
            let _ = read(&framed);
        }
    }
}
