//! Sources of bursts for one worker: capture-file ports merged by time ([`Merged`]), a
//! worker's own shard of them ([`OwnShard`]), and what every reader does with a packet
//! ([`ingress`]).

use crate::burst::{Burst, MAX_FRAME};
use crate::counters::Stats;
use crate::port::{RxPacket, RxPort, SeenAt};
use crate::program::{DropReason, PortId};
use crate::run_config::RunHandle;
use crate::worker::{count_malformed, count_port_drop};
use stateplane_wire::flow::shard_of;
use stateplane_wire::{FlowHasher, Malformed, Parsed};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A packet held back for the next offer: the next packet of one of several input ports
/// (staged so that ports can be merged by time), or the packet a single port's reader
/// declined (its burst was full). Each port keeps one `Head` for the whole run; its buffer
/// grows to the largest frame and is reused.
struct Head {
    port: PortId,
    data: Vec<u8>,
    orig_len: u32,
    ts_ns: u64,
    seen: SeenAt,
    /// Whether `data` holds a packet not yet taken.
    held: bool,
}

impl Head {
    fn new(port: PortId) -> Head {
        Head {
            port,
            data: Vec::new(),
            orig_len: 0,
            ts_ns: 0,
            seen: SeenAt::default(),
            held: false,
        }
    }

    fn packet(&self) -> RxPacket<'_> {
        RxPacket {
            data: &self.data,
            orig_len: self.orig_len,
            ts_ns: self.ts_ns,
            seen: self.seen,
        }
    }

    fn hold(&mut self, packet: &RxPacket) {
        self.data.clear();
        self.data.extend_from_slice(packet.data);
        self.orig_len = packet.orig_len;
        self.ts_ns = packet.ts_ns;
        self.seen = packet.seen;
        self.held = true;
    }
}

/// The next packet of the input as [`Merged::offer`] hands it to a reader.
pub(crate) struct Offered<'a> {
    pub(crate) port: PortId,
    /// The packet's input sequence number.
    pub(crate) seq: u64,
    pub(crate) packet: RxPacket<'a>,
}

/// Capture-file ports read in timestamp order across ports, the earliest next packet first:
/// what the dispatcher reads, and what a worker reading its own shard reads.
///
/// Several ports are merged through a [`Head`] per port, which costs a copy of each packet;
/// a single port needs no merge, so its packets are offered where the port holds them and
/// copied only when a reader declines one (once per full burst).
pub(crate) struct Merged {
    rx: Vec<(PortId, Box<dyn RxPort>)>,
    heads: Vec<Head>,
    /// Per port: its name, for errors.
    names: Vec<String>,
    /// Per port: whether its input has ended (or failed).
    ended: Vec<bool>,
    /// The input sequence number of the next packet.
    seq: u64,
    /// The latest timestamp read so far.
    pub(crate) now_ns: u64,
    pub(crate) errors: Vec<String>,
    /// Per port: the packets taken from it and their bytes.
    taken: Vec<(u64, u64)>,
}

impl Merged {
    pub(crate) fn open(rx: Vec<(PortId, Box<dyn RxPort>)>) -> Merged {
        let heads = rx.iter().map(|(port, _)| Head::new(*port)).collect();
        let mut input = Merged {
            names: rx.iter().map(|(_, src)| src.name().to_string()).collect(),
            ended: vec![false; rx.len()],
            taken: vec![(0, 0); rx.len()],
            rx,
            heads,
            seq: 0,
            now_ns: 0,
            errors: Vec::new(),
        };
        if input.rx.len() > 1 {
            for i in 0..input.rx.len() {
                input.stage(i);
            }
        }
        input
    }

    /// Offers the earliest next packet to `take`, which returns whether it took it; one it
    /// declines is offered again at the next call. `None` once every input has ended. The
    /// clock moves to the packet's time as it is offered.
    #[inline]
    pub(crate) fn offer(&mut self, take: impl FnOnce(Offered) -> bool) -> Option<bool> {
        if self.rx.len() == 1 && !self.heads[0].held {
            return self.offer_from_port(take);
        }
        let i = (self.heads.iter().enumerate())
            .filter(|(_, h)| h.held)
            .min_by_key(|(_, h)| h.ts_ns)
            .map(|(i, _)| i)?;
        let head = &mut self.heads[i];
        self.now_ns = self.now_ns.max(head.ts_ns);
        let packet = head.packet();
        let len = packet.data.len() as u64;
        let offered = Offered {
            port: head.port,
            seq: self.seq,
            packet,
        };
        if !take(offered) {
            return Some(false);
        }
        head.held = false;
        self.seq += 1;
        self.taken[i] = (self.taken[i].0 + 1, self.taken[i].1 + len);
        if self.rx.len() > 1 {
            self.stage(i);
        }
        Some(true)
    }

