//! `stateplane flows`: capture files or interfaces in, unsampled flow records out (IPFIX
//! over UDP or TCP, IPFIX files, CSV, JSON lines), through the same parse, sharding and
//! workers as `stateplane run`, with the flow stage as each worker's tap.

use crate::export::{ExportConfig, ExportReport, Exporter, SinkSpec};
use crate::progress::Progress;
use crate::{CliResult, run::bounded, run_live};
use stateplane_flows::aggregator::Timeouts;
use stateplane_flows::ipfix::Features;
use stateplane_flows::stage::{FlowStage, FlowTap, StageConfig, StageCounters};
use stateplane_io::capture::FileRx;
use stateplane_runtime::pipeline::{OfflinePorts, RunHandle, RuntimeConfig, run_offline};
use stateplane_runtime::{
    Burst, Context, DropReason, PortId, Program, ProgramFactory, RxPort, Tap, TapFactory, Verdict,
};
use stateplane_wire::FlowHasher;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(clap::Args)]
pub struct FlowsArgs {
    /// Capture files to read (pcap or pcapng), merged by time; timestamps come from them.
    #[arg(long = "in", short = 'i')]
    pub inputs: Vec<PathBuf>,
    /// Interfaces to capture from instead (runs until SIGINT or SIGTERM).
    #[arg(long = "iface", short = 'I')]
    pub interfaces: Vec<String>,
    /// Send IPFIX over UDP to this collector (repeatable), e.g. 127.0.0.1:4739.
    #[arg(long)]
    pub ipfix: Vec<SocketAddr>,
    /// Send IPFIX over TCP to this collector.
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
    /// Worker threads, each owning a shard of the flows.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Seconds without a packet after which a flow is exported.
    #[arg(long, default_value_t = 15.0)]
    pub inactive_timeout: f64,
    /// Seconds after which a long flow is exported (and goes on in a new record).
    #[arg(long, default_value_t = 1800.0)]
    pub active_timeout: f64,
    /// Microflow table slots per worker and family (a power of two); 0 sends every packet
    /// straight to the flow table (one level).
    #[arg(long, default_value_t = 4096)]
    pub microflow_slots: usize,
    /// Flows each worker holds per address family; when full, the least recently active
    /// of a sample is exported early (counted).
    #[arg(long, default_value_t = 1 << 18)]
    pub max_flows: usize,
    /// IPFIX messages per second over UDP (0: unpaced).
    #[arg(long, default_value_t = 20_000)]
    pub ipfix_rate: u64,
    /// Largest IPFIX message over UDP, in bytes.
    #[arg(long, default_value_t = 1400)]
    pub mtu: usize,
    /// IPFIX observation domain id.
    #[arg(long, default_value_t = 1)]
    pub domain: u32,
    /// Print the summary as JSON.
    #[arg(long)]
    pub summary_json: bool,
    /// Seed of the flow hash (default: random per process).
    #[arg(long)]
    pub hash_seed: Option<u64>,
}

/// What a worker gets if it asks twice for its stage (never in one run).
struct NoTap;

impl Tap for NoTap {
    fn observe(&mut self, _burst: &Burst, _ctx: &Context) {}
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id().into());
    h.finish()
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

