//! `l2learn`: an Ethernet learning switch, learning in the data plane by add-on-miss.
//!
//! Every frame teaches the switch where its source lives: a source MAC the table misses is
//! added on the spot (PNA add-on-miss) with the port it came in on; a known source's entry
//! has its ageing timer restarted, and its port updated in place if the station moved. The
//! destination is then looked up: a known one on another port is forwarded there, one on
//! the ingress port is dropped (`same_port`), and unknown, broadcast and multicast
//! destinations are flooded to every other port. Stations not heard from for `ageing`
//! seconds are forgotten (AUTO_DELETE).
//!
//! State: one table per worker from (VLAN, MAC) to port, written by the data plane
//! (write-centric). With several workers each worker learns from the frames of the flows
//! it owns; a destination another worker learned is flooded until this one sees it too.
//! Configuration: `capacity` (stations per worker, default 65536), `ageing` (seconds,
//! default 300, as IEEE 802.1D recommends), `digests` (default false: when true, each
//! station learned is also sent to the control plane as a digest), `learn_rate` and
//! `learn_burst` (new stations a second each port may teach, default 0: no limit; a
//! bucket of `learn_burst` stations, default `learn_rate`): a port flooding random source
//! MACs (a MAC flooding attack) then fills the table no faster than its rate, and the other
//! ports' stations are still learned. Counters: drops `same_port`; stations not learned
//! (their frames still flood) are counted by the table, `ctl stats stations`:
//! `adds_refused_full` and `adds_refused_rate`, as every table's are.

use crate::l2::StationCodec;
use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, DropReason, PortId, Program, Verdict};
use stateplane_state::{DeclaredTable, ExpireMode, ExpireProfile, InsertLimit};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct L2LearnConfig {
    #[serde(default = "default_capacity")]
    pub capacity: usize,
    #[serde(default = "default_ageing")]
    pub ageing: f64,
    /// Send a digest of each station learned to the control plane (`ctl watch`).
    #[serde(default)]
    pub digests: bool,
    /// New stations a second each port may teach (0: no limit).
    #[serde(default)]
    pub learn_rate: u64,
    /// How many new stations a port may teach at once (default: `learn_rate`).
    pub learn_burst: Option<u64>,
}

fn default_capacity() -> usize {
    65_536
}

fn default_ageing() -> f64 {
    300.0
}

const SAME_PORT: DropReason = DropReason::program(0);

#[derive(Clone)]
pub struct L2Learn {
    table: DeclaredTable<StationCodec>,
    digests: bool,
}

/// A station's key: the same (VLAN, MAC) key as `l2`'s static table.
fn station(vlan: u16, mac: &[u8]) -> u64 {
    let mut m = [0u8; 6];
    m.copy_from_slice(&mac[..6]);
    crate::l2::table_key(vlan, m)
}

impl L2Learn {
    pub fn new(
        cfg: &L2LearnConfig,
        ports: &PortNames,
        field: &str,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        if cfg.capacity == 0 || cfg.capacity > 1 << 24 {
            return Err(ConfigError::new(
                format!("{field}.capacity"),
                "give 1 to 16777216 stations per worker",
            ));
        }
        if !(1.0..=1e6).contains(&cfg.ageing) {
            return Err(ConfigError::new(
                format!("{field}.ageing"),
                format!("{} is outside 1 to 1000000 seconds", cfg.ageing),
            ));
        }
        let ageing = ExpireProfile {
            timeout_ns: (cfg.ageing * 1e9) as u64,
            mode: ExpireMode::AutoDelete,
        };
        let mut table =
            crate::budgeted_table(&format!("{field}.capacity"), cfg.capacity, &[ageing], seed)?;
        match (cfg.learn_rate, cfg.learn_burst) {
            (0, Some(_)) => {
                return Err(ConfigError::new(
                    format!("{field}.learn_burst"),
                    "a burst needs a rate: give learn_rate too (new stations a second per port)",
                ));
            }
            (0, None) => {}
            (per_second, burst) => {
                let burst = burst.unwrap_or(per_second);
                for (key, value) in [("learn_rate", per_second), ("learn_burst", burst)] {
                    if !(1..=1 << 32).contains(&value) {
                        return Err(ConfigError::new(
                            format!("{field}.{key}"),
                            format!("{value} is outside 1 to 4294967296 stations"),
                        ));
                    }
                }
                table.set_insert_limit(Some(InsertLimit { per_second, burst }));
            }
        }
        Ok(L2Learn {
            table: DeclaredTable::new(
                table,
                StationCodec::declaration("stations", cfg.capacity, false, ports.0.len()),
            ),
            digests: cfg.digests,
        })
    }

    /// The port station `mac` on `vlan` was learned on.
    pub fn port_of(&self, vlan: u16, mac: [u8; 6]) -> Option<PortId> {
        self.table.get(&station(vlan, &mac)).copied()
    }

    pub fn stations(&self) -> usize {
        self.table.len()
    }

    /// Looks at `budget` slots for stations not heard from within the ageing time.
    fn age(&mut self, now: u64, budget: usize) {
        self.table.expire(now, budget, |_, _| {});
    }
}

