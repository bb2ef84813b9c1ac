//! `stateplane bench-replication`: programs over generated captures, unreplicated and with
//! their per-flow state replicated linearizably to the memory store and to a real
//! redis-server on loopback, in one run, at each burst size; beside it, the same run's
//! measure of the store's sequenced write one flow per call, so that the replicated rate
//! reads as a multiple of the store's.
//!
//! The programs: `counter` (every packet writes its flow: replication's worst case, on the
//! internet workload), `firewall` (its connections: written when a connection's state
//! moves, read by the rest; on the datacenter workload's longer flows), `nat` (its
//! translations, on the same workload from the inside: written when a connection is
//! made or closes), `lb` (its connections, on the kv workload's requests to a VIP of four
//! backends: written when a client's first request places it), `sgw` (its sessions, on the gtp workload: signaling writes, users'
//! packets read) and `kv` (its cache: PUTs write, GETs read) at two update ratios.
//!
//! Beside each Redis row, the server's CPU time over the time the switch forwarded
//! (`store CPU`: 0.5 is half a core), the share of this host's cores the store took from
//! the switch. The server's time is read before and after the switch's process, whose
//! start and end (connecting, loading the functions) count too: the share errs high.
//!
//! The read-centric programs (`firewall`, `nat`, `lb`, `sgw`) also run over their trace
//! as eight passes of established flows (`stateplane_gen::established`: connections open
//! throughout, none opened or closed after the first pass) and over its first pass alone:
//! the later passes' packets over the time they added (`established`) is the rate on
//! flows whose leases and state the switch holds already, each run's start, first leases
//! and end taken out, which is what their target is read on. (`counter` and `kv` are read
//! against the store's rate.)
//!
//! Each round runs every mode in turn, and each ratio is the median over rounds of a
//! round's figure over its unreplicated run's: the host's speed, which moves between
//! rounds on a shared machine, moves a ratio's two sides alike.
//!
//! The run checks its work before it prints: every replicated run forwards as many packets
//! as the unreplicated one and drops none, and for `counter` Redis holds, summed over its
//! flows, every packet counted.

use crate::BenchResult;
use crate::results::{Csv, ResultFiles, Table};
use crate::statistics::median;
use stateplane_gen::established::{Passes, generate_established};
use stateplane_gen::{GenConfig, Workload, generate};
use stateplane_io::capture::CaptureWriter;
use stateplane_runtime::Counter;
use stateplane_switch::assemble::Switch;
use stateplane_switch::units::bounded;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct BenchReplicationArgs {
    /// Packets in the generated trace (internet workload).
    #[arg(long, default_value_t = 100_000)]
    pub packets: u64,
    /// Flows in it.
    #[arg(long, default_value_t = 1_000)]
    pub flows: u64,
    /// The programs measured, comma-separated: counter, firewall, nat, lb, sgw, kv (kv at
    /// 5% and at 50% PUTs).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "counter,firewall,nat,lb,sgw,kv"
    )]
    pub programs: Vec<String>,
    /// Comma-separated burst sizes.
    #[arg(long, default_value = "64,256")]
    pub bursts: String,
    /// Repeat each measurement and report the median.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

struct Row {
    program: String,
    mode: &'static str,
    burst: usize,
    pps: f64,
    /// The median of each round's rate over the unreplicated run's of the same round.
    vs_unreplicated: f64,
    /// The rate on established flows, median over the rounds (`None`: not measured, or
    /// the runs' times too close to tell it in most rounds).
    established_pps: Option<f64>,
    /// The median of each round's established rate over the unreplicated one's.
    established_vs_unreplicated: Option<f64>,
    writes: u64,
    folded: u64,
    round_trips: u64,
    /// Redis: the server's CPU time over the time the switch forwarded (median; 0.5: half
    /// a core).
    store_cpu: Option<f64>,
}

/// A mode's runs at a burst size, one of each kind a round.
#[derive(Default)]
struct Measured {
    rates: Vec<f64>,
    /// Per round: the rate on established flows, if told apart from the host's noise.
    established: Vec<Option<f64>>,
    store_cpu: Vec<f64>,
    last: Option<Ran>,
}

