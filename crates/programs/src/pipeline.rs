//! `pipeline`: an OpenFlow-style switch. Numbered tables of prioritized wildcard rules
//! (`stateplane-classifier`) decide each packet's actions; a microflow cache per worker
//! remembers the outcome for each exact combination of the header bits the rules read,
//! and is kept consistent with the rules under every kind of update (FlowShadow's
//! schemes, made correct for inserts that overlap cached microflows, timeouts and
//! replacements).
//!
//! Actions change the packet itself: set-field on MACs, IP addresses and ports (checksums
//! updated incrementally), `dec_ttl`, VLAN push (in the burst's headroom), pop and
//! rewrite, and the last `output` applied is where it goes. No output: dropped
//! (`no_output`); a table miss that drops: `no_match`; a TTL at 1 before `dec_ttl`:
//! `ttl_expired`; a set-field the packet has no field for (a port on ICMP, an IPv4 address
//! on IPv6): `cannot_edit`. `controller` and a table miss set to `controller` hand the
//! packet to the control plane.
//!
//! State: the rule set (read-centric; each worker holds a copy, changed between bursts by
//! the control plane, all workers alike), each rule's packet and byte counters (per worker,
//! summed on read), and the per-worker microflow cache and Action Table. Rules with idle or
//! hard timeouts expire by the data-plane clock, checked once a second: an idle timeout
//! counts every worker's packets (each worker shares its rules' last hits once a second,
//! and with several workers an idle rule goes a second later than its timeout, so that a
//! hit not yet shared can never make it go early). The worker that finds a rule expired
//! asks the control plane to remove it; every worker removes it at one version, as for a
//! client's delete, and subscribers get one flow-removed notification with the counters
//! of all workers.
//!
//! Configuration: `tables` (default 1), `rules` (rule lines) and/or `rules_file` (one rule
//! per line, `#` comments) in the format of docs/cli.md, `miss` (per table from 0:
//! "drop", "controller" or "continue"; tables not listed drop), `cache` ("action",
//! "cookie", "strong" or "off"; default "action"), `capacity` (rules at most, default
//! 1,048,576), `cache_entries` (a power of two,
//! default 262,144) and `cache_ways` (1, 2 or 4; default 1).
//!
//! Control API: the rule pipeline `flows`, written as rule text (`ctl add-flow`,
//! `add-flows`, `mod-flows`, `del-flows`, `dump-flows`, with `table=N,cookie=V/M`
//! filters). Rule text is parsed and checked on the control plane's thread; each worker
//! then applies the change between two bursts, and once the API has answered, no packet
//! gets an outcome the new rules would not give.

use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_classifier::Timeout;
use stateplane_classifier::apply::{self, ApplyError, VlanChange};
use stateplane_classifier::{
    CachedPipeline, Consistency, Fields, Miss, Pattern, Probe, Rule, RuleId, RuleSet,
    TREE_BYTES_A_RULE, TREE_RULES, format_rule, parse_rule, parse_rule_warning,
};
use stateplane_mem::budget::{Allowance, Growth, OverBudget};
use stateplane_runtime::{Burst, Context, DropReason, Program, Verdict};
use stateplane_state::{
    Carried, ControlError, Declaration, Expiry, FlowChange, FlowFilter, FlowStat, Guarantee, Kind,
    RemovedReason, Reply, Request,
};
use stateplane_wire::{ParseFlags, edit};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    #[serde(default = "one")]
    pub tables: usize,
    #[serde(default)]
    pub rules: Vec<String>,
    pub rules_file: Option<String>,
    #[serde(default)]
    pub miss: Vec<String>,
    #[serde(default = "default_cache")]
    pub cache: String,
    #[serde(default = "default_entries")]
    pub cache_entries: usize,
    #[serde(default = "default_ways")]
    pub cache_ways: usize,
    #[serde(default = "default_capacity")]
    pub capacity: usize,
}

fn default_capacity() -> usize {
    DEFAULT_CAPACITY
}

fn one() -> usize {
    1
}

fn default_cache() -> String {
    "action".into()
}

/// The flow cache's entries and ways unless configured otherwise (`bench-pipeline`'s
/// too), chosen by its measurements (docs/BENCHMARKS.md, *The flow cache's shape*):
/// 262,144 direct-mapped entries, 32 MiB a worker.
pub const DEFAULT_CACHE_ENTRIES: usize = 1 << 18;
pub const DEFAULT_CACHE_WAYS: usize = 1;

fn default_entries() -> usize {
    DEFAULT_CACHE_ENTRIES
}

fn default_ways() -> usize {
    DEFAULT_CACHE_WAYS
}

/// Tables a pipeline may have: table numbers are bytes, and a walk visits each at most once.
pub const MAX_TABLES: usize = 64;

const NO_MATCH: DropReason = DropReason::program(0);
const NO_OUTPUT: DropReason = DropReason::program(1);
const TTL_EXPIRED: DropReason = DropReason::program(2);
const CANNOT_EDIT: DropReason = DropReason::program(3);

/// `ToControl` codes: a table miss set to `controller`, and a `controller` action.
pub const TO_CONTROL_MISS: u16 = 1;
pub const TO_CONTROL_ACTION: u16 = 2;

const SECOND_NS: u64 = 1_000_000_000;

/// Retired Action Table entries freed per burst: a bounded share of the work of a change.
const RETIRE_PER_BURST: usize = 64;

#[derive(Clone)]
pub struct Pipeline {
    flows: CachedPipeline,
    /// When the next expiry check is due (data-plane clock).
    next_expiry_ns: u64,
    /// The switch's ports, which outputs must name.
    ports: usize,
    /// Rules at most, all tables together.
    capacity: usize,
    /// The burst's keys and hashes (kept to reuse its memory).
    batch: Vec<(Fields, u64, Probe)>,
    /// Shared by every worker's copy.
    timers: Arc<Mutex<SharedTimers>>,
    /// Expired rules this worker found, for the control plane to remove everywhere.
    expired: Vec<Expiry>,
    /// Shared by every worker's copy.
    rule_budget: Arc<RuleBudget>,
}

