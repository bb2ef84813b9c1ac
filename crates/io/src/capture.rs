//! The format-independent face of capture files: records, errors, and a reader and writer
//! that pick pcap or pcapng (from the file's magic number, or the output's extension).

use crate::{pcap, pcapng};
use stateplane_runtime::{RxPacket, RxPort, TxPort};
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// One packet read from a capture, borrowed until the next read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub ts_ns: u64,
    pub data: &'a [u8],
    pub orig_len: u32,
}

impl<'a> From<Record<'a>> for RxPacket<'a> {
    fn from(r: Record<'a>) -> Self {
        RxPacket {
            data: r.data,
            orig_len: r.orig_len,
            ts_ns: r.ts_ns,
        }
    }
}

/// Link type 1, the only one Stateplane reads.
pub const LINKTYPE_ETHERNET: u32 = 1;

/// The largest captured length a record may claim; more is a corrupt file, not a packet.
pub const MAX_RECORD_LEN: u32 = 256 * 1024;

/// Why a capture could not be read or written.
#[derive(Debug)]
pub enum CaptureError {
    Io(io::Error),
    /// The file is shorter than any capture's magic number (empty, or a stray file).
    TooShort {
        bytes: u64,
    },
    /// The file starts with neither a pcap nor a pcapng magic number.
    NotACapture {
        magic: u32,
    },
    /// The capture's link type is not Ethernet.
    UnsupportedLinkType {
        linktype: u32,
    },
    /// The file ends in the middle of a record or block (a capture cut short).
    Truncated {
        at_byte: u64,
    },
    /// A record or block header holds an impossible value.
    Corrupt {
        at_byte: u64,
        what: &'static str,
    },
}

/// The conventional name of a link type, for messages.
pub fn linktype_name(linktype: u32) -> &'static str {
    match linktype {
        0 => "NULL (BSD loopback)",
        1 => "ETHERNET",
        101 => "RAW (IP without a link header)",
        105 => "IEEE802_11 (Wi-Fi)",
        113 => "LINUX_SLL (Linux cooked capture, e.g. tcpdump -i any)",
        127 => "IEEE802_11_RADIOTAP",
        228 => "IPV4",
        229 => "IPV6",
        276 => "LINUX_SLL2 (Linux cooked capture v2, e.g. tcpdump -i any)",
        _ => "unknown",
    }
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaptureError::Io(e) => write!(f, "{e}"),
            CaptureError::TooShort { bytes } => write!(
                f,
                "only {bytes} bytes long, too short to be a pcap or pcapng file; give a capture written by tcpdump, tshark or `stateplane gen`"
            ),
            CaptureError::NotACapture { magic } => write!(
                f,
                "not a pcap or pcapng file (it starts with {magic:#010x}); give a capture written by tcpdump, tshark or `stateplane gen`"
            ),
            CaptureError::UnsupportedLinkType { linktype } => write!(
                f,
                "link type {linktype} ({}) is not supported: Stateplane reads Ethernet captures (link type 1) only; capture on an Ethernet interface rather than 'any'",
                linktype_name(*linktype)
            ),
            CaptureError::Truncated { at_byte } => {
                write!(
                    f,
                    "the capture ends in the middle of a record at byte {at_byte} (was it cut short while being written?)"
                )
            }
            CaptureError::Corrupt { at_byte, what } => {
                write!(f, "corrupt capture at byte {at_byte}: {what}")
            }
        }
    }
}

impl std::error::Error for CaptureError {}

impl From<io::Error> for CaptureError {
    fn from(e: io::Error) -> Self {
        CaptureError::Io(e)
    }
}

impl From<CaptureError> for io::Error {
    fn from(e: CaptureError) -> Self {
        match e {
            CaptureError::Io(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
        }
    }
}

/// The byte order of a capture's header fields, learnt once from its magic number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endian {
    Little,
    Big,
}

impl Endian {
    /// The order in which the four `stored` bytes read as `magic`, if either does.
    pub fn of(stored: [u8; 4], magic: u32) -> Option<Endian> {
        if u32::from_le_bytes(stored) == magic {
            Some(Endian::Little)
        } else if u32::from_be_bytes(stored) == magic {
            Some(Endian::Big)
        } else {
            None
        }
    }

