//! A rule pipeline with a microflow cache in front of it that is never stale: FlowShadow's
//! three schemes (`action`, `cookie`, `strong`; see [`Consistency`]), each made correct for
//! every kind of update.
//!
//! A cache entry holds a microflow's key (see the key mask below) and a reference into the
//! **Action Table**: the deduplicated outcomes of walks through the tables (actions, and
//! the rule matched in each table, so rule counters stay exact on hits). Each Action Table
//! entry knows the rules that produced it, and each rule the entries it contributes to.
//! Entries carry a stamp; a change invalidates the Action Table entries it can affect and
//! gives them a newer stamp, and a cached microflow whose entry is invalid or newer than
//! itself is dropped and resolved again by the tables.
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
//! The cache's key is not the whole of a packet's fields but the fields under the *key
//! mask*: every bit some rule's match reads (a port whole, where a rule narrows its range).
//! Packets that agree under it take the same walk, because a rule's actions only set whole
//! fields to constants, so they keep agreeing table after table; one entry serves them all.
//! A TCP connection's packets with different flags are then one microflow unless a rule
//! matches flags. The mask grows as rules are inserted (a superset stays correct) and is
//! made again when the rule set is replaced. An entry cached before it grew keeps a key
//! whose new bits are 0, found only by packets that agree with the one that made it on the
//! old mask, so that they walked alike before the insert; if the insert changes that walk,
//! the rule it beats or the miss it fills is one of the entry's sources, and the entry is
//! invalidated like any other.
//!
//! The guarantee: once a change has returned, no packet classified afterwards gets an
//! outcome the new rule set would not give. (The caller applies changes between bursts.)

use crate::cache::MicroflowCache;
use crate::fields::Fields;
use crate::rule::Rule;
use crate::ruleset::{Fold, Outcome, RuleError, RuleId, RuleSet};
use std::collections::{HashMap, HashSet};

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

/// What a cache probe found: the Action Table entry and the stamp it was cached with.
#[derive(Debug, Clone, Copy, Default)]
pub struct Probe(Option<(u32, u64)>);

/// What contributes to an outcome: a rule, or a table's miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Rule(RuleId),
    Miss(u8),
}

#[derive(Clone)]
struct ActionEntry {
    path: Box<[u32]>,
    outcome: Outcome,
    /// The packets that took this outcome from the cache or its misses, not yet added to
    /// the counters of its rules (a hit counts here, in the entry's own cache line; a
    /// rule's counters are its own plus those of its entries, and an entry's are added to
    /// its rules' own when it is freed).
    packets: u64,
    bytes: u64,
    last_hit_ns: u64,
    /// Retired: stale for good, waiting to be freed.
    dying: bool,
    valid: bool,
    /// When the entry was made, or last made valid again. A cached microflow older than
    /// its entry is stale, in every mode: that is also what makes reusing a freed entry
    /// safe.
    stamp: u64,
    sources: Vec<Source>,
}

/// A pipeline and its cache, for one worker.
///
/// Memory stays bounded under any update rate: the Action Table entries, counters and
/// stamps of a removed rule are freed with it (its id is never seen again), and the slots
/// are reused.
#[derive(Clone)]
pub struct CachedPipeline {
    rules: RuleSet,
    mode: Consistency,
    cache: MicroflowCache<(u32, u64)>,
    /// The key mask (see the module documentation): at least every bit a rule's match reads.
    key_mask: Fields,
    actions: Vec<ActionEntry>,
    free_actions: Vec<u32>,
    /// Retired entries waiting to be freed (see `forget`).
    dying: Vec<u32>,
    /// Entries by the path of the walk that made them (see [`RuleSet::path`]).
    by_path: HashMap<Box<[u32]>, u32, Fold>,
    /// A miss's path, reused so that a miss whose outcome is known allocates nothing.
    path: Vec<u32>,
    /// The entries each source contributes to: sets, so that freeing an entry costs the
    /// same however many entries share a rule with it (a default rule is in most).
    by_source: HashMap<Source, HashSet<u32, Fold>, Fold>,
    /// `Cookie`: when each source last changed.
    source_stamps: HashMap<Source, u64, Fold>,
    /// `Strong`: the microflows cached through each source (some since evicted).
    source_flows: HashMap<Source, Vec<(u64, Fields)>, Fold>,
    clock: u64,
    /// Each rule's own counters and times (see `ActionEntry`), in a slot of its own.
    counters: Vec<RuleCounters>,
    slot_of: HashMap<RuleId, u32, Fold>,
    free_slots: Vec<u32>,
    /// The rules with an idle or hard timeout: the only ones `due` looks at.
    timed: HashSet<RuleId, Fold>,
    /// The latest time seen (packets, expiry), for rules added now.
    now_ns: u64,
    /// `Off`: the last outcome, so that `classify` can hand out a reference either way.
    uncached: Outcome,
}

