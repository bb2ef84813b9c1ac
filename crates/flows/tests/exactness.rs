//! Exactness against ground truth: generated traces go through the flow stage in every
//! shape (two levels or one, uniflows or biflows, tables small enough to evict, timeouts
//! short enough to split flows), and a plain map computed here from the same packets must
//! equal the sums over the exported records, flow by flow. Tables that keep only totals
//! give the records of tables that keep everything, less the extremes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use stateplane_flows::stage::{FlowStage, RecordSink, StageConfig, StageCounters};
use stateplane_flows::{
    CompactKey, FlowRecord, FlowStats, FlowTotals, Observation, Timeouts, V4Key, V6Key,
};
use stateplane_gen::{GenConfig, Workload, generate};
use stateplane_wire::{FlowHasher, FlowKey, parse};
use std::collections::HashMap;

struct Collect(Vec<FlowRecord>);

impl RecordSink for Collect {
    fn deliver(&mut self, records: &mut Vec<FlowRecord>) {
        self.0.append(records);
    }
}

/// Per flow: packets, bytes, first and last time, TCP flags ORed.
#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
struct Truth {
    packets: u64,
    bytes: u64,
    first_ns: u64,
    last_ns: u64,
    flags: u8,
}

impl Truth {
    fn add(&mut self, packets: u64, bytes: u64, first: u64, last: u64, flags: u8) {
        if self.packets == 0 {
            self.first_ns = first;
        }
        self.packets += packets;
        self.bytes += bytes;
        self.first_ns = self.first_ns.min(first);
        self.last_ns = self.last_ns.max(last);
        self.flags |= flags;
    }
}

/// The key both directions share when `biflow` (so truth and records compare alike).
fn flow_of(key: &FlowKey, biflow: bool) -> FlowKey {
    let mut k = *key;
    k.in_port = 0;
    if !biflow {
        return k;
    }
    match k.ip_version {
        4 => V4Key::pack(&k).map(|p| p.canonical().0.unpack()),
        _ => V6Key::pack(&k).map(|p| p.canonical().0.unpack()),
    }
    .unwrap_or(k)
}

fn trace(workload: Workload, packets: u64, seed: u64) -> Vec<(FlowKey, Observation)> {
    let mut cfg = GenConfig::new(workload, packets);
    cfg.seed = seed;
    cfg.ipv6_share = 0.3;
    cfg.vlans = 3;
    let hasher = FlowHasher::with_seed(1);
    let mut out = Vec::new();
    generate(
        &cfg,
        |ts_ns, frame| {
            if let Ok(p) = parse(frame, 0, &hasher) {
                let orig_len = frame.len() as u32;
                out.push((p.key, Observation::of(&p, orig_len, ts_ns, 0, 1)));
            }
            Ok(())
        },
        |_| {},
    )
    .unwrap();
    out
}

/// Runs `packets` through a stage shaped by `config` in bursts of 64, as a worker does:
/// the records it exported, and its counters.
fn run(
    packets: &[(FlowKey, Observation)],
    config: StageConfig,
) -> (Vec<FlowRecord>, StageCounters) {
    let mut stage = FlowStage::new(config, 99).unwrap();
    let mut sink = Collect(Vec::new());
    for burst in packets.chunks(64) {
        for (key, o) in burst {
            stage.observe(key, o);
        }
        stage.end_burst(burst[burst.len() - 1].1.ts_ns, &mut sink);
    }
    stage.finish(&mut sink);
    (sink.0, stage.counters())
}

/// Returns the stage's counters and how many flows the truth has.
fn check(
    packets: &[(FlowKey, Observation)],
    config: StageConfig,
    what: &str,
) -> (StageCounters, usize) {
    let (records, c) = run(packets, config);
    let mut truth: HashMap<FlowKey, Truth> = HashMap::new();
    for (key, o) in packets {
        truth.entry(flow_of(key, config.biflow)).or_default().add(
            1,
            o.ip_len.into(),
            o.ts_ns,
            o.ts_ns,
            o.tcp_flags,
        );
    }
    let mut got: HashMap<FlowKey, Truth> = HashMap::new();
    for r in &records {
        assert!(r.forward.packets > 0, "{what}: an empty record");
        for s in std::iter::once(&r.forward).chain(r.reverse.as_ref()) {
            got.entry(flow_of(&r.key, config.biflow)).or_default().add(
                s.packets,
                s.bytes,
                s.first_ns,
                s.last_ns,
                s.tcp_flags,
            );
        }
    }
    let total = |m: &HashMap<FlowKey, Truth>| {
        m.values()
            .map(|t| (t.packets, t.bytes))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    };
    assert_eq!(total(&got), total(&truth), "{what}: packet and byte totals");
    assert_eq!(got.len(), truth.len(), "{what}: flows");
    for (k, t) in &truth {
        assert_eq!(got.get(k), Some(t), "{what}: flow {k:?}");
    }
    assert_eq!(c.packets, packets.len() as u64);
    assert_eq!(c.records_out, records.len() as u64);
    (c, truth.len())
}

