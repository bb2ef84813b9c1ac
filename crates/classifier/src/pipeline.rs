//! Numbered tables of rules, walked OpenFlow style: the highest-priority match of a table
//! applies its actions (which may change the fields later tables match on) and may go on to
//! a later table; a table miss does what the table says.
//!
//! Each table is searched by tuple-space search; `classify_linear` scans it in priority
//! order instead, the reference semantics the search and the microflow cache are checked
//! against.

use crate::fields::Fields;
use crate::rule::{Action, Rule};
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

/// A rule's handle: unique for the rule set's lifetime, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(pub u32);

#[derive(Debug, Clone, Default)]
struct Table {
    /// Highest priority first; among equals, the rule added first.
    rules: Vec<(RuleId, Rule)>,
    miss: Miss,
    index: TupleIndex,
}

/// Tuple-space search over one table's rules: rules with the same field masks form a
/// tuple, where one hash lookup of the packet's masked fields finds the rules that can
/// match (ports, which are ranges, are checked on those). Tuples are visited highest
/// priority first, and the search stops once no tuple left can beat the match found.
#[derive(Debug, Clone, Default)]
struct TupleIndex {
    tuples: Vec<Tuple>,
}

#[derive(Debug, Clone)]
struct Tuple {
    mask: Fields,
    /// The highest priority among its rules.
    best: u16,
    /// Masked fields -> positions in the table's rule list, in list order.
    rules: HashMap<Fields, Vec<u32>>,
}

fn masked(f: &Fields, m: &Fields) -> Fields {
    Fields {
        in_port: f.in_port & m.in_port,
        eth_src: f.eth_src & m.eth_src,
        eth_dst: f.eth_dst & m.eth_dst,
        vlan: f.vlan & m.vlan,
        eth_type: f.eth_type & m.eth_type,
        ip_src: f.ip_src & m.ip_src,
        ip_dst: f.ip_dst & m.ip_dst,
        ip_proto: f.ip_proto & m.ip_proto,
        tcp_flags: f.tcp_flags & m.tcp_flags,
        tp_src: 0,
        tp_dst: 0,
    }
}

impl TupleIndex {
    fn build(rules: &[(RuleId, Rule)]) -> TupleIndex {
        let mut tuples: Vec<Tuple> = Vec::new();
        for (pos, (_, r)) in rules.iter().enumerate() {
            let mask = r.pattern.mask;
            let t = match tuples.iter().position(|t| t.mask == mask) {
                Some(t) => t,
                None => {
                    tuples.push(Tuple {
                        mask,
                        best: 0,
                        rules: HashMap::new(),
                    });
                    tuples.len() - 1
                }
            };
            let t = &mut tuples[t];
            t.best = t.best.max(r.priority);
            t.rules
                .entry(masked(&r.pattern.value, &mask))
                .or_default()
                .push(pos as u32);
        }
        tuples.sort_by_key(|t| std::cmp::Reverse(t.best));
        TupleIndex { tuples }
    }
}

impl Table {
    /// The position of the rule matching `f`: the first in list order among matches.
    fn lookup(&self, f: &Fields) -> Option<usize> {
        let mut best: Option<usize> = None;
        for t in &self.index.tuples {
            if let Some(b) = best
                && t.best < self.rules[b].1.priority
            {
                break; // no rule in this or a later tuple can win
            }
            let Some(list) = t.rules.get(&masked(f, &t.mask)) else {
                continue;
            };
            // Lists are in list order: the first whose ports match is this tuple's winner.
            let found = list.iter().map(|&p| p as usize).find(|&p| {
                let pat = &self.rules[p].1.pattern;
                (pat.tp_src.0..=pat.tp_src.1).contains(&f.tp_src)
                    && (pat.tp_dst.0..=pat.tp_dst.1).contains(&f.tp_dst)
            });
            if let Some(p) = found
                && best.is_none_or(|b| p < b)
            {
                best = Some(p);
            }
        }
        best
    }

    /// The reference: the first rule in list order that matches.
    fn lookup_linear(&self, f: &Fields) -> Option<usize> {
        self.rules.iter().position(|(_, r)| r.pattern.matches(f))
    }

