//! The flow-record stage of one worker: microflow tables and aggregators for both address
//! families, fed packet by packet, handing finished flow records to a [`RecordSink`].
//!
//! As a runtime [`Tap`] it runs after any program, so every program can have flow records
//! of what it forwarded (with the egress port it chose); `stateplane flows` runs it behind
//! a program that only observes.

use crate::aggregator::{Aggregator, Biflow, FlowValue, Timeouts, Uniflow};
use crate::compact_key::{CompactKey, V4Key, V6Key, hash_key};
use crate::flow_stats::{Fate, FlowTotals, KeptStats, NO_PORT, Observation, TCP_FIN, TCP_RST};
use crate::microflow::{Microflow, MicroflowTable, SizeError};
use crate::record::FlowRecord;
use stateplane_runtime::{Burst, Context, Tap, Verdict};
use stateplane_wire::FlowKey;

/// How a worker's flow stage is shaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageConfig {
    /// Microflow table slots per family (a power of two), or 0 for no microflow table:
    /// every packet goes straight to the aggregator (the single-table design).
    pub microflow_slots: usize,
    /// Flows the aggregator holds per family before it evicts (the memory budget).
    pub max_flows: usize,
    pub timeouts: Timeouts,
    pub biflow: bool,
    /// A microflow entry older than this leaves its table at the next sweep, so that the
    /// aggregator sees a flow's activity this late at most.
    pub microflow_max_age_ns: u64,
    /// The sweeps cover each table about once per this much data time.
    pub sweep_period_ns: u64,
    /// Flow tables at their budget's size from the start, so that they never double while
    /// running: a doubling holds the worker (about 2 ms for the last one at the default
    /// budget, `bench-flows` *growth*). Pages are still touched only as flows arrive.
    pub presize: bool,
    /// Whether the flow tables keep the extremes (sizes, TTLs, inter-arrival times):
    /// without them they keep [`FlowTotals`], a smaller slot (see
    /// `Features::needs_extremes`). Records then read the extremes as none seen.
    pub extremes: bool,
}

impl Default for StageConfig {
    fn default() -> Self {
        StageConfig {
            // 4,096 slots per family (80 bytes for IPv4, 104 for IPv6: 736 KiB in all,
            // checked by a test; 56 and 80 keeping totals), inside this machine's 1 MiB L2.
            microflow_slots: 4096,
            max_flows: 1 << 18,
            timeouts: Timeouts::default(),
            biflow: false,
            microflow_max_age_ns: 1_000_000_000,
            sweep_period_ns: 1_000_000_000,
            presize: false,
            extremes: true,
        }
    }
}

/// Where finished flow records go (an exporter's queue).
pub trait RecordSink: Send {
    /// Takes the records out of `records` (leaving it empty, its capacity kept).
    fn deliver(&mut self, records: &mut Vec<FlowRecord>);
}

/// What a stage has seen and done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageCounters {
    pub packets: u64,
    pub bytes: u64,
    /// Packets that are not IPv4 or IPv6 (ARP, ...): not in any flow.
    pub not_ip: u64,
    /// Microflow records handed to the aggregators.
    pub microflow_records: u64,
    pub flows_created: u64,
    /// Flows exported early because a table was full.
    pub evicted_full: u64,
    pub records_out: u64,
}

impl StageCounters {
    /// Adds another stage's counts (another worker's).
    pub fn merge(&mut self, o: &StageCounters) {
        self.packets += o.packets;
        self.bytes += o.bytes;
        self.not_ip += o.not_ip;
        self.microflow_records += o.microflow_records;
        self.flows_created += o.flows_created;
        self.evicted_full += o.evicted_full;
        self.records_out += o.records_out;
    }
}

struct Family<K, V: FlowValue> {
    micro: Option<MicroflowTable<K, V::Kept>>,
    /// Records waiting for the aggregator (TurboFlow's ring): drained every burst, and
    /// whenever it fills, so it never grows.
    ring: Vec<Microflow<K, V::Kept>>,
    agg: Aggregator<K, V>,
    seed: u64,
}

const RING: usize = 4096;

