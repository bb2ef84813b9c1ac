//! `stateplane bench-catalog`: Mpps per core of each program of the catalog on its
//! workload, next to `forward` on the same trace in the same run, so that the cost of each
//! function's state shows as a ratio. Every packet arrives on port 0 (the inside, the
//! clients' side); each program's settings are in `SETUPS` and printed with the results.

use crate::BenchResult;
use crate::bench::{Rates, generated_trace, rates, replay_runtime};
use crate::results::{Csv, ResultFiles, Table};
use stateplane_programs::PortNames;
use stateplane_runtime::ProgramFactory;
use stateplane_switch::units::bounded;
use std::collections::BTreeMap;

#[derive(clap::Args)]
pub struct BenchCatalogArgs {
    /// Comma-separated programs (default: all of the table below).
    #[arg(long)]
    pub programs: Option<String>,
    /// Packets in each generated trace.
    #[arg(long, default_value_t = 1_000_000)]
    pub packets: u64,
    /// Frame size (as captured), raised where a workload's headers need more.
    #[arg(long, default_value_t = 64)]
    pub packet_size: usize,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Times each worker replays its share of the trace.
    #[arg(long, default_value_t = 3)]
    pub loops: u64,
    /// Worker threads, each with its own share of the flows.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Packets a worker takes at a time.
    #[arg(long, default_value_t = 64)]
    pub burst: usize,
    /// Repeat each measurement and report the median.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    #[command(flatten)]
    pub files: ResultFiles,
}

/// Each program: the workload it runs on and its settings (ports `p0`, where every packet
/// arrives, and `p1`). Tables have room for every flow of the trace. Traces have a fifth of
/// their flows on IPv6, but `kv`'s (whose IPv6 server is no VIP of `lb`'s) and `gtp`'s
/// (`sgw` tunnels IPv4 subscribers).
const SETUPS: &[(&str, &str, &str)] = &[
    (
        "conntrack",
        "internet",
        "capacity = 1048576\ndrop_invalid = false",
    ),
    ("firewall", "internet", "connections = 1048576"),
    (
        "nat",
        "internet",
        "external = \"198.18.255.1\"\ncapacity = 1048576",
    ),
    (
        "lb",
        "kv",
        "clients = \"p0\"\nservers = \"p1\"\ncapacity = 1048576\n\
         [[vips]]\naddress = \"198.19.0.100\"\nport = 9000\nproto = \"udp\"\n\
         backends = [{ address = \"198.18.200.1\" }, { address = \"198.18.200.2\" }, \
         { address = \"198.18.200.3\" }, { address = \"198.18.200.4\" }, \
         { address = \"198.18.200.5\" }, { address = \"198.18.200.6\" }, \
         { address = \"198.18.200.7\" }, { address = \"198.18.200.8\" }]",
    ),
    ("kv", "kv", "server = \"198.19.0.100\""),
    ("counter", "internet", "capacity = 1048576"),
    ("hh", "internet", "threshold = 1000"),
    ("superspreader", "internet", "threshold = 100"),
    ("udpflood", "udpflood", "threshold = 10000"),
    ("synflood", "synflood", "threshold = 10000"),
    ("flowlet", "internet", ""),
    (
        "sgw",
        "gtp",
        "address = \"198.19.255.2\"\nue_pool = \"198.18.128.0/17\"",
    ),
];

struct Row {
    program: String,
    workload: String,
    program_rates: Rates,
    forward_mpps: f64,
}

/// Builds program `name` from its settings (TOML text) on ports `p0` and `p1`.
pub(crate) fn factory(name: &str, settings: &str) -> BenchResult<ProgramFactory> {
    let table: toml::Value =
        toml::from_str(settings).map_err(|e| format!("{name}'s settings: {e}"))?;
    stateplane_programs::build(
        name,
        Some(&table),
        &PortNames(vec!["p0".into(), "p1".into()]),
    )
    .map_err(|e| e.to_string())
}

