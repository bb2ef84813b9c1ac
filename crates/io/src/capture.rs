//! The format-independent face of capture files: records, errors, and a reader and writer
//! that pick pcap or pcapng (from the file's magic number, or the output's extension).

use crate::link::{LinkType, READ_LINK_TYPES, linktype_name};
use crate::{pcap, pcapng};
use stateplane_runtime::{RxPacket, RxPort, SeenAt, TxPort};
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
    /// What `data` starts with; [`CaptureReader`] hands out Ethernet frames only.
    pub link: LinkType,
    /// Where its link header said it was seen, once that header is taken off
    /// ([`Record::as_ethernet`]).
    pub seen: SeenAt,
}

impl<'a> Record<'a> {
    /// This record as an Ethernet frame: itself where it is one, else written into
    /// `frame` with a synthesized header (see [`LinkType`]), its length on the wire
    /// changed by as much as its header.
    pub fn as_ethernet(self, frame: &'a mut Vec<u8>) -> Record<'a> {
        if self.link == LinkType::Ethernet {
            return self;
        }
        let seen = self.link.seen_at(self.data);
        self.link.write_ethernet(self.data, frame);
        let orig_len = i64::from(self.orig_len) + frame.len() as i64 - self.data.len() as i64;
        Record {
            orig_len: orig_len.clamp(frame.len() as i64, i64::from(u32::MAX)) as u32,
            data: frame,
            link: LinkType::Ethernet,
            seen,
            ..self
        }
    }
}

impl<'a> From<Record<'a>> for RxPacket<'a> {
    fn from(r: Record<'a>) -> Self {
        RxPacket {
            data: r.data,
            orig_len: r.orig_len,
            ts_ns: r.ts_ns,
            seen: r.seen,
        }
    }
}

/// Link type 1, Ethernet: what Stateplane writes.
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
    /// The capture's link type is none that [`LinkType`] takes.
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
                "link type {linktype} ({}) is not one Stateplane reads: it reads {READ_LINK_TYPES}",
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
    /// file or section header. `None` for a capture of another link type than Ethernet
    /// (in pcapng, on the interfaces described at its start): chunks lend frames as they
    /// lie in the file, so it is read as a stream ([`CaptureReader`]) instead.
    pub fn open(path: &Path) -> Result<Option<Self>, CaptureError> {
        let mut file = File::open(path)?;
        let magic = read_magic(&mut file)?;
        let name = path.display().to_string();
        Ok(if pcapng::is_magic(magic) {
            pcapng::PcapngFile::after_magic(file, magic, name)?.map(ChunkedCapture::Pcapng)
        } else {
            pcap::PcapFile::after_magic(file, magic, name)?.map(ChunkedCapture::Pcap)
        })
    }
}

/// A capture-file reader of either format, which hands out Ethernet frames: those of other
/// link types it writes as Ethernet frames into a buffer of its own ([`Record::as_ethernet`]).
pub struct CaptureReader<R: BufRead> {
    format: FormatReader<R>,
    /// The last record of a link type other than Ethernet, as an Ethernet frame.
    frame: Vec<u8>,
}

enum FormatReader<R: BufRead> {
    Pcap(pcap::PcapReader<R>),
    Pcapng(pcapng::PcapngReader<R>),
}

impl<R: BufRead> CaptureReader<R> {
    /// Detects the format from the first four bytes.
    pub fn new(mut r: R) -> Result<Self, CaptureError> {
        let magic = read_magic(&mut r)?;
        let format = if pcapng::is_magic(magic) {
            FormatReader::Pcapng(pcapng::PcapngReader::after_magic(r, magic)?)
        } else {
            FormatReader::Pcap(pcap::PcapReader::after_magic(r, magic)?)
        };
        Ok(CaptureReader {
            format,
            frame: Vec::new(),
        })
    }

