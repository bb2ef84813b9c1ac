//! `stateplane bench-tables`: operations per second per core on the state primitives, on
//! keys and orders fixed by a seed, each measured `--repeat` times (median reported).
//!
//! Exact tables keyed by flow (the 40-byte `FlowKey`, as conntrack and NAT key them):
//! add-on-miss insertion into an empty table up to its capacity, lookups that hit (one at
//! a time, and a burst at a time with the burst's slots touched first), and lookups that
//! miss. One table small enough for the CPU caches, one far larger.

use crate::BenchResult;
use crate::results::{Csv, ResultFiles, Table};
use crate::statistics::median;
use stateplane_gen::rng::Rng;
use stateplane_state::{ExactTable, ExpireProfile};
use stateplane_wire::FlowKey;
use std::hint::black_box;
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchTablesArgs {
    /// Table sizes (entries), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "4096,1048576")]
    pub entries: Vec<usize>,
    /// Lookups per measurement.
    #[arg(long, default_value_t = 4_000_000)]
    pub lookups: usize,
    /// Runs of each measurement; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Keep exact tables on 4 KiB pages (default: huge pages where the kernel gives them).
    #[arg(long)]
    pub no_hugepages: bool,
    /// Rule counts of the generated ACLs for the ternary measurement (empty: skip).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub acl_rules: Vec<usize>,
    /// IPv4 prefixes of the generated routing table for the LPM measurement (0: skip).
    #[arg(long, default_value_t = 400_000)]
    pub ipv4_prefixes: usize,
    /// IPv6 prefixes of the generated routing table (0: skip).
    #[arg(long, default_value_t = 150_000)]
    pub ipv6_prefixes: usize,
    /// Entries inserted by the control plane for the bulk-insertion measurement (0: skip).
    #[arg(long, default_value_t = 200_000)]
    pub control_entries: usize,
    /// Entries per control-plane write.
    #[arg(long, default_value_t = 1000)]
    pub control_batch: usize,
    #[command(flatten)]
    pub files: ResultFiles,
}

fn flow(rng: &mut Rng) -> FlowKey {
    let a = rng.next_u64();
    let b = rng.next_u64();
    FlowKey::v4(
        std::net::Ipv4Addr::from((a as u32) | 0xc612_0000),
        std::net::Ipv4Addr::from((b as u32) | 0xc613_0000),
        6,
        (a >> 32) as u16,
        (b >> 32) as u16,
    )
}

struct Row {
    op: String,
    entries: usize,
    mops: f64,
    ns: f64,
}