#[derive(Debug, Clone, Copy, Default)]
struct RuleCounters {
    packets: u64,
    bytes: u64,
    /// When the rule was added; `None` if the pipeline had seen no time yet then (rules
    /// given at start, or added before the first packet), in which case its timers start
    /// the first time [`CachedPipeline::expire`] looks at it.
    added_ns: Option<u64>,
    last_hit_ns: u64,
}

const SECOND_NS: u64 = 1_000_000_000;

/// A rule's counters and times on one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleStat {
    pub packets: u64,
    pub bytes: u64,
    /// When it was added (or when its timers started, for a rule given before any time
    /// was seen).
    pub added_ns: u64,
    /// Its last hit on this worker; 0 for none.
    pub last_hit_ns: u64,
}

/// Which of a rule's timeouts ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    Idle,
    Hard,
}

/// Retired Action Table entries a change frees before it returns (the rest wait for
/// `maintain`).
const RETIRE_PER_CHANGE: usize = 16;

impl CachedPipeline {
    /// The bytes the cache of `entries` in sets of `ways` takes, or why it cannot be made.
    pub fn cache_bytes(entries: usize, ways: usize) -> Result<u64, crate::cache::CacheSizeError> {
        MicroflowCache::<(u32, u64)>::bytes_for(entries, ways)
    }

    /// A pipeline over `rules` (with whatever counters they had reset) and a cache of
    /// `entries` in sets of `ways`.
    pub fn new(
        rules: RuleSet,
        mode: Consistency,
        entries: usize,
        ways: usize,
        seed: u64,
    ) -> Result<Self, crate::cache::CacheSizeError> {
        let mut p = CachedPipeline {
            rules: RuleSet::new(1),
            mode,
            cache: MicroflowCache::new(entries, ways, seed)?,
            key_mask: Fields::default(),
            actions: Vec::new(),
            free_actions: Vec::new(),
            dying: Vec::new(),
            by_path: HashMap::default(),
            path: Vec::new(),
            by_source: HashMap::default(),
            source_stamps: HashMap::default(),
            source_flows: HashMap::default(),
            clock: 1,
            counters: Vec::new(),
            slot_of: HashMap::default(),
            free_slots: Vec::new(),
            timed: HashSet::default(),
            now_ns: 0,
            uncached: Outcome::default(),
        };
        p.replace(rules);
        Ok(p)
    }

    pub fn rules(&self) -> &RuleSet {
        &self.rules
    }

    pub fn mode(&self) -> Consistency {
        self.mode
    }

    pub fn cache_stats(&self) -> crate::cache::CacheStats {
        self.cache.stats
    }

    /// How many Action Table entries are in use.
    pub fn action_entries(&self) -> usize {
        self.actions.len() - self.free_actions.len() - self.dying.len()
    }

    /// The packets and bytes a rule has matched.
    pub fn counters(&self, id: RuleId) -> (u64, u64) {
        let c = self.rule_counters(id);
        (c.packets, c.bytes)
    }