    /// The `N` bytes at `at`, as stored (the caller checked the length).
    fn bytes<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
        let mut v = [0u8; N];
        v.copy_from_slice(&b[at..at + N]);
        v
    }

    // One load and at most one byte swap per field (reversing the bytes first cost a
    // loop per field on the per-record path).
    pub fn u16(self, b: &[u8], at: usize) -> u16 {
        match self {
            Endian::Little => u16::from_le_bytes(Self::bytes(b, at)),
            Endian::Big => u16::from_be_bytes(Self::bytes(b, at)),
        }
    }

    pub fn u32(self, b: &[u8], at: usize) -> u32 {
        match self {
            Endian::Little => u32::from_le_bytes(Self::bytes(b, at)),
            Endian::Big => u32::from_be_bytes(Self::bytes(b, at)),
        }
    }

    pub fn i64(self, b: &[u8], at: usize) -> i64 {
        match self {
            Endian::Little => i64::from_le_bytes(Self::bytes(b, at)),
            Endian::Big => i64::from_be_bytes(Self::bytes(b, at)),
        }
    }
}

/// Reads exactly `buf.len()` bytes, or reports how many it got before the end.
pub(crate) fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// A capture's first four bytes, which say its format; too few is an error of its own.
fn read_magic(r: &mut impl Read) -> Result<[u8; 4], CaptureError> {
    let mut magic = [0u8; 4];
    let got = read_full(r, &mut magic)?;
    if got < magic.len() {
        return Err(CaptureError::TooShort { bytes: got as u64 });
    }
    Ok(magic)
}

/// A file read from an offset on, without moving its cursor (so threads can share it).
struct FileAt<'a>(&'a File, u64);

impl Read for FileAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.0.read_at(buf, self.1)?;
        self.1 += n as u64;
        Ok(n)
    }
}

/// Fills `buf` from `offset` of `file` (fewer bytes only at its end): a chunk's read.
pub(crate) fn read_chunk_at(file: &File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    read_full(&mut FileAt(file, offset), buf)
}

/// What a chunked reader says when `bytes` (at `at_byte`) hold less than a whole record:
/// wait for the next chunk, or, where they run to the file's end, a file cut short.
pub(crate) fn partial_record<T>(bytes: &[u8], at_byte: u64, at_end: bool) -> io::Result<Option<T>> {
    match at_end && !bytes.is_empty() {
        true => Err(CaptureError::Truncated { at_byte }.into()),
        false => Ok(None),
    }
}

/// A capture file of either format, opened to be read in chunks by several workers at
/// once ([`stateplane_runtime::ChunkedFile`]).
pub enum ChunkedCapture {
    Pcap(pcap::PcapFile),
    Pcapng(pcapng::PcapngFile),
}

impl ChunkedCapture {
    /// Opens `path`, whose format it detects from the first four bytes, and checks its
    /// file or section header.
    pub fn open(path: &Path) -> Result<Self, CaptureError> {
        let mut file = File::open(path)?;
        let magic = read_magic(&mut file)?;
        let name = path.display().to_string();
        Ok(if pcapng::is_magic(magic) {
            ChunkedCapture::Pcapng(pcapng::PcapngFile::after_magic(file, magic, name)?)
        } else {
            ChunkedCapture::Pcap(pcap::PcapFile::after_magic(file, magic, name)?)
        })
    }
}

/// A capture-file reader of either format.
pub enum CaptureReader<R: BufRead> {
    Pcap(pcap::PcapReader<R>),
    Pcapng(pcapng::PcapngReader<R>),
}

impl<R: BufRead> CaptureReader<R> {
    /// Detects the format from the first four bytes.
    pub fn new(mut r: R) -> Result<Self, CaptureError> {
        let magic = read_magic(&mut r)?;
        if pcapng::is_magic(magic) {
            Ok(CaptureReader::Pcapng(pcapng::PcapngReader::after_magic(
                r, magic,
            )?))
        } else {
            Ok(CaptureReader::Pcap(pcap::PcapReader::after_magic(
                r, magic,
            )?))
        }
    }

    pub fn next_record(&mut self) -> Result<Option<Record<'_>>, CaptureError> {
        match self {
            CaptureReader::Pcap(p) => p.next_record(),
            CaptureReader::Pcapng(p) => p.next_record(),
        }
    }

    /// Bytes of the file consumed so far.
    pub fn bytes_read(&self) -> u64 {
        match self {
            CaptureReader::Pcap(p) => p.bytes_read(),
            CaptureReader::Pcapng(p) => p.bytes_read(),
        }
    }
}

