//! `stateplane bench-cache`: the microflow cache's hit rate against its size and ways on
//! generated traces (FlowShadow's section IV experiment), with the best any cache could do
//! (every microflow's first packet misses) for reference.
//!
//! Two keys: `full`, every parsed field (MACs, VLAN, TCP flags...), what the pipeline's
//! cache keys by when its rules read them all; and `5-tuple`, EtherType, addresses,
//! protocol and ports, what it keys by under rules that read only those (as the benchmark
//! pipeline's ACL and FIB), and the paper's microflow.

use crate::BenchResult;
use crate::results::{Csv, ResultFiles, Table};
use stateplane_classifier::{Fields, MicroflowCache};

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
    /// Keys, comma-separated: full (every parsed field), 5-tuple (EtherType, addresses,
    /// protocol, ports).
    #[arg(long, value_delimiter = ',', default_value = "full,5-tuple")]
    pub keys: Vec<String>,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

/// A trace under a key, and the best hit rate any cache could have on it.
struct Bound {
    workload: String,
    key: String,
    packets: usize,
    microflows: usize,
    best: f64,
}

struct Row {
    workload: String,
    key: String,
    entries: usize,
    ways: usize,
    hit_rate: f64,
}

/// The bits of [`Fields`] a key keeps, by its name.
fn key_mask(name: &str) -> Option<Fields> {
    let all = Fields {
        in_port: u16::MAX,
        eth_src: u64::MAX,
        eth_dst: u64::MAX,
        vlan: u16::MAX,
        eth_type: u16::MAX,
        ip_src: u128::MAX,
        ip_dst: u128::MAX,
        ip_proto: u8::MAX,
        tp_src: u16::MAX,
        tp_dst: u16::MAX,
        tcp_flags: u8::MAX,
    };
    match name {
        "full" => Some(all),
        "5-tuple" => Some(Fields {
            in_port: 0,
            eth_src: 0,
            eth_dst: 0,
            vlan: 0,
            tcp_flags: 0,
            ..all
        }),
        _ => None,
    }
}

/// The trace's packets as the fields the cache keys on.
fn trace(workload: &str, a: &BenchCacheArgs) -> BenchResult<Vec<Fields>> {
    let mut keys = Vec::with_capacity(a.packets as usize);
    crate::each_parsed(workload, a.packets, a.seed, |_, parsed, frame| {
        keys.push(Fields::of(parsed, frame, 0));
    })?;
    Ok(keys)
}

pub fn main(a: BenchCacheArgs) -> BenchResult<()> {
    if a.packets == 0 || a.sizes.iter().any(|&s| s == 0 || s > 1 << 26) {
        return Err("--packets must be above 0 and --sizes 1 to 67108864".into());
    }
    let masks = (a.keys.iter())
        .map(|k| match key_mask(k) {
            Some(m) => Ok((k.clone(), m)),
            None => Err(format!("--keys: '{k}' is not one of full, 5-tuple")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut rows = Vec::new();
    let mut bounds = Vec::new();
    for workload in &a.workloads {
        eprint!("\rgenerating {workload}   ");
        let packets = trace(workload, &a)?;
        for (key, mask) in &masks {
            let keys: Vec<Fields> = packets.iter().map(|p| p.and(mask)).collect();
            let distinct = keys.iter().collect::<std::collections::HashSet<_>>().len();
            let best = 1.0 - distinct as f64 / keys.len().max(1) as f64;
            bounds.push(Bound {
                workload: workload.clone(),
                key: key.clone(),
                packets: keys.len(),
                microflows: distinct,
                best,
            });
            measure(workload, key, &keys, &a, &mut rows)?;
        }
    }
    eprintln!();
    report(&a, &bounds, &rows)
}

/// The hit rate of each size and ways on `keys`, a miss inserting.
fn measure(
    workload: &str,
    key: &str,
    keys: &[Fields],
    a: &BenchCacheArgs,
    rows: &mut Vec<Row>,
) -> BenchResult<()> {
    for &size in &a.sizes {
        for &ways in &a.ways {
            let entries = size.next_power_of_two().max(ways);
            eprint!("\r{workload}, {key} key: {entries} entries, {ways} ways      ");
            let mut cache: MicroflowCache<u8> = MicroflowCache::new(entries, ways, a.seed)
                .map_err(|e| format!("--sizes/--ways: {e}"))?;
            for k in keys {
                let h = cache.hash(k);
                if cache.lookup(h, k).is_none() {
                    cache.insert(h, k, 0);
                }
            }
            rows.push(Row {
                workload: workload.to_string(),
                key: key.to_string(),
                entries,
                ways,
                hit_rate: cache.stats.hits as f64 / keys.len().max(1) as f64,
            });
        }
    }
    Ok(())
}

fn report(a: &BenchCacheArgs, bounds: &[Bound], rows: &[Row]) -> BenchResult<()> {
    println!(
        "input: stateplane gen WORKLOAD --packets {} --seed {}; a miss inserts (replacing the set's pseudo-LRU way)",
        a.packets, a.seed
    );
    for b in bounds {
        println!(
            "{}, {} key: {} packets, {} microflows: at best {:.2}% hits (each microflow's first packet misses)",
            b.workload,
            b.key,
            b.packets,
            b.microflows,
            b.best * 100.0
        );
    }
    let mut table = Table::new(&["workload", "key"], &["entries", "ways", "hit rate"]);
    for r in rows {
        table.row(vec![
            r.workload.to_string(),
            r.key.to_string(),
            r.entries.to_string(),
            r.ways.to_string(),
            format!("{:.2}%", r.hit_rate * 100.0),
        ]);
    }
    table.print();
    if let Some(path) = &a.files.csv {
        let mut csv = Csv::new("workload,key,entries,ways,hit_rate");
        for r in rows {
            csv.row(format_args!(
                "{},{},{},{},{:.5}",
                r.workload, r.key, r.entries, r.ways, r.hit_rate
            ));
        }
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let panels: Vec<crate::chart::Panel> = bounds
            .iter()
            .map(|b| crate::chart::Panel {
                title: format!(
                    "{}, {} key: hit rate by cache entries and ways",
                    b.workload, b.key
                ),
                unit: "%".into(),
                bars: rows
                    .iter()
                    .filter(|r| r.workload == b.workload && r.key == b.key)
                    .map(|r| {
                        (
                            format!("{} entries, {} way(s)", r.entries, r.ways),
                            r.hit_rate * 100.0,
                        )
                    })
                    .collect(),
            })
            .collect();
        a.files.write_chart(
            "Microflow cache hit rate",
            &format!("{} packets per trace, seed {}", a.packets, a.seed),
            &panels,
        )?;
    }
    Ok(())
}
