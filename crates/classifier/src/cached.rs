//! A rule pipeline with a microflow cache in front of it that is never stale: FlowShadow's
//! three schemes (`action`, `cookie`, `strong`; see [`Consistency`]), each made correct for
//! every kind of update.
//!
//! A cache entry holds a microflow's full key and a reference into the **Action Table**:
//! the deduplicated outcomes of walks through the tables (actions, and the rule matched in
//! each table, so rule counters stay exact on hits). Each Action Table entry knows the rules
//! that produced it, and each rule the entries it contributes to. Entries carry a stamp;
//! a change invalidates the Action Table entries it can affect and gives them a newer
//! stamp, and a cached microflow whose entry is invalid or newer than itself is dropped
//! and resolved again by the tables.
//!
//! The other modes follow the same sources differently: `cookie` stamps each rule (and
//! table miss) and checks the stamps of an entry's sources on every hit; `strong` lists the
//! microflows cached through each source and removes them from the cache at the change.
//!
//! What a change can affect:
//! * modifying or deleting a rule (a timeout too): the entries it contributed to;
//! * inserting a rule R in table t: the entries of every lower-priority rule of t whose
//!   pattern overlaps R's (R may now win for their microflows; at equal priority the older
//!   rule keeps winning), and the entries of walks that *missed* table t (each table's miss
//!   counts as a rule of its own, below all others);
//! * replacing the rule set: everything.
//!
//! The guarantee: once a change has returned, no packet classified afterwards gets an
//! outcome the new rule set would not give. (The caller applies changes between bursts.)

use crate::cache::MicroflowCache;
use crate::fields::Fields;
use crate::pipeline::{Outcome, RuleError, RuleId, RuleSet};
use crate::rule::Rule;
use std::collections::HashMap;

/// How the cache is kept consistent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consistency {
    /// No cache: every packet walks the tables (the reference).
    Off,
    /// Action Table entries with valid bits and stamps (see the module documentation).
    Action,
    /// Every rule (and table miss) has a stamp; a hit checks those of its entry's sources.
    Cookie,
    /// Each rule (and table miss) lists the microflows cached through it; a change removes
    /// them from the cache at once, and hits check nothing.
    Strong,
}

/// What contributes to an outcome: a rule, or a table's miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Rule(RuleId),
    Miss(u8),
}

struct ActionEntry {
    outcome: Outcome,
    valid: bool,
    stamp: u64,
    sources: Vec<Source>,
}

/// A pipeline and its cache, for one worker.
pub struct CachedPipeline {
    rules: RuleSet,
    mode: Consistency,
    cache: MicroflowCache<(u32, u64)>,
    actions: Vec<ActionEntry>,
    by_outcome: HashMap<Outcome, u32>,
    by_source: HashMap<Source, Vec<u32>>,
    /// `Cookie`: when each source last changed.
    source_stamps: HashMap<Source, u64>,
    /// `Strong`: the microflows cached through each source (some since evicted).
    source_flows: HashMap<Source, Vec<(u64, Fields)>>,
    clock: u64,
    /// Per rule, by `RuleId`: its counters and times.
    counters: Vec<RuleCounters>,
    /// The latest time seen (packets, expiry), for rules added now.
    now_ns: u64,
    /// `Off`: the last outcome, so that `classify` can hand out a reference either way.
    uncached: Outcome,
}

#[derive(Debug, Clone, Copy, Default)]
struct RuleCounters {
    packets: u64,
    bytes: u64,
    added_ns: u64,
    last_hit_ns: u64,
}

impl CachedPipeline {
    pub fn new(
        rules: RuleSet,
        mode: Consistency,
        entries: usize,
        ways: usize,
        seed: u64,
    ) -> Result<Self, crate::cache::CacheSizeError> {
        Ok(CachedPipeline {
            rules,
            mode,
            cache: MicroflowCache::new(entries, ways, seed)?,
            actions: Vec::new(),
            by_outcome: HashMap::new(),
            by_source: HashMap::new(),
            source_stamps: HashMap::new(),
            source_flows: HashMap::new(),
            clock: 1,
            counters: Vec::new(),
            now_ns: 0,
            uncached: Outcome::default(),
        })
    }

