//! One capture file read by all the workers at once, with no reader thread: each worker
//! reads and parses its turn of the file's chunks and hands the other workers their flows'
//! packets, so that every packet is read and parsed once, and reading grows with the
//! workers instead of bounding them.
//!
//! Chunk `k` is read by worker `k % N`. A chunk is the records that start in the `k`-th
//! block of `chunk_bytes` after the file's first record. Its reader reads the block (and a
//! little past it, for the record that runs on into the next block) before it knows where
//! its first record starts, so that the workers' reads, the costly part, run at the same
//! time. Then it waits for that start from the reader of the chunk before (with the packet
//! count, the input's clock, and the format's context there, such as the pcapng
//! interfaces described so far), walks its records, and passes on where the first record
//! after its block starts, so the next chunk's walk starts while this one parses. Parsing
//! takes the packets the walk found (it does not read their records again) and sorts them
//! into one share per worker, by flow hash (the dispatcher's [`shard_of`]).
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
//! It cannot deadlock: the lowest chunk not yet walked has its start known (the chunk
//! before it is walked), and its reader is not waiting on anything else, since a worker
//! reads its own chunks up to `AHEAD` ahead before it waits for a share of an earlier
//! chunk, and a read waits on nothing.

use crate::burst::Burst;
use crate::counters::Stats;
use crate::port::{ChunkedFile, RxPacket, SeenAt};
use crate::program::PortId;
use crate::run_config::RunHandle;
use crate::source::{BurstSource, PacketBytes, ingress};
use crossbeam_channel::{Receiver, Sender, unbounded};
use stateplane_wire::flow::shard_of;
use stateplane_wire::{FlowHasher, Parsed};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A chunk's size where nothing else is asked for. A block read should stay in the
/// reading core's cache (1 MiB of L2 per core on this project's 2-core machine) while it
/// is parsed, and a chunk should be long enough that the hand-offs between workers, each
/// a context switch when the other worker is not ready, are few. To choose again, change
/// it and run `scripts/compare-flow-exporters.sh` (its long realistic trace, two workers):
/// 128 KiB to 1 MiB took the same time within this machine's noise, 64 KiB was slower.
pub const CHUNK_BYTES: usize = 256 << 10;

/// How many of its own chunks a worker reads ahead of the one it processes, so that
/// neither waits when one worker's chunk takes longer.
const AHEAD: usize = 2;

/// Bytes read past a block's end with it, so that the record that starts in the block and
/// runs on into the next is read whole with it (a longer one takes a second read).
const SLACK: usize = 2048;

/// How the workers read a file in chunks.
#[derive(Clone, Copy, Debug)]
pub struct ChunkConfig {
    pub workers: usize,
    /// The run's flow hasher: a flow's packets go to the worker its hash chooses.
    pub hasher: FlowHasher,
    pub burst_size: usize,
    pub chunk_bytes: usize,
    pub bytes: PacketBytes,
}

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
    file: Arc<F>,
    port: PortId,
    config: ChunkConfig,
    /// Where the first record starts: block `k` starts `k * chunk_bytes` after it.
    first: u64,
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
    /// What this worker's chunks hold: the bytes read from its block's start, the packets
    /// among them, their shares.
    buf: Vec<u8>,
    walked: Vec<Walked>,
    building: Vec<Vec<Burst>>,
    /// What this worker's chunks dropped before any worker, and the errors it met.
    stats: Stats,
    errors: Vec<String>,
    input_bytes: Arc<AtomicU64>,
    round: u64,
}

/// The bytes of a block read so far: `buf[..read]` holds the file from `offset`, and
/// `at_end` says that they run to the file's end.
#[derive(Clone, Copy, Debug)]
struct BlockRead {
    offset: u64,
    read: usize,
    at_end: bool,
}

