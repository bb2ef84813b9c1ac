//! Wiring: ports, a dispatcher, workers and the output stage on threads.
//!
//! Two shapes:
//!
//! * [`run_offline`] — packets come from stream ports (capture files). A dispatcher thread
//!   reads them in timestamp order across ports, parses each once, and hands it to the
//!   worker that owns its flow (by the flow hash). It works in *rounds*: every round sends
//!   one burst, possibly empty, to every worker, and the output stage takes round `r` from
//!   every worker and merges the bursts by input sequence number. So output order equals
//!   input order whatever the number of workers, and every queue stays bounded.
//! * [`run_sharded`] — each worker has its own [`BurstSource`] (a replay queue sharded by
//!   flow hash at load time, like a NIC's RSS queue, or later a live socket in a fanout
//!   group, or [`OwnShard`]: capture files read by each worker for its own share) and its
//!   own output; there is no dispatcher and nothing shared per packet.
//!
//! Shutdown is by draining: when input ends or the stop flag is raised, the dispatcher
//! finishes its round and closes its queues; workers finish what is queued, then the output
//! stage does, and every count is final.

use crate::burst::{Burst, MAX_FRAME};
use crate::port::{RxPacket, RxPort, TxPort};
use crate::program::{DropReason, PortId, ProgramFactory, Verdict};
use crate::stats::{SharedStats, Stats};
use crate::tap::TapFactory;
use crate::worker::{Worker, count_malformed, count_port_drop};
use crossbeam_channel::{Receiver, Sender, bounded};
use stateplane_wire::flow::shard_of;
use stateplane_wire::{FlowHasher, Malformed, Parsed};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How the runtime is shaped.
#[derive(Clone)]
pub struct RuntimeConfig {
    pub workers: usize,
    /// Packets per burst.
    pub burst_size: usize,
    /// Bursts that may wait in each worker's queue.
    pub queue_depth: usize,
    pub hasher: FlowHasher,
    /// A stage every worker runs after its program (flow records), if any.
    pub tap: Option<TapFactory>,
}

impl std::fmt::Debug for RuntimeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeConfig")
            .field("workers", &self.workers)
            .field("burst_size", &self.burst_size)
            .field("queue_depth", &self.queue_depth)
            .field("tap", &self.tap.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            workers: 1,
            burst_size: 64,
            queue_depth: 8,
            hasher: FlowHasher::random(),
            tap: None,
        }
    }
}

/// What a run shares with whoever watches it (a progress display, a metrics endpoint).
pub struct RunHandle {
    /// Index 0 is the dispatcher (packets dropped before a worker: malformed, oversize),
    /// then one per worker.
    pub stats: Vec<Arc<SharedStats>>,
    /// Raise to stop the run; it drains and reports.
    pub stop: Arc<AtomicBool>,
    /// Bytes consumed from the input files, for progress.
    pub input_bytes: Arc<AtomicU64>,
    /// Live ports' own counts, per worker and port, refreshed every 100 ms by live workers
    /// (empty offline).
    pub port_counters: std::sync::Mutex<Vec<Vec<crate::PortCounters>>>,
}

impl RunHandle {
    pub fn new(workers: usize) -> Self {
        RunHandle {
            stats: (0..=workers)
                .map(|_| Arc::new(SharedStats::default()))
                .collect(),
            stop: Arc::new(AtomicBool::new(false)),
            input_bytes: Arc::new(AtomicU64::new(0)),
            port_counters: std::sync::Mutex::new(vec![Vec::new(); workers]),
        }
    }

    /// Live ports' counts summed over workers, per port, as of the last refresh.
    pub fn port_totals(&self) -> Vec<crate::PortCounters> {
        let per_worker = self
            .port_counters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut total: Vec<crate::PortCounters> = Vec::new();
        for w in per_worker.iter() {
            if total.len() < w.len() {
                total.resize(w.len(), crate::PortCounters::default());
            }
            for (t, c) in total.iter_mut().zip(w) {
                t.merge(c);
            }
        }
        total
    }

