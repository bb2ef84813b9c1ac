//! `stateplane run`: a program over capture-file ports, or over network interfaces (see
//! `run_live`).

use crate::progress::Progress;
use crate::{CliResult, run_live, summary};
use stateplane_io::capture::{FileRx, FileTx};
use stateplane_programs::PortNames;
use stateplane_runtime::{OfflinePorts, RunHandle, RuntimeConfig, run_offline};
use stateplane_runtime::{PortId, ProgramFactory, RxPort, TxPort};
use stateplane_switch::config::{PortSection, RunConfig};
use stateplane_switch::export::Naming;
use stateplane_switch::flow_export::FlowReport;
use stateplane_switch::metrics;
use stateplane_switch::units::CaptureBuffer;
use stateplane_switch::units::bounded;
use stateplane_wire::FlowHasher;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

#[derive(clap::Args)]
#[command(after_help = program_list())]
pub struct RunArgs {
    /// The program (overrides the config's `[program]` name); default `forward`.
    pub program: Option<String>,
    /// A TOML configuration (see docs/cli.md).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// An input capture (pcap or pcapng); repeat for several ports, named in0, in1, ...
    #[arg(long = "in", short = 'i')]
    pub inputs: Vec<PathBuf>,
    /// The output capture, port `out` (after the inputs); `.pcapng` writes pcapng.
    #[arg(long = "out", short = 'o')]
    pub output: Option<PathBuf>,
    /// A network interface as a live port (named after it); repeat for each port. The run
    /// goes on until SIGINT or SIGTERM.
    #[arg(long = "iface", short = 'I')]
    pub interfaces: Vec<String>,
    /// Worker threads, each owning a shard of the flows.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Packets per burst.
    #[arg(long)]
    pub burst: Option<usize>,
    /// Live ports' I/O: auto (AF_XDP where it is measured to win and the interface allows,
    /// else AF_PACKET), afpacket, afxdp, or observe (a passive monitor: AF_PACKET copies of
    /// what the interfaces receive and send, the host's traffic undisturbed, nothing sent).
    #[arg(long)]
    pub io: Option<String>,
    /// With --io observe: each worker's capture ring on each interface, in bytes, with k,
    /// M or G (default 64M; 1M to 1G), as `stateplane flows --capture-buffer`.
    #[arg(long, value_name = "BYTES")]
    pub capture_buffer: Option<CaptureBuffer>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Serve Prometheus metrics on this loopback address, e.g. 127.0.0.1:9464.
    #[arg(long)]
    pub metrics: Option<String>,
    /// Live runs: serve the control API (`stateplane ctl`) on this loopback address
    /// (default 127.0.0.1:9559), or `off`.
    #[arg(long)]
    pub control: Option<String>,
    /// Write packets sent to the control plane into this capture.
    #[arg(long)]
    pub control_pcap: Option<PathBuf>,
    /// Keep serving metrics this many seconds after the run, for a last scrape.
    #[arg(long, default_value_t = 0)]
    pub hold_metrics: u64,
    /// Seed of the flow hash (default: random per process), for reproducible sharding.
    #[arg(long)]
    pub hash_seed: Option<u64>,
}

fn program_list() -> String {
    let mut s = String::from("Programs:\n");
    for (name, about) in stateplane_programs::catalog() {
        s.push_str(&format!("  {name:<13} {about}\n"));
    }
    s
}

/// The program named by the flag or the config, built for `names`.
fn load_program(
    args_program: Option<&str>,
    cfg: &RunConfig,
    names: &PortNames,
) -> CliResult<(String, ProgramFactory)> {
    let program_name = args_program
        .map(str::to_owned)
        .or_else(|| cfg.program.as_ref().map(|p| p.name.clone()))
        .unwrap_or_else(|| "forward".into());
    let settings = cfg
        .program
        .as_ref()
        .filter(|p| p.name == program_name)
        .and_then(|p| p.settings.get(&program_name))
        .cloned();
    let factory = stateplane_programs::build(&program_name, settings.as_ref(), names)
        .and_then(|f| stateplane_programs::with_guarantees(f, &cfg.guarantees))
        .map_err(|e| e.to_string())?;
    Ok((program_name, factory))
}

