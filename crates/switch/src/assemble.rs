//! A switch assembled from its run configuration ([`RunConfig`]): the program from the
//! catalog, the ports (capture files, or interfaces for a live daemon), the workers, flow
//! records, the metrics endpoint and the control API. [`Switch::build`] checks everything
//! and opens every file before anything runs; [`Switch::run`] runs it to the end.
//!
//! ```no_run
//! # fn main() -> Result<(), String> {
//! let config = r#"
//!     workers = 2
//!     [[port]]
//!     name = "in"
//!     rx = "trace.pcap"
//!     [[port]]
//!     name = "out"
//!     tx = "out.pcap"
//! "#;
//! let switch = stateplane_switch::Switch::from_toml(config, std::path::Path::new("."))?;
//! let outcome = switch.run()?;
//! println!("{}", outcome.table());
//! # Ok(())
//! # }
//! ```

use crate::SetupResult;
use crate::config::{PortSection, RunConfig};
use crate::daemon::{self, ControlAddr, IoChoice, LiveRun};
use crate::export::Naming;
use crate::flow_export::FlowExport;
use crate::metrics;
use crate::replication_stage::ReplicationPlan;
use crate::summary::Outcome;
use crate::sync_stage::{SyncPlan, SyncSettings};
use crate::units::{CaptureBuffer, MemoryBudget, bounded};
use stateplane_io::capture::{FileRx, FileTx};
use stateplane_io::live::steer;
use stateplane_programs::PortNames;
use stateplane_runtime::{
    ControlPlane, OfflinePorts, PortId, ProgramFactory, RunHandle, RuntimeConfig, RxPort, Spread,
    Steering, TxPort, run_offline,
};
use stateplane_state::Guarantee;
use stateplane_wire::FlowHasher;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a switch takes beside its configuration (the command line's own flags).
#[derive(Clone, Debug, Default)]
pub struct SwitchOptions {
    /// The program's name, over the configuration's `[program]` name (default `forward`).
    pub program: Option<String>,
    /// Where the configuration was read from: a live switch reads it again on SIGHUP.
    pub config_path: Option<PathBuf>,
    /// Seed of the flow hash (default: random per process), for reproducible sharding.
    pub hash_seed: Option<u64>,
    /// Runs over capture files: write packets for the control plane into this capture.
    pub control_pcap: Option<PathBuf>,
}

/// A switch ready to run: everything checked, files and sinks open.
pub struct Switch {
    program: String,
    factory: ProgramFactory,
    port_names: Vec<String>,
    runtime: RuntimeConfig,
    flows: Option<FlowExport>,
    sync: Option<SyncPlan>,
    replication: Option<ReplicationPlan>,
    handle: Arc<RunHandle>,
    metrics: Option<std::net::SocketAddr>,
    /// The bounds it runs within, for the metrics.
    bounds: Vec<metrics::Bound>,
    /// What it claimed of its memory budget, by setting, for the metrics and the summary.
    memory: stateplane_mem::budget::Growth,
    ports: Ports,
}

/// Where the switch's packets come from and go to.
enum Ports {
    Files {
        ports: OfflinePorts,
        /// Bytes of the input captures, for progress.
        input_size: u64,
    },
    Live(Box<LiveRun>),
}

impl Switch {
    /// A switch from the text of a configuration; relative paths in it are taken from
    /// `base`.
    pub fn from_toml(text: &str, base: &Path) -> SetupResult<Switch> {
        Switch::build(RunConfig::parse(text, base)?, SwitchOptions::default())
    }

    /// Checks `cfg` (errors name the key and the fix), builds the program, opens the flow
    /// sinks and the port files; a live configuration is made ready to open its interfaces.
    pub fn build(cfg: RunConfig, options: SwitchOptions) -> SetupResult<Switch> {
        let ports = checked_ports(&cfg)?;
        let names = PortNames(ports.iter().map(|p| p.name.clone()).collect());
        let workers = bounded("workers", cfg.workers.unwrap_or(1), 1, 64)?;
        let live = ports.iter().all(|p| p.iface.is_some());
        let io = IoChoice::parse(cfg.io.as_deref())?;
        let seed = (options.hash_seed).unwrap_or_else(stateplane_wire::flow::random_seed);
        let burst_size = bounded("burst", cfg.burst.unwrap_or(64), 1, 1024)?;
        let queue_depth = bounded("queue_depth", cfg.queue_depth.unwrap_or(8), 1, 1024)?;
        // What the configuration sizes is claimed from the memory budget before it is made.
        let (loaded, claimed) =
            stateplane_mem::budget::scope(memory_budget(cfg.memory_budget, workers, true), || {
                let (program, factory) = load_program(options.program.as_deref(), &cfg, &names)?;
                if live && io == IoChoice::Observe {
                    claim_capture_rings(
                        cfg.capture_buffer.unwrap_or_default(),
                        workers,
                        ports.len(),
                    )?;
                }
                let sync = sync_plan(&cfg, &factory, workers)?;
                let replication = replication_plan(&cfg, &factory)?;
                if let Some(r) = &replication {
                    claim_parking(r.park_limit(), workers)?;
                }
                claim_bursts(
                    workers,
                    queue_depth,
                    burst_size,
                    sync.is_some() || replication.is_some(),
                    live,
                )?;
                let flows = (cfg.flows.as_ref())
                    .map(|f| {
                        // The names records give the program's drop reasons (a copy of
                        // the program claims nothing: its tables were claimed as built).
                        let drop_names = factory(0).drop_reasons();
                        f.start(Naming::Config, workers, seed, live, Some(drop_names))
                    })
                    .transpose()?;
                let growth = stateplane_mem::budget::Growth::of_scope();
                SetupResult::Ok((program, factory, flows, sync, replication, growth))
            });
        let (program, factory, flows, sync, replication, growth) = loaded?;
        factory(0).check_workers(workers, live)?;
        let mut bounds = metrics::run_bounds(&claimed, growth.clone(), burst_size, queue_depth);
        if let Some(s) = &sync {
            bounds.push(metrics::Bound {
                name: "sync_slots",
                help: "Slots of each worker's sync read handler (sync.slots)",
                value: metrics::Level::Fixed(s.slots() as u64),
            });
        }
        let (flows, tap) = flows.unzip();
        if let Some(r) = &replication {
            bounds.push(metrics::Bound {
                name: "replication_held_limit",
                help: "Packets each worker may hold for their flows' writes (replication.park_limit); stateplane_replication_held is how many it holds",
                value: metrics::Level::Fixed(r.park_limit() as u64),
            });
        }
        let mut state_stages: Vec<_> = sync
            .as_ref()
            .map(SyncPlan::factory)
            .transpose()?
            .into_iter()
            .collect();
        state_stages.extend(
            replication
                .as_ref()
                .map(ReplicationPlan::factory)
                .transpose()?,
        );
        let runtime = RuntimeConfig {
            workers,
            burst_size,
            queue_depth,
            hasher: FlowHasher::with_seed(seed),
            taps: tap.into_iter().collect(),
            state_stages,
            spread: spread_over_files(&factory, names.0.len(), workers),
        };
        let metrics = (cfg.metrics.as_ref())
            .map(|a| metrics::parse_addr("--metrics", a, "127.0.0.1:9464"))
            .transpose()?;
        let control = control_endpoint(&cfg, live)?;
        if cfg.capture_buffer.is_some() && !(live && io == IoChoice::Observe) {
            return Err("--capture-buffer (capture_buffer) sizes the ring of a passive monitor, a live run with --io observe (io = \"observe\"); a switch's rings are fixed, and capture files are read as they are".into());
        }
        let port_names = names.0.clone();
        let ports = if live {
            if options.control_pcap.is_some() {
                return Err("--control-pcap is for runs over capture files; a live run counts packets for the control plane".into());
            }
            let rebuild_options = options.clone();
            let started = StartedWith::of(&cfg, &factory, port_names.len());
            let steering = started.steering.clone();
            if workers > 1 && io == IoChoice::AfXdp && steering.iter().any(|s| *s != Steering::Flow)
            {
                return Err(format!(
                    "io = \"afxdp\": the program `{program}` spreads packets over its {workers} workers by the remote address, which AF_XDP cannot (the NIC's hash picks each packet's queue); use io = \"afpacket\" or \"auto\" (--io), or workers = 1"
                ));
            }
            Ports::Live(Box::new(LiveRun {
                steering,
                program: program.clone(),
                port_names: port_names.clone(),
                interfaces: ports.iter().filter_map(|p| p.iface.clone()).collect(),
                io,
                runtime: runtime.clone(),
                factory: factory.clone(),
                rebuild: Box::new(move || {
                    reload_program(&rebuild_options, &names, workers, &started)
                }),
                metrics,
                control,
                monitor_buffer: cfg.capture_buffer.unwrap_or_default().0,
                flows: None,
                sync: sync.clone(),
                replication: replication.clone(),
                bounds: bounds.clone(),
                memory: growth.clone(),
            }))
        } else {
            open_files(&ports, options.control_pcap.as_deref())?
        };
        Ok(Switch {
            program,
            factory,
            port_names,
            runtime,
            flows,
            sync,
            replication,
            handle: Arc::new(RunHandle::new(workers)),
            metrics,
            bounds,
            memory: growth,
            ports,
        })
    }

    /// What a watcher reads while the switch runs (counters, input read so far); raise its
    /// `stop` to stop the run (it drains and reports).
    pub fn handle(&self) -> Arc<RunHandle> {
        self.handle.clone()
    }

    /// Bytes of the input captures (0 on live ports).
    pub fn input_size(&self) -> u64 {
        match &self.ports {
            Ports::Files { input_size, .. } => *input_size,
            Ports::Live(_) => 0,
        }
    }

    /// Whether the switch runs on interfaces (a daemon until SIGINT or SIGTERM).
    pub fn is_live(&self) -> bool {
        matches!(self.ports, Ports::Live(_))
    }

    /// Runs the switch to the end: over capture files until every input ends (or the
    /// handle's stop), live until SIGINT or SIGTERM.
    pub fn run(self) -> SetupResult<Outcome> {
        let Switch {
            program,
            factory,
            port_names,
            runtime,
            flows,
            sync,
            replication,
            handle,
            metrics: metrics_addr,
            bounds,
            memory,
            ports,
        } = self;
        let (ports, _) = match ports {
            Ports::Live(mut run) => {
                run.flows = flows;
                return daemon::run(*run);
            }
            Ports::Files { ports, input_size } => (ports, input_size),
        };
        // The workers answer a control plane between bursts, as live: a program's own
        // requests (a pipeline's rules that timed out) reach every worker, and a metrics
        // scrape asks the tables their counts.
        let (plane, controls) = ControlPlane::new(runtime.workers.max(1), factory.as_ref()(0));
        if let Some(addr) = metrics_addr {
            metrics::serve(
                addr,
                metrics::Scrape {
                    handle: handle.clone(),
                    drop_names: factory(0).drop_reasons(),
                    ports: port_names.clone(),
                    sync: sync.as_ref().map(|s| s.counters.clone()),
                    replication: replication.as_ref().map(|r| r.counters.clone()),
                    flows: flows.as_ref().map(FlowExport::progress),
                    bounds,
                    memory: memory.clone(),
                    plane: Some(plane),
                    // A run over files serves no control API.
                    control_requests: None,
                },
            )?;
        }
        // An interrupt stops the reading; what was read goes through as at the inputs' end.
        let signals = daemon::SignalThread::start(handle.stop.clone(), None)?;
        let report = run_offline(&runtime, ports, &factory, &handle, controls);
        let interrupted = signals.close();
        // The taps no worker took hold the exporter's queue open.
        drop(runtime);
        let records_to_stdout = flows.as_ref().is_some_and(FlowExport::writes_to_stdout);
        Ok(Outcome {
            program,
            port_names,
            report,
            flows: flows.map(FlowExport::finish),
            sync: sync.as_ref().map(SyncPlan::report),
            replication: replication.as_ref().map(ReplicationPlan::report),
            live: false,
            records_to_stdout,
            interrupted,
            memory,
        })
    }
}

/// The run's memory budget: the configuration's (or three quarters of the machine's), its
/// program's state kept once per worker and once in the factory, and once more where a
/// control plane prepares requests (a switch's, over files or live).
pub(crate) fn memory_budget(
    given: Option<MemoryBudget>,
    workers: usize,
    control_plane: bool,
) -> stateplane_mem::budget::Budget {
    stateplane_mem::budget::Budget {
        limit: given.unwrap_or_else(MemoryBudget::machine_default).0,
        copies: workers as u64 + 1 + u64::from(control_plane),
        setting: "--memory-budget (memory_budget)",
    }
}

/// Claims the bursts every worker keeps: over files its queues' (see [`Burst::pool`]); on
/// interfaces the one its loop fills from its rings (which are claimed as they open).
fn claim_bursts(
    workers: usize,
    queue_depth: usize,
    burst_size: usize,
    holds_packets: bool,
    live: bool,
) -> SetupResult<()> {
    let (pool, capacity) = match live {
        true => (1, burst_size),
        false => stateplane_runtime::Burst::pool(queue_depth, burst_size, holds_packets),
    };
    let bytes = stateplane_runtime::Burst::bytes_for(capacity) * (pool * workers) as u64;
    let setting = "queue_depth, burst";
    stateplane_mem::budget::claim_once(
        setting,
        || format!("packet buffers of {pool} bursts of {capacity} packets for each of {workers} workers"),
        bytes,
    )
    .map_err(|e| format!("{setting}: {e}"))
}

/// Claims the packets each worker may hold for its replicated flows' writes.
fn claim_parking(park_limit: usize, workers: usize) -> SetupResult<()> {
    let setting = "replication.park_limit";
    stateplane_mem::budget::claim_once(
        setting,
        || format!("{park_limit} parked packets and a replica's steady flows for each of {workers} workers"),
        crate::replication_stage::parking_claim(park_limit, workers),
    )
    .map_err(|e| format!("{setting}: {e}"))
}

/// Claims a passive monitor's capture rings, one per worker and interface.
pub(crate) fn claim_capture_rings(
    buffer: CaptureBuffer,
    workers: usize,
    interfaces: usize,
) -> SetupResult<()> {
    let rings = (workers * interfaces) as u64;
    let setting = "--capture-buffer (capture_buffer)";
    stateplane_mem::budget::claim_once(
        setting,
        || {
            format!(
                "{rings} capture rings of {} bytes ({workers} workers, {interfaces} interfaces)",
                buffer.0
            )
        },
        buffer.0 as u64 * rings,
    )
    .map_err(|e| format!("{setting}: {e}"))
}

/// The program named by `name` or the config, built for the ports `names`.
fn load_program(
    name: Option<&str>,
    cfg: &RunConfig,
    names: &PortNames,
) -> SetupResult<(String, ProgramFactory)> {
    let program_name = name
        .map(str::to_owned)
        .or_else(|| cfg.program.as_ref().map(|p| p.name.clone()))
        .unwrap_or_else(|| "forward".into());
    let settings = cfg
        .program
        .as_ref()
        .filter(|p| p.name == program_name)
        .and_then(|p| p.settings.get(&program_name))
        .cloned();
    let mode = match &cfg.replication {
        Some(r) => r.mode()?,
        None => Default::default(),
    };
    let factory = stateplane_programs::build(&program_name, settings.as_ref(), names)
        .and_then(|f| stateplane_programs::with_guarantees(f, &cfg.guarantees, mode))
        .map_err(|e| e.to_string())?;
    Ok((program_name, factory))
}

/// The replication plan of a run whose program keeps state `replicated` (the memory store
/// when the run has no `[replication]` section); a section with no replicated state is
/// refused (a promise nothing keeps).
fn replication_plan(
    cfg: &RunConfig,
    factory: &ProgramFactory,
) -> SetupResult<Option<ReplicationPlan>> {
    let replicated = (factory(0).declarations().into_iter())
        .any(|d| d.guarantees.contains(&Guarantee::Replicated));
    match (&cfg.replication, replicated) {
        (None, false) => Ok(None),
        (Some(r), false) if r.history.is_some() => Err("--history (replication.history) records \
             the packets of replicated flows, and no state is replicated: name the state in \
             [guarantees] (e.g. flows = [\"replicated\"] for counter)"
            .into()),
        (settings, true) => Ok(Some(settings.clone().unwrap_or_default().plan()?)),
        (Some(_), false) => Err("replication: a [replication] section, but no state is \
                                 replicated: name the state in [guarantees] (e.g. flows = \
                                 [\"replicated\"] for counter), or remove [replication]"
            .into()),
    }
}

/// The sync plan of a run whose program keeps state `synced`; a `[sync]` section with no
/// synced state, or synced state with no `[sync]` section, is refused (either would be a
/// promise nothing keeps).
fn sync_plan(
    cfg: &RunConfig,
    factory: &ProgramFactory,
    workers: usize,
) -> SetupResult<Option<SyncPlan>> {
    let synced: Vec<String> = (factory(0).declarations().into_iter())
        .filter(|d| d.guarantees.contains(&Guarantee::Synced))
        .map(|d| d.name)
        .collect();
    match (&cfg.sync, synced.is_empty()) {
        (None, true) => Ok(None),
        (Some(settings), false) => {
            // The state replicated in snapshots takes the first ids (see `naming`).
            let bounded = match &cfg.replication {
                Some(r) if r.mode()? == stateplane_programs::ReplicationMode::Bounded => {
                    replicated_states(factory).len()
                }
                _ => 0,
            };
            Ok(Some(settings.plan(workers)?.naming(synced, bounded as u16)))
        }
        (None, false) => Err(format!(
            "guarantees: {} is synced, but the run has no [sync] section to say where to: add [sync] with collector = \"127.0.0.1:7474\" (where `stateplane collector` listens)",
            synced.join(", ")
        )
        ),
        (Some(_), true) => Err(
            "sync: a [sync] section, but no state is synced: name the state in [guarantees] (e.g. sketch = [\"synced\"] for hh), or remove [sync]"
                .into(),
        ),
    }
}

/// What a reload keeps of the switch's start: the state stages were made for it.
#[derive(Clone, Default)]
struct StartedWith {
    sync: Option<SyncSettings>,
    replication: Option<crate::replication_stage::ReplicationSettings>,
    /// The states kept `replicated`, by name.
    replicated: Vec<String>,
    /// How each live port spreads packets over the workers (its fanout group's program).
    steering: Vec<Steering>,
}

impl StartedWith {
    fn of(cfg: &RunConfig, factory: &ProgramFactory, ports: usize) -> StartedWith {
        StartedWith {
            sync: cfg.sync.clone(),
            replication: cfg.replication.clone(),
            replicated: replicated_states(factory),
            steering: steerings(factory, ports),
        }
    }
}

/// How a run over files spreads packets over `workers`: where the program steers live
/// ports by the packet alone, as they would (the same programs, run by their interpreter
/// on each packet), so that such a program runs on every worker over files too; else by
/// the flow hash.
fn spread_over_files(factory: &ProgramFactory, ports: usize, workers: usize) -> Spread {
    let steering = steerings(factory, ports);
    if workers < 2 || !steering.iter().any(Steering::reads_the_packet_alone) {
        return Spread::FlowHash;
    }
    let programs: Vec<_> = steering.into_iter().map(steer::program).collect();
    Spread::Steered(Arc::new(move |packet, parsed, port| {
        match programs.get(usize::from(port)).and_then(Option::as_ref) {
            Some(program) => {
                // The kernel runs the program on the packet with its VLAN tag taken off.
                let ethertype = match parsed.key.ip_version {
                    4 => 0x0800,
                    6 => 0x86dd,
                    _ => 0,
                };
                steer::run_at(program, packet, usize::from(parsed.l3_offset), ethertype)
            }
            // A port left to the flow hash: the worker the hash picks.
            None => stateplane_wire::flow::shard_of(parsed.hash, workers) as u32,
        }
    }))
}

/// How the program asks each of `ports` live ports to spread packets over the workers.
fn steerings(factory: &ProgramFactory, ports: usize) -> Vec<Steering> {
    let program = factory(0);
    (0..ports).map(|p| program.steering(p as PortId)).collect()
}

/// The names of the states a program keeps `replicated`, in order.
fn replicated_states(factory: &ProgramFactory) -> Vec<String> {
    let mut names: Vec<String> = (factory(0).declarations().into_iter())
        .filter(|d| d.guarantees.contains(&Guarantee::Replicated))
        .map(|d| d.name)
        .collect();
    names.sort();
    names
}

/// The program of a live run rebuilt from its configuration as it is now (SIGHUP), for the
/// `workers` it runs on: one that cannot work on them is refused, as at the start (a
/// reload keeps the workers it has).
///
/// The sync stages are the switch's from its start: a reload keeps its `[sync]` section
/// (the synced state may change; the stages start their streams over), and one that
/// would sync with another, or none, is refused rather than leave synced state unsent.
/// The replication stages are too: a reload keeps the `[replication]` section and the
/// states replicated, and one that would change either is refused rather than run with
/// settings no stage keeps.
fn reload_program(
    options: &SwitchOptions,
    names: &PortNames,
    workers: usize,
    started: &StartedWith,
) -> SetupResult<ProgramFactory> {
    let cfg = match &options.config_path {
        Some(path) => RunConfig::load(path)?,
        None => RunConfig::default(),
    };
    let budget = memory_budget(cfg.memory_budget, workers, true);
    let (loaded, _) = stateplane_mem::budget::scope(budget, || {
        load_program(options.program.as_deref(), &cfg, names)
    });
    let factory = loaded?.1;
    factory(0).check_workers(workers, true)?;
    let steering = steerings(&factory, names.0.len());
    let at = |s: &[Steering], p: usize| s.get(p).copied().unwrap_or_default();
    if workers > 1 && (0..names.0.len()).any(|p| at(&steering, p) != at(&started.steering, p)) {
        return Err("a reload keeps how the live ports spread packets over the workers (by the flow hash, or by the remote address for `nat`), which was set when they were opened; restart the switch to change the program or its ports so".into());
    }
    sync_plan(&cfg, &factory, workers)?;
    if cfg.sync != started.sync {
        return Err("sync: a reload keeps the [sync] section the switch started with (its stages and sockets are the workers'); restart the switch to start, stop or change syncing".into());
    }
    if cfg.replication != started.replication || replicated_states(&factory) != started.replicated {
        return Err("replication: a reload keeps the [replication] section and the replicated state the switch started with (its stages and store links are the workers'); restart the switch to start, stop or change replicating".into());
    }
    Ok(factory)
}

/// The config's ports, checked: names unique, each port either files or an interface, and
/// either every port live or none.
fn checked_ports(cfg: &RunConfig) -> SetupResult<Vec<PortSection>> {
    let ports = &cfg.port;
    if ports.is_empty() {
        return Err("no input: give a capture with --in FILE (make one with `stateplane gen internet -o trace.pcap`), an interface with --iface NAME, or [[port]] tables with rx or iface in --config".into());
    }
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
    Ok(ports.clone())
}

/// Where the control API of a live run listens, from `control` and its guard's files.
fn control_endpoint(cfg: &RunConfig, live: bool) -> SetupResult<ControlAddr> {
    use stateplane_control::endpoint::{GuardFiles, Listen};
    let files = GuardFiles {
        cert: cfg.control_cert.clone(),
        key: cfg.control_key.clone(),
        client_ca: cfg.control_client_ca.clone(),
        token_file: cfg.control_token_file.clone(),
    };
    if !live && (cfg.control.is_some() || files != GuardFiles::default()) {
        return Err("--control and its TLS settings are for live runs (ports with `iface`); a run over capture files has no control API".into());
    }
    Ok(match cfg.control.as_deref() {
        Some("off") if files != GuardFiles::default() => {
            return Err("--control off: the control API's TLS settings guard nothing; leave them out, or give --control an address".into());
        }
        Some("off") => ControlAddr::Off,
        Some(text) => ControlAddr::Given(
            Listen::parse(text, &files).map_err(|e| format!("--control {text}: {e}"))?,
        ),
        None if files != GuardFiles::default() => {
            return Err("the control API's TLS settings are for a TCP endpoint: give --control HOST:PORT too (by default it listens on a Unix socket)".into());
        }
        None => ControlAddr::Default,
    })
}

/// Why a capture to read could not be opened, as `what` (the port or flag that named it),
/// with the way out where the file is not there: most often a first run's trace not made
/// yet.
pub(crate) fn cannot_read_capture(what: &str, e: stateplane_io::capture::CaptureError) -> String {
    let missing = matches!(&e, stateplane_io::capture::CaptureError::Io(io) if io.kind() == std::io::ErrorKind::NotFound);
    if missing {
        format!(
            "{what}: no such file; write a trace with `stateplane gen internet -o FILE` (a path in a configuration file is relative to that file)"
        )
    } else {
        format!("{what}: {e}")
    }
}

/// Opens the ports' capture files (and the control plane's, if given).
fn open_files(ports: &[PortSection], control_pcap: Option<&Path>) -> SetupResult<Ports> {
    let mut rx: Vec<(PortId, Box<dyn RxPort>)> = Vec::new();
    let mut tx: Vec<Option<Box<dyn TxPort>>> = Vec::new();
    let mut input_size = 0u64;
    for (i, p) in ports.iter().enumerate() {
        if let Some(path) = &p.rx {
            let port = FileRx::open(path).map_err(|e| {
                cannot_read_capture(&format!("port {} (rx {})", p.name, path.display()), e)
            })?;
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
    let control: Option<Box<dyn TxPort>> = match control_pcap {
        Some(path) => Some(Box::new(
            FileTx::create(path).map_err(|e| format!("--control-pcap: {e}"))?,
        )),
        None => None,
    };
    Ok(Ports::Files {
        ports: OfflinePorts { rx, tx, control },
        input_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reload to a program that cannot work on the running workers is refused with the
    /// reason, as a start would be; on one worker, or to a program that can, it goes.
    #[test]
    fn a_reload_refuses_a_program_the_running_workers_cannot_run() {
        let path =
            std::env::temp_dir().join(format!("stateplane-reload-{}.toml", std::process::id()));
        std::fs::write(
            &path,
            "[program]\nname = \"kv\"\n[program.kv]\nserver = \"198.19.0.100\"\n",
        )
        .unwrap();
        let options = SwitchOptions {
            config_path: Some(path.clone()),
            ..SwitchOptions::default()
        };
        let names = PortNames(vec!["p0".into(), "p1".into()]);
        let none = StartedWith::default();
        let refused = reload_program(&options, &names, 2, &none)
            .err()
            .expect("kv on 2 workers");
        assert!(refused.contains("kv runs on one worker"), "{refused}");
        assert!(reload_program(&options, &names, 1, &none).is_ok());
        std::fs::write(&path, "[program]\nname = \"forward\"\n").unwrap();
        assert!(reload_program(&options, &names, 2, &none).is_ok());
        std::fs::remove_file(&path).unwrap();
    }

    /// A configuration file of `text` (named by `what`), the options that read it, ports
    /// p0 and p1, and what a switch started with it would keep across reloads.
    fn started_from(
        what: &str,
        text: &str,
    ) -> (std::path::PathBuf, SwitchOptions, PortNames, StartedWith) {
        let path = std::env::temp_dir().join(format!(
            "stateplane-reload-{what}-{}.toml",
            std::process::id()
        ));
        std::fs::write(&path, text).unwrap();
        let options = SwitchOptions {
            config_path: Some(path.clone()),
            ..SwitchOptions::default()
        };
        let names = PortNames(vec!["p0".into(), "p1".into()]);
        let cfg = RunConfig::load(&path).unwrap();
        let (_, factory) = load_program(None, &cfg, &names).unwrap();
        let started = StartedWith::of(&cfg, &factory, 2);
        (path, options, names, started)
    }

    /// On several workers a reload keeps how the live ports spread packets: `nat`'s
    /// steering by the remote address, with its ports on the same sides; one that would
    /// change it is refused (the fanout groups were made with it). On one worker it does
    /// not matter.
    #[test]
    fn a_reload_keeps_the_steering_the_ports_were_opened_with() {
        let nat = "[program]\nname = \"nat\"\n[program.nat]\nexternal = \"198.18.0.100\"\n\
                   inside = \"p0\"\noutside = \"p1\"\n";
        let (path, options, names, started) = started_from("steering", nat);
        assert_eq!(
            started.steering,
            [Steering::RemoteIsDestination, Steering::RemoteIsSource]
        );
        std::fs::write(&path, nat.replace("198.18.0.100", "198.18.0.101")).unwrap();
        assert!(reload_program(&options, &names, 2, &started).is_ok());
        let swapped = nat
            .replace("\"p0\"", "\"pX\"")
            .replace("\"p1\"", "\"p0\"")
            .replace("\"pX\"", "\"p1\"");
        for changed in [swapped.as_str(), "[program]\nname = \"forward\"\n"] {
            std::fs::write(&path, changed).unwrap();
            let refused = reload_program(&options, &names, 2, &started).err().unwrap();
            assert!(
                refused.contains("a reload keeps how the live ports spread"),
                "{refused}"
            );
            assert!(reload_program(&options, &names, 1, &started).is_ok());
        }
        std::fs::remove_file(&path).unwrap();
    }

    /// A reload keeps the switch's sync: one that would start, stop or change it is
    /// refused (its synced state would go unsent, or to a collector no stage knows).
    #[test]
    fn a_reload_keeps_the_sync_the_switch_started_with() {
        let path = std::env::temp_dir().join(format!(
            "stateplane-reload-sync-{}.toml",
            std::process::id()
        ));
        let synced = "[program]\nname = \"hh\"\n[program.hh]\nmap = { p0 = \"p1\" }\n\
                      [guarantees]\nsketch = [\"synced\"]\n[sync]\ncollector = \"127.0.0.1:7474\"\n";
        std::fs::write(&path, synced).unwrap();
        let options = SwitchOptions {
            config_path: Some(path.clone()),
            ..SwitchOptions::default()
        };
        let names = PortNames(vec!["p0".into(), "p1".into()]);
        let started = StartedWith {
            sync: RunConfig::load(&path).unwrap().sync,
            ..StartedWith::default()
        };
        assert!(reload_program(&options, &names, 1, &started).is_ok());
        let none = StartedWith::default();
        let refused = reload_program(&options, &names, 1, &none).err().unwrap();
        assert!(refused.starts_with("sync: a reload keeps"), "{refused}");
        std::fs::write(&path, synced.replace("7474", "7475")).unwrap();
        assert!(reload_program(&options, &names, 1, &started).is_err());
        std::fs::write(&path, "[program]\nname = \"forward\"\n").unwrap();
        assert!(reload_program(&options, &names, 1, &started).is_err());
        std::fs::remove_file(&path).unwrap();
    }

    /// A reload keeps the switch's replication: one that would change its settings, or
    /// replicate other state or none, is refused (no stage would keep what it says).
    #[test]
    fn a_reload_keeps_the_replication_the_switch_started_with() {
        let bounded = "[program]\nname = \"hh\"\n[program.hh]\nmap = { p0 = \"p1\" }\n\
                       [guarantees]\nsketch = [\"replicated\"]\n[replication]\nmode = \"bounded\"\n\
                       snapshot_ms = 10\n";
        let (path, options, names, started) = started_from("replication", bounded);
        assert_eq!(started.replicated, ["sketch"]);
        // The same again, and another setting of the program: a reload.
        assert!(reload_program(&options, &names, 1, &started).is_ok());
        std::fs::write(&path, bounded.replace("map =", "threshold = 5\nmap =")).unwrap();
        assert!(reload_program(&options, &names, 1, &started).is_ok());
        // Another period, the state no more replicated, another program: refused.
        for changed in [
            bounded.replace("snapshot_ms = 10", "snapshot_ms = 20"),
            bounded.replace("[guarantees]\nsketch = [\"replicated\"]\n", ""),
            "[program]\nname = \"forward\"\n".to_string(),
        ] {
            std::fs::write(&path, &changed).unwrap();
            let refused = reload_program(&options, &names, 1, &started).err().unwrap();
            assert!(
                refused.starts_with("replication: a reload keeps"),
                "{changed}: {refused}"
            );
        }
        std::fs::remove_file(&path).unwrap();
    }
}
