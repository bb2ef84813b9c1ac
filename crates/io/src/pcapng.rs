//! pcapng files (draft-ietf-opsawg-pcapng): sections, interfaces with their own link type
//! and timestamp resolution, and the packet blocks (enhanced, simple, obsolete). Other
//! blocks are skipped. Interfaces of a link type [`LinkType`] does not take are refused
//! when described.
//!
//! A block's meaning depends on the blocks before it (the section's byte order, the
//! interfaces it has described, the last timestamp for simple packet blocks): that is a
//! [`Section`], which the streaming [`PcapngReader`] keeps as it goes, and which
//! [`PcapngFile`] hands from each chunk to the next, so that several workers can read one
//! file in chunks. Both read every block through [`Section::read`].

use crate::capture::{
    CaptureError, Endian, LINKTYPE_ETHERNET, MAX_RECORD_LEN, Record, partial_record, read_chunk_at,
    read_full,
};
use crate::link::LinkType;
use stateplane_runtime::{ChunkedFile, FileRecord, RxPacket, SeenAt};
use std::fs::File;
use std::io::{self, BufRead, Write};

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
/// The smallest block (type, length, trailing length), which is also as much of any block
/// as says how long it is: a section header's byte order follows its length.
const BLOCK_HEAD_LEN: usize = 12;

pub fn is_magic(magic: [u8; 4]) -> bool {
    u32::from_le_bytes(magic) == SHB
}

#[derive(Clone, Copy, Debug)]
struct Interface {
    /// Timestamp units per second.
    units_per_sec: u64,
    /// Seconds added to every timestamp.
    offset_secs: i64,
    /// Nanoseconds per unit where that is a whole number and there is no offset (the
    /// common case: micro- or nanoseconds), else 0.
    ns_per_unit: u64,
    snaplen: u32,
    link: LinkType,
}

impl Interface {
    fn new(link: LinkType, snaplen: u32, units_per_sec: u64, offset_secs: i64) -> Interface {
        let per_unit = 1_000_000_000u64.checked_div(units_per_sec);
        let whole = per_unit.filter(|&p| p * units_per_sec == 1_000_000_000);
        Interface {
            units_per_sec,
            offset_secs,
            ns_per_unit: whole.filter(|_| offset_secs == 0).unwrap_or(0),
            snaplen,
            link,
        }
    }

    /// A raw timestamp in nanoseconds since the epoch (0 before it, the most a u64 holds
    /// past it).
    fn ns(&self, raw: u64) -> u64 {
        // The common case in one multiplication, where the general one divides 128-bit
        // numbers (a library call per packet).
        if self.ns_per_unit != 0
            && let Some(ns) = raw.checked_mul(self.ns_per_unit)
        {
            return ns;
        }
        let ns = u128::from(raw) * 1_000_000_000 / u128::from(self.units_per_sec.max(1));
        (ns as i128 + i128::from(self.offset_secs) * 1_000_000_000).clamp(0, i128::from(u64::MAX))
            as u64
    }
}

/// What the blocks before a point of a pcapng file say about the blocks after it.
#[derive(Clone, Debug)]
pub struct Section {
    endian: Endian,
    interfaces: Vec<Interface>,
    /// Simple packet blocks carry no timestamp: they get the last one seen.
    last_ts_ns: u64,
}

impl Default for Section {
    /// Before the file's first block, which is a section header and says the byte order.
    fn default() -> Self {
        Section {
            endian: Endian::Little,
            interfaces: Vec::new(),
            last_ts_ns: 0,
        }
    }
}

/// A packet in a block: where its data starts in the block, its lengths, its time and its
/// interface's link type.
struct Found {
    start: usize,
    caplen: usize,
    orig_len: u32,
    ts_ns: u64,
    link: LinkType,
}

