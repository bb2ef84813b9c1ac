//! `stateplane bench`: packets per second per core through a program, on an in-memory
//! replay sharded across workers as a NIC's RSS would shard it. Also measures a bare
//! receive loop (copy into bursts, no parse) as the baseline in the same run, and repeats
//! each measurement to report the median.

use crate::BenchResult;
use crate::results::{Csv, ResultFiles, Table};
use crate::statistics::median;
use stateplane_gen::{GenConfig, Workload, generate};
use stateplane_io::{ReplayQueue, ReplayTrace};
use stateplane_programs::PortNames;
use stateplane_programs::forward::Forward;
use stateplane_programs::l2::{L2, L2Config, MacEntry};
use stateplane_runtime::{Burst, Counter, ProgramFactory};
use stateplane_runtime::{BurstSource, RunHandle, RuntimeConfig, run_sharded};
use stateplane_switch::units::bounded;
use stateplane_wire::FlowHasher;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Replay this capture instead of generating one.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Workload of the generated trace.
    #[arg(long, default_value = "internet")]
    pub workload: String,
    /// Packets in the generated trace.
    #[arg(long, default_value_t = 2_000_000)]
    pub packets: u64,
    /// Flows (connections) in the generated trace (default: the workload's).
    #[arg(long)]
    pub flows: Option<u64>,
    /// conntrack's table capacity per worker (1 to 67,108,864; default 1,048,576): room for
    /// every connection of the trace, or the benchmark's every-packet-forwarded check
    /// fails naming it. Only with conntrack among --programs.
    #[arg(long)]
    pub capacity: Option<usize>,
    /// Frame size of the generated trace (as captured).
    #[arg(long, default_value_t = 64)]
    pub packet_size: usize,
    /// Share of IPv6 flows in the generated trace.
    #[arg(long, default_value_t = 0.0)]
    pub ipv6_share: f64,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Times each worker replays its share of the trace.
    #[arg(long, default_value_t = 5)]
    pub loops: u64,
    /// Worker threads, each with its own share of the flows.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Packets a worker takes at a time.
    #[arg(long, default_value_t = 64)]
    pub burst: usize,
    /// Comma-separated: rx (baseline), forward, l2, conntrack, router.
    #[arg(long, default_value = "rx,forward,l2")]
    pub programs: String,
    /// Repeat each measurement and report the median.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Do not ask for huge pages for the replay memory.
    #[arg(long)]
    pub no_hugepages: bool,
    /// Print the results as JSON (for scripts) instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub files: ResultFiles,
}

struct Measurement {
    program: String,
    packets: u64,
    /// Median over repeats of the per-core rate (from each worker's packets / busy time).
    mpps_per_core: f64,
    ns_per_packet: f64,
    /// Median over repeats of all workers together (all packets / the slowest worker's time).
    mpps_total: f64,
}

fn l2_factory() -> BenchResult<ProgramFactory> {
    // Both router MACs of the generated traces lead to port 1, among 4094 other stations,
    // so lookups hit a table larger than a toy one.
    let mut macs = vec![
        MacEntry {
            mac: "02:00:00:00:00:01".into(),
            port: "1".into(),
            vlan: 0,
        },
        MacEntry {
            mac: "02:00:00:00:00:02".into(),
            port: "1".into(),
            vlan: 0,
        },
    ];
    for i in 0..4094u32 {
        macs.push(MacEntry {
            mac: format!(
                "02:10:00:{:02x}:{:02x}:{:02x}",
                i >> 16,
                (i >> 8) & 0xff,
                i & 0xff
            ),
            port: "0".into(),
            vlan: 0,
        });
    }
    let ports = PortNames(vec!["0".into(), "1".into()]);
    let l2 = L2::new(
        &L2Config {
            capacity: macs.len().max(1),
            macs,
            unknown: None,
        },
        &ports,
        "bench.l2",
        0x5eed,
    )
    .map_err(|e| e.to_string())?;
    Ok(Arc::new(move |_| Box::new(l2.clone())))
}

/// `conntrack` tracking every connection of the trace: room for `capacity` per worker, and
/// packets of connections that started before the trace are passed, not dropped, so the
/// benchmark's every-packet-forwarded check holds.
fn conntrack_factory(capacity: usize) -> BenchResult<ProgramFactory> {
    let settings: toml::Value =
        toml::from_str(&format!("capacity = {capacity}\ndrop_invalid = false"))
            .map_err(|e| e.to_string())?;
    stateplane_programs::build(
        "conntrack",
        Some(&settings),
        &PortNames(vec!["0".into(), "1".into()]),
    )
    .map_err(|e| e.to_string())
}