    /// Totals over the dispatcher and every worker, as of now.
    pub fn totals(&self) -> Stats {
        let mut total = Stats::default();
        for s in &self.stats {
            total.merge(&s.snapshot());
        }
        total
    }
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub total: Stats,
    pub per_worker: Vec<Stats>,
    /// Packets and bytes sent out of each port.
    pub tx_per_port: Vec<(u64, u64)>,
    pub drop_reason_names: &'static [&'static str],
    pub wall: Duration,
    /// Time each worker spent from its first to its last burst.
    pub worker_busy: Vec<Duration>,
    /// Problems that ended the run early or lost output (read or write errors).
    pub errors: Vec<String>,
}

impl RunReport {
    /// A report with no counts yet, for `ports` ports, to add workers' results to.
    pub fn empty(ports: usize, drop_reason_names: &'static [&'static str], wall: Duration) -> Self {
        RunReport {
            total: Stats::default(),
            per_worker: Vec::new(),
            tx_per_port: vec![(0, 0); ports],
            drop_reason_names,
            wall,
            worker_busy: Vec::new(),
            errors: Vec::new(),
        }
    }
}

/// The ports of an offline run.
pub struct OfflinePorts {
    /// Input streams and the port each one arrives on.
    pub rx: Vec<(PortId, Box<dyn RxPort>)>,
    /// Output per port id; `None` discards (after counting).
    pub tx: Vec<Option<Box<dyn TxPort>>>,
    /// Where packets for the control plane go; `None` counts them only.
    pub control: Option<Box<dyn TxPort>>,
}

/// The next packet of one input port, staged so that ports can be merged by time. Each
/// port keeps one `Head` for the whole run; its buffer grows to the largest frame and is
/// reused.
struct Head {
    port: PortId,
    data: Vec<u8>,
    orig_len: u32,
    ts_ns: u64,
    /// False once the port's input has ended (or failed).
    live: bool,
}