/// What the workers of one pipeline share about its timed rules, so that they agree on
/// when each expires.
/// Rules are known by their insert sequence numbers, which (unlike ids) no later rule
/// takes.
#[derive(Default)]
struct SharedTimers {
    /// Each rule with an idle timeout: its latest hit on any worker, as of each worker's
    /// last check.
    last_hit: HashMap<u64, u64>,
    /// The rules some worker has asked to remove (one request for a rule, not one for
    /// each worker that finds it expired).
    asked: HashSet<u64>,
}

/// The rules a pipeline holds at most unless configured otherwise.
pub const DEFAULT_CAPACITY: usize = 1 << 20;

/// The actions a rule's share of the budget covers; each one more takes
/// [`BYTES_AN_ACTION`] more.
pub const ACTIONS_IN_A_RULE: usize = 8;
pub const BYTES_AN_ACTION: u64 = 64;

/// What every copy of a pipeline holds from the run's memory budget for its rules,
/// shared by the copies: the most rules they have held, at [`Pipeline::bytes_for_rules`]
/// in each copy (hash maps keep their room when rules go, so the most is what stays),
/// and the actions beyond [`ACTIONS_IN_A_RULE`] any rule was given.
struct RuleBudget {
    held: Mutex<RulesHeld>,
    /// The pipeline's tables (each may keep a decision tree).
    tables: usize,
    /// Rules the workers hold now (each worker's copy has the same rules).
    now: AtomicUsize,
}

/// What the budget holds for the rules, and for how many.
struct RulesHeld {
    allowance: Allowance,
    most: usize,
    extra_actions: u64,
}

impl RuleBudget {
    fn new(growth: Growth, tables: usize) -> RuleBudget {
        RuleBudget {
            tables,
            held: Mutex::new(RulesHeld {
                allowance: Allowance::new(growth, "rules"),
                most: 0,
                extra_actions: 0,
            }),
            now: AtomicUsize::new(0),
        }
    }

    /// Makes the budget cover `rules` more rules than the workers hold now, with
    /// `extra_actions` actions beyond their share; refused, it changes nothing.
    fn cover(&self, rules: usize, extra_actions: u64) -> Result<(), OverBudget> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let most = held.most.max(self.now.load(Ordering::Relaxed) + rules);
        let extra = held.extra_actions + extra_actions;
        let copies = held.allowance.copies();
        let bytes = Pipeline::bytes_for_rules(most, self.tables) + BYTES_AN_ACTION * extra;
        held.allowance.cover(
            || format!("{most} rules in a pipeline"),
            bytes.saturating_mul(copies),
            0,
        )?;
        (held.most, held.extra_actions) = (most, extra);
        Ok(())
    }
}

/// The actions of `rules` beyond each one's share.
fn extra_actions<'a>(rules: impl IntoIterator<Item = &'a Rule>) -> u64 {
    (rules.into_iter())
        .map(|r| r.actions.len().saturating_sub(ACTIONS_IN_A_RULE) as u64)
        .sum()
}

/// The rule pipeline's name in the control API.
pub const FLOWS: &str = "flows";

/// Reads a consistency mode by its configuration name.
pub fn consistency(name: &str) -> Option<Consistency> {
    Some(match name {
        "off" => Consistency::Off,
        "action" => Consistency::Action,
        "cookie" => Consistency::Cookie,
        "strong" => Consistency::Strong,
        _ => return None,
    })
}

/// Rules read from lines, and warnings about words that probably do not mean what they
/// say (each naming its line).
#[derive(Debug, Default)]
pub struct ReadRules {
    pub rules: Vec<Rule>,
    pub warnings: Vec<String>,
}

/// The lines that hold rules, numbered from 1: blank lines and `#` comments skipped.
fn rule_lines<'a>(
    lines: impl IntoIterator<Item = &'a str>,
) -> impl Iterator<Item = (usize, &'a str)> {
    (lines.into_iter().enumerate())
        .map(|(n, line)| (n + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
}

/// Reads rule lines, checking each against the tables of `rules` and the switch's
/// `ports`; an error names the line. Two rules with the same table, priority and match are
/// refused: the later would replace the earlier without a word.
pub fn parse_rules<'a>(
    rules: &RuleSet,
    lines: impl IntoIterator<Item = &'a str>,
    ports: usize,
) -> Result<ReadRules, String> {
    let mut read = ReadRules::default();
    let mut first_line = HashMap::new();
    for (n, line) in rule_lines(lines) {
        let at = |e: &dyn std::fmt::Display| format!("line {n}: {e}");
        let (rule, warnings) = parse_rule_warning(line).map_err(|e| at(&e))?;
        check_ports(&rule, ports).map_err(|e| at(&e))?;
        rules.check(&rule).map_err(|e| at(&e))?;
        if let Some(first) = first_line.insert((rule.table, rule.priority, rule.pattern), n) {
            return Err(at(&format!(
                "the same table, priority and match as line {first}, which it would replace; \
                 keep one"
            )));
        }
        read.warnings.extend(warnings.iter().map(|w| at(w)));
        read.rules.push(rule);
    }
    Ok(read)
}

/// The warnings of rule lines (see [`parse_rules`]), for a client that sends them to a
/// switch: words that do not read are left for the switch to refuse.
pub fn rule_warnings<'a>(lines: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    rule_lines(lines)
        .filter_map(|(n, line)| Some((n, parse_rule_warning(line).ok()?.1)))
        .flat_map(|(n, warnings)| warnings.into_iter().map(move |w| format!("line {n}: {w}")))
        .collect()
}

/// A client's rule lines, read against the tables and ports; their warnings logged here
/// (the client shows them to its user).
fn read_client_rules(
    rules: &RuleSet,
    lines: &[String],
    ports: usize,
) -> Result<Vec<Rule>, ControlError> {
    let read = parse_rules(rules, lines.iter().map(String::as_str), ports).map_err(invalid)?;
    for w in &read.warnings {
        log::warn!("rules from the control API: {w}");
    }
    Ok(read.rules)
}