    /// A rule's own counters plus those of its Action Table entries.
    fn rule_counters(&self, id: RuleId) -> RuleCounters {
        let mut c = (self.slot_of.get(&id))
            .and_then(|&s| self.counters.get(s as usize))
            .copied()
            .unwrap_or_default();
        for &at in self.by_source.get(&Source::Rule(id)).into_iter().flatten() {
            let a = &self.actions[at as usize];
            c.packets += a.packets;
            c.bytes += a.bytes;
            c.last_hit_ns = c.last_hit_ns.max(a.last_hit_ns);
        }
        c
    }

    /// Adds to a rule's own counters (a rule that replaces another and keeps its counts).
    pub fn add_counts(&mut self, id: RuleId, packets: u64, bytes: u64) {
        if let Some(&slot) = self.slot_of.get(&id) {
            let c = &mut self.counters[slot as usize];
            c.packets += packets;
            c.bytes += bytes;
        }
    }

    /// A rule's counters (with its Action Table entries') and times, as this worker has
    /// them; `None` for no such rule.
    pub fn stat(&self, id: RuleId) -> Option<RuleStat> {
        self.rules.get(id)?;
        let c = self.rule_counters(id);
        Some(RuleStat {
            packets: c.packets,
            bytes: c.bytes,
            added_ns: c.added_ns.unwrap_or(self.now_ns),
            last_hit_ns: c.last_hit_ns,
        })
    }

    /// The rules with an idle timeout, by insert sequence number ([`RuleSet::seq`]), and
    /// when this worker last saw a packet match each (0: never): what it shares with other
    /// workers, so that a rule idle here but busy elsewhere is not taken for idle.
    pub fn idle_timed_hits(&self) -> Vec<(u64, u64)> {
        (self.timed.iter())
            .filter(|&&id| self.rules.get(id).is_some_and(|r| r.idle_timeout > 0))
            .filter_map(|&id| Some((self.rules.seq(id)?, self.rule_counters(id).last_hit_ns)))
            .collect()
    }

    /// The rules whose timeout has run out by `now_ns`, with their insert sequence numbers,
    /// oldest first, without removing them. A hard timeout counts from when the rule was
    /// added; an idle timeout from the latest of when it was added, its last hit here and
    /// `elsewhere(seq)` (its last hit on other workers), and runs `grace_ns` longer (for
    /// hits elsewhere not yet shared). Only rules with a timeout are looked at; a rule
    /// whose timers have not started (added before the pipeline saw any time) starts them
    /// now.
    pub fn due(
        &mut self,
        now_ns: u64,
        elsewhere: impl Fn(u64) -> u64,
        grace_ns: u64,
    ) -> Vec<(RuleId, u64, Timeout)> {
        self.now_ns = self.now_ns.max(now_ns);
        let now = self.now_ns;
        for id in &self.timed {
            if let Some(&slot) = self.slot_of.get(id) {
                self.counters[slot as usize].added_ns.get_or_insert(now);
            }
        }
        let mut due: Vec<(RuleId, u64, Timeout)> = (self.timed.iter().copied())
            .filter_map(|id| {
                let r = self.rules.get(id)?;
                let seq = self.rules.seq(id)?;
                let c = self.rule_counters(id);
                let added = c.added_ns.unwrap_or(now);
                let idle_since = c.last_hit_ns.max(elsewhere(seq)).max(added);
                let after = |since: u64, seconds: u32, grace: u64| {
                    seconds > 0
                        && now >= since.saturating_add(u64::from(seconds) * SECOND_NS + grace)
                };
                if after(added, r.hard_timeout, 0) {
                    Some((id, seq, Timeout::Hard))
                } else if after(idle_since, r.idle_timeout, grace_ns) {
                    Some((id, seq, Timeout::Idle))
                } else {
                    None
                }
            })
            .collect();
        due.sort_unstable_by_key(|&(_, seq, _)| seq);
        due
    }

    /// Removes the rules whose idle or hard timeout has run out by `now_ns` on this
    /// pipeline alone (see [`CachedPipeline::due`]), as deletes; their handles, oldest
    /// first.
    pub fn expire(&mut self, now_ns: u64) -> Vec<RuleId> {
        let due = self.due(now_ns, |_| 0, 0);
        for &(id, _, _) in &due {
            self.remove(id);
        }
        due.into_iter().map(|(id, _, _)| id).collect()
    }

