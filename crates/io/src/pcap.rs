//! Classic pcap files: a 24-byte file header, then a 16-byte header per record.
//! Both byte orders and both timestamp resolutions (micro 0xa1b2c3d4, nano 0xa1b23c4d).

use crate::capture::{
    CaptureError, Endian, LINKTYPE_ETHERNET, MAX_RECORD_LEN, Record, partial_record, read_chunk_at,
    read_full,
};
use crate::link::LinkType;
use stateplane_runtime::{ChunkedFile, FileRecord, SeenAt};
use std::fs::File;
use std::io::{self, BufRead, Write};

const MAGIC_MICRO: u32 = 0xa1b2_c3d4;
const MAGIC_NANO: u32 = 0xa1b2_3c4d;
const FILE_HEADER_LEN: usize = 24;
const RECORD_HEADER_LEN: usize = 16;

/// Reads records in place from `r`'s buffer when a whole one is there (nearly always with
/// a large buffer), and through a copy only when one straddles the buffer's end.
pub struct PcapReader<R: BufRead> {
    r: R,
    format: Format,
    /// A record that straddled the end of `r`'s buffer.
    buf: Vec<u8>,
    /// Bytes of `r`'s buffer lent out as the last record: consumed at the next read.
    lent: usize,
    at_byte: u64,
}

/// What a file header says about its records: their byte order, timestamp resolution and
/// link type.
#[derive(Debug, Clone, Copy)]
struct Format {
    endian: Endian,
    nanos: bool,
    link: LinkType,
}

/// A record header's fields, checked.
struct RecordHeader {
    ts_ns: u64,
    caplen: usize,
    orig_len: u32,
}

impl Format {
    /// Reads the rest of the file header, after the caller has read its 4-byte magic number.
    fn after_magic(r: &mut impl io::Read, magic: [u8; 4]) -> Result<Format, CaptureError> {
        let (endian, nanos) = match (
            Endian::of(magic, MAGIC_MICRO),
            Endian::of(magic, MAGIC_NANO),
        ) {
            (Some(e), _) => (e, false),
            (_, Some(e)) => (e, true),
            _ => {
                return Err(CaptureError::NotACapture {
                    magic: u32::from_be_bytes(magic),
                });
            }
        };
        let mut rest = [0u8; FILE_HEADER_LEN - 4];
        let got = read_full(r, &mut rest)?;
        if got < rest.len() {
            return Err(CaptureError::Truncated {
                at_byte: 4 + got as u64,
            });
        }
        // The link type's upper 16 bits may carry FCS information (pcap-linktype(7)).
        let linktype = endian.u32(&rest, 16) & 0xffff;
        let link = LinkType::of(linktype).ok_or(CaptureError::UnsupportedLinkType { linktype })?;
        Ok(Format {
            endian,
            nanos,
            link,
        })
    }

    /// The record header `header`, which lies at `at_byte` in the file, checked.
    fn check(
        self,
        header: &[u8; RECORD_HEADER_LEN],
        at_byte: u64,
    ) -> Result<RecordHeader, CaptureError> {
        let secs = u64::from(self.endian.u32(header, 0));
        let frac = u64::from(self.endian.u32(header, 4));
        let caplen = self.endian.u32(header, 8);
        let orig_len = self.endian.u32(header, 12);
        if caplen > MAX_RECORD_LEN {
            return Err(CaptureError::Corrupt {
                at_byte,
                what: "a record claims more than 256 KiB of data",
            });
        }
        // A fraction of a second or more (written by a broken clock or tool) is read as the
        // fields say, its whole seconds carried over, as tcpdump and Wireshark read it: the
        // packet is there whatever its time (and no sum here reaches 2^64).
        Ok(RecordHeader {
            ts_ns: secs * 1_000_000_000 + if self.nanos { frac } else { frac * 1000 },
            caplen: caplen as usize,
            orig_len: orig_len.max(caplen),
        })
    }