/// A rule may only output to a port the switch has.
pub fn check_ports(rule: &Rule, ports: usize) -> Result<(), String> {
    for a in &rule.actions {
        if let stateplane_classifier::Action::Output(p) = a
            && usize::from(*p) >= ports
        {
            return Err(format!(
                "output:{p}: there is no port {p}; the switch has ports 0 to {}",
                ports.saturating_sub(1)
            ));
        }
    }
    Ok(())
}

impl Pipeline {
    /// What `rules` rules of up to [`ACTIONS_IN_A_RULE`] actions take in one copy of a
    /// pipeline: measured by the allocator over several rule shapes
    /// (`tests/rule_memory.rs`) and rounded up: 2 KiB a rule (its copy, its index
    /// entries and its tuple's, with hash maps' spare room), 4 KiB for the first, and what
    /// the decision trees of `tables` tables may hold for their rules
    /// ([`TREE_BYTES_A_RULE`] each, for at most [`TREE_RULES`] rules a table).
    pub fn bytes_for_rules(rules: usize, tables: usize) -> u64 {
        let in_trees = rules.min(TREE_RULES.saturating_mul(tables)) as u64;
        match rules {
            0 => 0,
            n => 4096 + 2048 * n as u64 + TREE_BYTES_A_RULE as u64 * in_trees,
        }
    }

    pub fn new(cfg: &PipelineConfig, ports: &PortNames, field: &str) -> Result<Self, ConfigError> {
        if cfg.tables == 0 || cfg.tables > MAX_TABLES {
            return Err(ConfigError::new(
                format!("{field}.tables"),
                format!("give 1 to {MAX_TABLES} tables"),
            ));
        }
        let mut rules = RuleSet::new(cfg.tables);
        for (t, miss) in cfg.miss.iter().enumerate() {
            let m = match miss.as_str() {
                "drop" => Miss::Drop,
                "controller" => Miss::Controller,
                "continue" => Miss::Continue,
                other => {
                    return Err(ConfigError::new(
                        format!("{field}.miss[{t}]"),
                        format!("'{other}' is not one of drop, controller, continue"),
                    ));
                }
            };
            rules
                .set_miss(t as u8, m)
                .map_err(|e| ConfigError::new(format!("{field}.miss[{t}]"), e.to_string()))?;
        }
        let n = ports.0.len();
        let listed = parse_rules(&rules, cfg.rules.iter().map(String::as_str), n)
            .map_err(|e| ConfigError::new(format!("{field}.rules"), e))?;
        for w in &listed.warnings {
            log::warn!("{field}.rules: {w}");
        }
        let mut given = listed.rules;
        if let Some(path) = &cfg.rules_file {
            let file_field = format!("{field}.rules_file");
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfigError::new(&file_field, format!("cannot read '{path}': {e}")))?;
            let filed = parse_rules(&rules, text.lines(), n)
                .map_err(|e| ConfigError::new(&file_field, format!("{path}: {e}")))?;
            for w in &filed.warnings {
                log::warn!("{file_field}: {path}: {w}");
            }
            given.extend(filed.rules);
        }
        if given.len() > cfg.capacity {
            return Err(ConfigError::new(
                format!("{field}.capacity"),
                format!(
                    "{} rules are given and the capacity is {}; raise it",
                    given.len(),
                    cfg.capacity
                ),
            ));
        }
        for rule in given {
            // Checked against these tables just above.
            let _ = rules.insert(rule);
        }
        let mode = consistency(&cfg.cache).ok_or_else(|| {
            ConfigError::new(
                format!("{field}.cache"),
                format!("'{}' is not one of action, cookie, strong, off", cfg.cache),
            )
        })?;
        if ![1, 2, 4].contains(&cfg.cache_ways) {
            return Err(ConfigError::new(
                format!("{field}.cache_ways"),
                format!("{} ways: give 1, 2 or 4", cfg.cache_ways),
            ));
        }
        let cache_field = format!("{field}.cache_entries");
        let cache_bytes = CachedPipeline::cache_bytes(cfg.cache_entries, cfg.cache_ways)
            .map_err(|e| ConfigError::new(&cache_field, e.to_string()))?;
        crate::claim_bytes(
            &cache_field,
            || format!("a flow cache of {} entries", cfg.cache_entries),
            cache_bytes,
        )?;
        let (count, extra) = (rules.len(), extra_actions(rules.rules().map(|(_, r)| r)));
        let mut p = Self::with_rules(rules, mode, cfg.cache_entries, cfg.cache_ways)
            .map_err(|e| ConfigError::new(cache_field, e))?;
        (p.rule_budget.cover(count, extra))
            .map_err(|e| ConfigError::new(format!("{field}.rules"), e.to_string()))?;
        p.rule_budget.now.store(count, Ordering::Relaxed);
        (p.ports, p.capacity) = (n, cfg.capacity);
        Ok(p)
    }

    /// A pipeline over `rules` with a cache of `entries` in sets of `ways` (benchmarks and
    /// tests build it so).
    pub fn with_rules(
        rules: RuleSet,
        mode: Consistency,
        entries: usize,
        ways: usize,
    ) -> Result<Self, String> {
        let tables = rules.tables();
        let flows = CachedPipeline::new(rules, mode, entries, ways, crate::table_seed())
            .map_err(|e| e.to_string())?;
        Ok(Pipeline {
            flows,
            next_expiry_ns: 0,
            ports: usize::from(u16::MAX),
            capacity: DEFAULT_CAPACITY,
            batch: Vec::new(),
            timers: Arc::default(),
            expired: Vec::new(),
            rule_budget: Arc::new(RuleBudget::new(Growth::of_scope(), tables)),
        })
    }

    pub fn flows(&self) -> &CachedPipeline {
        &self.flows
    }

    pub fn flows_mut(&mut self) -> &mut CachedPipeline {
        &mut self.flows
    }

    /// Between bursts: frees some retired Action Table entries, and checks the timeouts
    /// once a second.
    fn expire_due(&mut self, ctx: &Context) {
        self.flows.maintain(RETIRE_PER_BURST);
        if ctx.now_ns >= self.next_expiry_ns {
            self.check_timeouts(ctx.now_ns, ctx.workers);
            self.next_expiry_ns = ctx.now_ns + SECOND_NS;
        }
    }

    /// Shares this worker's last hits, then finds the rules expired on every worker's
    /// account that nobody has asked to remove yet.
    fn check_timeouts(&mut self, now_ns: u64, workers: usize) {
        let mine = self.flows.idle_timed_hits();
        let mut shared = self.timers.lock().unwrap_or_else(PoisonError::into_inner);
        for (seq, hit) in mine {
            let latest = shared.last_hit.entry(seq).or_default();
            *latest = (*latest).max(hit);
        }
        // Other workers share their hits once a second of their clocks.
        let grace = if workers > 1 { SECOND_NS } else { 0 };
        let due = (self.flows).due(
            now_ns,
            |seq| shared.last_hit.get(&seq).copied().unwrap_or(0),
            grace,
        );
        for (id, seq, timeout) in due {
            if shared.asked.insert(seq) {
                self.expired.push(Expiry {
                    id: u64::from(id.0),
                    seq,
                    reason: match timeout {
                        Timeout::Idle => RemovedReason::IdleTimeout,
                        Timeout::Hard => RemovedReason::HardTimeout,
                    },
                });
            }
        }
    }

    /// Makes `rules` the rules of `table` (or of every table), changing only what differs:
    /// a rule there identical to one of them in everything stays, with its counters and
    /// timers; the others there go (as deletes) and the rest of `rules` are added. Among
    /// `rules` with the same table, priority and match, the last counts (as adds in
    /// turn would leave it). All between two bursts, so no packet sees a mix of the two
    /// sets; all or none, refused whole if the pipeline's capacity cannot take it.
    fn replace(
        &mut self,
        table: Option<u8>,
        rules: &[Rule],
        now_ns: u64,
    ) -> Result<Reply, ControlError> {
        let mut last_of: HashMap<(u8, u16, Pattern), usize> = HashMap::new();
        for (i, r) in rules.iter().enumerate() {
            last_of.insert((r.table, r.priority, r.pattern.normalized()), i);
        }
        let set = self.flows.rules();
        let (mut kept, mut added) = (HashSet::new(), Vec::new());
        for (i, rule) in rules.iter().enumerate() {
            if last_of.get(&(rule.table, rule.priority, rule.pattern.normalized())) != Some(&i) {
                continue;
            }
            let normalized = Rule {
                pattern: rule.pattern.normalized(),
                ..rule.clone()
            };
            match set.identical(rule) {
                Some(old) if set.get(old) == Some(&normalized) => {
                    kept.insert(old);
                }
                _ => added.push(rule),
            }
        }
        let removed: Vec<RuleId> = (set.rules())
            .filter(|(id, r)| table.is_none_or(|t| r.table == t) && !kept.contains(id))
            .map(|(id, _)| id)
            .collect();
        if set.len() - removed.len() + added.len() > self.capacity {
            return Err(ControlError::TableFull {
                table: FLOWS.into(),
                capacity: self.capacity,
            });
        }
        let removed = self.remove(&removed, now_ns);
        for rule in &added {
            // `prepare` checked each against these same tables, so none fails.
            (self.flows)
                .insert((*rule).clone())
                .map_err(|e| invalid(e.to_string()))?;
        }
        Ok(Reply::Replaced {
            removed,
            added: added.len() as u64,
            kept: kept.len() as u64,
        })
    }

    /// Removes rules (a delete, or an expiry every worker applies); what they were.
    fn remove(&mut self, ids: &[RuleId], now_ns: u64) -> Vec<FlowStat> {
        let stats = self.stats(ids, now_ns);
        let seqs: Vec<u64> = ids
            .iter()
            .filter_map(|&id| self.flows.rules().seq(id))
            .collect();
        for &id in ids {
            self.flows.remove(id);
        }
        let mut shared = self.timers.lock().unwrap_or_else(PoisonError::into_inner);
        for seq in &seqs {
            shared.last_hit.remove(seq);
            shared.asked.remove(seq);
        }
        stats
    }
}

