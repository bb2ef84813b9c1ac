//! `stateplane`: the command line, as a library so that a binary of your own can add
//! programs and keep every command (`run`, `lab`, `ctl`, the benchmarks): register them
//! with `stateplane_programs::register`, then call [`main`] (see examples/tollbooth and
//! docs/program-api.md).
//!
//! Owns: argument parsing (errors name the flag and the fix), progress display, and
//! printing. A run is built by `stateplane-switch`, an experiment is run by
//! `stateplane-bench`; this crate only parses, calls and prints.
//!
//! Must never: process packets or assemble a switch itself.

mod collector_cmd;
mod ctl;
mod flags;
mod flows_cmd;
mod gen_cmd;
mod lab_cmd;
mod logging;
mod progress;
mod relay_cmd;
mod report_cmd;
mod run_cmd;
mod send_cmd;
mod summary_output;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "stateplane",
    version,
    about = "A fast software data plane for stateful network functions"
)]
struct Cli {
    /// Log level: error, warn, info, debug or trace (default: STATEPLANE_LOG, else info).
    #[arg(long, global = true)]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program over ports (capture files or live interfaces), from flags or a TOML config.
    Run(run_cmd::RunArgs),
    /// Flow records (IPFIX, CSV, JSON) from capture files or interfaces, unsampled.
    Flows(flows_cmd::FlowsArgs),
    /// Generate a trace deterministically from a seed.
    Gen(gen_cmd::GenArgs),
    /// Measure packets per second per core on an in-memory replay.
    Bench(stateplane_bench::bench::BenchArgs),
    /// The add-on-miss insertion-latency experiment (phase 1 inserts, phase 2 mixes).
    BenchAddOnMiss(stateplane_bench::bench_addonmiss::AddOnMissArgs),
    /// Mpps per core of each program of the catalog on its workload, beside forward.
    BenchCatalog(stateplane_bench::bench_catalog::BenchCatalogArgs),
    /// Legitimate connections through conntrack, nat and lb under a flood at many times
    /// their table, with early drop on and off: the share of their packets served.
    BenchFlood(stateplane_bench::bench_flood::BenchFloodArgs),
    /// How long a reload holds a worker while nat's new instance takes the old one's
    /// translations: whole at the same capacity, one by one into another.
    BenchReload(stateplane_bench::bench_reload::BenchReloadArgs),
    /// What lb's backend changes at run time move: new connections remapped against the
    /// least any scheme must and a modulo hash, and every open connection kept.
    BenchLb(stateplane_bench::bench_lb::BenchLbArgs),
    /// The microflow cache's hit rate against its size and ways on generated traces.
    BenchCache(stateplane_bench::bench_cache::BenchCacheArgs),
    /// TurboFlow's eviction model (Equations 1 and 2, Table 5) beside the microflow table
    /// measured on the model's workload.
    BenchFlowModel(stateplane_bench::bench_flow_model::BenchFlowModelArgs),
    /// State sync's rate experiment on the sync cores in virtual time: updates sent and
    /// lost, and the collector's divergence, for fixed thresholds and the rate controller.
    BenchSyncRate(stateplane_bench::bench_sync::BenchSyncRateArgs),
    /// State sync's write experiment on the sync cores in virtual time: how long a write
    /// takes through a lossy channel, and the parts it sent again.
    BenchSyncWrite(stateplane_bench::bench_sync::BenchSyncWriteArgs),
    /// What tracking synced state costs a register's update, against a plain array and a
    /// register not tracked.
    BenchSyncTrack(stateplane_bench::bench_sync::BenchSyncTrackArgs),
    /// What syncing a program's state (hh's sketch, counter's flow table) to a collector
    /// costs its forwarding, against sync off, in one run, with the copy checked against
    /// the packets counted.
    BenchSyncCost(stateplane_bench::bench_sync::BenchSyncCostArgs),
    /// How long reading N values of a switch's sketch takes from the collector's copy and
    /// by polling the switch's control API.
    BenchSyncRead(stateplane_bench::bench_sync::BenchSyncReadArgs),
    /// How long moving a sketch from one switch into another through the collector takes,
    /// 256 to 65,536 values, with the target's sync channel losing 0 to 80% each way, on
    /// real sockets, every move checked.
    BenchSyncMigrate(stateplane_bench::bench_sync_migrate::BenchSyncMigrateArgs),
    /// Heavy hitters found from a collector's copy of a sketch, with the rate controller's
    /// threshold and by mirroring every change, against the data plane's own sketch and
    /// the exact counts, in virtual time, Lemma 1's bound checked at every sample.
    BenchSyncHh(stateplane_bench::bench_sync_hh::BenchSyncHhArgs),
    /// What becomes of the updates a sketch takes while a reset is on its way (overwritten,
    /// held back and replayed as the paper does, or kept), and the heavy hitters found, in
    /// virtual time over a lossy channel, every increment accounted for.
    BenchSyncReorder(stateplane_bench::bench_sync_reorder::BenchSyncReorderArgs),
    /// counter's packets a second unreplicated and replicated to the memory store and to a
    /// real Redis, in one run, beside the store's own rate, every run's counts checked.
    BenchReplication(stateplane_bench::bench_replication::BenchReplicationArgs),
    /// The replication store's sequenced write a second, one flow per call, by calls per
    /// round trip, for the memory store and a real Redis on loopback, every write checked.
    BenchReplicationStore(stateplane_bench::bench_replication_store::BenchReplicationStoreArgs),
    /// hh's packets a second and staleness with its sketches replicated in bounded mode
    /// (periodic snapshots) to the memory store and a real Redis, by snapshot period,
    /// beside unreplicated; every Redis run's last snapshots checked to hold every packet.
    BenchSnapshots(stateplane_bench::bench_snapshots::BenchSnapshotsArgs),
    /// The flow stage's experiments: microflow records per packet against table memory,
    /// the aggregator with each optimization on in turn, two levels against one.
    BenchFlows(stateplane_bench::bench_flows::BenchFlowsArgs),
    /// The rule pipeline's Mpps with and without its cache, under rule updates, by tables.
    BenchPipeline(stateplane_bench::bench_pipeline::BenchPipelineArgs),
    /// Operations per second per core on the state primitives (exact tables).
    BenchTables(stateplane_bench::bench_tables::BenchTablesArgs),
    /// Hosts and switches in network namespaces on this machine: up, down, status, exec.
    Lab(lab_cmd::LabArgs),
    /// Send a capture's frames on an interface at full speed (a traffic source).
    Send(send_cmd::SendArgs),
    /// Take switches' synced state (their `[sync]` messages) into a copy with a bound per
    /// location.
    Collector(collector_cmd::CollectorArgs),
    /// Relay UDP datagrams both ways, losing, duplicating and delaying them at given
    /// rates (fault injection on the sync channel).
    Relay(relay_cmd::RelayArgs),
    /// Talk to a running switch's control API: tables, registers, notifications, counters.
    Ctl(ctl::CtlArgs),
    /// Draw a CSV (a panel per first column, a bar per row, the value last) as an SVG or
    /// PNG bar chart.
    Chart(stateplane_bench::draw::ChartArgs),
    /// One HTML page of a folder's results (the demo's out/): run summaries, CSV tables and
    /// charts, checked by the page itself as it loads.
    Report(report_cmd::ReportArgs),
    /// Print the version.
    Version,
}