impl Measured {
    /// The median of the rounds' established rates, if most rounds told one.
    fn established_median(&self) -> Option<f64> {
        let told: Vec<f64> = self.established.iter().flatten().copied().collect();
        (told.len() * 2 > self.established.len()).then(|| median(told))
    }

    /// The median over rounds of the established rate over `baseline`'s of the same
    /// round, if most rounds told both.
    fn established_ratio(&self, baseline: &Measured) -> Option<f64> {
        let ratios: Vec<f64> = (self.established.iter().zip(&baseline.established))
            .filter_map(|(e, b)| Some((*e)? / (*b)?))
            .collect();
        (ratios.len() * 2 > self.established.len()).then(|| median(ratios))
    }
}

/// The median over rounds of each round's `rates` over its `baseline`.
fn median_ratio(rates: &[f64], baseline: &[f64]) -> f64 {
    median(rates.iter().zip(baseline).map(|(r, b)| r / b).collect())
}

/// A program measured: its `[program]` configuration (forwarding p0 to p1), the state
/// it replicates, and the capture it reads.
struct Case {
    name: String,
    program: String,
    state: &'static str,
    trace: PathBuf,
    /// A read-centric program's trace as established flows ([`established`]): its first
    /// pass alone, all its passes, and what they hold.
    established: Option<(PathBuf, PathBuf, Passes)>,
}

/// What a run of a case gave: packets a second and forwarded, and the replication
/// report's writes, folded changes and round trips.
struct Ran {
    wall_s: f64,
    pps: f64,
    tx: u64,
    writes: u64,
    folded: u64,
    round_trips: u64,
}

/// Runs `case` over `trace` at `burst` with `extra` configuration, checking that it read
/// the whole trace (`packets`) and dropped nothing as unreplicated.
fn run_case(
    case: &Case,
    trace: &Path,
    burst: usize,
    extra: &str,
    packets: u64,
) -> BenchResult<Ran> {
    let text = format!(
        "burst = {burst}\n{}\n[[port]]\nname = \"p0\"\nrx = \"{}\"\n[[port]]\nname = \"p1\"\n{extra}",
        case.program,
        trace.display()
    );
    let outcome = Switch::from_toml(&text, Path::new("."))?.run()?;
    let total = &outcome.report.total;
    let rx = total.get(Counter::RxPackets);
    if rx != packets {
        return Err(format!(
            "a run of {} read {rx} packets, the trace having {packets}",
            case.name
        ));
    }
    let r = outcome.replication.as_ref();
    if let Some(r) = r
        && r.dropped > 0
    {
        return Err(format!(
            "{}: {} of {packets} packets dropped as unreplicated ({} requests fenced: the store \
             fell behind its leases), so its rate would not be comparable; a shorter trace \
             (--packets) keeps the store within them (docs/BENCHMARKS.md)",
            case.name, r.dropped, r.fenced
        ));
    }
    Ok(Ran {
        wall_s: outcome.report.wall.as_secs_f64(),
        pps: packets as f64 / outcome.report.wall.as_secs_f64(),
        tx: total.get(Counter::TxPackets),
        writes: r.map_or(0, |r| r.writes),
        folded: r.map_or(0, |r| r.coalesced),
        round_trips: r.map_or(0, |r| r.round_trips),
    })
}

/// Writes a generated capture of `cfg` to `path`; its packets and flows.
pub(crate) fn write_trace(cfg: &GenConfig, path: &Path) -> BenchResult<(u64, u64)> {
    let mut writer = CaptureWriter::create(path).map_err(|e| e.to_string())?;
    let summary = generate(cfg, |ts, f| writer.write(ts, f, f.len() as u32), |_| {})
        .map_err(|e| e.to_string())?;
    writer.flush().map_err(|e| e.to_string())?;
    Ok((summary.packets, summary.flows))
}

/// Passes over a trace of established flows in the run that measures their rate: the
/// first sees the flows come, the others are timed.
const PASSES: u64 = 8;

