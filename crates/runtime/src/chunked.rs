//! One capture file read by all the workers at once, with no reader thread: each worker
//! reads and parses its turn of the file's chunks and hands the other workers their flows'
//! packets, so that every packet is read and parsed once, and reading grows with the
//! workers instead of bounding them.
//!
//! Chunk `k` is read by worker `k % N`. A chunk is the whole records in one read of
//! `chunk_bytes` from where the chunk before it ended. Its reader walks it first and passes
//! on where the next chunk starts (with the packet count, the input's clock, and the
//! format's context there, such as the pcapng interfaces described so far), so the next
//! chunk's reader starts while this one parses. Parsing takes the packets the walk found
//! (it does not read their records again) and sorts them into one share per worker, by
//! flow hash (the dispatcher's [`shard_of`]).
//!
//! Each worker processes the shares of chunks 0, 1, 2, ... in that order, its own and the
//! others', so each flow's packets reach their worker in file order, as from the
//! dispatcher. A worker reads its own next chunks before it waits for the others' shares
//! (up to `AHEAD` of its own ahead of the chunk it processes), so that the workers read
//! at the same time rather than in turn, and one slow chunk does not stall the others.
//!
//! Must never: block on a send (shares and spent bursts travel on unbounded channels; what
//! is in flight stays bounded because no worker reads more than `AHEAD` of its chunks
//! ahead of what it processes, and it processes only what every worker has read), or wait
//! for a worker that has stopped (its channels close, which reads as the input's end).
//! It cannot deadlock: the lowest chunk not yet read has its start known (the chunk before
//! it is read), and its reader is not waiting on anything else, since a worker reads its
//! own chunks up to `AHEAD` ahead before it waits for a share of an earlier chunk.

use crate::burst::Burst;
use crate::counters::Stats;
use crate::port::{ChunkedFile, RxPacket};
use crate::program::PortId;
use crate::run_config::RunHandle;
use crate::source::{BurstSource, ingress};
use crossbeam_channel::{Receiver, Sender, unbounded};
use stateplane_wire::flow::shard_of;
use stateplane_wire::{FlowHasher, Parsed};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A chunk's size where nothing else is asked for. A chunk and the bursts made from it
/// should stay in the reading core's cache: on this project's 2-core machine (1 MiB of L2
/// per core), two workers took the same time with chunks of 64 to 256 KiB, and 1.3x as
/// long with 1 MiB, 1.5x with 4 MiB (BENCHMARKS.md, flow export, says how).
pub const CHUNK_BYTES: usize = 256 << 10;

/// How many of its own chunks a worker reads ahead of the one it processes, so that
/// neither waits when one worker's chunk takes longer.
const AHEAD: usize = 2;

/// Where a chunk starts, passed from each chunk's reader to the next one's.
#[derive(Debug, Clone)]
struct ChunkStart<C> {
    offset: u64,
    /// The format's context there (what its records need from the ones before).
    context: C,
    /// The input sequence number of the chunk's first packet.
    seq: u64,
    /// The input's clock before the chunk: the latest timestamp of the chunks before it.
    clock_ns: u64,
}

/// A packet the walk of a chunk found: where its data lies in the chunk, its length on the
/// wire and its time, so that parsing the chunk does not read its record again.
#[derive(Debug, Clone, Copy)]
struct Walked {
    at: usize,
    len: usize,
    orig_len: u32,
    ts_ns: u64,
}

/// A chunk's start, or `None` once the input has ended before it.
type Start<C> = Option<ChunkStart<C>>;

/// One worker's packets of one chunk, in file order, or `None` where the input ended.
type Share = Option<Vec<Burst>>;

/// How the workers of one file reach each other.
struct Channels<C> {
    /// Chunk starts, from the reader of each chunk to the next one's.
    starts: Receiver<Start<C>>,
    next_reader: Sender<Start<C>>,
    /// Shares from each worker (this one's own entry stays unused), and to each.
    shares_in: Vec<Receiver<Share>>,
    shares_out: Vec<Sender<Share>>,
    /// Bursts given back to this worker to fill again, a share's at once, and the way
    /// back to each worker.
    spent_in: Receiver<Vec<Burst>>,
    spent_out: Vec<Sender<Vec<Burst>>>,
}

