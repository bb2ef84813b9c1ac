//! `stateplane flows`: capture files or interfaces in, unsampled flow records out (IPFIX
//! over UDP or TCP, IPFIX files, CSV, JSON lines), with the flow stage as each worker's
//! tap behind a program that only observes. Over files a reader thread reads and parses
//! ahead (`ReadAhead`: one worker's, or one for all workers), each worker reads its own
//! shard (`OwnShard`), or the workers read one capture file's chunks in turn (`ChunkShard`);
//! live, interfaces are opened passively (AF_PACKET copies).
//! [`FlowSettings::start`] also serves a run's `[flows]` section.

use crate::export::{ExportConfig, ExportReport, Exporter, Naming, SinkSpec};
use crate::progress::Progress;
use crate::units::{ByteRate, CaptureBuffer, MessageSize};
use crate::{CliResult, run::bounded, run_live};
use stateplane_flows::aggregator::Timeouts;
use stateplane_flows::ipfix::Features;
use stateplane_flows::stage::{FlowStage, FlowTap, StageConfig, StageCounters};
use stateplane_io::ChunkedCapture;
use stateplane_io::capture::{FileRx, is_stdin};
use stateplane_runtime::chunked::{CHUNK_BYTES, ChunkShard};
use stateplane_runtime::{
    Burst, ChunkedFile, Context, DropReason, PortId, Program, ProgramFactory, RxPort, Tap,
    TapFactory, Verdict,
};
use stateplane_runtime::{BurstSource, OwnShard, ReadAhead, RunHandle, RuntimeConfig, run_sharded};
use stateplane_wire::FlowHasher;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
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

/// The flow stage's and the exporter's settings: the flags of `stateplane flows`, and the
/// keys of the `[flows]` section with which `stateplane run` gives any program flow
/// records of what it forwarded. Defaults as mature exporters (15 s inactive, 30 min active).
#[derive(clap::Args, serde::Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields, default)]
pub struct FlowSettings {
    /// Send IPFIX over UDP to this collector (repeatable), e.g. 127.0.0.1:4739.
    #[arg(long)]
    pub ipfix: Vec<SocketAddr>,
    /// Send IPFIX over TCP to this collector (a connection lost later is made again, a
    /// second later and then at waits doubling up to 30 s, as a new stream; what is
    /// exported meanwhile is lost and counted).
    #[arg(long)]
    pub ipfix_tcp: Vec<SocketAddr>,
    /// Write IPFIX to this file (RFC 5655).
    #[arg(long)]
    pub ipfix_file: Vec<PathBuf>,
    /// Write CSV to this file, or - for standard output.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write JSON lines to this file, or - for standard output.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Features to export: default, all, or a list of counts, times, tcp_flags, tos, ttl,
    /// sizes, iat, ports, vlan, icmp, end_reason.
    #[arg(long, default_value = "default")]
    pub features: String,
    /// Biflow records (RFC 5103): both directions of a connection in one record, the side
    /// that sent first as forward.
    #[arg(long)]
    pub biflow: bool,
    /// Seconds without a packet after which a flow is exported.
    #[arg(long, default_value_t = DEFAULT.inactive_timeout)]
    pub inactive_timeout: f64,
    /// Seconds after which a long flow is exported (and goes on in a new record).
    #[arg(long, default_value_t = DEFAULT.active_timeout)]
    pub active_timeout: f64,
    /// Microflow table slots per worker and family (a power of two); 0 sends every packet
    /// straight to the flow table (one level).
    #[arg(long, default_value_t = DEFAULT.microflow_slots)]
    pub microflow_slots: usize,
    /// Flows each worker holds per address family; when full, the least recently active
    /// of a sample is exported early (counted).
    #[arg(long, default_value_t = DEFAULT.max_flows)]
    pub max_flows: usize,
    /// Make each flow table its full size (--max-flows) at the start, so that it never
    /// doubles while running: the last doubling holds a worker about 2 ms at the default
    /// size, which a live port at line rate must hold in its rings. Memory is still touched
    /// only as flows arrive (but fills toward the budget sooner).
    #[arg(long)]
    pub presize_flows: bool,
    /// IPFIX bytes per second to each UDP collector, in bursts of at most 22,400 bytes
    /// (or one larger message): k, M and G for thousands, millions, billions; 0 unpaced.
    #[arg(long, default_value_t = DEFAULT.ipfix_rate)]
    pub ipfix_rate: ByteRate,
    /// Largest IPFIX message over UDP, in bytes (512 to 65535), or auto: what one packet
    /// on the route to the collector carries (its MTU less the IP and UDP headers: 64 KiB
    /// on loopback, 1,472 bytes on Ethernet, read when the socket opens), or 1,400 where
    /// the kernel does not say.
    #[arg(long, default_value_t = DEFAULT.mtu)]
    pub mtu: MessageSize,
    /// Hand the kernel runs of equal-size IPFIX messages in one send, to cut into datagrams
    /// (UDP generic segmentation offload): about a quarter of the time per message on
    /// loopback. One send holds 64 KiB, so this joins messages only with a --mtu of a few
    /// thousand bytes or less (not --mtu auto on loopback). Collectors receive the same
    /// datagrams, but a capture taken on this host (tcpdump on the sending side, or on
    /// loopback) shows each send as one oversized packet, which tshark calls malformed;
    /// hence off unless asked for.
    #[arg(long)]
    pub ipfix_gso: bool,
    /// IPFIX observation domain id.
    #[arg(long, default_value_t = DEFAULT.domain)]
    pub domain: u32,
}

