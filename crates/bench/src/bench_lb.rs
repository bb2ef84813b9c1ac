//! `stateplane bench-lb`: what a change of `lb`'s backends at run time does to the
//! connections, change by change (backends inserted, reweighted, drained, marked down and
//! up, deleted, each through the control plane as `ctl` makes it). For each change: the
//! share of new connections that now reach another backend (Maglev's disruption), beside
//! the least share any scheme must move (the weights' change) and the share a modulo hash
//! over the same backends moves; and the open connections, every one of which must stay on
//! its backend unless that backend was taken away (checked, connection by connection).

use crate::chart::Panel;
use crate::results::{Csv, ResultFiles, Table};
use crate::statistics::median;
use crate::{BenchResult, run_frames};
use stateplane_gen::build::{Hosts, L4, emit_frame};
use stateplane_programs::PortNames;
use stateplane_runtime::{Context, Running, Verdict};
use stateplane_state::control::{Entry, Match, Request, Write};
use stateplane_wire::tcp::flags;
use stateplane_wire::{FlowHasher, MacAddr};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchLbArgs {
    /// Backends of the VIP at the start (weight 1 each).
    #[arg(long, default_value_t = 10)]
    pub backends: u8,
    /// Open connections, and as many new ones probed after each change.
    #[arg(long, default_value_t = 100_000)]
    pub connections: u32,
    /// Maglev slots of the VIP (a prime).
    #[arg(long, default_value_t = 65_537)]
    pub table_size: usize,
    /// Run the changes this many times; the apply times are the medians.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    #[command(flatten)]
    pub files: ResultFiles,
}

const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);
const CLIENTS: u16 = 0;
const SERVERS: u16 = 1;
const TCP: u8 = 6;

/// Backend `n`'s address.
fn backend(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 1, n)
}

/// What the control plane does to a backend in one change.
#[derive(Debug, Clone, Copy)]
enum Change {
    Insert { weight: u16 },
    Weight(u16),
    Drain,
    Down,
    Up,
    Delete,
}

/// The changes, in order: (backend, change), the backends being those `backends` starts
/// with (1 to n) and two more (n + 1, n + 2).
fn changes(n: u8) -> Vec<(u8, Change)> {
    vec![
        (n + 1, Change::Insert { weight: 1 }),
        (n + 2, Change::Insert { weight: 2 }),
        (4, Change::Weight(3)),
        (5, Change::Drain),
        (6, Change::Down),
        (6, Change::Up),
        (n + 1, Change::Delete),
        (2, Change::Delete),
    ]
}

fn describe(b: u8, change: Change) -> String {
    let b = backend(b);
    match change {
        Change::Insert { weight } => format!("insert {b} (weight {weight})"),
        Change::Weight(w) => format!("weight {b} to {w}"),
        Change::Drain => format!("drain {b}"),
        Change::Down => format!("down {b}"),
        Change::Up => format!("up {b}"),
        Change::Delete => format!("delete {b}"),
    }
}

/// A backend as the bench expects it to be: its weight and what it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Expected {
    weight: u16,
    state: &'static str,
}

/// Each backend's share of new connections by the weights of those up.
fn shares(pool: &BTreeMap<u8, Expected>) -> BTreeMap<u8, f64> {
    let up = || pool.iter().filter(|(_, e)| e.state == "up");
    let total: f64 = up().map(|(_, e)| f64::from(e.weight)).sum();
    up().map(|(&b, e)| (b, f64::from(e.weight) / total))
        .collect()
}

/// The least share of new connections a change of `before` into `after` must move: the
/// shares' total variation distance.
fn least_moved(before: &BTreeMap<u8, Expected>, after: &BTreeMap<u8, Expected>) -> f64 {
    let (a, b) = (shares(before), shares(after));
    let all: std::collections::BTreeSet<u8> = a.keys().chain(b.keys()).copied().collect();
    let get = |m: &BTreeMap<u8, f64>, k| m.get(&k).copied().unwrap_or(0.0);
    all.iter()
        .map(|&k| (get(&a, k) - get(&b, k)).abs())
        .sum::<f64>()
        / 2.0
}

/// Where a modulo hash over the backends up (each repeated by its weight) sends flow `id`.
fn modulo_pick(pool: &BTreeMap<u8, Expected>, id: u32) -> Option<u8> {
    let slots: Vec<u8> = (pool.iter())
        .filter(|(_, e)| e.state == "up")
        .flat_map(|(&b, e)| std::iter::repeat_n(b, usize::from(e.weight)))
        .collect();
    let mut z = u64::from(id).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (!slots.is_empty()).then(|| slots[(z % slots.len() as u64) as usize])
}

