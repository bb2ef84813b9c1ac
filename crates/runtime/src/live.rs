//! The live shape: each worker owns one queue pair (receive and transmit) per interface and
//! runs until told to stop.
//!
//! There is no dispatcher: the kernel spreads flows over the workers' receive queues (an
//! AF_PACKET fanout group in hash mode), so nothing is shared per packet. A worker reads a
//! burst from each of its queues in turn, runs the program, and writes the forwarded
//! packets to its own transmit queues, kicking each once per burst. When every queue is
//! empty it waits in `poll` (the only blocking call), so an idle switch costs no CPU.
//!
//! Stopping drains: after the stop flag rises, each worker keeps reading until its queues
//! are empty (bounded by [`DRAIN_LIMIT`]), so packets already received are still forwarded.
//! Reloading swaps the program between bursts: packets wait in the rings meanwhile, so a
//! reload loses none.

use crate::burst::Burst;
use crate::control::WorkerControl;
use crate::port::{LiveQueue, PortCounters};
use crate::program::{PortId, ProgramFactory};
use crate::run::{RunHandle, RunReport, RuntimeConfig};
use crate::stats::Stats;
use crate::worker::Worker;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a stopping worker keeps draining its queues at most.
pub const DRAIN_LIMIT: Duration = Duration::from_millis(200);
/// How long an idle worker sleeps in `poll` before looking at its flags again.
const IDLE_WAIT: Duration = Duration::from_millis(10);
/// How often a worker publishes its ports' counts (a system call per queue for the
/// kernel's drop counts, so not per burst).
const PORT_REFRESH: Duration = Duration::from_millis(100);
/// How often a program's `poll` runs (timers, probes).
const POLL_EVERY_NS: u64 = 1_000_000;

/// One worker's queues, one per port, indexed by port id.
pub struct LiveQueues {
    pub ports: Vec<Box<dyn LiveQueue>>,
    /// The worker's end of the control plane, if the run has one.
    pub control: Option<WorkerControl>,
}

/// Waits until one of the descriptors is readable or the timeout passes (a wrapper of
/// `poll(2)` that the I/O crate provides, so that this crate makes no system calls itself).
pub type WaitReadable = fn(&[RawFd], Duration);

/// A new program for running workers; each picks it up between two bursts.
pub struct Reload {
    generation: AtomicU64,
    factory: Mutex<ProgramFactory>,
}

impl Reload {
    pub fn new(factory: ProgramFactory) -> Self {
        Reload {
            generation: AtomicU64::new(0),
            factory: Mutex::new(factory),
        }
    }