/// Microflow records that gather in a family's ring before a burst's end hands them to the
/// aggregator (every sweep, each millisecond of the flows' clock, hands over the rest): a
/// burst leaves about 22 on `internet`, too few for the aggregator's batched prefetch to
/// overlap its memory reads; waiting for 512 made the whole stage 16% faster
/// (`bench-flows`, *stage*; 128 and 2,048 measured between the two).
const DRAIN_AT: usize = 512;

/// Records that wait before they are handed to the sink: a sink is usually another
/// thread's queue, and waking that thread per burst cost a quarter of the run.
pub const DELIVERY_BATCH: usize = 1024;
/// The longest a finished record waits for [`DELIVERY_BATCH`] others, in the flows' clock:
/// short next to any timeout, yet waking the exporter at every 1 ms sweep cost a tenth of
/// a run over a file.
pub const DELIVERY_DELAY_NS: u64 = 100_000_000;

impl<K: CompactKey, V: FlowValue> Family<K, V> {
    fn new(config: &StageConfig, seed: u64) -> Result<Self, SizeError> {
        let mut agg = Aggregator::new(config.max_flows, config.timeouts, seed ^ 0x5bd1_e995)?;
        if config.presize {
            agg.reserve(config.max_flows);
        }
        Ok(Family {
            micro: match config.microflow_slots {
                0 => None,
                n => Some(MicroflowTable::new(n)?),
            },
            ring: Vec::with_capacity(RING + 2),
            agg,
            seed,
        })
    }

    fn memory_bytes(&self) -> usize {
        self.micro.as_ref().map_or(0, |t| t.memory_bytes()) + self.agg.memory_bytes()
    }

    /// What a family made by [`Family::new`] with `config` may grow to.
    fn budget_for(config: &StageConfig) -> u64 {
        let micro = match config.microflow_slots {
            0 => 0,
            n => MicroflowTable::<K, V::Kept>::bytes_for(n),
        };
        let ring = ((RING + 2) * std::mem::size_of::<Microflow<K, V::Kept>>()) as u64;
        micro + ring + Aggregator::<K, V>::budget_for(config.max_flows)
    }

    /// The hash of `key` in this family's microflow table.
    #[inline]
    fn hash(&self, key: K) -> u64 {
        hash_key(&key, self.seed)
    }

    #[inline]
    fn prefetch(&self, hash: u64) {
        if let Some(m) = &self.micro {
            m.prefetch(hash);
        }
    }

    /// Adds a packet of flow `key`, whose [`Family::hash`] is `hash`.
    #[inline]
    fn observe(&mut self, key: K, hash: u64, o: &Observation, out: &mut Vec<FlowRecord>) {
        match &mut self.micro {
            Some(m) => {
                // A packet that may end a biflow first sends the other direction's pending
                // packets on, so that the aggregator has both sides when it ends the flow.
                if V::BIFLOW && o.tcp_flags & (TCP_FIN | TCP_RST) != 0 {
                    let reverse = key.reversed();
                    m.take(reverse, hash_key(&reverse, self.seed), &mut self.ring);
                }
                m.observe(key, hash, o, &mut self.ring);
            }
            None => self.ring.push(Microflow {
                key,
                stats: V::Kept::start(o),
            }),
        }
        if self.ring.len() >= RING {
            self.drain(out);
        }
    }

    fn drain(&mut self, out: &mut Vec<FlowRecord>) {
        self.agg.ingest(&self.ring, out);
        self.ring.clear();
    }

    /// Sends out the microflow entries that began at or before `now_ns - max_age_ns`
    /// among the next `visit` slots, in steps that fit the ring (so that it never grows).
    fn sweep_microflows(
        &mut self,
        now_ns: u64,
        max_age_ns: u64,
        mut visit: usize,
        out: &mut Vec<FlowRecord>,
    ) {
        self.drain(out);
        let Some(m) = &mut self.micro else { return };
        while visit > 0 {
            let step = visit.min(RING);
            m.sweep(now_ns, max_age_ns, step, &mut self.ring);
            self.agg.ingest(&self.ring, out);
            self.ring.clear();
            visit -= step;
        }
    }

