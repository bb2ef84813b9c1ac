//! `flowlet`: flowlet switching across equal-cost next hops (as in LetFlow and CONGA).
//!
//! A flow's packets that follow one another closely stay on one next hop, so they cannot
//! be reordered; once a flow has paused for longer than `gap_us` (longer than the
//! difference in delay between the paths), its next packet starts a new flowlet, which may
//! take another next hop. Traffic is so spread at a finer grain than whole flows (an
//! elephant does not pin a path) without reordering within a flowlet.
//!
//! Flowlets are tracked in a table indexed by the flow hash, with no key: flows that
//! collide share an entry (they then switch together, which is harmless), so the table
//! never fills. A new flowlet's next hop is drawn at random (LetFlow's choice, which
//! balances by letting congested paths' flowlets end sooner).
//!
//! Ports: packets from `ingress` (default port 0) are spread over `next_hops` (default
//! every other port); packets from a next hop go to `ingress`.
//!
//! State: per worker, the last packet time and next hop of each table slot (write-centric:
//! every packet writes its slot). Configuration: `ingress`, `next_hops`, `gap_us`
//! (default 500), `slots` (a power of two, default 65536).

use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, PortId, Program, Verdict};
use stateplane_state::Carried;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowletConfig {
    #[serde(default = "default_ingress")]
    pub ingress: String,
    #[serde(default)]
    pub next_hops: Vec<String>,
    #[serde(default = "default_gap")]
    pub gap_us: u64,
    #[serde(default = "default_slots")]
    pub slots: usize,
}

fn default_ingress() -> String {
    "0".into()
}

fn default_gap() -> u64 {
    500
}

fn default_slots() -> usize {
    65_536
}

/// One table slot: when its last packet passed, and where it went.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    last_ns: u64,
    hop: u16,
}

#[derive(Clone)]
pub struct Flowlet {
    ingress: PortId,
    hops: Vec<PortId>,
    gap_ns: u64,
    slots: Vec<Slot>,
    mask: u64,
    rng: u64,
    /// Flowlets begun (a flow's first packet or one after a gap).
    pub flowlets: u64,
}

impl Flowlet {
    pub fn new(
        cfg: &FlowletConfig,
        ports: &PortNames,
        field: &str,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        let ingress = ports.resolve(&format!("{field}.ingress"), &cfg.ingress)?;
        let hops: Vec<PortId> = if cfg.next_hops.is_empty() {
            (0..ports.0.len() as PortId)
                .filter(|&p| p != ingress)
                .collect()
        } else {
            let field = format!("{field}.next_hops");
            let hops = (cfg.next_hops.iter())
                .map(|h| ports.resolve(&field, h))
                .collect::<Result<Vec<_>, _>>()?;
            if hops.contains(&ingress) {
                return Err(ConfigError::new(
                    field,
                    "the ingress port cannot be a next hop",
                ));
            }
            hops
        };
        if hops.is_empty() {
            return Err(ConfigError::new(
                format!("{field}.next_hops"),
                "give at least one next hop (the switch has no port besides the ingress)",
            ));
        }
        if !cfg.slots.is_power_of_two() || !(64..=1 << 26).contains(&cfg.slots) {
            return Err(ConfigError::new(
                format!("{field}.slots"),
                format!("{} is not a power of two from 64 to 67108864", cfg.slots),
            ));
        }
        if !(1..=10_000_000).contains(&cfg.gap_us) {
            return Err(ConfigError::new(
                format!("{field}.gap_us"),
                "give 1 to 10000000 microseconds",
            ));
        }
        crate::claim_bytes(
            &format!("{field}.slots"),
            || format!("{} slots", cfg.slots),
            (cfg.slots * std::mem::size_of::<Slot>()) as u64,
        )?;
        Ok(Flowlet {
            ingress,
            hops,
            gap_ns: cfg.gap_us * 1000,
            slots: vec![Slot::default(); cfg.slots],
            mask: cfg.slots as u64 - 1,
            rng: seed | 1,
            flowlets: 0,
        })
    }

    /// A random next hop (xorshift64*).
    fn draw(&mut self) -> u16 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
        ((r >> 32) % self.hops.len() as u64) as u16
    }
}

impl Program for Flowlet {
    type Prepared = ();

    fn process(&mut self, burst: &mut Burst, _ctx: &mut Context) {
        for d in burst.descs_mut() {
            if d.in_port != self.ingress {
                d.verdict = Verdict::Forward(self.ingress);
                continue;
            }
            let i = (d.parsed.hash & self.mask) as usize;
            let Slot { last_ns, hop } = self.slots[i];
            // A slot never used has `last_ns` 0: a first packet is a new flowlet.
            let hop = if last_ns == 0 || d.ts_ns.saturating_sub(last_ns) > self.gap_ns {
                self.flowlets += 1;
                self.draw()
            } else {
                hop
            };
            self.slots[i] = Slot {
                last_ns: d.ts_ns.max(1),
                hop,
            };
            d.verdict = Verdict::Forward(self.hops[usize::from(hop)]);
        }
    }

