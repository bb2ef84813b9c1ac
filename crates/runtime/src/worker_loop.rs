//! The worker loop: the one loop that every worker thread runs, whatever its ports are (an
//! offline run's queues from the dispatcher, a worker's own shard of capture files or of a
//! replay queue, live interfaces). What differs between them is behind [`WorkerPorts`].
//!
//! One pass of the loop, in this order (the points where a stage may act):
//!
//! 1. *Between bursts*: the stop flag (a stop drains, see below) and a program reload.
//! 2. *Each of the worker's inputs in turn*: receive a burst, then [`Worker::handle`]: parse
//!    what is not parsed yet, apply staged control writes (between bursts, so each change
//!    is atomic with respect to packet processing), run the program on every packet, count
//!    every verdict, and hand the burst to the taps (after the burst); then the ports send
//!    what it forwards.
//! 3. *After the pass*, on ports with a clock of their own ([`Timekeeping::Clock`]): the
//!    program's timers (`Program::poll`, about once a millisecond) and the taps' ticks, and
//!    the ports' counters published every 100 ms. Then the ports flush what they batched.
//! 4. *A pass that received nothing*: on replay, the inputs have ended and so does the
//!    loop; on a clock, the loop waits for input (at most [`IDLE_WAIT`]).
//!
//! Held packets: a state stage that holds packets across bursts puts them back into later
//! ones; when they are ready and the last burst had no room, the loop hands the stage a
//! burst of their own (where the ports take one: [`WorkerPorts::takes_extra_bursts`]), and
//! before the worker ends it does so until the stages hold none.
//!
//! Stopping drains: once the stop flag rises the ports are told ([`WorkerPorts::stop`]: a
//! file source ends there, a queue keeps what is in it), and the loop goes on until a pass
//! receives nothing, the inputs end, or, on a clock, [`DRAIN_LIMIT`] has passed.
//!
//! Must never: block except in [`WorkerPorts::receive`] and [`WorkerPorts::wait`]; read a
//! clock per packet; publish counters more often than once per burst.

use crate::burst::Burst;
use crate::control::WorkerControl;
use crate::counters::Stats;
use crate::port::PortCounters;
use crate::program::ProgramFactory;
use crate::run_config::{RunHandle, RunReport, RuntimeConfig};
use crate::worker::Worker;
use stateplane_api::Carried;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a stopping worker on a clock keeps draining its inputs at most.
pub const DRAIN_LIMIT: Duration = Duration::from_millis(200);
/// How long an idle worker on a clock waits for input before it looks at its flags again.
pub const IDLE_WAIT: Duration = Duration::from_millis(10);
/// How often a worker on a clock publishes its ports' counts (a system call per queue for
/// the kernel's drop counts, so not per burst).
pub const PORT_REFRESH: Duration = Duration::from_millis(100);
/// How often a program's timers run (`Program::poll`), on a clock.
pub const POLL_EVERY: Duration = Duration::from_millis(1);
/// How long a finishing worker waits between two looks at what its state stages hold.
const HELD_WAIT: Duration = Duration::from_micros(20);

/// The longest a run on packet time waits for its backlogged state stages before the
/// next burst.
const BACKLOG_WAIT: Duration = Duration::from_secs(60);
/// Bursts between two publications of a busy worker's counters: publishing every burst
/// would cost a cache line per burst on a shared counter page; every 64th (about 4,000
/// packets) keeps progress and metrics live. An idle pass and the end publish too.
const PUBLISH_EVERY: u32 = 64;

/// A source of the time in nanoseconds, never going back.
pub trait Clock: Send + Sync {
    fn now_ns(&self) -> u64;
}

/// The system clock as packet timestamps read it (nanoseconds since the Unix epoch), made
/// monotonic: it moves with `Instant` from the moment it was made, so a step of the
/// system time cannot stall the timers or cut a drain short.
pub struct WallClock {
    epoch_ns: u64,
    start: Instant,
}

impl WallClock {
    pub fn new() -> Self {
        WallClock {
            epoch_ns: wall_clock_ns(),
            start: Instant::now(),
        }
    }
}

impl Default for WallClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for WallClock {
    fn now_ns(&self) -> u64 {
        self.epoch_ns + self.start.elapsed().as_nanos() as u64
    }
}

/// The system clock in nanoseconds since the Unix epoch (the clock of packet timestamps).
pub fn wall_clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A clock that moves only when told: the tests' virtual time.
#[derive(Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn at(ns: u64) -> Self {
        ManualClock(AtomicU64::new(ns))
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_nanos() as u64, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// How a worker's loop keeps time.
#[derive(Clone)]
pub enum Timekeeping {
    /// Packet time only (replay of captures): no timers run, the loop ends when the
    /// inputs do, and a stop drains whatever the ports still hand over.
    Packets,
    /// A clock of the ports' own (live): timers run on it, idle passes wait, and a stop
    /// drains for at most [`DRAIN_LIMIT`] of it.
    Clock(Arc<dyn Clock>),
}