pub fn main(a: BenchTablesArgs) -> BenchResult<()> {
    if a.repeat == 0 || a.lookups == 0 || a.entries.iter().any(|&e| e == 0 || e > 1 << 26) {
        return Err("--repeat and --lookups must be above 0, and --entries 1 to 67108864".into());
    }
    let mut rows = Vec::new();
    // Progress on standard error as each part starts (the whole takes half a minute).
    let acls = a.acl_rules.iter().filter(|&&n| n > 0).count();
    let parts = a.entries.len() + 2 + acls;
    let mut part = 0;
    let mut step = |what: String| {
        part += 1;
        eprintln!("[{part}/{parts}] {what}");
    };
    for &n in &a.entries {
        step(format!(
            "exact table of {n} entries: inserts and lookups, {} times",
            a.repeat
        ));
        let mut rng = Rng::new(a.seed);
        let present: Vec<FlowKey> = (0..n).map(|_| flow(&mut rng)).collect();
        let absent: Vec<FlowKey> = (0..n).map(|_| flow(&mut rng)).collect();
        // Lookup orders: random draws from each set.
        let order: Vec<usize> = (0..a.lookups)
            .map(|_| rng.below(n as u64) as usize)
            .collect();
        let hits: Vec<FlowKey> = order.iter().map(|&i| present[i]).collect();
        let misses: Vec<FlowKey> = order.iter().map(|&i| absent[i]).collect();
        let mut insert = Vec::new();
        let (mut hit, mut hit_burst, mut miss) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..a.repeat {
            let mut t: ExactTable<FlowKey, u64> =
                ExactTable::with_pages(n, &[ExpireProfile::NEVER], a.seed, !a.no_hugepages);
            let start = Instant::now();
            for (i, k) in present.iter().enumerate() {
                // The add-on-miss path as a program runs it: the lookup misses, then adds.
                if t.lookup(k, 0).is_none() {
                    black_box(t.add_entry(*k, i as u64, 0, 0).is_ok());
                }
            }
            insert.push(start.elapsed().as_secs_f64() / n as f64);
            if t.len() != n {
                return Err(format!("only {} of {n} keys went in", t.len()));
            }
            let time = |t: &mut ExactTable<FlowKey, u64>, keys: &[FlowKey]| {
                let start = Instant::now();
                let mut found = 0u64;
                for k in keys {
                    if let Some(id) = t.lookup(k, 0) {
                        found += *t.value(id) & 1;
                    }
                }
                black_box(found);
                start.elapsed().as_secs_f64() / keys.len() as f64
            };
            hit.push(time(&mut t, &hits));
            miss.push(time(&mut t, &misses));
            let mut out = vec![None; 64];
            let start = Instant::now();
            let mut found = 0u64;
            for chunk in hits.chunks(64) {
                t.lookup_burst(chunk, &mut out[..chunk.len()], 0);
                found += out[..chunk.len()].iter().flatten().count() as u64;
            }
            black_box(found);
            hit_burst.push(start.elapsed().as_secs_f64() / hits.len() as f64);
        }
        for (op, v) in [
            ("add-on-miss insert", insert),
            ("lookup hit", hit),
            ("lookup hit, burst of 64", hit_burst),
            ("lookup miss", miss),
        ] {
            let s = median(v);
            rows.push(Row {
                op: op.to_owned(),
                entries: n,
                mops: 1e-6 / s,
                ns: s * 1e9,
            });
        }
    }
    step(format!(
        "LPM tables of {} IPv4 and {} IPv6 prefixes",
        a.ipv4_prefixes, a.ipv6_prefixes
    ));
    lpm_rows(&a, &mut rows);
    ternary_rows(&a, &mut rows, &mut step);
    step("control plane: table writes directly and through gRPC".to_string());
    control_rows(&a, &mut rows)?;
    println!(
        "input: exact tables of FlowKey -> u64; LPM tables of {} IPv4 and {} IPv6 generated prefixes (stateplane_state::prefixes); seed {}, {} lookups per measurement, median of {}",
        a.ipv4_prefixes, a.ipv6_prefixes, a.seed, a.lookups, a.repeat
    );
    let mut table = Table::new(&["operation"], &["entries", "M ops/s | s", "ns/op"]);
    for r in &rows {
        // Build rows carry seconds in the rate column.
        let digits = if r.op.ends_with("(s)") { 3 } else { 1 };
        table.row(vec![
            r.op.to_string(),
            r.entries.to_string(),
            format!("{:.digits$}", r.mops),
            format!("{:.1}", r.ns),
        ]);
    }
    table.print();
    if let Some(path) = &a.files.csv {
        let mut csv = Csv::new("operation,entries,value,unit,ns_per_op");
        for r in &rows {
            let unit = if r.op.ends_with("(s)") { "s" } else { "Mops/s" };
            csv.row(format_args!(
                "{},{},{:.4},{unit},{:.2}",
                r.op, r.entries, r.mops, r.ns
            ));
        }
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let mut panels: Vec<crate::chart::Panel> = a
            .entries
            .iter()
            .map(|&n| crate::chart::Panel {
                title: format!("Exact table, {n} entries: million operations per second per core"),
                unit: "M/s".into(),
                bars: rows
                    .iter()
                    .filter(|r| {
                        r.entries == n
                            && !r.op.starts_with("lpm")
                            && !r.op.starts_with("acl")
                            && !r.op.starts_with("control")
                    })
                    .map(|r| (r.op.clone(), r.mops))
                    .collect(),
            })
            .collect();
        panels.push(crate::chart::Panel {
            title: "Ternary ACL (tuple-space search vs linear scan): million classifications per second".into(),
            unit: "M/s".into(),
            bars: rows
                .iter()
                .filter(|r| r.op.starts_with("acl"))
                .map(|r| {
                    let how = if r.op.contains("linear") { "linear" } else { "tuple-space" };
                    (format!("{how}, {} rules", r.entries), r.mops)
                })
                .collect(),
        });
        panels.push(crate::chart::Panel {
            title: "Longest-prefix match: million lookups per second per core".into(),
            unit: "M/s".into(),
            bars: rows
                .iter()
                .filter(|r| r.op.starts_with("lpm") && r.op.contains("lookup"))
                .map(|r| (r.op.clone(), r.mops))
                .collect(),
        });
        panels.push(crate::chart::Panel {
            title: "Control-plane bulk insertion into l2's table: million entries per second"
                .into(),
            unit: "M/s".into(),
            bars: rows
                .iter()
                .filter(|r| r.op.starts_with("control"))
                .map(|r| (r.op.clone(), r.mops))
                .collect(),
        });
        a.files
            .write_chart("State primitives", "FlowKey -> u64", &panels)?;
    }
    Ok(())
}

