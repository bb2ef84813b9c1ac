//! `stateplane bench-replication`: `counter` (every packet writes its flow: replication's
//! worst case) over a generated capture, unreplicated and with its `flows` replicated
//! linearizably to the memory store and to a real redis-server on loopback, in one run, at
//! each burst size; beside it, the same run's measure of the store's sequenced write one
//! flow per call, so that the replicated rate reads as a multiple of the store's.
//!
//! The run checks its work before it prints: every replicated run forwards as many packets
//! as the unreplicated one, drops none, and Redis holds, summed over its flows, every
//! packet counted.

use crate::BenchResult;
use crate::results::{Csv, ResultFiles, Table};
use crate::statistics::median;
use stateplane_gen::{GenConfig, Workload, generate};
use stateplane_io::capture::CaptureWriter;
use stateplane_runtime::Counter;
use stateplane_switch::assemble::Switch;
use stateplane_switch::units::bounded;
use std::path::Path;

#[derive(clap::Args)]
pub struct BenchReplicationArgs {
    /// Packets in the generated trace (internet workload).
    #[arg(long, default_value_t = 100_000)]
    pub packets: u64,
    /// Flows in it.
    #[arg(long, default_value_t = 1_000)]
    pub flows: u64,
    /// Comma-separated burst sizes.
    #[arg(long, default_value = "64,256")]
    pub bursts: String,
    /// Repeat each measurement and report the median.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

struct Row {
    mode: &'static str,
    burst: usize,
    pps: f64,
    writes: u64,
    folded: u64,
    round_trips: u64,
}

/// Runs `counter` over `trace` with `extra` configuration; packets a second, and the
/// replication report's writes, folded changes and round trips.
fn run_counter(
    trace: &Path,
    burst: usize,
    extra: &str,
    packets: u64,
) -> BenchResult<(f64, u64, u64, u64)> {
    let text = format!(
        "burst = {burst}\n[program]\nname = \"counter\"\n[program.counter]\nmap = {{ p0 = \"p1\" }}\n\
         capacity = 1048576\n[[port]]\nname = \"p0\"\nrx = \"{}\"\n[[port]]\nname = \"p1\"\n{extra}",
        trace.display()
    );
    let outcome = Switch::from_toml(&text, Path::new("."))?.run()?;
    let total = &outcome.report.total;
    let (rx, tx) = (total.get(Counter::RxPackets), total.get(Counter::TxPackets));
    if rx != packets || tx != packets {
        return Err(format!(
            "a run of counter ({}) forwarded {tx} of {rx} packets received, the trace having {packets}",
            if extra.is_empty() {
                "unreplicated"
            } else {
                extra.lines().last().unwrap_or("")
            }
        ));
    }
    let r = outcome.replication.as_ref();
    if let Some(r) = r
        && r.dropped > 0
    {
        return Err(format!("{} packets dropped as unreplicated", r.dropped));
    }
    Ok((
        packets as f64 / outcome.report.wall.as_secs_f64(),
        r.map_or(0, |r| r.writes),
        r.map_or(0, |r| r.coalesced),
        r.map_or(0, |r| r.round_trips),
    ))
}

/// Packets counted over every flow's record in Redis.
fn counted_in_redis(url: &str) -> BenchResult<u64> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client.get_connection().map_err(|e| e.to_string())?;
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("stateplane:rep:*")
        .query(&mut conn)
        .map_err(|e| e.to_string())?;
    let mut packets = 0;
    for key in keys {
        let v: Vec<u8> = redis::cmd("HGET")
            .arg(&key)
            .arg("v")
            .query(&mut conn)
            .map_err(|e| e.to_string())?;
        let word = v
            .get(1..9)
            .ok_or("a record of another shape than counter's")?;
        let mut b = [0; 8];
        b.copy_from_slice(word);
        packets += u64::from_le_bytes(b);
    }
    Ok(packets)
}

