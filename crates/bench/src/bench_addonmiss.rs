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
//! slides timed whole packets on the wire with hardware timestamps.
//!
//! The digest baseline runs the same packets through the other way P4 switches learn: a
//! miss sends a digest (the key) to the control plane and the packet goes on; a
//! controller thread takes the digests as they come, in batches, and inserts them through
//! the control plane, which the worker applies between bursts of 64 packets. Reported:
//! the data plane's per-packet cost (a miss now costs the digest), and the time from a
//! miss to its entry being visible to the data plane, with the rate entries go in and the
//! digests lost to full queues (a controller slower than the misses loses them).

use crate::BenchResult;
use crate::results::{Csv, ResultFiles, Table};
use crate::statistics::percentile;
use stateplane_runtime::{Context, ControlPlane, Program};
use stateplane_state::control::{Action, Field, Format};
use stateplane_state::{
    Declaration, DeclaredTable, Entry, ExactTable, ExpireProfile, Guarantee, Kind, Notification,
    Request, ValueCodec, Write,
};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    #[command(flatten)]
    pub files: ResultFiles,
}

/// Keys as the slides' packets carry them: 64-bit values, pseudo-random but distinct.
fn key(i: u64) -> u64 {
    // An odd multiplier is a bijection on u64: distinct i give distinct keys.
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1_e995
}

/// The keys of the experiment's packets, both ways of learning alike: a new key for an
/// inserting packet, else the next of a pseudo-random cycle over the `loaded` keys
/// inserted before (an odd stride modulo a power of two).
struct Keys {
    loaded: u64,
    span: u64,
    cursor: u64,
    next_new: u64,
}

impl Keys {
    fn new(loaded: usize) -> Self {
        Keys {
            loaded: loaded as u64,
            span: (loaded as u64).next_power_of_two(),
            cursor: 0,
            next_new: loaded as u64,
        }
    }

    fn next(&mut self, new: bool) -> u64 {
        if new {
            self.next_new += 1;
            return key(self.next_new - 1);
        }
        loop {
            self.cursor = (self.cursor + 0x9e37_79b9) & (self.span - 1);
            if self.cursor < self.loaded {
                return key(self.cursor);
            }
        }
    }
}

struct Percentiles {
    p50: f64,
    p99: f64,
    p999: f64,
    count: usize,
}