    /// A single port's next packet, offered where the port holds it.
    #[inline]
    fn offer_from_port(&mut self, take: impl FnOnce(Offered) -> bool) -> Option<bool> {
        let Merged {
            rx,
            heads,
            names,
            ended,
            seq,
            now_ns,
            errors,
            taken: counts,
        } = self;
        let (port, src) = &mut rx[0];
        let packet = next_packet(src.as_mut(), &names[0], &mut ended[0], errors)?;
        *now_ns = (*now_ns).max(packet.ts_ns);
        let len = packet.data.len() as u64;
        let taken = take(Offered {
            port: *port,
            seq: *seq,
            packet,
        });
        if taken {
            *seq += 1;
            counts[0] = (counts[0].0 + 1, counts[0].1 + len);
        } else {
            heads[0].hold(&packet);
        }
        Some(taken)
    }

    /// Reads port `i`'s next packet into its head, or marks the port ended.
    fn stage(&mut self, i: usize) {
        let src = self.rx[i].1.as_mut();
        let name = &self.names[i];
        if let Some(packet) = next_packet(src, name, &mut self.ended[i], &mut self.errors) {
            self.heads[i].hold(&packet);
        }
    }

    pub(crate) fn done(&self) -> bool {
        self.ended.iter().all(|&e| e) && self.heads.iter().all(|h| !h.held)
    }

    pub(crate) fn bytes_read(&self) -> u64 {
        self.rx.iter().map(|(_, src)| src.bytes_read()).sum()
    }

    /// The packets taken from each port and their bytes, by port id, into `by_port`.
    pub(crate) fn taken_by_port(&self, by_port: &mut Vec<(u64, u64)>) {
        for ((port, _), &taken) in self.rx.iter().zip(&self.taken) {
            let p = usize::from(*port);
            if by_port.len() <= p {
                by_port.resize(p + 1, (0, 0));
            }
            by_port[p] = taken;
        }
    }
}

/// `src`'s (named `name`) next packet; `None` at its end or on an error (recorded in
/// `errors`), after which `ended` is set and the port is not read again.
#[inline]
fn next_packet<'a>(
    src: &'a mut dyn RxPort,
    name: &str,
    ended: &mut bool,
    errors: &mut Vec<String>,
) -> Option<RxPacket<'a>> {
    if *ended {
        return None;
    }
    match src.next_packet() {
        Ok(Some(packet)) => Some(packet),
        Ok(None) => {
            *ended = true;
            None
        }
        Err(e) => {
            *ended = true;
            port_failed(name, e, errors);
            None
        }
    }
}

#[cold]
fn port_failed(name: &str, e: std::io::Error, errors: &mut Vec<String>) {
    errors.push(format!("reading {name}: {e}"));
}

/// What a reader does with each packet of the input (the dispatcher, the shared reader, a
/// worker reading its own shard or its chunks of a file).
pub(crate) mod ingress {
    use super::*;

    /// Whether a packet of `len` bytes fits a burst; one that does not is counted in
    /// `stats` if given (the packets the input drops before any worker: oversize here,
    /// malformed in [`reject_malformed`]).
    pub fn fits(len: usize, stats: Option<&mut Stats>) -> bool {
        let fits = len <= MAX_FRAME;
        if let (false, Some(stats)) = (fits, stats) {
            count_port_drop(stats, DropReason::OVERSIZE, len as u32);
        }
        fits
    }

    /// Counts a packet of `len` bytes as malformed in `stats`, if given.
    pub fn reject_malformed(len: usize, why: Malformed, stats: Option<&mut Stats>) {
        if let Some(stats) = stats {
            count_malformed(stats, why, len as u32);
        }
    }

    /// Parses `packet`, which arrived on `port`, into `out` (a scratch the caller keeps,
    /// so that the parse is copied once, into the descriptor of the burst its hash
    /// chooses): what of it goes into a burst (`bytes`), or `None` when that is too large
    /// for one or the packet is malformed, which is counted in `stats` if given. A whole
    /// packet is measured before it is parsed; one kept to its headers after, by them, so
    /// that a segment above 64 KiB (BIG TCP, GRO) is read.
    #[inline]
    pub fn parse<'a>(
        packet: &RxPacket<'a>,
        port: PortId,
        hasher: &FlowHasher,
        out: &mut Parsed,
        bytes: PacketBytes,
        mut stats: Option<&mut Stats>,
    ) -> Option<RxPacket<'a>> {
        let len = packet.data.len();
        if bytes == PacketBytes::Whole && !fits(len, stats.as_deref_mut()) {
            return None;
        }
        if let Err(m) = stateplane_wire::parse_in_place(packet.data, port, hasher, out) {
            reject_malformed(len, m, stats);
            return None;
        }
        match bytes {
            PacketBytes::Whole => Some(*packet),
            PacketBytes::Headers => {
                let kept = bytes.kept(packet, out);
                fits(kept.data.len(), stats).then_some(kept)
            }
        }
    }
}

