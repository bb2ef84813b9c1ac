//! `stateplane flows`: capture files or interfaces in, unsampled flow records out (IPFIX
//! over UDP or TCP, IPFIX files, CSV, JSON lines), with the flow stage as each worker's
//! tap behind a program that only observes. Over files a reader thread reads and parses
//! ahead (`ReadAhead`: one worker's, or one for all workers), each worker reads its own
//! shard (`OwnShard`), or the workers read one capture file's chunks in turn (`ChunkShard`);
//! live, interfaces are opened passively (AF_PACKET copies).
//! [`FlowSettings::start`] also serves a run's `[flows]` section.

use crate::CliResult;
use crate::progress::Progress;
use stateplane_io::ChunkedCapture;
use stateplane_io::capture::{FileRx, is_stdin};
use stateplane_programs::monitor::Monitor;
use stateplane_runtime::chunked::{CHUNK_BYTES, ChunkShard};
use stateplane_runtime::{BurstSource, OwnShard, ReadAhead, RunHandle, RuntimeConfig, run_sharded};
use stateplane_runtime::{ChunkedFile, PortId, ProgramFactory, RxPort};
use stateplane_switch::daemon::{self, ControlAddr, IoChoice, LiveRun};
use stateplane_switch::export::Naming;
use stateplane_switch::flow_export::FlowSettings;
use stateplane_switch::units::{CaptureBuffer, bounded};
use stateplane_wire::FlowHasher;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

#[derive(clap::Args)]
pub struct FlowsArgs {
    /// Capture files to read (pcap or pcapng), merged by time; timestamps come from them.
    /// `-` reads standard input (e.g. `tcpdump -w - | stateplane flows -i - ...`).
    #[arg(long = "in", short = 'i')]
    pub inputs: Vec<PathBuf>,
    /// Interfaces to capture from instead (runs until SIGINT or SIGTERM): copies of what
    /// they receive and send, the host's traffic undisturbed.
    #[arg(long = "iface", short = 'I')]
    pub interfaces: Vec<String>,
    /// With --iface: each worker's capture ring on each interface, in bytes, with k, M or G
    /// (default 64M; 1M to 1G, in blocks of 256 KiB). A monitor cannot slow the traffic
    /// down, so its ring carries it through a spell off the CPU; what the kernel drops
    /// when the ring is full is in the summary (rx_kernel_drops).
    #[arg(long, value_name = "BYTES")]
    pub capture_buffer: Option<CaptureBuffer>,
    #[command(flatten)]
    pub settings: FlowSettings,
    /// Worker threads, each owning a shard of the flows.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Reading capture files: a thread that reads and parses ahead of the workers (on:
    /// one worker's own, or one for all workers); each worker reading the files for
    /// itself and keeping its shard (off); or the workers reading one capture file's chunks
    /// in turn and handing each other their flows' packets (chunks), so that reading grows
    /// with the workers. Auto: chunks for several workers on one file, else (several files,
    /// standard input) one reader for all; for one worker, on with two cores or more.
    #[arg(long, value_enum, default_value_t = ReadAheadChoice::Auto)]
    pub read_ahead: ReadAheadChoice,
    /// Print the summary as JSON.
    #[arg(long)]
    pub summary_json: bool,
    /// Seed of the flow hash (default: random per process).
    #[arg(long)]
    pub hash_seed: Option<u64>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadAheadChoice {
    Auto,
    On,
    Off,
    Chunks,
}

/// How capture files reach the workers.
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
    fn reading(self, inputs: &[PathBuf], workers: usize, cores: usize) -> CliResult<Reading> {
        let one_file = || match inputs {
            [path] if !is_stdin(path) => ChunkedCapture::open(path)
                .map(Some)
                .map_err(|e| format!("--in {}: {e}", path.display())),
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
                "--read-ahead chunks reads one capture file (not several files, not \
                 standard input): use auto, on or off",
            )?),
            ReadAheadChoice::Auto if workers > 1 => {
                one_file()?.map_or(Reading::Shared, Reading::Chunks)
            }
            ReadAheadChoice::Auto => Reading::OwnShard { ahead: cores >= 2 },
        })
    }
}