/// A worker's source of bursts from a capture file read in chunks by all the workers (see
/// the module doc).
pub struct ChunkShard<F: ChunkedFile> {
    worker: usize,
    workers: usize,
    file: Arc<F>,
    port: PortId,
    hasher: FlowHasher,
    burst_size: usize,
    chunk_bytes: usize,
    channels: Channels<F::Context>,
    /// The chunk whose share is processed next.
    next_chunk: u64,
    /// The share being handed out, the worker its bursts go back to, and those of its
    /// bursts already processed, which go back together once it is done: one message a
    /// share, not one a burst.
    current: VecDeque<Burst>,
    current_from: usize,
    spent: Vec<Burst>,
    /// Bursts this worker may fill (its own, and those given back).
    free: Vec<Burst>,
    /// This worker's own shares of the chunks it has read and not processed, in order.
    own: VecDeque<Share>,
    /// The next chunk this worker reads; `None` once it has met the input's end.
    next_read: Option<u64>,
    /// Whether the input's end has been handed out.
    done: bool,
    /// What this worker's chunks hold: the records in `buf`, the packets among them, their
    /// shares.
    buf: Vec<u8>,
    walked: Vec<Walked>,
    building: Vec<Vec<Burst>>,
    /// What this worker's chunks dropped before any worker, and the errors it met.
    stats: Stats,
    errors: Vec<String>,
    input_bytes: Arc<AtomicU64>,
    round: u64,
}