fn lb(n: u8, connections: u32, table_size: usize) -> BenchResult<Box<dyn Running>> {
    let backends: Vec<String> = (1..=n)
        .map(|b| format!("{{ address = \"{}\" }}", backend(b)))
        .collect();
    let config = format!(
        "clients = \"0\"\nservers = \"1\"\ncapacity = {}\ntable_size = {table_size}\n\
         [[vips]]\naddress = \"{VIP}\"\nport = 80\nbackends = [{}]\n",
        u64::from(connections) * 2,
        backends.join(", ")
    );
    let table: toml::Value = toml::from_str(&config).map_err(|e| e.to_string())?;
    let names = PortNames(vec!["0".into(), "1".into()]);
    let factory =
        stateplane_programs::build("lb", Some(&table), &names).map_err(|e| e.to_string())?;
    Ok(factory(0))
}

/// Client connection `id`'s packet to the VIP with these TCP flags. Open connections and
/// probes take ids from separate ranges.
fn packet(id: u32, tcp_flags: u8) -> Vec<u8> {
    let hosts = Hosts {
        src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
        dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        vlan: 0,
        src: IpAddr::V4(Ipv4Addr::from(
            u32::from(Ipv4Addr::new(198, 18, 64, 0)) + id / 50_000,
        )),
        dst: IpAddr::V4(VIP),
        ttl: 64,
    };
    let l4 = L4::Tcp {
        src_port: 1024 + (id % 50_000) as u16,
        dst_port: 80,
        seq: 1,
        ack: 0,
        flags: tcp_flags,
    };
    let mut f = Vec::new();
    emit_frame(&mut f, &hosts, &l4, b"");
    f
}

/// Runs the connections `ids` from the clients' port through `program`, each by a packet
/// with `tcp_flags`: the backend (last address byte) each reached.
fn reached(program: &mut dyn Running, ids: &[u32], tcp_flags: u8) -> BenchResult<Vec<u8>> {
    let frames: Vec<Vec<u8>> = ids.iter().map(|&id| packet(id, tcp_flags)).collect();
    let out = run_frames(program, &frames, CLIENTS);
    (ids.iter().zip(out))
        .map(|(&id, (verdict, bytes))| {
            // The destination address, after a 14-byte Ethernet header, at 16 in IPv4.
            match (verdict, bytes.get(30..34)) {
                (Verdict::Forward(SERVERS), Some(&[198, 18, 1, b])) => Ok(b),
                _ => Err(format!("connection {id} was not balanced: {verdict:?}")),
            }
        })
        .collect()
}

/// The control plane's write for `change` to backend `b` (its settings from `pool`).
fn write(b: u8, change: Change, pool: &BTreeMap<u8, Expected>) -> Write {
    let key = vec![
        Match::Exact(u128::from(u32::from(backend(b)))),
        Match::Exact(80),
        Match::Exact(u128::from(TCP)),
    ];
    let entry = |e: Expected| Entry {
        key: key.clone(),
        action: e.state.into(),
        params: vec![
            u128::from(u32::from(VIP)),
            80,
            u128::from(e.weight),
            u128::from(SERVERS),
            0,
        ],
        priority: 0,
        hits: 0,
    };
    let now = pool.get(&b).copied().unwrap_or(Expected {
        weight: 1,
        state: "up",
    });
    match change {
        Change::Insert { weight } => Write::Insert(entry(Expected {
            weight,
            state: "up",
        })),
        Change::Weight(weight) => Write::Modify(entry(Expected { weight, ..now })),
        Change::Drain => Write::Modify(entry(Expected {
            state: "drain",
            ..now
        })),
        Change::Down => Write::Modify(entry(Expected {
            state: "down",
            ..now
        })),
        Change::Up => Write::Modify(entry(Expected { state: "up", ..now })),
        Change::Delete => Write::Delete(key),
    }
}

/// One change's figures.
struct Measured {
    change: String,
    remapped: f64,
    least: f64,
    modulo: f64,
    /// Open connections that had to stay, and those that did.
    open_to_keep: usize,
    open_kept: usize,
    /// Open connections on the backend taken away (which must all move).
    open_moved: usize,
    apply_ms: f64,
}

