//! `stateplane bench-snapshots`: bounded replication's cost and staleness against the
//! snapshot period (RedPlane's figure 11, in software). `hh` counts a generated trace
//! (the internet workload, tenants on VLANs) unreplicated, and with its sketches
//! replicated in bounded mode to the memory store and to a real redis-server on loopback
//! at each period, the runs of each repeat alternated; medians.
//!
//! The run checks its work before it prints: every replicated run forwards what the
//! unreplicated one forwards and writes snapshots; after each Redis run, the last image of
//! every worker in Redis holds every packet of the trace (each tenant's sketch's rows sum
//! to the packets it counted, and the sketches to the trace's).

use crate::BenchResult;
use crate::results::{Csv, ResultFiles, Table};
use crate::statistics::median;
use stateplane_gen::{GenConfig, Workload};
use stateplane_replication::snapshot::read_image;
use stateplane_runtime::Counter;
use stateplane_switch::assemble::Switch;
use stateplane_switch::units::bounded;
use std::path::Path;

#[derive(clap::Args)]
pub struct BenchSnapshotsArgs {
    /// Packets in the generated trace (internet workload).
    #[arg(long, default_value_t = 2_000_000)]
    pub packets: u64,
    /// Flows in it.
    #[arg(long, default_value_t = 20_000)]
    pub flows: u64,
    /// Tenants: the flows are tagged with VLANs 1 to this, each counted in its own sketch.
    #[arg(long, default_value_t = 8)]
    pub vlans: u16,
    /// Comma-separated snapshot periods, in milliseconds.
    #[arg(long, default_value = "1,10,100")]
    pub periods: String,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Repeat each measurement and report the median.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

/// `hh`'s sketches as its default configuration has them: per worker, 65 sketches (64
/// tenants and the shared one) of 4 rows of 4,096 counters.
const SKETCHES: usize = 65;
const DEPTH: usize = 4;
const WIDTH: usize = 4096;
/// The words `hh` keeps beside them (the interval, tenants, touched, each VLAN's sketch).
const ASIDE_WORDS: u32 = 2 + SKETCHES as u32 + 4096;

/// A snapshot in Redis: its (switch, worker), and each of its sketches' row sums.
pub type StoredSketches = ((u32, u32), Vec<Vec<u64>>);

/// Each snapshot in the store under `url` (Redis), by (switch, worker): each sketch's row
/// sums (the rows of a count-min sketch each sum to the packets it counted).
pub fn stored_sketch_rows(url: &str) -> BenchResult<Vec<StoredSketches>> {
    let mut conn = crate::redis_connection(url)?;
    // "snapshot/" in hex: the start of every snapshot's key.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("stateplane:rep:{736e617073686f742f*")
        .query(&mut conn)
        .map_err(|e| e.to_string())?;
    let mut found = Vec::new();
    for k in keys {
        let hex = k
            .trim_start_matches("stateplane:rep:{")
            .trim_end_matches('}');
        let word = |at: usize| {
            hex.get(at..at + 8)
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("{k}: not a snapshot's key"))
        };
        let at = (word(18)?, word(26)?);
        let image: Vec<u8> = redis::cmd("HGET")
            .arg(&k)
            .arg("v")
            .query(&mut conn)
            .map_err(|e| e.to_string())?;
        if image.is_empty() {
            // Leased, no snapshot written yet.
            continue;
        }
        let mut rows = vec![vec![0u64; DEPTH]; SKETCHES];
        read_image(
            &image,
            |id| match id {
                0 => Some((SKETCHES * DEPTH * WIDTH) as u32),
                u16::MAX => Some(ASIDE_WORDS),
                _ => None,
            },
            |id, first, words| {
                if id == 0 {
                    for (i, w) in words.iter().enumerate() {
                        let cell = first as usize + i;
                        rows[cell / (DEPTH * WIDTH)][cell / WIDTH % DEPTH] += w;
                    }
                }
            },
        )
        .map_err(|e| format!("{k}: {e}"))?;
        found.push((at, rows));
    }
    found.sort();
    Ok(found)
}