/// Which bytes of each packet go into the bursts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PacketBytes {
    /// The packet as the file holds it.
    #[default]
    Whole,
    /// Its headers, up to where the parser found the transport payload to start (the whole
    /// packet where it did not get that far), as a capture cut at that length would hold
    /// it: for programs that read the parsed headers and no payload, such as a flow
    /// monitor's, so that the payload is not copied. The workers' received bytes count
    /// what is kept. Read by [`OwnShard`] and [`crate::chunked::ChunkShard`].
    Headers,
}

impl PacketBytes {
    /// What of `packet`, parsed as `parsed`, goes into a burst.
    #[inline]
    pub(crate) fn kept<'a>(self, packet: &RxPacket<'a>, parsed: &Parsed) -> RxPacket<'a> {
        let headers = usize::from(parsed.payload_offset);
        match self {
            PacketBytes::Headers if headers > 0 && headers < packet.data.len() => RxPacket {
                data: &packet.data[..headers],
                ..*packet
            },
            _ => *packet,
        }
    }
}

/// A per-worker source of whole bursts (a replay queue, a live socket in a fanout group).
pub trait BurstSource: Send {
    /// Fills `burst` (cleared by the caller); returns `false` once the source is exhausted
    /// and nothing was added.
    fn fill(&mut self, burst: &mut Burst) -> bool;

    /// After the last fill: what the source itself counted (packets it dropped before the
    /// worker) and the errors it met.
    fn finish(&mut self) -> (Stats, Vec<String>) {
        (Stats::default(), Vec::new())
    }
}

/// A worker's share of capture-file ports, read by the worker itself: it reads and parses
/// every packet in time order and keeps those of its shard (the dispatcher's
/// [`shard_of`]), so that a run over files needs no dispatcher thread and no queues. The
/// price is parsing every packet once per worker; for a worker whose per-packet work is
/// light (the flow stage), that is less than a thread between reader and worker costs.
/// Oversize and malformed packets are counted by worker 0's shard only. Worker 0 reports
/// the bytes read (for progress).
pub struct OwnShard {
    input: Merged,
    worker: usize,
    workers: usize,
    hasher: FlowHasher,
    bytes: PacketBytes,
    /// What worker 0's shard dropped before its worker: every shard's drops, counted once.
    stats: Stats,
    round: u64,
    input_bytes: Option<Arc<AtomicU64>>,
}

impl OwnShard {
    /// Worker `worker`'s (of `workers`) shard of the ports `rx` (each worker opens its
    /// own), hashing as the run's `hasher`, keeping `bytes` of each packet.
    pub fn new(
        rx: Vec<(PortId, Box<dyn RxPort>)>,
        worker: usize,
        workers: usize,
        hasher: FlowHasher,
        bytes: PacketBytes,
        handle: &RunHandle,
    ) -> OwnShard {
        OwnShard {
            input: Merged::open(rx),
            worker,
            workers: workers.max(1),
            hasher,
            bytes,
            stats: Stats::default(),
            round: 0,
            input_bytes: (worker == 0).then(|| handle.input_bytes.clone()),
        }
    }
}

impl BurstSource for OwnShard {
    fn fill(&mut self, burst: &mut Burst) -> bool {
        let mut parsed = Parsed::EMPTY;
        while burst.len() < burst.capacity() {
            // Only worker 0's shard counts what the input drops, so it is counted once.
            let mut stats = (self.worker == 0).then_some(&mut self.stats);
            let (hasher, worker, workers) = (&self.hasher, self.worker, self.workers);
            let bytes = self.bytes;
            let offered = self.input.offer(|Offered { port, seq, packet }| {
                if bytes == PacketBytes::Headers {
                    // Parsed first, so that only what is kept is copied.
                    let kept = ingress::parse(&packet, port, hasher, &mut parsed, bytes, stats);
                    return match kept {
                        Some(kept) if shard_of(parsed.hash, workers) == worker => {
                            burst.push_parsed(&kept, port, seq, &parsed)
                        }
                        _ => true, // another worker's, or counted and dropped
                    };
                }
                let len = packet.data.len();
                if !ingress::fits(len, stats.as_deref_mut()) {
                    return true; // counted and dropped
                }
                // Pushed first and parsed where it lies (no parse result copied about),
                // then taken back out if it is another worker's or malformed.
                if !burst.push(packet.data, packet.orig_len, packet.ts_ns, port, seq) {
                    return false; // the packet opens the next burst
                }
                match burst.parse_last(hasher) {
                    Some(Ok(hash)) if shard_of(hash, workers) == worker => {}
                    Some(Err(m)) => {
                        ingress::reject_malformed(len, m, stats);
                        burst.pop();
                    }
                    _ => burst.pop(),
                }
                true
            });
            if offered != Some(true) {
                break;
            }
        }
        if let Some(bytes) = &self.input_bytes {
            bytes.store(self.input.bytes_read(), Ordering::Relaxed);
        }
        burst.round = self.round;
        burst.now_ns = self.input.now_ns;
        burst.parsed = true;
        self.round += 1;
        !burst.is_empty()
    }