/// Runs every change once on a fresh `lb`, checking the open connections after each.
fn run_changes(n: u8, connections: u32, table_size: usize) -> BenchResult<Vec<Measured>> {
    let mut program = lb(n, connections, table_size)?;
    let open: Vec<u32> = (0..connections).collect();
    let probes: Vec<u32> = (connections..connections * 2).collect();
    reached(program.as_mut(), &open, flags::SYN)?;
    let mut on = reached(program.as_mut(), &open, flags::ACK)?;
    // Probes are resets: balanced like a new connection, and never kept.
    let mut probed = reached(program.as_mut(), &probes, flags::RST)?;
    let mut pool: BTreeMap<u8, Expected> = (1..=n)
        .map(|b| {
            let up = Expected {
                weight: 1,
                state: "up",
            };
            (b, up)
        })
        .collect();
    let mut out = Vec::new();
    for (b, change) in changes(n) {
        let before = pool.clone();
        let request = Request::Write {
            table: "backends".into(),
            writes: vec![write(b, change, &pool)],
        };
        let start = Instant::now();
        let prepared = program
            .prepare(&request)
            .map_err(|e| format!("{}: {e}", describe(b, change)))?;
        let ctx = Context::one_worker(1, FlowHasher::with_seed(1), 2);
        program
            .control(&request, prepared.as_ref(), &ctx)
            .map_err(|e| format!("{}: {e}", describe(b, change)))?;
        let apply_ms = start.elapsed().as_secs_f64() * 1e3;
        match change {
            Change::Insert { weight } => {
                pool.insert(
                    b,
                    Expected {
                        weight,
                        state: "up",
                    },
                );
            }
            Change::Delete => {
                pool.remove(&b);
            }
            other => {
                let e = pool.get_mut(&b).ok_or("a change to a backend not there")?;
                match other {
                    Change::Weight(w) => e.weight = w,
                    Change::Drain => e.state = "drain",
                    Change::Down => e.state = "down",
                    _ => e.state = "up",
                }
            }
        }
        let now_probed = reached(program.as_mut(), &probes, flags::RST)?;
        let remapped = (probed.iter().zip(&now_probed))
            .filter(|(a, b)| a != b)
            .count() as f64
            / probes.len() as f64;
        let modulo = (probes.iter())
            .filter(|&&id| modulo_pick(&before, id) != modulo_pick(&pool, id))
            .count() as f64
            / probes.len() as f64;
        let now_on = reached(program.as_mut(), &open, flags::ACK)?;
        // An open connection stays unless its backend is down or gone.
        let taken_away = |backend: u8| pool.get(&backend).is_none_or(|e| e.state == "down");
        let mut measured = Measured {
            change: describe(b, change),
            remapped,
            least: least_moved(&before, &pool),
            modulo,
            open_to_keep: 0,
            open_kept: 0,
            open_moved: 0,
            apply_ms,
        };
        for (id, (&was, &is)) in open.iter().zip(on.iter().zip(&now_on)) {
            if taken_away(was) {
                if taken_away(is) {
                    return Err(format!(
                        "{}: connection {id} is on {} still",
                        measured.change,
                        backend(is)
                    ));
                }
                measured.open_moved += 1;
            } else {
                measured.open_to_keep += 1;
                measured.open_kept += usize::from(was == is);
            }
        }
        if measured.open_kept != measured.open_to_keep {
            return Err(format!(
                "{}: only {} of {} open connections stayed on their backend",
                measured.change, measured.open_kept, measured.open_to_keep
            ));
        }
        on = now_on;
        probed = now_probed;
        out.push(measured);
    }
    Ok(out)
}