/// The ports from the config's `[[port]]` tables or from the flags, checked.
fn ports_of(args: &RunArgs, cfg: &RunConfig) -> CliResult<Vec<PortSection>> {
    let flags_given =
        !(args.inputs.is_empty() && args.output.is_none() && args.interfaces.is_empty());
    let ports = match (cfg.port.is_empty(), flags_given) {
        (false, true) => {
            return Err(
                "give ports either in the config's [[port]] tables or with --in/--out/--iface, not both"
                    .into(),
            );
        }
        (false, false) => cfg.port.clone(),
        (true, _) if !args.interfaces.is_empty() => {
            if !args.inputs.is_empty() || args.output.is_some() {
                return Err("--iface makes live ports; it cannot be mixed with --in/--out files (capture live traffic with tcpdump instead)".into());
            }
            args.interfaces
                .iter()
                .map(|name| PortSection {
                    name: name.clone(),
                    rx: None,
                    tx: None,
                    iface: Some(name.clone()),
                })
                .collect()
        }
        (true, _) => {
            if args.inputs.is_empty() {
                return Err("no input: give a capture with --in FILE (make one with `stateplane gen internet -o trace.pcap`), an interface with --iface NAME, or [[port]] tables with rx or iface in --config".into());
            }
            let mut ports: Vec<PortSection> = args
                .inputs
                .iter()
                .enumerate()
                .map(|(i, p)| PortSection {
                    name: format!("in{i}"),
                    rx: Some(p.clone()),
                    tx: None,
                    iface: None,
                })
                .collect();
            ports.push(PortSection {
                name: "out".into(),
                rx: None,
                tx: args.output.clone(),
                iface: None,
            });
            ports
        }
    };
    for (i, p) in ports.iter().enumerate() {
        if ports[..i].iter().any(|q| q.name == p.name) {
            return Err(format!(
                "port[{i}].name: '{}' is used twice; give each port its own name",
                p.name
            ));
        }
        if p.iface.is_some() && (p.rx.is_some() || p.tx.is_some()) {
            return Err(format!(
                "port[{i}] ({}): give either iface or rx/tx files, not both",
                p.name
            ));
        }
    }
    let live = ports.iter().filter(|p| p.iface.is_some()).count();
    if live > 0 && live < ports.len() {
        return Err("either every port names an iface (a live run) or none does (a run over capture files); mixing them is not supported".into());
    }
    if ports.len() > usize::from(PortId::MAX) {
        return Err(format!(
            "{} ports given; a switch has at most {} ports",
            ports.len(),
            PortId::MAX
        ));
    }
    Ok(ports)
}

