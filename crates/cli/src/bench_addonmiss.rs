//! `stateplane bench-add-on-miss`: the insertion-latency experiment of the add-on-miss
//! slides (seed 003), on Stateplane's exact table.
//!
//! Phase 1 sends 2^20 packets that each carry a new key: the lookup misses and the
//! table's default action adds the entry (add-on-miss). Phase 2 sends about 4 million
//! packets that look up keys inserted before (in a pseudo-random cycle), while every N-th
//! packet carries a new key and inserts it, for several N. Reported per phase and N: the
//! per-packet latency of lookups, insertions and both mixed (p50, p99, p99.9, in ns), and
//! packets per second measured in a separate pass without per-packet timing.
//!
//! Latency here is the table's share of a packet's time, timed with the monotonic clock
//! around each packet's table work, minus the clock's own cost (measured first); the
//! slides timed whole packets on the wire with hardware timestamps. The digest baseline
//! (a miss goes to the control plane, which inserts) needs the control API and is not
//! measured yet.

use crate::CliResult;
use stateplane_state::{ExactTable, ExpireProfile};
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct AddOnMissArgs {
    /// Keys inserted in phase 1 (the slides: 2^20).
    #[arg(long, default_value_t = 1 << 20)]
    pub keys: usize,
    /// Packets in phase 2 (the slides: about 4 million).
    #[arg(long, default_value_t = 4_000_000)]
    pub packets: usize,
    /// Insert a new key every N-th packet of phase 2; comma-separated values of N.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000,10000")]
    pub every: Vec<usize>,
    #[arg(long)]
    pub csv: Option<PathBuf>,
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// Keys as the slides' packets carry them: 64-bit values, pseudo-random but distinct.
fn key(i: u64) -> u64 {
    // An odd multiplier is a bijection on u64: distinct i give distinct keys.
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1_e995
}

struct Percentiles {
    p50: f64,
    p99: f64,
    p999: f64,
    count: usize,
}

fn percentiles(v: &mut [u32]) -> Percentiles {
    v.sort_unstable();
    let at = |q: f64| {
        if v.is_empty() {
            0.0
        } else {
            f64::from(v[((v.len() - 1) as f64 * q) as usize])
        }
    };
    Percentiles {
        p50: at(0.5),
        p99: at(0.99),
        p999: at(0.999),
        count: v.len(),
    }
}

/// The clock's own cost per reading pair, to subtract (median of many).
fn clock_cost_ns() -> u32 {
    let mut v: Vec<u32> = (0..100_000)
        .map(|_| {
            let t = Instant::now();
            t.elapsed().as_nanos() as u32
        })
        .collect();
    v.sort_unstable();
    v[v.len() / 2]
}

struct Row {
    phase: String,
    kind: &'static str,
    p: Percentiles,
    mpps: f64,
}

pub fn main(a: AddOnMissArgs) -> CliResult<()> {
    if a.keys == 0 || a.keys > 1 << 26 || a.packets == 0 || a.every.contains(&0) {
        return Err("--keys must be 1 to 67108864, --packets above 0, and every N above 0".into());
    }
    let clock = clock_cost_ns();
    let profiles = [ExpireProfile::NEVER];
    let most_inserts = a.packets / a.every.iter().copied().min().unwrap_or(1) + 1;
    let capacity = a.keys + most_inserts;
    let mut rows = Vec::new();
    eprintln!("clock cost {clock} ns per reading, subtracted; table capacity {capacity}");

    // Phase 1: every packet misses and inserts.
    let mut table: ExactTable<u64, u64> = ExactTable::new(capacity, &profiles, 7);
    let mut lat = Vec::with_capacity(a.keys);
    for i in 0..a.keys as u64 {
        let k = key(i);
        let t = Instant::now();
        if table.lookup(&k).is_none() {
            black_box(table.add_entry(k, i, 0, 0).is_ok());
        }
        lat.push((t.elapsed().as_nanos() as u32).saturating_sub(clock));
    }
    let mut untimed: ExactTable<u64, u64> = ExactTable::new(capacity, &profiles, 7);
    let t = Instant::now();
    for i in 0..a.keys as u64 {
        let k = key(i);
        if untimed.lookup(&k).is_none() {
            black_box(untimed.add_entry(k, i, 0, 0).is_ok());
        }
    }
    let mpps = a.keys as f64 / t.elapsed().as_secs_f64() / 1e6;
    drop(untimed);
    rows.push(Row {
        phase: "phase 1".into(),
        kind: "insert",
        p: percentiles(&mut lat),
        mpps,
    });

    // Phase 2, for each N, on a copy of the phase-1 table.
    for &n in &a.every {
        eprint!("\rphase 2, every {n}th packet inserts   ");
        let run = |timed: bool| -> (ExactTable<u64, u64>, Vec<u32>, Vec<u32>, f64) {
            let mut t2 = table.clone();
            let (mut lookups, mut inserts) = (Vec::new(), Vec::new());
            let mut next_new = a.keys as u64;
            // A pseudo-random cycle over the inserted keys (an odd stride mod a power of 2).
            let span = (a.keys as u64).next_power_of_two();
            let mut j = 0u64;
            let start = Instant::now();
            for p in 1..=a.packets {
                let insert = p % n == 0;
                let k = if insert {
                    next_new += 1;
                    key(next_new - 1)
                } else {
                    loop {
                        j = (j + 0x9e37_79b9) & (span - 1);
                        if j < a.keys as u64 {
                            break key(j);
                        }
                    }
                };
                let t = timed.then(Instant::now);
                match t2.lookup(&k) {
                    Some(id) => {
                        black_box(*t2.value(id));
                    }
                    None => {
                        black_box(t2.add_entry(k, p as u64, 0, 0).is_ok());
                    }
                }
                if let Some(t) = t {
                    let ns = (t.elapsed().as_nanos() as u32).saturating_sub(clock);
                    if insert {
                        inserts.push(ns);
                    } else {
                        lookups.push(ns);
                    }
                }
            }
            let secs = start.elapsed().as_secs_f64();
            (t2, lookups, inserts, a.packets as f64 / secs / 1e6)
        };
        let (_, mut lookups, mut inserts, _) = run(true);
        let (_, _, _, mpps) = run(false);
        let mut mixed: Vec<u32> = lookups.iter().chain(&inserts).copied().collect();
        let phase = format!("phase 2, N={n}");
        rows.push(Row {
            phase: phase.clone(),
            kind: "mixed",
            p: percentiles(&mut mixed),
            mpps,
        });
        rows.push(Row {
            phase: phase.clone(),
            kind: "lookup",
            p: percentiles(&mut lookups),
            mpps,
        });
        rows.push(Row {
            phase,
            kind: "insert",
            p: percentiles(&mut inserts),
            mpps,
        });
    }
    eprintln!();
    println!(
        "input: {} keys inserted by add-on-miss, then {} packets of lookups with every N-th inserting; u64 keys and values; latency per packet's table work (clock cost {clock} ns subtracted)",
        a.keys, a.packets
    );
    println!(
        "{:<18} {:<7} {:>10} {:>8} {:>8} {:>9} {:>8}",
        "phase", "packets", "count", "p50 ns", "p99 ns", "p99.9 ns", "Mpps"
    );
    for r in &rows {
        println!(
            "{:<18} {:<7} {:>10} {:>8.0} {:>8.0} {:>9.0} {:>8.2}",
            r.phase, r.kind, r.p.count, r.p.p50, r.p.p99, r.p.p999, r.mpps
        );
    }
    if let Some(path) = &a.csv {
        let mut csv = String::from("phase,packets,count,p50_ns,p99_ns,p999_ns,mpps_all_packets\n");
        for r in &rows {
            csv.push_str(&format!(
                "{},{},{},{:.0},{:.0},{:.0},{:.3}\n",
                r.phase, r.kind, r.p.count, r.p.p50, r.p.p99, r.p.p999, r.mpps
            ));
        }
        std::fs::write(path, csv).map_err(|e| format!("--csv {}: {e}", path.display()))?;
    }
    if let Some(path) = &a.svg {
        let bars = |f: fn(&Percentiles) -> f64| {
            rows.iter()
                .map(|r| (format!("{} {}", r.phase, r.kind), f(&r.p)))
                .collect()
        };
        let panels = [
            crate::chart::Panel {
                title: "Median latency per packet (table work)".into(),
                unit: "ns".into(),
                bars: bars(|p| p.p50),
            },
            crate::chart::Panel {
                title: "99th percentile".into(),
                unit: "ns".into(),
                bars: bars(|p| p.p99),
            },
        ];
        let svg = crate::chart::bars(
            "Add-on-miss insertion latency (the slides' experiment)",
            &format!(
                "{} keys, then {} packets with every N-th inserting",
                a.keys, a.packets
            ),
            &panels,
        );
        std::fs::write(path, svg).map_err(|e| format!("--svg {}: {e}", path.display()))?;
    }
    Ok(())
}
