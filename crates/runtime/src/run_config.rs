//! What every shape of run shares: its configuration, the handle that watchers read while
//! it runs, and the report it ends with.

use crate::counters::{SharedStats, Stats};
use crate::program::PortId;
use crate::state_stage::StateStageFactory;
use crate::tap::TapFactory;
use stateplane_wire::flow::shard_of;
use stateplane_wire::{FlowHasher, Parsed};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

/// How the runtime is shaped.
#[derive(Clone)]
pub struct RuntimeConfig {
    pub workers: usize,
    /// Packets per burst.
    pub burst_size: usize,
    /// Bursts that may wait in each worker's queue.
    pub queue_depth: usize,
    pub hasher: FlowHasher,
    /// Stages every worker runs after its program, in order (flow records).
    pub taps: Vec<TapFactory>,
    /// Duties every worker runs between bursts for its program's declared state (sync).
    pub state_stages: Vec<StateStageFactory>,
    /// How a run over files spreads packets over the workers.
    pub spread: Spread,
}

/// How a run over files spreads packets over its workers.
#[derive(Clone, Default)]
pub enum Spread {
    /// By the flow hash ([`shard_of`] of `parsed.hash`): both directions of a flow reach
    /// one worker.
    #[default]
    FlowHash,
    /// As live ports spread them for a program that steers them
    /// ([`crate::Program::steering`]): the function's result, given a packet, its parse
    /// and its port, modulo the workers (the kernel's rule for a steered fanout group), so
    /// that a run over files puts each packet on the worker a live run would.
    Steered(Arc<SteerFn>),
}

/// What [`Spread::Steered`] runs on each packet.
pub type SteerFn = dyn Fn(&[u8], &Parsed, PortId) -> u32 + Send + Sync;

impl Spread {
    /// The worker, of `workers`, that `packet` (parsed as `parsed`, in by `port`) goes to.
    pub fn worker(&self, packet: &[u8], parsed: &Parsed, port: PortId, workers: usize) -> usize {
        match self {
            Spread::FlowHash => shard_of(parsed.hash, workers),
            Spread::Steered(steer) => steer(packet, parsed, port) as usize % workers.max(1),
        }
    }

    /// Whether packets reach their worker by their flow hash ([`crate::Context::by_hash`]).
    pub fn by_hash(&self) -> bool {
        matches!(self, Spread::FlowHash)
    }
}

impl std::fmt::Debug for RuntimeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeConfig")
            .field("workers", &self.workers)
            .field("burst_size", &self.burst_size)
            .field("queue_depth", &self.queue_depth)
            .field("taps", &self.taps.len())
            .field("state_stages", &self.state_stages.len())
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
            taps: Vec::new(),
            state_stages: Vec::new(),
            spread: Spread::FlowHash,
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
    /// A run over files: what each port read and wrote, as of the last round (empty live).
    pub file_ports: std::sync::Mutex<FilePorts>,
}

/// A run over files: packets and bytes read from each port's capture and written to each
/// port's, as of the dispatcher's and the output stage's last round (live ports count
/// their own: [`RunHandle::port_counters`]).
#[derive(Debug, Clone, Default)]
pub struct FilePorts {
    pub rx: Vec<(u64, u64)>,
    pub tx: Vec<(u64, u64)>,
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
            file_ports: std::sync::Mutex::new(FilePorts::default()),
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

    /// What each file port read and wrote, as of the last round.
    pub fn file_ports(&self) -> FilePorts {
        (self.file_ports.lock())
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Publishes what each port of a run over files has read (the dispatcher's count).
    pub(crate) fn publish_file_reads(&self, by_port: &[(u64, u64)]) {
        self.publish_file_side(by_port, |ports| &mut ports.rx);
    }

    /// Publishes what each port of a run over files has written (the output stage's count).
    pub(crate) fn publish_file_writes(&self, by_port: &[(u64, u64)]) {
        self.publish_file_side(by_port, |ports| &mut ports.tx);
    }

    fn publish_file_side(
        &self,
        by_port: &[(u64, u64)],
        side: fn(&mut FilePorts) -> &mut Vec<(u64, u64)>,
    ) {
        let mut ports = (self.file_ports.lock()).unwrap_or_else(std::sync::PoisonError::into_inner);
        let side = side(&mut ports);
        side.clear();
        side.extend_from_slice(by_port);
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
    /// Live ports' own counts per port, summed over workers (empty offline).
    pub port_counters: Vec<crate::PortCounters>,
    /// The program generation each worker ran last (0: the program it started with).
    pub generations: Vec<u64>,
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
            port_counters: Vec::new(),
            generations: Vec::new(),
        }
    }
}