/// The defaults of [`FlowSettings`], for the flags and the config alike.
const DEFAULT: FlowSettings = FlowSettings {
    ipfix: Vec::new(),
    ipfix_tcp: Vec::new(),
    ipfix_file: Vec::new(),
    csv: None,
    json: None,
    features: String::new(),
    biflow: false,
    inactive_timeout: 15.0,
    active_timeout: 1800.0,
    microflow_slots: 4096,
    max_flows: 1 << 18,
    presize_flows: false,
    // What 20,000 messages of 1,400 bytes a second were: nfcapd keeps up with it at its
    // default receive buffer while the exporter shares its two cores.
    ipfix_rate: ByteRate(28_000_000),
    mtu: MessageSize::Auto,
    ipfix_gso: false,
    domain: 1,
};

impl Default for FlowSettings {
    fn default() -> Self {
        FlowSettings {
            features: "default".into(),
            ..DEFAULT
        }
    }
}

/// What a worker gets if it asks twice for its stage (never in one run).
struct NoTap;

impl Tap for NoTap {
    fn observe(&mut self, _burst: &Burst, _ctx: &Context) {}
}

/// Observes only: the packets end here (their records carry no egress port).
struct Monitor;

impl Program for Monitor {
    fn process(&mut self, burst: &mut Burst, _ctx: &mut Context) {
        for d in burst.descs_mut() {
            d.verdict = Verdict::Drop(DropReason::program(0));
        }
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &["observed"]
    }
}

fn seconds(name: &str, s: f64) -> CliResult<u64> {
    if s.is_finite() && s > 0.0 && s < 1e9 {
        Ok((s * 1e9) as u64)
    } else {
        Err(format!("{name}: {s} is not a positive number of seconds"))
    }
}

/// A text sink's file, or `None` for `-` (standard output).
fn file_or_stdout(path: &std::path::Path) -> Option<PathBuf> {
    (path.as_os_str() != "-").then(|| path.to_path_buf())
}

/// A flow stage in every worker and the exporter they feed: what `stateplane flows` runs
/// behind an observer, and what a `[flows]` section adds to `stateplane run`.
pub struct FlowExport {
    exporter: Exporter,
    counters: Arc<Mutex<Vec<StageCounters>>>,
}