/// LPM: build time of an Internet-sized table, and lookups of random addresses inside its
/// prefixes (every lookup finds a route).
fn lpm_rows(a: &BenchTablesArgs, rows: &mut Vec<Row>) {
    use stateplane_state::{Lpm4, Lpm6, prefixes};
    let mut rng = Rng::new(a.seed);
    if a.ipv4_prefixes > 0 {
        let v4 = prefixes::ipv4(a.ipv4_prefixes, a.seed);
        let addrs: Vec<u32> = (0..a.lookups)
            .map(|_| {
                let (p, len, _) = v4[rng.below(v4.len() as u64) as usize];
                let host = if len >= 32 {
                    0
                } else {
                    (rng.next_u64() as u32) >> len
                };
                u32::from(p) | host
            })
            .collect();
        build_and_lookup(
            "lpm4",
            v4.len(),
            a.repeat,
            || Lpm4::build(&v4).ok(),
            &addrs,
            |t, x| t.lookup(*x).copied().unwrap_or(0),
            rows,
        );
    }
    if a.ipv6_prefixes > 0 {
        let v6 = prefixes::ipv6(a.ipv6_prefixes, a.seed);
        let addrs: Vec<std::net::Ipv6Addr> = (0..a.lookups)
            .map(|_| {
                let (p, len, _) = v6[rng.below(v6.len() as u64) as usize];
                let r = (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64());
                let host = if len == 0 { r } else { r >> len };
                std::net::Ipv6Addr::from(u128::from(p) | host)
            })
            .collect();
        build_and_lookup(
            "lpm6",
            v6.len(),
            a.repeat,
            || Lpm6::build(&v6).ok(),
            &addrs,
            |t, x| t.lookup(x).copied().unwrap_or(0),
            rows,
        );
    }
}

/// Builds a table `repeat` times and looks every address up in it each time; adds the
/// median build time and lookup rate as rows `NAME build (s)` and `NAME lookup`.
fn build_and_lookup<T, A>(
    name: &str,
    entries: usize,
    repeat: usize,
    build: impl Fn() -> Option<T>,
    addrs: &[A],
    lookup: impl Fn(&T, &A) -> u32,
    rows: &mut Vec<Row>,
) {
    let (mut builds, mut lookups) = (Vec::new(), Vec::new());
    for _ in 0..repeat {
        let t = Instant::now();
        let Some(table) = build() else {
            eprintln!("{name}: the generated table could not be built");
            return;
        };
        builds.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut sum = 0u64;
        for x in addrs {
            sum += u64::from(lookup(&table, x));
        }
        black_box(sum);
        lookups.push(t.elapsed().as_secs_f64() / addrs.len() as f64);
    }
    let b = median(builds);
    rows.push(Row {
        op: format!("{name} build (s)"),
        entries,
        mops: b,
        ns: b * 1e9 / entries as f64,
    });
    let l = median(lookups);
    rows.push(Row {
        op: format!("{name} lookup"),
        entries,
        mops: 1e-6 / l,
        ns: l * 1e9,
    });
}