/// Writes `cfg`'s trace as [`PASSES`] passes of established flows
/// ([`generate_established`]) to `passes`, and its first pass alone to `first`.
fn write_established(cfg: &GenConfig, first: &Path, passes: &Path) -> BenchResult<Passes> {
    let mut first_out = CaptureWriter::create(first).map_err(|e| e.to_string())?;
    let mut out = CaptureWriter::create(passes).map_err(|e| e.to_string())?;
    let written = generate_established(cfg, PASSES, |pass, ts, f| {
        if pass == 0 {
            first_out.write(ts, f, f.len() as u32)?;
        }
        out.write(ts, f, f.len() as u32)
    })
    .map_err(|e| e.to_string())?;
    first_out.flush().map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    Ok(written)
}

/// The rate on established flows: the later passes' packets (`later`, all of them) over
/// the time they added to the first pass's (the median times of runs over the first pass
/// alone and over all passes); `None` when that time is not a tenth of the first pass's
/// (too small against the host's noise to tell a rate from).
fn established_rate(later: u64, first_s: f64, passes_s: f64) -> Option<f64> {
    let added = passes_s - first_s;
    (added > first_s / 10.0).then(|| later as f64 / added)
}

fn check_forwarded(case: &str, mode: &str, tx: u64, expected: &mut Option<u64>) -> BenchResult<()> {
    let expected = *expected.get_or_insert(tx);
    if tx != expected {
        return Err(format!(
            "{case} replicated to {mode} forwarded {tx} packets, unreplicated {expected}"
        ));
    }
    Ok(())
}

/// Every packet of the later passes over established flows was forwarded (`all` ran all
/// passes, `first` the first alone): what is timed is established flows' forwarding, not
/// drops (a segment out of its window, a flow the program does not know).
fn check_later_passes_forwarded(
    case: &str,
    first: &Ran,
    all: &Ran,
    written: &Passes,
) -> BenchResult<()> {
    let later = (PASSES - 1) * written.later;
    let forwarded = all.tx.saturating_sub(first.tx);
    if forwarded != later {
        return Err(format!(
            "{case}: the passes over established flows after the first forwarded {forwarded} \
             of their {later} packets"
        ));
    }
    Ok(())
}

/// Redis's `counter` records count, summed, the `packets` the run counted.
fn check_counted(url: &str, packets: u64) -> BenchResult<()> {
    let counted = counted_in_redis(url)?;
    if counted != packets {
        return Err(format!(
            "Redis holds {counted} packets counted, not {packets}"
        ));
    }
    Ok(())
}

/// The CPU time redis-server has used so far (`INFO cpu`: user and system, seconds), so
/// that a run's share of the host taken by the store beside the switch can be told.
fn redis_cpu_seconds(conn: &mut redis::Connection) -> BenchResult<f64> {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query(conn)
        .map_err(|e| e.to_string())?;
    let field = |name: &str| -> BenchResult<f64> {
        (info.lines())
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("redis INFO cpu has no {name}: {info}"))
    };
    Ok(field("used_cpu_user")? + field("used_cpu_sys")?)
}

