//! `stateplane bench-flood`: legitimate long connections through a stateful program while
//! a flood of new connections (TCP SYNs, or UDP datagrams, nobody answers) at many times
//! the program's table capacity arrives, with the table's early drop on and off in the
//! same run. Reports the share of legitimate packets served (forwarded where they should
//! go), of those of established connections apart, the legitimate connections refused at
//! their SYN, how many flood connections the table took, its entries at the end (never
//! past its capacity: the run fails if they are), and how much the process's resident
//! memory grew over the run (tables are allocated when the program is built, so a flood
//! must not grow it).
//!
//! The legitimate connections open over the first half of the run, so half of them open
//! while the flood has the table full: without early drop those find no room. Answers to
//! a NAT's connections are made as the packets go out, to the external port it chose.
//! Every packet is built and run one burst at a time through the program itself, on one
//! worker, in time order; the figures are counts, not timings.

use crate::BenchResult;
use crate::bench_catalog::factory;
use crate::results::{Csv, ResultFiles, Table};
use stateplane_gen::build::{Hosts, L4, emit_frame};
use stateplane_runtime::{Burst, Context, Running, Verdict};
use stateplane_state::{Reply, Request};
use stateplane_switch::units::bounded;
use stateplane_wire::ethernet::MacAddr;
use stateplane_wire::tcp::flags;
use stateplane_wire::{FlowHasher, parse};
use std::collections::HashMap;
use std::net::Ipv4Addr;

#[derive(clap::Args)]
pub struct BenchFloodArgs {
    /// Comma-separated programs: conntrack, nat, lb.
    #[arg(long, default_value = "conntrack,nat,lb")]
    pub programs: String,
    /// Connections each program's table holds.
    #[arg(long, default_value_t = 4096)]
    pub capacity: usize,
    /// Legitimate long connections, as a share of the capacity.
    #[arg(long, default_value_t = 0.25)]
    pub legit_share: f64,
    /// Flood connections over the run, as a multiple of the capacity.
    #[arg(long, default_value_t = 10)]
    pub flood_factor: usize,
    /// The flood: syn or udp (udp only for conntrack and nat: lb's VIP is TCP).
    #[arg(long, default_value = "syn")]
    pub flood: String,
    /// Seconds of traffic (the data-plane clock): longer than the flood's embryonic
    /// timeouts, so that the table is full for most of the run.
    #[arg(long, default_value_t = 90)]
    pub seconds: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

const SECOND: u64 = 1_000_000_000;
/// A legitimate connection sends a packet each way this often.
const DATA_EVERY: u64 = SECOND / 5;
const BURST: usize = 32;
const EXTERNAL: Ipv4Addr = Ipv4Addr::new(198, 18, 255, 1);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 100);
const SERVER: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 2);

/// Each program: its settings (`CAPACITY` and `EARLY` filled in), the table it keeps
/// connections in, and whether it sees answers (a one-armed load balancer does not).
const SETUPS: &[(&str, &str, &str, bool)] = &[
    (
        "conntrack",
        "capacity = CAPACITY\nearly_drop = EARLY",
        "connections",
        true,
    ),
    (
        "nat",
        "external = \"198.18.255.1\"\ncapacity = CAPACITY\nearly_drop = EARLY",
        "translations",
        true,
    ),
    (
        "lb",
        "clients = \"p0\"\nservers = \"p1\"\ncapacity = CAPACITY\nearly_drop = EARLY\n\
         [[vips]]\naddress = \"198.19.0.100\"\nport = 80\n\
         backends = [{ address = \"198.19.1.1\" }, { address = \"198.19.1.2\" }, \
         { address = \"198.19.1.3\" }, { address = \"198.19.1.4\" }]",
        "connections",
        false,
    ),
];

/// What a packet of the run is.
#[derive(Clone, Copy)]
enum Kind {
    /// Legitimate connection `i`: its opening (SYN, or the SYN+ACK answer, or the ACK) or
    /// its data, from the client or from the server.
    Legit {
        i: u32,
        step: Step,
        from_client: bool,
    },
    Flood(u32),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    Syn,
    SynAck,
    Ack,
    Data,
}