fn percentiles(v: &mut [u32]) -> Percentiles {
    Percentiles {
        p50: f64::from(percentile(v, 0.5)),
        p99: f64::from(percentile(v, 0.99)),
        p999: f64::from(percentile(v, 0.999)),
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
    /// Phase 2's N (an insertion every N-th packet); `None` in phase 1.
    every: Option<usize>,
    kind: &'static str,
    p: Percentiles,
    mpps: f64,
}

pub fn main(a: AddOnMissArgs) -> BenchResult<()> {
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
        if table.lookup(&k, 0).is_none() {
            black_box(table.add_entry(k, i, 0, 0).is_ok());
        }
        lat.push((t.elapsed().as_nanos() as u32).saturating_sub(clock));
    }
    let mut untimed: ExactTable<u64, u64> = ExactTable::new(capacity, &profiles, 7);
    let t = Instant::now();
    for i in 0..a.keys as u64 {
        let k = key(i);
        if untimed.lookup(&k, 0).is_none() {
            black_box(untimed.add_entry(k, i, 0, 0).is_ok());
        }
    }
    let mpps = a.keys as f64 / t.elapsed().as_secs_f64() / 1e6;
    drop(untimed);
    rows.push(Row {
        phase: "phase 1".into(),
        every: None,
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
            let mut keys = Keys::new(a.keys);
            let start = Instant::now();
            for p in 1..=a.packets {
                let insert = p % n == 0;
                let k = keys.next(insert);
                let t = timed.then(Instant::now);
                match t2.lookup(&k, 0) {
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
            every: Some(n),
            kind: "mixed",
            p: percentiles(&mut mixed),
            mpps,
        });
        rows.push(Row {
            phase: phase.clone(),
            every: Some(n),
            kind: "lookup",
            p: percentiles(&mut lookups),
            mpps,
        });
        rows.push(Row {
            phase,
            every: Some(n),
            kind: "insert",
            p: percentiles(&mut inserts),
            mpps,
        });
    }
    eprintln!();
    digest_rows(&a, clock, &mut rows)?;
    println!(
        "input: {} keys inserted by add-on-miss, then {} packets of lookups with every N-th inserting; u64 keys and values; latency per packet's table work (clock cost {clock} ns subtracted). Digest rows: `miss` is a miss that sends a digest, `visible` the time from a miss to its entry being in, with Mpps the entries the controller put in per second",
        a.keys, a.packets
    );
    let mut table = Table::new(
        &["phase", "packets"],
        &["count", "p50 ns", "p99 ns", "p99.9 ns", "Mpps"],
    );
    for r in &rows {
        table.row(vec![
            r.phase.to_string(),
            r.kind.to_string(),
            r.p.count.to_string(),
            format!("{:.0}", r.p.p50),
            format!("{:.0}", r.p.p99),
            format!("{:.0}", r.p.p999),
            format!("{:.2}", r.mpps),
        ]);
    }
    table.print();
    let by_rate = by_insertion_rate(&rows);
    println!(
        "insertion latency against insertion rate (the slides' trend: up to +47% from the lowest rate to the highest), each against its lowest rate:"
    );
    let mut rates = Table::new(
        &["N"],
        &[
            "add-on-miss inserts/s",
            "insert p50 ns",
            "vs lowest",
            "digest entries in/s",
            "miss to in p50 µs",
            "vs lowest",
        ],
    );
    for r in &by_rate {
        rates.row(vec![
            r.every.to_string(),
            format!("{:.0}", r.add_rate),
            format!("{:.0}", r.add_p50_ns),
            format!("{:+.0}%", 100.0 * (r.add_vs_lowest - 1.0)),
            format!("{:.0}", r.digest_rate),
            format!("{:.1}", r.digest_p50_ns / 1e3),
            format!("{:+.0}%", 100.0 * (r.digest_vs_lowest - 1.0)),
        ]);
    }
    rates.print();
    if let Some(path) = &a.files.csv {
        let mut csv = Csv::new("phase,packets,count,p50_ns,p99_ns,p999_ns,mpps_all_packets");
        for r in &rows {
            csv.row(format_args!(
                "\"{}\",{},{},{:.0},{:.0},{:.0},{:.3}",
                r.phase, r.kind, r.p.count, r.p.p50, r.p.p99, r.p.p999, r.mpps
            ));
        }
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        // Per-packet costs (ns) and the digest's miss-to-entry times (µs) on panels apart.
        let bars = |f: fn(&Percentiles) -> f64, visible: bool, scale: f64| {
            rows.iter()
                .filter(|r| (r.kind == "visible") == visible)
                .map(|r| (format!("{} {}", r.phase, r.kind), f(&r.p) / scale))
                .collect()
        };
        let relative = (by_rate.iter())
            .flat_map(|r| {
                [
                    (format!("add-on-miss, 1 in {}", r.every), r.add_vs_lowest),
                    (format!("digest, 1 in {}", r.every), r.digest_vs_lowest),
                ]
            })
            .collect();
        let panels = [
            crate::chart::Panel {
                title: "Median insertion latency against the lowest insertion rate's (slides: up to 1.47 at the highest)".into(),
                unit: "x".into(),
                bars: relative,
            },
            crate::chart::Panel {
                title: "Median latency per packet (table work)".into(),
                unit: "ns".into(),
                bars: bars(|p| p.p50, false, 1.0),
            },
            crate::chart::Panel {
                title: "99th percentile".into(),
                unit: "ns".into(),
                bars: bars(|p| p.p99, false, 1.0),
            },
            crate::chart::Panel {
                title: "Digest baseline: from a miss to its entry being in, median".into(),
                unit: "µs".into(),
                bars: bars(|p| p.p50, true, 1e3),
            },
        ];
        a.files.write_chart(
            "Add-on-miss insertion latency (the slides' experiment)",
            &format!(
                "{} keys, then {} packets with every N-th inserting",
                a.keys, a.packets
            ),
            &panels,
        )?;
    }
    Ok(())
}

/// Phase 2's insertions at one N, both ways of learning: insertions per second, median
/// insertion latency (add-on-miss: the inserting packet's table work; digest: from a miss
/// to its entry being in) and that median over the one at the lowest rate (largest N).
struct ByRate {
    every: usize,
    add_rate: f64,
    add_p50_ns: f64,
    add_vs_lowest: f64,
    digest_rate: f64,
    digest_p50_ns: f64,
    digest_vs_lowest: f64,
}

fn by_insertion_rate(rows: &[Row]) -> Vec<ByRate> {
    let find = |n: usize, kind: &str, digest: bool| {
        rows.iter()
            .find(|r| r.every == Some(n) && r.kind == kind && r.phase.ends_with("digest") == digest)
    };
    let mut ns: Vec<usize> = rows.iter().filter_map(|r| r.every).collect();
    ns.sort_unstable_by(|a, b| b.cmp(a));
    ns.dedup();
    let Some(&lowest) = ns.first() else {
        return Vec::new();
    };
    let p50 = |n, kind, digest| find(n, kind, digest).map_or(f64::NAN, |r| r.p.p50);
    let (add_base, digest_base) = (p50(lowest, "insert", false), p50(lowest, "visible", true));
    ns.iter()
        .rev()
        .map(|&n| ByRate {
            every: n,
            add_rate: find(n, "insert", false).map_or(f64::NAN, |r| r.mpps * 1e6 / n as f64),
            add_p50_ns: p50(n, "insert", false),
            add_vs_lowest: p50(n, "insert", false) / add_base,
            digest_rate: find(n, "visible", true).map_or(f64::NAN, |r| r.mpps * 1e6),
            digest_p50_ns: p50(n, "visible", true),
            digest_vs_lowest: p50(n, "visible", true) / digest_base,
        })
        .collect()
}

/// The experiment's table in the control API: key `key`, action `set(value)`.
struct KeyCodec;

impl ValueCodec for KeyCodec {
    type Key = u64;
    type Value = u64;
    fn value(_action: usize, params: &[u128]) -> u64 {
        params.first().map_or(0, |&v| v as u64)
    }
    fn action_values(value: &u64, out: &mut [u128]) -> (usize, usize) {
        (0, stateplane_state::params_into([u128::from(*value)], out))
    }
}

/// A table that learns by digest: a miss queues the key for the control plane.
struct DigestLearner {
    table: DeclaredTable<KeyCodec>,
}

impl DigestLearner {
    fn new(capacity: usize) -> Self {
        let table = ExactTable::new(capacity, &[ExpireProfile::NEVER], 7);
        let decl = Declaration {
            name: "keys".into(),
            capacity,
            guarantees: vec![Guarantee::Local],
            kind: Kind::Table {
                key: vec![Field::exact("key", 64, Format::Int)],
                actions: vec![Action {
                    name: "set".into(),
                    params: vec![Field::exact("value", 64, Format::Int)],
                }],
                writable: true,
            },
        };
        DigestLearner {
            table: DeclaredTable::new(table, decl),
        }
    }

    /// One packet's table work; whether it hit.
    #[inline]
    fn packet(&mut self, key: u64, now_ns: u64) -> bool {
        match self.table.lookup(&key, now_ns) {
            Some(id) => {
                black_box(*self.table.value(id));
                true
            }
            None => {
                // The digest carries the key (the value is the controller's to choose).
                self.table.digest(&key, &0, now_ns);
                false
            }
        }
    }
}

impl Program for DigestLearner {
    type Prepared = ();

    fn process(&mut self, _burst: &mut stateplane_runtime::Burst, _ctx: &mut Context) {}

    stateplane_programs::answer_by_table!(table);
}

/// What one pass of a digest phase measured.
struct DigestPass {
    lookups: Vec<u32>,
    misses: Vec<u32>,
    /// Per inserted key: nanoseconds from its miss to its entry being visible.
    visible: Vec<u32>,
    lost: u64,
    /// Packets per second of the data plane, and entries per second the controller put in.
    mpps: f64,
    inserts_per_s: f64,
}

/// The digest baseline: phase 1 and phase 2 for each N, learning by digest; latencies from
/// a timed pass, packet rates from an untimed one.
fn digest_rows(a: &AddOnMissArgs, clock: u32, rows: &mut Vec<Row>) -> BenchResult<()> {
    let phases: Vec<(String, Option<usize>)> =
        std::iter::once(("phase 1, digest".to_string(), None))
            .chain(
                a.every
                    .iter()
                    .map(|&n| (format!("phase 2, N={n}, digest"), Some(n))),
            )
            .collect();
    for (phase, every) in phases {
        eprint!("\r{phase}   ");
        let mut timed = digest_pass(a, every, Some(clock))?;
        let untimed = digest_pass(a, every, None)?;
        eprintln!(
            "\r{phase}: {} misses, {} entries in, {} digests lost (timed pass); {} lost in the untimed pass",
            timed.misses.len(),
            timed.visible.len(),
            timed.lost,
            untimed.lost
        );
        rows.push(Row {
            phase: phase.clone(),
            every,
            kind: "miss",
            p: percentiles(&mut timed.misses),
            mpps: untimed.mpps,
        });
        if every.is_some() {
            rows.push(Row {
                phase: phase.clone(),
                every,
                kind: "lookup",
                p: percentiles(&mut timed.lookups),
                mpps: untimed.mpps,
            });
        }
        rows.push(Row {
            phase,
            every,
            kind: "visible",
            p: percentiles(&mut timed.visible),
            mpps: untimed.inserts_per_s / 1e6,
        });
    }
    Ok(())
}

/// One pass of a digest phase (`every`: None for phase 1), per-packet timing when `clock`
/// (the clock's cost) is given.
fn digest_pass(
    a: &AddOnMissArgs,
    every: Option<usize>,
    clock: Option<u32>,
) -> BenchResult<DigestPass> {
    const BURST: usize = 64;
    let most_inserts = a.packets / a.every.iter().copied().min().unwrap_or(1) + 1;
    let epoch = Instant::now();
    let now_ns = move || epoch.elapsed().as_nanos() as u64;
    let mut learner = DigestLearner::new(a.keys + most_inserts);
    let loaded = if every.is_some() { a.keys } else { 0 };
    for i in 0..loaded as u64 {
        let _ = learner.table.add_entry(key(i), i, 0, 0);
    }
    let (plane, mut ends) = ControlPlane::new(1, Box::new(DigestLearner::new(1)));
    let mut control = ends.pop().ok_or("no worker end")?;
    let digests = plane.subscribe();
    let done = Arc::new(AtomicBool::new(false));
    // The controller: takes what digests there are (up to 1024), inserts them in one write,
    // and notes for each how long after its miss the entry was in.
    let controller = {
        let (plane, done) = (plane.clone(), done.clone());
        std::thread::spawn(move || -> Result<(Vec<u32>, u64), String> {
            let (mut visible, mut last) = (Vec::new(), 0u64);
            loop {
                let first = match digests.recv_timeout(std::time::Duration::from_millis(20)) {
                    Ok(d) => d,
                    Err(_) if done.load(Ordering::Acquire) => break,
                    Err(_) => continue,
                };
                let batch: Vec<Notification> = std::iter::once(first)
                    .chain(digests.try_iter().take(1023))
                    .collect();
                let writes = batch
                    .iter()
                    .map(|d| {
                        Write::Insert(Entry {
                            key: d.entry.key.clone(),
                            action: "set".into(),
                            params: vec![1],
                            priority: 0,
                            hits: 0,
                        })
                    })
                    .collect();
                let write = Request::Write {
                    table: "keys".into(),
                    writes,
                };
                plane.submit(write).map_err(|e| e.to_string())?;
                last = now_ns();
                for d in &batch {
                    visible.push(last.saturating_sub(d.at_ns).min(u64::from(u32::MAX)) as u32);
                }
            }
            Ok((visible, last))
        })
    };
    let ctx = Context::one_worker(0, stateplane_wire::FlowHasher::with_seed(1), 1);
    let (mut lookups, mut misses) = (Vec::new(), Vec::new());
    let mut missed = 0u64;
    let packets = every.map_or(a.keys, |_| a.packets);
    let mut keys = Keys::new(a.keys);
    keys.next_new = loaded as u64;
    let start = now_ns();
    for p in 1..=packets {
        let k = keys.next(every.is_none_or(|n| p % n == 0));
        // The digest's timestamp is for the latency measurement only: the untimed pass
        // does without the clock reading.
        let at = if clock.is_some() { now_ns() } else { 0 };
        let t = clock.map(|_| Instant::now());
        let hit = learner.packet(k, at);
        if let (Some(t), Some(clock)) = (t, clock) {
            let ns = (t.elapsed().as_nanos() as u32).saturating_sub(clock);
            if hit { &mut lookups } else { &mut misses }.push(ns);
        }
        missed += u64::from(!hit);
        if p % BURST == 0 {
            control.poll(&mut learner, &ctx);
        }
    }
    let mpps = packets as f64 / ((now_ns() - start) as f64 / 1e9) / 1e6;
    control.poll(&mut learner, &ctx);
    let lost =
        learner.table.notifications_dropped() + plane.notifications_dropped.load(Ordering::Relaxed);
    // Keep applying the controller's writes until every digest that was not lost is in.
    let want = loaded + (missed - lost) as usize;
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while learner.table.len() < want && Instant::now() < deadline {
        control.poll(&mut learner, &ctx);
        std::thread::yield_now();
    }
    done.store(true, Ordering::Release);
    // Answer the controller's last write, if any, while it finishes.
    while !controller.is_finished() {
        control.poll(&mut learner, &ctx);
        std::thread::yield_now();
    }
    let (visible, last) = controller
        .join()
        .map_err(|_| "the controller thread failed")??;
    let inserts_per_s = visible.len() as f64 / (last.saturating_sub(start) as f64 / 1e9);
    Ok(DigestPass {
        lookups,
        misses,
        visible,
        lost,
        mpps,
        inserts_per_s,
    })
}