    pub fn rules(&self) -> &RuleSet {
        &self.rules
    }

    pub fn cache_stats(&self) -> crate::cache::CacheStats {
        self.cache.stats
    }

    /// The packets and bytes a rule has matched.
    pub fn counters(&self, id: RuleId) -> (u64, u64) {
        let c = self
            .counters
            .get(id.0 as usize)
            .copied()
            .unwrap_or_default();
        (c.packets, c.bytes)
    }

    /// Removes the rules whose idle or hard timeout has run out by `now_ns`, as deletes;
    /// their handles. (A rule's idle time counts from its last hit, or from when it was
    /// added.)
    pub fn expire(&mut self, now_ns: u64) -> Vec<RuleId> {
        self.now_ns = self.now_ns.max(now_ns);
        let now = self.now_ns;
        let expired: Vec<RuleId> = self
            .rules
            .rules()
            .filter(|(id, r)| {
                let c = self
                    .counters
                    .get(id.0 as usize)
                    .copied()
                    .unwrap_or_default();
                let idle_since = c.last_hit_ns.max(c.added_ns);
                let s = 1_000_000_000u64;
                (r.hard_timeout > 0 && now >= c.added_ns + u64::from(r.hard_timeout) * s)
                    || (r.idle_timeout > 0 && now >= idle_since + u64::from(r.idle_timeout) * s)
            })
            .map(|(id, _)| id)
            .collect();
        for &id in &expired {
            self.remove(id);
        }
        expired
    }

    /// Classifies one packet of `bytes` bytes arriving at `now_ns`, counting it on the
    /// rules it matched. A cache hit allocates nothing: the outcome is the Action Table's.
    pub fn classify(&mut self, fields: &Fields, bytes: u32, now_ns: u64) -> &Outcome {
        self.now_ns = self.now_ns.max(now_ns);
        let outcome = match self.mode {
            Consistency::Off => {
                self.uncached = self.rules.classify(fields);
                &self.uncached
            }
            Consistency::Action | Consistency::Cookie | Consistency::Strong => {
                let at = self.cached(fields);
                &self.actions[at as usize].outcome
            }
        };
        for r in &outcome.rules {
            let i = r.0 as usize;
            if self.counters.len() <= i {
                self.counters.resize(i + 1, RuleCounters::default());
            }
            let c = &mut self.counters[i];
            c.packets += 1;
            c.bytes += u64::from(bytes);
            c.last_hit_ns = self.now_ns;
        }
        outcome
    }

    /// The Action Table entry of `fields`: the cached one if it is fresh, else the tables'.
    fn cached(&mut self, fields: &Fields) -> u32 {
        let hash = self.cache.hash(fields);
        if let Some((at, stamp)) = self.cache.lookup(hash, fields) {
            let a = &self.actions[at as usize];
            let fresh = match self.mode {
                Consistency::Cookie => a.sources.iter().all(|s| {
                    self.source_stamps
                        .get(s)
                        .is_none_or(|&changed| changed <= stamp)
                }),
                Consistency::Strong => true,
                _ => a.valid && a.stamp <= stamp,
            };
            if fresh {
                return at;
            }
            self.cache.remove(hash, fields);
        }
        let outcome = self.rules.classify(fields);
        let at = self.action_entry(&outcome);
        self.cache.insert(hash, fields, (at, self.clock));
        if self.mode == Consistency::Strong {
            self.track(at, hash, fields);
        }
        at
    }