/// `router` with an Internet-sized table: 400,000 generated IPv4 and 150,000 IPv6
/// prefixes, plus the generator's address blocks so that every packet has a route.
fn router_factory() -> BenchResult<ProgramFactory> {
    use stateplane_programs::router::{NextHop, Router};
    use stateplane_state::prefixes;
    let hop = |i: u32| NextHop {
        port: (i % 2) as u16,
        mac: [2, 0, 0, 0, 0x10, (i % 251) as u8],
    };
    let mut v4: Vec<_> = prefixes::ipv4(400_000, 1)
        .into_iter()
        .map(|(a, l, i)| (a, l, hop(i)))
        .collect();
    v4.push(("198.18.0.0".parse().map_err(|_| "address")?, 15, hop(1)));
    // Default routes: any trace's destinations are routed (`--trace` of another source).
    v4.push(("0.0.0.0".parse().map_err(|_| "address")?, 0, hop(0)));
    let mut v6: Vec<_> = prefixes::ipv6(150_000, 1)
        .into_iter()
        .map(|(a, l, i)| (a, l, hop(i)))
        .collect();
    v6.push(("2001:2::".parse().map_err(|_| "address")?, 48, hop(1)));
    v6.push(("::".parse().map_err(|_| "address")?, 0, hop(0)));
    let router = Router::from_routes(&v4, &v6, vec![[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]])
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(move |_| Box::new(router.clone())))
}

const PROGRAMS: [&str; 5] = ["rx", "forward", "l2", "conntrack", "router"];

/// One worker's share of a measurement: packets handled and seconds busy.
type WorkerRun = (u64, f64);

/// The baseline: receive into bursts and count, touching no packet data.
fn rx_only(queues: Vec<ReplayQueue>, burst_size: usize) -> Vec<WorkerRun> {
    std::thread::scope(|s| {
        let threads: Vec<_> = queues
            .into_iter()
            .map(|mut q| {
                s.spawn(move || {
                    let mut burst = Burst::with_capacity(burst_size);
                    let mut n = 0u64;
                    let t = Instant::now();
                    while q.fill(&mut burst) {
                        n += burst.len() as u64;
                        burst.clear();
                    }
                    (n, t.elapsed().as_secs_f64())
                })
            })
            .collect();
        threads.into_iter().filter_map(|t| t.join().ok()).collect()
    })
}

/// The factory of one of this benchmark's programs (`capacity`: conntrack's).
fn factory_of(program: &str, capacity: usize) -> BenchResult<ProgramFactory> {
    Ok(match program {
        "forward" => {
            let f = Forward::from_pairs(&[(0, 1), (1, 0)]);
            Arc::new(move |_| Box::new(f.clone()))
        }
        "conntrack" => conntrack_factory(capacity)?,
        "router" => router_factory()?,
        _ => l2_factory()?,
    })
}

/// Runs `program` once over fresh replay queues (`None`: the receive-only baseline):
/// per-worker results, and the packets forwarded of those received.
pub(crate) fn measure(
    factory: Option<&ProgramFactory>,
    queues: Vec<ReplayQueue>,
    runtime: &RuntimeConfig,
) -> BenchResult<(Vec<WorkerRun>, u64, u64)> {
    let Some(factory) = factory else {
        let runs = rx_only(queues, runtime.burst_size);
        let n = runs.iter().map(|r| r.0).sum();
        return Ok((runs, n, n));
    };
    let workers = queues.len();
    let sources: Vec<Box<dyn BurstSource>> = queues
        .into_iter()
        .map(|q| Box::new(q) as Box<dyn BurstSource>)
        .collect();
    let report = run_sharded(runtime, sources, 2, factory, &RunHandle::new(workers));
    if let Some(e) = report.errors.first() {
        return Err(e.clone());
    }
    let runs = report
        .per_worker
        .iter()
        .zip(&report.worker_busy)
        .map(|(s, b)| (s.get(Counter::RxPackets), b.as_secs_f64()))
        .collect();
    Ok((
        runs,
        report.total.get(Counter::RxPackets),
        report.total.get(Counter::TxPackets),
    ))
}

/// A program's rates over `repeat` runs of the trace: medians of Mpps per core (from each
/// worker's packets and busy time), ns per packet, and Mpps of all workers together; and
/// the packets handled and forwarded in a run.
pub(crate) struct Rates {
    pub packets: u64,
    pub forwarded: u64,
    pub mpps_per_core: f64,
    pub ns_per_packet: f64,
    pub mpps_total: f64,
}