    fn sweep(
        &mut self,
        config: &StageConfig,
        now_ns: u64,
        elapsed_ns: u64,
        out: &mut Vec<FlowRecord>,
    ) {
        let slots = self.micro.as_ref().map_or(0, MicroflowTable::slots);
        let visit = (slots as u128 * u128::from(elapsed_ns))
            .div_ceil(u128::from(config.sweep_period_ns.max(1)))
            .min(slots as u128) as usize;
        self.sweep_microflows(now_ns, config.microflow_max_age_ns, visit, out);
        let visit = self.agg.sweep_share(elapsed_ns, config.sweep_period_ns);
        self.agg.sweep(now_ns, visit, out);
    }

    /// Exports everything: every microflow entry (all are old enough at the end of time;
    /// none are left after the first call), then every flow until `out` holds `room`
    /// records. Whether everything is out; if not, call again.
    fn flush(&mut self, out: &mut Vec<FlowRecord>, room: usize) -> bool {
        let slots = self.micro.as_ref().map_or(0, MicroflowTable::slots);
        self.sweep_microflows(u64::MAX, 0, slots, out);
        self.agg.flush(out, room)
    }
}

struct Families<V: FlowValue> {
    v4: Family<V4Key, V>,
    v6: Family<V6Key, V>,
}

/// The tables of a run, by the records they make and what they keep of each flow.
enum Tables {
    Uni(Families<Uniflow>),
    Bi(Families<Biflow>),
    UniTotals(Families<Uniflow<FlowTotals>>),
    BiTotals(Families<Biflow<FlowTotals>>),
}

/// Evaluates `$body` with `$f` bound to `$tables`' families (shared or mutable as
/// `$tables` is), whichever shape they have.
macro_rules! each_shape {
    ($tables:expr, $f:ident => $body:expr) => {
        match $tables {
            Tables::Uni($f) => $body,
            Tables::Bi($f) => $body,
            Tables::UniTotals($f) => $body,
            Tables::BiTotals($f) => $body,
        }
    };
}

/// Evaluates `$body` with `$f` bound to the IPv4 family's tables, then to the IPv6
/// family's (shared or mutable as `$tables` is), whichever shape they have; gives the two
/// results as a pair.
macro_rules! each_family {
    ($tables:expr, $f:ident => $body:expr) => {
        each_shape!($tables, families => {
            let Families { v4, v6 } = families;
            (
                {
                    let $f = v4;
                    $body
                },
                {
                    let $f = v6;
                    $body
                },
            )
        })
    };
}

/// The flow stage of one worker.
pub struct FlowStage {
    config: StageConfig,
    tables: Tables,
    out: Vec<FlowRecord>,
    last_sweep_ns: Option<u64>,
    last_delivery_ns: u64,
    /// The stage's own counts (packets, bytes, not_ip, records_out); the rest are the
    /// aggregators', added up by [`FlowStage::counters`].
    own: StageCounters,
}

impl FlowStage {
    pub fn new(config: StageConfig, seed: u64) -> Result<FlowStage, SizeError> {
        fn families<V: FlowValue>(c: &StageConfig, seed: u64) -> Result<Families<V>, SizeError> {
            Ok(Families {
                v4: Family::new(c, seed)?,
                v6: Family::new(c, seed.rotate_left(17))?,
            })
        }
        Ok(FlowStage {
            tables: match (config.biflow, config.extremes) {
                (false, true) => Tables::Uni(families(&config, seed)?),
                (true, true) => Tables::Bi(families(&config, seed)?),
                (false, false) => Tables::UniTotals(families(&config, seed)?),
                (true, false) => Tables::BiTotals(families(&config, seed)?),
            },
            config,
            out: Vec::with_capacity(RING * 2),
            last_sweep_ns: None,
            last_delivery_ns: 0,
            own: StageCounters::default(),
        })
    }

    /// The bytes a stage made with `config` may grow to (both families' tables at their
    /// budget), for a run's memory budget to check before it is made.
    pub fn budget_for(config: &StageConfig) -> u64 {
        fn families<V: FlowValue>(c: &StageConfig) -> u64 {
            Family::<V4Key, V>::budget_for(c) + Family::<V6Key, V>::budget_for(c)
        }
        match (config.biflow, config.extremes) {
            (false, true) => families::<Uniflow>(config),
            (true, true) => families::<Biflow>(config),
            (false, false) => families::<Uniflow<FlowTotals>>(config),
            (true, false) => families::<Biflow<FlowTotals>>(config),
        }
    }

