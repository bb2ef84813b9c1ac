//! The offline shape: packets come from stream ports (capture files). A dispatcher thread
//! reads them in timestamp order across ports, parses each once, and hands it to the
//! worker that owns its flow (by the flow hash). It works in *rounds*: every round sends
//! one burst, possibly empty, to every worker, and the output stage takes round `r` from
//! every worker and merges the bursts by input sequence number. So output order equals
//! input order whatever the number of workers, and every queue stays bounded.
//!
//! Shutdown is by draining: when input ends or the stop flag is raised, the dispatcher
//! finishes its round and closes its queues; workers finish what is queued, then the output
//! stage does, and every count is final.

use crate::burst::Burst;
use crate::control::WorkerControl;
use crate::counters::{Counter, Stats};
use crate::port::{RxPort, TxPort};
use crate::program::{DropReason, PortId, ProgramFactory, Verdict};
use crate::run_config::{RunHandle, RunReport, RuntimeConfig};
use crate::source::{Merged, Offered, PacketBytes, ingress};
use crate::worker_loop::{Receive, Reload, WorkerPorts, WorkerSetup, spawn_workers};
use crossbeam_channel::{Receiver, Sender, bounded};
use stateplane_wire::Parsed;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Rounds between two publications of what each port read and wrote (and at the end):
/// often enough for a scrape, rarely enough to cost nothing a packet.
const PORTS_PUBLISHED_EVERY: u64 = 16;

/// The ports of an offline run.
pub struct OfflinePorts {
    /// Input streams and the port each one arrives on.
    pub rx: Vec<(PortId, Box<dyn RxPort>)>,
    /// Output per port id; `None` discards (after counting).
    pub tx: Vec<Option<Box<dyn TxPort>>>,
    /// Where packets for the control plane go; `None` counts them only.
    pub control: Option<Box<dyn TxPort>>,
}

/// Runs `factory`'s program over capture-file ports until every input ends (or `handle.stop`).
/// `controls`, one a worker (or none), connects the workers to a control plane, which they
/// answer between bursts: a program's own requests (a pipeline's expired rules) and a
/// metrics scrape's questions to the tables.
pub fn run_offline(
    config: &RuntimeConfig,
    mut ports: OfflinePorts,
    factory: &ProgramFactory,
    handle: &RunHandle,
    controls: Vec<WorkerControl>,
) -> RunReport {
    let workers = config.workers.max(1);
    let start = Instant::now();
    let port_count = ports.tx.len();
    // The dispatcher fills a burst to `burst_size`; a state stage that holds packets puts
    // them back into later bursts, in the room left above it.
    let (pool, capacity) = Burst::pool(
        config.queue_depth,
        config.burst_size,
        !config.state_stages.is_empty(),
    );
    let mut to_worker = Vec::new();
    let mut worker_rx = Vec::new();
    let mut to_output = Vec::new();
    let mut output_rx = Vec::new();
    let mut free_tx = Vec::new();
    let mut free_rx = Vec::new();
    for _ in 0..workers {
        let (t, r) = bounded::<Burst>(config.queue_depth);
        to_worker.push(t);
        worker_rx.push(r);
        let (t, r) = bounded::<Burst>(config.queue_depth);
        to_output.push(t);
        output_rx.push(r);
        let (t, r) = bounded::<Burst>(pool);
        for _ in 0..pool {
            let _ = t.send(Burst::with_capacity(capacity));
        }
        free_tx.push(t);
        free_rx.push(r);
    }
    let reload = Reload::new(factory.clone());
    let mut report = RunReport::empty(port_count, factory(0).drop_reasons(), Duration::ZERO);
    std::thread::scope(|scope| {
        let rx = std::mem::take(&mut ports.rx);
        let dispatcher = scope.spawn(|| dispatch(config, rx, to_worker, free_rx, handle));
        let mut controls = controls.into_iter();
        let setups = (worker_rx.into_iter().zip(to_output))
            .map(|(input, output)| {
                let by_hash = config.spread.by_hash();
                let mut setup = WorkerSetup::new(Box::new(FromDispatcher {
                    input,
                    output,
                    by_hash,
                }));
                setup.control = controls.next();
                setup
            })
            .collect();
        let workers = spawn_workers(scope, config, setups, port_count, &reload, handle);
        let written = output_stage(
            &output_rx,
            &free_tx,
            &mut ports.tx,
            &mut ports.control,
            handle,
        );
        match dispatcher.join() {
            Ok((stats, errors)) => {
                report.total.merge(&stats);
                report.errors.extend(errors);
            }
            Err(_) => (report.errors).push("the dispatcher thread panicked".to_owned()),
        }
        report.add_workers(workers);
        // After the workers' counts, which counted as sent what was forwarded.
        written.into_report(&mut report);
    });
    report.wall = start.elapsed();
    report
}

