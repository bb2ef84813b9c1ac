//! `counter`: packet and byte counters per flow, updated by every packet (the
//! write-heaviest kind of state: each packet writes its flow's entry).
//!
//! A flow is the 5-tuple and VLAN in the direction the packet travels (the two directions
//! of a connection are two flows, as in NetFlow). Its entry is added by its first packet
//! (add-on-miss) and removed when the flow has been idle for `idle` seconds; the removal
//! is a notification carrying the final counts (`ctl watch`). Packets are forwarded by
//! `forward`'s port map whether or not their flow could be counted: a full table loses
//! counts (`ctl stats flows` shows them as `add_full`), never traffic.
//!
//! State: `flows` (declared; key the flow; action `count` with `packets bytes`; per
//! worker, write-centric; may be `synced`, its counts within the threshold). Configuration: `capacity` (flows per worker, default 65536),
//! `idle` (seconds, default 60), `map` as `forward`.

use crate::forward::{Forward, ForwardConfig};
use crate::keys::filled_table;
use crate::{ConfigError, PortNames, answer_by_table};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, PacketDesc, Program, Verdict};
use stateplane_state::control::{Field, Format};
use stateplane_state::{DeclaredTable, ValueCodec, params_into};
use stateplane_wire::FlowKey;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CounterConfig {
    #[serde(default = "default_capacity")]
    pub capacity: usize,
    #[serde(default = "default_idle")]
    pub idle: f64,
    #[serde(default)]
    pub map: BTreeMap<String, String>,
}

fn default_capacity() -> usize {
    65_536
}

fn default_idle() -> f64 {
    60.0
}

/// A flow's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct Counts {
    pub packets: u64,
    pub bytes: u64,
}

struct CountsCodec;

impl ValueCodec for CountsCodec {
    type Key = FlowKey;
    type Value = Counts;

    fn value(_action: usize, params: &[u128]) -> Counts {
        let p = |i: usize| params.get(i).copied().unwrap_or(0) as u64;
        Counts {
            packets: p(0),
            bytes: p(1),
        }
    }

    fn action_values(c: &Counts, out: &mut [u128]) -> (usize, usize) {
        (
            0,
            params_into([u128::from(c.packets), u128::from(c.bytes)], out),
        )
    }

    const COUNTING: &'static [&'static str] = &["packets", "bytes"];
}

#[derive(Clone)]
pub struct Counter {
    forward: Forward,
    flows: DeclaredTable<CountsCodec>,
}

/// The key of a packet's flow in `flows`.
fn flow_of(parsed: &stateplane_wire::Parsed) -> FlowKey {
    FlowKey {
        in_port: 0,
        ..parsed.key
    }
}

impl Counter {
    pub fn new(
        cfg: &CounterConfig,
        ports: &PortNames,
        field: &str,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        crate::check_capacity(&format!("{field}.capacity"), cfg.capacity, "flows")?;
        let profiles = crate::idle_profiles(field, &[("idle", cfg.idle)])?;
        let counts = vec![
            Field::exact("packets", 64, Format::Int),
            Field::exact("bytes", 64, Format::Int),
        ];
        let declaration = filled_table::<FlowKey>("flows", "", cfg.capacity, &["count"], counts);
        Ok(Counter {
            forward: Forward::new(
                &ForwardConfig {
                    map: cfg.map.clone(),
                },
                ports,
                field,
            )?,
            flows: DeclaredTable::new(
                crate::budgeted_table(&format!("{field}.capacity"), cfg.capacity, &profiles, seed)?,
                declaration,
            ),
        })
    }

    /// The counts of the flow `key` (as its packets have it).
    pub fn counts(&self, key: &FlowKey) -> Option<Counts> {
        self.flows.get(&FlowKey { in_port: 0, ..*key }).copied()
    }
}