/// Packets counted over every flow's record in Redis.
fn counted_in_redis(url: &str) -> BenchResult<u64> {
    let mut conn = crate::redis_connection(url)?;
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
    const PROGRAMS: [&str; 6] = ["counter", "firewall", "nat", "lb", "sgw", "kv"];
    if let Some(p) = (a.programs.iter()).find(|p| !PROGRAMS.contains(&p.as_str())) {
        return Err(format!(
            "--programs: '{p}' is not one of {}",
            PROGRAMS.join(", ")
        ));
    }
    let scratch = crate::Scratch::new("bench-replication")?;
    let dir = scratch.path();
    let mut cases = Vec::new();
    let mut traces = Vec::new();
    let forward = "map = { p0 = \"p1\" }";
    for (name, workload, get_share) in [
        ("counter", Workload::Internet, None),
        ("firewall", Workload::Datacenter, None),
        ("nat", Workload::Datacenter, None),
        ("lb", Workload::Kv, None),
        ("sgw", Workload::Gtp, None),
        ("kv, 5% PUT", Workload::Kv, Some(0.95)),
        ("kv, 50% PUT", Workload::Kv, Some(0.5)),
    ] {
        let program = name.split(',').next().unwrap_or(name);
        if !a.programs.iter().any(|p| p == program) {
            continue;
        }
        let mut cfg = GenConfig::new(workload, a.packets);
        (cfg.seed, cfg.flows) = (a.seed, Some(a.flows));
        if let Some(share) = get_share {
            cfg.kv_get_share = share;
        }
        // The VIP is an IPv4 address: every request is to it.
        if name == "lb" {
            cfg.ipv6_share = 0.0;
        }
        let trace = dir.join(format!("{}.pcap", traces.len()));
        let (packets, flows) = write_trace(&cfg, &trace)?;
        let established = match name {
            "firewall" | "nat" | "lb" | "sgw" => {
                let first = dir.join(format!("{}-first.pcap", traces.len()));
                let passes = dir.join(format!("{}-passes.pcap", traces.len()));
                let written = write_established(&cfg, &first, &passes)?;
                Some((first, passes, written))
            }
            _ => None,
        };
        traces.push((name, workload.name(), packets, flows));
        let (program, state) = match name {
            "counter" => (
                format!(
                    "[program]\nname = \"counter\"\n[program.counter]\n{forward}\ncapacity = 1048576"
                ),
                "flows",
            ),
            "firewall" => (
                "[program]\nname = \"firewall\"\n[program.firewall]\ninside = \"p0\"".to_owned(),
                "connections",
            ),
            // Every packet comes from the inside: each direction of a connection is a
            // connection of its own, translated on its way out.
            "nat" => (
                "[program]\nname = \"nat\"\n[program.nat]\ninside = \"p0\"\noutside = \"p1\"\n\
                 external = \"198.18.255.100\""
                    .to_owned(),
                "translations",
            ),
            // Each client's requests to the VIP are a connection, placed on one of four
            // backends by its first packet (written) and followed by the rest (read).
            "lb" => (
                format!(
                    "[program]\nname = \"lb\"\n[program.lb]\nclients = \"p0\"\nservers = \"p1\"\n\
                     [[program.lb.vips]]\naddress = \"{}\"\nport = {}\nproto = \"udp\"\n\
                     backends = [{{ address = \"198.18.200.1\" }}, {{ address = \"198.18.200.2\" }}, \
                     {{ address = \"198.18.200.3\" }}, {{ address = \"198.18.200.4\" }}]",
                    stateplane_gen::KV_SERVER,
                    stateplane_wire::kv_proto::PORT
                ),
                "connections",
            ),
            "sgw" => (
                "[program]\nname = \"sgw\"\n[program.sgw]\naccess = \"p0\"\ncore = \"p1\"\n\
                 address = \"198.19.255.2\"\nue_pool = \"198.18.128.0/17\"\n\
                 ue_pool6 = \"2001:2:0:8000::/49\""
                    .to_owned(),
                "sessions",
            ),
            _ => (
                format!(
                    "[program]\nname = \"kv\"\n[program.kv]\nserver = \"{}\"\nclients = \"p0\"\nbackend = \"p1\"",
                    stateplane_gen::KV_SERVER
                ),
                "cache",
            ),
        };
        cases.push((
            Case {
                name: name.to_owned(),
                program,
                state,
                trace,
                established,
            },
            packets,
        ));
    }
    let port = stateplane_lab::free_loopback_port()?;
    let server = stateplane_lab::RedisServer::start(port, false)?;
    for (name, workload, packets, flows) in &traces {
        eprintln!(
            "{name}: {packets} packets over {flows} flows ({workload}, seed {})",
            a.seed
        );
    }
    eprintln!(
        "bursts {bursts:?}, median of {repeat}; redis-server on {}",
        server.url()
    );
    let store_rate = crate::bench_replication_store::one_flow_per_call(&server.url())?;
    // One connection reads the server's CPU time before and after each Redis run.
    let mut watch = crate::redis_connection(&server.url())?;
    let mut rows = Vec::new();
    for (case, packets) in &cases {
        let packets = *packets;
        let replicated = format!("[guarantees]\n{} = [\"replicated\"]\n", case.state);
        let redis = format!("{replicated}[replication]\nstore = \"{}\"\n", server.url());
        for &burst in &bursts {
            // What the unreplicated runs forwarded of the trace, of its first pass as
            // established flows and of all those passes.
            let (mut forwarded, mut forwarded_first, mut forwarded_passes) = (None, None, None);
            let modes = [
                ("unreplicated", ""),
                ("memory", replicated.as_str()),
                ("redis", redis.as_str()),
            ];
            let mut measured: Vec<Measured> = modes.iter().map(|_| Measured::default()).collect();
            // The modes in turn within each repetition, so that the host's speed moving
            // between repetitions moves each mode's runs and their baseline's alike.
            for round in 0..repeat {
                eprintln!(
                    "  {}, burst {burst}: round {} of {repeat}",
                    case.name,
                    round + 1
                );
                for ((mode, extra), m) in modes.iter().zip(&mut measured) {
                    let cpu_before = match *mode {
                        "redis" => {
                            server.cli(&["flushall"]);
                            Some(redis_cpu_seconds(&mut watch)?)
                        }
                        _ => None,
                    };
                    let ran = run_case(case, &case.trace, burst, extra, packets)?;
                    if let Some(before) = cpu_before {
                        let used = redis_cpu_seconds(&mut watch)? - before;
                        m.store_cpu.push(used * ran.pps / packets as f64);
                    }
                    check_forwarded(&case.name, mode, ran.tx, &mut forwarded)?;
                    if *mode == "redis" && case.name == "counter" {
                        check_counted(&server.url(), packets)?;
                    }
                    if let Some((first, passes, written)) = &case.established {
                        let all_packets = written.first + (PASSES - 1) * written.later;
                        if *mode == "redis" {
                            server.cli(&["flushall"]);
                        }
                        let once = run_case(case, first, burst, extra, written.first)?;
                        check_forwarded(&case.name, mode, once.tx, &mut forwarded_first)?;
                        if *mode == "redis" {
                            server.cli(&["flushall"]);
                        }
                        let all = run_case(case, passes, burst, extra, all_packets)?;
                        check_forwarded(&case.name, mode, all.tx, &mut forwarded_passes)?;
                        check_later_passes_forwarded(&case.name, &once, &all, written)?;
                        let later = (PASSES - 1) * written.later;
                        m.established
                            .push(established_rate(later, once.wall_s, all.wall_s));
                    }
                    m.rates.push(ran.pps);
                    m.last = Some(ran);
                }
            }
            let baseline = &measured[0];
            for ((mode, _), m) in modes.iter().zip(&measured) {
                let established = m.established_median();
                let said = match (&case.established, established) {
                    (None, _) => String::new(),
                    (Some(_), None) => ", established: not told apart from the host's noise \
                                        (try more --packets)"
                        .to_owned(),
                    (Some(_), Some(e)) => format!(", established {e:.0}"),
                };
                let pps = median(m.rates.clone());
                eprintln!(
                    "  {}, burst {burst}, {mode}: {pps:.0} packets/s{said}",
                    case.name
                );
                let last = m.last.as_ref().ok_or("no run")?;
                rows.push(Row {
                    program: case.name.clone(),
                    mode,
                    burst,
                    pps,
                    vs_unreplicated: median_ratio(&m.rates, &baseline.rates),
                    established_pps: established,
                    established_vs_unreplicated: m.established_ratio(baseline),
                    writes: last.writes,
                    folded: last.folded,
                    round_trips: last.round_trips,
                    store_cpu: (!m.store_cpu.is_empty()).then(|| median(m.store_cpu.clone())),
                });
            }
        }
    }
    drop(scratch);

    let mut table = Table::new(
        &["program", "mode", "burst"],
        &[
            "packets/s",
            "vs unreplicated",
            "established/s",
            "established vs unreplicated",
            "x store rate",
            "writes",
            "folded",
            "round trips",
            "store CPU",
        ],
    );
    let mut csv = Csv::new(
        "program,mode,burst,packets_per_s,vs_unreplicated,established_packets_per_s,\
         established_vs_unreplicated,x_store_rate,writes,folded,round_trips,store_cpu",
    );
    let established_ratio = |r: &Row| r.established_vs_unreplicated;
    let label = |r: &Row| format!("{}, {}, burst {}", r.program, r.mode, r.burst);
    for r in &rows {
        let (ratio, x_store) = (r.vs_unreplicated, r.pps / store_rate);
        let (established, established_vs) = (r.established_pps, established_ratio(r));
        table.row(vec![
            r.program.clone(),
            r.mode.into(),
            r.burst.to_string(),
            format!("{:.0}", r.pps),
            format!("{ratio:.3}"),
            established.map_or("-".into(), |e| format!("{e:.0}")),
            established_vs.map_or("-".into(), |ratio| format!("{ratio:.3}")),
            format!("{x_store:.2}"),
            r.writes.to_string(),
            r.folded.to_string(),
            r.round_trips.to_string(),
            r.store_cpu.map_or("-".into(), |c| format!("{c:.2}")),
        ]);
        csv.row(format_args!(
            "{},{},{},{:.0},{ratio:.4},{},{},{x_store:.3},{},{},{},{}",
            r.program.replace(',', ""),
            r.mode,
            r.burst,
            r.pps,
            established.map_or(String::new(), |e| format!("{e:.0}")),
            established_vs.map_or(String::new(), |ratio| format!("{ratio:.4}")),
            r.writes,
            r.folded,
            r.round_trips,
            r.store_cpu.map_or(String::new(), |c| format!("{c:.4}"))
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
            title: "Packets a second, unreplicated and replicated linearizably".into(),
            unit: "packets/s".into(),
            bars: rows
                .iter()
                .map(|r| (label(r), r.pps))
                .chain([("Redis: one-flow writes/s".to_string(), store_rate)])
                .collect(),
        };
        let established = crate::chart::Panel {
            title: "On established flows (passes 2-8 of the trace): replicated vs unreplicated"
                .into(),
            unit: "ratio".into(),
            bars: (rows.iter())
                .filter(|r| r.mode != "unreplicated")
                .filter_map(|r| Some((label(r), established_ratio(r)?)))
                .collect(),
        };
        let title = "Replication's cost by program";
        let inputs: Vec<String> = (traces.iter())
            .map(|(name, workload, packets, flows)| {
                format!("{name}: {packets} packets, {flows} flows ({workload})")
            })
            .collect();
        let subtitle = format!("{}; median of {repeat}", inputs.join("; "));
        a.files
            .write_chart(title, &subtitle, &[panel, established])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rate of the passes after the first is their packets over the time they added;
    /// a time added that the host's noise could make is no rate.
    #[test]
    fn the_established_rate_is_the_later_passes_over_the_time_they_added() {
        let rate = established_rate(900, 1.0, 4.0).unwrap();
        assert!((rate - 300.0).abs() < 1e-9, "{rate}");
        assert_eq!(established_rate(300, 1.0, 1.09), None);
        assert_eq!(established_rate(300, 1.0, 0.9), None);
        assert!(established_rate(300, 1.0, 1.11).is_some());
    }

    /// A ratio is the median of the rounds' own ratios: a round on a host twice as fast
    /// for both modes moves neither side alone; a ratio of rounds that told no rate is
    /// none when most did not.
    #[test]
    fn ratios_are_taken_round_by_round() {
        assert_eq!(median_ratio(&[1.0, 4.0, 1.0], &[2.0, 8.0, 2.0]), 0.5);
        let measured = |established: Vec<Option<f64>>| Measured {
            established,
            ..Measured::default()
        };
        let base = measured(vec![Some(2.0), Some(8.0), Some(2.0)]);
        let replicated = measured(vec![Some(1.0), Some(4.0), None]);
        assert_eq!(replicated.established_ratio(&base), Some(0.5));
        assert_eq!(replicated.established_median(), Some(2.5));
        let mostly_untold = measured(vec![Some(1.0), None, None]);
        assert_eq!(mostly_untold.established_ratio(&base), None);
        assert_eq!(mostly_untold.established_median(), None);
    }
}
