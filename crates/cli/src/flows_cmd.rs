//! `stateplane flows`: capture files or interfaces in, unsampled flow records out (IPFIX
//! over UDP or TCP, IPFIX files, CSV, JSON lines). The flags become `MonitorOptions`;
//! `stateplane_switch::flow_monitor` builds and runs the monitor; this prints.

use crate::progress::Progress;
use crate::summary_output::CliResult;
use stateplane_switch::flow_export::FlowSettings;
use stateplane_switch::flow_monitor::{
    FlowMonitor, MonitorOptions, MonitorOutcome, ReadAheadChoice,
};
use stateplane_switch::units::{CaptureBuffer, MemoryBudget};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

#[derive(clap::Args)]
pub struct FlowsArgs {
    /// Capture files to read (pcap or pcapng; Ethernet, Linux cooked as `tcpdump -i any`
    /// writes, raw IP or loopback), merged by time; timestamps come from them. `-` reads
    /// standard input (e.g. `tcpdump -i any -w - | stateplane flows -i - ...`).
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
    /// The memory the run may take, in bytes with k, M, G or T (default: three quarters of
    /// this machine's). What the settings size (tables, sketches, flow tables, capture
    /// rings) is checked against it before anything is allocated.
    #[arg(long, value_name = "BYTES")]
    pub memory_budget: Option<MemoryBudget>,
    /// Serve Prometheus metrics on this loopback address, e.g. 127.0.0.1:9464: packets,
    /// drops, flow records and each sink's messages (docs/cli.md).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Capture files: keep serving metrics this many seconds after the run, for a last
    /// scrape.
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    pub hold_metrics: u64,
}

pub fn main(args: FlowsArgs) -> CliResult<()> {
    let metrics = (args.metrics.as_deref())
        .map(|a| stateplane_switch::metrics::parse_addr("--metrics", a, "127.0.0.1:9464"))
        .transpose()?;
    if args.hold_metrics > 0 && metrics.is_none() {
        return Err(
            "--hold-metrics keeps the metrics endpoint up after the run: give --metrics ADDR too"
                .into(),
        );
    }
    if args.hold_metrics > 0 && !args.interfaces.is_empty() {
        return Err("--hold-metrics is for runs over capture files; a capture on interfaces serves metrics until it stops".into());
    }
    let monitor = FlowMonitor::build(MonitorOptions {
        metrics,
        inputs: args.inputs,
        interfaces: args.interfaces,
        capture_buffer: args.capture_buffer,
        settings: args.settings,
        workers: args.workers,
        memory_budget: args.memory_budget,
        read_ahead: args.read_ahead,
        hash_seed: args.hash_seed,
    })?;
    let progress = (!monitor.is_live()).then(|| {
        let watched = monitor.handle();
        let progress = move || watched.input_bytes.load(Ordering::Relaxed);
        Progress::start(monitor.input_size(), true, progress)
    });
    let outcome = monitor.run()?;
    drop(progress);
    let hold = || std::thread::sleep(std::time::Duration::from_secs(args.hold_metrics));
    match outcome {
        MonitorOutcome::Live(outcome) => {
            crate::summary_output::print_summary(&outcome, args.summary_json)?;
            outcome.error().map_or(Ok(()), Err)
        }
        MonitorOutcome::Files {
            flows,
            wall,
            input,
            errors,
            records_to_stdout,
            interrupted,
            memory,
        } => {
            use stateplane_switch::summary::{memory_json, memory_table};
            if args.summary_json {
                let mut json = flows.to_json(wall);
                if let Some(fields) = json.as_object_mut() {
                    fields.extend(input.json_fields());
                    fields.insert("memory".into(), memory_json(&memory));
                }
                crate::summary_output::emit(&format!("{json}\n"), records_to_stdout);
            } else {
                // Standard error: a table is for people, and records may be on standard output.
                let memory = memory_table(&memory);
                eprint!("{}{}{memory}", flows.table(wall), input.table());
            }
            hold();
            if !errors.is_empty() {
                return Err(errors.join("; "));
            }
            if let Some(signal) = interrupted {
                crate::summary_output::end_interrupted(signal, flows.error());
            }
            flows.error().map_or(Ok(()), Err)
        }
    }
}
