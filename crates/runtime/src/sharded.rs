//! The sharded shape (RSS): each worker has its own [`BurstSource`] (a replay queue sharded
//! by flow hash at load time, like a NIC's RSS queue, or [`crate::source::OwnShard`]:
//! capture files read by each worker for its own share) and its own output; there is no
//! dispatcher and nothing shared per packet.

use crate::burst::Burst;
use crate::program::ProgramFactory;
use crate::run::{RunHandle, RunReport, RuntimeConfig};
use crate::source::BurstSource;
use crate::worker::Worker;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Runs one worker per source, each to completion on its own thread, with outputs counted
/// per port and discarded (the benchmark's null sink).
pub fn run_sharded(
    config: &RuntimeConfig,
    sources: Vec<Box<dyn BurstSource>>,
    ports: usize,
    factory: &ProgramFactory,
    handle: &RunHandle,
) -> RunReport {
    let workers = sources.len();
    let start = Instant::now();
    let drop_reason_names = factory(0).drop_reasons();
    let results: Vec<_> = std::thread::scope(|scope| {
        let threads: Vec<_> = sources
            .into_iter()
            .enumerate()
            .map(|(w, mut source)| {
                let program = factory(w);
                let shared = handle.stats[w + 1].clone();
                let stop = handle.stop.clone();
                let hasher = config.hasher;
                let burst_size = config.burst_size;
                let tap = config.tap.as_ref().map(|f| f(w));
                scope.spawn(move || {
                    let mut worker = Worker::new(program, w, workers, ports, hasher).with_tap(tap);
                    let mut sink = vec![(0u64, 0u64); ports];
                    let mut burst = Burst::with_capacity(burst_size);
                    let t = Instant::now();
                    let mut bursts = 0u32;
                    while source.fill(&mut burst) {
                        worker.handle(&mut burst);
                        null_sink(&burst, &mut sink);
                        burst.clear();
                        bursts = bursts.wrapping_add(1);
                        // Publishing every burst would cost a cache line per burst on a
                        // shared counter page; every 64th keeps progress live.
                        if bursts.is_multiple_of(64) {
                            shared.publish(&worker.stats);
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                        }
                    }
                    let busy = t.elapsed();
                    worker.finish();
                    shared.publish(&worker.stats);
                    let (dropped, errors) = source.finish();
                    let mut stats = worker.stats;
                    stats.merge(&dropped);
                    (stats, busy, sink, errors)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join()).collect()
    });
    let mut report = RunReport::empty(ports, drop_reason_names, start.elapsed());
    for r in results {
        match r {
            Ok((stats, busy, sink, errors)) => {
                report.errors.extend(errors);
                report.total.merge(&stats);
                report.per_worker.push(stats);
                report.worker_busy.push(busy);
                for (acc, s) in report.tx_per_port.iter_mut().zip(sink) {
                    acc.0 += s.0;
                    acc.1 += s.1;
                }
            }
            Err(_) => report.errors.push("a worker thread panicked".to_owned()),
        }
    }
    report
}

/// Counts forwarded packets per port: the output of a benchmark.
#[inline]
fn null_sink(burst: &Burst, counts: &mut [(u64, u64)]) {
    let ports = counts.len();
    for d in burst.descs() {
        for p in d.verdict.out_ports(d.in_port, ports) {
            let c = &mut counts[usize::from(p)];
            c.0 += 1;
            c.1 += u64::from(d.len);
        }
    }
}