    /// Bytes held by the tables (both families).
    pub fn memory_bytes(&self) -> usize {
        let (v4, v6) = each_family!(&self.tables, f => f.memory_bytes());
        v4 + v6
    }

    /// What the stage has seen and done so far.
    pub fn counters(&self) -> StageCounters {
        let mut c = self.own;
        let (v4, v6) = each_family!(&self.tables, f => f.agg.counters);
        for a in [v4, v6] {
            c.microflow_records += a.records_in;
            c.flows_created += a.flows_created;
            c.evicted_full += a.evicted_full;
        }
        c
    }

    /// Starts loading the microflow slot of flow `key` into the cache, and returns the
    /// key's hash for [`FlowStage::observe_hashed`]: for a caller with a burst of packets,
    /// before it adds any of them (the slot's load was half the microflow table's time).
    #[inline]
    pub fn prefetch(&self, key: &FlowKey) -> u64 {
        each_shape!(&self.tables, f => match key.ip_version {
            4 => {
                let hash = f.v4.hash(pack(key));
                f.v4.prefetch(hash);
                hash
            }
            6 => {
                let hash = f.v6.hash(pack(key));
                f.v6.prefetch(hash);
                hash
            }
            _ => 0,
        })
    }

    /// Adds one packet of flow `key`.
    #[inline]
    pub fn observe(&mut self, key: &FlowKey, o: &Observation) {
        let hash = each_shape!(&self.tables, f => match key.ip_version {
            4 => f.v4.hash(pack(key)),
            6 => f.v6.hash(pack(key)),
            _ => 0,
        });
        self.observe_hashed(key, hash, o);
    }

    /// Adds one packet of flow `key`, whose hash [`FlowStage::prefetch`] returned (so that
    /// a packet's key is hashed once).
    #[inline]
    pub fn observe_hashed(&mut self, key: &FlowKey, hash: u64, o: &Observation) {
        let out = &mut self.out;
        let is_ip = each_shape!(&mut self.tables, f => match key.ip_version {
            4 => {
                f.v4.observe(pack(key), hash, o, out);
                true
            }
            6 => {
                f.v6.observe(pack(key), hash, o, out);
                true
            }
            _ => false,
        });
        if !is_ip {
            self.own.not_ip += 1;
            return;
        }
        self.own.packets += 1;
        self.own.bytes += u64::from(o.ip_len);
    }

    /// Between bursts: moves microflow records to the aggregators once [`DRAIN_AT`] wait,
    /// sweeps for timeouts (each millisecond of the flows' clock, moving every waiting
    /// record first), and hands finished records to `sink` in
    /// batches: as soon as [`DELIVERY_BATCH`] wait, or at the first sweep once the oldest
    /// has waited [`DELIVERY_DELAY_NS`].
    pub fn end_burst(&mut self, now_ns: u64, sink: &mut dyn RecordSink) {
        let elapsed = now_ns.saturating_sub(self.last_sweep_ns.unwrap_or(now_ns));
        let waiting = !self.out.is_empty();
        // Sweep in steps of at least a millisecond, so that bursts pay a share each.
        let swept = self.last_sweep_ns.is_none() || elapsed >= 1_000_000;
        if swept {
            self.last_sweep_ns = Some(now_ns);
            let (c, out) = (&self.config, &mut self.out);
            each_family!(&mut self.tables, f => f.sweep(c, now_ns, elapsed, out));
        } else {
            let out = &mut self.out;
            each_family!(&mut self.tables, f => if f.ring.len() >= DRAIN_AT {
                f.drain(out)
            });
        }
        if !waiting {
            // The delay counts from when the oldest waiting record ended.
            self.last_delivery_ns = now_ns;
        }
        let overdue = swept && now_ns.saturating_sub(self.last_delivery_ns) >= DELIVERY_DELAY_NS;
        if self.out.len() >= DELIVERY_BATCH || overdue {
            self.deliver(sink);
            self.last_delivery_ns = now_ns;
        }
    }