/// What a run's flow stages and exporter did.
pub struct FlowReport {
    pub stages: StageCounters,
    pub export: ExportReport,
}

impl FlowSettings {
    /// Checks the settings (errors name the flag or key, as `naming` says), opens every
    /// sink and builds a stage for each of `workers`, hashing with `seed`. `live`: a full
    /// exporter queue drops records (counted) instead of holding the workers.
    pub fn start(
        &self,
        naming: Naming,
        workers: usize,
        seed: u64,
        live: bool,
    ) -> CliResult<(FlowExport, TapFactory)> {
        let name = |key| naming.name(key);
        let features =
            Features::parse(&self.features).map_err(|e| format!("{}: {e}", name("features")))?;
        let stage = StageConfig {
            microflow_slots: self.microflow_slots,
            max_flows: bounded(&name("max_flows"), self.max_flows, 1, 1 << 28)?,
            timeouts: Timeouts {
                inactive_ns: seconds(&name("inactive_timeout"), self.inactive_timeout)?,
                active_ns: seconds(&name("active_timeout"), self.active_timeout)?,
            },
            biflow: self.biflow,
            presize: self.presize_flows,
            extremes: features.needs_extremes(),
            ..StageConfig::default()
        };
        let mut sinks: Vec<SinkSpec> = self.ipfix.iter().map(|a| SinkSpec::IpfixUdp(*a)).collect();
        sinks.extend(self.ipfix_tcp.iter().map(|a| SinkSpec::IpfixTcp(*a)));
        sinks.extend(
            self.ipfix_file
                .iter()
                .map(|p| SinkSpec::IpfixFile(p.clone())),
        );
        if let Some(p) = &self.csv {
            sinks.push(SinkSpec::Csv(file_or_stdout(p)));
        }
        if let Some(p) = &self.json {
            sinks.push(SinkSpec::Json(file_or_stdout(p)));
        }
        // Stages first, so that a bad size is an error before any sink is opened.
        let stages = (0..workers)
            .map(|w| {
                FlowStage::new(
                    stage,
                    seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                )
                .map_err(|e| format!("{} / {}: {e}", name("microflow_slots"), name("max_flows")))
            })
            .collect::<CliResult<Vec<_>>>()?;
        let exporter = Exporter::start(
            ExportConfig {
                naming,
                sinks,
                features,
                biflow: self.biflow,
                domain: self.domain,
                mtu: self.mtu,
                rate: self.ipfix_rate,
                gso: self.ipfix_gso,
            },
            live,
        )?;
        let counters = Arc::new(Mutex::new(Vec::new()));
        let taps: Vec<Option<FlowTap>> = (stages.into_iter())
            .map(|stage| {
                let sink = Box::new(exporter.sink());
                Some(FlowTap::new(stage, sink).reporting_to(counters.clone()))
            })
            .collect();
        let taps = Mutex::new(taps);
        let factory: TapFactory = Arc::new(move |w| {
            let mut taken = taps
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Each worker asks once (a live reload replaces the program, not the tap).
            match taken.get_mut(w).and_then(Option::take) {
                Some(tap) => Box::new(tap) as Box<dyn Tap>,
                None => Box::new(NoTap),
            }
        });
        Ok((FlowExport { exporter, counters }, factory))
    }
}

impl FlowExport {
    /// Whether records go to standard output.
    pub fn writes_to_stdout(&self) -> bool {
        self.exporter.writes_to_stdout()
    }

    /// Waits until every record is written. The run and its tap factory must be gone
    /// (stages no worker took hold sinks too, and the exporter's queue ends with them).
    pub fn finish(self) -> FlowReport {
        let export = self.exporter.finish();
        let mut stages = StageCounters::default();
        let counters = self.counters.lock();
        for s in counters
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
        {
            stages.merge(s);
        }
        FlowReport { stages, export }
    }
}