/// The length of the block that starts with `head` (at `at_byte` in the file), checked,
/// and the byte order it is written in: a section header's own, which it declares, any
/// other block's the section's, `endian`.
fn block_len(
    head: &[u8; BLOCK_HEAD_LEN],
    endian: Endian,
    at_byte: u64,
) -> Result<(usize, Endian), CaptureError> {
    let corrupt = |what| CaptureError::Corrupt { at_byte, what };
    let (endian, least, what) = if is_magic([head[0], head[1], head[2], head[3]]) {
        let magic = [head[8], head[9], head[10], head[11]];
        let endian = Endian::of(magic, BYTE_ORDER_MAGIC)
            .ok_or_else(|| corrupt("section header with an unknown byte-order magic"))?;
        (endian, 28, "section header block with an impossible length")
    } else {
        (endian, 12, "block with an impossible length")
    };
    let total = endian.u32(head, 4);
    if !(least..=MAX_BLOCK_LEN).contains(&total) || !total.is_multiple_of(4) {
        return Err(corrupt(what));
    }
    Ok((total as usize, endian))
}

impl Section {
    /// Reads the whole block `block`, whose length and byte order `endian` [`block_len`]
    /// found, and which lies at `at_byte` in the file: a section header starts a new
    /// section, an interface description adds an interface, and a packet block's packet is
    /// returned. Other blocks (statistics, name resolution, custom) are skipped.
    fn read(
        &mut self,
        block: &[u8],
        endian: Endian,
        at_byte: u64,
    ) -> Result<Option<Found>, CaptureError> {
        let corrupt = |what| CaptureError::Corrupt { at_byte, what };
        let total = block.len();
        if block.first_chunk().is_some_and(|magic| is_magic(*magic)) {
            // A section header: its own byte order, and no interfaces yet.
            self.endian = endian;
            self.interfaces.clear();
        }
        if self.endian.u32(block, total - 4) as usize != total {
            return Err(corrupt(
                "block whose trailing length differs from its leading length",
            ));
        }
        let body = &block[8..total - 4];
        let found = match self.endian.u32(block, 0) {
            IDB => return self.add_interface(body, at_byte).map(|()| None),
            EPB => self.timed_packet(body, |b| self.endian.u32(b, 0), at_byte)?,
            OBSOLETE_PB => self.timed_packet(body, |b| self.endian.u16(b, 0).into(), at_byte)?,
            SPB => self.simple_packet(body, at_byte)?,
            _ => return Ok(None),
        };
        self.last_ts_ns = found.ts_ns;
        Ok(Some(Found {
            start: 8 + found.start,
            ..found
        }))
    }

    fn add_interface(&mut self, b: &[u8], at_byte: u64) -> Result<(), CaptureError> {
        let corrupt = |what| CaptureError::Corrupt { at_byte, what };
        if b.len() < 8 {
            return Err(corrupt("interface description block too short"));
        }
        let linktype = u32::from(self.endian.u16(b, 0));
        let link = LinkType::of(linktype).ok_or(CaptureError::UnsupportedLinkType { linktype })?;
        let (mut units_per_sec, mut offset_secs) = (1_000_000, 0);
        let mut at = 8;
        while at + 4 <= b.len() {
            let code = self.endian.u16(b, at);
            let len = usize::from(self.endian.u16(b, at + 2));
            let value = (b.get(at + 4..at + 4 + len))
                .ok_or_else(|| corrupt("option runs past its block"))?;
            match code {
                OPT_END => break,
                OPT_IF_TSRESOL if len == 1 => {
                    let v = value[0];
                    let exp = u32::from(v & 0x7f);
                    units_per_sec = if v & 0x80 == 0 {
                        10u64.checked_pow(exp)
                    } else {
                        2u64.checked_pow(exp)
                    }
                    .ok_or_else(|| corrupt("if_tsresol beyond 64 bits"))?;
                }
                OPT_IF_TSOFFSET if len == 8 => offset_secs = self.endian.i64(value, 0),
                _ => {}
            }
            at += 4 + len.next_multiple_of(4);
        }
        let snaplen = self.endian.u32(b, 4);
        (self.interfaces).push(Interface::new(link, snaplen, units_per_sec, offset_secs));
        Ok(())
    }