    /// Installs `factory`; returns the generation that workers will report once they run it.
    pub fn publish(&self, factory: ProgramFactory) -> u64 {
        *self.factory.lock().unwrap_or_else(PoisonError::into_inner) = factory;
        self.generation.fetch_add(1, Ordering::AcqRel) + 1
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn current(&self) -> (u64, ProgramFactory) {
        let factory = self
            .factory
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        (self.generation(), factory)
    }
}

/// The wall clock in nanoseconds since the Unix epoch (the clock of packet timestamps).
pub fn wall_clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// What a live run did, beyond the offline report: counts per port, summed over queues.
pub struct LiveReport {
    pub run: RunReport,
    pub ports: Vec<PortCounters>,
    /// The program generation each worker ran last (0: the program it started with).
    pub generations: Vec<u64>,
}

/// Runs the program on live queues, one worker thread per entry of `queues`, until
/// `handle.stop` rises; then drains and reports.
pub fn run_live(
    config: &RuntimeConfig,
    queues: Vec<LiveQueues>,
    ports: usize,
    reload: &Arc<Reload>,
    handle: &RunHandle,
    wait: WaitReadable,
) -> LiveReport {
    let workers = queues.len();
    let start = Instant::now();
    let (_, first) = reload.current();
    let drop_reason_names = first(0).drop_reasons();
    let results: Vec<_> = std::thread::scope(|scope| {
        let threads: Vec<_> = queues
            .into_iter()
            .enumerate()
            .map(|(w, q)| {
                let reload = reload.clone();
                let config = config.clone();
                scope.spawn(move || {
                    worker_loop(w, workers, ports, &config, q, &reload, handle, wait)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join()).collect()
    });
    let mut report = LiveReport {
        run: RunReport::empty(ports, drop_reason_names, start.elapsed()),
        ports: vec![PortCounters::default(); ports],
        generations: Vec::new(),
    };
    for r in results {
        match r {
            Ok(done) => {
                report.run.total.merge(&done.stats);
                report.run.per_worker.push(done.stats);
                report.run.worker_busy.push(done.busy);
                report.generations.push(done.generation);
                for (p, c) in done.ports.iter().enumerate() {
                    report.ports[p].merge(c);
                    report.run.tx_per_port[p].0 += c.tx_packets;
                    report.run.tx_per_port[p].1 += c.tx_bytes;
                }
            }
            Err(_) => report
                .run
                .errors
                .push("a worker thread panicked".to_owned()),
        }
    }
    report
}

struct WorkerDone {
    stats: Stats,
    busy: Duration,
    ports: Vec<PortCounters>,
    generation: u64,
}

#[allow(clippy::too_many_arguments)]
fn worker_loop(
    w: usize,
    workers: usize,
    ports: usize,
    config: &RuntimeConfig,
    mut q: LiveQueues,
    reload: &Reload,
    handle: &RunHandle,
    wait: WaitReadable,
) -> WorkerDone {
    let shared = &handle.stats[w + 1];
    let stop = &handle.stop;
    let mut last_port_refresh = Instant::now();
    let (mut generation, factory) = reload.current();
    let mut worker = Worker::new(factory(w), w, workers, ports, config.hasher)
        .with_tap(config.tap.as_ref().map(|f| f(w)));
    if let Some(control) = q.control.take() {
        worker = worker.with_control(control);
    }
    let mut burst = Burst::with_capacity(config.burst_size);
    let fds: Vec<RawFd> = q.ports.iter().map(|p| p.fd()).collect();
    let mut busy = Duration::ZERO;
    let mut last_poll = 0u64;
    let mut stopping_since: Option<Instant> = None;
    loop {
        match stopping_since {
            None if stop.load(Ordering::Relaxed) => stopping_since = Some(Instant::now()),
            Some(s) if s.elapsed() > DRAIN_LIMIT => break,
            _ => {}
        }
        if reload.generation() != generation {
            let (g, factory) = reload.current();
            worker.replace_program(factory(w), || factory(0));
            generation = g;
            log::info!("worker {w}: now running program generation {g}");
        }
        let t = Instant::now();
        let mut received = 0;
        for port in 0..q.ports.len() {
            burst.clear();
            let n = q.ports[port].recv(&mut burst, port as PortId);
            if n == 0 {
                continue;
            }
            received += n;
            worker.handle(&mut burst);
            transmit(&burst, &mut q.ports);
        }
        let now = wall_clock_ns();
        if now.saturating_sub(last_poll) >= POLL_EVERY_NS {
            last_poll = now;
            burst.clear();
            burst.now_ns = now;
            if worker.poll(&mut burst) > 0 {
                transmit(&burst, &mut q.ports);
            }
        }
        for p in q.ports.iter_mut() {
            p.flush();
        }
        if last_port_refresh.elapsed() >= PORT_REFRESH {
            last_port_refresh = Instant::now();
            let counts = q.ports.iter_mut().map(|p| p.counters()).collect();
            if let Some(slot) = handle
                .port_counters
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_mut(w)
            {
                *slot = counts;
            }
        }
        if received > 0 {
            busy += t.elapsed();
            shared.publish(&worker.stats);
            continue;
        }
        shared.publish(&worker.stats);
        if stopping_since.is_some() {
            break; // drained
        }
        wait(&fds, IDLE_WAIT);
    }
    worker.finish();
    let port_counters = q.ports.iter_mut().map(|p| p.counters()).collect();
    WorkerDone {
        stats: worker.stats,
        busy,
        ports: port_counters,
        generation,
    }
}

/// Writes each forwarded packet of `burst` to its port's queue.
fn transmit(burst: &Burst, ports: &mut [Box<dyn LiveQueue>]) {
    let n = ports.len();
    for (d, data) in burst.iter() {
        for p in d.verdict.out_ports(d.in_port, n) {
            ports[usize::from(p)].send(data);
        }
    }
}