pub fn main(args: FlowsArgs) -> CliResult<()> {
    let workers = bounded("--workers", args.workers, 1, 64)?;
    let live = !args.interfaces.is_empty();
    if live != args.inputs.is_empty() {
        return Err(
            "give capture files with --in FILE, or interfaces with --iface NAME (not both)".into(),
        );
    }
    if !live && args.capture_buffer.is_some() {
        return Err("--capture-buffer sizes the ring of a capture on an interface (--iface); capture files are read as they are".into());
    }
    // Inputs are checked before the sinks start, so that a wrong name leaves no output
    // file with a header and nothing else.
    for name in &args.interfaces {
        stateplane_io::live::Interface::lookup(name).map_err(|e| format!("--iface: {e}"))?;
    }
    let open_inputs = || {
        (args.inputs.iter().enumerate())
            .map(|(i, path)| {
                let port =
                    FileRx::open(path).map_err(|e| format!("--in {}: {e}", path.display()))?;
                Ok((i as PortId, Box::new(port) as Box<dyn RxPort>))
            })
            .collect::<CliResult<Vec<_>>>()
    };
    // Files: how they are read is chosen, and they are opened, before the sinks start too.
    let files = if live {
        None
    } else {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let reading = args.read_ahead.reading(&args.inputs, workers, cores)?;
        // Chunks read the file they opened; the other layouts read these streams.
        let streams = match reading {
            Reading::Chunks(_) => None,
            _ => Some(open_inputs()?),
        };
        Some((reading, streams))
    };
    let seed = args
        .hash_seed
        .unwrap_or_else(stateplane_wire::flow::random_seed);
    let (export, tap) = args.settings.start(Naming::Flags, workers, seed, live)?;
    let runtime = RuntimeConfig {
        workers,
        hasher: FlowHasher::with_seed(seed),
        taps: vec![tap],
        ..RuntimeConfig::default()
    };
    let factory: ProgramFactory = Arc::new(|_| Box::new(Monitor));
    let start = Instant::now();
    let Some((reading, mut opened)) = files else {
        let outcome = daemon::run(LiveRun {
            io: IoChoice::Observe,
            program: "flows".into(),
            port_names: args.interfaces.clone(),
            interfaces: args.interfaces.clone(),
            runtime,
            factory: factory.clone(),
            rebuild: Box::new(move || Ok(factory.clone())),
            metrics: None,
            control: ControlAddr::Off,
            monitor_buffer: args.capture_buffer.unwrap_or_default().0,
            // The records' summary comes with the run's.
            flows: Some(export),
        })?;
        crate::print_summary(&outcome, args.summary_json)?;
        return outcome.error().map_or(Ok(()), Err);
    };
    // Reading ahead: a reader thread fills batches of bursts (handed over 16 at a time, so
    // the threads wake each other once per batch), for one worker or for all. Otherwise
    // each worker reads the files for itself and keeps its own shard, or its turn of one
    // file's chunks. The inputs opened above serve the first reader; a worker reading for
    // itself after it opens them again (`reading` has refused that for standard input).
    let mut inputs = || opened.take().map_or_else(open_inputs, Ok);
    let handle = RunHandle::new(workers);
    let (hasher, burst_size) = (runtime.hasher, runtime.burst_size);
    let sources = match reading {
        Reading::Chunks(ChunkedCapture::Pcap(file)) => chunk_shards(file, &runtime, &handle),
        Reading::Chunks(ChunkedCapture::Pcapng(file)) => chunk_shards(file, &runtime, &handle),
        Reading::Shared => ReadAhead::spawn_shared(inputs()?, workers, hasher, burst_size, &handle)
            .map_err(|e| format!("starting the reader thread: {e}"))?,
        Reading::OwnShard { ahead } => (0..workers)
            .map(|w| {
                let shard = OwnShard::new(inputs()?, w, workers, hasher, &handle);
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
            .collect::<CliResult<Vec<_>>>()?,
    };
    // Standard input's size is not known: the progress then shows bytes read so far.
    let size = if args.inputs.iter().any(|p| is_stdin(p)) {
        0
    } else {
        (args.inputs.iter())
            .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
            .sum()
    };
    let watched = handle.input_bytes.clone();
    let progress = Progress::start(size, true, move || watched.load(Ordering::Relaxed));
    let run = run_sharded(&runtime, sources, args.inputs.len(), &factory, &handle);
    drop(progress);
    // The taps no worker took hold the exporter's queue open.
    drop(runtime);
    let malformed: u64 = run.total.malformed.iter().sum();
    if malformed > 0 {
        eprintln!("{malformed} malformed packets counted and skipped");
    }
    let records_to_stdout = export.writes_to_stdout();
    let report = export.finish();
    let wall = start.elapsed();
    if args.summary_json {
        crate::emit(&format!("{}\n", report.to_json(wall)), records_to_stdout);
    } else {
        // Standard error: a table is for people, and records may be on standard output.
        eprint!("{}", report.table(wall));
    }
    if !run.errors.is_empty() {
        return Err(run.errors.join("; "));
    }
    report.error().map_or(Ok(()), Err)
}

/// The workers' sources for `file`, read in chunks by all of them.
fn chunk_shards<F: ChunkedFile + 'static>(
    file: F,
    runtime: &RuntimeConfig,
    handle: &RunHandle,
) -> Vec<Box<dyn BurstSource>> {
    let (workers, hasher, burst) = (runtime.workers, runtime.hasher, runtime.burst_size);
    ChunkShard::for_workers(
        Arc::new(file),
        0,
        workers,
        hasher,
        burst,
        CHUNK_BYTES,
        handle,
    )
}