/// What [`WorkerPorts::receive`] got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Receive {
    /// A burst to handle and send, possibly empty (an offline round with nothing for this
    /// worker still goes through, so that the output stage's rounds stay whole).
    Burst,
    /// Nothing now; more may come (a live queue).
    Nothing,
    /// This input has ended for good.
    Ended,
}

/// One worker's ports: where its bursts come from and where its forwarded packets go.
pub trait WorkerPorts: Send {
    /// How many inputs a pass of the loop visits (live: one per interface).
    fn inputs(&self) -> usize {
        1
    }

    /// Fills `burst` (empty on entry) from input `input`, or hands over a filled one in its
    /// place.
    fn receive(&mut self, input: usize, burst: &mut Burst) -> Receive;

    /// Sends a handled burst's packets out; their verdicts are final.
    fn send(&mut self, burst: &mut Burst);

    /// The end of a pass: pushes out what `send` batched (a live ring's kick).
    fn flush(&mut self) {}

    /// Nothing came in on a whole pass: waits for input, or for one of `also` (the state
    /// stages' sockets) to be readable, at most `timeout`.
    fn wait(&mut self, _timeout: Duration, _also: &[std::os::fd::RawFd]) {}

    /// Whether a burst may be sent that no `receive` handed over (a state stage's held
    /// packets, ready while the last burst had no room). An offline run's output merges
    /// each worker's bursts round by round, so there held packets wait for the next
    /// round's burst (made with room for them), and go in bursts of their own only once
    /// the inputs have ended.
    fn takes_extra_bursts(&self) -> bool {
        true
    }

    /// The stop flag rose: take no new input (what is queued may still come).
    fn stop(&mut self) {}

    /// The ports' own counts, per port (live queues; empty elsewhere).
    fn counters(&mut self) -> Vec<PortCounters> {
        Vec::new()
    }

    /// How this worker keeps time.
    fn timekeeping(&self) -> Timekeeping {
        Timekeeping::Packets
    }

    /// Whether the packets reaching this worker were chosen by their `parsed.hash`
    /// ([`Context::by_hash`]): true where the runtime spreads them; live ports, which the
    /// kernel spreads by its own hash, say false.
    fn spread_by_hash(&self) -> bool {
        true
    }

    /// After the last pass: what the ports dropped before the worker saw it, the errors
    /// they met, and packets and bytes sent per port when the ports count them.
    fn finish(&mut self) -> PortsReport {
        PortsReport::default()
    }
}

/// What a worker's ports report at its end.
#[derive(Default)]
pub struct PortsReport {
    pub dropped: Stats,
    pub errors: Vec<String>,
    /// Packets and bytes sent per port (empty when another stage counts them).
    pub tx_per_port: Vec<(u64, u64)>,
    /// The ports' own counts, per port (live).
    pub counters: Vec<PortCounters>,
}

/// The program workers run, and a newer one to switch to: each worker picks it up between
/// two bursts (a reload, SIGHUP on a live run). Packets wait in the ports meanwhile, so a
/// reload loses none.
pub struct Reload {
    generation: AtomicU64,
    factory: Mutex<ProgramFactory>,
    /// What each worker's program kept when it took the newest generation (by worker).
    taken: Mutex<Vec<Taken>>,
    taken_changed: Condvar,
}

/// What one worker's new program kept of its old one's state, on taking a generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub worker: usize,
    pub generation: u64,
    pub carried: Vec<Carried>,
}

impl Reload {
    pub fn new(factory: ProgramFactory) -> Self {
        Reload {
            generation: AtomicU64::new(0),
            factory: Mutex::new(factory),
            taken: Mutex::new(Vec::new()),
            taken_changed: Condvar::new(),
        }
    }

    /// Worker `worker` runs `generation` now, its program having kept `carried`.
    fn record(&self, worker: usize, generation: u64, carried: Vec<Carried>) {
        let mut taken = self.taken.lock().unwrap_or_else(PoisonError::into_inner);
        taken.retain(|t| t.worker != worker);
        taken.push(Taken {
            worker,
            generation,
            carried,
        });
        taken.sort_by_key(|t| t.worker);
        self.taken_changed.notify_all();
    }

