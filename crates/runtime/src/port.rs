//! Port traits: where packets come from and where they go.

use std::io;

/// One received packet, borrowed from the port until the next call.
#[derive(Debug, Clone, Copy)]
pub struct RxPacket<'a> {
    pub data: &'a [u8],
    /// Length on the wire (more than `data.len()` if the capture was cut short).
    pub orig_len: u32,
    pub ts_ns: u64,
    /// Where its capture says it was seen (nothing, but for Linux cooked captures).
    pub seen: SeenAt,
}

/// Where a capture says a packet was seen: Linux cooked captures (`tcpdump -i any`) say
/// whether it was leaving the host (SLL and SLL2) and by which interface (SLL2: its index
/// as the kernel numbers it, `ip link` shows it). Programs see their ports, not this; an
/// observer's flow records take their interfaces from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeenAt {
    /// The interface's index; 0 where the capture does not say.
    pub interface: u32,
    /// Leaving by it; else arriving (or not said).
    pub outgoing: bool,
}

/// A source of packets, read one at a time (capture files, live sockets).
pub trait RxPort: Send {
    fn name(&self) -> &str;
    /// The next packet, or `None` at the end of the input.
    fn next_packet(&mut self) -> io::Result<Option<RxPacket<'_>>>;
    /// Bytes of the input consumed so far, for progress; 0 where that means nothing.
    fn bytes_read(&self) -> u64 {
        0
    }
}

/// Frames held in memory as an input port, each with its timestamp in nanoseconds: for
/// tests and for a program's own harness, where a capture file would only add a write.
pub struct MemoryRx {
    packets: Vec<(u64, Vec<u8>)>,
    next: usize,
}

impl MemoryRx {
    pub fn new(packets: Vec<(u64, Vec<u8>)>) -> MemoryRx {
        MemoryRx { packets, next: 0 }
    }
}

impl RxPort for MemoryRx {
    fn name(&self) -> &str {
        "memory"
    }

    fn next_packet(&mut self) -> io::Result<Option<RxPacket<'_>>> {
        let packet = self.packets.get(self.next);
        self.next += usize::from(packet.is_some());
        Ok(packet.map(|(ts_ns, data)| RxPacket {
            seen: SeenAt::default(),
            data,
            orig_len: data.len() as u32,
            ts_ns: *ts_ns,
        }))
    }
}

/// A capture file that several threads read at once, each a chunk of whole records at a
/// time, by positioned reads (no shared cursor). Only the format knows where a record
/// ends, so a chunk's reader finds where the next chunk starts by walking its records.
/// Where a record's meaning depends on the records before it (a pcapng packet on the
/// interfaces described earlier in its section), the format keeps that in a `Context`,
/// which the walk carries from each chunk to the next.
pub trait ChunkedFile: Send + Sync {
    /// What reading a record needs to know from the records before it.
    type Context: Clone + Send;
    fn name(&self) -> &str;
    /// Where the first record starts, and the context there.
    fn first_record(&self) -> (u64, Self::Context);
    /// The most bytes one record can take in the file: a read of that many always holds
    /// a whole record, unless the file ends first.
    fn max_record_len(&self) -> usize;
    /// Reads into `buf` from `offset`; fewer bytes than `buf.len()` only at the file's end.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
    /// The record at the start of `bytes`, which lie at `at_byte` in the file, read in
    /// `context` (which it updates to the context after it); `None` when `bytes` are empty
    /// or hold less than all of it, which is an error instead when they run to the file's
    /// end (`at_end`): a file cut short. `context` changes only when a record is returned.
    /// A packet's data lies within `bytes` (the chunk reader finds it again by its place).
    fn record<'a>(
        &self,
        bytes: &'a [u8],
        at_byte: u64,
        at_end: bool,
        context: &mut Self::Context,
    ) -> io::Result<Option<FileRecord<'a>>>;
}

/// A record of a [`ChunkedFile`]: its length in the file, and its packet if it holds one
/// (a pcapng interface description or statistics block holds none).
#[derive(Debug, Clone, Copy)]
pub struct FileRecord<'a> {
    pub packet: Option<RxPacket<'a>>,
    pub len: usize,
}

/// A sink of packets.
pub trait TxPort: Send {
    fn name(&self) -> &str;
    /// Sends one packet. An error of kind `InvalidInput` refuses this packet alone (the
    /// port's format cannot hold it, e.g. a pcap timestamp past 2106); any other fails the
    /// port.
    fn send(&mut self, data: &[u8], orig_len: u32, ts_ns: u64) -> io::Result<()>;
    /// Makes everything sent so far durable or visible (end of run).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
    /// Packets and bytes `send` took that never reached their destination: those a file's
    /// buffer held when a write of it failed. Asked once the port is done with.
    fn unwritten(&self) -> (u64, u64) {
        (0, 0)
    }
}

