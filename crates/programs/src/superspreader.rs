//! `superspreader`: sources that contact more than `threshold` distinct destinations in
//! an interval (scanners, worms, a DDoS's command host), counted in the data plane.
//!
//! Each packet's (source, destination) pair is looked up in a Bloom filter of the pairs
//! seen in the interval; a pair not seen before adds one to its source's count in a
//! count-min sketch, and a source whose count reaches the threshold is reported (once per
//! interval as a digest, and in the `spreaders` table with its latest count). Both are
//! cleared at each interval. The errors run both ways and are bounded: a Bloom false
//! positive (about `(1 - e^(-3n/bits))^3` for n pairs) loses a pair, the sketch overcounts
//! as in `hh`.
//!
//! Workers: the runtime spreads a source's packets over workers by flow, so with several
//! workers each counts the destinations it sees; run with one worker, or a threshold per
//! worker, for whole counts. Packets are forwarded by `forward`'s port map.
//!
//! State: the pair filter (per worker, write-centric, not declared), the sketch (per
//! worker, write-centric; declared, `sketch`, each source's destinations) and
//! `spreaders` (declared; key `src`; action `found` with `interval` and `destinations`);
//! the sketch and `spreaders` may be synced.
//! Configuration: `threshold` (default 100), `pair_bits` (the filter's size, default
//! 2^22), `interval_ms`, `width`, `depth`, `reports`, `map`.

use crate::forward::{Forward, ForwardConfig};
use crate::report::{Intervals, Measurement, Reports, Writers};
use crate::sketches::{SketchRegister, inherit_counts};
use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, Program, Verdict};
use stateplane_state::{Carried, CountMin, TableKey};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuperspreaderConfig {
    #[serde(default = "default_threshold")]
    pub threshold: u32,
    #[serde(default = "default_pair_bits")]
    pub pair_bits: usize,
    #[serde(flatten)]
    pub measurement: Measurement,
    #[serde(default)]
    pub map: BTreeMap<String, String>,
}

fn default_threshold() -> u32 {
    100
}

fn default_pair_bits() -> usize {
    1 << 22
}

/// A Bloom filter of (source, destination) pairs, three bits per pair.
#[derive(Clone)]
struct PairFilter {
    words: Vec<u64>,
    mask: u64,
    seed: u64,
    /// Whether anything was set since the last clear.
    dirty: bool,
}

impl PairFilter {
    fn new(bits: usize, seed: u64) -> Self {
        let bits = bits.next_power_of_two().max(64);
        PairFilter {
            words: vec![0; bits / 64],
            mask: bits as u64 - 1,
            seed,
            dirty: false,
        }
    }

    /// Sets the pair's bits; whether any was unset (the pair is new).
    #[inline]
    fn insert(&mut self, src: u128, dst: u128) -> bool {
        let h = (src ^ dst.rotate_left(64) ^ dst >> 1).hash_with(self.seed);
        let mut new = false;
        for k in 0..3 {
            let bit = (h >> (k * 21)) & self.mask;
            let (w, b) = ((bit / 64) as usize, bit % 64);
            new |= self.words[w] & (1 << b) == 0;
            self.words[w] |= 1 << b;
        }
        self.dirty = true;
        new
    }

    fn clear(&mut self) {
        if std::mem::take(&mut self.dirty) {
            self.words.fill(0);
        }
    }

    /// Whether `other` sets the same bits for a pair (the same size and seed).
    fn hashed_alike(&self, other: &PairFilter) -> bool {
        (self.mask, self.seed) == (other.mask, other.seed)
    }
}

#[derive(Clone)]
pub struct Superspreader {
    forward: Forward,
    threshold: u32,
    intervals: Intervals,
    pairs: PairFilter,
    destinations: CountMin,
    /// The sketch as a declared register, `sketch`.
    sketch_register: SketchRegister,
    reports: Reports<u128>,
}

/// An address as the control API writes it (IPv4 mapped into IPv6).
fn address(ip: Option<std::net::IpAddr>) -> u128 {
    ip.map_or(0, stateplane_state::control::ip_value)
}

impl Superspreader {
    pub fn new(
        cfg: &SuperspreaderConfig,
        ports: &PortNames,
        field: &str,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        let m = &cfg.measurement;
        m.check(field)?;
        if cfg.threshold == 0 {
            return Err(ConfigError::new(
                format!("{field}.threshold"),
                "give a number of destinations above 0",
            ));
        }
        if !(1 << 10..=1 << 32).contains(&cfg.pair_bits) {
            return Err(ConfigError::new(
                format!("{field}.pair_bits"),
                "give 1024 to 4294967296 bits (about 30 per pair an interval sees)",
            ));
        }
        Ok(Superspreader {
            forward: Forward::new(
                &ForwardConfig {
                    map: cfg.map.clone(),
                },
                ports,
                field,
            )?,
            threshold: cfg.threshold,
            intervals: Intervals::new(m.interval_ns()),
            pairs: PairFilter::new(cfg.pair_bits, seed),
            destinations: CountMin::new(m.depth, m.width, seed.rotate_left(13)),
            sketch_register: SketchRegister::new("sketch"),
            reports: Reports::new(
                field,
                "spreaders",
                "src",
                "destinations",
                m,
                2 * m.interval_ns(),
                seed.rotate_left(29),
                Writers::DataPlane,
            )?,
        })
    }