    fn interface(&self, id: u32, at_byte: u64) -> Result<&Interface, CaptureError> {
        (self.interfaces.get(id as usize)).ok_or(CaptureError::Corrupt {
            at_byte,
            what: "packet on an interface that was never described",
        })
    }

    /// The packet of an enhanced or obsolete packet block's body `b`, whose interface id
    /// `id` reads (the two lay out the rest alike).
    fn timed_packet(
        &self,
        b: &[u8],
        id: impl Fn(&[u8]) -> u32,
        at_byte: u64,
    ) -> Result<Found, CaptureError> {
        let corrupt = |what| CaptureError::Corrupt { at_byte, what };
        const DATA_AT: usize = 20;
        if b.len() < DATA_AT {
            return Err(corrupt("packet block too short"));
        }
        let iface = self.interface(id(b), at_byte)?;
        let raw = (u64::from(self.endian.u32(b, 4)) << 32) | u64::from(self.endian.u32(b, 8));
        let caplen = self.endian.u32(b, 12) as usize;
        let orig_len = self.endian.u32(b, 16);
        if b.len() < DATA_AT + caplen {
            return Err(corrupt("packet data runs past its block"));
        }
        let ts_ns = iface.ns(raw);
        Ok(Found {
            start: DATA_AT,
            caplen,
            orig_len: orig_len.max(caplen as u32),
            ts_ns,
            link: iface.link,
        })
    }

    /// The packet of a simple packet block's body `b`: on interface 0, at the last time.
    fn simple_packet(&self, b: &[u8], at_byte: u64) -> Result<Found, CaptureError> {
        let iface = self.interface(0, at_byte)?;
        if b.len() < 4 {
            return Err(CaptureError::Corrupt {
                at_byte,
                what: "simple packet block too short",
            });
        }
        let orig_len = self.endian.u32(b, 0);
        let snap = if iface.snaplen == 0 {
            u32::MAX
        } else {
            iface.snaplen
        };
        Ok(Found {
            start: 4,
            caplen: (orig_len.min(snap) as usize).min(b.len() - 4),
            orig_len,
            ts_ns: self.last_ts_ns,
            link: iface.link,
        })
    }
}

/// Reads a pcapng stream block by block: in place from `r`'s buffer when a whole block is
/// there (nearly always with a large buffer), through a copy only when one straddles the
/// buffer's end.
pub struct PcapngReader<R: BufRead> {
    r: R,
    section: Section,
    /// A block that straddled the end of `r`'s buffer, whole.
    block: Vec<u8>,
    /// Bytes of `r`'s buffer lent out as the last packet: consumed at the next read.
    lent: usize,
    at_byte: u64,
}

impl<R: BufRead> PcapngReader<R> {
    /// Continues after the caller has read the section header block's type (the magic).
    pub fn after_magic(r: R, magic: [u8; 4]) -> Result<Self, CaptureError> {
        if !is_magic(magic) {
            return Err(CaptureError::NotACapture {
                magic: u32::from_be_bytes(magic),
            });
        }
        let mut reader = PcapngReader {
            r,
            section: Section::default(),
            block: magic.to_vec(),
            lent: 0,
            at_byte: 0,
        };
        let Some(endian) = reader.read_block(magic.len())? else {
            return Err(CaptureError::Truncated { at_byte: 0 });
        };
        reader.section.read(&reader.block, endian, 0)?;
        reader.at_byte = reader.block.len() as u64;
        reader.read_leading_interfaces()?;
        Ok(reader)
    }