/// The packets the snapshots of switch `switch` counted, each sketch's rows checked to
/// agree.
pub fn stored_packets(stored: &[StoredSketches], switch: u32) -> BenchResult<u64> {
    let mut sum = 0;
    for (at, rows) in stored.iter().filter(|(at, _)| at.0 == switch) {
        for (k, sketch) in rows.iter().enumerate() {
            if sketch.iter().any(|&r| r != sketch[0]) {
                return Err(format!(
                    "worker {}'s sketch {k}: rows sum to {sketch:?}, not one count",
                    at.1
                ));
            }
            sum += sketch[0];
        }
    }
    Ok(sum)
}

struct Row {
    store: &'static str,
    period_ms: u64,
    pps: f64,
    snapshots: u64,
    bytes: u64,
    wall_s: f64,
    staleness_ms: f64,
}

/// One run: packets a second, and the replication report if any.
fn run(text: &str, packets: u64) -> BenchResult<(f64, u64, Option<Row>)> {
    let outcome = Switch::from_toml(text, Path::new("."))?.run()?;
    let total = &outcome.report.total;
    let rx = total.get(Counter::RxPackets);
    if rx != packets {
        return Err(format!(
            "a run read {rx} packets, the trace having {packets}"
        ));
    }
    let wall = outcome.report.wall.as_secs_f64();
    let row = outcome.replication.map(|r| Row {
        store: "",
        period_ms: 0,
        pps: 0.0,
        snapshots: r.snapshots,
        bytes: r.snapshot_bytes,
        wall_s: wall,
        staleness_ms: r.staleness_most_ms,
    });
    Ok((packets as f64 / wall, total.get(Counter::TxPackets), row))
}

