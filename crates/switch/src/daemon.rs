//! A switch on network interfaces: a daemon that runs until SIGINT or SIGTERM, then drains
//! its queues and reports; SIGHUP reloads the program from the configuration.

use crate::flow_export::FlowExport;
use crate::summary::Outcome;
use crate::{SetupResult, metrics};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use stateplane_control::server::{
    ControlService, PipelineCounters, Reloader, RequestCounts, Server,
};
use stateplane_io::live::{self, RingConfig};
use stateplane_runtime::live::{LiveQueues, run_live};
use stateplane_runtime::port::{LiveQueue, PortCounters};
use stateplane_runtime::{ControlPlane, Counter};
use stateplane_runtime::{PortId, ProgramFactory, Steering};
use stateplane_runtime::{Reload, Taken};
use stateplane_runtime::{RunHandle, RuntimeConfig};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long after the first SIGINT or SIGTERM another one means "stop at once, without
/// draining". Closer ones are the same request: under `timeout`, a Ctrl-C reaches the run
/// two or three times within milliseconds (the terminal's, and `timeout` passing its own
/// on to the run and to its group), and ending at the second lost every record not yet
/// written.
const SECOND_STOP_AFTER: Duration = Duration::from_secs(1);

/// What a SIGINT or SIGTERM asks for, given the ones before it.
#[derive(Debug, PartialEq, Eq)]
enum StopRequest {
    /// The first: stop taking packets, drain, report.
    Drain,
    /// Within [`SECOND_STOP_AFTER`] of the first: the same request again.
    Repeat,
    /// Later: end the process now.
    AtOnce,
}

/// The stop signals seen so far (fed the time, so it is tested on a clock of its own).
#[derive(Default)]
struct StopSignals {
    first: Option<Instant>,
}

impl StopSignals {
    fn on_signal(&mut self, now: Instant) -> StopRequest {
        match self.first {
            None => {
                self.first = Some(now);
                StopRequest::Drain
            }
            Some(at) if now.saturating_duration_since(at) >= SECOND_STOP_AFTER => {
                StopRequest::AtOnce
            }
            Some(_) => StopRequest::Repeat,
        }
    }
}

/// The run's signals, on a thread of their own until [`SignalThread::close`]: SIGINT or
/// SIGTERM sets `stop` (the run drains and reports), and another one at least
/// [`SECOND_STOP_AFTER`] later ends the process at once, with status 1; SIGHUP, where the
/// run can reload, rebuilds the program from the configuration and publishes it to the
/// workers.
pub(crate) struct SignalThread {
    handle: signal_hook::iterator::Handle,
    thread: std::thread::JoinHandle<()>,
    /// The signal that stopped the run (0: none yet).
    stopped_by: Arc<AtomicI32>,
}

impl SignalThread {
    pub(crate) fn start(
        stop: Arc<AtomicBool>,
        reload: Option<Arc<Reloading>>,
    ) -> SetupResult<Self> {
        let wanted: &[i32] = match reload {
            Some(_) => &[SIGINT, SIGTERM, SIGHUP],
            None => &[SIGINT, SIGTERM],
        };
        let mut signals = signal_hook::iterator::Signals::new(wanted)
            .map_err(|e| format!("installing the signal handler: {e}"))?;
        let handle = signals.handle();
        let stopped_by = Arc::new(AtomicI32::new(0));
        let first = stopped_by.clone();
        let thread = std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                let mut stops = StopSignals::default();
                for signal in signals.forever() {
                    if let (SIGHUP, Some(reload)) = (signal, &reload) {
                        // Said in the log, either way.
                        let _ = reload.publish();
                        continue;
                    }
                    match stops.on_signal(Instant::now()) {
                        StopRequest::Drain => {
                            let _ = first.compare_exchange(
                                0,
                                signal,
                                Ordering::Relaxed,
                                Ordering::Relaxed,
                            );
                            stop.store(true, Ordering::Relaxed);
                        }
                        StopRequest::Repeat => {}
                        StopRequest::AtOnce => {
                            log::warn!("signal {signal} again: stopping at once, without draining");
                            std::process::exit(1);
                        }
                    }
                }
            })
            .map_err(|e| format!("starting the signal thread: {e}"))?;
        Ok(SignalThread {
            handle,
            thread,
            stopped_by,
        })
    }

    /// Stops taking signals (the run has ended) and waits for the thread: the signal that
    /// stopped the run, if one did.
    pub(crate) fn close(self) -> Option<i32> {
        self.handle.close();
        let _ = self.thread.join();
        Some(self.stopped_by.load(Ordering::Relaxed)).filter(|&s| s != 0)
    }
}