    /// The Action Table entry of `outcome`, made (or made valid again) if need be.
    fn action_entry(&mut self, outcome: &Outcome) -> u32 {
        if let Some(&at) = self.by_outcome.get(outcome) {
            let a = &mut self.actions[at as usize];
            if !a.valid {
                a.valid = true;
                a.stamp = self.clock;
            }
            return at;
        }
        let at = self.actions.len() as u32;
        // The tables the walk missed in (visited, no rule matched) are sources too.
        let sources: Vec<Source> = (outcome.rules.iter().map(|&r| Source::Rule(r)))
            .chain(outcome.missed.iter().map(|&t| Source::Miss(t)))
            .collect();
        for s in &sources {
            self.by_source.entry(*s).or_default().push(at);
        }
        self.actions.push(ActionEntry {
            outcome: outcome.clone(),
            valid: true,
            stamp: self.clock,
            sources,
        });
        self.by_outcome.insert(outcome.clone(), at);
        at
    }

    /// `Strong`: notes a cached microflow under each of its entry's sources (a list that
    /// outgrows the cache is trimmed to the microflows still cached).
    fn track(&mut self, at: u32, hash: u64, fields: &Fields) {
        let limit = 2 * self.cache.capacity();
        for s in &self.actions[at as usize].sources {
            let list = self.source_flows.entry(*s).or_default();
            list.push((hash, *fields));
            if list.len() > limit {
                list.retain(|(h, f)| self.cache.contains(*h, f));
            }
        }
    }

    /// Invalidates what `source` contributes to, as the mode keeps track.
    fn invalidate(&mut self, source: Source) {
        self.clock += 1;
        self.source_stamps.insert(source, self.clock);
        for (h, f) in self.source_flows.remove(&source).unwrap_or_default() {
            self.cache.remove(h, &f);
        }
        if let Some(list) = self.by_source.get(&source) {
            for &at in list {
                let a = &mut self.actions[at as usize];
                a.valid = false;
                a.stamp = self.clock;
            }
        }
    }

    /// Adds a rule; its handle. Cached microflows it may now catch are resolved again.
    pub fn insert(&mut self, rule: Rule) -> Result<RuleId, RuleError> {
        let table = rule.table;
        let shadowed = self.rules.overlapping_below(&rule);
        let id = self.rules.insert(rule)?;
        let i = id.0 as usize;
        if self.counters.len() <= i {
            self.counters.resize(i + 1, RuleCounters::default());
        }
        self.counters[i].added_ns = self.now_ns;
        for s in shadowed {
            self.invalidate(Source::Rule(s));
        }
        self.invalidate(Source::Miss(table));
        Ok(id)
    }

    /// Replaces a rule's actions and goto (an OpenFlow modify); whether it was there.
    pub fn modify(
        &mut self,
        id: RuleId,
        actions: Vec<crate::rule::Action>,
        goto: Option<u8>,
    ) -> Result<bool, RuleError> {
        let changed = self.rules.modify(id, actions, goto)?;
        if changed {
            self.invalidate(Source::Rule(id));
        }
        Ok(changed)
    }

    /// Removes a rule (a delete or a timeout); whether it was there.
    pub fn remove(&mut self, id: RuleId) -> bool {
        let was = self.rules.remove(id);
        if was {
            self.invalidate(Source::Rule(id));
        }
        was
    }