/// One run's counts.
#[derive(Default)]
struct Outcome {
    legit: u64,
    legit_served: u64,
    established: u64,
    established_served: u64,
    /// Legitimate connections whose SYN was not served.
    opens_refused: u64,
    flood: u64,
    flood_taken: u64,
    counters: HashMap<&'static str, u64>,
    /// Resident memory before the program was built, after, and after its run.
    rss_kib: [u64; 3],
}

fn resident_kib() -> u64 {
    stateplane_mem::budget::resident(stateplane_mem::budget::Resident::Now).unwrap_or(0) / 1024
}

fn host(i: u32, base: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, base, (i >> 8) as u8, i as u8)
}

/// The time-ordered packets of a run: `legit` connections opening over the first half,
/// each sending both ways every [`DATA_EVERY`] until the end; `flood` new connections
/// spread over the whole run.
fn schedule(legit: u32, flood: u32, seconds: u64, answers: bool) -> Vec<(u64, Kind)> {
    let end = seconds * SECOND;
    let mut events = Vec::new();
    for i in 0..legit {
        let start = u64::from(i) * (end / 2) / u64::from(legit.max(1));
        let legit = |step, from_client| Kind::Legit {
            i,
            step,
            from_client,
        };
        events.push((start, legit(Step::Syn, true)));
        if answers {
            events.push((start + 5_000_000, legit(Step::SynAck, false)));
        }
        events.push((start + 10_000_000, legit(Step::Ack, true)));
        let mut t = start + DATA_EVERY;
        while t < end {
            events.push((t, legit(Step::Data, true)));
            if answers {
                events.push((t + DATA_EVERY / 2, legit(Step::Data, false)));
            }
            t += DATA_EVERY;
        }
    }
    for f in 0..flood {
        events.push((u64::from(f) * end / u64::from(flood.max(1)), Kind::Flood(f)));
    }
    events.sort_by_key(|(t, _)| *t);
    events
}

/// The frame of a packet, or `None` for a NAT's answer to a connection it never took.
fn frame(
    program: &str,
    kind: Kind,
    udp_flood: bool,
    nat_ports: &HashMap<u32, u16>,
    out: &mut Vec<u8>,
) -> Option<(u16, bool)> {
    let client_mac = MacAddr([2, 0, 0, 0, 0, 1]);
    let server_mac = MacAddr([2, 0, 0, 0, 0, 2]);
    let hosts = |src: Ipv4Addr, dst: Ipv4Addr, from_client: bool| Hosts {
        src_mac: if from_client { client_mac } else { server_mac },
        dst_mac: if from_client { server_mac } else { client_mac },
        vlan: 0,
        src: src.into(),
        dst: dst.into(),
        ttl: 64,
    };
    let server = if program == "lb" { VIP } else { SERVER };
    let tcp = |src_port, dst_port, f| L4::Tcp {
        src_port,
        dst_port,
        seq: 1,
        ack: 1,
        flags: f,
    };
    let (h, l4, port, legit) = match kind {
        Kind::Flood(f) => {
            let src = host(f, 18);
            let dst = if program == "lb" { VIP } else { host(f, 19) };
            let l4 = if udp_flood {
                L4::Udp {
                    src_port: 1024 + (f % 60_000) as u16,
                    dst_port: 53,
                }
            } else {
                tcp(1024 + (f % 60_000) as u16, 80, flags::SYN)
            };
            (hosts(src, dst, true), l4, 0, false)
        }
        Kind::Legit {
            i,
            step,
            from_client,
        } => {
            let client = Ipv4Addr::new(198, 18, 200, 0).to_bits() + i;
            let client = Ipv4Addr::from_bits(client);
            let f = match step {
                Step::Syn => flags::SYN,
                Step::SynAck => flags::SYN | flags::ACK,
                Step::Ack | Step::Data => flags::ACK,
            };
            let cport = 40_000 + (i % 20_000) as u16;
            if from_client {
                (hosts(client, server, true), tcp(cport, 80, f), 0, true)
            } else if program == "nat" {
                let ext = *nat_ports.get(&i)?;
                (hosts(SERVER, EXTERNAL, false), tcp(80, ext, f), 1, true)
            } else {
                (hosts(SERVER, client, false), tcp(80, cport, f), 1, true)
            }
        }
    };
    emit_frame(out, &h, &l4, &[0; 18]);
    Some((port, legit))
}