impl Program for Counter {
    type Prepared = ();

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        self.forward.process(burst, ctx);
        self.flows.prefetch_keys(
            (burst.descs().iter())
                .filter(|d| !matches!(d.verdict, Verdict::Drop(_)))
                .map(|d| flow_of(&d.parsed)),
        );
        for d in burst.descs_mut() {
            if matches!(d.verdict, Verdict::Drop(_)) {
                continue;
            }
            let key = flow_of(&d.parsed);
            let bytes = u64::from(d.orig_len);
            match self.flows.lookup(&key, ctx.now_ns) {
                Some(id) => {
                    let c = self.flows.value_mut(id);
                    c.packets += 1;
                    c.bytes += bytes;
                    self.flows.restart_timer(id, d.ts_ns);
                }
                None => {
                    let first = Counts { packets: 1, bytes };
                    // A full table is counted by the table (`add_full`); the packet goes on.
                    let _ = self.flows.add_entry(key, first, 0, d.ts_ns);
                }
            }
        }
        self.flows
            .expire(ctx.now_ns, crate::sweep_budget(burst.len()), |_, _| {});
    }

    fn poll(&mut self, _out: &mut Burst, ctx: &mut Context) {
        self.flows.expire(ctx.now_ns, crate::IDLE_SWEEP, |_, _| {});
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        self.forward.drop_reasons()
    }

    answer_by_table!(flows);

    crate::synced_tables::synced_table_methods!(flows);

    crate::inherit_table!(flows);

    crate::replicated_tables::replicated_table_methods!(flows, with_counts: true, key: flow_key_of);
}