/// A worker's ports in an offline run: bursts from the dispatcher, handled bursts on to the
/// output stage, which writes them in input order.
struct FromDispatcher {
    input: Receiver<Burst>,
    output: Sender<Burst>,
    /// The dispatcher spreads by the flow hash ([`crate::Spread`]).
    by_hash: bool,
}

impl WorkerPorts for FromDispatcher {
    fn receive(&mut self, _input: usize, burst: &mut Burst) -> Receive {
        match self.input.recv() {
            Ok(next) => {
                *burst = next;
                Receive::Burst
            }
            Err(_) => Receive::Ended,
        }
    }

    fn spread_by_hash(&self) -> bool {
        self.by_hash
    }

    fn send(&mut self, burst: &mut Burst) {
        // The output stage gone means the run is ending; the dispatcher sees it too.
        let _ = self.output.send(std::mem::take(burst));
    }

    /// A burst of its own mid-run would put this worker a round ahead of the others at
    /// the output, which waits for each worker's burst of a round in turn: its queue
    /// would fill, then the dispatcher's to it, and the others would starve.
    fn takes_extra_bursts(&self) -> bool {
        false
    }
}

/// The dispatcher: merges the input ports by timestamp, parses, shards, and sends rounds.
fn dispatch(
    config: &RuntimeConfig,
    rx: Vec<(PortId, Box<dyn RxPort>)>,
    to_worker: Vec<Sender<Burst>>,
    free: Vec<Receiver<Burst>>,
    handle: &RunHandle,
) -> (Stats, Vec<String>) {
    let workers = to_worker.len();
    let mut stats = Stats::default();
    let mut parsed = Parsed::EMPTY;
    let mut round = 0u64;
    let mut bursts: Vec<Burst> = Vec::with_capacity(workers);
    let mut input = Merged::open(rx);
    // Packets and bytes read from each port, as of the last round.
    let mut read = Vec::new();
    'rounds: loop {
        for f in &free {
            match f.recv() {
                Ok(b) => bursts.push(b),
                Err(_) => break 'rounds,
            }
        }
        let mut taken = 0;
        let stopping = handle.stop.load(Ordering::Relaxed);
        while taken < config.burst_size && !stopping {
            let offered = input.offer(|Offered { port, seq, packet }| {
                let (hasher, whole, stats) = (&config.hasher, PacketBytes::Whole, Some(&mut stats));
                if ingress::parse(&packet, port, hasher, &mut parsed, whole, stats).is_none() {
                    return true; // counted and dropped
                }
                let w = config.spread.worker(packet.data, &parsed, port, workers);
                // A full burst leaves the packet to open the next round.
                bursts[w].push_parsed(&packet, port, seq, &parsed)
            });
            if offered != Some(true) {
                break;
            }
            taken += 1;
        }
        handle
            .input_bytes
            .store(input.bytes_read(), Ordering::Relaxed);
        handle.stats[0].publish(&stats);
        let done = stopping || input.done();
        if round.is_multiple_of(PORTS_PUBLISHED_EVERY) || done {
            input.taken_by_port(&mut read);
            handle.publish_file_reads(&read);
        }
        for (w, mut b) in bursts.drain(..).enumerate() {
            b.round = round;
            b.now_ns = input.now_ns;
            b.parsed = true;
            if to_worker[w].send(b).is_err() {
                break 'rounds;
            }
        }
        round += 1;
        if done {
            break;
        }
    }
    (stats, input.errors)
}

/// What the output stage wrote: packets and bytes per port, the packets and bytes it could
/// not write (counted by the workers as sent), and the errors that lost output.
struct Written {
    tx_per_port: Vec<(u64, u64)>,
    not_written: (u64, u64),
    errors: Vec<String>,
}

impl Written {
    /// Moves what was not written from sent to dropped in `report`.
    fn into_report(self, report: &mut RunReport) {
        let (packets, bytes) = self.not_written;
        let total = &mut report.total;
        total.take(Counter::TxPackets, packets);
        total.take(Counter::TxBytes, bytes);
        total.add(Counter::Dropped, packets);
        total.drops[usize::from(DropReason::NOT_WRITTEN.0)] += packets;
        report.tx_per_port = self.tx_per_port;
        report.errors.extend(self.errors);
    }
}

/// What a port's output has met: a failure, after which it takes nothing more; a packet
/// it refused alone (its format cannot hold it), which was logged.
#[derive(Clone, Copy, Default)]
struct PortWrites {
    failed: bool,
    warned: bool,
}