    /// Exports every flow held (the end of a run).
    pub fn finish(&mut self, sink: &mut dyn RecordSink) {
        loop {
            let out = &mut self.out;
            let (v4_done, v6_done) = each_family!(&mut self.tables, f => f.flush(out, FLUSHED));
            self.deliver(sink);
            if v4_done && v6_done {
                return;
            }
        }
    }

    fn deliver(&mut self, sink: &mut dyn RecordSink) {
        if !self.out.is_empty() {
            self.own.records_out += self.out.len() as u64;
            sink.deliver(&mut self.out);
            self.out.clear();
        }
    }
}

#[inline]
fn pack<K: CompactKey>(key: &FlowKey) -> K {
    K::pack(key).unwrap_or_default()
}

/// What a packet contributes to its flow, as the stage sees it after the program.
#[inline]
pub fn observation(d: &stateplane_runtime::PacketDesc) -> Observation {
    let fate = match d.verdict {
        Verdict::Forward(port) => Fate::Port(port),
        Verdict::Flood => Fate::Flooded,
        Verdict::Drop(reason) => Fate::Dropped(reason.0),
        Verdict::ToControl(_) => Fate::ToControl,
    };
    Observation::of(&d.parsed, d.orig_len, d.ts_ns, d.in_port, fate.code())
}

/// What a packet an observer saw contributes to its flow: its verdict says nothing, and
/// its ports are where its capture saw it ([`captured_ports`]).
#[inline]
pub fn observed(d: &stateplane_runtime::PacketDesc) -> Observation {
    let (in_port, out_port) = captured_ports(d);
    Observation::of(&d.parsed, d.orig_len, d.ts_ns, in_port, out_port)
}

/// The ports of a packet an observer saw: the interface its capture names (a Linux cooked
/// capture's SLL2 header), as the port one below its index, so that a record's
/// ingressInterface and egressInterface (port + 1) are the kernel's index; where the
/// capture names none, the input it was read from. Arriving, it is the packet's way in;
/// leaving, its way out; the other is none ([`NO_PORT`]). An index past the ports a
/// record holds is none.
#[inline]
fn captured_ports(d: &stateplane_runtime::PacketDesc) -> (u16, u16) {
    let port = match d.seen.interface {
        0 => d.in_port,
        index => u16::try_from(index - 1)
            .ok()
            .filter(|&p| Fate::of(p) == Fate::Port(p))
            .unwrap_or(NO_PORT),
    };
    match d.seen.outgoing {
        false => (port, NO_PORT),
        true => (NO_PORT, port),
    }
}

/// Records a family's flush hands over at a time at the end of a run: few enough that they
/// stay in the cache and the sink starts on them while the rest are made (all at once, a
/// million flows were tens of MiB of fresh pages, and a tenth of a two-worker run's CPU).
const FLUSHED: usize = 4096;

/// Packets whose microflow slots a tap prefetches before it adds any of them (a default
/// burst is 64).
const PREFETCHED: usize = 64;

/// A [`FlowStage`] as a runtime stage, with the sink its records go to.
pub struct FlowTap {
    pub stage: FlowStage,
    sink: Box<dyn RecordSink>,
    /// Where the stage's counters go when the worker finishes.
    report: Option<std::sync::Arc<std::sync::Mutex<Vec<StageCounters>>>>,
    /// Behind an observer: ports from where the packets were captured ([`observed`]).
    observer: bool,
}

impl FlowTap {
    pub fn new(stage: FlowStage, sink: Box<dyn RecordSink>) -> FlowTap {
        FlowTap {
            stage,
            sink,
            report: None,
            observer: false,
        }
    }

    /// A tap behind an observer, whose records take their ports from where the packets
    /// were captured ([`observed`]).
    pub fn observing(mut self) -> Self {
        self.observer = true;
        self
    }

    /// Adds the stage's counters to `report` when the worker finishes.
    pub fn reporting_to(
        mut self,
        report: std::sync::Arc<std::sync::Mutex<Vec<StageCounters>>>,
    ) -> Self {
        self.report = Some(report);
        self
    }
}