    fn finish(&mut self) -> (Stats, Vec<String>) {
        (
            std::mem::take(&mut self.stats),
            std::mem::take(&mut self.input.errors),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::MemoryRx;
    use std::io;

    /// A port in memory that fails with an error after `fail_after` packets, if set.
    struct Failing {
        rx: MemoryRx,
        left: Option<usize>,
    }

    impl RxPort for Failing {
        fn name(&self) -> &str {
            self.rx.name()
        }
        fn next_packet(&mut self) -> io::Result<Option<RxPacket<'_>>> {
            match &mut self.left {
                Some(0) => return Err(io::Error::other("cut short")),
                Some(left) => *left -= 1,
                None => {}
            }
            self.rx.next_packet()
        }
    }

    /// A port whose packets are each a byte naming it and their index, at `times`.
    fn port(tag: u8, times: &[u64], fail_after: Option<usize>) -> Box<dyn RxPort> {
        let packets = (times.iter().enumerate())
            .map(|(i, &ts)| (ts, vec![tag, i as u8]))
            .collect();
        Box::new(Failing {
            rx: MemoryRx::new(packets),
            left: fail_after,
        })
    }

    /// Takes every packet, declining each one the first time when `decline_first` (as a
    /// full burst does): `(port, seq, data)` in the order taken.
    fn read_all(input: &mut Merged, decline_first: bool) -> Vec<(PortId, u64, Vec<u8>)> {
        let mut taken = Vec::new();
        let mut declined = false;
        while let Some(took) = input.offer(|o| {
            if decline_first && !declined {
                declined = true;
                return false;
            }
            declined = false;
            taken.push((o.port, o.seq, o.packet.data.to_vec()));
            true
        }) {
            assert!(took || decline_first);
        }
        taken
    }

    #[test]
    fn one_port_gives_its_packets_in_order_and_again_when_declined() {
        for decline_first in [false, true] {
            let mut input = Merged::open(vec![(3, port(7, &[10, 20, 30], None))]);
            let got = read_all(&mut input, decline_first);
            let want = vec![(3, 0, vec![7, 0]), (3, 1, vec![7, 1]), (3, 2, vec![7, 2])];
            assert_eq!(got, want, "decline_first: {decline_first}");
            assert!(input.done());
            assert_eq!(input.now_ns, 30);
            assert!(input.errors.is_empty());
        }
    }

    #[test]
    fn ports_merge_by_time_and_a_declined_packet_keeps_its_place() {
        for decline_first in [false, true] {
            let mut input = Merged::open(vec![
                (0, port(0, &[10, 40, 50], None)),
                (1, port(1, &[20, 30, 60], None)),
            ]);
            let got = read_all(&mut input, decline_first);
            let order: Vec<(PortId, u64, u8)> =
                got.iter().map(|(p, s, d)| (*p, *s, d[1])).collect();
            assert_eq!(
                order,
                vec![
                    (0, 0, 0),
                    (1, 1, 0),
                    (1, 2, 1),
                    (0, 3, 1),
                    (0, 4, 2),
                    (1, 5, 2)
                ]
            );
            assert!(input.done());
            assert_eq!(input.now_ns, 60);
        }
    }

    #[test]
    fn a_port_that_fails_ends_with_its_error_and_the_others_go_on() {
        let mut one = Merged::open(vec![(0, port(0, &[1, 2, 3], Some(2)))]);
        assert_eq!(read_all(&mut one, true).len(), 2);
        assert_eq!(one.errors, vec!["reading memory: cut short".to_string()]);
        assert!(one.done());

        let mut two = Merged::open(vec![
            (0, port(0, &[1, 2, 3], Some(1))),
            (1, port(1, &[4, 5], None)),
        ]);
        let ports: Vec<PortId> = read_all(&mut two, false).iter().map(|t| t.0).collect();
        assert_eq!(ports, vec![0, 1, 1]);
        assert_eq!(two.errors.len(), 1);
        assert!(two.done());
    }

    #[test]
    fn an_empty_input_offers_nothing() {
        let mut input = Merged::open(vec![(0, port(0, &[], None))]);
        assert_eq!(input.offer(|_| panic!("nothing to offer")), None);
        assert!(input.done());
        let mut none = Merged::open(Vec::new());
        assert_eq!(none.offer(|_| panic!("nothing to offer")), None);
        assert!(none.done());
    }
}