/// What a flow change prepares: the rules an add or a replace parses, or the actions a
/// modify sets.
pub enum Prepared {
    Rules(Vec<Rule>),
    Modify(Rule),
}

impl Program for Pipeline {
    type Prepared = Prepared;

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        self.expire_due(ctx);
        // First every packet's key and hash, reading its cache slot ahead; then the
        // lookups, which find the slots loaded.
        // Passes over the burst, so that memory reads overlap across its packets: every
        // packet's key and hash (loading its cache slot), every cache probe (loading the
        // Action Table entry found), every entry's actions, then the outcomes and the
        // rewrites.
        self.batch.clear();
        for (d, data) in burst.iter() {
            let fields = Fields::of(&d.parsed, data, d.in_port);
            let hash = self.flows.hash(&fields);
            self.flows.warm(hash);
            self.batch.push((fields, hash, Probe::default()));
        }
        for (fields, hash, probe) in &mut self.batch {
            *probe = self.flows.probe(fields, *hash);
        }
        for &(_, _, probe) in &self.batch {
            self.flows.warm_outcome(probe);
        }
        for i in 0..burst.len() {
            let p = burst.packet_mut(i);
            let parsed = &p.desc.parsed;
            let (fields, hash, probe) = self.batch[i];
            let outcome = self
                .flows
                .classify_probed(&fields, hash, probe, p.desc.len, ctx.now_ns);
            let applied = apply::apply(p.data, parsed, &outcome.actions);
            let tagged = parsed.flags.has(ParseFlags::VLAN);
            let (to_controller, dropped_by_miss) = (outcome.to_controller, outcome.dropped_by_miss);
            let verdict = match applied {
                Err(ApplyError::TtlExpired) => Verdict::Drop(TTL_EXPIRED),
                Err(ApplyError::CannotEdit(_)) => Verdict::Drop(CANNOT_EDIT),
                Ok(a) => {
                    let vlan_done = match a.vlan {
                        VlanChange::Keep => true,
                        VlanChange::Set(id) if tagged => edit::set_vlan_id(p.data, id).is_ok(),
                        VlanChange::Set(id) => burst
                            .grow_front(i, 4)
                            .is_some_and(|g| edit::insert_vlan_tag(g.data, id).is_ok()),
                        VlanChange::Pop => {
                            edit::remove_vlan_tag(p.data).is_ok() && burst.shrink_front(i, 4)
                        }
                    };
                    if !vlan_done {
                        Verdict::Drop(CANNOT_EDIT)
                    } else if to_controller {
                        Verdict::ToControl(TO_CONTROL_MISS)
                    } else if a.controller {
                        Verdict::ToControl(TO_CONTROL_ACTION)
                    } else if let Some(port) = a.output {
                        Verdict::Forward(port)
                    } else if dropped_by_miss {
                        Verdict::Drop(NO_MATCH)
                    } else {
                        Verdict::Drop(NO_OUTPUT)
                    }
                }
            };
            burst.descs_mut()[i].verdict = verdict;
        }
    }

    fn poll(&mut self, _out: &mut Burst, ctx: &mut Context) {
        self.expire_due(ctx);
    }

    fn requests(&mut self, out: &mut Vec<Request>) {
        if !self.expired.is_empty() {
            out.push(Request::Flows {
                name: FLOWS.into(),
                change: FlowChange::Expire(std::mem::take(&mut self.expired)),
            });
        }
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &["no_match", "no_output", "ttl_expired", "cannot_edit"]
    }

    fn declarations(&self) -> Vec<Declaration> {
        vec![Declaration {
            name: FLOWS.into(),
            capacity: self.capacity,
            guarantees: vec![Guarantee::Local],
            kind: Kind::Rules {
                tables: self.flows.rules().tables() as u8,
            },
        }]
    }

    /// Rule text is read here, on the control plane's thread, and checked against the
    /// tables and ports, so that the workers only insert: all or none, never half.
    fn prepare(&self, request: &Request) -> Result<Option<Arc<Prepared>>, ControlError> {
        let Request::Flows { change, .. } = request else {
            return Ok(None);
        };
        match change {
            FlowChange::Add { lines, .. } => {
                let rules = read_client_rules(self.flows.rules(), lines, self.ports)?;
                self.cover(rules.len(), extra_actions(rules.iter()))?;
                Ok(Some(Arc::new(Prepared::Rules(rules))))
            }
            FlowChange::Replace { table, lines } => {
                let rules = read_client_rules(self.flows.rules(), lines, self.ports)?;
                if let Some(t) = table
                    && let Some(other) = rules.iter().find(|r| r.table != *t)
                {
                    return Err(invalid(format!(
                        "replacing table {t}, the rules must all be in it: `{}` is in table {}",
                        format_rule(other),
                        other.table
                    )));
                }
                self.cover(rules.len(), extra_actions(rules.iter()))?;
                Ok(Some(Arc::new(Prepared::Rules(rules))))
            }
            FlowChange::Modify { actions, .. } => {
                let rule = parse_rule(&format!("actions={actions}"))
                    .map_err(|e| invalid(e.to_string()))?;
                check_ports(&rule, self.ports).map_err(invalid)?;
                // As though every rule took the new actions.
                let now = self.rule_budget.now.load(Ordering::Relaxed) as u64;
                self.cover(0, extra_actions([&rule]) * now)?;
                Ok(Some(Arc::new(Prepared::Modify(rule))))
            }
            FlowChange::Delete(_) | FlowChange::Dump(_) | FlowChange::Expire(_) => Ok(None),
        }
    }

    fn control(
        &mut self,
        request: &Request,
        prepared: Option<&Arc<Prepared>>,
        ctx: &Context,
    ) -> Result<Reply, ControlError> {
        if let Request::Stats { .. } = request {
            return Ok(Reply::Counters(self.counts(ctx.worker)));
        }
        let reply = self.change(request, prepared, ctx);
        // What the rules' budget counts from: every worker's copy holds the same rules.
        (self.rule_budget.now).store(self.flows.rules().len(), Ordering::Relaxed);
        reply
    }

    /// A reload makes the rules the configuration's (rules written with `ctl` since that
    /// it does not have leave), and each configured rule identical in everything to one
    /// the old pipeline held takes that rule's packet and byte counts, as `ovs-ofctl
    /// replace-flows` keeps an unchanged flow's (its duration starts again).
    fn inherit(&mut self, old: Self, _now_ns: u64) -> Vec<Carried> {
        let before = old.flows.rules();
        let counted: Vec<(RuleId, (u64, u64))> = (self.flows.rules().rules())
            .filter_map(|(id, rule)| {
                let was = before.identical(rule)?;
                (before.get(was) == Some(rule)).then(|| (id, old.flows.counters(was)))
            })
            .collect();
        let kept = counted.len() as u64;
        for (id, (packets, bytes)) in counted {
            self.flows.add_counts(id, packets, bytes);
        }
        let dropped = (before.len() as u64).saturating_sub(kept);
        let why = "rules the configuration no longer has as they were";
        vec![Carried::entries(FLOWS, kept, dropped, why)]
    }
}