impl<F: ChunkedFile + 'static> ChunkShard<F> {
    /// The sources of `workers` workers reading `file`, which arrives on `port`, in chunks
    /// of `chunk_bytes` (one that cannot hold a record whole grows to hold it), hashing as
    /// the run's `hasher`. The bytes read are added to `handle`'s count, for progress.
    pub fn for_workers(
        file: Arc<F>,
        port: PortId,
        workers: usize,
        hasher: FlowHasher,
        burst_size: usize,
        chunk_bytes: usize,
        handle: &RunHandle,
    ) -> Vec<Box<dyn BurstSource>> {
        let workers = workers.max(1);
        let (start_tx, start_rx): (Vec<_>, Vec<_>) = (0..workers).map(|_| unbounded()).unzip();
        let (spent_tx, spent_rx): (Vec<_>, Vec<_>) = (0..workers).map(|_| unbounded()).unzip();
        // One channel for each pair of workers, by receiver then sender.
        let (share_tx, share_rx): (Vec<Vec<_>>, Vec<Vec<_>>) = (0..workers)
            .map(|_| (0..workers).map(|_| unbounded::<Share>()).unzip())
            .unzip();
        let (offset, context) = file.first_record();
        let first = ChunkStart {
            offset,
            context,
            seq: 0,
            clock_ns: 0,
        };
        let _ = start_tx[0].send(Some(first));
        (share_rx.into_iter().zip(start_rx).zip(spent_rx).enumerate())
            .map(|(w, ((shares_in, starts), spent_in))| {
                let channels = Channels {
                    starts,
                    next_reader: start_tx[(w + 1) % workers].clone(),
                    shares_in,
                    shares_out: share_tx.iter().map(|to| to[w].clone()).collect(),
                    spent_in,
                    spent_out: spent_tx.clone(),
                };
                let shard = ChunkShard {
                    worker: w,
                    workers,
                    file: file.clone(),
                    port,
                    hasher,
                    burst_size,
                    chunk_bytes,
                    channels,
                    next_chunk: 0,
                    current: VecDeque::new(),
                    current_from: w,
                    spent: Vec::new(),
                    free: Vec::new(),
                    own: VecDeque::new(),
                    next_read: Some(w as u64),
                    done: false,
                    buf: vec![0; chunk_bytes],
                    walked: Vec::new(),
                    building: (0..workers).map(|_| Vec::new()).collect(),
                    stats: Stats::default(),
                    errors: Vec::new(),
                    input_bytes: handle.input_bytes.clone(),
                    round: 0,
                };
                Box::new(shard) as Box<dyn BurstSource>
            })
            .collect()
    }

    /// Reads this worker's next chunk: passes on where the one after it starts, sends
    /// each other worker its share and keeps its own; or, when the input has ended before
    /// it, says so to every worker and to the next reader.
    fn read_chunk(&mut self) {
        let Some(chunk) = self.next_read else {
            return;
        };
        let Ok(Some(start)) = self.channels.starts.recv() else {
            self.end_input();
            return;
        };
        let mut buf = std::mem::take(&mut self.buf);
        let (walked, next) = self.walk(&mut buf, &start);
        let _ = self.channels.next_reader.send(next);
        self.parse(&buf, &start);
        buf.truncate(self.chunk_bytes);
        self.buf = buf;
        self.input_bytes.fetch_add(walked as u64, Ordering::Relaxed);
        for (to, bursts) in self.building.iter_mut().enumerate() {
            let share = Some(std::mem::take(bursts));
            if to == self.worker {
                self.own.push_back(share);
            } else {
                let _ = self.channels.shares_out[to].send(share);
            }
        }
        self.next_read = Some(chunk + self.workers as u64);
    }

    /// Reads the chunk at `start` into `buf` and walks its records: how many bytes of
    /// whole records it holds, and where the next chunk starts (`None` if the input ends
    /// in this one, or cannot be read past a fault in it, which is kept as an error).
    fn walk(
        &mut self,
        buf: &mut Vec<u8>,
        start: &ChunkStart<F::Context>,
    ) -> (usize, Start<F::Context>) {
        let read = match self.file.read_at(start.offset, buf) {
            Ok(n) => n,
            Err(e) => return (0, self.fault(e)),
        };
        let at_end = read < buf.len();
        let bytes = &buf[..read];
        let (mut walked, mut clock_ns) = (0, start.clock_ns);
        let mut context = start.context.clone();
        self.walked.clear();
        loop {
            let at_byte = start.offset + walked as u64;
            match (self.file).record(&bytes[walked..], at_byte, at_end, &mut context) {
                Ok(Some(record)) => {
                    walked += record.len;
                    if let Some(packet) = record.packet {
                        clock_ns = clock_ns.max(packet.ts_ns);
                        self.walked.push(Walked {
                            // The packet's data lies inside `bytes`.
                            at: packet.data.as_ptr() as usize - bytes.as_ptr() as usize,
                            len: packet.data.len(),
                            orig_len: packet.orig_len,
                            ts_ns: packet.ts_ns,
                        });
                    }
                }
                Ok(None) if at_end || walked > 0 => break,
                Ok(None) => {
                    // A record longer than a chunk: read it whole (chunks are kept small
                    // to stay in the core's cache; records that long are rare).
                    let longest = self.file.max_record_len();
                    if buf.len() >= longest {
                        let e =
                            format!("a record at byte {at_byte} claims more than {longest} bytes");
                        return (walked, self.fault(e));
                    }
                    buf.resize(longest, 0);
                    return self.walk(buf, start);
                }
                Err(e) => return (walked, self.fault(e)),
            }
        }
        let next = ChunkStart {
            offset: start.offset + walked as u64,
            context,
            seq: start.seq + self.walked.len() as u64,
            clock_ns,
        };
        (walked, (!at_end).then_some(next))
    }

    /// Keeps `e` as the input's error, where it stops: no chunk starts after this one.
    fn fault(&mut self, e: impl std::fmt::Display) -> Start<F::Context> {
        self.errors
            .push(format!("reading {}: {e}", self.file.name()));
        None
    }

    /// Parses the packets the walk found in the chunk `bytes`, which starts at `start`,
    /// into each worker's share.
    fn parse(&mut self, bytes: &[u8], start: &ChunkStart<F::Context>) {
        let (mut seq, mut clock_ns) = (start.seq, start.clock_ns);
        let walked = std::mem::take(&mut self.walked);
        let mut parsed = Parsed::EMPTY;
        for w in &walked {
            let packet = RxPacket {
                data: &bytes[w.at..w.at + w.len],
                orig_len: w.orig_len,
                ts_ns: w.ts_ns,
            };
            clock_ns = clock_ns.max(packet.ts_ns);
            let (port, hasher) = (self.port, &self.hasher);
            if ingress::parse(&packet, port, hasher, &mut parsed, Some(&mut self.stats)) {
                let to = shard_of(parsed.hash, self.workers);
                (self.room(to, packet.data.len(), clock_ns))
                    .push_parsed(&packet, port, seq, &parsed);
            }
            seq += 1;
        }
        self.walked = walked;
        for bursts in &mut self.building {
            if let Some(last) = bursts.last_mut() {
                last.now_ns = clock_ns;
            }
        }
    }

    /// The burst of worker `to`'s share with room for a packet of `len` bytes: the last
    /// one, or a new one when that is full (sealed at the input's clock `now_ns`).
    fn room(&mut self, to: usize, len: usize, now_ns: u64) -> &mut Burst {
        let bursts = &mut self.building[to];
        if !bursts.last().is_some_and(|b| b.has_room(len)) {
            if let Some(full) = bursts.last_mut() {
                full.now_ns = now_ns;
            }
            if self.free.is_empty() {
                while let Ok(spent) = self.channels.spent_in.try_recv() {
                    self.free.extend(spent);
                }
            }
            let mut burst =
                (self.free.pop()).unwrap_or_else(|| Burst::with_capacity(self.burst_size));
            burst.clear();
            burst.parsed = true;
            bursts.push(burst);
        }
        let last = bursts.len() - 1;
        &mut bursts[last]
    }

    /// Gives the processed bursts of the share just done back to the worker that filled
    /// them (this worker's own go straight to its free list).
    fn give_back_spent(&mut self) {
        if self.spent.is_empty() {
            return;
        }
        if self.current_from == self.worker {
            self.free.append(&mut self.spent);
        } else {
            // The next share's list is made at this one's size: one allocation a share.
            let next = Vec::with_capacity(self.spent.len());
            let spent = std::mem::replace(&mut self.spent, next);
            let _ = self.channels.spent_out[self.current_from].send(spent);
        }
    }

    /// The input has ended before this worker's next chunk: every worker hears it there.
    fn end_input(&mut self) {
        for (to, out) in self.channels.shares_out.iter().enumerate() {
            if to != self.worker {
                let _ = out.send(None);
            }
        }
        self.own.push_back(None);
        let _ = self.channels.next_reader.send(None);
        self.next_read = None;
    }
}

impl<F: ChunkedFile + 'static> BurstSource for ChunkShard<F> {
    fn fill(&mut self, burst: &mut Burst) -> bool {
        loop {
            if let Some(mut next) = self.current.pop_front() {
                std::mem::swap(burst, &mut next);
                self.spent.push(next);
                burst.round = self.round;
                self.round += 1;
                return true;
            }
            self.give_back_spent();
            if self.done {
                return false;
            }
            let chunk = self.next_chunk;
            while self
                .next_read
                .is_some_and(|c| c < chunk + (AHEAD * self.workers) as u64)
            {
                self.read_chunk();
            }
            let from = (chunk % self.workers as u64) as usize;
            let share = if from == self.worker {
                self.own.pop_front().flatten()
            } else {
                self.channels.shares_in[from].recv().ok().flatten()
            };
            match share {
                Some(bursts) => {
                    self.current = bursts.into();
                    self.current_from = from;
                    self.next_chunk += 1;
                }
                None => self.done = true,
            }
        }
    }

    fn finish(&mut self) -> (Stats, Vec<String>) {
        (
            std::mem::take(&mut self.stats),
            std::mem::take(&mut self.errors),
        )
    }
}