    /// What the workers kept on taking `generation`, once `workers` of them have taken it
    /// (or a later one) or `timeout` has passed (then those that had), by worker.
    pub fn taken(&self, generation: u64, workers: usize, timeout: Duration) -> Vec<Taken> {
        let deadline = Instant::now() + timeout;
        let mut taken = self.taken.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let done: Vec<Taken> = (taken.iter())
                .filter(|t| t.generation == generation)
                .cloned()
                .collect();
            let now = Instant::now();
            let past = taken.iter().filter(|t| t.generation >= generation).count();
            if past >= workers || now >= deadline {
                return done;
            }
            taken = (self.taken_changed)
                .wait_timeout(taken, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
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

    /// The generation and the program factory in force.
    pub fn current(&self) -> (u64, ProgramFactory) {
        let factory = self
            .factory
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        (self.generation(), factory)
    }
}

/// What one worker thread is given.
pub struct WorkerSetup {
    pub ports: Box<dyn WorkerPorts>,
    /// The worker's end of the control plane, if the run has one.
    pub control: Option<WorkerControl>,
}

impl WorkerSetup {
    pub fn new(ports: Box<dyn WorkerPorts>) -> Self {
        WorkerSetup {
            ports,
            control: None,
        }
    }
}

/// What one worker did.
pub struct WorkerReport {
    /// The worker's counts and what its ports dropped before it.
    pub stats: Stats,
    /// Time spent on passes that received packets.
    pub busy: Duration,
    pub ports: PortsReport,
    /// The program generation the worker ran last (0: the one it started with).
    pub generation: u64,
}

/// Runs worker `w` of `workers` on `setup`'s ports until they end (or, after `handle.stop`,
/// drain): the loop of the module documentation.
pub fn run_worker(
    w: usize,
    workers: usize,
    port_count: usize,
    config: &RuntimeConfig,
    setup: WorkerSetup,
    reload: &Reload,
    handle: &RunHandle,
) -> WorkerReport {
    let WorkerSetup { mut ports, control } = setup;
    let shared = &handle.stats[w + 1];
    let (mut generation, factory) = reload.current();
    let taps = config.taps.iter().map(|f| f(w)).collect();
    let stages = config.state_stages.iter().map(|f| f(w)).collect();
    let mut worker = Worker::new(factory(w), w, workers, port_count, config.hasher)
        .with_taps(taps)
        .with_state_stages(stages)
        .spread_by_hash(workers == 1 || ports.spread_by_hash());
    if let Some(control) = control {
        worker = worker.with_control(control);
    }
    // The stages' first tick comes before the first burst, so that what they set up
    // (a synced table's pages) is done before the worker forwards, not in the middle.
    worker.tick_stages();
    // The stages keep their sockets across reloads.
    let wake = worker.wake_fds();
    let clock = match ports.timekeeping() {
        Timekeeping::Clock(c) => Some(c),
        Timekeeping::Packets => None,
    };
    let now = || clock.as_ref().map_or(0, |c| c.now_ns());
    let mut last_poll = 0u64;
    let mut last_refresh = now();
    let mut stopping_since: Option<u64> = None;
    let mut burst = Burst::with_capacity(config.burst_size);
    let mut busy = Duration::ZERO;
    let mut bursts = 0u32;
    let inputs = ports.inputs();
    let mut ended = vec![false; inputs];
    loop {
        // 1. Between bursts.
        if stopping_since.is_none() && handle.stop.load(Ordering::Relaxed) {
            stopping_since = Some(now());
            ports.stop();
        }
        if let (Some(since), Some(_)) = (stopping_since, &clock)
            && now().saturating_sub(since) > DRAIN_LIMIT.as_nanos() as u64
        {
            break;
        }
        if reload.generation() != generation {
            let (g, factory) = reload.current();
            let carried = worker.replace_program(factory(w), || factory(0));
            generation = g;
            log::info!("worker {w}: now running program generation {g}");
            for c in &carried {
                match c.lost() {
                    false => log::info!("worker {w}: reload: {c}"),
                    true => log::warn!("worker {w}: reload: {c}"),
                }
            }
            reload.record(w, g, carried);
        }
        // 2. Each input in turn; on packet time, once the state stages can take more.
        if clock.is_none() {
            wait_out_backlog(&mut worker);
        }
        let t = Instant::now();
        let mut received = false;
        for (input, ended) in ended.iter_mut().enumerate() {
            if *ended {
                continue;
            }
            burst.clear();
            match ports.receive(input, &mut burst) {
                Receive::Burst => {
                    received = true;
                    worker.handle(&mut burst);
                    ports.send(&mut burst);
                    send_released(&mut worker, ports.as_mut(), &mut burst, config.burst_size);
                    bursts = bursts.wrapping_add(1);
                    if bursts.is_multiple_of(PUBLISH_EVERY) {
                        shared.publish(&worker.stats);
                    }
                }
                Receive::Nothing => {}
                Receive::Ended => *ended = true,
            }
        }
        // 3. After the pass.
        if let Some(clock) = &clock {
            let now = clock.now_ns();
            if now.saturating_sub(last_poll) >= POLL_EVERY.as_nanos() as u64 {
                last_poll = now;
                burst.clear();
                burst.now_ns = now;
                if worker.poll(&mut burst) > 0 {
                    ports.send(&mut burst);
                }
                send_released(&mut worker, ports.as_mut(), &mut burst, config.burst_size);
            }
            if now.saturating_sub(last_refresh) >= PORT_REFRESH.as_nanos() as u64 {
                last_refresh = now;
                let counts = ports.counters();
                if let Some(slot) = handle
                    .port_counters
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get_mut(w)
                {
                    *slot = counts;
                }
            }
        }
        ports.flush();
        if received {
            busy += t.elapsed();
            continue;
        }
        // 4. Nothing came in.
        shared.publish(&worker.stats);
        if ended.iter().all(|&e| e) || stopping_since.is_some() {
            break;
        }
        ports.wait(IDLE_WAIT, &wake);
        if !wake.is_empty() {
            // What woke the worker may be a state stage's datagram (a write's part): the
            // stages tick now, not up to a millisecond later with the program's poll.
            worker.tick_stages();
            send_released(&mut worker, ports.as_mut(), &mut burst, config.burst_size);
            ports.flush();
        }
    }
    // What the state stages hold goes out (or is dropped and counted) before the end.
    while worker.holding() > 0 {
        let sent = send_held(&mut worker, ports.as_mut(), &mut burst, config.burst_size);
        ports.flush();
        if sent == 0 {
            std::thread::sleep(HELD_WAIT);
        }
    }
    worker.finish();
    shared.publish(&worker.stats);
    let ports = ports.finish();
    let mut stats = worker.stats;
    stats.merge(&ports.dropped);
    WorkerReport {
        stats,
        busy,
        ports,
        generation,
    }
}

/// Ticks the state stages until none is backlogged (`StateStage::backlogged`), for at
/// most [`BACKLOG_WAIT`]: a stage's held packets time out on their own, so a store that
/// never answers ends the wait well before that.
fn wait_out_backlog(worker: &mut Worker) {
    let start = Instant::now();
    while worker.backlogged() && start.elapsed() < BACKLOG_WAIT {
        worker.tick_stages();
        std::thread::sleep(HELD_WAIT);
    }
}

/// Held packets ready to go back go in a burst of their own, when the last had no room
/// for them (or none came).
fn send_released(worker: &mut Worker, ports: &mut dyn WorkerPorts, burst: &mut Burst, size: usize) {
    if worker.releasable() && ports.takes_extra_bursts() {
        send_held(worker, ports, burst, size);
    }
}

/// Hands the worker an empty burst for its state stages to fill with held packets, and
/// sends it; how many went.
fn send_held(
    worker: &mut Worker,
    ports: &mut dyn WorkerPorts,
    burst: &mut Burst,
    size: usize,
) -> usize {
    if burst.capacity() == 0 {
        // The ports took the last burst away (an offline run's queue).
        *burst = Burst::with_capacity(size);
    }
    burst.clear();
    worker.handle(burst);
    let sent = burst.len();
    ports.send(burst);
    sent
}

/// Runs one worker thread per setup (worker `w` gets `setups[w]`) on `scope`, each with its
/// program from `reload`; the threads' handles, in worker order.
pub fn spawn_workers<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    config: &'env RuntimeConfig,
    setups: Vec<WorkerSetup>,
    port_count: usize,
    reload: &'env Reload,
    handle: &'env RunHandle,
) -> Vec<std::thread::ScopedJoinHandle<'scope, WorkerReport>> {
    let workers = setups.len();
    (setups.into_iter().enumerate())
        .map(|(w, setup)| {
            scope.spawn(move || run_worker(w, workers, port_count, config, setup, reload, handle))
        })
        .collect()
}

