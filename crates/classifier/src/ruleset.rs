//! Numbered tables of rules, walked OpenFlow style: the highest-priority match of a table
//! applies its actions (which may change the fields later tables match on) and may go on to
//! a later table; a table miss does what the table says.
//!
//! Each table is searched by its decision tree while it keeps one and has tuples enough
//! for the tree to be the faster, else by tuple-space search; both follow every update.
//! `classify_linear` scans it in priority order instead, the reference semantics the
//! searches and the microflow cache are checked against.

use crate::fields::Fields;
use crate::rule::{Action, Pattern, Rule};
use crate::tree::{Tree, TreeShape};
use crate::tuple::{Candidate, MAX_BUCKET, Tuple, mergeable, relaxed, within};
use std::collections::HashMap;
use std::fmt;

/// What a table does with a packet no rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Miss {
    #[default]
    Drop,
    Controller,
    /// Go on to the next table (drop after the last).
    Continue,
}

/// A rule's handle: unique among the rules present. A removed rule's handle is given to a
/// later rule (the rule's [`RuleSet::seq`] tells them apart), so handles stay below the
/// rules present at once, however many come and go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(pub u32);

/// One table. Invariants: every rule of the table is in `order` and in exactly one
/// tuple's bucket; `tuples` is sorted by `best`, highest first, and a tuple's `best` is at
/// least the priority of each of its rules (it may be stale high after a remove, which
/// only costs an early stop).
#[derive(Debug, Clone, Default)]
struct Table {
    /// Every rule in rank order: the reference scan and iteration (a tree, so that an
    /// insert or remove costs log n, not a shift of the rules after it).
    order: std::collections::BTreeSet<Rank>,
    miss: Miss,
    tuples: Vec<Tuple>,
    /// The decision tree over the same rules that lookups walk instead of the tuples, kept
    /// while the table holds at most [`TREE_RULES`] rules and its rules are not copied too
    /// often; once given up, made again only when the table is empty.
    tree: Option<Box<Tree>>,
}

/// Rules a table's decision tree serves at most: past this the tree's inserts and memory
/// grow faster than tuple search's, and a table this large is mostly prefixes (a FIB),
/// which the tuples' hash lookups serve in a few probes.
pub const TREE_RULES: usize = 8192;

/// Tuples from which lookups walk the tree: below, the few hash probes cost less than
/// the walk.
const TREE_FROM_TUPLES: usize = 5;

/// A rule's place in its table: higher priority first, among equals the one inserted
/// first (smaller `seq`; ids are reused, so they do not say). Sorting ranks ascending
/// sorts rules best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Rank {
    pub priority: std::cmp::Reverse<u16>,
    pub seq: u64,
    pub id: RuleId,
}

impl Rank {
    fn of(id: RuleId, seq: u64, rule: &Rule) -> Rank {
        Rank {
            priority: std::cmp::Reverse(rule.priority),
            seq,
            id,
        }
    }
}

impl Table {
    fn add(&mut self, rank: Rank, rule: &Rule) {
        if self.order.is_empty() {
            self.tree = Some(Box::default());
        }
        self.order.insert(rank);
        if let Some(tree) = &mut self.tree {
            tree.insert(rank, &rule.pattern);
            if tree.too_large() || self.order.len() > TREE_RULES {
                self.tree = None;
            }
        }
        let pattern = &rule.pattern;
        let t = self.tuple_for(pattern);
        let tuple = &mut self.tuples[t];
        tuple.best = tuple.best.max(rule.priority);
        tuple.len += 1;
        tuple.add(
            pattern.value.masked(&tuple.mask),
            Candidate::of(rank, pattern),
        );
        self.sort_tuples();
    }

    /// The tuple a rule of `pattern` joins: the one of its own mask; else the most
    /// specific merged tuple that may hold it with room in its bucket; else a new one, of
    /// the relaxed mask (or, where that one's bucket is full, of its own).
    fn tuple_for(&mut self, pattern: &Pattern) -> usize {
        let mask = pattern.mask;
        if let Some(t) = self.tuples.iter().position(|t| t.mask == mask) {
            return t;
        }
        let has_room = |t: &Tuple| {
            (t.bucket(&pattern.value.masked(&t.mask))).is_none_or(|b| b.len() < MAX_BUCKET)
        };
        let merged = (self.tuples.iter().enumerate())
            .filter(|(_, t)| within(&t.mask, &mask) && mergeable(&t.mask, &mask) && has_room(t))
            .max_by_key(|(_, t)| t.mask.bits())
            .map(|(i, _)| i);
        if let Some(t) = merged {
            return t;
        }
        let relaxed = relaxed(&mask);
        let mask = match self.tuples.iter().any(|t| t.mask == relaxed) {
            true => mask,
            false => relaxed,
        };
        self.tuples.push(Tuple::new(mask));
        self.tuples.len() - 1
    }