impl Program for L2Learn {
    type Prepared = ();

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        let now = ctx.now_ns;
        for p in burst.iter_mut() {
            let d = p.desc;
            let vlan = d.parsed.key.vlan;
            let (dst, src) = (&p.data[..6], &p.data[6..12]);
            // Learn the source (a multicast source is bogus and never learned).
            if src[0] & 1 == 0 {
                let key = station(vlan, src);
                match self.table.lookup(&key, now) {
                    Some(id) => {
                        *self.table.value_mut(id) = d.in_port;
                        self.table.restart_timer(id, now);
                    }
                    // A station not learned (table full, or its port over its rate) is
                    // counted by the table by reason; its frames still flood.
                    None => {
                        let added = self.table.add_entry_from(d.in_port, key, d.in_port, 0, now);
                        if added.is_ok() && self.digests {
                            self.table.digest(&key, &d.in_port, now);
                        }
                    }
                }
            }
            let known = if dst[0] & 1 == 0 {
                self.table
                    .lookup(&station(vlan, dst), now)
                    .map(|id| *self.table.value(id))
            } else {
                None
            };
            d.verdict = match known {
                Some(port) if port == d.in_port => Verdict::Drop(SAME_PORT),
                Some(port) => Verdict::Forward(port),
                None => Verdict::Flood,
            };
        }
        self.age(now, 16 + 2 * burst.len());
    }

    /// Idle live ports still age stations out: the sweep goes on between bursts.
    fn poll(&mut self, _out: &mut Burst, ctx: &mut Context) {
        self.age(ctx.now_ns, crate::IDLE_SWEEP);
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &["same_port"]
    }

    crate::answer_by_table!(table);

    crate::synced_tables::synced_table_methods!(table);

    crate::inherit_table!(table);
}

#[cfg(test)]
mod tests_support {
    use super::*;
    use stateplane_state::{Reply, Request};
    use stateplane_wire::FlowHasher;

    pub const S: u64 = 1_000_000_000;

    pub fn learner(config: &str) -> L2Learn {
        let cfg: L2LearnConfig = toml::from_str(config).unwrap();
        L2Learn::new(&cfg, &PortNames(vec![]), "program.l2learn", 5).unwrap()
    }

    pub fn switch(ageing: f64) -> L2Learn {
        // A small table, so that a few bursts sweep all of it.
        learner(&format!("ageing = {ageing}\ncapacity = 64"))
    }

    pub fn mac(n: u8) -> [u8; 6] {
        [2, 0, 0, 0, 0, n]
    }

    /// One frame from station `src` on `port` to `dst` at time `t`; its verdict.
    pub fn send(sw: &mut L2Learn, t: u64, port: PortId, src: [u8; 6], dst: [u8; 6]) -> Verdict {
        let mut f = dst.to_vec();
        f.extend_from_slice(&src);
        f.extend_from_slice(&[0x88, 0xb5]);
        f.resize(60, 0);
        let mut b = Burst::with_capacity(2);
        b.push(&f, 60, t, port, 0);
        b.now_ns = t;
        b.parse(&FlowHasher::with_seed(1));
        let mut ctx = crate::testutil::ctx(t, 4);
        sw.process(&mut b, &mut ctx);
        b.descs()[0].verdict
    }

