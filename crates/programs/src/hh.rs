//! `hh`: heavy-hitter detection. Each tenant (VLAN) counts its flows in a count-min sketch
//! of its own, started afresh every interval; a flow whose count in the interval reaches
//! `threshold` is reported (once per interval as a digest, and in the `heavy_hitters`
//! table with its latest estimate, kept for two intervals).
//!
//! A count-min sketch never undercounts, so every flow at or over the threshold is
//! reported; it overcounts by more than `e * N / width` (N: the tenant's count in the
//! interval) with probability at most `e^-depth`, so a reported flow's true count is at
//! least `threshold - e * N / width` with that probability. One sketch per tenant keeps a
//! busy tenant's traffic from inflating another's estimates. Tenants beyond `tenants` share
//! one more sketch (counted, with that sketch's larger error).
//!
//! Workers: a flow is counted by the worker the runtime sends it to, so its count is whole
//! there. Packets are forwarded by `forward`'s port map, whatever is measured.
//!
//! State: the sketches (per worker, write-centric: every packet adds to `depth` counters)
//! and `heavy_hitters` (declared; key the flow; action `found` with `interval` and the
//! count). Configuration: `threshold` (default 1000), `by` (`packets` or `bytes`),
//! `tenants` (default 64), `interval_ms`, `width`, `depth`, `reports` (see
//! docs/programs.md), `map` as `forward`.

use crate::forward::{Forward, ForwardConfig};
use crate::report::{Intervals, Measurement, Reports, Writers};
use crate::sketches::{SketchRegister, inherit_counts};
use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, Program, Verdict};
use stateplane_state::{
    Carried, ControlError, CountMin, Declaration, Notification, Reply, Request,
};
use stateplane_wire::FlowKey;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HhConfig {
    #[serde(default = "default_threshold")]
    pub threshold: u32,
    /// "packets" (the default) or "bytes".
    #[serde(default = "default_by")]
    pub by: String,
    #[serde(default = "default_tenants")]
    pub tenants: usize,
    #[serde(flatten)]
    pub measurement: Measurement,
    #[serde(default)]
    pub map: BTreeMap<String, String>,
}

fn default_threshold() -> u32 {
    1000
}

fn default_by() -> String {
    "packets".into()
}

fn default_tenants() -> usize {
    64
}

#[derive(Clone)]
pub struct Hh {
    forward: Forward,
    threshold: u32,
    bytes: bool,
    intervals: Intervals,
    /// VLAN -> 1 + its sketch (0: none yet); `sketches[tenants]` is shared by the tenants
    /// beyond.
    tenant_of: Vec<u16>,
    tenants_seen: usize,
    sketches: Vec<CountMin>,
    /// Whether each sketch was added to in this interval (only those are cleared).
    touched: Vec<bool>,
    /// The sketches as one declared register, `sketch`.
    sketch_register: SketchRegister,
    reports: Reports<FlowKey>,
}

impl Hh {
    pub fn new(
        cfg: &HhConfig,
        ports: &PortNames,
        field: &str,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        let m = &cfg.measurement;
        m.check(field)?;
        let bytes = match cfg.by.as_str() {
            "packets" => false,
            "bytes" => true,
            other => {
                return Err(ConfigError::new(
                    format!("{field}.by"),
                    format!("'{other}' is not packets or bytes"),
                ));
            }
        };
        if cfg.threshold == 0 {
            return Err(ConfigError::new(
                format!("{field}.threshold"),
                "give a count above 0",
            ));
        }
        if !(1..=4096).contains(&cfg.tenants) {
            return Err(ConfigError::new(
                format!("{field}.tenants"),
                "give 1 to 4096 tenants (VLANs) with a sketch of their own",
            ));
        }
        // A sketch per tenant beyond the one the measurement claimed.
        crate::claim_bytes(
            &format!("{field}.tenants"),
            || format!("{} more sketches", cfg.tenants),
            CountMin::bytes_for(m.depth, m.width) * cfg.tenants as u64,
        )?;
        Ok(Hh {
            forward: Forward::new(
                &ForwardConfig {
                    map: cfg.map.clone(),
                },
                ports,
                field,
            )?,
            threshold: cfg.threshold,
            bytes,
            intervals: Intervals::new(m.interval_ns()),
            tenant_of: vec![0; 4096],
            tenants_seen: 0,
            sketches: vec![CountMin::new(m.depth, m.width, seed.rotate_left(17)); cfg.tenants + 1],
            touched: vec![false; cfg.tenants + 1],
            sketch_register: SketchRegister::new("sketch"),
            reports: Reports::new(
                field,
                "heavy_hitters",
                "",
                &cfg.by,
                m,
                2 * m.interval_ns(),
                seed.rotate_left(31),
                Writers::DataPlane,
            )?,
        })
    }