/// Ternary ACLs: classifications per second by tuple-space search, and by the linear
/// scan it replaces, on packets aimed at random rules (half exactly at a rule's corner,
/// half anywhere in the rules' blocks).
fn ternary_rows(a: &BenchTablesArgs, rows: &mut Vec<Row>, step: &mut dyn FnMut(String)) {
    use stateplane_state::ternary::{Packet5, Ternary, acl_rules};
    for &n in &a.acl_rules {
        if n == 0 {
            continue;
        }
        step(format!(
            "ternary ACL of {n} rules: tuple-space search and linear scan"
        ));
        let rules = acl_rules(n, a.seed);
        let table = Ternary::build(&rules);
        let mut rng = Rng::new(a.seed);
        let packets: Vec<Packet5> = (0..a.lookups.min(1_000_000))
            .map(|i| {
                let r = &rules[rng.below(n as u64) as usize];
                let noise = if i % 2 == 0 {
                    0
                } else {
                    rng.next_u64() as u32 & 0xff
                };
                Packet5 {
                    src: r.src | noise,
                    dst: r.dst | (noise << 3),
                    proto: r.proto.unwrap_or(6),
                    src_port: r.src_ports.0,
                    dst_port: r.dst_ports.1,
                }
            })
            .collect();
        let time = |f: &dyn Fn(&Packet5) -> Option<u32>, packets: &[Packet5]| {
            let mut v = Vec::new();
            for _ in 0..a.repeat {
                let t = Instant::now();
                let mut sum = 0u64;
                for p in packets {
                    sum += u64::from(f(p).unwrap_or(0));
                }
                black_box(sum);
                v.push(t.elapsed().as_secs_f64() / packets.len() as f64);
            }
            median(v)
        };
        let tss = time(&|p| table.classify(p).map(|r| r.action), &packets);
        rows.push(Row {
            op: format!("acl tuple-space ({} tuples)", table.tuples()),
            entries: n,
            mops: 1e-6 / tss,
            ns: tss * 1e9,
        });
        // The linear scan is slow; a sample shows its rate.
        let sample = &packets[..packets.len().min(20_000)];
        let lin = time(&|p| table.classify_linear(p).map(|r| r.action), sample);
        rows.push(Row {
            op: "acl linear scan".into(),
            entries: n,
            mops: 1e-6 / lin,
            ns: lin * 1e9,
        });
    }
}

/// Control-plane bulk insertion: `l2`'s MAC table filled by writes of `--control-batch`
/// entries, while one worker polls for requests as an idle live worker does; through the
/// control plane directly, and through gRPC on loopback with `ctl`'s client.
fn control_rows(a: &BenchTablesArgs, rows: &mut Vec<Row>) -> BenchResult<()> {
    use stateplane_control::client::Client;
    use stateplane_control::server::{ControlService, Server};
    use stateplane_state::{Entry, Match, Request, Write};
    use std::sync::Arc;

    let n = a.control_entries;
    if n == 0 {
        return Ok(());
    }
    if a.control_batch == 0 || n > 1 << 23 {
        return Err("--control-batch must be above 0 and --control-entries at most 8388608".into());
    }
    let batches: Vec<Vec<Write>> = (0..n as u128)
        .map(|i| {
            Write::Insert(Entry {
                key: vec![Match::Exact(0), Match::Exact(0x0200_0000_0000 | i)],
                action: "forward".into(),
                params: vec![1],
                priority: 0,
                hits: 0,
            })
        })
        .collect::<Vec<_>>()
        .chunks(a.control_batch)
        .map(<[Write]>::to_vec)
        .collect();
    let config: toml::Value =
        toml::from_str(&format!("capacity = {n}")).map_err(|e| e.to_string())?;
    let names = stateplane_programs::PortNames(vec!["0".into(), "1".into()]);
    for via in ["direct", "gRPC"] {
        let factory =
            stateplane_programs::build("l2", Some(&config), &names).map_err(|e| e.to_string())?;
        let secs = with_idle_worker(&factory, |plane| {
            let t = Instant::now();
            if via == "direct" {
                for b in &batches {
                    let write = Request::Write {
                        table: "macs".into(),
                        writes: b.clone(),
                    };
                    plane.submit(write).map_err(|e| e.to_string())?;
                }
            } else {
                // The server logs each write it takes (its audit trail): thousands here,
                // which would bury the table.
                let _quiet = QuietLog::new();
                let service = ControlService::new(plane.clone(), "l2", Arc::new(Vec::new));
                let any_port = &stateplane_control::endpoint::Listen::loopback(0);
                let server = Server::start(any_port, service)?;
                let mut client =
                    Client::connect(&server.endpoint.to_string()).map_err(|e| e.to_string())?;
                for b in &batches {
                    client.write("macs", b).map_err(|e| e.to_string())?;
                }
            }
            Ok(t.elapsed().as_secs_f64())
        })?;
        rows.push(Row {
            op: format!("control insert ({via}, {} per write)", a.control_batch),
            entries: n,
            mops: n as f64 / secs / 1e6,
            ns: secs * 1e9 / n as f64,
        });
    }
    route_update_rows(a, rows)
}