    /// The record at the start of `bytes`, which lie at `at_byte` in the file, and its
    /// length in the file; `None` when `bytes` hold less than all of it.
    fn record(
        self,
        bytes: &[u8],
        at_byte: u64,
    ) -> Result<Option<(Record<'_>, usize)>, CaptureError> {
        let Some(header) = bytes.first_chunk() else {
            return Ok(None);
        };
        let h = self.check(header, at_byte)?;
        let len = RECORD_HEADER_LEN + h.caplen;
        Ok(bytes.get(RECORD_HEADER_LEN..len).map(|data| {
            let record = Record {
                ts_ns: h.ts_ns,
                data,
                orig_len: h.orig_len,
                link: self.link,
                seen: SeenAt::default(),
            };
            (record, len)
        }))
    }
}

impl<R: BufRead> PcapReader<R> {
    pub fn new(mut r: R) -> Result<Self, CaptureError> {
        let mut magic = [0u8; 4];
        if read_full(&mut r, &mut magic)? < 4 {
            return Err(CaptureError::Truncated { at_byte: 0 });
        }
        Self::after_magic(r, magic)
    }

    /// Continues after the caller has read the 4-byte magic number.
    pub fn after_magic(mut r: R, magic: [u8; 4]) -> Result<Self, CaptureError> {
        Ok(PcapReader {
            format: Format::after_magic(&mut r, magic)?,
            r,
            buf: Vec::new(),
            lent: 0,
            at_byte: FILE_HEADER_LEN as u64,
        })
    }

    /// Bytes of the file consumed so far.
    pub fn bytes_read(&self) -> u64 {
        self.at_byte
    }

    /// Whether timestamps are in nanoseconds.
    pub fn is_nanosecond(&self) -> bool {
        self.format.nanos
    }

    pub fn next_record(&mut self) -> Result<Option<Record<'_>>, CaptureError> {
        self.r.consume(std::mem::take(&mut self.lent));
        // Peek: when the header and its data are both buffered, lend them as they lie.
        let buffered = self.r.fill_buf()?;
        if buffered.is_empty() {
            return Ok(None);
        }
        if let Some((record, len)) = self.format.record(buffered, self.at_byte)? {
            let (ts_ns, orig_len) = (record.ts_ns, record.orig_len);
            self.lent = len;
            self.at_byte += len as u64;
            // The same bytes again: `fill_buf` reads nothing while some are buffered.
            let data = (self.r.fill_buf()?.get(RECORD_HEADER_LEN..len))
                .ok_or_else(|| io::Error::other("the reader's buffer shrank unread"))?;
            return Ok(Some(Record {
                ts_ns,
                data,
                orig_len,
                link: self.format.link,
                seen: SeenAt::default(),
            }));
        }
        let mut header = [0u8; RECORD_HEADER_LEN];
        if read_full(&mut self.r, &mut header)? < RECORD_HEADER_LEN {
            return Err(CaptureError::Truncated {
                at_byte: self.at_byte,
            });
        }
        let h = self.format.check(&header, self.at_byte)?;
        self.buf.resize(h.caplen, 0);
        if read_full(&mut self.r, &mut self.buf)? < h.caplen {
            return Err(CaptureError::Truncated {
                at_byte: self.at_byte,
            });
        }
        self.at_byte += (RECORD_HEADER_LEN + h.caplen) as u64;
        Ok(Some(Record {
            ts_ns: h.ts_ns,
            data: &self.buf,
            orig_len: h.orig_len,
            link: self.format.link,
            seen: SeenAt::default(),
        }))
    }
}

/// A classic pcap file read in chunks by several threads at once (see [`ChunkedFile`]).
pub struct PcapFile {
    name: String,
    file: File,
    format: Format,
}

impl PcapFile {
    /// Opens `file`, named `name`, whose magic (already read) is not pcapng's, for chunked
    /// reading; its file header is checked here. `None` for a link type other than
    /// Ethernet: chunks lend frames as they lie in the file, so such a capture is read as
    /// a stream, through [`crate::capture::CaptureReader`].
    pub fn after_magic(
        mut file: File,
        magic: [u8; 4],
        name: String,
    ) -> Result<Option<Self>, CaptureError> {
        let format = Format::after_magic(&mut file, magic)?;
        Ok((format.link == LinkType::Ethernet).then_some(PcapFile { name, file, format }))
    }
}

impl ChunkedFile for PcapFile {
    /// Every record of a classic pcap file reads alike (the file header said how).
    type Context = ();