impl Counter {
    /// The flow a packet counts in (its replicated key).
    fn flow_key_of(&self, packet: &PacketDesc, _data: &[u8]) -> Option<FlowKey> {
        Some(flow_of(&packet.parsed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{hasher, ip_frame, run_at, tcp};
    use stateplane_state::Match;
    use std::collections::HashMap;

    fn counter(extra: &str) -> Counter {
        let names = PortNames(vec!["a".into(), "b".into()]);
        let cfg: CounterConfig = toml::from_str(extra).unwrap();
        Counter::new(&cfg, &names, "program.counter", 4).unwrap()
    }

    /// A synced flow table sends its counts within the threshold and its keys exactly; a
    /// write into a full table places what fits and refuses the rest whole, and what it
    /// placed goes back as the write's changes, where the data plane's counts do not.
    #[test]
    fn a_synced_flow_table_counts_within_the_threshold_and_a_full_one_refuses_entries() {
        let mut c = counter("capacity = 2");
        // A slot: action, src and dst (two words each), proto, ports, VLAN, packets, bytes.
        let stride = 11;
        let length = c.track("flows", 0).unwrap();
        assert_eq!(length as usize, c.flows.slot_count() * stride);
        run_at(
            &mut c,
            0,
            &[(ip_frame("198.18.0.1", "198.19.0.1", tcp(1000, 80, 0x10)), 0)],
            (0, 1),
            2,
        );
        let mut changes = Vec::new();
        assert!(c.changes(&mut changes, usize::MAX));
        let (counting, exact): (Vec<_>, Vec<_>) = changes.iter().partition(|ch| !ch.exact);
        let words = |chs: &[&stateplane_state::changes::Change]| {
            chs.iter()
                .map(|ch| ch.index as usize % stride)
                .collect::<Vec<_>>()
        };
        assert_eq!(words(&counting), [9, 10], "packets and bytes count");
        assert!(
            words(&exact).contains(&0) && words(&exact).contains(&6),
            "{exact:?}"
        );
        // Three entries into a table of two (one there already): one placed, two refused.
        let slot: Vec<u64> = (0..stride as u32)
            .map(|w| c.read_synced(0, changes[0].index / stride as u32 * stride as u32 + w))
            .map(Option::unwrap)
            .collect();
        for port in 0..3u64 {
            let mut entry = slot.clone();
            entry[7] = 2000 + port; // another destination port: another flow
            for (w, &v) in entry.iter().enumerate() {
                let index = port as usize * stride + w;
                c.write_synced(0, index as u32, v).unwrap();
            }
        }
        assert_eq!(c.commit_synced_write(), 2, "the table holds 2 flows");
        assert_eq!(c.flows.len(), 2);
        assert!(changes.iter().all(|ch| !ch.by_write), "the data plane's");
        let mut placed = Vec::new();
        assert!(c.changes(&mut placed, usize::MAX));
        assert!(
            placed.len() >= 2 && placed.iter().all(|ch| ch.by_write),
            "{placed:?}"
        );
        let frame = ip_frame("198.18.0.1", "198.19.0.1", tcp(1000, 80, 0x10));
        run_at(&mut c, 1_000, &[(frame, 0)], (0, 1), 2);
        let mut counted = Vec::new();
        assert!(c.changes(&mut counted, usize::MAX));
        assert!(
            !counted.is_empty() && counted.iter().all(|ch| !ch.by_write),
            "{counted:?}"
        );
    }

    /// A flow table both synced and replicated is read by the collector, but a synced
    /// write into it is refused whole, a new entry or a deletion alike: the table's
    /// entries change through the store alone, which the write would go around.
    #[test]
    fn a_synced_write_into_a_replicated_flow_table_is_refused() {
        let stride = 11u32;
        for replicated in [false, true] {
            let mut c = counter("");
            c.track("flows", 0).unwrap();
            assert!(!replicated || c.replicate("flows"));
            let frame = ip_frame("198.18.0.1", "198.19.0.1", tcp(1000, 80, 0x10));
            let flow = stateplane_wire::parse(&frame, 0, &hasher()).unwrap().key;
            run_at(&mut c, 0, &[(frame, 0)], (0, 1), 2);
            let counted = c.counts(&flow);
            assert!(counted.is_some());
            let mut changes = Vec::new();
            assert!(c.changes(&mut changes, usize::MAX));
            let first = changes[0].index / stride * stride;
            let slot: Vec<u64> = (first..first + stride)
                .map(|index| c.read_synced(0, index).unwrap())
                .collect();
            let mut another = slot.clone();
            another[7] = 2000; // another destination port: another flow
            let mut deleted = slot.clone();
            deleted[0] = 0; // the same key with no action: its deletion
            for (n, entry) in [another, deleted].iter().enumerate() {
                for (w, &v) in (0..).zip(entry) {
                    c.write_synced(0, n as u32 * stride + w, v).unwrap();
                }
            }
            let refused = c.commit_synced_write();
            assert_eq!(c.flows.len(), 1);
            if replicated {
                assert_eq!(refused, 2, "both entries refused");
                assert_eq!(c.counts(&flow), counted, "the flow as it was");
            } else {
                assert_eq!(refused, 0, "one placed, one deleted");
                assert_eq!(c.counts(&flow), None);
            }
        }
    }

    #[test]
    fn every_packet_is_counted_on_its_flow_and_forwarded() {
        let mut c = counter("");
        // 50 flows, flow i sending i + 1 packets, interleaved over bursts of 32.
        let mut frames = Vec::new();
        for round in 0..50 {
            for i in round..50u16 {
                frames.push((
                    ip_frame("198.18.0.1", "198.19.0.1", tcp(1000 + i, 80, 0x10)),
                    0,
                ));
            }
        }
        let mut exact: HashMap<FlowKey, Counts> = HashMap::new();
        for (t, chunk) in frames.chunks(32).enumerate() {
            for (v, bytes) in run_at(&mut c, t as u64, chunk, (0, 1), 2) {
                assert_eq!(v, Verdict::Forward(1));
                let key = stateplane_wire::parse(&bytes, 0, &hasher()).unwrap().key;
                let e = exact.entry(key).or_default();
                e.packets += 1;
                e.bytes += bytes.len() as u64;
            }
        }
        assert_eq!(exact.len(), 50);
        for (key, counts) in &exact {
            assert_eq!(c.counts(key), Some(*counts), "{key:?}");
        }
        assert_eq!(exact.values().map(|c| c.packets).max(), Some(50));
    }

    #[test]
    fn idle_flows_leave_with_a_notification_of_their_counts_and_a_full_table_forwards() {
        let mut c = counter("capacity = 2\nidle = 1.0");
        let frame = |port| (ip_frame("198.18.0.1", "198.19.0.1", tcp(port, 80, 0x10)), 0);
        let out = run_at(
            &mut c,
            0,
            &[frame(1), frame(1), frame(2), frame(3)],
            (0, 1),
            2,
        );
        assert!(
            out.iter().all(|(v, _)| *v == Verdict::Forward(1)),
            "full: still forwarded"
        );
        assert_eq!(c.flows.stats.add_full, 1);
        for _ in 0..8 {
            c.poll(
                &mut Burst::with_capacity(1),
                &mut crate::testutil::ctx(2_000_000_000, 2),
            );
        }
        assert_eq!(c.flows.len(), 0);
        let mut notes = Vec::new();
        c.notifications(&mut notes);
        assert_eq!(notes.len(), 2);
        let first = notes
            .iter()
            .find(|n| n.entry.key[3] == Match::Exact(1))
            .unwrap();
        assert_eq!(first.entry.params[0], 2, "the final packet count");
    }
}