/// Runs one worker thread per setup until their ports end (or, after `handle.stop`,
/// drain), and sums up what they did.
pub fn run_workers(
    config: &RuntimeConfig,
    setups: Vec<WorkerSetup>,
    port_count: usize,
    reload: &Reload,
    handle: &RunHandle,
) -> RunReport {
    let start = Instant::now();
    let (_, first) = reload.current();
    let mut report = RunReport::empty(port_count, first(0).drop_reasons(), Duration::ZERO);
    std::thread::scope(|scope| {
        let threads = spawn_workers(scope, config, setups, port_count, reload, handle);
        report.add_workers(threads);
    });
    report.wall = start.elapsed();
    report
}

impl RunReport {
    /// Joins worker threads and adds what each did, in worker order.
    pub fn add_workers(&mut self, threads: Vec<std::thread::ScopedJoinHandle<'_, WorkerReport>>) {
        for t in threads {
            match t.join() {
                Ok(done) => self.add_worker(done),
                Err(_) => self.errors.push("a worker thread panicked".to_owned()),
            }
        }
    }

    fn add_worker(&mut self, done: WorkerReport) {
        self.total.merge(&done.stats);
        self.per_worker.push(done.stats);
        self.worker_busy.push(done.busy);
        self.generations.push(done.generation);
        self.errors.extend(done.ports.errors);
        for (acc, s) in self.tx_per_port.iter_mut().zip(&done.ports.tx_per_port) {
            acc.0 += s.0;
            acc.1 += s.1;
        }
        if self.port_counters.len() < done.ports.counters.len() {
            (self.port_counters).resize(done.ports.counters.len(), PortCounters::default());
        }
        for (acc, c) in self.port_counters.iter_mut().zip(&done.ports.counters) {
            acc.merge(c);
        }
    }
}