    /// Classifies one packet of `bytes` bytes arriving at `now_ns`, counting it on the
    /// rules it matched. A cache hit allocates nothing: the outcome is the Action Table's.
    pub fn classify(&mut self, fields: &Fields, bytes: u32, now_ns: u64) -> &Outcome {
        let hash = self.hash(fields);
        self.classify_hashed(fields, hash, bytes, now_ns)
    }

    /// The cache's hash of `fields`. For a burst, take every packet's hash and
    /// [`CachedPipeline::warm`] its slot first, then classify them: the slots' memory
    /// reads then overlap instead of stalling one packet at a time.
    #[inline]
    pub fn hash(&self, fields: &Fields) -> u64 {
        self.cache.hash(&self.key(fields))
    }

    /// The fields the cache keys `fields` by: those under the key mask.
    #[inline]
    fn key(&self, fields: &Fields) -> Fields {
        fields.and(&self.key_mask)
    }

    /// The bits of a packet's fields the cache tells microflows apart by.
    pub fn key_mask(&self) -> &Fields {
        &self.key_mask
    }

    /// Starts loading `hash`'s cache slot ahead of its lookup.
    #[inline]
    pub fn warm(&self, hash: u64) {
        if self.mode != Consistency::Off {
            self.cache.warm(hash);
        }
    }

    /// [`CachedPipeline::classify`] with the hash already taken.
    pub fn classify_hashed(
        &mut self,
        fields: &Fields,
        hash: u64,
        bytes: u32,
        now_ns: u64,
    ) -> &Outcome {
        let probe = self.probe(fields, hash);
        self.classify_probed(fields, hash, probe, bytes, now_ns)
    }

    /// Looks `fields` up in the cache (counting the hit or miss) and starts loading the
    /// Action Table entry found. A burst probes every packet, then classifies each with
    /// [`CachedPipeline::classify_probed`]; the rules must not change in between (they
    /// change between bursts).
    #[inline]
    pub fn probe(&mut self, fields: &Fields, hash: u64) -> Probe {
        if self.mode == Consistency::Off {
            return Probe(None);
        }
        let found = self.cache.lookup(hash, &self.key(fields));
        if let Some((at, _)) = found
            && let Some(entry) = self.actions.get(at as usize)
        {
            stateplane_mem::prefetch(entry);
        }
        Probe(found)
    }

    /// Starts loading the actions of the entry `probe` found (whose entry line a probe
    /// earlier in the burst has loaded by now).
    #[inline]
    pub fn warm_outcome(&self, probe: Probe) {
        if let Some((at, _)) = probe.0
            && let Some(entry) = self.actions.get(at as usize)
            && let Some(first) = entry.outcome.actions.first()
        {
            stateplane_mem::prefetch(first);
        }
    }

    /// Classifies a packet whose cache probe is `probe`: the probe's entry if it is
    /// fresh, else the tables' walk (see [`CachedPipeline::classify`]).
    pub fn classify_probed(
        &mut self,
        fields: &Fields,
        hash: u64,
        probe: Probe,
        bytes: u32,
        now_ns: u64,
    ) -> &Outcome {
        self.now_ns = self.now_ns.max(now_ns);
        let now = self.now_ns;
        match self.mode {
            Consistency::Off => {
                self.rules.classify_into(fields, &mut self.uncached);
                for r in &self.uncached.rules {
                    if let Some(&s) = self.slot_of.get(r) {
                        count(&mut self.counters[s as usize], bytes, now);
                    }
                }
                &self.uncached
            }
            Consistency::Action | Consistency::Cookie | Consistency::Strong => {
                let at = self.cached(fields, hash, probe.0) as usize;
                let entry = &mut self.actions[at];
                entry.packets += 1;
                entry.bytes += u64::from(bytes);
                entry.last_hit_ns = now;
                &entry.outcome
            }
        }
    }

