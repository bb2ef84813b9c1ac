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
//! State: the pair filter and the sketch (per worker, write-centric) and `spreaders`
//! (declared; key `src`; action `found` with `interval` and `destinations`).
//! Configuration: `threshold` (default 100), `pair_bits` (the filter's size, default
//! 2^22), `interval_ms`, `width`, `depth`, `reports`, `map`.

use crate::forward::{Forward, ForwardConfig};
use crate::report::{Intervals, Measurement, Reports, Writers};
use crate::sketches::inherit_counts;
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

    crate::answer_by_table!(reports.table);

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
            "destinations",
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

    #[test]
    fn a_reload_keeps_the_pairs_seen_and_the_destinations_counted() {
        let config = "threshold = 100\nwidth = 1024";
        let mut old = spreader(config);
        let before: Vec<_> = (0..60).map(|d| packet("198.18.1.1", d)).collect();
        run_at(&mut old, 1, &before, (0, 1), 2);
        let mut new = spreader(config);
        let carried = Program::inherit(&mut new, old.clone(), 1);
        assert_eq!(carried[1].to_string(), "destinations: kept 4096 entries");
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
            "destinations: starts afresh (the measurement interval changed)"
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
