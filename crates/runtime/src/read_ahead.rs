//! Reading ahead of workers on threads of their own: [`ReadAhead`].

use crate::burst::Burst;
use crate::counters::Stats;
use crate::port::RxPort;
use crate::program::PortId;
use crate::run_config::RunHandle;
use crate::source::{BurstSource, Merged, Offered, PacketBytes, ingress};
use crossbeam_channel::{Receiver, Sender, bounded};
use stateplane_wire::flow::shard_of;
use stateplane_wire::{FlowHasher, Parsed};
use std::sync::atomic::{AtomicU64, Ordering};

/// A worker's bursts, filled ahead of it by a reader thread, so that reading and parsing
/// overlap the worker's processing: a thread of the worker's own running a burst source
/// ([`ReadAhead::spawn`], e.g. an [`OwnShard`]), or one thread for all workers
/// ([`ReadAhead::spawn_shared`]). Bursts travel between the threads in batches, full one
/// way and spent the other, so that the threads wake each other once per batch rather than
/// once per burst (a wake per burst cost more than the overlap gained).
pub struct ReadAhead {
    full: Option<Receiver<FullBatch>>,
    spent: Option<Sender<Vec<Burst>>>,
    /// The batch being handed out: `batch[next..filled]` are still to come.
    batch: Vec<Burst>,
    next: usize,
    filled: usize,
    /// The reader ends after its last batch and drops its sender, so a `recv` after that
    /// batch fails: the end of the input. It returns what its source counted and met; a
    /// reader shared by several workers is joined by the first one's (the others have
    /// `None` here).
    reader: Option<std::thread::JoinHandle<(Stats, Vec<String>)>>,
}

impl ReadAhead {
    /// Bursts per batch, and batches in flight: 64 x 64 packets ahead per batch, and
    /// enough batches that neither side waits while the other is busy. The reader is the
    /// slower side of a flow monitor, and waking its waiting worker costs it 15 µs on this
    /// project's 2-core VM: 64 bursts a batch took a fifth less time than 16 on one worker
    /// (`perf stat` of `stateplane flows` on BENCHMARKS.md's 5-million-packet traces, with
    /// bursts that keep headers only, 2026-11-26).
    const BATCH: usize = 64;
    const BATCHES: usize = 4;

    /// Runs `source` on a new thread named `name`, filling bursts of `burst_size`.
    pub fn spawn(
        source: Box<dyn BurstSource>,
        burst_size: usize,
        name: String,
    ) -> std::io::Result<ReadAhead> {
        let (lane, full_rx, spent_tx) = Self::channels(burst_size);
        let reader = std::thread::Builder::new().name(name).spawn(move || {
            let mut source = source;
            while let Ok(mut batch) = lane.spent.recv() {
                let mut filled = 0;
                for burst in batch.iter_mut() {
                    burst.clear();
                    if !source.fill(burst) {
                        break;
                    }
                    filled += 1;
                }
                let ended = filled < batch.len();
                if lane.full.send((batch, filled)).is_err() || ended {
                    break;
                }
            }
            source.finish()
        })?;
        Ok(ReadAhead::receiving(full_rx, spent_tx, Some(reader)))
    }

    /// A worker's end of the channels a reader thread fills (see [`ReadAhead::spawn`]);
    /// `reader` if this worker joins it.
    fn receiving(
        full: Receiver<FullBatch>,
        spent: Sender<Vec<Burst>>,
        reader: Option<std::thread::JoinHandle<(Stats, Vec<String>)>>,
    ) -> ReadAhead {
        ReadAhead {
            full: Some(full),
            spent: Some(spent),
            batch: Vec::new(),
            next: 0,
            filled: 0,
            reader,
        }
    }

    /// Bursts ready to be filled, in batches, and their channels: the worker's ends, then
    /// the reader's.
    fn channels(burst_size: usize) -> (Lane, Receiver<FullBatch>, Sender<Vec<Burst>>) {
        let (full_tx, full_rx) = bounded::<FullBatch>(Self::BATCHES);
        let (spent_tx, spent_rx) = bounded::<Vec<Burst>>(Self::BATCHES);
        for _ in 0..Self::BATCHES {
            let batch = (0..Self::BATCH)
                .map(|_| Burst::with_capacity(burst_size))
                .collect();
            let _ = spent_tx.send(batch);
        }
        let lane = Lane {
            full: full_tx,
            spent: spent_rx,
            batch: Vec::new(),
            filled: 0,
            round: 0,
        };
        (lane, full_rx, spent_tx)
    }

    /// One reader thread for `workers` workers: it reads the capture-file ports `rx` once,
    /// in time order, parses each packet and hands it to its shard's worker (the
    /// dispatcher's [`shard_of`]), in batches of bursts as [`ReadAhead::spawn`] does for
    /// one: the input is read and parsed once, where [`OwnShard`]s each read all of it.
    /// Each worker's source, in order, with `bytes` of each packet; the first one's reports
    /// what the input dropped, and the reader updates `handle`'s bytes read (for progress).
    pub fn spawn_shared(
        rx: Vec<(PortId, Box<dyn RxPort>)>,
        workers: usize,
        hasher: FlowHasher,
        burst_size: usize,
        bytes: PacketBytes,
        handle: &RunHandle,
    ) -> std::io::Result<Vec<Box<dyn BurstSource>>> {
        let mut lanes = Vec::new();
        let mut ends = Vec::new();
        for _ in 0..workers.max(1) {
            let (lane, full, spent) = Self::channels(burst_size);
            lanes.push(lane);
            ends.push((full, spent));
        }
        let input_bytes = handle.input_bytes.clone();
        let reader = std::thread::Builder::new()
            .name("reader".into())
            .spawn(move || read_shared(Merged::open(rx), lanes, &hasher, bytes, &input_bytes))?;
        let mut reader = Some(reader);
        Ok((ends.into_iter())
            .map(|(full, spent)| {
                Box::new(ReadAhead::receiving(full, spent, reader.take())) as Box<dyn BurstSource>
            })
            .collect())
    }

