//! A flow monitor: capture files or interfaces in, unsampled flow records out, with the
//! flow stage as each worker's tap behind a program that only observes (`Monitor`). What
//! `stateplane flows` runs; [`FlowMonitor::build`] checks and opens everything before
//! anything runs, [`FlowMonitor::run`] runs it to the end.
//!
//! Over files a reader thread reads and parses ahead ([`ReadAhead`]: one worker's, or one
//! for all workers), each worker reads its own shard ([`OwnShard`]), or the workers read
//! one capture file's chunks in turn ([`ChunkShard`]); live, interfaces are opened
//! passively (AF_PACKET copies), so the host keeps its traffic.

use crate::SetupResult;
use crate::daemon::{self, ControlAddr, IoChoice, LiveRun, SignalThread};
use crate::export::Naming;
use crate::flow_export::{FlowExport, FlowReport, FlowSettings};
use crate::summary::Outcome;
use crate::units::{CaptureBuffer, bounded};
use stateplane_io::ChunkedCapture;
use stateplane_io::capture::{FileRx, is_stdin};
use stateplane_programs::monitor::Monitor;
use stateplane_runtime::chunked::{CHUNK_BYTES, ChunkConfig, ChunkShard};
use stateplane_runtime::{BurstSource, OwnShard, ReadAhead, RunHandle, RuntimeConfig, run_sharded};
use stateplane_runtime::{ChunkedFile, PacketBytes, PortId, ProgramFactory, RxPort};
use stateplane_wire::FlowHasher;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How capture files reach the workers, as the user asks (`--read-ahead`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadAheadChoice {
    /// Chunks for several workers on one file, else (several files, standard input) one
    /// reader for all; for one worker, a reader of its own with two cores or more.
    #[default]
    Auto,
    /// A thread reads and parses ahead: one worker's own, or one for all workers.
    On,
    /// Each worker reads the files for itself and keeps its shard.
    Off,
    /// The workers read one capture file's chunks in turn and hand each other their
    /// flows' packets, so that reading grows with the workers.
    Chunks,
}

/// What a flow monitor is built from.
#[derive(Clone, Debug, Default)]
pub struct MonitorOptions {
    /// Capture files (pcap or pcapng) merged by time; `-` is standard input.
    pub inputs: Vec<PathBuf>,
    /// Or interfaces, captured from until SIGINT or SIGTERM.
    pub interfaces: Vec<String>,
    /// With interfaces: each worker's capture ring on each interface.
    pub capture_buffer: Option<CaptureBuffer>,
    pub settings: FlowSettings,
    pub workers: usize,
    pub read_ahead: ReadAheadChoice,
    /// Seed of the flow hash (default: random per process).
    pub hash_seed: Option<u64>,
    /// The memory the run may take (default: three quarters of the machine's).
    pub memory_budget: Option<crate::units::MemoryBudget>,
    /// Where to serve Prometheus metrics (a loopback address), if anywhere.
    pub metrics: Option<std::net::SocketAddr>,
}

/// What of each packet the workers' bursts hold: the monitor's program and its flow stage
/// read the parsed headers only, so the payload is not copied.
const MONITOR_BYTES: PacketBytes = PacketBytes::Headers;

/// How capture files reach the workers, decided.
enum Reading {
    /// Each worker reads every file and keeps its shard, with a reader thread of its own
    /// ahead of it or not.
    OwnShard { ahead: bool },
    /// One reader thread for all the workers.
    Shared,
    /// The workers read one capture file's chunks in turn ([`ChunkShard`]).
    Chunks(ChunkedCapture),
}

impl ReadAheadChoice {
    /// How `workers` workers read `inputs` on a machine of `cores` cores.
    fn reading(self, inputs: &[PathBuf], workers: usize, cores: usize) -> SetupResult<Reading> {
        let one_file = || match inputs {
            [path] if !is_stdin(path) => {
                ChunkedCapture::open(path).map_err(|e| format!("--in {}: {e}", path.display()))
            }
            _ => Ok(None),
        };
        let stdin = inputs.iter().filter(|path| is_stdin(path)).count();
        if stdin > 1 {
            return Err("--in -: standard input is given more than once".into());
        }
        let stdin = stdin == 1;
        Ok(match self {
            ReadAheadChoice::On if workers > 1 => Reading::Shared,
            ReadAheadChoice::On => Reading::OwnShard { ahead: true },
            ReadAheadChoice::Off if workers > 1 && stdin => {
                return Err(
                    "--read-ahead off: each worker reads the input for itself, and \
                            standard input can be read once: use auto or on"
                        .into(),
                );
            }
            ReadAheadChoice::Off => Reading::OwnShard { ahead: false },
            ReadAheadChoice::Chunks => Reading::Chunks(one_file()?.ok_or(
                "--read-ahead chunks reads one capture file of Ethernet frames (not \
                 several files, not standard input, not another link type, whose frames \
                 are read through a synthesized Ethernet header): use auto, on or off",
            )?),
            ReadAheadChoice::Auto if workers > 1 => {
                one_file()?.map_or(Reading::Shared, Reading::Chunks)
            }
            ReadAheadChoice::Auto => Reading::OwnShard { ahead: cores >= 2 },
        })
    }
}

/// A flow monitor ready to run: inputs checked and open, sinks open, readers started.
pub struct FlowMonitor {
    runtime: RuntimeConfig,
    factory: ProgramFactory,
    export: FlowExport,
    handle: Arc<RunHandle>,
    inputs: Inputs,
    /// What its settings claimed of the memory budget, for the summary.
    memory: stateplane_mem::budget::Growth,
    metrics: Option<std::net::SocketAddr>,
    /// The bounds it runs within, for the metrics.
    bounds: Vec<crate::metrics::Bound>,
}

enum Inputs {
    Files {
        sources: Vec<Box<dyn BurstSource>>,
        ports: usize,
        /// Bytes of the input captures, for progress (0 with standard input).
        size: u64,
    },
    Live {
        interfaces: Vec<String>,
        capture_buffer: usize,
    },
}

/// What a flow monitor did.
pub enum MonitorOutcome {
    /// On interfaces: the daemon's summary, the records' report in it.
    Live(Box<Outcome>),
    /// Over capture files: the records' report, and what the run met.
    Files {
        flows: FlowReport,
        wall: Duration,
        /// What the readers did with each packet they read.
        input: InputCounts,
        /// Problems that ended the run early (read errors).
        errors: Vec<String>,
        /// Whether records went to standard output (a summary then goes elsewhere).
        records_to_stdout: bool,
        /// The signal (SIGINT or SIGTERM) that ended the run before its inputs did: the
        /// flows of what was read were exported all the same.
        interrupted: Option<i32>,
        /// What its settings claimed of the memory budget.
        memory: stateplane_mem::budget::Growth,
    },
}

impl FlowMonitor {
    /// Checks `options` (errors name the flag and the fix), opens the inputs before the
    /// sinks (so that a wrong name leaves no output file with a header and nothing else),
    /// then the sinks, and starts the readers.
    pub fn build(options: MonitorOptions) -> SetupResult<FlowMonitor> {
        let MonitorOptions {
            inputs,
            interfaces,
            capture_buffer,
            settings,
            workers,
            read_ahead,
            hash_seed,
            memory_budget,
            metrics,
        } = options;
        let workers = bounded("--workers", workers, 1, 64)?;
        let live = !interfaces.is_empty();
        if live != inputs.is_empty() {
            return Err(
                "give capture files with --in FILE, or interfaces with --iface NAME (not both)"
                    .into(),
            );
        }
        if !live && capture_buffer.is_some() {
            return Err("--capture-buffer sizes the ring of a capture on an interface (--iface); capture files are read as they are".into());
        }
        for name in &interfaces {
            stateplane_io::live::Interface::lookup(name).map_err(|e| format!("--iface: {e}"))?;
        }
        let open_inputs = || {
            (inputs.iter().enumerate())
                .map(|(i, path)| {
                    let port = FileRx::open(path).map_err(|e| {
                        crate::assemble::cannot_read_capture(&format!("--in {}", path.display()), e)
                    })?;
                    Ok((i as PortId, Box::new(port) as Box<dyn RxPort>))
                })
                .collect::<SetupResult<Vec<_>>>()
        };
        // Files: how they are read is chosen, and they are opened, before the sinks start.
        let files = if live {
            None
        } else {
            let cores = std::thread::available_parallelism().map_or(1, usize::from);
            let reading = read_ahead.reading(&inputs, workers, cores)?;
            // Chunks read the file they opened; the other layouts read these streams.
            let streams = match reading {
                Reading::Chunks(_) => None,
                _ => Some(open_inputs()?),
            };
            Some((reading, streams))
        };
        let seed = hash_seed.unwrap_or_else(stateplane_wire::flow::random_seed);
        // What the flags size is claimed from the memory budget before it is made.
        let budget = crate::assemble::memory_budget(memory_budget, workers, live);
        let (started, claimed) = stateplane_mem::budget::scope(budget, || {
            if live {
                let rings = capture_buffer.unwrap_or_default();
                crate::assemble::claim_capture_rings(rings, workers, interfaces.len())?;
            }
            let started = settings.start(Naming::Flags, workers, seed, live, None)?;
            SetupResult::Ok((started, stateplane_mem::budget::Growth::of_scope()))
        });
        let ((export, tap), memory) = started?;
        let runtime = RuntimeConfig {
            workers,
            hasher: FlowHasher::with_seed(seed),
            taps: vec![tap],
            ..RuntimeConfig::default()
        };
        let bounds = crate::metrics::run_bounds(
            &claimed,
            memory.clone(),
            runtime.burst_size,
            runtime.queue_depth,
        );
        let factory: ProgramFactory = Arc::new(|_| Box::new(Monitor));
        let handle = Arc::new(RunHandle::new(workers));
        let inputs = match files {
            None => Inputs::Live {
                interfaces,
                capture_buffer: capture_buffer.unwrap_or_default().0,
            },
            Some((reading, opened)) => Inputs::Files {
                sources: sources(reading, opened, open_inputs, &runtime, &handle)?,
                ports: inputs.len(),
                size: input_size(&inputs),
            },
        };
        Ok(FlowMonitor {
            runtime,
            factory,
            export,
            handle,
            inputs,
            memory,
            metrics,
            bounds,
        })
    }

    /// What a watcher reads while the monitor runs (counters, input read so far); raise its
    /// `stop` to stop the run (it drains and reports).
    pub fn handle(&self) -> Arc<RunHandle> {
        self.handle.clone()
    }

    /// Bytes of the input captures (0 on interfaces and with standard input, whose size is
    /// not known).
    pub fn input_size(&self) -> u64 {
        match &self.inputs {
            Inputs::Files { size, .. } => *size,
            Inputs::Live { .. } => 0,
        }
    }

    pub fn is_live(&self) -> bool {
        matches!(self.inputs, Inputs::Live { .. })
    }

    /// Runs to the end: over capture files until every input ends (or the handle's stop),
    /// on interfaces until SIGINT or SIGTERM.
    pub fn run(self) -> SetupResult<MonitorOutcome> {
        let FlowMonitor {
            runtime,
            factory,
            export,
            handle,
            inputs,
            memory,
            metrics,
            bounds,
        } = self;
        let start = Instant::now();
        let (sources, ports) = match inputs {
            Inputs::Live {
                interfaces,
                capture_buffer,
            } => {
                let outcome = daemon::run(LiveRun {
                    io: IoChoice::Observe,
                    // Flow records are per flow: the flow hash keeps each on one worker.
                    steering: Vec::new(),
                    program: "flows".into(),
                    port_names: interfaces.clone(),
                    interfaces,
                    runtime,
                    factory: factory.clone(),
                    rebuild: Box::new(move || Ok(factory.clone())),
                    metrics,
                    control: ControlAddr::Off,
                    monitor_buffer: capture_buffer,
                    // The records' summary comes with the run's.
                    flows: Some(export),
                    sync: None,
                    replication: None,
                    bounds,
                    // Its rings were claimed with its settings, above.
                    memory,
                })?;
                return Ok(MonitorOutcome::Live(Box::new(outcome)));
            }
            Inputs::Files { sources, ports, .. } => (sources, ports),
        };
        if let Some(addr) = metrics {
            crate::metrics::serve(
                addr,
                crate::metrics::Scrape {
                    handle: handle.clone(),
                    drop_names: factory(0).drop_reasons(),
                    // Its inputs are read by the workers themselves, each port uncounted.
                    ports: Vec::new(),
                    sync: None,
                    replication: None,
                    flows: Some(export.progress()),
                    bounds,
                    memory: memory.clone(),
                    plane: None,
                    control_requests: None,
                },
            )?;
        }
        // Records are all it makes: once no sink has a reader, it stops (on interfaces, the
        // daemon's run does the same).
        export.progress().stop_when_unread(handle.stop.clone());
        // An interrupt stops the reading; the flows read so far end as at the inputs' end.
        let signals = SignalThread::start(handle.stop.clone(), None)?;
        let run = run_sharded(&runtime, sources, ports, &factory, &handle);
        let interrupted = signals.close();
        // The taps no worker took hold the exporter's queue open.
        drop(runtime);
        let records_to_stdout = export.writes_to_stdout();
        Ok(MonitorOutcome::Files {
            flows: export.finish(),
            wall: start.elapsed(),
            input: InputCounts::of(&run.total),
            errors: run.errors,
            records_to_stdout,
            interrupted,
            memory,
        })
    }
}

/// What became of the packets read from capture files: each was handed to the workers,
/// whose flow stage counts it (`packets` if IP, else `not_ip`), or dropped as it was read,
/// malformed (by reason) or too large for a burst (`oversize`: a frame above 64 KiB that is
/// not IP, whose headers alone would be kept).
///
/// Invariant: `read` is the flow stage's `packets` plus `not_ip` plus these drops.
#[derive(Debug, Clone, Default)]
pub struct InputCounts {
    pub read: u64,
    pub malformed: Vec<(&'static str, u64)>,
    pub oversize: u64,
}

impl InputCounts {
    fn of(total: &stateplane_runtime::Stats) -> InputCounts {
        use stateplane_runtime::{Counter, DropReason};
        InputCounts {
            read: total.get(Counter::RxPackets),
            malformed: total.malformed_by_reason(),
            oversize: total.drops[usize::from(DropReason::OVERSIZE.0)],
        }
    }

    /// The packets dropped as malformed, every reason's.
    pub fn malformed_total(&self) -> u64 {
        self.malformed.iter().map(|(_, n)| n).sum()
    }

    /// The counts as JSON fields, to stand beside the flow report's.
    pub fn json_fields(&self) -> serde_json::Map<String, serde_json::Value> {
        let by_reason: serde_json::Map<_, _> = (self.malformed.iter())
            .map(|(reason, n)| ((*reason).to_owned(), (*n).into()))
            .collect();
        let fields = serde_json::json!({"read": self.read, "malformed": self.malformed_total(),
            "malformed_by_reason": by_reason, "oversize": self.oversize});
        fields.as_object().cloned().unwrap_or_default()
    }

    /// The counts as table rows, to follow the flow report's.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut rows = String::new();
        let _ = writeln!(rows, "read           {:>14}", self.read);
        let _ = writeln!(rows, "malformed      {:>14}", self.malformed_total());
        for (reason, n) in &self.malformed {
            let _ = writeln!(rows, "  {reason:<24} {n:>14}");
        }
        let _ = writeln!(rows, "oversize       {:>14}", self.oversize);
        rows
    }
}

/// The workers' sources. A reader thread fills batches of bursts (handed over 16 at a time,
/// so the threads wake each other once per batch), for one worker or for all; otherwise
/// each worker reads the files for itself and keeps its own shard, or its turn of one
/// file's chunks. The inputs `opened` serve the first reader; a worker reading for itself
/// after it opens them again (`reading` has refused that for standard input).
fn sources(
    reading: Reading,
    mut opened: Option<Vec<(PortId, Box<dyn RxPort>)>>,
    open_inputs: impl Fn() -> SetupResult<Vec<(PortId, Box<dyn RxPort>)>>,
    runtime: &RuntimeConfig,
    handle: &RunHandle,
) -> SetupResult<Vec<Box<dyn BurstSource>>> {
    let mut inputs = || opened.take().map_or_else(&open_inputs, Ok);
    let (workers, hasher, burst_size) = (runtime.workers, runtime.hasher, runtime.burst_size);
    Ok(match reading {
        Reading::Chunks(ChunkedCapture::Pcap(file)) => chunk_shards(file, runtime, handle),
        Reading::Chunks(ChunkedCapture::Pcapng(file)) => chunk_shards(file, runtime, handle),
        Reading::Shared => ReadAhead::spawn_shared(
            inputs()?,
            workers,
            hasher,
            burst_size,
            MONITOR_BYTES,
            handle,
        )
        .map_err(|e| format!("starting the reader thread: {e}"))?,
        Reading::OwnShard { ahead } => (0..workers)
            .map(|w| {
                let shard = OwnShard::new(inputs()?, w, workers, hasher, MONITOR_BYTES, handle);
                Ok(if ahead {
                    let name = format!("reader-{w}");
                    Box::new(
                        ReadAhead::spawn(Box::new(shard), burst_size, name)
                            .map_err(|e| format!("starting a reader thread: {e}"))?,
                    ) as Box<dyn BurstSource>
                } else {
                    Box::new(shard) as Box<dyn BurstSource>
                })
            })
            .collect::<SetupResult<Vec<_>>>()?,
    })
}

/// Bytes of the capture files `inputs`; 0 if one is standard input (its size is not known,
/// so progress shows the bytes read so far).
fn input_size(inputs: &[PathBuf]) -> u64 {
    if inputs.iter().any(|p| is_stdin(p)) {
        return 0;
    }
    (inputs.iter())
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum()
}

/// The workers' sources for `file`, read in chunks by all of them.
fn chunk_shards<F: ChunkedFile + 'static>(
    file: F,
    runtime: &RuntimeConfig,
    handle: &RunHandle,
) -> Vec<Box<dyn BurstSource>> {
    let config = ChunkConfig {
        workers: runtime.workers,
        hasher: runtime.hasher,
        burst_size: runtime.burst_size,
        chunk_bytes: CHUNK_BYTES,
        bytes: MONITOR_BYTES,
    };
    ChunkShard::for_workers(Arc::new(file), 0, config, handle)
}
