//! `stateplane run`: flags over a configuration, a switch built from it
//! ([`stateplane_switch::Switch`]), its summary printed.

use crate::progress::Progress;
use crate::summary_output::CliResult;
use stateplane_switch::config::{PortSection, RunConfig};
use stateplane_switch::out_file::OutFile;
use stateplane_switch::units::{CaptureBuffer, MemoryBudget, bounded};
use stateplane_switch::{Switch, SwitchOptions};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

#[derive(clap::Args)]
#[command(after_help = program_list())]
pub struct RunArgs {
    /// The program (overrides the config's `[program]` name); default `forward`.
    pub program: Option<String>,
    /// A TOML configuration (see docs/cli.md).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// An input capture (pcap or pcapng; Ethernet, or Linux cooked, raw IP or loopback
    /// behind a synthesized Ethernet header); repeat for several ports, named in0, in1, ...
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
    /// else AF_PACKET; AF_PACKET when a port is a veth with TSO on, whose TCP comes in
    /// large segments), afpacket, afxdp, or observe (a passive monitor: AF_PACKET copies of
    /// what the interfaces receive and send, the host's traffic undisturbed, nothing sent).
    #[arg(long)]
    pub io: Option<String>,
    /// With --io observe: each worker's capture ring on each interface, in bytes, with k,
    /// M or G (default 64M; 1M to 1G), as `stateplane flows --capture-buffer`.
    #[arg(long, value_name = "BYTES")]
    pub capture_buffer: Option<CaptureBuffer>,
    /// The memory the run may take, in bytes with k, M, G or T (default: three quarters of
    /// this machine's). What the settings size (tables, sketches, flow tables, capture
    /// rings) is checked against it before anything is allocated.
    #[arg(long, value_name = "BYTES")]
    pub memory_budget: Option<MemoryBudget>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also write the summary as JSON to this file (what `stateplane report` gathers into
    /// a page): written beside it and renamed onto it once whole; the file beside it is
    /// made and removed before the run starts, so that a folder it cannot write is refused
    /// at once, and made again only to write the summary (a killed run leaves none).
    #[arg(long, value_name = "FILE")]
    pub summary_file: Option<PathBuf>,
    /// Serve Prometheus metrics on this loopback address, e.g. 127.0.0.1:9464.
    #[arg(long)]
    pub metrics: Option<String>,
    /// Live runs: where the control API (`stateplane ctl`) listens: a Unix socket
    /// (`unix:PATH`; default control.sock in the run directory, mode 0600), a loopback
    /// address (127.0.0.1:9559), any other address with TLS and a token or client
    /// certificates, or `off`.
    #[arg(long, value_name = "ENDPOINT")]
    pub control: Option<String>,
    /// TLS on a TCP control endpoint: the server's certificate chain (PEM).
    #[arg(long, value_name = "FILE")]
    pub control_cert: Option<PathBuf>,
    /// TLS on a TCP control endpoint: the server's private key (PEM).
    #[arg(long, value_name = "FILE")]
    pub control_key: Option<PathBuf>,
    /// TLS on a TCP control endpoint: clients present a certificate this CA signed (PEM).
    #[arg(long, value_name = "FILE")]
    pub control_client_ca: Option<PathBuf>,
    /// TLS on a TCP control endpoint: clients send the token this file holds
    /// (`stateplane ctl --token-file`).
    #[arg(long, value_name = "FILE")]
    pub control_token_file: Option<PathBuf>,
    /// Write packets sent to the control plane into this capture.
    #[arg(long)]
    pub control_pcap: Option<PathBuf>,
    /// Keep serving metrics this many seconds after the run, for a last scrape.
    #[arg(long, default_value_t = 0)]
    pub hold_metrics: u64,
    /// Seed of the flow hash (default: random per process), for reproducible sharding.
    #[arg(long)]
    pub hash_seed: Option<u64>,
    /// Replicated state: write each packet of a replicated flow, its input and output with
    /// call and return times, to this file as JSON lines (docs/REPLICATION.md).
    #[arg(long, value_name = "FILE")]
    pub history: Option<PathBuf>,
}

fn program_list() -> String {
    let mut s = String::from("Programs:\n");
    for (name, about) in stateplane_programs::catalog() {
        s.push_str(&format!("  {name:<13} {about}\n"));
    }
    s
}

/// The ports the flags give, if any (a config's `[[port]]` tables, or these, not both).
fn flag_ports(args: &RunArgs, cfg: &RunConfig) -> CliResult<Option<Vec<PortSection>>> {
    let flags_given =
        !(args.inputs.is_empty() && args.output.is_none() && args.interfaces.is_empty());
    if !flags_given {
        return Ok(None);
    }
    if !cfg.port.is_empty() {
        return Err(
            "give ports either in the config's [[port]] tables or with --in/--out/--iface, not both"
                .into(),
        );
    }
    if !args.interfaces.is_empty() {
        if !args.inputs.is_empty() || args.output.is_some() {
            return Err("--iface makes live ports; it cannot be mixed with --in/--out files (capture live traffic with tcpdump instead)".into());
        }
        let live = |name: &String| PortSection {
            name: name.clone(),
            rx: None,
            tx: None,
            iface: Some(name.clone()),
        };
        return Ok(Some(args.interfaces.iter().map(live).collect()));
    }
    if args.inputs.is_empty() {
        return Err("no input: give a capture with --in FILE (make one with `stateplane gen internet -o trace.pcap`), an interface with --iface NAME, or [[port]] tables with rx or iface in --config".into());
    }
    let mut ports: Vec<PortSection> = (args.inputs.iter().enumerate())
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
    Ok(Some(ports))
}

pub fn main(args: RunArgs) -> CliResult<()> {
    let mut cfg = match &args.config {
        Some(path) => RunConfig::load(path)?,
        None => RunConfig::default(),
    };
    if let Some(ports) = flag_ports(&args, &cfg)? {
        cfg.port = ports;
    }
    // Flags over the config's keys; flags are checked under their own names.
    if let Some(w) = args.workers {
        cfg.workers = Some(bounded("--workers", w, 1, 64)?);
    }
    if let Some(b) = args.burst {
        cfg.burst = Some(bounded("--burst", b, 1, 1024)?);
    }
    cfg.io = args.io.clone().or(cfg.io);
    cfg.capture_buffer = args.capture_buffer.or(cfg.capture_buffer);
    cfg.memory_budget = args.memory_budget.or(cfg.memory_budget);
    cfg.metrics = args.metrics.clone().or(cfg.metrics);
    cfg.control = args.control.clone().or(cfg.control);
    cfg.control_cert = args.control_cert.clone().or(cfg.control_cert);
    cfg.control_key = args.control_key.clone().or(cfg.control_key);
    cfg.control_client_ca = args.control_client_ca.clone().or(cfg.control_client_ca);
    cfg.control_token_file = args.control_token_file.clone().or(cfg.control_token_file);
    if let Some(path) = &args.history {
        cfg.replication.get_or_insert_default().history = Some(path.clone());
    }
    let live = !cfg.port.is_empty() && cfg.port.iter().all(|p| p.iface.is_some());
    if live && args.hold_metrics > 0 {
        return Err("--hold-metrics is for runs over capture files; a live run serves metrics until it stops".into());
    }
    // The endpoint may come from the flag or the configuration's `metrics`.
    let serves_metrics = cfg.metrics.is_some();
    if args.hold_metrics > 0 && !serves_metrics {
        return Err("--hold-metrics keeps the metrics endpoint up after the run: give --metrics ADDR (or metrics in the configuration) too".into());
    }
    let switch = Switch::build(
        cfg,
        SwitchOptions {
            program: args.program.clone(),
            config_path: args.config.clone(),
            hash_seed: args.hash_seed,
            control_pcap: args.control_pcap.clone(),
        },
    )?;
    // The summary is written beside its path and renamed onto it at the end, so that a
    // reader (`stateplane report`, a script polling for it) never sees half of one, and a
    // run that never runs leaves what was there as it was. Tried before the run, so that
    // a folder that cannot be written is refused first.
    let summary_file = (args.summary_file.as_ref())
        .map(|path| OutFile::checked("--summary-file", path))
        .transpose()?;
    let progress = (!switch.is_live()).then(|| {
        let watched = switch.handle();
        Progress::start(switch.input_size(), true, move || {
            watched.input_bytes.load(Ordering::Relaxed)
        })
    });
    let outcome = switch.run();
    drop(progress);
    let outcome = outcome?;
    // The file first: a summary printed to a closed standard output still leaves it.
    if let Some(file) = summary_file {
        let summary = outcome.to_json();
        file.write(|out| serde_json::to_writer_pretty(out, &summary).map_err(Into::into))?;
    }
    crate::summary_output::print_summary(&outcome, args.json)?;
    if let Some(signal) = outcome.interrupted {
        crate::summary_output::end_interrupted(signal, outcome.error());
    }
    if args.hold_metrics > 0 && serves_metrics {
        std::thread::sleep(std::time::Duration::from_secs(args.hold_metrics));
    }
    outcome.error().map_or(Ok(()), Err)
}