    /// Reads the interface descriptions that follow the section header at once (where
    /// every writer puts them), so that an interface of a link type this reader refuses is
    /// refused as the file opens, before a run starts. Stops at the first other block, or
    /// at one not yet buffered whole: the next record reads it.
    fn read_leading_interfaces(&mut self) -> Result<(), CaptureError> {
        loop {
            let buffered = self.r.fill_buf()?;
            let Some(head) = buffered.first_chunk() else {
                return Ok(());
            };
            if self.section.endian.u32(head, 0) != IDB {
                return Ok(());
            }
            let (len, endian) = block_len(head, self.section.endian, self.at_byte)?;
            let Some(block) = buffered.get(..len) else {
                return Ok(());
            };
            self.section.read(block, endian, self.at_byte)?;
            self.at_byte += len as u64;
            self.r.consume(len);
        }
    }

    /// Reads the next block whole into `self.block`, whose first `have` bytes are there
    /// already: the byte order it is written in, or `None` at the stream's end.
    fn read_block(&mut self, have: usize) -> Result<Option<Endian>, CaptureError> {
        self.block.resize(BLOCK_HEAD_LEN, 0);
        let got = have + read_full(&mut self.r, &mut self.block[have..])?;
        if got == 0 {
            return Ok(None);
        }
        let truncated = CaptureError::Truncated {
            at_byte: self.at_byte,
        };
        let Some(head) = self.block.first_chunk().filter(|_| got == BLOCK_HEAD_LEN) else {
            return Err(truncated);
        };
        let (total, endian) = block_len(head, self.section.endian, self.at_byte)?;
        self.block.resize(total, 0);
        if read_full(&mut self.r, &mut self.block[BLOCK_HEAD_LEN..])? < total - BLOCK_HEAD_LEN {
            return Err(truncated);
        }
        Ok(Some(endian))
    }

    /// Bytes of the file consumed so far.
    pub fn bytes_read(&self) -> u64 {
        self.at_byte
    }

    pub fn next_record(&mut self) -> Result<Option<Record<'_>>, CaptureError> {
        self.r.consume(std::mem::take(&mut self.lent));
        let (found, in_place) = loop {
            let at_byte = self.at_byte;
            let buffered = self.r.fill_buf()?;
            if buffered.is_empty() {
                return Ok(None);
            }
            let whole = match buffered.first_chunk() {
                Some(head) => {
                    let (len, endian) = block_len(head, self.section.endian, at_byte)?;
                    buffered.get(..len).map(|block| (block, endian))
                }
                None => None,
            };
            if let Some((block, endian)) = whole {
                let (len, found) = (block.len(), self.section.read(block, endian, at_byte)?);
                self.at_byte += len as u64;
                match found {
                    Some(found) => {
                        self.lent = len;
                        break (found, true);
                    }
                    None => self.r.consume(len),
                }
            } else if let Some(endian) = self.read_block(0)? {
                self.at_byte += self.block.len() as u64;
                if let Some(found) = self.section.read(&self.block, endian, at_byte)? {
                    break (found, false);
                }
            }
        };
        let data = if in_place {
            // The same bytes again: `fill_buf` reads nothing while some are buffered.
            self.r.fill_buf()?
        } else {
            &self.block
        };
        let data = (data.get(found.start..found.start + found.caplen))
            .ok_or_else(|| io::Error::other("the reader's buffer shrank unread"))?;
        Ok(Some(Record {
            ts_ns: found.ts_ns,
            data,
            orig_len: found.orig_len,
            link: found.link,
            seen: SeenAt::default(),
        }))
    }
}

/// A pcapng file read in chunks by several threads at once (see [`ChunkedFile`]); the
/// context carried from chunk to chunk is the [`Section`].
pub struct PcapngFile {
    name: String,
    file: File,
}