pub fn main(a: BenchReplicationArgs) -> BenchResult<()> {
    let repeat = bounded("--repeat", a.repeat, 1, 101)?;
    let bursts = (a.bursts.split(','))
        .map(|b| {
            b.trim()
                .parse::<usize>()
                .ok()
                .filter(|b| (1..=1024).contains(b))
                .ok_or_else(|| format!("--bursts: '{b}' is not a burst size from 1 to 1024"))
        })
        .collect::<BenchResult<Vec<_>>>()?;
    let dir = std::env::temp_dir().join(format!(
        "stateplane-bench-replication-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let trace = dir.join("trace.pcap");
    let mut cfg = GenConfig::new(Workload::Internet, a.packets);
    (cfg.seed, cfg.flows) = (a.seed, Some(a.flows));
    let mut writer = CaptureWriter::create(&trace).map_err(|e| e.to_string())?;
    let summary = generate(&cfg, |ts, f| writer.write(ts, f, f.len() as u32), |_| {})
        .map_err(|e| e.to_string())?;
    writer.flush().map_err(|e| e.to_string())?;
    let packets = summary.packets;
    let port = stateplane_lab::free_loopback_port()?;
    let server = stateplane_lab::RedisServer::start(port, false)?;
    let replicated = "[guarantees]\nflows = [\"replicated\"]\n";
    let redis = format!("{replicated}[replication]\nstore = \"{}\"\n", server.url());
    eprintln!(
        "{packets} packets over {} flows (internet, seed {}), bursts {bursts:?}, median of {repeat}; \
         redis-server on {}",
        summary.flows,
        a.seed,
        server.url()
    );
    let store_rate = crate::bench_replication_store::one_flow_per_call(&server.url())?;
    let mut rows = Vec::new();
    for &burst in &bursts {
        for (mode, extra) in [
            ("unreplicated", ""),
            ("memory", replicated),
            ("redis", redis.as_str()),
        ] {
            let mut rates = Vec::new();
            let mut last = (0, 0, 0);
            for _ in 0..repeat {
                if mode == "redis" {
                    server.cli(&["flushall"]);
                }
                let (pps, writes, folded, trips) = run_counter(&trace, burst, extra, packets)?;
                if mode == "redis" {
                    let counted = counted_in_redis(&server.url())?;
                    if counted != packets {
                        return Err(format!(
                            "Redis holds {counted} packets counted, not {packets}"
                        ));
                    }
                }
                rates.push(pps);
                last = (writes, folded, trips);
            }
            let pps = median(rates);
            eprintln!("  burst {burst}, {mode}: {pps:.0} packets/s");
            rows.push(Row {
                mode,
                burst,
                pps,
                writes: last.0,
                folded: last.1,
                round_trips: last.2,
            });
        }
    }
    let _ = std::fs::remove_dir_all(&dir);

    let mut table = Table::new(
        &["mode", "burst"],
        &[
            "packets/s",
            "vs unreplicated",
            "x store rate",
            "writes",
            "folded",
            "round trips",
        ],
    );
    let mut csv =
        Csv::new("mode,burst,packets_per_s,vs_unreplicated,x_store_rate,writes,folded,round_trips");
    for r in &rows {
        let base = (rows.iter())
            .find(|b| b.burst == r.burst && b.mode == "unreplicated")
            .map_or(f64::NAN, |b| b.pps);
        let (ratio, x_store) = (r.pps / base, r.pps / store_rate);
        table.row(vec![
            r.mode.into(),
            r.burst.to_string(),
            format!("{:.0}", r.pps),
            format!("{ratio:.3}"),
            format!("{x_store:.2}"),
            r.writes.to_string(),
            r.folded.to_string(),
            r.round_trips.to_string(),
        ]);
        csv.row(format_args!(
            "{},{},{:.0},{ratio:.4},{x_store:.3},{},{},{}",
            r.mode, r.burst, r.pps, r.writes, r.folded, r.round_trips
        ));
    }
    table.print();
    println!(
        "the store's sequenced write, one flow per call, pipelined (256 a round trip): {store_rate:.0}/s"
    );
    if let Some(path) = &a.files.csv {
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let panel = crate::chart::Panel {
            title: "counter's packets a second, unreplicated and replicated linearizably".into(),
            unit: "packets/s".into(),
            bars: rows
                .iter()
                .map(|r| (format!("{}, burst {}", r.mode, r.burst), r.pps))
                .chain([("Redis: one-flow writes/s".to_string(), store_rate)])
                .collect(),
        };
        let title = "Replication's cost on counter (every packet writes)";
        let subtitle = format!(
            "{packets} packets, {} flows, median of {repeat}",
            summary.flows
        );
        a.files.write_chart(title, &subtitle, &[panel])?;
    }
    Ok(())
}