pub fn main(args: FlowsArgs) -> CliResult<()> {
    let features = Features::parse(&args.features).map_err(|e| format!("--features: {e}"))?;
    let stage = StageConfig {
        microflow_slots: args.microflow_slots,
        max_flows: bounded("--max-flows", args.max_flows, 1, 1 << 28)?,
        timeouts: Timeouts {
            inactive_ns: seconds("--inactive-timeout", args.inactive_timeout)?,
            active_ns: seconds("--active-timeout", args.active_timeout)?,
        },
        biflow: args.biflow,
        ..StageConfig::default()
    };
    let workers = bounded("--workers", args.workers, 1, 64)?;
    let mut sinks: Vec<SinkSpec> = args.ipfix.iter().map(|a| SinkSpec::IpfixUdp(*a)).collect();
    sinks.extend(args.ipfix_tcp.iter().map(|a| SinkSpec::IpfixTcp(*a)));
    sinks.extend(
        args.ipfix_file
            .iter()
            .map(|p| SinkSpec::IpfixFile(p.clone())),
    );
    if let Some(p) = &args.csv {
        sinks.push(SinkSpec::Csv(file_or_stdout(p)));
    }
    if let Some(p) = &args.json {
        sinks.push(SinkSpec::Json(file_or_stdout(p)));
    }
    let live = !args.interfaces.is_empty();
    if live != args.inputs.is_empty() {
        return Err(
            "give capture files with --in FILE, or interfaces with --iface NAME (not both)".into(),
        );
    }
    let exporter = Exporter::start(
        ExportConfig {
            sinks,
            features,
            biflow: args.biflow,
            domain: args.domain,
            mtu: args.mtu,
            rate: args.ipfix_rate,
        },
        live,
    )?;
    let counters = Arc::new(Mutex::new(Vec::new()));
    let seed = args.hash_seed.unwrap_or_else(random_seed);
    // Built here, so that a bad size is an error before the run and workers only take them.
    let stages = (0..workers)
        .map(|w| {
            let stage = FlowStage::new(
                stage,
                seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            )
            .map_err(|e| format!("--microflow-slots / --max-flows: {e}"))?;
            let tap = FlowTap::new(stage, Box::new(exporter.sink())).reporting_to(counters.clone());
            Ok(Some(tap))
        })
        .collect::<CliResult<Vec<_>>>()?;
    let stages = Mutex::new(stages);
    let tap: TapFactory = Arc::new(move |w| {
        let mut taken = stages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Each worker asks once (a live reload replaces the program, not the tap).
        match taken.get_mut(w).and_then(Option::take) {
            Some(tap) => Box::new(tap) as Box<dyn Tap>,
            None => Box::new(NoTap),
        }
    });
    let runtime = RuntimeConfig {
        workers,
        hasher: FlowHasher::with_seed(seed),
        tap: Some(tap),
        ..RuntimeConfig::default()
    };
    let factory: ProgramFactory = Arc::new(|_| Box::new(Monitor));
    let start = Instant::now();
    let run_error = if live {
        run_live::main(run_live::LiveRun {
            io: run_live::IoChoice::Auto,
            program: "flows".into(),
            port_names: args.interfaces.clone(),
            interfaces: args.interfaces.clone(),
            runtime,
            factory: factory.clone(),
            rebuild: Box::new(move || Ok(factory.clone())),
            metrics: None,
            control: run_live::ControlAddr::Off,
            json: args.summary_json,
        })
        .err()
    } else {
        let mut rx: Vec<(PortId, Box<dyn RxPort>)> = Vec::new();
        let mut size = 0;
        for (i, path) in args.inputs.iter().enumerate() {
            let port = FileRx::open(path).map_err(|e| format!("--in {}: {e}", path.display()))?;
            size += std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            rx.push((i as PortId, Box::new(port)));
        }
        let tx = (0..rx.len()).map(|_| None).collect();
        let handle = RunHandle::new(workers);
        let watched = handle.input_bytes.clone();
        let progress = Progress::start(size, true, move || watched.load(Ordering::Relaxed));
        let report = run_offline(
            &runtime,
            OfflinePorts {
                rx,
                tx,
                control: None,
            },
            &factory,
            &handle,
        );
        drop(progress);
        // Stages no worker took hold sinks too: the exporter's queue ends when they go.
        drop(runtime);
        let malformed: u64 = report.total.malformed.iter().sum();
        if malformed > 0 {
            eprintln!("{malformed} malformed packets counted and skipped");
        }
        (!report.errors.is_empty()).then(|| report.errors.join("; "))
    };
    let export = exporter.finish();
    let stages = counters
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    print_summary(&stages, &export, start.elapsed(), args.summary_json);
    if let Some(e) = run_error {
        return Err(e);
    }
    if let Some(e) = export.sinks.iter().find_map(|s| s.3.clone()) {
        return Err(format!("export failed: {e}"));
    }
    Ok(())
}

fn print_summary(
    stages: &[StageCounters],
    export: &ExportReport,
    wall: std::time::Duration,
    json: bool,
) {
    let mut t = StageCounters::default();
    for s in stages {
        t.merge(s);
    }
    let mpps = t.packets as f64 / wall.as_secs_f64().max(1e-9) / 1e6;
    if json {
        let sinks: Vec<_> = export
            .sinks
            .iter()
            .map(|(name, units, bytes, error)| serde_json::json!({"sink": name, "messages": units, "bytes": bytes, "error": error}))
            .collect();
        let v = serde_json::json!({
            "packets": t.packets, "bytes": t.bytes, "not_ip": t.not_ip,
            "flows": t.flows_created, "records": t.records_out,
            "microflow_records": t.microflow_records, "evicted_full": t.evicted_full,
            "records_exported": export.records, "records_dropped": export.dropped,
            "seconds": wall.as_secs_f64(), "mpps": mpps, "sinks": sinks,
        });
        println!("{v}");
        return;
    }
    let ratio = t.packets as f64 / t.microflow_records.max(1) as f64;
    eprintln!(
        "packets        {:>14}   ({:.2} Mpps over {:.2} s)",
        t.packets,
        mpps,
        wall.as_secs_f64()
    );
    eprintln!("bytes (IP)     {:>14}", t.bytes);
    eprintln!("not IP         {:>14}   (in no flow)", t.not_ip);
    eprintln!("flows          {:>14}", t.flows_created);
    eprintln!("records        {:>14}", t.records_out);
    eprintln!(
        "microflow recs {:>14}   ({ratio:.2} packets per record)",
        t.microflow_records
    );
    eprintln!("evicted (full) {:>14}", t.evicted_full);
    if export.dropped > 0 {
        eprintln!(
            "DROPPED        {:>14}   records: the exporter fell behind",
            export.dropped
        );
    }
    for (name, units, bytes, error) in &export.sinks {
        match error {
            None => eprintln!("{name}: {units} messages/lines, {bytes} bytes"),
            Some(e) => eprintln!("{name}: FAILED after {units} messages: {e}"),
        }
    }
}