/// What a live port counts, beyond the worker's counters: what the kernel or the rings
/// dropped, and why. Summed over the queues of an interface in the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortCounters {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Dropped by the kernel because the receive ring was full.
    pub rx_kernel_drops: u64,
    /// Larger than the port carries (above the MTU and not a large TCP segment, or above
    /// `burst::MAX_FRAME`); dropped at the port.
    pub rx_oversize: u64,
    /// Arrived with the checksum left to offload (the sender's checksum offload is on);
    /// forwarded as they came.
    pub rx_partial_checksum: u64,
    /// Large segments: TCP segments larger than the MTU that their sender left for a
    /// device to cut (TSO, GSO, GRO), received whole (each one of `rx_packets`).
    pub rx_large_segments: u64,
    pub rx_errors: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Longer than the interface's MTU allows, or a large segment the port cannot have
    /// cut; not sent.
    pub tx_oversize: u64,
    /// The transmit ring stayed full; not sent.
    pub tx_ring_full: u64,
    /// Refused by the kernel.
    pub tx_errors: u64,
}

impl PortCounters {
    pub fn merge(&mut self, o: &PortCounters) {
        self.rx_packets += o.rx_packets;
        self.rx_bytes += o.rx_bytes;
        self.rx_kernel_drops += o.rx_kernel_drops;
        self.rx_oversize += o.rx_oversize;
        self.rx_partial_checksum += o.rx_partial_checksum;
        self.rx_large_segments += o.rx_large_segments;
        self.rx_errors += o.rx_errors;
        self.tx_packets += o.tx_packets;
        self.tx_bytes += o.tx_bytes;
        self.tx_oversize += o.tx_oversize;
        self.tx_ring_full += o.tx_ring_full;
        self.tx_errors += o.tx_errors;
    }

    /// Every count by name, for summaries and metrics.
    pub fn named(&self) -> [(&'static str, u64); 12] {
        [
            ("rx_packets", self.rx_packets),
            ("rx_bytes", self.rx_bytes),
            ("rx_kernel_drops", self.rx_kernel_drops),
            ("rx_oversize", self.rx_oversize),
            ("rx_partial_checksum", self.rx_partial_checksum),
            ("rx_large_segments", self.rx_large_segments),
            ("rx_errors", self.rx_errors),
            ("tx_packets", self.tx_packets),
            ("tx_bytes", self.tx_bytes),
            ("tx_oversize", self.tx_oversize),
            ("tx_ring_full", self.tx_ring_full),
            ("tx_errors", self.tx_errors),
        ]
    }
}

/// How a live port shared by several workers spreads what it receives over them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Steering {
    /// By the kernel's symmetric flow hash: both directions of a flow reach one worker.
    #[default]
    Flow,
    /// By the remote endpoint's address, which is the source of what this port receives
    /// (of an ICMP error, the destination of the packet it quotes): every packet to and
    /// from one remote address, errors about them included, reaches one worker.
    RemoteIsSource,
    /// By the remote endpoint's address, which is the destination of what this port
    /// receives (of an ICMP error, the source of the packet it quotes).
    RemoteIsDestination,
    /// By the subscriber of a mobile gateway a packet belongs to, so that one subscriber's
    /// signaling and traffic all reach the worker holding its session, whose place in
    /// the pools ([`PLACE_MASK`] of its TEIDs, its addresses' offset in the pools) that
    /// worker handed out: GTP-U and GTPv2-C (UDP to `gateway`, ports 2152 and 2123) by
    /// the place in their TEID; a GTPv2-C request with no TEID yet (Create Session) by its
    /// IMSI as a number modulo 2^32, when its first element is the IMSI, 8 bytes of digits
    /// (so the subscribers numbered from a multiple of 2^32, as `stateplane gen gtp`
    /// numbers them, reach worker `n` modulo the workers); other IPv4 by its
    /// destination minus `pool`, IPv6 by its destination's second 32 bits minus `pool6`
    /// (the pool's /64s, one a place). The result, modulo the workers, is a worker.
    Subscriber { gateway: u32, pool: u32, pool6: u32 },
}

impl Steering {
    /// Whether it reads the packet alone, not the port it came by: then a run over files,
    /// whose ports need not be the live ones (one file may carry both directions of every
    /// connection), spreads by it too. By the remote address, a port says which end is
    /// remote, so files keep the flow hash.
    pub fn reads_the_packet_alone(&self) -> bool {
        matches!(self, Steering::Subscriber { .. })
    }
}

/// The bits of a gateway's TEID that are the subscriber's place ([`Steering::Subscriber`]);
/// the bits above tell the interface.
pub const PLACE_MASK: u32 = 0x0fff_ffff;

/// One worker's queue pair on a live interface: receive and transmit (an AF_PACKET fanout
/// member with its transmit ring, an AF_XDP socket).
pub trait LiveQueue: Send {
    fn name(&self) -> &str;
    /// Moves waiting packets into `burst` as arriving on `port` until the burst is full or
    /// none wait; never blocks. Returns how many it moved.
    fn recv(&mut self, burst: &mut crate::Burst, port: crate::PortId) -> usize;
    /// Queues one frame to send; `false` if it was dropped (counted by reason). A
    /// `segment_size` above 0 marks a large segment to be cut into pieces of that size
    /// ([`crate::PacketDesc::segment_size`]): a queue that cannot have it cut drops it.
    fn send(&mut self, frame: &[u8], segment_size: u16) -> bool;
    /// Hands everything queued to the kernel (once per burst).
    fn flush(&mut self);
    /// A descriptor that polls readable when packets wait.
    fn fd(&self) -> std::os::fd::RawFd;
    /// The counts so far.
    fn counters(&mut self) -> PortCounters;
}