    /// The Action Table entry of `fields`: the cached one if it is fresh, else the tables'.
    fn cached(&mut self, fields: &Fields, hash: u64, found: Option<(u32, u64)>) -> u32 {
        let key = self.key(fields);
        if let Some((at, stamp)) = found {
            let a = &self.actions[at as usize];
            let fresh = a.stamp <= stamp
                && match self.mode {
                    Consistency::Cookie => a.sources.iter().all(|s| {
                        self.source_stamps
                            .get(s)
                            .is_none_or(|&changed| changed <= stamp)
                    }),
                    Consistency::Strong => true,
                    _ => a.valid,
                };
            if fresh {
                return at;
            }
            self.cache.remove(hash, &key);
        }
        let mut path = std::mem::take(&mut self.path);
        self.rules.path(fields, &mut path);
        let at = self.action_entry(&path);
        self.path = path;
        self.cache.insert(hash, &key, (at, self.clock));
        if self.mode == Consistency::Strong {
            self.track(at, hash, &key);
        }
        at
    }

    /// The Action Table entry of a walk's path, made (or made valid again) if need be.
    fn action_entry(&mut self, path: &[u32]) -> u32 {
        if let Some(&at) = self.by_path.get(path)
            && !self.actions[at as usize].dying
        {
            let a = &mut self.actions[at as usize];
            if !a.valid {
                a.valid = true;
                a.stamp = self.clock;
            }
            return at;
        }
        let outcome = self.rules.outcome_of_path(path);
        // The tables the walk missed in (visited, no rule matched) are sources too.
        let sources: Vec<Source> = (outcome.rules.iter().map(|&r| Source::Rule(r)))
            .chain(outcome.missed.iter().map(|&t| Source::Miss(t)))
            .collect();
        let entry = ActionEntry {
            path: path.into(),
            outcome,
            packets: 0,
            bytes: 0,
            last_hit_ns: 0,
            dying: false,
            valid: true,
            stamp: self.clock,
            sources,
        };
        let at = reuse_or_push(&mut self.actions, &mut self.free_actions, entry);
        for s in &self.actions[at as usize].sources {
            self.by_source.entry(*s).or_default().insert(at);
        }
        self.by_path.insert(path.into(), at);
        at
    }

    /// `Strong`: notes a cached microflow under each of its entry's sources (a list that
    /// outgrows the cache is trimmed to the microflows still cached).
    fn track(&mut self, at: u32, hash: u64, key: &Fields) {
        let limit = 2 * self.cache.capacity();
        for s in &self.actions[at as usize].sources {
            let list = self.source_flows.entry(*s).or_default();
            list.push((hash, *key));
            if list.len() > limit {
                list.retain(|(h, f)| self.cache.contains(*h, f));
            }
        }
    }

    /// Invalidates what `source` contributes to, as the mode keeps track.
    fn invalidate(&mut self, source: Source) {
        self.clock += 1;
        match self.mode {
            Consistency::Off => {}
            Consistency::Cookie => {
                self.source_stamps.insert(source, self.clock);
            }
            Consistency::Strong => {
                for (h, f) in self.source_flows.remove(&source).unwrap_or_default() {
                    self.cache.remove(h, &f);
                }
            }
            Consistency::Action => {
                for &at in self.by_source.get(&source).into_iter().flatten() {
                    let a = &mut self.actions[at as usize];
                    a.valid = false;
                    a.stamp = self.clock;
                }
            }
        }
    }