    fn name(&self) -> &str {
        &self.name
    }

    fn first_record(&self) -> (u64, ()) {
        (FILE_HEADER_LEN as u64, ())
    }

    fn max_record_len(&self) -> usize {
        RECORD_HEADER_LEN + MAX_RECORD_LEN as usize
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        read_chunk_at(&self.file, offset, buf)
    }

    fn record<'a>(
        &self,
        bytes: &'a [u8],
        at_byte: u64,
        at_end: bool,
        _: &mut (),
    ) -> io::Result<Option<FileRecord<'a>>> {
        match self.format.record(bytes, at_byte)? {
            Some((r, len)) => Ok(Some(FileRecord {
                packet: Some(r.into()),
                len,
            })),
            None => partial_record(bytes, at_byte, at_end),
        }
    }
}

pub struct PcapWriter<W: Write> {
    w: W,
    nanos: bool,
}

/// The snap length written in headers: what the file may hold per record.
pub const SNAPLEN: u32 = 262_144;

impl<W: Write> PcapWriter<W> {
    pub fn new(mut w: W, nanos: bool) -> io::Result<Self> {
        let mut h = [0u8; FILE_HEADER_LEN];
        h[0..4].copy_from_slice(&(if nanos { MAGIC_NANO } else { MAGIC_MICRO }).to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        h[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        w.write_all(&h)?;
        Ok(PcapWriter { w, nanos })
    }

    pub fn write(&mut self, ts_ns: u64, data: &[u8], orig_len: u32) -> io::Result<()> {
        let secs = ts_ns / 1_000_000_000;
        let sub = ts_ns % 1_000_000_000;
        let frac = if self.nanos { sub } else { sub / 1000 };
        let secs = u32::try_from(secs)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "timestamp beyond 2106"))?;
        let mut h = [0u8; RECORD_HEADER_LEN];
        h[0..4].copy_from_slice(&secs.to_le_bytes());
        h[4..8].copy_from_slice(&(frac as u32).to_le_bytes());
        h[8..12].copy_from_slice(&(data.len() as u32).to_le_bytes());
        h[12..16].copy_from_slice(&orig_len.max(data.len() as u32).to_le_bytes());
        self.w.write_all(&h)?;
        self.w.write_all(data)
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

    fn packets() -> Vec<(u64, Vec<u8>)> {
        vec![
            (1_700_000_000_123_456_789, vec![1; 60]),
            (1_700_000_001_000_000_001, vec![2; 1514]),
            (1_700_000_002_999_999_999, vec![3; 14]),
        ]
    }

    #[test]
    fn round_trip_both_resolutions() {
        for nanos in [false, true] {
            let mut w = PcapWriter::new(Vec::new(), nanos).unwrap();
            for (ts, d) in packets() {
                w.write(ts, &d, d.len() as u32).unwrap();
            }
            let bytes = w.into_inner();
            let mut r = PcapReader::new(&bytes[..]).unwrap();
            assert_eq!(r.is_nanosecond(), nanos);
            for (ts, d) in packets() {
                let rec = r.next_record().unwrap().unwrap();
                let want = if nanos { ts } else { ts / 1000 * 1000 };
                assert_eq!((rec.ts_ns, rec.data), (want, &d[..]));
            }
            assert!(r.next_record().unwrap().is_none());
        }
    }

    #[test]
    fn records_straddling_the_buffer_read_the_same_as_records_in_it() {
        let mut w = PcapWriter::new(Vec::new(), true).unwrap();
        for (ts, d) in packets().into_iter().cycle().take(12) {
            w.write(ts, &d, d.len() as u32).unwrap();
        }
        let bytes = w.into_inner();
        let read_all =
            |capacity| crate::capture::chunked_vs_streamed::through_buffer(&bytes, capacity);
        let in_place = read_all(bytes.len());
        assert_eq!(in_place.len(), 12);
        assert_eq!(in_place.last().unwrap().2, bytes.len() as u64);
        // Buffers smaller than a header, than a record, and cutting records anywhere.
        for capacity in [1, 7, 16, 17, 75, 76, 77, 1000, 1531, 4096] {
            assert_eq!(read_all(capacity), in_place, "buffer of {capacity} bytes");
        }
    }

    #[test]
    fn big_endian_files_are_read() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&MAGIC_MICRO.to_be_bytes());
        bytes.extend_from_slice(&[
            0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 1,
        ]);
        bytes.extend_from_slice(&[0, 0, 0, 5, 0, 0, 0, 7, 0, 0, 0, 2, 0, 0, 0, 9, 0xaa, 0xbb]);
        let mut r = PcapReader::new(&bytes[..]).unwrap();
        let rec = r.next_record().unwrap().unwrap();
        assert_eq!(
            (rec.ts_ns, rec.data, rec.orig_len),
            (5_000_007_000, &[0xaa, 0xbb][..], 9)
        );
    }

    #[test]
    fn other_link_types_are_refused_by_name() {
        let mut w = PcapWriter::new(Vec::new(), false).unwrap().into_inner();
        w[20..24].copy_from_slice(&105u32.to_le_bytes());
        let err = PcapReader::new(&w[..]).err().unwrap();
        assert!(err.to_string().contains("105 (IEEE802_11"), "{err}");
    }

    /// A fraction of a second or more, as a broken clock writes it: the packet is read,
    /// its time the fields' sum, in either resolution and at the fields' maxima.
    #[test]
    fn a_fraction_past_a_second_is_carried_into_the_seconds() {
        for (nanos, unit) in [(false, 1000), (true, 1)] {
            let mut w = PcapWriter::new(Vec::new(), nanos).unwrap();
            w.write(5_000_000_000, &[1, 2, 3], 3).unwrap();
            w.write(6_000_000_000, &[4, 5], 2).unwrap();
            let mut bytes = w.into_inner();
            // The first record's fraction 1,000,000 units, the second's and its seconds all ones.
            bytes[24 + 4..24 + 8].copy_from_slice(&1_000_000u32.to_le_bytes());
            bytes[43..51].copy_from_slice(&[0xff; 8]);
            let mut r = PcapReader::new(&bytes[..]).unwrap();
            let first = r.next_record().unwrap().unwrap().ts_ns;
            assert_eq!(first, 5_000_000_000 + 1_000_000 * unit, "nanos {nanos}");
            let last = r.next_record().unwrap().unwrap().ts_ns;
            assert_eq!(last, u64::from(u32::MAX) * (1_000_000_000 + unit));
            assert_eq!(r.next_record().unwrap(), None);
        }
    }

    #[test]
    fn cut_files_say_truncated_never_panic() {
        let mut w = PcapWriter::new(Vec::new(), true).unwrap();
        for (ts, d) in packets() {
            w.write(ts, &d, d.len() as u32).unwrap();
        }
        let bytes = w.into_inner();
        for cut in 0..bytes.len() {
            let result = PcapReader::new(&bytes[..cut]).and_then(|mut r| {
                let mut n = 0;
                while r.next_record()?.is_some() {
                    n += 1;
                }
                Ok(n)
            });
            match result {
                Ok(n) => assert!(
                    n < 3 && [24, 24 + 76, 24 + 76 + 1530].contains(&cut),
                    "cut {cut} read {n}"
                ),
                Err(e) => assert!(
                    matches!(e, CaptureError::Truncated { .. }),
                    "cut {cut}: {e}"
                ),
            }
        }
    }

    /// Chunked reading walks a file (whole or cut anywhere) to the records, the end or the
    /// error of streamed reading, the error at the same byte.
    #[test]
    fn chunked_reading_meets_what_streamed_reading_meets() {
        let mut w = PcapWriter::new(Vec::new(), true).unwrap();
        for (ts, d) in packets() {
            w.write(ts, &d, d.len() as u32).unwrap();
        }
        crate::capture::chunked_vs_streamed::assert_same_at_every_cut(&w.into_inner());
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut framed = MAGIC_NANO.to_le_bytes().to_vec();
            framed.extend_from_slice(&bytes);
            if let Ok(mut r) = PcapReader::new(&framed[..]) {
                for _ in 0..20 {
                    if !matches!(r.next_record(), Ok(Some(_))) { break; }
                }
            }
        }
    }
}