/// Rebuilds the program from the configuration as it is now (for SIGHUP).
pub type Rebuild = Box<dyn Fn() -> SetupResult<ProgramFactory> + Send>;

/// A live run's reloads, from SIGHUP or the control API's `Reload`, one at a time: the
/// configuration read again and its program published to the workers.
pub(crate) struct Reloading {
    reload: Arc<Reload>,
    rebuild: Mutex<Rebuild>,
    workers: usize,
}

impl Reloading {
    /// Publishes the program the configuration gives now: the generation the workers will
    /// run; `Err` (the running program stays) with why it was refused. Logged either way.
    fn publish(&self) -> Result<u64, String> {
        let rebuild = self.rebuild.lock().unwrap_or_else(PoisonError::into_inner);
        match rebuild() {
            Ok(factory) => {
                let generation = self.reload.publish(factory);
                log::info!("reloaded the program (generation {generation})");
                Ok(generation)
            }
            Err(e) => {
                log::error!("reload refused, the running program stays: {e}");
                Err(e)
            }
        }
    }

    /// As [`Reloading::publish`], then what each worker's program kept once every worker
    /// runs it (at most [`RELOAD_WAIT`] later; a worker that has not is left out).
    fn publish_and_wait(&self) -> Result<(u64, Vec<Taken>), String> {
        let generation = self.publish()?;
        Ok((
            generation,
            (self.reload).taken(generation, self.workers, RELOAD_WAIT),
        ))
    }
}

/// How long a reload through the control API waits for the workers to take it.
const RELOAD_WAIT: Duration = Duration::from_secs(5);

/// How live ports move packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoChoice {
    Auto,
    AfPacket,
    AfXdp,
    /// Copies of what crosses the interface, both directions, through AF_PACKET: the
    /// host's own traffic goes on undisturbed (a monitor such as `stateplane flows`; AF_XDP
    /// would take the packets away from the host).
    Observe,
}

impl IoChoice {
    pub fn parse(text: Option<&str>) -> SetupResult<IoChoice> {
        match text.unwrap_or("auto") {
            "auto" => Ok(IoChoice::Auto),
            "afpacket" => Ok(IoChoice::AfPacket),
            "afxdp" => Ok(IoChoice::AfXdp),
            "observe" => Ok(IoChoice::Observe),
            other => Err(format!(
                "io: '{other}' is not a kind of live port; use auto, afpacket, afxdp or observe"
            )),
        }
    }
}

/// A live queue that takes copies in and sends nothing: what a program forwards from an
/// observed interface goes no further, since the originals went on in the kernel (a
/// monitor must never put a second copy on the wire).
struct ObserveOnly(Box<dyn LiveQueue>);

impl LiveQueue for ObserveOnly {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn recv(&mut self, burst: &mut stateplane_runtime::Burst, port: PortId) -> usize {
        self.0.recv(burst, port)
    }
    fn send(&mut self, _frame: &[u8], _segment_size: u16) -> bool {
        true
    }
    fn flush(&mut self) {}
    fn fd(&self) -> std::os::fd::RawFd {
        self.0.fd()
    }
    fn counters(&mut self) -> PortCounters {
        self.0.counters()
    }
}