    /// Retires what a rule that is gone or changed contributed to: its Action Table
    /// entries can never be the outcome of a walk again. The work that cannot wait is
    /// done here, a few writes per entry (made stale, their counts added to their rules'
    /// own counters); taking them out of the other rules' lists and reusing them waits for
    /// [`CachedPipeline::maintain`], so that no single change holds a worker for long.
    fn forget(&mut self, id: RuleId) {
        let source = Source::Rule(id);
        self.invalidate(source);
        for at in self.by_source.remove(&source).unwrap_or_default() {
            let entry = &mut self.actions[at as usize];
            entry.valid = false;
            entry.stamp = self.clock;
            if entry.dying {
                continue;
            }
            entry.dying = true;
            let counted = RuleCounters {
                packets: std::mem::take(&mut entry.packets),
                bytes: std::mem::take(&mut entry.bytes),
                added_ns: None,
                last_hit_ns: entry.last_hit_ns,
            };
            for s in &entry.sources {
                if let Source::Rule(r) = s
                    && let Some(&slot) = self.slot_of.get(r)
                {
                    let c = &mut self.counters[slot as usize];
                    c.packets += counted.packets;
                    c.bytes += counted.bytes;
                    c.last_hit_ns = c.last_hit_ns.max(counted.last_hit_ns);
                }
            }
            self.dying.push(at);
        }
        self.maintain(RETIRE_PER_CHANGE);
    }

    /// Frees up to `budget` retired Action Table entries for reuse; how many are left.
    /// Call it between bursts (changes call it too, with a small budget).
    pub fn maintain(&mut self, budget: usize) -> usize {
        for _ in 0..budget {
            let Some(at) = self.dying.pop() else {
                break;
            };
            let entry = &mut self.actions[at as usize];
            let sources = std::mem::take(&mut entry.sources);
            if self.by_path.get(&entry.path) == Some(&at) {
                self.by_path.remove(&entry.path);
            }
            for s in &sources {
                if let Some(set) = self.by_source.get_mut(s) {
                    set.remove(&at);
                }
            }
            self.free_actions.push(at);
        }
        self.dying.len()
    }

    /// Moves the pipeline's clock to `now_ns` if it is later (a control change applied
    /// between bursts brings the worker's time, so that a rule added now is timed from now,
    /// not from the last packet).
    pub fn observe_time(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
    }

    /// Adds a rule; its handle. Cached microflows it may now catch are resolved again.
    pub fn insert(&mut self, rule: Rule) -> Result<RuleId, RuleError> {
        let table = rule.table;
        let timed = rule.idle_timeout > 0 || rule.hard_timeout > 0;
        let shadowed = self.rules.overlapping_below(&rule);
        let key_bits = rule.pattern.key_bits();
        let id = self.rules.insert(rule)?;
        self.key_mask = self.key_mask.union(&key_bits);
        self.add_counters(id, timed);
        for s in shadowed {
            self.invalidate(Source::Rule(s));
        }
        self.invalidate(Source::Miss(table));
        Ok(id)
    }

    fn add_counters(&mut self, id: RuleId, timed: bool) {
        let fresh = RuleCounters {
            added_ns: (self.now_ns > 0).then_some(self.now_ns),
            ..RuleCounters::default()
        };
        let slot = reuse_or_push(&mut self.counters, &mut self.free_slots, fresh);
        self.slot_of.insert(id, slot);
        if timed {
            self.timed.insert(id);
        }
    }

    /// Replaces a rule's actions and goto (an OpenFlow modify), keeping its counters;
    /// whether it was there.
    pub fn modify(
        &mut self,
        id: RuleId,
        actions: Vec<crate::rule::Action>,
        goto: Option<u8>,
    ) -> Result<bool, RuleError> {
        let changed = self.rules.modify(id, actions, goto)?;
        if changed {
            self.forget(id);
        }
        Ok(changed)
    }

    /// Removes a rule (a delete or a timeout); whether it was there.
    pub fn remove(&mut self, id: RuleId) -> bool {
        if self.rules.get(id).is_none() {
            return false;
        }
        self.timed.remove(&id);
        self.rules.remove(id);
        self.forget(id);
        self.source_stamps.remove(&Source::Rule(id));
        if let Some(slot) = self.slot_of.remove(&id) {
            self.free_slots.push(slot);
        }
        true
    }