    /// The tuple holding the rule of `rank` and `pattern`, and its bucket's key.
    fn holder(&self, rank: Rank, pattern: &Pattern) -> Option<(usize, Fields)> {
        (self.tuples.iter().enumerate())
            .filter(|(_, t)| within(&t.mask, &pattern.mask))
            .find_map(|(i, t)| {
                let key = pattern.value.masked(&t.mask);
                let bucket = t.bucket(&key)?;
                bucket.iter().any(|c| c.rank == rank).then_some((i, key))
            })
    }

    fn take(&mut self, rank: Rank, rule: &Rule) {
        self.order.remove(&rank);
        if let Some(tree) = &mut self.tree {
            tree.remove(rank, &rule.pattern);
        }
        let Some((t, key)) = self.holder(rank, &rule.pattern) else {
            return;
        };
        let tuple = &mut self.tuples[t];
        tuple.take(&key, rank);
        tuple.len -= 1;
        if tuple.len == 0 {
            self.tuples.remove(t);
        }
    }

    fn sort_tuples(&mut self) {
        // Stable and nearly sorted already: one new or raised tuple moves into place.
        self.tuples.sort_by_key(|t| std::cmp::Reverse(t.best));
    }

    /// The tree lookups walk, if they walk one.
    fn walked_tree(&self) -> Option<&Tree> {
        (self.tree.as_deref()).filter(|_| self.tuples.len() >= TREE_FROM_TUPLES)
    }

    /// The rule matching `f`: the best ranked among matches.
    fn lookup(&self, f: &Fields) -> Option<RuleId> {
        if let Some(tree) = self.walked_tree() {
            return tree.lookup(f).map(|r| r.id);
        }
        let mut best: Option<Rank> = None;
        for t in &self.tuples {
            if let Some(b) = best
                && t.best < b.priority.0
            {
                break; // no rule in this or a later tuple can win
            }
            let Some(bucket) = t.bucket(&f.masked(&t.mask)) else {
                continue;
            };
            // Buckets are in rank order: the first that matches is this tuple's best.
            if let Some(c) = bucket.iter().find(|c| c.matches(f))
                && best.is_none_or(|b| c.rank < b)
            {
                best = Some(c.rank);
            }
        }
        best.map(|b| b.id)
    }

    /// The rule of this table with `priority` and exactly `pattern` (normalized), if any.
    fn identical(&self, priority: u16, pattern: &Pattern) -> Option<RuleId> {
        (self.tuples.iter())
            .filter(|t| within(&t.mask, &pattern.mask))
            .find_map(|t| {
                let key = pattern.value.masked(&t.mask);
                let bucket = t.bucket(&key)?;
                (bucket.iter())
                    .find(|c| c.rank.priority.0 == priority && c.pattern(&t.mask, &key) == *pattern)
                    .map(|c| c.rank.id)
            })
    }

    /// The rules ranked below `rank` whose patterns overlap `pattern`. A tuple whose mask
    /// lies within the pattern's holds at most one bucket that can overlap it, found by one
    /// lookup (a shorter prefix under a longer one, say); other tuples are scanned.
    fn overlapping_below(&self, rank: Rank, pattern: &Pattern) -> Vec<RuleId> {
        let mut found = Vec::new();
        let mut take = |mask: &Fields, key: &Fields, bucket: &[Candidate]| {
            found.extend(
                (bucket.iter())
                    .filter(|c| c.rank > rank && c.pattern(mask, key).overlaps(pattern))
                    .map(|c| c.rank.id),
            )
        };
        for t in &self.tuples {
            if within(&t.mask, &pattern.mask) {
                let key = pattern.value.masked(&t.mask);
                if let Some(bucket) = t.bucket(&key) {
                    take(&t.mask, &key, bucket);
                }
            } else {
                let both = t.mask.masked(&pattern.mask);
                let want = pattern.value.masked(&both);
                for (key, bucket) in t.buckets() {
                    if key.masked(&both) == want {
                        take(&t.mask, key, bucket);
                    }
                }
            }
        }
        found
    }
}

/// The hasher of tuple buckets and the cache's side tables: the folded multiply
/// ([`crate::fields::fold`]) over each word written (SipHash would cost more than the rest
/// of a lookup).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Fold;

impl std::hash::BuildHasher for Fold {
    type Hasher = FoldHasher;
    fn build_hasher(&self) -> FoldHasher {
        FoldHasher(0x9e37_79b9_7f4a_7c15)
    }
}