impl Tap for FlowTap {
    fn observe(&mut self, burst: &Burst, ctx: &Context) {
        for packets in burst.descs().chunks(PREFETCHED) {
            let mut hashes = [0; PREFETCHED];
            for (d, hash) in packets.iter().zip(&mut hashes) {
                *hash = self.stage.prefetch(&d.parsed.key);
            }
            for (d, &hash) in packets.iter().zip(&hashes) {
                let seen = match self.observer {
                    false => observation(d),
                    true => observed(d),
                };
                self.stage.observe_hashed(&d.parsed.key, hash, &seen);
            }
        }
        self.stage.end_burst(ctx.now_ns, self.sink.as_mut());
    }

    fn tick(&mut self, ctx: &Context) {
        self.stage.end_burst(ctx.now_ns, self.sink.as_mut());
    }

    fn finish(&mut self, _ctx: &Context) {
        self.stage.finish(self.sink.as_mut());
        if let Some(r) = &self.report {
            r.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(self.stage.counters());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a run's memory budget is told a stage may take is what its tables allocate at
    /// their budget, in every shape.
    #[test]
    fn budget_for_is_what_a_stage_may_grow_to() {
        fn family<K: CompactKey, V: FlowValue>(f: &Family<K, V>) -> u64 {
            let micro = f.micro.as_ref().map_or(0, |t| t.memory_bytes());
            let ring = f.ring.capacity() * size_of::<Microflow<K, V::Kept>>();
            (micro + ring + f.agg.budget_bytes()) as u64
        }
        for (biflow, extremes) in [(false, false), (false, true), (true, false), (true, true)] {
            for (max_flows, microflow_slots) in [(1, 0), (1000, 64), (262_144, 4096)] {
                let config = StageConfig {
                    max_flows,
                    microflow_slots,
                    biflow,
                    extremes,
                    ..StageConfig::default()
                };
                let stage = FlowStage::new(config, 3).unwrap();
                let (v4, v6) = each_family!(&stage.tables, f => family(f));
                assert_eq!(FlowStage::budget_for(&config), v4 + v6, "{config:?}");
            }
        }
    }

    /// The default microflow tables (both families) fit this machine's 1 MiB L2, as
    /// `StageConfig::default` says; the aggregators are the memory budget.
    #[test]
    fn default_microflow_tables_fit_in_l2() {
        let one_level = FlowStage::new(
            StageConfig {
                microflow_slots: 0,
                ..StageConfig::default()
            },
            1,
        )
        .unwrap();
        let two_levels = FlowStage::new(StageConfig::default(), 1).unwrap();
        let microflow = two_levels.memory_bytes() - one_level.memory_bytes();
        assert_eq!(microflow, 4096 * (80 + 104));
        assert!(microflow < 1 << 20);
        // Keeping totals, the microflow entries are smaller too.
        let totals = |microflow_slots| {
            let config = StageConfig {
                microflow_slots,
                extremes: false,
                ..StageConfig::default()
            };
            FlowStage::new(config, 1).unwrap().memory_bytes()
        };
        assert_eq!(totals(4096) - totals(0), 4096 * (56 + 80));
    }

    /// A presized stage's flow tables start at their budget's size (then never double); a
    /// growing one's start small.
    #[test]
    fn presized_flow_tables_start_full_size() {
        let config = StageConfig {
            microflow_slots: 0,
            ..StageConfig::default()
        };
        let growing = FlowStage::new(config, 1).unwrap();
        let presized = FlowStage::new(
            StageConfig {
                presize: true,
                ..config
            },
            1,
        )
        .unwrap();
        assert!(growing.memory_bytes() * 64 < presized.memory_bytes());
        // 262,144 flows a family fit, at most 7/8 full, in 2^19 slots of each family's size.
        let slots = 1 << 19;
        assert_eq!(presized.memory_bytes() % slots, 0);
        assert!(presized.memory_bytes() / slots >= 88 + 104);
    }

    /// Tables that keep only totals (the default features) have one cache line per IPv4
    /// slot, and a quarter less memory in all than tables that keep every feature.
    #[test]
    fn totals_only_tables_are_smaller() {
        let size = |extremes| {
            let config = StageConfig {
                microflow_slots: 0,
                presize: true,
                extremes,
                ..StageConfig::default()
            };
            FlowStage::new(config, 1).unwrap().memory_bytes() / (1 << 19)
        };
        assert_eq!(size(true), 88 + 112);
        assert_eq!(size(false), 64 + 88);
    }

    /// A reset from one side ends the biflow with the other side's packets in it, even
    /// those still in the microflow table when the reset came.
    #[test]
    fn a_reset_ends_a_biflow_with_both_directions() {
        struct Keep(Vec<FlowRecord>);
        impl RecordSink for Keep {
            fn deliver(&mut self, records: &mut Vec<FlowRecord>) {
                self.0.append(records);
            }
        }
        let config = StageConfig {
            biflow: true,
            ..StageConfig::default()
        };
        let mut stage = FlowStage::new(config, 3).unwrap();
        let mut key = FlowKey {
            ip_version: 4,
            proto: 6,
            src_port: 40000,
            dst_port: 5201,
            ..FlowKey::default()
        };
        key.src[..4].copy_from_slice(&[198, 18, 0, 1]);
        key.dst[..4].copy_from_slice(&[198, 18, 0, 2]);
        let mut back = key;
        std::mem::swap(&mut back.src, &mut back.dst);
        std::mem::swap(&mut back.src_port, &mut back.dst_port);
        let packet = |ts_ns, tcp_flags| Observation {
            ts_ns,
            ip_len: 100,
            tcp_flags,
            ..Observation::default()
        };
        let mut sink = Keep(Vec::new());
        // Data one way, acks the other, within one burst: all still in the microflow table.
        for i in 0..10 {
            stage.observe(&key, &packet(i * 10, 0x18));
            stage.observe(&back, &packet(i * 10 + 5, 0x10));
        }
        stage.observe(&back, &packet(200, 0x04));
        stage.end_burst(200, &mut sink);
        // Held back while it waits for others, delivered at the first sweep after that.
        stage.end_burst(DELIVERY_DELAY_NS - 1_000, &mut sink);
        assert!(sink.0.is_empty(), "{:?}", sink.0);
        stage.end_burst(DELIVERY_DELAY_NS + 1_000_200, &mut sink);
        assert_eq!(sink.0.len(), 1, "{:?}", sink.0);
        let r = &sink.0[0];
        assert_eq!(r.end, crate::record::EndReason::EndOfFlow);
        let reverse = r.reverse.expect("both directions");
        let mut counts = [r.forward.packets, reverse.packets];
        counts.sort();
        assert_eq!(counts, [10, 11]);
        stage.finish(&mut sink);
        assert_eq!(sink.0.len(), 1, "nothing left behind: {:?}", &sink.0[1..]);
    }

    /// The end of a run hands the flows over in pieces of at most `FLUSHED` records per
    /// family (the microflow entries swept first ride with the first), every flow once.
    #[test]
    fn the_end_of_a_run_hands_flows_over_in_pieces() {
        struct Sizes(Vec<usize>, u64);
        impl RecordSink for Sizes {
            fn deliver(&mut self, records: &mut Vec<FlowRecord>) {
                self.0.push(records.len());
                self.1 += records.iter().map(FlowRecord::packets).sum::<u64>();
                records.clear();
            }
        }
        let mut stage = FlowStage::new(StageConfig::default(), 3).unwrap();
        let flows = 3 * FLUSHED as u32 + 17;
        for i in 0..flows {
            let mut key = FlowKey {
                ip_version: if i % 3 == 0 { 6 } else { 4 },
                proto: 17,
                src_port: 1000,
                dst_port: 53,
                ..FlowKey::default()
            };
            key.src[..4].copy_from_slice(&i.to_be_bytes());
            let o = Observation {
                ts_ns: u64::from(i),
                ip_len: 100,
                ..Observation::default()
            };
            stage.observe(&key, &o);
        }
        let mut sink = Sizes(Vec::new(), 0);
        stage.finish(&mut sink);
        assert_eq!(sink.1, u64::from(flows), "every packet, in one record each");
        assert!(sink.0.len() >= 3, "{:?}", sink.0);
        let microflow_slots = StageConfig::default().microflow_slots;
        assert!(sink.0[0] <= 2 * FLUSHED + microflow_slots, "{:?}", sink.0);
        assert!(
            sink.0[1..].iter().all(|&n| n <= 2 * FLUSHED),
            "{:?}",
            sink.0
        );
    }
}