    /// The report of the flow `key` (as its packets have it), if it was found heavy.
    pub fn report(&self, key: &FlowKey) -> Option<crate::report::Report> {
        self.reports.get(&FlowKey { in_port: 0, ..*key })
    }

    /// The sketch tenant `vlan` counts in; `None` while it has none (its first packet
    /// gives it one of its own if there is room, else the shared one).
    fn sketch_of(&self, vlan: u16) -> Option<usize> {
        tenant_sketch(
            &self.tenant_of,
            self.tenants_seen,
            self.sketches.len(),
            vlan,
        )
    }

    /// The sketch of tenant `vlan`, given one if it has none.
    fn sketch(&mut self, vlan: u16) -> usize {
        self.sketch_of(vlan).unwrap_or_else(|| {
            self.tenants_seen += 1;
            self.tenant_of[usize::from(vlan & 0x0fff)] = self.tenants_seen as u16;
            self.tenants_seen - 1
        })
    }

    /// Starts the counts of a new interval.
    fn roll(&mut self, now_ns: u64) -> u32 {
        let (interval, later) = self.intervals.at(now_ns);
        if later {
            for (sketch, touched) in self.sketches.iter_mut().zip(&mut self.touched) {
                if std::mem::take(touched) {
                    sketch.clear();
                }
            }
        }
        interval
    }
}

/// The sketch of tenant `vlan` given `tenant_of` (VLAN -> 1 + its sketch, 0: none yet),
/// `seen` tenants so far and `sketches` in all (the last shared by the tenants beyond).
fn tenant_sketch(tenant_of: &[u16], seen: usize, sketches: usize, vlan: u16) -> Option<usize> {
    match tenant_of[usize::from(vlan & 0x0fff)] {
        0 if seen + 1 < sketches => None,
        0 => Some(sketches - 1),
        s => Some(usize::from(s) - 1),
    }
}