    fn reindex(&mut self) {
        self.index = TupleIndex::build(&self.rules);
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
    next_id: u32,
}

impl RuleSet {
    /// `tables` empty tables (at least one), each dropping on a miss.
    pub fn new(tables: usize) -> Self {
        RuleSet {
            tables: vec![Table::default(); tables.max(1)],
            next_id: 0,
        }
    }

    pub fn tables(&self) -> usize {
        self.tables.len()
    }

    pub fn set_miss(&mut self, table: u8, miss: Miss) -> Result<(), RuleError> {
        self.table_mut(table)?.miss = miss;
        Ok(())
    }

    fn table_mut(&mut self, table: u8) -> Result<&mut Table, RuleError> {
        let tables = self.tables.len();
        self.tables
            .get_mut(usize::from(table))
            .ok_or(RuleError::NoSuchTable { table, tables })
    }

    /// Adds a rule; its handle.
    pub fn insert(&mut self, rule: Rule) -> Result<RuleId, RuleError> {
        check_goto(rule.table, rule.goto, self.tables.len())?;
        let id = RuleId(self.next_id);
        let table = self.table_mut(rule.table)?;
        let at = table
            .rules
            .partition_point(|(_, r)| r.priority >= rule.priority);
        table.rules.insert(at, (id, rule));
        table.reindex();
        self.next_id += 1;
        Ok(id)
    }

    /// Replaces a rule's actions and goto, keeping its place; whether it was there.
    pub fn modify(
        &mut self,
        id: RuleId,
        actions: Vec<Action>,
        goto: Option<u8>,
    ) -> Result<bool, RuleError> {
        let tables = self.tables.len();
        let Some(rule) = self
            .tables
            .iter_mut()
            .flat_map(|t| t.rules.iter_mut())
            .find(|(r, _)| *r == id)
            .map(|(_, rule)| rule)
        else {
            return Ok(false);
        };
        check_goto(rule.table, goto, tables)?;
        rule.actions = actions;
        rule.goto = goto;
        Ok(true)
    }

    /// Removes a rule; whether it was there.
    pub fn remove(&mut self, id: RuleId) -> bool {
        for t in &mut self.tables {
            if let Some(i) = t.rules.iter().position(|(r, _)| *r == id) {
                t.rules.remove(i);
                t.reindex();
                return true;
            }
        }
        false
    }

    pub fn get(&self, id: RuleId) -> Option<&Rule> {
        self.rules().find(|(r, _)| *r == id).map(|(_, rule)| rule)
    }

    /// Every rule, table by table, in priority order.
    pub fn rules(&self) -> impl Iterator<Item = (RuleId, &Rule)> {
        self.tables
            .iter()
            .flat_map(|t| t.rules.iter().map(|(id, r)| (*id, r)))
    }

    /// Walks the tables for a packet with these fields (tuple-space search in each).
    pub fn classify(&self, fields: &Fields) -> Outcome {
        self.walk(fields, Table::lookup)
    }

    /// As [`RuleSet::classify`], scanning each table's rules in order: the reference.
    pub fn classify_linear(&self, fields: &Fields) -> Outcome {
        self.walk(fields, Table::lookup_linear)
    }

    fn walk(&self, fields: &Fields, find: impl Fn(&Table, &Fields) -> Option<usize>) -> Outcome {
        let mut f = *fields;
        let mut out = Outcome::default();
        let mut t = 0usize;
        while let Some(table) = self.tables.get(t) {
            let Some((id, rule)) = find(table, &f).map(|p| &table.rules[p]) else {
                out.missed.push(t as u8);
                match table.miss {
                    Miss::Drop => break,
                    Miss::Controller => {
                        out.to_controller = true;
                        break;
                    }
                    Miss::Continue => {
                        t += 1;
                        continue;
                    }
                }
            };
            out.rules.push(*id);
            for a in &rule.actions {
                a.apply(&mut f);
                out.actions.push(*a);
            }
            match rule.goto {
                Some(next) => t = usize::from(next),
                None => break,
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::text::parse_rule;

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