    /// Stops the reader (it ends at its next batch) and takes what it counted, if this
    /// worker joins it.
    fn stop(&mut self) -> Option<std::thread::Result<(Stats, Vec<String>)>> {
        self.spent = None;
        self.full = None;
        Some(self.reader.take()?.join())
    }
}

/// A batch of bursts on its way to a worker, and how many of them are filled.
type FullBatch = (Vec<Burst>, usize);

/// A worker's lane out of a reader thread: its channels, and (for the shared reader) the
/// batch being filled.
struct Lane {
    full: Sender<FullBatch>,
    spent: Receiver<Vec<Burst>>,
    /// The batch being filled (empty between batches): `batch[..filled]` are done, and
    /// `batch[filled]` is being filled.
    batch: Vec<Burst>,
    filled: usize,
    round: u64,
}

impl Lane {
    /// The burst being filled, with room for a packet of `len` bytes: the next one when the
    /// current one is full, the next batch when the batch is. `None` when the worker is gone.
    fn room(&mut self, len: usize, now_ns: u64) -> Option<&mut Burst> {
        if self.batch.is_empty() {
            self.batch = self.spent.recv().ok()?;
            self.filled = 0;
            self.batch.iter_mut().for_each(Burst::clear);
        }
        if !self.batch[self.filled].has_room(len) {
            self.seal(now_ns);
            if self.filled == self.batch.len() {
                self.send()?;
                return self.room(len, now_ns);
            }
        }
        Some(&mut self.batch[self.filled])
    }

    /// Closes the burst being filled: its round and clock, and the next one's turn.
    fn seal(&mut self, now_ns: u64) {
        let burst = &mut self.batch[self.filled];
        burst.round = self.round;
        burst.now_ns = now_ns;
        burst.parsed = true;
        self.round += 1;
        self.filled += 1;
    }

    /// Hands the batch's done bursts to the worker.
    fn send(&mut self) -> Option<()> {
        let batch = std::mem::take(&mut self.batch);
        self.full.send((batch, self.filled)).ok()
    }

    /// At the input's end: hands over what is left.
    fn finish(&mut self, now_ns: u64) {
        if self.batch.is_empty() {
            return;
        }
        if !self.batch[self.filled].is_empty() {
            self.seal(now_ns);
        }
        let _ = self.send();
    }
}

/// The shared reader's loop (see [`ReadAhead::spawn_shared`]): what the input dropped, and
/// the errors it met.
fn read_shared(
    mut input: Merged,
    mut lanes: Vec<Lane>,
    hasher: &FlowHasher,
    bytes: PacketBytes,
    input_bytes: &AtomicU64,
) -> (Stats, Vec<String>) {
    let mut stats = Stats::default();
    let mut parsed = Parsed::EMPTY;
    let workers = lanes.len();
    let mut packets = 0u32;
    loop {
        let now_ns = input.now_ns;
        let offered = input.offer(|Offered { port, seq, packet }| {
            let stats = Some(&mut stats);
            let Some(kept) = ingress::parse(&packet, port, hasher, &mut parsed, bytes, stats)
            else {
                return true; // counted and dropped
            };
            let lane = &mut lanes[shard_of(parsed.hash, workers)];
            // No room means that worker stopped: the run is stopping.
            let Some(burst) = lane.room(kept.data.len(), now_ns.max(packet.ts_ns)) else {
                return false;
            };
            burst.push_parsed(&kept, port, seq, &parsed);
            true
        });
        if offered != Some(true) {
            break;
        }
        packets = packets.wrapping_add(1);
        if packets.is_multiple_of(4096) {
            input_bytes.store(input.bytes_read(), Ordering::Relaxed);
        }
    }
    input_bytes.store(input.bytes_read(), Ordering::Relaxed);
    for lane in &mut lanes {
        lane.finish(input.now_ns);
    }
    (stats, input.errors)
}

impl BurstSource for ReadAhead {
    fn fill(&mut self, burst: &mut Burst) -> bool {
        loop {
            if self.next < self.filled {
                std::mem::swap(burst, &mut self.batch[self.next]);
                self.next += 1;
                return true;
            }
            if let Some(spent) = &self.spent
                && !self.batch.is_empty()
            {
                let _ = spent.send(std::mem::take(&mut self.batch));
            }
            let Some(Ok((batch, filled))) = self.full.as_ref().map(Receiver::recv) else {
                return false;
            };
            (self.batch, self.filled, self.next) = (batch, filled, 0);
        }
    }

    fn finish(&mut self) -> (Stats, Vec<String>) {
        match self.stop() {
            Some(Ok(report)) => report,
            Some(Err(_)) => (
                Stats::default(),
                vec!["the read-ahead thread panicked".into()],
            ),
            // Another worker's source joins the shared reader.
            None => (Stats::default(), Vec::new()),
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.stop();
    }
}