pub(crate) fn rates(
    factory: Option<&ProgramFactory>,
    trace: &ReplayTrace,
    runtime: &RuntimeConfig,
    (loops, repeat, huge): (u64, usize, bool),
) -> BenchResult<(Rates, bool)> {
    let (mut per_core, mut total, mut ns) = (Vec::new(), Vec::new(), Vec::new());
    let (mut packets, mut forwarded, mut huge_used) = (0, 0, huge);
    for _ in 0..repeat {
        let queues = trace.into_queues(runtime.workers, &runtime.hasher, loops, 0, huge);
        huge_used &= queues.iter().all(|q| q.is_huge());
        let (runs, rx, tx) = measure(factory, queues, runtime)?;
        (packets, forwarded) = (rx, tx);
        let mean_ns = runs
            .iter()
            .map(|&(n, secs)| secs * 1e9 / n.max(1) as f64)
            .sum::<f64>()
            / runs.len() as f64;
        let slowest = runs.iter().map(|r| r.1).fold(0.0, f64::max);
        ns.push(mean_ns);
        per_core.push(1e3 / mean_ns);
        total.push(packets as f64 / slowest / 1e6);
    }
    let rates = Rates {
        packets,
        forwarded,
        mpps_per_core: median(per_core),
        ns_per_packet: median(ns),
        mpps_total: median(total),
    };
    Ok((rates, huge_used))
}

/// Generates a trace in memory: the trace, and the command that makes the same one.
pub(crate) fn generated_trace(
    workload: &str,
    packets: u64,
    flows: Option<u64>,
    packet_size: usize,
    ipv6_share: f64,
    seed: u64,
) -> BenchResult<(ReplayTrace, String)> {
    let w: Workload = workload
        .parse()
        .map_err(|e: stateplane_gen::GenError| format!("--workload: {}", e.problem))?;
    let mut cfg = GenConfig::new(w, packets);
    cfg.seed = seed;
    cfg.flows = flows;
    cfg.packet_size = Some(packet_size);
    cfg.ipv6_share = ipv6_share;
    let mut frames = Vec::new();
    let mut bounds = Vec::new();
    generate(
        &cfg,
        |ts, f| {
            bounds.push((ts, frames.len(), f.len()));
            frames.extend_from_slice(f);
            Ok(())
        },
        |_| {},
    )
    .map_err(|e| e.to_string())?;
    let trace = ReplayTrace::from_packets(
        bounds
            .iter()
            .map(|&(ts, at, len)| (ts, &frames[at..at + len])),
    );
    let flows = flows.map_or(String::new(), |f| format!(" --flows {f}"));
    let input = format!(
        "generated: stateplane gen {workload} --packets {packets}{flows} --packet-size \
         {packet_size} --ipv6-share {ipv6_share} --seed {seed}"
    );
    Ok((trace, input))
}