/// Folds each word written into the state with a widening multiply.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FoldHasher(u64);

impl FoldHasher {
    fn fold(&mut self, w: u64) {
        self.0 = crate::fields::fold(self.0, w);
    }
}

impl std::hash::Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.fold(u64::from_le_bytes(w));
        }
    }
    fn write_u8(&mut self, v: u8) {
        self.fold(u64::from(v));
    }
    fn write_u16(&mut self, v: u16) {
        self.fold(u64::from(v));
    }
    fn write_u32(&mut self, v: u32) {
        self.fold(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        self.fold(v);
    }
    fn write_u128(&mut self, v: u128) {
        self.fold(v as u64);
        self.fold((v >> 64) as u64);
    }
}

/// Why a rule was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleError {
    NoSuchTable {
        table: u8,
        tables: usize,
    },
    /// A goto must lead to a later table.
    GotoBackwards {
        from: u8,
        to: u8,
    },
    /// Every rule handle (about a billion) is held by a rule present.
    IdsExhausted,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleError::NoSuchTable { table, tables } => {
                write!(
                    f,
                    "there is no table {table}: the pipeline has tables 0 to {}",
                    tables - 1
                )
            }
            RuleError::GotoBackwards { from, to } => write!(
                f,
                "table {from} cannot go to table {to}: a goto must lead to a later table"
            ),
            RuleError::IdsExhausted => f.write_str(
                "every rule handle (about a billion) is held by a rule present: delete some",
            ),
        }
    }
}

impl std::error::Error for RuleError {}

/// The outcome of a packet's walk through the tables.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Outcome {
    /// The actions applied, in order (outputs among them).
    pub actions: Vec<Action>,
    /// The rule that matched in each table visited.
    pub rules: Vec<RuleId>,
    /// A table missed and sent the packet to the control plane.
    pub to_controller: bool,
    /// The tables visited where no rule matched.
    pub missed: Vec<u8>,
    /// The walk ended on a table miss that drops (or ran past the last table).
    pub dropped_by_miss: bool,
}

/// A goto must lead to a later table that exists.
fn check_goto(from: u8, goto: Option<u8>, tables: usize) -> Result<(), RuleError> {
    match goto {
        Some(to) if to <= from => Err(RuleError::GotoBackwards { from, to }),
        Some(to) if usize::from(to) >= tables => Err(RuleError::NoSuchTable { table: to, tables }),
        _ => Ok(()),
    }
}

/// A pipeline of tables 0 to N-1.
#[derive(Debug, Clone)]
pub struct RuleSet {
    tables: Vec<Table>,
    rules: HashMap<RuleId, (Rule, u64), Fold>,
    /// Handles of removed rules, for the next inserts (last freed first). Every copy of
    /// a rule set given the same changes gives the same handles, so workers agree.
    free_ids: Vec<u32>,
    /// Handles from here on have never been given.
    next_id: u32,
    /// The next insert's sequence number: its rank among equal priorities.
    next_seq: u64,
}

impl RuleSet {
    /// `tables` empty tables (at least one), each dropping on a miss.
    pub fn new(tables: usize) -> Self {
        RuleSet {
            tables: vec![Table::default(); tables.max(1)],
            rules: HashMap::default(),
            free_ids: Vec::new(),
            next_id: 0,
            next_seq: 0,
        }
    }

    pub fn tables(&self) -> usize {
        self.tables.len()
    }

    /// How many rules the tables hold.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// The tuples table `table`'s rules fall into (what a miss there probes at most).
    pub fn tuples(&self, table: u8) -> usize {
        self.tables
            .get(usize::from(table))
            .map_or(0, |t| t.tuples.len())
    }