impl Head {
    fn packet(&self) -> RxPacket<'_> {
        RxPacket {
            data: &self.data,
            orig_len: self.orig_len,
            ts_ns: self.ts_ns,
        }
    }

    /// Stages the port's next packet, or marks the port ended.
    fn refill(&mut self, rx: &mut dyn RxPort) -> std::io::Result<()> {
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
struct Merged {
    rx: Vec<(PortId, Box<dyn RxPort>)>,
    heads: Vec<Head>,
    /// The input sequence number of the current packet.
    seq: u64,
    /// The latest timestamp read so far.
    now_ns: u64,
    /// The port [`Merged::earliest`] last gave.
    current: Option<usize>,
    errors: Vec<String>,
}

impl Merged {
    fn open(mut rx: Vec<(PortId, Box<dyn RxPort>)>) -> Merged {
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
    fn earliest(&mut self) -> Option<&Head> {
        let i = self.step()?;
        Some(&self.heads[i])
    }

    /// [`Merged::earliest`] as an index into `heads`, so that a caller can read the packet
    /// and the clock together.
    fn step(&mut self) -> Option<usize> {
        let i = (self.heads.iter().enumerate())
            .filter(|(_, h)| h.live)
            .min_by_key(|(_, h)| h.ts_ns)
            .map(|(i, _)| i)?;
        self.current = Some(i);
        self.now_ns = self.now_ns.max(self.heads[i].ts_ns);
        Some(i)
    }

    /// Moves past the current packet: the next sequence number, and its port's next packet.
    fn advance(&mut self) {
        let Some(i) = self.current.take() else {
            return;
        };
        self.seq += 1;
        let src = &mut self.rx[i].1;
        if let Err(e) = self.heads[i].refill(src.as_mut()) {
            self.errors.push(format!("reading {}: {e}", src.name()));
        }
    }

    fn done(&self) -> bool {
        self.heads.iter().all(|h| !h.live)
    }

    fn bytes_read(&self) -> u64 {
        self.rx.iter().map(|(_, src)| src.bytes_read()).sum()
    }
}

/// Runs `factory`'s program over capture-file ports until every input ends (or `handle.stop`).
pub fn run_offline(
    config: &RuntimeConfig,
    mut ports: OfflinePorts,
    factory: &ProgramFactory,
    handle: &RunHandle,
) -> RunReport {
    let workers = config.workers.max(1);
    let start = Instant::now();
    let port_count = ports.tx.len();
    let pool = config.queue_depth * 2 + 2;
    let mut to_worker = Vec::new();
    let mut worker_rx = Vec::new();
    let mut to_output = Vec::new();
    let mut output_rx = Vec::new();
    let mut free_tx = Vec::new();
    let mut free_rx = Vec::new();
    for _ in 0..workers {
        let (t, r) = bounded::<Burst>(config.queue_depth);
        to_worker.push(t);
        worker_rx.push(r);
        let (t, r) = bounded::<Burst>(config.queue_depth);
        to_output.push(t);
        output_rx.push(r);
        let (t, r) = bounded::<Burst>(pool);
        for _ in 0..pool {
            let _ = t.send(Burst::with_capacity(config.burst_size));
        }
        free_tx.push(t);
        free_rx.push(r);
    }
    let drop_reason_names = factory(0).drop_reasons();

    std::thread::scope(|scope| {
        let rx = std::mem::take(&mut ports.rx);
        let dispatcher = scope.spawn(|| dispatch(config, rx, to_worker, free_rx, handle));
        let worker_threads: Vec<_> = worker_rx
            .into_iter()
            .zip(to_output)
            .enumerate()
            .map(|(w, (input, output))| {
                let program = factory(w);
                let shared = handle.stats[w + 1].clone();
                let hasher = config.hasher;
                let tap = config.tap.as_ref().map(|f| f(w));
                scope.spawn(move || {
                    let mut worker =
                        Worker::new(program, w, workers, port_count, hasher).with_tap(tap);
                    let mut busy = Duration::ZERO;
                    for mut burst in input.iter() {
                        let t = Instant::now();
                        worker.handle(&mut burst);
                        busy += t.elapsed();
                        shared.publish(&worker.stats);
                        if output.send(burst).is_err() {
                            break;
                        }
                    }
                    worker.finish();
                    (worker.stats, busy)
                })
            })
            .collect();
        let (tx_per_port, mut errors) = output_stage(
            &output_rx,
            &free_tx,
            &mut ports.tx,
            &mut ports.control,
            handle,
        );
        let (dispatcher_stats, dispatch_errors) = match dispatcher.join() {
            Ok(r) => r,
            Err(_) => (
                Stats::default(),
                vec!["the dispatcher thread panicked".to_owned()],
            ),
        };
        errors.extend(dispatch_errors);
        let mut per_worker = Vec::new();
        let mut worker_busy = Vec::new();
        for t in worker_threads {
            match t.join() {
                Ok((s, busy)) => {
                    per_worker.push(s);
                    worker_busy.push(busy);
                }
                Err(_) => errors.push("a worker thread panicked".to_owned()),
            }
        }
        let mut total = dispatcher_stats;
        for s in &per_worker {
            total.merge(s);
        }
        RunReport {
            total,
            per_worker,
            tx_per_port,
            drop_reason_names,
            wall: start.elapsed(),
            worker_busy,
            errors,
        }
    })
}

/// The dispatcher: merges the input ports by timestamp, parses, shards, and sends rounds.
fn dispatch(
    config: &RuntimeConfig,
    rx: Vec<(PortId, Box<dyn RxPort>)>,
    to_worker: Vec<Sender<Burst>>,
    free: Vec<Receiver<Burst>>,
    handle: &RunHandle,
) -> (Stats, Vec<String>) {
    let workers = to_worker.len();
    let mut stats = Stats::default();
    let mut parsed = Parsed::EMPTY;
    let mut input = Merged::open(rx);
    let mut round = 0u64;
    let mut bursts: Vec<Burst> = Vec::with_capacity(workers);
    'rounds: loop {
        for f in &free {
            match f.recv() {
                Ok(b) => bursts.push(b),
                Err(_) => break 'rounds,
            }
        }
        let mut taken = 0;
        let stopping = handle.stop.load(Ordering::Relaxed);
        while taken < config.burst_size && !stopping {
            let seq = input.seq;
            let Some(head) = input.earliest() else {
                break;
            };
            let packet = head.packet();
            if ingress::parse(
                &packet,
                head.port,
                &config.hasher,
                &mut parsed,
                Some(&mut stats),
            ) {
                let w = shard_of(parsed.hash, workers);
                if !bursts[w].has_room(head.data.len()) {
                    break; // this worker's burst is full: the packet opens the next round
                }
                bursts[w].push_parsed(&packet, head.port, seq, &parsed);
            }
            input.advance();
            taken += 1;
        }
        handle
            .input_bytes
            .store(input.bytes_read(), Ordering::Relaxed);
        handle.stats[0].publish(&stats);
        let done = stopping || input.done();
        for (w, mut b) in bursts.drain(..).enumerate() {
            b.round = round;
            b.now_ns = input.now_ns;
            b.parsed = true;
            if to_worker[w].send(b).is_err() {
                break 'rounds;
            }
        }
        round += 1;
        if done {
            break;
        }
    }
    (stats, input.errors)
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

/// The output stage: takes round `r` from every worker, merges by sequence number, sends.
fn output_stage(
    from_workers: &[Receiver<Burst>],
    free: &[Sender<Burst>],
    tx: &mut [Option<Box<dyn TxPort>>],
    control: &mut Option<Box<dyn TxPort>>,
    handle: &RunHandle,
) -> (Vec<(u64, u64)>, Vec<String>) {
    let mut counts = vec![(0u64, 0u64); tx.len()];
    let mut errors: Vec<String> = Vec::new();
    let mut failed = vec![false; tx.len()];
    let mut control_failed = false;
    let mut bursts: Vec<Burst> = Vec::with_capacity(from_workers.len());
    let mut cursor = vec![0usize; from_workers.len()];
    'rounds: loop {
        bursts.clear();
        for r in from_workers {
            match r.recv() {
                Ok(b) => bursts.push(b),
                Err(_) => break 'rounds,
            }
        }
        cursor.iter_mut().for_each(|c| *c = 0);
        loop {
            let next = (0..bursts.len())
                .filter(|&w| cursor[w] < bursts[w].len())
                .min_by_key(|&w| bursts[w].descs()[cursor[w]].seq);
            let Some(w) = next else { break };
            let i = cursor[w];
            cursor[w] += 1;
            let d = bursts[w].descs()[i];
            let data = bursts[w].data(i);
            match d.verdict {
                Verdict::Forward(_) | Verdict::Flood => {
                    for port in d.verdict.out_ports(d.in_port, tx.len()) {
                        let p = usize::from(port);
                        counts[p].0 += 1;
                        counts[p].1 += u64::from(d.len);
                        if let Some(out) = tx[p].as_mut().filter(|_| !failed[p])
                            && let Err(e) = out.send(data, d.orig_len, d.ts_ns)
                        {
                            errors.push(format!("writing port {} ({}): {e}; its later packets were counted but not written", p, out.name()));
                            failed[p] = true;
                            handle.stop.store(true, Ordering::Relaxed);
                        }
                    }
                }
                Verdict::ToControl(_) => {
                    if let Some(out) = control.as_mut().filter(|_| !control_failed)
                        && let Err(e) = out.send(data, d.orig_len, d.ts_ns)
                    {
                        errors.push(format!(
                            "writing control-plane output ({}): {e}",
                            out.name()
                        ));
                        control_failed = true;
                    }
                }
                Verdict::Drop(_) => {}
            }
        }
        for (w, mut b) in bursts.drain(..).enumerate() {
            b.clear();
            let _ = free[w].send(b);
        }
    }
    for (p, out) in tx.iter_mut().enumerate() {
        if let Some(out) = out
            && let Err(e) = out.flush()
        {
            errors.push(format!("flushing port {p} ({}): {e}", out.name()));
        }
    }
    if let Some(out) = control
        && let Err(e) = out.flush()
    {
        errors.push(format!(
            "flushing control-plane output ({}): {e}",
            out.name()
        ));
    }
    (counts, errors)
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
    /// Bursts per batch, and batches in flight: 16 x 64 packets ahead per batch, and
    /// enough batches that neither side waits while the other is busy.
    const BATCH: usize = 16;
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
    /// Each worker's source, in order; the first one's reports what the input dropped, and
    /// the reader updates `handle`'s bytes read (for progress).
    pub fn spawn_shared(
        rx: Vec<(PortId, Box<dyn RxPort>)>,
        workers: usize,
        hasher: FlowHasher,
        burst_size: usize,
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
            .spawn(move || read_shared(Merged::open(rx), lanes, &hasher, &input_bytes))?;
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
    input_bytes: &AtomicU64,
) -> (Stats, Vec<String>) {
    let mut stats = Stats::default();
    let mut parsed = Parsed::EMPTY;
    let workers = lanes.len();
    let mut packets = 0u32;
    while let Some(i) = input.step() {
        let (head, seq) = (&input.heads[i], input.seq);
        let packet = head.packet();
        if ingress::parse(&packet, head.port, hasher, &mut parsed, Some(&mut stats)) {
            let lane = &mut lanes[shard_of(parsed.hash, workers)];
            let Some(burst) = lane.room(head.data.len(), input.now_ns) else {
                break; // that worker stopped: the run is stopping
            };
            burst.push_parsed(&packet, head.port, seq, &parsed);
        }
        input.advance();
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

/// Runs one worker per source, each to completion on its own thread, with outputs counted
/// per port and discarded (the benchmark's null sink).
pub fn run_sharded(
    config: &RuntimeConfig,
    sources: Vec<Box<dyn BurstSource>>,
    ports: usize,
    factory: &ProgramFactory,
    handle: &RunHandle,
) -> RunReport {
    let workers = sources.len();
    let start = Instant::now();
    let drop_reason_names = factory(0).drop_reasons();
    let results: Vec<_> = std::thread::scope(|scope| {
        let threads: Vec<_> = sources
            .into_iter()
            .enumerate()
            .map(|(w, mut source)| {
                let program = factory(w);
                let shared = handle.stats[w + 1].clone();
                let stop = handle.stop.clone();
                let hasher = config.hasher;
                let burst_size = config.burst_size;
                let tap = config.tap.as_ref().map(|f| f(w));
                scope.spawn(move || {
                    let mut worker = Worker::new(program, w, workers, ports, hasher).with_tap(tap);
                    let mut sink = vec![(0u64, 0u64); ports];
                    let mut burst = Burst::with_capacity(burst_size);
                    let t = Instant::now();
                    let mut bursts = 0u32;
                    while source.fill(&mut burst) {
                        worker.handle(&mut burst);
                        null_sink(&burst, &mut sink);
                        burst.clear();
                        bursts = bursts.wrapping_add(1);
                        // Publishing every burst would cost a cache line per burst on a
                        // shared counter page; every 64th keeps progress live.
                        if bursts.is_multiple_of(64) {
                            shared.publish(&worker.stats);
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                        }
                    }
                    let busy = t.elapsed();
                    worker.finish();
                    shared.publish(&worker.stats);
                    let (dropped, errors) = source.finish();
                    let mut stats = worker.stats;
                    stats.merge(&dropped);
                    (stats, busy, sink, errors)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join()).collect()
    });
    let mut report = RunReport::empty(ports, drop_reason_names, start.elapsed());
    for r in results {
        match r {
            Ok((stats, busy, sink, errors)) => {
                report.errors.extend(errors);
                report.total.merge(&stats);
                report.per_worker.push(stats);
                report.worker_busy.push(busy);
                for (acc, s) in report.tx_per_port.iter_mut().zip(sink) {
                    acc.0 += s.0;
                    acc.1 += s.1;
                }
            }
            Err(_) => report.errors.push("a worker thread panicked".to_owned()),
        }
    }
    report
}

/// Counts forwarded packets per port: the output of a benchmark.
#[inline]
fn null_sink(burst: &Burst, counts: &mut [(u64, u64)]) {
    let ports = counts.len();
    for d in burst.descs() {
        for p in d.verdict.out_ports(d.in_port, ports) {
            let c = &mut counts[usize::from(p)];
            c.0 += 1;
            c.1 += u64::from(d.len);
        }
    }
}
