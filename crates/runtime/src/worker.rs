//! A worker runs its program to completion on one burst at a time and counts the outcome.

use crate::burst::Burst;
use crate::control::WorkerControl;
use crate::counters::{Counter, Stats};
use crate::program::{Context, DropReason, Running, Verdict};
use crate::state_stage::StateStage;
use crate::tap::Tap;
use stateplane_api::Carried;
use stateplane_wire::{FlowHasher, Malformed};

pub struct Worker {
    program: Box<dyn Running>,
    ctx: Context,
    control: Option<WorkerControl>,
    /// Stages that see each burst after the program, in order.
    taps: Vec<Box<dyn Tap>>,
    /// Duties for the program's declared state, run after the taps, between bursts.
    state_stages: Vec<Box<dyn StateStage>>,
    pub stats: Stats,
}

impl Worker {
    pub fn new(
        program: Box<dyn Running>,
        worker: usize,
        workers: usize,
        ports: usize,
        hasher: FlowHasher,
    ) -> Self {
        Worker {
            program,
            ctx: Context {
                now_ns: 0,
                worker,
                workers,
                hasher,
                ports,
                by_hash: true,
            },
            control: None,
            taps: Vec::new(),
            state_stages: Vec::new(),
            stats: Stats::default(),
        }
    }

    /// Says whether packets reach this worker by their hash ([`Context::by_hash`]).
    pub fn spread_by_hash(mut self, by_hash: bool) -> Self {
        self.ctx.by_hash = by_hash;
        self
    }

    /// Connects the worker to the control plane: requests are applied before each burst.
    pub fn with_control(mut self, control: WorkerControl) -> Self {
        self.control = Some(control);
        self
    }

    /// Gives the worker stages that see each burst after the program, in this order.
    pub fn with_taps(mut self, taps: Vec<Box<dyn Tap>>) -> Self {
        self.taps = taps;
        self
    }

    /// Gives the worker duties for its program's declared state (the sync stage).
    pub fn with_state_stages(mut self, stages: Vec<Box<dyn StateStage>>) -> Self {
        self.state_stages = stages;
        self
    }

    /// The worker is done: its taps and state stages hand on what they hold (flow records
    /// of open flows, the last changes of synced state).
    pub fn finish(&mut self) {
        for tap in &mut self.taps {
            tap.finish(&self.ctx);
        }
        for stage in &mut self.state_stages {
            stage.finish(self.program.as_mut(), &self.ctx);
        }
        if let Some(c) = &mut self.control {
            c.finish(self.program.as_mut(), &self.ctx);
        }
    }

    /// Ticks the state stages alone (woken by one of `wake_fds`, between two polls).
    pub fn tick_stages(&mut self) {
        for stage in &mut self.state_stages {
            stage.tick(self.program.as_mut(), &self.ctx);
        }
    }

    /// Packets the state stages hold across bursts (`StateStage::holding`).
    pub fn holding(&self) -> usize {
        self.state_stages.iter().map(|s| s.holding()).sum()
    }

    /// Whether a state stage has held packets ready to go back (`StateStage::releasable`).
    pub fn releasable(&self) -> bool {
        self.state_stages.iter().any(|s| s.releasable())
    }

    /// Whether a state stage is backlogged (`StateStage::backlogged`).
    pub fn backlogged(&self) -> bool {
        self.state_stages.iter().any(|s| s.backlogged())
    }

    /// What the state stages wake on (`StateStage::wake_fd`).
    pub fn wake_fds(&self) -> Vec<std::os::fd::RawFd> {
        self.state_stages
            .iter()
            .filter_map(|s| s.wake_fd())
            .collect()
    }

    /// The program, once the worker is done with it (its state, for a test or benchmark to
    /// check).
    pub fn into_program(self) -> Box<dyn Running> {
        self.program
    }

    /// Applies waiting control requests and passes notifications on (between bursts).
    #[inline]
    fn poll_control(&mut self) {
        if let Some(c) = &mut self.control {
            c.poll(self.program.as_mut(), &self.ctx);
        }
    }

    /// Parses the burst (unless the dispatcher already did, in which case it also took out
    /// the malformed packets), drops and counts malformed packets, runs the program, and
    /// counts every verdict. Afterwards each packet's verdict is final: `Forward` only to
    /// ports that exist.
    #[inline]
    pub fn handle(&mut self, burst: &mut Burst) {
        self.stats.add(Counter::Bursts, 1);
        if !burst.parsed && burst.parse(&self.ctx.hasher) > 0 {
            self.drop_malformed(burst);
        }
        self.ctx.now_ns = self.ctx.now_ns.max(burst.now_ns);
        self.poll_control();
        for stage in &mut self.state_stages {
            stage.before_program(burst, self.program.as_mut(), &self.ctx);
        }
        self.program.process(burst, &mut self.ctx);
        for stage in &mut self.state_stages {
            stage.after_program(burst, self.program.as_mut(), &self.ctx);
        }
        self.count_verdicts(burst);
        for tap in &mut self.taps {
            tap.observe(burst, &self.ctx);
        }
        for stage in &mut self.state_stages {
            stage.after_burst(self.program.as_mut(), &self.ctx);
        }
    }

