//! `stateplane bench-flows`: the flow stage's experiments (TurboFlow's section 6), on one
//! core, from memory (no capture file, no export):
//!
//! * ratio (the paper's Figure 11): microflow records per packet against the microflow
//!   tables' memory, on generated `internet` and `datacenter` traces: how much work the
//!   first level takes off the aggregator;
//! * aggregator (Figure 12): microflow records per second into the flow table, with each
//!   optimization switched on in turn, from a std map with a wide key to the flat,
//!   linear-probing table with compact keys and batched prefetch, then keeping only the
//!   totals (the default features' smaller slots); every variant must export the same
//!   records, or the command fails;
//! * stage: packets per second through the whole stage with two levels (the default
//!   microflow table) and with one (every packet straight to the flow table), the
//!   measurement behind keeping the two-level design;
//! * workers: packets per second through the whole stage with one worker and with two,
//!   each on its own thread with its own shard of the flows (split by the runtime's flow
//!   hash beforehand): how the stage scales when reading is not in the way; and
//!   `scaling`, the median of each round's own ratio of the two, beside the shards'
//!   balance (two workers end when the larger shard does);
//! * growth: the aggregator as the product runs it, starting small and doubling in place,
//!   fed in the stage's batches of 4,096 records, each timed: the median, the longest
//!   batch in which the table doubled (how long its growth stalls a worker) and the longest
//!   in which it did not (the noise).
//!
//! Measurements of one experiment are interleaved in each round, and figures are medians
//! over rounds.

use crate::BenchResult;
use crate::chart::Panel;
use crate::results::{self, Csv, ResultFiles};
use crate::statistics::median;
use stateplane_flows::flow_stats::NO_PORT;
use stateplane_flows::stage::{FlowStage, RecordSink, StageConfig};
use stateplane_flows::{
    Aggregator, CompactKey, EndReason, FlowRecord, FlowStats, FlowTotals, FlowValue, KeptStats,
    Microflow, MicroflowTable, Observation, TcpEnd, Timeouts, Uniflow, V4Key,
};
use stateplane_wire::FlowKey;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::Hash;
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchFlowsArgs {
    /// Generated workloads, comma-separated (internet, datacenter).
    #[arg(long, value_delimiter = ',', default_value = "internet,datacenter")]
    pub workloads: Vec<String>,
    /// Packets per trace.
    #[arg(long, default_value_t = 4_000_000)]
    pub packets: u64,
    /// Microflow table slots per address family for the ratio experiment (powers of two).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64,256,1024,4096,16384,65536"
    )]
    pub slots: Vec<usize>,
    /// Rounds of each timed experiment (figures are medians).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

struct Row {
    experiment: &'static str,
    workload: String,
    variant: String,
    value: f64,
    unit: &'static str,
}

/// A packet as the flow stage sees it.
type Packet = (FlowKey, Observation);

fn trace(workload: &str, a: &BenchFlowsArgs) -> BenchResult<Vec<Packet>> {
    let mut packets = Vec::with_capacity(a.packets as usize);
    crate::each_parsed(workload, a.packets, a.seed, |ts_ns, p, frame| {
        let orig_len = frame.len() as u32;
        packets.push((p.key, Observation::of(p, orig_len, ts_ns, 0, NO_PORT)));
    })?;
    Ok(packets)
}

/// Counts the packets of the records it is given, and drops them.
#[derive(Default)]
struct Count {
    packets: u64,
}

impl RecordSink for Count {
    fn deliver(&mut self, records: &mut Vec<FlowRecord>) {
        self.packets += records.iter().map(FlowRecord::packets).sum::<u64>();
        records.clear();
    }
}

/// Long enough that no flow times out during a run: the experiments measure the tables.
/// Closed flows leave at their FIN, as the baseline's do.
const NO_TIMEOUTS: Timeouts = Timeouts {
    inactive_ns: u64::MAX / 4,
    active_ns: u64::MAX / 4,
    fin_ns: 0,
};

fn stage(slots: usize, max_flows: usize, timeouts: Timeouts) -> BenchResult<FlowStage> {
    let config = StageConfig {
        microflow_slots: slots,
        max_flows,
        timeouts,
        ..StageConfig::default()
    };
    FlowStage::new(config, 7).map_err(|e| format!("--slots: {e}"))
}