impl Program for Hh {
    type Prepared = ();

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        self.forward.process(burst, ctx);
        for d in burst.descs_mut() {
            if matches!(d.verdict, Verdict::Drop(_)) {
                continue;
            }
            let interval = self.roll(d.ts_ns);
            let key = FlowKey {
                in_port: 0,
                ..d.parsed.key
            };
            let s = self.sketch(key.vlan);
            self.touched[s] = true;
            let n = if self.bytes { d.orig_len } else { 1 };
            let estimate = self.sketches[s].add(&key, n);
            if estimate >= self.threshold {
                self.reports.file(key, estimate, interval, d.ts_ns);
            }
        }
        self.reports
            .expire(ctx.now_ns, crate::sweep_budget(burst.len()));
    }

    fn poll(&mut self, _out: &mut Burst, ctx: &mut Context) {
        self.roll(ctx.now_ns);
        self.reports.expire(ctx.now_ns, crate::IDLE_SWEEP);
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        self.forward.drop_reasons()
    }

    fn declarations(&self) -> Vec<Declaration> {
        (self.reports).declarations_with(&self.sketch_register, &self.sketches)
    }

    fn control(
        &mut self,
        request: &Request,
        _prepared: Option<&std::sync::Arc<()>>,
        ctx: &Context,
    ) -> Result<Reply, ControlError> {
        let (tenant_of, seen) = (&self.tenant_of, self.tenants_seen);
        let sketches = self.sketches.len();
        let sketch = (&self.sketch_register, &mut self.sketches[..]);
        (self.reports).answer_with(sketch, request, ctx, |key: &FlowKey| {
            tenant_sketch(tenant_of, seen, sketches, key.vlan)
        })
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) {
        self.reports.table.take_notifications(out);
    }

    /// A reload keeps the reports (a new threshold applies from the next packet), and the
    /// sketches' counts with the interval they count and each VLAN's sketch when the
    /// measurement is the same: its width, depth, tenants, interval and unit.
    fn inherit(&mut self, mut old: Self, _now_ns: u64) -> Vec<Carried> {
        let measure = if self.bytes != old.bytes {
            Err("it counts bytes where it counted packets, or packets where bytes")
        } else if !self.intervals.inherit(&old.intervals) {
            Err("the measurement interval changed")
        } else {
            Ok(())
        };
        let name = self.sketch_register.name();
        let sketch = inherit_counts(name, &mut self.sketches, &old.sketches, measure);
        if !sketch.lost() {
            self.tenant_of = old.tenant_of;
            self.tenants_seen = old.tenants_seen;
            self.touched = old.touched;
        }
        vec![self.reports.table.adopt(&mut old.reports.table), sketch]
    }

    /// Beside the sketches, what makes their counts mean what they meant: the interval
    /// counted (0: none yet, else 1 + its number), how many tenants have a sketch, which
    /// sketches were added to in the interval, and each VLAN's sketch.
    fn snapshot_aside(&self) -> Vec<u64> {
        let mut words = Vec::with_capacity(2 + self.touched.len() + self.tenant_of.len());
        words.push(self.intervals.current().map_or(0, |i| i + 1));
        words.push(self.tenants_seen as u64);
        words.extend(self.touched.iter().map(|&t| u64::from(t)));
        words.extend(self.tenant_of.iter().map(|&s| u64::from(s)));
        words
    }

    fn install_aside(&mut self, words: &[u64]) {
        let (touched, tenants) = (self.touched.len(), self.tenant_of.len());
        if words.len() != 2 + touched + tenants {
            return;
        }
        self.intervals.set_current(words[0].checked_sub(1));
        self.tenants_seen = (words[1] as usize).min(self.sketches.len() - 1);
        for (t, &w) in self.touched.iter_mut().zip(&words[2..]) {
            *t = w != 0;
        }
        let sketches = self.sketches.len() as u64;
        for (s, &w) in self.tenant_of.iter_mut().zip(&words[2 + touched..]) {
            // 0 (none) to `sketches` (1 + the last): a word past it names none.
            *s = if w <= sketches { w as u16 } else { 0 };
        }
    }

    crate::synced_parts::synced_parts_methods!();
    crate::sketches::sketch_snapshot_methods!();
}

/// What may be synced: the sketch and the reports found from it.
impl crate::synced_parts::SyncedParts for Hh {
    fn synced_views(&self, f: &mut dyn FnMut(&dyn crate::synced_parts::SyncedView)) {
        f(&crate::synced_parts::SketchesView(
            &self.sketch_register,
            &self.sketches,
        ));
        f(&self.reports.table);
    }

    fn synced_parts(&mut self, f: &mut dyn FnMut(&mut dyn crate::synced_parts::SyncedPart)) {
        f(&mut crate::synced_parts::SketchesPart(
            &mut self.sketch_register,
            &mut self.sketches,
        ));
        f(&mut self.reports.table);
    }
}

impl crate::sketches::Sketched for Hh {
    fn sketches_mut(&mut self) -> (&mut SketchRegister, &mut [CountMin]) {
        (&mut self.sketch_register, &mut self.sketches)
    }