    /// The report of source `src`, if it was found spreading.
    pub fn report(&self, src: std::net::IpAddr) -> Option<crate::report::Report> {
        self.reports.get(&address(Some(src)))
    }

    fn roll(&mut self, now_ns: u64) -> u32 {
        let (interval, later) = self.intervals.at(now_ns);
        if later {
            self.pairs.clear();
            self.destinations.clear();
        }
        interval
    }
}

/// What may be synced: the sketch and the spreaders found from it (not the pair filter,
/// which only says which pairs the sketch has counted).
impl crate::synced_parts::SyncedParts for Superspreader {
    fn synced_views(&self, f: &mut dyn FnMut(&dyn crate::synced_parts::SyncedView)) {
        let sketch = std::slice::from_ref(&self.destinations);
        f(&crate::synced_parts::SketchesView(
            &self.sketch_register,
            sketch,
        ));
        f(&self.reports.table);
    }

    fn synced_parts(&mut self, f: &mut dyn FnMut(&mut dyn crate::synced_parts::SyncedPart)) {
        let sketch = std::slice::from_mut(&mut self.destinations);
        f(&mut crate::synced_parts::SketchesPart(
            &mut self.sketch_register,
            sketch,
        ));
        f(&mut self.reports.table);
    }
}

impl Program for Superspreader {
    type Prepared = ();

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        self.forward.process(burst, ctx);
        for d in burst.descs_mut() {
            if matches!(d.verdict, Verdict::Drop(_)) || d.parsed.key.ip_version == 0 {
                continue;
            }
            let interval = self.roll(d.ts_ns);
            let key = &d.parsed.key;
            let (src, dst) = (address(key.src_ip()), address(key.dst_ip()));
            if self.pairs.insert(src, dst) {
                let count = self.destinations.add(&src, 1);
                if count >= self.threshold {
                    self.reports.file(src, count, interval, d.ts_ns);
                }
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

    crate::report::answer_by_measurement!(reports, sketch_register, destinations);

    crate::synced_parts::synced_parts_methods!();

    /// A reload keeps the reports (a new threshold applies from the next packet), and the
    /// interval's counts (the pairs seen and each source's destinations) when the
    /// measurement is the same: its interval, sketch and pair filter.
    fn inherit(&mut self, mut old: Self, _now_ns: u64) -> Vec<Carried> {
        let measure = if !self.intervals.inherit(&old.intervals) {
            Err("the measurement interval changed")
        } else if !self.pairs.hashed_alike(&old.pairs) {
            Err("pair_bits changed")
        } else {
            Ok(())
        };
        let destinations = inherit_counts(
            self.sketch_register.name(),
            std::slice::from_mut(&mut self.destinations),
            std::slice::from_ref(&old.destinations),
            measure,
        );
        if !destinations.lost() {
            self.pairs = old.pairs;
        }
        vec![
            self.reports.table.adopt(&mut old.reports.table),
            destinations,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{ip_frame, run_at};
    use stateplane_gen::build::L4;

    fn spreader(extra: &str) -> Superspreader {
        let names = PortNames(vec!["a".into(), "b".into()]);
        let cfg: SuperspreaderConfig = toml::from_str(extra).unwrap();
        Superspreader::new(&cfg, &names, "program.superspreader", 2).unwrap()
    }

    fn packet(src: &str, dst: u32) -> (Vec<u8>, u16) {
        let dst = format!("198.19.{}.{}", dst / 250, 1 + dst % 250);
        let l4 = L4::Udp {
            src_port: 999,
            dst_port: 80,
        };
        (ip_frame(src, &dst, l4), 0)
    }

    fn bytes(addr: &str) -> std::net::IpAddr {
        addr.parse().unwrap()
    }

    /// The sketch is declared (`sketch`, read as the control API reads it) and syncs
    /// beside the spreaders found: each new pair counts once in each row, a pair seen
    /// again not at all, and a spreader's report is an entry of the synced table.
    #[test]
    fn the_sketch_and_the_spreaders_sync_side_by_side() {
        use stateplane_state::{Reply, Request};
        let mut p = spreader("threshold = 10\nwidth = 64\ndepth = 2");
        let declared = p.declarations();
        assert_eq!(declared[1].name, "sketch");
        assert_eq!(declared[1].capacity, 128);
        let length = Program::track(&mut p, "spreaders", 0).unwrap();
        assert_eq!(Program::track(&mut p, "sketch", 1), Some(128));
        assert_eq!(p.synced(), [(0, length), (1, 128)]);
        let packets: Vec<_> = (0..12)
            .chain(0..5)
            .map(|d| packet("198.18.1.1", d))
            .collect();
        run_at(&mut p, 1, &packets, (0, 1), 2);
        assert!(p.report(bytes("198.18.1.1")).is_some());
        let mut changes = Vec::new();
        assert!(p.changes(&mut changes, usize::MAX));
        let counted: u64 = (changes.iter().filter(|c| c.state == 1))
            .map(|c| c.new - c.old)
            .sum();
        assert_eq!(counted, 2 * 12, "12 pairs, each once in each of 2 rows");
        assert!(
            changes.iter().any(|c| c.state == 0 && c.exact),
            "the report's key"
        );
        let request = Request::ReadRegister {
            name: "sketch".into(),
            first: 0,
            count: 128,
        };
        let Ok(Reply::Values(read)) = p.control(&request, None, &crate::testutil::ctx(2, 2)) else {
            panic!("the sketch reads")
        };
        let synced = (0..128).map(|i| p.read_synced(1, i).map(u128::from));
        assert_eq!(synced.collect::<Option<Vec<_>>>(), Some(read));
    }

    #[test]
    fn a_reload_keeps_the_pairs_seen_and_the_destinations_counted() {
        let config = "threshold = 100\nwidth = 1024";
        let mut old = spreader(config);
        let before: Vec<_> = (0..60).map(|d| packet("198.18.1.1", d)).collect();
        run_at(&mut old, 1, &before, (0, 1), 2);
        let mut new = spreader(config);
        let carried = Program::inherit(&mut new, old.clone(), 1);
        assert_eq!(carried[1].to_string(), "sketch: kept 4096 entries");
        // 30 destinations seen before the reload and 60 new ones: 120 in all, the repeats
        // not counted again.
        let after: Vec<_> = (30..120).map(|d| packet("198.18.1.1", d)).collect();
        run_at(&mut new, 2, &after, (0, 1), 2);
        let found = new.report(bytes("198.18.1.1")).map(|r| r.estimate);
        assert!(found.is_some_and(|e| (110..=125).contains(&e)), "{found:?}");
        let mut shorter = spreader("threshold = 100\nwidth = 1024\ninterval_ms = 10");
        let carried = Program::inherit(&mut shorter, old, 1);
        assert_eq!(
            carried[1].to_string(),
            "sketch: starts afresh (the measurement interval changed)"
        );
    }

    #[test]
    fn sources_over_the_threshold_of_distinct_destinations_are_found_and_no_others() {
        let mut p = spreader("threshold = 100\nwidth = 1024");
        let mut frames = Vec::new();
        // Five scanners, 300 distinct destinations each.
        for s in 0..5 {
            for d in 0..300 {
                frames.push(packet(&format!("198.18.1.{}", s + 1), d));
            }
        }
        // 400 ordinary sources: 20 destinations each, 10 packets to each.
        for s in 0..400u32 {
            for d in 0..20 {
                for _ in 0..10 {
                    frames.push(packet(
                        &format!("198.18.{}.{}", 2 + s / 200, 1 + s % 200),
                        d,
                    ));
                }
            }
        }
        // One heavy talker to a single destination is not spreading.
        frames.extend((0..5000).map(|_| packet("198.18.9.9", 7)));
        crate::testutil::shuffle(&mut frames, 5);
        for chunk in frames.chunks(64) {
            run_at(&mut p, 1, chunk, (0, 1), 2);
        }
        for s in 0..5 {
            let r = p.report(bytes(&format!("198.18.1.{}", s + 1)));
            let r = r.expect("a scanner is found");
            assert!((290..=330).contains(&r.estimate), "{r:?}");
        }
        assert_eq!(
            p.report(bytes("198.18.9.9")),
            None,
            "many packets, one destination"
        );
        assert_eq!(p.reports.table.len(), 5, "only the scanners");
    }

    #[test]
    fn counts_start_again_every_interval() {
        let mut p = spreader("threshold = 50\ninterval_ms = 10");
        let ms = 1_000_000u64;
        let half: Vec<_> = (0..30).map(|d| packet("198.18.1.1", d)).collect();
        let other_half: Vec<_> = (30..60).map(|d| packet("198.18.1.1", d)).collect();
        run_at(&mut p, ms, &half, (0, 1), 2);
        run_at(&mut p, 11 * ms, &other_half, (0, 1), 2);
        assert_eq!(
            p.report(bytes("198.18.1.1")),
            None,
            "30 and 30 in two intervals"
        );
        let more: Vec<_> = (60..80).map(|d| packet("198.18.1.1", d)).collect();
        run_at(&mut p, 12 * ms, &more, (0, 1), 2);
        let r = p.report(bytes("198.18.1.1")).unwrap();
        assert_eq!((r.interval, r.estimate), (1, 50));
    }
}