impl PortWrites {
    /// Sends packet `d` (its bytes `data`) on `out`, port `p`: whether it was written. A
    /// refusal of this packet alone (`InvalidInput`) is logged once per port; any other
    /// error fails the port, and is kept in `errors`.
    fn send(
        &mut self,
        out: &mut dyn TxPort,
        p: usize,
        d: &crate::burst::PacketDesc,
        data: &[u8],
        errors: &mut Vec<String>,
    ) -> bool {
        if self.failed {
            return false;
        }
        let Err(e) = out.send(data, d.orig_len, d.ts_ns) else {
            return true;
        };
        let name = out.name();
        if e.kind() != std::io::ErrorKind::InvalidInput {
            errors.push(format!("writing port {p} ({name}): {e}; its later packets are not written (dropped as not_written)"));
            self.failed = true;
        } else if !self.warned {
            log::warn!(
                "writing port {p} ({name}): {e}; such packets are dropped as not_written (a .pcapng output holds them)"
            );
            self.warned = true;
        }
        false
    }
}

/// The output stage: takes round `r` from every worker, merges by sequence number, sends.
fn output_stage(
    from_workers: &[Receiver<Burst>],
    free: &[Sender<Burst>],
    tx: &mut [Option<Box<dyn TxPort>>],
    control: &mut Option<Box<dyn TxPort>>,
    handle: &RunHandle,
) -> Written {
    let mut counts = vec![(0u64, 0u64); tx.len()];
    let mut errors: Vec<String> = Vec::new();
    let mut writes = vec![PortWrites::default(); tx.len()];
    let mut not_written = (0u64, 0u64);
    let mut control_failed = false;
    let mut bursts: Vec<Burst> = Vec::with_capacity(from_workers.len());
    // Which worker each of `bursts` came from; a worker whose queue closed has ended (one
    // may send more bursts than the others: the packets its state stage held).
    let mut from: Vec<usize> = Vec::with_capacity(from_workers.len());
    let mut open = vec![true; from_workers.len()];
    let mut cursor = vec![0usize; from_workers.len()];
    for round in 0u64.. {
        bursts.clear();
        from.clear();
        for (w, r) in from_workers.iter().enumerate() {
            if !open[w] {
                continue;
            }
            match r.recv() {
                Ok(b) => {
                    bursts.push(b);
                    from.push(w);
                }
                Err(_) => open[w] = false,
            }
        }
        if bursts.is_empty() {
            break;
        }
        cursor.iter_mut().for_each(|c| *c = 0);
        loop {
            let next = (0..bursts.len())
                .filter(|&w| cursor[w] < bursts[w].len())
                .min_by_key(|&w| bursts[w].descs()[cursor[w]].seq);
            let Some(w) = next else { break };
            let i = cursor[w];
            cursor[w] += 1;
            let d = bursts[w].descs()[i];
            let data = bursts[w].data(i);
            match d.verdict {
                Verdict::Forward(_) | Verdict::Flood => {
                    for port in d.verdict.out_ports(d.in_port, tx.len()) {
                        let p = usize::from(port);
                        let sent = match tx[p].as_mut() {
                            Some(out) => writes[p].send(out.as_mut(), p, &d, data, &mut errors),
                            None => true, // a port without an output counts its packets only
                        };
                        if !sent && writes[p].failed {
                            handle.stop.store(true, Ordering::Relaxed);
                        }
                        let to = if sent {
                            &mut counts[p]
                        } else {
                            &mut not_written
                        };
                        to.0 += 1;
                        to.1 += u64::from(d.len);
                    }
                }
                Verdict::ToControl(_) => {
                    if let Some(out) = control.as_mut().filter(|_| !control_failed)
                        && let Err(e) = out.send(data, d.orig_len, d.ts_ns)
                    {
                        errors.push(format!(
                            "writing control-plane output ({}): {e}",
                            out.name()
                        ));
                        control_failed = true;
                    }
                }
                Verdict::Drop(_) => {}
            }
        }
        if round.is_multiple_of(PORTS_PUBLISHED_EVERY) {
            handle.publish_file_writes(&counts);
        }
        for (&w, mut b) in from.iter().zip(bursts.drain(..)) {
            b.clear();
            // A pool already full (a burst of held packets came on top) lets it go.
            let _ = free[w].try_send(b);
        }
    }
    for (p, out) in tx.iter_mut().enumerate() {
        let Some(out) = out else { continue };
        if let Err(e) = out.flush() {
            errors.push(format!("flushing port {p} ({}): {e}", out.name()));
        }
        // What a failed write lost of what the port took was not sent either.
        let (packets, bytes) = out.unwritten();
        counts[p].0 = counts[p].0.saturating_sub(packets);
        counts[p].1 = counts[p].1.saturating_sub(bytes);
        not_written.0 += packets;
        not_written.1 += bytes;
    }
    handle.publish_file_writes(&counts);
    if let Some(out) = control
        && let Err(e) = out.flush()
    {
        errors.push(format!(
            "flushing control-plane output ({}): {e}",
            out.name()
        ));
    }
    Written {
        tx_per_port: counts,
        not_written,
        errors,
    }
}