pub struct LiveRun {
    pub io: IoChoice,
    /// How each port spreads packets over the workers, as the program asks.
    pub steering: Vec<Steering>,
    pub program: String,
    pub port_names: Vec<String>,
    /// The interface of each port, in port order.
    pub interfaces: Vec<String>,
    pub runtime: RuntimeConfig,
    pub factory: ProgramFactory,
    pub rebuild: Rebuild,
    pub metrics: Option<std::net::SocketAddr>,
    pub control: ControlAddr,
    /// With [`IoChoice::Observe`]: each receive ring's bytes ([`RingConfig::monitor`]).
    pub monitor_buffer: usize,
    /// Flow records of the run (its taps are in `runtime`), summed up at the end.
    pub flows: Option<FlowExport>,
    /// The sync stages' plan (its stages are in `runtime`), for the summary.
    pub sync: Option<crate::sync_stage::SyncPlan>,
    /// The replication stages' plan, for the report.
    pub replication: Option<crate::replication_stage::ReplicationPlan>,
    /// The bounds it runs within, for the metrics.
    pub bounds: Vec<crate::metrics::Bound>,
    /// The run's memory budget, which the rings are claimed from before they are mapped.
    pub memory: stateplane_mem::budget::Growth,
}

/// Where the control API listens.
#[derive(Clone)]
pub enum ControlAddr {
    /// The Unix socket in the run directory
    /// ([`stateplane_control::endpoint::default_socket`]). If another switch listens there
    /// the run does not start: a client would otherwise program that switch believing it
    /// programs this one.
    Default,
    /// Given by the user: not being able to listen there is an error.
    Given(stateplane_control::endpoint::Listen),
    Off,
}

/// Claims the rings of each worker's queue on `iface` from the run's memory budget, before
/// they are mapped (a passive monitor's were claimed with its settings).
fn claim_rings(run: &LiveRun, iface: &str, rings: &RingConfig) -> SetupResult<()> {
    // An interface that is not there is refused by the open, by name.
    let Ok(interface) = live::Interface::lookup(iface) else {
        return Ok(());
    };
    let queue = match run.io {
        IoChoice::AfXdp => live::afxdp::QUEUE_BYTES,
        IoChoice::AfPacket => live::afpacket::queue_bytes(rings, &interface),
        IoChoice::Auto => {
            live::afxdp::QUEUE_BYTES.max(live::afpacket::queue_bytes(rings, &interface))
        }
        IoChoice::Observe => 0,
    };
    let workers = run.runtime.workers;
    if queue == 0 {
        return Ok(());
    }
    (run.memory)
        .take(
            &format!("{iface} rings"),
            || {
                format!(
                    "rings for {workers} worker(s) at MTU {} (a lower MTU makes them smaller)",
                    interface.mtu
                )
            },
            (queue * workers) as u64,
        )
        .map_err(|e| format!("{iface}: {e}"))
}

/// The I/O of a run that asked for `auto`: AF_PACKET for every port when one of them is a
/// veth with TSO on, whose hosts hand TCP over in segments above the MTU (a veth's
/// default): AF_PACKET carries them whole, while an XDP program on a veth has the kernel
/// take TSO from its peer, which then cuts every segment itself (TCP through the lab's
/// veths: 16.47 against 2.21 Gbit/s, docs/BENCHMARKS.md). Otherwise as asked.
fn choose_io(run: &LiveRun) -> IoChoice {
    if run.io != IoChoice::Auto {
        return run.io;
    }
    match run.interfaces.iter().find(|i| live::veth_with_tso(i)) {
        Some(iface) => {
            log::info!(
                "{iface}: a veth with TSO on, whose hosts hand TCP over in segments above the MTU: every port gets AF_PACKET, which carries them whole (on AF_XDP the veth's peer would cut them, and TCP would move several times slower); `--io afxdp` chooses AF_XDP anyway"
            );
            IoChoice::AfPacket
        }
        None => IoChoice::Auto,
    }
}