pub fn main(a: BenchSnapshotsArgs) -> BenchResult<()> {
    let repeat = bounded("--repeat", a.repeat, 1, 101)?;
    let workers = bounded("--workers", a.workers, 1, 64)?;
    let vlans = bounded("--vlans", usize::from(a.vlans), 0, 64)? as u16;
    let periods = (a.periods.split(','))
        .map(|p| {
            p.trim()
                .parse::<u64>()
                .ok()
                .filter(|p| (1..=60_000).contains(p))
                .ok_or_else(|| format!("--periods: '{p}' is not a period from 1 to 60000 ms"))
        })
        .collect::<BenchResult<Vec<_>>>()?;
    let scratch = crate::Scratch::new("bench-snapshots")?;
    let trace = scratch.path().join("trace.pcap");
    let mut cfg = GenConfig::new(Workload::Internet, a.packets);
    (cfg.seed, cfg.flows, cfg.vlans) = (a.seed, Some(a.flows), vlans);
    let (packets, flows) = crate::bench_replication::write_trace(&cfg, &trace)?;
    let port = stateplane_lab::free_loopback_port()?;
    let server = stateplane_lab::RedisServer::start(port, false)?;
    eprintln!(
        "hh: {packets} packets over {flows} flows on {vlans} VLANs (internet, seed {}); \
         {workers} worker(s); periods {periods:?} ms, median of {repeat}; redis-server on {}",
        a.seed,
        server.url()
    );
    let base = format!(
        "workers = {workers}\n[program]\nname = \"hh\"\n[program.hh]\ninterval_ms = 3600000\n\
         map = {{ p0 = \"p1\" }}\n[[port]]\nname = \"p0\"\nrx = \"{}\"\n[[port]]\nname = \"p1\"\n",
        trace.display()
    );
    let replicated = |store: &str, period: u64| {
        format!(
            "{base}[guarantees]\nsketch = [\"replicated\"]\n[replication]\nmode = \"bounded\"\n\
             store = \"{store}\"\nsnapshot_ms = {period}\nstaleness_ms = {}\n",
            (period * 10).max(1000)
        )
    };
    let mut configs = vec![("unreplicated", 0, base.clone())];
    for &period in &periods {
        configs.push(("memory", period, replicated("memory", period)));
        configs.push(("redis", period, replicated(&server.url(), period)));
    }
    let mut runs: Vec<Vec<(f64, Option<Row>)>> = (0..configs.len()).map(|_| Vec::new()).collect();
    let mut forwarded = None;
    for round in 0..repeat {
        for (i, (store, period, text)) in configs.iter().enumerate() {
            if *store == "redis" {
                server.cli(&["flushall"]);
            }
            let (pps, tx, row) = run(text, packets)?;
            let expected = *forwarded.get_or_insert(tx);
            if tx != expected {
                return Err(format!(
                    "{store} at {period} ms forwarded {tx} packets, unreplicated {expected}"
                ));
            }
            if let Some(r) = &row
                && r.snapshots == 0
            {
                return Err(format!("{store} at {period} ms wrote no snapshot"));
            }
            if *store == "redis" {
                let stored = stored_packets(&stored_sketch_rows(&server.url())?, 1)?;
                if stored != packets {
                    return Err(format!(
                        "Redis's last snapshots hold {stored} packets counted, not {packets}"
                    ));
                }
            }
            eprintln!(
                "  round {}/{repeat}: {store}{}: {pps:.0} packets/s",
                round + 1,
                if *period > 0 {
                    format!(" every {period} ms")
                } else {
                    String::new()
                }
            );
            runs[i].push((pps, row));
        }
    }
    drop(scratch);

    let mut rows = Vec::new();
    for ((store, period, _), ran) in configs.iter().zip(runs) {
        let pps = median(ran.iter().map(|r| r.0).collect());
        let of =
            |f: fn(&Row) -> f64| median(ran.iter().filter_map(|r| r.1.as_ref().map(f)).collect());
        rows.push(Row {
            store,
            period_ms: *period,
            pps,
            snapshots: of(|r| r.snapshots as f64) as u64,
            bytes: of(|r| r.bytes as f64) as u64,
            wall_s: of(|r| r.wall_s),
            staleness_ms: of(|r| r.staleness_ms),
        });
    }
    let base_pps = rows[0].pps;
    let mut table = Table::new(
        &["store", "period ms"],
        &[
            "packets/s",
            "vs unreplicated",
            "snapshots",
            "KB a snapshot",
            "MB/s to the store",
            "staleness max ms",
        ],
    );
    let mut csv = Csv::new(
        "store,period_ms,packets_per_s,vs_unreplicated,snapshots,bytes_per_snapshot,store_mb_per_s,staleness_max_ms",
    );
    for r in &rows {
        let replicated = r.store != "unreplicated";
        let per = r.bytes as f64 / r.snapshots.max(1) as f64;
        let rate = r.bytes as f64 / r.wall_s.max(1e-9) / 1e6;
        let cells = |v: String| if replicated { v } else { "-".into() };
        table.row(vec![
            r.store.into(),
            cells(r.period_ms.to_string()),
            format!("{:.0}", r.pps),
            format!("{:.3}", r.pps / base_pps),
            cells(r.snapshots.to_string()),
            cells(format!("{:.1}", per / 1e3)),
            cells(format!("{rate:.2}")),
            cells(format!("{:.1}", r.staleness_ms)),
        ]);
        csv.row(format_args!(
            "{},{},{:.0},{:.4},{},{per:.0},{rate:.3},{:.3}",
            r.store,
            r.period_ms,
            r.pps,
            r.pps / base_pps,
            r.snapshots,
            r.staleness_ms
        ));
    }
    table.print();
    if let Some(path) = &a.files.csv {
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let label = |r: &Row| match r.store {
            "unreplicated" => "unreplicated".to_string(),
            s => format!("{s}, every {} ms", r.period_ms),
        };
        let speed = crate::chart::Panel {
            title: "Packets a second".into(),
            unit: "packets/s".into(),
            bars: rows.iter().map(|r| (label(r), r.pps)).collect(),
        };
        let staleness = crate::chart::Panel {
            title: "Staleness at most (the age of the store's snapshot)".into(),
            unit: "ms".into(),
            bars: (rows.iter().skip(1))
                .map(|r| (label(r), r.staleness_ms))
                .collect(),
        };
        let subtitle = format!(
            "hh, {packets} packets over {flows} flows on {vlans} VLANs; {workers} worker(s); \
             median of {repeat}"
        );
        a.files.write_chart(
            "Bounded replication: cost and staleness by snapshot period",
            &subtitle,
            &[speed, staleness],
        )?;
    }
    Ok(())
}
