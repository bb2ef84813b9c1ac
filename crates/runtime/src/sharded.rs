//! The sharded shape (RSS): each worker has its own [`BurstSource`] (a replay queue sharded
//! by flow hash at load time, like a NIC's RSS queue, or [`crate::source::OwnShard`]:
//! capture files read by each worker for its own share) and its own output; there is no
//! dispatcher and nothing shared per packet.

use crate::burst::Burst;
use crate::program::ProgramFactory;
use crate::run_config::{RunHandle, RunReport, RuntimeConfig};
use crate::source::BurstSource;
use crate::worker_loop::{PortsReport, Receive, Reload, WorkerPorts, WorkerSetup, run_workers};

/// Runs one worker per source, each to completion on its own thread, with outputs counted
/// per port and discarded (the benchmark's null sink). A stop ends each source at once.
pub fn run_sharded(
    config: &RuntimeConfig,
    sources: Vec<Box<dyn BurstSource>>,
    ports: usize,
    factory: &ProgramFactory,
    handle: &RunHandle,
) -> RunReport {
    let setups = (sources.into_iter())
        .map(|source| {
            WorkerSetup::new(Box::new(FromSource {
                source,
                sent: vec![(0, 0); ports],
                stopped: false,
            }))
        })
        .collect();
    run_workers(config, setups, ports, &Reload::new(factory.clone()), handle)
}

/// A worker's ports in a sharded run: bursts from its own source, and a null sink that
/// counts what goes out of each port.
struct FromSource {
    source: Box<dyn BurstSource>,
    /// Packets and bytes per port.
    sent: Vec<(u64, u64)>,
    stopped: bool,
}

impl WorkerPorts for FromSource {
    fn receive(&mut self, _input: usize, burst: &mut Burst) -> Receive {
        if !self.stopped && self.source.fill(burst) {
            Receive::Burst
        } else {
            Receive::Ended
        }
    }

    #[inline]
    fn send(&mut self, burst: &mut Burst) {
        let ports = self.sent.len();
        for d in burst.descs() {
            for p in d.verdict.out_ports(d.in_port, ports) {
                let c = &mut self.sent[usize::from(p)];
                c.0 += 1;
                c.1 += u64::from(d.len);
            }
        }
    }

    fn stop(&mut self) {
        self.stopped = true;
    }

    fn finish(&mut self) -> PortsReport {
        let (dropped, errors) = self.source.finish();
        PortsReport {
            dropped,
            errors,
            tx_per_port: std::mem::take(&mut self.sent),
            counters: Vec::new(),
        }
    }
}