    pub fn next_record(&mut self) -> Result<Option<Record<'_>>, CaptureError> {
        let record = match &mut self.format {
            FormatReader::Pcap(p) => p.next_record()?,
            FormatReader::Pcapng(p) => p.next_record()?,
        };
        Ok(record.map(|r| r.as_ethernet(&mut self.frame)))
    }

    /// Bytes of the file consumed so far.
    pub fn bytes_read(&self) -> u64 {
        match &self.format {
            FormatReader::Pcap(p) => p.bytes_read(),
            FormatReader::Pcapng(p) => p.bytes_read(),
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

    /// What a run's progress reads (it read 0 here, and the bar never moved).
    fn bytes_read(&self) -> u64 {
        self.reader.bytes_read()
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
        Self::create_through(path, |file| file)
    }
}

impl<W: io::Write> CaptureWriter<BufWriter<W>> {
    /// Creates `path` as [`CaptureWriter::create`] does, writing through `wrap` of it.
    fn create_through(path: &Path, wrap: impl FnOnce(File) -> W) -> io::Result<Self> {
        let file = File::create(path).map_err(|e| {
            let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
            let why = match folder {
                // Not made for the user: a folder made from a mistyped path would hide it.
                Some(folder) if e.kind() == io::ErrorKind::NotFound && !folder.is_dir() => format!(
                    "its folder {} does not exist (make it first: mkdir -p {})",
                    folder.display(),
                    folder.display()
                ),
                _ => e.to_string(),
            };
            io::Error::new(e.kind(), format!("creating {}: {why}", path.display()))
        })?;
        Self::new(
            BufWriter::with_capacity(1 << 20, wrap(file)),
            CaptureFormat::from_path(path),
        )
    }
}

impl<W: io::Write> CaptureWriter<W> {
    pub fn get_ref(&self) -> &W {
        match self {
            CaptureWriter::Pcap(p) => p.get_ref(),
            CaptureWriter::Pcapng(p) => p.get_ref(),
        }
    }
}

/// A writer that counts the bytes its inner writer took: what reached the file.
struct Landed<W> {
    inner: W,
    bytes: u64,
}

impl<W: io::Write> io::Write for Landed<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A capture file opened as an output port, which knows which packets it took reached
/// the file: a write that fails (a full disk) loses what its buffer held, and those
/// packets were not sent ([`TxPort::unwritten`]).
pub struct FileTx {
    name: String,
    writer: CaptureWriter<BufWriter<Landed<File>>>,
    /// Per packet taken and not yet known to have reached the file: where its record ends
    /// in the file, and its captured length. In file order.
    pending: std::collections::VecDeque<(u64, u32)>,
}

impl FileTx {
    pub fn create(path: &Path) -> io::Result<Self> {
        let landed = |inner| Landed { inner, bytes: 0 };
        Ok(FileTx {
            name: path.display().to_string(),
            writer: CaptureWriter::create_through(path, landed)?,
            pending: std::collections::VecDeque::new(),
        })
    }

    /// Bytes that reached the file, and bytes given to the writer.
    fn offsets(&self) -> (u64, u64) {
        let buffered = self.writer.get_ref();
        let landed = buffered.get_ref().bytes;
        (landed, landed + buffered.buffer().len() as u64)
    }

    /// Forgets the packets that reached the file.
    fn settle(&mut self) {
        let (landed, _) = self.offsets();
        while self.pending.front().is_some_and(|&(end, _)| end <= landed) {
            self.pending.pop_front();
        }
    }
}

impl TxPort for FileTx {
    fn name(&self) -> &str {
        &self.name
    }
    fn send(&mut self, data: &[u8], orig_len: u32, ts_ns: u64) -> io::Result<()> {
        self.writer.write(ts_ns, data, orig_len)?;
        let (_, given) = self.offsets();
        self.pending.push_back((given, data.len() as u32));
        self.settle();
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        let flushed = self.writer.flush();
        self.settle();
        flushed
    }
    fn unwritten(&self) -> (u64, u64) {
        let bytes = self.pending.iter().map(|&(_, len)| u64::from(len)).sum();
        (self.pending.len() as u64, bytes)
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

    /// An output whose folder is not there is refused with the command that makes it; the
    /// folder is not made (a mistyped path would make one silently).
    #[test]
    fn an_output_in_a_folder_not_made_says_how_to_make_it() {
        let scratch = std::env::temp_dir().join(format!("sp-io-nofolder-{}", std::process::id()));
        let path = scratch.join("out/sample.pcap");
        let Err(e) = FileTx::create(&path) else {
            panic!("{} was created", path.display())
        };
        let folder = scratch.join("out");
        let want = format!(
            "creating {}: its folder {} does not exist (make it first: mkdir -p {})",
            path.display(),
            folder.display(),
            folder.display()
        );
        assert_eq!(e.to_string(), want);
        assert!(!scratch.exists());
    }

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

    /// An SLL2 packet: IPv4, interface 2, Ethernet hardware, incoming, the sender's MAC.
    fn sll2_packet(payload: &[u8]) -> Vec<u8> {
        let mut p = vec![
            0x08, 0, 0, 0, 0, 0, 0, 2, 0, 1, 0, 6, 2, 0, 0, 0, 0, 9, 0, 0,
        ];
        p.extend_from_slice(payload);
        p
    }

    /// The Ethernet frame that stands in for [`sll2_packet`].
    fn its_ethernet_frame(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 9, 0x08, 0];
        f.extend_from_slice(payload);
        f
    }

    /// A pcap file of link type `linktype` holding `packets` (each with 10 more bytes on
    /// the wire than captured), in `format`.
    fn capture_of(linktype: u32, packets: &[Vec<u8>], format: CaptureFormat) -> Vec<u8> {
        let mut w = CaptureWriter::new(Vec::new(), format).unwrap();
        for (i, p) in packets.iter().enumerate() {
            w.write(i as u64 * 1000, p, p.len() as u32 + 10).unwrap();
        }
        let mut bytes = match w {
            CaptureWriter::Pcap(p) => p.into_inner(),
            CaptureWriter::Pcapng(p) => p.into_inner(),
        };
        match format {
            CaptureFormat::Pcapng => {
                bytes[36..38].copy_from_slice(&(linktype as u16).to_le_bytes())
            }
            _ => bytes[20..24].copy_from_slice(&linktype.to_le_bytes()),
        }
        bytes
    }

    #[test]
    fn a_cooked_capture_reads_as_ethernet_frames_in_either_format() {
        let payloads: [&[u8]; 3] = [&[0x45; 30], &[1, 2, 3], &[]];
        let packets: Vec<Vec<u8>> = payloads.iter().map(|p| sll2_packet(p)).collect();
        for format in [CaptureFormat::PcapMicro, CaptureFormat::Pcapng] {
            let bytes = capture_of(276, &packets, format);
            let mut r = CaptureReader::new(&bytes[..]).unwrap();
            for (i, payload) in payloads.iter().enumerate() {
                let rec = r.next_record().unwrap().unwrap();
                let frame = its_ethernet_frame(payload);
                // On the wire: 10 bytes more than captured, less the 6 the header shrank by.
                let orig_len = frame.len() as u32 + 10;
                assert_eq!(
                    (rec.data, rec.orig_len, rec.ts_ns),
                    (&frame[..], orig_len, i as u64 * 1000)
                );
                assert_eq!(rec.link, LinkType::Ethernet);
            }
            assert_eq!(r.next_record().unwrap(), None);
        }
        // A packet cut inside its cooked header reads as an empty frame, not an error.
        let bytes = capture_of(276, &[vec![0x08, 0, 0]], CaptureFormat::PcapNano);
        let mut r = CaptureReader::new(&bytes[..]).unwrap();
        let rec = r.next_record().unwrap().unwrap();
        assert_eq!((rec.data.len(), rec.orig_len), (0, 10));
    }

    #[test]
    fn captures_of_other_link_types_are_not_read_in_chunks_and_others_are_refused() {
        let path = std::env::temp_dir().join(format!("link-{}.pcap", std::process::id()));
        for format in [CaptureFormat::PcapNano, CaptureFormat::Pcapng] {
            let ethernet = capture_of(1, &[its_ethernet_frame(&[])], format);
            std::fs::write(&path, ethernet).unwrap();
            assert!(matches!(ChunkedCapture::open(&path), Ok(Some(_))));
            std::fs::write(&path, capture_of(276, &[sll2_packet(&[])], format)).unwrap();
            assert!(matches!(ChunkedCapture::open(&path), Ok(None)));
            // Radiotap is no link type a switch sees: refused by name, with what is read.
            let radiotap = capture_of(127, &[vec![0; 8]], format);
            std::fs::write(&path, &radiotap).unwrap();
            for err in [
                ChunkedCapture::open(&path).err().unwrap(),
                CaptureReader::new(&radiotap[..]).err().unwrap(),
            ] {
                let err = err.to_string();
                assert!(err.starts_with("link type 127 (IEEE802_11_RADIOTAP) is not one Stateplane reads: it reads Ethernet (1), Linux cooked SLL (113)"), "{err}");
            }
        }
        std::fs::remove_file(&path).unwrap();
    }

    /// A file port says how much of its file it has read, so that a run's progress moves:
    /// the whole file once every packet is read, in both formats.
    #[test]
    fn a_file_port_counts_the_bytes_it_has_read() {
        let path = std::env::temp_dir().join(format!("read-{}.pcap", std::process::id()));
        let frames: Vec<Vec<u8>> = (0..100).map(|i| its_ethernet_frame(&[i; 60])).collect();
        for format in [CaptureFormat::PcapNano, CaptureFormat::Pcapng] {
            let bytes = capture_of(1, &frames, format);
            std::fs::write(&path, &bytes).unwrap();
            let mut port = FileRx::open(&path).unwrap();
            let mut read = Vec::new();
            while port.next_packet().unwrap().is_some() {
                read.push(port.bytes_read());
            }
            assert_eq!(read.len(), 100);
            assert!(read.windows(2).all(|w| w[0] < w[1]), "{format:?}: it grows");
            assert_eq!(port.bytes_read(), bytes.len() as u64, "{format:?}");
        }
        std::fs::remove_file(&path).unwrap();
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
                    Ok(Some(ChunkedCapture::Pcap(file))) => chunked(&file, chunk),
                    Ok(Some(ChunkedCapture::Pcapng(file))) => chunked(&file, chunk),
                    Ok(None) => panic!("an Ethernet capture is read in chunks"),
                    Err(e) => (Vec::new(), Some(e.to_string())),
                };
                assert_eq!(met, streamed, "cut at {cut}, chunks of {chunk}");
            }
        }
        std::fs::remove_file(&path).unwrap();
    }
}