/// Runs every packet through `stage` in bursts of 64, as a worker does; returns the
/// packets of what it exported.
fn run_stage(stage: &mut FlowStage, packets: &[Packet]) -> Count {
    let mut sink = Count::default();
    for burst in packets.chunks(64) {
        for (key, o) in burst {
            stage.observe(key, o);
        }
        let now = burst.last().map_or(0, |p| p.1.ts_ns);
        stage.end_burst(now, &mut sink);
    }
    stage.finish(&mut sink);
    sink
}

fn ratio(workload: &str, packets: &[Packet], a: &BenchFlowsArgs) -> BenchResult<Vec<Row>> {
    let base = stage(0, 1 << 10, NO_TIMEOUTS)?.memory_bytes();
    let mut rows = Vec::new();
    for &slots in &a.slots {
        eprint!("\r  ratio {workload}: {slots} slots      ");
        let mut s = stage(slots, 1 << 10, NO_TIMEOUTS)?;
        let kib = (s.memory_bytes() - base) as f64 / 1024.0;
        run_stage(&mut s, packets);
        let c = s.counters();
        rows.push(Row {
            experiment: "ratio",
            workload: workload.into(),
            variant: format!("{slots} slots ({kib:.0} KiB)"),
            value: c.microflow_records as f64 / c.packets.max(1) as f64,
            unit: "records/packet",
        });
    }
    Ok(rows)
}

/// A flow table the aggregator experiment measures: microflow records (keeping `S` of
/// their features) in, records of the flows they end out.
trait Table<S = FlowStats> {
    fn ingest(&mut self, records: &[Microflow<V4Key, S>], out: &mut Vec<FlowRecord>);
    /// The memory in use, where the table says (to see when it grows).
    fn memory_bytes(&self) -> usize {
        0
    }
}

impl<S: KeptStats> Table<S> for Aggregator<V4Key, Uniflow<S>> {
    fn ingest(&mut self, records: &[Microflow<V4Key, S>], out: &mut Vec<FlowRecord>) {
        Aggregator::ingest(self, records, out);
    }
    fn memory_bytes(&self) -> usize {
        Aggregator::memory_bytes(self)
    }
}

/// The baseline: a std `HashMap` (SipHash) from a flow key of type `K` to the flow, doing
/// what the aggregator does per record (merge, or start a flow; export it if it ended).
/// The wide key is made from the compact one per record, in the timed loop (a few shifts
/// against a map lookup).
struct StdMap<K>(HashMap<K, Uniflow>, fn(&V4Key) -> K);

impl<K: Hash + Eq> Table for StdMap<K> {
    fn ingest(&mut self, records: &[Microflow<V4Key>], out: &mut Vec<FlowRecord>) {
        for m in records {
            match self.0.entry((self.1)(&m.key)) {
                Entry::Occupied(mut e) => {
                    e.get_mut().merge(&m.stats, false);
                    if e.get().tcp_end() != TcpEnd::Open {
                        out.push(e.remove().record(&m.key, EndReason::EndOfFlow));
                    }
                }
                Entry::Vacant(e) => {
                    let flow = Uniflow::start(&m.stats, false);
                    if flow.tcp_end() != TcpEnd::Open {
                        out.push(flow.record(&m.key, EndReason::EndOfFlow));
                    } else {
                        e.insert(flow);
                    }
                }
            }
        }
    }
}

/// The IPv4 microflow records the default first level sends the aggregator.
fn microflow_records(packets: &[Packet]) -> BenchResult<Vec<Microflow<V4Key>>> {
    let slots = StageConfig::default().microflow_slots;
    let mut table = MicroflowTable::<V4Key>::new(slots).map_err(|e| e.to_string())?;
    let mut records = Vec::new();
    for (key, o) in packets {
        if let Some(k) = V4Key::pack(key) {
            let hash = stateplane_flows::compact_key::hash_key(&k, 7);
            table.observe(k, hash, o, &mut records);
        }
    }
    table.sweep(u64::MAX, 0, table.slots(), &mut records);
    Ok(records)
}