    /// Replaces every rule: the cache starts empty. A rule that stays (the same id and
    /// match, as when the new set was made from this one's) keeps its counters and times.
    pub fn replace(&mut self, rules: RuleSet) {
        let kept: HashMap<RuleId, RuleCounters> = (rules.rules())
            .filter(|(id, r)| {
                self.rules.get(*id).is_some_and(|old| {
                    (old.table, old.priority, old.pattern) == (r.table, r.priority, r.pattern)
                })
            })
            .map(|(id, _)| (id, self.rule_counters(id)))
            .collect();
        self.rules = rules;
        self.key_mask = (self.rules.rules()).fold(Fields::default(), |m, (_, r)| {
            m.union(&r.pattern.key_bits())
        });
        self.cache.clear();
        self.actions.clear();
        self.free_actions.clear();
        self.dying.clear();
        self.by_path.clear();
        self.by_source.clear();
        self.source_stamps.clear();
        self.source_flows.clear();
        self.counters.clear();
        self.slot_of.clear();
        self.free_slots.clear();
        self.timed.clear();
        self.clock += 1;
        let ids: Vec<(RuleId, bool)> = (self.rules.rules())
            .map(|(id, r)| (id, r.idle_timeout > 0 || r.hard_timeout > 0))
            .collect();
        for (id, timed) in ids {
            self.add_counters(id, timed);
            if let (Some(c), Some(&slot)) = (kept.get(&id), self.slot_of.get(&id)) {
                self.counters[slot as usize] = *c;
            }
        }
    }
}

/// Puts `item` in a freed place of `items` if there is one, else at the end; its index.
fn reuse_or_push<T>(items: &mut Vec<T>, free: &mut Vec<u32>, item: T) -> u32 {
    match free.pop() {
        Some(i) => {
            items[i as usize] = item;
            i
        }
        None => {
            items.push(item);
            items.len() as u32 - 1
        }
    }
}