    fn sketches(&self) -> (&SketchRegister, &[CountMin]) {
        (&self.sketch_register, &self.sketches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{hasher, run_at};
    use stateplane_gen::build::{Hosts, L4, emit_frame};
    use stateplane_wire::MacAddr;
    use std::collections::HashMap;

    /// Flow `i` of tenant `vlan`: a UDP flow to port 53 from its own port.
    fn frame(vlan: u16, i: u32) -> Vec<u8> {
        let hosts = Hosts {
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            vlan,
            src: format!("198.18.{}.{}", i / 200, 1 + i % 200)
                .parse()
                .unwrap(),
            dst: "198.19.0.1".parse().unwrap(),
            ttl: 64,
        };
        let mut f = Vec::new();
        emit_frame(
            &mut f,
            &hosts,
            &L4::Udp {
                src_port: 1000,
                dst_port: 53,
            },
            b"x",
        );
        f
    }

    fn hh(extra: &str) -> Hh {
        let names = PortNames(vec!["a".into(), "b".into()]);
        let cfg: HhConfig = toml::from_str(extra).unwrap();
        Hh::new(&cfg, &names, "program.hh", 8).unwrap()
    }

    /// `n` packets of flow `i` of tenant `vlan` through `p` at `t_ns`.
    fn send(p: &mut Hh, t_ns: u64, vlan: u16, i: u32, n: usize) {
        let frames = vec![(frame(vlan, i), 0); n];
        for chunk in frames.chunks(64) {
            run_at(p, t_ns, chunk, (0, 1), 2);
        }
    }

    #[test]
    fn a_reload_keeps_the_counts_of_the_interval_and_the_reports() {
        let config = "threshold = 100\nwidth = 256";
        let mut old = hh(config);
        send(&mut old, 1_000_000, 10, 1, 150);
        send(&mut old, 1_000_000, 20, 2, 60);
        assert!(old.report(&key_of(10, 1)).is_some() && old.report(&key_of(20, 2)).is_none());
        let mut new = hh(config);
        let carried = Program::inherit(&mut new, old, 1_000_000);
        let said: Vec<String> = carried.iter().map(ToString::to_string).collect();
        // 64 tenants' sketches and the shared one, 4 rows of 256 counters each.
        let counters = 65 * 4 * 256;
        assert_eq!(
            said,
            [
                "heavy_hitters: kept 1 entries".to_string(),
                format!("sketch: kept {counters} entries")
            ]
        );
        // Flow 2's 60 packets before the reload and 60 after, in one interval, make it
        // heavy: the counts went on.
        send(&mut new, 2_000_000, 20, 2, 60);
        assert_eq!(new.report(&key_of(20, 2)).map(|r| r.estimate), Some(120));
        assert!(new.report(&key_of(10, 1)).is_some());

        // Another interval length: counts of an interval of another length mean
        // something else, so they start afresh; the reports stay.
        let mut longer = hh("threshold = 100\nwidth = 256\ninterval_ms = 2000");
        let carried = Program::inherit(&mut longer, new.clone(), 3_000_000);
        assert_eq!(
            carried[1].to_string(),
            "sketch: starts afresh (the measurement interval changed)"
        );
        assert_eq!(carried[0].kept, 2);
        let mut wider = hh("threshold = 100\nwidth = 512");
        let carried = Program::inherit(&mut wider, new.clone(), 3_000_000);
        assert_eq!(
            carried[1].to_string(),
            "sketch: starts afresh (the sketches' width, depth or number changed)"
        );
        let mut by_bytes = hh("threshold = 100\nwidth = 256\nby = \"bytes\"");
        assert!(Program::inherit(&mut by_bytes, new, 3_000_000)[1].lost());
    }

    /// Flow `i` of tenant `vlan` as its reports are keyed.
    fn key_of(vlan: u16, i: u32) -> FlowKey {
        let key = stateplane_wire::parse(&frame(vlan, i), 0, &hasher())
            .unwrap()
            .key;
        FlowKey { in_port: 0, ..key }
    }

    #[test]
    fn every_heavy_flow_is_reported_and_no_light_one_beyond_the_sketch_bound() {
        let (width, depth, threshold) = (256usize, 4, 200u32);
        let mut p = hh(&format!(
            "threshold = {threshold}\nwidth = {width}\ndepth = {depth}"
        ));
        // Three tenants; in each, flow i sends about 4000 / (i + 1) packets (Zipf-like),
        // interleaved, in one interval.
        let mut frames = Vec::new();
        let mut exact: HashMap<FlowKey, u32> = HashMap::new();
        let mut per_tenant: HashMap<u16, u32> = HashMap::new();
        for vlan in [10u16, 20, 30] {
            for i in 0..600u32 {
                let n = 4000 / (i + 1) / (u32::from(vlan) / 10);
                for _ in 0..n.max(1) {
                    frames.push((frame(vlan, i), 0));
                }
            }
        }
        // A fixed shuffle, so that flows interleave.
        crate::testutil::shuffle(&mut frames, 1);
        for chunk in frames.chunks(64) {
            for (v, bytes) in run_at(&mut p, 5_000_000, chunk, (0, 1), 2) {
                assert_eq!(v, Verdict::Forward(1));
                let key = stateplane_wire::parse(&bytes, 0, &hasher()).unwrap().key;
                *exact.entry(FlowKey { in_port: 0, ..key }).or_default() += 1;
                *per_tenant.entry(key.vlan).or_default() += 1;
            }
        }
        let (mut heavy, mut reported) = (0, 0);
        for (key, &count) in &exact {
            let report = p.report(key);
            if count >= threshold {
                heavy += 1;
                assert!(report.is_some(), "a flow of {count} packets was missed");
            }
            if let Some(r) = report {
                reported += 1;
                let bound = std::f64::consts::E * f64::from(per_tenant[&key.vlan]) / width as f64;
                assert!(
                    f64::from(count) >= f64::from(threshold) - bound,
                    "{count} packets reported (bound {bound:.0})"
                );
                assert!(r.estimate >= count, "count-min never undercounts");
            }
        }
        assert!(heavy >= 20, "the test has heavy flows: {heavy}");
        assert!(
            reported < heavy + heavy / 2,
            "{reported} reported of {heavy}"
        );
        // Each report was sent once as a digest.
        let mut notes = Vec::new();
        p.notifications(&mut notes);
        assert_eq!(notes.len(), reported);
    }

    /// A snapshot of the sketches and the words beside them, installed in a fresh
    /// instance, carry on its counts: each tenant's in its own sketch, whatever order the
    /// tenants come back in, until the interval ends.
    #[test]
    fn a_snapshot_installed_elsewhere_counts_on_in_the_same_tenants_sketches_and_interval() {
        let ms = 1_000_000u64;
        let config = "threshold = 10\ninterval_ms = 100";
        let mut a = hh(config);
        assert_eq!(Program::track(&mut a, "sketch", 0), Some(65 * 4 * 4096));
        run_at(&mut a, 10 * ms, &vec![(frame(20, 0), 0); 3], (0, 1), 2);
        run_at(&mut a, 10 * ms, &vec![(frame(10, 0), 0); 6], (0, 1), 2);
        assert!(Program::snapshot_begin(&mut a, 0));
        let aside = Program::snapshot_aside(&a);
        let mut cells = vec![0u64; 65 * 4 * 4096];
        assert_eq!(
            Program::snapshot_read(&mut a, 0, 0, &mut cells),
            cells.len()
        );
        // Packets after the snapshot began are not in it.
        run_at(&mut a, 11 * ms, &vec![(frame(10, 0), 0); 50], (0, 1), 2);

        let mut b = hh(config);
        Program::track(&mut b, "sketch", 0);
        Program::write_synced_run(&mut b, 0, 0, &cells);
        Program::install_aside(&mut b, &aside);
        let key = |vlan| {
            let k = stateplane_wire::parse(&frame(vlan, 0), 0, &hasher())
                .unwrap()
                .key;
            FlowKey { in_port: 0, ..k }
        };
        // VLAN 10 comes back first: its count goes on in its own sketch (6 + 4 = 10).
        run_at(&mut b, 20 * ms, &vec![(frame(10, 0), 0); 4], (0, 1), 2);
        assert_eq!(b.report(&key(10)).map(|r| r.estimate), Some(10));
        run_at(&mut b, 20 * ms, &vec![(frame(20, 0), 0); 6], (0, 1), 2);
        assert_eq!(b.report(&key(20)), None, "3 + 6 is under 10");
        // The interval ends: the installed counts end with it.
        run_at(&mut b, 150 * ms, &vec![(frame(20, 0), 0); 1], (0, 1), 2);
        run_at(&mut b, 150 * ms, &vec![(frame(20, 0), 0); 8], (0, 1), 2);
        assert_eq!(b.report(&key(20)), None, "9 in the new interval");
        // Words of another length are not taken.
        let mut c = hh(config);
        Program::install_aside(&mut c, &aside[1..]);
        assert_eq!(
            Program::snapshot_aside(&c),
            Program::snapshot_aside(&hh(config))
        );
    }

    /// A pass of a small budget: the sketch's counters, taken whole, leave the table
    /// beside them its own budget, not nothing (else a busy sketch would hold its
    /// reports back pass after pass).
    #[test]
    fn a_busy_sketch_leaves_the_reports_their_budget() {
        let mut p = hh("threshold = 10\ntenants = 1\nwidth = 64\ndepth = 2");
        Program::track(&mut p, "heavy_hitters", 0).unwrap();
        Program::track(&mut p, "sketch", 1).unwrap();
        for flow in 0..6 {
            send(&mut p, 1_000, 10, flow, 12);
        }
        let budget = 20;
        let mut taken = Vec::new();
        assert!(
            !p.changes(&mut taken, budget),
            "six reports are more than 20 words"
        );
        let of = |state| taken.iter().filter(|c| c.state == state).count();
        assert!(of(1) >= 6, "the sketch's counters, whole: {taken:?}");
        assert!(of(0) >= budget, "the reports' own budget: {taken:?}");
    }

    /// The heavy hitters found sync beside the sketch they were found in, each under its
    /// own id: the table's entries move into another switch (another hash seed) whole, by
    /// their keys, and the sketch's counters are read as the control API reads them.
    #[test]
    fn the_heavy_hitters_sync_beside_their_sketch() {
        use stateplane_state::{Reply, Request};
        let mut a = hh("threshold = 10\ntenants = 1\nwidth = 64\ndepth = 2");
        let cfg: HhConfig = toml::from_str("threshold = 10\ntenants = 1").unwrap();
        let names = PortNames(vec!["a".into(), "b".into()]);
        let mut b = Hh::new(&cfg, &names, "program.hh", 9).unwrap();
        let declared = a.reports.table.declaration().clone();
        let stride = stateplane_state::synced_table::SlotWords::of(&declared, &[])
            .unwrap()
            .stride() as u32;
        let slots = a.reports.table.slot_count() as u32;
        for p in [&mut a, &mut b] {
            assert_eq!(Program::track(p, "heavy_hitters", 0), Some(slots * stride));
        }
        assert_eq!(Program::track(&mut a, "sketch", 1), Some(2 * 2 * 64));
        assert_eq!(a.synced(), [(0, slots * stride), (1, 256)]);
        send(&mut a, 1_000, 10, 0, 12);
        send(&mut a, 1_000, 10, 1, 3);
        let key = |i| {
            stateplane_wire::parse(&frame(10, i), 0, &hasher())
                .unwrap()
                .key
        };
        let found = a.report(&key(0));
        assert!(found.is_some() && a.report(&key(1)).is_none());
        let counters = (0..256)
            .map(|i| a.read_synced(1, i).unwrap())
            .collect::<Vec<_>>();
        let request = Request::ReadRegister {
            name: "sketch".into(),
            first: 0,
            count: 256,
        };
        let Ok(Reply::Values(read)) = a.control(&request, None, &crate::testutil::ctx(2, 2)) else {
            panic!("the sketch reads")
        };
        assert_eq!(counters, read.iter().map(|&v| v as u64).collect::<Vec<_>>());
        assert_eq!(
            counters.iter().sum::<u64>(),
            2 * 15,
            "each packet in each row"
        );
        let moved = crate::testutil::move_synced_state(&mut a, &mut b, 0, stride);
        assert_eq!(moved, (1, 0), "one report, placed");
        assert_eq!(b.report(&key(0)), found);
        assert_eq!(b.report(&key(1)), None);
    }

    #[test]
    fn counts_start_again_every_interval_and_tenants_are_apart() {
        let mut p = hh("threshold = 10\ninterval_ms = 100\ntenants = 1");
        let ms = 1_000_000u64;
        let burst = |vlan, n| vec![(frame(vlan, 0), 0); n];
        run_at(&mut p, 10 * ms, &burst(10, 6), (0, 1), 2);
        run_at(&mut p, 150 * ms, &burst(10, 6), (0, 1), 2);
        let key = |vlan| {
            let k = stateplane_wire::parse(&frame(vlan, 0), 0, &hasher())
                .unwrap()
                .key;
            FlowKey { in_port: 0, ..k }
        };
        assert_eq!(
            p.report(&key(10)),
            None,
            "6 + 6 in two intervals is never 10"
        );
        run_at(&mut p, 160 * ms, &burst(10, 4), (0, 1), 2);
        assert_eq!(p.report(&key(10)).map(|r| r.interval), Some(1));
        // A second tenant beyond `tenants` shares the overflow sketch but is still counted.
        run_at(&mut p, 170 * ms, &burst(20, 10), (0, 1), 2);
        assert_eq!(p.report(&key(20)).map(|r| r.estimate), Some(10));
    }
}