impl PcapngFile {
    /// Opens `file`, named `name`, whose magic (already read) is pcapng's, for chunked
    /// reading; its section header is checked here, as the streaming reader does. `None`
    /// when an interface described at its start is not Ethernet: chunks lend frames as they
    /// lie in the file, so such a capture is read as a stream, through
    /// [`crate::capture::CaptureReader`].
    pub fn after_magic(
        mut file: File,
        magic: [u8; 4],
        name: String,
    ) -> Result<Option<Self>, CaptureError> {
        let reader = PcapngReader::after_magic(io::BufReader::new(&mut file), magic)?;
        let interfaces = reader.section.interfaces;
        let ethernet = interfaces.iter().all(|i| i.link == LinkType::Ethernet);
        Ok(ethernet.then_some(PcapngFile { name, file }))
    }
}

impl ChunkedFile for PcapngFile {
    type Context = Section;

    fn name(&self) -> &str {
        &self.name
    }

    fn first_record(&self) -> (u64, Section) {
        (0, Section::default())
    }

    fn max_record_len(&self) -> usize {
        MAX_BLOCK_LEN as usize
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        read_chunk_at(&self.file, offset, buf)
    }

    fn record<'a>(
        &self,
        bytes: &'a [u8],
        at_byte: u64,
        at_end: bool,
        section: &mut Section,
    ) -> io::Result<Option<FileRecord<'a>>> {
        let Some(head) = bytes.first_chunk() else {
            return partial_record(bytes, at_byte, at_end);
        };
        let (len, endian) = block_len(head, section.endian, at_byte)?;
        let Some(block) = bytes.get(..len) else {
            return partial_record(bytes, at_byte, at_end);
        };
        let found = section.read(block, endian, at_byte)?;
        if let Some(found) = found.as_ref().filter(|f| f.link != LinkType::Ethernet) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a packet at byte {at_byte} is on an interface of link type {} ({}), \
                     described after the file's start: chunks are read from Ethernet \
                     captures only; read it with --read-ahead on",
                    found.link.number(),
                    crate::link::linktype_name(found.link.number())
                ),
            ));
        }
        let packet = found.map(|found| RxPacket {
            data: &block[found.start..found.start + found.caplen],
            orig_len: found.orig_len,
            ts_ns: found.ts_ns,
            seen: SeenAt::default(),
        });
        Ok(Some(FileRecord { packet, len }))
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

    pub fn get_ref(&self) -> &W {
        &self.w
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
    fn an_interface_of_a_link_type_not_read_is_refused() {
        let mut bytes = PcapngWriter::new(Vec::new()).unwrap().into_inner();
        bytes[28 + 8] = 127; // the IDB's link type
        let err = read(&bytes).err().unwrap();
        assert!(
            err.to_string().contains("127 (IEEE802_11_RADIOTAP"),
            "{err}"
        );
        // As the file opens, before any record is asked for.
        let magic = [bytes[0], bytes[1], bytes[2], bytes[3]];
        let opened = PcapngReader::after_magic(&bytes[4..], magic);
        let err = opened.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("127 (IEEE802_11_RADIOTAP"), "{err}");
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

    /// Blocks in either byte order, padded, framed by their lengths.
    struct Blocks {
        big: bool,
        bytes: Vec<u8>,
    }

    impl Blocks {
        fn u16(&self, v: u16) -> [u8; 2] {
            if self.big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        }
        fn u32(&self, v: u32) -> [u8; 4] {
            if self.big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        }
        fn block(&mut self, block_type: u32, body: &[u8]) {
            let total = 12 + body.len().next_multiple_of(4) as u32;
            let head = [self.u32(block_type), self.u32(total)].concat();
            self.bytes.extend_from_slice(&head);
            self.bytes.extend_from_slice(body);
            self.bytes.resize(
                self.bytes.len() + body.len().next_multiple_of(4) - body.len(),
                0,
            );
            self.bytes.extend_from_slice(&self.u32(total));
        }
        fn section(&mut self, big: bool) {
            self.big = big;
            let body = [
                &self.u32(BYTE_ORDER_MAGIC)[..],
                &self.u16(1),
                &self.u16(0),
                &[0xff; 8],
            ];
            self.block(SHB, &body.concat());
        }
        /// An Ethernet interface, with its timestamp resolution option if given.
        fn interface(&mut self, snaplen: u32, tsresol: Option<u8>) {
            self.interface_offset(snaplen, tsresol, None);
        }
        /// An Ethernet interface with its resolution and offset options, where given.
        fn interface_offset(&mut self, snaplen: u32, tsresol: Option<u8>, offset: Option<i64>) {
            let mut body = [&self.u16(1)[..], &self.u16(0), &self.u32(snaplen)].concat();
            if let Some(r) = tsresol {
                body.extend_from_slice(
                    &[&self.u16(OPT_IF_TSRESOL)[..], &self.u16(1), &[r, 0, 0, 0]].concat(),
                );
            }
            if let Some(secs) = offset {
                let v = if self.big {
                    secs.to_be_bytes()
                } else {
                    secs.to_le_bytes()
                };
                body.extend_from_slice(
                    &[&self.u16(OPT_IF_TSOFFSET)[..], &self.u16(8), &v].concat(),
                );
            }
            if tsresol.is_some() || offset.is_some() {
                body.extend_from_slice(&[0; 4]);
            }
            self.block(IDB, &body);
        }
        fn enhanced(&mut self, iface: u32, raw_ts: u64, data: &[u8], orig_len: u32) {
            let head = [
                self.u32(iface),
                self.u32((raw_ts >> 32) as u32),
                self.u32(raw_ts as u32),
                self.u32(data.len() as u32),
                self.u32(orig_len),
            ];
            self.block(EPB, &[&head.concat()[..], data].concat());
        }
        fn obsolete(&mut self, iface: u16, raw_ts: u64, data: &[u8]) {
            let head = [
                &self.u16(iface)[..],
                &self.u16(0),
                &self.u32((raw_ts >> 32) as u32),
                &self.u32(raw_ts as u32),
                &self.u32(data.len() as u32),
                &self.u32(data.len() as u32),
            ];
            self.block(OBSOLETE_PB, &[&head.concat()[..], data].concat());
        }
        fn simple(&mut self, data: &[u8], orig_len: u32) {
            self.block(SPB, &[&self.u32(orig_len)[..], data].concat());
        }
    }

    /// Two sections (little-endian, then big-endian), interfaces described mid-file with
    /// their own resolutions, every kind of packet block, and a block to skip.
    fn varied() -> Vec<u8> {
        let mut b = Blocks {
            big: false,
            bytes: Vec::new(),
        };
        b.section(false);
        b.interface(100, None); // microseconds
        b.enhanced(0, 1_000_001, &[1; 60], 60);
        b.simple(&[2; 80], 80); // the last timestamp
        b.block(0x0bad, &[9; 10]); // unknown: skipped
        b.interface(0, Some(9)); // nanoseconds
        b.enhanced(1, 5_000_000_007, &[3; 64], 1500);
        b.obsolete(0, 2_000_000, &[4; 42]);
        b.section(true);
        b.interface(0, Some(9));
        b.enhanced(0, 7, &[5; 50], 50);
        b.simple(&[6; 30], 30);
        b.bytes
    }

    #[test]
    fn sections_interfaces_and_every_packet_block_are_read() {
        let got = read(&varied()).unwrap();
        let want = [
            (1_000_001_000, vec![1; 60], 60),
            (1_000_001_000, vec![2; 80], 80),
            (5_000_000_007, vec![3; 64], 1500),
            (2_000_000_000, vec![4; 42], 42),
            (7, vec![5; 50], 50),
            (7, vec![6; 30], 30),
        ];
        assert_eq!(got, want);
    }

    /// Blocks are read in place from the stream's buffer when whole in it, through a copy
    /// when they straddle its end: the same packets either way, with buffers of any size.
    #[test]
    fn blocks_straddling_the_buffer_read_the_same_as_blocks_in_it() {
        let bytes = varied();
        let read_all =
            |capacity| crate::capture::chunked_vs_streamed::through_buffer(&bytes, capacity);
        let in_place = read_all(bytes.len());
        assert_eq!(in_place.len(), 6);
        assert_eq!(in_place.last().unwrap().2, bytes.len() as u64);
        for capacity in [1, 7, 11, 12, 13, 40, 100, 101, 1000] {
            assert_eq!(read_all(capacity), in_place, "buffer of {capacity} bytes");
        }
    }

    /// Chunked reading carries each chunk's section (byte order, interfaces, last time) to
    /// the next: whole or cut anywhere, in chunks of any size, the file reads as streamed.
    #[test]
    fn chunked_reading_meets_what_streamed_reading_meets() {
        crate::capture::chunked_vs_streamed::assert_same_at_every_cut(&varied());
    }

    /// Timestamps in any resolution (powers of ten and of two) and with an offset, each
    /// in nanoseconds since the epoch; none before it, and none past what a u64 holds.
    #[test]
    fn timestamps_of_every_resolution_and_offset() {
        let mut b = Blocks {
            big: false,
            bytes: Vec::new(),
        };
        b.section(false);
        b.interface_offset(0, Some(3), None); // milliseconds
        b.interface_offset(0, Some(0x80 | 10), Some(10)); // 1/1024 s, 10 s later
        b.interface_offset(0, Some(9), Some(-5)); // nanoseconds, 5 s earlier
        b.interface_offset(0, Some(9), Some(2)); // nanoseconds, 2 s later
        b.enhanced(0, 1_500, &[1; 20], 20);
        b.enhanced(1, 1_536, &[1; 20], 20);
        b.enhanced(2, 7, &[1; 20], 20);
        b.enhanced(3, u64::MAX, &[1; 20], 20);
        b.enhanced(0, u64::MAX / 10, &[1; 20], 20);
        let got: Vec<u64> = read(&b.bytes).unwrap().iter().map(|p| p.0).collect();
        let ms = u128::from(u64::MAX / 10) * 1_000_000;
        let want_last = u64::try_from(ms).unwrap_or(u64::MAX);
        assert_eq!(got, [1_500_000_000, 11_500_000_000, 0, u64::MAX, want_last]);
    }

    #[test]
    fn a_packet_block_too_short_for_its_fields_is_corrupt() {
        for block_type in [EPB, OBSOLETE_PB, SPB] {
            let mut b = Blocks {
                big: false,
                bytes: Vec::new(),
            };
            b.section(false);
            b.interface(0, None);
            b.block(block_type, &[]);
            let err = read(&b.bytes).unwrap_err().to_string();
            assert!(err.contains("too short"), "{err}");
        }
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let mut framed = PcapngWriter::new(Vec::new()).unwrap().into_inner();
            framed.extend_from_slice(&bytes);
            let _ = read(&framed);
        }

        /// Whatever follows a section header, chunks read it as the stream does.
        #[test]
        fn garbage_reads_the_same_in_chunks(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
        ) {
            use crate::capture::chunked_vs_streamed::{chunked, streamed};
            let mut framed = PcapngWriter::new(Vec::new()).unwrap().into_inner();
            framed.extend_from_slice(&bytes);
            let path = std::env::temp_dir().join(format!("garbage-{}.pcapng", std::process::id()));
            std::fs::write(&path, &framed).unwrap();
            let file = match crate::capture::ChunkedCapture::open(&path) {
                Ok(Some(crate::capture::ChunkedCapture::Pcapng(file))) => file,
                _ => panic!("a pcapng header opens as pcapng"),
            };
            prop_assert_eq!(chunked(&file, 64), streamed(&framed));
            std::fs::remove_file(&path).unwrap();
        }
    }
}