#[test]
fn every_packet_and_byte_is_in_the_records() {
    let internet = trace(Workload::Internet, 200_000, 7);
    let datacenter = trace(Workload::Datacenter, 100_000, 8);
    let base = StageConfig::default();
    for (name, packets) in [("internet", &internet), ("datacenter", &datacenter)] {
        for biflow in [false, true] {
            for (shape, config) in [
                ("two levels", StageConfig { biflow, ..base }),
                (
                    "totals only",
                    StageConfig {
                        biflow,
                        extremes: false,
                        ..base
                    },
                ),
                (
                    "one level",
                    StageConfig {
                        biflow,
                        microflow_slots: 0,
                        ..base
                    },
                ),
                (
                    "tiny tables",
                    StageConfig {
                        biflow,
                        microflow_slots: 16,
                        max_flows: 8,
                        ..base
                    },
                ),
                (
                    "short timeouts",
                    StageConfig {
                        biflow,
                        timeouts: Timeouts {
                            inactive_ns: 2_000_000,
                            active_ns: 50_000_000,
                            fin_ns: 1_000_000,
                        },
                        microflow_max_age_ns: 500_000,
                        sweep_period_ns: 5_000_000,
                        ..base
                    },
                ),
            ] {
                let what = format!("{name}, {shape}, biflow {biflow}");
                let (c, flows) = check(packets, config, &what);
                // The shapes do what they are named for.
                match shape {
                    "tiny tables" => assert!(c.evicted_full > 0, "{what}"),
                    "short timeouts" => {
                        assert!(c.records_out > flows as u64, "{what}: no flow split")
                    }
                    "one level" => assert_eq!(c.microflow_records, c.packets, "{what}"),
                    _ => assert!(c.microflow_records < c.packets, "{what}"),
                }
            }
        }
    }
}

/// The records of a stage, in an order that does not depend on the table's layout.
fn records(packets: &[(FlowKey, Observation)], config: StageConfig) -> Vec<FlowRecord> {
    let mut records = run(packets, config).0;
    records.sort_by_key(|r| (r.forward.first_ns, format!("{:?}", r.key)));
    records
}

/// A stage that keeps only totals makes the same records as one that
/// keeps every feature, with the extremes read as none seen; uniflows and biflows, with
/// tables small enough to evict.
#[test]
fn totals_only_tables_make_the_same_records_less_the_extremes() {
    let mut packets = trace(Workload::Internet, 50_000, 5);
    // Ports that change within flows: the first packet's ingress and the last one's egress
    // are kept.
    for (i, (_, o)) in packets.iter_mut().enumerate() {
        (o.in_port, o.out_port) = ((i % 3) as u16, (i % 5) as u16);
    }
    for biflow in [false, true] {
        for max_flows in [1 << 18, 64] {
            let all = StageConfig {
                biflow,
                max_flows,
                ..StageConfig::default()
            };
            let totals = StageConfig {
                extremes: false,
                ..all
            };
            let (want, got) = (records(&packets, all), records(&packets, totals));
            assert_eq!(want.len(), got.len());
            let none_seen = |s: &FlowStats| {
                (
                    s.len_min,
                    s.len_max,
                    s.ttl_min,
                    s.ttl_max,
                    s.iat_min_ns,
                    s.iat_max_ns,
                ) == (0, 0, 0, 0, u64::MAX, 0)
            };
            let mut extremes_differ = 0;
            for (w, g) in want.iter().zip(&got) {
                let what = format!("biflow {biflow}, max_flows {max_flows}, flow {:?}", w.key);
                assert_eq!((w.key, w.end), (g.key, g.end), "{what}");
                let sides = |r: &FlowRecord| [Some(r.forward), r.reverse];
                for (ws, gs) in sides(w).into_iter().zip(sides(g)) {
                    assert_eq!(ws.is_some(), gs.is_some(), "{what}");
                    let (Some(ws), Some(gs)) = (ws, gs) else {
                        continue;
                    };
                    assert_eq!(FlowTotals::from(&ws), FlowTotals::from(&gs), "{what}");
                    assert!(none_seen(&gs), "{what}: {gs:?}");
                    extremes_differ += usize::from(ws != gs);
                }
            }
            // The comparison is of records whose extremes were really kept on one side.
            assert!(extremes_differ > want.len() / 2, "{extremes_differ}");
        }
    }
}