fn invalid(why: String) -> ControlError {
    ControlError::Invalid {
        what: format!("`{FLOWS}`"),
        why,
    }
}

impl Pipeline {
    /// What `ctl stats` and a metrics scrape read, summed over the workers: the rules (each
    /// worker holds them all, so worker 0 alone counts them) and this worker's microflow
    /// cache.
    fn counts(&self, worker: usize) -> Vec<(&'static str, u64)> {
        let cache = self.flows.cache_stats();
        let rules = if worker == 0 {
            self.flows.rules().len()
        } else {
            0
        };
        vec![
            ("rules", rules as u64),
            ("cache_hits", cache.hits),
            ("cache_misses", cache.misses),
            ("cache_inserts", cache.inserts),
            ("cache_evictions", cache.evictions),
            ("cache_collisions", cache.collisions),
        ]
    }

    /// Has the rules' budget cover `rules` more rules and `extra` actions beyond their
    /// share, or refuses the change.
    fn cover(&self, rules: usize, extra: u64) -> Result<(), ControlError> {
        (self.rule_budget.cover(rules, extra)).map_err(|e| ControlError::OverBudget {
            table: FLOWS.into(),
            why: e.to_string(),
        })
    }

    /// Applies a checked flow request (see [`Program::control`]).
    fn change(
        &mut self,
        request: &Request,
        prepared: Option<&Arc<Prepared>>,
        ctx: &Context,
    ) -> Result<Reply, ControlError> {
        let Request::Flows { change, .. } = request else {
            return Err(invalid(
                "it is a rule pipeline: use the flow requests".into(),
            ));
        };
        // A rule added now is timed from now, not from the worker's last packet.
        self.flows.observe_time(ctx.now_ns);
        match change {
            FlowChange::Add { keep_counters, .. } => {
                let Some(Prepared::Rules(rules)) = prepared.map(|p| p.as_ref()) else {
                    return Err(ControlError::Unavailable);
                };
                // As OpenFlow's add: a rule with the table, priority and match of one
                // there replaces it, its timers starting again, and its counters too
                // unless asked to keep them.
                let replaced = (rules.iter())
                    .filter(|r| self.flows.rules().identical(r).is_some())
                    .count();
                if self.flows.rules().len().saturating_sub(replaced) + rules.len() > self.capacity {
                    return Err(ControlError::TableFull {
                        table: FLOWS.into(),
                        capacity: self.capacity,
                    });
                }
                for rule in rules.iter() {
                    let old = self.flows.rules().identical(rule);
                    let counts = old.and_then(|old| self.flows.stat(old));
                    if let Some(old) = old {
                        self.remove(&[old], ctx.now_ns);
                    }
                    // `prepare` checked each against these same tables, so none fails.
                    let id = (self.flows)
                        .insert(rule.clone())
                        .map_err(|e| invalid(e.to_string()))?;
                    if let (true, Some(c)) = (keep_counters, counts) {
                        self.flows.add_counts(id, c.packets, c.bytes);
                    }
                }
                Ok(Reply::Done)
            }
            FlowChange::Modify { filter, .. } => {
                let Some(Prepared::Modify(new)) = prepared.map(|p| p.as_ref()) else {
                    return Err(ControlError::Unavailable);
                };
                let ids = self.matching(filter);
                // Every goto is checked before any rule changes: all or none.
                for &id in &ids {
                    if let Some(r) = self.flows.rules().get(id) {
                        let probe = Rule {
                            goto: new.goto,
                            ..r.clone()
                        };
                        self.flows
                            .rules()
                            .check(&probe)
                            .map_err(|e| invalid(e.to_string()))?;
                    }
                }
                for &id in &ids {
                    let _ = self.flows.modify(id, new.actions.clone(), new.goto);
                }
                Ok(Reply::Flows(self.stats(&ids, ctx.now_ns)))
            }
            FlowChange::Delete(filter) => {
                let ids = self.matching(filter);
                Ok(Reply::Flows(self.remove(&ids, ctx.now_ns)))
            }
            FlowChange::Replace { table, .. } => {
                let Some(Prepared::Rules(rules)) = prepared.map(|p| p.as_ref()) else {
                    return Err(ControlError::Unavailable);
                };
                self.replace(*table, rules, ctx.now_ns)
            }
            FlowChange::Expire(expired) => {
                // Only the rules found expired: not a later rule given the same id.
                let ids: Vec<RuleId> = (expired.iter())
                    .filter_map(|e| Some((RuleId(u32::try_from(e.id).ok()?), e.seq)))
                    .filter(|&(id, seq)| self.flows.rules().seq(id) == Some(seq))
                    .map(|(id, _)| id)
                    .collect();
                Ok(Reply::Flows(self.remove(&ids, ctx.now_ns)))
            }
            FlowChange::Dump(filter) => {
                Ok(Reply::Flows(self.stats(&self.matching(filter), ctx.now_ns)))
            }
        }
    }