/// Runs one program's flood, with early drop on or off.
fn run(
    program: &str,
    settings: &str,
    table: &str,
    events: &[(u64, Kind)],
    udp_flood: bool,
) -> BenchResult<Outcome> {
    let rss_before = resident_kib();
    let factory = factory(program, settings)?;
    let mut p: Box<dyn Running> = factory(0);
    let mut ctx = Context::one_worker(0, FlowHasher::with_seed(1), 2);
    let mut o = Outcome {
        rss_kib: [rss_before, resident_kib(), 0],
        ..Outcome::default()
    };
    let mut nat_ports: HashMap<u32, u16> = HashMap::new();
    let mut burst = Burst::with_capacity(BURST);
    let mut kinds = Vec::with_capacity(BURST);
    let mut buf = Vec::new();
    for chunk in events.chunks(BURST) {
        burst.clear();
        kinds.clear();
        for &(t, kind) in chunk {
            // Answers in the same burst as their SYN find no port yet: they go next burst
            // in a real switch too (they come a round trip later).
            if let Some((port, _)) = frame(program, kind, udp_flood, &nat_ports, &mut buf) {
                burst.push(&buf, buf.len() as u32, t, port, 0);
                kinds.push(kind);
            }
        }
        let now = chunk.last().map_or(0, |e| e.0);
        burst.now_ns = now;
        ctx.now_ns = now;
        burst.parse(&ctx.hasher);
        p.process(&mut burst, &mut ctx);
        for (i, &kind) in kinds.iter().enumerate() {
            let served = matches!(burst.descs()[i].verdict, Verdict::Forward(_));
            match kind {
                Kind::Flood(_) => {
                    o.flood += 1;
                    o.flood_taken += u64::from(served);
                }
                Kind::Legit {
                    i: flow,
                    step,
                    from_client,
                } => {
                    o.legit += 1;
                    o.legit_served += u64::from(served);
                    if step == Step::Data {
                        o.established += 1;
                        o.established_served += u64::from(served);
                    }
                    o.opens_refused += u64::from(step == Step::Syn && !served);
                    if program == "nat" && step == Step::Syn && from_client && served {
                        let out = parse(burst.data(i), 0, &ctx.hasher)
                            .map_err(|e| format!("nat's translated SYN: {e:?}"))?;
                        nat_ports.insert(flow, out.key.src_port);
                    }
                }
            }
        }
    }
    let stats = Request::Stats {
        table: table.to_string(),
    };
    if let Ok(Reply::Counters(cs)) = p.control(&stats, None, &ctx) {
        o.counters = cs.into_iter().collect();
    }
    o.rss_kib[2] = resident_kib();
    Ok(o)
}