/// Whether `path` names standard input (`-`), which can be read once only.
pub fn is_stdin(path: &Path) -> bool {
    path == Path::new("-")
}

/// A capture file opened as an input port; `-` is standard input (`tcpdump -w - | ...`).
pub struct FileRx {
    name: String,
    reader: CaptureReader<BufReader<Box<dyn Read + Send>>>,
}

impl FileRx {
    pub fn open(path: &Path) -> Result<Self, CaptureError> {
        let (source, name): (Box<dyn Read + Send>, _) = if is_stdin(path) {
            (Box::new(io::stdin()), "standard input".to_owned())
        } else {
            (Box::new(File::open(path)?), path.display().to_string())
        };
        let reader = CaptureReader::new(BufReader::with_capacity(1 << 20, source))?;
        Ok(FileRx { name, reader })
    }
}

impl RxPort for FileRx {
    fn name(&self) -> &str {
        &self.name
    }

    fn next_packet(&mut self) -> io::Result<Option<RxPacket<'_>>> {
        Ok(self.reader.next_record()?.map(RxPacket::from))
    }
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureFormat {
    /// Classic pcap, microsecond timestamps (what most tools default to).
    PcapMicro,
    /// Classic pcap, nanosecond timestamps (magic 0xa1b23c4d).
    PcapNano,
    /// pcapng with nanosecond timestamps (`if_tsresol` 9).
    Pcapng,
}

impl CaptureFormat {
    /// `.pcapng` gives pcapng; anything else pcap with nanosecond timestamps.
    pub fn from_path(path: &Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("pcapng") => CaptureFormat::Pcapng,
            _ => CaptureFormat::PcapNano,
        }
    }
}

/// A capture-file writer of either format.
pub enum CaptureWriter<W: io::Write> {
    Pcap(pcap::PcapWriter<W>),
    Pcapng(pcapng::PcapngWriter<W>),
}

impl<W: io::Write> CaptureWriter<W> {
    pub fn new(w: W, format: CaptureFormat) -> io::Result<Self> {
        Ok(match format {
            CaptureFormat::PcapMicro => CaptureWriter::Pcap(pcap::PcapWriter::new(w, false)?),
            CaptureFormat::PcapNano => CaptureWriter::Pcap(pcap::PcapWriter::new(w, true)?),
            CaptureFormat::Pcapng => CaptureWriter::Pcapng(pcapng::PcapngWriter::new(w)?),
        })
    }