impl<F: ChunkedFile + 'static> ChunkShard<F> {
    /// The sources of `config.workers` workers reading `file`, which arrives on `port`, in
    /// chunks. The bytes read are added to `handle`'s count, for progress.
    pub fn for_workers(
        file: Arc<F>,
        port: PortId,
        config: ChunkConfig,
        handle: &RunHandle,
    ) -> Vec<Box<dyn BurstSource>> {
        let config = ChunkConfig {
            workers: config.workers.max(1),
            chunk_bytes: config.chunk_bytes.max(1),
            ..config
        };
        let workers = config.workers;
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
                    file: file.clone(),
                    port,
                    config,
                    first: offset,
                    channels,
                    next_chunk: 0,
                    current: VecDeque::new(),
                    current_from: w,
                    spent: Vec::new(),
                    free: Vec::new(),
                    own: VecDeque::new(),
                    next_read: Some(w as u64),
                    done: false,
                    buf: vec![0; config.chunk_bytes + SLACK],
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

    /// Reads this worker's next chunk: reads its block, waits for where its first record
    /// starts, passes on where the next chunk's does, sends each other worker its share
    /// and keeps its own; or, when the input has ended before it, says so to every worker
    /// and to the next reader.
    fn read_chunk(&mut self) {
        let Some(chunk) = self.next_read else {
            return;
        };
        let block_bytes = self.config.chunk_bytes as u64;
        let offset = chunk.saturating_mul(block_bytes).saturating_add(self.first);
        self.buf.resize(self.config.chunk_bytes + SLACK, 0);
        // Before the wait: the reads of the workers' blocks overlap.
        let read = self
            .file
            .read_at(offset, &mut self.buf)
            .map(|read| BlockRead {
                offset,
                read,
                at_end: read < self.buf.len(),
            });
        let Ok(Some(start)) = self.channels.starts.recv() else {
            self.end_input();
            return;
        };
        let (walked, next) = match read {
            Ok(block) => self.walk(block, offset.saturating_add(block_bytes), &start),
            Err(e) => (0, self.fault(e)),
        };
        let _ = self.channels.next_reader.send(next);
        let buf = std::mem::take(&mut self.buf);
        self.parse(&buf, &start);
        self.buf = buf;
        self.input_bytes.fetch_add(walked, Ordering::Relaxed);
        for (to, bursts) in self.building.iter_mut().enumerate() {
            let share = Some(std::mem::take(bursts));
            if to == self.worker {
                self.own.push_back(share);
            } else {
                let _ = self.channels.shares_out[to].send(share);
            }
        }
        self.next_read = Some(chunk + self.config.workers as u64);
    }

    /// Walks the records that start from `start` up to `block_end` in the block read into
    /// `buf` (reading on where a record runs past what is read): how many bytes they take,
    /// and where the next chunk starts (`None` if the input ends in this one, or cannot be
    /// read past a fault in it, which is kept as an error).
    fn walk(
        &mut self,
        mut block: BlockRead,
        block_end: u64,
        start: &ChunkStart<F::Context>,
    ) -> (u64, Start<F::Context>) {
        let (mut at, mut clock_ns) = (start.offset, start.clock_ns);
        let mut context = start.context.clone();
        self.walked.clear();
        while at < block_end {
            // The start of a block's first record lies in what was read of it, since the
            // record before it ended there (and nothing is read past the file's end).
            let Some(from) = (at.checked_sub(block.offset))
                .and_then(|from| usize::try_from(from).ok())
                .filter(|&from| from <= block.read)
            else {
                let e = format!("byte {at} lies outside the chunk read at {}", block.offset);
                return (at - start.offset, self.fault(e));
            };
            let bytes = &self.buf[from..block.read];
            match self.file.record(bytes, at, block.at_end, &mut context) {
                Ok(Some(record)) => {
                    at += record.len as u64;
                    if let Some(packet) = record.packet {
                        clock_ns = clock_ns.max(packet.ts_ns);
                        self.walked.push(Walked {
                            // The packet's data lies inside `buf`.
                            at: packet.data.as_ptr() as usize - self.buf.as_ptr() as usize,
                            len: packet.data.len(),
                            orig_len: packet.orig_len,
                            ts_ns: packet.ts_ns,
                        });
                    }
                }
                Ok(None) if block.at_end => break,
                Ok(None) => {
                    // The record runs past what was read: read on, to its longest.
                    let longest = self.file.max_record_len();
                    if bytes.len() >= longest {
                        let e = format!("a record at byte {at} claims more than {longest} bytes");
                        return (at - start.offset, self.fault(e));
                    }
                    self.buf.resize(from + longest, 0);
                    let more = block.offset + block.read as u64;
                    match self.file.read_at(more, &mut self.buf[block.read..]) {
                        Ok(n) => {
                            block.read += n;
                            block.at_end = block.read < self.buf.len();
                        }
                        Err(e) => return (at - start.offset, self.fault(e)),
                    }
                }
                Err(e) => return (at - start.offset, self.fault(e)),
            }
        }
        let ended = block.at_end && at == block.offset + block.read as u64;
        let next = ChunkStart {
            offset: at,
            context,
            seq: start.seq + self.walked.len() as u64,
            clock_ns,
        };
        (at - start.offset, (!ended).then_some(next))
    }

    /// Keeps `e` as the input's error, where it stops: no chunk starts after this one.
    fn fault(&mut self, e: impl std::fmt::Display) -> Start<F::Context> {
        self.errors
            .push(format!("reading {}: {e}", self.file.name()));
        None
    }

    /// Parses the packets the walk found in the block read into `bytes`, from `start`,
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
                // Chunks are read from Ethernet captures only, which say nothing of this.
                seen: SeenAt::default(),
            };
            clock_ns = clock_ns.max(packet.ts_ns);
            let (port, hasher) = (self.port, &self.config.hasher);
            let (bytes, stats) = (self.config.bytes, Some(&mut self.stats));
            if let Some(kept) = ingress::parse(&packet, port, hasher, &mut parsed, bytes, stats) {
                let to = shard_of(parsed.hash, self.config.workers);
                (self.room(to, kept.data.len(), clock_ns)).push_parsed(&kept, port, seq, &parsed);
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
                (self.free.pop()).unwrap_or_else(|| Burst::with_capacity(self.config.burst_size));
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
                .is_some_and(|c| c < chunk + (AHEAD * self.config.workers) as u64)
            {
                self.read_chunk();
            }
            let from = (chunk % self.config.workers as u64) as usize;
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