    /// Runs the program's `poll` (timers, probes of its own) with `out` empty and its clock
    /// set; returns how many packets the program put in `out` to send.
    pub fn poll(&mut self, out: &mut Burst) -> usize {
        self.ctx.now_ns = self.ctx.now_ns.max(out.now_ns);
        self.poll_control();
        self.program.poll(out, &mut self.ctx);
        for tap in &mut self.taps {
            tap.tick(&self.ctx);
        }
        for stage in &mut self.state_stages {
            stage.tick(self.program.as_mut(), &self.ctx);
        }
        out.len()
    }

    /// Swaps in a new program (a reload), between two bursts; worker 0 also hands the
    /// control plane `spare`, another instance from the same factory. The new program
    /// takes what it can of the old one's state, once the state stages are done with the
    /// old one: what came across, per piece of state.
    pub fn replace_program(
        &mut self,
        program: Box<dyn Running>,
        spare: impl FnOnce() -> Box<dyn Running>,
    ) -> Vec<Carried> {
        let mut old = std::mem::replace(&mut self.program, program);
        for stage in &mut self.state_stages {
            stage.reloaded(old.as_mut(), self.program.as_mut(), &self.ctx);
        }
        let carried = self.program.inherit(old, self.ctx.now_ns);
        if let Some(c) = &self.control
            && self.ctx.worker == 0
        {
            c.reloaded(spare());
        }
        carried
    }

    #[cold]
    fn drop_malformed(&mut self, burst: &mut Burst) {
        for d in burst.descs() {
            if let Some(m) = d.malformed {
                count_malformed(&mut self.stats, m, d.len);
            }
        }
        burst.retain(|d| d.malformed.is_none());
    }

    /// Counts what came in and what the program decided, in one pass over the burst.
    #[inline]
    fn count_verdicts(&mut self, burst: &mut Burst) {
        let ports = self.ctx.ports;
        let (mut rx_bytes, mut tx, mut tx_bytes, mut ctl, mut dropped) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        for d in burst.descs_mut() {
            rx_bytes += u64::from(d.len);
            match d.verdict {
                Verdict::Forward(port) if usize::from(port) < ports => {
                    tx += 1;
                    tx_bytes += u64::from(d.len);
                }
                Verdict::Flood => {
                    // Counted as the copies that go out.
                    let copies = d.verdict.out_ports(d.in_port, ports).count() as u64;
                    tx += copies;
                    tx_bytes += copies * u64::from(d.len);
                }
                Verdict::Forward(_) => {
                    d.verdict = Verdict::Drop(DropReason::NO_SUCH_PORT);
                    self.stats.drops[usize::from(DropReason::NO_SUCH_PORT.0)] += 1;
                    dropped += 1;
                }
                Verdict::ToControl(_) => ctl += 1,
                Verdict::Drop(reason) => {
                    self.stats.drops[usize::from(reason.0) % DropReason::COUNT] += 1;
                    dropped += 1;
                }
            }
        }
        self.stats.add(Counter::RxPackets, burst.len() as u64);
        self.stats.add(Counter::RxBytes, rx_bytes);
        self.stats.add(Counter::TxPackets, tx);
        self.stats.add(Counter::TxBytes, tx_bytes);
        self.stats.add(Counter::ToControl, ctl);
        self.stats.add(Counter::Dropped, dropped);
    }
}

/// Counts one malformed packet of `len` bytes: received, malformed by reason, dropped.
pub fn count_malformed(stats: &mut Stats, m: Malformed, len: u32) {
    stats.malformed[m.index()] += 1;
    count_port_drop(stats, DropReason::MALFORMED, len);
}

/// Counts one packet of `len` bytes that a port or the dispatcher received and dropped
/// before any worker saw it.
pub fn count_port_drop(stats: &mut Stats, reason: DropReason, len: u32) {
    stats.drops[usize::from(reason.0)] += 1;
    if reason == DropReason::MALFORMED {
        stats.add(Counter::Malformed, 1);
    }
    stats.add(Counter::Dropped, 1);
    stats.add(Counter::RxPackets, 1);
    stats.add(Counter::RxBytes, u64::from(len));
}
