//! `udpflood` and `synflood`: flood detection per destination, and mitigation.
//!
//! Attack packets are UDP datagrams (`udpflood`) or TCP SYNs without ACK (`synflood`:
//! connection openings, which a victim must answer with state of its own). Each interval
//! they are counted per destination in a count-min sketch, cleared at the interval's end;
//! a destination whose count reaches `threshold` in an interval is a victim: reported (a
//! digest at the first detection of each interval, and the `victims` table), and from then
//! on its attack packets are mitigated, while other traffic to it (a SYN flood victim's
//! established connections) passes untouched. A victim stays one until it has gone `hold`
//! seconds without being detected again.
//!
//! Mitigation (`mitigation`): `drop` every attack packet to a victim, `limit` them to
//! `limit_rate` bytes per second with bursts of `limit_burst` (a single-rate meter per
//! victim, RFC 2697, so that some legitimate clients still get through), or `none`
//! (detection only).
//!
//! Workers: each worker counts the attack packets the runtime sends it; flood packets
//! come from many flows, so with `n` workers each sees about `1/n` of them: give the
//! threshold per worker. Other packets are forwarded by `forward`'s port map.
//!
//! State: the sketch (per worker, write-centric), `victims` (declared; key `dst`; action
//! `found` with `interval` and `packets`; with their meters). Configuration: `threshold`
//! (attack packets per interval, default 10000), `mitigation`, `limit_rate`,
//! `limit_burst`, `hold` (seconds, default 10), `interval_ms`, `width`, `depth`,
//! `reports`, `map`. Drop reasons: `flood` (dropped), `policed` (over the limit).

use crate::forward::{Forward, ForwardConfig};
use crate::report::{Intervals, Measurement, Reports, Writers};
use crate::sketches::{SketchRegister, inherit_counts};
use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, DropReason, Program, Verdict};
use stateplane_state::control::ip_value;
use stateplane_state::{Carried, Colour, CountMin, ExactTable, ExpireProfile, Meter, MeterConfig};
use stateplane_wire::parse::Parsed;
use stateplane_wire::tcp::flags;
use std::collections::BTreeMap;

/// Which packets are the attack's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attack {
    Udp,
    Syn,
}