/// Route changes on a running router with the Internet-sized IPv4 table: the latency of a
/// one-route write (the control plane updates a copy of the tables; the worker swaps it in).
fn route_update_rows(a: &BenchTablesArgs, rows: &mut Vec<Row>) -> BenchResult<()> {
    use stateplane_programs::router::{NextHop, Router};
    use stateplane_state::{Entry, Match, Request, Write, prefixes};
    const WRITES: usize = 21;
    if a.ipv4_prefixes == 0 {
        return Ok(());
    }
    let hop = NextHop {
        port: 1,
        mac: [2, 0, 0, 0, 0, 1],
    };
    let v4: Vec<_> = prefixes::ipv4(a.ipv4_prefixes, a.seed)
        .into_iter()
        .map(|(p, len, _)| (p, len, hop))
        .collect();
    let router =
        Router::from_routes(&v4, &[], vec![[2, 0, 0, 0, 0, 1]; 2]).map_err(|e| e.to_string())?;
    let factory: stateplane_runtime::ProgramFactory =
        std::sync::Arc::new(move |_| Box::new(router.clone()));
    let ns = with_idle_worker(&factory, |plane| {
        let mut ns = Vec::new();
        for i in 0..WRITES as u128 {
            // /24s under 198.19.0.0/16, beyond the generated table's prefixes' reach.
            let entry = Entry {
                key: vec![Match::Prefix {
                    value: 0xc613_0000 | i << 8,
                    len: 24,
                }],
                action: "route".into(),
                params: vec![0, 0x0200_0000_0002],
                priority: 0,
                hits: 0,
            };
            let t = Instant::now();
            plane
                .submit(Request::Write {
                    table: "routes4".into(),
                    writes: vec![Write::Insert(entry)],
                })
                .map_err(|e| e.to_string())?;
            ns.push(t.elapsed().as_nanos() as f64);
        }
        Ok(ns)
    })?;
    let median_ns = median(ns);
    rows.push(Row {
        op: "control route insert (1 per write)".into(),
        entries: a.ipv4_prefixes,
        mops: 1e3 / median_ns,
        ns: median_ns,
    });
    Ok(())
}

/// Holds the log at warnings and errors while it lives.
struct QuietLog(log::LevelFilter);

impl QuietLog {
    fn new() -> QuietLog {
        let level = log::max_level();
        log::set_max_level(level.min(log::LevelFilter::Warn));
        QuietLog(level)
    }
}

impl Drop for QuietLog {
    fn drop(&mut self) {
        log::set_max_level(self.0);
    }
}

/// Runs `f` with the control plane of one worker of `factory`'s program, the worker polling
/// for requests in a loop as an idle live worker does.
fn with_idle_worker<T>(
    factory: &stateplane_runtime::ProgramFactory,
    f: impl FnOnce(&std::sync::Arc<stateplane_runtime::ControlPlane>) -> BenchResult<T>,
) -> BenchResult<T> {
    use stateplane_runtime::{Burst, ControlPlane, Worker};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (plane, mut ends) = ControlPlane::new(1, factory(0));
    let end = ends.pop().ok_or("no worker end")?;
    let stop = Arc::new(AtomicBool::new(false));
    let worker_stop = stop.clone();
    let program = factory(0);
    let worker = std::thread::spawn(move || {
        let hasher = stateplane_wire::FlowHasher::with_seed(1);
        let mut w = Worker::new(program, 0, 1, 2, hasher).with_control(end);
        let mut idle = Burst::with_capacity(1);
        while !worker_stop.load(Ordering::Relaxed) {
            w.poll(&mut idle);
            std::thread::yield_now();
        }
    });
    let result = f(&plane);
    stop.store(true, Ordering::Relaxed);
    let _ = worker.join();
    result
}