    /// A reload keeps each flow's flowlet (its next hop and its last packet's time) while
    /// the table's size and the next hops are the same; a new `gap_us` applies from the
    /// next packet.
    fn inherit(&mut self, old: Self, _now_ns: u64) -> Vec<Carried> {
        self.flowlets += old.flowlets;
        if self.slots.len() != old.slots.len() || self.hops != old.hops {
            let why = "the table's size or the next hops changed";
            return vec![Carried::afresh("flowlets", why)];
        }
        let kept = old.slots.iter().filter(|s| s.last_ns != 0).count() as u64;
        self.slots = old.slots;
        vec![Carried::entries("flowlets", kept, 0, "")]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{ip_frame, run_at, tcp};

    const US: u64 = 1000;

    fn flowlet(extra: &str) -> Flowlet {
        let names = PortNames(vec!["in".into(), "a".into(), "b".into(), "c".into()]);
        let cfg: FlowletConfig = toml::from_str(extra).unwrap();
        Flowlet::new(&cfg, &names, "program.flowlet", 77).unwrap()
    }

    fn packet(flow: u16) -> (Vec<u8>, u16) {
        (
            ip_frame("198.18.0.1", "198.19.0.1", tcp(1000 + flow, 80, 0x10)),
            0,
        )
    }

    #[test]
    fn a_reload_keeps_each_flowlet_on_its_hop() {
        let mut old = flowlet("gap_us = 100");
        let frames: Vec<_> = (0..200).map(packet).collect();
        let before = run_at(&mut old, 1_000 * US, &frames, (0, 1), 4);
        let mut new = flowlet("gap_us = 200");
        let carried = Program::inherit(&mut new, old.clone(), 1_000 * US);
        let used = old.slots.iter().filter(|s| s.last_ns != 0).count() as u64;
        assert!(used > 150, "{used}");
        assert_eq!(carried, [Carried::entries("flowlets", used, 0, "")]);
        // Within the gap, every flow goes on along its hop, in the flowlet it was in (a
        // fresh table would begin a new flowlet for each, on a hop drawn again).
        let after = run_at(&mut new, 1_050 * US, &frames, (0, 1), 4);
        let moved = before
            .iter()
            .zip(&after)
            .filter(|(b, a)| b.0 != a.0)
            .count();
        assert_eq!(moved, 0);
        assert_eq!(new.flowlets, old.flowlets, "no flowlet begun again");
        let mut other_hops = flowlet("gap_us = 100\nnext_hops = [\"a\", \"b\"]");
        let carried = Program::inherit(&mut other_hops, old, 1_000 * US);
        assert!(carried[0].lost());
    }

    #[test]
    fn a_flowlet_stays_on_one_hop_and_a_gap_lets_it_move() {
        let mut p = flowlet("gap_us = 100");
        // 200 flows; each sends 20 packets 10 us apart (one flowlet), pauses 1 ms, and
        // sends 20 more (a second flowlet).
        let mut hops: Vec<Vec<Verdict>> = vec![Vec::new(); 200];
        for (start, _) in [(1_000 * US, 0), (3_000 * US, 1)] {
            for k in 0..20u64 {
                let frames: Vec<_> = (0..200).map(packet).collect();
                for (f, (v, _)) in run_at(&mut p, start + k * 10 * US, &frames, (0, 1), 4)
                    .into_iter()
                    .enumerate()
                {
                    hops[f].push(v);
                }
            }
        }
        let mut moved = 0;
        let mut used = std::collections::BTreeMap::new();
        for h in &hops {
            assert!(h[..20].iter().all(|v| *v == h[0]), "one hop per flowlet");
            assert!(h[20..].iter().all(|v| *v == h[20]), "one hop per flowlet");
            moved += usize::from(h[0] != h[20]);
            *used.entry(format!("{:?}", h[0])).or_insert(0) += 1;
        }
        // With three hops drawn at random, about two thirds of second flowlets move.
        assert!((90..=175).contains(&moved), "{moved} of 200 moved");
        assert_eq!(used.len(), 3, "every next hop is used: {used:?}");
        assert!(used.values().all(|&n| n > 40), "{used:?}");
        assert_eq!(p.flowlets, 400);
        // From a next hop, back to the ingress.
        let back = (ip_frame("198.19.0.1", "198.18.0.1", tcp(80, 1000, 0x10)), 2);
        assert_eq!(
            run_at(&mut p, 9_000 * US, &[back], (0, 1), 4)[0].0,
            Verdict::Forward(0)
        );
    }

    #[test]
    fn bad_settings_name_the_field() {
        let names = PortNames(vec!["in".into(), "a".into()]);
        let err = |text: &str| {
            let cfg: FlowletConfig = toml::from_str(text).unwrap();
            Flowlet::new(&cfg, &names, "program.flowlet", 1)
                .err()
                .map(|e| e.field)
        };
        assert_eq!(
            err("slots = 1000").as_deref(),
            Some("program.flowlet.slots")
        );
        assert_eq!(err("gap_us = 0").as_deref(), Some("program.flowlet.gap_us"));
        assert_eq!(
            err("next_hops = [\"in\"]").as_deref(),
            Some("program.flowlet.next_hops")
        );
        assert_eq!(
            err("next_hops = [\"z\"]").as_deref(),
            Some("program.flowlet.next_hops")
        );
        let lonely = PortNames(vec!["in".into()]);
        let cfg: FlowletConfig = toml::from_str("").unwrap();
        let e = Flowlet::new(&cfg, &lonely, "program.flowlet", 1)
            .err()
            .unwrap();
        assert_eq!(e.field, "program.flowlet.next_hops");
    }
}
