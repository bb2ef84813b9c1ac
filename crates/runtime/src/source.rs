//! Sources of bursts for one worker: capture-file ports merged by time ([`Merged`]), a
//! worker's own shard of them ([`OwnShard`]), and what every reader does with a packet
//! ([`ingress`]).

use crate::burst::{Burst, MAX_FRAME};
use crate::counters::Stats;
use crate::port::{RxPacket, RxPort};
use crate::program::{DropReason, PortId};
use crate::run_config::RunHandle;
use crate::worker::{count_malformed, count_port_drop};
use stateplane_wire::flow::shard_of;
use stateplane_wire::{FlowHasher, Malformed, Parsed};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The next packet of one input port, staged so that ports can be merged by time. Each
/// port keeps one `Head` for the whole run; its buffer grows to the largest frame and is
/// reused.
pub(crate) struct Head {
    pub(crate) port: PortId,
    pub(crate) data: Vec<u8>,
    pub(crate) orig_len: u32,
    pub(crate) ts_ns: u64,
    /// False once the port's input has ended (or failed).
    live: bool,
}

impl Head {
    pub(crate) fn packet(&self) -> RxPacket<'_> {
        RxPacket {
            data: &self.data,
            orig_len: self.orig_len,
            ts_ns: self.ts_ns,
        }
    }

    /// Stages the port's next packet, or marks the port ended.
    pub(crate) fn refill(&mut self, rx: &mut dyn RxPort) -> std::io::Result<()> {
        self.live = false;
        if let Some(p) = rx.next_packet()? {
            self.data.clear();
            self.data.extend_from_slice(p.data);
            self.orig_len = p.orig_len;
            self.ts_ns = p.ts_ns;
            self.live = true;
        }
        Ok(())
    }
}

/// Capture-file ports read in timestamp order across ports, the earliest next packet first:
/// what the dispatcher reads, and what a worker reading its own shard reads.
pub(crate) struct Merged {
    rx: Vec<(PortId, Box<dyn RxPort>)>,
    pub(crate) heads: Vec<Head>,
    /// The input sequence number of the current packet.
    pub(crate) seq: u64,
    /// The latest timestamp read so far.
    pub(crate) now_ns: u64,
    /// The port [`Merged::earliest`] last gave.
    current: Option<usize>,
    pub(crate) errors: Vec<String>,
}

impl Merged {
    pub(crate) fn open(mut rx: Vec<(PortId, Box<dyn RxPort>)>) -> Merged {
        let mut errors = Vec::new();
        let mut heads = Vec::with_capacity(rx.len());
        for (port, src) in rx.iter_mut() {
            let mut head = Head {
                port: *port,
                data: Vec::new(),
                orig_len: 0,
                ts_ns: 0,
                live: false,
            };
            if let Err(e) = head.refill(src.as_mut()) {
                errors.push(format!("reading {}: {e}", src.name()));
            }
            heads.push(head);
        }
        Merged {
            rx,
            heads,
            seq: 0,
            now_ns: 0,
            current: None,
            errors,
        }
    }

    /// The port whose next packet is the earliest, if any input is left; the clock moves to
    /// that packet.
    pub(crate) fn earliest(&mut self) -> Option<&Head> {
        let i = self.step()?;
        Some(&self.heads[i])
    }

    /// [`Merged::earliest`] as an index into `heads`, so that a caller can read the packet
    /// and the clock together.
    pub(crate) fn step(&mut self) -> Option<usize> {
        let i = (self.heads.iter().enumerate())
            .filter(|(_, h)| h.live)
            .min_by_key(|(_, h)| h.ts_ns)
            .map(|(i, _)| i)?;
        self.current = Some(i);
        self.now_ns = self.now_ns.max(self.heads[i].ts_ns);
        Some(i)
    }

    /// Moves past the current packet: the next sequence number, and its port's next packet.
    pub(crate) fn advance(&mut self) {
        let Some(i) = self.current.take() else {
            return;
        };
        self.seq += 1;
        let src = &mut self.rx[i].1;
        if let Err(e) = self.heads[i].refill(src.as_mut()) {
            self.errors.push(format!("reading {}: {e}", src.name()));
        }
    }

    pub(crate) fn done(&self) -> bool {
        self.heads.iter().all(|h| !h.live)
    }

    pub(crate) fn bytes_read(&self) -> u64 {
        self.rx.iter().map(|(_, src)| src.bytes_read()).sum()
    }
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
    /// chooses): `false` when it is oversize or malformed, which is counted in `stats` if
    /// given.
    pub fn parse(
        packet: &RxPacket,
        port: PortId,
        hasher: &FlowHasher,
        out: &mut Parsed,
        mut stats: Option<&mut Stats>,
    ) -> bool {
        let len = packet.data.len();
        if !fits(len, stats.as_deref_mut()) {
            return false;
        }
        stateplane_wire::parse_in_place(packet.data, port, hasher, out)
            .map_err(|m| reject_malformed(len, m, stats))
            .is_ok()
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
    /// What worker 0's shard dropped before its worker: every shard's drops, counted once.
    stats: Stats,
    round: u64,
    input_bytes: Option<Arc<AtomicU64>>,
}

impl OwnShard {
    /// Worker `worker`'s (of `workers`) shard of the ports `rx` (each worker opens its
    /// own), hashing as the run's `hasher`.
    pub fn new(
        rx: Vec<(PortId, Box<dyn RxPort>)>,
        worker: usize,
        workers: usize,
        hasher: FlowHasher,
        handle: &RunHandle,
    ) -> OwnShard {
        OwnShard {
            input: Merged::open(rx),
            worker,
            workers: workers.max(1),
            hasher,
            stats: Stats::default(),
            round: 0,
            input_bytes: (worker == 0).then(|| handle.input_bytes.clone()),
        }
    }
}

impl BurstSource for OwnShard {
    fn fill(&mut self, burst: &mut Burst) -> bool {
        while burst.len() < burst.capacity() {
            let seq = self.input.seq;
            let Some(head) = self.input.earliest() else {
                break;
            };
            // Only worker 0's shard counts what the input drops, so it is counted once.
            let mut stats = (self.worker == 0).then_some(&mut self.stats);
            if ingress::fits(head.data.len(), stats.as_deref_mut()) {
                // Pushed first and parsed where it lies (no parse result copied about),
                // then taken back out if it is another worker's or malformed.
                if !burst.push(&head.data, head.orig_len, head.ts_ns, head.port, seq) {
                    break; // the packet opens the next burst
                }
                match burst.parse_last(&self.hasher) {
                    Some(Ok(hash)) if shard_of(hash, self.workers) == self.worker => {}
                    Some(Err(m)) => {
                        ingress::reject_malformed(head.data.len(), m, stats);
                        burst.pop();
                    }
                    _ => burst.pop(),
                }
            }
            self.input.advance();
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
