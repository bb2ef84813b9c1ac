//! The live shape: each worker owns one queue pair (receive and transmit) per interface and
//! runs until told to stop.
//!
//! There is no dispatcher: the kernel spreads flows over the workers' receive queues (an
//! AF_PACKET fanout group in hash mode), so nothing is shared per packet. A worker reads a
//! burst from each of its queues in turn, runs the program, and writes the forwarded
//! packets to its own transmit queues, kicking each once per pass. When every queue is
//! empty it waits in `poll` (the only blocking call), so an idle switch costs no CPU.
//!
//! Stopping drains: after the stop flag rises, each worker keeps reading until its queues
//! are empty (bounded by [`DRAIN_LIMIT`]), so packets already received are still forwarded.
//! Reloading swaps the program between bursts ([`Reload`]): packets wait in the rings
//! meanwhile, so a reload loses none. The loop itself is [`crate::worker_loop`]'s.

use crate::burst::Burst;
use crate::control::WorkerControl;
use crate::port::{LiveQueue, PortCounters};
use crate::program::PortId;
use crate::run_config::{RunHandle, RunReport, RuntimeConfig};
use crate::worker_loop::{
    Clock, PortsReport, Receive, Reload, Timekeeping, WallClock, WorkerPorts, WorkerSetup,
    run_workers,
};
pub use crate::worker_loop::{DRAIN_LIMIT, wall_clock_ns};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

/// One worker's queues, one per port, indexed by port id.
pub struct LiveQueues {
    pub ports: Vec<Box<dyn LiveQueue>>,
    /// The worker's end of the control plane, if the run has one.
    pub control: Option<WorkerControl>,
}

/// Waits until one of the descriptors is readable or the timeout passes (a wrapper of
/// `poll(2)` that the I/O crate provides, so that this crate makes no system calls itself).
pub type WaitReadable = fn(&[RawFd], Duration);

/// Runs the program on live queues, one worker thread per entry of `queues`, until
/// `handle.stop` rises; then drains and reports (with the ports' own counts and the
/// program generation each worker ran last).
pub fn run_live(
    config: &RuntimeConfig,
    queues: Vec<LiveQueues>,
    ports: usize,
    reload: &Reload,
    handle: &RunHandle,
    wait: WaitReadable,
) -> RunReport {
    let clock: Arc<dyn Clock> = Arc::new(WallClock::new());
    let setups = (queues.into_iter())
        .map(|q| WorkerSetup {
            ports: Box::new(LivePorts::new(q.ports, wait, clock.clone())),
            control: q.control,
        })
        .collect();
    let mut report = run_workers(config, setups, ports, reload, handle);
    report.port_counters.resize(ports, PortCounters::default());
    report
}

/// A worker's live queues as its loop sees them: one input per queue, forwarded packets
/// sent on the queue of their port, the wall clock.
struct LivePorts {
    queues: Vec<Box<dyn LiveQueue>>,
    fds: Vec<RawFd>,
    wait: WaitReadable,
    clock: Arc<dyn Clock>,
}

impl LivePorts {
    fn new(queues: Vec<Box<dyn LiveQueue>>, wait: WaitReadable, clock: Arc<dyn Clock>) -> Self {
        let fds = queues.iter().map(|q| q.fd()).collect();
        LivePorts {
            queues,
            fds,
            wait,
            clock,
        }
    }
}

impl WorkerPorts for LivePorts {
    fn spread_by_hash(&self) -> bool {
        false
    }

    fn inputs(&self) -> usize {
        self.queues.len()
    }

    fn receive(&mut self, input: usize, burst: &mut Burst) -> Receive {
        match self.queues[input].recv(burst, input as PortId) {
            0 => Receive::Nothing,
            _ => Receive::Burst,
        }
    }

    fn send(&mut self, burst: &mut Burst) {
        let n = self.queues.len();
        for (d, data) in burst.iter() {
            for p in d.verdict.out_ports(d.in_port, n) {
                self.queues[usize::from(p)].send(data, d.segment_size);
            }
        }
    }

    fn flush(&mut self) {
        self.queues.iter_mut().for_each(|q| q.flush());
    }

    fn wait(&mut self, timeout: Duration, also: &[RawFd]) {
        if also.is_empty() {
            (self.wait)(&self.fds, timeout);
        } else {
            let fds: Vec<RawFd> = self.fds.iter().chain(also).copied().collect();
            (self.wait)(&fds, timeout);
        }
    }

    fn counters(&mut self) -> Vec<PortCounters> {
        self.queues.iter_mut().map(|q| q.counters()).collect()
    }

    fn timekeeping(&self) -> Timekeeping {
        Timekeeping::Clock(self.clock.clone())
    }

    fn finish(&mut self) -> PortsReport {
        let counters = self.counters();
        PortsReport {
            tx_per_port: counters
                .iter()
                .map(|c| (c.tx_packets, c.tx_bytes))
                .collect(),
            counters,
            ..PortsReport::default()
        }
    }
}