fn count(c: &mut RuleCounters, bytes: u32, now_ns: u64) {
    c.packets += 1;
    c.bytes += u64::from(bytes);
    c.last_hit_ns = now_ns;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fields::mapped;
    use crate::rule::{Action, Pattern, SetField};
    use crate::ruleset::Miss;

    use crate::testing::Rng;

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
            tcp_flags: rng.pick(&[0x02u8, 0x10, 0x18, 0x11]),
            ..Fields::default()
        }
    }

    fn rule(rng: &mut Rng) -> Rule {
        let table = rng.below(u64::from(TABLES)) as u8;
        let mut p = Pattern::ANY;
        if rng.below(2) == 0 {
            let len = rng.pick(&[16u32, 20, 24, 28, 31, 32]);
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
        // Rare matches on fields most rules leave alone, so that the cache's key mask
        // grows in the middle of a run, over microflows cached without them.
        if rng.below(40) == 0 {
            p.mask.tcp_flags = 0x02;
            p.value.tcp_flags = 0x02;
        }
        if rng.below(60) == 0 {
            p.tp_src = (1024, u16::MAX);
        }
        if rng.below(8) == 0 {
            // Source prefixes of any length: rules of nearby masks share merged tuples.
            p.mask.ip_src = u128::MAX << rng.below(33);
            p.value.ip_src = mapped(rng.pick(&HOSTS));
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
                12 => {
                    // Retired entries freed a few at a time, between other steps.
                    on.maintain(rng.below(4) as usize);
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
        let low = crate::rule_text::parse_rule("priority=1,ip,actions=output:1").unwrap();
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
            crate::rule_text::parse_rule("priority=9,ip,nw_dst=198.19.5.0/24,actions=output:2")
                .unwrap();
        p.insert(high).unwrap();
        assert_eq!(p.classify(&f, 60, 0).actions, [Action::Output(2)]);
        // A rule that cannot overlap leaves the cached microflow alone.
        let hits = p.cache_stats().hits;
        let other = crate::rule_text::parse_rule("priority=9,ipv6,actions=output:3").unwrap();
        p.insert(other).unwrap();
        p.classify(&f, 60, 0);
        assert_eq!(p.cache_stats().hits, hits + 1);
    }

    /// Packets that differ only in fields no rule reads share one cache entry; a rule that
    /// reads one of them (here TCP flags) tells them apart from then on.
    #[test]
    fn the_cache_keys_microflows_by_the_fields_rules_read() {
        let rule = |line: &str| crate::rule_text::parse_rule(line).unwrap();
        let mut p = CachedPipeline::new(RuleSet::new(1), Consistency::Action, 64, 1, 1).unwrap();
        p.insert(rule("priority=1,tcp,nw_dst=198.19.0.0/16,actions=output:1"))
            .unwrap();
        let packet = |flags: u8, port: u16| Fields {
            eth_type: 0x0800,
            ip_proto: 6,
            ip_dst: mapped(0xc613_0505),
            tp_src: port,
            tcp_flags: flags,
            ..Fields::default()
        };
        let (syn, ack) = (packet(0x02, 40000), packet(0x10, 40000));
        p.classify(&syn, 60, 0);
        assert_eq!(p.classify(&ack, 60, 0).actions, [Action::Output(1)]);
        assert_eq!(p.cache_stats().hits, 1, "a SYN's entry serves its ACK");
        assert_eq!(p.key_mask().tcp_flags, 0);
        assert_eq!(p.key_mask().tp_src, 0, "no rule narrows the source port");

        p.insert(rule("priority=9,tcp,tcp_flags=0x02/0x02,actions=drop"))
            .unwrap();
        assert_eq!(p.key_mask().tcp_flags, 0x02);
        assert!(p.classify(&syn, 60, 0).actions.is_empty(), "SYNs dropped");
        assert_eq!(p.classify(&ack, 60, 0).actions, [Action::Output(1)]);
        let hits = p.cache_stats().hits;
        assert_eq!(p.classify(&ack, 60, 0).actions, [Action::Output(1)]);
        assert!(p.classify(&syn, 60, 0).actions.is_empty());
        assert_eq!(p.cache_stats().hits, hits + 2, "each has its own entry now");

        // Replacing the rules makes the mask again, from the rules that are left.
        let mut only_ports = RuleSet::new(1);
        only_ports
            .insert(rule("priority=1,tcp,tp_src=40000-40010,actions=output:2"))
            .unwrap();
        p.replace(only_ports);
        assert_eq!(p.key_mask().tcp_flags, 0);
        assert_eq!(p.key_mask().tp_src, u16::MAX);
        assert_eq!(p.key_mask().ip_dst, 0);
    }

    /// Churn leaves no garbage: the Action Table and the counters of removed and modified
    /// rules are reused, so memory stays bounded at any update rate.
    #[test]
    fn rule_churn_reuses_action_entries_and_counters() {
        for mode in [
            Consistency::Action,
            Consistency::Cookie,
            Consistency::Strong,
        ] {
            let mut p = CachedPipeline::new(RuleSet::new(1), mode, 256, 2, 1).unwrap();
            let base = crate::rule_text::parse_rule("priority=1,actions=output:1").unwrap();
            let base = p.insert(base).unwrap();
            for i in 0..5_000u32 {
                let line = format!(
                    "priority=5,ip,nw_dst=198.19.{}.0/24,actions=output:2",
                    i % 200
                );
                let id = p
                    .insert(crate::rule_text::parse_rule(&line).unwrap())
                    .unwrap();
                let f = Fields {
                    eth_type: 0x0800,
                    ip_dst: mapped(0xc613_0005 | (i % 200) << 8),
                    ..Fields::default()
                };
                assert_eq!(p.classify(&f, 60, 0).actions, [Action::Output(2)]);
                p.modify(id, vec![Action::Output(3)], None).unwrap();
                assert_eq!(p.classify(&f, 60, 0).actions, [Action::Output(3)]);
                assert!(p.remove(id));
                assert_eq!(p.classify(&f, 60, 0).actions, [Action::Output(1)]);
            }
            assert!(
                p.actions.len() <= 4,
                "{mode:?}: {} entries",
                p.actions.len()
            );
            assert!(
                p.counters.len() <= 2,
                "{mode:?}: {} counters",
                p.counters.len()
            );
            assert_eq!(p.counters(base), (5_000, 300_000), "{mode:?}");
        }
    }
}