pub fn main(a: BenchCatalogArgs) -> BenchResult<()> {
    let workers = bounded("--workers", a.workers, 1, 64)?;
    let burst_size = bounded("--burst", a.burst, 1, 1024)?;
    let repeat = bounded("--repeat", a.repeat, 1, 101)?;
    let chosen: Vec<&(&str, &str, &str)> = match &a.programs {
        None => SETUPS.iter().collect(),
        Some(list) => list
            .split(',')
            .map(str::trim)
            .map(|p| {
                SETUPS.iter().find(|s| s.0 == p).ok_or_else(|| {
                    let names: Vec<&str> = SETUPS.iter().map(|s| s.0).collect();
                    format!("--programs: '{p}' is not one of {}", names.join(", "))
                })
            })
            .collect::<BenchResult<_>>()?,
    };
    // Settings are checked before any trace is made.
    let factories = chosen
        .iter()
        .map(|(name, _, settings)| factory(name, settings))
        .collect::<BenchResult<Vec<_>>>()?;
    let runtime = replay_runtime(workers, burst_size);
    let how = (a.loops, repeat, true);
    let forward = factory("forward", "map = { p0 = \"p1\", p1 = \"p0\" }")?;
    let mut traces = BTreeMap::new();
    let mut rows = Vec::new();
    for (i, ((name, workload, _), program)) in chosen.iter().zip(&factories).enumerate() {
        if !traces.contains_key(workload) {
            eprintln!("generating {} packets of {workload}", a.packets);
            let ipv6_share = if matches!(*workload, "kv" | "gtp") {
                0.0
            } else {
                0.2
            };
            let (trace, input) =
                generated_trace(workload, a.packets, None, a.packet_size, ipv6_share, a.seed)?;
            let (forward_rates, _) = rates(Some(&forward), &trace, &runtime, how)?;
            traces.insert(*workload, (trace, input, forward_rates.mpps_per_core));
        }
        let (trace, _, forward_mpps) = &traces[workload];
        eprintln!("[{}/{}] {name} on {workload}", i + 1, chosen.len());
        let (r, _) = rates(Some(program), trace, &runtime, how)?;
        rows.push(Row {
            program: name.to_string(),
            workload: workload.to_string(),
            program_rates: r,
            forward_mpps: *forward_mpps,
        });
    }
    println!(
        "workers {workers}, burst {burst_size}, loops {}, repeat {repeat} (median); traces:",
        a.loops
    );
    for (_, input, _) in traces.values() {
        println!("  {input}");
    }
    let mut table = Table::new(
        &["program", "workload"],
        &["Mpps/core", "forward", "ratio", "ns/packet", "forwarded"],
    );
    for r in &rows {
        let p = &r.program_rates;
        table.row(vec![
            r.program.to_string(),
            r.workload.to_string(),
            format!("{:.2}", p.mpps_per_core),
            format!("{:.2}", r.forward_mpps),
            format!("{:.2}", p.mpps_per_core / r.forward_mpps),
            format!("{:.1}", p.ns_per_packet),
            format!(
                "{:.1}%",
                100.0 * p.forwarded as f64 / p.packets.max(1) as f64
            ),
        ]);
    }
    table.print();
    if let Some(path) = &a.files.csv {
        let mut csv = Csv::new(
            "program,workload,packets,workers,mpps_per_core,forward_mpps_per_core,ratio,ns_per_packet,forwarded_share",
        );
        for r in &rows {
            let p = &r.program_rates;
            csv.row(format_args!(
                "{},{},{},{},{:.3},{:.3},{:.3},{:.2},{:.4}",
                r.program,
                r.workload,
                p.packets,
                workers,
                p.mpps_per_core,
                r.forward_mpps,
                p.mpps_per_core / r.forward_mpps,
                p.ns_per_packet,
                p.forwarded as f64 / p.packets.max(1) as f64
            ));
        }
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let mut bars = Vec::new();
        for r in &rows {
            bars.push((r.program.clone(), r.program_rates.mpps_per_core));
            bars.push((format!("forward ({})", r.workload), r.forward_mpps));
        }
        let panel = crate::chart::Panel {
            title: "Mpps per core, each program beside forward on its trace".into(),
            unit: "Mpps".into(),
            bars,
        };
        let title =
            format!("The catalog: {workers} worker(s), burst {burst_size}, median of {repeat}");
        let subtitle = format!("{} packets per trace, {} bytes", a.packets, a.packet_size);
        a.files.write_chart(&title, &subtitle, &[panel])?;
    }
    Ok(())
}