/// Runs `run` until SIGINT or SIGTERM, then drains and reports; SIGHUP reloads.
pub fn run(mut run: LiveRun) -> SetupResult<Outcome> {
    run.io = choose_io(&run);
    let workers = run.runtime.workers;
    let rings = RingConfig::default();
    let mut queues: Vec<LiveQueues> = (0..workers)
        .map(|_| LiveQueues {
            ports: Vec::new(),
            control: None,
        })
        .collect();
    for (port, iface) in run.interfaces.iter().enumerate() {
        claim_rings(&run, iface, &rings)?;
        let steering = run.steering.get(port).copied().unwrap_or_default();
        let opened = match run.io {
            IoChoice::AfXdp => live::open_afxdp(iface, workers),
            IoChoice::AfPacket => live::open_afpacket(iface, workers, &rings, steering),
            IoChoice::Observe => live::open_afpacket(
                iface,
                workers,
                &RingConfig::monitor(run.monitor_buffer),
                steering,
            ),
            // AF_XDP spreads by the NIC's hash: a program steering otherwise gets AF_PACKET.
            IoChoice::Auto if workers > 1 && steering != Steering::Flow => {
                log::info!("{iface}: AF_PACKET, whose fanout steers as the program asks");
                live::open_afpacket(iface, workers, &rings, steering)
            }
            IoChoice::Auto => match live::open_afxdp(iface, workers) {
                Err(e @ live::LiveError::NoSuchInterface { .. }) => Err(e),
                Err(e) => {
                    log::info!("{iface}: AF_XDP not possible ({e}); using AF_PACKET");
                    live::open_afpacket(iface, workers, &rings, steering)
                }
                ok => ok,
            },
        }
        .map_err(|e| {
            let name = &run.port_names[port];
            if name == iface {
                e.to_string()
            } else {
                format!("port {name}: {e}")
            }
        })?;
        for (q, queue) in queues.iter_mut().zip(opened.queues) {
            q.ports.push(match run.io {
                IoChoice::Observe => Box::new(ObserveOnly(queue)),
                _ => queue,
            });
        }
    }

    let handle = Arc::new(RunHandle::new(workers));
    // A run that only observes makes nothing but its records: once no sink has a reader
    // (`flows -I eth0 --csv - | head`), it stops.
    if let (IoChoice::Observe, Some(flows)) = (&run.io, &run.flows) {
        flows.progress().stop_when_unread(handle.stop.clone());
    }
    let reloading = Arc::new(Reloading {
        reload: Arc::new(Reload::new(run.factory.clone())),
        rebuild: Mutex::new(run.rebuild),
        workers,
    });
    let reloader: Reloader = {
        let reloading = reloading.clone();
        Arc::new(move || reloading.publish_and_wait())
    };
    let (_control_api, plane, control_requests) = start_control(
        (&run.control, &run.program, &run.factory),
        &handle,
        &mut queues,
        reloader,
    )?;
    if let Some(addr) = run.metrics {
        metrics::serve(
            addr,
            metrics::Scrape {
                handle: handle.clone(),
                drop_names: run.factory.as_ref()(0).drop_reasons(),
                ports: run.port_names.clone(),
                sync: run.sync.as_ref().map(|s| s.counters.clone()),
                replication: run.replication.as_ref().map(|r| r.counters.clone()),
                flows: run
                    .flows
                    .as_ref()
                    .map(crate::flow_export::FlowExport::progress),
                bounds: run.bounds.clone(),
                memory: run.memory.clone(),
                plane,
                control_requests,
            },
        )?;
    }

    let reload = reloading.reload.clone();
    let signals = SignalThread::start(handle.stop.clone(), Some(reloading))?;
    log::info!(
        "running {} on {} with {workers} worker(s); SIGINT or SIGTERM stops, SIGHUP reloads",
        run.program,
        run.port_names
            .iter()
            .zip(&run.interfaces)
            .map(|(p, i)| if p == i {
                p.clone()
            } else {
                format!("{p}={i}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    let report = run_live(
        &run.runtime,
        queues,
        run.interfaces.len(),
        &reload,
        &handle,
        |fds, timeout| {
            let _ = live::poll_readable(fds, timeout.as_millis() as i32);
        },
    );
    signals.close();
    log::info!("stopped; queues drained");
    for (name, port) in run.port_names.iter().zip(&report.port_counters) {
        if port.rx_kernel_drops > 0 {
            let hint = match run.io {
                IoChoice::Observe => " (--capture-buffer makes it larger)",
                _ => "",
            };
            log::warn!(
                "{name}: the kernel dropped {} packets, its receive ring full while the run fell behind{hint}",
                port.rx_kernel_drops
            );
        }
    }
    // The taps no worker took hold the exporter's queue open.
    drop(run.runtime);
    let records_to_stdout = run.flows.as_ref().is_some_and(|f| f.writes_to_stdout());
    Ok(Outcome {
        program: run.program,
        port_names: run.port_names,
        report,
        flows: run.flows.map(FlowExport::finish),
        sync: run.sync.as_ref().map(crate::sync_stage::SyncPlan::report),
        replication: (run.replication.as_ref())
            .map(crate::replication_stage::ReplicationPlan::report),
        live: true,
        records_to_stdout,
        interrupted: None,
        memory: run.memory,
    })
}

/// The control API's server (it stops when dropped), the control plane behind it, and
/// what counts the API's requests.
type Control = (
    Option<stateplane_control::server::Server>,
    Option<Arc<ControlPlane>>,
    Option<Arc<RequestCounts>>,
);

/// Connects the workers to a control plane and serves the control API, as the run's
/// `control` address says, for its program's `factory`.
fn start_control(
    (control, program, factory): (&ControlAddr, &str, &ProgramFactory),
    handle: &Arc<RunHandle>,
    queues: &mut [LiveQueues],
    reloader: Reloader,
) -> SetupResult<Control> {
    let listen = match control {
        ControlAddr::Off => {
            log::info!("no control API (control is off): ctl cannot reach this switch");
            return Ok((None, None, None));
        }
        ControlAddr::Given(listen) => listen.clone(),
        ControlAddr::Default => stateplane_control::endpoint::Listen::Unix(
            stateplane_control::endpoint::default_socket(),
        ),
    };
    let (plane, ends) = ControlPlane::new(queues.len(), factory.as_ref()(0));
    let stats = handle.clone();
    let pipeline: PipelineCounters = Arc::new(move || {
        let total = stats.totals();
        Counter::ALL
            .iter()
            .map(|&c| (c.name().to_string(), total.get(c)))
            .collect()
    });
    let service = ControlService::new(plane.clone(), program, pipeline).with_reloader(reloader);
    let requests = service.requests();
    let server = Server::start(&listen, service).map_err(|e| match control {
        ControlAddr::Default => format!(
            "--control: {e}; give this one --control ENDPOINT (unix:PATH or a loopback \
             address), or --control off to run without the control API"
        ),
        _ => format!("--control: {e}"),
    })?;
    for (q, end) in queues.iter_mut().zip(ends) {
        q.control = Some(end);
    }
    log::info!(
        "control API on {} (stateplane ctl --server {})",
        server.endpoint,
        server.endpoint
    );
    Ok((Some(server), Some(plane), Some(requests)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Signals within a second of the first are one request to drain (a Ctrl-C under
    /// `timeout` arrives two or three times); one later ends the run at once.
    #[test]
    fn a_second_stop_signal_ends_the_run_only_when_it_comes_later() {
        let start = Instant::now();
        let mut seen = StopSignals::default();
        assert_eq!(seen.on_signal(start), StopRequest::Drain);
        let soon = start + Duration::from_millis(50);
        assert_eq!(seen.on_signal(soon), StopRequest::Repeat);
        assert_eq!(seen.on_signal(soon), StopRequest::Repeat);
        let later = start + SECOND_STOP_AFTER;
        assert_eq!(seen.on_signal(later), StopRequest::AtOnce);
    }
}