    fn matching(&self, filter: &FlowFilter) -> Vec<RuleId> {
        (self.flows.rules().rules())
            .filter(|(_, r)| filter.matches(r.table, r.cookie))
            .map(|(id, _)| id)
            .collect()
    }

    /// The rules `ids` as the control API shows them, with this worker's counters and
    /// times at `now_ns`.
    fn stats(&self, ids: &[RuleId], now_ns: u64) -> Vec<FlowStat> {
        (ids.iter())
            .filter_map(|&id| {
                let r = self.flows.rules().get(id)?;
                let s = self.flows.stat(id)?;
                Some(FlowStat {
                    id: u64::from(id.0),
                    table: r.table,
                    priority: r.priority,
                    cookie: r.cookie,
                    rule: format_rule(r),
                    packets: s.packets,
                    bytes: s.bytes,
                    duration_ns: now_ns.saturating_sub(s.added_ns),
                    idle_ns: now_ns.saturating_sub(s.last_hit_ns.max(s.added_ns)),
                    at_ns: now_ns,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::testutil::{hasher, run, udp_frame, verdicts};
    use stateplane_wire::checksum::{pseudo_v4, pseudo_v6};
    use stateplane_wire::ipv4::Ipv4Packet;
    use stateplane_wire::udp::UdpPacket;

    fn ports(n: usize) -> PortNames {
        PortNames((0..n).map(|i| format!("p{i}")).collect())
    }

    fn config(toml_text: &str) -> Result<Pipeline, ConfigError> {
        let cfg: PipelineConfig = toml::from_str(toml_text).unwrap();
        Pipeline::new(&cfg, &ports(4), "program.pipeline")
    }

    /// Whether a frame's IPv4 header and UDP checksums verify from scratch.
    fn checksums_valid(f: &[u8]) -> bool {
        let p = stateplane_wire::parse(f, 0, &hasher()).unwrap();
        let (l3, l4) = (usize::from(p.l3_offset), usize::from(p.l4_offset));
        let udp = UdpPacket::new_checked(&f[l4..]).unwrap();
        let len = (f.len() - l4) as u32;
        if p.key.ip_version == 4 {
            let ip = Ipv4Packet::new_checked(&f[l3..]).unwrap();
            let pseudo = pseudo_v4(ip.src(), ip.dst(), 17, len as u16);
            ip.verify_checksum() && udp.verify_checksum(pseudo)
        } else {
            let a = |at: usize| {
                std::net::Ipv6Addr::from(<[u8; 16]>::try_from(&f[at..at + 16]).unwrap())
            };
            udp.verify_checksum(pseudo_v6(a(l3 + 8), a(l3 + 24), 17, len))
        }
    }

    const ACL_THEN_FIB: &str = r#"
        tables = 2
        miss = ["drop", "drop"]
        rules = [
            "table=0,priority=100,udp,tp_dst=22,actions=drop",
            "table=0,priority=10,ip,actions=goto_table:1",
            "table=0,priority=10,ipv6,actions=goto_table:1",
            "table=1,priority=16,ip,nw_dst=198.19.0.0/16,actions=dec_ttl,mod_dl_dst:02:00:00:00:0b:01,output:1",
            "table=1,priority=24,ip,nw_dst=198.19.7.0/24,actions=dec_ttl,mod_nw_dst:198.19.8.8,mod_tp_dst:5353,output:2",
            "table=1,priority=32,ipv6,ipv6_dst=2001:2:1::/48,actions=dec_ttl,mod_vlan_vid:42,output:3",
        ]
    "#;

    /// Runs `frames` as one burst arriving on port 0 at `t`, after applying what the
    /// pipeline asked of the control plane (as the runtime does before a burst).
    fn at(p: &mut Pipeline, frames: &[Vec<u8>], t: u64) -> Vec<Verdict> {
        let mut ctx = crate::testutil::ctx(t, 4);
        let mut requests = Vec::new();
        p.requests(&mut requests);
        for r in &requests {
            p.control(r, None, &ctx).unwrap();
        }
        let mut b = Burst::with_capacity(frames.len());
        for (i, f) in frames.iter().enumerate() {
            b.push(f, f.len() as u32, t, 0, i as u64);
        }
        b.now_ns = t;
        b.parse(&hasher());
        p.process(&mut b, &mut ctx);
        verdicts(&b)
    }

    /// A rule given at start with a hard timeout is timed from the first time the pipeline
    /// sees, not from time 0: at a capture's time (nanoseconds since 1970) it forwards
    /// until its 60 s have passed, then it is gone. Before, it expired on the first burst.
    #[test]
    fn a_timed_rule_given_at_start_counts_from_the_first_packet_not_from_zero() {
        let mut p =
            config(r#"rules = ["priority=10,udp,hard_timeout=60,actions=output:1"]"#).unwrap();
        let t0 = 1_700_000_000 * SECOND_NS;
        let frames = [udp_frame("198.19.1.1", 64)];
        assert_eq!(at(&mut p, &frames, t0), [Verdict::Forward(1)]);
        assert_eq!(
            at(&mut p, &frames, t0 + 59 * SECOND_NS),
            [Verdict::Forward(1)]
        );
        // Found expired at 61 s, removed before the next burst.
        at(&mut p, &frames, t0 + 61 * SECOND_NS);
        assert_eq!(
            at(&mut p, &frames, t0 + 61 * SECOND_NS + 1),
            [Verdict::Drop(NO_MATCH)]
        );
    }

    #[test]
    fn an_acl_then_a_fib_forwards_and_rewrites_real_packets() {
        for cache in ["off", "action", "cookie", "strong"] {
            let mut p = config(&format!("cache = \"{cache}\"\n{ACL_THEN_FIB}")).unwrap();
            let frames = [
                udp_frame("198.19.1.1", 64),
                udp_frame("198.19.7.7", 64),
                udp_frame("2001:2:1::9", 64),
                udp_frame("198.20.0.1", 64),
                udp_frame("198.19.1.1", 1),
            ];
            // Twice, so that the second round comes from the cache.
            for round in 0..2 {
                let b = run(&mut p, &frames, 4);
                assert_eq!(
                    verdicts(&b),
                    [
                        Verdict::Forward(1),
                        Verdict::Forward(2),
                        Verdict::Forward(3),
                        Verdict::Drop(NO_MATCH),
                        Verdict::Drop(TTL_EXPIRED),
                    ],
                    "{cache}, round {round}"
                );
                let routed = stateplane_wire::parse(b.data(0), 0, &hasher()).unwrap();
                assert_eq!(
                    (routed.ttl, &b.data(0)[..6]),
                    (63, &[2, 0, 0, 0, 0x0b, 1][..])
                );
                let nat = stateplane_wire::parse(b.data(1), 0, &hasher()).unwrap();
                assert_eq!(
                    (&nat.key.dst[..4], nat.key.dst_port),
                    (&[198, 19, 8, 8][..], 5353)
                );
                let tagged = stateplane_wire::parse(b.data(2), 0, &hasher()).unwrap();
                assert_eq!((tagged.key.vlan, tagged.ttl), (42, 63));
                assert_eq!(b.data(2).len(), frames[2].len() + 4);
                for i in 0..3 {
                    assert!(
                        checksums_valid(b.data(i)),
                        "{cache}: packet {i}'s checksums"
                    );
                }
            }
            let counted: Vec<(u64, u64)> = (p.flows().rules().rules())
                .map(|(id, _)| p.flows().counters(id))
                .collect();
            let packets: u64 = counted.iter().map(|c| c.0).sum();
            // Per round, all 5 packets match in table 0 and 4 in table 1 (198.20.0.1 has no
            // route; the TTL-expired one matched before its TTL was found at 1).
            assert_eq!(packets, 2 * (5 + 4), "{cache}: {counted:?}");
        }
    }

    #[test]
    fn a_reload_keeps_the_counts_of_the_rules_it_keeps_as_they_were() {
        let rules = |second: &str| {
            format!("rules = [\"priority=10,udp,tp_dst=53,actions=output:1\", \"{second}\"]")
        };
        let mut old = config(&rules("priority=5,udp,actions=output:2")).unwrap();
        let frames = [udp_frame("198.19.1.1", 64)];
        let dns = {
            let mut f = udp_frame("198.19.1.1", 64);
            // The UDP destination port, after 14 bytes of Ethernet and 20 of IPv4.
            f[36..38].copy_from_slice(&53u16.to_be_bytes());
            f
        };
        for t in 1..4 {
            at(&mut old, &[dns.clone(), frames[0].clone()], t * SECOND_NS);
        }
        let mut new = config(&rules("priority=5,udp,actions=output:3")).unwrap();
        let carried = Program::inherit(&mut new, old, 5 * SECOND_NS);
        assert_eq!(
            carried[0].to_string(),
            "flows: kept 1 entries, dropped 1 (rules the configuration no longer has as they \
             were)"
        );
        let counts: Vec<u64> = (new.flows().rules().rules())
            .map(|(id, _)| new.flows().counters(id).0)
            .collect();
        assert_eq!(
            counts,
            [3, 0],
            "the unchanged rule's 3 packets, the changed one's none"
        );
    }

    #[test]
    fn a_tag_is_popped_and_a_miss_can_go_to_the_controller() {
        let mut p = config(
            r#"
            miss = ["controller"]
            rules = ["dl_vlan=7,actions=strip_vlan,output:1"]
            "#,
        )
        .unwrap();
        let mut tagged = vec![0u8; 0];
        let plain = udp_frame("198.19.1.1", 64);
        tagged.extend(&plain[..12]);
        tagged.extend([0x81, 0x00, 0x00, 0x07]);
        tagged.extend(&plain[12..]);
        let b = run(&mut p, &[tagged, plain.clone()], 4);
        assert_eq!(
            verdicts(&b),
            [Verdict::Forward(1), Verdict::ToControl(TO_CONTROL_MISS)]
        );
        assert_eq!(b.data(0), &plain[..], "the tag is gone, the rest as it was");
    }

    #[test]
    fn a_set_field_the_packet_lacks_drops_it_counted() {
        let mut p = config(r#"rules = ["actions=mod_nw_dst:2001:db8::1,output:1"]"#).unwrap();
        let b = run(&mut p, &[udp_frame("198.19.1.1", 64)], 4);
        assert_eq!(verdicts(&b), [Verdict::Drop(CANNOT_EDIT)]);
    }

    #[test]
    fn configuration_mistakes_name_the_field_and_the_line() {
        let err = |text: &str| config(text).err().unwrap().to_string();
        assert!(err(r#"miss = ["sometimes"]"#).contains("program.pipeline.miss[0]"));
        assert!(err(r#"cache = "lru""#).contains("'lru' is not one of"));
        assert!(err("tables = 0").contains("program.pipeline.tables"));
        assert!(err("cache_ways = 3").contains("program.pipeline.cache_ways"));
        assert!(err("cache_entries = 1000").contains("program.pipeline.cache_entries"));
        let bad_port = err(r#"rules = ["priority=1,actions=output:9"]"#);
        assert!(
            bad_port.contains("line 1") && bad_port.contains("no port 9"),
            "{bad_port}"
        );
        let bad_goto = err(r#"rules = ["", "table=0,actions=goto_table:3"]"#);
        assert!(
            bad_goto.contains("line 2") && bad_goto.contains("table 3"),
            "{bad_goto}"
        );
        let dir = std::env::temp_dir().join(format!("sp-rules-{}", std::process::id()));
        std::fs::write(
            &dir,
            "# ACL\npriority=5,ip,actions=output:1\npriority=x,actions=drop\n",
        )
        .unwrap();
        let file = err(&format!("rules_file = {:?}", dir.display().to_string()));
        std::fs::remove_file(&dir).unwrap();
        assert!(
            file.contains("rules_file") && file.contains("line 3") && file.contains("priority=x"),
            "{file}"
        );
        assert!(err(r#"rules_file = "/nonexistent/rules""#).contains("cannot read"));
    }

    #[test]
    fn the_same_match_twice_at_one_priority_is_refused_naming_both_lines() {
        let err = |text: &str| config(text).err().unwrap().to_string();
        let twice = err(r##"rules = [
            "priority=5,tcp,tp_dst=80,actions=output:1",
            "priority=6,tcp,tp_dst=80,actions=output:2",
            "# the same match and priority as line 1, in other words",
            "tp_dst=80 priority=5 tcp actions=output:3",
        ]"##);
        assert_eq!(
            twice,
            "program.pipeline.rules: line 4: the same table, priority and match as line 1, \
             which it would replace; keep one"
        );
        // Another table or priority is another rule.
        config(
            r#"tables = 2
            rules = ["priority=5,tcp,actions=output:1", "table=1,priority=5,tcp,actions=output:1",
                     "priority=4,tcp,actions=output:1"]"#,
        )
        .unwrap();
    }

    #[test]
    fn warnings_name_the_line_and_the_word() {
        let lines = [
            "# header",
            "",
            "ip,nw_dst=0.0.0.0/0,actions=drop",
            "tcp,nw_dst=x",
        ];
        assert_eq!(
            rule_warnings(lines),
            [
                "line 3: 'nw_dst=0.0.0.0/0': its mask is zero, so it matches every packet; \
              leave it out if that is meant"
            ]
        );
        let read = parse_rules(&RuleSet::new(1), lines.into_iter().take(3), 2).unwrap();
        assert_eq!((read.rules.len(), read.warnings), (1, rule_warnings(lines)));
    }
}