impl FlowReport {
    /// The first sink that failed, as an error.
    pub fn error(&self) -> Option<String> {
        (self.export.sinks.iter())
            .find_map(|s| (s.error.as_ref()).map(|e| format!("export failed: {}: {e}", s.name)))
    }

    pub fn to_json(&self, wall: std::time::Duration) -> serde_json::Value {
        let t = &self.stages;
        let sinks: Vec<_> = (self.export.sinks.iter())
            .map(|s| {
                serde_json::json!({"sink": s.name, "messages": s.units, "bytes": s.bytes,
                "lost_messages": s.lost, "reconnects": s.reconnects, "error": s.error})
            })
            .collect();
        serde_json::json!({
            "packets": t.packets, "bytes": t.bytes, "not_ip": t.not_ip,
            "flows": t.flows_created, "records": t.records_out,
            "microflow_records": t.microflow_records, "evicted_full": t.evicted_full,
            "records_exported": self.export.records, "records_dropped": self.export.dropped,
            "seconds": wall.as_secs_f64(), "mpps": mpps(t.packets, wall), "sinks": sinks,
        })
    }

    /// The summary as a table.
    pub fn table(&self, wall: std::time::Duration) -> String {
        use std::fmt::Write;
        let t = &self.stages;
        let ratio = t.packets as f64 / t.microflow_records.max(1) as f64;
        let mut s = String::new();
        let rate = mpps(t.packets, wall);
        let secs = wall.as_secs_f64();
        let _ = writeln!(
            s,
            "packets        {:>14}   ({rate:.2} Mpps over {secs:.2} s)",
            t.packets
        );
        let _ = writeln!(s, "bytes (IP)     {:>14}", t.bytes);
        let _ = writeln!(s, "not IP         {:>14}   (in no flow)", t.not_ip);
        let _ = writeln!(s, "flows          {:>14}", t.flows_created);
        let _ = writeln!(s, "records        {:>14}", t.records_out);
        let recs = t.microflow_records;
        let _ = writeln!(
            s,
            "microflow recs {recs:>14}   ({ratio:.2} packets per record)"
        );
        let _ = writeln!(s, "evicted (full) {:>14}", t.evicted_full);
        if self.export.dropped > 0 {
            let dropped = self.export.dropped;
            let _ = writeln!(
                s,
                "DROPPED        {dropped:>14}   records: the exporter fell behind"
            );
        }
        for sink in &self.export.sinks {
            let (name, units, bytes) = (&sink.name, sink.units, sink.bytes);
            let _ = match &sink.error {
                None => write!(s, "{name}: {units} messages/lines, {bytes} bytes"),
                Some(e) => write!(s, "{name}: FAILED after {units} messages: {e}"),
            };
            if sink.reconnects > 0 {
                let (lost, again) = (sink.lost, sink.reconnects);
                let _ = write!(
                    s,
                    "; LOST {lost} messages while the collector was away (connected again {again} times)"
                );
            }
            s.push('\n');
        }
        s
    }
}

fn mpps(packets: u64, wall: std::time::Duration) -> f64 {
    packets as f64 / wall.as_secs_f64().max(1e-9) / 1e6
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
        return run_live::main(run_live::LiveRun {
            io: run_live::IoChoice::Observe,
            program: "flows".into(),
            port_names: args.interfaces.clone(),
            interfaces: args.interfaces.clone(),
            runtime,
            factory: factory.clone(),
            rebuild: Box::new(move || Ok(factory.clone())),
            metrics: None,
            control: run_live::ControlAddr::Off,
            json: args.summary_json,
            monitor_buffer: args.capture_buffer.unwrap_or_default().0,
            // The records' summary comes with the run's.
            flows: Some(export),
        });
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
        crate::summary::emit(&format!("{}\n", report.to_json(wall)), records_to_stdout);
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