impl Attack {
    #[inline]
    fn matches(self, p: &Parsed) -> bool {
        match self {
            Attack::Udp => p.key.proto == 17,
            Attack::Syn => {
                p.key.proto == 6 && p.tcp_flags & (flags::SYN | flags::ACK) == flags::SYN
            }
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FloodConfig {
    #[serde(default = "default_threshold")]
    pub threshold: u32,
    /// "drop" (the default), "limit" or "none".
    #[serde(default = "default_mitigation")]
    pub mitigation: String,
    /// Bytes per second and burst bytes of attack traffic a victim still gets (`limit`).
    #[serde(default = "default_limit_rate")]
    pub limit_rate: u64,
    #[serde(default = "default_limit_burst")]
    pub limit_burst: u64,
    #[serde(default = "default_hold")]
    pub hold: f64,
    #[serde(flatten)]
    pub measurement: Measurement,
    #[serde(default)]
    pub map: BTreeMap<String, String>,
}

fn default_threshold() -> u32 {
    10_000
}

fn default_mitigation() -> String {
    "drop".into()
}

fn default_limit_rate() -> u64 {
    125_000
}

fn default_limit_burst() -> u64 {
    15_000
}

fn default_hold() -> f64 {
    10.0
}

const FLOOD: DropReason = DropReason::program(1);
const POLICED: DropReason = DropReason::program(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mitigation {
    Drop,
    Limit(MeterConfig),
    None,
}

#[derive(Clone)]
pub struct Flood {
    attack: Attack,
    forward: Forward,
    threshold: u32,
    mitigation: Mitigation,
    intervals: Intervals,
    counts: CountMin,
    /// The sketch as a declared register, `sketch`.
    sketch_register: SketchRegister,
    victims: Reports<u128>,
    /// Each victim's meter (`limit`), removed with it.
    meters: ExactTable<u128, Meter>,
}

impl Flood {
    pub fn new(
        attack: Attack,
        cfg: &FloodConfig,
        ports: &PortNames,
        field: &str,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        let m = &cfg.measurement;
        m.check(field)?;
        if cfg.threshold == 0 {
            return Err(ConfigError::new(
                format!("{field}.threshold"),
                "give a number of packets per interval above 0",
            ));
        }
        let mitigation = match cfg.mitigation.as_str() {
            "drop" => Mitigation::Drop,
            "none" => Mitigation::None,
            "limit" => {
                let meter = MeterConfig::SrTcm {
                    cir: cfg.limit_rate,
                    cbs: cfg.limit_burst,
                    ebs: 0,
                };
                if let Some(problem) = meter.problem() {
                    return Err(ConfigError::new(format!("{field}.limit_burst"), problem));
                }
                Mitigation::Limit(meter)
            }
            other => {
                return Err(ConfigError::new(
                    format!("{field}.mitigation"),
                    format!("'{other}' is not drop, limit or none"),
                ));
            }
        };
        let hold = crate::idle_profiles(field, &[("hold", cfg.hold)])?[0].timeout_ns;
        let victims = Reports::new(
            field,
            "victims",
            "dst",
            "packets",
            m,
            hold,
            seed.rotate_left(7),
            Writers::DataPlaneAndControl,
        )?;
        Ok(Flood {
            attack,
            forward: Forward::new(
                &ForwardConfig {
                    map: cfg.map.clone(),
                },
                ports,
                field,
            )?,
            threshold: cfg.threshold,
            mitigation,
            intervals: Intervals::new(m.interval_ns()),
            counts: CountMin::new(m.depth, m.width, seed),
            sketch_register: SketchRegister::new("sketch"),
            victims,
            meters: crate::budgeted_table(
                &format!("{field}.reports"),
                m.reports,
                &[ExpireProfile::NEVER],
                seed.rotate_left(19),
            )?,
        })
    }

    /// The report of victim `dst`, if it is one.
    pub fn victim(&self, dst: std::net::IpAddr) -> Option<crate::report::Report> {
        self.victims.get(&ip_value(dst))
    }

    /// What happens to an attack packet of `bytes` to `dst` at `now`: counted, and
    /// mitigated if `dst` is a victim.
    fn judge(&mut self, dst: u128, bytes: u32, now: u64) -> Option<DropReason> {
        let (interval, later) = self.intervals.at(now);
        if later {
            self.counts.clear();
        }
        let count = self.counts.add(&dst, 1);
        // One look at the victims per packet: filed at or over the threshold, else read.
        let victim = if count >= self.threshold {
            self.victims.file(dst, count, interval, now).is_some()
        } else {
            self.victims.get(&dst).is_some()
        };
        if !victim {
            return None;
        }
        match self.mitigation {
            Mitigation::None => None,
            Mitigation::Drop => Some(FLOOD),
            Mitigation::Limit(config) => {
                // A victim's meter starts full when it is first found.
                let id = match self.meters.lookup(&dst, now) {
                    Some(id) => id,
                    None => self
                        .meters
                        .add_entry(dst, Meter::new(config, now), 0, now)
                        .ok()?,
                };
                let colour = self.meters.value_mut(id).mark(bytes, now, None);
                (colour == Colour::Red).then_some(POLICED)
            }
        }
    }

    fn expire(&mut self, now: u64, budget: usize) {
        let meters = &mut self.meters;
        self.victims.table.expire(now, budget, |dst, _| {
            meters.delete(dst);
        });
    }
}

impl Program for Flood {
    type Prepared = ();

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        self.forward.process(burst, ctx);
        for d in burst.descs_mut() {
            if matches!(d.verdict, Verdict::Drop(_)) || !self.attack.matches(&d.parsed) {
                continue;
            }
            let Some(dst) = d.parsed.key.dst_ip() else {
                continue;
            };
            if let Some(reason) = self.judge(ip_value(dst), d.orig_len, d.ts_ns) {
                d.verdict = Verdict::Drop(reason);
            }
        }
        self.expire(ctx.now_ns, crate::sweep_budget(burst.len()));
    }

    fn poll(&mut self, _out: &mut Burst, ctx: &mut Context) {
        self.expire(ctx.now_ns, crate::IDLE_SWEEP);
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        // `forward`'s `no_mapping` first, at its index 0.
        &["no_mapping", "flood", "policed"]
    }

    crate::report::answer_by_measurement!(victims, sketch_register, counts);

    crate::synced_parts::synced_parts_methods!();
    crate::sketches::sketch_snapshot_methods!();

    /// A reload keeps the victims and, while the mitigation is the same, their meters;
    /// and the interval's counts when the measurement is the same (its interval and
    /// sketch). A program that counts another attack starts afresh.
    fn inherit(&mut self, mut old: Self, _now_ns: u64) -> Vec<Carried> {
        let sketch = self.sketch_register.name();
        if self.attack != old.attack {
            let why = "it counts another attack";
            return (self.declarations().iter())
                .map(|d| Carried::afresh(&d.name, why))
                .collect();
        }
        let measure = match self.intervals.inherit(&old.intervals) {
            true => Ok(()),
            false => Err("the measurement interval changed"),
        };
        let counts = inherit_counts(
            sketch,
            std::slice::from_mut(&mut self.counts),
            std::slice::from_ref(&old.counts),
            measure,
        );
        let victims = self.victims.table.adopt(&mut old.victims.table);
        let meters = if self.mitigation == old.mitigation {
            let adopted = self.meters.adopt(&mut old.meters);
            let why = "the new reports capacity holds fewer";
            Carried::entries("meters", adopted.kept, adopted.dropped, why)
        } else {
            Carried::afresh("meters", "the mitigation changed")
        };
        vec![victims, counts, meters]
    }
}

/// What may be synced: the sketch and the reports found from it.
impl crate::synced_parts::SyncedParts for Flood {
    fn synced_views(&self, f: &mut dyn FnMut(&dyn crate::synced_parts::SyncedView)) {
        f(&crate::synced_parts::SketchesView(
            &self.sketch_register,
            std::slice::from_ref(&self.counts),
        ));
        f(&self.victims.table);
    }

    fn synced_parts(&mut self, f: &mut dyn FnMut(&mut dyn crate::synced_parts::SyncedPart)) {
        f(&mut crate::synced_parts::SketchesPart(
            &mut self.sketch_register,
            std::slice::from_mut(&mut self.counts),
        ));
        f(&mut self.victims.table);
    }
}

impl crate::sketches::Sketched for Flood {
    fn sketches_mut(&mut self) -> (&mut SketchRegister, &mut [CountMin]) {
        (
            &mut self.sketch_register,
            std::slice::from_mut(&mut self.counts),
        )
    }

    fn sketches(&self) -> (&SketchRegister, &[CountMin]) {
        (&self.sketch_register, std::slice::from_ref(&self.counts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{ip_frame, run_at, tcp};
    use stateplane_gen::build::L4;

    const MS: u64 = 1_000_000;
    const VICTIM: &str = "198.19.0.66";

    fn flood(attack: Attack, extra: &str) -> Flood {
        let names = PortNames(vec!["a".into(), "b".into()]);
        let cfg: FloodConfig = toml::from_str(extra).unwrap();
        Flood::new(attack, &cfg, &names, "program.flood", 6).unwrap()
    }

    fn udp(src: u32, dst: &str) -> (Vec<u8>, u16) {
        let src = format!("198.18.{}.{}", src / 250, 1 + src % 250);
        let l4 = L4::Udp {
            src_port: 4000,
            dst_port: 53,
        };
        (ip_frame(&src, dst, l4), 0)
    }

    fn reasons(p: &Flood, out: &[(Verdict, Vec<u8>)]) -> Vec<&'static str> {
        out.iter()
            .map(|(v, _)| match v {
                Verdict::Drop(r) => r.name(p.drop_reasons()),
                _ => "pass",
            })
            .collect()
    }

    #[test]
    fn a_reload_keeps_the_counts_the_victims_and_their_meters() {
        let config =
            "threshold = 100\nmitigation = \"limit\"\nlimit_rate = 1000\nlimit_burst = 1000";
        let mut old = flood(Attack::Udp, config);
        let frames: Vec<_> = (0..60).map(|i| udp(i, VICTIM)).collect();
        run_at(&mut old, 10 * MS, &frames, (0, 1), 2);
        // A bystander flooded: the victim reported before the reload.
        run_at(
            &mut old,
            10 * MS,
            &vec![udp(0, "198.19.0.7"); 150],
            (0, 1),
            2,
        );
        assert!(old.victim(VICTIM.parse().unwrap()).is_none());
        let mut new = flood(Attack::Udp, config);
        let carried = Program::inherit(&mut new, old.clone(), 20 * MS);
        let said: Vec<String> = carried.iter().map(ToString::to_string).collect();
        assert_eq!(
            said,
            [
                "victims: kept 1 entries",
                "sketch: kept 16384 entries",
                "meters: kept 1 entries"
            ]
        );
        // 60 datagrams before the reload and 60 after, in one interval: a flood.
        run_at(&mut new, 20 * MS, &frames, (0, 1), 2);
        assert!(new.victim(VICTIM.parse().unwrap()).is_some());
        // Another mitigation's meters would police at the old rate: they start afresh.
        let mut dropping = flood(Attack::Udp, "threshold = 100");
        let carried = Program::inherit(&mut dropping, old.clone(), 20 * MS);
        assert_eq!(
            carried[2].to_string(),
            "meters: starts afresh (the mitigation changed)"
        );
        assert_eq!(carried[0].kept, 1);
        let mut syn = flood(Attack::Syn, config);
        let carried = Program::inherit(&mut syn, old, 20 * MS);
        assert!(carried.iter().all(|c| c.lost()), "{carried:?}");
    }

    #[test]
    fn a_udp_flood_is_found_at_the_threshold_and_dropped_until_it_stops() {
        let mut p = flood(
            Attack::Udp,
            "threshold = 100\ninterval_ms = 100\nhold = 0.3\nreports = 16",
        );
        // 300 datagrams from many sources to the victim, 50 to a bystander, interleaved.
        let mut frames: Vec<_> = (0..300).map(|i| udp(i, VICTIM)).collect();
        for i in 0..50 {
            frames.insert(i * 6, udp(i as u32, "198.19.0.7"));
        }
        let out = run_at(&mut p, 10 * MS, &frames, (0, 1), 2);
        let r = reasons(&p, &out);
        let to_victim: Vec<&str> = (0..frames.len())
            .filter(|i| i % 6 != 0 || i / 6 >= 50)
            .map(|i| r[i])
            .collect();
        assert!(
            to_victim[..99].iter().all(|&x| x == "pass"),
            "below the threshold"
        );
        assert!(
            to_victim[99..].iter().all(|&x| x == "flood"),
            "from the 100th on"
        );
        assert!(
            (0..50).all(|i| r[i * 6] == "pass"),
            "the bystander is untouched"
        );
        assert_eq!(
            p.victim(VICTIM.parse().unwrap()).map(|v| v.interval),
            Some(0)
        );
        // A later interval: the counts start again, but a victim's attack packets are
        // dropped from the first; it is found again at the threshold.
        let again: Vec<_> = (0..100).map(|i| udp(i, VICTIM)).collect();
        let out = run_at(&mut p, 150 * MS, &again, (0, 1), 2);
        assert!(reasons(&p, &out).iter().all(|&r| r == "flood"));
        assert_eq!(
            p.victim(VICTIM.parse().unwrap()).map(|v| v.interval),
            Some(1)
        );
        // The flood stops; after `hold`, the victim's traffic passes again.
        for _ in 0..8 {
            p.poll(
                &mut Burst::with_capacity(1),
                &mut crate::testutil::ctx(500 * MS, 2),
            );
        }
        assert_eq!(p.victim(VICTIM.parse().unwrap()), None);
        let out = run_at(&mut p, 500 * MS, &[udp(1, VICTIM)], (0, 1), 2);
        assert_eq!(reasons(&p, &out), ["pass"]);
        let mut notes = Vec::new();
        p.notifications(&mut notes);
        assert_eq!(
            notes
                .iter()
                .filter(|n| n.kind == stateplane_state::NotificationKind::Digest)
                .count(),
            2,
            "one digest per interval it was found in"
        );
    }

    #[test]
    fn a_syn_flood_victims_established_connections_pass() {
        let mut p = flood(Attack::Syn, "threshold = 50");
        let syn = |i: u32| {
            (
                ip_frame(
                    &format!("198.18.0.{}", 1 + i % 250),
                    VICTIM,
                    tcp(1000 + i as u16, 80, flags::SYN),
                ),
                0,
            )
        };
        let syns: Vec<_> = (0..200).map(syn).collect();
        let out = run_at(&mut p, MS, &syns, (0, 1), 2);
        assert_eq!(
            reasons(&p, &out).iter().filter(|&&r| r == "flood").count(),
            151
        );
        let ack = (ip_frame("198.18.0.1", VICTIM, tcp(1000, 80, flags::ACK)), 0);
        let syn_ack = (
            ip_frame("198.18.0.1", VICTIM, tcp(1000, 80, flags::SYN | flags::ACK)),
            0,
        );
        let udp = udp(3, VICTIM);
        let out = run_at(&mut p, 2 * MS, &[ack, syn_ack, udp], (0, 1), 2);
        assert_eq!(reasons(&p, &out), ["pass", "pass", "pass"]);
    }

    #[test]
    fn limit_lets_the_meters_rate_through() {
        // 10,000 bytes per second, bursts of 2,000: over one second of flooding, a victim
        // gets at most 12,000 bytes of attack traffic.
        let mut p = flood(
            Attack::Udp,
            "threshold = 10\nmitigation = \"limit\"\nlimit_rate = 10000\nlimit_burst = 2000",
        );
        let mut passed = 0usize;
        let mut found = false;
        for ms in 0..1000u64 {
            let frames: Vec<_> = (0..5).map(|i| udp(i, VICTIM)).collect();
            let out = run_at(&mut p, ms * MS, &frames, (0, 1), 2);
            // From the first burst after the detection, all of it metered.
            if found {
                for (v, bytes) in out {
                    if v == Verdict::Forward(1) {
                        passed += bytes.len();
                    }
                }
            }
            found |= p.victim(VICTIM.parse().unwrap()).is_some();
        }
        assert!(found);
        assert!((8_000..=12_000).contains(&passed), "{passed} bytes passed");
    }

    #[test]
    fn bad_settings_name_the_field() {
        let names = PortNames(vec!["a".into(), "b".into()]);
        let err = |text: &str| {
            let cfg: FloodConfig = toml::from_str(text).unwrap();
            Flood::new(Attack::Udp, &cfg, &names, "program.udpflood", 1)
                .err()
                .map(|e| e.field)
        };
        assert_eq!(
            err("mitigation = \"block\"").as_deref(),
            Some("program.udpflood.mitigation")
        );
        assert_eq!(
            err("threshold = 0").as_deref(),
            Some("program.udpflood.threshold")
        );
        assert_eq!(
            err("interval_ms = 0").as_deref(),
            Some("program.udpflood.interval_ms")
        );
        assert_eq!(err("hold = 0").as_deref(), Some("program.udpflood.hold"));
        let unknown = toml::from_str::<FloodConfig>("treshold = 5").unwrap_err();
        assert!(unknown.message().contains("treshold"), "{unknown}");
    }
}