pub fn main(args: RunArgs) -> CliResult<()> {
    let cfg = match &args.config {
        Some(path) => RunConfig::load(path)?,
        None => RunConfig::default(),
    };
    let ports = ports_of(&args, &cfg)?;
    let names = PortNames(ports.iter().map(|p| p.name.clone()).collect());
    let (program_name, factory) = load_program(args.program.as_deref(), &cfg, &names)?;

    let workers = bounded(
        "--workers",
        args.workers.or(cfg.workers).unwrap_or(1),
        1,
        64,
    )?;
    let burst_size = bounded("--burst", args.burst.or(cfg.burst).unwrap_or(64), 1, 1024)?;
    let queue_depth = bounded("queue_depth", cfg.queue_depth.unwrap_or(8), 1, 1024)?;
    let seed = args
        .hash_seed
        .unwrap_or_else(stateplane_wire::flow::random_seed);
    let live = ports.iter().all(|p| p.iface.is_some());
    let flows = (cfg.flows.as_ref())
        .map(|f| f.start(Naming::Config, workers, seed, live))
        .transpose()?;
    let (flows, tap) = flows.unzip();
    let runtime = RuntimeConfig {
        workers,
        burst_size,
        queue_depth,
        hasher: FlowHasher::with_seed(seed),
        taps: tap.into_iter().collect(),
    };

    let metrics_addr = args
        .metrics
        .as_ref()
        .or(cfg.metrics.as_ref())
        .map(|a| metrics::parse_addr("--metrics", a, "127.0.0.1:9464"))
        .transpose()?;
    let control = match args.control.as_deref().or(cfg.control.as_deref()) {
        Some("off") => run_live::ControlAddr::Off,
        Some(a) => run_live::ControlAddr::Given(metrics::parse_addr(
            "--control",
            a,
            stateplane_control::DEFAULT_ADDR,
        )?),
        None => run_live::ControlAddr::Default,
    };
    let capture_buffer = args.capture_buffer.or(cfg.capture_buffer);
    let io = run_live::IoChoice::parse(args.io.as_deref().or(cfg.io.as_deref()))?;
    if capture_buffer.is_some() && !(live && io == run_live::IoChoice::Observe) {
        return Err("--capture-buffer (capture_buffer) sizes the ring of a passive monitor, a live run with --io observe (io = \"observe\"); a switch's rings are fixed, and capture files are read as they are".into());
    }
    if live {
        if args.control_pcap.is_some() || args.hold_metrics > 0 {
            return Err("--control-pcap and --hold-metrics are for runs over capture files; a live run counts packets for the control plane and serves metrics until it stops".into());
        }
        let program = args.program.clone();
        let config_path = args.config.clone();
        let rebuild_names = names.clone();
        return run_live::main(run_live::LiveRun {
            program: program_name,
            port_names: names.0.clone(),
            interfaces: ports.iter().filter_map(|p| p.iface.clone()).collect(),
            io,
            runtime,
            factory,
            rebuild: Box::new(move || {
                let cfg = match &config_path {
                    Some(path) => RunConfig::load(path)?,
                    None => RunConfig::default(),
                };
                Ok(load_program(program.as_deref(), &cfg, &rebuild_names)?.1)
            }),
            metrics: metrics_addr,
            control,
            json: args.json,
            monitor_buffer: capture_buffer.unwrap_or_default().0,
            flows,
        });
    }

    let mut rx: Vec<(PortId, Box<dyn RxPort>)> = Vec::new();
    let mut tx: Vec<Option<Box<dyn TxPort>>> = Vec::new();
    let mut input_size = 0u64;
    for (i, p) in ports.iter().enumerate() {
        if let Some(path) = &p.rx {
            let port = FileRx::open(path)
                .map_err(|e| format!("port {} (rx {}): {e}", p.name, path.display()))?;
            input_size += std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            rx.push((i as PortId, Box::new(port)));
        }
        tx.push(match &p.tx {
            Some(path) => Some(Box::new(
                FileTx::create(path).map_err(|e| format!("port {}: {e}", p.name))?,
            )),
            None => None,
        });
    }
    if rx.is_empty() {
        return Err("no port has an rx capture: give one with --in FILE or rx = \"FILE\" in a [[port]] table".into());
    }
    let control: Option<Box<dyn TxPort>> = match &args.control_pcap {
        Some(path) => Some(Box::new(
            FileTx::create(path).map_err(|e| format!("--control-pcap: {e}"))?,
        )),
        None => None,
    };

    let handle = Arc::new(RunHandle::new(workers));
    if let Some(addr) = metrics_addr {
        metrics::serve(
            addr,
            handle.clone(),
            factory(0).drop_reasons(),
            names.0.clone(),
        )?;
        eprintln!("metrics on http://{addr}/metrics");
    }
    let watched = handle.input_bytes.clone();
    let progress = Progress::start(input_size, true, move || watched.load(Ordering::Relaxed));
    let started = std::time::Instant::now();
    let report = run_offline(
        &runtime,
        OfflinePorts { rx, tx, control },
        &factory,
        &handle,
    );
    drop(progress);
    // The taps no worker took hold the exporter's queue open.
    drop(runtime);
    let records_to_stdout = flows.as_ref().is_some_and(|f| f.writes_to_stdout());
    let flows = flows.map(|f| f.finish());

    let text = if args.json {
        let mut summary = summary::to_json(&report, &program_name, &names.0);
        if let Some(f) = &flows {
            summary["flows"] = f.to_json(started.elapsed());
        }
        serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())? + "\n"
    } else {
        let mut table = summary::table(&report, &program_name, &names.0);
        if let Some(f) = &flows {
            table += &format!("flow records:\n{}", f.table(started.elapsed()));
        }
        table
    };
    summary::emit(&text, records_to_stdout);
    if let Some(e) = flows.as_ref().and_then(FlowReport::error) {
        return Err(e);
    }
    if args.hold_metrics > 0 && args.metrics.is_some() {
        std::thread::sleep(std::time::Duration::from_secs(args.hold_metrics));
    }
    if report.errors.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the run had {} error(s), listed above",
            report.errors.len()
        ))
    }
}
