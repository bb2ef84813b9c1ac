//! `stateplane bench-cache`: the microflow cache's hit rate against its size and ways on
//! generated traces (FlowShadow's section IV experiment), with the best any cache could do
//! (every microflow's first packet misses) for reference.

use crate::CliResult;
use stateplane_classifier::{Fields, MicroflowCache};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct BenchCacheArgs {
    /// Generated workloads, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "internet,datacenter")]
    pub workloads: Vec<String>,
    /// Packets per trace.
    #[arg(long, default_value_t = 4_000_000)]
    pub packets: u64,
    /// Cache sizes in entries, each rounded up to a power of two.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "100,1000,10000,100000,1000000,10000000"
    )]
    pub sizes: Vec<usize>,
    /// Ways per set, comma-separated (1, 2, 4).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub ways: Vec<usize>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub csv: Option<PathBuf>,
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

struct Row {
    workload: String,
    entries: usize,
    ways: usize,
    hit_rate: f64,
}

/// The trace's packets as the fields the cache keys on, and how many distinct ones.
fn trace(workload: &str, a: &BenchCacheArgs) -> CliResult<(Vec<Fields>, usize)> {
    let mut keys = Vec::with_capacity(a.packets as usize);
    crate::gen_cmd::each_parsed(workload, a.packets, a.seed, |_, parsed, frame| {
        keys.push(Fields::of(parsed, frame, 0));
    })?;
    let distinct = keys.iter().collect::<std::collections::HashSet<_>>().len();
    Ok((keys, distinct))
}

pub fn main(a: BenchCacheArgs) -> CliResult<()> {
    if a.packets == 0 || a.sizes.iter().any(|&s| s == 0 || s > 1 << 26) {
        return Err("--packets must be above 0 and --sizes 1 to 67108864".into());
    }
    let mut rows = Vec::new();
    let mut bounds = Vec::new();
    for workload in &a.workloads {
        eprint!("\rgenerating {workload}   ");
        let (keys, distinct) = trace(workload, &a)?;
        let best = 1.0 - distinct as f64 / keys.len().max(1) as f64;
        bounds.push((workload.clone(), keys.len(), distinct, best));
        for &size in &a.sizes {
            for &ways in &a.ways {
                let entries = size.next_power_of_two().max(ways);
                eprint!("\r{workload}: {entries} entries, {ways} ways      ");
                let mut cache: MicroflowCache<u8> = MicroflowCache::new(entries, ways, a.seed)
                    .map_err(|e| format!("--sizes/--ways: {e}"))?;
                for k in &keys {
                    let h = cache.hash(k);
                    if cache.lookup(h, k).is_none() {
                        cache.insert(h, k, 0);
                    }
                }
                rows.push(Row {
                    workload: workload.clone(),
                    entries,
                    ways,
                    hit_rate: cache.stats.hits as f64 / keys.len().max(1) as f64,
                });
            }
        }
    }
    eprintln!();
    println!(
        "input: stateplane gen WORKLOAD --packets {} --seed {}; a miss inserts (replacing the set's pseudo-LRU way)",
        a.packets, a.seed
    );
    for (w, packets, distinct, best) in &bounds {
        println!(
            "{w}: {packets} packets, {distinct} microflows: at best {:.2}% hits (each microflow's first packet misses)",
            best * 100.0
        );
    }
    println!(
        "{:<12} {:>10} {:>5} {:>10}",
        "workload", "entries", "ways", "hit rate"
    );
    for r in &rows {
        println!(
            "{:<12} {:>10} {:>5} {:>9.2}%",
            r.workload,
            r.entries,
            r.ways,
            r.hit_rate * 100.0
        );
    }
    if let Some(path) = &a.csv {
        let mut csv = String::from("workload,entries,ways,hit_rate\n");
        for r in &rows {
            csv.push_str(&format!(
                "{},{},{},{:.5}\n",
                r.workload, r.entries, r.ways, r.hit_rate
            ));
        }
        std::fs::write(path, csv).map_err(|e| format!("--csv {}: {e}", path.display()))?;
    }
    if let Some(path) = &a.svg {
        let panels: Vec<crate::chart::Panel> = a
            .workloads
            .iter()
            .map(|w| crate::chart::Panel {
                title: format!("{w}: hit rate by cache entries and ways"),
                unit: "%".into(),
                bars: rows
                    .iter()
                    .filter(|r| &r.workload == w)
                    .map(|r| {
                        (
                            format!("{} entries, {} way(s)", r.entries, r.ways),
                            r.hit_rate * 100.0,
                        )
                    })
                    .collect(),
            })
            .collect();
        let svg = crate::chart::bars(
            "Microflow cache hit rate",
            &format!("{} packets per trace, seed {}", a.packets, a.seed),
            &panels,
        );
        std::fs::write(path, svg).map_err(|e| format!("--svg {}: {e}", path.display()))?;
    }
    Ok(())
}