fn share(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

pub fn main(a: BenchFloodArgs) -> BenchResult<()> {
    let capacity = bounded("--capacity", a.capacity, 64, 1 << 22)?;
    let factor = bounded("--flood-factor", a.flood_factor, 1, 1000)?;
    let seconds = bounded("--seconds", a.seconds as usize, 10, 3600)? as u64;
    if !(a.legit_share > 0.0 && a.legit_share <= 0.9) {
        return Err(format!(
            "--legit-share: {} is not a share of the capacity from 0 to 0.9",
            a.legit_share
        ));
    }
    let udp_flood = match a.flood.as_str() {
        "syn" => false,
        "udp" => true,
        other => return Err(format!("--flood: '{other}' is not syn or udp")),
    };
    let chosen = (a.programs.split(','))
        .map(str::trim)
        .map(|name| {
            SETUPS
                .iter()
                .find(|s| s.0 == name)
                .ok_or_else(|| format!("--programs: '{name}' is not one of conntrack, nat, lb"))
        })
        .collect::<BenchResult<Vec<_>>>()?;
    if udp_flood && chosen.iter().any(|s| s.0 == "lb") {
        return Err(
            "--flood udp: lb's VIP is TCP, so a UDP flood never reaches its table; \
                    leave lb out (--programs conntrack,nat)"
                .into(),
        );
    }
    let legit = (capacity as f64 * a.legit_share) as u32;
    let flood = (capacity * factor) as u32;
    println!(
        "capacity {capacity} per table, {legit} legitimate connections (half opening during \
         the flood, a packet each way every 200 ms), a {} flood of {flood} connections \
         ({factor}x) over {seconds} s; one worker, bursts of {BURST}",
        a.flood
    );
    let mut rows = Vec::new();
    for (i, &&(name, settings, table, answers)) in chosen.iter().enumerate() {
        let events = schedule(legit, flood, seconds, answers);
        for early in [true, false] {
            eprintln!(
                "[{}/{}] {name}, early drop {}: {} packets",
                2 * i + usize::from(!early) + 1,
                2 * chosen.len(),
                if early { "on" } else { "off" },
                events.len()
            );
            let settings = settings
                .replace("CAPACITY", &capacity.to_string())
                .replace("EARLY", &early.to_string());
            let o = run(name, &settings, table, &events, udp_flood)?;
            let entries = o.counters.get("entries").copied().unwrap_or(0);
            if entries > capacity as u64 {
                return Err(format!(
                    "{name}: {entries} entries in a table of {capacity}: the budget did not hold"
                ));
            }
            rows.push((name, early, o));
        }
    }
    let mut t = Table::new(
        &["program", "early drop"],
        &[
            "legit served",
            "established served",
            "legit refused",
            "flood taken",
            "early dropped",
            "refused full",
            "entries",
            "RSS growth MiB",
        ],
    );
    let mib = |kib: u64| format!("{:.1}", kib as f64 / 1024.0);
    for (name, early, o) in &rows {
        let c = |k| o.counters.get(k).copied().unwrap_or(0);
        t.row(vec![
            name.to_string(),
            if *early { "on" } else { "off" }.into(),
            format!("{:.2}%", share(o.legit_served, o.legit)),
            format!("{:.2}%", share(o.established_served, o.established)),
            format!("{} of {legit}", o.opens_refused),
            format!("{:.1}%", share(o.flood_taken, o.flood)),
            c("early_dropped").to_string(),
            c("adds_refused_full").to_string(),
            c("entries").to_string(),
            mib(o.rss_kib[2].saturating_sub(o.rss_kib[1])),
        ]);
    }
    t.print();
    if let Some(path) = &a.files.csv {
        let mut csv = Csv::new(
            "program,early_drop,capacity,legit_connections,legit_refused,legit_packets,legit_served,established_packets,established_served,flood_packets,flood_taken,early_dropped,refused_full,entries,rss_before_kib,rss_built_kib,rss_after_kib",
        );
        for (name, early, o) in &rows {
            let c = |k| o.counters.get(k).copied().unwrap_or(0);
            csv.row(format_args!(
                "{name},{early},{capacity},{legit},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                o.opens_refused,
                o.legit,
                o.legit_served,
                o.established,
                o.established_served,
                o.flood,
                o.flood_taken,
                c("early_dropped"),
                c("adds_refused_full"),
                c("entries"),
                o.rss_kib[0],
                o.rss_kib[1],
                o.rss_kib[2]
            ));
        }
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let bars = (rows.iter())
            .map(|(name, early, o)| {
                let on = if *early { "on" } else { "off" };
                (
                    format!("{name}, early drop {on}"),
                    share(o.established_served, o.established),
                )
            })
            .collect();
        let panel = crate::chart::Panel {
            title: "established connections' packets served".into(),
            unit: "%".into(),
            bars,
        };
        a.files.write_chart(
            &format!("A {} flood at {factor}x the table", a.flood),
            &format!(
                "capacity {capacity}, {legit} legitimate connections, {flood} flood connections over {seconds} s"
            ),
            &[panel],
        )?;
    }
    Ok(())
}