pub fn main(args: BenchLbArgs) -> BenchResult<()> {
    if !(6..=200).contains(&args.backends) {
        return Err("--backends: give 6 to 200 (the changes touch backends 2, 4, 5 and 6)".into());
    }
    if args.connections == 0 || args.connections > 1_000_000 {
        return Err("--connections: give 1 to 1000000".into());
    }
    if args.repeat == 0 {
        return Err("--repeat: give at least 1".into());
    }
    let n = args.backends;
    // The one setting of the program's a flag gives that the program may refuse.
    lb(n, args.connections, args.table_size)
        .map_err(|e| format!("--table-size {}: {e}", args.table_size))?;
    println!(
        "lb: one VIP of {n} backends (weight 1), {} open connections and {} new ones \
         probed after each change, {} Maglev slots; each change applied as ctl writes it; \
         apply time median of {}",
        args.connections, args.connections, args.table_size, args.repeat
    );
    let mut runs = Vec::new();
    for round in 0..args.repeat {
        eprintln!("  round {} of {}", round + 1, args.repeat);
        runs.push(run_changes(n, args.connections, args.table_size)?);
    }
    let first = &runs[0];
    let mut table = Table::new(
        &["change"],
        &[
            "remapped %",
            "least %",
            "ratio",
            "modulo %",
            "open kept",
            "open moved",
            "apply ms",
        ],
    );
    let mut csv =
        Csv::new("change,remapped,least,modulo,open_to_keep,open_kept,open_moved,apply_ms");
    let (mut maglev_bars, mut modulo_bars) = (Vec::new(), Vec::new());
    for (i, m) in first.iter().enumerate() {
        let apply = median(runs.iter().map(|r| r[i].apply_ms).collect());
        let ratio = if m.least > 0.0 {
            format!("{:.2}", m.remapped / m.least)
        } else {
            "-".into()
        };
        table.row(vec![
            m.change.clone(),
            format!("{:.2}", m.remapped * 100.0),
            format!("{:.2}", m.least * 100.0),
            ratio,
            format!("{:.2}", m.modulo * 100.0),
            format!("{}/{}", m.open_kept, m.open_to_keep),
            m.open_moved.to_string(),
            format!("{apply:.2}"),
        ]);
        csv.row(format_args!(
            "{},{:.5},{:.5},{:.5},{},{},{},{apply:.4}",
            m.change, m.remapped, m.least, m.modulo, m.open_to_keep, m.open_kept, m.open_moved
        ));
        maglev_bars.push((m.change.clone(), m.remapped * 100.0));
        modulo_bars.push((m.change.clone(), m.modulo * 100.0));
    }
    table.print();
    if let Some(path) = &args.files.csv {
        csv.write(path)?;
    }
    if args.files.wants_chart() {
        let least: Vec<(String, f64)> = (first.iter())
            .map(|m| (m.change.clone(), m.least * 100.0))
            .collect();
        let panels = [
            Panel {
                title: "Maglev (lb): new connections that reach another backend".into(),
                unit: "%".into(),
                bars: maglev_bars,
            },
            Panel {
                title: "The least any scheme must move (the weights' change)".into(),
                unit: "%".into(),
                bars: least,
            },
            Panel {
                title: "A modulo hash over the same backends".into(),
                unit: "%".into(),
                bars: modulo_bars,
            },
        ];
        args.files.write_chart(
            "What a change of backends moves: lb at run time",
            "share of new connections remapped, by change; every open connection checked",
            &panels,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every change keeps the open connections it must (the check each run makes), and
    /// moves little more than the least it must where a modulo hash moves most.
    #[test]
    fn each_change_is_checked_and_maglev_moves_near_the_least() {
        let runs = run_changes(10, 20_000, 65_537).unwrap();
        assert_eq!(runs.len(), changes(10).len());
        for m in &runs {
            assert_eq!(m.open_kept, m.open_to_keep, "{}", m.change);
            assert!(
                m.remapped <= m.least * 1.6 + 0.01,
                "{}: {}",
                m.change,
                m.remapped
            );
        }
        let inserted = &runs[0];
        assert!(inserted.modulo > 0.8, "{}", inserted.modulo);
        let down = &runs[4];
        assert!(down.open_moved > 1_000, "{}", down.open_moved);
        assert_eq!(runs[5].open_moved, 0, "up moves nothing open");
    }

    #[test]
    fn the_least_share_is_the_weights_change() {
        let pool = |ws: &[(u8, u16)]| -> BTreeMap<u8, Expected> {
            (ws.iter())
                .map(|&(b, weight)| {
                    (
                        b,
                        Expected {
                            weight,
                            state: "up",
                        },
                    )
                })
                .collect()
        };
        let ten = pool(&(1..=10).map(|b| (b, 1)).collect::<Vec<_>>());
        let eleven = pool(&(1..=11).map(|b| (b, 1)).collect::<Vec<_>>());
        assert!((least_moved(&ten, &eleven) - 1.0 / 11.0).abs() < 1e-9);
        assert!((least_moved(&eleven, &ten) - 1.0 / 11.0).abs() < 1e-9);
        assert_eq!(least_moved(&ten, &ten), 0.0);
    }
}