    /// Replaces every rule: the cache starts empty.
    pub fn replace(&mut self, rules: RuleSet) {
        self.rules = rules;
        self.cache.clear();
        self.actions.clear();
        self.by_outcome.clear();
        self.by_source.clear();
        self.source_stamps.clear();
        self.source_flows.clear();
        self.clock += 1;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fields::mapped;
    use crate::pipeline::Miss;
    use crate::rule::{Action, Pattern, SetField};

    /// A small generator (xorshift) so a failing seed can be replayed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn pick<T: Copy>(&mut self, items: &[T]) -> T {
            items[self.below(items.len() as u64) as usize]
        }
    }

    const TABLES: u8 = 3;
    /// Field values packets and rules draw from, so that rules overlap and packets fall on
    /// their boundaries.
    const HOSTS: [u32; 6] = [
        0xc613_0001,
        0xc613_0002,
        0xc613_0101,
        0xc613_0102,
        0xc612_0001,
        0xc613_ff01,
    ];
    const PORTS: [u16; 5] = [22, 80, 443, 1024, 8080];

    fn packet(rng: &mut Rng) -> Fields {
        Fields {
            in_port: rng.below(3) as u16,
            eth_type: 0x0800,
            ip_src: mapped(rng.pick(&HOSTS)),
            ip_dst: mapped(rng.pick(&HOSTS)),
            ip_proto: rng.pick(&[6u8, 17]),
            tp_src: rng.pick(&PORTS),
            tp_dst: rng.pick(&PORTS),
            ..Fields::default()
        }
    }

    fn rule(rng: &mut Rng) -> Rule {
        let table = rng.below(u64::from(TABLES)) as u8;
        let mut p = Pattern::ANY;
        if rng.below(2) == 0 {
            let len = rng.pick(&[16u32, 24, 32]);
            p.mask.ip_dst = u128::MAX << (32 - len);
            p.value.ip_dst = mapped(rng.pick(&HOSTS));
        }
        if rng.below(3) == 0 {
            p.mask.ip_proto = 0xff;
            p.value.ip_proto = rng.pick(&[6u8, 17]);
        }
        if rng.below(3) == 0 {
            let (a, b) = (rng.pick(&PORTS), rng.pick(&PORTS));
            p.tp_dst = (a.min(b), a.max(b));
        }
        if rng.below(4) == 0 {
            p.mask.in_port = u16::MAX;
            p.value.in_port = rng.below(3) as u16;
        }
        Rule {
            table,
            priority: rng.pick(&[1u16, 5, 5, 9]),
            cookie: rng.next(),
            pattern: p.normalized(),
            actions: actions(rng),
            goto: (table + 1 < TABLES && rng.below(2) == 0)
                .then(|| table + 1 + rng.below(u64::from(TABLES - table - 1)) as u8),
            idle_timeout: rng.pick(&[0u32, 0, 0, 2, 5]),
            hard_timeout: rng.pick(&[0u32, 0, 0, 0, 8]),
        }
    }

    const SECOND: u64 = 1_000_000_000;

    fn actions(rng: &mut Rng) -> Vec<Action> {
        (0..rng.below(3))
            .map(|_| match rng.below(4) {
                0 => Action::Set(SetField::IpDst(mapped(rng.pick(&HOSTS)))),
                1 => Action::Set(SetField::TpDst(rng.pick(&PORTS))),
                _ => Action::Output(rng.below(4) as u16),
            })
            .collect()
    }

    /// The differential tester: the same random updates applied to a cached pipeline and to
    /// the uncached reference, with packets in between; every packet's outcome, and every
    /// rule's counters at the end, must be the same (and the tables' tuple search must
    /// agree with their linear scan). Returns how many rules timed out.
    fn differential(seed: u64, steps: usize, ways: usize, mode: Consistency) -> usize {
        let mut rng = Rng(seed | 1);
        let mut base = RuleSet::new(usize::from(TABLES));
        base.set_miss(0, Miss::Continue).unwrap();
        let mut off = CachedPipeline::new(base.clone(), Consistency::Off, 16, 1, seed).unwrap();
        let mut on = CachedPipeline::new(base, mode, 64, ways, seed).unwrap();
        let mut ids: Vec<RuleId> = Vec::new();
        let mut now = 0u64;
        let mut expired = 0;
        for step in 0..steps {
            match rng.below(100) {
                0..=4 => {
                    let r = rule(&mut rng);
                    // The index finds exactly the lower-ranked overlapping rules.
                    let mut found = off.rules().overlapping_below(&r);
                    found.sort();
                    let brute: Vec<RuleId> = (off.rules().rules())
                        .filter(|(_, o)| {
                            o.table == r.table
                                && o.priority < r.priority
                                && o.pattern.overlaps(&r.pattern)
                        })
                        .map(|(id, _)| id)
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    assert_eq!(found, brute, "seed {seed}, step {step}: overlaps");
                    let a = off.insert(r.clone());
                    let b = on.insert(r);
                    assert_eq!(a, b);
                    if let Ok(id) = a {
                        ids.push(id);
                    }
                }
                5..=6 if !ids.is_empty() => {
                    let id = ids.swap_remove(rng.below(ids.len() as u64) as usize);
                    assert_eq!(off.remove(id), on.remove(id));
                }
                7..=8 if !ids.is_empty() => {
                    let id = rng.pick(&ids);
                    let (acts, table) = (actions(&mut rng), off.rules().get(id).unwrap().table);
                    let goto = (table + 1 < TABLES && rng.below(2) == 0).then_some(TABLES - 1);
                    assert_eq!(
                        off.modify(id, acts.clone(), goto),
                        on.modify(id, acts, goto)
                    );
                }
                9 if rng.below(20) == 0 => {
                    let rules = off.rules().clone();
                    on.replace(rules);
                }
                10..=11 => {
                    // Time passes; rules time out the same on both.
                    now += rng.below(3) * SECOND;
                    let (a, b) = (off.expire(now), on.expire(now));
                    assert_eq!(a, b, "seed {seed}, step {step}: the same rules expire");
                    ids.retain(|id| !a.contains(id));
                    expired += a.len();
                }
                _ => {
                    let p = packet(&mut rng);
                    let reference = off.rules().classify_linear(&p);
                    let a = off.classify(&p, 60, now).clone();
                    assert_eq!(
                        a, reference,
                        "tuple search, seed {seed}, step {step}, {p:?}"
                    );
                    let b = on.classify(&p, 60, now);
                    assert_eq!(&a, b, "{mode:?}, seed {seed}, step {step}, packet {p:?}");
                }
            }
        }
        for (id, _) in off.rules().rules() {
            assert_eq!(
                off.counters(id),
                on.counters(id),
                "seed {seed}: counters of {id:?}"
            );
        }
        assert!(on.cache_stats().hits > 0, "seed {seed}: the cache was used");
        expired
    }

    #[test]
    fn the_cache_agrees_with_the_tables_under_every_kind_of_update() {
        // 40 seeds of 20,000 steps per mode in release builds (the test script's); a quarter
        // of that in debug builds, which run it ten times slower.
        let seeds = if cfg!(debug_assertions) { 10 } else { 40 };
        for mode in [
            Consistency::Action,
            Consistency::Cookie,
            Consistency::Strong,
        ] {
            let mut expired = 0;
            for seed in 0..seeds {
                let ways = [1, 2, 4][(seed % 3) as usize];
                expired += differential(seed * 7919 + 3, 20_000, ways, mode);
            }
            assert!(
                expired > 25,
                "{mode:?}: rules timed out along the way ({expired})"
            );
        }
    }

    /// The case the paper's schemes miss: a new, higher-priority rule over a microflow
    /// already cached.
    #[test]
    fn an_inserted_higher_priority_rule_takes_over_cached_microflows() {
        let mut p = CachedPipeline::new(RuleSet::new(1), Consistency::Action, 64, 2, 1).unwrap();
        let low = crate::text::parse_rule("priority=1,ip,actions=output:1").unwrap();
        p.insert(low).unwrap();
        let f = Fields {
            eth_type: 0x0800,
            ip_dst: mapped(0xc613_0505),
            ..Fields::default()
        };
        assert_eq!(p.classify(&f, 60, 0).actions, [Action::Output(1)]);
        assert_eq!(p.classify(&f, 60, 0).actions, [Action::Output(1)]);
        assert_eq!(p.cache_stats().hits, 1);
        let high =
            crate::text::parse_rule("priority=9,ip,nw_dst=198.19.5.0/24,actions=output:2").unwrap();
        p.insert(high).unwrap();
        assert_eq!(p.classify(&f, 60, 0).actions, [Action::Output(2)]);
        // A rule that cannot overlap leaves the cached microflow alone.
        let hits = p.cache_stats().hits;
        let other = crate::text::parse_rule("priority=9,ipv6,actions=output:3").unwrap();
        p.insert(other).unwrap();
        p.classify(&f, 60, 0);
        assert_eq!(p.cache_stats().hits, hits + 1);
    }
}