pub fn main(a: BenchArgs) -> BenchResult<()> {
    let workers = bounded("--workers", a.workers, 1, 64)?;
    let burst_size = bounded("--burst", a.burst, 1, 1024)?;
    let repeat = bounded("--repeat", a.repeat, 1, 101)?;
    let huge = !a.no_hugepages;
    let capacity = bounded("--capacity", a.capacity.unwrap_or(1 << 20), 1, 1 << 26)?;
    let programs: Vec<&str> = a.programs.split(',').map(str::trim).collect();
    if a.capacity.is_some() && !programs.contains(&"conntrack") {
        return Err("--capacity sizes conntrack's table; add conntrack to --programs".into());
    }
    if a.trace.is_some() && a.flows.is_some() {
        return Err("--flows shapes a generated trace; --trace replays one as it is".into());
    }
    if let Some(bad) = programs.iter().find(|p| !PROGRAMS.contains(p)) {
        return Err(format!(
            "--programs: '{bad}' is not one of {}",
            PROGRAMS.join(", ")
        ));
    }
    let t = Instant::now();
    let (trace, input) = match &a.trace {
        Some(path) => {
            let trace = ReplayTrace::load(path, None, huge)
                .map_err(|e| format!("--trace {}: {e}", path.display()))?;
            (trace, format!("trace {}", path.display()))
        }
        None => generated_trace(
            &a.workload,
            a.packets,
            a.flows,
            a.packet_size,
            a.ipv6_share,
            a.seed,
        )?,
    };
    if trace.is_empty() {
        return Err("the trace has no packets".into());
    }
    let input = match programs.contains(&"conntrack") {
        true => format!("{input}; conntrack capacity {capacity} per worker"),
        false => input,
    };
    eprintln!(
        "loaded {} packets ({} bytes) in {:.1} s",
        trace.len(),
        trace.bytes(),
        t.elapsed().as_secs_f64()
    );
    let runtime = replay_runtime(workers, burst_size);
    let mut results = Vec::new();
    let mut failures = Vec::new();
    let mut huge_used = huge;
    for (i, program) in programs.iter().enumerate() {
        eprintln!(
            "[{}/{}] {program}: {repeat} round(s) of {} replay(s)",
            i + 1,
            programs.len(),
            a.loops
        );
        // A program that fails is reported beside the others, which are kept.
        let measured = (|| {
            let factory = match *program {
                "rx" => None,
                p => Some(factory_of(p, capacity)?),
            };
            let (r, huge) = rates(factory.as_ref(), &trace, &runtime, (a.loops, repeat, huge))?;
            if r.forwarded != r.packets {
                return Err(format!(
                    "{program}: forwarded {} of {} packets; the benchmark expects all",
                    r.forwarded, r.packets
                ));
            }
            Ok((r, huge))
        })();
        match measured {
            Ok((r, huge)) => {
                huge_used &= huge;
                results.push(Measurement {
                    program: program.to_string(),
                    packets: r.packets,
                    mpps_per_core: r.mpps_per_core,
                    ns_per_packet: r.ns_per_packet,
                    mpps_total: r.mpps_total,
                });
            }
            Err(e) => failures.push((program.to_string(), e)),
        }
    }
    report(
        &a, &input, workers, burst_size, huge_used, &results, &failures,
    )?;
    match failures.is_empty() {
        true => Ok(()),
        false => Err(failures
            .into_iter()
            .map(|(_, e)| e)
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

/// Prints the measurements, and a row for each program that failed (`failures`: the
/// program and why).
fn report(
    a: &BenchArgs,
    input: &str,
    workers: usize,
    burst: usize,
    huge: bool,
    results: &[Measurement],
    failures: &[(String, String)],
) -> BenchResult<()> {
    if a.json {
        let mut rows: Vec<_> = results
            .iter()
            .map(|m| serde_json::json!({"program": m.program, "packets": m.packets, "mpps_per_core": m.mpps_per_core,
                                         "ns_per_packet": m.ns_per_packet, "mpps_total": m.mpps_total}))
            .collect();
        rows.extend((failures.iter()).map(|(p, e)| serde_json::json!({"program": p, "error": e})));
        let v = serde_json::json!({"input": input, "workers": workers, "burst": burst, "loops": a.loops, "repeat": a.repeat,
                                   "hugepages": huge, "results": rows});
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
    } else {
        println!("input: {input}");
        println!(
            "workers {workers}, burst {burst}, loops {}, repeat {} (median), huge pages {}",
            a.loops,
            a.repeat,
            if huge { "yes" } else { "no" }
        );
        let mut table = Table::new(
            &["program"],
            &["packets", "Mpps/core", "ns/packet", "Mpps total"],
        );
        for m in results {
            table.row(vec![
                m.program.to_string(),
                m.packets.to_string(),
                format!("{:.2}", m.mpps_per_core),
                format!("{:.1}", m.ns_per_packet),
                format!("{:.2}", m.mpps_total),
            ]);
        }
        for (program, _) in failures {
            let failed = || "FAILED".to_string();
            table.row(vec![
                program.clone(),
                failed(),
                failed(),
                failed(),
                failed(),
            ]);
        }
        table.print();
    }
    if let Some(path) = &a.files.csv {
        let mut csv =
            Csv::new("program,packets,workers,burst,mpps_per_core,ns_per_packet,mpps_total");
        for m in results {
            csv.row(format_args!(
                "{},{},{},{},{:.3},{:.2},{:.3}",
                m.program,
                m.packets,
                workers,
                burst,
                m.mpps_per_core,
                m.ns_per_packet,
                m.mpps_total
            ));
        }
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let title = format!(
            "Mpps per core: {workers} worker(s), burst {burst}, median of {}",
            a.repeat
        );
        let panel = crate::chart::Panel {
            title: "Mpps per core".into(),
            unit: "Mpps".into(),
            bars: results
                .iter()
                .map(|m| (m.program.clone(), m.mpps_per_core))
                .collect(),
        };
        a.files.write_chart(&title, input, &[panel])?;
    }
    Ok(())
}

/// The runtime of a replay benchmark: `workers` workers on bursts of `burst_size`, shallow
/// queues (a replay needs no slack), a hash seed of the process's own, no taps.
pub fn replay_runtime(workers: usize, burst_size: usize) -> RuntimeConfig {
    RuntimeConfig {
        workers,
        burst_size,
        queue_depth: 8,
        hasher: FlowHasher::random(),
        taps: Vec::new(),
        state_stages: Vec::new(),
        spread: Default::default(),
    }
}