fn aggregator(workload: &str, packets: &[Packet], a: &BenchFlowsArgs) -> BenchResult<Vec<Row>> {
    let records = microflow_records(packets)?;
    let flows = records
        .iter()
        .map(|m| m.key)
        .collect::<std::collections::HashSet<_>>()
        .len();
    // Room for every flow, so that no variant evicts (the std maps have no budget).
    let max_flows = (flows + 1).next_power_of_two();
    // Every variant is sized for the flows beforehand (the std maps by `with_capacity`, ours
    // by `reserve`), memory touched as flows arrive; the last row is ours as the product
    // runs it, starting small and doubling as flows arrive. The tables that keep only the
    // totals get the same records with only their totals, converted here, untimed.
    let records = Records {
        totals: (records.iter())
            .map(|m| Microflow {
                key: m.key,
                stats: FlowTotals::from(&m.stats),
            })
            .collect(),
        all: records,
    };
    type Run = fn(usize, &Records, &mut Vec<FlowRecord>) -> BenchResult<Fed>;
    let variants: [(&str, Run); 6] = [
        ("std map, wide key", |n, r, out| {
            let mut table = StdMap(HashMap::with_capacity(n), V4Key::unpack);
            Ok(feed(&mut table, &r.all, out))
        }),
        ("std map, compact key", |n, r, out| {
            let mut table = StdMap(HashMap::with_capacity(n), |k: &V4Key| *k);
            Ok(feed(&mut table, &r.all, out))
        }),
        ("flat linear probing, compact key", |n, r, out| {
            let mut table = sized_aggregator::<FlowStats>(n)?.without_prefetch();
            Ok(feed(&mut table, &r.all, out))
        }),
        ("+ batched prefetch (ours)", |n, r, out| {
            Ok(feed(&mut sized_aggregator::<FlowStats>(n)?, &r.all, out))
        }),
        ("+ totals only (the default features)", |n, r, out| {
            Ok(feed(
                &mut sized_aggregator::<FlowTotals>(n)?,
                &r.totals,
                out,
            ))
        }),
        ("ours, growing from empty", |n, r, out| {
            Ok(feed(&mut new_aggregator::<FlowStats>(n)?, &r.all, out))
        }),
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut exported: Vec<usize> = vec![0; variants.len()];
    let mut out = Vec::with_capacity(1 << 16);
    // The growing table's batches, each timed, and whether the table doubled in it: a
    // doubling stalls the batch it falls in.
    let growing = variants.len() - 1;
    let (mut typical_ms, mut doubling_ms, mut other_ms) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..a.repeat {
        for (v, (name, run)) in variants.iter().enumerate() {
            eprint!(
                "\r  aggregator {workload}: round {} {name}          ",
                round + 1
            );
            let fed = run(max_flows, &records, &mut out)?;
            if v == growing {
                let batches = &fed.batches;
                // NaN when no batch was of that kind (a table that never doubled).
                let longest = |doubled: bool| {
                    (batches.iter().filter(|b| b.1 == doubled))
                        .fold(f64::NAN, |m: f64, b| m.max(b.0))
                };
                doubling_ms.push(longest(true));
                other_ms.push(longest(false));
                typical_ms.push(median(batches.iter().map(|b| b.0).collect()));
            }
            rates[v].push(fed.rate);
            exported[v] = fed.ended;
        }
    }
    if let Some(v) = exported.iter().position(|&n| n != exported[0]) {
        return Err(format!(
            "aggregator: '{}' ended {} flows, '{}' {}: the variants disagree",
            variants[0].0, exported[0], variants[v].0, exported[v]
        ));
    }
    eprintln!(
        "\r  aggregator {workload}: {} microflow records of {flows} flows; {} flows ended by FIN/RST in each variant",
        records.all.len(),
        exported[0]
    );
    let mut rows: Vec<Row> = (variants.iter().zip(rates))
        .map(|((name, _), r)| Row {
            experiment: "aggregator",
            workload: workload.into(),
            variant: (*name).into(),
            value: median(r),
            unit: "M records/s",
        })
        .collect();
    for (variant, ms) in [
        ("median batch of 4096 records", typical_ms),
        ("longest batch in which the table doubled", doubling_ms),
        ("longest batch in which it did not", other_ms),
    ] {
        // Rounds with no batch of that kind (a table that never doubled) have none; with
        // none in any round, no row, said once.
        let ms: Vec<f64> = ms.into_iter().filter(|m| !m.is_nan()).collect();
        if ms.is_empty() {
            eprintln!("  growth {workload}: no {variant}");
            continue;
        }
        rows.push(Row {
            experiment: "growth",
            workload: workload.into(),
            variant: variant.into(),
            value: median(ms),
            unit: "ms",
        });
    }
    Ok(rows)
}

/// The aggregator experiment's records: every feature, and the totals alone.
struct Records {
    all: Vec<Microflow<V4Key>>,
    totals: Vec<Microflow<V4Key, FlowTotals>>,
}

/// What feeding a table its records gave: microflow records per second (millions), the
/// records of the flows it ended, and each batch's time (ms) with whether the table's
/// memory changed in it (a doubling).
struct Fed {
    rate: f64,
    ended: usize,
    batches: Vec<(f64, bool)>,
}

/// Feeds `records` to `table` in the ring's batches of 4,096, as the stage hands them over,
/// each batch timed.
fn feed<S>(
    table: &mut impl Table<S>,
    records: &[Microflow<V4Key, S>],
    out: &mut Vec<FlowRecord>,
) -> Fed {
    let (mut ended, mut batches) = (0, Vec::new());
    let t = Instant::now();
    for chunk in records.chunks(4096) {
        let (b, before) = (Instant::now(), table.memory_bytes());
        table.ingest(chunk, out);
        batches.push((
            b.elapsed().as_secs_f64() * 1e3,
            table.memory_bytes() != before,
        ));
        ended += out.len();
        out.clear();
    }
    Fed {
        rate: records.len() as f64 / t.elapsed().as_secs_f64() / 1e6,
        ended,
        batches,
    }
}

fn new_aggregator<S: KeptStats>(max_flows: usize) -> BenchResult<Aggregator<V4Key, Uniflow<S>>> {
    Aggregator::new(max_flows, NO_TIMEOUTS, 7).map_err(|e| e.to_string())
}

fn sized_aggregator<S: KeptStats>(max_flows: usize) -> BenchResult<Aggregator<V4Key, Uniflow<S>>> {
    let mut table = new_aggregator(max_flows)?;
    table.reserve(max_flows);
    Ok(table)
}

fn stage_speed(workload: &str, packets: &[Packet], a: &BenchFlowsArgs) -> BenchResult<Vec<Row>> {
    let variants = [
        ("two levels (4096-slot microflow tables)", 4096),
        ("one level (flow table only)", 0),
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let ip = packets.iter().filter(|p| p.0.ip_version != 0).count() as u64;
    for round in 0..a.repeat {
        for (v, &(name, slots)) in variants.iter().enumerate() {
            eprint!("\r  stage {workload}: round {} {name}          ", round + 1);
            // The product's defaults: its flow budget and timeouts.
            let mut s = stage(slots, StageConfig::default().max_flows, Timeouts::default())?;
            let t = Instant::now();
            let exported = run_stage(&mut s, packets);
            rates[v].push(packets.len() as f64 / t.elapsed().as_secs_f64() / 1e6);
            // Either shape puts every packet in exactly one record.
            if exported.packets != ip {
                return Err(format!(
                    "stage, {name}: {} packets in records, {ip} in the trace",
                    exported.packets
                ));
            }
        }
    }
    Ok((variants.iter().zip(rates))
        .map(|(&(name, _), r)| Row {
            experiment: "stage",
            workload: workload.into(),
            variant: name.into(),
            value: median(r),
            unit: "Mpps",
        })
        .collect())
}

/// Worker counts of the scaling experiment.
const WORKERS: [usize; 2] = [1, 2];

fn worker_scaling(workload: &str, packets: &[Packet], a: &BenchFlowsArgs) -> BenchResult<Vec<Row>> {
    let hasher = stateplane_wire::FlowHasher::with_seed(a.seed);
    let ip = packets.iter().filter(|p| p.0.ip_version != 0).count() as u64;
    let shards_of = |workers: usize| {
        let mut shards = vec![Vec::new(); workers];
        for p in packets {
            let shard = stateplane_wire::flow::shard_of(hasher.hash_connection(&p.0), workers);
            shards[shard].push(*p);
        }
        shards
    };
    let split: Vec<Vec<Vec<Packet>>> = WORKERS.iter().map(|&w| shards_of(w)).collect();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); WORKERS.len()];
    for round in 0..a.repeat {
        for (v, shards) in split.iter().enumerate() {
            eprint!(
                "\r  workers {workload}: round {} {} worker(s)      ",
                round + 1,
                shards.len()
            );
            let mut stages = (shards.iter())
                .map(|_| stage(4096, StageConfig::default().max_flows, Timeouts::default()))
                .collect::<BenchResult<Vec<_>>>()?;
            let t = Instant::now();
            let exported: u64 = std::thread::scope(|scope| {
                let threads: Vec<_> = (stages.iter_mut().zip(shards))
                    .map(|(s, shard)| scope.spawn(move || run_stage(s, shard).packets))
                    .collect();
                threads.into_iter().map(|t| t.join().unwrap_or(0)).sum()
            });
            rates[v].push(packets.len() as f64 / t.elapsed().as_secs_f64() / 1e6);
            if exported != ip {
                return Err(format!(
                    "workers, {} worker(s): {exported} packets in records, {ip} in the trace",
                    shards.len()
                ));
            }
        }
    }
    // Each round's own ratio: a slow spell of the shared machine falls on both its runs.
    let per_round = (rates[1].iter().zip(&rates[0]))
        .map(|(two, one)| two / one)
        .collect();
    // The split's balance: two workers end when the larger shard does, so at one
    // worker's speed a packet they give this much (smaller flow tables can beat it).
    let largest = split[1].iter().map(Vec::len).max().unwrap_or(0).max(1);
    let scaling = [
        (
            "2 workers to 1, median of the rounds' ratios",
            median(per_round),
        ),
        (
            "the shards' balance (packets / larger shard)",
            packets.len() as f64 / largest as f64,
        ),
    ]
    .map(|(variant, value)| Row {
        experiment: "scaling",
        workload: workload.into(),
        variant: variant.into(),
        value,
        unit: "x",
    });
    Ok((WORKERS.iter().zip(rates))
        .map(|(&workers, r)| Row {
            experiment: "workers",
            workload: workload.into(),
            variant: format!("{workers} worker(s)"),
            value: median(r),
            unit: "Mpps",
        })
        .chain(scaling)
        .collect())
}