    /// The stations table's counters, as `ctl stats stations` reads them.
    pub fn counters(sw: &mut L2Learn) -> std::collections::HashMap<&'static str, u64> {
        let stats = Request::Stats {
            table: "stations".into(),
        };
        match sw.control(&stats, None, &crate::testutil::ctx(0, 4)) {
            Ok(Reply::Counters(cs)) => cs.into_iter().collect(),
            other => panic!("{other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::*;
    use super::*;

    #[test]
    fn learns_from_sources_floods_the_unknown_and_follows_a_moved_station() {
        let mut sw = switch(300.0);
        // A to B: B is unknown, so flood; A is learned on port 0 by add-on-miss.
        assert_eq!(send(&mut sw, S, 0, mac(1), mac(2)), Verdict::Flood);
        assert_eq!(sw.port_of(0, mac(1)), Some(0));
        // B answers from port 2: A is known, so it goes straight to port 0.
        assert_eq!(send(&mut sw, S, 2, mac(2), mac(1)), Verdict::Forward(0));
        assert_eq!(send(&mut sw, S, 0, mac(1), mac(2)), Verdict::Forward(2));
        // Broadcasts always flood; a frame back to its own port is dropped.
        assert_eq!(send(&mut sw, S, 0, mac(1), [0xff; 6]), Verdict::Flood);
        assert_eq!(
            send(&mut sw, S, 2, mac(3), mac(2)),
            Verdict::Drop(SAME_PORT)
        );
        // B moves to port 3: the next frame from it updates its entry in place.
        send(&mut sw, 2 * S, 3, mac(2), mac(1));
        assert_eq!(send(&mut sw, 2 * S, 0, mac(1), mac(2)), Verdict::Forward(3));
        assert_eq!(sw.stations(), 3);
    }

    /// Synced, the stations a switch learned move into another (another hash seed) with
    /// their ports: it sends straight to a station it never heard from.
    #[test]
    fn learned_stations_move_to_another_switch_through_their_synced_words() {
        let mut a = switch(300.0);
        // A slot: action, VLAN, MAC, port.
        assert_eq!(
            a.track("stations", 0),
            Some(a.table.slot_count() as u32 * 4)
        );
        send(&mut a, S, 0, mac(1), [0xff; 6]);
        send(&mut a, S, 2, mac(2), [0xff; 6]);
        send(&mut a, S, 1, mac(1), [0xff; 6]); // moved to port 1
        let mut changes = Vec::new();
        assert!(a.changes(&mut changes, usize::MAX));
        let mut words = std::collections::BTreeMap::new();
        for c in &changes {
            words.insert(c.index, c.new);
            assert!(c.exact, "a station's words are all exact: {c:?}");
        }
        let cfg: L2LearnConfig = toml::from_str("ageing = 300.0\ncapacity = 64").unwrap();
        let mut b = L2Learn::new(&cfg, &PortNames(vec![]), "program.l2learn", 77).unwrap();
        b.track("stations", 0);
        // The copy's slots whole (a word never changed is the 0 every word starts at).
        for (&index, _) in words.iter().filter(|&(i, &v)| i % 4 == 0 && v != 0) {
            for w in index..index + 4 {
                b.write_synced(0, w, words.get(&w).copied().unwrap_or(0))
                    .unwrap();
            }
        }
        assert_eq!(b.commit_synced_write(), 0);
        assert_eq!(send(&mut b, S, 2, mac(9), mac(1)), Verdict::Forward(1));
        assert_eq!(send(&mut b, S, 0, mac(9), mac(2)), Verdict::Forward(2));
    }

    #[test]
    fn silent_stations_age_out_and_talking_ones_stay() {
        let mut sw = switch(10.0);
        send(&mut sw, S, 0, mac(1), [0xff; 6]);
        send(&mut sw, S, 1, mac(2), [0xff; 6]);
        // Station 2 keeps talking every 4 s; station 1 goes silent.
        for i in 1..=5 {
            send(&mut sw, S + i * 4 * S, 1, mac(2), [0xff; 6]);
        }
        for _ in 0..20 {
            send(&mut sw, 21 * S + S / 2, 1, mac(2), [0xff; 6]);
        }
        assert_eq!(
            sw.port_of(0, mac(1)),
            None,
            "aged out after 10 s of silence"
        );
        assert_eq!(sw.port_of(0, mac(2)), Some(1));
        assert_eq!(send(&mut sw, 22 * S, 1, mac(2), mac(1)), Verdict::Flood);
    }
}

#[cfg(test)]
mod limits {
    use super::tests_support::*;
    use super::*;

    /// A port flooding random source MACs: with `learn_rate`, it teaches no more than its
    /// bucket and rate, the table keeps room, and another port's station is learned; each
    /// refusal is counted by reason in the table's stats, as a full table's are.
    #[test]
    fn a_mac_flood_on_one_port_learns_at_its_rate_and_others_still_learn() {
        let mut sw = learner("capacity = 64\nlearn_rate = 10\nlearn_burst = 20");
        for n in 0..1_000u32 {
            let src = [2, 0, 0, (n >> 16) as u8, (n >> 8) as u8, n as u8];
            // 1,000 stations in a second, from port 1.
            send(&mut sw, S + u64::from(n) * 1_000_000, 1, src, [0xff; 6]);
        }
        assert_eq!(
            sw.stations(),
            29,
            "the burst of 20, then one each 100 ms of the 0.999 s"
        );
        assert_eq!(
            send(&mut sw, 2 * S, 0, [2, 9, 9, 9, 9, 9], [0xff; 6]),
            Verdict::Flood
        );
        assert_eq!(sw.port_of(0, [2, 9, 9, 9, 9, 9]), Some(0), "port 0 learns");
        let stats = counters(&mut sw);
        assert_eq!(stats["adds_refused_rate"], 971);
        assert_eq!(stats["adds_refused_full"], 0);
        // Without a limit, the flood fills the table: the next station is refused as full.
        let mut sw = learner("capacity = 64");
        for n in 0..1_000u32 {
            let src = [2, 0, 0, (n >> 16) as u8, (n >> 8) as u8, n as u8];
            send(&mut sw, S, 1, src, [0xff; 6]);
        }
        send(&mut sw, 2 * S, 0, [2, 9, 9, 9, 9, 9], [0xff; 6]);
        assert_eq!(sw.port_of(0, [2, 9, 9, 9, 9, 9]), None);
        assert_eq!(counters(&mut sw)["adds_refused_full"], 937);
        // A burst with no rate says what is missing.
        let cfg: L2LearnConfig = toml::from_str("learn_burst = 5").unwrap();
        let Err(err) = L2Learn::new(&cfg, &PortNames(vec![]), "program.l2learn", 5) else {
            panic!("a burst with no rate was taken");
        };
        assert!(
            err.to_string().contains("program.l2learn.learn_burst"),
            "{err}"
        );
    }
}