/// Runs the command line: parses the arguments, runs the command, and says how it went.
pub fn main() -> ExitCode {
    stateplane_io::end_quietly_when_stdout_closes();
    let cli = Cli::parse();
    if let Err(e) = logging::init(cli.log_level.as_deref()) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Run(args) => run_cmd::main(args),
        Command::Flows(args) => flows_cmd::main(args),
        Command::Gen(args) => gen_cmd::main(args),
        Command::Bench(args) => stateplane_bench::bench::main(args),
        Command::Lab(args) => lab_cmd::main(args),
        Command::BenchTables(args) => stateplane_bench::bench_tables::main(args),
        Command::BenchCache(args) => stateplane_bench::bench_cache::main(args),
        Command::BenchCatalog(args) => stateplane_bench::bench_catalog::main(args),
        Command::BenchFlood(args) => stateplane_bench::bench_flood::main(args),
        Command::BenchReload(args) => stateplane_bench::bench_reload::main(args),
        Command::BenchLb(args) => stateplane_bench::bench_lb::main(args),
        Command::BenchFlows(args) => stateplane_bench::bench_flows::main(args),
        Command::BenchFlowModel(args) => stateplane_bench::bench_flow_model::main(args),
        Command::BenchSyncRate(args) => stateplane_bench::bench_sync::main(args),
        Command::BenchSyncWrite(args) => stateplane_bench::bench_sync::main_write(args),
        Command::BenchSyncTrack(args) => stateplane_bench::bench_sync::main_track(args),
        Command::BenchSyncCost(args) => stateplane_bench::bench_sync::main_cost(args),
        Command::BenchSyncRead(args) => stateplane_bench::bench_sync::main_read(args),
        Command::BenchSyncMigrate(args) => stateplane_bench::bench_sync_migrate::main_migrate(args),
        Command::BenchSyncHh(args) => stateplane_bench::bench_sync_hh::main_hh(args),
        Command::BenchReplication(args) => stateplane_bench::bench_replication::main(args),
        Command::BenchReplicationStore(args) => {
            stateplane_bench::bench_replication_store::main(args)
        }
        Command::BenchSnapshots(args) => stateplane_bench::bench_snapshots::main(args),
        Command::BenchSyncReorder(args) => stateplane_bench::bench_sync_reorder::main_reorder(args),
        Command::BenchPipeline(args) => stateplane_bench::bench_pipeline::main(args),
        Command::BenchAddOnMiss(args) => stateplane_bench::bench_addonmiss::main(args),
        Command::Send(args) => send_cmd::main(args),
        Command::Ctl(args) => ctl::main(args),
        Command::Collector(args) => collector_cmd::main(args),
        Command::Relay(args) => relay_cmd::main(args),
        Command::Chart(args) => stateplane_bench::draw::main(args),
        Command::Report(args) => report_cmd::main(args),
        Command::Version => {
            println!("stateplane {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

pub use summary_output::CliResult;

#[cfg(test)]
mod tests {
    use clap::Parser;

    /// Command lines that share names across levels parse: a global flag and a
    /// subcommand's argument with one id would otherwise panic in the parse itself.
    #[test]
    fn command_lines_with_shared_names_parse() {
        for line in [
            "stateplane ctl read macs vlan=0 mac=02:00:00:00:00:01",
            "stateplane ctl delete macs vlan=0 mac=02:00:00:00:00:01",
            "stateplane ctl --server https://127.0.0.1:9559 --ca ca.pem --cert c.pem --key c.key --token-file t describe",
            "stateplane ctl read macs --key c.key --ca ca.pem vlan=0",
            "stateplane run forward -I a -I b --control 127.0.0.1:9559 --control-key k --control-cert c --control-token-file t",
        ] {
            let args = line.split_whitespace();
            if let Err(e) = super::Cli::try_parse_from(args) {
                panic!("{line}: {e}");
            }
        }
    }

    /// Every command, argument and flag at every level says in a line what it is for.
    #[test]
    fn every_command_and_argument_has_a_line_of_help() {
        fn undocumented(command: &clap::Command, path: &str, out: &mut Vec<String>) {
            let path = format!("{path} {}", command.get_name());
            for arg in command.get_arguments() {
                let builtin = ["help", "version"].contains(&arg.get_id().as_str());
                if !builtin && arg.get_help().is_none() {
                    out.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    out.push(format!("{path} {}", sub.get_name()));
                }
                undocumented(sub, &path, out);
            }
        }
        let mut missing = Vec::new();
        undocumented(
            &<super::Cli as clap::CommandFactory>::command(),
            "",
            &mut missing,
        );
        assert!(missing.is_empty(), "no help for:\n{}", missing.join("\n"));
    }
}