/// The loop on a virtual clock: scripted ports hand over packets as the clock reaches their
/// arrival, and waiting moves the clock on, so every timing rule is checked exactly.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::{Context, DropReason, Program, Verdict};
    use crate::tap::Tap;
    use crate::{Counter, PortId};
    use stateplane_wire::FlowHasher;
    use std::collections::VecDeque;

    const MS: u64 = 1_000_000;

    /// An Ethernet, IPv4 and UDP frame from source port `sport`.
    fn frame(sport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8 + 4];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&(20u16 + 8 + 4).to_be_bytes());
        f[22] = 64;
        f[23] = 17;
        f[26..30].copy_from_slice(&[198, 18, 0, 1]);
        f[30..34].copy_from_slice(&[198, 18, 0, 2]);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&9u16.to_be_bytes());
        f[38..40].copy_from_slice(&12u16.to_be_bytes());
        f
    }

    /// What the scripted ports saw, for the test to read after the loop has ended.
    #[derive(Default)]
    struct Seen {
        /// (sequence number, verdict, clock) of each packet sent, in order.
        sent: Vec<(u64, Verdict, u64)>,
        waits: u32,
        stops: u32,
        flushes: u32,
        finished: bool,
    }

    /// Ports that hand over scripted packets as the clock reaches them.
    struct Scripted {
        clock: Option<Arc<ManualClock>>,
        /// Per input: (arrival, sequence number) still to come.
        arrivals: Vec<VecDeque<(u64, u64)>>,
        /// Inputs end once their script is done (replay) or wait for more (live).
        ends: bool,
        /// An input that never runs dry: each receive takes 1 ms of the clock.
        endless: bool,
        seen: Arc<Mutex<Seen>>,
        received: u64,
    }

    impl Scripted {
        fn new(clock: Option<Arc<ManualClock>>, script: &[(u64, usize)]) -> Self {
            let mut arrivals = Vec::new();
            for (seq, &(at, input)) in script.iter().enumerate() {
                arrivals.resize_with(arrivals.len().max(input + 1), VecDeque::new);
                arrivals[input].push_back((at, seq as u64));
            }
            Scripted {
                clock,
                arrivals,
                ends: false,
                endless: false,
                seen: Arc::default(),
                received: 0,
            }
        }

        fn now(&self) -> u64 {
            self.clock.as_ref().map_or(u64::MAX, |c| c.now_ns())
        }
    }

    impl WorkerPorts for Scripted {
        fn inputs(&self) -> usize {
            self.arrivals.len()
        }

        fn receive(&mut self, input: usize, burst: &mut Burst) -> Receive {
            if self.endless {
                burst.push(&frame(1), 46, self.now(), input as PortId, self.received);
                self.received += 1;
                if let Some(c) = &self.clock {
                    c.advance(Duration::from_millis(1));
                }
                return Receive::Burst;
            }
            let now = self.now();
            let queue = &mut self.arrivals[input];
            while let Some(&(at, seq)) = queue.front() {
                if at > now || !burst.push(&frame(seq as u16), 46, at, input as PortId, seq) {
                    break;
                }
                queue.pop_front();
                self.received += 1;
            }
            match (burst.is_empty(), queue.is_empty() && self.ends) {
                (false, _) => Receive::Burst,
                (true, true) => Receive::Ended,
                (true, false) => Receive::Nothing,
            }
        }

        fn send(&mut self, burst: &mut Burst) {
            let now = self.now();
            let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            for d in burst.descs() {
                seen.sent.push((d.seq, d.verdict, now));
            }
        }

        fn flush(&mut self) {
            self.seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .flushes += 1;
        }

        fn wait(&mut self, timeout: Duration, _also: &[std::os::fd::RawFd]) {
            self.seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .waits += 1;
            let Some(clock) = &self.clock else { return };
            // Up to the next arrival, as poll(2) wakes for it, at most `timeout`.
            let now = clock.now_ns();
            let next = (self.arrivals.iter())
                .filter_map(|q| q.front().map(|&(at, _)| at))
                .min()
                .unwrap_or(u64::MAX);
            let step = next.saturating_sub(now).clamp(1, timeout.as_nanos() as u64);
            clock.advance(Duration::from_nanos(step));
        }

        fn stop(&mut self) {
            self.seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .stops += 1;
        }

        fn counters(&mut self) -> Vec<PortCounters> {
            vec![PortCounters {
                rx_packets: self.received,
                ..PortCounters::default()
            }]
        }

        fn timekeeping(&self) -> Timekeeping {
            match &self.clock {
                Some(c) => Timekeeping::Clock(c.clone()),
                None => Timekeeping::Packets,
            }
        }

        fn finish(&mut self) -> PortsReport {
            self.seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .finished = true;
            PortsReport {
                counters: self.counters(),
                ..PortsReport::default()
            }
        }
    }

    /// Forwards every packet to port `port`, counts its timer calls, and stops the run
    /// once it has seen `stop_after` packets (if given).
    struct Probe {
        port: PortId,
        polls: Arc<AtomicU64>,
        stop_after: Option<(u64, Arc<RunHandle>)>,
        seen: u64,
    }

    impl Program for Probe {
        type Prepared = ();

        fn process(&mut self, burst: &mut Burst, _ctx: &mut Context) {
            for d in burst.descs_mut() {
                d.verdict = Verdict::Forward(self.port);
                self.seen += 1;
            }
            if let Some((n, handle)) = &self.stop_after
                && self.seen >= *n
            {
                handle.stop.store(true, Ordering::Relaxed);
            }
        }

        fn poll(&mut self, _out: &mut Burst, _ctx: &mut Context) {
            self.polls.fetch_add(1, Ordering::Relaxed);
        }

        /// The packets seen go on counting from the old instance's.
        fn inherit(&mut self, old: Self, _now_ns: u64) -> Vec<stateplane_api::Carried> {
            self.seen += old.seen;
            vec![stateplane_api::Carried::entries("seen", self.seen, 0, "")]
        }
    }

    /// A reload hands the new program the instance it replaces, state and all, and says
    /// what came across; a program of another type gets nothing, and says why.
    #[test]
    fn a_reloaded_program_inherits_from_the_one_it_replaces() {
        let polls = Arc::new(AtomicU64::new(0));
        let with_seen = |seen| {
            Box::new(Probe {
                port: 0,
                polls: polls.clone(),
                stop_after: None,
                seen,
            })
        };
        let mut worker = crate::Worker::new(with_seen(5), 0, 1, 2, FlowHasher::with_seed(1));
        let carried = worker.replace_program(with_seen(2), || unreachable!("no control"));
        assert_eq!(
            carried,
            [stateplane_api::Carried::entries("seen", 7, 0, "")]
        );
        struct Other;
        impl Program for Other {
            type Prepared = ();
            fn process(&mut self, _burst: &mut Burst, _ctx: &mut Context) {}
        }
        assert_eq!(
            worker.replace_program(Box::new(Other), || unreachable!()),
            []
        );
        let carried = worker.replace_program(with_seen(0), || unreachable!());
        assert_eq!(
            carried,
            [],
            "Other declares nothing, so there is nothing to tell"
        );
    }

    fn probe(port: PortId, polls: &Arc<AtomicU64>) -> ProgramFactory {
        let polls = polls.clone();
        Arc::new(move |_| {
            Box::new(Probe {
                port,
                polls: polls.clone(),
                stop_after: None,
                seen: 0,
            })
        })
    }

    fn config() -> RuntimeConfig {
        RuntimeConfig {
            burst_size: 4,
            hasher: FlowHasher::with_seed(1),
            ..RuntimeConfig::default()
        }
    }

    fn run(ports: Scripted, factory: ProgramFactory, handle: &RunHandle) -> WorkerReport {
        let reload = Reload::new(factory);
        run_worker(
            0,
            1,
            2,
            &config(),
            WorkerSetup::new(Box::new(ports)),
            &reload,
            handle,
        )
    }

    fn seen(s: &Arc<Mutex<Seen>>) -> std::sync::MutexGuard<'_, Seen> {
        s.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replay: every packet is handled once, in bursts of the configured size, sent in
    /// order; the loop ends with its inputs, runs no timers and never waits.
    #[test]
    fn replay_handles_every_packet_once_in_order_and_ends_with_its_input() {
        let script: Vec<(u64, usize)> = (0..10).map(|i| (i * MS, 0)).collect();
        let mut ports = Scripted::new(None, &script);
        ports.ends = true;
        let log = ports.seen.clone();
        let polls = Arc::new(AtomicU64::new(0));
        let handle = RunHandle::new(1);
        let done = run(ports, probe(1, &polls), &handle);
        let seen = seen(&log);
        let seqs: Vec<u64> = seen.sent.iter().map(|s| s.0).collect();
        assert_eq!(seqs, (0..10).collect::<Vec<_>>());
        assert!(seen.sent.iter().all(|s| s.1 == Verdict::Forward(1)));
        assert_eq!(done.stats.get(Counter::RxPackets), 10);
        assert_eq!(done.stats.get(Counter::TxPackets), 10);
        assert_eq!(done.stats.get(Counter::Bursts), 3, "bursts of 4, 4 and 2");
        assert_eq!(polls.load(Ordering::Relaxed), 0, "no timers on packet time");
        assert_eq!((seen.waits, seen.stops), (0, 0));
        assert!(seen.finished);
        assert_eq!(
            handle.stats[1].snapshot().get(Counter::RxPackets),
            10,
            "published at the end"
        );
    }

    /// On a clock, an idle worker waits, runs its program's timers as its clock moves,
    /// publishes its ports' counters every 100 ms, and handles packets as they arrive.
    #[test]
    fn on_a_clock_timers_run_as_time_moves_and_packets_are_taken_as_they_arrive() {
        let clock = Arc::new(ManualClock::at(1_000 * MS));
        let start = clock.now_ns();
        let script = [
            (start + 5 * MS, 0),
            (start + 250 * MS, 1),
            (start + 250 * MS, 0),
        ];
        let ports = Scripted::new(Some(clock.clone()), &script);
        let log = ports.seen.clone();
        let polls = Arc::new(AtomicU64::new(0));
        let handle = Arc::new(RunHandle::new(1));
        // Stops the run after the third packet; the worker drains and ends.
        let (stopper, polls_in) = (handle.clone(), polls.clone());
        let factory: ProgramFactory = Arc::new(move |_| {
            Box::new(Probe {
                port: 1,
                polls: polls_in.clone(),
                stop_after: Some((3, stopper.clone())),
                seen: 0,
            })
        });
        let done = run(ports, factory, &handle);
        let seen = seen(&log);
        assert_eq!(seen.sent.len(), 3);
        for &(seq, _, sent_at) in &seen.sent {
            let arrival = script[seq as usize].0;
            assert!(
                sent_at >= arrival && sent_at <= arrival + IDLE_WAIT.as_nanos() as u64,
                "packet {seq} sent at {sent_at}, arrived at {arrival}"
            );
        }
        // 250 ms idle with waits of at most 10 ms: a timer call per pass, each at least
        // 1 ms after the last.
        let p = polls.load(Ordering::Relaxed);
        assert!((25..=250).contains(&p), "{p} timer calls in 250 ms");
        assert!(seen.waits >= 25, "{} waits", seen.waits);
        assert_eq!(seen.stops, 1);
        // Counters were published at 100 and 200 ms, before the last packets.
        let published = handle
            .port_counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[0]
            .clone();
        assert_eq!(published.first().map(|c| c.rx_packets), Some(1));
        assert_eq!(done.ports.counters[0].rx_packets, 3, "the final count");
    }

    /// A stop drains what is queued, but an input that never runs dry is cut off once
    /// [`DRAIN_LIMIT`] has passed on the worker's clock.
    #[test]
    fn a_stop_drains_for_at_most_the_drain_limit_of_the_clock() {
        let clock = Arc::new(ManualClock::at(0));
        let mut ports = Scripted::new(Some(clock.clone()), &[(0, 0)]);
        ports.endless = true;
        let log = ports.seen.clone();
        let handle = RunHandle::new(1);
        handle.stop.store(true, Ordering::Relaxed);
        let polls = Arc::new(AtomicU64::new(0));
        run(ports, probe(1, &polls), &handle);
        let limit = DRAIN_LIMIT.as_nanos() as u64;
        let now = clock.now_ns();
        assert!(now > limit && now <= limit + 2 * MS, "stopped at {now} ns");
        assert_eq!(seen(&log).stops, 1);
        assert!(
            seen(&log).sent.len() >= 200,
            "drained {}",
            seen(&log).sent.len()
        );
    }

    /// A stop on replay ends the input at once (the source is told), and what was
    /// received before is handled.
    #[test]
    fn a_stop_on_replay_tells_the_ports_and_ends() {
        let script: Vec<(u64, usize)> = (0..10).map(|i| (i, 0)).collect();
        let mut ports = Scripted::new(None, &script);
        ports.ends = true;
        let log = ports.seen.clone();
        let handle = RunHandle::new(1);
        handle.stop.store(true, Ordering::Relaxed);
        let polls = Arc::new(AtomicU64::new(0));
        run(ports, probe(1, &polls), &handle);
        // The scripted ports keep handing over what they hold after the stop (a queue's
        // drain); the loop took it all and ended with the input.
        assert_eq!(seen(&log).stops, 1);
        assert_eq!(seen(&log).sent.len(), 10);
    }

    /// A reload is taken between two bursts: the packets after it carry the new program's
    /// verdicts, none is lost, and the worker reports the generation it ran last.
    #[test]
    fn a_reload_takes_effect_between_bursts_and_loses_nothing() {
        let clock = Arc::new(ManualClock::at(0));
        let script: Vec<(u64, usize)> = (0..8)
            .map(|i| (if i < 4 { 0 } else { 50 * MS }, 0))
            .collect();
        let ports = Scripted::new(Some(clock.clone()), &script);
        let log = ports.seen.clone();
        let polls = Arc::new(AtomicU64::new(0));
        let reload = Arc::new(Reload::new(probe(0, &polls)));
        let handle = Arc::new(RunHandle::new(1));
        // A tap that publishes the reload once it has seen the first burst, and stops the
        // run after the second.
        struct Reloader {
            reload: Arc<Reload>,
            next: Option<ProgramFactory>,
            handle: Arc<RunHandle>,
            bursts: u32,
        }
        impl Tap for Reloader {
            fn observe(&mut self, _burst: &Burst, _ctx: &Context) {
                self.bursts += 1;
                if let Some(f) = self.next.take() {
                    self.reload.publish(f);
                }
                if self.bursts == 2 {
                    self.handle.stop.store(true, Ordering::Relaxed);
                }
            }
        }
        let (r, h, p) = (reload.clone(), handle.clone(), polls.clone());
        let tap: crate::TapFactory = Arc::new(move |_| {
            Box::new(Reloader {
                reload: r.clone(),
                next: Some(probe(1, &p)),
                handle: h.clone(),
                bursts: 0,
            })
        });
        let cfg = RuntimeConfig {
            taps: vec![tap],
            ..config()
        };
        let done = run_worker(
            0,
            1,
            2,
            &cfg,
            WorkerSetup::new(Box::new(ports)),
            &reload,
            &handle,
        );
        let verdicts: Vec<Verdict> = seen(&log).sent.iter().map(|s| s.1).collect();
        assert_eq!(
            verdicts,
            [vec![Verdict::Forward(0); 4], vec![Verdict::Forward(1); 4]].concat()
        );
        assert_eq!(done.generation, 1);
        // The new program took the old one's count of the first burst, and said so.
        let taken = reload.taken(1, 1, Duration::ZERO);
        let seen = stateplane_api::Carried::entries("seen", 4, 0, "");
        assert_eq!(
            taken,
            [Taken {
                worker: 0,
                generation: 1,
                carried: vec![seen]
            }]
        );
        assert_eq!(reload.taken(2, 1, Duration::from_millis(10)), []);
    }

    /// Taps see every burst after the program (its verdicts set), in the order given, and
    /// are told once at the end; a state stage ticks once before the first burst (what it
    /// sets up is done before the worker forwards), runs after them, between bursts, and
    /// finishes last.
    #[test]
    fn taps_see_each_burst_after_the_program_in_order_and_finish_once() {
        #[derive(Default)]
        struct Trace(Mutex<Vec<String>>);
        struct Named(&'static str, Arc<Trace>);
        impl Tap for Named {
            fn observe(&mut self, burst: &Burst, _ctx: &Context) {
                let forwarded = burst
                    .descs()
                    .iter()
                    .all(|d| d.verdict == Verdict::Forward(1));
                (self.1)
                    .0
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(format!("{} {} {forwarded}", self.0, burst.len()));
            }
            fn finish(&mut self, _ctx: &Context) {
                (self.1)
                    .0
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(format!("{} finish", self.0));
            }
        }
        use crate::Running;
        struct Stage(Arc<Trace>);
        impl Stage {
            fn log(&self, what: &str, program: &dyn Running) {
                let reasons = program.drop_reasons().len();
                let mut trace = (self.0).0.lock().unwrap_or_else(PoisonError::into_inner);
                trace.push(format!("stage {what} ({reasons} reasons)"));
            }
        }
        impl crate::StateStage for Stage {
            fn after_burst(&mut self, program: &mut dyn Running, _ctx: &Context) {
                self.log("after", program);
            }
            fn tick(&mut self, program: &mut dyn Running, _ctx: &Context) {
                self.log("tick", program);
            }
            fn reloaded(&mut self, _old: &mut dyn Running, program: &mut dyn Running, _: &Context) {
                self.log("reloaded", program);
            }
            fn finish(&mut self, program: &mut dyn Running, _ctx: &Context) {
                self.log("finish", program);
            }
        }
        let trace = Arc::new(Trace::default());
        let staged = trace.clone();
        let stage: crate::StateStageFactory = Arc::new(move |_| Box::new(Stage(staged.clone())));
        let tap = |name: &'static str| -> crate::TapFactory {
            let t = trace.clone();
            Arc::new(move |_| Box::new(Named(name, t.clone())))
        };
        let script: Vec<(u64, usize)> = (0..6).map(|i| (i, 0)).collect();
        let mut ports = Scripted::new(None, &script);
        ports.ends = true;
        let cfg = RuntimeConfig {
            taps: vec![tap("a"), tap("b")],
            state_stages: vec![stage],
            ..config()
        };
        let polls = Arc::new(AtomicU64::new(0));
        let reload = Reload::new(probe(1, &polls));
        run_worker(
            0,
            1,
            2,
            &cfg,
            WorkerSetup::new(Box::new(ports)),
            &reload,
            &RunHandle::new(1),
        );
        let got = trace
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        assert_eq!(
            got,
            [
                "stage tick (0 reasons)",
                "a 4 true",
                "b 4 true",
                "stage after (0 reasons)",
                "a 2 true",
                "b 2 true",
                "stage after (0 reasons)",
                "a finish",
                "b finish",
                "stage finish (0 reasons)"
            ]
        );
    }

    /// A program that names a port the switch does not have gets its packet dropped and
    /// counted, not sent.
    #[test]
    fn a_forward_to_a_missing_port_is_dropped_before_the_ports_see_it() {
        let mut ports = Scripted::new(None, &[(0, 0)]);
        ports.ends = true;
        let log = ports.seen.clone();
        let polls = Arc::new(AtomicU64::new(0));
        let done = run(ports, probe(7, &polls), &RunHandle::new(1));
        assert_eq!(
            seen(&log).sent[0].1,
            Verdict::Drop(DropReason::NO_SUCH_PORT)
        );
        assert_eq!(done.stats.get(Counter::Dropped), 1);
    }
}