pub fn main(a: BenchFlowsArgs) -> BenchResult<()> {
    if a.packets == 0 || a.repeat == 0 {
        return Err("--packets and --repeat must be above 0".into());
    }
    // Checked before the traces are generated, which takes a while.
    if let Some(&n) = a.slots.iter().find(|n| !n.is_power_of_two()) {
        return Err(format!(
            "--slots: {n} is not a power of two (e.g. {})",
            n.max(1).next_power_of_two()
        ));
    }
    let mut rows = Vec::new();
    for workload in &a.workloads {
        eprint!("\rgenerating {workload}      ");
        let packets = trace(workload, &a)?;
        rows.extend(ratio(workload, &packets, &a)?);
        rows.extend(aggregator(workload, &packets, &a)?);
        rows.extend(stage_speed(workload, &packets, &a)?);
        rows.extend(worker_scaling(workload, &packets, &a)?);
    }
    eprintln!();
    println!(
        "input: stateplane gen WORKLOAD --packets {} --seed {} (IPv4 and IPv6), parsed once, from memory on one core (two in `workers`); medians of {} rounds",
        a.packets, a.seed, a.repeat
    );
    let mut table = results::Table::new(&["experiment", "workload", "variant", "unit"], &["value"]);
    for r in &rows {
        table.row(vec![
            r.experiment.to_string(),
            r.workload.to_string(),
            r.variant.to_string(),
            r.unit.to_string(),
            format!("{:.4}", r.value),
        ]);
    }
    table.print();
    if let Some(path) = &a.files.csv {
        let mut csv = Csv::new("experiment,workload,variant,value,unit");
        for r in &rows {
            csv.row(format_args!(
                "{},{},\"{}\",{:.5},{}",
                r.experiment, r.workload, r.variant, r.value, r.unit
            ));
        }
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let mut panels = Vec::new();
        for (experiment, title) in [
            (
                "ratio",
                "microflow records per packet, by microflow table memory",
            ),
            (
                "aggregator",
                "aggregator throughput, optimizations on in turn",
            ),
            ("stage", "whole flow stage, two levels against one"),
            ("workers", "whole flow stage, one worker and two"),
            ("growth", "the table growing from empty: a batch's time"),
        ] {
            for w in &a.workloads {
                let chosen: Vec<&Row> = (rows.iter())
                    .filter(|r| r.experiment == experiment && &r.workload == w)
                    .collect();
                panels.push(Panel {
                    title: format!("{w}: {title}"),
                    unit: chosen.first().map_or("", |r| r.unit).into(),
                    bars: chosen
                        .iter()
                        .map(|r| (r.variant.clone(), r.value))
                        .collect(),
                });
            }
        }
        a.files.write_chart("Flow records (TurboFlow section 6 on this CPU)",
            &format!(
                "{} packets per trace, seed {}, one core (workers: one per core), medians of {} rounds",
                a.packets, a.seed, a.repeat
            ),
            &panels,
        )?;
    }
    Ok(())
}