    pub fn write(&mut self, ts_ns: u64, data: &[u8], orig_len: u32) -> io::Result<()> {
        match self {
            CaptureWriter::Pcap(p) => p.write(ts_ns, data, orig_len),
            CaptureWriter::Pcapng(p) => p.write(ts_ns, data, orig_len),
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        match self {
            CaptureWriter::Pcap(p) => p.flush(),
            CaptureWriter::Pcapng(p) => p.flush(),
        }
    }
}

impl CaptureWriter<BufWriter<File>> {
    /// Creates `path`, its format chosen by [`CaptureFormat::from_path`].
    pub fn create(path: &Path) -> io::Result<Self> {
        let file = File::create(path)
            .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", path.display())))?;
        Self::new(
            BufWriter::with_capacity(1 << 20, file),
            CaptureFormat::from_path(path),
        )
    }
}

/// A capture file opened as an output port.
pub struct FileTx {
    name: String,
    writer: CaptureWriter<BufWriter<File>>,
}

impl FileTx {
    pub fn create(path: &Path) -> io::Result<Self> {
        Ok(FileTx {
            name: path.display().to_string(),
            writer: CaptureWriter::create(path)?,
        })
    }
}

impl TxPort for FileTx {
    fn name(&self) -> &str {
        &self.name
    }
    fn send(&mut self, data: &[u8], orig_len: u32, ts_ns: u64) -> io::Result<()> {
        self.writer.write(ts_ns, data, orig_len)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }
}

/// Reads a whole capture into memory: (timestamp, bytes, original length) per packet.
/// For tests and small traces; large ones stream through [`CaptureReader`].
pub fn read_all(path: &Path) -> Result<Vec<(u64, Vec<u8>, u32)>, CaptureError> {
    let mut r = CaptureReader::new(BufReader::new(File::open(path)?))?;
    let mut out = Vec::new();
    while let Some(rec) = r.next_record()? {
        out.push((rec.ts_ns, rec.data.to_vec(), rec.orig_len));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_are_no_capture_say_so() {
        let short = CaptureReader::new(&b"ab\n"[..]).err().unwrap();
        assert!(
            short
                .to_string()
                .starts_with("only 3 bytes long, too short to be a pcap or pcapng file"),
            "{short}"
        );
        let text = CaptureReader::new(&b"hello world, not a capture"[..])
            .err()
            .unwrap();
        assert!(
            text.to_string()
                .starts_with("not a pcap or pcapng file (it starts with 0x68656c6c)"),
            "{text}"
        );
    }
}

/// Reading a capture in chunks against reading it as a stream, for the formats' tests.
#[cfg(test)]
pub(crate) mod chunked_vs_streamed {
    use super::*;
    use stateplane_runtime::ChunkedFile;

    /// What reading met: the packets (time, data, length on the wire), and the error that
    /// stopped it (opening included).
    pub type Met = (Vec<(u64, Vec<u8>, u32)>, Option<String>);

    pub fn streamed(bytes: &[u8]) -> Met {
        let mut met: Met = (Vec::new(), None);
        let mut reader = match CaptureReader::new(bytes) {
            Ok(reader) => reader,
            Err(e) => return (met.0, Some(e.to_string())),
        };
        loop {
            match reader.next_record() {
                Ok(Some(r)) => met.0.push((r.ts_ns, r.data.to_vec(), r.orig_len)),
                Ok(None) => return met,
                Err(e) => return (met.0, Some(e.to_string())),
            }
        }
    }

    /// Reads `file` through [`ChunkedFile`] in reads of `chunk` bytes, each from where the
    /// last one's whole records ended, with the context carried over (a read too small for
    /// a record grows): the formats' side of the workers' walk, which meets records cut
    /// anywhere after their start.
    pub fn chunked<F: ChunkedFile>(file: &F, chunk: usize) -> Met {
        let mut met: Met = (Vec::new(), None);
        let (mut offset, mut context) = file.first_record();
        let mut buf = vec![0; chunk];
        loop {
            let n = match file.read_at(offset, &mut buf) {
                Ok(n) => n,
                Err(e) => return (met.0, Some(e.to_string())),
            };
            let at_end = n < buf.len();
            let mut at = 0;
            loop {
                let at_byte = offset + at as u64;
                match file.record(&buf[at..n], at_byte, at_end, &mut context) {
                    Ok(Some(record)) => {
                        if let Some(p) = record.packet {
                            met.0.push((p.ts_ns, p.data.to_vec(), p.orig_len));
                        }
                        at += record.len;
                    }
                    Ok(None) => break,
                    Err(e) => return (met.0, Some(e.to_string())),
                }
            }
            match (at_end, at) {
                (true, _) => return met,
                (false, 0) => buf.resize(buf.len() * 2, 0),
                (false, _) => offset += at as u64,
            }
        }
    }

    /// Reads `bytes` as a stream through a buffer of `capacity` bytes: each packet's time and
    /// data, and the bytes read once it was returned.
    pub fn through_buffer(bytes: &[u8], capacity: usize) -> Vec<(u64, Vec<u8>, u64)> {
        let mut r = CaptureReader::new(BufReader::with_capacity(capacity, bytes)).unwrap();
        let mut got = Vec::new();
        while let Some(rec) = r.next_record().unwrap() {
            got.push((rec.ts_ns, rec.data.to_vec(), r.bytes_read()));
        }
        got
    }

    /// Reads `bytes`, whole and cut at every byte, in chunks of several sizes and as a
    /// stream: the same packets, and the same error at the same byte.
    pub fn assert_same_at_every_cut(bytes: &[u8]) {
        let path = std::env::temp_dir().join(format!(
            "chunked-{}-{:?}.cap",
            std::process::id(),
            std::thread::current().id()
        ));
        for cut in 0..=bytes.len() {
            let streamed = streamed(&bytes[..cut]);
            std::fs::write(&path, &bytes[..cut]).unwrap();
            for chunk in [13, 100, bytes.len().max(1)] {
                let met = match ChunkedCapture::open(&path) {
                    Ok(ChunkedCapture::Pcap(file)) => chunked(&file, chunk),
                    Ok(ChunkedCapture::Pcapng(file)) => chunked(&file, chunk),
                    Err(e) => (Vec::new(), Some(e.to_string())),
                };
                assert_eq!(met, streamed, "cut at {cut}, chunks of {chunk}");
            }
        }
        std::fs::remove_file(&path).unwrap();
    }
}