    /// The shape of the decision tree lookups in `table` walk; none where they search its
    /// tuples.
    pub fn tree_shape(&self, table: u8) -> Option<TreeShape> {
        (self.tables.get(usize::from(table)))
            .and_then(Table::walked_tree)
            .map(Tree::shape)
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn set_miss(&mut self, table: u8, miss: Miss) -> Result<(), RuleError> {
        self.table_mut(table)?.miss = miss;
        Ok(())
    }

    pub fn miss(&self, table: u8) -> Option<Miss> {
        self.tables.get(usize::from(table)).map(|t| t.miss)
    }

    fn table_mut(&mut self, table: u8) -> Result<&mut Table, RuleError> {
        let tables = self.tables.len();
        self.tables
            .get_mut(usize::from(table))
            .ok_or(RuleError::NoSuchTable { table, tables })
    }

    /// Whether `insert` would take this rule (its table and goto exist and lead on).
    pub fn check(&self, rule: &Rule) -> Result<(), RuleError> {
        let tables = self.tables.len();
        if usize::from(rule.table) >= tables {
            return Err(RuleError::NoSuchTable {
                table: rule.table,
                tables,
            });
        }
        check_goto(rule.table, rule.goto, tables)
    }

    /// Adds a rule; its handle. Costs the same at any table size (one tuple touched).
    pub fn insert(&mut self, rule: Rule) -> Result<RuleId, RuleError> {
        self.check(&rule)?;
        let id = match self.free_ids.last() {
            Some(&id) => RuleId(id),
            None if self.next_id <= MAX_RULE_ID => RuleId(self.next_id),
            None => return Err(RuleError::IdsExhausted),
        };
        let mut rule = rule;
        rule.pattern = rule.pattern.normalized();
        let seq = self.next_seq;
        self.table_mut(rule.table)?
            .add(Rank::of(id, seq, &rule), &rule);
        self.rules.insert(id, (rule, seq));
        if self.free_ids.pop().is_none() {
            self.next_id += 1;
        }
        self.next_seq += 1;
        Ok(id)
    }

    /// The sequence number of rule `id`'s insert: unique for the rule set's lifetime, so
    /// it tells a rule from a later one given the same handle.
    pub fn seq(&self, id: RuleId) -> Option<u64> {
        self.rules.get(&id).map(|(_, seq)| *seq)
    }

    /// Replaces a rule's actions and goto, keeping its place; whether it was there.
    pub fn modify(
        &mut self,
        id: RuleId,
        actions: Vec<Action>,
        goto: Option<u8>,
    ) -> Result<bool, RuleError> {
        let tables = self.tables.len();
        let Some((rule, _)) = self.rules.get_mut(&id) else {
            return Ok(false);
        };
        check_goto(rule.table, goto, tables)?;
        rule.actions = actions;
        rule.goto = goto;
        Ok(true)
    }

    /// Removes a rule; whether it was there.
    pub fn remove(&mut self, id: RuleId) -> bool {
        let Some((rule, seq)) = self.rules.remove(&id) else {
            return false;
        };
        if let Some(t) = self.tables.get_mut(usize::from(rule.table)) {
            t.take(Rank::of(id, seq, &rule), &rule);
        }
        self.free_ids.push(id.0);
        true
    }

    pub fn get(&self, id: RuleId) -> Option<&Rule> {
        self.rules.get(&id).map(|(rule, _)| rule)
    }

    /// Every rule, table by table, in rank order.
    pub fn rules(&self) -> impl Iterator<Item = (RuleId, &Rule)> {
        self.tables
            .iter()
            .flat_map(|t| t.order.iter())
            .filter_map(|r| self.get(r.id).map(|rule| (r.id, rule)))
    }

    /// The rule of `rule`'s table with its priority and match, if any: the one an
    /// OpenFlow add of `rule` replaces.
    pub fn identical(&self, rule: &Rule) -> Option<RuleId> {
        let pattern = rule.pattern.normalized();
        (self.tables.get(usize::from(rule.table)))
            .and_then(|t| t.identical(rule.priority, &pattern))
    }

    /// The rules of `rule`'s table ranked below it (as if it were inserted now) that some
    /// packet could match as well as it: those whose microflows it may take over.
    pub fn overlapping_below(&self, rule: &Rule) -> Vec<RuleId> {
        let rank = Rank::of(RuleId(u32::MAX), self.next_seq, rule);
        let pattern = rule.pattern.normalized();
        self.tables
            .get(usize::from(rule.table))
            .map_or_else(Vec::new, |t| t.overlapping_below(rank, &pattern))
    }

    /// Walks the tables for a packet with these fields (tuple-space search in each).
    pub fn classify(&self, fields: &Fields) -> Outcome {
        let mut out = Outcome::default();
        self.classify_into(fields, &mut out);
        out
    }

    /// As [`RuleSet::classify`], into `out` (cleared first): with `out` reused, a walk
    /// allocates nothing once its vectors have grown.
    pub fn classify_into(&self, fields: &Fields, out: &mut Outcome) {
        self.outcome_by(fields, Table::lookup, out);
    }

    /// As [`RuleSet::classify`], scanning each table's rules in order: the reference.
    pub fn classify_linear(&self, fields: &Fields) -> Outcome {
        let mut out = Outcome::default();
        self.outcome_by(
            fields,
            |t, f| {
                t.order
                    .iter()
                    .find(|r| self.get(r.id).is_some_and(|rule| rule.pattern.matches(f)))
                    .map(|r| r.id)
            },
            &mut out,
        );
        out
    }

    /// The path of a packet's walk into `path` (cleared first): per table visited, the
    /// matching rule's id or [`PATH_MISS`] with the table, then [`PATH_END`] with how it
    /// ended. The rules on a path decide its outcome, so a path names an outcome without
    /// building it: [`RuleSet::outcome_of_path`] does that.
    pub fn path(&self, fields: &Fields, path: &mut Vec<u32>) {
        path.clear();
        let end = self.walk(fields, Table::lookup, |step| {
            path.push(match step {
                Step::Matched(id, _) => id.0,
                Step::Missed(t) => PATH_MISS | u32::from(t),
            })
        });
        path.push(PATH_END | u32::from(end.to_controller) | u32::from(end.dropped_by_miss) << 1);
    }

    /// The outcome a path leads to with the rules as they are now.
    pub fn outcome_of_path(&self, path: &[u32]) -> Outcome {
        let mut out = Outcome::default();
        for &step in path {
            if step & PATH_END != 0 {
                out.to_controller = step & 1 != 0;
                out.dropped_by_miss = step & 2 != 0;
            } else if step & PATH_MISS != 0 {
                out.missed.push(step as u8);
            } else if let Some(rule) = self.get(RuleId(step)) {
                out.rules.push(RuleId(step));
                out.actions.extend_from_slice(&rule.actions);
            }
        }
        out
    }

    fn outcome_by(
        &self,
        fields: &Fields,
        find: impl Fn(&Table, &Fields) -> Option<RuleId>,
        out: &mut Outcome,
    ) {
        out.actions.clear();
        out.rules.clear();
        out.missed.clear();
        let end = self.walk(fields, find, |step| match step {
            Step::Matched(id, rule) => {
                out.rules.push(id);
                out.actions.extend_from_slice(&rule.actions);
            }
            Step::Missed(t) => out.missed.push(t),
        });
        out.to_controller = end.to_controller;
        out.dropped_by_miss = end.dropped_by_miss;
    }

    /// The one walk through the tables: each table's match (found by `find`) applies its
    /// actions to the fields later tables see and may go on; a miss does what the table
    /// says. `visit` sees each step.
    fn walk(
        &self,
        fields: &Fields,
        find: impl Fn(&Table, &Fields) -> Option<RuleId>,
        mut visit: impl FnMut(Step<'_>),
    ) -> End {
        let mut f = *fields;
        let mut end = End::default();
        let mut t = 0usize;
        while let Some(table) = self.tables.get(t) {
            let Some((id, rule)) = find(table, &f).and_then(|id| Some((id, self.get(id)?))) else {
                visit(Step::Missed(t as u8));
                match table.miss {
                    Miss::Drop => {
                        end.dropped_by_miss = true;
                        break;
                    }
                    Miss::Controller => {
                        end.to_controller = true;
                        break;
                    }
                    Miss::Continue => {
                        t += 1;
                        end.dropped_by_miss = t == self.tables.len();
                        continue;
                    }
                }
            };
            visit(Step::Matched(id, rule));
            for a in &rule.actions {
                a.apply(&mut f);
            }
            match rule.goto {
                Some(next) => t = usize::from(next),
                None => break,
            }
        }
        end
    }
}

/// A step of a walk.
enum Step<'a> {
    Matched(RuleId, &'a Rule),
    Missed(u8),
}

/// How a walk ended (besides on a rule with no goto).
#[derive(Default)]
struct End {
    to_controller: bool,
    dropped_by_miss: bool,
}

/// A path step that is a table miss (the low bits: the table).
pub const PATH_MISS: u32 = 1 << 31;
/// The last step of a path (bit 0: to the controller; bit 1: dropped by a miss).
pub const PATH_END: u32 = 1 << 30;
/// Rule ids stay below the path's flag bits.
pub const MAX_RULE_ID: u32 = PATH_END - 1;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::rule_text::parse_rule;

    /// Handles of removed rules go to later rules, so they stay below the rules present
    /// however many come and go (the lifetime cap of about a billion inserts is gone);
    /// among equal priorities the rule inserted first still wins, whatever its handle.
    #[test]
    fn handles_are_reused_and_order_among_equals_is_by_insertion() {
        let mut s = RuleSet::new(1);
        let first = s
            .insert(parse_rule("priority=5,tcp,actions=output:1").unwrap())
            .unwrap();
        let second = s
            .insert(parse_rule("priority=5,ip,actions=output:2").unwrap())
            .unwrap();
        assert!(s.remove(first));
        let third = s
            .insert(parse_rule("priority=5,tcp,actions=output:3").unwrap())
            .unwrap();
        assert_eq!(third, first, "the freed handle");
        assert!(s.seq(third) > s.seq(second));
        let packet = tcp_to([198, 19, 0, 1], 80);
        for out in [s.classify(&packet), s.classify_linear(&packet)] {
            assert_eq!(out.rules, [second], "the older of equal priority");
        }
        // Near the handles' limit, churn goes on.
        s.next_id = MAX_RULE_ID;
        for _ in 0..10_000 {
            let id = s
                .insert(parse_rule("priority=9,udp,actions=drop").unwrap())
                .unwrap();
            assert!(id.0 <= MAX_RULE_ID);
            assert!(s.remove(id));
        }
        assert_eq!(s.len(), 2);
        assert_eq!(
            s.next_id,
            MAX_RULE_ID + 1,
            "one new handle for all the churn"
        );
        s.insert(parse_rule("priority=9,udp,actions=drop").unwrap())
            .unwrap();
        assert_eq!(
            s.insert(parse_rule("priority=9,udp,actions=drop").unwrap()),
            Err(RuleError::IdsExhausted),
            "only with every handle held"
        );
    }

    fn set(lines: &[&str]) -> RuleSet {
        let mut s = RuleSet::new(3);
        for l in lines {
            s.insert(parse_rule(l).unwrap()).unwrap();
        }
        s
    }

    fn tcp_to(dst: [u8; 4], port: u16) -> Fields {
        Fields {
            eth_type: 0x0800,
            ip_proto: 6,
            ip_dst: crate::fields::mapped(u32::from_be_bytes(dst)),
            tp_dst: port,
            ..Fields::default()
        }
    }

    #[test]
    fn the_highest_priority_match_wins_and_goto_continues_with_changed_fields() {
        let s = set(&[
            "table=0,priority=10,ip,actions=goto_table:1",
            "table=0,priority=20,tcp,tp_dst=22,actions=drop",
            "table=1,priority=5,ip,nw_dst=198.19.0.0/16,actions=mod_nw_dst:198.19.9.9,goto_table:2",
            "table=2,priority=5,ip,nw_dst=198.19.9.9,actions=dec_ttl,output:2",
        ]);
        let ssh = s.classify(&tcp_to([198, 19, 1, 1], 22));
        assert_eq!(
            (ssh.actions.len(), ssh.rules.len()),
            (0, 1),
            "ssh is dropped"
        );
        let web = s.classify(&tcp_to([198, 19, 1, 1], 80));
        assert_eq!(web.rules.len(), 3);
        assert_eq!(web.actions.last(), Some(&Action::Output(2)));
        let elsewhere = s.classify(&tcp_to([198, 18, 1, 1], 80));
        assert!(elsewhere.actions.is_empty(), "table 1 misses: dropped");
    }

    /// Rules of nearby masks share a merged tuple, each checked whole: /25 to /32 under
    /// a /24 tuple, TCP and UDP under one that ignores the protocol. A bucket full at
    /// [`MAX_BUCKET`] sends the next rule to a tuple of its own mask. Lookups, exact
    /// finds, overlaps and removes agree with the rules one by one throughout.
    #[test]
    fn merged_tuples_check_each_rule_whole_and_a_full_bucket_overflows() {
        let mut s = RuleSet::new(1);
        let mut ids = Vec::new();
        for i in 0..40u16 {
            let len = 25 + i % 8;
            let proto = ["tcp", "udp"][usize::from(i % 2)];
            let line = format!(
                "priority={},{proto},nw_dst=198.19.7.{}/{len},actions=output:{}",
                100 + i,
                ((i * 37) % 256) & (0xffu16 << (32 - len)) & 0xff,
                i % 4
            );
            ids.push(s.insert(parse_rule(&line).unwrap()).unwrap());
        }
        let tuples = s.tables[0].tuples.len();
        assert!(tuples < 16, "fewer tuples than the 16 masks: {tuples}");
        let largest = (s.tables[0].tuples.iter())
            .flat_map(|t| t.buckets().map(|(_, b)| b.len()))
            .max();
        assert_eq!(
            largest,
            Some(MAX_BUCKET),
            "a full bucket, the rest elsewhere"
        );
        let check = |s: &RuleSet| {
            for last in 0..=255u8 {
                for (proto, port) in [(6, 80), (17, 53)] {
                    let mut p = tcp_to([198, 19, 7, last], port);
                    p.ip_proto = proto;
                    assert_eq!(s.classify(&p), s.classify_linear(&p), "{p:?}");
                }
            }
            for (id, rule) in s.rules() {
                assert_eq!(s.identical(rule), Some(id));
                let brute: Vec<RuleId> = (s.rules())
                    .filter(|(_, o)| {
                        o.priority < rule.priority && o.pattern.overlaps(&rule.pattern)
                    })
                    .map(|(id, _)| id)
                    .collect();
                let mut found = s.overlapping_below(rule);
                found.sort();
                let mut brute = brute;
                brute.sort();
                assert_eq!(found, brute);
            }
        };
        check(&s);
        for id in ids.iter().step_by(3) {
            assert!(s.remove(*id));
        }
        check(&s);
        assert_eq!(s.len(), 40 - 14);
    }

    /// A tuple's index grows with its buckets and forgets a bucket once it is gone (a
    /// removed bucket's run is closed up behind it, and the last bucket moves into its
    /// place): lookups of every rule's address, and of addresses no rule has, agree with
    /// the rules one by one as 10,000 come, half go, and some come back.
    #[test]
    fn a_tuples_index_grows_with_its_buckets_and_forgets_the_gone() {
        let mut s = RuleSet::new(1);
        let host = |i: u32| [198, 18 + (i >> 16) as u8, (i >> 8) as u8, i as u8];
        let rule = |i: u32| {
            let [a, b, c, d] = host(i * 7);
            parse_rule(&format!(
                "priority=5,ip,nw_dst={a}.{b}.{c}.{d},actions=output:{}",
                i % 4
            ))
            .unwrap()
        };
        let mut ids = Vec::new();
        for i in 0..10_000u32 {
            ids.push(s.insert(rule(i)).unwrap());
        }
        assert_eq!(s.tuples(0), 1);
        let (used, slots) = s.tables[0].tuples[0].slots();
        assert_eq!(used, 10_000);
        assert!(slots >= 8 * used, "{slots} slots for {used} buckets");
        let check = |s: &RuleSet| {
            for i in (0..70_000u32).step_by(3) {
                let p = tcp_to(host(i), 80);
                assert_eq!(s.classify(&p), s.classify_linear(&p), "{i}");
            }
        };
        check(&s);
        for id in ids.iter().step_by(2) {
            assert!(s.remove(*id));
        }
        assert_eq!(s.tables[0].tuples[0].slots().0, 5_000);
        check(&s);
        for i in (0..10_000u32).step_by(4) {
            s.insert(rule(i)).unwrap();
        }
        assert_eq!(s.tables[0].tuples[0].slots().0, 7_500);
        check(&s);
    }

    use crate::testing::Rng;

    /// An address of a few hosts of IPv4 (mapped) or IPv6, so that rules and packets
    /// meet.
    fn host(rng: &mut Rng, v6: bool) -> u128 {
        let low = rng.below(4) << 8 | rng.below(3);
        match v6 {
            false => crate::fields::mapped(0xc612_0000 | low as u32),
            true => 0x2001_0db8_u128 << 96 | u128::from(rng.below(2)) << 64 | u128::from(low),
        }
    }

    /// A rule of random masks: prefixes of any length on both addresses (IPv4 or IPv6),
    /// sometimes a protocol, port ranges, an in_port or a MAC bit; priorities often tied.
    fn random_rule(rng: &mut Rng) -> Rule {
        let v6 = rng.below(4) == 0;
        let bits = if v6 { 128 } else { 32 };
        let mut p = Pattern::ANY;
        p.mask.eth_type = 0xffff;
        p.value.eth_type = if v6 { 0x86dd } else { 0x0800 };
        for (mask, value) in [
            (&mut p.mask.ip_src, &mut p.value.ip_src),
            (&mut p.mask.ip_dst, &mut p.value.ip_dst),
        ] {
            if rng.below(4) != 0 {
                let len = rng.below(bits + 1) as u32;
                *mask = u128::MAX.checked_shl(bits as u32 - len).unwrap_or(0)
                    | if v6 { 0 } else { u128::MAX << 32 };
                *value = host(rng, v6);
            }
        }
        if rng.below(2) == 0 {
            p.mask.ip_proto = 0xff;
            p.value.ip_proto = [6, 17][rng.below(2) as usize];
        }
        if rng.below(3) == 0 {
            let (a, b) = (rng.below(1100) as u16, rng.below(1100) as u16);
            p.tp_dst = (a.min(b), a.max(b));
        }
        if rng.below(6) == 0 {
            p.mask.in_port = u16::MAX;
            p.value.in_port = rng.below(3) as u16;
        }
        if rng.below(10) == 0 {
            p.mask.eth_dst = 1 << 40;
            p.value.eth_dst = rng.below(2) << 40;
        }
        Rule {
            priority: rng.below(8) as u16,
            pattern: p.normalized(),
            actions: vec![Action::Output(rng.below(4) as u16)],
            ..parse_rule("actions=drop").unwrap()
        }
    }

    fn random_packet(rng: &mut Rng) -> Fields {
        let v6 = rng.below(4) == 0;
        Fields {
            in_port: rng.below(3) as u16,
            eth_dst: rng.below(2) << 40,
            eth_type: if v6 { 0x86dd } else { 0x0800 },
            ip_src: host(rng, v6),
            ip_dst: host(rng, v6),
            ip_proto: [6, 17, 1][rng.below(3) as usize],
            tp_src: rng.below(1100) as u16,
            tp_dst: rng.below(1100) as u16,
            ..Fields::default()
        }
    }

    /// The decision tree agrees with the rules one by one: rules of many masks come, a
    /// third go, more come, and at each point every packet gets the rule the linear scan
    /// gives; and it is the tree that answers (the table keeps one, with tuples enough
    /// to walk it).
    #[test]
    fn the_decision_tree_agrees_with_the_rules_one_by_one() {
        for seed in 1..=6u64 {
            let mut rng = Rng(seed * 0x9e37_79b9_7f4a_7c15);
            let mut s = RuleSet::new(1);
            let check = |s: &RuleSet, rng: &mut Rng| {
                let shape = s.tree_shape(0).expect("the tree is kept and walked");
                assert!(
                    shape.leaves > 1 && shape.leaves_a_rule >= 1.0,
                    "seed {seed}: {shape}"
                );
                for _ in 0..3000 {
                    let p = random_packet(rng);
                    assert_eq!(s.classify(&p), s.classify_linear(&p), "seed {seed}: {p:?}");
                }
            };
            let mut ids: Vec<RuleId> = (0..400)
                .map(|_| s.insert(random_rule(&mut rng)).unwrap())
                .collect();
            check(&s, &mut rng);
            for id in ids.iter().step_by(3) {
                assert!(s.remove(*id));
            }
            check(&s, &mut rng);
            ids.extend((0..200).map(|_| s.insert(random_rule(&mut rng)).unwrap()));
            check(&s, &mut rng);
        }
    }

    /// Rules that each fix a different half of many bits part at every split but copy
    /// the other half: the tree gives up before its copies pass their bound, the tuples
    /// answer alone (and rightly), and a table emptied starts a tree again.
    #[test]
    fn a_tree_copying_too_much_is_given_up_and_made_again_once_the_table_empties() {
        let mut rng = Rng(77);
        let mut s = RuleSet::new(1);
        let mut ids = Vec::new();
        for _ in 0..600 {
            let mut p = Pattern::ANY;
            p.mask.eth_src = rng.next() & 0xffff_ffff_ffff;
            p.value.eth_src = rng.next();
            p.mask.eth_dst = rng.next() & 0xffff_ffff_ffff;
            p.value.eth_dst = rng.next();
            let rule = Rule {
                priority: rng.below(100) as u16,
                pattern: p.normalized(),
                ..parse_rule("actions=drop").unwrap()
            };
            ids.push(s.insert(rule).unwrap());
        }
        assert!(s.tables[0].tree.is_none(), "the tree was given up");
        for _ in 0..2000 {
            let p = Fields {
                eth_src: rng.next() & 0xffff_ffff_ffff,
                eth_dst: rng.next() & 0xffff_ffff_ffff,
                ..Fields::default()
            };
            assert_eq!(s.classify(&p), s.classify_linear(&p));
        }
        for id in ids {
            assert!(s.remove(id));
        }
        s.insert(parse_rule("priority=1,ip,actions=drop").unwrap())
            .unwrap();
        assert!(
            s.tables[0].tree.is_some(),
            "a new tree for the emptied table"
        );
    }

    #[test]
    fn a_miss_does_what_the_table_says() {
        let mut s = set(&["table=1,priority=1,actions=output:1"]);
        assert_eq!(s.classify(&Fields::default()).rules.len(), 0);
        s.set_miss(0, Miss::Continue).unwrap();
        assert_eq!(s.classify(&Fields::default()).actions, [Action::Output(1)]);
        s.set_miss(0, Miss::Controller).unwrap();
        assert!(s.classify(&Fields::default()).to_controller);
    }

    #[test]
    fn bad_gotos_and_tables_are_refused() {
        let mut s = RuleSet::new(2);
        let back = parse_rule("table=1,actions=goto_table:1").unwrap();
        assert_eq!(
            s.insert(back),
            Err(RuleError::GotoBackwards { from: 1, to: 1 })
        );
        let far = parse_rule("table=0,actions=goto_table:5").unwrap();
        assert!(matches!(
            s.insert(far),
            Err(RuleError::NoSuchTable { table: 5, .. })
        ));
        let id = s
            .insert(parse_rule("table=0,priority=3,actions=output:0").unwrap())
            .unwrap();
        assert!(s.remove(id));
        assert!(!s.remove(id));
    }
}
